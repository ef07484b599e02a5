//! One entry of `routes[].limits`: key, number, window, algorithm and cost.

use super::super::calendar::{Calendar, Period, PeriodBounds};
use super::super::checker::Checker;
use super::super::defaults::limit as defaults;
use super::super::file::{
    AlgorithmFile, KeyPartFile, LimitFile, OnLimitFile, OverrideFile, PeriodFile,
};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::template::PathTemplate;
use super::super::usage::CostFrom;
use super::super::{
    format_duration, Algorithm, KeyPart, LimitConfig, Override, PlanSource, StatusMatch,
};
use super::server::check_between;
use std::time::Duration;

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
    let key = key_parts(c, &path.key("key"), &f.key, template);
    let limit = written_limit(c, path, f);
    if limit == 0 {
        c.problem(&path.key("limit"), ProblemKind::ZeroLimit);
    }
    let calendar = calendar(c, path, f, kind);
    let window = match &calendar {
        Some(calendar) => calendar.period.nominal(),
        None => window(c, path, f, kind),
    };
    let cost = f.cost.unwrap_or(defaults::COST);
    let algorithm = match &calendar {
        Some(calendar) => Algorithm::Calendar {
            period: calendar.period,
            bounds: PeriodBounds::default(),
        },
        None => algorithm(c, path, f, kind, window, cost),
    };
    if cost == 0 {
        let kind = ProblemKind::AtLeast {
            key: "cost",
            min: "1",
        };
        c.problem(&path.key("cost"), kind);
    } else if cost > limit && limit > 0 && kind != AlgorithmFile::TokenBucket {
        c.problem(
            &path.key("cost"),
            ProblemKind::CostOverLimit { cost, limit },
        );
    }
    if let Some(share) = &f.share {
        c.name(&path.key("share"), share, "share");
    }
    let (limit_from, plans, overrides) = plans_and_overrides(c, path, f, &key, cost, kind);
    let block_for = block_for(c, path, f, kind);
    let (count_when, cost_from) = deferred(c, path, f, kind);
    let reserve = super::usage::reserve(c, path, f, kind);
    let (max_delay, max_waiting) = on_limit(c, path, f, kind);
    LimitConfig {
        name: f.name.clone(),
        credential_parts: Vec::new(),
        key,
        limit,
        window,
        algorithm,
        on_missing: f.on_missing.unwrap_or(defaults::ON_MISSING),
        cost,
        shadow: f.shadow,
        share: f.share.clone(),
        exempt: super::exempt::exempt(c, &path.key("exempt"), f.exempt.as_ref()),
        limit_from,
        plans,
        overrides,
        block_for,
        count_when,
        cost_from,
        reserve,
        calendar,
        max_delay,
        max_waiting,
    }
}

/// The longest `max_delay`: a request holds its connection while it waits.
const MAX_DELAY: Duration = Duration::from_secs(60);

/// `on_limit`, `max_delay` and `max_waiting`: whether a request over the
/// limit waits for its turn, how long at most, and how many of one key may.
fn on_limit(
    c: &mut Checker,
    path: &KeyPath,
    f: &LimitFile,
    kind: AlgorithmFile,
) -> (Duration, usize) {
    let delays = f.on_limit == Some(OnLimitFile::Delay);
    if !delays {
        for (key, present) in [
            ("max_delay", f.max_delay.is_some()),
            ("max_waiting", f.max_waiting.is_some()),
        ] {
            if present {
                c.problem(&path.key(key), ProblemKind::OnlyWithDelay(key));
            }
        }
        return (Duration::ZERO, defaults::MAX_WAITING);
    }
    let at = path.key("on_limit");
    let why = if f.calendar.is_some() {
        Some("a calendar quota (its units free at the period's end)")
    } else if !matches!(kind, AlgorithmFile::SlidingLog | AlgorithmFile::TokenBucket) {
        Some("this algorithm: only sliding_log and token_bucket reserve a unit's time")
    } else if f.shadow {
        Some("a shadow limit (it never denies)")
    } else if f.count_when.is_some() || f.cost_from.is_some() || f.reserve.is_some() {
        Some("a limit counted by its response (`count_when`, `cost_from`, `reserve`)")
    } else if f.share.is_some() {
        Some("a shared counter")
    } else {
        None
    };
    if let Some(why) = why {
        c.problem(&at, ProblemKind::CannotDelay(why));
    }
    let delay_at = path.key("max_delay");
    let max_delay = c.duration(&delay_at, f.max_delay.as_deref(), defaults::MAX_DELAY);
    if max_delay < Duration::from_millis(1) {
        let kind = ProblemKind::AtLeast {
            key: "max_delay",
            min: "1ms",
        };
        c.problem(&delay_at, kind);
    } else if max_delay > MAX_DELAY {
        let kind = ProblemKind::AtMost {
            key: "max_delay",
            max: "60s",
        };
        c.problem(&delay_at, kind);
    }
    let max_waiting = f.max_waiting.unwrap_or(defaults::MAX_WAITING);
    if max_waiting == 0 {
        let kind = ProblemKind::AtLeast {
            key: "max_waiting",
            min: "1",
        };
        c.problem(&path.key("max_waiting"), kind);
    }
    (max_delay, max_waiting)
}

/// `calendar` and `timezone`: a quota counted per civil period. The
/// algorithm is then a counter per period, and there is no `window`.
fn calendar(
    c: &mut Checker,
    path: &KeyPath,
    f: &LimitFile,
    kind: AlgorithmFile,
) -> Option<Calendar> {
    let Some(period) = f.calendar else {
        if f.timezone.is_some() {
            c.problem(&path.key("timezone"), ProblemKind::TimezoneWithoutCalendar);
        }
        return None;
    };
    if f.window.is_some() {
        c.problem(&path.key("window"), ProblemKind::CalendarWindow);
    }
    if f.algorithm.is_some() && kind != AlgorithmFile::FixedWindow {
        c.problem(
            &path.key("algorithm"),
            ProblemKind::CalendarAlgorithm(kind.name()),
        );
    }
    let period = match period {
        PeriodFile::Day => Period::Day,
        PeriodFile::Week => Period::Week,
        PeriodFile::Month => Period::Month,
    };
    let zone = f.timezone.as_deref().unwrap_or("UTC");
    match Calendar::new(period, zone) {
        Ok(calendar) => Some(calendar),
        Err(_) => {
            let kind = ProblemKind::UnknownTimeZone(zone.to_string());
            c.problem(&path.key("timezone"), kind);
            Calendar::new(period, "UTC").ok()
        }
    }
}

/// `count_when` and `cost_from`: what the response makes the limit count.
fn deferred(
    c: &mut Checker,
    path: &KeyPath,
    f: &LimitFile,
    kind: AlgorithmFile,
) -> (Option<Vec<StatusMatch>>, Option<CostFrom>) {
    let count_when = f.count_when.as_ref().map(|when| {
        let at = path.key("count_when").key("status");
        if when.status.is_empty() {
            let item = "status (401, \"5xx\")";
            c.problem(
                &at,
                ProblemKind::NeedsOne {
                    key: "status",
                    item,
                },
            );
        }
        let mut statuses = Vec::new();
        for (i, value) in when.status.iter().enumerate() {
            let text = match value {
                serde_yaml::Value::Number(n) => n.to_string(),
                serde_yaml::Value::String(s) => s.clone(),
                other => format!("{other:?}"),
            };
            let class = text
                .strip_suffix("xx")
                .or_else(|| text.strip_suffix("XX"))
                .and_then(|d| d.parse::<u16>().ok())
                .filter(|d| (1..=5).contains(d));
            match (class, text.parse::<u16>()) {
                (Some(d), _) => statuses.push(StatusMatch::Class(d)),
                (None, Ok(s)) if (100..=599).contains(&s) => statuses.push(StatusMatch::Exact(s)),
                _ => c.problem(&at.index(i), ProblemKind::BadStatusMatch(text)),
            }
        }
        statuses
    });
    let cost_from = super::usage::cost_from(c, path, f);
    for (key, present) in [
        ("count_when", count_when.is_some()),
        ("cost_from", f.cost_from.is_some() && f.reserve.is_none()),
    ] {
        if !present {
            continue;
        }
        let why = if kind == AlgorithmFile::Concurrency {
            Some("a `concurrency` limit (it counts requests in flight)")
        } else if f.shadow {
            Some("a shadow limit")
        } else if f.share.is_some() {
            Some("a shared counter (its other limits count at admission)")
        } else {
            None
        };
        if let Some(why) = why {
            c.problem(&path.key(key), ProblemKind::NotDeferrable { key, why });
        }
    }
    (count_when, cost_from)
}

/// `block_for`: 1ms … 366d, on an enforced limit whose denials end in time.
fn block_for(c: &mut Checker, path: &KeyPath, f: &LimitFile, kind: AlgorithmFile) -> Duration {
    let Some(text) = &f.block_for else {
        return Duration::ZERO;
    };
    let at = path.key("block_for");
    let block = c.duration(&at, Some(text), Duration::ZERO);
    if block < Duration::from_millis(1) {
        let kind = ProblemKind::AtLeast {
            key: "block_for",
            min: "1ms",
        };
        c.problem(&at, kind);
    } else if block > MAX_WINDOW {
        let kind = ProblemKind::AtMost {
            key: "block_for",
            max: "366d",
        };
        c.problem(&at, kind);
    }
    if f.shadow {
        c.problem(
            &at,
            ProblemKind::BlockForNever("a shadow limit never denies"),
        );
    }
    if kind == AlgorithmFile::Concurrency {
        let why = "a concurrency denial ends when a request does, not in time";
        c.problem(&at, ProblemKind::BlockForNever(why));
    }
    block
}

/// `limit_from`, `plans` and `overrides`: the limit a request gets, by its
/// plan or its key values. Every number is checked as `limit` is.
fn plans_and_overrides(
    c: &mut Checker,
    path: &KeyPath,
    f: &LimitFile,
    key: &[KeyPart],
    cost: u64,
    kind: AlgorithmFile,
) -> (Option<PlanSource>, Vec<(String, u64)>, Vec<Override>) {
    let check_number = |c: &mut Checker, at: &KeyPath, n: u64| {
        if n == 0 {
            c.problem(at, ProblemKind::ZeroLimit);
        } else if cost > n && kind != AlgorithmFile::TokenBucket {
            c.problem(at, ProblemKind::CostOverLimit { cost, limit: n });
        }
    };
    let limit_from = limit_from(c, path, f);
    let mut plans = Vec::new();
    for (name, &n) in f.plans.iter().flatten() {
        check_number(c, &path.key("plans").key(name), n);
        plans.push((name.clone(), n));
    }
    match (f.limit_from.is_some(), f.plans.is_some()) {
        (true, false) => c.problem(
            &path.key("limit_from"),
            ProblemKind::Needs("limit_from", "plans"),
        ),
        (false, true) => c.problem(
            &path.key("plans"),
            ProblemKind::Needs("plans", "limit_from"),
        ),
        _ => {}
    }
    let overrides = f
        .overrides
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, o)| {
            let at = path.key("overrides").index(i);
            let limit = override_limit(c, &at, o, &plans, &check_number);
            let parts = override_parts(c, &at, o, key);
            Override { parts, limit }
        })
        .collect();
    (limit_from, plans, overrides)
}

/// `limit_from`: where a request's plan comes from (a claim or a header,
/// exactly one).
fn limit_from(c: &mut Checker, path: &KeyPath, f: &LimitFile) -> Option<PlanSource> {
    let from = f.limit_from.as_ref()?;
    let at = path.key("limit_from");
    let kind = ProblemKind::OneOf {
        owner: "`limit_from`",
        keys: "claim, header or consumer",
    };
    match (&from.claim, &from.header, &from.consumer) {
        (Some(claim), None, None) if !claim.is_empty() => Some(PlanSource::Claim(claim.clone())),
        (None, Some(header), None) => {
            c.header_name(&at.key("header"), header);
            Some(PlanSource::Header(header.to_ascii_lowercase()))
        }
        (None, None, Some(field)) if field == "plan" => Some(PlanSource::ConsumerPlan),
        (None, None, Some(field)) => {
            c.problem(
                &at.key("consumer"),
                ProblemKind::BadConsumerField(field.clone()),
            );
            None
        }
        _ => {
            c.problem(&at, kind);
            None
        }
    }
}

/// An override's limit: its own number, or its plan's.
fn override_limit(
    c: &mut Checker,
    at: &KeyPath,
    o: &OverrideFile,
    plans: &[(String, u64)],
    check_number: &dyn Fn(&mut Checker, &KeyPath, u64),
) -> u64 {
    match (o.limit, &o.plan) {
        (Some(n), None) => {
            check_number(c, &at.key("limit"), n);
            n
        }
        (None, Some(plan)) => match plans.iter().find(|(name, _)| name == plan) {
            Some((_, n)) => *n,
            None => {
                let known = plans.iter().map(|(name, _)| name.clone()).collect();
                let kind = ProblemKind::UnknownPlan {
                    name: plan.clone(),
                    known,
                };
                c.problem(&at.key("plan"), kind);
                1
            }
        },
        _ => {
            c.problem(at, ProblemKind::OverrideLimitOrPlan);
            1
        }
    }
}

/// An override's `match`: each named part with its value; every part must
/// be one of the limit's `key`.
fn override_parts(
    c: &mut Checker,
    at: &KeyPath,
    o: &OverrideFile,
    key: &[KeyPart],
) -> Vec<(KeyPart, String)> {
    if o.matcher.is_empty() {
        c.problem(&at.key("match"), ProblemKind::EmptyOverrideMatch);
    }
    let mut parts = Vec::new();
    for (label, value) in &o.matcher {
        match key.iter().find(|part| part.label() == match_label(label)) {
            Some(part) => parts.push((part.clone(), value.clone())),
            None => {
                let kind = ProblemKind::OverridePartNotInKey {
                    part: label.clone(),
                    key: key.iter().map(KeyPart::label).collect(),
                };
                c.problem(&at.key("match").key(label), kind);
            }
        }
    }
    parts
}

/// How `match` names a part: `header.X-Api-Key` is `header.x-api-key`
/// (header names are case-insensitive; the rest is as written).
fn match_label(label: &str) -> String {
    match label.strip_prefix("header.") {
        Some(name) => format!("header.{}", name.to_ascii_lowercase()),
        None => label.to_string(),
    }
}

pub(super) fn key_parts(
    c: &mut Checker,
    at: &KeyPath,
    parts: &[KeyPartFile],
    template: Option<&PathTemplate>,
) -> Vec<KeyPart> {
    if parts.is_empty() {
        let item = "part (ip, user, method, path, {header: NAME}, {query: NAME}, {cookie: NAME} or {param: NAME})";
        let key = if at.leaf() == "hash_key" {
            "hash_key"
        } else {
            "key"
        };
        c.problem(at, ProblemKind::NeedsOne { key, item });
    }
    let mut key = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        key.push(match part {
            KeyPartFile::Ip => KeyPart::Ip,
            KeyPartFile::User => KeyPart::User,
            KeyPartFile::ClientCert => KeyPart::ClientCert,
            KeyPartFile::ClientSubject => KeyPart::ClientSubject,
            KeyPartFile::ClientSan => KeyPart::ClientSan,
            KeyPartFile::Method => KeyPart::Method,
            KeyPartFile::Path => KeyPart::Path,
            KeyPartFile::Header(name) => {
                c.header_name(&at.index(i), name);
                KeyPart::Header(name.to_ascii_lowercase())
            }
            KeyPartFile::Query(name) => {
                let bad = name.is_empty()
                    || name
                        .chars()
                        .any(|ch| matches!(ch, '&' | '=' | '#' | '?') || ch.is_whitespace());
                if bad {
                    let kind = ProblemKind::BadQueryName(name.clone());
                    c.problem(&at.index(i), kind);
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
                    c.problem(&at.index(i), kind);
                }
                KeyPart::Cookie(name.clone())
            }
            KeyPartFile::Param(name) => {
                if !template.is_some_and(|t| t.has_param(name)) {
                    let kind = ProblemKind::UnknownParam {
                        name: name.clone(),
                        template: template.map(|t| t.as_str().to_string()),
                    };
                    c.problem(&at.index(i), kind);
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

/// `limit:`, or, when only `plans` are written, the smallest plan's number
/// (what a request without a listed plan gets).
fn written_limit(c: &mut Checker, path: &KeyPath, f: &LimitFile) -> u64 {
    if let Some(limit) = f.limit {
        return limit;
    }
    match f
        .plans
        .as_ref()
        .and_then(|plans| plans.values().copied().min())
    {
        Some(smallest) => smallest,
        None => {
            c.problem(path, ProblemKind::NoLimit);
            1
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
    let limit = f
        .limit
        .or_else(|| f.plans.as_ref()?.values().copied().min())
        .unwrap_or(0);
    match kind {
        AlgorithmFile::SlidingLog => {
            if limit > defaults::MAX_LOG {
                let kind = ProblemKind::LogTooLong {
                    limit,
                    max: defaults::MAX_LOG,
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
