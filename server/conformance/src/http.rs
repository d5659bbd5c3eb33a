//! Talking to the server under test as the outbox does: one signed-in client (cookies or
//! a bearer token), replays sent with `Idempotency-Key`, `X-PM-Expected-Account` and the
//! CSRF token, redirects never followed.

use crate::options::{parse_header, Options, RequestSpec};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::redirect::Policy;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use sw_outbox::core::answer::{classify, AnswerBody, ReplayAnswer, Verdict};
use sw_outbox::core::identity::{read_identity, Identity};

/// Why the check could not run at all (as opposed to a duty that failed).
#[derive(Debug)]
pub struct SetupError(pub String);

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SetupError {}

/// The outbox reads at most this much of an answer to classify it.
const READ_BOUND: usize = 64 * 1024;

/// One HTTP answer, reduced to what the outbox reads (and the check prints).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    pub replayed: bool,
    pub location: Option<String>,
    pub retry_after: Option<String>,
    pub csrf_header: Option<String>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// What the outbox makes of this answer to a replay (`core::answer::classify`).
    pub fn verdict(&self) -> Verdict {
        let json = self.json();
        let text = std::str::from_utf8(&self.body).ok();
        let body = match (&json, text) {
            (Some(v), _) => AnswerBody::Json(v),
            (None, Some(t)) if !t.is_empty() => AnswerBody::Text(t),
            _ => AnswerBody::None,
        };
        let answer = ReplayAnswer {
            status: self.status,
            opaque_redirect: false,
            retry_after: self.retry_after.as_deref(),
            replayed: self.replayed,
            body,
        };
        classify(Some(answer), now_ms())
    }

    /// `201`, `409 {"detail":"idempotency_in_progress"}`, `417 text/html "Expectation
    /// Failed"`: short enough for one line.
    pub fn describe(&self) -> String {
        let mut out = self.status.to_string();
        if (200..300).contains(&self.status) {
            // A success's body is the app's own data, not a code the outbox reads.
        } else if let Some(v) = self.json() {
            let code = ["detail", "code", "title", "type"]
                .iter()
                .find_map(|f| v.get(*f).and_then(Value::as_str).map(|s| (*f, s)));
            if let Some((field, code)) = code {
                out.push_str(&format!(" {{\"{field}\":\"{code}\"}}"));
            }
        } else if let Ok(text) = std::str::from_utf8(&self.body) {
            let plain = strip_tags(text);
            if !plain.is_empty() {
                let ct = self.content_type.as_deref().unwrap_or("?");
                let ct = ct.split(';').next().unwrap_or(ct);
                out.push_str(&format!(" {ct} \"{}\"", shorten(&plain, 60)));
            }
        }
        if self.replayed {
            out.push_str(" (Idempotent-Replayed: true)");
        }
        out
    }
}

/// The visible text of an error page (its `<body>` when it has one), in one line.
fn strip_tags(html: &str) -> String {
    let html = match html.to_ascii_lowercase().find("<body") {
        Some(at) => &html[at..],
        None => html,
    };
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}…")
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A JSON string literal of `s` (for the sign-in body template).
fn json_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The server under test, and a signed-in client of it.
pub struct Target {
    base: String,
    signed_in: reqwest::Client,
    anonymous: reqwest::Client,
    bearer: Option<String>,
    extra: HeaderMap,
    pub write: RequestSpec,
    pub body_template: String,
    pub content_type: String,
    pub csrf_header: String,
    pub me_path: String,
    /// The token `GET --me` gave, if any.
    pub csrf: Option<String>,
    /// Who the server says is signed in.
    pub account: String,
    pub options: Options,
}

static FRESH: AtomicU64 = AtomicU64::new(0);

impl Target {
    /// Builds the clients and signs in (cookie sign-in, or nothing for a bearer token).
    /// The identity itself is checked by the `auth-me` duty.
    pub async fn connect(options: &Options) -> Result<Target, SetupError> {
        let setup = |what: &str, e: &dyn std::fmt::Display| SetupError(format!("{what}: {e}"));
        let base = options.base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SetupError(format!(
                "{base}: the base URL must start with http:// or https://"
            )));
        }
        let write = RequestSpec::parse(&options.write).map_err(|e| setup("--write", &e))?;
        let mut extra = HeaderMap::new();
        for h in &options.headers {
            let (name, value) = parse_header(h).map_err(|e| setup("--header", &e))?;
            let name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| setup("--header", &e))?;
            let value = HeaderValue::from_str(&value).map_err(|e| setup("--header", &e))?;
            extra.append(name, value);
        }
        let build = |cookies: bool| {
            reqwest::Client::builder()
                .cookie_store(cookies)
                .redirect(Policy::none())
                .timeout(options.timeout)
                .build()
                .map_err(|e| setup("building the HTTP client", &e))
        };
        let signed_in = build(true)?;
        let anonymous = build(false)?;
        let account = match (&options.bearer, &options.user) {
            (Some(_), _) => options.account.clone().ok_or_else(|| {
                SetupError("with --bearer, --account names the account it signs in".into())
            })?,
            (None, Some(user)) => options.account.clone().unwrap_or_else(|| user.clone()),
            (None, None) => {
                return Err(SetupError(
                    "give --user and --password (cookie sign-in) or --bearer and --account".into(),
                ))
            }
        };
        let target = Target {
            base,
            signed_in,
            anonymous,
            bearer: options.bearer.clone(),
            extra,
            write,
            body_template: options.body.clone(),
            content_type: options.content_type.clone(),
            csrf_header: options.csrf_header.clone(),
            me_path: options.me.clone(),
            csrf: None,
            account,
            options: options.clone(),
        };
        if let (None, Some(user)) = (&options.bearer, &options.user) {
            let password = options.password.clone().unwrap_or_default();
            target
                .sign_in(&target.signed_in, user, &password)
                .await
                .map_err(|e| {
                    SetupError(format!(
                        "{e}: check --login, --login-body, --user and --password"
                    ))
                })?;
        }
        Ok(target)
    }

    /// A cookie sign-in on `client`.
    async fn sign_in(
        &self,
        client: &reqwest::Client,
        user: &str,
        password: &str,
    ) -> Result<(), String> {
        let login = &self.options.login;
        let body = self
            .options
            .login_body
            .replace("{user}", &json_string(user))
            .replace("{password}", &json_string(password));
        let a = self
            .send(
                client,
                "POST",
                login,
                &[("content-type", "application/json")],
                Some(body),
                None,
            )
            .await
            .map_err(|e| format!("POST {login}: {e}"))?;
        if !(200..300).contains(&a.status) {
            return Err(format!(
                "signing in as {user} at POST {login} answered {}",
                a.describe()
            ));
        }
        Ok(())
    }

    /// The second account the options name (`--second-user`/`--second-password`, or
    /// `--second-bearer`), signed in and named by `GET --me`; `Ok(None)` when none is
    /// given.
    pub async fn second_account(&self) -> Result<Option<Account>, String> {
        let o = &self.options;
        let client = reqwest::Client::builder()
            .cookie_store(true)
            .redirect(Policy::none())
            .timeout(o.timeout)
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let bearer = match (&o.second_user, &o.second_bearer) {
            (Some(user), _) => {
                let password = o.second_password.clone().unwrap_or_default();
                self.sign_in(&client, user, &password).await?;
                None
            }
            (None, Some(token)) => Some(token.clone()),
            (None, None) => return Ok(None),
        };
        let a = self
            .send(&client, "GET", &self.me_path, &[], None, bearer.as_deref())
            .await
            .map_err(|e| format!("GET {} as the second account: {e}", self.me_path))?;
        match read_identity(a.status, a.json().as_ref(), a.csrf_header.as_deref()) {
            Identity::SignedIn { user, csrf } if user != self.account => Ok(Some(Account {
                client,
                bearer,
                id: user,
                csrf,
            })),
            Identity::SignedIn { user, .. } => Err(format!(
                "GET {} names the second account {user:?}, the first one: give another account",
                self.me_path
            )),
            _ => Err(format!(
                "GET {} as the second account answered {}: not signed in",
                self.me_path,
                a.describe()
            )),
        }
    }

    /// The write as `who` sends it: its own session, CSRF token and expected account.
    pub async fn write_as(&self, who: &Account, key: &str, body: &str) -> Result<Answer, String> {
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", &self.content_type),
            ("idempotency-key", key),
            ("x-pm-expected-account", &who.id),
        ];
        if let Some(t) = &who.csrf {
            headers.push((&self.csrf_header, t));
        }
        self.send(
            &who.client,
            &self.write.method,
            &self.write.path,
            &headers,
            Some(body.to_owned()),
            who.bearer.as_deref(),
        )
        .await
    }

    /// The count route as `who` reads it (`None`: as the first account).
    pub async fn count_as(&self, who: Option<&Account>) -> Result<u64, String> {
        let (client, bearer) = match who {
            Some(a) => (&a.client, a.bearer.as_deref()),
            None => (&self.signed_in, self.bearer.as_deref()),
        };
        let path = &self.options.count;
        let a = self.send(client, "GET", path, &[], None, bearer).await?;
        if a.status != 200 {
            return Err(format!("GET {path} answered {}", a.describe()));
        }
        let v = a
            .json()
            .ok_or_else(|| format!("GET {path} did not answer JSON"))?;
        let at = v.pointer(&self.options.count_pointer).ok_or_else(|| {
            format!(
                "GET {path}: nothing at {} in its answer",
                self.options.count_pointer
            )
        })?;
        match at {
            Value::Array(items) => Ok(items.len() as u64),
            Value::Number(n) => n
                .as_u64()
                .ok_or_else(|| format!("GET {path}: {n} is not a count")),
            other => Err(format!(
                "GET {path}: {} is neither an array nor a number ({other})",
                self.options.count_pointer
            )),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends one request; `Err` is a network failure or a timeout.
    async fn send(
        &self,
        client: &reqwest::Client,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<String>,
        bearer: Option<&str>,
    ) -> Result<Answer, String> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let mut req = client
            .request(method, self.url(path))
            .headers(self.extra.clone());
        if let Some(token) = bearer {
            req = req.bearer_auth(token);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let mut resp = req.send().await.map_err(|e| describe_error(&e))?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let mut answer = Answer {
            status: resp.status().as_u16(),
            content_type: header("content-type"),
            replayed: header("idempotent-replayed").is_some_and(|v| v.eq_ignore_ascii_case("true")),
            location: header("location"),
            retry_after: header("retry-after"),
            csrf_header: header(&self.csrf_header),
            body: Vec::new(),
        };
        while let Some(chunk) = resp.chunk().await.map_err(|e| describe_error(&e))? {
            answer.body.extend_from_slice(&chunk);
            if answer.body.len() >= READ_BOUND {
                answer.body.truncate(READ_BOUND);
                break;
            }
        }
        Ok(answer)
    }

    /// `GET --me`, signed in or not; remembers the CSRF token a signed-in answer gives.
    pub async fn me(&mut self, signed_in: bool) -> Result<(Answer, Identity), String> {
        let client = if signed_in {
            self.signed_in.clone()
        } else {
            self.anonymous.clone()
        };
        let path = self.me_path.clone();
        let bearer = if signed_in { self.bearer.clone() } else { None };
        let a = self
            .send(&client, "GET", &path, &[], None, bearer.as_deref())
            .await?;
        let identity = read_identity(a.status, a.json().as_ref(), a.csrf_header.as_deref());
        if let (true, Identity::SignedIn { csrf, .. }) = (signed_in, &identity) {
            self.csrf = csrf.clone();
        }
        Ok((a, identity))
    }

    /// A fresh body (the template with a new {n}).
    pub fn fresh_body(&self) -> String {
        let n = FRESH.fetch_add(1, Ordering::Relaxed);
        self.body_template
            .replace("{n}", &format!("{}-{n}", now_ms()))
    }

    /// The write as the outbox replays it, with `key`; `tweak` changes what this copy
    /// carries (another expected account, no CSRF token, no session).
    pub async fn write(&self, key: &str, body: &str, tweak: Tweak<'_>) -> Result<Answer, String> {
        let expected = tweak.expected_account.unwrap_or(&self.account);
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", &self.content_type),
            ("idempotency-key", key),
            ("x-pm-expected-account", expected),
        ];
        if let (false, Some(t)) = (tweak.without_csrf, &self.csrf) {
            headers.push((&self.csrf_header, t));
        }
        let (client, bearer) = if tweak.signed_out {
            (&self.anonymous, None)
        } else {
            (&self.signed_in, self.bearer.as_deref())
        };
        self.send(
            client,
            &self.write.method,
            &self.write.path,
            &headers,
            Some(body.to_owned()),
            bearer,
        )
        .await
    }

    /// Sends a request named on the command line (the slow hook), signed in.
    pub async fn request(&self, spec: &RequestSpec) -> Result<Answer, String> {
        let ct = [("content-type", "application/json")];
        let headers: &[(&str, &str)] = if spec.body.is_some() { &ct } else { &[] };
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if let Some(t) = &self.csrf {
            all.push((&self.csrf_header, t));
        }
        self.send(
            &self.signed_in,
            &spec.method,
            &spec.path,
            &all,
            spec.body.clone(),
            self.bearer.as_deref(),
        )
        .await
    }

    /// How many writes the count route shows now; `Err` says why it cannot be read.
    pub async fn count(&self) -> Result<u64, String> {
        self.count_as(None).await
    }

    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }
}

/// Another signed-in account ([`Target::second_account`]).
pub struct Account {
    client: reqwest::Client,
    bearer: Option<String>,
    /// Who `GET --me` says it is.
    pub id: String,
    /// The CSRF token its `GET --me` gave, if any.
    pub csrf: Option<String>,
}

/// How one copy of the write differs from what the outbox sends.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tweak<'a> {
    pub expected_account: Option<&'a str>,
    pub without_csrf: bool,
    pub signed_out: bool,
}

fn describe_error(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    if e.is_timeout() {
        out.push_str(" (timed out)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, ct: &str, body: &str) -> Answer {
        Answer {
            status,
            content_type: Some(ct.into()),
            replayed: false,
            location: None,
            retry_after: None,
            csrf_header: None,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn answers_are_described_in_one_line() {
        assert_eq!(
            answer(
                409,
                "application/json",
                r#"{"detail":"idempotency_in_progress"}"#
            )
            .describe(),
            r#"409 {"detail":"idempotency_in_progress"}"#
        );
        let html = "<!DOCTYPE html>\n<html><head><title>Error</title></head><body><pre>Conflict</pre></body></html>";
        assert_eq!(
            answer(409, "text/html; charset=utf-8", html).describe(),
            r#"409 text/html "Conflict""#
        );
        let mut replay = answer(201, "application/json", r#"{"id":1}"#);
        replay.replayed = true;
        assert_eq!(replay.describe(), "201 (Idempotent-Replayed: true)");
    }

    #[test]
    fn verdicts_come_from_the_outbox_core() {
        let html = answer(417, "text/html", "<pre>Expectation Failed</pre>");
        assert!(matches!(html.verdict(), Verdict::Attention { .. }));
        let bare = answer(409, "text/html", "<pre>Conflict</pre>");
        assert_eq!(bare.verdict(), Verdict::InProgress);
        assert_eq!(
            answer(201, "application/json", "{}").verdict(),
            Verdict::Replayed
        );
    }
}
