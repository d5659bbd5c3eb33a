//! The ledger: what must be stored, and atomically, for a keyed write to run at most once.
//!
//! The HTTP side (waiting, staleness, replay) is the layer's ([`crate::layer`]); a backend
//! only stores. It is a trait so an app can keep the ledger in its own database:
//! [`crate::SqliteLedger`] is built in, `PgLedger` comes with the `postgres` feature. The one
//! hard requirement on any backend: [`Ledger::begin`] is atomic and its claim durable
//! (committed) before it returns, because the route runs right after, and a claim that could
//! vanish in a crash would let a retry apply the write twice.

use std::future::Future;
use std::pin::Pin;

/// Async results without an `async-trait` dependency, and object-safe so an app can hold an
/// `Arc<dyn Ledger>`.
pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

/// Why a ledger call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerErrorKind {
    /// A bounded wait for a lock (or a pooled connection) ran out: others hold the ledger.
    /// The layer answers 503 with `Retry-After: 1`; trying again shortly is right.
    Busy,
    /// Anything else (the database is gone, a row is corrupt).
    Failed,
}

#[derive(Clone, Debug)]
pub struct LedgerError {
    pub kind: LedgerErrorKind,
    pub message: String,
}

impl LedgerError {
    pub fn busy(message: impl Into<String>) -> LedgerError {
        LedgerError {
            kind: LedgerErrorKind::Busy,
            message: message.into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> LedgerError {
        LedgerError {
            kind: LedgerErrorKind::Failed,
            message: message.into(),
        }
    }

    pub fn is_busy(&self) -> bool {
        self.kind == LedgerErrorKind::Busy
    }
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            LedgerErrorKind::Busy => write!(f, "ledger busy: {}", self.message),
            LedgerErrorKind::Failed => write!(f, "ledger: {}", self.message),
        }
    }
}

impl std::error::Error for LedgerError {}

/// Keys are scoped per account: two accounts that happen to send the same key are
/// unrelated writes, and one account can never read another's stored answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scope {
    pub account: String,
    pub key: String,
}

/// What makes a retry "the same request". The body is hashed so the ledger never keeps
/// request bodies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub method: String,
    /// Path with query: `/api/x?a=1` and `/api/x?a=2` are different writes.
    pub path: String,
    pub body_sha256: [u8; 32],
}

/// An answer as stored for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAnswer {
    pub status: u16,
    /// The stored headers the answer had (lower-case names), in the order of the
    /// settings' list.
    pub headers: Vec<(String, String)>,
    /// `None`: the body was over the size bound, so only the status was kept and a replay
    /// cannot give the answer back.
    pub body: Option<Vec<u8>>,
}

/// Identifies one claim, so a request whose entry expired and was claimed again by another
/// request cannot complete or heartbeat the newer claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimToken(pub String);

/// Everything [`Ledger::begin`] needs to decide.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest<'a> {
    pub scope: &'a Scope,
    pub fingerprint: &'a Fingerprint,
    pub token: &'a ClaimToken,
    /// Creation and heartbeat time of a new claim (wall-clock milliseconds).
    pub now_ms: i64,
    /// An entry created before this is absent: it is replaced by the new claim.
    pub expired_before_ms: i64,
    /// Most entries the ledger may hold (see [`Begin::Full`]).
    pub max_rows: u64,
}

/// The outcome of trying to claim a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// No live entry existed: a running claim is now committed; the caller runs the route.
    Claimed,
    /// The same request already completed: replay this.
    Completed(StoredAnswer),
    /// The same request is running (or died while running); `heartbeat_ms` is its last sign
    /// of life, from which the caller decides between waiting and "outcome unknown".
    Running { heartbeat_ms: i64 },
    /// The key belongs to a different request.
    Reused,
    /// A new entry is needed, the ledger holds `max_rows`, and none of them is completed
    /// or expired: nothing can be evicted without forgetting a running claim.
    Full,
}

pub trait Ledger: Send + Sync {
    /// Atomically: look up the scope; treat an entry created before `expired_before_ms` as
    /// absent; if absent, make room (evicting the oldest completed or expired entries when
    /// the ledger holds `max_rows`, or answering [`Begin::Full`]) and insert a running claim
    /// with `now_ms` as creation and heartbeat time, committed before returning.
    fn begin<'a>(&'a self, claim: ClaimRequest<'a>) -> LedgerFuture<'a, Begin>;

    /// Refreshes a running claim's heartbeat. A no-op if the claim is gone or not ours.
    fn heartbeat<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        now_ms: i64,
    ) -> LedgerFuture<'a, ()>;

    /// Stores the answer and marks the claim completed. A no-op if the claim is gone or not
    /// ours (it expired and was claimed again).
    fn complete<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        answer: &'a StoredAnswer,
    ) -> LedgerFuture<'a, ()>;

    /// Deletes entries created before `expired_before_ms`; returns how many.
    fn prune(&self, expired_before_ms: i64) -> LedgerFuture<'_, u64>;

    /// How many entries the ledger holds (expired ones included until pruned).
    fn entries(&self) -> LedgerFuture<'_, u64>;

    /// Deletes everything.
    fn clear(&self) -> LedgerFuture<'_, ()>;
}

/// Stored headers as one text column: a JSON array of `[name, value]` pairs.
pub(crate) fn encode_headers(headers: &[(String, String)]) -> String {
    serde_json::Value::Array(
        headers
            .iter()
            .map(|(k, v)| serde_json::json!([k, v]))
            .collect(),
    )
    .to_string()
}

pub(crate) fn decode_headers(text: Option<&str>) -> Result<Vec<(String, String)>, LedgerError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let pairs: Vec<(String, String)> = serde_json::from_str(text)
        .map_err(|e| LedgerError::failed(format!("stored headers unreadable: {e}")))?;
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let h = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("retry-after".to_owned(), "5".to_owned()),
            ("location".to_owned(), "/a\"b\\c".to_owned()),
        ];
        assert_eq!(decode_headers(Some(&encode_headers(&h))).unwrap(), h);
        assert_eq!(decode_headers(None).unwrap(), vec![]);
        assert!(decode_headers(Some("{")).is_err());
    }
}
