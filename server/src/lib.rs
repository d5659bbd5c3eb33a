//! The reference API server of sw-outbox.
//!
//! It exists for three audiences: the demo PWA and the end-to-end tests (which need a real
//! server whose failures can be injected on demand), the benchmark, and site developers who
//! want to see, in working code, what their own API must do for the outbox to deliver a
//! queued write exactly once. That last part is the idempotency ledger: see [`ledger`] for
//! the storage side and [`idempotency`] for the HTTP protocol on top of it.
//!
//! Layout: [`config`] (flags and timing bounds), [`store`] (SQLite: demo data, sessions,
//! the applied log), [`ledger`] (the `Ledger` trait and its SQLite implementation),
//! [`ledger_pg`] (the same ledger in PostgreSQL, shared by several server processes),
//! [`idempotency`] (claim / replay / wait / heartbeat), [`auth`], [`routes`] (demo data),
//! [`faults`] and [`control`] (test-only fault injection), [`statics`], [`app`] (the router
//! and the per-request pipeline) and [`serve`] (the connection loop that can drop a
//! connection without answering).

// Handlers return `Result<_, Response>` so a refusal is a ready answer; boxing every
// `Response` to satisfy this lint would only add allocations on the error path.
#![allow(clippy::result_large_err)]

pub mod app;
pub mod auth;
pub mod config;
pub mod control;
pub mod faults;
pub mod http_util;
pub mod idempotency;
pub mod ledger;
pub mod ledger_pg;
pub mod routes;
pub mod serve;
pub mod statics;
pub mod store;

pub use config::{Config, LedgerTimings, Mode};
pub use serve::{spawn, RunningServer};
