//! What the admin APIs share: their answer (a status and a JSON body), the
//! error body, the admin-token check and query parameters read once.

use crate::policy::state::GatewayState;
use crate::request::parts::{query_value, PartValue};
use http::StatusCode;
use serde_json::json;
use std::borrow::Cow;
use std::net::SocketAddr;

/// An admin API's answer: a status and a JSON body.
pub(crate) type Answer = (StatusCode, serde_json::Value);

/// When an admin API may be used without the admin token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Without `server.admin_token_env`, open on a loopback admin listener
    /// (the usage and top APIs: reads, and resets of one key).
    LoopbackOpen,
    /// Always needs the token, whatever the listener's address (the
    /// consumers API hands out credentials).
    TokenOnly,
}

/// The token check: `Ok` when a request with this `Authorization` value
/// may use an API kept by `guard`; else the 401 or 403 to answer.
pub(crate) fn authorize(
    state: &GatewayState,
    authorization: Option<&[u8]>,
    guard: Guard,
) -> Result<(), Answer> {
    let Some(token) = &state.config.server.admin_token else {
        let reason = match guard {
            Guard::LoopbackOpen if on_loopback(state) => return Ok(()),
            Guard::LoopbackOpen => {
                "the admin listener is not on loopback: set server.admin_token_env to use the admin API"
            }
            Guard::TokenOnly => "set server.admin_token_env to manage API keys",
        };
        return Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            json!({ "reason": reason }),
        ));
    };
    let expected = format!("Bearer {token}");
    if constant_time_eq(authorization.unwrap_or(b""), expected.as_bytes()) {
        Ok(())
    } else {
        Err(error(StatusCode::UNAUTHORIZED, "unauthorized", json!({})))
    }
}

/// Whether the admin listener's configured address is a loopback one.
fn on_loopback(state: &GatewayState) -> bool {
    state
        .config
        .server
        .admin
        .parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback())
}

/// Compares without stopping at the first difference (the token's bytes
/// must not leak through timing).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An error answer: `extra` with `error` set to `what`.
pub fn error(status: StatusCode, what: &str, mut extra: serde_json::Value) -> Answer {
    if let Some(object) = extra.as_object_mut() {
        object.insert("error".into(), json!(what));
    }
    (status, extra)
}

/// The query parameter `name`, percent-decoded; given twice with different
/// values, an error.
pub fn parameter<'q>(query: &'q [u8], name: &str) -> Result<Option<Cow<'q, [u8]>>, Answer> {
    match query_value(query, name) {
        PartValue::One(value) => Ok(Some(value)),
        PartValue::Missing => Ok(None),
        PartValue::Ambiguous => Err(error(
            StatusCode::BAD_REQUEST,
            "ambiguous_parameter",
            json!({ "parameter": name }),
        )),
    }
}

/// `raw` percent-encoded for a query string: everything but unreserved
/// bytes.
pub(crate) fn encode(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len() * 3);
    for &b in raw {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
