//! The command line (flags as in docs/SERVER-API.md).

use crate::client::{parse_net, ForwardedHeader};
use crate::config::{parse_duration, parse_rate, AuthMode, Config, Mode};
use sw_outbox_idempotency::{KeyRule, TableName};

pub const USAGE: &str = "usage: sw-outbox-server [--port N] [--host ADDR] [--www DIR] \
[--db FILE|:memory:] [--ledger postgres://USER@HOST:PORT/DB] [--ledger-table NAME] \
[--mode prod|demo|test] [--key-ttl DUR] [--strict-keys] [--in-progress-wait DUR] \
[--in-progress-poll DUR] [--heartbeat DUR] [--stale-after DUR] [--ledger-max-rows N] \
[--ledger-max-rows-per-account N] [--ledger-lock-wait DUR] \
[--origin URL]... [--auth cookie|bearer] [--token-ttl DUR] [--session-idle DUR] [--session-max DUR] [--login-throttle N/DUR] \
[--trusted-proxy IP|CIDR]... [--client-ip-header x-forwarded-for|forwarded] \
[--write-budget N/DUR] [--request-log N] [--header-timeout DUR] [--body-timeout DUR]   \
(DUR: 250ms, 90s, 10m, 24h, 7d, or milliseconds)";

/// Flags that take no value.
const SWITCHES: &[&str] = &["--strict-keys"];

/// Parses the arguments (without the program name). The mode's defaults apply first,
/// whatever the order of the flags; the other flags override them.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Config, String> {
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return Err(USAGE.to_owned());
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        if SWITCHES.contains(&flag.as_str()) {
            if inline.is_some() {
                return Err(format!("{flag} takes no value\n{USAGE}"));
            }
            flags.push((flag, None));
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?,
        };
        flags.push((flag, Some(value)));
    }
    let mut mode = Mode::Prod;
    for (flag, value) in &flags {
        if flag == "--mode" {
            let v = value.as_deref().unwrap_or("");
            mode = Mode::parse(v).ok_or_else(|| format!("bad --mode {v}"))?;
        }
    }
    let mut c = Config::for_mode(mode);
    let mut idem = c.idempotency.to_builder();
    let count = |flag: &str, v: &str| -> Result<u64, String> {
        v.parse().map_err(|_| format!("bad {flag} {v}"))
    };
    for (flag, value) in flags {
        let v = value.unwrap_or_default();
        let dur = |v: &str| parse_duration(v).map_err(|e| format!("{flag}: {e}"));
        let rate = |v: &str| parse_rate(v).map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--mode" => {}
            "--port" => c.port = v.parse().map_err(|_| format!("bad --port {v}"))?,
            "--host" => c.host = v.parse().map_err(|_| format!("bad --host {v}"))?,
            "--www" => c.www = v.into(),
            "--db" => c.db = v,
            "--ledger" => c.ledger = Some(v),
            "--ledger-table" => {
                c.ledger_table = TableName::new(&v).map_err(|e| format!("--ledger-table: {e}"))?
            }
            "--key-ttl" => idem = idem.key_ttl(dur(&v)?),
            "--strict-keys" => idem = idem.key_rule(KeyRule::Strict),
            "--in-progress-wait" => idem = idem.in_progress_wait(dur(&v)?),
            "--in-progress-poll" => idem = idem.in_progress_poll(dur(&v)?),
            "--heartbeat" => idem = idem.heartbeat_every(dur(&v)?),
            "--stale-after" => idem = idem.stale_after(dur(&v)?),
            "--ledger-max-rows" => idem = idem.max_rows(count(&flag, &v)?),
            "--ledger-max-rows-per-account" => {
                idem = idem.max_rows_per_account(Some(count(&flag, &v)?))
            }
            "--ledger-lock-wait" => c.ledger_lock_wait = dur(&v)?,
            "--origin" => c.origins.push(normalize_origin(&v)?),
            "--auth" => {
                c.auth =
                    AuthMode::parse(&v).ok_or_else(|| format!("--auth {v}: cookie or bearer"))?
            }
            "--token-ttl" => c.token_ttl = dur(&v)?,
            "--session-idle" => c.session_idle = dur(&v)?,
            "--session-max" => c.session_max = dur(&v)?,
            "--login-throttle" => c.login_throttle = rate(&v)?,
            "--write-budget" => c.write_budget = rate(&v)?,
            "--trusted-proxy" => c
                .trusted_proxies
                .push(parse_net(&v).map_err(|e| format!("--trusted-proxy: {e}"))?),
            "--client-ip-header" => {
                c.forwarded_header = ForwardedHeader::parse(&v).ok_or_else(|| {
                    format!("--client-ip-header {v}: x-forwarded-for or forwarded")
                })?
            }
            "--request-log" => {
                c.request_log = v.parse().map_err(|_| format!("bad --request-log {v}"))?
            }
            "--header-timeout" => c.header_read_timeout = dur(&v)?,
            "--body-timeout" => c.body_read_timeout = dur(&v)?,
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    c.idempotency = idem.build().map_err(|e| e.to_string())?;
    if c.session_idle.is_zero() || c.session_max.is_zero() {
        return Err("--session-idle and --session-max must be above zero".into());
    }
    if c.token_ttl.is_zero() {
        return Err("--token-ttl must be above zero".into());
    }
    if c.header_read_timeout.is_zero() || c.body_read_timeout.is_zero() {
        return Err("--header-timeout and --body-timeout must be above zero".into());
    }
    Ok(c)
}

/// `scheme://host[:port]`, lower-case, without a path: how browsers send `Origin`.
fn normalize_origin(v: &str) -> Result<String, String> {
    let lower = v.trim().trim_end_matches('/').to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
        .ok_or_else(|| format!("--origin {v}: must start with http:// or https://"))?;
    if rest.is_empty() || rest.contains('/') {
        return Err(format!("--origin {v}: scheme, host and port only"));
    }
    Ok(lower)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<Config, String> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn the_harness_command_line() {
        let c = parse(&[
            "--port", "0", "--mode", "test", "--db", ":memory:", "--www", "www",
        ])
        .expect("parses");
        assert_eq!((c.port, c.mode, c.db.as_str()), (0, Mode::Test, ":memory:"));
        assert_eq!(c.idempotency.stale_after(), Duration::from_secs(10));
    }

    #[test]
    fn ledger_flags() {
        let c = parse(&[
            "--key-ttl=90s",
            "--strict-keys",
            "--in-progress-wait",
            "5s",
            "--heartbeat",
            "1s",
            "--stale-after",
            "4s",
            "--ledger-max-rows",
            "10",
            "--ledger-max-rows-per-account=4",
            "--ledger-table",
            "app.ledger",
            "--mode",
            "test",
        ])
        .expect("parses");
        assert_eq!(c.idempotency.key_ttl(), Duration::from_secs(90));
        assert_eq!(c.idempotency.key_rule(), KeyRule::Strict);
        // Set after `--mode test` in the list, but the flags win over the mode's defaults.
        assert_eq!(c.idempotency.in_progress_wait(), Duration::from_secs(5));
        assert_eq!(c.idempotency.stale_after(), Duration::from_secs(4));
        assert_eq!(c.idempotency.max_rows(), 10);
        assert_eq!(c.idempotency.max_rows_per_account(), Some(4));
        assert_eq!(c.ledger_table.to_string(), "app.ledger");
        assert!(c.idempotency.stored_headers().iter().any(|h| h == "etag"));
        let defaults = parse(&[]).expect("defaults");
        assert_eq!(defaults.idempotency.key_ttl(), Duration::from_secs(86_400));
        assert_eq!(defaults.idempotency.max_rows_per_account(), None);
        assert_eq!(defaults.ledger_table.to_string(), "idempotency");
    }

    #[test]
    fn security_flags() {
        let c = parse(&[
            "--origin",
            "https://App.Example/",
            "--session-idle",
            "30m",
            "--login-throttle",
            "3/5m",
            "--write-budget",
            "100/10s",
        ])
        .expect("parses");
        assert_eq!(c.origins, vec!["https://app.example".to_owned()]);
        assert_eq!(c.session_idle, Duration::from_secs(1800));
        assert_eq!(c.login_throttle.count, 3);
        assert_eq!(c.write_budget.per, Duration::from_secs(10));
        assert_eq!(c.auth, AuthMode::Cookie, "cookie sessions by default");
        let b = parse(&["--auth", "bearer", "--token-ttl", "90s"]).expect("parses");
        assert_eq!(
            (b.auth, b.token_ttl),
            (AuthMode::Bearer, Duration::from_secs(90))
        );
    }

    #[test]
    fn proxy_log_and_timeout_flags() {
        let c = parse(&[
            "--trusted-proxy",
            "10.0.0.0/8",
            "--trusted-proxy=127.0.0.1",
            "--client-ip-header",
            "Forwarded",
            "--request-log",
            "50",
            "--header-timeout",
            "5s",
            "--body-timeout",
            "2s",
        ])
        .expect("parses");
        let nets: Vec<String> = c.trusted_proxies.iter().map(|n| n.to_string()).collect();
        assert_eq!(nets, ["10.0.0.0/8", "127.0.0.1/32"]);
        assert_eq!(c.forwarded_header, ForwardedHeader::Forwarded);
        assert_eq!(c.request_log, 50);
        assert_eq!(c.header_read_timeout, Duration::from_secs(5));
        assert_eq!(c.body_read_timeout, Duration::from_secs(2));
        let prod = parse(&[]).expect("defaults");
        assert_eq!(prod.request_log, 0, "prod keeps no requests log");
        assert_eq!(prod.header_read_timeout, Duration::from_secs(30));
        assert_eq!(prod.body_read_timeout, Duration::from_secs(30));
        assert!(prod.trusted_proxies.is_empty());
        assert!(parse(&["--mode", "test"]).expect("test").request_log > 0);
    }

    #[test]
    fn refusals() {
        for bad in [
            &["--key-ttl", "soon"][..],
            &["--strict-keys=yes"],
            &["--port"],
            &["--mode", "staging"],
            &["--heartbeat", "40s"],
            &[
                "--ledger-max-rows",
                "10",
                "--ledger-max-rows-per-account",
                "11",
            ],
            &["--ledger-table", "Robert'); DROP TABLE students;--"],
            &["--origin", "app.example"],
            &["--frobnicate", "1"],
            &["--trusted-proxy", "proxy.internal"],
            &["--client-ip-header", "x-real-ip"],
            &["--request-log", "-1"],
            &["--header-timeout", "0s"],
            &["--auth", "token"],
            &["--token-ttl", "0s"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
