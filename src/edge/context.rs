//! What one request carries between the proxy's filters: the state it is
//! served with, its route, what the limits said, and what goes upstream.

use crate::config::consumers::KeySource;
use crate::config::forward::{HeaderEdits, UpstreamHost};
use crate::config::Balance;
use crate::config::RouteAction;
use crate::edge::respond::Voice;
use crate::observe::access_log::AccessLogLine;
use crate::observe::instance::Instance;
use crate::observe::trace::{Ending, RequestTrace};
use crate::policy;
use crate::policy::state::{CompiledRoute, GatewayState};
use crate::policy::{Early, HeldLeases, LimitReport, RateEntry, Rejection, Routed, Verdict};
use crate::request::client_cert::ClientCert;
use crate::request::forward::{rewritten_target, Values};
use crate::request::id::request_id;
use crate::request::parts::without_query_param;
use crate::request::{request_path, UpstreamRewrite};
use crate::upstream::balance::hash_key;
use crate::upstream::Upstream;
use http::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};
use std::net::{IpAddr, Ipv4Addr};

/// The peer of a connection that is not over IP, as the gateway sees it.
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
use std::sync::Arc;
use std::time::Instant;

/// Per-request state shared between the filters.
pub struct RequestCtx {
    /// The configuration this request is served with, from start to end.
    pub state: Arc<GatewayState>,
    /// The matched route's index in the state's compiled routes.
    pub route: Option<usize>,
    /// When the request arrived.
    pub started: Instant,
    /// The enforced limits' decisions, most restrictive first: what the
    /// headers report.
    pub rate: Vec<RateEntry>,
    /// Concurrency leases to release when the response ends.
    pub leases: Option<HeldLeases>,
    /// What the limiter decided, for the access log.
    pub verdict: Option<Verdict>,
    /// The client IP, once known.
    pub client: Option<IpAddr>,
    /// The upstream server chosen.
    pub upstream_addr: Option<String>,
    /// The canonical path, when it is not the path as received (which is
    /// then canonical already): what routes, keys and the upstream see.
    pub path: Option<String>,
    /// The origin-form target to send upstream instead of the one received.
    pub upstream_target: Option<Vec<u8>>,
    /// The Host to send upstream for an absolute-form request without one.
    pub upstream_host: Option<Vec<u8>>,
    /// The client left while the request waited for its turn.
    pub abandoned: bool,
    /// The request's ID (set first thing).
    pub request_id: Option<HeaderValue>,
    /// The established identity, when the route's header edits name it.
    pub user: Option<Vec<u8>>,
    /// The identity method that decided who the request is, if its
    /// credential was present (`jwt`, `api_key`, `header`).
    pub identity: Option<&'static str>,
    /// The connection's verified client certificate, if any.
    pub client_cert: Option<Arc<ClientCert>>,
    /// The chosen server's name as written, for `upstream_host: upstream`.
    pub server_name: Option<HeaderValue>,
    /// Request body bytes received so far.
    pub body_bytes: u64,
    /// The request was refused for a body over the route's cap.
    pub body_too_large: bool,
    /// Tries at the upstream so far.
    pub attempts: u32,
    /// The servers tried, in order.
    pub tried: Vec<std::net::SocketAddr>,
    /// It is a CORS preflight, answered by sluice.
    pub preflight: bool,
    /// Its `Access-Control-Allow-Origin`, when its route answers CORS and
    /// its origin is allowed.
    pub cors_origin: Option<HeaderValue>,
    /// Its trace, when `tracing:` names a collector.
    pub trace: Option<RequestTrace>,
    /// Its whole body, when it was read before the decision (a limit
    /// reserves by it): what goes upstream.
    pub early_body: Option<bytes::Bytes>,
    /// What its reservation came to, once settled.
    pub settlement: policy::Settlement,
}

impl RequestCtx {
    /// A context for a request served with `state`, started now.
    pub fn new(state: Arc<GatewayState>) -> Self {
        RequestCtx {
            state,
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
            abandoned: false,
            request_id: None,
            user: None,
            identity: None,
            client_cert: None,
            server_name: None,
            body_bytes: 0,
            body_too_large: false,
            attempts: 0,
            tried: Vec::new(),
            preflight: false,
            cors_origin: None,
            trace: None,
            early_body: None,
            settlement: policy::Settlement::default(),
        }
    }

    /// A chunk of the request body on its way upstream: counted against
    /// the route's cap (see [`RequestCtx::body_received`]), or, for a body
    /// read before the decision, replaced by the whole body (Pingora sends
    /// only its tail, from the retry buffer; a retry sends it again).
    pub fn body_passing(&mut self, body: &mut Option<bytes::Bytes>) -> pingora::Result<()> {
        match &self.early_body {
            Some(whole) => {
                if body.is_some() {
                    *body = Some(whole.clone());
                }
                Ok(())
            }
            None => self.body_received(body.as_ref().map_or(0, |b| b.len())),
        }
    }

    /// A request whose body was read before the decision no longer waits
    /// for `100 Continue`: the upstream is not asked to send one.
    pub fn drop_expect(&self, upstream: &mut RequestHeader) {
        if self.early_body.is_some() {
            upstream.remove_header(&http::header::EXPECT);
        }
    }

    /// The request ended with `status`: hands back what it held and
    /// settles what its response cost (see [`HeldLeases::release`]).
    pub async fn release(&mut self, status: u16) {
        let state = Arc::clone(&self.state);
        let route = self.route.and_then(|i| state.compiled.get(i));
        if let (Some(leases), Some(route)) = (self.leases.take(), route) {
            self.settlement = leases.release(&state, route, status).await;
        }
    }

    /// Counts the request, answered with `status`, in its route's series
    /// (`unmatched`: the duration of a request no route matched) and its
    /// upstream's gateway errors.
    pub fn count_response(
        &self,
        metrics: &crate::observe::metrics::Metrics,
        status: u16,
        unmatched: &prometheus::Histogram,
    ) {
        let (route_name, duration) = match self.route() {
            Some(route) => (route.name.as_str(), &route.duration),
            None => ("_unmatched", unmatched),
        };
        metrics.count_request(route_name, status);
        if matches!(status, 502 | 504) {
            if let Some(upstream) = self.upstream() {
                upstream.gateway_errors.count(status);
            }
        }
        duration.observe(self.started.elapsed().as_secs_f64());
    }

    /// A chunk of the response body, already on its way to the client:
    /// read for the usage it reports, when a limit's cost is in it.
    pub fn response_body_passed(&mut self, body: Option<&bytes::Bytes>, end: bool) {
        if let Some(held) = self.leases.as_mut().filter(|h| h.reads_body()) {
            held.body_passed(body.map_or(&[][..], |b| &b[..]), end);
        }
    }

    /// Counts `len` more body bytes; the error answered 413 once they
    /// exceed the route's `max_body_bytes`.
    pub fn body_received(&mut self, len: usize) -> pingora::Result<()> {
        self.body_bytes = self.body_bytes.saturating_add(len as u64);
        let cap = self.route().map_or(0, |r| r.max_body_bytes);
        if cap == 0 || self.body_bytes <= cap {
            return Ok(());
        }
        self.body_too_large = true;
        let why = format!("request body over {cap} bytes");
        Err(pingora::Error::explain(
            pingora::ErrorType::HTTPStatus(413),
            why,
        ))
    }

    /// Takes in who sent `head` over a connection from `peer`: the
    /// request's ID is the one a trusted proxy sent, or a new one.
    pub fn arrived(&mut self, head: &RequestHeader, peer: IpAddr) {
        let trusted = self.state.client_ip.is_trusted(peer);
        let header = &self.state.config.server.request_id_header;
        self.request_id = Some(request_id(head, header, trusted));
        self.trace = self.state.tracer.as_ref().map(|t| t.start(head));
    }

    /// What sluice's own answers to this request carry.
    pub fn voice(&self) -> Voice<'_> {
        let server = &self.state.config.server;
        Voice {
            server: server.server_header.as_deref(),
            request_id: self
                .request_id
                .as_ref()
                .map(|id| (&server.request_id_header, id)),
            cors: self
                .route()
                .and_then(|r| r.forward.cors.as_ref())
                .map(|policy| (policy, self.cors_origin.as_ref())),
            errors: self.route().map_or_else(Default::default, |r| r.errors),
        }
    }

    /// Takes in where the request goes and what to send upstream.
    pub fn routed(&mut self, routed: Routed, head: &RequestHeader) {
        self.route = Some(routed.route);
        self.path = routed.rewritten_path;
        self.upstream_target = routed.upstream_target;
        self.upstream_host = routed.upstream_host;
        self.preflight = routed.preflight;
        let cors = self.route().and_then(|r| r.forward.cors.as_ref());
        self.cors_origin =
            cors.and_then(|policy| crate::request::cors::allowed_origin(policy, head));
    }

    /// What a request gets before any limit counts it, if anything: a CORS
    /// preflight's `204`, or a `413` for a declared body over the route's cap.
    pub fn before_limits<'r>(
        &mut self,
        head: &RequestHeader,
        route: &'r CompiledRoute,
    ) -> Option<Early<'r>> {
        if self.preflight {
            let cors = route.forward.cors.as_ref()?;
            let headers = match self.cors_origin {
                Some(_) => crate::request::cors::preflight_headers(cors, head),
                None => Vec::new(),
            };
            return Some(Early::Reply(policy::fixed_reply(204, "", headers)));
        }
        if policy::declared_body_over(head, route.max_body_bytes) {
            self.body_too_large = true;
            let route = Some(route.name.as_str());
            return Some(Early::Reject(Rejection::PayloadTooLarge { route }));
        }
        None
    }

    /// Takes in what the limits said, for the headers and the access log.
    pub fn judged(&mut self, report: LimitReport) {
        self.rate = report.rate;
        self.verdict = report.verdict;
        self.client = report.client;
        self.user = report.user;
        self.identity = report.identity;
        if let (Some(trace), Some(decided)) = (self.trace.as_mut(), report.decided) {
            trace.decided(decided);
        }
        if let (Some(trace), Some(auth)) = (self.trace.as_mut(), report.auth) {
            trace.asked_auth(auth);
        }
    }

    /// The consumer whose API key identified the request (the `user`, when
    /// the API key was the method that decided).
    fn consumer(&self) -> Option<&[u8]> {
        self.user
            .as_deref()
            .filter(|_| self.identity == Some("api_key"))
    }

    /// The matched route, if any.
    pub fn route(&self) -> Option<&CompiledRoute> {
        self.route.map(|i| &self.state.compiled[i])
    }

    /// The upstream the request's route proxies to, if it has one.
    pub fn upstream(&self) -> Option<Arc<Upstream>> {
        match self.route().map(|route| &route.action) {
            Some(RouteAction::Upstream(u)) => self.state.upstreams.get(*u).cloned(),
            _ => None,
        }
    }

    /// What the upstream is sent instead of `head` as received from `peer`
    /// (the socket's IP; `None` when not over IP): the routed target,
    /// rewritten by the route's `rewrite`, and `Host` (taken: asked once),
    /// `peer` appended to `X-Forwarded-For`, the identity header removed
    /// unless `peer` is a trusted proxy — the upstream must not take a
    /// client's own for it —, the request ID, and the route's header edits.
    pub fn upstream_rewrite(
        &mut self,
        head: &RequestHeader,
        peer: Option<IpAddr>,
    ) -> UpstreamRewrite<'_> {
        let peer_or_loopback = peer.unwrap_or(LOOPBACK);
        let trusted = self.state.client_ip.is_trusted(peer_or_loopback);
        let mut target = self.upstream_target.take();
        let mut host = self.upstream_host.take();
        let state = Arc::clone(&self.state);
        if let Some(route) = self.route.and_then(|i| state.compiled.get(i)) {
            let forward = &route.forward;
            if let Some(rewrite) = &forward.rewrite {
                let sent = target.as_deref().unwrap_or(head.raw_path());
                let path = request_path(&self.path, head);
                target = rewritten_target(rewrite, path, sent).or(target);
            }
            host = match &forward.upstream_host {
                UpstreamHost::Preserve => host,
                UpstreamHost::Upstream => self.server_name.as_ref().map(|v| v.as_bytes().to_vec()),
                UpstreamHost::Literal(name) => Some(name.as_bytes().to_vec()),
            };
            // `{client_ip}` in either direction's edits is the client as
            // the limits resolve it, even on a route without limits.
            let edits = !forward.request_headers.is_empty() || !forward.response_headers.is_empty();
            if self.client.is_none() && edits {
                self.client = Some(policy::client_ip(&state, head, peer_or_loopback));
            }
        }
        // A key sent in the query never reaches the upstream.
        if let Some(KeySource::Query(name)) = state.identity.api_keys().map(|k| &k.source) {
            let sent = target.as_deref().unwrap_or(head.raw_path());
            target = without_query_param(sent, name).or(target);
        }
        let route = self.route();
        let edits = route
            .filter(|r| !r.forward.request_headers.is_empty())
            .zip(self.request_id.as_ref())
            .map(|(route, request_id)| {
                let values = Values {
                    client_ip: self.client.unwrap_or(peer_or_loopback).to_string(),
                    request_id,
                    route: &route.name,
                    user: self.user.as_deref(),
                };
                (&route.forward.request_headers, values)
            });
        let server = &self.state.config.server;
        UpstreamRewrite {
            target,
            host,
            remove: self.state.identity.trusted_header().filter(|_| !trusted),
            consumer: self.state.identity.api_keys().map(|keys| {
                let header = match &keys.source {
                    KeySource::Header(name) => Some(name.as_str()),
                    KeySource::Query(_) => None,
                };
                (header, self.consumer())
            }),
            forwarded_for: peer,
            request_id: self
                .request_id
                .as_ref()
                .map(|id| (&server.request_id_header, id)),
            edits,
            trace: self
                .trace
                .as_ref()
                .map(|t| (t.upstream_traceparent(), t.tracestate())),
        }
    }

    /// Counts the route's deferred limits now that the response head is
    /// known (its status, and the headers `cost_from` reads).
    pub async fn settle_deferred(&mut self, response: &ResponseHeader) {
        let Some(held) = self.leases.as_mut() else {
            return;
        };
        let state = Arc::clone(&self.state);
        if let Some(route) = self.route.and_then(|i| state.compiled.get(i)) {
            let status = response.status.as_u16();
            let header = |name: &str| response.headers.get(name).map(|v| v.as_bytes());
            held.settle(&state, route, status, &header).await;
            let content_type = header("content-type").and_then(|v| std::str::from_utf8(v).ok());
            held.read_body(route, content_type.unwrap_or(""));
        }
    }

    /// Adds to the upstream's response what the client gets from sluice:
    /// the rate-limit headers, the request ID and CORS, then the route's
    /// `response_headers` edits.
    pub fn dress_response(&self, response: &mut ResponseHeader) -> pingora::Result<()> {
        for (name, value) in policy::rate_headers(self.route(), &self.rate) {
            response.insert_header(name, value)?;
        }
        let voice = self.voice();
        if let Some((name, id)) = voice.request_id {
            response.insert_header(name.clone(), id.clone())?;
        }
        if let Some((policy, allowed)) = voice.cors {
            crate::request::cors::dress(response, policy, allowed)?;
        }
        if let Some((edits, values)) = self.response_edits() {
            crate::request::forward::edit(response, edits, &values)?;
        }
        Ok(())
    }

    /// The response edits of the route, with this request's values; `None`
    /// when the route edits nothing.
    fn response_edits(&self) -> Option<(&HeaderEdits, Values<'_>)> {
        let route = self
            .route()
            .filter(|r| !r.forward.response_headers.is_empty())?;
        let values = Values {
            client_ip: self.client.unwrap_or(LOOPBACK).to_string(),
            request_id: self.request_id.as_ref()?,
            route: &route.name,
            user: self.user.as_deref(),
        };
        Some((&route.forward.response_headers, values))
    }

    /// The bytes the route's upstream chooses a server by (`hash_key` of a
    /// consistent-hash upstream; empty for the others), for `head` from
    /// `peer`.
    pub fn balance_key(&self, head: &RequestHeader, peer: IpAddr) -> Vec<u8> {
        let (Some(route), Some(upstream)) = (self.route(), self.upstream()) else {
            return Vec::new();
        };
        let Balance::ConsistentHash(parts) = &upstream.config.balance else {
            return Vec::new();
        };
        let client = self
            .client
            .unwrap_or_else(|| policy::client_ip(&self.state, head, peer));
        let view = self.view(head, peer);
        let user = self.user.as_deref();
        policy::with_request_parts(&self.state, route, &view, client, user, |request| {
            hash_key(parts, request)
        })
    }

    /// What the policy reads of this context's request `head`, from `peer`.
    pub fn view<'a>(&'a self, head: &'a RequestHeader, peer: IpAddr) -> policy::RequestView<'a> {
        policy::RequestView {
            head,
            peer,
            path: self.path(head),
            client_cert: self.client_cert.as_deref(),
            body: self.early_body.as_deref(),
        }
    }

    /// The canonical path of `req`, this context's request.
    pub fn path<'a>(&'a self, req: &'a RequestHeader) -> &'a str {
        request_path(&self.path, req)
    }

    /// Ends the request's trace: its spans are exported if it was sampled
    /// (or denied, with `always_sample_denied`).
    pub fn finish_trace(&mut self, req: &RequestHeader, status: u16, peer: IpAddr) {
        let (Some(trace), Some(tracer)) = (self.trace.take(), self.state.tracer.as_ref()) else {
            return;
        };
        let verdict = self.verdict;
        let denied =
            verdict.is_some_and(|v| v.label == crate::observe::metrics::DecisionLabel::Deny);
        if !tracer.exports(&trace, denied) {
            return;
        }
        let route = self.route();
        let upstream = match route.map(|r| &r.action) {
            Some(RouteAction::Upstream(u)) => self.state.upstreams.get(*u).map(|u| u.name()),
            _ => None,
        };
        let client = self
            .client
            .unwrap_or_else(|| policy::client_ip(&self.state, req, peer));
        let ending = Ending {
            method: req.method.as_str(),
            path: req.uri.path(),
            route: route.map_or("_unmatched", |r| r.name.as_str()),
            upstream,
            status,
            client: client.to_string(),
            decision: verdict.map(|v| v.label.name()),
            limit: verdict
                .and_then(|v| v.limit)
                .zip(route)
                .map(|(i, r)| r.limits[i].config.name.as_str()),
            identity: self.identity,
            reserved: (self.settlement.reserved > 0).then_some(self.settlement.reserved),
            cost: self.settlement.cost,
        };
        tracer.export(&trace, &ending);
    }

    /// The access-log line of this request (`req` from `peer`), which
    /// ended with `status`.
    pub fn log_line<'a>(
        &'a self,
        req: &'a RequestHeader,
        status: u16,
        peer: IpAddr,
    ) -> AccessLogLine<'a> {
        let client = self
            .client
            .unwrap_or_else(|| policy::client_ip(&self.state, req, peer));
        let (ctx, state, route) = (self, &self.state, self.route());
        let upstream = match route.map(|r| &r.action) {
            Some(RouteAction::Upstream(u)) if ctx.upstream_addr.is_some() => {
                Some(state.upstreams[*u].name())
            }
            _ => None,
        };
        let verdict = ctx.verdict;
        let instance = Instance::current();
        let (path, truncated) = AccessLogLine::capped(request_path(&ctx.path, req));
        AccessLogLine {
            time: AccessLogLine::now(),
            route: route.map_or("_unmatched", |r| r.name.as_str()),
            method: req.method.as_str(),
            path,
            truncated,
            status,
            upstream,
            upstream_addr: ctx.upstream_addr.as_deref(),
            duration_ms: ctx.started.elapsed().as_secs_f64() * 1000.0,
            decision: verdict.map(|v| v.label.name()),
            limit: verdict
                .and_then(|v| v.limit)
                .zip(route)
                .map(|(i, r)| r.limits[i].config.name.as_str()),
            source: verdict.map(|v| v.source.label()),
            client,
            request_id: ctx.request_id.as_ref().and_then(|id| id.to_str().ok()),
            trace_id: ctx.trace.as_ref().map(RequestTrace::trace_id_hex),
            consumer: ctx.consumer().and_then(|id| std::str::from_utf8(id).ok()),
            identity: ctx.identity,
            pod: instance.is_pod.then_some(instance.name.as_str()),
            namespace: instance.namespace.as_deref(),
            reserved: (ctx.settlement.reserved > 0).then_some(ctx.settlement.reserved),
            cost: ctx.settlement.cost,
        }
    }
}
