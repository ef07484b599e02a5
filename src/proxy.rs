//! The Pingora `ProxyHttp` implementation — glue only (DESIGN §1).
//!
//! `request_filter` matches the route, builds the limit keys, asks the
//! [`Decider`] and either lets the request through or answers it (404, 429,
//! 503, or a `respond:` route). `response_filter` adds the rate-limit headers
//! to proxied responses; `logging` releases concurrency leases, counts every
//! request and writes its access-log line.
//!
//! Each request works on the [`GatewayState`] that was current when it
//! started (taken in `new_ctx`), so a reload never changes a request in flight.

use crate::access_log::AccessLogLine;
use crate::config::{Algorithm, HeaderStyle, OnMissing, RouteAction};
use crate::identity::User;
use crate::keys::{build_key, RequestParts};
use crate::limiter::{Decision, LimitCheck, Outcome, Source};
use crate::metrics::{DecisionLabel, Metrics};
use crate::state::{CompiledRoute, GatewayState, SharedState};
use async_trait::async_trait;
use bytes::Bytes;
use http::{header, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::{HttpPeer, Result};
use pingora::proxy::{ProxyHttp, Session};
use pingora::{Error, ErrorType};
use prometheus::Histogram;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The gateway: the swappable [`GatewayState`] plus the process-wide metrics.
pub struct Gateway {
    state: SharedState,
    metrics: Arc<Metrics>,
    unmatched_duration: Histogram,
}

/// Per-request state shared between the filters.
pub struct RequestCtx {
    /// The configuration this request is served with, from start to end.
    state: Arc<GatewayState>,
    route: Option<usize>,
    started: Instant,
    /// (limit index, decision) of the enforced limits that applied, most
    /// restrictive (least remaining) first: what the headers report.
    rate: Vec<(usize, Decision)>,
    /// Concurrency leases to release when the response ends.
    leases: Option<HeldLeases>,
    /// What the limiter decided, for the access log.
    verdict: Option<Verdict>,
    /// The client IP, once known.
    client: Option<IpAddr>,
    /// The upstream server chosen.
    upstream_addr: Option<String>,
}

/// The limiter's decision on a request, as the access log reports it.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    label: DecisionLabel,
    /// The limit that denied (or would have, for shadow), by index.
    limit: Option<usize>,
    /// For a denial, how long until the denying limit would admit it.
    retry_after: Duration,
    source: Source,
}

/// The concurrency leases an admitted request holds.
struct HeldLeases {
    keys: Vec<(usize, String)>,
    outcome: Outcome,
}

/// Why keys could not be built for a request.
enum KeyError {
    /// `identity.jwt.required` and no valid token.
    Unauthorized,
}

impl Gateway {
    /// A gateway serving whatever state `state` holds when each request starts.
    pub fn new(state: SharedState, metrics: Arc<Metrics>) -> Self {
        Self {
            unmatched_duration: metrics.request_duration.with_label_values(&["_unmatched"]),
            state,
            metrics,
        }
    }

    /// Builds the counter keys of the route's limits for this request, as
    /// (limit index, key). Limits whose key part is missing with
    /// `on_missing: skip` are left out.
    fn limit_keys(
        state: &GatewayState,
        route: &CompiledRoute,
        session: &Session,
        client: IpAddr,
    ) -> std::result::Result<Vec<(usize, String)>, KeyError> {
        let req = session.req_header();
        let ip_text = state.client_ip.key_text(client);
        let header = |name: &str| req.headers.get(name).map(|v| v.as_bytes());
        let user = state
            .identity
            .user(header, state.client_ip.is_trusted(peer_ip(session)));
        let user = match user {
            User::Known(user) => Some(user),
            User::Invalid(_) | User::Absent if state.identity.required() => {
                return Err(KeyError::Unauthorized)
            }
            User::Invalid(reason) => {
                log::debug!("identity ignored: {reason}");
                None
            }
            User::Absent => None,
        };
        let parts = RequestParts {
            ip: &ip_text,
            user: user.as_deref(),
            method: req.method.as_str(),
            path: req.uri.path().as_bytes(),
            header: &header,
        };
        Ok(route
            .limits
            .iter()
            .enumerate()
            .filter_map(|(i, limit)| {
                let c = &limit.config;
                // A shared counter is named by its share, under the route
                // name `*`, which no route can have.
                let (scope, name) = match &c.share {
                    Some(share) => ("*", share.as_str()),
                    None => (route.name.as_str(), c.name.as_str()),
                };
                build_key(
                    &state.config.limiter.redis.key_prefix,
                    scope,
                    name,
                    &c.key,
                    &parts,
                    c.on_missing == OnMissing::Ip,
                )
                .map(|key| (i, key))
            })
            .collect())
    }

    fn checks<'k>(route: &CompiledRoute, keys: &'k [(usize, String)]) -> Vec<LimitCheck<'k>> {
        keys.iter()
            .map(|(i, key)| {
                let c = &route.limits[*i].config;
                LimitCheck {
                    key,
                    limit: c.limit,
                    window: c.window,
                    cost: c.cost,
                    algorithm: c.algorithm,
                    shadow: c.shadow,
                }
            })
            .collect()
    }

    fn count_decisions(route: &CompiledRoute, keys: &[(usize, String)], outcome: &Outcome) {
        let admitted = outcome.admitted;
        match outcome.source {
            Source::Redis | Source::DenyCache | Source::Local => {
                for ((i, _), decision) in keys.iter().zip(&outcome.decisions) {
                    let limit = &route.limits[*i];
                    // A denied request is counted against the limits that denied it;
                    // the others neither admitted it nor consumed anything. A shadow
                    // limit that would deny counts shadow_deny, whatever the others did.
                    let label = match (limit.config.shadow, decision.allowed, admitted) {
                        (true, false, _) => DecisionLabel::ShadowDeny,
                        (_, _, true) => DecisionLabel::Allow,
                        (false, false, false) => DecisionLabel::Deny,
                        (_, true, false) => continue,
                    };
                    limit.counters.inc(label, outcome.source);
                }
            }
            Source::FailOpen | Source::FailClosed => {
                let label = if admitted {
                    DecisionLabel::Allow
                } else {
                    DecisionLabel::Deny
                };
                for (i, _) in keys {
                    route.limits[*i].counters.inc(label, outcome.source);
                }
            }
        }
    }

    /// The enforced limits' decisions, most restrictive first.
    fn rate_entries(
        route: &CompiledRoute,
        keys: &[(usize, String)],
        decisions: &[Decision],
    ) -> Vec<(usize, Decision)> {
        let mut entries: Vec<(usize, Decision)> = keys
            .iter()
            .zip(decisions)
            .filter(|((i, _), _)| !route.limits[*i].config.shadow)
            .map(|((i, _), d)| (*i, *d))
            .collect();
        entries.sort_by_key(|(_, d)| d.remaining);
        entries
    }

    /// The configured rate-limit headers (DESIGN §6) for `entries`.
    fn rate_headers(
        state: &GatewayState,
        route: Option<&CompiledRoute>,
        entries: &[(usize, Decision)],
    ) -> Vec<(&'static str, HeaderValue)> {
        let style = state.config.response.headers;
        let (Some(route), Some((first, most))) = (route, entries.first()) else {
            return Vec::new();
        };
        let mut headers = Vec::new();
        if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
            // Numbers straight into header values: no String, no validation.
            headers.push((
                "x-ratelimit-limit",
                HeaderValue::from(route.limits[*first].config.limit),
            ));
            headers.push(("x-ratelimit-remaining", HeaderValue::from(most.remaining)));
            headers.push((
                "x-ratelimit-reset",
                HeaderValue::from(ceil_secs(most.reset)),
            ));
        }
        if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
            let mut policy = String::new();
            let mut state = String::new();
            for (n, (i, d)) in entries.iter().enumerate() {
                let c = &route.limits[*i].config;
                if n > 0 {
                    policy.push_str(", ");
                    state.push_str(", ");
                }
                // Names are [a-z0-9_-]+: valid inside an sf-string as they are.
                policy.push_str(&format!("\"{}\";q={}", c.name, c.limit));
                if !matches!(c.algorithm, Algorithm::Concurrency { .. }) {
                    policy.push_str(&format!(";w={}", ceil_secs(c.window).max(1)));
                }
                let t = if d.allowed {
                    d.reset
                } else {
                    d.retry_after.max(d.reset)
                };
                state.push_str(&format!(
                    "\"{}\";r={};t={}",
                    c.name,
                    d.remaining,
                    ceil_secs(t)
                ));
            }
            // Names are [a-z0-9_-]+ and the rest digits: always a valid value.
            for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
                if let Ok(value) = HeaderValue::try_from(value) {
                    headers.push((name, value));
                }
            }
        }
        headers
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_micros().div_ceil(1_000_000) as u64
}

async fn respond(
    session: &mut Session,
    status: u16,
    content_type: &str,
    headers: &[(&'static str, HeaderValue)],
    body: Bytes,
) -> Result<()> {
    let mut response = ResponseHeader::build(status, Some(headers.len() + 2))?;
    response.insert_header(header::CONTENT_TYPE, content_type)?;
    response.insert_header(header::CONTENT_LENGTH, body.len())?;
    for (name, value) in headers {
        response.insert_header(*name, value.clone())?;
    }
    // A body the client sent but we did not read would be taken for the next
    // request on this connection: close it instead.
    if !session.is_body_empty() {
        session.set_keepalive(None);
    }
    let head_only = session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(response), head_only)
        .await?;
    if !head_only {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}

const JSON: &str = "application/json";

/// The socket peer's IP (loopback if the connection is not over IP).
fn peer_ip(session: &Session) -> IpAddr {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The client IP per `client_ip` (trusted proxies' X-Forwarded-For).
fn client_ip(state: &GatewayState, session: &Session) -> IpAddr {
    let forwarded = session.req_header().headers.get_all("x-forwarded-for");
    state
        .client_ip
        .client_ip(peer_ip(session), forwarded.iter().map(|v| v.as_bytes()))
}

/// What the access log says the limiter decided.
fn verdict(route: &CompiledRoute, keys: &[(usize, String)], outcome: &Outcome) -> Verdict {
    let decisions = keys.iter().zip(&outcome.decisions);
    let (label, limit, retry_after) = if !outcome.admitted {
        // The enforced limit that denies longest names the denial.
        match decisions
            .filter(|((i, _), d)| !d.allowed && !route.limits[*i].config.shadow)
            .max_by_key(|(_, d)| d.retry_after)
        {
            Some(((i, _), d)) => (DecisionLabel::Deny, Some(*i), d.retry_after),
            None => (DecisionLabel::Deny, None, Duration::ZERO),
        }
    } else {
        match decisions
            .filter(|((i, _), d)| !d.allowed && route.limits[*i].config.shadow)
            .map(|((i, _), _)| *i)
            .next()
        {
            Some(shadow) => (DecisionLabel::ShadowDeny, Some(shadow), Duration::ZERO),
            None => (DecisionLabel::Allow, None, Duration::ZERO),
        }
    };
    Verdict {
        label,
        limit,
        retry_after,
        source: outcome.source,
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    /// No downstream modules. Pingora's default adds a response-compression
    /// module at level 0 (disabled), which still costs every request a module
    /// context and a pass over its headers; sluice passes bodies through.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            state: self.state.load_full(),
            route: None,
            started: Instant::now(),
            rate: Vec::new(),
            leases: None,
            verdict: None,
            client: None,
            upstream_addr: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let state = Arc::clone(&ctx.state);
        let found = {
            let req = session.req_header();
            let host = req
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| req.uri.host());
            state.routes.find(req.method.as_str(), host, req.uri.path())
        };
        let Some(index) = found else {
            respond(
                session,
                404,
                JSON,
                &[],
                Bytes::from_static(br#"{"error":"not_found"}"#),
            )
            .await?;
            return Ok(true);
        };
        ctx.route = Some(index);
        let route = &state.compiled[index];

        if !route.limits.is_empty() {
            let client = client_ip(&state, session);
            ctx.client = Some(client);
            let keys = match Self::limit_keys(&state, route, session, client) {
                Ok(keys) => keys,
                Err(KeyError::Unauthorized) => {
                    respond(
                        session,
                        401,
                        JSON,
                        &[(
                            "www-authenticate",
                            HeaderValue::from_static(r#"Bearer error="invalid_token""#),
                        )],
                        Bytes::from_static(br#"{"error":"unauthorized"}"#),
                    )
                    .await?;
                    return Ok(true);
                }
            };
            if !keys.is_empty() {
                let checks = Self::checks(route, &keys);
                let outcome = state.decider.decide(&checks).await;
                Self::count_decisions(route, &keys, &outcome);
                ctx.rate = Self::rate_entries(route, &keys, &outcome.decisions);
                let verdict = verdict(route, &keys, &outcome);
                ctx.verdict = Some(verdict);

                if outcome.source == Source::FailClosed {
                    let body = format!(
                        r#"{{"error":"rate_limiter_unavailable","route":"{}"}}"#,
                        route.name
                    );
                    respond(
                        session,
                        503,
                        JSON,
                        &[("retry-after", HeaderValue::from_static("1"))],
                        body.into(),
                    )
                    .await?;
                    return Ok(true);
                }
                if !outcome.admitted {
                    let denying = verdict
                        .limit
                        .map(|i| route.limits[i].config.name.as_str())
                        .unwrap_or("");
                    let retry_after = ceil_secs(verdict.retry_after).max(1);
                    let mut headers = vec![("retry-after", HeaderValue::from(retry_after))];
                    headers.extend(Self::rate_headers(&state, Some(route), &ctx.rate));
                    let body = format!(
                        r#"{{"error":"too_many_requests","route":"{}","limit":"{denying}","retry_after_seconds":{retry_after}}}"#,
                        route.name
                    );
                    respond(
                        session,
                        state.config.response.status,
                        JSON,
                        &headers,
                        body.into(),
                    )
                    .await?;
                    return Ok(true);
                }
                let held: Vec<(usize, String)> = keys
                    .iter()
                    .zip(&outcome.decisions)
                    .filter(|((i, _), d)| {
                        d.allowed
                            && matches!(
                                route.limits[*i].config.algorithm,
                                Algorithm::Concurrency { .. }
                            )
                    })
                    .map(|((i, key), _)| (*i, key.clone()))
                    .collect();
                if !held.is_empty() {
                    ctx.leases = Some(HeldLeases {
                        keys: held,
                        outcome,
                    });
                }
            }
        }

        if let RouteAction::Respond { status, body } = &route.action {
            let headers = Self::rate_headers(&state, Some(route), &ctx.rate);
            let body = Bytes::copy_from_slice(body.as_bytes());
            respond(
                session,
                *status,
                "text/plain; charset=utf-8",
                &headers,
                body,
            )
            .await?;
            return Ok(true);
        }
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let upstream = match ctx.route.map(|i| &ctx.state.compiled[i].action) {
            Some(RouteAction::Upstream(u)) => &ctx.state.upstreams[*u],
            _ => {
                return Err(Error::explain(
                    ErrorType::InternalError,
                    "route has no upstream",
                ))
            }
        };
        let backend = upstream.balancer.select(b"", 256).ok_or_else(|| {
            Error::explain(
                ErrorType::HTTPStatus(502),
                format!("no healthy server in upstream `{}`", upstream.name()),
            )
        })?;
        if ctx.state.config.server.access_log {
            ctx.upstream_addr = Some(backend.addr.to_string());
        }
        let mut peer = HttpPeer::new(backend, false, String::new());
        peer.options.connection_timeout = Some(upstream.connect_timeout());
        peer.options.read_timeout = Some(upstream.read_timeout());
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        // Append the socket peer to X-Forwarded-For, as Envoy and most proxies do.
        if let Some(peer) = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip())
        {
            use std::io::Write as _;
            let mut value = Vec::with_capacity(48);
            for existing in upstream_request.headers.get_all("x-forwarded-for") {
                value.extend_from_slice(existing.as_bytes());
                value.extend_from_slice(b", ");
            }
            let _ = write!(value, "{peer}");
            upstream_request.insert_header("x-forwarded-for", value)?;
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let route = ctx.route.map(|i| &ctx.state.compiled[i]);
        for (name, value) in Self::rate_headers(&ctx.state, route, &ctx.rate) {
            upstream_response.insert_header(name, value)?;
        }
        Ok(())
    }

    async fn logging(
        &self,
        session: &mut Session,
        _e: Option<&pingora::Error>,
        ctx: &mut RequestCtx,
    ) {
        let leases = ctx.leases.take();
        let state = &ctx.state;
        let route = ctx.route.map(|i| &state.compiled[i]);
        if let (Some(held), Some(route)) = (leases, route) {
            let checks = Self::checks(route, &held.keys);
            state.decider.release(&checks, &held.outcome).await;
        }
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .unwrap_or(0);
        let code = http::StatusCode::from_u16(status).ok();
        let status_label = code.as_ref().map(|c| c.as_str()).unwrap_or("0");
        let (route_name, duration) = match route {
            Some(route) => (route.name.as_str(), &route.duration),
            None => ("_unmatched", &self.unmatched_duration),
        };
        let elapsed = ctx.started.elapsed();
        self.metrics
            .requests
            .with_label_values(&[route_name, status_label])
            .inc();
        duration.observe(elapsed.as_secs_f64());

        if state.config.server.access_log {
            let upstream = match route.map(|r| &r.action) {
                Some(RouteAction::Upstream(u)) if ctx.upstream_addr.is_some() => {
                    Some(state.upstreams[*u].name())
                }
                _ => None,
            };
            let req = session.req_header();
            let verdict = ctx.verdict;
            AccessLogLine {
                time: AccessLogLine::now(),
                route: route_name,
                method: req.method.as_str(),
                path: req.uri.path(),
                status,
                upstream,
                upstream_addr: ctx.upstream_addr.as_deref(),
                duration_ms: elapsed.as_secs_f64() * 1000.0,
                decision: verdict.map(|v| v.label.name()),
                limit: verdict
                    .and_then(|v| v.limit)
                    .zip(route)
                    .map(|(i, r)| r.limits[i].config.name.as_str()),
                source: verdict.map(|v| v.source.label()),
                client: ctx.client.unwrap_or_else(|| client_ip(state, session)),
            }
            .write();
        }
    }
}
