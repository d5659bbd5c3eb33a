//! A flush's planning (contract 4.2, 4.3, 4.7): the queue read once, each record checked
//! against the key window and the retention (an expired one stored as needing a person
//! before anything is sent), and handed to the planner (`core::planner::Replay`), which
//! decides what may be sent and why the rest is blocked.

use super::identity::Stop;
use crate::core::answer::{check_age, Age};
use crate::core::backoff::FlushEnd;
use crate::core::delivery::StopReason;
use crate::core::planner::{PlanItem, Replay};
use crate::core::record::{RecordId, RecordMeta};
use crate::core::route::record_is_auth_route;
use crate::store::QueueItem;
use crate::worker::Inner;
use std::collections::HashMap;

/// The queue as this flush plans it.
pub(super) struct Plan {
    pub replay: Replay,
    /// One copy of each record's metadata (for reports and first-send marks).
    pub metas: HashMap<RecordId, RecordMeta>,
    /// Records read, corrupt ones included.
    pub total: usize,
    /// Records this flush found past the key window or the retention, and stored so.
    pub expired_now: usize,
    pub first_expired: Option<RecordId>,
    /// Some record's age cannot be known (the clock reads earlier than its first send):
    /// it is held, and the flush backs off as after a transient failure.
    pub unknown_age: bool,
}

/// Reads the queue and plans it for `user` (`None`: signed out, nothing is sent).
pub(super) async fn read(inner: &Inner, started: u64, user: Option<String>) -> Result<Plan, Stop> {
    let cfg = &inner.config;
    let items = read_all(inner).await.map_err(|e| Stop {
        stop: StopReason::Storage,
        end: FlushEnd::Transient,
        why: format!("the queue could not be read: {e}"),
        ask: None,
    })?;
    let mut metas: HashMap<RecordId, RecordMeta> = HashMap::new();
    let mut expired_now = 0;
    let mut first_expired: Option<RecordId> = None;
    let mut unknown_age = Vec::new();
    let mut plan = Vec::with_capacity(items.len());
    // Consumed, not cloned: the flush holds one copy of each record's metadata.
    for item in items {
        match item {
            QueueItem::Record(mut m) => {
                match check_age(&m, started, cfg) {
                    Age::Sendable => {}
                    Age::Unknown => unknown_age.push(m.id),
                    Age::Expired(expired) => {
                        let stored = inner
                            .store
                            .write_fields(m.id, &expired.mutable_fields())
                            .await
                            .is_ok();
                        if stored {
                            expired_now += 1;
                            first_expired = first_expired.or(Some(m.id));
                        }
                        // Stored or not, it is never sent with its old key (r3: fails
                        // closed): it is planned, and reported, as what it now is.
                        m = *expired;
                    }
                }
                let auth = record_is_auth_route(&m.path, cfg, &*inner.patterns);
                plan.push(PlanItem::of(&m, auth));
                metas.insert(m.id, m);
            }
            QueueItem::Corrupt(id, _) => plan.push(PlanItem::corrupt(id)),
        }
    }
    let total = plan.len();
    let mut replay = Replay::new(plan, user);
    // Only a record this flush would send holds it back (r4): another account's with a
    // clock behind its first send is blocked anyway, and never makes it back off.
    let clock_held = unknown_age.iter().any(|id| replay.would_send(*id));
    for id in &unknown_age {
        replay.hold(*id);
    }
    Ok(Plan {
        replay,
        metas,
        total,
        expired_now,
        first_expired,
        unknown_age: clock_held,
    })
}

/// Every stored value, with values under foreign keys given ids first so that they are
/// reported (`corrupt-record`) instead of counted but invisible. A re-keying that fails
/// never fails the read (issue 27, 8): the readable values are returned, and the
/// re-keying is tried again at the next read.
pub(in crate::worker) async fn read_all(
    inner: &Inner,
) -> Result<Vec<QueueItem>, crate::store::idb::IdbError> {
    let (items, foreign) = inner.store.read_queue().await?;
    if foreign == 0 {
        return Ok(items);
    }
    if let Err(e) = inner.store.rekey_foreign().await {
        web_sys::console::warn_1(
            &format!(
                "sw-outbox: {foreign} stored values under foreign keys could not be given ids: {e}"
            )
            .into(),
        );
        return Ok(items);
    }
    // The generation moved: the view reloads at its next use.
    inner.reload().await;
    Ok(inner.store.read_queue().await?.0)
}
