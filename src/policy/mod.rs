//! The policy layer: what the gateway decides about a request before it is
//! proxied, and the running state it decides with ([`state`]: routes,
//! identity, limits, upstreams, built from one config and swapped whole on
//! reload). Below it: route matching ([`route`](mod@route)), who the user is
//! ([`identity`]), exemptions ([`exempt`]), counter keys ([`keys`]), unknown
//! API keys per client ([`key_failures`]) and the rate-limit headers
//! ([`rate_headers`]). May use `observe`, `upstream`, `request`, `config`,
//! the limiter and the leaves; never the edge (it touches no session).
//!
//! The policy step itself (this file) turns the running state, the matched
//! route and a view of the request into a [`Judgement`]: proceed (with the
//! rate entries the headers report and the concurrency leases to release at
//! the end), or a [`Rejection`]. Its steps, one file each: who the request
//! is (`who.rs`), the checks the limiter is asked (`checks.rs`), what the
//! outcome means (`verdict.rs`), what an admitted request holds until it
//! ends (`leases.rs`), and the status, headers and JSON body a rejection is
//! answered with (`rejection.rs`).
//!
//! The rules here, each unit-tested below:
//! - identity is checked on every route when it is required, otherwise only
//!   where limits need it, so a token is never verified for nothing;
//! - a denial is counted against the enforced limits that denied it, a shadow
//!   limit that would deny counts `shadow_deny` whatever the others did;
//! - the enforced limit that denies longest names a denial, and its wait
//!   rounded up to whole seconds (at least 1) is the `Retry-After`;
//! - headers describe the enforced limits, most restrictive first.
//!
//! Nothing here touches a Pingora session: the proxy reads the request head
//! and the peer address into a [`RequestView`] and writes the [`Reply`].

pub mod consumer_plans;
pub mod exempt;
pub mod identity;
pub mod key_failures;
pub mod keys;
pub mod rate_headers;
pub mod route;
pub mod state;
pub mod usage;

mod checks;
mod error_styles;
mod leases;
mod rejection;
mod settle;
mod shown;
mod verdict;
mod who;

use crate::config::{Backend, EscapedSlashes, PlanSource};
use crate::limiter::redis::batch_size;
use crate::limiter::waiters::WaitPermit;
use crate::limiter::{LimitCheck, Outcome, Source};
use crate::observe::trace::DecisionSpan;
use crate::policy::exempt::{exempts, Subject};
use crate::policy::rate_headers::ceil_secs;
use crate::policy::state::{CompiledLimit, CompiledRoute, GatewayState};
use crate::request::client_cert::ClientCert;
use crate::request::{canonical_request, header_values};
pub use checks::{applied_limit, counter_name, limit_check, with_request_parts};
use checks::{checks, limit_keys, Keyed};
use http::HeaderValue;
use keys::AmbiguousPart;
use leases::held_leases;
pub use leases::{HeldLeases, MAX_RESPONSE_COST};
use pingora::http::RequestHeader;
pub use rejection::{fixed_reply, is_grpc, Rejection, Reply};
pub use settle::Settlement;
use std::net::IpAddr;
use std::time::{Duration, Instant};
use verdict::{count_decisions, rate_entries, verdict};
pub use verdict::{LimitReport, RateEntry, Verdict};
use who::{identify, plan_name, Who};

/// The parts of a request the policy reads.
pub struct RequestView<'a> {
    /// The request head, as it will go upstream.
    pub head: &'a RequestHeader,
    /// The socket peer (loopback when the connection is not over IP).
    pub peer: IpAddr,
    /// The canonical path.
    pub path: &'a str,
    /// The connection's verified client certificate, if any.
    pub client_cert: Option<&'a ClientCert>,
    /// The request body, when the route's limits read it (`reserve`) and
    /// it was read before the decision.
    pub body: Option<&'a [u8]>,
}

/// Where a request goes: its route and what to send upstream instead of
/// what was received.
#[derive(Debug)]
pub struct Routed {
    /// Index into the state's routes.
    pub route: usize,
    /// The canonical path, when it differs from the received one.
    pub rewritten_path: Option<String>,
    /// The origin-form target to send upstream, when rewritten.
    pub upstream_target: Option<Vec<u8>>,
    /// The `Host` to send upstream, for absolute-form without one.
    pub upstream_host: Option<Vec<u8>>,
    /// It is a CORS preflight for a route that answers CORS.
    pub preflight: bool,
}

/// Matches the canonical request to a route: 400 when it cannot be made
/// canonical, 404 when no route matches.
pub fn route(
    state: &GatewayState,
    head: &RequestHeader,
    slashes: EscapedSlashes,
) -> Result<Routed, Rejection<'static>> {
    let canonical = canonical_request(head, slashes).map_err(|e| {
        log::debug!("bad request target: {e}");
        Rejection::BadRequest
    })?;
    let host = canonical.host.as_deref();
    // A CORS preflight is routed as the request it asks about, to a route
    // that answers CORS; elsewhere it is an OPTIONS like any other.
    let preflight = crate::request::cors::preflight_method(head)
        .and_then(|asked| state.routes.find(asked, host, &canonical.path))
        .filter(|&i| state.compiled[i].forward.cors.is_some());
    let found = preflight.or_else(|| {
        state
            .routes
            .find(head.method.as_str(), host, &canonical.path)
    });
    let route = found.ok_or(Rejection::NotFound)?;
    Ok(Routed {
        route,
        rewritten_path: canonical.rewritten_path,
        upstream_target: canonical.upstream_target,
        upstream_host: canonical.upstream_host,
        preflight: preflight.is_some(),
    })
}

/// An answer made before the limits.
#[derive(Debug)]
pub enum Early<'a> {
    /// A reply of the gateway's own (a preflight's).
    Reply(Reply),
    /// A refusal.
    Reject(Rejection<'a>),
}

/// Whether `head` declares (`Content-Length`) a body longer than `cap`
/// (0: no cap). A chunked body is counted as it arrives instead.
pub(crate) fn declared_body_over(head: &RequestHeader, cap: u64) -> bool {
    cap > 0
        && head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|length| length > cap)
}

/// What to do with a routed request.
#[derive(Debug)]
pub enum Step<'a> {
    /// Serve it; release these leases when it ends.
    Proceed(Option<HeldLeases>),
    /// Answer it with this.
    Reject(Rejection<'a>),
}

/// The policy's answer for one routed request.
#[derive(Debug)]
pub struct Judgement<'a> {
    /// For the headers and the access log.
    pub report: LimitReport,
    /// Proceed or reject.
    pub step: Step<'a>,
}

/// Applies the identity rules and the route's limits to the request.
pub(crate) async fn judge<'a>(
    state: &GatewayState,
    route: &'a CompiledRoute,
    view: &RequestView<'_>,
) -> Judgement<'a> {
    let mut report = LimitReport::default();
    let who = match identify(state, route, view, &mut report).await {
        Ok(who) => who,
        Err(rejection) => {
            return Judgement {
                report,
                step: Step::Reject(rejection),
            }
        }
    };
    if route.limits.is_empty() {
        return Judgement {
            report,
            step: Step::Proceed(None),
        };
    }
    let client = report
        .client
        .unwrap_or_else(|| client_ip(state, view.head, view.peer));
    report.client = Some(client);
    let keys = applied_keys(state, route, view, client, &who);
    let keys = match keys {
        Ok(keys) => keys,
        Err(e) => {
            log::debug!("bad request on route {}: {e}", route.name);
            return Judgement {
                report,
                step: Step::Reject(Rejection::BadRequest),
            };
        }
    };
    if keys.is_empty() {
        return Judgement {
            report,
            step: Step::Proceed(None),
        };
    }
    let mut keys = keys;
    if let Err(rejection) = settle::reserve(route, &mut keys, view.body) {
        return Judgement {
            report,
            step: Step::Reject(rejection),
        };
    }
    let mut checks = checks(route, &keys);
    let permits = wait_permits(state, route, &keys, &mut checks);
    // Timed and its batch observed only for a trace: nothing added to a
    // request when tracing is off.
    let outcome = if state.tracer.is_some() {
        let asked = Instant::now();
        let (outcome, batch) = batch_size::observed(state.decider.decide(&checks)).await;
        report.decided = Some(decision_span(state, route, &keys, &outcome, (asked, batch)));
        outcome
    } else {
        state.decider.decide(&checks).await
    };
    drop(checks);
    let denied = count_decisions(route, &keys, &outcome);
    if !denied.is_empty() {
        let user = who.user.as_deref();
        shown::record_denied(state, route, view, (client, user), &keys, &denied);
    }
    report.rate = rate_entries(route, &keys, &outcome.decisions);
    let verdict = verdict(route, &keys, &outcome);
    report.verdict = Some(verdict);
    let step = step_for(state, route, keys, outcome, permits, &report);
    Judgement { report, step }
}

/// The decision for the request's trace: when it was `asked` and answered,
/// by whom, in a Redis batch of what size, with the algorithm of its first
/// limit (the denying one when it was denied).
fn decision_span(
    state: &GatewayState,
    route: &CompiledRoute,
    keys: &[Keyed],
    outcome: &Outcome,
    (asked, batch): (Instant, Option<usize>),
) -> DecisionSpan {
    let named = keys
        .iter()
        .zip(&outcome.decisions)
        .find(|(_, d)| !d.allowed)
        .map(|(k, _)| k)
        .or(keys.first());
    let backend = match state.config.limiter.backend {
        Backend::Redis => "redis",
        Backend::Local => "local",
    };
    DecisionSpan {
        start: asked,
        end: Instant::now(),
        backend,
        source: outcome.source.label(),
        algorithm: named.map_or("", |k| route.limits[k.index].config.algorithm.name()),
        keys: keys.len(),
        batch,
    }
}

/// The keys of the route's limits that apply to the request (those no
/// exemption lifts), each with the limit that applies to it.
fn applied_keys(
    state: &GatewayState,
    route: &CompiledRoute,
    view: &RequestView<'_>,
    client: IpAddr,
    who: &Who<'_>,
) -> Result<Vec<Keyed>, AmbiguousPart> {
    let header = |name: &str| header_values(view.head, name);
    let subject = Subject {
        client,
        trusted_peer: state.client_ip.is_trusted(view.peer),
        header: &header,
        claims: who.claims.as_ref(),
    };
    let whole_route = exempts(&state.config.exempt, &subject) || exempts(&route.exempt, &subject);
    let exempt = |limit: &CompiledLimit| whole_route || exempts(&limit.config.exempt, &subject);
    let plan = |source: &PlanSource| match source {
        PlanSource::ConsumerPlan => who.plan.as_deref().map(|plan| {
            state.consumer_plans.note(plan);
            plan.to_string()
        }),
        _ => plan_name(source, &subject),
    };
    let user = who.user.as_deref();
    limit_keys(state, route, view, client, user, &exempt, &plan)
}

/// What the limiter's `outcome` makes of the request: 503 when it failed
/// closed, the configured denial when it was not admitted, else proceed
/// holding its leases.
fn step_for<'a>(
    state: &GatewayState,
    route: &'a CompiledRoute,
    keys: Vec<Keyed>,
    outcome: Outcome,
    permits: Vec<(usize, WaitPermit)>,
    report: &LimitReport,
) -> Step<'a> {
    if outcome.source == Source::FailClosed {
        return Step::Reject(Rejection::Unavailable { route: &route.name });
    }
    if outcome.admitted {
        return Step::Proceed(held_leases(state, route, keys, outcome, permits));
    }
    let limit = report
        .verdict
        .and_then(|v| v.limit)
        .map(|i| &route.limits[i].config);
    let retry_after = report.verdict.map_or(Duration::ZERO, |v| v.retry_after);
    Step::Reject(Rejection::TooMany {
        status: state.config.response.status,
        route: &route.name,
        limit: limit.map_or("", |c| c.name.as_str()),
        counts_tokens: limit.is_some_and(|c| c.reserve.is_some() || c.cost_from.is_some()),
        retry_after: ceil_secs(retry_after).max(1),
        headers: rate_headers(Some(route), &report.rate),
    })
}

/// Places among the waiters for the limits that delay (`on_limit: delay`):
/// a limit that gets none (its key's `max_waiting`, or the instance's
/// `limiter.max_waiting`, are waiting already) is decided without a delay,
/// so a request that does not fit now is denied.
fn wait_permits(
    state: &GatewayState,
    route: &CompiledRoute,
    keys: &[Keyed],
    checks: &mut [LimitCheck<'_>],
) -> Vec<(usize, WaitPermit)> {
    let mut permits = Vec::new();
    for (i, (check, k)) in checks.iter_mut().zip(keys).enumerate() {
        if check.max_delay.is_zero() {
            continue;
        }
        let per_key = route.limits[k.index].config.max_waiting;
        match state.decider.wait_permit(check.key, per_key) {
            Some(permit) => permits.push((i, permit)),
            None => check.max_delay = Duration::ZERO,
        }
    }
    permits
}

/// The configured rate-limit headers for `entries` (see [`headers`]).
pub(crate) fn rate_headers(
    route: Option<&CompiledRoute>,
    entries: &[RateEntry],
) -> Vec<(&'static str, HeaderValue)> {
    let Some(route) = route else {
        return Vec::new();
    };
    let entries = entries
        .iter()
        .map(|e| (&route.limits[e.limit].config, e.applied, &e.decision));
    rate_headers::rate_headers(route.rate_headers, entries)
}

/// The client IP per `client_ip` (trusted proxies' X-Forwarded-For).
pub fn client_ip(state: &GatewayState, head: &RequestHeader, peer: IpAddr) -> IpAddr {
    let forwarded = head.headers.get_all("x-forwarded-for");
    state
        .client_ip
        .client_ip(peer, forwarded.iter().map(|v| v.as_bytes()))
}

/// Whether a limiter failure refuses requests (`on_error: deny`).
fn fails_closed(state: &GatewayState) -> bool {
    state.config.limiter.on_error == crate::config::OnError::Deny
}

#[cfg(test)]
mod tests;
