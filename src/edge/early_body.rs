//! The request body read before the decision, for a route whose limits
//! reserve by it (`reserve: {request_json: …}`), and sent upstream whole,
//! byte for byte.
//!
//! Pingora sends a body read before the upstream is chosen only through
//! the session's retry buffer, which holds at most 64 KiB (and keeps
//! nothing once more went through it). So the body is read here into its
//! own buffer, with retry buffering turned on only for its last 64 KiB or
//! less (`Content-Length` says where they start): Pingora then sends that
//! tail as the whole body, and the request body filter puts the full body
//! in its place ([`RequestCtx::early_body`](crate::edge::context::RequestCtx)).
//! A body without a length is buffered from its start, so it can be at most
//! 64 KiB (larger: 411, send a `Content-Length`).

use crate::edge::context::RequestCtx;
use crate::policy::Rejection;
use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;

/// What Pingora's retry buffer holds (`BODY_BUF_LIMIT` in pingora-core).
pub const RETRY_BUFFER_BYTES: u64 = 64 * 1024;

/// The most a route without a body cap reads before the decision.
pub const UNCAPPED_READ_BYTES: u64 = 1024 * 1024;

/// Reads the request body before the decision when the route's limits
/// read it, into `ctx.early_body`. `Err` with the rejection to answer: 413
/// over the route's cap, 411 for a body without a length over what can be
/// forwarded; `Ok(Err)` for a client that failed to send it (closed, timed
/// out), to end the request with.
pub async fn read<'r>(
    session: &mut Session,
    ctx: &mut RequestCtx,
    route: &'r crate::policy::state::CompiledRoute,
) -> Result<pingora::Result<()>, Rejection<'r>> {
    if !route.reads_body {
        return Ok(Ok(()));
    }
    let cap = match route.max_body_bytes {
        0 => UNCAPPED_READ_BYTES,
        cap => cap,
    };
    let declared = declared_length(session);
    if declared.is_some_and(|length| length > cap) {
        ctx.body_too_large = true;
        return Err(Rejection::PayloadTooLarge {
            route: Some(&route.name),
        });
    }
    if expects_continue(session) {
        if let Err(e) = session.write_continue_response().await {
            return Ok(Err(e));
        }
    }
    let mut body = BytesMut::new();
    let mut buffering = false;
    loop {
        let remaining = declared.map(|length| length.saturating_sub(body.len() as u64));
        if !buffering && remaining.is_none_or(|r| r <= RETRY_BUFFER_BYTES) {
            session.enable_retry_buffering();
            buffering = true;
        }
        let chunk = match session.read_request_body().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => return Ok(Err(e)),
        };
        body.extend_from_slice(&chunk);
        if body.len() as u64 > cap {
            ctx.body_too_large = true;
            return Err(Rejection::PayloadTooLarge {
                route: Some(&route.name),
            });
        }
        if declared.is_none() && body.len() as u64 > RETRY_BUFFER_BYTES {
            return Err(Rejection::LengthRequired { route: &route.name });
        }
    }
    ctx.body_bytes = body.len() as u64;
    ctx.early_body = Some(Bytes::from(body));
    Ok(Ok(()))
}

/// The body's `Content-Length`, when it has one.
fn declared_length(session: &Session) -> Option<u64> {
    let value = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)?;
    value.to_str().ok()?.trim().parse().ok()
}

/// Whether the client waits for `100 Continue` before it sends the body.
fn expects_continue(session: &Session) -> bool {
    session
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}
