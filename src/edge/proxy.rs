//! The Pingora `ProxyHttp` implementation — glue only (docs/architecture.md).
//!
//! `request_filter` routes the request and hands it to the [`policy`] step,
//! then lets it through or writes the answer; [`attempt`] chooses each try's
//! server; the upstream gets the route's rewrite, the client the rate-limit
//! headers and the request ID; `logging` releases leases, counts and logs.
//!
//! Each request works on the [`GatewayState`](crate::policy::state::GatewayState) that was current when it
//! started (taken in `new_ctx`), so a reload never changes a request in flight.

use crate::config::RouteAction;
use crate::edge::attempt;
use crate::edge::context::RequestCtx;
use crate::edge::early_body;
use crate::edge::front_door::GuardedStream;
use crate::edge::respond;
use crate::edge::shutdown_delay::Draining;
use crate::observe::access_log::AccessLog;
use crate::observe::metrics::Metrics;
use crate::policy::state::SharedState;
use crate::policy::{self, Rejection, Step};
use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::{HttpPeer, Result};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorType};
use prometheus::Histogram;
use std::sync::Arc;

/// The gateway: the swappable [`GatewayState`](crate::policy::state::GatewayState) plus the process-wide metrics.
pub struct Gateway {
    state: SharedState,
    metrics: Arc<Metrics>,
    access_log: AccessLog,
    unmatched_duration: Histogram,
    draining: Arc<Draining>,
}

impl Gateway {
    /// A gateway serving whatever state `state` holds when each request
    /// starts, writing its access log through `access_log`; while
    /// `draining`, each HTTP/1 response closes its connection.
    pub fn new(
        state: SharedState,
        metrics: Arc<Metrics>,
        access_log: AccessLog,
        draining: Arc<Draining>,
    ) -> Self {
        Self {
            access_log,
            draining,
            unmatched_duration: metrics.request_duration.with_label_values(&["_unmatched"]),
            state,
            metrics,
        }
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
        RequestCtx::new(self.state.load_full())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let state = Arc::clone(&ctx.state);
        ctx.arrived(session.req_header(), respond::peer_ip(session));
        let front_door = &state.config.server.front_door;
        respond::prepare(session, front_door.client_body_timeout, &self.draining);
        let routed = match policy::route(&state, session.req_header(), front_door.escaped_slashes) {
            Ok(routed) => routed,
            Err(rejection) => {
                if rejection == Rejection::BadRequest {
                    ctx.path =
                        Some(String::from_utf8_lossy(session.req_header().raw_path()).into());
                }
                return respond::reject(session, &rejection, &ctx.voice()).await;
            }
        };
        let route = &state.compiled[routed.route];
        ctx.routed(routed, session.req_header());
        if let Some(early) = ctx.before_limits(session.req_header(), route) {
            return respond::early(session, early, &ctx.voice()).await;
        }
        ctx.client_cert = respond::client_cert(session);
        match early_body::read(session, ctx, route).await {
            Ok(read) => read?,
            Err(rejection) => return respond::reject(session, &rejection, &ctx.voice()).await,
        }
        let view = ctx.view(session.req_header(), respond::peer_ip(session));
        let judgement = policy::judge(&state, route, &view).await;
        ctx.judged(judgement.report);
        match judgement.step {
            Step::Reject(rejection) => respond::reject(session, &rejection, &ctx.voice()).await,
            Step::Proceed(mut leases) => {
                if let Some(held) = leases.as_mut() {
                    let waiting = &self.metrics.waiting;
                    if !respond::take_turn(session, held, &state, route, waiting).await {
                        ctx.leases = leases;
                        ctx.abandoned = true;
                        let why = "the client left while its request waited for its turn";
                        return Err(Error::explain(ErrorType::ConnectionClosed, why).into_down());
                    }
                }
                ctx.leases = leases;
                let RouteAction::Respond { status, body } = &route.action else {
                    return Ok(false);
                };
                let headers = policy::rate_headers(Some(route), &ctx.rate);
                let reply = policy::fixed_reply(*status, body, headers);
                respond::respond(session, reply, &ctx.voice()).await
            }
        }
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let (head, peer) = (session.req_header(), respond::peer_ip(session));
        let retries = &self.metrics.upstream_retries;
        attempt::choose(ctx, head, peer, retries).map(Box::new)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut RequestCtx,
        e: Box<Error>,
    ) -> Box<Error> {
        attempt::connect_failed(ctx, peer, e)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        reused: bool,
    ) -> Box<Error> {
        attempt::proxy_failed(ctx, peer, session, reused, e)
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = upstream_response.status.as_u16();
        attempt::answered(ctx, &session.req_header().method, status)
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let peer = respond::socket_ip(session);
        ctx.drop_expect(upstream_request);
        ctx.upstream_rewrite(session.req_header(), peer)
            .apply(upstream_request)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.dress_response(upstream_response)?;
        ctx.settle_deferred(upstream_response).await;
        Ok(())
    }

    /// An upstream or gateway failure answered in sluice's voice (see
    /// `respond::fail_to_proxy`), never Pingora's empty body.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let route = ctx.route().map(|r| r.name.as_str());
        respond::fail_to_proxy(session, e, route, &ctx.voice()).await
    }

    /// The request as error-log lines name it: without its query (an API
    /// key or a token may ride there), with its request ID.
    fn request_summary(&self, session: &Session, ctx: &RequestCtx) -> String {
        crate::request::summary(session.req_header(), ctx.request_id.as_ref())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.body_passing(body)
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        ctx.response_body_passed(body.as_ref(), end_of_stream);
        Ok(None)
    }

    async fn logging(
        &self,
        session: &mut Session,
        error: Option<&pingora::Error>,
        ctx: &mut RequestCtx,
    ) {
        respond::count_downstream_rejection(&self.metrics, error, ctx.body_too_large);
        if let Some(stream) = session.stream().and_then(GuardedStream::of) {
            stream.request_done();
        }
        let status = respond::final_status(session, ctx.abandoned);
        ctx.release(status).await;
        ctx.count_response(&self.metrics, status, &self.unmatched_duration);
        let (req, peer) = (session.req_header(), respond::peer_ip(session));
        if ctx.state.config.server.access_log {
            self.access_log.write(&ctx.log_line(req, status, peer));
        }
        ctx.finish_trace(req, status, peer);
    }
}
