//! An idempotency layer for axum (any tower HTTP service): a write that carries an
//! `Idempotency-Key` runs at most once per (account, key) while the key lives, and every
//! copy of it gets the first answer back, marked `Idempotent-Replayed: true`. This is the
//! server half of the sw-outbox promise that a queued write is delivered exactly once: the
//! outbox retries when it did not get an answer, and this layer makes the retry safe.
//!
//! ```no_run
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
//! ```
//!
//! Parts: [`IdempotencyLayer`] ([`layer`]: the protocol), [`Ledger`] ([`ledger`]: what a
//! storage backend must do), [`SqliteLedger`], `PgLedger` (feature `postgres`, several
//! processes sharing one ledger), [`Settings`] (every bound, with the design's defaults).

mod answers;
mod body;
pub mod layer;
pub mod ledger;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod settings;
pub mod sqlite;

pub use answers::{detail, REPLAYED_HEADER};
pub use layer::{now_ms, AccountOf, Idempotency, IdempotencyLayer, KEY_HEADER};
pub use ledger::{
    Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger, LedgerError, LedgerErrorKind,
    LedgerFuture, Scope, StoredAnswer,
};
#[cfg(feature = "postgres")]
pub use postgres::PgLedger;
pub use settings::{default_stored_headers, KeyRule, Settings};
pub use sqlite::{SqliteLedger, DEFAULT_LOCK_WAIT};
