//! A flush's reports and its stop (contract 4.8, 5): each replayed write's answer to
//! its account's windows, the blocked records and the summary (`stoppedBy`, `retryAt`)
//! to every window, the notification; then a flush that left work is retried — the
//! live worker's timer armed and, where Background Sync exists, a sync registered again.

use super::identity::Stop;
use super::lanes::Run;
use super::plan::Plan;
use super::settle::{conclude_stopped, Settled};
use super::{not_run, FlushOutcome};
use crate::core::backoff::{Backoff, Trigger};
use crate::core::delivery::Delivery;
use crate::protocol::{BlockedEntry, Outgoing};
use crate::worker::{clients, notify, retry, Inner};
use std::rc::Rc;

/// The reports of a flush that read the queue (`user`: the account it ran under).
pub(super) async fn report(
    inner: &Rc<Inner>,
    trigger: Trigger,
    user: Option<&str>,
    plan: &Plan,
    run: &mut Run,
    settled: &Settled,
) {
    // Each replayed write's answer, to its account's windows only (r3, contract 5); kept
    // for an account with no window open (r4).
    clients::settled(inner, std::mem::take(&mut run.settled)).await;
    // Asked once the stop is stored: the `AUTH_SESSION` that answers finds what it resumes.
    if let Some(c) = &run.refused {
        inner.credential_refused(Some(&c.authorization));
        run.ask_for = run.ask_for.take().or(Some(c.user.clone()));
    }
    if let Some(user) = &run.ask_for {
        clients::ask_for_credential(inner, user).await;
    }
    if !run.identity_changed {
        // Each window sees the details of its own account's records only (r4: the
        // account it is on, not the flush's).
        let blocked = plan.replay.blocked();
        clients::per_viewer(inner, |viewer| Outgoing::Blocked {
            blocked: blocked
                .iter()
                .map(|&(id, reason)| BlockedEntry::of(id, plan.metas.get(&id), reason, viewer))
                .collect(),
        })
        .await;
    }
    let replayed = plan.replay.replayed();
    // Whether a window got this report decides the notification: a person who saw the
    // report in a page needs none, and a page opened after it asks for the queue itself.
    let reached = clients::broadcast(&Outgoing::flush_summary(
        replayed,
        settled.remaining,
        plan.total.saturating_sub(replayed),
        settled.delivery.stopped_by,
        settled.delivery.retry_at,
    ))
    .await;
    if !run.identity_changed {
        let attention = plan.replay.moved_to_attention() + plan.expired_now;
        notify::after_flush(
            inner,
            trigger,
            reached > 0,
            user,
            &run.sent_kinds,
            attention,
            run.first_attention,
        )
        .await;
    }
}

/// A flush that stopped before it read the queue (the identity check, or the queue's
/// read, failed): the stop is persisted, reported (`MUTATIONS_PARTIAL` with `stoppedBy`
/// and `retryAt`, no `MUTATIONS_BLOCKED`: without an identity nothing can be said of the
/// records) and retried (contract 4.1, 4.8).
pub(super) async fn before_reading(
    inner: &Rc<Inner>,
    trigger: Trigger,
    backoff: Backoff,
    started: u64,
    Stop {
        stop,
        end,
        why,
        ask,
    }: Stop,
) -> FlushOutcome {
    let settled = conclude_stopped(inner, backoff, started, stop, end).await;
    if let Some(user) = &ask {
        clients::ask_for_credential(inner, user).await;
    }
    if !settled.drained {
        clients::broadcast(&Outgoing::flush_summary(
            0,
            settled.remaining,
            1,
            settled.delivery.stopped_by,
            settled.delivery.retry_at,
        ))
        .await;
    }
    let keep_alive = retry_later(inner, trigger, &settled.delivery, settled.drained).await;
    let mut out = not_run(why, !settled.drained);
    out.keep_alive = keep_alive;
    out.reported = !settled.drained;
    out
}

/// After a flush that left work: the live worker's timer is armed for `retryAt` (every
/// engine, with or without Background Sync), and where Background Sync exists a sync is
/// registered again (one that gave up after its retries is gone) — except while a sync
/// event is being handled: its rejection already has the browser retry it, and a
/// registration made while it fires would fire again as soon as it ends (a loop of sync
/// events that never lets a new version activate).
pub(super) async fn retry_later(
    inner: &Rc<Inner>,
    trigger: Trigger,
    delivery: &Delivery,
    drained: bool,
) -> Option<js_sys::Promise> {
    // A retry an earlier flush armed would only meet the same refusal without the
    // sign-in this stop waits for. (A drained queue keeps it: a write queued since the
    // queue was counted may have armed it.)
    if delivery.stopped_by.is_some_and(|s| s.awaits_trigger()) {
        inner.disarm_retry();
    }
    if drained {
        return None;
    }
    let sync_firing = trigger == Trigger::Sync || inner.syncs_firing.get() > 0;
    if delivery.retry_at.is_some() && !sync_firing && inner.background_sync {
        retry::register_sync(&inner.config.sync_tag).await;
    }
    inner.retry_when(delivery.retry_at)
}
