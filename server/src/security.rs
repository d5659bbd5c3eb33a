//! Where a request comes from: the Origin / `Sec-Fetch-Site` check on writes and on the
//! control routes, and whether the site is served over https (for `Secure` cookies).
//!
//! A browser names the page that sent a request: `Origin` on every cross-origin request and
//! on every non-GET one, and `Sec-Fetch-Site` on everything. A service worker's fetch is
//! `same-origin`, as is the demo's own page. Requests without either header are not from a
//! browser page (a script, curl, the test harness in Node) and pass: the session cookie and
//! the CSRF token still stand between them and the data.

use axum::http::{header, HeaderMap};
use std::net::IpAddr;

pub struct OriginPolicy {
    /// Configured origins (`--origin`), normalised; empty: the one `Host` names.
    origins: Vec<String>,
    /// The address the server is bound to, a trusted `Host` for the control routes.
    bound: IpAddr,
}

impl OriginPolicy {
    pub fn new(origins: Vec<String>, bound: IpAddr) -> OriginPolicy {
        OriginPolicy { origins, bound }
    }

    /// The origin this request was sent to, as a browser would write it.
    fn own_origin(headers: &HeaderMap) -> Option<String> {
        let host = headers.get(header::HOST)?.to_str().ok()?;
        let scheme = if served_over_https(headers) {
            "https"
        } else {
            "http"
        };
        Some(format!("{scheme}://{}", host.to_ascii_lowercase()))
    }

    fn is_own(&self, origin: &str, headers: &HeaderMap) -> bool {
        if self.origins.is_empty() {
            OriginPolicy::own_origin(headers).is_some_and(|o| o == origin)
        } else {
            self.origins.iter().any(|o| o == origin)
        }
    }

    /// Whether a write may go on: no browser says it came from elsewhere.
    pub fn write_allowed(&self, headers: &HeaderMap) -> bool {
        if let Some(site) = headers.get("sec-fetch-site") {
            if !matches!(site.as_bytes(), b"same-origin" | b"none") {
                return false;
            }
        }
        match headers.get(header::ORIGIN) {
            None => true,
            Some(o) => o
                .to_str()
                .is_ok_and(|o| self.is_own(&o.to_ascii_lowercase(), headers)),
        }
    }

    /// Whether a control request may go on: as a write, and addressed to a host that is
    /// this server (loopback, the bound address, or a configured origin). The host check
    /// stops DNS rebinding: a site whose name resolves to 127.0.0.1 is same-origin with
    /// itself, but its `Host` is its own name.
    pub fn control_allowed(&self, headers: &HeaderMap) -> bool {
        if !self.write_allowed(headers) {
            return false;
        }
        let Some(own) = OriginPolicy::own_origin(headers) else {
            return false;
        };
        if !self.origins.is_empty() {
            return self.origins.contains(&own);
        }
        let host = own.split_once("://").map_or("", |(_, h)| h);
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(n, _)| n),
        };
        if name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        match name.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || (!self.bound.is_unspecified() && ip == self.bound),
            Err(_) => false,
        }
    }
}

/// Whether the browser reached the site over https: a TLS-terminating proxy in front says
/// so in `X-Forwarded-Proto` or `Forwarded`. (A client that forges it only makes its own
/// cookie `Secure`, which its browser then refuses to send over http.)
pub fn served_over_https(headers: &HeaderMap) -> bool {
    let forwarded_proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .next()
                .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
        });
    let forwarded = headers
        .get(header::FORWARDED)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',').next().is_some_and(|first| {
                first
                    .split(';')
                    .any(|p| p.trim().eq_ignore_ascii_case("proto=https"))
            })
        });
    forwarded_proto || forwarded
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::net::Ipv4Addr;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn policy() -> OriginPolicy {
        OriginPolicy::new(Vec::new(), IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    #[test]
    fn writes() {
        let p = policy();
        let host = ("host", "127.0.0.1:8080");
        assert!(p.write_allowed(&headers(&[host])), "no browser headers");
        assert!(p.write_allowed(&headers(&[
            host,
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!p.write_allowed(&headers(&[host, ("origin", "http://evil.example")])));
        assert!(!p.write_allowed(&headers(&[host, ("origin", "null")])));
        assert!(!p.write_allowed(&headers(&[host, ("sec-fetch-site", "cross-site")])));
        assert!(!p.write_allowed(&headers(&[host, ("sec-fetch-site", "same-site")])));
        assert!(
            !p.write_allowed(&headers(&[host, ("origin", "https://127.0.0.1:8080")])),
            "another scheme"
        );
        assert!(p.write_allowed(&headers(&[
            host,
            ("origin", "https://127.0.0.1:8080"),
            ("x-forwarded-proto", "https")
        ])));
        let configured = OriginPolicy::new(
            vec!["https://app.example".into()],
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        );
        assert!(configured.write_allowed(&headers(&[
            ("host", "internal:80"),
            ("origin", "https://app.example")
        ])));
        assert!(!configured.write_allowed(&headers(&[
            ("host", "internal:80"),
            ("origin", "http://internal:80")
        ])));
    }

    #[test]
    fn control() {
        let p = policy();
        assert!(p.control_allowed(&headers(&[("host", "127.0.0.1:9")])));
        assert!(p.control_allowed(&headers(&[
            ("host", "localhost:9"),
            ("origin", "http://localhost:9")
        ])));
        assert!(p.control_allowed(&headers(&[("host", "[::1]:9")])));
        assert!(
            !p.control_allowed(&headers(&[
                ("host", "rebound.example:9"),
                ("origin", "http://rebound.example:9")
            ])),
            "DNS rebinding"
        );
        assert!(!p.control_allowed(&headers(&[
            ("host", "127.0.0.1:9"),
            ("origin", "http://evil.example")
        ])));
        assert!(!p.control_allowed(&headers(&[])), "no host");
    }

    #[test]
    fn https() {
        assert!(served_over_https(&headers(&[(
            "x-forwarded-proto",
            "https"
        )])));
        assert!(served_over_https(&headers(&[(
            "forwarded",
            "for=1.2.3.4;proto=https"
        )])));
        assert!(!served_over_https(&headers(&[(
            "x-forwarded-proto",
            "http"
        )])));
        assert!(!served_over_https(&headers(&[])));
    }
}
