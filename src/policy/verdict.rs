//! What the limiter's outcome means for a request: the decision counted
//! per limit, the rate entries the headers report, and the verdict the
//! access log and traces carry.

use crate::limiter::{Decision, Outcome, Source};
use crate::observe::metrics::DecisionLabel;
use crate::observe::trace::{AuthSpan, DecisionSpan};
use crate::policy::checks::Keyed;
use crate::policy::state::CompiledRoute;
use std::net::IpAddr;
use std::time::Duration;

/// The limiter's decision on a request, as the access log reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Allow, deny or shadow deny.
    pub label: DecisionLabel,
    /// The limit that denied (or would have, for shadow), by index.
    pub limit: Option<usize>,
    /// For a denial, how long until the denying limit would admit it.
    pub retry_after: Duration,
    /// Who decided.
    pub source: Source,
}

/// One enforced limit's decision, as the response headers report it.
#[derive(Debug, Clone, Copy)]
pub struct RateEntry {
    /// The limit's index in its route.
    pub limit: usize,
    /// The limit that applied (see `plans` and `overrides`).
    pub applied: u64,
    /// Its decision.
    pub decision: Decision,
}

/// What the limits said about a request, whatever its outcome.
#[derive(Debug, Default)]
pub struct LimitReport {
    /// The enforced limits that applied, most restrictive (least
    /// remaining) first: what the headers report.
    pub rate: Vec<RateEntry>,
    /// What the limiter decided, if it was asked.
    pub verdict: Option<Verdict>,
    /// The client IP, when the limits needed it.
    pub client: Option<IpAddr>,
    /// The established identity, when the route's header edits name it.
    pub user: Option<Vec<u8>>,
    /// The identity method that decided who the request is (`jwt`,
    /// `api_key`, `header`), when its credential was present.
    pub identity: Option<&'static str>,
    /// The limiter's decision, for the request's trace.
    pub decided: Option<DecisionSpan>,
    /// The auth service's answer, for the request's trace.
    pub auth: Option<AuthSpan>,
}

/// Counts the decision in `sluice_ratelimit_decisions_total`, and returns
/// which of `keys` were counted as denied (none allocated when none was).
pub(super) fn count_decisions(
    route: &CompiledRoute,
    keys: &[Keyed],
    outcome: &Outcome,
) -> Vec<usize> {
    let admitted = outcome.admitted;
    if matches!(outcome.source, Source::FailOpen | Source::FailClosed) {
        let label = if admitted {
            DecisionLabel::Allow
        } else {
            DecisionLabel::Deny
        };
        for k in keys {
            route.limits[k.index].counters.inc(label, outcome.source);
        }
        return Vec::new();
    }
    let mut denied = Vec::new();
    for (i, (k, decision)) in keys.iter().zip(&outcome.decisions).enumerate() {
        let limit = &route.limits[k.index];
        // A denied request is counted against the limits that denied it; the
        // others neither admitted it nor consumed anything.
        let label = match (limit.config.shadow, decision.allowed, admitted) {
            (true, false, _) => DecisionLabel::ShadowDeny,
            (_, true, true) if !decision.delay().is_zero() => DecisionLabel::Delayed,
            (_, _, true) => DecisionLabel::Allow,
            (false, false, false) => DecisionLabel::Deny,
            (_, true, false) => continue,
        };
        limit.counters.inc(label, outcome.source);
        if label == DecisionLabel::Deny {
            denied.push(i);
        }
    }
    denied
}

/// The enforced limits' decisions, most restrictive first.
pub(super) fn rate_entries(
    route: &CompiledRoute,
    keys: &[Keyed],
    decisions: &[Decision],
) -> Vec<RateEntry> {
    let mut entries: Vec<RateEntry> = keys
        .iter()
        .zip(decisions)
        .filter(|(k, _)| !route.limits[k.index].config.shadow)
        .map(|(k, d)| RateEntry {
            limit: k.index,
            applied: k.applied,
            decision: *d,
        })
        .collect();
    entries.sort_by_key(|e| e.decision.remaining);
    entries
}

/// What the access log says the limiter decided.
pub(super) fn verdict(route: &CompiledRoute, keys: &[Keyed], outcome: &Outcome) -> Verdict {
    let shadow = |i: &usize| route.limits[*i].config.shadow;
    let mut denials = keys
        .iter()
        .zip(&outcome.decisions)
        .filter(|(_, d)| !d.allowed);
    let (label, limit, retry_after) = if !outcome.admitted {
        // The enforced limit that denies longest names the denial.
        match denials
            .filter(|(k, _)| !shadow(&k.index))
            .max_by_key(|(_, d)| d.retry_after)
        {
            Some((k, d)) => (DecisionLabel::Deny, Some(k.index), d.retry_after),
            None => (DecisionLabel::Deny, None, Duration::ZERO),
        }
    } else {
        let delayed = keys
            .iter()
            .zip(&outcome.decisions)
            .filter(|(_, d)| !d.delay().is_zero())
            .max_by_key(|(_, d)| d.delay());
        match (denials.find(|(k, _)| shadow(&k.index)), delayed) {
            (Some((k, _)), _) => (DecisionLabel::ShadowDeny, Some(k.index), Duration::ZERO),
            (None, Some((k, _))) => (DecisionLabel::Delayed, Some(k.index), Duration::ZERO),
            (None, None) => (DecisionLabel::Allow, None, Duration::ZERO),
        }
    };
    Verdict {
        label,
        limit,
        retry_after,
        source: outcome.source,
    }
}
