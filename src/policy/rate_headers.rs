//! The rate-limit response headers: legacy `X-RateLimit-*` and the IETF
//! draft `RateLimit-Policy` / `RateLimit` (docs/configuration.md,
//! "Responses").
//!
//! Legacy headers describe the most restrictive limit (least remaining);
//! draft headers list every enforced limit, most restrictive first. Values
//! are built straight from numbers and limit names (`[a-z0-9_-]+`), so they
//! are always valid header values and valid structured fields.

use crate::config::{Algorithm, HeaderStyle, LimitConfig};
use crate::limiter::Decision;
use http::HeaderValue;
use std::time::Duration;

/// Whole seconds, rounded up: what `Retry-After` and the reset fields carry.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_micros().div_ceil(1_000_000) as u64
}

/// The headers of `style` for `entries`: each enforced limit with the number
/// that applied to the request (its plan's or override's, else its own) and
/// its decision, most restrictive first. Empty when there is no entry.
pub(crate) fn rate_headers<'a>(
    style: HeaderStyle,
    entries: impl Iterator<Item = (&'a LimitConfig, u64, &'a Decision)> + Clone,
) -> Vec<(&'static str, HeaderValue)> {
    let mut headers = Vec::new();
    let Some((_, limit, most)) = entries.clone().next() else {
        return headers;
    };
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        headers.push(("x-ratelimit-limit", HeaderValue::from(limit)));
        headers.push(("x-ratelimit-remaining", HeaderValue::from(most.remaining)));
        headers.push((
            "x-ratelimit-reset",
            HeaderValue::from(ceil_secs(most.reset)),
        ));
    }
    if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
        let (policy, state) = draft(entries);
        // Names are [a-z0-9_-]+ and the rest digits: always a valid value.
        for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
            if let Ok(value) = HeaderValue::try_from(value) {
                headers.push((name, value));
            }
        }
    }
    headers
}

/// The draft headers' values: `"name";q=..;w=..` and `"name";r=..;t=..`.
fn draft<'a>(
    entries: impl Iterator<Item = (&'a LimitConfig, u64, &'a Decision)>,
) -> (String, String) {
    use std::fmt::Write as _;
    let mut policy = String::new();
    let mut state = String::new();
    for (n, (c, limit, d)) in entries.enumerate() {
        if n > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        let _ = write!(policy, "\"{}\";q={limit}", c.name);
        if !matches!(c.algorithm, Algorithm::Concurrency { .. }) {
            let _ = write!(policy, ";w={}", ceil_secs(c.window).max(1));
        }
        let t = if d.allowed {
            d.reset
        } else {
            d.retry_after.max(d.reset)
        };
        let _ = write!(state, "\"{}\";r={};t={}", c.name, d.remaining, ceil_secs(t));
    }
    (policy, state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeyPart, OnMissing};

    fn limit(name: &str, limit: u64, secs: u64, algorithm: Algorithm) -> LimitConfig {
        LimitConfig {
            name: name.into(),
            key: vec![KeyPart::Ip],
            credential_parts: vec![false],
            limit,
            window: Duration::from_secs(secs),
            algorithm,
            on_missing: OnMissing::Ip,
            cost: 1,
            shadow: false,
            share: None,
            exempt: Default::default(),
            limit_from: None,
            plans: Vec::new(),
            overrides: Vec::new(),
            block_for: Duration::ZERO,
            count_when: None,
            cost_from: None,
            reserve: None,
            calendar: None,
            max_delay: Duration::ZERO,
            max_waiting: 1,
        }
    }

    fn decision(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> Decision {
        Decision {
            allowed,
            remaining,
            reset: Duration::from_millis(reset_ms),
            retry_after: Duration::from_millis(retry_ms),
            taken_us: 0,
        }
    }

    fn value<'h>(headers: &'h [(&'static str, HeaderValue)], name: &str) -> Option<&'h str> {
        headers
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.to_str().ok())
    }

    #[test]
    fn legacy_headers_describe_the_most_restrictive_limit() {
        let (a, b) = (
            limit("per-user", 5, 10, Algorithm::SlidingLog),
            limit("per-ip", 100, 60, Algorithm::SlidingLog),
        );
        let (da, db) = (decision(true, 0, 6_500, 0), decision(true, 40, 60_000, 0));
        let entries = [(&a, a.limit, &da), (&b, b.limit, &db)];
        let headers = rate_headers(HeaderStyle::Legacy, entries.iter().copied());
        assert_eq!(value(&headers, "x-ratelimit-limit"), Some("5"));
        assert_eq!(value(&headers, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(value(&headers, "x-ratelimit-reset"), Some("7"));
        assert_eq!(value(&headers, "ratelimit"), None);
        assert!(rate_headers(HeaderStyle::None, entries.iter().copied()).is_empty());
        assert!(rate_headers(HeaderStyle::Both, std::iter::empty()).is_empty());
    }

    #[test]
    fn draft_headers_are_structured_field_lists() {
        let lease = Duration::from_secs(30);
        let (a, b) = (
            limit("per-user", 5, 10, Algorithm::SlidingLog),
            limit("in-flight", 2, 1, Algorithm::Concurrency { lease }),
        );
        // Denied by per-user: t is the retry time, not the reset.
        let (da, db) = (decision(false, 0, 2_000, 7_200), decision(true, 1, 0, 0));
        let entries = [(&a, a.limit, &da), (&b, b.limit, &db)];
        let headers = rate_headers(HeaderStyle::Draft, entries.iter().copied());
        assert_eq!(value(&headers, "x-ratelimit-limit"), None);
        let policy = value(&headers, "ratelimit-policy").expect("policy");
        let state = value(&headers, "ratelimit").expect("state");
        assert_eq!(policy, r#""per-user";q=5;w=10, "in-flight";q=2"#);
        assert_eq!(state, r#""per-user";r=0;t=8, "in-flight";r=1;t=0"#);
        for text in [policy, state] {
            let list = sfv::Parser::new(text).parse::<sfv::List>();
            assert!(list.is_ok_and(|l| l.len() == 2), "{text}");
        }
    }

    #[test]
    fn reset_rounds_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_micros(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_001)), 2);
    }
}
