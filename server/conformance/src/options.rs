//! The command line: where the server is, how to sign in, which write to exercise and how
//! to see whether it ran. Defaults fit the reference server (`server/`).

use clap::Parser;
use std::time::Duration;

/// Checks a server's idempotency duties as the sw-outbox service worker relies on them.
///
/// Run it against a test or staging instance that nobody else writes to meanwhile: it
/// makes about twenty writes with the write route you name, and counts what they did
/// through the count route.
#[derive(Parser, Debug, Clone)]
#[command(name = "sw-outbox-conformance", version)]
pub struct Options {
    /// The server's base URL, e.g. http://127.0.0.1:8080 (paths below are relative to it).
    pub base: String,

    /// Cookie sign-in: the route POSTed with --login-body (its cookies are kept).
    #[arg(long, default_value = "/api/auth/login")]
    pub login: String,
    /// The account to sign in as ({user} in --login-body).
    #[arg(long)]
    pub user: Option<String>,
    /// Its password ({password} in --login-body).
    #[arg(long)]
    pub password: Option<String>,
    /// The sign-in body: JSON with {user} and {password} put in as JSON strings.
    #[arg(long, default_value = r#"{"userId":{user},"password":{password}}"#)]
    pub login_body: String,
    /// Instead of a cookie sign-in: send `Authorization: Bearer <TOKEN>` (the outbox's
    /// AUTH_SESSION credential).
    #[arg(long, conflicts_with_all = ["user", "password"])]
    pub bearer: Option<String>,
    /// The account id `GET --me` must name (default: --user).
    #[arg(long)]
    pub account: Option<String>,
    /// A second account, to check that keys are scoped per account: its cookie sign-in
    /// (the same --login and --login-body as the first).
    #[arg(long, requires = "second_password", conflicts_with = "second_bearer")]
    pub second_user: Option<String>,
    /// The second account's password.
    #[arg(long, requires = "second_user")]
    pub second_password: Option<String>,
    /// A second account for token apps: its `Authorization: Bearer` token (the account it
    /// names is read from GET --me).
    #[arg(long)]
    pub second_bearer: Option<String>,
    /// An account id that is not the signed-in one, sent as X-PM-Expected-Account to
    /// see the server refuse it.
    #[arg(long, default_value = "sw-outbox-conformance-someone-else")]
    pub other_account: String,
    /// The identity route (the outbox's authMePath).
    #[arg(long, default_value = "/api/auth/me")]
    pub me: String,
    /// The header the CSRF token is sent in (the outbox's csrfHeader).
    #[arg(long, default_value = "X-CSRF-Token")]
    pub csrf_header: String,

    /// The write to exercise: "METHOD PATH". Every copy is sent as the outbox sends a
    /// replay: Idempotency-Key, X-PM-Expected-Account, the CSRF token.
    #[arg(long, default_value = "POST /api/projects/conformance/tasks")]
    pub write: String,
    /// Its body; {n} becomes a fresh value for every new write (a repeat reuses it).
    #[arg(long, default_value = r#"{"title":"conformance {n}"}"#)]
    pub body: String,
    /// The body's Content-Type.
    #[arg(long, default_value = "application/json")]
    pub content_type: String,
    /// A header sent on every request ("Name: value"); repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,

    /// A GET route whose JSON shows how many writes ran: the length of the array (or the
    /// number) at --count-pointer. Without it, "ran only once" cannot be checked.
    #[arg(long, default_value = "/api/projects/conformance/tasks")]
    pub count: String,
    /// JSON pointer into the count route's answer (RFC 6901), e.g. /tasks or /total.
    #[arg(long, default_value = "/tasks")]
    pub count_pointer: String,
    /// The server has no count route: skip what needs one (reported "not checked").
    #[arg(long)]
    pub no_count: bool,

    /// A request that makes the next run of the write slow (your test hook), sent before
    /// the concurrent-repeat check: "METHOD PATH [JSON BODY]". Without it that check
    /// races copies of one write and may not catch the first one still running.
    #[arg(long)]
    pub slow_hook: Option<String>,
    /// How long after the slowed first copy the repeat is sent.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub repeat_after: Duration,
    /// Copies sent at once in the concurrent-repeat check without --slow-hook.
    #[arg(long, default_value_t = 4)]
    pub copies: usize,

    /// How long your server keeps a key (its ledger's expiry), e.g. 24h. Only a short
    /// wait (--key-probe) is checked; this is compared with the outbox's serverKeyTtlMs.
    #[arg(long, value_parser = parse_duration)]
    pub key_ttl: Option<Duration>,
    /// How long to wait before checking that a completed key is still honoured.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub key_probe: Duration,

    /// Longest wait for one answer (a repeat may wait for its first copy: the reference
    /// server waits up to 25 s).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `250ms`, `3s`, `10m`, `24h`, `7d`, or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (250ms, 3s, 10m, 24h, 7d)"))?;
    let ms_per: u64 = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// A request named on the command line: "METHOD PATH [BODY]".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    pub method: String,
    pub path: String,
    pub body: Option<String>,
}

impl RequestSpec {
    pub fn parse(s: &str) -> Result<RequestSpec, String> {
        let s = s.trim();
        let (method, rest) = s
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("{s:?}: expected \"METHOD PATH [BODY]\""))?;
        let rest = rest.trim_start();
        let (path, body) = match rest.split_once(char::is_whitespace) {
            Some((p, b)) => (p, Some(b.trim().to_owned()).filter(|b| !b.is_empty())),
            None => (rest, None),
        };
        if !method.bytes().all(|b| b.is_ascii_alphabetic()) || !path.starts_with('/') {
            return Err(format!(
                "{s:?}: expected \"METHOD /path [BODY]\" (a path relative to the base URL)"
            ));
        }
        Ok(RequestSpec {
            method: method.to_ascii_uppercase(),
            path: path.to_owned(),
            body,
        })
    }
}

/// A header given as "Name: value".
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected \"Name: value\""))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("{s:?}: the header has no name"));
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1500"), Ok(Duration::from_millis(1500)));
        for bad in ["", "1.5s", "3w", "-1s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn request_specs() {
        assert_eq!(
            RequestSpec::parse("post /api/tasks"),
            Ok(RequestSpec {
                method: "POST".into(),
                path: "/api/tasks".into(),
                body: None
            })
        );
        let hook = RequestSpec::parse(r#"POST /__control/fault {"kind":"slow", "ms":3000}"#)
            .expect("with a body");
        assert_eq!(hook.body.as_deref(), Some(r#"{"kind":"slow", "ms":3000}"#));
        for bad in ["POST", "/api/tasks", "POST api/tasks", "P0ST /x"] {
            assert!(RequestSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers() {
        assert_eq!(
            parse_header("X-Tenant: acme"),
            Ok(("X-Tenant".into(), "acme".into()))
        );
        assert!(parse_header("no colon").is_err());
        assert!(parse_header(": v").is_err());
    }

    #[test]
    fn the_reference_servers_defaults() {
        let o = Options::try_parse_from(["c", "http://127.0.0.1:1", "--user", "alice"])
            .expect("parses");
        assert_eq!(o.write, "POST /api/projects/conformance/tasks");
        assert_eq!(o.count_pointer, "/tasks");
        assert!(
            Options::try_parse_from(["c", "http://x", "--bearer", "t", "--user", "u"]).is_err(),
            "a bearer token or a sign-in, not both"
        );
        let second = Options::try_parse_from([
            "c",
            "http://x",
            "--user",
            "alice",
            "--second-user",
            "bob",
            "--second-password",
            "pw",
        ])
        .expect("a second account");
        assert_eq!(second.second_user.as_deref(), Some("bob"));
        for bad in [
            vec!["c", "http://x", "--second-user", "bob"],
            vec!["c", "http://x", "--second-password", "pw"],
            vec![
                "c",
                "http://x",
                "--second-bearer",
                "t",
                "--second-user",
                "b",
                "--second-password",
                "p",
            ],
        ] {
            assert!(Options::try_parse_from(&bad).is_err(), "{bad:?}");
        }
        assert!(Options::try_parse_from(["c", "http://x", "--second-bearer", "t"]).is_ok());
    }
}
