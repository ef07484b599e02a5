//! One entry of `routes[].limits`: key, number, window, algorithm and cost.

use super::super::checker::Checker;
use super::super::defaults::limit as defaults;
use super::super::file::{AlgorithmFile, KeyPartFile, LimitFile};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::template::PathTemplate;
use super::super::{format_duration, Algorithm, KeyPart, LimitConfig};
use super::server::check_between;
use std::time::Duration;

/// The most entries a `sliding_log` limit may keep per key.
const MAX_LOG: u64 = 1_000_000;
/// Above this, a `sliding_log` limit is worth a warning.
const LARGE_LOG: u64 = 10_000;
/// The longest window.
const MAX_WINDOW: Duration = Duration::from_secs(366 * 86_400);

/// `template` is the route's templated path, which `{param: NAME}` parts
/// must name a parameter of.
pub(super) fn limit(
    c: &mut Checker,
    path: &KeyPath,
    f: &LimitFile,
    template: Option<&PathTemplate>,
) -> LimitConfig {
    c.name(&path.key("name"), &f.name, "limit");
    let kind = f.algorithm.unwrap_or(AlgorithmFile::SlidingLog);
    for (key, present, owner) in [
        ("buckets", f.buckets.is_some(), AlgorithmFile::SlidingWindow),
        ("burst", f.burst.is_some(), AlgorithmFile::TokenBucket),
        ("lease", f.lease.is_some(), AlgorithmFile::Concurrency),
    ] {
        if present && kind != owner {
            let algorithm = owner.name();
            c.problem(&path.key(key), ProblemKind::OnlyFor { key, algorithm });
        }
    }
    let key = key_parts(c, path, &f.key, template);
    if f.limit == 0 {
        c.problem(&path.key("limit"), ProblemKind::ZeroLimit);
    }
    let window = window(c, path, f, kind);
    let cost = f.cost.unwrap_or(defaults::COST);
    let algorithm = algorithm(c, path, f, kind, window, cost);
    if cost == 0 {
        let kind = ProblemKind::AtLeast {
            key: "cost",
            min: "1",
        };
        c.problem(&path.key("cost"), kind);
    } else if cost > f.limit && f.limit > 0 && kind != AlgorithmFile::TokenBucket {
        let limit = f.limit;
        c.problem(
            &path.key("cost"),
            ProblemKind::CostOverLimit { cost, limit },
        );
    }
    if let Some(share) = &f.share {
        c.name(&path.key("share"), share, "share");
    }
    LimitConfig {
        name: f.name.clone(),
        key,
        limit: f.limit,
        window,
        algorithm,
        on_missing: f.on_missing.unwrap_or(defaults::ON_MISSING),
        cost,
        shadow: f.shadow,
        share: f.share.clone(),
        exempt: super::exempt::exempt(c, &path.key("exempt"), f.exempt.as_ref()),
    }
}

fn key_parts(
    c: &mut Checker,
    path: &KeyPath,
    parts: &[KeyPartFile],
    template: Option<&PathTemplate>,
) -> Vec<KeyPart> {
    if parts.is_empty() {
        let item = "part (ip, user, method, path, {header: NAME}, {query: NAME}, {cookie: NAME} or {param: NAME})";
        c.problem(&path.key("key"), ProblemKind::NeedsOne { key: "key", item });
    }
    let mut key = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        key.push(match part {
            KeyPartFile::Ip => KeyPart::Ip,
            KeyPartFile::User => KeyPart::User,
            KeyPartFile::Method => KeyPart::Method,
            KeyPartFile::Path => KeyPart::Path,
            KeyPartFile::Header(name) => {
                c.header_name(&path.key("key").index(i), name);
                KeyPart::Header(name.to_ascii_lowercase())
            }
            KeyPartFile::Query(name) => {
                let bad = name.is_empty()
                    || name
                        .chars()
                        .any(|ch| matches!(ch, '&' | '=' | '#' | '?') || ch.is_whitespace());
                if bad {
                    let kind = ProblemKind::BadQueryName(name.clone());
                    c.problem(&path.key("key").index(i), kind);
                }
                KeyPart::Query(name.clone())
            }
            KeyPartFile::Cookie(name) => {
                let token = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !token {
                    let kind = ProblemKind::BadCookieName(name.clone());
                    c.problem(&path.key("key").index(i), kind);
                }
                KeyPart::Cookie(name.clone())
            }
            KeyPartFile::Param(name) => {
                if !template.is_some_and(|t| t.has_param(name)) {
                    let kind = ProblemKind::UnknownParam {
                        name: name.clone(),
                        template: template.map(|t| t.as_str().to_string()),
                    };
                    c.problem(&path.key("key").index(i), kind);
                }
                KeyPart::Param(name.clone())
            }
        });
    }
    key
}

fn window(c: &mut Checker, path: &KeyPath, f: &LimitFile, kind: AlgorithmFile) -> Duration {
    let at = path.key("window");
    match (&f.window, kind == AlgorithmFile::Concurrency) {
        (Some(_), true) => {
            c.problem(&at, ProblemKind::ConcurrencyWindow);
            Duration::ZERO
        }
        (None, true) => Duration::ZERO,
        (None, false) => {
            c.problem(path, ProblemKind::NeedsWindow(f.name.clone()));
            Duration::from_secs(1)
        }
        (Some(text), false) => {
            let window = c.duration(&at, Some(text), Duration::from_secs(1));
            if window < Duration::from_millis(1) {
                let kind = ProblemKind::AtLeast {
                    key: "window",
                    min: "1ms",
                };
                c.problem(&at, kind);
            }
            if window > MAX_WINDOW {
                let kind = ProblemKind::AtMost {
                    key: "window",
                    max: "366d",
                };
                c.problem(&at, kind);
            }
            window
        }
    }
}

fn algorithm(
    c: &mut Checker,
    path: &KeyPath,
    f: &LimitFile,
    kind: AlgorithmFile,
    window: Duration,
    cost: u64,
) -> Algorithm {
    let limit = f.limit;
    match kind {
        AlgorithmFile::SlidingLog => {
            if limit > MAX_LOG {
                let kind = ProblemKind::LogTooLong {
                    limit,
                    max: MAX_LOG,
                };
                c.problem(&path.key("limit"), kind);
            } else if limit > LARGE_LOG {
                let counters = defaults::BUCKETS + 1;
                c.warning(&path.key("limit"), ProblemKind::LogLong { limit, counters });
            }
            Algorithm::SlidingLog
        }
        AlgorithmFile::SlidingWindow => {
            let buckets = f.buckets.unwrap_or(defaults::BUCKETS);
            let at = path.key("buckets");
            if !(1..=1000).contains(&buckets) {
                check_between(c, &at, buckets, (1, 1000));
            } else if !window.as_micros().is_multiple_of(u128::from(buckets)) {
                let window = format_duration(window);
                c.problem(&at, ProblemKind::BucketsDoNotDivide { window, buckets });
            }
            Algorithm::SlidingWindow { buckets }
        }
        AlgorithmFile::FixedWindow => Algorithm::FixedWindow,
        AlgorithmFile::TokenBucket => {
            let burst = f.burst.unwrap_or(limit);
            if burst == 0 {
                let kind = ProblemKind::AtLeast {
                    key: "burst",
                    min: "1",
                };
                c.problem(&path.key("burst"), kind);
            } else if cost > burst {
                c.problem(
                    &path.key("cost"),
                    ProblemKind::CostOverBurst { cost, burst },
                );
            }
            Algorithm::TokenBucket { burst }
        }
        AlgorithmFile::Concurrency => {
            let at = path.key("lease");
            let lease = c.duration(&at, f.lease.as_deref(), defaults::LEASE);
            if lease < Duration::from_millis(1) {
                let kind = ProblemKind::AtLeast {
                    key: "lease",
                    min: "1ms",
                };
                c.problem(&at, kind);
            }
            Algorithm::Concurrency { lease }
        }
    }
}
