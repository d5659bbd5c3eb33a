//! When the next flush may run (issue: replay policy, backoff). Persisted by the shell
//! so that a restarted worker honours it.

use serde::{Deserialize, Serialize};

/// What started a flush. Only a page's explicit `FLUSH_QUEUE` may go before the
/// exponential backoff; nothing goes inside a server's `Retry-After` window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Page,
    Sync,
    Online,
    Start,
    /// A flush that follows a successful recovery command.
    Recovery,
    /// A live worker's own retry where the browser has no Background Sync (contract
    /// 2.6, r2): on the backoff schedule, like the browser's sync would be.
    Retry,
    /// The known-offline probe saw the network answer again: the failures the
    /// exponential backoff counts are over, so it may go before it (a server's
    /// `Retry-After` still holds).
    Probe,
    /// An `AUTH_SESSION` named an account after a flush stopped signed out (r3): a
    /// person just signed in, so it may go before the exponential backoff.
    SignIn,
}

impl Trigger {
    pub fn is_automatic(self) -> bool {
        matches!(
            self,
            Trigger::Sync | Trigger::Online | Trigger::Start | Trigger::Retry
        )
    }
}

/// The backoff state, stored in the `session` store under key `backoff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Backoff {
    /// No flush of any kind before this (a server's `Retry-After`), ms since epoch.
    pub retry_after_until: u64,
    /// No automatic flush before this (exponential backoff), ms since epoch.
    pub not_before: u64,
    /// Transient failures in a row.
    pub failures: u32,
}

/// How a flush ended, as far as backoff cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushEnd {
    /// It reached the server and nothing transient went wrong.
    Clean,
    /// Network failure, timeout, a 5xx, or a 409 "still running": worth retrying soon.
    Transient,
    /// 429 or 503 with `Retry-After`; the delay when the server named one.
    RetryAfter(Option<u64>),
}

pub const BASE_MS: u64 = 1_000;
pub const CAP_MS: u64 = 5 * 60 * 1_000;

impl Backoff {
    pub fn may_flush(&self, trigger: Trigger, now_ms: u64) -> bool {
        if now_ms < self.retry_after_until {
            return false;
        }
        !(trigger.is_automatic() && now_ms < self.not_before)
    }

    /// The state as read back from storage, bounded from `now_ms`: a hold further away
    /// than `max_hold_ms` (a server's `Retry-After`) or than the exponential cap was set
    /// under a clock that has since moved back, and must not stop delivery for good
    /// (contract 4.5, r2).
    pub fn clamped(self, now_ms: u64, max_hold_ms: u64) -> Backoff {
        let until = now_ms.saturating_add(max_hold_ms);
        let not_before = now_ms.saturating_add(max_hold_ms.max(CAP_MS));
        Backoff {
            retry_after_until: self.retry_after_until.min(until),
            not_before: self.not_before.min(not_before),
            failures: self.failures,
        }
    }

    /// When the next automatic flush may run (the later of both holds).
    pub fn next_automatic(&self) -> u64 {
        self.retry_after_until.max(self.not_before)
    }

    /// The state after a flush. `jitter` in `[0, 1)` spreads retries: the delay is
    /// between half and all of `min(cap, base * 2^(failures-1))`. A server's
    /// `Retry-After` holds at most `max_hold_ms` (`maxRetryAfterMs`).
    pub fn after(self, end: FlushEnd, now_ms: u64, jitter: f64, max_hold_ms: u64) -> Backoff {
        match end {
            FlushEnd::Clean => Backoff::default(),
            FlushEnd::Transient | FlushEnd::RetryAfter(None) => {
                let failures = self.failures.saturating_add(1);
                let exp = BASE_MS.saturating_mul(1u64 << (failures - 1).min(20));
                let full = exp.min(CAP_MS);
                let j = jitter.clamp(0.0, 1.0);
                let delay = full / 2 + ((full / 2) as f64 * j) as u64;
                Backoff {
                    retry_after_until: self.retry_after_until,
                    not_before: now_ms + delay,
                    failures,
                }
            }
            FlushEnd::RetryAfter(Some(ms)) => {
                let until = now_ms.saturating_add(ms.min(max_hold_ms));
                Backoff {
                    retry_after_until: until,
                    not_before: until,
                    failures: self.failures.saturating_add(1),
                }
            }
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn retry_after_is_bounded_by_max_retry_after() {
        let year = 31_536_000_000;
        let b = Backoff::default().after(FlushEnd::RetryAfter(Some(year)), 1_000, 0.5, 2_000);
        assert_eq!(b.retry_after_until, 3_000);
        assert!(b.may_flush(Trigger::Sync, 3_000));
    }

    #[test]
    fn a_stored_hold_from_a_clock_that_moved_back_is_clamped_on_read() {
        // Stored under a clock ten years ahead.
        let stored = Backoff {
            retry_after_until: u64::MAX / 4,
            not_before: u64::MAX / 4,
            failures: 3,
        };
        let now = 1_000_000;
        let b = stored.clamped(now, HOUR);
        assert_eq!(b.retry_after_until, now + HOUR);
        assert_eq!(b.not_before, now + HOUR);
        assert!(b.may_flush(Trigger::Page, now + HOUR));
        // A hold inside the bounds is left as it was.
        let near = Backoff {
            retry_after_until: now + 10,
            not_before: now + 20,
            failures: 1,
        };
        assert_eq!(near.clamped(now, HOUR), near);
    }

    #[test]
    fn retry_after_holds_every_trigger() {
        let b = Backoff::default().after(FlushEnd::RetryAfter(Some(5_000)), 1_000, 0.5, HOUR);
        for t in [
            Trigger::Page,
            Trigger::Sync,
            Trigger::Online,
            Trigger::Start,
            Trigger::Recovery,
            Trigger::Retry,
            Trigger::Probe,
            Trigger::SignIn,
        ] {
            assert!(!b.may_flush(t, 5_999), "{t:?}");
            assert!(b.may_flush(t, 6_000), "{t:?}");
        }
    }

    #[test]
    fn exponential_backoff_holds_only_automatic_flushes() {
        let b = Backoff::default().after(FlushEnd::Transient, 0, 0.999, HOUR);
        assert!(b.not_before > 0);
        assert!(!b.may_flush(Trigger::Sync, 1));
        assert!(!b.may_flush(Trigger::Start, 1));
        assert!(!b.may_flush(Trigger::Retry, 1));
        assert!(b.may_flush(Trigger::Page, 1));
        assert!(b.may_flush(Trigger::Probe, 1), "the network answered again");
        assert!(b.may_flush(Trigger::Sync, b.not_before));
    }

    #[test]
    fn delays_double_and_are_capped_and_reset_on_success() {
        let mut b = Backoff::default();
        let mut last = 0;
        for n in 1..=12 {
            b = b.after(FlushEnd::Transient, 0, 0.0, HOUR);
            assert_eq!(b.failures, n);
            assert!(b.not_before >= last);
            assert!(b.not_before <= CAP_MS);
            last = b.not_before;
        }
        assert_eq!(last, CAP_MS / 2, "jitter 0 gives half the capped delay");
        assert_eq!(b.after(FlushEnd::Clean, 0, 0.0, HOUR), Backoff::default());
    }

    proptest! {
        #[test]
        fn delay_stays_within_half_and_full(failures in 0u32..40, jitter in 0.0f64..1.0, now in 0u64..1u64<<40) {
            let b = Backoff { failures, ..Backoff::default() }.after(FlushEnd::Transient, now, jitter, HOUR);
            let full = (BASE_MS << (failures.min(20))).min(CAP_MS);
            prop_assert!(b.not_before >= now + full / 2);
            prop_assert!(b.not_before <= now + full);
        }
    }
}
