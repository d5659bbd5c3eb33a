//! The layer's bounds. Every default is the one of the ledger design the outbox's server
//! side was taken from. [`Settings::builder`] changes them and checks that they can work
//! together before the layer ever sees them.

use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::HeaderName;
use std::fmt;
use std::time::Duration;

pub(crate) const DEFAULT_KEY_TTL: Duration = Duration::from_secs(24 * 60 * 60);
pub(crate) const DEFAULT_MAX_ROWS: u64 = 100_000;

/// Which `Idempotency-Key` values the layer takes; any other gets
/// 400 `{"detail":"idempotency_key_invalid"}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Whether `key` is taken under this rule.
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

/// The layer's bounds, checked: made by [`Settings::default`] or
/// [`SettingsBuilder::build`], read through the methods of the same names as the builder's.
#[derive(Clone, Debug)]
pub struct Settings {
    in_progress_wait: Duration,
    in_progress_poll: Duration,
    heartbeat_every: Duration,
    stale_after: Duration,
    key_ttl: Duration,
    prune_every: Duration,
    max_request_body: usize,
    max_stored_answer: usize,
    max_rows: u64,
    max_rows_per_account: Option<u64>,
    key_rule: KeyRule,
    stored_headers: Vec<HeaderName>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            in_progress_wait: Duration::from_secs(25),
            in_progress_poll: Duration::from_millis(250),
            heartbeat_every: Duration::from_secs(10),
            stale_after: Duration::from_secs(30),
            key_ttl: DEFAULT_KEY_TTL,
            prune_every: Duration::from_secs(60),
            max_request_body: 1024 * 1024,
            max_stored_answer: 1024 * 1024,
            max_rows: DEFAULT_MAX_ROWS,
            max_rows_per_account: None,
            key_rule: KeyRule::Visible,
            stored_headers: default_stored_headers(),
        }
    }
}

/// Settings that cannot work together, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError(String);

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idempotency settings: {}", self.0)
    }
}

impl std::error::Error for SettingsError {}

impl Settings {
    /// A builder starting from the defaults.
    pub fn builder() -> SettingsBuilder {
        SettingsBuilder(Settings::default())
    }

    /// A builder starting from these settings.
    pub fn to_builder(&self) -> SettingsBuilder {
        SettingsBuilder(self.clone())
    }

    /// How long a duplicate waits for a running first attempt before 409
    /// `idempotency_in_progress`. Default 25 s.
    pub fn in_progress_wait(&self) -> Duration {
        self.in_progress_wait
    }
    /// How often a waiting duplicate reads the ledger again. Default 250 ms.
    pub fn in_progress_poll(&self) -> Duration {
        self.in_progress_poll
    }
    /// How often a running request refreshes its claim. Default 10 s.
    pub fn heartbeat_every(&self) -> Duration {
        self.heartbeat_every
    }
    /// A running claim whose heartbeat is older is dead. Default 30 s.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }
    /// How long an entry lives after its last sign of life. Default 24 h.
    pub fn key_ttl(&self) -> Duration {
        self.key_ttl
    }
    /// How often expired entries are deleted. Default 60 s.
    pub fn prune_every(&self) -> Duration {
        self.prune_every
    }
    /// Largest request body taken with idempotency. Default 1 MiB.
    pub fn max_request_body(&self) -> usize {
        self.max_request_body
    }
    /// Largest answer body stored. Default 1 MiB.
    pub fn max_stored_answer(&self) -> usize {
        self.max_stored_answer
    }
    /// Most unexpired entries. Default 100 000.
    pub fn max_rows(&self) -> u64 {
        self.max_rows
    }
    /// Most unexpired entries per account, if bounded. Default: not bounded.
    pub fn max_rows_per_account(&self) -> Option<u64> {
        self.max_rows_per_account
    }
    /// Which keys are taken. Default [`KeyRule::Visible`].
    pub fn key_rule(&self) -> KeyRule {
        self.key_rule
    }
    /// Answer headers stored and replayed.
    pub fn stored_headers(&self) -> &[HeaderName] {
        &self.stored_headers
    }

    fn check(&self) -> Result<(), SettingsError> {
        let err = |m: String| Err(SettingsError(m));
        if self.in_progress_poll.is_zero() || self.heartbeat_every.is_zero() {
            return err("the in-progress poll and the heartbeat must be above zero".into());
        }
        if self.prune_every.is_zero() {
            return err("the prune interval must be above zero".into());
        }
        if self.heartbeat_every >= self.stale_after {
            return err(format!(
                "the heartbeat ({:?}) must be shorter than the stale bound ({:?}), or live \
                 requests are declared dead",
                self.heartbeat_every, self.stale_after
            ));
        }
        if self.key_ttl <= self.stale_after {
            return err(format!(
                "the key expiry ({:?}) must be longer than the stale bound ({:?}), or a live \
                 claim could expire",
                self.key_ttl, self.stale_after
            ));
        }
        if self.max_rows == 0 {
            return err("the ledger needs room for at least one entry".into());
        }
        match self.max_rows_per_account {
            Some(0) => return err("an account needs room for at least one entry".into()),
            Some(n) if n > self.max_rows => {
                return err(format!(
                    "the per-account bound ({n}) is above the ledger's ({})",
                    self.max_rows
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

/// Builds checked [`Settings`]: `Settings::builder().key_ttl(…).build()?`.
#[derive(Clone, Debug)]
pub struct SettingsBuilder(Settings);

impl SettingsBuilder {
    /// How long a duplicate waits for a running first attempt before answering 409
    /// `idempotency_in_progress`. Pair it with the outbox's `attemptTimeoutMs`
    /// (docs/SERVER-API.md).
    pub fn in_progress_wait(mut self, d: Duration) -> Self {
        self.0.in_progress_wait = d;
        self
    }

    /// How often a waiting duplicate reads the ledger again. Polling (rather than an
    /// in-process notification) keeps this right when several processes share a ledger.
    pub fn in_progress_poll(mut self, d: Duration) -> Self {
        self.0.in_progress_poll = d;
        self
    }

    /// How often a running request refreshes its claim; shorter than `stale_after`.
    pub fn heartbeat_every(mut self, d: Duration) -> Self {
        self.0.heartbeat_every = d;
        self
    }

    /// A running claim whose heartbeat is older than this is dead (its process crashed or
    /// the request was cancelled): 409 `idempotency_outcome_unknown`, never re-run.
    pub fn stale_after(mut self, d: Duration) -> Self {
        self.0.stale_after = d;
        self
    }

    /// How long an entry lives after its last sign of life (its claim, a heartbeat, its
    /// completion); after that the key applies again. An outbox must not replay a write
    /// with its old key later than this (its `serverKeyTtlMs`). Longer than `stale_after`.
    pub fn key_ttl(mut self, d: Duration) -> Self {
        self.0.key_ttl = d;
        self
    }

    /// How often the layer deletes expired entries (in a task of its own).
    pub fn prune_every(mut self, d: Duration) -> Self {
        self.0.prune_every = d;
        self
    }

    /// A request body larger than this passes through without idempotency, and is not
    /// buffered past this many bytes. The outbox never queues more than 1 MiB.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.0.max_request_body = bytes;
        self
    }

    /// An answer body larger than this (or streamed: no exact length, or
    /// `text/event-stream`) is passed through unbuffered and stored as its status only,
    /// replayed as 409 `idempotency_replay_unavailable`.
    pub fn max_stored_answer(mut self, bytes: usize) -> Self {
        self.0.max_stored_answer = bytes;
        self
    }

    /// Most unexpired entries the ledger keeps. A new key when it holds that many gets 503
    /// `idempotency_ledger_full` with a `Retry-After` of when the oldest expires: an
    /// unexpired key is never forgotten to make room.
    pub fn max_rows(mut self, n: u64) -> Self {
        self.0.max_rows = n;
        self
    }

    /// Most unexpired entries one account keeps (`None`: no bound of its own). With it, an
    /// account that writes far more than the others gets 503 `idempotency_ledger_full`
    /// for its new keys before it can fill the whole ledger for everyone.
    pub fn max_rows_per_account(mut self, n: Option<u64>) -> Self {
        self.0.max_rows_per_account = n;
        self
    }

    /// Which keys are taken.
    pub fn key_rule(mut self, rule: KeyRule) -> Self {
        self.0.key_rule = rule;
        self
    }

    /// Answer headers stored and replayed (replacing the list).
    pub fn stored_headers(mut self, headers: Vec<HeaderName>) -> Self {
        self.0.stored_headers = headers;
        self
    }

    /// One more answer header to store and replay (e.g. `ETag`).
    pub fn store_header(mut self, header: HeaderName) -> Self {
        if !self.0.stored_headers.contains(&header) {
            self.0.stored_headers.push(header);
        }
        self
    }

    /// The settings, if they can work: a heartbeat shorter than the stale bound, a key
    /// window longer than it, room for at least one entry (per account too, and no more
    /// than the ledger's), polls and intervals above zero.
    pub fn build(self) -> Result<Settings, SettingsError> {
        self.0.check()?;
        Ok(self.0)
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
    fn defaults_are_the_design_and_pass_the_checks() {
        let s = Settings::default();
        assert_eq!(s.in_progress_wait(), Duration::from_secs(25));
        assert_eq!(s.in_progress_poll(), Duration::from_millis(250));
        assert_eq!(s.heartbeat_every(), Duration::from_secs(10));
        assert_eq!(s.stale_after(), Duration::from_secs(30));
        assert_eq!(s.key_ttl(), Duration::from_secs(86_400));
        assert_eq!(s.max_request_body(), 1 << 20);
        assert_eq!(s.max_stored_answer(), 1 << 20);
        assert_eq!(s.max_rows(), 100_000);
        assert_eq!(s.max_rows_per_account(), None);
        assert_eq!(s.stored_headers().len(), 4);
        assert!(Settings::builder().build().is_ok());
    }

    #[test]
    fn the_builder_refuses_settings_that_cannot_work() {
        let refused = |b: SettingsBuilder| b.build().expect_err("refused").to_string();
        let b = Settings::builder;
        assert!(refused(b().heartbeat_every(Duration::from_secs(30))).contains("heartbeat"));
        assert!(refused(b().in_progress_poll(Duration::ZERO)).contains("above zero"));
        assert!(refused(b().heartbeat_every(Duration::ZERO)).contains("above zero"));
        assert!(refused(b().prune_every(Duration::ZERO)).contains("prune"));
        assert!(refused(b().key_ttl(Duration::from_secs(30))).contains("key expiry"));
        assert!(refused(b().max_rows(0)).contains("at least one"));
        assert!(refused(b().max_rows_per_account(Some(0))).contains("account"));
        assert!(refused(b().max_rows(10).max_rows_per_account(Some(11))).contains("above"));
        // A change the checks allow, and the builder keeps what it was given.
        let s = b()
            .key_ttl(Duration::from_secs(90))
            .stale_after(Duration::from_secs(4))
            .heartbeat_every(Duration::from_secs(1))
            .max_rows_per_account(Some(10))
            .store_header(http::header::ETAG)
            .store_header(http::header::ETAG)
            .build()
            .expect("valid");
        assert_eq!(s.key_ttl(), Duration::from_secs(90));
        assert_eq!(s.max_rows_per_account(), Some(10));
        assert_eq!(s.stored_headers().len(), 5);
        let again = s
            .to_builder()
            .key_rule(KeyRule::Strict)
            .build()
            .expect("valid");
        assert_eq!(
            (again.key_rule(), again.key_ttl()),
            (KeyRule::Strict, Duration::from_secs(90))
        );
    }
}
