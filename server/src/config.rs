//! Run-time configuration: the command-line flags of docs/SERVER-API.md plus the ledger's
//! timing bounds, which are fields (not constants) so tests can shrink the 10 s stale bound
//! and the 24 h expiry to milliseconds.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

/// Which routes exist. `/__control/` is a remote switch for breaking the server, so it must
/// never be reachable in `prod`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Prod,
    Demo,
    Test,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "prod" => Some(Mode::Prod),
            "demo" => Some(Mode::Demo),
            "test" => Some(Mode::Test),
            _ => None,
        }
    }

    /// Whether the `/__control/` routes are mounted.
    pub fn has_control(self) -> bool {
        matches!(self, Mode::Demo | Mode::Test)
    }
}

/// The bounds of the idempotency protocol (see [`crate::idempotency`]).
#[derive(Clone, Copy, Debug)]
pub struct LedgerTimings {
    /// How long a duplicate waits for a running first attempt before answering
    /// 409 `idempotency_in_progress`.
    pub in_progress_wait: Duration,
    /// How often a waiting duplicate re-reads the ledger. Polling (rather than an in-process
    /// notification) keeps the protocol correct when several server processes share one
    /// database.
    pub in_progress_poll: Duration,
    /// A running claim whose heartbeat is older than this is considered dead:
    /// 409 `idempotency_outcome_unknown`, never re-run.
    pub stale_after: Duration,
    /// How often a running request refreshes its claim's heartbeat. Must be well below
    /// `stale_after`, so a slow-but-alive request is never mistaken for a dead one.
    pub heartbeat_every: Duration,
    /// Entries older than this no longer exist: the key applies again.
    pub expiry: Duration,
    /// How often expired entries are deleted.
    pub prune_every: Duration,
}

impl Default for LedgerTimings {
    fn default() -> Self {
        LedgerTimings {
            in_progress_wait: Duration::from_secs(2),
            in_progress_poll: Duration::from_millis(50),
            stale_after: Duration::from_secs(10),
            heartbeat_every: Duration::from_millis(2500),
            expiry: Duration::from_secs(24 * 60 * 60),
            prune_every: Duration::from_secs(60),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub host: IpAddr,
    /// `0` picks a free port; the real one is in [`crate::RunningServer::addr`].
    pub port: u16,
    pub www: PathBuf,
    /// A file path, or `:memory:`.
    pub db: String,
    /// `Some(postgres://…)`: keep the idempotency ledger in that PostgreSQL database instead
    /// of `db`, so several server processes share it. The demo data stays in `db`.
    pub ledger: Option<String>,
    pub mode: Mode,
    pub timings: LedgerTimings,
    /// Largest request body read (bigger → 413). The outbox itself refuses to queue more
    /// than 1 MiB, so 2 MiB leaves room for pages that send directly.
    pub max_request_body: usize,
    /// How long graceful shutdown waits for open connections (a `hang` fault never ends
    /// on its own).
    pub shutdown_grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            www: PathBuf::from("www"),
            db: "sw-outbox-server.sqlite".to_owned(),
            ledger: None,
            mode: Mode::Prod,
            timings: LedgerTimings::default(),
            max_request_body: 2 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(2),
        }
    }
}
