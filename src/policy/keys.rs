//! The counter key of one limit for one request (docs/architecture.md,
//! "Keys"): the route's and limit's names and the key parts' values, each
//! value kept as it is only when short and safe, else hashed.
//!
//! Every function is total: any byte sequence a client can send produces a
//! bounded, Redis-safe key, and distinct part lists give distinct keys.

use crate::config::KeyPart;
use crate::request::parts::{part_value, PartValue, RequestParts};
use sha2::{Digest, Sha256};

/// A key-part value longer than this is replaced by its hash.
pub(crate) const MAX_RAW_PART: usize = 64;

/// Length of the hex SHA-256 prefix that replaces an unsafe value (128 bits).
const HASH_HEX_LEN: usize = 32;

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
pub(crate) fn push_part(out: &mut String, value: &[u8]) {
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

/// A key part the request carries twice with different values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the request carries `{0}` twice with different values")]
pub struct AmbiguousPart(pub String);

/// The counter key of one limit for one request:
/// `prefix + "{" + route + ":" + limit + ":" + parts + "}"`.
///
/// Returns `Ok(None)` when a part is missing and `substitute_ip` is false (the
/// limit is skipped), and an error when a part is ambiguous (see
/// [`PartValue::Ambiguous`]). A missing part with `substitute_ip` becomes `ip=<client ip>`,
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
) -> Result<Option<String>, AmbiguousPart> {
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
        match part_value(part, request) {
            PartValue::One(value) if !value.is_empty() => push_part(&mut key, &value),
            PartValue::Ambiguous => return Err(AmbiguousPart(part.label())),
            _ if substitute_ip => {
                key.push_str("ip=");
                key.push_str(request.ip);
            }
            _ => return Ok(None),
        }
    }
    key.push('}');
    Ok(Some(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_for(header_value: Option<&'static [u8]>, substitute: bool) -> Option<String> {
        let header = move |_: &str| header_value;
        let parts = RequestParts {
            ip: "1.2.3.4",
            user: None,
            method: "GET",
            path: b"/x",
            header: &header,
            query: b"",
            cookie: &|_| PartValue::Missing,
            param: &|_| None,
            client_cert: None,
        };
        build_key(
            "sluice:",
            "r",
            "l",
            &[KeyPart::Header("k".into()), KeyPart::Method],
            &parts,
            substitute,
        )
        .unwrap()
    }

    #[test]
    fn an_ambiguous_part_makes_no_key() {
        let parts = RequestParts {
            ip: "1.2.3.4",
            user: None,
            method: "GET",
            path: b"/x",
            header: &|_| None,
            query: b"k=a&k=b",
            cookie: &|_| PartValue::Missing,
            param: &|_| Some("42"),
            client_cert: None,
        };
        let key = |part: KeyPart| build_key("s:", "r", "l", &[part], &parts, true);
        assert_eq!(
            key(KeyPart::Query("k".into())),
            Err(AmbiguousPart("query.k".into()))
        );
        assert_eq!(
            key(KeyPart::Param("id".into())),
            Ok(Some("s:{r:l:42}".into()))
        );
        assert_eq!(
            key(KeyPart::Cookie("c".into())),
            Ok(Some("s:{r:l:ip=1.2.3.4}".into()))
        );
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
