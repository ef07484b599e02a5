//! The consumers API on the admin listener, for API keys kept in Redis
//! (`identity.api_key.store: redis`):
//!
//! - `POST /v1/consumers/{id}/keys` creates a key and returns it, once:
//!   `201 {"key": "...", "key_id": "<first 12 hex of its hash>"}`; a JSON
//!   body `{"plan": "pro"}` gives the key a plan;
//! - `GET /v1/consumers/{id}/keys` lists the ids of the consumer's keys;
//! - `DELETE /v1/consumers/{id}/keys/{key_id}` revokes one: every instance
//!   refuses it within `cache_ttl`;
//! - `GET /v1/consumers` lists the consumers that have keys made here.
//!
//! Every call needs `Authorization: Bearer <admin token>`
//! (`server.admin_token_env`), on any listener address: this API hands out
//! credentials.

use crate::admin::api::{authorize, error, Answer, Guard};
use crate::config::consumers::valid_id;
use crate::policy::identity::key_store::RedisKeys;
use crate::policy::state::GatewayState;
use http::{Method, StatusCode};
use serde_json::json;

/// Whether `path` is the consumers API's.
pub fn handles(path: &str) -> bool {
    path == "/v1/consumers" || path.starts_with("/v1/consumers/")
}

/// Answers one call: `method` on `path`, with the `Authorization` header's
/// value and the request body.
pub async fn answer(
    state: &GatewayState,
    method: &Method,
    path: &str,
    authorization: Option<&[u8]>,
    body: &[u8],
) -> Answer {
    if let Err(refusal) = authorize(state, authorization, Guard::TokenOnly) {
        return refusal;
    }
    let Some(store) = state.identity.api_keys().and_then(|k| k.redis_store()) else {
        let reason = "keys are managed here only with identity.api_key.store: redis";
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            json!({ "reason": reason }),
        );
    };
    if path == "/v1/consumers" {
        return list(store, state, method).await;
    }
    let parts: Vec<&str> = path
        .trim_start_matches("/v1/consumers/")
        .split('/')
        .collect();
    let (consumer, key_id) = match parts[..] {
        [consumer, "keys"] => (consumer, None),
        [consumer, "keys", key_id] => (consumer, Some(key_id)),
        _ => return error(StatusCode::NOT_FOUND, "not_found", json!({})),
    };
    if !valid_id(consumer) {
        return error(StatusCode::BAD_REQUEST, "bad_consumer_id", json!({}));
    }
    let decider = &state.decider;
    let result = match (method, key_id) {
        (&Method::POST, None) => {
            let plan = match plan_of(body) {
                Ok(plan) => plan,
                Err(refusal) => return refusal,
            };
            store
                .create(consumer, plan.as_deref(), decider)
                .await
                .map(|(key, key_id)| (StatusCode::CREATED, json!({ "key": key, "key_id": key_id })))
        }
        (&Method::GET, None) => store
            .list(consumer, decider)
            .await
            .map(|ids| (StatusCode::OK, json!({ "consumer": consumer, "keys": ids }))),
        (&Method::DELETE, Some(key_id)) if is_key_id(key_id) => store
            .revoke(consumer, key_id, decider)
            .await
            .map(|revoked| match revoked {
                true => (StatusCode::OK, json!({ "revoked": key_id })),
                false => error(StatusCode::NOT_FOUND, "not_found", json!({})),
            }),
        (&Method::DELETE, Some(_)) => {
            return error(StatusCode::BAD_REQUEST, "bad_key_id", json!({}))
        }
        _ => {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                json!({}),
            )
        }
    };
    result.unwrap_or_else(|e| {
        log::warn!("consumers API: Redis could not answer: {e}");
        error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", json!({}))
    })
}

/// `GET /v1/consumers`: the consumers with keys made here.
async fn list(store: &RedisKeys, state: &GatewayState, method: &Method) -> Answer {
    if method != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            json!({}),
        );
    }
    store
        .consumers(&state.decider)
        .await
        .map(|ids| (StatusCode::OK, json!({ "consumers": ids })))
        .unwrap_or_else(|e| {
            log::warn!("consumers API: Redis could not answer: {e}");
            error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", json!({}))
        })
}

/// A key id: the first 12 lower-case hex digits of a key's hash.
fn is_key_id(text: &str) -> bool {
    text.len() == 12
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The `plan` of a creation's JSON body (an empty body: none).
fn plan_of(body: &[u8]) -> Result<Option<String>, Answer> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let bad = || {
        error(
            StatusCode::BAD_REQUEST,
            "bad_body",
            json!({ "expected": "{\"plan\": \"NAME\"}" }),
        )
    };
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| bad())?;
    match value.get("plan") {
        None => Ok(None),
        Some(serde_json::Value::String(plan)) if valid_id(plan) => Ok(Some(plan.clone())),
        Some(_) => Err(bad()),
    }
}
