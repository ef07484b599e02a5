//! The top limited keys on the admin listener:
//! `GET /v1/top?route=R&limit=L&n=20` lists the keys this instance denied
//! most in the last minute, with their counts, from each limit's sketch (see
//! [`top_keys`](crate::observe::top_keys) for the error bound). Without `limit`, the
//! route's limits together; without `route`, every limit's. The admin
//! token is required as for the usage API.

use crate::admin::api::{authorize, encode, error, parameter, Answer, Guard};
use crate::observe::top_keys::{TopKey, CAPACITY, SLICE, SLICES};
use crate::policy::state::{CompiledLimit, CompiledRoute, GatewayState};
use http::StatusCode;
use serde_json::json;
use std::time::Instant;

/// Keys listed when `n` is not given.
const DEFAULT_N: usize = 20;

/// Answers one `/v1/top` request: `method`, the raw query string, the
/// `Authorization` header's value.
pub fn answer(
    state: &GatewayState,
    method: &http::Method,
    query: &[u8],
    authorization: Option<&[u8]>,
) -> Answer {
    if let Err(refusal) = authorize(state, authorization, Guard::LoopbackOpen) {
        return refusal;
    }
    if method != http::Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            json!({}),
        );
    }
    let text = |name: &str| {
        parameter(query, name).map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned()))
    };
    let (route, limit, n) = match (text("route"), text("limit"), text("n")) {
        (Ok(route), Ok(limit), Ok(n)) => (route, limit, n),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return e,
    };
    let n = match n.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_N,
        Some(Ok(n)) if (1..=CAPACITY).contains(&n) => n,
        Some(_) => {
            let body = json!({ "parameter": "n", "allowed": format!("1 to {CAPACITY}") });
            return error(StatusCode::BAD_REQUEST, "bad_parameter", body);
        }
    };
    let limits = match chosen(state, route.as_deref(), limit.as_deref()) {
        Ok(limits) => limits,
        Err(e) => return e,
    };
    (StatusCode::OK, report(&limits, n, Instant::now()))
}

/// The limits a query names: one, a route's, or every route's.
fn chosen<'s>(
    state: &'s GatewayState,
    route: Option<&str>,
    limit: Option<&str>,
) -> Result<Vec<(&'s CompiledRoute, &'s CompiledLimit)>, Answer> {
    let routes: Vec<&CompiledRoute> = match route {
        Some(name) => match state.compiled.iter().find(|r| r.name == name) {
            Some(route) => vec![route],
            None => {
                return Err(error(
                    StatusCode::NOT_FOUND,
                    "unknown_route",
                    json!({ "route": name }),
                ))
            }
        },
        None if limit.is_some() => {
            let body = json!({ "parameter": "route" });
            return Err(error(StatusCode::BAD_REQUEST, "missing_parameter", body));
        }
        None => state.compiled.iter().collect(),
    };
    let mut limits = Vec::new();
    for route in routes {
        for l in &route.limits {
            if limit.is_none_or(|name| l.config.name == name) {
                limits.push((route, l));
            }
        }
    }
    if let (Some(name), true) = (limit, limits.is_empty()) {
        let body = json!({ "route": route, "limit": name });
        return Err(error(StatusCode::NOT_FOUND, "unknown_limit", body));
    }
    Ok(limits)
}

/// The report over `limits`: the `n` keys with the most denials, each with
/// its route, limit and key parts by label.
fn report(
    limits: &[(&CompiledRoute, &CompiledLimit)],
    n: usize,
    now: Instant,
) -> serde_json::Value {
    let mut keys: Vec<(&CompiledRoute, &CompiledLimit, TopKey)> = Vec::new();
    let mut denied = Vec::new();
    for &(route, limit) in limits {
        let (top, total) = limit.denied.top(n, now);
        denied.push(json!({
            "route": route.name,
            "limit": limit.config.name,
            "denied": total,
            "error_bound": total / CAPACITY as u64,
        }));
        keys.extend(top.into_iter().map(|k| (route, limit, k)));
    }
    keys.sort_by_key(|k| std::cmp::Reverse(k.2.count));
    keys.truncate(n);
    let keys: Vec<serde_json::Value> = keys
        .into_iter()
        .map(|(route, limit, k)| {
            json!({
                "route": route.name,
                "limit": limit.config.name,
                "key": k.key,
                "parts": labelled(limit, &k.key),
                "shown": shown(limit, &k),
                "usage": usage_query(route, limit, &k),
                "count": k.count,
                "error": k.error,
            })
        })
        .collect();
    let window = SLICE.as_secs() * SLICES as u64;
    json!({ "window_seconds": window, "keys": keys, "limits": denied })
}

/// The key's parts as the request carried them (see
/// [`ShownPart`](crate::observe::top_keys::ShownPart)), by label.
fn shown(limit: &CompiledLimit, key: &TopKey) -> serde_json::Value {
    let parts: Vec<serde_json::Value> = limit
        .config
        .key
        .iter()
        .zip(key.shown.iter())
        .map(|(part, shown)| json!({ "part": part.label(), "value": shown.text, "exact": shown.exact }))
        .collect();
    json!(parts)
}

/// The `/v1/usage` query string for this key, when every part is known
/// exactly (`null` otherwise: a credential, a cut value).
fn usage_query(route: &CompiledRoute, limit: &CompiledLimit, key: &TopKey) -> serde_json::Value {
    let parts = &limit.config.key;
    if key.shown.len() != parts.len() || key.shown.iter().any(|s| !s.exact) {
        return serde_json::Value::Null;
    }
    let mut query = format!(
        "route={}&limit={}",
        encode(route.name.as_bytes()),
        encode(limit.config.name.as_bytes())
    );
    for (part, shown) in parts.iter().zip(key.shown.iter()) {
        query.push_str(&format!(
            "&{}={}",
            encode(part.label().as_bytes()),
            encode(shown.text.as_bytes())
        ));
    }
    json!(query)
}

/// The key's parts by their labels (`ip`, `header.x-api-key`, …), in the
/// limit's order. Hashed values stay hashed.
fn labelled(limit: &CompiledLimit, key: &str) -> serde_json::Value {
    let values: Vec<&str> = key.split('|').collect();
    let labels: Vec<String> = limit.config.key.iter().map(|p| p.label()).collect();
    if values.len() != labels.len() {
        return json!({});
    }
    let map: serde_json::Map<String, serde_json::Value> = labels
        .into_iter()
        .zip(values)
        .map(|(l, v)| (l, json!(v)))
        .collect();
    json!(map)
}
