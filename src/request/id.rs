//! Request IDs: the value that ties a client's report, the access log and
//! the upstream's logs to one request.
//!
//! An ID sent by a trusted proxy (`client_ip.trusted_proxies`) is kept when
//! it is a plausible ID; any other request gets a new UUID v7 (time-ordered,
//! so IDs sort by arrival). A client outside the trusted proxies cannot
//! choose its request's ID, so it cannot make its requests look like
//! another's in the logs.

use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;

/// The longest ID taken from a trusted proxy, in bytes.
pub const MAX_ID_BYTES: usize = 200;

/// The ID of `head`: the one value of `header` when `trusted` and it is
/// 1 to [`MAX_ID_BYTES`] visible ASCII characters, else a new UUID v7.
pub fn request_id(head: &RequestHeader, header: &HeaderName, trusted: bool) -> HeaderValue {
    if trusted {
        let mut values = head.headers.get_all(header).iter();
        if let (Some(value), None) = (values.next(), values.next()) {
            if plausible(value.as_bytes()) {
                return value.clone();
            }
        }
    }
    generate()
}

/// Whether `id` may be kept as an ID: not empty, not too long, printable
/// without spaces (what a log line or a header can carry unchanged).
fn plausible(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_BYTES && id.iter().all(|b| (0x21..0x7f).contains(b))
}

/// A new UUID v7, hyphenated, lower case.
pub(crate) fn generate() -> HeaderValue {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let id = uuid::Uuid::now_v7().hyphenated().encode_lower(&mut text);
    // A hyphenated UUID is ASCII hex and hyphens: always a header value.
    HeaderValue::from_str(id).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(values: &[&str]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/", None).expect("head");
        for value in values {
            req.append_header("x-request-id", *value).expect("header");
        }
        req
    }

    #[test]
    fn only_a_trusted_proxy_chooses_the_id() {
        let name = HeaderName::from_static("x-request-id");
        assert_eq!(request_id(&head(&["abc-123"]), &name, true), "abc-123");
        let untrusted = request_id(&head(&["abc-123"]), &name, false);
        assert_ne!(untrusted, "abc-123");
        assert_eq!(untrusted.len(), 36);
    }

    #[test]
    fn implausible_ids_are_replaced() {
        let name = HeaderName::from_static("x-request-id");
        let long = "a".repeat(MAX_ID_BYTES + 1);
        for values in [&[""][..], &["a b"], &[long.as_str()], &["a", "b"], &[]] {
            let id = request_id(&head(values), &name, true);
            assert_eq!(id.len(), 36, "{values:?}");
        }
    }

    #[test]
    fn generated_ids_differ_and_sort_by_time() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert_eq!(&a.as_bytes()[14..15], b"7", "version 7");
    }
}
