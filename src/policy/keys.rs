//! The counter key of one limit for one request (docs/architecture.md,
//! "Keys"): the route's and limit's names and the key parts' values, each
//! value kept as it is only when short, safe and not a credential, else
//! hashed. A credential (see `IdentityConfig::reads_credential`) is always
//! hashed here, where every key is made: Redis, the top keys and every
//! admin answer read keys, never the values behind them.
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
    if is_safe(value) {
        // Safe bytes are ASCII, so this never fails.
        if let Ok(text) = std::str::from_utf8(value) {
            out.push_str(text);
            return;
        }
    }
    push_hashed(out, value);
}

/// Appends `value` to `out` as `#` + hex SHA-256 prefix, whatever it is.
pub(crate) fn push_hashed(out: &mut String, value: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
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
/// `prefix + "{" + route + ":" + limit + ":" + parts + "}"`. A part whose
/// `credential` flag is set (by index; one beyond its end is not) is
/// hashed whatever its value.
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
    credential: &[bool],
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
            PartValue::One(value) if !value.is_empty() => {
                if credential.get(i) == Some(&true) {
                    push_hashed(&mut key, &value);
                } else {
                    push_part(&mut key, &value);
                }
            }
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
            &[],
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
        let key = |part: KeyPart| build_key("s:", "r", "l", &[part], &[], &parts, true);
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
    fn a_credential_is_hashed_however_short_and_safe() {
        let parts = RequestParts {
            ip: "1.2.3.4",
            user: None,
            method: "GET",
            path: b"/x",
            header: &|_| Some(&b"sk_live_abc"[..]),
            query: b"",
            cookie: &|_| PartValue::Missing,
            param: &|_| None,
            client_cert: None,
        };
        let key = |credential: &[bool]| {
            let parts_read = [KeyPart::Header("x-api-key".into()), KeyPart::Method];
            build_key("s:", "r", "l", &parts_read, credential, &parts, false).unwrap()
        };
        assert_eq!(key(&[]).unwrap(), "s:{r:l:sk_live_abc|GET}");
        let hashed = key(&[true, false]).unwrap();
        assert!(!hashed.contains("sk_live"), "{hashed}");
        assert!(
            hashed.starts_with("s:{r:l:#") && hashed.ends_with("|GET}"),
            "{hashed}"
        );
        // The same hash an unsafe value gets: one spelling per value.
        let mut alone = String::new();
        push_hashed(&mut alone, b"sk_live_abc");
        assert!(hashed.contains(&alone), "{hashed} {alone}");
    }

    #[test]
    fn missing_part_substitutes_or_skips() {
        assert_eq!(key_for(None, true).unwrap(), "sluice:{r:l:ip=1.2.3.4|GET}");
        assert_eq!(key_for(Some(b""), false), None);
        assert_ne!(key_for(None, true), key_for(Some(b"1.2.3.4"), true));
    }
}
