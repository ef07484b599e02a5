//! `GET /v1/upstreams`: each upstream's servers as written, with weight,
//! the addresses they resolve to now (after the last DNS refresh), each
//! address's active and passive health — out until when, and why — and
//! the upstream's 502 and 504 answers over the last five minutes and since
//! its pool was built. Guarded as the usage API is.

use crate::admin::api::Answer;
use crate::admin::config_status::unix_seconds;
use crate::admin::history::{growth, History};
use crate::config::Balance;
use crate::policy::state::GatewayState;
use crate::upstream::Upstream;
use http::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant, SystemTime};

/// The span the recent 502/504 counts cover.
const RECENT: Duration = Duration::from_secs(300);

/// Answers `GET /v1/upstreams` (the caller is already authorized).
pub fn answer(state: &GatewayState, history: &History) -> Answer {
    let span = history.span(RECENT);
    let now = Instant::now();
    let upstreams: Vec<serde_json::Value> = state
        .upstreams
        .iter()
        .map(|upstream| {
            let (bad_gateway, gateway_timeout) = upstream.gateway_errors.totals();
            let recent = span.as_ref().and_then(|(before, after)| {
                let (b, a) = (before.upstream(upstream.name())?, after.upstream(upstream.name())?);
                Some(json!({
                    "seconds": after.seconds_since(before).round(),
                    "bad_gateway": growth(b.0, a.0),
                    "gateway_timeout": growth(b.1, a.1),
                }))
            });
            let c = &upstream.config;
            json!({
                "name": upstream.name(),
                "balance": balance_name(&c.balance),
                "health_check_seconds": c.health_check.map(|d| d.as_secs_f64()),
                "max_fails": c.max_fails,
                "fail_timeout_seconds": c.fail_timeout.as_secs_f64(),
                "dns_refresh_seconds": c.dns_refresh.map(|d| d.as_secs_f64()),
                "servers": servers(upstream, now),
                "errors": {
                    "since_built": { "bad_gateway": bad_gateway, "gateway_timeout": gateway_timeout },
                    "recent": recent,
                },
            })
        })
        .collect();
    (StatusCode::OK, json!({ "upstreams": upstreams }))
}

/// The balance's name as `balance:` writes it.
fn balance_name(balance: &Balance) -> &'static str {
    match balance {
        Balance::RoundRobin => "round_robin",
        Balance::Random => "random",
        Balance::ConsistentHash(_) => "consistent_hash",
    }
}

/// "1 failure", "3 failures".
fn failures(count: u32) -> String {
    match count {
        1 => "1 failure".to_string(),
        n => format!("{n} failures"),
    }
}

/// Each server as written, with its addresses and their health.
fn servers(upstream: &Upstream, now: Instant) -> Vec<serde_json::Value> {
    let resolved = upstream.servers.current();
    let checked = upstream.config.health_check.is_some();
    upstream
        .config
        .addresses
        .iter()
        .enumerate()
        .map(|(spec, written)| {
            let addresses: Vec<serde_json::Value> = resolved
                .iter()
                .filter(|r| r.spec == spec)
                .map(|r| {
                    let passes = upstream.passes_health_check(spec, r.addr);
                    let ejection = upstream.passive.ejection(r.addr, now);
                    let why = match (&ejection, checked && !passes) {
                        (Some(e), _) => Some(format!(
                            "{} within fail_timeout, the last {}",
                            failures(upstream.config.max_fails),
                            e.last_failure
                        )),
                        (None, true) => Some("the health check fails".to_string()),
                        (None, false) => None,
                    };
                    json!({
                        "address": r.addr.to_string(),
                        "up": passes && ejection.is_none(),
                        "health_check": if checked { json!(passes) } else { json!(null) },
                        "out_for_seconds": ejection.map(|e| e.remaining.as_secs_f64()),
                        "out_until": ejection.map(|e| unix_seconds(SystemTime::now() + e.remaining)),
                        "why": why,
                    })
                })
                .collect();
            json!({
                "server": written.addr,
                "weight": written.weight,
                "up": upstream.server_up(spec),
                "addresses": addresses,
            })
        })
        .collect()
}
