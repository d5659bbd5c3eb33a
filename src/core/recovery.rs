//! Explicit recovery (contract section 6): adopting unknown-owner records and settling
//! needs-attention ones. The shell runs these inside one readwrite transaction, only
//! after a fresh identity check confirmed `owner` (see `identity::confirms`).

use super::key::IdempotencyKey;
use super::record::{RecordId, RecordMeta, RecordState};

/// What a person asked for a record that needs attention (`RECOVER_RECORD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoverAction {
    RetryNew,
    Discard,
    /// Replace the body (the command's `edit`) and resend under a fresh key.
    Edit,
}

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
    Requeue(Box<RecordMeta>),
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
    #[error("record {0} is corrupt: it can only be discarded")]
    CorruptOnlyDiscard(RecordId),
    /// An edit of a `queued` record that has a first send: its old version may have
    /// reached the server, and the edit re-keys it, so both could be applied (r3). The
    /// reason is the contract's code, exactly.
    #[error("may-have-been-applied")]
    MayHaveBeenApplied(RecordId),
    /// A record of no known owner is read or discarded, never retried or edited: that
    /// would send it, which adoption (`REBIND_RECORDS`) is for.
    #[error("record {0} has no known owner: adopt it first to send it again")]
    UnknownOwner(RecordId),
    #[error("the new body is {len} bytes, over the outbox's limit of {max}")]
    TooLarge { len: usize, max: u32 },
}

/// An edit's new content (`RECOVER_RECORD` action `edit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub body: Vec<u8>,
    /// `None`: the record keeps its Content-Type.
    pub content_type: Option<String>,
}

/// What a `RECOVER_RECORD` finds under its id.
#[derive(Debug, Clone, Copy)]
pub enum Found<'a> {
    Gone,
    /// A value that is not a record: it has no readable owner, so any signed-in user of
    /// the device (verified like any recovery) may discard it, one by one.
    Corrupt,
    Record(&'a RecordMeta),
}

/// Whether `owner` (verified) may read a record owned by `record_owner` (`READ_RECORD`):
/// its own, or one of no known owner (r3: a person can copy it and drop it without ever
/// sending it, instead of adopting it).
pub fn readable_by(record_owner: Option<&str>, owner: &str) -> bool {
    record_owner.is_none_or(|o| o == owner)
}

/// Whether a command may stand on the persisted session when `authMePath` cannot be
/// reached (a network failure, or no answer in time; any HTTP answer is the authority):
/// `READ_RECORD` (`action` `None`), `edit` and `discard` change or reveal nothing on the
/// server, so a person can read, fix and cancel their own writes while offline (r3);
/// `retry-new` (and adoption) send the write, so they wait for the server to say who
/// is signed in. `persisted` is the account of the last `AUTH_SESSION`.
pub fn checked_offline(
    action: Option<RecoverAction>,
    persisted: Option<&str>,
    owner: &str,
) -> bool {
    let works_offline = !matches!(action, Some(RecoverAction::RetryNew));
    works_offline && persisted == Some(owner)
}

/// Decides a `RECOVER_RECORD` for what was found under `id`. A retry
/// is a new write as far as retention goes: its `timestamp` becomes `now_ms`, so an
/// expired record retried is not expired again at once. Its place in the queue (its id)
/// is kept. A discard takes the owner's record in either state (r3: discarding a
/// `queued` one cancels a write not yet delivered) and a record of no known owner.
pub fn recover(
    id: RecordId,
    found: Found<'_>,
    owner: &str,
    action: RecoverAction,
    now_ms: u64,
    mint: impl FnOnce() -> Option<IdempotencyKey>,
) -> Result<Recovery, RecoveryRefused> {
    let r = match (found, action) {
        (Found::Gone, _) => return Err(RecoveryRefused::Missing(id)),
        (Found::Corrupt, RecoverAction::Discard) => return Ok(Recovery::Delete),
        (Found::Corrupt, RecoverAction::RetryNew | RecoverAction::Edit) => {
            return Err(RecoveryRefused::CorruptOnlyDiscard(id))
        }
        (Found::Record(r), _) => r,
    };
    if !readable_by(r.owner.as_deref(), owner) {
        return Err(RecoveryRefused::NotOwner(id));
    }
    if action == RecoverAction::Discard {
        return Ok(Recovery::Delete);
    }
    if r.owner.is_none() {
        return Err(RecoveryRefused::UnknownOwner(id));
    }
    if r.state == RecordState::Queued {
        return Err(RecoveryRefused::NotNeedingAttention(id));
    }
    match action {
        RecoverAction::Discard => Ok(Recovery::Delete),
        // An edit carries content: `edit` decides it.
        RecoverAction::Edit => Err(RecoveryRefused::Missing(id)),
        RecoverAction::RetryNew => {
            let mut n = r.clone();
            n.key = Some(mint().ok_or(RecoveryRefused::NoRandomness)?);
            n.state = RecordState::Queued;
            n.server_failures = 0;
            n.conflicts = 0;
            n.conflicts_since = None;
            n.last_status = None;
            n.timestamp = now_ms;
            // A new key: no server has seen it, so its key window starts at its next send.
            n.first_sent_at = None;
            Ok(Recovery::Requeue(Box::new(n)))
        }
    }
}

/// Decides an edit (contract: issue "recovery people can use"): for the owner's queued
/// or needs-attention record, the new body (at most `max_body` bytes) replaces the old
/// one under a fresh key, the failure state is cleared, and its id — its place in its
/// lane — is kept, so it neither overtakes nor falls behind the writes around it. Like a
/// retry, it is a new write for retention and for the server's key window. A `queued`
/// record that has a first send is refused (r3, `may-have-been-applied`): the old key
/// may have reached the server and would still be applied by a retry of the server's
/// own, beside the edit. Once it needs attention the person was shown that it may
/// have been applied (`READ_RECORD`'s `sentBefore`), and may edit it.
pub fn edit(
    id: RecordId,
    found: Found<'_>,
    owner: &str,
    change: &Edit,
    max_body: u32,
    now_ms: u64,
    mint: impl FnOnce() -> Option<IdempotencyKey>,
) -> Result<RecordMeta, RecoveryRefused> {
    let r = match found {
        Found::Gone => return Err(RecoveryRefused::Missing(id)),
        Found::Corrupt => return Err(RecoveryRefused::CorruptOnlyDiscard(id)),
        Found::Record(r) => r,
    };
    if r.owner.is_none() {
        return Err(RecoveryRefused::UnknownOwner(id));
    }
    if r.owner.as_deref() != Some(owner) {
        return Err(RecoveryRefused::NotOwner(id));
    }
    if r.state == RecordState::Queued && r.first_sent_at.is_some() {
        return Err(RecoveryRefused::MayHaveBeenApplied(id));
    }
    if change.body.len() > max_body as usize {
        return Err(RecoveryRefused::TooLarge {
            len: change.body.len(),
            max: max_body,
        });
    }
    let mut n = r.clone();
    n.key = Some(mint().ok_or(RecoveryRefused::NoRandomness)?);
    n.state = RecordState::Queued;
    n.server_failures = 0;
    n.conflicts = 0;
    n.conflicts_since = None;
    n.last_status = None;
    n.first_sent_at = None;
    n.timestamp = now_ms;
    n.body_len = change.body.len();
    if let Some(ct) = &change.content_type {
        n.content_type = Some(ct.clone());
    }
    Ok(n)
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
            ..RecordMeta::default()
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
        let mut r = rec(
            4,
            Some("alice"),
            RecordState::NeedsAttention(AttentionReason::KeyExpired),
        );
        r.first_sent_at = Some(5);
        r.conflicts = 2;
        let Ok(Recovery::Requeue(n)) = recover(
            RecordId(4),
            Found::Record(&r),
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
            n.first_sent_at, None,
            "and, with its new key, the key window"
        );
        assert_eq!(n.conflicts, 0);
        assert_eq!(
            recover(
                RecordId(4),
                Found::Record(&r),
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
        assert_eq!(
            recover(
                RecordId(5),
                Found::Record(&queued),
                "alice",
                RecoverAction::RetryNew,
                99,
                key
            ),
            Err(RecoveryRefused::NotNeedingAttention(RecordId(5)))
        );
        for action in [RecoverAction::RetryNew, RecoverAction::Discard] {
            assert_eq!(
                recover(RecordId(6), Found::Record(&bobs), "alice", action, 99, key),
                Err(RecoveryRefused::NotOwner(RecordId(6)))
            );
            assert_eq!(
                recover(RecordId(7), Found::Gone, "alice", action, 99, key),
                Err(RecoveryRefused::Missing(RecordId(7)))
            );
        }
    }

    #[test]
    fn an_edit_replaces_the_body_under_a_new_key_in_its_place() {
        let mut r = rec(
            9,
            Some("alice"),
            RecordState::NeedsAttention(AttentionReason::Rejected),
        );
        r.first_sent_at = Some(3);
        let change = Edit {
            body: b"{\"title\":\"short\"}".to_vec(),
            content_type: Some("application/json".into()),
        };
        let n = edit(
            RecordId(9),
            Found::Record(&r),
            "alice",
            &change,
            1024,
            77,
            key,
        )
        .expect("edits");
        assert_eq!(n.id, RecordId(9), "same place in its lane");
        assert_eq!(n.state, RecordState::Queued);
        assert_eq!(n.key, key());
        assert_eq!(
            (n.server_failures, n.last_status, n.first_sent_at),
            (0, None, None)
        );
        assert_eq!(n.body_len, change.body.len());
        assert_eq!(n.content_type.as_deref(), Some("application/json"));
        assert_eq!(n.timestamp, 77);
        let queued = rec(10, Some("alice"), RecordState::Queued);
        assert!(
            edit(
                RecordId(10),
                Found::Record(&queued),
                "alice",
                &change,
                1024,
                0,
                key
            )
            .is_ok(),
            "a queued record that never left the worker may be edited too"
        );
        assert_eq!(
            edit(RecordId(9), Found::Record(&r), "bob", &change, 1024, 0, key),
            Err(RecoveryRefused::NotOwner(RecordId(9)))
        );
        assert_eq!(
            edit(RecordId(9), Found::Record(&r), "alice", &change, 4, 0, key),
            Err(RecoveryRefused::TooLarge {
                len: change.body.len(),
                max: 4
            })
        );
        assert_eq!(
            edit(RecordId(9), Found::Corrupt, "alice", &change, 1024, 0, key),
            Err(RecoveryRefused::CorruptOnlyDiscard(RecordId(9)))
        );
    }

    #[test]
    fn offline_the_persisted_session_stands_in_for_reading_editing_and_discarding() {
        for action in [
            None,
            Some(RecoverAction::Edit),
            Some(RecoverAction::Discard),
        ] {
            assert!(
                checked_offline(action, Some("alice"), "alice"),
                "{action:?}"
            );
            assert!(!checked_offline(action, Some("bob"), "alice"), "{action:?}");
            assert!(!checked_offline(action, None, "alice"), "{action:?}");
        }
        assert!(
            !checked_offline(Some(RecoverAction::RetryNew), Some("alice"), "alice"),
            "a retry sends the write: the server must say who is signed in"
        );
    }

    #[test]
    fn a_queued_record_of_its_owner_can_be_cancelled() {
        let queued = rec(5, Some("alice"), RecordState::Queued);
        assert_eq!(
            recover(
                RecordId(5),
                Found::Record(&queued),
                "alice",
                RecoverAction::Discard,
                99,
                key
            ),
            Ok(Recovery::Delete)
        );
        assert_eq!(
            recover(
                RecordId(5),
                Found::Record(&queued),
                "bob",
                RecoverAction::Discard,
                99,
                key
            ),
            Err(RecoveryRefused::NotOwner(RecordId(5))),
            "never another account's"
        );
    }

    #[test]
    fn an_edit_of_a_queued_record_that_may_have_been_sent_is_refused() {
        let change = Edit {
            body: b"{}".to_vec(),
            content_type: None,
        };
        let mut sent = rec(11, Some("alice"), RecordState::Queued);
        sent.first_sent_at = Some(5);
        let refused = edit(
            RecordId(11),
            Found::Record(&sent),
            "alice",
            &change,
            64,
            9,
            key,
        );
        assert_eq!(
            refused,
            Err(RecoveryRefused::MayHaveBeenApplied(RecordId(11)))
        );
        assert_eq!(
            refused.unwrap_err().to_string(),
            "may-have-been-applied",
            "the contract's reason, exactly"
        );
        // Once it needs attention, the person has been shown it may have been applied.
        sent.state = RecordState::NeedsAttention(AttentionReason::Repeated5xx);
        assert!(edit(
            RecordId(11),
            Found::Record(&sent),
            "alice",
            &change,
            64,
            9,
            key
        )
        .is_ok());
        // Edited once (a new key, never sent): it may be edited again.
        let mut edited = rec(12, Some("alice"), RecordState::Queued);
        edited.attempts = 3;
        edited.first_sent_at = None;
        assert!(edit(
            RecordId(12),
            Found::Record(&edited),
            "alice",
            &change,
            64,
            9,
            key
        )
        .is_ok());
    }

    #[test]
    fn a_record_of_no_known_owner_is_read_and_discarded_never_sent() {
        let unknown = rec(13, None, RecordState::Queued);
        assert!(readable_by(None, "alice"));
        assert!(readable_by(Some("alice"), "alice"));
        assert!(!readable_by(Some("bob"), "alice"));
        assert_eq!(
            recover(
                RecordId(13),
                Found::Record(&unknown),
                "alice",
                RecoverAction::Discard,
                9,
                key
            ),
            Ok(Recovery::Delete)
        );
        assert_eq!(
            recover(
                RecordId(13),
                Found::Record(&unknown),
                "alice",
                RecoverAction::RetryNew,
                9,
                key
            ),
            Err(RecoveryRefused::UnknownOwner(RecordId(13)))
        );
        let change = Edit {
            body: b"{}".to_vec(),
            content_type: None,
        };
        assert_eq!(
            edit(
                RecordId(13),
                Found::Record(&unknown),
                "alice",
                &change,
                64,
                9,
                key
            ),
            Err(RecoveryRefused::UnknownOwner(RecordId(13)))
        );
    }

    #[test]
    fn a_corrupt_record_can_be_discarded_by_whoever_is_signed_in_but_not_retried() {
        assert_eq!(
            recover(
                RecordId(8),
                Found::Corrupt,
                "bob",
                RecoverAction::Discard,
                99,
                key
            ),
            Ok(Recovery::Delete)
        );
        assert_eq!(
            recover(
                RecordId(8),
                Found::Corrupt,
                "bob",
                RecoverAction::RetryNew,
                99,
                key
            ),
            Err(RecoveryRefused::CorruptOnlyDiscard(RecordId(8)))
        );
    }
}
