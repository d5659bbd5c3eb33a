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
    /// Every stop reason, to read one back by its name ([`StopReason::from_name`]).
    pub const ALL: [StopReason; 8] = [
        StopReason::Offline,
        StopReason::SignedOut,
        StopReason::IdentityCheck,
        StopReason::Unauthorized,
        StopReason::RateLimited,
        StopReason::AccountMismatch,
        StopReason::Budget,
        StopReason::Storage,
    ];

    /// The stop reason named `name` ([`StopReason::as_str`]'s words), if any.
    pub fn from_name(name: &str) -> Option<StopReason> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

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

    /// Whether only a trigger ends it (no timer, `retryAt` null): a credential the
    /// server refused (401, r3) waits for the pages to give a new one (`AUTH_NEEDED`);
    /// the next `AUTH_SESSION`, a page's `FLUSH_QUEUE` or the worker's next start tries
    /// again. A sign-out is not such a stop (r4, 4.8): an `/auth/me` that names nobody
    /// (an expired session, a captive portal's 200 page) is asked again on the backoff
    /// schedule, so the queue does not wait for a reload once the session is back.
    pub fn awaits_trigger(self) -> bool {
        matches!(self, StopReason::Unauthorized)
    }

    /// Whether an `AUTH_SESSION` naming an account resumes delivery at once, before the
    /// backoff: a person just signed in after nobody was (or after a refused credential).
    pub fn resumed_by_sign_in(self) -> bool {
        matches!(self, StopReason::SignedOut | StopReason::Unauthorized)
    }

    /// How the stop counts for the backoff. The budget and a refused credential are no
    /// failure of the network or the server; a sign-out backs off like a transient
    /// failure (r4: asked again, each time a little later, up to the cap).
    pub fn flush_end(self) -> FlushEnd {
        match self {
            StopReason::Unauthorized | StopReason::Budget => FlushEnd::Clean,
            StopReason::SignedOut
            | StopReason::Offline
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
    use crate::core::backoff::CAP_MS;
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
        let all = StopReason::ALL;
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
            assert_eq!(StopReason::from_name(s.as_str()), Some(s));
        }
        assert_eq!(StopReason::from_name("Offline"), None);
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
    fn the_budget_is_continued_soon_and_a_refused_credential_awaits_a_trigger() {
        let now = 5_000;
        let after = Backoff::default().after(StopReason::Budget.flush_end(), now, 0.5, HOUR);
        assert_eq!(after, Backoff::default(), "no failure");
        assert_eq!(
            retry_at(Some(StopReason::Budget), false, &after, now),
            Some(now + BASE_MS)
        );
        let s = StopReason::Unauthorized;
        assert!(s.awaits_trigger());
        assert!(s.resumed_by_sign_in());
        assert_eq!(retry_at(Some(s), true, &after, now), None);
    }

    /// r4 (4.8): nobody signed in is asked again on the backoff schedule, later each time
    /// up to the cap; a sign-in still resumes at once.
    #[test]
    fn a_sign_out_is_retried_on_the_backoff_schedule() {
        let s = StopReason::SignedOut;
        assert!(!s.awaits_trigger());
        assert!(s.resumed_by_sign_in());
        let mut now = 5_000;
        let mut backoff = Backoff::default();
        let mut last_wait = 0;
        for _ in 0..12 {
            backoff = backoff.after(s.flush_end(), now, 0.999, HOUR);
            let at = retry_at(Some(s), false, &backoff, now).expect("a timer, not a trigger");
            let wait = at - now;
            assert!(
                wait >= last_wait && wait <= CAP_MS,
                "{wait} after {last_wait}"
            );
            last_wait = wait;
            now = at;
        }
        assert!(last_wait > CAP_MS / 2, "it reached the cap: {last_wait}");
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
