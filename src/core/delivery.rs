//! Why a flush stopped before the queue was drained, when it is tried again, and what
//! pages are told of it (contract 4.8 and 5, r3). The shell only acts on these answers:
//! it persists the [`Delivery`] state, arms its retry for `retry_at`, and puts
//! `stoppedBy`/`retryAt` on `MUTATIONS_PARTIAL` and `delivery` on `QUEUE_STATE`.

use super::answer::{parse_retry_after, Verdict};
use super::backoff::{Backoff, FlushEnd, BASE_MS};
use serde::{Deserialize, Serialize};

/// Why a flush stopped (contract 5, r3: `stoppedBy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    /// The network failed or timed out (the identity check or a replay).
    Offline,
    /// The identity check said nobody is signed in, or the account changed to nobody
    /// while the flush ran.
    SignedOut,
    /// The identity check answered something else (a 5xx, a 429, a 403, a body that did
    /// not arrive), or named another account after a sign-in passed through.
    IdentityCheck,
    /// A replay was answered 401.
    Unauthorized,
    /// A replay was answered 429, or 503 with `Retry-After`.
    RateLimited,
    /// A replay was answered `account_mismatch` again after the identity re-check, or the
    /// re-check named another account (or nobody, or could not be made).
    AccountMismatch,
    /// `flushBudgetMs` was spent.
    Budget,
    /// IndexedDB failed under the flush (a step, or the queue, could not be stored or read).
    Storage,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Offline => "offline",
            StopReason::SignedOut => "signed-out",
            StopReason::IdentityCheck => "identity-check",
            StopReason::Unauthorized => "unauthorized",
            StopReason::RateLimited => "rate-limited",
            StopReason::AccountMismatch => "account-mismatch",
            StopReason::Budget => "budget",
            StopReason::Storage => "storage",
        }
    }

    /// The stop a replay's answer makes, when it ends the flush.
    pub fn of_verdict(verdict: &Verdict) -> Option<StopReason> {
        match verdict {
            Verdict::NetworkFailure => Some(StopReason::Offline),
            Verdict::SignedOut => Some(StopReason::Unauthorized),
            Verdict::RetryLater { .. } => Some(StopReason::RateLimited),
            Verdict::StaleIdentity { .. } => Some(StopReason::AccountMismatch),
            _ => None,
        }
    }

    /// Whether only a trigger from a person ends it: being signed out (or refused as
    /// such) is not fixed by asking `/auth/me` again on a timer. Choice: no timer; the
    /// next `AUTH_SESSION` naming an account, a page's `FLUSH_QUEUE` or the worker's
    /// next start tries again (`retryAt` null).
    pub fn awaits_trigger(self) -> bool {
        matches!(self, StopReason::SignedOut | StopReason::Unauthorized)
    }

    /// How the stop counts for the backoff. The budget and a sign-out are no failure of
    /// the network or the server.
    pub fn flush_end(self) -> FlushEnd {
        match self {
            StopReason::SignedOut | StopReason::Unauthorized | StopReason::Budget => {
                FlushEnd::Clean
            }
            StopReason::Offline
            | StopReason::IdentityCheck
            | StopReason::AccountMismatch
            | StopReason::Storage
            | StopReason::RateLimited => FlushEnd::Transient,
        }
    }
}

/// How an identity check that answered neither "signed in" nor "signed out" counts for
/// the backoff: a 429, or a 503 with `Retry-After`, holds every trigger as a replay's
/// would (bounded by `maxRetryAfterMs`); any other status backs off exponentially.
pub fn identity_unavailable(status: u16, retry_after: Option<&str>, now_ms: u64) -> FlushEnd {
    match (status, retry_after) {
        (429, r) => FlushEnd::RetryAfter(r.and_then(|r| parse_retry_after(r, now_ms))),
        (503, Some(r)) => FlushEnd::RetryAfter(parse_retry_after(r, now_ms)),
        _ => FlushEnd::Transient,
    }
}

/// When the next automatic flush will run after a flush that ended with `stop` (`None`:
/// it was not stopped) and left the backoff at `after`; `None` when no timer is set: the
/// queue is drained or holds only records that wait for a person, or a trigger is
/// awaited ([`StopReason::awaits_trigger`]). `held`: records were left queued to be
/// tried again (a 5xx below the limit, a 409 still running, a clock behind a first send).
pub fn retry_at(stop: Option<StopReason>, held: bool, after: &Backoff, now_ms: u64) -> Option<u64> {
    match stop {
        Some(s) if s.awaits_trigger() => None,
        Some(StopReason::Budget) => Some(after.next_automatic().max(now_ms + BASE_MS)),
        Some(_) => Some(after.next_automatic().max(now_ms + 1)),
        None if held || after.failures > 0 => Some(after.next_automatic().max(now_ms + BASE_MS)),
        None => None,
    }
}

/// The delivery state a restarted worker answers `LIST_QUEUE` with: why the last flush
/// stopped (`None`: it did not), when the next attempt is due (`None`: when a trigger
/// comes), and when the last flush reached the identity check. Stored in the `session`
/// store under `delivery`; `CLEAR_DEVICE` removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Delivery {
    pub stopped_by: Option<StopReason>,
    pub retry_at: Option<u64>,
    pub last_attempt_at: Option<u64>,
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::core::record::AttentionReason;

    const HOUR: u64 = 3_600_000;

    /// A `Retry-After` date as `core::answer` reads it, held by the backoff no longer
    /// than `maxRetryAfterMs` (here, where both are used: neither imports the other).
    #[test]
    fn a_retry_after_date_far_ahead_is_bounded_by_max_retry_after() {
        let date_9999 = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", 0);
        let b = Backoff::default().after(FlushEnd::RetryAfter(date_9999), 0, 0.5, HOUR);
        assert_eq!(b.retry_after_until, HOUR);
        let b = Backoff::default().after(
            FlushEnd::RetryAfter(parse_retry_after(
                "Fri, 31 Dec 9223372036854775807 23:59:59 GMT",
                5,
            )),
            5,
            0.5,
            HOUR,
        );
        assert_eq!(b.retry_after_until, HOUR + 5, "bounded by maxRetryAfterMs");
    }

    #[test]
    fn every_stopping_answer_names_its_stop() {
        assert_eq!(
            StopReason::of_verdict(&Verdict::NetworkFailure),
            Some(StopReason::Offline)
        );
        assert_eq!(
            StopReason::of_verdict(&Verdict::SignedOut),
            Some(StopReason::Unauthorized)
        );
        assert_eq!(
            StopReason::of_verdict(&Verdict::RetryLater { after_ms: Some(5) }),
            Some(StopReason::RateLimited)
        );
        assert_eq!(
            StopReason::of_verdict(&Verdict::StaleIdentity { status: 409 }),
            Some(StopReason::AccountMismatch)
        );
        for goes_on in [
            Verdict::Replayed,
            Verdict::InProgress,
            Verdict::ServerFailure { status: 502 },
            Verdict::Attention {
                reason: AttentionReason::Rejected,
                status: 403,
            },
        ] {
            assert!(!goes_on.stops_flush());
            assert_eq!(StopReason::of_verdict(&goes_on), None, "{goes_on:?}");
        }
        // Every verdict that stops a flush has a stop reason.
        for stops in [
            Verdict::NetworkFailure,
            Verdict::SignedOut,
            Verdict::RetryLater { after_ms: None },
            Verdict::StaleIdentity { status: 403 },
        ] {
            assert!(stops.stops_flush());
            assert!(StopReason::of_verdict(&stops).is_some());
        }
    }

    #[test]
    fn names_are_the_contracts() {
        let all = [
            StopReason::Offline,
            StopReason::SignedOut,
            StopReason::IdentityCheck,
            StopReason::Unauthorized,
            StopReason::RateLimited,
            StopReason::AccountMismatch,
            StopReason::Budget,
            StopReason::Storage,
        ];
        let names: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "offline",
                "signed-out",
                "identity-check",
                "unauthorized",
                "rate-limited",
                "account-mismatch",
                "budget",
                "storage"
            ]
        );
        for s in all {
            assert_eq!(
                serde_json::to_value(s).expect("serialises"),
                serde_json::Value::String(s.as_str().into())
            );
        }
    }

    #[test]
    fn a_stop_is_retried_on_the_backoff_and_within_the_hold() {
        let now = 1_000_000;
        for stop in [
            StopReason::Offline,
            StopReason::IdentityCheck,
            StopReason::AccountMismatch,
            StopReason::Storage,
            StopReason::RateLimited,
        ] {
            let after = Backoff::default().after(stop.flush_end(), now, 0.5, HOUR);
            let at = retry_at(Some(stop), false, &after, now).expect("a timer");
            assert!(at > now && at <= now + HOUR, "{stop:?}: {at}");
        }
        // A server's Retry-After on the identity check holds, bounded by maxRetryAfterMs.
        let end = identity_unavailable(429, Some("120"), now);
        assert_eq!(end, FlushEnd::RetryAfter(Some(120_000)));
        let after = Backoff::default().after(end, now, 0.5, HOUR);
        assert_eq!(
            retry_at(Some(StopReason::IdentityCheck), false, &after, now),
            Some(now + 120_000)
        );
        let far = identity_unavailable(503, Some("Fri, 31 Dec 9999 23:59:59 GMT"), now);
        let after = Backoff::default().after(far, now, 0.5, HOUR);
        assert_eq!(
            retry_at(Some(StopReason::IdentityCheck), false, &after, now),
            Some(now + HOUR),
            "never further than maxRetryAfterMs"
        );
        assert_eq!(identity_unavailable(502, None, now), FlushEnd::Transient);
        assert_eq!(identity_unavailable(503, None, now), FlushEnd::Transient);
    }

    #[test]
    fn the_budget_is_continued_soon_and_a_sign_out_awaits_a_trigger() {
        let now = 5_000;
        let after = Backoff::default().after(StopReason::Budget.flush_end(), now, 0.5, HOUR);
        assert_eq!(after, Backoff::default(), "no failure");
        assert_eq!(
            retry_at(Some(StopReason::Budget), false, &after, now),
            Some(now + BASE_MS)
        );
        for s in [StopReason::SignedOut, StopReason::Unauthorized] {
            assert!(s.awaits_trigger());
            assert_eq!(retry_at(Some(s), true, &after, now), None);
        }
    }

    #[test]
    fn a_flush_that_was_not_stopped_is_retried_only_for_what_it_left() {
        let now = 5_000;
        let clean = Backoff::default();
        assert_eq!(
            retry_at(None, false, &clean, now),
            None,
            "drained, or only blocked records"
        );
        assert_eq!(retry_at(None, true, &clean, now), Some(now + BASE_MS));
        let failed = clean.after(FlushEnd::Transient, now, 0.999, HOUR);
        assert_eq!(
            retry_at(None, true, &failed, now),
            Some(failed.not_before.max(now + BASE_MS))
        );
    }

    #[test]
    fn the_stored_state_reads_back_and_tolerates_what_it_does_not_know() {
        let d = Delivery {
            stopped_by: Some(StopReason::RateLimited),
            retry_at: Some(7),
            last_attempt_at: Some(3),
        };
        let v = serde_json::to_value(d).expect("serialises");
        assert_eq!(
            v,
            serde_json::json!({"stoppedBy":"rate-limited","retryAt":7,"lastAttemptAt":3})
        );
        assert_eq!(serde_json::from_value::<Delivery>(v).expect("reads"), d);
        assert_eq!(
            serde_json::from_value::<Delivery>(serde_json::json!({"key":"delivery"}))
                .expect("reads"),
            Delivery::default()
        );
    }
}
