//! `ShouldRateLimit`: a request's descriptors, matched to their limits, are
//! decided in one all-or-nothing decision — the gateway's own, with its
//! batching, deny cache, `on_error` and circuit — and answered as Envoy
//! expects: an overall code, one status per descriptor, and headers.
//!
//! Where envoyproxy/ratelimit consumes the descriptors that fit while
//! another is over its limit, a request over any limit consumes none.

use super::matching::{counter_key, find};
use super::proto::{
    Code, CurrentLimit, DescriptorStatus, HeaderValue, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse,
};
use crate::config::rls::{Rate, RlsConfig, RlsHeaders, RlsLimit, Unit};
use crate::config::Algorithm;
use crate::limiter::{Decision, LimitCheck, Source};
use crate::observe::metrics::{DecisionLabel, LimitCounters};
use crate::policy::state::{CompiledRls, GatewayState};
use std::collections::HashMap;
use std::time::Duration;

/// The most descriptors one request may carry.
pub(crate) const MAX_DESCRIPTORS: usize = 256;
/// The most entries one descriptor may carry.
pub(crate) const MAX_ENTRIES: usize = 64;

/// Why a request gets no decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The request is malformed (gRPC `INVALID_ARGUMENT`).
    Invalid(String),
    /// No decision could be made and `on_error: deny` (gRPC `UNAVAILABLE`,
    /// so that Envoy's `failure_mode_deny` applies).
    Unavailable,
}

/// What one request descriptor is checked against.
enum Plan<'s> {
    /// No limit applies (none matches, or another replaces it).
    None,
    /// An `unlimited` entry.
    Unlimited { replaces: &'s [String] },
    /// A limit to count.
    Limited(Limited<'s>),
}

/// A descriptor with a limit to count.
struct Limited<'s> {
    name: Option<&'s str>,
    replaces: &'s [String],
    rate: Rate,
    shadow: bool,
    key: String,
    /// Units this request takes; zero checks without taking any.
    cost: u64,
    counters: &'s LimitCounters,
    /// Its counter among the decision's checks (descriptors that share a
    /// counter share a check).
    check: usize,
}

/// What became of one counter.
#[derive(Debug, Clone, Copy)]
enum Verdict {
    /// The limiter decided it.
    Decided(Decision),
    /// It can never take the request's units (a limit of 0, or fewer
    /// than the request's hits).
    Never,
    /// Not decided: another counter can never pass, or the limiter fell
    /// back to `on_error`.
    Undecided,
}

/// One counter to decide, for one or more descriptors.
struct Counter {
    key: String,
    rate: Rate,
    shadow: bool,
    cost: u64,
}

impl Counter {
    /// Whether the counter can ever take `cost` units at once.
    fn can_pass(&self) -> bool {
        let capacity = match self.rate.algorithm {
            Algorithm::TokenBucket { burst } => burst,
            _ => u64::from(self.rate.requests_per_unit),
        };
        self.rate.requests_per_unit > 0 && self.cost <= capacity
    }

    fn check(&self) -> LimitCheck<'_> {
        LimitCheck {
            key: &self.key,
            limit: u64::from(self.rate.requests_per_unit),
            window: self.rate.unit.window(),
            cost: self.cost.max(1),
            algorithm: self.rate.algorithm,
            shadow: self.shadow,
            block: Duration::ZERO,
            deferred: self.cost == 0,
            max_delay: Duration::ZERO,
        }
    }
}

/// Answers `request` from `state`.
pub(crate) async fn should_rate_limit(
    state: &GatewayState,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, Refusal> {
    let (Some(rls), Some(compiled)) = (&state.config.server.rls, &state.rls) else {
        return Err(Refusal::Unavailable);
    };
    check_shape(request)?;
    let prefix = &state.config.limiter.redis.key_prefix;
    let mut plans: Vec<Plan<'_>> = request
        .descriptors
        .iter()
        .map(|d| plan(rls, compiled, prefix, request, d))
        .collect();
    apply_replaces(&mut plans);
    let counters = counters(&mut plans);
    let possible = counters.iter().all(|c| c.shadow || c.can_pass());
    let checks: Vec<LimitCheck<'_>> = counters
        .iter()
        .filter(|c| c.can_pass())
        .map(Counter::check)
        .collect();
    let outcome = if possible && !checks.is_empty() {
        Some(state.decider.decide(&checks).await)
    } else {
        None
    };
    let mut decided = outcome.iter().flat_map(|o| o.decisions.iter().copied());
    let decisions: Vec<Verdict> = counters
        .iter()
        .map(|counter| match counter.can_pass() {
            false => Verdict::Never,
            true => decided.next().map_or(Verdict::Undecided, Verdict::Decided),
        })
        .collect();
    let source = outcome.as_ref().map(|o| o.source);
    let admitted = possible && outcome.as_ref().is_none_or(|o| o.admitted);
    count(&plans, &decisions, source, admitted);
    if source == Some(Source::FailClosed) {
        return Err(Refusal::Unavailable);
    }
    Ok(answer(rls, &plans, &decisions, source, admitted))
}

/// A request envoyproxy/ratelimit would refuse, or too large to serve.
fn check_shape(request: &RateLimitRequest) -> Result<(), Refusal> {
    let invalid = |why: &str| Err(Refusal::Invalid(why.to_string()));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty");
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty");
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid("more than 256 descriptors in one request");
    }
    for descriptor in &request.descriptors {
        if descriptor.entries.len() > MAX_ENTRIES {
            return invalid("more than 64 entries in one descriptor");
        }
        if descriptor.entries.iter().any(|e| e.key.is_empty()) {
            return invalid("a descriptor entry has an empty key");
        }
    }
    Ok(())
}

/// What descriptor `d` of `request` is checked against.
fn plan<'s>(
    rls: &'s RlsConfig,
    compiled: &'s CompiledRls,
    prefix: &str,
    request: &RateLimitRequest,
    d: &RateLimitDescriptor,
) -> Plan<'s> {
    let domain = request.domain.as_str();
    let cost = match d.hits_addend {
        Some(hits) => hits,
        None => u64::from(request.hits_addend.max(1)),
    };
    // A descriptor that brings its own limit (Envoy's `limit` override)
    // is counted under it, in a domain the rules know.
    if let Some(own) = &d.limit {
        let (Some(counters), Some(unit)) =
            (compiled.overrides.get(domain), Unit::from_proto(own.unit))
        else {
            return Plan::None;
        };
        return Plan::Limited(Limited {
            name: None,
            replaces: &[],
            rate: Rate {
                requests_per_unit: own.requests_per_unit,
                unit,
                algorithm: override_algorithm(rls.algorithm, own.requests_per_unit),
            },
            shadow: false,
            key: counter_key(prefix, domain, &d.entries, &[]),
            cost,
            counters,
            check: 0,
        });
    }
    let Some(found) = find(&rls.rules, domain, &d.entries) else {
        return Plan::None;
    };
    let limit: &RlsLimit = &rls.rules.limits[found.limit];
    let Some(rate) = limit.rate else {
        return Plan::Unlimited {
            replaces: &limit.replaces,
        };
    };
    Plan::Limited(Limited {
        name: limit.name.as_deref(),
        replaces: &limit.replaces,
        rate,
        shadow: limit.shadow,
        key: counter_key(prefix, domain, &d.entries, &found.shared),
        cost,
        counters: &compiled.counters[found.limit],
        check: 0,
    })
}

/// The default algorithm for a limit a request brings: a token bucket
/// fills to that limit.
fn override_algorithm(default: Algorithm, requests_per_unit: u32) -> Algorithm {
    match default {
        Algorithm::TokenBucket { .. } => Algorithm::TokenBucket {
            burst: u64::from(requests_per_unit),
        },
        other => other,
    }
}

/// A limit named in another matched limit's `replaces` does not apply.
fn apply_replaces(plans: &mut [Plan<'_>]) {
    let replaced: Vec<&str> = plans
        .iter()
        .flat_map(|p| match p {
            Plan::Unlimited { replaces } => replaces.iter(),
            Plan::Limited(l) => l.replaces.iter(),
            Plan::None => [].iter(),
        })
        .map(String::as_str)
        .collect();
    if replaced.is_empty() {
        return;
    }
    for plan in plans.iter_mut() {
        if let Plan::Limited(l) = plan {
            if l.name.is_some_and(|n| replaced.contains(&n)) {
                *plan = Plan::None;
            }
        }
    }
}

/// The counters to decide: descriptors with one counter key share one
/// check, their units added, so that a request naming a counter twice
/// cannot pass on two checks of one state.
fn counters(plans: &mut [Plan<'_>]) -> Vec<Counter> {
    let mut counters: Vec<Counter> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for plan in plans.iter_mut() {
        let Plan::Limited(l) = plan else { continue };
        match by_key.get(&l.key) {
            Some(&i) => {
                let counter = &mut counters[i];
                counter.cost = counter.cost.saturating_add(l.cost);
                counter.shadow &= l.shadow;
                l.check = i;
            }
            None => {
                l.check = counters.len();
                by_key.insert(l.key.clone(), counters.len());
                counters.push(Counter {
                    key: l.key.clone(),
                    rate: l.rate,
                    shadow: l.shadow,
                    cost: l.cost,
                });
            }
        }
    }
    counters
}

/// Counts each limited descriptor's decision in
/// `sluice_ratelimit_decisions_total`, as the gateway counts a route's.
fn count(plans: &[Plan<'_>], decisions: &[Verdict], source: Option<Source>, admitted: bool) {
    let source = source.unwrap_or(Source::Redis);
    for plan in plans {
        let Plan::Limited(l) = plan else { continue };
        let allowed = match (source, decisions[l.check]) {
            (Source::FailOpen | Source::FailClosed, _) => admitted,
            (_, Verdict::Decided(d)) => d.allowed,
            (_, Verdict::Never) => false,
            // Not this descriptor's doing.
            (_, Verdict::Undecided) => continue,
        };
        let label = match (l.shadow, allowed, admitted) {
            (true, false, _) => DecisionLabel::ShadowDeny,
            (_, _, true) => DecisionLabel::Allow,
            (false, false, false) => DecisionLabel::Deny,
            // Within its limit, but another denied the request.
            (_, true, false) => continue,
        };
        l.counters.inc(label, source);
    }
}

/// The response: the overall code, a status per descriptor, and the
/// headers of the descriptor closest to its limit.
fn answer(
    rls: &RlsConfig,
    plans: &[Plan<'_>],
    decisions: &[Verdict],
    source: Option<Source>,
    admitted: bool,
) -> RateLimitResponse {
    let fail_open = source == Some(Source::FailOpen);
    let statuses: Vec<DescriptorStatus> = plans
        .iter()
        .map(|plan| match plan {
            Plan::None => DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            },
            Plan::Unlimited { .. } => DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            },
            Plan::Limited(l) => status(l, decisions[l.check], fail_open),
        })
        .collect();
    let headers = match rls.response_headers {
        RlsHeaders::Draft if !fail_open => draft_headers(&statuses),
        _ => Vec::new(),
    };
    RateLimitResponse {
        overall_code: if admitted {
            Code::Ok as i32
        } else {
            Code::OverLimit as i32
        },
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

/// The status of a limited descriptor: over its limit when its decision
/// denied it (never for `shadow_mode`); what remains; and until when —
/// for a denial, when the request would pass, else when the window next
/// frees a unit.
fn status(l: &Limited<'_>, verdict: Verdict, fail_open: bool) -> DescriptorStatus {
    let current_limit = Some(CurrentLimit {
        name: l.name.unwrap_or_default().to_string(),
        requests_per_unit: l.rate.requests_per_unit,
        unit: l.rate.unit.proto(),
    });
    let window = l.rate.unit.window();
    let (allowed, remaining, until) = match verdict {
        Verdict::Decided(d) if d.allowed => (true, d.remaining, d.reset),
        Verdict::Decided(d) => (false, d.remaining, d.retry_after),
        Verdict::Never => (false, 0, window),
        Verdict::Undecided => (true, 0, Duration::ZERO),
    };
    let until = if until.is_zero() && !fail_open {
        window
    } else {
        until
    };
    DescriptorStatus {
        code: if allowed || l.shadow {
            Code::Ok as i32
        } else {
            Code::OverLimit as i32
        },
        current_limit,
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: (!fail_open).then(|| prost_types::Duration {
            seconds: i64::try_from(until.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(until.subsec_nanos()).unwrap_or(0),
        }),
        quota: None,
    }
}

/// `RateLimit-Limit`, `-Remaining` and `-Reset` (whole seconds, rounded
/// up) of the descriptor with the least remaining; over the limit counts
/// as none remaining.
fn draft_headers(statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let closest = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| {
            if s.code == Code::OverLimit as i32 {
                0
            } else {
                s.limit_remaining
            }
        });
    let Some(status) = closest else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let remaining = if status.code == Code::OverLimit as i32 {
        0
    } else {
        status.limit_remaining
    };
    let reset = status.duration_until_reset.as_ref().map_or(0, |d| {
        let whole = u64::try_from(d.seconds).unwrap_or(0);
        whole + u64::from(d.nanos > 0)
    });
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_string(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header("RateLimit-Limit", limit.to_string()),
        header("RateLimit-Remaining", remaining.to_string()),
        header("RateLimit-Reset", reset.to_string()),
    ]
}
