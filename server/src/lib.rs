//! The reference API server of sw-outbox.
//!
//! It exists for three audiences: the demo PWA and the end-to-end tests (which need a real
//! server whose failures can be injected on demand), the benchmark, and site developers who
//! want to see, in working code, what their own API must do for the outbox to deliver a
//! queued write exactly once. That last part is the idempotency ledger, which lives in the
//! `sw-outbox-idempotency` crate (a tower layer any axum app can add); this server is one
//! user of it, plus the security duties a real app has (see docs/SERVER-API.md).
//!
//! Layout: [`config`] and [`cli`] (flags and their defaults), [`store`] (SQLite: demo
//! data, sessions, the applied log), [`auth`] (sessions, CSRF, login throttle, bearer
//! tokens),
//! [`client`] (who a request comes from, behind trusted proxies),
//! [`security`] (the Origin check, https detection), [`limits`] (throttle and write budget
//! counters), [`conditional`] (`If-Match`), [`routes`] (demo data), [`faults`] and
//! [`control`] (test-only fault injection), [`static_files`], [`app`] (the router and the
//! per-request pipeline, with the idempotency layer of the `sw-outbox-idempotency` crate
//! around the routes) and [`serve`] (the connection loop that can drop a connection without
//! answering).

// Handlers return `Result<_, Response>` so a refusal is a ready answer; boxing every
// `Response` to satisfy this lint would only add allocations on the error path.
#![allow(clippy::result_large_err)]

pub mod app;
pub mod auth;
pub mod cli;
pub mod client;
pub mod conditional;
pub mod config;
pub mod control;
pub mod control_routes;
pub mod faults;
pub mod http_util;
pub mod limits;
pub mod routes;
pub mod security;
pub mod serve;
pub mod state;
pub mod static_files;
pub mod store;

pub use config::{AuthMode, Config, Mode, Rate};
pub use serve::{spawn, RunningServer};
