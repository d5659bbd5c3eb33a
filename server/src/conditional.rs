//! `If-Match` (RFC 9110 §13.1.1) with strong comparison, for the versioned tasks.

use axum::http::{header, HeaderMap};

/// What a request's `If-Match` headers ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: any current version.
    Any,
    /// A list of entity tags as sent (`"3"`, `W/"3"`); a weak one never matches.
    Tags(Vec<String>),
}

impl IfMatch {
    /// The request's condition, if it has one. A header that does not parse is a list that
    /// matches nothing: the update must not go ahead on a condition nobody can read.
    pub fn from_headers(headers: &HeaderMap) -> Option<IfMatch> {
        let mut values = headers.get_all(header::IF_MATCH).iter().peekable();
        values.peek()?;
        let mut tags = Vec::new();
        for v in values {
            let Ok(text) = v.to_str() else {
                return Some(IfMatch::Tags(Vec::new()));
            };
            match parse_list(text) {
                Some(List::Any) => return Some(IfMatch::Any),
                Some(List::Tags(t)) => tags.extend(t),
                None => return Some(IfMatch::Tags(Vec::new())),
            }
        }
        Some(IfMatch::Tags(tags))
    }

    /// Strong comparison against the current entity tag (e.g. `"3"`).
    pub fn matches(&self, current: &str) -> bool {
        match self {
            IfMatch::Any => true,
            IfMatch::Tags(tags) => tags.iter().any(|t| !t.starts_with("W/") && t == current),
        }
    }
}

enum List {
    Any,
    Tags(Vec<String>),
}

/// `*` or `1#entity-tag`; `None` when malformed.
fn parse_list(text: &str) -> Option<List> {
    if text.trim() == "*" {
        return Some(List::Any);
    }
    let mut tags = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let (weak, after) = match rest.strip_prefix("W/") {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let inner = after.strip_prefix('"')?;
        let end = inner.find('"')?;
        let opaque = &inner[..end];
        if !opaque
            .bytes()
            .all(|b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80)
        {
            return None;
        }
        tags.push(format!("{}\"{opaque}\"", if weak { "W/" } else { "" }));
        rest = inner[end + 1..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r.trim_start(),
            None if rest.is_empty() => {}
            None => return None,
        }
    }
    if tags.is_empty() {
        None
    } else {
        Some(List::Tags(tags))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn cond(values: &[&'static str]) -> Option<IfMatch> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::IF_MATCH, HeaderValue::from_static(v));
        }
        IfMatch::from_headers(&h)
    }

    #[test]
    fn strong_comparison() {
        assert_eq!(cond(&[]), None);
        assert!(cond(&["\"3\""]).unwrap().matches("\"3\""));
        assert!(!cond(&["\"3\""]).unwrap().matches("\"4\""));
        assert!(
            !cond(&["W/\"3\""]).unwrap().matches("\"3\""),
            "weak never matches"
        );
        assert!(cond(&["\"1\", \"3\""]).unwrap().matches("\"3\""));
        assert!(cond(&["\"1\"", "\"3\""]).unwrap().matches("\"3\""));
        assert!(cond(&["*"]).unwrap().matches("\"9\""));
        assert!(
            !cond(&["3"]).unwrap().matches("\"3\""),
            "unquoted is malformed"
        );
        assert!(!cond(&["\"3\" \"4\""]).unwrap().matches("\"3\""));
        assert!(!cond(&[""]).unwrap().matches("\"3\""));
    }
}
