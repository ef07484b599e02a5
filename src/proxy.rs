//! The Pingora `ProxyHttp` implementation — glue only (docs/architecture.md).
//!
//! `request_filter` matches the route, builds the limit keys, asks the
//! [`Decider`] and either lets the request through or answers it (404, 429,
//! 503, or a `respond:` route). `response_filter` adds the rate-limit headers
//! to proxied responses; `logging` releases concurrency leases, counts every
//! request and writes its access-log line.
//!
//! Each request works on the [`GatewayState`] that was current when it
//! started (taken in `new_ctx`), so a reload never changes a request in flight.

use crate::access_log::{AccessLog, AccessLogLine};
use crate::config::EscapedSlashes;
use crate::config::{Algorithm, OnMissing, RouteAction};
use crate::front_door::GuardedStream;
use crate::headers::{self, ceil_secs};
use crate::identity::{HeaderValues, User};
use crate::keys::{build_key, RequestParts};
use crate::limiter::{Decision, LimitCheck, Outcome, Source};
use crate::metrics::{DecisionLabel, Metrics};
use crate::state::{CompiledRoute, GatewayState, SharedState};
use crate::target::{canonical_host, canonical_target, TargetError};
use async_trait::async_trait;
use bytes::Bytes;
use http::{header, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::{HttpPeer, Result};
use pingora::proxy::{ProxyHttp, Session};
use pingora::{Error, ErrorType};
use prometheus::Histogram;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The gateway: the swappable [`GatewayState`] plus the process-wide metrics.
pub struct Gateway {
    state: SharedState,
    metrics: Arc<Metrics>,
    access_log: AccessLog,
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
    /// The canonical path, when it is not the path as received (which is
    /// then canonical already): what routes, keys and the upstream see. See
    /// [`request_path`].
    path: Option<String>,
    /// The origin-form target to send upstream instead of the one received
    /// (it was not canonical, or was in absolute-form).
    upstream_target: Option<Vec<u8>>,
    /// The Host to send upstream for an absolute-form request without one.
    upstream_host: Option<Vec<u8>>,
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

impl Gateway {
    /// A gateway serving whatever state `state` holds when each request
    /// starts, writing its access log through `access_log`.
    pub fn new(state: SharedState, metrics: Arc<Metrics>, access_log: AccessLog) -> Self {
        Self {
            access_log,
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
        user: Option<&[u8]>,
        path: &str,
    ) -> Vec<(usize, String)> {
        let req = session.req_header();
        let ip_text = state.client_ip.key_text(client);
        let header = |name: &str| req.headers.get(name).map(|v| v.as_bytes());
        let parts = RequestParts {
            ip: &ip_text,
            user,
            method: req.method.as_str(),
            path: path.as_bytes(),
            header: &header,
        };
        route
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
            .collect()
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

    /// The configured rate-limit headers for `entries` (see [`headers`]).
    fn rate_headers(
        state: &GatewayState,
        route: Option<&CompiledRoute>,
        entries: &[(usize, Decision)],
    ) -> Vec<(&'static str, HeaderValue)> {
        let Some(route) = route else {
            return Vec::new();
        };
        let entries = entries.iter().map(|(i, d)| (&route.limits[*i].config, d));
        headers::rate_headers(state.config.response.headers, entries)
    }
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

/// Removes an `Upgrade` other than WebSocket (`h2c`, `TLS/1.0`, …) and the
/// `Connection` tokens that go with it, so the request is an ordinary one:
/// only WebSocket is tunnelled, whose handshake the limits have counted.
fn drop_foreign_upgrade(req: &mut RequestHeader) {
    let Some(upgrade) = req.headers.get(header::UPGRADE) else {
        return;
    };
    let several = req.headers.get_all(header::UPGRADE).iter().count() > 1;
    if !several && upgrade.as_bytes().eq_ignore_ascii_case(b"websocket") {
        return;
    }
    req.remove_header(&header::UPGRADE);
    req.remove_header("http2-settings");
    let kept: Vec<String> = req
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case("upgrade")
                && !t.eq_ignore_ascii_case("http2-settings")
        })
        .map(str::to_string)
        .collect();
    req.remove_header(&header::CONNECTION);
    if !kept.is_empty() {
        let _ = req.insert_header(header::CONNECTION, kept.join(", "));
    }
}

/// The values of header `name`, as the identity sees them.
fn header_values<'a>(req: &'a RequestHeader, name: &str) -> HeaderValues<'a> {
    let mut values = req.headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => HeaderValues::Absent,
        (Some(one), None) => HeaderValues::One(one.as_bytes()),
        (Some(_), Some(_)) => HeaderValues::Several,
    }
}

/// The request's identity: `Err(())` when one is required and missing or
/// invalid (answer 401).
fn request_user<'a>(
    state: &GatewayState,
    session: &'a Session,
) -> std::result::Result<Option<std::borrow::Cow<'a, [u8]>>, ()> {
    let req = session.req_header();
    let trusted = state.client_ip.is_trusted(peer_ip(session));
    match state
        .identity
        .user(|name| header_values(req, name), trusted)
    {
        User::Known(user) => Ok(Some(user)),
        User::Invalid(_) | User::Absent if state.identity.required() => Err(()),
        User::Invalid(reason) => {
            log::debug!("identity ignored: {reason}");
            Ok(None)
        }
        User::Absent => Ok(None),
    }
}

/// What the gateway works with instead of the target as received: the
/// canonical path and host, and what to send upstream instead.
struct CanonicalRequest<'a> {
    /// Set when it differs from the path as received.
    rewritten_path: Option<String>,
    path: Cow<'a, str>,
    host: Option<Cow<'a, str>>,
    upstream_target: Option<Vec<u8>>,
    upstream_host: Option<Vec<u8>>,
}

/// Makes the request's target and host canonical, or says why it cannot be
/// (answer 400).
fn canonical_request(
    req: &RequestHeader,
    slashes: EscapedSlashes,
) -> std::result::Result<CanonicalRequest<'_>, TargetError> {
    let target = canonical_target(req.raw_path(), slashes)?;
    let mut hosts = req.headers.get_all(header::HOST).iter();
    let first_host = hosts.next();
    let host_header = match (first_host, hosts.next()) {
        (_, Some(_)) => return Err(TargetError::HostMismatch),
        (Some(value), None) => Some(canonical_host(value.as_bytes())?),
        (None, None) => None,
    };
    let authority = match target.authority {
        Some(authority) => Some(canonical_host(authority)?.ok_or(TargetError::Host)?),
        None => None,
    };
    let host = match (host_header, authority) {
        (Some(header), Some(authority)) if header.as_ref() != Some(&authority) => {
            return Err(TargetError::HostMismatch)
        }
        (None, None) if req.version == http::Version::HTTP_11 => {
            return Err(TargetError::HostMismatch)
        }
        (_, Some(authority)) => Some(authority),
        (header, None) => header.flatten(),
    };
    let rewrite = target.authority.is_some() || matches!(target.path, Cow::Owned(_));
    Ok(CanonicalRequest {
        upstream_target: rewrite.then(|| target.origin_form()),
        upstream_host: match (target.authority, first_host) {
            (Some(authority), None) => Some(authority.to_vec()),
            _ => None,
        },
        rewritten_path: rewrite.then(|| target.path.to_string()),
        path: target.path,
        host,
    })
}

/// The request's canonical path: the rewritten one, or the path as received
/// when that was canonical already.
fn request_path<'a>(rewritten: &'a Option<String>, req: &'a RequestHeader) -> &'a str {
    rewritten.as_deref().unwrap_or_else(|| req.uri.path())
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
            path: None,
            upstream_target: None,
            upstream_host: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let state = Arc::clone(&ctx.state);
        // Between two reads of the body (the head is the front door's).
        session.set_read_timeout(Some(state.config.server.front_door.client_body_timeout));
        drop_foreign_upgrade(session.req_header_mut());
        let routed = {
            let req = session.req_header();
            canonical_request(req, state.config.server.front_door.escaped_slashes).map(|c| {
                let found = state
                    .routes
                    .find(req.method.as_str(), c.host.as_deref(), &c.path);
                (found, c.rewritten_path, c.upstream_target, c.upstream_host)
            })
        };
        let found = match routed {
            Ok((found, rewritten_path, upstream_target, upstream_host)) => {
                ctx.path = rewritten_path;
                ctx.upstream_target = upstream_target;
                ctx.upstream_host = upstream_host;
                found
            }
            Err(e) => {
                log::debug!("bad request target: {e}");
                let raw = String::from_utf8_lossy(session.req_header().raw_path());
                ctx.path = Some(raw.into_owned());
                let body = Bytes::from_static(br#"{"error":"bad_request"}"#);
                respond(session, 400, JSON, &[], body).await?;
                return Ok(true);
            }
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

        // Identity is checked on every route when it is required, with or
        // without limits: `required` guards the upstream, not only the keys.
        // Otherwise only limits need it (a token is not verified for nothing).
        let needs_user = state.identity.required() || !route.limits.is_empty();
        let user = match needs_user.then(|| request_user(&state, session)) {
            None => None,
            Some(Ok(user)) => user.map(Cow::into_owned),
            Some(Err(())) => {
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

        if !route.limits.is_empty() {
            let client = client_ip(&state, session);
            ctx.client = Some(client);
            let path = request_path(&ctx.path, session.req_header());
            let keys = Self::limit_keys(&state, route, session, client, user.as_deref(), path);
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
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // The upstream sees the target the gateway routed and keyed on.
        if let Some(target) = ctx.upstream_target.take() {
            upstream_request.set_raw_path(&target)?;
        }
        if let Some(host) = ctx.upstream_host.take() {
            upstream_request.insert_header(header::HOST, host)?;
        }
        // An identity header is the word of a trusted proxy only: the
        // upstream must not take a client's own for it.
        if let Some(name) = ctx.state.identity.trusted_header() {
            if !ctx.state.client_ip.is_trusted(peer_ip(session)) {
                upstream_request.remove_header(name);
            }
        }
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
        error: Option<&pingora::Error>,
        ctx: &mut RequestCtx,
    ) {
        if error.is_some_and(|e| {
            e.etype == ErrorType::ReadTimedout && e.esource == pingora::ErrorSource::Downstream
        }) {
            self.metrics
                .downstream_rejected
                .with_label_values(&["body_timeout"])
                .inc();
        }
        if let Some(stream) = session.stream().and_then(GuardedStream::of) {
            stream.request_done();
        }
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
            let (path, truncated) = AccessLogLine::capped(request_path(&ctx.path, req));
            let line = AccessLogLine {
                time: AccessLogLine::now(),
                route: route_name,
                method: req.method.as_str(),
                path,
                truncated,
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
            };
            self.access_log.write(&line);
        }
    }
}
