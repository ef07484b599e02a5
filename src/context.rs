//! What one request carries between the proxy's filters: the state it is
//! served with, its route, what the limits said, and what goes upstream.

use crate::access_log::AccessLogLine;
use crate::config::RouteAction;
use crate::policy::{HeldLeases, LimitReport, RateEntry, Routed, Verdict};
use crate::request::{request_path, UpstreamRewrite};
use crate::state::{CompiledRoute, GatewayState};
use crate::upstream::Upstream;
use pingora::http::RequestHeader;
use std::net::{IpAddr, Ipv4Addr};

/// The peer of a connection that is not over IP, as the gateway sees it.
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
use std::sync::Arc;
use std::time::Instant;

/// Per-request state shared between the filters.
pub struct RequestCtx {
    /// The configuration this request is served with, from start to end.
    pub state: Arc<GatewayState>,
    pub route: Option<usize>,
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
        }
    }

    /// Takes in where the request goes and what to send upstream.
    pub fn routed(&mut self, routed: Routed) {
        self.route = Some(routed.route);
        self.path = routed.rewritten_path;
        self.upstream_target = routed.upstream_target;
        self.upstream_host = routed.upstream_host;
    }

    /// Takes in what the limits said, for the headers and the access log.
    pub fn judged(&mut self, report: LimitReport) {
        self.rate = report.rate;
        self.verdict = report.verdict;
        self.client = report.client;
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

    /// What the upstream is sent instead of the head as received from
    /// `peer` (the socket's IP; `None` when not over IP): the routed target
    /// and `Host` (taken: asked once), `peer` appended to
    /// `X-Forwarded-For`, and the identity header removed unless `peer` is
    /// a trusted proxy — the upstream must not take a client's own for it.
    pub fn upstream_rewrite(&mut self, peer: Option<IpAddr>) -> UpstreamRewrite<'_> {
        let trusted = self.state.client_ip.is_trusted(peer.unwrap_or(LOOPBACK));
        UpstreamRewrite {
            target: self.upstream_target.take(),
            host: self.upstream_host.take(),
            remove: self.state.identity.trusted_header().filter(|_| !trusted),
            forwarded_for: peer,
        }
    }

    /// The canonical path of `req`, this context's request.
    pub fn path<'a>(&'a self, req: &'a RequestHeader) -> &'a str {
        request_path(&self.path, req)
    }

    /// The access-log line of this request, which ended with `status`.
    pub fn log_line<'a>(
        &'a self,
        req: &'a RequestHeader,
        status: u16,
        client: IpAddr,
    ) -> AccessLogLine<'a> {
        let (ctx, state, route) = (self, &self.state, self.route());
        let upstream = match route.map(|r| &r.action) {
            Some(RouteAction::Upstream(u)) if ctx.upstream_addr.is_some() => {
                Some(state.upstreams[*u].name())
            }
            _ => None,
        };
        let verdict = ctx.verdict;
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
        }
    }
}
