//! Explicit recovery (contract section 6): adopting unknown-owner records and settling
//! needs-attention ones. The shell runs these inside one readwrite transaction, only
//! after a fresh identity check confirmed `owner` (see `identity::confirms`).

use super::key::IdempotencyKey;
use super::record::{RecordId, RecordMeta, RecordState};
use crate::protocol::RecoverAction;

/// The adopted form of a record, or `None` when it is not adoptable: only unknown-owner
/// records that are not auth routes (and, when `ids` is given, only those ids). A record
/// without a key gets one.
pub fn adopt(
    record: &RecordMeta,
    owner: &str,
    ids: Option<&[RecordId]>,
    is_auth_route: bool,
    mint: impl FnOnce() -> Option<IdempotencyKey>,
) -> Option<RecordMeta> {
    if record.owner.is_some() || is_auth_route {
        return None;
    }
    if ids.is_some_and(|ids| !ids.contains(&record.id)) {
        return None;
    }
    let mut r = record.clone();
    r.owner = Some(owner.to_owned());
    if r.key.is_none() {
        r.key = Some(mint()?);
    }
    Some(r)
}

/// What a recovery does to its record.
#[derive(Debug, Clone, PartialEq)]
pub enum Recovery {
    /// Back to `queued` with a fresh key and no failures counted.
    Requeue(RecordMeta),
    Delete,
}

/// Why a recovery was refused (the record stays as it was).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryRefused {
    #[error("record {0} does not exist")]
    Missing(RecordId),
    #[error("record {0} belongs to another account")]
    NotOwner(RecordId),
    #[error("record {0} does not need attention")]
    NotNeedingAttention(RecordId),
    #[error("no cryptographic random source to mint a new Idempotency-Key")]
    NoRandomness,
}

/// Decides a `RECOVER_RECORD` for a record (`None`: it is gone or unreadable). A retry
/// is a new write as far as retention goes: its `timestamp` becomes `now_ms`, so an
/// expired record retried is not expired again at once. Its place in the queue (its id)
/// is kept.
pub fn recover(
    id: RecordId,
    record: Option<&RecordMeta>,
    owner: &str,
    action: RecoverAction,
    now_ms: u64,
    mint: impl FnOnce() -> Option<IdempotencyKey>,
) -> Result<Recovery, RecoveryRefused> {
    let r = record.ok_or(RecoveryRefused::Missing(id))?;
    if r.owner.as_deref() != Some(owner) {
        return Err(RecoveryRefused::NotOwner(id));
    }
    if r.state == RecordState::Queued {
        return Err(RecoveryRefused::NotNeedingAttention(id));
    }
    match action {
        RecoverAction::Discard => Ok(Recovery::Delete),
        RecoverAction::RetryNew => {
            let mut n = r.clone();
            n.key = Some(mint().ok_or(RecoveryRefused::NoRandomness)?);
            n.state = RecordState::Queued;
            n.server_failures = 0;
            n.last_status = None;
            n.timestamp = now_ms;
            Ok(Recovery::Requeue(n))
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::core::record::AttentionReason;

    fn rec(id: u64, owner: Option<&str>, state: RecordState) -> RecordMeta {
        RecordMeta {
            id: RecordId(id),
            method: "POST".into(),
            path: "/notes".into(),
            content_type: None,
            timestamp: 0,
            owner: owner.map(Into::into),
            workspace: None,
            key: None,
            state,
            server_failures: 2,
            last_status: Some(500),
            attempts: 1,
            body_len: 0,
        }
    }

    fn key() -> Option<IdempotencyKey> {
        IdempotencyKey::parse("fresh-key-0123456789abcdef").ok()
    }

    #[test]
    fn adoption_takes_only_unknown_owner_non_auth_records() {
        let unknown = rec(1, None, RecordState::Queued);
        let a = adopt(&unknown, "alice", None, false, key).expect("adoptable");
        assert_eq!(a.owner.as_deref(), Some("alice"));
        assert_eq!(a.key, key(), "a record without a key gets one");
        assert_eq!(
            adopt(
                &rec(2, Some("bob"), RecordState::Queued),
                "alice",
                None,
                false,
                key
            ),
            None
        );
        assert_eq!(
            adopt(
                &rec(3, Some("alice"), RecordState::Queued),
                "alice",
                None,
                false,
                key
            ),
            None
        );
        assert_eq!(
            adopt(&unknown, "alice", None, true, key),
            None,
            "auth routes never"
        );
        assert_eq!(
            adopt(&unknown, "alice", Some(&[RecordId(9)]), false, key),
            None
        );
        assert!(adopt(&unknown, "alice", Some(&[RecordId(1)]), false, key).is_some());
        let mut keyed = unknown.clone();
        keyed.key = IdempotencyKey::parse("kept-key-0123456789abcdef").ok();
        let a = adopt(&keyed, "alice", None, false, || panic!("must not mint")).expect("ok");
        assert_eq!(a.key, keyed.key, "an existing key is kept");
    }

    #[test]
    fn retry_new_requeues_with_a_fresh_key_and_no_failures() {
        let r = rec(
            4,
            Some("alice"),
            RecordState::NeedsAttention(AttentionReason::OutcomeUnknown),
        );
        let Ok(Recovery::Requeue(n)) = recover(
            RecordId(4),
            Some(&r),
            "alice",
            RecoverAction::RetryNew,
            99,
            key,
        ) else {
            panic!("must requeue");
        };
        assert_eq!(n.state, RecordState::Queued);
        assert_eq!(n.key, key());
        assert_eq!(n.server_failures, 0);
        assert_eq!(n.last_status, None);
        assert_eq!(n.timestamp, 99, "a retry restarts the retention clock");
        assert_eq!(
            recover(
                RecordId(4),
                Some(&r),
                "alice",
                RecoverAction::Discard,
                99,
                key
            ),
            Ok(Recovery::Delete)
        );
    }

    #[test]
    fn recovery_refuses_what_is_not_the_owners_needs_attention_record() {
        let queued = rec(5, Some("alice"), RecordState::Queued);
        let bobs = rec(
            6,
            Some("bob"),
            RecordState::NeedsAttention(AttentionReason::Rejected),
        );
        for action in [RecoverAction::RetryNew, RecoverAction::Discard] {
            assert_eq!(
                recover(RecordId(5), Some(&queued), "alice", action, 99, key),
                Err(RecoveryRefused::NotNeedingAttention(RecordId(5)))
            );
            assert_eq!(
                recover(RecordId(6), Some(&bobs), "alice", action, 99, key),
                Err(RecoveryRefused::NotOwner(RecordId(6)))
            );
            assert_eq!(
                recover(RecordId(7), None, "alice", action, 99, key),
                Err(RecoveryRefused::Missing(RecordId(7)))
            );
        }
    }
}
