//! A flush's settling (contract 4.5, 4.8): how it ended, as the backoff and `LIST_QUEUE`
//! see it — the worst end of its answers, the stop that ended it, what is left — stored
//! in one transaction before anything is reported.

use super::plan::Plan;
use crate::core::answer::Verdict;
use crate::core::backoff::{Backoff, FlushEnd};
use crate::core::delivery::{retry_at, Delivery, StopReason};
use crate::core::planner::Decision;
use crate::worker::{now_ms, Inner};

/// How a flush ended, as the shell acts on it.
pub(super) struct Ending {
    pub stop: Option<StopReason>,
    pub end: FlushEnd,
    /// Records were left queued to be tried again (not a stop).
    pub held: bool,
}

/// The backoff-relevant side of one answer.
pub(super) fn verdict_end(v: &Verdict) -> FlushEnd {
    match v {
        Verdict::RetryLater { after_ms } => FlushEnd::RetryAfter(*after_ms),
        Verdict::NetworkFailure | Verdict::ServerFailure { .. } | Verdict::InProgress => {
            FlushEnd::Transient
        }
        _ => FlushEnd::Clean,
    }
}

/// The worse of two ends for the backoff: a server's `Retry-After` over a transient
/// failure over a clean end.
pub(super) fn worst(a: FlushEnd, b: FlushEnd) -> FlushEnd {
    match (a, b) {
        (FlushEnd::RetryAfter(_), _) => a,
        (_, FlushEnd::RetryAfter(_)) => b,
        (FlushEnd::Transient, _) | (_, FlushEnd::Transient) => FlushEnd::Transient,
        _ => FlushEnd::Clean,
    }
}

/// What a flush's end stored: the delivery state, and what is left.
pub(super) struct Settled {
    pub delivery: Delivery,
    pub remaining: Option<usize>,
    pub drained: bool,
}

/// The flush's end after its lanes: a budget spent with records still waiting is a
/// stop; the backoff moves by the worst end; what is left is counted; the backoff and
/// the delivery state are stored.
pub(super) async fn conclude(
    inner: &Inner,
    backoff: Backoff,
    started: u64,
    ending: &mut Ending,
    budget_spent: bool,
    plan: &Plan,
) -> Settled {
    if budget_spent && ending.stop.is_none() && plan.replay.decide().contains(&Decision::Wait) {
        ending.stop = Some(StopReason::Budget);
    }
    if let Some(stop) = ending.stop {
        ending.end = worst(ending.end, stop.flush_end());
    }
    let max_hold = inner.config.max_retry_after_ms as u64;
    let after = backoff.after(ending.end, now_ms(), jitter(), max_hold);
    let remaining = inner.store.count().await.ok().map(|n| n as usize);
    let drained = remaining == Some(0);
    let retry = if drained {
        None
    } else {
        retry_at(ending.stop, ending.held, &after, now_ms())
    };
    let delivery = Delivery {
        stopped_by: ending.stop.filter(|_| !drained),
        retry_at: retry,
        last_attempt_at: Some(started),
    };
    save_flush_end(inner, backoff, after, delivery).await;
    Settled {
        delivery,
        remaining,
        drained,
    }
}

/// A flush that stopped before it read the queue: the backoff moved by the stop's end,
/// what is left counted, and both stored.
pub(super) async fn conclude_stopped(
    inner: &Inner,
    backoff: Backoff,
    started: u64,
    stop: StopReason,
    end: FlushEnd,
) -> Settled {
    let after = backoff.after(
        end,
        now_ms(),
        jitter(),
        inner.config.max_retry_after_ms as u64,
    );
    let remaining = inner.store.count().await.ok().map(|n| n as usize);
    let drained = remaining == Some(0);
    let delivery = Delivery {
        stopped_by: (!drained).then_some(stop),
        retry_at: if drained {
            None
        } else {
            retry_at(Some(stop), false, &after, now_ms())
        },
        last_attempt_at: Some(started),
    };
    save_flush_end(inner, backoff, after, delivery).await;
    Settled {
        delivery,
        remaining,
        drained,
    }
}

/// Persists the backoff (when the flush changed it) and the delivery state, in one
/// transaction.
async fn save_flush_end(inner: &Inner, old: Backoff, new: Backoff, delivery: Delivery) {
    let changed = (new != old).then_some(&new);
    if let Err(e) = inner.store.set_flush_end(changed, &delivery).await {
        web_sys::console::warn_1(&format!("sw-outbox: delivery state not stored: {e}").into());
    }
}

fn jitter() -> f64 {
    js_sys::Math::random()
}
