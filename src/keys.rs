//! Client IP, identity and counter-key building (docs/architecture.md, "Keys").
//!
//! Nothing here touches a socket or Redis: inputs are the peer address and the
//! request's header values, outputs are strings. Every function is total — any
//! byte sequence a client can send produces a bounded, Redis-safe key.

use crate::config::{ClientIpConfig, IpNet, KeyPart};
use sha2::{Digest, Sha256};
use std::net::IpAddr;

/// A key-part value longer than this is replaced by its hash.
pub const MAX_RAW_PART: usize = 64;

/// Length of the hex SHA-256 prefix that replaces an unsafe value (128 bits).
const HASH_HEX_LEN: usize = 32;

/// Finds the client address of a request.
#[derive(Debug, Clone)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
}

impl ClientIpResolver {
    /// Builds a resolver from the validated `client_ip` settings.
    pub fn new(config: &ClientIpConfig) -> Self {
        Self {
            trusted: config.trusted_proxies.clone(),
            ipv6_prefix: config.ipv6_prefix,
        }
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client IP: the peer, unless the peer is a trusted proxy; then
    /// `X-Forwarded-For` (all `forwarded_for` header values, in order) is
    /// walked right to left and the first address that is not a trusted proxy
    /// is the client. An entry that does not parse stops the walk and the last
    /// trustworthy address is used. IPv4-mapped IPv6 is returned as IPv4.
    pub fn client_ip<'a>(
        &self,
        peer: IpAddr,
        forwarded_for: impl DoubleEndedIterator<Item = &'a [u8]>,
    ) -> IpAddr {
        let mut client = canonical(peer);
        if !self.is_trusted(client) {
            return client;
        }
        for header in forwarded_for.rev() {
            for entry in header.rsplit(|&b| b == b',') {
                match parse_forwarded_entry(entry) {
                    Some(ip) => {
                        client = ip;
                        if !self.is_trusted(ip) {
                            return client;
                        }
                    }
                    None => return client,
                }
            }
        }
        client
    }

    /// The key-part text for `ip`: IPv4 as dotted quad, IPv6 as its network
    /// (`2001:db8::/64`) so that one host cannot rotate through its prefix.
    pub fn key_text(&self, ip: IpAddr) -> String {
        match canonical(ip) {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => match ipnet::Ipv6Net::new(v6, self.ipv6_prefix) {
                Ok(net) => net.trunc().to_string(),
                Err(_) => v6.to_string(),
            },
        }
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Parses one X-Forwarded-For entry: `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]:80`.
fn parse_forwarded_entry(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inner, _) = rest.split_once(']')?;
        return inner.parse::<IpAddr>().ok().map(canonical);
    }
    let (host, port) = text.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// Whether a raw key-part value may appear in a key as it is.
fn is_safe(value: &[u8]) -> bool {
    !value.is_empty()
        && value.len() <= MAX_RAW_PART
        && value.iter().all(|&b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'@' | b'-')
        })
}

/// Appends `value` to `out`, as it is when safe, else as `#` + hex SHA-256 prefix.
///
/// `#` never occurs in a safe value, so a hashed value can never equal a raw
/// one, and `|` (the part separator) occurs in neither: distinct part lists
/// give distinct keys (up to 128-bit hash collisions).
pub fn push_part(out: &mut String, value: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    if is_safe(value) {
        // Safe bytes are ASCII, so this never fails.
        if let Ok(text) = std::str::from_utf8(value) {
            out.push_str(text);
            return;
        }
    }
    let digest = Sha256::digest(value);
    out.reserve(1 + HASH_HEX_LEN);
    out.push('#');
    for &byte in digest.iter().take(HASH_HEX_LEN / 2) {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
}

/// The values a request offers for key parts, borrowed from the request.
#[derive(Clone, Copy)]
pub struct RequestParts<'a> {
    /// Client IP key text (see [`ClientIpResolver::key_text`]).
    pub ip: &'a str,
    /// Identity, if one was established.
    pub user: Option<&'a [u8]>,
    /// Method.
    pub method: &'a str,
    /// Path without query.
    pub path: &'a [u8],
    /// Header lookup by lower-case name (first value).
    pub header: &'a dyn Fn(&str) -> Option<&'a [u8]>,
}

/// The counter key of one limit for one request:
/// `prefix + "{" + route + ":" + limit + ":" + parts + "}"`.
///
/// Returns `None` when a part is missing and `substitute_ip` is false (the limit
/// is skipped). A missing part with `substitute_ip` becomes `ip=<client ip>`,
/// which no present value can equal (`=` is never kept raw). The hash tag puts
/// all of one key in one Redis Cluster slot and keeps client bytes from
/// choosing the slot (`{` and `}` are never kept raw). Length is bounded by
/// prefix + names + 33 bytes per part.
pub fn build_key(
    prefix: &str,
    route: &str,
    limit: &str,
    parts: &[KeyPart],
    request: &RequestParts<'_>,
    substitute_ip: bool,
) -> Option<String> {
    let mut key =
        String::with_capacity(prefix.len() + route.len() + limit.len() + 4 + parts.len() * 24);
    key.push_str(prefix);
    key.push('{');
    key.push_str(route);
    key.push(':');
    key.push_str(limit);
    key.push(':');
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            key.push('|');
        }
        let value: Option<&[u8]> = match part {
            KeyPart::Ip => Some(request.ip.as_bytes()),
            KeyPart::User => request.user,
            KeyPart::Method => Some(request.method.as_bytes()),
            KeyPart::Path => Some(request.path),
            KeyPart::Header(name) => (request.header)(name),
        };
        match value.filter(|v| !v.is_empty()) {
            Some(value) => push_part(&mut key, value),
            None if substitute_ip => {
                key.push_str("ip=");
                key.push_str(request.ip);
            }
            None => return None,
        }
    }
    key.push('}');
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(trusted: &[&str]) -> ClientIpResolver {
        ClientIpResolver::new(&ClientIpConfig {
            trusted_proxies: trusted.iter().map(|t| t.parse().unwrap()).collect(),
            ipv6_prefix: 64,
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peer_ignores_forwarded_for() {
        let r = resolver(&["10.0.0.0/8"]);
        let xff: [&[u8]; 1] = [b"1.1.1.1"];
        assert_eq!(
            r.client_ip(ip("203.0.113.9"), xff.into_iter()),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn trusted_chain_is_walked_right_to_left() {
        let r = resolver(&["10.0.0.0/8"]);
        let xff: [&[u8]; 2] = [b"6.6.6.6, 1.2.3.4", b"10.0.0.2"];
        assert_eq!(r.client_ip(ip("10.0.0.1"), xff.into_iter()), ip("1.2.3.4"));
        // Garbage stops the walk at the last trustworthy address.
        let xff: [&[u8]; 1] = [b"1.2.3.4, garbage, 10.0.0.3"];
        assert_eq!(r.client_ip(ip("10.0.0.1"), xff.into_iter()), ip("10.0.0.3"));
        let xff: [&[u8]; 1] = [b"\xff\xfe"];
        assert_eq!(r.client_ip(ip("10.0.0.1"), xff.into_iter()), ip("10.0.0.1"));
        // Ports and brackets are accepted.
        let xff: [&[u8]; 1] = [b"[2001:db8::1]:443, 5.6.7.8:80"];
        assert_eq!(r.client_ip(ip("10.0.0.1"), xff.into_iter()), ip("5.6.7.8"));
        // All-trusted chain: the leftmost is the client.
        let xff: [&[u8]; 1] = [b"10.9.9.9"];
        assert_eq!(r.client_ip(ip("10.0.0.1"), xff.into_iter()), ip("10.9.9.9"));
    }

    #[test]
    fn mapped_ipv4_and_ipv6_prefix() {
        let r = resolver(&["127.0.0.1/32"]);
        assert!(r.is_trusted(ip("::ffff:127.0.0.1")));
        assert_eq!(r.key_text(ip("::ffff:1.2.3.4")), "1.2.3.4");
        assert_eq!(r.key_text(ip("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
    }

    fn key_for(header_value: Option<&'static [u8]>, substitute: bool) -> Option<String> {
        let header = move |_: &str| header_value;
        let parts = RequestParts {
            ip: "1.2.3.4",
            user: None,
            method: "GET",
            path: b"/x",
            header: &header,
        };
        build_key(
            "sluice:",
            "r",
            "l",
            &[KeyPart::Header("k".into()), KeyPart::Method],
            &parts,
            substitute,
        )
    }

    #[test]
    fn keys_are_bounded_and_safe() {
        assert_eq!(
            key_for(Some(b"user_1@example.com"), false).unwrap(),
            "sluice:{r:l:user_1@example.com|GET}"
        );
        let long = key_for(
            Some(Box::leak(vec![b'a'; 10_000].into_boxed_slice())),
            false,
        )
        .unwrap();
        assert!(long.len() < 60, "{long}");
        for nasty in [
            &b"a\r\nb"[..],
            b"{slot}",
            b"x|y",
            b"\x00\xff",
            b"ip=1.2.3.4",
            b"#00",
        ] {
            let nasty: &'static [u8] = Box::leak(nasty.to_vec().into_boxed_slice());
            let key = key_for(Some(nasty), false).unwrap();
            let inner = &key["sluice:{".len()..key.len() - 1];
            assert!(!inner.contains(['{', '}', '\r', '\n']), "{key}");
            assert!(inner.starts_with("r:l:#"), "{key}");
        }
        // Distinct values stay distinct.
        assert_ne!(key_for(Some(b"\x00"), false), key_for(Some(b"\x01"), false));
    }

    #[test]
    fn missing_part_substitutes_or_skips() {
        assert_eq!(key_for(None, true).unwrap(), "sluice:{r:l:ip=1.2.3.4|GET}");
        assert_eq!(key_for(Some(b""), false), None);
        assert_ne!(key_for(None, true), key_for(Some(b"1.2.3.4"), true));
    }
}
