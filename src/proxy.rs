//! The Pingora `ProxyHttp` implementation — glue only (docs/architecture.md).
//!
//! `request_filter` routes the request and hands it to the [`policy`] step,
//! then either lets it through or writes the policy's [`Reply`] (400, 401,
//! 404, 429, 503, or a `respond:` route). `upstream_request_filter` sends the
//! canonical target upstream; `response_filter` adds the rate-limit headers
//! to proxied responses; `logging` releases concurrency leases, counts every
//! request and writes its access-log line.
//!
//! Each request works on the [`GatewayState`](crate::state::GatewayState) that was current when it
//! started (taken in `new_ctx`), so a reload never changes a request in flight.

use crate::access_log::AccessLog;
use crate::config::RouteAction;
use crate::context::RequestCtx;
use crate::front_door::GuardedStream;
use crate::metrics::Metrics;
use crate::policy::{self, Rejection, Reply, RequestView, Step};
use crate::request::{drop_foreign_upgrade, UpstreamRewrite};
use crate::state::SharedState;
use async_trait::async_trait;
use http::header;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::{HttpPeer, Result};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::Peer;
use pingora::{Error, ErrorSource, ErrorType};
use prometheus::Histogram;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

/// The gateway: the swappable [`GatewayState`](crate::state::GatewayState) plus the process-wide metrics.
pub struct Gateway {
    state: SharedState,
    metrics: Arc<Metrics>,
    access_log: AccessLog,
    unmatched_duration: Histogram,
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
}

/// Waits `wait` (a delayed request's turn, `on_limit: delay`); false if
/// the client closed the connection meanwhile. A request whose body is still
/// to come is not watched: its body is the upstream's to read.
async fn wait_turn(session: &mut Session, wait: Duration) -> bool {
    let turn = tokio::time::sleep(wait);
    if !session.is_body_empty() && !session.is_body_done() {
        turn.await;
        return true;
    }
    tokio::select! {
        () = turn => true,
        // Ends only when the client closes (or sends what no request may).
        _ = session.read_body_or_idle(true) => false,
    }
}

/// Writes a rejection: in gRPC's form for a gRPC call, else as JSON.
async fn reject(
    session: &mut Session,
    rejection: &Rejection<'_>,
    server: Option<&str>,
) -> Result<bool> {
    if policy::is_grpc(session.req_header()) {
        respond(session, rejection.grpc_reply(), server).await
    } else {
        respond(session, rejection.reply(), server).await
    }
}

/// Writes a reply the gateway makes itself, and ends the request.
/// `server`: the configured `Server` header, if any. A gRPC reply (no body)
/// is trailers-only: one header block that ends the stream.
async fn respond(session: &mut Session, reply: Reply, server: Option<&str>) -> Result<bool> {
    let mut response = ResponseHeader::build(reply.status, Some(reply.headers.len() + 3))?;
    if let Some(server) = server {
        response.insert_header(header::SERVER, server)?;
    }
    response.insert_header(header::CONTENT_TYPE, reply.content_type)?;
    let trailers_only = reply.content_type == "application/grpc";
    for (name, value) in reply.headers {
        response.insert_header(name, value)?;
    }
    // A body the client sent but we did not read would be taken for the next
    // request on this connection: close it instead.
    if !session.is_body_empty() {
        session.set_keepalive(None);
    }
    if trailers_only {
        // One header block that ends the stream (what gRPC calls
        // trailers-only); Pingora's proxy session would end the stream with
        // an empty DATA frame, which gRPC clients take for missing trailers.
        if let pingora::protocols::http::ServerSession::H2(h2) = session.downstream_session.as_mut()
        {
            h2.write_response_header(Box::new(response), true)?;
            return Ok(true);
        }
    }
    // Over HTTP/1.1 (no gRPC client speaks it) it is an empty response.
    response.insert_header(header::CONTENT_LENGTH, reply.body.len())?;
    let head_only = trailers_only || session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(response), head_only)
        .await?;
    if !head_only {
        session.write_response_body(Some(reply.body), true).await?;
    }
    Ok(true)
}

/// The socket peer's IP (loopback if the connection is not over IP).
fn peer_ip(session: &Session) -> IpAddr {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    /// No downstream modules. Pingora's default adds a response-compression
    /// module at level 0 (disabled), which still costs every request a module
    /// context and a pass over its headers; sluice passes bodies through.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::new(self.state.load_full())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let state = Arc::clone(&ctx.state);
        let front_door = &state.config.server.front_door;
        // Between two reads of the body (the head is the front door's).
        session.set_read_timeout(Some(front_door.client_body_timeout));
        drop_foreign_upgrade(session.req_header_mut());
        let routed = match policy::route(&state, session.req_header(), front_door.escaped_slashes) {
            Ok(routed) => routed,
            Err(rejection) => {
                if rejection == Rejection::BadRequest {
                    ctx.path =
                        Some(String::from_utf8_lossy(session.req_header().raw_path()).into());
                }
                let server = state.config.server.server_header.as_deref();
                return reject(session, &rejection, server).await;
            }
        };
        let route = &state.compiled[routed.route];
        ctx.routed(routed);
        let view = RequestView {
            head: session.req_header(),
            peer: peer_ip(session),
            path: ctx.path(session.req_header()),
        };
        let judgement = policy::judge(&state, route, &view).await;
        ctx.judged(judgement.report);
        match judgement.step {
            Step::Reject(rejection) => {
                let server = state.config.server.server_header.as_deref();
                reject(session, &rejection, server).await
            }
            Step::Proceed(mut leases) => {
                if let Some(held) = leases.as_mut().filter(|l| !l.delay().is_zero()) {
                    let wait = held.delay();
                    if let Some(delays) = &route.delays {
                        delays.observe(wait.as_secs_f64());
                    }
                    self.metrics.waiting.inc();
                    let stayed = wait_turn(session, wait).await;
                    self.metrics.waiting.dec();
                    if !stayed {
                        held.give_back(&state, route).await;
                        ctx.leases = leases;
                        ctx.abandoned = true;
                        let why = "the client left while its request waited for its turn";
                        return Err(Error::explain(ErrorType::ConnectionClosed, why).into_down());
                    }
                    held.waited();
                }
                ctx.leases = leases;
                let RouteAction::Respond { status, body } = &route.action else {
                    return Ok(false);
                };
                let headers = policy::rate_headers(&state, Some(route), &ctx.rate);
                let server = state.config.server.server_header.as_deref();
                respond(session, policy::fixed_reply(*status, body, headers), server).await
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let upstream = match ctx.route().map(|route| &route.action) {
            Some(RouteAction::Upstream(u)) => Arc::clone(&ctx.state.upstreams[*u]),
            _ => return Err(Error::explain(ErrorType::InternalError, "no upstream")),
        };
        let peer = upstream.peer().ok_or_else(|| {
            let why = format!("no healthy server in upstream `{}`", upstream.name());
            Error::explain(ErrorType::HTTPStatus(502), why)
        })?;
        if ctx.state.config.server.access_log {
            ctx.upstream_addr = Some(peer.address().to_string());
        }
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // An identity header is the word of a trusted proxy only: the
        // upstream must not take a client's own for it.
        let peer = peer_ip(session);
        let untrusted = match ctx.state.identity.trusted_header() {
            Some(name) if !ctx.state.client_ip.is_trusted(peer) => Some(name),
            _ => None,
        };
        let rewrite = UpstreamRewrite {
            target: ctx.upstream_target.take(),
            host: ctx.upstream_host.take(),
            remove: untrusted,
            forwarded_for: session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip()),
        };
        rewrite.apply(upstream_request)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        for (name, value) in policy::rate_headers(&ctx.state, ctx.route(), &ctx.rate) {
            upstream_response.insert_header(name, value)?;
        }
        // Deferred limits count now that the response head is known.
        if let Some(held) = ctx.leases.as_mut() {
            let state = Arc::clone(&ctx.state);
            if let Some(route) = ctx.route.and_then(|i| state.compiled.get(i)) {
                let status = upstream_response.status.as_u16();
                let headers = &upstream_response.headers;
                let header = |name: &str| headers.get(name).map(|v| v.as_bytes());
                held.settle(&state, route, status, &header).await;
            }
        }
        Ok(())
    }

    /// An upstream or gateway failure answered in sluice's voice: a JSON
    /// body naming the route, 502 when the upstream cannot be reached or
    /// breaks the exchange, 504 when it does not connect or answer in time,
    /// 400 for a request the client broke, nothing for a client already
    /// gone; never Pingora's empty body and `Server: Pingora`.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let route = ctx.route().map(|r| r.name.as_str());
        let rejection = match (e.etype(), e.esource()) {
            (ErrorType::HTTPStatus(504), _) => Some(Rejection::GatewayTimeout { route }),
            (ErrorType::HTTPStatus(400), _) => Some(Rejection::BadRequest),
            (ErrorType::HTTPStatus(code), _) if (500..600).contains(code) => {
                Some(Rejection::BadGateway { route })
            }
            (ErrorType::HTTPStatus(_), _) => Some(Rejection::BadRequest),
            (
                ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout,
                ErrorSource::Upstream,
            ) => Some(Rejection::GatewayTimeout { route }),
            (_, ErrorSource::Upstream) => Some(Rejection::BadGateway { route }),
            (
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed,
                ErrorSource::Downstream,
            ) => None,
            (_, ErrorSource::Downstream) => Some(Rejection::BadRequest),
            (_, ErrorSource::Internal | ErrorSource::Unset) => Some(Rejection::Internal),
        };
        let Some(rejection) = rejection else {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        };
        let code = rejection.reply().status;
        // Once a response head is on its way, nothing more can be said.
        if session.response_written().is_none() {
            let server = ctx.state.config.server.server_header.as_deref();
            if let Err(e) = reject(session, &rejection, server).await {
                log::debug!("could not send the {code} to the client: {e}");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
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
        let route = ctx.route();
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            // nginx's word for a client that left before its answer.
            .unwrap_or(if ctx.abandoned { 499 } else { 0 });
        if let (Some(leases), Some(route)) = (leases, route) {
            leases.release(&ctx.state, route, status).await;
        }
        let code = http::StatusCode::from_u16(status).ok();
        let status_label = code.as_ref().map(|c| c.as_str()).unwrap_or("0");
        let (route_name, duration) = match route {
            Some(route) => (route.name.as_str(), &route.duration),
            None => ("_unmatched", &self.unmatched_duration),
        };
        self.metrics
            .requests
            .with_label_values(&[route_name, status_label])
            .inc();
        duration.observe(ctx.started.elapsed().as_secs_f64());

        if ctx.state.config.server.access_log {
            let req = session.req_header();
            let client = ctx
                .client
                .unwrap_or_else(|| policy::client_ip(&ctx.state, req, peer_ip(session)));
            self.access_log.write(&ctx.log_line(req, status, client));
        }
    }
}
