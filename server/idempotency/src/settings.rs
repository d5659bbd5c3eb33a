//! The layer's bounds. Every default is the one of the ledger design the outbox's server
//! side was taken from; every bound is a public field, so an app (or a test) sets its own.

use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::HeaderName;
use std::time::Duration;

/// Which `Idempotency-Key` values the layer takes; any other gets
/// 400 `{"detail":"idempotency_key_invalid"}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyRule {
    /// 1–255 visible ASCII characters (0x21–0x7E), as Stripe and the IETF
    /// idempotency-key draft allow: `order_1234`, an 80-character hash, `k:7f3e`.
    #[default]
    Visible,
    /// 22–64 characters of `[A-Za-z0-9_-]`: a random id (a base64url UUID is 22) and
    /// nothing else.
    Strict,
}

impl KeyRule {
    pub fn accepts(self, key: &str) -> bool {
        match self {
            KeyRule::Visible => {
                (1..=255).contains(&key.len()) && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
            }
            KeyRule::Strict => {
                (22..=64).contains(&key.len())
                    && key
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            }
        }
    }
}

/// The answer headers kept with a stored answer and sent again on a replay.
pub fn default_stored_headers() -> Vec<HeaderName> {
    vec![CONTENT_TYPE, LOCATION, CONTENT_DISPOSITION, RETRY_AFTER]
}

#[derive(Clone, Debug)]
pub struct Settings {
    /// How long a duplicate waits for a running first attempt before answering
    /// 409 `idempotency_in_progress`. Default 25 s.
    pub in_progress_wait: Duration,
    /// How often a waiting duplicate reads the ledger again. Polling (rather than an
    /// in-process notification) keeps this right when several processes share a ledger.
    /// Default 250 ms.
    pub in_progress_poll: Duration,
    /// How often a running request refreshes its claim. Default 10 s.
    pub heartbeat_every: Duration,
    /// A running claim whose heartbeat is older than this is dead (its process crashed or
    /// the request was cancelled): 409 `idempotency_outcome_unknown`, never re-run.
    /// Default 30 s; must be well above `heartbeat_every`.
    pub stale_after: Duration,
    /// Entries older than this no longer exist: the key applies again. Default 24 h. An
    /// outbox must not replay a write with its old key after this (its `serverKeyTtlMs`).
    pub key_ttl: Duration,
    /// How often the layer deletes expired entries (in a task of its own). Default 60 s.
    pub prune_every: Duration,
    /// A request body larger than this passes through without idempotency, and is not
    /// buffered past this many bytes. Default 1 MiB (the outbox never queues more).
    pub max_request_body: usize,
    /// An answer body larger than this is stored as its status only and replayed as
    /// 409 `idempotency_replay_unavailable`. Default 1 MiB.
    pub max_stored_answer: usize,
    /// Most entries the ledger keeps. When full, the oldest completed (or expired) entries
    /// are evicted; when only running claims remain, a new key gets 503
    /// `idempotency_ledger_full` with `Retry-After: 1`. Default 100 000.
    pub max_rows: u64,
    /// Which keys are taken. Default [`KeyRule::Visible`].
    pub key_rule: KeyRule,
    /// Answer headers stored and replayed. Default `content-type`, `location`,
    /// `content-disposition`, `retry-after`.
    pub stored_headers: Vec<HeaderName>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            in_progress_wait: Duration::from_secs(25),
            in_progress_poll: Duration::from_millis(250),
            heartbeat_every: Duration::from_secs(10),
            stale_after: Duration::from_secs(30),
            key_ttl: Duration::from_secs(24 * 60 * 60),
            prune_every: Duration::from_secs(60),
            max_request_body: 1024 * 1024,
            max_stored_answer: 1024 * 1024,
            max_rows: 100_000,
            key_rule: KeyRule::Visible,
            stored_headers: default_stored_headers(),
        }
    }
}

impl Settings {
    /// Why these settings cannot work, if they cannot: a heartbeat slower than the stale
    /// bound would declare live requests dead.
    pub fn check(&self) -> Result<(), String> {
        if self.in_progress_poll.is_zero() || self.heartbeat_every.is_zero() {
            return Err("the in-progress poll and the heartbeat must be above zero".into());
        }
        if self.heartbeat_every >= self.stale_after {
            return Err(format!(
                "the heartbeat ({:?}) must be shorter than the stale bound ({:?})",
                self.heartbeat_every, self.stale_after
            ));
        }
        if self.key_ttl <= self.stale_after {
            return Err(format!(
                "the key expiry ({:?}) must be longer than the stale bound ({:?})",
                self.key_ttl, self.stale_after
            ));
        }
        if self.max_rows == 0 {
            return Err("the ledger needs room for at least one entry".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_keys() {
        let r = KeyRule::Visible;
        for ok in ["a", "order_1234", "k:7f3e", &"h".repeat(255), "!~\"{}"] {
            assert!(r.accepts(ok), "{ok}");
        }
        for bad in [
            "",
            &"h".repeat(256),
            "has space",
            "tab\there",
            "é",
            "\u{7f}",
        ] {
            assert!(!r.accepts(bad), "{bad:?}");
        }
    }

    #[test]
    fn strict_keys() {
        let r = KeyRule::Strict;
        assert!(r.accepts("abcdefghijklmnopqrstuv"));
        assert!(r.accepts(&"a".repeat(64)));
        assert!(r.accepts("0b9f6c1e-8a9d-4c3e-9f2a-1d2c3b4a5e6f"));
        assert!(!r.accepts(&"a".repeat(21)));
        assert!(!r.accepts(&"a".repeat(65)));
        assert!(!r.accepts("abcdefghijklmnopqrstu!"));
        assert!(!r.accepts("order_1234"));
    }

    #[test]
    fn defaults_are_the_design_and_consistent() {
        let s = Settings::default();
        assert_eq!(s.in_progress_wait, Duration::from_secs(25));
        assert_eq!(s.in_progress_poll, Duration::from_millis(250));
        assert_eq!(s.heartbeat_every, Duration::from_secs(10));
        assert_eq!(s.stale_after, Duration::from_secs(30));
        assert_eq!(s.key_ttl, Duration::from_secs(86_400));
        assert_eq!(s.max_request_body, 1 << 20);
        assert_eq!(s.max_stored_answer, 1 << 20);
        assert_eq!(s.stored_headers.len(), 4);
        assert_eq!(s.check(), Ok(()));
        let slow_heartbeat = Settings {
            heartbeat_every: Duration::from_secs(30),
            ..Settings::default()
        };
        assert!(slow_heartbeat.check().is_err());
    }
}
