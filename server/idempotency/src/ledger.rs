//! The ledger: what must be stored, and atomically, for a keyed write to run at most once.
//!
//! The HTTP side (waiting, staleness, replay) is the layer's ([`crate::layer`]); a backend
//! only stores. It is a trait so an app can keep the ledger in its own database:
//! `SqliteLedger` (feature `sqlite`) and `PgLedger` (feature `postgres`) are built in. The
//! hard requirements on any backend:
//!
//! - [`Ledger::begin`] is atomic and its claim durable (committed) before it returns,
//!   because the route runs right after, and a claim that could vanish in a crash would let
//!   a retry apply the write twice;
//! - every time is the ledger's own clock (the database's, when several processes share
//!   it): the layer passes durations and reads ages, never timestamps, so server instances
//!   whose clocks disagree still agree on what is alive and what expired;
//! - an unexpired entry is never removed to make room: a full ledger answers
//!   [`Begin::Full`] instead.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// How long a ledger call waits for a lock (or a pooled connection) before it gives up as
/// [`LedgerErrorKind::Busy`].
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Async results without an `async-trait` dependency, and object-safe so an app can hold an
/// `Arc<dyn Ledger>`.
pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

/// Why a ledger call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LedgerErrorKind {
    /// A bounded wait for a lock (or a pooled connection) ran out: others hold the ledger.
    /// The layer answers 503 with `Retry-After: 1`; trying again shortly is right.
    Busy,
    /// Anything else (the database is gone, a row is corrupt).
    Failed,
}

/// A ledger call that failed, with its kind and what the backend said.
#[derive(Clone, Debug)]
pub struct LedgerError {
    kind: LedgerErrorKind,
    message: String,
}

impl LedgerError {
    /// A bounded wait ran out (see [`LedgerErrorKind::Busy`]).
    pub fn busy(message: impl Into<String>) -> LedgerError {
        LedgerError {
            kind: LedgerErrorKind::Busy,
            message: message.into(),
        }
    }

    /// Any other failure.
    pub fn failed(message: impl Into<String>) -> LedgerError {
        LedgerError {
            kind: LedgerErrorKind::Failed,
            message: message.into(),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> LedgerErrorKind {
        self.kind
    }

    /// What the backend said.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether trying again shortly is right.
    pub fn is_busy(&self) -> bool {
        self.kind == LedgerErrorKind::Busy
    }
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
#[non_exhaustive]
pub struct Scope {
    /// Who the write acts for (what [`crate::AccountOf`] said).
    pub account: String,
    /// The `Idempotency-Key`.
    pub key: String,
}

impl Scope {
    /// The scope of `key` under `account`.
    pub fn new(account: impl Into<String>, key: impl Into<String>) -> Scope {
        Scope {
            account: account.into(),
            key: key.into(),
        }
    }
}

/// What makes a retry "the same request". The body is hashed so the ledger never keeps
/// request bodies.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fingerprint {
    /// `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    /// Path with query: `/api/x?a=1` and `/api/x?a=2` are different writes.
    pub path: String,
    /// SHA-256 of the request body.
    pub body_sha256: [u8; 32],
    /// The request's `Content-Type`, trimmed and lower-cased; empty when it had none. The
    /// same bytes as another type are another request (a form is not its JSON twin).
    pub content_type: String,
}

impl Fingerprint {
    /// The fingerprint of a request without a `Content-Type`.
    pub fn new(
        method: impl Into<String>,
        path: impl Into<String>,
        body_sha256: [u8; 32],
    ) -> Fingerprint {
        Fingerprint {
            method: method.into(),
            path: path.into(),
            body_sha256,
            content_type: String::new(),
        }
    }

    /// The same fingerprint with the request's `Content-Type` (normalised here).
    pub fn with_content_type(mut self, content_type: &str) -> Fingerprint {
        self.content_type = normalise_content_type(content_type);
        self
    }
}

/// `Application/JSON ; charset=UTF-8` and `application/json;charset=utf-8` are one type:
/// lower-cased, spaces around `;` and `=` dropped.
pub(crate) fn normalise_content_type(value: &str) -> String {
    value
        .split(';')
        .map(|part| part.split('=').map(str::trim).collect::<Vec<_>>().join("="))
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(";")
        .to_ascii_lowercase()
}

/// An answer as stored for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The stored headers the answer had (lower-case names), in the order of the
    /// settings' list.
    pub headers: Vec<(String, String)>,
    /// `None`: the body was streamed or over the size bound, so only the status was kept
    /// and a replay cannot give the answer back (`idempotency_replay_unavailable`).
    pub body: Option<Vec<u8>>,
}

impl StoredAnswer {
    /// An answer with its body.
    pub fn new(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> StoredAnswer {
        StoredAnswer {
            status,
            headers,
            body: Some(body),
        }
    }

    /// An answer kept as its status (and headers) only.
    pub fn status_only(status: u16, headers: Vec<(String, String)>) -> StoredAnswer {
        StoredAnswer {
            status,
            headers,
            body: None,
        }
    }
}

/// Identifies one claim, so a request whose entry expired and was claimed again by another
/// request cannot complete or heartbeat the newer claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimToken(pub String);

/// Everything [`Ledger::begin`] needs to decide. Times are durations, measured by the
/// ledger's own clock.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The entry.
    pub scope: Scope,
    /// The request, to tell a retry from a reused key.
    pub fingerprint: Fingerprint,
    /// The new claim's identity.
    pub token: ClaimToken,
    /// An entry whose last sign of life (claim, heartbeat, completion) is older than this
    /// is expired: absent, and replaced by the new claim.
    pub key_ttl: Duration,
    /// Most unexpired entries the ledger holds (see [`Begin::Full`]).
    pub max_rows: u64,
    /// Most unexpired entries one account holds, if bounded (see [`Begin::Full`]).
    pub max_rows_per_account: Option<u64>,
}

impl ClaimRequest {
    /// A claim with the default key window (24 h) and row bound (100 000), no per-account
    /// bound; the layer sets them from its [`Settings`](crate::Settings).
    pub fn new(scope: Scope, fingerprint: Fingerprint, token: ClaimToken) -> ClaimRequest {
        ClaimRequest {
            scope,
            fingerprint,
            token,
            key_ttl: crate::settings::DEFAULT_KEY_TTL,
            max_rows: crate::settings::DEFAULT_MAX_ROWS,
            max_rows_per_account: None,
        }
    }

    /// The same claim with another key window.
    pub fn with_key_ttl(mut self, key_ttl: Duration) -> ClaimRequest {
        self.key_ttl = key_ttl;
        self
    }

    /// The same claim with other row bounds.
    pub fn with_max_rows(mut self, max_rows: u64, per_account: Option<u64>) -> ClaimRequest {
        self.max_rows = max_rows;
        self.max_rows_per_account = per_account;
        self
    }
}

/// The outcome of trying to claim a key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Begin {
    /// No live entry existed: a running claim is now committed; the caller runs the route.
    Claimed,
    /// The same request already completed: replay this.
    Completed(StoredAnswer),
    /// The same request is running (or died while running). `since_heartbeat` is the age
    /// of its last sign of life by the ledger's clock, from which the caller decides
    /// between waiting and "outcome unknown". A claim whose row lock is held (a route in
    /// transactional mode, or another claim being decided this instant) is alive by that
    /// lock: zero.
    Running {
        /// How long ago the claim was made or last heartbeat.
        since_heartbeat: Duration,
    },
    /// The key belongs to a different request.
    Reused,
    /// A new entry is needed and the ledger (or this account) holds its bound of
    /// unexpired entries. Nothing was written, and nothing unexpired was removed: a key is
    /// never forgotten inside its window. `retry_after` is when the oldest entry in the
    /// way expires.
    Full {
        /// How long until room is made by expiry.
        retry_after: Duration,
    },
}

/// What a storage backend must do. See the module documentation for the rules.
pub trait Ledger: Send + Sync + fmt::Debug {
    /// Atomically: look up the scope; treat an expired entry (last sign of life older than
    /// `key_ttl`) as absent; if absent, check the row bounds (expired entries may be deleted
    /// to make room; unexpired ones never: [`Begin::Full`]) and insert a running claim,
    /// committed before returning.
    fn begin<'a>(&'a self, claim: &'a ClaimRequest) -> LedgerFuture<'a, Begin>;

    /// Refreshes a running claim's heartbeat to now. A no-op if the claim is gone or not
    /// ours.
    fn heartbeat<'a>(&'a self, scope: &'a Scope, token: &'a ClaimToken) -> LedgerFuture<'a, ()>;

    /// Stores the answer and marks the claim completed (its last sign of life is now: the
    /// key window counts from here). A no-op if the claim is gone or not ours (it expired
    /// and was claimed again).
    fn complete<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        answer: &'a StoredAnswer,
    ) -> LedgerFuture<'a, ()>;

    /// Deletes expired entries (last sign of life older than `key_ttl`); returns how many.
    fn prune(&self, key_ttl: Duration) -> LedgerFuture<'_, u64>;

    /// Removes a running claim whose route never started (its client went away before it
    /// could), so the key applies again: its retry runs the write instead of meeting
    /// "outcome unknown". A no-op if the claim is gone, not ours, or completed.
    fn release<'a>(&'a self, scope: &'a Scope, token: &'a ClaimToken) -> LedgerFuture<'a, ()>;
}

/// Milliseconds of a duration, saturating.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A duration from milliseconds; a negative age (a clock that moved back) is zero.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn from_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Stored headers as one text column: a JSON array of `[name, value]` pairs.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn encode_headers(headers: &[(String, String)]) -> String {
    serde_json::Value::Array(
        headers
            .iter()
            .map(|(k, v)| serde_json::json!([k, v]))
            .collect(),
    )
    .to_string()
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn decode_headers(text: Option<&str>) -> Result<Vec<(String, String)>, LedgerError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let pairs: Vec<(String, String)> = serde_json::from_str(text)
        .map_err(|e| LedgerError::failed(format!("stored headers unreadable: {e}")))?;
    Ok(pairs)
}

/// What a stored row says, decided the same way by every built-in backend.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) struct Found {
    pub method: String,
    pub path: String,
    pub body_sha256: Vec<u8>,
    /// `None` for an entry written before the type was part of the fingerprint: it
    /// matches any type, so a retry across the upgrade still gets its answer.
    pub content_type: Option<String>,
    pub completed: bool,
    /// Claimed in transactional mode: alive exactly while its row lock is held.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub held: bool,
    pub age_ms: i64,
    pub status: Option<i64>,
    pub headers: Option<String>,
    pub body: Option<Vec<u8>>,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Found {
    /// Whether the entry is of the same request.
    pub fn matches(&self, fp: &Fingerprint) -> bool {
        let same_type = self
            .content_type
            .as_deref()
            .is_none_or(|t| t == fp.content_type);
        self.method == fp.method
            && self.path == fp.path
            && self.body_sha256 == fp.body_sha256
            && same_type
    }

    /// The outcome for a live (unexpired) entry.
    pub fn outcome(self, fp: &Fingerprint) -> Result<Begin, LedgerError> {
        if !self.matches(fp) {
            return Ok(Begin::Reused);
        }
        if !self.completed {
            return Ok(Begin::Running {
                since_heartbeat: from_millis(self.age_ms),
            });
        }
        let status = self
            .status
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| LedgerError::failed("completed entry without a status"))?;
        Ok(Begin::Completed(StoredAnswer {
            status,
            headers: decode_headers(self.headers.as_deref())?,
            body: self.body,
        }))
    }
}

/// When the oldest entry in the way expires, from its age; at least a second, so a client
/// that honours it does not spin.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn retry_after(key_ttl: Duration, oldest_age_ms: Option<i64>) -> Duration {
    let left = millis(key_ttl).saturating_sub(oldest_age_ms.unwrap_or(0));
    Duration::from_millis(u64::try_from(left).unwrap_or(0)).max(Duration::from_secs(1))
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
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

    #[test]
    fn content_types_are_compared_as_one_type() {
        let t = |v: &str| Fingerprint::new("POST", "/x", [0; 32]).with_content_type(v);
        assert_eq!(
            t("Application/JSON ; charset = UTF-8").content_type,
            "application/json;charset=utf-8"
        );
        assert_eq!(t("application/json").content_type, "application/json");
        assert_ne!(t("text/plain"), t("application/json"));
        assert_eq!(Fingerprint::new("POST", "/x", [0; 32]).content_type, "");
    }

    #[test]
    fn retry_after_is_when_the_oldest_expires_and_at_least_a_second() {
        let day = Duration::from_secs(86_400);
        assert_eq!(
            retry_after(day, Some(86_400_000 - 90_000)),
            Duration::from_secs(90)
        );
        assert_eq!(retry_after(day, Some(86_400_000)), Duration::from_secs(1));
        assert_eq!(retry_after(day, Some(99_999_999)), Duration::from_secs(1));
        assert_eq!(retry_after(day, None), day);
    }
}
