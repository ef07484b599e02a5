//! The policy layer: what the gateway decides about a request before it is
//! proxied, and the running state it decides with ([`state`]: routes,
//! identity, limits, upstreams, built from one config and swapped whole on
//! reload). Below it: route matching ([`route`]), who the user is
//! ([`identity`]), exemptions ([`exempt`]), counter keys ([`keys`]), unknown
//! API keys per client ([`key_failures`]) and the rate-limit headers
//! ([`rate_headers`]). May use `observe`, `upstream`, `request`, `config`,
//! the limiter and the leaves; never the edge (it touches no session).
//!
//! The policy step itself turns the running state, the matched route and a view of the
//! request into a [`Judgement`]: proceed (with the rate entries the headers
//! report and the concurrency leases to release at the end), or a
//! [`Rejection`] that renders its own status, headers and JSON body.
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

pub mod exempt;
pub mod identity;
pub mod key_failures;
pub mod keys;
pub mod rate_headers;
pub mod route;
pub mod state;

use crate::config::consumers::KeySource;
use crate::config::{
    Algorithm, Backend, EscapedSlashes, KeyPart, LimitConfig, OnMissing, PlanSource,
};
use crate::limiter::leases::LeaseHold;
use crate::limiter::redis::batch_size;
use crate::limiter::waiters::WaitPermit;
use crate::limiter::{Decision, LimitCheck, Outcome, Source};
use crate::observe::metrics::DecisionLabel;
use crate::observe::top_keys::parts_of;
use crate::observe::trace::{AuthSpan, DecisionSpan};
use crate::policy::exempt::{exempts, Subject};
use crate::policy::identity::auth_request::{AuthAnswer, AuthService};
use crate::policy::identity::{ApiKeys, Claims, Established, Identity, User};
use crate::policy::rate_headers::ceil_secs;
use crate::policy::state::{CompiledLimit, CompiledRoute, GatewayState};
use crate::request::client_cert::ClientCert;
use crate::request::parts::query_value;
use crate::request::parts::{cookie_value, part_value, PartValue, RequestParts};
use crate::request::HeaderValues;
use crate::request::{canonical_request, header_values};
use bytes::Bytes;
use http::HeaderValue;
use keys::{build_key, AmbiguousPart};
use pingora::http::RequestHeader;
use std::borrow::Cow;
use std::net::IpAddr;
use std::time::{Duration, Instant};

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
}

/// Why a request is answered by the gateway instead of the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection<'a> {
    /// The target or Host cannot be made canonical: 400.
    BadRequest,
    /// No route matches: 404.
    NotFound,
    /// A required identity is missing or invalid: 401.
    Unauthorized,
    /// An enforced limit denies (`response.status`, 429 by default).
    TooMany {
        /// The status to answer with.
        status: u16,
        /// The route's name.
        route: &'a str,
        /// The denying limit's name (empty when none can be named).
        limit: &'a str,
        /// Whole seconds to wait, at least 1.
        retry_after: u64,
        /// The rate-limit headers.
        headers: Vec<(&'static str, HeaderValue)>,
    },
    /// The limiter failed and `on_error: deny` refuses: 503.
    Unavailable {
        /// The route's name.
        route: &'a str,
    },
    /// The upstream could not be reached or answered wrongly (refused,
    /// reset, no healthy server): 502.
    BadGateway {
        /// The route's name, if one matched.
        route: Option<&'a str>,
    },
    /// The upstream did not connect or answer in time: 504.
    GatewayTimeout {
        /// The route's name, if one matched.
        route: Option<&'a str>,
    },
    /// The request body is larger than the route takes
    /// (`max_body_bytes`): 413.
    PayloadTooLarge {
        /// The route's name.
        route: Option<&'a str>,
    },
    /// The auth service refused the request (401 or 403): its answer,
    /// passed on.
    AuthRefused {
        /// 401 or 403.
        status: u16,
        /// The service's body.
        body: Bytes,
        /// The service's `WWW-Authenticate` and `Content-Type`.
        headers: Vec<(&'static str, HeaderValue)>,
    },
    /// Something in the gateway itself failed: 500.
    Internal,
}

/// A response the gateway writes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Further headers, in order.
    pub headers: Vec<(&'static str, HeaderValue)>,
    /// The whole body.
    pub body: Bytes,
}

/// The JSON body of every rejection; absent fields are left out (written by
/// [`ErrorBody::to_json`]; the derive is the reference its test compares with).
#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    error: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    route: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
}

impl ErrorBody<'_> {
    fn only(error: &'static str) -> Self {
        ErrorBody {
            error,
            route: None,
            limit: None,
            retry_after_seconds: None,
        }
    }

    /// The body as JSON, fields in declaration order, written by hand: it is
    /// on every denial's path, where a serializer cost a thousand
    /// instructions for four fields. A test holds it equal to serde_json's.
    fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        out.extend_from_slice(b"{\"error\":");
        push_json_string(&mut out, self.error);
        if let Some(route) = self.route {
            out.extend_from_slice(b",\"route\":");
            push_json_string(&mut out, route);
        }
        if let Some(limit) = self.limit {
            out.extend_from_slice(b",\"limit\":");
            push_json_string(&mut out, limit);
        }
        if let Some(seconds) = self.retry_after_seconds {
            use std::io::Write as _;
            let _ = write!(out, ",\"retry_after_seconds\":{seconds}");
        }
        out.push(b'}');
        out
    }
}

/// Appends `text` as a JSON string. Names (`[a-z0-9_-]+`) are copied as
/// they are; anything else goes through serde_json's escaping.
fn push_json_string(out: &mut Vec<u8>, text: &str) {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    if text.bytes().all(plain) {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, text);
    }
}

impl Rejection<'_> {
    /// The response that says this rejection: its status, headers and a
    /// JSON body `{"error": ...}` with the route, limit and wait it concerns
    /// (an auth service's refusal: the service's own answer).
    pub fn reply(&self) -> Reply {
        if let Rejection::AuthRefused {
            status,
            body,
            headers,
        } = self
        {
            return Reply {
                status: *status,
                content_type: "text/plain",
                headers: headers.clone(),
                body: body.clone(),
            };
        }
        let (status, headers, body) = self.error_parts();
        Reply {
            status,
            content_type: "application/json",
            headers,
            body: body.to_json().into(),
        }
    }

    /// The status, headers and JSON body of a rejection sluice words itself.
    fn error_parts(&self) -> (u16, Vec<(&'static str, HeaderValue)>, ErrorBody<'_>) {
        match self {
            Rejection::BadRequest => (400, Vec::new(), ErrorBody::only("bad_request")),
            Rejection::NotFound => (404, Vec::new(), ErrorBody::only("not_found")),
            Rejection::Unauthorized => (
                401,
                vec![(
                    "www-authenticate",
                    HeaderValue::from_static(r#"Bearer error="invalid_token""#),
                )],
                ErrorBody::only("unauthorized"),
            ),
            Rejection::TooMany {
                status,
                route,
                limit,
                retry_after,
                headers,
            } => {
                let mut all = Vec::with_capacity(headers.len() + 1);
                all.push(("retry-after", HeaderValue::from(*retry_after)));
                all.extend(headers.iter().cloned());
                let body = ErrorBody {
                    error: "too_many_requests",
                    route: Some(route),
                    limit: Some(limit),
                    retry_after_seconds: Some(*retry_after),
                };
                (*status, all, body)
            }
            Rejection::Unavailable { route } => (
                503,
                vec![("retry-after", HeaderValue::from_static("1"))],
                ErrorBody {
                    route: Some(route),
                    ..ErrorBody::only("rate_limiter_unavailable")
                },
            ),
            Rejection::BadGateway { route } => (
                502,
                Vec::new(),
                ErrorBody {
                    route: *route,
                    ..ErrorBody::only("bad_gateway")
                },
            ),
            Rejection::GatewayTimeout { route } => (
                504,
                Vec::new(),
                ErrorBody {
                    route: *route,
                    ..ErrorBody::only("gateway_timeout")
                },
            ),
            Rejection::PayloadTooLarge { route } => (
                413,
                Vec::new(),
                ErrorBody {
                    route: *route,
                    ..ErrorBody::only("payload_too_large")
                },
            ),
            Rejection::Internal | Rejection::AuthRefused { .. } => {
                (500, Vec::new(), ErrorBody::only("internal_error"))
            }
        }
    }
}

impl Rejection<'_> {
    /// The same rejection as a gRPC client understands it: HTTP 200,
    /// trailers-only (`grpc-status`, `grpc-message` in the one header block,
    /// no body). A denial is `RESOURCE_EXHAUSTED` (8) with the wait in
    /// `retry-after` and the message; a failed limiter or upstream is
    /// `UNAVAILABLE` (14), an upstream timeout `DEADLINE_EXCEEDED` (4).
    pub fn grpc_reply(&self) -> Reply {
        let (code, message, mut headers) = match self {
            Rejection::BadRequest => (13, "bad request".to_string(), Vec::new()),
            Rejection::NotFound => (12, "no route".to_string(), Vec::new()),
            Rejection::Unauthorized => (16, "unauthorized".to_string(), Vec::new()),
            Rejection::AuthRefused { status: 403, .. } => {
                (7, "permission denied".to_string(), Vec::new())
            }
            Rejection::AuthRefused { .. } => (16, "unauthorized".to_string(), Vec::new()),
            Rejection::TooMany {
                route,
                limit,
                retry_after,
                headers,
                ..
            } => {
                let mut all = vec![("retry-after", HeaderValue::from(*retry_after))];
                all.extend(headers.iter().cloned());
                let message =
                    format!("rate limited: route {route}, limit {limit}; retry in {retry_after}s");
                (8, message, all)
            }
            Rejection::Unavailable { route } => (
                14,
                format!("rate limiter unavailable: route {route}"),
                Vec::new(),
            ),
            Rejection::BadGateway { route } => {
                let route = route.unwrap_or("-");
                (
                    14,
                    format!("upstream unavailable: route {route}"),
                    Vec::new(),
                )
            }
            Rejection::GatewayTimeout { route } => {
                let route = route.unwrap_or("-");
                (4, format!("upstream timed out: route {route}"), Vec::new())
            }
            Rejection::PayloadTooLarge { .. } => {
                (8, "request body too large".to_string(), Vec::new())
            }
            Rejection::Internal => (13, "internal error".to_string(), Vec::new()),
        };
        headers.insert(0, ("grpc-status", HeaderValue::from(code)));
        // Names and numbers only: printable ASCII without `%`, which
        // gRPC's percent-encoding leaves as it is.
        let message: String = message
            .chars()
            .map(|c| {
                if (c.is_ascii_graphic() && c != '%') || c == ' ' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if let Ok(value) = HeaderValue::from_str(&message) {
            headers.insert(1, ("grpc-message", value));
        }
        Reply {
            status: 200,
            content_type: "application/grpc",
            headers,
            body: Bytes::new(),
        }
    }
}

/// Whether the request is a gRPC call (`content-type: application/grpc`,
/// `application/grpc+proto`, …), whose rejections take gRPC's form.
pub fn is_grpc(head: &RequestHeader) -> bool {
    head.headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.as_bytes())
        .is_some_and(|v| v.len() >= 16 && v[..16].eq_ignore_ascii_case(b"application/grpc"))
}

/// A `respond:` route's answer, with the rate headers of its limits.
pub fn fixed_reply(status: u16, body: &str, headers: Vec<(&'static str, HeaderValue)>) -> Reply {
    Reply {
        status,
        content_type: "text/plain; charset=utf-8",
        headers,
        body: Bytes::copy_from_slice(body.as_bytes()),
    }
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
pub fn declared_body_over(head: &RequestHeader, cap: u64) -> bool {
    cap > 0
        && head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|length| length > cap)
}

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

/// What an admitted request holds until it ends: its concurrency leases,
/// and its deferred limits (`count_when`, `cost_from`), which count once
/// its response head is known.
#[derive(Debug)]
pub struct HeldLeases {
    keys: Vec<Keyed>,
    deferred: Vec<Keyed>,
    outcome: Outcome,
    /// The wait before the request may proceed (`on_limit: delay`), the
    /// limits that reserved units for it, and its places among the waiters.
    delay: Duration,
    delayed: Vec<Keyed>,
    permits: Vec<WaitPermit>,
    /// The concurrency leases on the book of held leases (renewed while
    /// the request lives).
    renewing: Option<LeaseHold>,
}

/// One limit that applies to a request: its index in the route, its counter
/// key, and the limit that applies (the configured one, or the request's
/// plan's or override's).
#[derive(Debug, Clone)]
struct Keyed {
    index: usize,
    key: String,
    applied: u64,
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

impl HeldLeases {
    /// The wait the request must do before it proceeds (`on_limit:
    /// delay`); zero when it may proceed now.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The request's wait is over: its places among the waiters are free.
    pub fn waited(&mut self) {
        self.delay = Duration::ZERO;
        self.permits.clear();
    }

    /// The client left while the request waited: the units reserved for it
    /// are given back (the next request of the key can have them), and its
    /// deferred limits count nothing, as no response will come.
    pub async fn give_back(&mut self, state: &GatewayState, route: &CompiledRoute) {
        self.deferred.clear();
        let delayed = std::mem::take(&mut self.delayed);
        let checks = checks(route, &delayed);
        state.decider.give_back(&checks, &self.outcome).await;
        self.waited();
    }

    /// Hands the leases back to the limiter that granted them (and counts
    /// the deferred limits by `status`, if that has not happened yet).
    pub async fn release(mut self, state: &GatewayState, route: &CompiledRoute, status: u16) {
        // Off the book first: a renewal never runs after the release.
        drop(self.renewing.take());
        self.settle(state, route, status, &|_| None).await;
        let checks = checks(route, &self.keys);
        state.decider.release(&checks, &self.outcome).await;
    }

    /// Counts the deferred limits for a response of `status` whose headers
    /// `header` looks up (lower-case name): a `count_when` limit only when
    /// the status matches; a `cost_from` limit the header's whole number
    /// (its `cost` when the header is absent or not a number, nothing when
    /// it is 0). Once: later calls do nothing.
    pub async fn settle<'h>(
        &mut self,
        state: &GatewayState,
        route: &CompiledRoute,
        status: u16,
        header: &(dyn Fn(&str) -> Option<&'h [u8]> + Sync),
    ) {
        let deferred = std::mem::take(&mut self.deferred);
        let mut counted = Vec::with_capacity(deferred.len());
        let mut costs = Vec::with_capacity(deferred.len());
        for k in deferred {
            let c = &route.limits[k.index].config;
            if let Some(when) = &c.count_when {
                if !when.iter().any(|m| m.matches(status)) {
                    continue;
                }
            }
            let cost = match &c.cost_from {
                Some(name) => response_cost(header(name)).unwrap_or(c.cost),
                None => c.cost,
            };
            if cost > 0 {
                counted.push(k);
                costs.push(cost);
            }
        }
        if counted.is_empty() {
            return;
        }
        let mut checks = checks(route, &counted);
        for (check, cost) in checks.iter_mut().zip(costs) {
            check.cost = cost;
        }
        state.decider.record(&checks, &self.outcome).await;
    }
}

/// The most units one response may report (`cost_from`): a header beyond it
/// counts this much.
pub const MAX_RESPONSE_COST: u64 = 1_000_000_000;

/// A `cost_from` header's units: a whole number, capped at
/// [`MAX_RESPONSE_COST`]; `None` when absent or not a number.
fn response_cost(value: Option<&[u8]>) -> Option<u64> {
    let text = std::str::from_utf8(value?).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        text.parse::<u64>()
            .unwrap_or(MAX_RESPONSE_COST)
            .min(MAX_RESPONSE_COST),
    )
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
pub async fn judge<'a>(
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
    count_decisions(route, &keys, &outcome);
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
        PlanSource::ConsumerPlan => who.plan.as_deref().map(str::to_string),
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
        .map(|i| route.limits[i].config.name.as_str());
    let retry_after = report.verdict.map_or(Duration::ZERO, |v| v.retry_after);
    Step::Reject(Rejection::TooMany {
        status: state.config.response.status,
        route: &route.name,
        limit: limit.unwrap_or(""),
        retry_after: ceil_secs(retry_after).max(1),
        headers: rate_headers(state, Some(route), &report.rate),
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
pub fn rate_headers(
    state: &GatewayState,
    route: Option<&CompiledRoute>,
    entries: &[RateEntry],
) -> Vec<(&'static str, HeaderValue)> {
    let Some(route) = route else {
        return Vec::new();
    };
    let entries = entries
        .iter()
        .map(|e| (&route.limits[e.limit].config, e.applied, &e.decision));
    rate_headers::rate_headers(state.config.response.headers, entries)
}

/// The client IP per `client_ip` (trusted proxies' X-Forwarded-For).
pub fn client_ip(state: &GatewayState, head: &RequestHeader, peer: IpAddr) -> IpAddr {
    let forwarded = head.headers.get_all("x-forwarded-for");
    state
        .client_ip
        .client_ip(peer, forwarded.iter().map(|v| v.as_bytes()))
}

/// The request's plan name from `source`: a verified claim (a string, or a
/// number as JSON writes it), or a header sent once by a trusted proxy.
fn plan_name(source: &PlanSource, subject: &Subject<'_>) -> Option<String> {
    match source {
        PlanSource::Claim(name) => match subject.claims?.get(name)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        },
        PlanSource::Header(name) if subject.trusted_peer => match (subject.header)(name) {
            HeaderValues::One(value) => std::str::from_utf8(value).ok().map(str::to_string),
            _ => None,
        },
        PlanSource::Header(_) | PlanSource::ConsumerPlan => None,
    }
}

/// Whether a limiter failure refuses requests (`on_error: deny`).
fn fails_closed(state: &GatewayState) -> bool {
    state.config.limiter.on_error == crate::config::OnError::Deny
}

/// Who a request is: its `user` key part, its verified token's claims and
/// its consumer's plan.
#[derive(Default)]
struct Who<'v> {
    user: Option<Cow<'v, [u8]>>,
    claims: Option<Claims>,
    plan: Option<std::sync::Arc<str>>,
}

/// Establishes who the request is, when anything needs it: the route's
/// limits or header edits, a required identity, or API keys (whose
/// consumer goes upstream). Refuses it with 429 when its client is over its
/// API-key failures, with 401 when an identity is required and missing or
/// invalid.
async fn identify<'v, 'r>(
    state: &GatewayState,
    route: &'r CompiledRoute,
    view: &RequestView<'v>,
    report: &mut LimitReport,
) -> Result<Who<'v>, Rejection<'r>> {
    let api_keys = state.identity.api_keys().is_some();
    let needed = state.identity.required() || api_keys || route.keeps_user;
    if !needed && route.limits.is_empty() {
        return Ok(Who::default());
    }
    let trusted = state.client_ip.is_trusted(view.peer);
    let method = deciding_method(state, view, trusted);
    report.identity = method.map(Identity::name);
    let (established, service_failed) = establish(state, method, view, trusted, report).await?;
    // Who must be known: the deciding method's rule, or (no credential at
    // all) whether any method requires one.
    let required = method.map_or(state.identity.required(), Identity::required);
    let method_name = method.map_or("none", Identity::name);
    state
        .identity_decisions
        .count(method_name, &established.user);
    // A failed store or auth service never lets a request in as anonymous
    // where an identity is required.
    let store_refuses = established.store_failed && (required || fails_closed(state));
    if store_refuses || (service_failed && required) {
        return Err(Rejection::Unavailable { route: &route.name });
    }
    let known = matches!(established.user, User::Known(_));
    let by_api_key = matches!(method, Some(Identity::ApiKey(_)));
    if by_api_key && (known || established.unknown_key) {
        let client = client_ip(state, view.head, view.peer);
        report.client = Some(client);
        let unknown = established.unknown_key;
        if let Some(retry_after) = key_failures::over_limit(state, client, unknown).await {
            return Err(Rejection::TooMany {
                status: state.config.response.status,
                route: &route.name,
                limit: key_failures::LIMIT_NAME,
                retry_after,
                headers: Vec::new(),
            });
        }
    }
    let user = match established.user {
        User::Known(user) => Some(user),
        User::Invalid(_) | User::Absent if required => return Err(Rejection::Unauthorized),
        User::Invalid(reason) => {
            log::debug!("identity ignored: {reason}");
            None
        }
        User::Absent => None,
    };
    if route.keeps_user || api_keys {
        report.user = user.as_deref().map(<[u8]>::to_vec);
    }
    Ok(Who {
        user,
        claims: established.claims,
        plan: established.plan,
    })
}

/// The API key a request sends, where `keys` reads it.
fn sent_key<'v>(keys: &ApiKeys, head: &'v RequestHeader) -> PartValue<'v> {
    match &keys.source {
        KeySource::Header(name) => header_values(head, name).into(),
        KeySource::Query(name) => query_value(head.uri.query().unwrap_or("").as_bytes(), name),
    }
}

/// The identity method whose credential the request carries first (a
/// header identity counts only from a trusted proxy), if any.
fn deciding_method<'s>(
    state: &'s GatewayState,
    view: &RequestView<'_>,
    trusted: bool,
) -> Option<&'s Identity> {
    let head = view.head;
    let sent = |name: &str| !header_values(head, name).is_absent();
    state.identity.deciding(|method| match method {
        Identity::Header(name) => trusted && sent(name),
        Identity::Jwt(_) => method.token_header().is_some_and(sent),
        Identity::ApiKey(keys) => !matches!(sent_key(keys, head), PartValue::Missing),
        Identity::ClientCert { .. } => view.client_cert.is_some(),
        Identity::AuthRequest(service) => service.headers().iter().any(|name| sent(name)),
        _ => false,
    })
}

/// Who the request is by `method`, and whether an auth service failed to
/// say; an auth service's refusal is the answer.
async fn establish<'v, 'r>(
    state: &GatewayState,
    method: Option<&Identity>,
    view: &RequestView<'v>,
    trusted: bool,
    report: &mut LimitReport,
) -> Result<(Established<'v>, bool), Rejection<'r>> {
    let head = view.head;
    Ok(match (method, view.client_cert) {
        (Some(Identity::ApiKey(keys)), _) => {
            let established = keys
                .establish_remote(sent_key(keys, head), &state.decider)
                .await;
            (established, false)
        }
        (Some(Identity::ClientCert { from, .. }), Some(cert)) => (
            Established::user(Identity::certificate_user(*from, cert)),
            false,
        ),
        (Some(Identity::AuthRequest(service)), _) => {
            return ask_auth_service(state, service, head, report).await;
        }
        (Some(method), _) => (
            method.establish(|name| header_values(head, name), trusted),
            false,
        ),
        (None, _) => (Established::user(User::Absent), false),
    })
}

/// Asks the auth service about the request: who it is, or the service's
/// refusal as the answer; `true` with an unknown user when it failed.
async fn ask_auth_service<'v, 'r>(
    state: &GatewayState,
    service: &AuthService,
    head: &RequestHeader,
    report: &mut LimitReport,
) -> Result<(Established<'v>, bool), Rejection<'r>> {
    // A credential header sent twice is never believed: the service would
    // vouch for one value while the upstream might read the other.
    let twice = service
        .headers()
        .iter()
        .any(|name| matches!(header_values(head, name), HeaderValues::Several));
    if twice {
        let user = User::Invalid("a credential header sent more than once");
        return Ok((Established::user(user), false));
    }
    let sent: Vec<Option<&[u8]>> = service
        .headers()
        .iter()
        .map(|name| head.headers.get(name.as_str()).map(|v| v.as_bytes()))
        .collect();
    let target = head.uri.path_and_query().map_or("/", |t| t.as_str());
    let start = Instant::now();
    let answer = service.ask(head.method.as_str(), target, &sent).await;
    let result = match &answer {
        AuthAnswer::Known { .. } => "ok",
        AuthAnswer::Refused { .. } => "denied",
        AuthAnswer::Failed(_) => "failed",
    };
    let end = Instant::now();
    report.auth = Some(AuthSpan { start, end, result });
    match answer {
        AuthAnswer::Known { user, plan } => {
            let user = match user {
                Some(user) => User::Known(Cow::Owned(user.as_bytes().to_vec())),
                None => User::Invalid("the auth service named no user"),
            };
            Ok((
                Established {
                    plan,
                    ..Established::user(user)
                },
                false,
            ))
        }
        AuthAnswer::Refused {
            status,
            body,
            www_authenticate,
            content_type,
        } => {
            let headers = [
                ("content-type", content_type),
                ("www-authenticate", www_authenticate),
            ]
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?)))
            .collect();
            state
                .identity_decisions
                .count("auth_request", &User::Invalid("refused"));
            Err(Rejection::AuthRefused {
                status,
                body,
                headers,
            })
        }
        AuthAnswer::Failed(why) => Ok((Established::user(User::Invalid(why)), true)),
    }
}

/// The counter keys of the route's limits for this request, as (limit
/// index, key). Limits whose key part is missing with `on_missing: skip`
/// are left out, and so are those `exempt` says do not count this request
/// (counted as exempt). A key part the request carries twice with different values
/// fails the request (a 400): counting it under either value could let the
/// client choose its counter.
fn limit_keys(
    state: &GatewayState,
    route: &CompiledRoute,
    view: &RequestView<'_>,
    client: IpAddr,
    user: Option<&[u8]>,
    exempt: &dyn Fn(&CompiledLimit) -> bool,
    plan: &dyn Fn(&PlanSource) -> Option<String>,
) -> Result<Vec<Keyed>, AmbiguousPart> {
    with_request_parts(state, route, view, client, user, |parts| {
        keys_of(state, route, parts, exempt, plan)
    })
}

/// Runs `f` on the values `view` offers for key parts (for `client` and
/// `user`), as limits and consistent hashing read them.
pub fn with_request_parts<R>(
    state: &GatewayState,
    route: &CompiledRoute,
    view: &RequestView<'_>,
    client: IpAddr,
    user: Option<&[u8]>,
    f: impl FnOnce(&RequestParts<'_>) -> R,
) -> R {
    let ip_text = state.client_ip.key_text(client);
    let header = |name: &str| view.head.headers.get(name).map(|v| v.as_bytes());
    let cookie = |name: &str| {
        let headers = view.head.headers.get_all(http::header::COOKIE).iter();
        cookie_value(headers.map(|v| v.as_bytes()), name)
    };
    let param = |name: &str| route.template.as_ref()?.param(view.path, name);
    let parts = RequestParts {
        ip: &ip_text,
        user,
        method: view.head.method.as_str(),
        path: view.path.as_bytes(),
        header: &header,
        query: view.head.uri.query().unwrap_or("").as_bytes(),
        cookie: &cookie,
        param: &param,
        client_cert: view.client_cert,
    };
    f(&parts)
}

/// The keys of the route's limits for a request's `parts` (see
/// [`limit_keys`]).
fn keys_of(
    state: &GatewayState,
    route: &CompiledRoute,
    parts: &RequestParts<'_>,
    exempt: &dyn Fn(&CompiledLimit) -> bool,
    plan: &dyn Fn(&PlanSource) -> Option<String>,
) -> Result<Vec<Keyed>, AmbiguousPart> {
    let prefix = &state.config.limiter.redis.key_prefix;
    let key_of = |(i, limit): (usize, &CompiledLimit)| {
        if exempt(limit) {
            limit.counters.inc_exempt();
            return None;
        }
        let c = &limit.config;
        let (scope, name) = counter_name(route, c);
        let on_missing_ip = c.on_missing == OnMissing::Ip;
        build_key(prefix, scope, name, &c.key, parts, on_missing_ip)
            .map(|key| {
                key.map(|key| Keyed {
                    index: i,
                    key,
                    applied: applied_limit(c, parts, plan),
                })
            })
            .transpose()
    };
    route.limits.iter().enumerate().filter_map(key_of).collect()
}

/// The limit that applies to a request: the first override whose key
/// values it carries, else its plan's (when it names a listed plan), else
/// the configured one.
pub fn applied_limit(
    c: &LimitConfig,
    parts: &RequestParts<'_>,
    plan: &dyn Fn(&PlanSource) -> Option<String>,
) -> u64 {
    let carries = |(part, want): &(KeyPart, String)| matches!(part_value(part, parts), PartValue::One(got) if got.as_ref() == want.as_bytes());
    if let Some(o) = c.overrides.iter().find(|o| o.parts.iter().all(carries)) {
        return o.limit;
    }
    let named = c.limit_from.as_ref().and_then(plan);
    named
        .and_then(|name| c.plans.iter().find(|(plan, _)| *plan == name))
        .map_or(c.limit, |(_, limit)| *limit)
}

/// The limiter's view of the keyed limits.
fn checks<'k>(route: &CompiledRoute, keys: &'k [Keyed]) -> Vec<LimitCheck<'k>> {
    keys.iter()
        .map(|k| limit_check(&route.limits[k.index].config, &k.key, k.applied))
        .collect()
}

/// The names a limit's counter key is built from: its route and its own, or,
/// for a shared counter, its share under the route name `*` (which no route
/// can have).
pub fn counter_name<'a>(route: &'a CompiledRoute, c: &'a LimitConfig) -> (&'a str, &'a str) {
    match &c.share {
        Some(share) => ("*", share.as_str()),
        None => (route.name.as_str(), c.name.as_str()),
    }
}

/// The limiter's view of limit `c` on `key` when `applied` is its number.
pub fn limit_check<'k>(c: &LimitConfig, key: &'k str, applied: u64) -> LimitCheck<'k> {
    // A burst equal to the limit (its default) follows the plan.
    let mut window = c.window;
    let algorithm = match c.algorithm {
        Algorithm::TokenBucket { burst } if burst == c.limit => {
            Algorithm::TokenBucket { burst: applied }
        }
        // A calendar quota carries the periods around now, by this clock;
        // Redis's clock picks among them.
        Algorithm::Calendar { period, .. } => match &c.calendar {
            Some(calendar) => {
                let bounds = calendar.bounds_at(unix_now_us());
                window = Duration::from_micros((bounds.end_us - bounds.start_us).max(1) as u64);
                Algorithm::Calendar { period, bounds }
            }
            None => c.algorithm,
        },
        other => other,
    };
    LimitCheck {
        key,
        limit: applied,
        window,
        cost: c.cost,
        algorithm,
        shadow: c.shadow,
        block: c.block_for,
        deferred: c.deferred(),
        max_delay: c.max_delay,
    }
}

/// The gateway's clock, in microseconds since the Unix epoch.
fn unix_now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Counts the decision in `sluice_ratelimit_decisions_total`.
fn count_decisions(route: &CompiledRoute, keys: &[Keyed], outcome: &Outcome) {
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
        return;
    }
    for (k, decision) in keys.iter().zip(&outcome.decisions) {
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
            let parts = parts_of(&k.key, counter_name(route, &limit.config));
            limit.denied.record(parts, Instant::now());
        }
    }
}

/// The enforced limits' decisions, most restrictive first.
fn rate_entries(route: &CompiledRoute, keys: &[Keyed], decisions: &[Decision]) -> Vec<RateEntry> {
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
fn verdict(route: &CompiledRoute, keys: &[Keyed], outcome: &Outcome) -> Verdict {
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

/// What an admitted request holds until it ends: its concurrency leases,
/// its deferred limits, and, when a limit delays it, the wait, the limits
/// that reserved units for it and its places among the waiters
/// (`permits`, by index in `keys`).
fn held_leases(
    state: &GatewayState,
    route: &CompiledRoute,
    keys: Vec<Keyed>,
    outcome: Outcome,
    mut permits: Vec<(usize, WaitPermit)>,
) -> Option<HeldLeases> {
    let is_lease = |i: usize| {
        matches!(
            route.limits[i].config.algorithm,
            Algorithm::Concurrency { .. }
        )
    };
    let mut held = Vec::new();
    let mut deferred = Vec::new();
    let mut delayed = Vec::new();
    let mut delay = Duration::ZERO;
    let mut waiting = Vec::new();
    for (i, (k, d)) in keys.into_iter().zip(&outcome.decisions).enumerate() {
        if !d.delay().is_zero() {
            delay = delay.max(d.delay());
            if let Some(at) = permits.iter().position(|(p, _)| *p == i) {
                waiting.push(permits.swap_remove(at).1);
            }
            delayed.push(k);
        } else if d.allowed && is_lease(k.index) {
            held.push(k);
        } else if route.limits[k.index].config.deferred() {
            deferred.push(k);
        }
    }
    if held.is_empty() && deferred.is_empty() && delayed.is_empty() {
        return None;
    }
    let renewing = state.decider.hold(&checks(route, &held), &outcome);
    Some(HeldLeases {
        keys: held,
        deferred,
        outcome,
        delay,
        delayed,
        permits: waiting,
        renewing,
    })
}

#[cfg(test)]
mod tests;
