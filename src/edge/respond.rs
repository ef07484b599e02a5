//! The gateway's own answers on a Pingora session: rejections (JSON, or
//! gRPC's trailers-only form for a gRPC call), fixed replies, the answer to
//! an upstream failure, and the wait of a delayed request.

use crate::config::forward::CorsPolicy;
use crate::edge::shutdown_delay::Draining;
use crate::observe::metrics::Metrics;
use crate::policy::state::{CompiledRoute, GatewayState};
use crate::policy::{self, HeldLeases, Rejection, Reply};
use crate::request::client_cert::{ClientCert, VerifiedClientCert};
use crate::request::drop_foreign_upgrade;
use http::{header, HeaderName, HeaderValue};
use pingora::http::ResponseHeader;
use pingora::prelude::Result;
use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, ErrorSource, ErrorType};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

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

/// A delayed request's turn (`on_limit: delay`): waits its delay, counted
/// in `waiting` and observed in the route's delay histogram. False when
/// the client left meanwhile: the units reserved for it are given back.
/// True at once for a request that is not delayed.
pub(crate) async fn take_turn(
    session: &mut Session,
    held: &mut HeldLeases,
    state: &GatewayState,
    route: &CompiledRoute,
    waiting: &prometheus::IntGauge,
) -> bool {
    let wait = held.delay();
    if wait.is_zero() {
        return true;
    }
    if let Some(delays) = &route.delays {
        delays.observe(wait.as_secs_f64());
    }
    waiting.inc();
    let stayed = wait_turn(session, wait).await;
    waiting.dec();
    if stayed {
        held.waited();
    } else {
        held.give_back(state, route).await;
    }
    stayed
}

/// What every answer sluice writes for a request carries besides its own
/// headers: the configured `Server` header and the request's ID.
#[derive(Debug, Clone, Copy, Default)]
pub struct Voice<'a> {
    /// `server.server_header`, if set.
    pub server: Option<&'a str>,
    /// The request ID header and the request's ID.
    pub request_id: Option<(&'a HeaderName, &'a HeaderValue)>,
    /// The route's CORS policy and the request's allowed origin, if any.
    pub cors: Option<(&'a CorsPolicy, Option<&'a HeaderValue>)>,
    /// The shape of the route's error bodies (`errors`).
    pub errors: crate::config::ErrorStyle,
}

/// Sets up the session of a request that just arrived: the wait allowed
/// between two reads of its body (the head is the front door's), no
/// `Upgrade` the gateway does not pass, and — while the process drains
/// before a stop — no keep-alive (`Connection: close`), so the client
/// opens its next connection elsewhere.
pub fn prepare(session: &mut Session, body_timeout: Duration, draining: &Draining) {
    session.set_read_timeout(Some(body_timeout));
    drop_foreign_upgrade(session.req_header_mut());
    if draining.is_draining() {
        session.set_keepalive(None);
    }
}

/// Writes an answer made before the limits.
pub async fn early(
    session: &mut Session,
    early: policy::Early<'_>,
    voice: &Voice<'_>,
) -> Result<bool> {
    match early {
        policy::Early::Reply(reply) => respond(session, reply, voice).await,
        policy::Early::Reject(rejection) => reject(session, &rejection, voice).await,
    }
}

/// Writes a rejection: in gRPC's form for a gRPC call, else as JSON.
pub(crate) async fn reject(
    session: &mut Session,
    rejection: &Rejection<'_>,
    voice: &Voice<'_>,
) -> Result<bool> {
    if policy::is_grpc(session.req_header()) {
        respond(session, rejection.grpc_reply(), voice).await
    } else {
        respond(session, rejection.reply_in(voice.errors), voice).await
    }
}

/// Writes a reply the gateway makes itself, and ends the request, with
/// `voice`'s headers. A gRPC reply (no body) is trailers-only: one header
/// block that ends the stream.
pub async fn respond(session: &mut Session, reply: Reply, voice: &Voice<'_>) -> Result<bool> {
    // No case map: every name sluice writes is lower case already, and the
    // map would cost each header a second insert on every denial.
    let mut response = ResponseHeader::build_no_case(reply.status, Some(reply.headers.len() + 4))?;
    if let Some(server) = voice.server {
        response.insert_header(header::SERVER, server)?;
    }
    if let Some((name, id)) = voice.request_id {
        response.insert_header(name.clone(), id.clone())?;
    }
    if let Some((policy, allowed)) = voice.cors {
        crate::request::cors::dress(&mut response, policy, allowed)?;
    }
    if reply.status != 204 {
        response.insert_header(header::CONTENT_TYPE, reply.content_type)?;
    }
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
    // A 204 has neither a body nor a length (RFC 9110, 8.6).
    let no_content = reply.status == 204;
    if !no_content {
        response.insert_header(header::CONTENT_LENGTH, reply.body.len())?;
    }
    let head_only =
        no_content || trailers_only || session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(response), head_only)
        .await?;
    if !head_only {
        session.write_response_body(Some(reply.body), true).await?;
    }
    Ok(true)
}

/// Answers an upstream or gateway failure `e` in sluice's voice (see
/// [`rejection_for`]), unless a response head is already on its way; the
/// status to log (0: the client is gone), and the connection is never
/// reused.
pub(crate) async fn fail_to_proxy(
    session: &mut Session,
    e: &Error,
    route: Option<&str>,
    voice: &Voice<'_>,
) -> FailToProxy {
    let Some(rejection) = rejection_for(e, route) else {
        return FailToProxy {
            error_code: 0,
            can_reuse_downstream: false,
        };
    };
    let code = rejection.reply().status;
    // Once a response head is on its way, nothing more can be said.
    if session.response_written().is_none() {
        if let Err(e) = reject(session, &rejection, voice).await {
            log::debug!("could not send the {code} to the client: {e}");
        }
    }
    FailToProxy {
        error_code: code,
        can_reuse_downstream: false,
    }
}

/// Counts what the client's side did wrong in `e` (a body that stalled)
/// or what sluice refused it for (a body over the cap: `body_too_large`).
pub(crate) fn count_downstream_rejection(
    metrics: &Metrics,
    e: Option<&Error>,
    body_too_large: bool,
) {
    let stalled = e.is_some_and(|e| {
        e.etype == ErrorType::ReadTimedout && e.esource == ErrorSource::Downstream
    });
    let reason = match (stalled, body_too_large) {
        (true, _) => "body_timeout",
        (false, true) => "body_too_large",
        (false, false) => return,
    };
    metrics
        .downstream_rejected
        .with_label_values(&[reason])
        .inc();
}

/// The socket peer's IP; `None` when the connection is not over IP.
pub(crate) fn socket_ip(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
}

/// The status a request ended with: the one written; 499 (nginx's word)
/// for a client that left while its request waited; else 0.
pub(crate) fn final_status(session: &Session, abandoned: bool) -> u16 {
    session
        .response_written()
        .map(|r| r.status.as_u16())
        .unwrap_or(if abandoned { 499 } else { 0 })
}

/// The socket peer's IP (loopback if the connection is not over IP).
pub(crate) fn peer_ip(session: &Session) -> IpAddr {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The connection's client certificate, if its listener verified one
/// (see `client_cert`): kept with the connection's TLS digest.
pub fn client_cert(session: &Session) -> Option<Arc<ClientCert>> {
    let digest = session.digest()?.ssl_digest.as_ref()?;
    let verified = digest.extension.get::<VerifiedClientCert>()?;
    Some(Arc::clone(&verified.0))
}

/// How an upstream or gateway failure `e` is answered for `route`: 502
/// when the upstream cannot be reached or breaks the exchange, 504 when it
/// does not connect or answer in time, 400 for a request the client broke,
/// 500 for the gateway's own fault; `None` for a client already gone.
pub(crate) fn rejection_for<'r>(e: &Error, route: Option<&'r str>) -> Option<Rejection<'r>> {
    match (e.etype(), e.esource()) {
        (ErrorType::HTTPStatus(504), _) => Some(Rejection::GatewayTimeout { route }),
        (ErrorType::HTTPStatus(400), _) => Some(Rejection::BadRequest),
        (ErrorType::HTTPStatus(413), _) => Some(Rejection::PayloadTooLarge { route }),
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
    }
}
