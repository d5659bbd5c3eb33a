//! Fault rules for `POST /__control/faults`: which `/api/` requests to break, and how.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Refuse,
    DropAfterCommit,
    Hang,
    Status,
    OutcomeUnknown,
    /// Extension to docs/SERVER-API.md: claim (if keyed), wait `delayMs`, then run the
    /// route and answer normally. It makes the "slow but alive" and "client gave up
    /// mid-run" cases reproducible.
    Delay,
}

/// A rule as posted by a test.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
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
}

/// A validated rule and how many more requests it may hit.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub path: String,
    pub method: Option<String>,
    pub kind: FaultKind,
    pub status: Option<u16>,
    pub retry_after: Option<String>,
    /// `None` = unlimited.
    pub remaining: Option<u64>,
    pub delay_ms: Option<u64>,
}

/// What the pipeline does to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Refuse,
    DropAfterCommit,
    Hang,
    Status {
        status: u16,
        retry_after: Option<String>,
    },
    OutcomeUnknown,
    Delay(Duration),
}

impl Rule {
    /// Checks a posted rule; the error is a short reason for the 400 body.
    pub fn from_spec(spec: RuleSpec) -> Result<Rule, String> {
        if !spec.path.starts_with('/') {
            return Err(format!("path must start with '/': {}", spec.path));
        }
        let status = match (spec.kind, spec.status) {
            (FaultKind::Status, None) => Some(503),
            (_, Some(s)) if !(100..=599).contains(&s) => return Err(format!("bad status {s}")),
            (_, s) => s,
        };
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
        Ok(Rule {
            path: spec.path,
            method: spec.method.map(|m| m.to_ascii_uppercase()),
            kind: spec.kind,
            status,
            retry_after,
            remaining: spec.times,
            delay_ms: spec.delay_ms,
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

    fn fault(&self) -> Fault {
        match self.kind {
            FaultKind::Refuse => Fault::Refuse,
            FaultKind::DropAfterCommit => Fault::DropAfterCommit,
            FaultKind::Hang => Fault::Hang,
            FaultKind::Status => Fault::Status {
                status: self.status.unwrap_or(503),
                retry_after: self.retry_after.clone(),
            },
            FaultKind::OutcomeUnknown => Fault::OutcomeUnknown,
            FaultKind::Delay => Fault::Delay(Duration::from_millis(self.delay_ms.unwrap_or(1000))),
        }
    }
}

/// The first live rule matching the request, which is then counted as hit.
pub fn take(rules: &mut [Rule], method: &str, path: &str) -> Option<Fault> {
    let rule = rules.iter_mut().find(|r| r.matches(method, path))?;
    if let Some(n) = rule.remaining.as_mut() {
        *n -= 1;
    }
    Some(rule.fault())
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
        let spec: RuleSpec = serde_json::from_str(
            r#"{"path":"/api/**","method":"post","kind":"status","status":503,"retryAfter":2,"times":1}"#,
        )
        .unwrap();
        let mut rules = vec![Rule::from_spec(spec).unwrap()];
        assert_eq!(take(&mut rules, "GET", "/api/notes"), None);
        assert_eq!(
            take(&mut rules, "POST", "/api/notes"),
            Some(Fault::Status {
                status: 503,
                retry_after: Some("2".into())
            })
        );
        assert_eq!(take(&mut rules, "POST", "/api/notes"), None);
    }

    #[test]
    fn rejects_bad_rules() {
        let bad = |j: &str| {
            serde_json::from_str::<RuleSpec>(j)
                .map_err(|e| e.to_string())
                .and_then(Rule::from_spec)
        };
        assert!(bad(r#"{"path":"/x","kind":"explode"}"#).is_err());
        assert!(bad(r#"{"path":"x","kind":"refuse"}"#).is_err());
        assert!(bad(r#"{"path":"/x","kind":"status","status":42}"#).is_err());
        assert!(bad(r#"{"path":"/x","kind":"status","retryAfter":[1]}"#).is_err());
    }
}
