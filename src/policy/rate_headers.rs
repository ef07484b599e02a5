//! The rate-limit response headers: legacy `X-RateLimit-*`, the IETF
//! draft `RateLimit-Policy` / `RateLimit`, and OpenAI's
//! (docs/configuration.md, "Responses").
//!
//! Legacy headers describe the most restrictive limit (least remaining);
//! draft headers list every enforced limit, most restrictive first;
//! OpenAI's describe the most restrictive limit that counts requests and
//! the most restrictive one that reserves (tokens). Values
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
    if style == HeaderStyle::Openai {
        return openai(entries);
    }
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

/// OpenAI's headers: `x-ratelimit-{limit,remaining,reset}-requests` for the
/// first of `entries` that counts requests (no `reserve`, no `cost_from`),
/// the same `-tokens` for the first that reserves, each reset as a Go
/// duration; and on a denial `retry-after-ms`, the longest wait of the
/// limits that deny.
fn openai<'a>(
    entries: impl Iterator<Item = (&'a LimitConfig, u64, &'a Decision)> + Clone,
) -> Vec<(&'static str, HeaderValue)> {
    let mut headers = Vec::with_capacity(7);
    let counts_requests = |c: &LimitConfig| c.reserve.is_none() && c.cost_from.is_none();
    let kinds: [(_, [&'static str; 3]); 2] = [
        (
            entries.clone().find(|(c, _, _)| counts_requests(c)),
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
        ),
        (
            entries.clone().find(|(c, _, _)| c.reserve.is_some()),
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
        ),
    ];
    for (entry, [limit_name, remaining_name, reset_name]) in kinds {
        let Some((_, limit, d)) = entry else {
            continue;
        };
        let reset = if d.allowed {
            d.reset
        } else {
            d.retry_after.max(d.reset)
        };
        headers.push((limit_name, HeaderValue::from(limit)));
        headers.push((remaining_name, HeaderValue::from(d.remaining)));
        if let Ok(value) = HeaderValue::try_from(go_duration(reset)) {
            headers.push((reset_name, value));
        }
    }
    let wait = entries
        .filter(|(_, _, d)| !d.allowed)
        .map(|(_, _, d)| d.retry_after)
        .max();
    if let Some(wait) = wait {
        let ms = wait.as_micros().div_ceil(1000) as u64;
        headers.push(("retry-after-ms", HeaderValue::from(ms)));
    }
    headers
}

/// `d` as Go writes a duration, to the millisecond (rounded up): `0s`,
/// `250ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = d.as_micros().div_ceil(1000) as u64;
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, minutes) = (ms / 3_600_000, ms / 60_000 % 60);
    let (seconds, fraction) = (ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h{minutes}m"));
    } else if minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&seconds.to_string());
    if fraction > 0 {
        let digits = format!("{fraction:03}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push('s');
    out
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

    #[test]
    fn go_durations_are_written_as_go_writes_them() {
        for (ms, want) in [
            (0, "0s"),
            (250, "250ms"),
            (999, "999ms"),
            (1_000, "1s"),
            (1_500, "1.5s"),
            (1_250, "1.25s"),
            (59_001, "59.001s"),
            (60_000, "1m0s"),
            (360_000, "6m0s"),
            (361_500, "6m1.5s"),
            (3_600_000, "1h0m0s"),
            (90_061_000, "25h1m1s"),
        ] {
            assert_eq!(go_duration(Duration::from_millis(ms)), want, "{ms} ms");
        }
        // Below a millisecond: rounded up, never written as 0s.
        assert_eq!(go_duration(Duration::from_micros(1)), "1ms");
    }

    #[test]
    fn openai_headers_describe_the_request_limit_and_the_reserving_one() {
        let requests = limit("rpm", 60, 60, Algorithm::SlidingLog);
        let mut tokens = limit("tpm", 10_000, 60, Algorithm::SlidingWindow { buckets: 60 });
        tokens.reserve = Some(crate::config::usage::Reserve {
            request_json: None,
            default: 0,
            max: u64::MAX,
            plus: 100,
            required: false,
        });
        let (r, t) = (
            decision(true, 59, 1_000, 0),
            decision(false, 40, 250, 360_000),
        );
        let entries = [(&tokens, 10_000, &t), (&requests, 60, &r)];
        let headers = rate_headers(HeaderStyle::Openai, entries.iter().copied());
        let got = |name| value(&headers, name);
        assert_eq!(got("x-ratelimit-limit-requests"), Some("60"));
        assert_eq!(got("x-ratelimit-remaining-requests"), Some("59"));
        assert_eq!(got("x-ratelimit-reset-requests"), Some("1s"));
        assert_eq!(got("x-ratelimit-limit-tokens"), Some("10000"));
        assert_eq!(got("x-ratelimit-remaining-tokens"), Some("40"));
        assert_eq!(got("x-ratelimit-reset-tokens"), Some("6m0s"));
        assert_eq!(got("retry-after-ms"), Some("360000"));
        assert_eq!(got("x-ratelimit-limit"), None, "no legacy headers");
        // Admitted: no retry-after-ms; a route without a reserving limit has
        // no -tokens headers.
        let headers = rate_headers(HeaderStyle::Openai, [(&requests, 60, &r)].into_iter());
        assert_eq!(value(&headers, "retry-after-ms"), None);
        assert_eq!(value(&headers, "x-ratelimit-limit-tokens"), None);
        assert_eq!(headers.len(), 3);
    }
}
