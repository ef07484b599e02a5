//! The consumers API on the admin listener, for API keys kept in Redis
//! (`identity.api_key.store: redis`):
//!
//! - `POST /v1/consumers/{id}/keys` creates a key and returns it, once:
//!   `201 {"key": "...", "key_id": "<first 12 hex of its hash>"}`; a JSON
//!   body `{"plan": "pro"}` also makes `pro` the consumer's plan;
//! - `GET /v1/consumers/{id}/keys` lists the ids of the consumer's keys;
//! - `DELETE /v1/consumers/{id}/keys/{key_id}` revokes one: every instance
//!   refuses it within `cache_ttl`;
//! - `GET /v1/consumers/{id}` shows the consumer: its plan, the plan its
//!   requests get, and each key's id, creation time and per-key plan;
//! - `PUT` (or `PATCH`) `/v1/consumers/{id}` with `{"plan": "pro"}` (or
//!   `{"plan": null}`) sets the consumer's plan for all its keys: every
//!   instance applies it within `cache_ttl`;
//! - `GET /v1/consumers` lists the consumers that have keys made here,
//!   and the plans a consumer may have.
//!
//! A plan is one some limit with `limit_from: {consumer: plan}` lists;
//! any other is refused (`400 unknown_plan`, with the plans there are), so
//! a typo never quietly gives a customer the default number.
//!
//! Every call needs `Authorization: Bearer <admin token>`
//! (`server.admin_token_env`), on any listener address: this API hands out
//! credentials.

use crate::admin::api::{authorize, error, Answer, Guard};
use crate::config::consumers::valid_id;
use crate::limiter::LimiterError;
use crate::policy::identity::key_store::{ConsumerView, RedisKeys};
use crate::policy::state::GatewayState;
use http::{Method, StatusCode};
use serde_json::json;
use std::collections::BTreeSet;

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
    let (consumer, keys, key_id) = match parts[..] {
        [consumer] => (consumer, false, None),
        [consumer, "keys"] => (consumer, true, None),
        [consumer, "keys", key_id] => (consumer, true, Some(key_id)),
        _ => return error(StatusCode::NOT_FOUND, "not_found", json!({})),
    };
    if !valid_id(consumer) {
        return error(StatusCode::BAD_REQUEST, "bad_consumer_id", json!({}));
    }
    let call = Call {
        store,
        state,
        method,
        consumer,
        body,
    };
    let result = match (keys, key_id) {
        (false, _) => call.on_consumer().await,
        (true, key_id) => call.on_keys(key_id).await,
    };
    result.unwrap_or_else(|e| {
        log::warn!("consumers API: Redis could not answer: {e}");
        error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", json!({}))
    })
}

/// A call about one consumer.
struct Call<'a> {
    store: &'a RedisKeys,
    state: &'a GatewayState,
    method: &'a Method,
    consumer: &'a str,
    body: &'a [u8],
}

/// An answer, or Redis failing to give one.
type Outcome = Result<Answer, LimiterError>;

impl Call<'_> {
    /// `/v1/consumers/{id}`: `GET` shows the consumer, `PUT`/`PATCH` set
    /// its plan.
    async fn on_consumer(&self) -> Outcome {
        let (store, decider, consumer) = (self.store, &self.state.decider, self.consumer);
        match *self.method {
            Method::GET => store
                .describe(consumer, decider)
                .await
                .map(|view| shown_consumer(self.state, consumer, view)),
            Method::PUT | Method::PATCH => {
                let plan = match plan_of(self.body, self.state.consumer_plans.known(), true) {
                    Ok(Some(plan)) => plan,
                    Ok(None) => return Ok(bad_body()),
                    Err(refusal) => return Ok(refusal),
                };
                store.set_plan(consumer, plan.as_deref(), decider).await?;
                log::info!(
                    target: "sluice::audit",
                    "consumer {consumer}: plan set to {}",
                    plan.as_deref().unwrap_or("none (each limit's own number)")
                );
                let body = json!({ "consumer": consumer, "plan": plan });
                Ok((StatusCode::OK, body))
            }
            _ => Ok(not_allowed()),
        }
    }

    /// `/v1/consumers/{id}/keys[/{key_id}]`: `POST` creates a key, `GET`
    /// lists them, `DELETE` revokes one.
    async fn on_keys(&self, key_id: Option<&str>) -> Outcome {
        let (store, decider, consumer) = (self.store, &self.state.decider, self.consumer);
        match (self.method, key_id) {
            (&Method::POST, None) => {
                let plan = match plan_of(self.body, self.state.consumer_plans.known(), false) {
                    Ok(plan) => plan.flatten(),
                    Err(refusal) => return Ok(refusal),
                };
                let (key, key_id) = store.create(consumer, plan.as_deref(), decider).await?;
                Ok((StatusCode::CREATED, json!({ "key": key, "key_id": key_id })))
            }
            (&Method::GET, None) => {
                let ids = store.list(consumer, decider).await?;
                Ok((StatusCode::OK, json!({ "consumer": consumer, "keys": ids })))
            }
            (&Method::DELETE, Some(key_id)) if is_key_id(key_id) => {
                Ok(match store.revoke(consumer, key_id, decider).await? {
                    true => (StatusCode::OK, json!({ "revoked": key_id })),
                    false => error(StatusCode::NOT_FOUND, "not_found", json!({})),
                })
            }
            (&Method::DELETE, Some(_)) => {
                Ok(error(StatusCode::BAD_REQUEST, "bad_key_id", json!({})))
            }
            _ => Ok(not_allowed()),
        }
    }
}

fn not_allowed() -> Answer {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        json!({}),
    )
}

/// `GET /v1/consumers`: the consumers with keys made here.
async fn list(store: &RedisKeys, state: &GatewayState, method: &Method) -> Answer {
    if method != Method::GET {
        return not_allowed();
    }
    store
        .consumers(&state.decider)
        .await
        .map(|ids| {
            let plans = state.consumer_plans.known();
            (StatusCode::OK, json!({ "consumers": ids, "plans": plans }))
        })
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

/// `GET /v1/consumers/{id}`: 404 for a consumer with neither keys nor a
/// plan; else its plan, the plan its requests get (its own, else the one
/// its keys name) and its keys.
fn shown_consumer(state: &GatewayState, consumer: &str, view: ConsumerView) -> Answer {
    if view.plan.is_none() && view.keys.is_empty() {
        return error(StatusCode::NOT_FOUND, "not_found", json!({}));
    }
    let applies = view.applied_plan();
    let known = state.consumer_plans.known();
    let applied_known = applies.as_ref().is_none_or(|p| known.contains(p));
    (
        StatusCode::OK,
        json!({
            "consumer": consumer,
            "plan": view.plan,
            "applied_plan": applies,
            "plan_known": applied_known,
            "keys": view.keys,
        }),
    )
}

fn bad_body() -> Answer {
    error(
        StatusCode::BAD_REQUEST,
        "bad_body",
        json!({ "expected": "{\"plan\": \"NAME\"}" }),
    )
}

/// The `plan` of a JSON body: `None` when the body is empty or names no
/// plan, `Some(None)` for `"plan": null` (allowed only where
/// `null_clears`), `Some(Some(name))` for a plan in `known`. Any other
/// name is refused with the plans there are.
fn plan_of(
    body: &[u8],
    known: &BTreeSet<String>,
    null_clears: bool,
) -> Result<Option<Option<String>>, Answer> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| bad_body())?;
    if !value.is_object() {
        return Err(bad_body());
    }
    match value.get("plan") {
        None => Ok(None),
        Some(serde_json::Value::Null) if null_clears => Ok(Some(None)),
        Some(serde_json::Value::String(plan)) if known.contains(plan) => {
            Ok(Some(Some(plan.clone())))
        }
        Some(serde_json::Value::String(plan)) => Err(error(
            StatusCode::BAD_REQUEST,
            "unknown_plan",
            json!({
                "plan": plan,
                "plans": known,
                "reason": "no limit with limit_from: {consumer: plan} lists this plan",
            }),
        )),
        Some(_) => Err(bad_body()),
    }
}
