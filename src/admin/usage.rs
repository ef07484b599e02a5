//! The usage API on the admin listener:
//! `GET /v1/usage?route=R&limit=L&<part>=<value>…` reports a key's use of a
//! limit without consuming it; `DELETE` with the same parameters resets the
//! key (its count and its penalty box). One parameter per key part of the
//! limit, named as `overrides.match` names them (`ip`, `user`, `method`,
//! `path`, `header.NAME`, `query.NAME`, `cookie.NAME`, `param.NAME`), with
//! the raw value a request would carry; `plan=NAME` picks the plan for a
//! limit whose number comes from one. Without it, a limit that takes its
//! number from the consumer's plan answers for the plan of the consumer
//! `user` names, read from the consumers store.
//!
//! Answers are JSON. With `server.admin_token_env` the API requires
//! `Authorization: Bearer <token>`; without it, it answers only on a
//! loopback admin listener (anyone who reaches a public one could otherwise
//! read or clear any key's count).

use crate::admin::api::{authorize, encode, error, parameter, Answer, Guard};
use crate::config::LimitConfig;
use crate::config::{KeyPart, PlanSource};
use crate::limiter::Decision;
use crate::policy::keys::build_key;
use crate::policy::rate_headers::ceil_secs;
use crate::policy::state::{CompiledLimit, CompiledRoute, GatewayState};
use crate::policy::{applied_limit, counter_name, limit_check};
use crate::request::parts::{PartValue, RequestParts};
use http::StatusCode;
use serde_json::json;
use std::borrow::Cow;
use std::net::IpAddr;

/// Answers one usage API request: `method`, the raw query string, the
/// `Authorization` header's value.
pub async fn answer(
    state: &GatewayState,
    method: &http::Method,
    query: &[u8],
    authorization: Option<&[u8]>,
) -> Answer {
    if let Err(refusal) = authorize(state, authorization, Guard::LoopbackOpen) {
        return refusal;
    }
    let reset = match *method {
        http::Method::GET => false,
        http::Method::DELETE => true,
        _ => {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                json!({}),
            )
        }
    };
    let (route, limit) = match route_and_limit(state, query) {
        Ok(found) => found,
        Err(e) => return e,
    };
    let c = &limit.config;

    let plan = match plan_asked(state, c, query).await {
        Ok(plan) => plan,
        Err(e) => return e,
    };
    let (key, quota) = match key_and_quota(state, route, c, query, plan.as_deref()) {
        Ok(found) => found,
        Err(e) => return e,
    };
    let mut check = limit_check(c, &key, quota);
    check.cost = 1;

    if reset {
        return match state.decider.reset(&[check]).await {
            Ok(()) => (
                StatusCode::OK,
                json!({ "route": route.name, "limit": c.name, "reset": true }),
            ),
            Err(e) => unavailable(&e),
        };
    }
    match state.decider.peek(&[check]).await {
        Ok(decisions) => match decisions.first() {
            Some(d) => usage_of(route, c, d, quota, plan.as_deref()),
            None => unavailable(&"no decision"),
        },
        Err(e) => unavailable(&e),
    }
}

/// The route and limit the `route` and `limit` parameters name.
fn route_and_limit<'s>(
    state: &'s GatewayState,
    query: &[u8],
) -> Result<(&'s CompiledRoute, &'s CompiledLimit), Answer> {
    let required = |name: &str| match parameter(query, name) {
        Ok(Some(value)) => Ok(String::from_utf8_lossy(&value).into_owned()),
        Ok(None) => Err(error(
            StatusCode::BAD_REQUEST,
            "missing_parameter",
            json!({ "parameter": name }),
        )),
        Err(e) => Err(e),
    };
    let (route_name, limit_name) = (required("route")?, required("limit")?);
    let Some(route) = state.compiled.iter().find(|r| r.name == route_name) else {
        let body = json!({ "route": route_name });
        return Err(error(StatusCode::NOT_FOUND, "unknown_route", body));
    };
    let Some(limit) = route.limits.iter().find(|l| l.config.name == limit_name) else {
        let body = json!({ "route": route_name, "limit": limit_name });
        return Err(error(StatusCode::NOT_FOUND, "unknown_limit", body));
    };
    Ok((route, limit))
}

/// The usage report of limit `c` of `route`, from the limiter's decision
/// `d`, for a key whose limit is `quota`.
fn usage_of(
    route: &CompiledRoute,
    c: &LimitConfig,
    d: &Decision,
    quota: u64,
    plan: Option<&str>,
) -> Answer {
    let remaining = d.remaining.min(quota);
    let mut answer = json!({
        "route": route.name,
        "limit": c.name,
        "quota": quota,
        "used": quota - remaining,
        "remaining": remaining,
        "reset_seconds": ceil_secs(d.reset),
    });
    if c.limit_from.is_some() {
        answer["plan"] = json!(plan);
    }
    (StatusCode::OK, answer)
}

/// The plan the answer is for: the `plan` parameter; else, for a limit
/// that takes its number from the consumer's plan and whose key has
/// `user`, the plan of the consumer the `user` parameter names (from the
/// consumers store, as a request with its key would get).
async fn plan_asked(
    state: &GatewayState,
    c: &LimitConfig,
    query: &[u8],
) -> Result<Option<String>, Answer> {
    if let Some(plan) = parameter(query, "plan")? {
        return Ok(Some(String::from_utf8_lossy(&plan).into_owned()));
    }
    if c.limit_from != Some(PlanSource::ConsumerPlan) || !c.key.contains(&KeyPart::User) {
        return Ok(None);
    }
    let (Some(user), Some(keys)) = (parameter(query, "user")?, state.identity.api_keys()) else {
        return Ok(None);
    };
    let user = String::from_utf8_lossy(&user);
    keys.plan_of_consumer(&user, &state.decider)
        .await
        .map_err(|e| unavailable(&e))
}

/// The counter key the parameters name, and the limit that applies to it.
fn key_and_quota(
    state: &GatewayState,
    route: &CompiledRoute,
    c: &LimitConfig,
    query: &[u8],
    plan: Option<&str>,
) -> Result<(String, u64), Answer> {
    let values = part_values(c, query)?;
    let value_of = |wanted: &KeyPart| {
        values
            .iter()
            .find(|(part, _)| part == wanted)
            .map(|(_, v)| v.as_slice())
    };
    let ip_text = ip_key_text(state, value_of(&KeyPart::Ip))?;
    // The parts as a request would carry them (a query parameter as its
    // encoded pair, so that it decodes to the value given).
    let query_pairs: String = values
        .iter()
        .filter_map(|(part, value)| match part {
            KeyPart::Query(name) => Some(format!("{}={}", encode(name.as_bytes()), encode(value))),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("&");
    let header = |name: &str| value_of(&KeyPart::Header(name.to_string()));
    let cookie = |name: &str| {
        value_of(&KeyPart::Cookie(name.to_string()))
            .map_or(PartValue::Missing, |v| PartValue::One(Cow::Borrowed(v)))
    };
    let param_part = |name: &str| {
        value_of(&KeyPart::Param(name.to_string())).and_then(|v| std::str::from_utf8(v).ok())
    };
    let method_text = value_of(&KeyPart::Method)
        .and_then(|m| std::str::from_utf8(m).ok())
        .unwrap_or("");
    let client_cert = named_certificate(c, &value_of);
    let parts = RequestParts {
        ip: &ip_text,
        user: value_of(&KeyPart::User),
        method: method_text,
        path: value_of(&KeyPart::Path).unwrap_or(b""),
        header: &header,
        query: query_pairs.as_bytes(),
        cookie: &cookie,
        param: &param_part,
        client_cert: client_cert.as_ref(),
    };
    let (scope, name) = counter_name(route, c);
    let prefix = &state.config.limiter.redis.key_prefix;
    let key = match build_key(
        prefix,
        scope,
        name,
        &c.key,
        &c.credential_parts,
        &parts,
        false,
    ) {
        Ok(Some(key)) => key,
        _ => return Err(error(StatusCode::BAD_REQUEST, "bad_part", json!({}))),
    };
    let plan_of = |_: &PlanSource| plan.map(str::to_string);
    let quota = applied_limit(c, &parts, &plan_of);
    Ok((key, quota))
}

/// The client certificate the parameters describe, when limit `c`'s key
/// reads one: its parts as the operator names them.
fn named_certificate<'v>(
    c: &LimitConfig,
    value_of: &impl Fn(&KeyPart) -> Option<&'v [u8]>,
) -> Option<crate::request::client_cert::ClientCert> {
    let text_of = |part: KeyPart| value_of(&part).map(|v| String::from_utf8_lossy(v).into_owned());
    let certificate_parts = [
        KeyPart::ClientCert,
        KeyPart::ClientSubject,
        KeyPart::ClientSan,
    ];
    certificate_parts
        .iter()
        .any(|p| c.key.contains(p))
        .then(|| crate::request::client_cert::ClientCert {
            fingerprint: text_of(KeyPart::ClientCert).unwrap_or_default(),
            subject: text_of(KeyPart::ClientSubject).unwrap_or_default(),
            subject_cn: None,
            san_dns: Vec::new(),
            san_uri: text_of(KeyPart::ClientSan).into_iter().collect(),
        })
}

/// Each part of limit `c`'s key with the value its parameter gives; a
/// part without one (or with an empty one) is an error.
fn part_values(c: &LimitConfig, query: &[u8]) -> Result<Vec<(KeyPart, Vec<u8>)>, Answer> {
    let mut values = Vec::with_capacity(c.key.len());
    for part in &c.key {
        let label = part.label();
        match parameter(query, &label)? {
            Some(value) if !value.is_empty() => values.push((part.clone(), value.into_owned())),
            _ => {
                let body = json!({ "part": label });
                return Err(error(StatusCode::BAD_REQUEST, "missing_part", body));
            }
        }
    }
    Ok(values)
}

/// The `ip` parameter as the key spells the client IP (empty when the key
/// has no `ip` part); not an IP address, an error.
fn ip_key_text(state: &GatewayState, raw: Option<&[u8]>) -> Result<String, Answer> {
    let Some(raw) = raw else {
        return Ok(String::new());
    };
    std::str::from_utf8(raw)
        .ok()
        .and_then(|t| t.parse::<IpAddr>().ok())
        .map(|ip| state.client_ip.key_text(ip))
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, "bad_part", json!({ "part": "ip" })))
}

fn unavailable(e: &dyn std::fmt::Display) -> Answer {
    log::warn!("usage API: the limiter could not answer: {e}");
    error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", json!({}))
}
