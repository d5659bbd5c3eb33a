//! The first attempt of a write (contract section 2): whose it is, which key it carries,
//! and what the page is told when it could not go through.

use super::config::Config;
use super::key::{IdempotencyKey, KeyError};
use super::record::RecordId;
use serde_json::{Map, Value};

/// The account a write is bound to, captured before it is sent: the page's own
/// `X-PM-Expected-Account`, else the session of the last `AUTH_SESSION`, else unknown.
pub fn capture_owner(page_header: Option<&str>, session_user: Option<&str>) -> Option<String> {
    page_header
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .or(session_user.filter(|s| !s.is_empty()))
        .map(str::to_owned)
}

/// The record's key: the page's `Idempotency-Key` when it set one (it must have the
/// key's shape, or the write is refused before it is sent), else a fresh one.
pub fn choose_key(
    page_header: Option<&str>,
    mint: impl FnOnce() -> Option<IdempotencyKey>,
) -> Result<IdempotencyKey, FirstAttemptRefusal> {
    match page_header.map(str::trim) {
        Some(k) => IdempotencyKey::parse(k).map_err(FirstAttemptRefusal::Key),
        None => mint().ok_or(FirstAttemptRefusal::NoRandomness),
    }
}

/// Why a write was refused before it was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FirstAttemptRefusal {
    #[error("{0}")]
    Key(KeyError),
    #[error("no cryptographic random source to mint an Idempotency-Key")]
    NoRandomness,
}

/// Why a write that failed to go through could not be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotQueued {
    #[error("the request body is {len} bytes, over the outbox's limit of {max}")]
    TooLarge { len: usize, max: u32 },
    #[error("the outbox already holds its maximum of {max} queued writes")]
    Full { max: u32 },
    #[error("the write could not be stored on this device: {0}")]
    Storage(String),
    /// `neverQueuePattern` matched and the network failed (contract 2.9, r2).
    #[error("this write is never queued (neverQueuePattern) and the network failed: it was not sent; keep the user's input and try again")]
    NeverQueued,
    /// `neverQueuePattern` matched and an earlier write of its lane is unresolved:
    /// sending it would overtake that write, queuing it is not allowed.
    #[error("this write is never queued (neverQueuePattern) and an earlier write of its workspace is still waiting to be delivered: it was not sent")]
    NeverQueuedBehind,
    /// `CLEAR_DEVICE` committed while the write was on its first attempt (contract 6, r2).
    #[error("this device was cleared while the write was being sent: it was not stored")]
    Cleared,
}

/// Whether a failed write may be queued at all, before storage is touched.
pub fn check_queueable(body_len: usize, config: &Config) -> Result<(), NotQueued> {
    if body_len > config.max_body_bytes as usize {
        return Err(NotQueued::TooLarge {
            len: body_len,
            max: config.max_body_bytes,
        });
    }
    Ok(())
}

/// An answer the worker makes up for the page: a status and a JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticAnswer {
    pub status: u16,
    pub body: Value,
}

impl SyntheticAnswer {
    /// The 202 a page gets once its write is committed to IndexedDB. `background`:
    /// Background Sync was registered for it, so it can be delivered while no page of
    /// the site is open (r3).
    pub fn queued(id: RecordId, key: &IdempotencyKey, background: bool) -> Self {
        SyntheticAnswer {
            status: 202,
            body: object(vec![
                ("queued", Value::Bool(true)),
                ("id", id.0.into()),
                ("idempotencyKey", key.as_str().into()),
                (
                    "message",
                    "Request queued for when you are back online".into(),
                ),
                ("background", Value::Bool(background)),
            ]),
        }
    }

    /// A write that is not stored: 413, 507 or 503, never claimed queued.
    pub fn not_queued(why: &NotQueued) -> Self {
        let status = match why {
            NotQueued::TooLarge { .. } => 413,
            NotQueued::Full { .. } => 507,
            NotQueued::Storage(_)
            | NotQueued::NeverQueued
            | NotQueued::NeverQueuedBehind
            | NotQueued::Cleared => 503,
        };
        SyntheticAnswer {
            status,
            body: object(vec![
                ("queued", Value::Bool(false)),
                ("error", why.to_string().into()),
            ]),
        }
    }

    /// A write refused before it was sent (a page key of the wrong shape).
    pub fn refused(why: &FirstAttemptRefusal) -> Self {
        let status = match why {
            FirstAttemptRefusal::Key(_) => 400,
            FirstAttemptRefusal::NoRandomness => 503,
        };
        SyntheticAnswer {
            status,
            body: object(vec![
                ("queued", Value::Bool(false)),
                ("error", why.to_string().into()),
            ]),
        }
    }

    /// A read (or auth request) whose network failed.
    pub fn offline() -> Self {
        SyntheticAnswer {
            status: 503,
            body: object(vec![("error", "offline".into())]),
        }
    }

    /// A write of the outbox's that arrived while the module could not start (`why`):
    /// never sent around the outbox (without its key and expected account), never
    /// claimed queued. `www/sw.js` gives it, from this template (tests/sw_rules.rs).
    pub fn not_started(why: &str) -> Self {
        SyntheticAnswer {
            status: 503,
            body: object(vec![
                ("queued", Value::Bool(false)),
                ("error", NOT_STARTED_ERROR.replace(WHY, why).into()),
            ]),
        }
    }
}

/// Where [`NOT_STARTED_ERROR`] names the reason.
pub const WHY: &str = "{why}";

/// The error text of [`SyntheticAnswer::not_started`].
pub const NOT_STARTED_ERROR: &str =
    "the outbox could not start ({why}), so this write was neither sent nor stored: try again";

/// A JSON object from its fields, built directly: `json!` goes through `to_value` and
/// an `unwrap` for every field, which costs the module a serializer and a panic path.
/// (Inserted one by one: collecting would sort the fields, with a sort of its own.)
fn object(fields: Vec<(&str, Value)>) -> Value {
    let mut map = Map::new();
    for (k, v) in fields {
        map.insert(k.to_owned(), v);
    }
    Value::Object(map)
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn owner_prefers_the_page_header_then_the_session() {
        assert_eq!(
            capture_owner(Some("bob"), Some("alice")).as_deref(),
            Some("bob")
        );
        assert_eq!(capture_owner(None, Some("alice")).as_deref(), Some("alice"));
        assert_eq!(
            capture_owner(Some("  "), Some("alice")).as_deref(),
            Some("alice")
        );
        assert_eq!(capture_owner(None, None), None);
        assert_eq!(capture_owner(None, Some("")), None);
    }

    #[test]
    fn page_keys_are_kept_or_refused_and_absent_keys_minted() {
        for page in ["client-key-0123456789abcdef", "order_1234", "k:7f3e"] {
            let k = choose_key(Some(page), || panic!("must not mint")).expect("kept");
            assert_eq!(k.as_str(), page);
        }
        assert!(matches!(
            choose_key(Some("bad key"), IdempotencyKey::mint_opt),
            Err(FirstAttemptRefusal::Key(_))
        ));
        let minted = choose_key(None, IdempotencyKey::mint_opt).expect("minted");
        assert_eq!(minted.as_str().len(), 36);
        assert_eq!(
            choose_key(None, || None),
            Err(FirstAttemptRefusal::NoRandomness)
        );
    }

    #[test]
    fn bodies_over_the_limit_are_not_queueable() {
        let c = Config::default();
        assert!(check_queueable(1024 * 1024, &c).is_ok());
        assert_eq!(
            check_queueable(1024 * 1024 + 1, &c),
            Err(NotQueued::TooLarge {
                len: 1_048_577,
                max: 1_048_576
            })
        );
    }

    #[test]
    fn synthetic_answers_have_the_contracts_shape() {
        let key = IdempotencyKey::parse("abcdefghijklmnopqrstuvwxyz").expect("valid");
        let a = SyntheticAnswer::queued(RecordId(7), &key, true);
        assert_eq!(a.status, 202);
        assert_eq!(a.body["background"], true);
        assert_eq!(
            SyntheticAnswer::queued(RecordId(7), &key, false).body["background"],
            false
        );
        assert_eq!(a.body["queued"], true);
        assert_eq!(a.body["id"], 7);
        assert_eq!(a.body["idempotencyKey"], key.as_str());
        assert_eq!(
            a.body["message"],
            "Request queued for when you are back online"
        );
        let cases = [
            (NotQueued::TooLarge { len: 2, max: 1 }, 413),
            (NotQueued::Full { max: 1 }, 507),
            (NotQueued::Storage("QuotaExceededError".into()), 503),
            (NotQueued::NeverQueued, 503),
            (NotQueued::NeverQueuedBehind, 503),
            (NotQueued::Cleared, 503),
        ];
        for (why, status) in cases {
            let a = SyntheticAnswer::not_queued(&why);
            assert_eq!(a.status, status);
            assert_eq!(a.body["queued"], false);
            assert!(a.body["error"].as_str().is_some_and(|e| !e.is_empty()));
        }
        assert_eq!(SyntheticAnswer::offline().body, json!({"error":"offline"}));
    }
}
