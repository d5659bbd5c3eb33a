//! A flush (contract section 4), as named steps, one module each:
//!
//! 1. the gate: the backoff (`core::backoff`) says whether a flush may run now;
//! 2. [`identity`]: who is signed in (4.1), asked once the sign-in barrier is settled
//!    (4.5 end), and the re-checks a session change or a stale identity earns;
//! 3. [`plan`]: the queue read once, the key window and retention applied (4.7), the
//!    planner's order (4.2, 4.3);
//! 4. [`lanes`]: what the planner hands out, sent up to `replayConcurrency` at once, one
//!    record each by [`send`] (4.4: the request; 4.5: the answer, its new state handed to
//!    the group commit; the barrier checked right before each `fetch()`), each record's
//!    first-send mark durable before it leaves, committed ahead ([`marks`], 4.7 r4);
//! 5. [`settle`]: how the flush ended — backoff and delivery state stored (4.8);
//! 6. [`stop`]: the reports (5), and a flush that left work retried (4.8).
//!
//! Every stop is classified (`core::delivery`), reported, persisted for `LIST_QUEUE`,
//! and retried; no replay is sent while a sign-in may be changing the session
//! (`worker::barrier`: `Inner::replay_allowed` in `lanes` and `send`).

mod identity;
mod lanes;
mod marks;
mod plan;
mod send;
mod settle;
mod stop;

use super::{now_ms, Inner, Trigger};
use crate::channel::oneshot;
use crate::core::backoff::Backoff;
use identity::Check;
use lanes::Run;
use std::rc::Rc;

pub(super) use plan::read_all;

/// What a flush achieved, for `COMMAND_RESULT` and for the sync event.
#[derive(Debug, Clone, Default)]
pub struct FlushOutcome {
    pub replayed: usize,
    /// Why the flush did not run or did not reach the server (`None`: it ran).
    pub not_run: Option<String>,
    /// Work is left that a later trigger should retry.
    pub retry_later: bool,
    /// Settles once the retry it scheduled ran, when that retry is near: the event that
    /// asked for the flush keeps the worker alive for it (`worker::retry`).
    pub keep_alive: Option<js_sys::Promise>,
    /// It sent pages a summary (`MUTATIONS_REPLAYED` or `MUTATIONS_PARTIAL`).
    pub reported: bool,
}
/// A caller waiting for the flush after the running one: `seen` is how many records the
/// running flush had replayed when it asked.
pub(super) struct Waiter {
    tx: oneshot::Sender<FlushOutcome>,
    seen: usize,
}

/// Asks for a flush. One runs at a time; asking during one schedules exactly one more
/// after it, which every caller that asked meanwhile shares. A caller that joined is
/// answered with what the rerun replayed plus what the running flush replayed after it
/// asked: a page's `FLUSH_QUEUE` that meets a `sync` flush under way still counts the
/// records that flush delivered for it.
pub async fn request(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    // Only the active version of a registration flushes (4.5, r4): an installing or
    // waiting version's triggers, and the timers of a version being replaced, start
    // nothing.
    if !inner.is_active_version() {
        return not_run(
            "this worker is not its registration's active version",
            false,
        );
    }
    let waiting = {
        let mut st = inner.flush.borrow_mut();
        if st.running {
            let (tx, rx) = oneshot::channel();
            let seen = st.replayed_now;
            st.again
                .get_or_insert_with(Vec::new)
                .push(Waiter { tx, seen });
            Some(rx)
        } else {
            st.running = true;
            st.replayed_now = 0;
            None
        }
    };
    if let Some(rx) = waiting {
        return rx.await.unwrap_or_default();
    }
    let first = run_in_chain(inner, trigger).await;
    if let Some(waiters) = next_waiters(inner) {
        // The rerun is kept alive by the events of the callers waiting for it.
        let inner = inner.clone();
        let mut waiters = carried(waiters, &first);
        wasm_bindgen_futures::spawn_local(async move {
            loop {
                let out = run_in_chain(&inner, Trigger::Page).await;
                for (tx, carry) in waiters {
                    let mut o = out.clone();
                    o.replayed += carry;
                    let _ = tx.send(o);
                }
                match next_waiters(&inner) {
                    Some(w) => waiters = carried(w, &out),
                    None => break,
                }
            }
        });
    }
    first
}

/// After a flush: the callers the next run serves, or `None` when nobody asked (flushing
/// stops). The next run is committed here, synchronously, so its count starts at 0 now: a
/// caller who joins while that run still waits for the queue's chain has seen none of it.
fn next_waiters(inner: &Inner) -> Option<Vec<Waiter>> {
    let mut st = inner.flush.borrow_mut();
    let next = st.again.take();
    match next {
        Some(_) => st.replayed_now = 0,
        None => st.running = false,
    }
    next
}

/// What the flush the waiters joined replayed after each asked.
fn carried(
    waiters: Vec<Waiter>,
    joined: &FlushOutcome,
) -> Vec<(oneshot::Sender<FlushOutcome>, usize)> {
    waiters
        .into_iter()
        .map(|w| (w.tx, joined.replayed.saturating_sub(w.seen)))
        .collect()
}

async fn run_in_chain(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    let me = inner.clone();
    inner
        .in_chain(Box::pin(async move {
            let out = flush(&me, trigger).await;
            // Its identity holds no longer: the origin's fence is let go of (r4).
            me.replays_done();
            out
        }))
        .await
}

fn not_run(why: impl Into<String>, retry_later: bool) -> FlushOutcome {
    FlushOutcome {
        replayed: 0,
        not_run: Some(why.into()),
        retry_later,
        keep_alive: None,
        reported: false,
    }
}

/// One flush. Runs inside the chain.
async fn flush(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    let started = now_ms();
    let deadline = started + inner.config.flush_budget_ms as u64;
    let backoff = match gate(inner, trigger, started).await {
        Ok(backoff) => backoff,
        Err(waiting) => return waiting,
    };
    let who = match identity::check(inner, deadline).await {
        Check::SignedIn(who) => Some(who),
        Check::SignedOut => None,
        Check::Stopped(stop) => {
            return stop::before_reading(inner, trigger, backoff, started, stop).await
        }
    };
    let user = who.as_ref().map(|w| w.user.clone());
    let mut plan = match plan::read(inner, started, user.clone()).await {
        Ok(plan) => plan,
        Err(stop) => return stop::before_reading(inner, trigger, backoff, started, stop).await,
    };
    let mut run = Run::new(&plan);
    match who {
        Some(who) => lanes::run(inner, who, &mut plan, deadline, &mut run).await,
        // Signed out: every record is reported `no-session`; nothing is sent.
        None if plan.total > 0 => {
            run.ending.stop = Some(crate::core::delivery::StopReason::SignedOut)
        }
        None => {}
    }
    let settled = settle::conclude(
        inner,
        backoff,
        started,
        &mut run.ending,
        run.budget_spent,
        &plan,
    )
    .await;
    stop::report(inner, trigger, user.as_deref(), &plan, &mut run, &settled).await;
    let keep_alive = stop::retry_later(inner, trigger, &settled.delivery, settled.drained).await;
    if run.identity_changed {
        // Another account (or nobody) is signed in now: a flush under that identity
        // follows at once, with reports of its own (this one's are not that account's).
        let inner = inner.clone();
        wasm_bindgen_futures::spawn_local(async move {
            request(&inner, trigger).await;
        });
    }
    FlushOutcome {
        replayed: plan.replay.replayed(),
        not_run: None,
        retry_later: !settled.drained
            && (run.ending.stop.is_some() || run.ending.held || plan.replay.is_stopped()),
        keep_alive,
        reported: true,
    }
}

/// The backoff, read (bounded by `maxRetryAfterMs`, against a clock that moved) and
/// asked whether this trigger may flush now; `Err` when it may not: the retry it waits
/// for is armed.
async fn gate(inner: &Rc<Inner>, trigger: Trigger, started: u64) -> Result<Backoff, FlushOutcome> {
    let backoff = inner
        .store
        .backoff()
        .await
        .unwrap_or_default()
        .clamped(started, inner.config.max_retry_after_ms as u64);
    if backoff.may_flush(trigger, started) {
        return Ok(backoff);
    }
    let mut out = not_run(
        "waiting: the server asked to retry later, or the last attempts failed",
        true,
    );
    out.keep_alive = inner.retry_when(Some(backoff.next_automatic().max(started + 1)));
    Err(out)
}
