//! Fault rules for `POST /__control/faults`: which `/api/` requests to break, and how.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Refuse,
    DropAfterCommit,
    Hang,
    Status,
    /// Like `status`, but in place of the route inside the ledger: stored and replayed.
    StoredStatus,
    OutcomeUnknown,
    /// Claim (if keyed), wait `delayMs`, then run the route and answer normally.
    Delay,
    Redirect,
    StallBody,
    /// Headers, the first bytes of a body, then filler without end (paced).
    EndlessBody,
}

/// A rule as posted by a test.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    pub path: String,
    #[serde(default)]
    pub method: Option<String>,
    pub kind: FaultKind,
    #[serde(default)]
    pub status: Option<u16>,
    /// A string (`"2"`, an HTTP date) or a number of seconds.
    #[serde(default)]
    pub retry_after: Option<Value>,
    #[serde(default)]
    pub times: Option<u64>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
    #[serde(default)]
    pub detail: Option<String>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub content_type: Option<String>,
    #[serde(default)]
    pub location: Option<String>,
}

/// The body of an injected answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum InjectedBody {
    /// `{"detail":"<code>"}` as JSON.
    Detail { detail: String },
    /// Raw text with its content type.
    Raw { body: String, content_type: String },
}

/// An answer a rule gives instead of the route's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Injected {
    pub status: u16,
    pub body: InjectedBody,
    pub retry_after: Option<String>,
}

impl Injected {
    pub fn response(&self) -> Response {
        let (body, content_type) = match &self.body {
            InjectedBody::Detail { detail } => (
                json!({ "detail": detail }).to_string(),
                "application/json".to_owned(),
            ),
            InjectedBody::Raw { body, content_type } => (body.clone(), content_type.clone()),
        };
        let mut resp = Response::new(Body::from(body));
        *resp.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&content_type) {
            h.insert(header::CONTENT_TYPE, v);
        }
        if let Some(v) = self
            .retry_after
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            h.insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// A validated rule and how many more requests it may hit.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub path: String,
    pub method: Option<String>,
    pub kind: FaultKind,
    /// `None` = unlimited.
    pub remaining: Option<u64>,
    #[serde(skip)]
    fault: Fault,
    /// The fields as posted (validated), shown by `GET /__control/faults`.
    #[serde(flatten)]
    shown: Shown,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Shown {
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    location: Option<String>,
}

/// What the pipeline does to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Refuse,
    DropAfterCommit,
    Hang,
    Status(Injected),
    StoredStatus(Injected),
    OutcomeUnknown,
    Delay(Duration),
    Redirect {
        status: u16,
        location: String,
    },
    StallBody {
        status: u16,
        content_type: String,
        prefix: String,
    },
    EndlessBody {
        status: u16,
        content_type: String,
        prefix: String,
    },
}

/// `Some(text)` when `text` can be a header value (visible ASCII and spaces).
fn header_text(what: &str, v: Option<String>) -> Result<Option<String>, String> {
    match v {
        None => Ok(None),
        Some(s) if !s.is_empty() && HeaderValue::from_str(&s).is_ok() => Ok(Some(s)),
        Some(s) => Err(format!("bad {what} {s:?}")),
    }
}

impl Rule {
    /// Checks a posted rule; the error is a short reason for the 400 body.
    pub fn from_spec(spec: RuleSpec) -> Result<Rule, String> {
        if !spec.path.starts_with('/') {
            return Err(format!("path must start with '/': {}", spec.path));
        }
        let kind = spec.kind;
        let answers = matches!(kind, FaultKind::Status | FaultKind::StoredStatus);
        if let Some(s) = spec.status {
            if !(100..=599).contains(&s) {
                return Err(format!("bad status {s}"));
            }
        }
        let retry_after = match spec.retry_after {
            None | Some(Value::Null) => None,
            Some(Value::String(s))
                if !s.is_empty() && s.bytes().all(|b| (0x20..0x7f).contains(&b)) =>
            {
                Some(s)
            }
            Some(Value::Number(n)) if n.as_u64().is_some() => Some(n.to_string()),
            Some(other) => return Err(format!("bad retryAfter {other}")),
        };
        let content_type = header_text("contentType", spec.content_type)?;
        let location = header_text("location", spec.location)?;
        if spec.detail.is_some() && !answers {
            return Err(format!(
                "detail is for status and stored-status, not {kind:?}"
            ));
        }
        let streams = matches!(kind, FaultKind::StallBody | FaultKind::EndlessBody);
        if spec.body.is_some() && !(answers || streams) {
            return Err(format!(
                "body is for status, stored-status, stall-body and endless-body, not {kind:?}"
            ));
        }
        if spec.detail.is_some() && spec.body.is_some() {
            return Err("give detail or body, not both".into());
        }
        if content_type.is_some() && spec.body.is_none() {
            return Err("contentType goes with body".into());
        }
        if location.is_some() && kind != FaultKind::Redirect {
            return Err("location is for redirect".into());
        }
        if retry_after.is_some() && !answers {
            return Err("retryAfter is for status and stored-status".into());
        }
        if spec.delay_ms.is_some() && kind != FaultKind::Delay {
            return Err("delayMs is for delay".into());
        }
        let injected = || Injected {
            status: spec.status.unwrap_or(503),
            body: match (&spec.detail, &spec.body) {
                (_, Some(body)) => InjectedBody::Raw {
                    body: body.clone(),
                    content_type: content_type
                        .clone()
                        .unwrap_or_else(|| "text/plain; charset=utf-8".into()),
                },
                (detail, None) => InjectedBody::Detail {
                    detail: detail.clone().unwrap_or_else(|| "injected".into()),
                },
            },
            retry_after: retry_after.clone(),
        };
        let fault = match kind {
            FaultKind::Refuse => Fault::Refuse,
            FaultKind::DropAfterCommit => Fault::DropAfterCommit,
            FaultKind::Hang => Fault::Hang,
            FaultKind::OutcomeUnknown => Fault::OutcomeUnknown,
            FaultKind::Status => Fault::Status(injected()),
            FaultKind::StoredStatus => Fault::StoredStatus(injected()),
            FaultKind::Delay => Fault::Delay(Duration::from_millis(spec.delay_ms.unwrap_or(1000))),
            FaultKind::Redirect => {
                let status = spec.status.unwrap_or(302);
                if ![301, 302, 303, 307, 308].contains(&status) {
                    return Err(format!(
                        "a redirect is 301, 302, 303, 307 or 308, not {status}"
                    ));
                }
                Fault::Redirect {
                    status,
                    location: location.clone().unwrap_or_else(|| "/login".into()),
                }
            }
            FaultKind::StallBody => Fault::StallBody {
                status: spec.status.unwrap_or(200),
                content_type: content_type
                    .clone()
                    .unwrap_or_else(|| "application/json".into()),
                prefix: spec.body.clone().unwrap_or_else(|| r#"{"user":"#.into()),
            },
            FaultKind::EndlessBody => Fault::EndlessBody {
                status: spec.status.unwrap_or(200),
                content_type: content_type
                    .clone()
                    .unwrap_or_else(|| "text/plain; charset=utf-8".into()),
                prefix: spec.body.clone().unwrap_or_default(),
            },
        };
        Ok(Rule {
            path: spec.path,
            method: spec.method.map(|m| m.to_ascii_uppercase()),
            kind,
            remaining: spec.times,
            fault,
            shown: Shown {
                status: spec.status,
                retry_after,
                delay_ms: spec.delay_ms,
                detail: spec.detail,
                body: spec.body,
                content_type,
                location,
            },
        })
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.remaining != Some(0)
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && glob_match(self.path.as_bytes(), path.as_bytes())
    }
}

/// The first live rule matching the request, which is then counted as hit.
pub fn take(rules: &mut [Rule], method: &str, path: &str) -> Option<Fault> {
    let rule = rules.iter_mut().find(|r| r.matches(method, path))?;
    if let Some(n) = rule.remaining.as_mut() {
        *n -= 1;
    }
    Some(rule.fault.clone())
}

/// Glob on a path: `*` matches within one segment, `**` across segments, `?` one non-`/`
/// character; everything else literally.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    match pat {
        [] => s.is_empty(),
        [b'*', b'*', rest @ ..] => (0..=s.len()).any(|i| glob_match(rest, &s[i..])),
        [b'*', rest @ ..] => {
            let seg = s.iter().position(|&c| c == b'/').unwrap_or(s.len());
            (0..=seg).any(|i| glob_match(rest, &s[i..]))
        }
        [b'?', rest @ ..] => matches!(s, [c, tail @ ..] if *c != b'/' && glob_match(rest, tail)),
        [p, rest @ ..] => matches!(s, [c, tail @ ..] if c == p && glob_match(rest, tail)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(j: &str) -> Result<Rule, String> {
        serde_json::from_str::<RuleSpec>(j)
            .map_err(|e| e.to_string())
            .and_then(Rule::from_spec)
    }

    #[test]
    fn globs() {
        let g = |p: &str, s: &str| glob_match(p.as_bytes(), s.as_bytes());
        assert!(g("/api/notes", "/api/notes"));
        assert!(!g("/api/notes", "/api/notes/1"));
        assert!(g("/api/projects/*/tasks", "/api/projects/p1/tasks"));
        assert!(!g("/api/projects/*/tasks", "/api/projects/a/b/tasks"));
        assert!(g("/api/**", "/api/projects/a/b/tasks"));
        assert!(g("/api/projects/**/tasks", "/api/projects/a/b/tasks"));
        assert!(g("/api/*", "/api/notes"));
        assert!(!g("/api/*", "/api/notes/2"));
        assert!(g("/api/projects/p?/tasks", "/api/projects/p1/tasks"));
        assert!(!g("/api/x", "/api/y"));
    }

    #[test]
    fn times_and_method() {
        let mut rules = vec![rule(
            r#"{"path":"/api/**","method":"post","kind":"status","status":503,"retryAfter":2,"times":1}"#,
        )
        .unwrap()];
        assert_eq!(take(&mut rules, "GET", "/api/notes"), None);
        assert_eq!(
            take(&mut rules, "POST", "/api/notes"),
            Some(Fault::Status(Injected {
                status: 503,
                body: InjectedBody::Detail {
                    detail: "injected".into()
                },
                retry_after: Some("2".into())
            }))
        );
        assert_eq!(take(&mut rules, "POST", "/api/notes"), None);
    }

    #[test]
    fn defaults_of_the_new_kinds() {
        let f = |j: &str| rule(j).map(|r| r.fault);
        assert_eq!(
            f(r#"{"path":"/x","kind":"redirect"}"#),
            Ok(Fault::Redirect {
                status: 302,
                location: "/login".into()
            })
        );
        assert_eq!(
            f(r#"{"path":"/x","kind":"stall-body"}"#),
            Ok(Fault::StallBody {
                status: 200,
                content_type: "application/json".into(),
                prefix: r#"{"user":"#.into()
            })
        );
        assert_eq!(
            f(
                r#"{"path":"/x","kind":"status","status":409,"body":"<h1>busy</h1>","contentType":"text/html"}"#
            ),
            Ok(Fault::Status(Injected {
                status: 409,
                body: InjectedBody::Raw {
                    body: "<h1>busy</h1>".into(),
                    content_type: "text/html".into()
                },
                retry_after: None
            }))
        );
        assert_eq!(
            f(r#"{"path":"/x","kind":"endless-body"}"#),
            Ok(Fault::EndlessBody {
                status: 200,
                content_type: "text/plain; charset=utf-8".into(),
                prefix: String::new()
            })
        );
        assert_eq!(
            f(
                r#"{"path":"/x","kind":"endless-body","status":422,"body":"<h1>key reused</h1>","contentType":"text/html"}"#
            ),
            Ok(Fault::EndlessBody {
                status: 422,
                content_type: "text/html".into(),
                prefix: "<h1>key reused</h1>".into()
            })
        );
        assert!(matches!(
            f(r#"{"path":"/x","kind":"stored-status","detail":"db_down","retryAfter":"5"}"#),
            Ok(Fault::StoredStatus(Injected { status: 503, .. }))
        ));
    }

    #[test]
    fn rejects_bad_rules() {
        for bad in [
            r#"{"path":"/x","kind":"explode"}"#,
            r#"{"path":"x","kind":"refuse"}"#,
            r#"{"path":"/x","kind":"status","status":42}"#,
            r#"{"path":"/x","kind":"status","retryAfter":[1]}"#,
            r#"{"path":"/x","kind":"redirect","status":200}"#,
            r#"{"path":"/x","kind":"redirect","location":"/a\nb"}"#,
            r#"{"path":"/x","kind":"status","detail":"a","body":"b"}"#,
            r#"{"path":"/x","kind":"status","contentType":"text/html"}"#,
            r#"{"path":"/x","kind":"refuse","detail":"a"}"#,
            r#"{"path":"/x","kind":"status","location":"/y"}"#,
            r#"{"path":"/x","kind":"status","staus":500}"#,
            r#"{"path":"/x","kind":"endless-body","detail":"a"}"#,
            r#"{"path":"/x","kind":"endless-body","retryAfter":1}"#,
            r#"{"path":"/x","kind":"endless-body","status":99}"#,
        ] {
            assert!(rule(bad).is_err(), "{bad}");
        }
    }
}
