//! One try at the upstream: which server (another one than those already
//! tried, when there is one), with the route's timeouts, and whether a
//! failed try is tried again (`retries`). Limits are decided once, before
//! the first try; a retry never counts a request again.

use crate::edge::context::RequestCtx;
use pingora::prelude::HttpPeer;
use pingora::{Error, ErrorType};
use std::net::IpAddr;

/// Chooses the server for the next try of `ctx`'s request (`head` from
/// `peer`): the balancer's pick among the servers not tried yet (any, once
/// all were), with the route's timeouts. Counts a retry in
/// `sluice_upstream_retries_total`.
pub(crate) fn choose(
    ctx: &mut RequestCtx,
    head: &pingora::http::RequestHeader,
    peer: IpAddr,
    retries: &prometheus::IntCounterVec,
) -> pingora::Result<HttpPeer> {
    let upstream = ctx
        .upstream()
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "no upstream"))?;
    let key = ctx.balance_key(head, peer);
    let (mut chosen, name) = upstream.select(&key, &ctx.tried)?;
    ctx.attempts += 1;
    if let Some(trace) = ctx.trace.as_mut() {
        trace.upstream_try(&chosen._address);
    }
    if ctx.attempts > 1 {
        if let Some(route) = ctx.route() {
            retries.with_label_values(&[route.name.as_str()]).inc();
        }
    }
    if let Some(route) = ctx.route() {
        let timeouts = route.forward.timeouts;
        if let Some(connect) = timeouts.connect {
            chosen.options.connection_timeout = Some(connect);
        }
        if let Some(read) = timeouts.read {
            chosen.options.read_timeout = Some(read);
        }
    }
    // Only a route that retries needs to know which servers it tried.
    if let Some(addr) = chosen._address.as_inet().filter(|_| tries_left(ctx)) {
        ctx.tried.push(*addr);
    }
    if ctx.state.config.server.access_log {
        ctx.upstream_addr = Some(chosen._address.to_string());
    }
    ctx.server_name = name;
    Ok(chosen)
}

/// Whether the route may try once more.
fn tries_left(ctx: &RequestCtx) -> bool {
    ctx.route()
        .is_some_and(|r| ctx.attempts < r.forward.retries.attempts)
}

/// A connection that failed before the request was sent: tried again on
/// another server when the route retries `connect_error` and has tries
/// left (whatever the method: nothing reached the server).
pub(crate) fn connect_failed(
    ctx: &mut RequestCtx,
    peer: &HttpPeer,
    mut e: Box<Error>,
) -> Box<Error> {
    server_failed(ctx, peer, e.etype().as_str());
    if let Some(trace) = ctx.trace.as_mut() {
        trace.try_failed(format!("connect: {}", e.etype().as_str()));
    }
    let retry = tries_left(ctx)
        && ctx
            .route()
            .is_some_and(|r| r.forward.retries.on_connect_error);
    if retry {
        e.set_retry(true);
    }
    e
}

/// Counts a failure of `peer` (refused, reset, timed out: `what`) toward
/// its passive health.
fn server_failed(ctx: &RequestCtx, peer: &HttpPeer, what: &'static str) {
    if let (Some(upstream), Some(addr)) = (ctx.upstream(), peer._address.as_inet()) {
        if upstream
            .passive
            .failed(*addr, std::time::Instant::now(), what)
        {
            log::warn!(
                "upstream `{}`: server {addr} failed {} times: out for {:?}",
                upstream.name(),
                upstream.config.max_fails,
                upstream.config.fail_timeout
            );
        }
    }
}

/// An exchange with `peer` that broke after connecting: a failure of the
/// server unless it is the retry of a status; then Pingora's own rule
/// (an idempotent method, a body still held) decides whether to retry.
pub(crate) fn proxy_failed(
    ctx: &mut RequestCtx,
    peer: &HttpPeer,
    session: &pingora::proxy::Session,
    reused: bool,
    mut e: Box<Error>,
) -> Box<Error> {
    if !matches!(e.etype(), ErrorType::HTTPStatus(_))
        && e.esource() == &pingora::ErrorSource::Upstream
    {
        server_failed(ctx, peer, e.etype().as_str());
    }
    if let Some(trace) = ctx.trace.as_mut() {
        trace.try_failed(e.etype().as_str().to_string());
    }
    let truncated = session.as_ref().retry_buffer_truncated();
    if !session.req_header().method.is_idempotent() || truncated {
        e.set_retry(false);
    } else {
        e.retry.decide_reuse(reused);
    }
    e
}

/// Methods a server may be asked twice without a second effect.
fn idempotent(method: &http::Method) -> bool {
    use http::Method;
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(method)
}

/// An upstream response with `status`: the error that tries again when
/// the route retries that status for this idempotent `method` and has tries
/// left; the last try's response goes to the client as it is. Pingora
/// then refuses the retry if the request body went past what it kept.
pub fn answered(ctx: &mut RequestCtx, method: &http::Method, status: u16) -> pingora::Result<()> {
    if let Some(trace) = ctx.trace.as_mut() {
        trace.try_answered(status);
    }
    let retried = ctx
        .route()
        .is_some_and(|r| r.forward.retries.statuses.contains(&status));
    if !retried || !idempotent(method) || !tries_left(ctx) {
        return Ok(());
    }
    let why = format!("the server answered {status}: trying another");
    let mut e = Error::explain(ErrorType::HTTPStatus(status), why);
    e.set_retry(true);
    Err(e.into_up())
}
