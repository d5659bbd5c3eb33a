//! Who a request comes from, for the login throttle: the peer address, or behind a
//! configured trusted proxy (`--trusted-proxy`), the client that proxy names.
//!
//! A forwarding header is only believed when the connection comes from a trusted proxy,
//! and only for the hops that proxy (and any trusted proxy before it) added: the list is
//! read from the right, skipping trusted addresses, and the first other entry is the
//! client. Entries to its left were written by the client itself and prove nothing. Only
//! the header the proxy is configured to write is read (`--client-ip-header`): a proxy
//! that appends `X-Forwarded-For` passes a client's own `Forwarded` through untouched.
//!
//! IPv6 clients are counted per /64: one host commonly holds a whole /64, so counting per
//! address would let it try again from a fresh address for every attempt.

use axum::http::HeaderMap;
use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Which header the trusted proxies write the client's address into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, cloud load balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for=proxy1`.
    Forwarded,
}

impl ForwardedHeader {
    pub fn parse(s: &str) -> Option<ForwardedHeader> {
        match s.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Some(ForwardedHeader::XForwardedFor),
            "forwarded" => Some(ForwardedHeader::Forwarded),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }
}

/// Parses `--trusted-proxy`: an address (`10.0.0.7`, `::1`) or a network (`10.0.0.0/8`).
pub fn parse_net(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    s.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
        format!("{s:?} is not an address or a network (10.0.0.7, 10.0.0.0/8, fd00::/8)")
    })
}

/// The key the throttle counts a client under.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientKey(String);

impl ClientKey {
    fn of_ip(ip: IpAddr) -> ClientKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => ClientKey(v4.to_string()),
            IpAddr::V6(v6) => {
                let net = ipnet::Ipv6Net::new(v6, 64).map(|n| n.trunc());
                ClientKey(net.map_or_else(|_| v6.to_string(), |n| n.to_string()))
            }
        }
    }

    /// What a proxy wrote when it names no address (`unknown`, an obfuscated `_node`).
    fn opaque(token: &str) -> ClientKey {
        ClientKey(format!(
            "token:{}",
            token.chars().take(64).collect::<String>()
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The trusted proxies and the header they write.
#[derive(Clone, Debug, Default)]
pub struct ClientPolicy {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
}

impl ClientPolicy {
    pub fn new(trusted: Vec<IpNet>, header: ForwardedHeader) -> ClientPolicy {
        ClientPolicy { trusted, header }
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client a request on a connection from `peer` comes from.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> ClientKey {
        if !self.is_trusted(peer) {
            return ClientKey::of_ip(peer);
        }
        let hops = self.hops(headers);
        for hop in hops.iter().rev() {
            match hop {
                Hop::Ip(ip) if self.is_trusted(*ip) => continue,
                Hop::Ip(ip) => return ClientKey::of_ip(*ip),
                Hop::Opaque(token) => return ClientKey::opaque(token),
            }
        }
        // Every hop is a trusted proxy (or the header is absent): the leftmost one is as
        // close to the client as anyone can say.
        match hops.first() {
            Some(Hop::Ip(ip)) => ClientKey::of_ip(*ip),
            Some(Hop::Opaque(token)) => ClientKey::opaque(token),
            None => ClientKey::of_ip(peer),
        }
    }

    /// The header's entries, left (client side) to right (nearest proxy), over every
    /// line of it in order.
    fn hops(&self, headers: &HeaderMap) -> Vec<Hop> {
        let lines = headers
            .get_all(self.header.name())
            .iter()
            .filter_map(|v| v.to_str().ok());
        let mut hops = Vec::new();
        for line in lines {
            for element in split_unquoted(line, ',') {
                let value = match self.header {
                    ForwardedHeader::XForwardedFor => Some(element.trim()),
                    ForwardedHeader::Forwarded => for_parameter(element),
                };
                if let Some(v) = value.filter(|v| !v.is_empty()) {
                    hops.push(Hop::parse(v));
                }
            }
        }
        hops
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Hop {
    Ip(IpAddr),
    Opaque(String),
}

impl Hop {
    /// `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:4711`, `"…"`.
    fn parse(v: &str) -> Hop {
        let v = v.trim().trim_matches('"');
        if let Ok(ip) = v.parse::<IpAddr>() {
            return Hop::Ip(ip);
        }
        if let Ok(sock) = v.parse::<SocketAddr>() {
            return Hop::Ip(sock.ip());
        }
        if let Some(inner) = v.strip_prefix('[').and_then(|r| r.split(']').next()) {
            if let Ok(ip) = inner.parse::<IpAddr>() {
                return Hop::Ip(ip);
            }
        }
        Hop::Opaque(v.to_owned())
    }
}

/// The `for=` value of one `Forwarded` element (`for=1.2.3.4;proto=https`).
fn for_parameter(element: &str) -> Option<&str> {
    split_unquoted(element, ';').into_iter().find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then_some(value.trim())
    })
}

/// Splits at `sep` outside double quotes.
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn policy(nets: &[&str], header: ForwardedHeader) -> ClientPolicy {
        ClientPolicy::new(
            nets.iter().map(|n| parse_net(n).expect("net")).collect(),
            header,
        )
    }

    #[test]
    fn without_trusted_proxies_the_peer_is_the_client() {
        let p = ClientPolicy::default();
        let h = headers(&[
            ("x-forwarded-for", "198.51.100.7"),
            ("forwarded", "for=1.1.1.1"),
        ]);
        assert_eq!(p.client(ip("127.0.0.1"), &h).as_str(), "127.0.0.1");
        // A peer that is not the configured proxy is not believed either.
        let p = policy(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        assert_eq!(p.client(ip("192.0.2.1"), &h).as_str(), "192.0.2.1");
    }

    #[test]
    fn behind_a_trusted_proxy_the_nearest_untrusted_hop() {
        let p = policy(&["10.0.0.0/8", "127.0.0.1"], ForwardedHeader::XForwardedFor);
        let peer = ip("127.0.0.1");
        let one = headers(&[("x-forwarded-for", "203.0.113.5")]);
        assert_eq!(p.client(peer, &one).as_str(), "203.0.113.5");
        // The client's own (forged) entries are on the left; the proxies' on the right.
        let chain = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.1.2.3")]);
        assert_eq!(p.client(peer, &chain).as_str(), "203.0.113.5");
        // Two header lines are one list, in order.
        let lines = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.9:4711, 10.0.0.2"),
        ]);
        assert_eq!(p.client(peer, &lines).as_str(), "203.0.113.9");
        // Only trusted hops: the leftmost; no header: the peer.
        let internal = headers(&[("x-forwarded-for", "10.0.0.9, 10.0.0.2")]);
        assert_eq!(p.client(peer, &internal).as_str(), "10.0.0.9");
        assert_eq!(p.client(peer, &headers(&[])).as_str(), "127.0.0.1");
        // The other header is not the one this proxy writes.
        let other = headers(&[("forwarded", "for=203.0.113.77")]);
        assert_eq!(p.client(peer, &other).as_str(), "127.0.0.1");
    }

    #[test]
    fn rfc7239_forwarded() {
        let p = policy(&["127.0.0.0/8"], ForwardedHeader::Forwarded);
        let peer = ip("127.0.0.1");
        let h = headers(&[(
            "forwarded",
            r#"for=6.6.6.6, For="[2001:db8:cafe::17]:4711";proto=https, for=127.0.0.2;by=x"#,
        )]);
        assert_eq!(p.client(peer, &h).as_str(), "2001:db8:cafe::/64");
        let hidden = headers(&[("forwarded", "for=_hidden;proto=https")]);
        assert_eq!(p.client(peer, &hidden).as_str(), "token:_hidden");
        let v4 = headers(&[("forwarded", r#"for="198.51.100.17:8080""#)]);
        assert_eq!(p.client(peer, &v4).as_str(), "198.51.100.17");
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_v4_as_v4() {
        let p = ClientPolicy::default();
        let h = headers(&[]);
        assert_eq!(
            p.client(ip("2001:db8:1:2:aaaa::1"), &h),
            p.client(ip("2001:db8:1:2:bbbb::9"), &h)
        );
        assert_ne!(
            p.client(ip("2001:db8:1:2::1"), &h),
            p.client(ip("2001:db8:1:3::1"), &h)
        );
        assert_eq!(p.client(ip("::ffff:192.0.2.4"), &h).as_str(), "192.0.2.4");
        let p = policy(&["127.0.0.1"], ForwardedHeader::XForwardedFor);
        assert_eq!(
            p.client(
                ip("::ffff:127.0.0.1"),
                &headers(&[("x-forwarded-for", "192.0.2.8")])
            )
            .as_str(),
            "192.0.2.8",
            "a v4-mapped peer is the trusted v4 proxy"
        );
    }

    #[test]
    fn trusted_proxy_flag_values() {
        assert_eq!(
            parse_net("10.0.0.7").expect("ip").to_string(),
            "10.0.0.7/32"
        );
        assert_eq!(
            parse_net("10.1.2.3/8").expect("net").to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(parse_net("fd00::/8").expect("v6").to_string(), "fd00::/8");
        for bad in ["", "10.0.0.0/33", "proxy.internal", "10.0.0"] {
            assert!(parse_net(bad).is_err(), "{bad}");
        }
        assert_eq!(
            ForwardedHeader::parse("Forwarded"),
            Some(ForwardedHeader::Forwarded)
        );
        assert_eq!(ForwardedHeader::parse("x-real-ip"), None);
    }
}
