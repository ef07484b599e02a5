//! `GET /v1/rates`: each limit's allowed, denied and shadow-denied
//! decisions per second over the last five minutes, one value per
//! [`STEP`](crate::admin::history::STEP), from this instance's counters
//! (the same ones `sluice_ratelimit_decisions_total` exports). Guarded as
//! the usage API is.

use crate::admin::api::Answer;
use crate::admin::history::{rates, History, KEPT, STEP};
use crate::policy::state::GatewayState;
use http::StatusCode;
use serde_json::json;

/// Answers `GET /v1/rates` (the caller is already authorized): `at` holds
/// the end of each step (Unix seconds); each limit's `allowed`, `denied`
/// and `shadow_denied` hold its rates per second for those steps, `null`
/// where the limit did not exist yet (a reload added it).
pub fn answer(state: &GatewayState, history: &History) -> Answer {
    let limits: Vec<(String, String, bool)> = state
        .compiled
        .iter()
        .flat_map(|route| {
            route.limits.iter().map(|limit| {
                (
                    route.name.clone(),
                    limit.config.name.clone(),
                    limit.config.shadow,
                )
            })
        })
        .collect();
    let names: Vec<(String, String)> = limits
        .iter()
        .map(|(route, limit, _)| (route.clone(), limit.clone()))
        .collect();
    let (at, series) = rates(&history.readings(), &names);
    let limits: Vec<serde_json::Value> = limits
        .iter()
        .zip(series)
        .map(
            |((route, limit, shadow), [allowed, denied, shadow_denied])| {
                json!({
                    "route": route,
                    "limit": limit,
                    "shadow": shadow,
                    "allowed": allowed,
                    "denied": denied,
                    "shadow_denied": shadow_denied,
                })
            },
        )
        .collect();
    let body = json!({
        "step_seconds": STEP.as_secs(),
        "window_seconds": STEP.as_secs() * (KEPT as u64 - 1),
        "at": at,
        "limits": limits,
    });
    (StatusCode::OK, body)
}
