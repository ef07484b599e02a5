//! What a key part reads off one request: the client IP (through trusted
//! proxies), a header, query parameter, cookie, path parameter, the method,
//! the path, the user or a client certificate's field.
//!
//! Nothing here touches a socket or Redis: inputs are the peer address and the
//! request's values, outputs are byte strings. Every function is total: any
//! byte sequence a client can send gives a value, a "missing" or an
//! "ambiguous", never a panic.

use crate::config::{ClientIpConfig, IpNet, KeyPart};
use crate::request::client_cert::ClientCert;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr};

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
            IpAddr::V4(v4) => dotted_quad(v4),
            IpAddr::V6(v6) => match ipnet::Ipv6Net::new(v6, self.ipv6_prefix) {
                Ok(net) => net.trunc().to_string(),
                Err(_) => v6.to_string(),
            },
        }
    }
}

/// `a.b.c.d`, as `Ipv4Addr`'s `Display` writes it, digit by digit: the
/// formatting machinery cost about 1,300 instructions for every request
/// (the text is made for each request's key parts).
fn dotted_quad(ip: Ipv4Addr) -> String {
    let mut text = String::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
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

/// A key part's value in one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartValue<'a> {
    /// The request does not carry it (or carries it empty).
    Missing,
    /// Its one value.
    One(Cow<'a, [u8]>),
    /// Carried twice with different values (`?k=a&k=b`, two cookies of one
    /// name): which one the upstream reads is not known, so no key is made
    /// from either — a client could otherwise be counted under a value of
    /// its choosing while the upstream acts on another.
    Ambiguous,
}

impl<'a> PartValue<'a> {
    /// Adds `value`, found once more, to what was found so far.
    fn and(self, value: Cow<'a, [u8]>) -> Self {
        match self {
            PartValue::Missing => PartValue::One(value),
            PartValue::One(first) if first == value => PartValue::One(first),
            _ => PartValue::Ambiguous,
        }
    }
}

/// The value of query parameter `name` in the raw query string `query`
/// (without `?`). Names and values are percent-decoded and `+` is a space,
/// as HTML forms and most frameworks read them, so `%61` and `a` are one
/// key; a value that is not valid percent-encoding is taken as it is.
pub fn query_value<'a>(query: &'a [u8], name: &str) -> PartValue<'a> {
    let mut found = PartValue::Missing;
    for pair in query.split(|&b| b == b'&') {
        let (raw_name, raw_value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        if form_decode(raw_name).as_ref() != name.as_bytes() {
            continue;
        }
        let value = form_decode(raw_value);
        if value.is_empty() {
            continue;
        }
        found = found.and(value);
    }
    found
}

/// `target` (origin form) without query parameter `name` (compared as
/// [`query_value`] decodes it), or `None` when it has no such parameter.
/// The other parameters stay as they were sent, in order.
pub fn without_query_param(target: &[u8], name: &str) -> Option<Vec<u8>> {
    let at = target.iter().position(|&b| b == b'?')?;
    let (path, query) = (&target[..at], &target[at + 1..]);
    let named = |pair: &&[u8]| {
        let raw_name = pair.split(|&b| b == b'=').next().unwrap_or(pair);
        form_decode(raw_name).as_ref() == name.as_bytes()
    };
    let pairs: Vec<&[u8]> = query.split(|&b| b == b'&').collect();
    if !pairs.iter().any(named) {
        return None;
    }
    let kept: Vec<&[u8]> = pairs.into_iter().filter(|p| !named(p)).collect();
    let mut out = path.to_vec();
    if !kept.is_empty() {
        out.push(b'?');
        out.extend_from_slice(&kept.join(&b'&'));
    }
    Some(out)
}

/// Percent-decodes `raw`, with `+` as a space; invalid escapes stay as they are.
fn form_decode(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(raw);
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => match (
                raw.get(i + 1).and_then(|&b| hex(b)),
                raw.get(i + 2).and_then(|&b| hex(b)),
            ) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

/// The value of cookie `name` in the `Cookie` header values `headers` (a
/// client may split its cookies over several). Pairs are `;`-separated,
/// names compared exactly, values trimmed and unquoted (`"a"` and `a` are
/// one key).
pub fn cookie_value<'a>(headers: impl Iterator<Item = &'a [u8]>, name: &str) -> PartValue<'a> {
    let mut found = PartValue::Missing;
    for header in headers {
        for pair in header.split(|&b| b == b';') {
            let Some(eq) = pair.iter().position(|&b| b == b'=') else {
                continue;
            };
            if pair[..eq].trim_ascii() != name.as_bytes() {
                continue;
            }
            let mut value = pair[eq + 1..].trim_ascii();
            if value.len() >= 2 && value.starts_with(b"\"") && value.ends_with(b"\"") {
                value = &value[1..value.len() - 1];
            }
            if value.is_empty() {
                continue;
            }
            found = found.and(Cow::Borrowed(value));
        }
    }
    found
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
    /// The raw query string, without `?` (empty when there is none).
    pub query: &'a [u8],
    /// Cookie lookup by name (see [`cookie_value`]).
    pub cookie: &'a dyn Fn(&str) -> PartValue<'a>,
    /// Path parameter lookup by name (the route's template).
    pub param: &'a dyn Fn(&str) -> Option<&'a str>,
    /// The connection's verified client certificate, if any.
    pub client_cert: Option<&'a ClientCert>,
}

/// The raw value of `part` in `request` (before hashing).
pub(crate) fn part_value<'a>(part: &KeyPart, request: &RequestParts<'a>) -> PartValue<'a> {
    let one = |value: &'a [u8]| PartValue::One(Cow::Borrowed(value));
    match part {
        KeyPart::Ip => one(request.ip.as_bytes()),
        KeyPart::User => request.user.map_or(PartValue::Missing, one),
        KeyPart::Method => one(request.method.as_bytes()),
        KeyPart::Path => one(request.path),
        KeyPart::Header(name) => (request.header)(name).map_or(PartValue::Missing, one),
        KeyPart::Query(name) => query_value(request.query, name),
        KeyPart::Cookie(name) => (request.cookie)(name),
        KeyPart::Param(name) => {
            (request.param)(name).map_or(PartValue::Missing, |v| one(v.as_bytes()))
        }
        KeyPart::ClientCert => request
            .client_cert
            .map_or(PartValue::Missing, |c| one(c.fingerprint.as_bytes())),
        KeyPart::ClientSubject => request
            .client_cert
            .map_or(PartValue::Missing, |c| one(c.subject.as_bytes())),
        KeyPart::ClientSan => request
            .client_cert
            .and_then(ClientCert::san)
            .map_or(PartValue::Missing, |san| one(san.as_bytes())),
    }
}

#[cfg(test)]
mod tests {
    /// The hand-written dotted quad is `Display`'s, for every octet width.
    #[test]
    fn dotted_quads_are_written_as_display_writes_them() {
        for text in [
            "0.0.0.0",
            "255.255.255.255",
            "1.2.3.4",
            "10.0.100.9",
            "192.168.0.10",
            "99.100.101.199",
        ] {
            let ip: Ipv4Addr = text.parse().expect("an address");
            assert_eq!(super::dotted_quad(ip), ip.to_string());
        }
    }

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

    fn one(value: &[u8]) -> PartValue<'_> {
        PartValue::One(Cow::Borrowed(value))
    }

    #[test]
    fn a_query_parameter_is_removed_in_every_spelling_and_the_rest_kept() {
        let strip = |t: &str| {
            without_query_param(t.as_bytes(), "api_key").map(|v| String::from_utf8(v).unwrap())
        };
        assert_eq!(strip("/a?api_key=s3cret"), Some("/a".into()));
        assert_eq!(
            strip("/a?x=1&api_key=s3cret&y=2"),
            Some("/a?x=1&y=2".into())
        );
        assert_eq!(
            strip("/a?api%5Fkey=s3cret&api_key=again&z"),
            Some("/a?z".into())
        );
        assert_eq!(strip("/a?api_key"), Some("/a".into()));
        assert_eq!(strip("/a?x=api_key"), None);
        assert_eq!(strip("/a"), None);
    }

    #[test]
    fn query_parameters_are_decoded_and_must_be_unambiguous() {
        let q = b"a=1&key=abc&b=&flag&sp=x+y%20z";
        assert_eq!(query_value(q, "key"), one(b"abc"));
        assert_eq!(query_value(q, "sp"), one(b"x y z"));
        assert_eq!(query_value(q, "b"), PartValue::Missing);
        assert_eq!(query_value(q, "flag"), PartValue::Missing);
        assert_eq!(query_value(q, "nope"), PartValue::Missing);
        // Encoded spellings of one value are one value, and one name.
        assert_eq!(query_value(b"%6Bey=%61bc", "key"), one(b"abc"));
        assert_eq!(query_value(b"key=a&key=%61", "key"), one(b"a"));
        // Two different values: neither is trusted.
        assert_eq!(query_value(b"key=a&key=b", "key"), PartValue::Ambiguous);
        // Bad escapes are kept literally.
        assert_eq!(query_value(b"key=%zz%4", "key"), one(b"%zz%4"));
        assert_eq!(query_value(b"key=%00%ff", "key"), one(b"\x00\xff"));
    }

    #[test]
    fn cookies_are_trimmed_unquoted_and_must_be_unambiguous() {
        let headers: [&[u8]; 2] = [b"a=1; session=s1 ;x=\"q\"", b"b=2"];
        assert_eq!(cookie_value(headers.into_iter(), "session"), one(b"s1"));
        assert_eq!(cookie_value(headers.into_iter(), "x"), one(b"q"));
        assert_eq!(cookie_value(headers.into_iter(), "b"), one(b"2"));
        assert_eq!(
            cookie_value(headers.into_iter(), "Session"),
            PartValue::Missing
        );
        let twice: [&[u8]; 2] = [b"s=1", b"s=\"1\"; s=2"];
        assert_eq!(cookie_value(twice.into_iter(), "s"), PartValue::Ambiguous);
        let same: [&[u8]; 2] = [b"s=1", b"s=\"1\""];
        assert_eq!(cookie_value(same.into_iter(), "s"), one(b"1"));
        let empty: [&[u8]; 1] = [b"s=; t"];
        assert_eq!(cookie_value(empty.into_iter(), "s"), PartValue::Missing);
    }
}
