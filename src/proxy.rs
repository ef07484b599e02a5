//! The Pingora `ProxyHttp` implementation — glue only (DESIGN §1).
//!
//! `request_filter` matches the route, builds the limit keys, asks the
//! [`Decider`] and either lets the request through or answers it (404, 429,
//! 503, or a `respond:` route). `response_filter` adds the rate-limit headers
//! to proxied responses; `logging` counts every request.

use crate::config::{Config, HeaderStyle, IdentityConfig, LimitConfig, OnMissing, RouteAction};
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
    identity: IdentityConfig,
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
    rate: Option<RateHeaders>,
}

/// The legacy headers of the most restrictive limit.
#[derive(Debug, Clone, Copy)]
struct RateHeaders {
    limit: u64,
    remaining: u64,
    reset: Duration,
}

impl Gateway {
    /// Builds the gateway. `upstreams` must be in `config.upstreams` order.
    pub fn new(
        config: &Config,
        upstreams: Vec<Upstream>,
        decider: Arc<Decider>,
        metrics: Arc<Metrics>,
    ) -> Self {
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
                        counters: metrics.limit_counters(&route.name, &limit.name),
                    })
                    .collect(),
                duration: metrics
                    .request_duration
                    .with_label_values(&[route.name.as_str()]),
            })
            .collect();
        Self {
            routes: RouteTable::new(&config.routes),
            compiled,
            upstreams,
            client_ip: ClientIpResolver::new(&config.client_ip),
            identity: config.identity.clone(),
            key_prefix: config.limiter.redis.key_prefix.clone(),
            deny_status: config.response.status,
            header_style: config.response.headers,
            unmatched_duration: metrics.request_duration.with_label_values(&["_unmatched"]),
            decider,
            metrics,
        }
    }

    /// Builds the counter keys of the route's limits for this request, as
    /// (limit index, key). Limits whose key part is missing with
    /// `on_missing: skip` are left out.
    fn limit_keys(&self, route: &CompiledRoute, session: &Session) -> Vec<(usize, String)> {
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
        let user = match &self.identity {
            IdentityConfig::Header(name) if self.client_ip.is_trusted(peer) => {
                req.headers.get(name.as_str()).map(|v| v.as_bytes())
            }
            _ => None,
        };
        let header = |name: &str| req.headers.get(name).map(|v| v.as_bytes());
        let parts = RequestParts {
            ip: &ip_text,
            user,
            method: req.method.as_str(),
            path: req.uri.path().as_bytes(),
            header: &header,
        };
        route
            .limits
            .iter()
            .enumerate()
            .filter_map(|(i, limit)| {
                let c = &limit.config;
                build_key(
                    &self.key_prefix,
                    &route.name,
                    &c.name,
                    &c.key,
                    &parts,
                    c.on_missing == OnMissing::Ip,
                )
                .map(|key| (i, key))
            })
            .collect()
    }

    fn count_decisions(route: &CompiledRoute, keys: &[(usize, String)], outcome: &Outcome) {
        let admitted = outcome.admitted();
        match outcome.source {
            Source::Redis | Source::DenyCache | Source::Local => {
                for ((i, _), decision) in keys.iter().zip(&outcome.decisions) {
                    // A denied request is counted against the limits that denied it;
                    // the others neither admitted it nor consumed anything.
                    if admitted {
                        route.limits[*i]
                            .counters
                            .inc(DecisionLabel::Allow, outcome.source);
                    } else if !decision.allowed {
                        route.limits[*i]
                            .counters
                            .inc(DecisionLabel::Deny, outcome.source);
                    }
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

    fn rate_headers(
        route: &CompiledRoute,
        keys: &[(usize, String)],
        decisions: &[Decision],
    ) -> Option<RateHeaders> {
        keys.iter()
            .zip(decisions)
            .map(|((i, _), d)| RateHeaders {
                limit: route.limits[*i].config.limit,
                remaining: d.remaining,
                reset: d.reset,
            })
            .min_by_key(|h| h.remaining)
    }

    fn legacy_headers(&self, rate: Option<RateHeaders>) -> Vec<(&'static str, String)> {
        match (self.header_style, rate) {
            (HeaderStyle::Legacy, Some(rate)) => vec![
                ("x-ratelimit-limit", rate.limit.to_string()),
                ("x-ratelimit-remaining", rate.remaining.to_string()),
                ("x-ratelimit-reset", ceil_secs(rate.reset).to_string()),
            ],
            _ => Vec::new(),
        }
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
            rate: None,
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
            let keys = self.limit_keys(route, session);
            if !keys.is_empty() {
                let checks: Vec<LimitCheck<'_>> = keys
                    .iter()
                    .map(|(i, key)| {
                        let c = &route.limits[*i].config;
                        LimitCheck {
                            key,
                            limit: c.limit,
                            window: c.window,
                            cost: c.cost,
                        }
                    })
                    .collect();
                let outcome = self.decider.decide(&checks).await;
                Self::count_decisions(route, &keys, &outcome);
                ctx.rate = Self::rate_headers(route, &keys, &outcome.decisions);

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
                if !outcome.admitted() {
                    let retry_after = ceil_secs(outcome.retry_after()).max(1);
                    let denying = keys
                        .iter()
                        .zip(&outcome.decisions)
                        .filter(|(_, d)| !d.allowed)
                        .max_by_key(|(_, d)| d.retry_after)
                        .map(|((i, _), _)| route.limits[*i].config.name.as_str())
                        .unwrap_or("");
                    let mut headers = vec![("retry-after", retry_after.to_string())];
                    headers.extend(self.legacy_headers(ctx.rate));
                    let body = format!(
                        r#"{{"error":"too_many_requests","route":"{}","limit":"{denying}","retry_after_seconds":{retry_after}}}"#,
                        route.name
                    );
                    respond(session, self.deny_status, JSON, &headers, body.into()).await?;
                    return Ok(true);
                }
            }
        }

        if let RouteAction::Respond { status, body } = &route.action {
            let headers = self.legacy_headers(ctx.rate);
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
        for (name, value) in self.legacy_headers(ctx.rate) {
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
