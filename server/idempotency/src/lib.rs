//! An `Idempotency-Key` layer for axum and any tower HTTP service: a write that carries a
//! key runs at most once per (account, key) while the key lives, and every copy of it gets
//! the first answer back, marked `Idempotent-Replayed: true`. This is the server half of
//! the sw-outbox promise that a queued write is delivered exactly once: the outbox retries
//! when it did not get an answer, and this layer makes the retry safe.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")] {
//! use axum::{http::request::Parts, routing::post, Router};
//! use std::sync::Arc;
//! use sw_outbox_idempotency::{IdempotencyLayer, SqliteLedger};
//!
//! # #[derive(Clone)] struct User(String);
//! # async fn create_order() -> &'static str { "ok" }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ledger = Arc::new(SqliteLedger::open("idempotency.sqlite")?);
//! let app: Router = Router::new()
//!     .route("/api/orders", post(create_order))
//!     // Keys are scoped per account: here, the user your auth middleware put in the request.
//!     .layer(IdempotencyLayer::new(ledger, |req: &Parts| {
//!         req.extensions.get::<User>().map(|u| u.0.clone())
//!     }));
//! # Ok(()) }
//! # }
//! ```
//!
//! Parts: [`IdempotencyLayer`] ([`layer`]: the protocol), [`Ledger`] ([`ledger`]: what a
//! storage backend must do), `SqliteLedger` (feature `sqlite`, the default), `PgLedger`
//! (feature `postgres`: on the app's sqlx `PgPool`, several instances sharing one ledger),
//! [`Settings`] (every bound, checked by [`Settings::builder`]). The crate's README has
//! the whole picture, with a five-minute axum example.
//!
//! Features: `sqlite` (default; rusqlite with its bundled SQLite), `postgres` (sqlx
//! 0.8), `postgres-rustls` (TLS through sqlx's rustls, when the app's sqlx has no TLS
//! feature of its own), `test-support` (the module `testing`).

#![warn(missing_docs, missing_debug_implementations)]

mod answers;
mod body;
mod claimed;
mod hold;
pub mod layer;
pub mod ledger;
#[cfg(feature = "postgres")]
pub mod postgres;
mod route;
pub mod settings;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "test-support")]
pub mod testing;
#[cfg(feature = "postgres")]
pub mod transactional;

pub use answers::{detail, REPLAYED_HEADER};
pub use body::{BoxError, IdempotencyBody};
pub use layer::{AccountOf, Idempotency, IdempotencyFuture, IdempotencyLayer, KEY_HEADER};
pub use ledger::{
    Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger, LedgerError, LedgerErrorKind,
    LedgerFuture, Scope, StoredAnswer, DEFAULT_LOCK_WAIT,
};
#[cfg(feature = "postgres")]
pub use postgres::{PgLedger, TableName};
pub use settings::{default_stored_headers, KeyRule, Settings, SettingsBuilder, SettingsError};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteLedger;
#[cfg(feature = "postgres")]
pub use transactional::{ClaimTransaction, TransactionConn};
