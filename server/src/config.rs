//! Run-time configuration: every flag of docs/SERVER-API.md as a field, with its default.
//!
//! The ledger's bounds are the library's [`Settings`]; `--mode test` shortens four of them
//! (see [`Config::for_mode`]) so the browser suites reach "in progress" and "outcome
//! unknown" within their own waits. Every bound can still be set by flag in every mode.

use crate::client::ForwardedHeader;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;
use sw_outbox_idempotency::{Settings, TableName, DEFAULT_LOCK_WAIT};

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

/// How pages authenticate (`--auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// A session cookie (`HttpOnly`, `SameSite=Strict`) and a CSRF token on every write.
    Cookie,
    /// `Authorization: Bearer <access token>`, no cookie at all: sign-in answers an
    /// access token that expires after `token_ttl` and a refresh token
    /// (`POST /api/auth/refresh`) that lives as a session does. No CSRF token: a page
    /// of another site cannot make the browser send the header.
    Bearer,
}

impl AuthMode {
    pub fn parse(s: &str) -> Option<AuthMode> {
        match s {
            "cookie" => Some(AuthMode::Cookie),
            "bearer" => Some(AuthMode::Bearer),
            _ => None,
        }
    }
}

/// At most `count` events per `per` (a sliding window for the login throttle, a token
/// bucket of that size and refill for the write budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub host: IpAddr,
    /// `0` picks a free port; the real one is in [`crate::RunningServer::addr`].
    pub port: u16,
    pub www: PathBuf,
    /// A file path, or `:memory:`: demo data and sessions, and the ledger (a connection of
    /// its own) unless `ledger` names PostgreSQL.
    pub db: String,
    /// `Some(postgres://…)`: keep the idempotency ledger in that PostgreSQL database, so
    /// several server processes share it.
    pub ledger: Option<String>,
    /// The PostgreSQL ledger's table (`--ledger-table`), created at start-up.
    pub ledger_table: TableName,
    pub mode: Mode,
    /// The idempotency layer's bounds; the reference server also stores and replays `ETag`.
    pub idempotency: Settings,
    /// How long a ledger call waits for a lock or a connection before answering 503.
    pub ledger_lock_wait: Duration,
    /// Largest request body a route reads (bigger → 413). Bodies over the layer's bound
    /// (1 MiB) are applied without idempotency.
    pub max_request_body: usize,
    /// How long graceful shutdown waits for open connections (a `hang` fault never ends
    /// on its own).
    pub shutdown_grace: Duration,
    /// The site's own origins (`https://app.example`), for the Origin check on writes and
    /// the control routes. Empty: the origin the request's `Host` names (and, for the
    /// control routes, only a loopback or bound-address host).
    pub origins: Vec<String>,
    /// Cookie sessions, or bearer tokens (`--auth`).
    pub auth: AuthMode,
    /// How long an access token lives in bearer mode (`--token-ttl`).
    pub token_ttl: Duration,
    /// A session not used for this long is over.
    pub session_idle: Duration,
    /// A session is over this long after sign-in, used or not.
    pub session_max: Duration,
    /// Failed sign-ins allowed per (account, client) in a window; per client and per
    /// account, `limits::WIDE_FACTOR` times as many (see [`crate::limits::LoginThrottle`]).
    pub login_throttle: Rate,
    /// Proxies whose forwarding header names the client (`--trusted-proxy`); from any
    /// other peer the header is ignored.
    pub trusted_proxies: Vec<IpNet>,
    /// The header those proxies write (`--client-ip-header`).
    pub forwarded_header: ForwardedHeader,
    /// How many `/api/` requests the requests log keeps (the newest); 0 keeps none. Only
    /// the control routes read it, so `prod` keeps none.
    pub request_log: usize,
    /// How long a connection may take to send a request's headers, and may sit idle
    /// between requests (keep-alive), before it is closed.
    pub header_read_timeout: Duration,
    /// Longest pause while a request body arrives before the request fails (408).
    pub body_read_timeout: Duration,
    /// Data writes allowed per session.
    pub write_budget: Rate,
    /// How often expired sessions and idle throttle entries are deleted.
    pub prune_every: Duration,
}

impl Config {
    /// The defaults of `mode`. In `test` mode a duplicate waits 2 s (polling every 50 ms)
    /// and a claim is stale after 10 s without a heartbeat (every 2.5 s): the end-to-end
    /// suites script those states and wait for them; `prod` and `demo` keep the design's
    /// 25 s / 250 ms / 30 s / 10 s.
    pub fn for_mode(mode: Mode) -> Config {
        let mut idempotency = Settings::builder().store_header(axum::http::header::ETAG);
        if mode == Mode::Test {
            idempotency = idempotency
                .in_progress_wait(Duration::from_secs(2))
                .in_progress_poll(Duration::from_millis(50))
                .heartbeat_every(Duration::from_millis(2500))
                .stale_after(Duration::from_secs(10));
        }
        // The defaults of both modes pass the settings' checks (a test below says so).
        let idempotency = idempotency.build().unwrap_or_default();
        Config {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            www: PathBuf::from("www"),
            db: "sw-outbox-server.sqlite".to_owned(),
            ledger: None,
            ledger_table: TableName::default(),
            mode,
            idempotency,
            ledger_lock_wait: DEFAULT_LOCK_WAIT,
            max_request_body: 2 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(2),
            origins: Vec::new(),
            auth: AuthMode::Cookie,
            token_ttl: Duration::from_secs(15 * 60),
            session_idle: Duration::from_secs(24 * 60 * 60),
            session_max: Duration::from_secs(7 * 24 * 60 * 60),
            login_throttle: Rate {
                count: 5,
                per: Duration::from_secs(60),
            },
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::default(),
            request_log: match mode {
                Mode::Prod => 0,
                Mode::Demo => 1_000,
                Mode::Test => 100_000,
            },
            // Test and demo browsers hold unused connections open for a while (Firefox up
            // to 115 s): the server waits longer, so the browser is always the one that
            // closes an idle connection and never races a request on it.
            header_read_timeout: Duration::from_secs(if mode == Mode::Prod { 30 } else { 120 }),
            body_read_timeout: Duration::from_secs(30),
            write_budget: Rate {
                count: 600,
                per: Duration::from_secs(60),
            },
            prune_every: Duration::from_secs(60),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::for_mode(Mode::Prod)
    }
}

/// `90s`, `10m`, `24h`, `7d`, `250ms`, or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 250ms, 90s, 10m, 24h, 7d)"))?;
    let ms_per = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60 * 1000,
        "h" => 60 * 60 * 1000,
        "d" => 24 * 60 * 60 * 1000,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// `COUNT/DURATION`, e.g. `5/60s`, `600/1m`.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let (count, per) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a rate (e.g. 5/60s)"))?;
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: bad count {count:?}"))?;
    let per = parse_duration(per)?;
    if count == 0 || per.is_zero() {
        return Err(format!(
            "{s:?}: the count and the duration must be above zero"
        ));
    }
    Ok(Rate { count, per })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok =
            |s: &str, ms: u64| assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)), "{s}");
        ok("90s", 90_000);
        ok("10m", 600_000);
        ok("24h", 86_400_000);
        ok("7d", 604_800_000);
        ok("250ms", 250);
        ok("1500", 1500);
        for bad in [
            "",
            "h",
            "1.5h",
            "-1s",
            "10 m",
            "3w",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(
            parse_rate("5/60s"),
            Ok(Rate {
                count: 5,
                per: Duration::from_secs(60)
            })
        );
        for bad in ["5", "0/1s", "5/0s", "x/1s", "5/1x"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn test_mode_shortens_the_waits_only() {
        let test = Config::for_mode(Mode::Test).idempotency;
        let prod = Config::for_mode(Mode::Prod).idempotency;
        assert_eq!(prod.in_progress_wait(), Duration::from_secs(25));
        assert_eq!(prod.stale_after(), Duration::from_secs(30));
        assert_eq!(test.in_progress_wait(), Duration::from_secs(2));
        assert_eq!(test.stale_after(), Duration::from_secs(10));
        assert_eq!(test.key_ttl(), prod.key_ttl());
        assert!(test.to_builder().build().is_ok() && prod.to_builder().build().is_ok());
        assert!(prod.stored_headers().iter().any(|h| h == "etag"));
        assert!(test.stored_headers().iter().any(|h| h == "etag"));
    }
}
