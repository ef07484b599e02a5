//! The Pingora `ProxyHttp` implementation — glue only (DESIGN §1).
//!
//! `request_filter` matches the route, builds the limit keys, asks the
//! [`Decider`] and either lets the request through or answers it (404, 429,
//! 503, or a `respond:` route). `response_filter` adds the rate-limit headers
//! to proxied responses; `logging` counts every request.

use crate::config::{Algorithm, Config, HeaderStyle, LimitConfig, OnMissing, RouteAction};
use crate::identity::{Identity, User};
use crate::keys::{build_key, ClientIpResolver, RequestParts};
use crate::limiter::{Decider, Decision, LimitCheck, Outcome, Source};
use crate::metrics::{DecisionLabel, LimitCounters, Metrics};
use crate::route::RouteTable;
use crate::upstream::Upstream;
use async_trait::async_trait;
use bytes::Bytes;
use http::header;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::{HttpPeer, Result};
use pingora::proxy::{ProxyHttp, Session};
use pingora::{Error, ErrorType};
use prometheus::Histogram;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The gateway: everything a request needs, built once from a [`Config`].
pub struct Gateway {
    routes: RouteTable,
    compiled: Vec<CompiledRoute>,
    upstreams: Vec<Upstream>,
    client_ip: ClientIpResolver,
    identity: Identity,
    key_prefix: String,
    deny_status: u16,
    header_style: HeaderStyle,
    decider: Arc<Decider>,
    metrics: Arc<Metrics>,
    unmatched_duration: Histogram,
}

struct CompiledRoute {
    name: String,
    action: RouteAction,
    limits: Vec<CompiledLimit>,
    duration: Histogram,
}

struct CompiledLimit {
    config: LimitConfig,
    counters: LimitCounters,
}

/// Per-request state shared between the filters.
pub struct RequestCtx {
    route: Option<usize>,
    started: Instant,
    /// (limit index, decision) of the enforced limits that applied, most
    /// restrictive (least remaining) first: what the headers report.
    rate: Vec<(usize, Decision)>,
    /// Concurrency leases to release when the response ends.
    leases: Option<HeldLeases>,
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
    /// Builds the gateway. `upstreams` must be in `config.upstreams` order.
    /// Fails only if JWT key material that validation accepted does not parse.
    pub fn new(
        config: &Config,
        upstreams: Vec<Upstream>,
        decider: Arc<Decider>,
        metrics: Arc<Metrics>,
    ) -> std::result::Result<Self, jsonwebtoken::errors::Error> {
        let compiled = config
            .routes
            .iter()
            .map(|route| CompiledRoute {
                name: route.name.clone(),
                action: route.action.clone(),
                limits: route
                    .limits
                    .iter()
                    .map(|limit| CompiledLimit {
                        config: limit.clone(),
                        counters: metrics.limit_counters(&route.name, &limit.name, limit.shadow),
                    })
                    .collect(),
                duration: metrics
                    .request_duration
                    .with_label_values(&[route.name.as_str()]),
            })
            .collect();
        Ok(Self {
            routes: RouteTable::new(&config.routes),
            compiled,
            upstreams,
            client_ip: ClientIpResolver::new(&config.client_ip),
            identity: Identity::new(&config.identity)?,
            key_prefix: config.limiter.redis.key_prefix.clone(),
            deny_status: config.response.status,
            header_style: config.response.headers,
            unmatched_duration: metrics.request_duration.with_label_values(&["_unmatched"]),
            decider,
            metrics,
        })
    }

    /// Builds the counter keys of the route's limits for this request, as
    /// (limit index, key). Limits whose key part is missing with
    /// `on_missing: skip` are left out.
    fn limit_keys(
        &self,
        route: &CompiledRoute,
        session: &Session,
    ) -> std::result::Result<Vec<(usize, String)>, KeyError> {
        let req = session.req_header();
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let forwarded = req.headers.get_all("x-forwarded-for");
        let client = self
            .client_ip
            .client_ip(peer, forwarded.iter().map(|v| v.as_bytes()));
        let ip_text = self.client_ip.key_text(client);
        let header = |name: &str| req.headers.get(name).map(|v| v.as_bytes());
        let user = self.identity.user(header, self.client_ip.is_trusted(peer));
        let user = match user {
            User::Known(user) => Some(user),
            User::Invalid(_) | User::Absent if self.identity.required() => {
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
                    &self.key_prefix,
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
        &self,
        route: Option<&CompiledRoute>,
        entries: &[(usize, Decision)],
    ) -> Vec<(&'static str, String)> {
        let (Some(route), Some((first, most))) = (route, entries.first()) else {
            return Vec::new();
        };
        let mut headers = Vec::new();
        if matches!(self.header_style, HeaderStyle::Legacy | HeaderStyle::Both) {
            headers.push((
                "x-ratelimit-limit",
                route.limits[*first].config.limit.to_string(),
            ));
            headers.push(("x-ratelimit-remaining", most.remaining.to_string()));
            headers.push(("x-ratelimit-reset", ceil_secs(most.reset).to_string()));
        }
        if matches!(self.header_style, HeaderStyle::Draft | HeaderStyle::Both) {
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
            headers.push(("ratelimit-policy", policy));
            headers.push(("ratelimit", state));
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
    headers: &[(&'static str, String)],
    body: Bytes,
) -> Result<()> {
    let mut response = ResponseHeader::build(status, Some(headers.len() + 2))?;
    response.insert_header(header::CONTENT_TYPE, content_type)?;
    response.insert_header(header::CONTENT_LENGTH, body.len())?;
    for (name, value) in headers {
        response.insert_header(*name, value)?;
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

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            route: None,
            started: Instant::now(),
            rate: Vec::new(),
            leases: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let found = {
            let req = session.req_header();
            let host = req
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| req.uri.host());
            self.routes.find(req.method.as_str(), host, req.uri.path())
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
        let route = &self.compiled[index];

        if !route.limits.is_empty() {
            let keys = match self.limit_keys(route, session) {
                Ok(keys) => keys,
                Err(KeyError::Unauthorized) => {
                    respond(
                        session,
                        401,
                        JSON,
                        &[("www-authenticate", r#"Bearer error="invalid_token""#.into())],
                        Bytes::from_static(br#"{"error":"unauthorized"}"#),
                    )
                    .await?;
                    return Ok(true);
                }
            };
            if !keys.is_empty() {
                let checks = Self::checks(route, &keys);
                let outcome = self.decider.decide(&checks).await;
                Self::count_decisions(route, &keys, &outcome);
                ctx.rate = Self::rate_entries(route, &keys, &outcome.decisions);

                if outcome.source == Source::FailClosed {
                    let body = format!(
                        r#"{{"error":"rate_limiter_unavailable","route":"{}"}}"#,
                        route.name
                    );
                    respond(
                        session,
                        503,
                        JSON,
                        &[("retry-after", "1".into())],
                        body.into(),
                    )
                    .await?;
                    return Ok(true);
                }
                if !outcome.admitted {
                    // The enforced limit that denies longest names the denial.
                    let (denying, wait) = keys
                        .iter()
                        .zip(&outcome.decisions)
                        .filter(|((i, _), d)| !d.allowed && !route.limits[*i].config.shadow)
                        .max_by_key(|(_, d)| d.retry_after)
                        .map(|((i, _), d)| (route.limits[*i].config.name.as_str(), d.retry_after))
                        .unwrap_or(("", Duration::ZERO));
                    let retry_after = ceil_secs(wait).max(1);
                    let mut headers = vec![("retry-after", retry_after.to_string())];
                    headers.extend(self.rate_headers(Some(route), &ctx.rate));
                    let body = format!(
                        r#"{{"error":"too_many_requests","route":"{}","limit":"{denying}","retry_after_seconds":{retry_after}}}"#,
                        route.name
                    );
                    respond(session, self.deny_status, JSON, &headers, body.into()).await?;
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
            let headers = self.rate_headers(Some(route), &ctx.rate);
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
        let upstream = match ctx.route.map(|i| &self.compiled[i].action) {
            Some(RouteAction::Upstream(u)) => &self.upstreams[*u],
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
                format!("no healthy server in upstream `{}`", upstream.name),
            )
        })?;
        let mut peer = HttpPeer::new(backend, false, String::new());
        peer.options.connection_timeout = Some(upstream.connect_timeout);
        peer.options.read_timeout = Some(upstream.read_timeout);
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
            let mut value = Vec::new();
            for existing in upstream_request.headers.get_all("x-forwarded-for") {
                value.extend_from_slice(existing.as_bytes());
                value.extend_from_slice(b", ");
            }
            value.extend_from_slice(peer.to_string().as_bytes());
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
        let route = ctx.route.map(|i| &self.compiled[i]);
        for (name, value) in self.rate_headers(route, &ctx.rate) {
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
        if let (Some(held), Some(i)) = (ctx.leases.take(), ctx.route) {
            let route = &self.compiled[i];
            let checks = Self::checks(route, &held.keys);
            self.decider.release(&checks, &held.outcome).await;
        }
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .unwrap_or(0);
        let code = http::StatusCode::from_u16(status).ok();
        let status_label = code.as_ref().map(|c| c.as_str()).unwrap_or("0");
        let (route, duration) = match ctx.route {
            Some(i) => (self.compiled[i].name.as_str(), &self.compiled[i].duration),
            None => ("_unmatched", &self.unmatched_duration),
        };
        self.metrics
            .requests
            .with_label_values(&[route, status_label])
            .inc();
        duration.observe(ctx.started.elapsed().as_secs_f64());
    }
}
