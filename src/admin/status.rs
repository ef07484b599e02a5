//! `GET /v1/status`: what the console's overview shows besides its charts —
//! the configuration's generation and last reload, the limiter's state
//! (backend, Redis link, circuit, fallback decisions and the p99 Redis
//! round trip over the last minute) and every route with its limits.
//! Guarded as the usage API is. It shows no secret: no Redis URL or
//! password, no JWT secret, and a refused reload's problems with any URL's
//! credentials replaced by `***`.

use crate::admin::api::Answer;
use crate::admin::config_status::ConfigStatus;
use crate::admin::history::{growth, quantile, History};
use crate::config::{Backend, OnError, PathMatch, RouteAction};
use crate::limiter::{Link, Readiness};
use crate::observe::metrics::DecisionTotals;
use crate::policy::state::{CompiledRoute, GatewayState};
use http::StatusCode;
use serde_json::json;
use std::time::Duration;

/// The span the limiter's rates and p99 are taken over.
const LAST_MINUTE: Duration = Duration::from_secs(60);

/// Answers `GET /v1/status` (the caller is already authorized).
pub fn answer(state: &GatewayState, config: &ConfigStatus, history: &History) -> Answer {
    let body = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "instance": instance(),
        "config": config.to_json(),
        "limiter": limiter(state, history),
        "routes": state.compiled.iter().map(|r| route(state, r)).collect::<Vec<_>>(),
    });
    (StatusCode::OK, body)
}

/// Which instance answers: its pod (or host) name, namespace and pid.
fn instance() -> serde_json::Value {
    let instance = crate::observe::instance::Instance::current();
    json!({
        "name": instance.name,
        "namespace": instance.namespace,
        "pod": instance.is_pod,
        "pid": std::process::id(),
    })
}

/// The limiter's state, and its decisions over the last minute.
fn limiter(state: &GatewayState, history: &History) -> serde_json::Value {
    let settings = &state.config.limiter;
    let decider = &state.decider;
    let redis = (settings.backend == Backend::Redis).then(|| {
        let link = match decider.link() {
            Link::Starting => "starting",
            Link::Connected => "connected",
            Link::Unreachable => "unreachable",
        };
        let mode = if settings.redis.sentinel.is_some() {
            "sentinel"
        } else if settings.redis.cluster.is_empty() {
            "standalone"
        } else {
            "cluster"
        };
        let circuit = if decider.circuit_open() {
            "open"
        } else {
            "closed"
        };
        json!({ "mode": mode, "link": link, "circuit": circuit })
    });
    let (readiness, reason) = match decider.readiness() {
        Readiness::Ready => ("ready", None),
        Readiness::Degraded(why) => ("degraded", Some(why)),
        Readiness::NotReady(why) => ("not_ready", Some(why)),
    };
    json!({
        "backend": match settings.backend { Backend::Redis => "redis", Backend::Local => "local" },
        "on_error": match settings.on_error {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        },
        "readiness": readiness,
        "reason": reason,
        "redis": redis,
        "last_minute": last_minute(settings.backend, history),
    })
}

/// Decisions and fallbacks per second, and the p99 Redis round trip,
/// over the last minute (`null`s until two readings exist).
fn last_minute(backend: Backend, history: &History) -> serde_json::Value {
    let Some((before, after)) = history.span(LAST_MINUTE) else {
        return json!({ "seconds": 0, "decisions_per_second": null,
                       "fallback_per_second": null, "p99_redis_seconds": null });
    };
    let seconds = after.seconds_since(&before);
    // In-process decisions are the fallback only when Redis is the
    // backend; with `backend: local` they are the rule.
    let fallback = |t: DecisionTotals| match backend {
        Backend::Redis => t.local + t.failed_over,
        Backend::Local => t.failed_over,
    };
    let (mut decisions, mut fallbacks) = (0, 0);
    for limit in &after.limits {
        let Some(earlier) = before.limit(&limit.route, &limit.limit) else {
            continue;
        };
        let (now, then) = (limit.totals, earlier);
        decisions += growth(
            then.allowed + then.denied + then.shadow_denied,
            now.allowed + now.denied + now.shadow_denied,
        );
        fallbacks += growth(fallback(then), fallback(now));
    }
    let p99 = quantile(&before.redis_buckets, &after.redis_buckets, 0.99).map(|s| {
        if s.is_finite() {
            json!(s)
        } else {
            json!("+Inf")
        }
    });
    json!({
        "seconds": seconds.round(),
        "decisions_per_second": decisions as f64 / seconds,
        "fallback_per_second": fallbacks as f64 / seconds,
        "p99_redis_seconds": p99,
    })
}

/// One route: how it matches, where it goes, its limits.
fn route(state: &GatewayState, route: &CompiledRoute) -> serde_json::Value {
    let config = state.config.routes.iter().find(|r| r.name == route.name);
    let path = config.map(|c| match &c.path {
        PathMatch::Any => "any path".to_string(),
        PathMatch::Exact(path) => format!("= {path}"),
        PathMatch::Prefix(prefix) => format!("{prefix}*"),
        PathMatch::Template(template) => template.to_string(),
    });
    let target = match &route.action {
        RouteAction::Upstream(index) => state
            .upstreams
            .get(*index)
            .map(|u| json!({ "upstream": u.name() })),
        RouteAction::Respond { status, .. } => Some(json!({ "respond": status })),
    };
    let limits: Vec<serde_json::Value> = route
        .limits
        .iter()
        .map(|limit| {
            let c = &limit.config;
            json!({
                "name": c.name,
                "describe": c.describe(),
                "key": c.key.iter().map(|p| p.label()).collect::<Vec<_>>(),
                "limit": c.limit,
                "window_seconds": c.window.as_secs_f64(),
                "shadow": c.shadow,
                "plans": c.plans.iter().map(|(name, limit)| json!({"plan": name, "limit": limit})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "name": route.name,
        "path": path,
        "methods": config.map(|c| c.methods.clone()).unwrap_or_default(),
        "host": config.and_then(|c| c.host.clone()),
        "target": target,
        "limits": limits,
    })
}
