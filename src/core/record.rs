//! The queued write as IndexedDB holds it (contract section 3), and its reading.
//!
//! A stored value is read in two steps: serde into [`RawRecord`], whose fields are all
//! optional so that version-1 records and hand-edited ones still deserialise, then
//! [`RecordMeta::from_raw`], which decides whether it is a record at all. Anything that
//! fails either step is *corrupt*: kept, reported, never sent.

use super::key::IdempotencyKey;
use super::route::{is_write_method, Patterns};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The IndexedDB key of a record. Auto-increment keys are integers below 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RecordId(pub u64);

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The largest integer a JavaScript number holds exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Why a record waits for a person instead of being replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionReason {
    /// The server could not tell whether the write was applied.
    OutcomeUnknown,
    /// The server saw the key with a different request.
    KeyReused,
    /// `maxServerFailures` 5xx answers in a row.
    #[serde(rename = "repeated-5xx")]
    Repeated5xx,
    /// A 4xx the outbox cannot fix; the status is kept in `lastStatus`.
    Rejected,
    /// Older than `maxRetentionMs`.
    Expired,
    /// The server answered a replay with a redirect (3xx, or an opaque redirect): the
    /// write was not applied where it was sent, and following it would turn it into a
    /// GET or resend it elsewhere (contract 4.5, r2).
    Redirected,
    /// `maxServerFailures` 409s in a row with no outcome-unknown marker: the server keeps
    /// saying another request with this key is running.
    Conflict,
    /// It may have reached the server, and its first send is older than
    /// `serverKeyTtlMs`: the server may have forgotten its key, so resending it could
    /// apply it twice (contract 4.7, r2).
    KeyExpired,
}

impl AttentionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AttentionReason::OutcomeUnknown => "outcome-unknown",
            AttentionReason::KeyReused => "key-reused",
            AttentionReason::Repeated5xx => "repeated-5xx",
            AttentionReason::Rejected => "rejected",
            AttentionReason::Expired => "expired",
            AttentionReason::Redirected => "redirected",
            AttentionReason::Conflict => "conflict",
            AttentionReason::KeyExpired => "key-expired",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            AttentionReason::OutcomeUnknown,
            AttentionReason::KeyReused,
            AttentionReason::Repeated5xx,
            AttentionReason::Rejected,
            AttentionReason::Expired,
            AttentionReason::Redirected,
            AttentionReason::Conflict,
            AttentionReason::KeyExpired,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// The page's credentials mode, kept for replays (contract 4.4, r2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Credentials {
    /// Records written before the mode was stored were replayed with cookies.
    #[default]
    Include,
    SameOrigin,
    Omit,
}

impl Credentials {
    pub fn as_str(self) -> &'static str {
        match self {
            Credentials::Include => "include",
            Credentials::SameOrigin => "same-origin",
            Credentials::Omit => "omit",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Credentials::Include,
            Credentials::SameOrigin,
            Credentials::Omit,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

/// A record's state; needs-attention always carries its reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    Queued,
    NeedsAttention(AttentionReason),
}

/// A stored value as serde sees it, before it is trusted. Unknown fields are ignored
/// (the body among them: it is read only when the record is sent).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawRecord {
    pub id: Option<f64>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub content_type: Option<String>,
    pub timestamp: Option<f64>,
    pub owner_id: Option<String>,
    pub workspace: Option<String>,
    pub idempotency_key: Option<String>,
    pub state: Option<String>,
    pub attention_reason: Option<String>,
    pub server_failures: Option<f64>,
    pub last_status: Option<f64>,
    pub attempts: Option<f64>,
    /// Schema 3: the body lives in its own store; this is its length.
    pub body_size: Option<f64>,
    pub first_sent_at: Option<f64>,
    pub headers: Option<Vec<(String, String)>>,
    pub credentials: Option<String>,
    pub conflicts: Option<f64>,
    pub conflicts_since: Option<f64>,
}

/// A record's metadata: everything but the body bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordMeta {
    pub id: RecordId,
    pub method: String,
    /// Path and query relative to the API base.
    pub path: String,
    pub content_type: Option<String>,
    /// Milliseconds since the epoch when the write was queued.
    pub timestamp: u64,
    /// The account that queued it; `None` is an unknown owner.
    pub owner: Option<String>,
    pub workspace: Option<String>,
    /// `None` only for records from version 1; adoption mints one.
    pub key: Option<IdempotencyKey>,
    pub state: RecordState,
    pub server_failures: u32,
    /// The status of the last answer that moved it to needs-attention.
    pub last_status: Option<u16>,
    /// How many times a replay of it was started (marked before each request).
    pub attempts: u32,
    /// The size of the stored body, for listings.
    pub body_len: usize,
    /// When it was first sent, if ever (ms since the epoch): a first attempt, or the
    /// first replay. `None`: it never left the worker, so the server cannot have applied
    /// it and its key window does not apply (contract 4.7).
    pub first_sent_at: Option<u64>,
    /// The page's headers that its replays carry (`replayHeaders`), in the page's order.
    pub headers: Vec<(String, String)>,
    pub credentials: Credentials,
    /// 409 answers in a row without an outcome-unknown marker ("still running").
    pub conflicts: u32,
    /// When the first of those answers came (ms since the epoch): `conflict` waits for
    /// `stillRunningPatienceMs` from it (contract 4.5, r4). `None` while `conflicts` is
    /// 0, and for a count stored by an earlier version (the time starts at the next).
    pub conflicts_since: Option<u64>,
}

impl Default for RecordMeta {
    /// A queued account-level POST with id 0 and no owner: a starting point for builders
    /// and tests, never a stored record.
    fn default() -> Self {
        RecordMeta {
            id: RecordId(0),
            method: "POST".into(),
            path: "/".into(),
            content_type: None,
            timestamp: 0,
            owner: None,
            workspace: None,
            key: None,
            state: RecordState::Queued,
            server_failures: 0,
            last_status: None,
            attempts: 0,
            body_len: 0,
            first_sent_at: None,
            headers: Vec::new(),
            credentials: Credentials::Include,
            conflicts: 0,
            conflicts_since: None,
        }
    }
}

/// Why a stored value is not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorruptRecord {
    #[error("the stored value is not an object with the record's field types: {0}")]
    Shape(String),
    #[error("field {0} is missing or invalid")]
    Field(&'static str),
}

fn count(v: Option<f64>, field: &'static str) -> Result<u32, CorruptRecord> {
    match v {
        None => Ok(0),
        Some(n) if n.is_finite() && n >= 0.0 && n.fract() == 0.0 && n <= u32::MAX as f64 => {
            Ok(n as u32)
        }
        Some(_) => Err(CorruptRecord::Field(field)),
    }
}

impl RecordMeta {
    /// Trusts a raw value as a record, or says which field makes it corrupt. `id` is
    /// the IndexedDB primary key; `body_len` is `None` when the stored body is neither
    /// absent, bytes nor a string. Missing `workspace` is derived from the path (the
    /// version-1 upgrade); a missing owner stays unknown.
    pub fn from_raw(
        id: RecordId,
        raw: RawRecord,
        body_len: Option<usize>,
        patterns: &dyn Patterns,
    ) -> Result<RecordMeta, CorruptRecord> {
        let method = raw
            .method
            .filter(|m| is_write_method(m))
            .ok_or(CorruptRecord::Field("method"))?
            .to_ascii_uppercase();
        let path = raw
            .path
            .filter(|p| p.starts_with('/'))
            .ok_or(CorruptRecord::Field("path"))?;
        let timestamp = match raw.timestamp {
            Some(t) if t.is_finite() && t >= 0.0 => t as u64,
            _ => return Err(CorruptRecord::Field("timestamp")),
        };
        let key = match raw.idempotency_key {
            None => None,
            Some(k) => Some(
                IdempotencyKey::parse(&k).map_err(|_| CorruptRecord::Field("idempotencyKey"))?,
            ),
        };
        let state = match raw.state.as_deref() {
            None | Some("queued") => RecordState::Queued,
            Some("needs-attention") => RecordState::NeedsAttention(
                raw.attention_reason
                    .as_deref()
                    .and_then(AttentionReason::parse)
                    .ok_or(CorruptRecord::Field("attentionReason"))?,
            ),
            Some(_) => return Err(CorruptRecord::Field("state")),
        };
        let last_status = match raw.last_status {
            None => None,
            // 0: an opaque redirect (a replay is sent with `redirect: "manual"`).
            Some(s) if (s == 0.0 || (100.0..=599.0).contains(&s)) && s.fract() == 0.0 => {
                Some(s as u16)
            }
            Some(_) => return Err(CorruptRecord::Field("lastStatus")),
        };
        let workspace = raw.workspace.or_else(|| patterns.workspace(&path));
        let body_len = match raw.body_size {
            None => body_len,
            Some(n) => Some(count(Some(n), "bodySize")? as usize),
        };
        let body_len = body_len.ok_or(CorruptRecord::Field("body"))?;
        let first_sent_at = match raw.first_sent_at {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => Some(t as u64),
            Some(_) => return Err(CorruptRecord::Field("firstSentAt")),
        };
        let conflicts_since = match raw.conflicts_since {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => Some(t as u64),
            Some(_) => return Err(CorruptRecord::Field("conflictsSince")),
        };
        let credentials = match raw.credentials.as_deref() {
            None => Credentials::Include,
            Some(c) => Credentials::parse(c).ok_or(CorruptRecord::Field("credentials"))?,
        };
        Ok(RecordMeta {
            id,
            method,
            path,
            content_type: raw.content_type,
            timestamp,
            owner: raw.owner_id.filter(|o| !o.is_empty()),
            workspace,
            key,
            state,
            server_failures: count(raw.server_failures, "serverFailures")?,
            last_status,
            attempts: count(raw.attempts, "attempts")?,
            body_len,
            first_sent_at,
            headers: raw.headers.unwrap_or_default(),
            credentials,
            conflicts: count(raw.conflicts, "conflicts")?,
            conflicts_since,
        })
    }

    /// The fields a state change may rewrite, in their stored form.
    pub fn mutable_fields(&self) -> MutableFields {
        let (state, attention_reason) = match self.state {
            RecordState::Queued => ("queued", None),
            RecordState::NeedsAttention(r) => ("needs-attention", Some(r.as_str())),
        };
        MutableFields {
            timestamp: self.timestamp,
            owner_id: self.owner.clone(),
            workspace: self.workspace.clone(),
            idempotency_key: self.key.as_ref().map(|k| k.as_str().to_owned()),
            state,
            attention_reason,
            server_failures: self.server_failures,
            last_status: self.last_status,
            attempts: self.attempts,
            first_sent_at: self.first_sent_at,
            conflicts: self.conflicts,
            conflicts_since: self.conflicts_since,
            content_type: self.content_type.clone(),
            body_size: self.body_len,
        }
    }
}

/// What a settle, adoption or recovery writes over a stored record. The shell assigns
/// these onto the stored object, so the body bytes are never copied through Rust.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MutableFields {
    pub timestamp: u64,
    pub owner_id: Option<String>,
    pub workspace: Option<String>,
    pub idempotency_key: Option<String>,
    pub state: &'static str,
    pub attention_reason: Option<&'static str>,
    pub server_failures: u32,
    pub last_status: Option<u16>,
    pub attempts: u32,
    pub first_sent_at: Option<u64>,
    pub conflicts: u32,
    pub conflicts_since: Option<u64>,
    /// Changed only by an edit (with the body, in the same transaction).
    pub content_type: Option<String>,
    pub body_size: usize,
}

/// A write about to be queued; the shell adds the body bytes and IndexedDB the id.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewRecord {
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub timestamp: u64,
    pub owner_id: Option<String>,
    pub workspace: Option<String>,
    pub idempotency_key: IdempotencyKey,
    pub state: &'static str,
    pub attention_reason: Option<&'static str>,
    pub server_failures: u32,
    pub last_status: Option<u16>,
    pub attempts: u32,
    pub body_size: usize,
    pub first_sent_at: Option<u64>,
    pub headers: Vec<(String, String)>,
    pub credentials: &'static str,
    pub conflicts: u32,
}

/// What a page's write carries into its record besides method, path and body.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WriteParts {
    pub content_type: Option<String>,
    /// The page's headers kept for replays (already filtered by `Config::stores_header`).
    pub headers: Vec<(String, String)>,
    pub credentials: Credentials,
}

impl NewRecord {
    /// A queued record. `first_sent_at` is when its first attempt went out, `None` when
    /// it was queued without one (behind its lane, or while the network was known down).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        method: &str,
        path: String,
        parts: WriteParts,
        body_size: usize,
        timestamp: u64,
        first_sent_at: Option<u64>,
        owner: Option<String>,
        workspace: Option<String>,
        key: IdempotencyKey,
    ) -> NewRecord {
        NewRecord {
            method: method.to_ascii_uppercase(),
            path,
            content_type: parts.content_type,
            timestamp,
            owner_id: owner,
            workspace,
            idempotency_key: key,
            state: "queued",
            attention_reason: None,
            server_failures: 0,
            last_status: None,
            attempts: 0,
            body_size,
            first_sent_at,
            headers: parts.headers,
            credentials: parts.credentials.as_str(),
            conflicts: 0,
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::core::route::test_patterns::RegexPatterns;

    fn parse(json: &str) -> Result<RecordMeta, CorruptRecord> {
        let raw: RawRecord =
            serde_json::from_str(json).map_err(|e| CorruptRecord::Shape(e.to_string()))?;
        RecordMeta::from_raw(RecordId(1), raw, Some(0), &RegexPatterns::defaults())
    }

    #[test]
    fn a_version_2_record_reads_back() {
        let m = parse(
            r#"{"id":1,"method":"post","path":"/projects/p1/tasks","body":null,
                "contentType":"application/json","timestamp":1700000000000,
                "ownerId":"alice","workspace":"p1",
                "idempotencyKey":"0b8f6d3e-6c53-4b1a-9d7e-2f4b5c6d7e8f",
                "state":"needs-attention","attentionReason":"rejected","lastStatus":422,
                "serverFailures":2}"#,
        )
        .expect("valid");
        assert_eq!(m.method, "POST");
        assert_eq!(m.owner.as_deref(), Some("alice"));
        assert_eq!(
            m.state,
            RecordState::NeedsAttention(AttentionReason::Rejected)
        );
        assert_eq!(m.last_status, Some(422));
        assert_eq!(m.server_failures, 2);
        assert_eq!(m.first_sent_at, None);
        assert_eq!(m.credentials, Credentials::Include);
        assert!(m.headers.is_empty());
    }

    #[test]
    fn a_version_3_record_reads_its_new_fields() {
        let m = parse(
            r#"{"method":"PUT","path":"/projects/p1/tasks/3","timestamp":5,"bodySize":12,
                "firstSentAt":7,"headers":[["If-Match","\"3\""],["Accept","application/json"]],
                "credentials":"same-origin","conflicts":2,"ownerId":"alice",
                "idempotencyKey":"order_1234","state":"needs-attention",
                "attentionReason":"key-expired"}"#,
        )
        .expect("valid");
        assert_eq!(m.body_len, 12);
        assert_eq!(m.first_sent_at, Some(7));
        assert_eq!(
            m.headers,
            vec![
                ("If-Match".to_owned(), "\"3\"".to_owned()),
                ("Accept".to_owned(), "application/json".to_owned())
            ]
        );
        assert_eq!(m.credentials, Credentials::SameOrigin);
        assert_eq!(m.conflicts, 2);
        assert_eq!(
            m.state,
            RecordState::NeedsAttention(AttentionReason::KeyExpired)
        );
        for (json, field) in [
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"bodySize":-1}"#,
                "bodySize",
            ),
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"firstSentAt":-5}"#,
                "firstSentAt",
            ),
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"credentials":"all"}"#,
                "credentials",
            ),
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"conflicts":1.5}"#,
                "conflicts",
            ),
        ] {
            assert_eq!(parse(json), Err(CorruptRecord::Field(field)), "{json}");
        }
        assert!(matches!(
            parse(r#"{"method":"POST","path":"/x","timestamp":1,"headers":[["a"]]}"#),
            Err(CorruptRecord::Shape(_))
        ));
    }

    #[test]
    fn every_attention_reason_round_trips() {
        for r in [
            AttentionReason::OutcomeUnknown,
            AttentionReason::KeyReused,
            AttentionReason::Repeated5xx,
            AttentionReason::Rejected,
            AttentionReason::Expired,
            AttentionReason::Redirected,
            AttentionReason::Conflict,
            AttentionReason::KeyExpired,
        ] {
            assert_eq!(AttentionReason::parse(r.as_str()), Some(r));
        }
    }

    #[test]
    fn a_version_1_record_becomes_unknown_owner_with_derived_workspace() {
        let m = parse(
            r#"{"id":3,"method":"POST","path":"/projects/9/tasks","body":"{\"t\":1}",
                "timestamp":5}"#,
        )
        .expect("valid");
        assert_eq!(m.owner, None);
        assert_eq!(m.workspace.as_deref(), Some("9"));
        assert_eq!(m.key, None);
        assert_eq!(m.state, RecordState::Queued);
    }

    #[test]
    fn wrong_field_types_are_corrupt() {
        for bad in [
            r#"{"method":5,"path":"/x","timestamp":1}"#,
            r#"{"method":"POST","path":["/x"],"timestamp":1}"#,
            r#"{"method":"POST","path":"/x","timestamp":"yesterday"}"#,
            r#"{"method":"POST","path":"/x","timestamp":1,"ownerId":7}"#,
            r#""just a string""#,
        ] {
            assert!(matches!(parse(bad), Err(CorruptRecord::Shape(_))), "{bad}");
        }
    }

    #[test]
    fn invalid_values_are_corrupt_naming_the_field() {
        let cases = [
            (r#"{"method":"GET","path":"/x","timestamp":1}"#, "method"),
            (r#"{"method":"POST","path":"x","timestamp":1}"#, "path"),
            (r#"{"method":"POST","path":"/x"}"#, "timestamp"),
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"idempotencyKey":"bad key"}"#,
                "idempotencyKey",
            ),
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"state":"lost"}"#,
                "state",
            ),
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"state":"needs-attention"}"#,
                "attentionReason",
            ),
            (
                r#"{"method":"POST","path":"/x","timestamp":1,"serverFailures":-1}"#,
                "serverFailures",
            ),
        ];
        for (json, field) in cases {
            assert_eq!(parse(json), Err(CorruptRecord::Field(field)), "{json}");
        }
        let raw: RawRecord =
            serde_json::from_str(r#"{"method":"POST","path":"/x","timestamp":1}"#).expect("ok");
        assert_eq!(
            RecordMeta::from_raw(RecordId(1), raw, None, &RegexPatterns::defaults()),
            Err(CorruptRecord::Field("body"))
        );
    }

    #[test]
    fn mutable_fields_serialise_in_the_stored_shape() {
        let m = parse(
            r#"{"method":"PUT","path":"/notes/1","timestamp":1,"state":"needs-attention",
                "attentionReason":"repeated-5xx","serverFailures":3}"#,
        )
        .expect("valid");
        let v = serde_json::to_value(m.mutable_fields()).expect("serialises");
        assert_eq!(v["state"], "needs-attention");
        assert_eq!(v["attentionReason"], "repeated-5xx");
        assert_eq!(v["serverFailures"], 3);
        assert!(v["ownerId"].is_null());
    }
}
