//! W3C Trace Context: the `traceparent` header read and written.
//!
//! A `traceparent` is accepted only as the recommendation's grammar has it:
//! version `00` exactly 55 characters (a later version at least 55, its
//! extra fields after a `-`), lowercase hex, neither ID all zeros, version
//! never `ff`. Anything else (and two headers at once) starts a new trace,
//! and the `tracestate` that came with it is dropped, as the recommendation
//! asks.

use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;

/// The parent a request's `traceparent` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace the request belongs to.
    pub trace_id: u128,
    /// The caller's span.
    pub span_id: u64,
    /// The caller sampled it (flag `01`).
    pub sampled: bool,
}

/// The longest `tracestate` passed on; a longer one is dropped.
const MAX_TRACESTATE: usize = 512;

/// The request's parent and its `tracestate`, if its `traceparent` is valid.
pub fn incoming(head: &RequestHeader) -> Option<(Parent, Option<HeaderValue>)> {
    let mut values = head.headers.get_all(&TRACEPARENT).iter();
    let (first, second) = (values.next()?, values.next());
    if second.is_some() {
        return None;
    }
    let parent = parse_traceparent(first.as_bytes())?;
    let states: Vec<&[u8]> = head
        .headers
        .get_all(&TRACESTATE)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let joined = states.join(&b","[..]);
    let state = (!joined.is_empty() && joined.len() <= MAX_TRACESTATE)
        .then(|| HeaderValue::from_bytes(&joined).ok())
        .flatten();
    Some((parent, state))
}

/// A `traceparent` value read by the grammar above.
pub(crate) fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    if value.len() < 55 || (value.len() > 55 && value[55] != b'-') {
        return None;
    }
    let field = |range: std::ops::Range<usize>| -> Option<u128> {
        let text = std::str::from_utf8(value.get(range)?).ok()?;
        if !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return None;
        }
        u128::from_str_radix(text, 16).ok()
    };
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let version = field(0..2)?;
    if version == 0xff || (version == 0 && value.len() != 55) {
        return None;
    }
    let trace_id = field(3..35)?;
    let span_id = u64::try_from(field(36..52)?).ok()?;
    let flags = field(53..55)?;
    (trace_id != 0 && span_id != 0).then_some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// The `traceparent` header's name, parsed once (a lookup by a `&str`
/// parses the name on every request).
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// The `tracestate` header's name, parsed once.
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The `traceparent` of a request sent on by span `span_id` of `trace_id`.
/// Written by hand into a fixed buffer: `format!`'s padded hex costs every
/// request some 2,000 instructions more.
pub fn traceparent(trace_id: u128, span_id: u64, sampled: bool) -> HeaderValue {
    let mut text = *b"00-00000000000000000000000000000000-0000000000000000-00";
    write_hex(&mut text[3..35], &trace_id.to_be_bytes());
    write_hex(&mut text[36..52], &span_id.to_be_bytes());
    if sampled {
        text[54] = b'1';
    }
    // Hex digits and dashes are always a valid header value; the fallback
    // (an unsampled, all-zero context, which receivers ignore) is never used.
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| {
        HeaderValue::from_static("00-00000000000000000000000000000000-0000000000000000-00")
    })
}

/// Writes `bytes` as lowercase hex into `out` (twice their length).
pub(crate) fn write_hex(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn valid_headers_are_read() {
        let parent = parse_traceparent(VALID.as_bytes()).expect("valid");
        assert_eq!(parent.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(parent.span_id, 0x00f067aa0ba902b7);
        assert!(parent.sampled);
        let unsampled = VALID.replace("-01", "-00");
        assert!(!parse_traceparent(unsampled.as_bytes()).unwrap().sampled);
        // A later version may carry more fields.
        let later = VALID.replacen("00-", "01-", 1) + "-extra";
        assert!(parse_traceparent(later.as_bytes()).is_some());
        assert_eq!(traceparent(parent.trace_id, parent.span_id, true), VALID);
        assert_eq!(
            traceparent(1, u64::MAX, false),
            "00-00000000000000000000000000000001-ffffffffffffffff-00"
        );
    }

    #[test]
    fn hostile_spellings_start_a_new_trace() {
        let zeros_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let zeros_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        let upper = VALID.to_uppercase();
        let long_v0 = format!("{VALID}-extra");
        let later_glued = VALID.replacen("00-", "01-", 1) + "x";
        for bad in [
            "",
            "00",
            zeros_trace,
            zeros_span,
            &upper,
            &long_v0,
            &later_glued,
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn two_traceparents_or_a_huge_tracestate_are_not_passed_on() {
        let mut head = RequestHeader::build("GET", b"/", None).unwrap();
        head.append_header("traceparent", VALID).unwrap();
        head.append_header("tracestate", "a=1").unwrap();
        head.append_header("tracestate", "b=2").unwrap();
        let (_, state) = incoming(&head).expect("valid");
        assert_eq!(state.unwrap(), "a=1,b=2");
        head.insert_header("tracestate", "x".repeat(600)).unwrap();
        assert_eq!(incoming(&head).unwrap().1, None);
        head.append_header("traceparent", VALID).unwrap();
        assert!(incoming(&head).is_none());
    }
}
