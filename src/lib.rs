//! sw-outbox: an offline outbox for Progressive Web Apps, run as the site's service
//! worker.
//!
//! `core` and `protocol` are pure Rust (host-tested); `store` (IndexedDB) and `worker`
//! (fetch, messages, events) are the browser shell and exist only on wasm32, with `js`
//! (serde over JavaScript values) under both; `channel` (one-thread channels between the
//! shell's tasks) is plain std, host-tested.

pub mod channel;
pub mod core;
pub mod protocol;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)] // public for its service-worker tests only
pub mod js;
#[cfg(target_arch = "wasm32")]
pub mod store;
#[cfg(target_arch = "wasm32")]
pub mod worker;

/// Talc in place of std's dlmalloc on wasm32: smaller code (see bench/README.md, issue
/// 30). The worker is single-threaded (no `atomics`), as talc's WebAssembly set-up needs.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();
