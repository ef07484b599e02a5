//! The one canonical spelling of a request's target and host.
//!
//! The gateway and the upstream must never disagree about which endpoint a
//! request is for: if `/api/%73ms/a` were routed as something other than
//! `/api/sms/a`, a limit on `/api/sms/` could be walked around by spelling the
//! path differently, because the upstream (like most frameworks) normalises
//! the path before dispatching it. So every request target is made canonical
//! once, before routing, before keys are built and before it is forwarded:
//!
//! 1. percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are
//!    decoded; every other escape stays encoded, with upper-case hex; raw bytes
//!    that may not appear in a path (non-ASCII, `"`, `<`, `{`, …) are encoded;
//! 2. runs of `/` are merged into one;
//! 3. dot segments are removed (RFC 3986 §5.2.4), after decoding, so `%2e%2e`
//!    is `..`.
//!
//! What cannot be made canonical safely is refused ([`TargetError`], answered
//! 400): encoded control bytes such as `%00`, malformed escapes, a raw
//! backslash or control byte, `..` above the root, and encoded slashes (`%2F`,
//! `%5C`) unless the operator keeps them ([`EscapedSlashes::Keep`]), for APIs
//! that put slashes inside identifiers. The query is kept exactly as sent.
//!
//! The result is idempotent and never contains `//`, `/./` or `/../`; two
//! targets that an RFC 3986 normaliser considers equal get the same result
//! (property-tested). Absolute-form targets (`GET http://host/p HTTP/1.1`)
//! give their authority as the host and are forwarded in origin-form.

use std::borrow::Cow;

/// What to do with `%2F` and `%5C` in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// Refuse the request (400): a path segment holding a slash means one
    /// thing to the gateway and possibly another to the upstream.
    #[default]
    Reject,
    /// Keep them encoded (`%2F`, `%5C`), never decoded into separators.
    Keep,
}

/// Why a request target or host was refused. Always the client's fault: 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// `%` not followed by two hex digits.
    #[error("malformed percent-escape")]
    MalformedEscape,
    /// A control byte, raw or percent-encoded (`%00`, `%0A`, `%7F`, …).
    #[error("control byte in the target")]
    ControlByte,
    /// A raw backslash, which some servers treat as a separator.
    #[error("backslash in the path")]
    Backslash,
    /// `%2F` or `%5C` while `escaped_slashes: reject`.
    #[error("encoded slash in the path")]
    EscapedSlash,
    /// A `..` segment that would climb above `/`.
    #[error("dot segment above the root")]
    AboveRoot,
    /// Not origin-form (`/…`) nor absolute-form (`http://…`).
    #[error("unsupported request-target form")]
    Form,
    /// A host that is not a valid name or address (or carries user info).
    #[error("invalid host")]
    Host,
    /// An HTTP/1.1 request without Host, with several, or with a Host that
    /// differs from its absolute-form authority.
    #[error("missing, repeated or conflicting Host")]
    HostMismatch,
}

/// A request's target, made canonical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalTarget<'a> {
    /// The canonical path: starts with `/`, no `//`, no dot segments.
    pub path: Cow<'a, str>,
    /// The query exactly as sent (without the `?`), if any.
    pub query: Option<&'a [u8]>,
    /// For an absolute-form target, its authority as sent.
    pub authority: Option<&'a [u8]>,
}

impl CanonicalTarget<'_> {
    /// The origin-form target to send upstream: the canonical path and the
    /// query as sent.
    pub fn origin_form(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.path.len() + 1 + self.query.map_or(0, <[u8]>::len));
        out.extend_from_slice(self.path.as_bytes());
        if let Some(query) = self.query {
            out.push(b'?');
            out.extend_from_slice(query);
        }
        out
    }
}

/// Makes the raw request target canonical (see the module doc).
pub fn canonical_target(
    raw: &[u8],
    slashes: EscapedSlashes,
) -> Result<CanonicalTarget<'_>, TargetError> {
    let (authority, path_and_query) = split_absolute_form(raw)?;
    let (path, query) = match path_and_query.iter().position(|&b| b == b'?') {
        Some(q) => (&path_and_query[..q], Some(&path_and_query[q + 1..])),
        None => (path_and_query, None),
    };
    // Fragments are never part of a request target.
    let query = query.map(|q| q.split(|&b| b == b'#').next().unwrap_or_default());
    let path = if path.is_empty() && authority.is_some() {
        Cow::Borrowed("/")
    } else {
        canonical_path(path, slashes)?
    };
    Ok(CanonicalTarget {
        path,
        query,
        authority,
    })
}

/// `http://authority/path` → (authority, `/path`); origin-form passes through.
fn split_absolute_form(raw: &[u8]) -> Result<(Option<&[u8]>, &[u8]), TargetError> {
    if raw.first() == Some(&b'/') {
        return Ok((None, raw));
    }
    let rest = strip_prefix_ignore_case(raw, b"http://")
        .or_else(|| strip_prefix_ignore_case(raw, b"https://"))
        .ok_or(TargetError::Form)?;
    let end = rest
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err(TargetError::Host);
    }
    // `path` may be empty or start with `?` (`http://host?q`): the caller
    // reads that as the root.
    Ok((Some(authority), path))
}

fn strip_prefix_ignore_case<'a>(raw: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (raw.len() >= prefix.len() && raw[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &raw[prefix.len()..])
}

/// Unreserved characters (RFC 3986 §2.3): decoded when escaped.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters a path segment may hold raw besides unreserved ones:
/// sub-delims, `:` and `@` (RFC 3986 §3.3).
fn is_raw_pchar(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

/// Whether `path` is already canonical and needs no copy: only raw pchars
/// and single slashes, no escapes, no dot segments.
fn is_plainly_canonical(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut previous = b'/';
    let mut segment_start = true;
    for (i, &b) in path.iter().enumerate().skip(1) {
        if b == b'/' {
            if previous == b'/' {
                return false;
            }
            segment_start = true;
        } else {
            if !is_raw_pchar(b) {
                return false;
            }
            if segment_start && b == b'.' {
                // `.` or `..` as a whole segment.
                let segment = path[i..].split(|&c| c == b'/').next().unwrap_or_default();
                if segment == b"." || segment == b".." {
                    return false;
                }
            }
            segment_start = false;
        }
        previous = b;
    }
    true
}

/// The canonical form of an origin-form path (see the module doc).
pub(crate) fn canonical_path(
    path: &[u8],
    slashes: EscapedSlashes,
) -> Result<Cow<'_, str>, TargetError> {
    if is_plainly_canonical(path) {
        // Only ASCII pchars and '/': valid UTF-8.
        return Ok(Cow::Borrowed(
            std::str::from_utf8(path).map_err(|_| TargetError::Form)?,
        ));
    }
    if path.first() != Some(&b'/') {
        return Err(TargetError::Form);
    }
    let decoded = decode(path, slashes)?;
    remove_dot_segments(&decoded).map(Cow::Owned)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn push_escaped(out: &mut String, b: u8) {
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

/// Step 1 and 2: escapes normalised, runs of `/` merged.
fn decode(path: &[u8], slashes: EscapedSlashes) -> Result<String, TargetError> {
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        match b {
            b'/' => {
                if !out.ends_with('/') {
                    out.push('/');
                }
            }
            b'%' => {
                let value = path
                    .get(i + 1..i + 3)
                    .and_then(|h| Some(hex_value(h[0])? << 4 | hex_value(h[1])?))
                    .ok_or(TargetError::MalformedEscape)?;
                i += 2;
                if is_unreserved(value) {
                    out.push(char::from(value));
                } else if is_control(value) {
                    return Err(TargetError::ControlByte);
                } else if matches!(value, b'/' | b'\\') && slashes == EscapedSlashes::Reject {
                    return Err(TargetError::EscapedSlash);
                } else {
                    push_escaped(&mut out, value);
                }
            }
            b'\\' => return Err(TargetError::Backslash),
            _ if is_control(b) => return Err(TargetError::ControlByte),
            _ if is_raw_pchar(b) => out.push(char::from(b)),
            _ => push_escaped(&mut out, b),
        }
        i += 1;
    }
    Ok(out)
}

/// Step 3, on a path that starts with `/` and has no `//`.
fn remove_dot_segments(path: &str) -> Result<String, TargetError> {
    let mut kept: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in path[1..].split('/') {
        trailing_slash = false;
        match segment {
            "." => trailing_slash = true,
            ".." => {
                kept.pop().ok_or(TargetError::AboveRoot)?;
                trailing_slash = true;
            }
            _ => kept.push(segment),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() || (trailing_slash && !out.ends_with('/')) {
        out.push('/');
    }
    Ok(out)
}

fn check_port(port: Option<&str>) -> Result<(), TargetError> {
    match port {
        Some(p) if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) => {
            Err(TargetError::Host)
        }
        _ => Ok(()),
    }
}

/// The canonical host of a Host header value or an authority: lower-case,
/// without port and without one trailing dot. `Ok(None)` for an empty value.
pub fn canonical_host(value: &[u8]) -> Result<Option<Cow<'_, str>>, TargetError> {
    if value.is_empty() {
        return Ok(None);
    }
    if value[0] == b'[' {
        let rest = std::str::from_utf8(&value[1..]).map_err(|_| TargetError::Host)?;
        return ipv6_literal(rest).map(|host| Some(Cow::Owned(host)));
    }
    // One pass: where the port starts, whether every byte may be in a
    // name, whether a dot follows a dot, whether anything is upper-case.
    let (mut colon, mut upper, mut double_dot, mut valid) = (None, false, false, true);
    for (i, &b) in value.iter().enumerate() {
        match b {
            b':' => {
                valid &= colon.is_none();
                colon = Some(i);
            }
            b'.' => double_dot |= i > 0 && value[i - 1] == b'.' && colon.is_none(),
            b'A'..=b'Z' => upper = true,
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => {}
            _ => valid = false,
        }
    }
    let (host, port) = match colon {
        Some(i) => (&value[..i], Some(&value[i + 1..])),
        None => (value, None),
    };
    if let Some(port) = port {
        if port.is_empty() || port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
            return Err(TargetError::Host);
        }
    }
    let host = host.strip_suffix(b".").unwrap_or(host);
    if !valid
        || double_dot
        || host.is_empty()
        || host.first() == Some(&b'.')
        || host.last() == Some(&b'.')
    {
        return Err(TargetError::Host);
    }
    // Only ASCII letters, digits and `-._` remain: valid UTF-8.
    let host = std::str::from_utf8(host).map_err(|_| TargetError::Host)?;
    Ok(Some(if upper {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }))
}

/// `::1]` or `::1]:8080` (after the `[`) → `[::1]`.
fn ipv6_literal(rest: &str) -> Result<String, TargetError> {
    let (inside, after) = rest.split_once(']').ok_or(TargetError::Host)?;
    let address_byte = |b: u8| b.is_ascii_hexdigit() || b == b':' || b == b'.';
    if inside.is_empty() || !inside.bytes().all(address_byte) {
        return Err(TargetError::Host);
    }
    let port = match after {
        "" => None,
        _ => Some(after.strip_prefix(':').ok_or(TargetError::Host)?),
    };
    check_port(port)?;
    Ok(format!("[{}]", inside.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(path: &str) -> Result<String, TargetError> {
        canonical_path(path.as_bytes(), EscapedSlashes::Reject).map(Cow::into_owned)
    }

    #[test]
    fn spellings_of_one_path_are_one_path() {
        for spelling in [
            "/api/sms/a",
            "//api/sms/a",
            "/api//sms/a",
            "/api/./sms/a",
            "/api/x/../sms/a",
            "/api/%73ms/a",
            "/%61pi/sms/a",
            "/%61%70%69/sms/%61",
            "/api/sms/./a",
            "/api/sms/b/../a",
            "/api/%2e/sms/a",
            "/api/x/%2E%2e/sms/a",
            "///api///sms///a",
        ] {
            assert_eq!(canon(spelling).as_deref(), Ok("/api/sms/a"), "{spelling}");
        }
    }

    #[test]
    fn trailing_slashes_and_root() {
        assert_eq!(canon("/").as_deref(), Ok("/"));
        assert_eq!(canon("//").as_deref(), Ok("/"));
        assert_eq!(canon("/.").as_deref(), Ok("/"));
        assert_eq!(canon("/a/..").as_deref(), Ok("/"));
        assert_eq!(canon("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(canon("/a/b/.").as_deref(), Ok("/a/b/"));
        assert_eq!(canon("/a/").as_deref(), Ok("/a/"));
        assert_eq!(canon("/a/.b/..c/...").as_deref(), Ok("/a/.b/..c/..."));
    }

    #[test]
    fn other_escapes_stay_encoded_upper_case() {
        assert_eq!(canon("/a%20b").as_deref(), Ok("/a%20b"));
        assert_eq!(canon("/a%3fb%3F").as_deref(), Ok("/a%3Fb%3F"));
        assert_eq!(canon("/%25").as_deref(), Ok("/%25"));
        assert_eq!(canon("/caf\u{e9}").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(canon("/a\"b{c}").as_deref(), Ok("/a%22b%7Bc%7D"));
        assert_eq!(
            canon("/a:b@c!$&'()*+,;=").as_deref(),
            Ok("/a:b@c!$&'()*+,;=")
        );
    }

    #[test]
    fn what_cannot_be_made_canonical_is_refused() {
        assert_eq!(canon("/a%00b"), Err(TargetError::ControlByte));
        assert_eq!(canon("/a%0d%0Ab"), Err(TargetError::ControlByte));
        assert_eq!(canon("/a%7f"), Err(TargetError::ControlByte));
        assert_eq!(canon("/a%"), Err(TargetError::MalformedEscape));
        assert_eq!(canon("/a%2"), Err(TargetError::MalformedEscape));
        assert_eq!(canon("/a%zz"), Err(TargetError::MalformedEscape));
        assert_eq!(canon("/a\\b"), Err(TargetError::Backslash));
        assert_eq!(canon("/.."), Err(TargetError::AboveRoot));
        assert_eq!(canon("/a/../.."), Err(TargetError::AboveRoot));
        assert_eq!(canon("/%2e%2e/x"), Err(TargetError::AboveRoot));
        assert_eq!(canon("/a%2Fb"), Err(TargetError::EscapedSlash));
        assert_eq!(canon("/a%5cb"), Err(TargetError::EscapedSlash));
        assert_eq!(canon("a/b"), Err(TargetError::Form));
        assert_eq!(canon(""), Err(TargetError::Form));
    }

    #[test]
    fn escaped_slashes_kept_when_asked() {
        let keep =
            |p: &str| canonical_path(p.as_bytes(), EscapedSlashes::Keep).map(Cow::into_owned);
        assert_eq!(keep("/ids/a%2fb/x").as_deref(), Ok("/ids/a%2Fb/x"));
        assert_eq!(keep("/ids/a%5Cb").as_deref(), Ok("/ids/a%5Cb"));
        // A kept %2F is never a separator: `a%2F..` is one ordinary segment.
        assert_eq!(keep("/ids/a%2F../x").as_deref(), Ok("/ids/a%2F../x"));
        assert_eq!(keep("/ids/a%2F/../x").as_deref(), Ok("/ids/x"));
    }

    #[test]
    fn targets_split_into_path_query_and_authority() {
        let t = canonical_target(b"/a//b?x=1&y=%2F//", EscapedSlashes::Reject).unwrap();
        assert_eq!(t.path, "/a/b");
        assert_eq!(t.query, Some(&b"x=1&y=%2F//"[..]));
        assert_eq!(t.authority, None);
        assert_eq!(t.origin_form(), b"/a/b?x=1&y=%2F//");

        let t = canonical_target(
            b"HTTP://API.example.com:8080/s/./x?q",
            EscapedSlashes::Reject,
        )
        .unwrap();
        assert_eq!(t.path, "/s/x");
        assert_eq!(t.authority, Some(&b"API.example.com:8080"[..]));
        assert_eq!(t.origin_form(), b"/s/x?q");

        let t = canonical_target(b"http://h", EscapedSlashes::Reject).unwrap();
        assert_eq!(t.origin_form(), b"/");
        let t = canonical_target(b"http://h?q=1", EscapedSlashes::Reject).unwrap();
        assert_eq!(t.origin_form(), b"/?q=1");

        for bad in [&b"*"[..], b"ftp://h/x", b"http:///x", b"h/x"] {
            assert!(
                canonical_target(bad, EscapedSlashes::Reject).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn hosts() {
        let host = |v: &str| canonical_host(v.as_bytes()).map(|h| h.map(Cow::into_owned));
        for spelling in [
            "api.example.com",
            "API.Example.COM.",
            "api.example.com:8080",
            "Api.Example.Com.:443",
        ] {
            assert_eq!(
                host(spelling),
                Ok(Some("api.example.com".into())),
                "{spelling}"
            );
        }
        assert_eq!(host("[::1]:8080"), Ok(Some("[::1]".into())));
        assert_eq!(host("127.0.0.1:80"), Ok(Some("127.0.0.1".into())));
        assert_eq!(host(""), Ok(None));
        for bad in [
            "a b",
            "user@host",
            "host:",
            "host:x",
            "host:123456",
            ".",
            "a..b",
            "[::1",
            "h/x",
            "api.example.com..",
            "a:b:80",
            "::1",
            "API.EXAMPLE.COM.:",
        ] {
            assert_eq!(host(bad), Err(TargetError::Host), "{bad}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Any bytes a hostile client could put in a path.
        fn any_path() -> impl Strategy<Value = Vec<u8>> {
            prop::collection::vec(
                prop_oneof![
                    Just(b'/'),
                    Just(b'.'),
                    Just(b'%'),
                    Just(b'a'),
                    Just(b'2'),
                    Just(b'e'),
                    Just(b'F'),
                    any::<u8>()
                ],
                0..40,
            )
            .prop_map(|mut p| {
                p.insert(0, b'/');
                p
            })
        }

        /// A plain segment of unreserved characters and sub-delims.
        fn segment() -> impl Strategy<Value = String> {
            "[a-zA-Z0-9._~!$&'()*+,;=:@-]{1,6}"
                .prop_filter("not a dot segment", |s| s != "." && s != "..")
        }

        /// `segments` spelt one of the ways an RFC 3986 normaliser (or a
        /// framework merging slashes) reads as the same path.
        fn respell(segments: &[String], choices: &[u8]) -> String {
            let mut out = String::new();
            let mut choice = choices.iter().cycle();
            for segment in segments {
                out.push('/');
                match choice.next().copied().unwrap_or(0) % 5 {
                    1 => out.push('/'),
                    2 => out.push_str("./"),
                    3 => out.push_str("zz/../"),
                    _ => {}
                }
                for b in segment.bytes() {
                    let c = choice.next().copied().unwrap_or(0);
                    if is_unreserved(b) && c % 3 == 0 {
                        if c % 2 == 0 {
                            out.push_str(&format!("%{b:02x}"));
                        } else {
                            out.push_str(&format!("%{b:02X}"));
                        }
                    } else {
                        out.push(char::from(b));
                    }
                }
            }
            if out.is_empty() {
                out.push('/');
            }
            out
        }

        proptest! {
            #[test]
            fn idempotent_and_free_of_dot_segments(raw in any_path(), keep in any::<bool>()) {
                let slashes = if keep { EscapedSlashes::Keep } else { EscapedSlashes::Reject };
                if let Ok(once) = canonical_path(&raw, slashes) {
                    let twice = canonical_path(once.as_bytes(), slashes).expect("canonical is accepted");
                    prop_assert_eq!(&once, &twice);
                    prop_assert!(once.starts_with('/'));
                    prop_assert!(!once.contains("//"), "{once}");
                    prop_assert!(!once.contains("/./"), "{once}");
                    prop_assert!(!once.contains("/../"), "{once}");
                    prop_assert!(!once.ends_with("/.") && !once.ends_with("/.."), "{once}");
                    prop_assert!(once.bytes().all(|b| b.is_ascii() && !is_control(b) && b != b'\\'));
                }
            }

            #[test]
            fn equal_spellings_one_result(
                segments in prop::collection::vec(segment(), 0..6),
                a in prop::collection::vec(any::<u8>(), 1..64),
                b in prop::collection::vec(any::<u8>(), 1..64),
            ) {
                let first = respell(&segments, &a);
                let second = respell(&segments, &b);
                let one = canonical_path(first.as_bytes(), EscapedSlashes::Reject);
                let other = canonical_path(second.as_bytes(), EscapedSlashes::Reject);
                prop_assert!(one.is_ok(), "{first}: {one:?}");
                prop_assert_eq!(one, other, "{} vs {}", first, second);
            }
        }
    }
}
