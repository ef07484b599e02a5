//! The limiter's checks for a request: each applying limit's key built from
//! the request's parts, its applied limit (plans and overrides), and the
//! check the limiter is asked.

use super::keys::{build_key, AmbiguousPart};
use super::RequestView;
use crate::config::{Algorithm, KeyPart, LimitConfig, OnMissing, PlanSource};
use crate::limiter::LimitCheck;
use crate::policy::state::{CompiledLimit, CompiledRoute, GatewayState};
use crate::request::parts::{cookie_value, part_value, PartValue, RequestParts};
use std::net::IpAddr;
use std::time::Duration;

/// One limit that applies to a request: its index in the route, its counter
/// key, and the limit that applies (the configured one, or the request's
/// plan's or override's).
#[derive(Debug, Clone)]
pub(super) struct Keyed {
    pub(super) index: usize,
    pub(super) key: String,
    pub(super) applied: u64,
    /// Units the request takes: the limit's `cost`, or what it reserves.
    pub(super) cost: u64,
}

/// The counter keys of the route's limits for this request, as (limit
/// index, key). Limits whose key part is missing with `on_missing: skip`
/// are left out, and so are those `exempt` says do not count this request
/// (counted as exempt). A key part the request carries twice with different values
/// fails the request (a 400): counting it under either value could let the
/// client choose its counter.
pub(super) fn limit_keys(
    state: &GatewayState,
    route: &CompiledRoute,
    view: &RequestView<'_>,
    client: IpAddr,
    user: Option<&[u8]>,
    exempt: &dyn Fn(&CompiledLimit) -> bool,
    plan: &dyn Fn(&PlanSource) -> Option<String>,
) -> Result<Vec<Keyed>, AmbiguousPart> {
    with_request_parts(state, route, view, client, user, |parts| {
        keys_of(state, route, parts, exempt, plan)
    })
}

/// Runs `f` on the values `view` offers for key parts (for `client` and
/// `user`), as limits and consistent hashing read them.
pub fn with_request_parts<R>(
    state: &GatewayState,
    route: &CompiledRoute,
    view: &RequestView<'_>,
    client: IpAddr,
    user: Option<&[u8]>,
    f: impl FnOnce(&RequestParts<'_>) -> R,
) -> R {
    let ip_text = state.client_ip.key_text(client);
    let header = |name: &str| view.head.headers.get(name).map(|v| v.as_bytes());
    let cookie = |name: &str| {
        let headers = view.head.headers.get_all(http::header::COOKIE).iter();
        cookie_value(headers.map(|v| v.as_bytes()), name)
    };
    let param = |name: &str| route.template.as_ref()?.param(view.path, name);
    let parts = RequestParts {
        ip: &ip_text,
        user,
        method: view.head.method.as_str(),
        path: view.path.as_bytes(),
        header: &header,
        query: view.head.uri.query().unwrap_or("").as_bytes(),
        cookie: &cookie,
        param: &param,
        client_cert: view.client_cert,
    };
    f(&parts)
}

/// The keys of the route's limits for a request's `parts` (see
/// [`limit_keys`]).
pub(super) fn keys_of(
    state: &GatewayState,
    route: &CompiledRoute,
    parts: &RequestParts<'_>,
    exempt: &dyn Fn(&CompiledLimit) -> bool,
    plan: &dyn Fn(&PlanSource) -> Option<String>,
) -> Result<Vec<Keyed>, AmbiguousPart> {
    let prefix = &state.config.limiter.redis.key_prefix;
    let key_of = |(i, limit): (usize, &CompiledLimit)| {
        if exempt(limit) {
            limit.counters.inc_exempt();
            return None;
        }
        let c = &limit.config;
        let (scope, name) = counter_name(route, c);
        let on_missing_ip = c.on_missing == OnMissing::Ip;
        build_key(
            prefix,
            scope,
            name,
            &c.key,
            &c.credential_parts,
            parts,
            on_missing_ip,
        )
        .map(|key| {
            key.map(|key| Keyed {
                index: i,
                key,
                applied: applied_limit(c, parts, plan),
                cost: c.cost,
            })
        })
        .transpose()
    };
    route.limits.iter().enumerate().filter_map(key_of).collect()
}

/// The limit that applies to a request: the first override whose key
/// values it carries, else its plan's (when it names a listed plan), else
/// the configured one.
pub fn applied_limit(
    c: &LimitConfig,
    parts: &RequestParts<'_>,
    plan: &dyn Fn(&PlanSource) -> Option<String>,
) -> u64 {
    let carries = |(part, want): &(KeyPart, String)| matches!(part_value(part, parts), PartValue::One(got) if got.as_ref() == want.as_bytes());
    if let Some(o) = c.overrides.iter().find(|o| o.parts.iter().all(carries)) {
        return o.limit;
    }
    let named = c.limit_from.as_ref().and_then(plan);
    named
        .and_then(|name| c.plans.iter().find(|(plan, _)| *plan == name))
        .map_or(c.limit, |(_, limit)| *limit)
}

/// The limiter's view of the keyed limits.
pub(super) fn checks<'k>(route: &CompiledRoute, keys: &'k [Keyed]) -> Vec<LimitCheck<'k>> {
    keys.iter()
        .map(|k| LimitCheck {
            cost: k.cost,
            ..limit_check(&route.limits[k.index].config, &k.key, k.applied)
        })
        .collect()
}

/// The names a limit's counter key is built from: its route and its own, or,
/// for a shared counter, its share under the route name `*` (which no route
/// can have).
pub fn counter_name<'a>(route: &'a CompiledRoute, c: &'a LimitConfig) -> (&'a str, &'a str) {
    match &c.share {
        Some(share) => ("*", share.as_str()),
        None => (route.name.as_str(), c.name.as_str()),
    }
}

/// The limiter's view of limit `c` on `key` when `applied` is its number.
pub fn limit_check<'k>(c: &LimitConfig, key: &'k str, applied: u64) -> LimitCheck<'k> {
    // A burst equal to the limit (its default) follows the plan.
    let mut window = c.window;
    let algorithm = match c.algorithm {
        Algorithm::TokenBucket { burst } if burst == c.limit => {
            Algorithm::TokenBucket { burst: applied }
        }
        // A calendar quota carries the periods around now, by this clock;
        // Redis's clock picks among them.
        Algorithm::Calendar { period, .. } => match &c.calendar {
            Some(calendar) => {
                let bounds = calendar.bounds_at(unix_now_us());
                window = Duration::from_micros((bounds.end_us - bounds.start_us).max(1) as u64);
                Algorithm::Calendar { period, bounds }
            }
            None => c.algorithm,
        },
        other => other,
    };
    LimitCheck {
        key,
        limit: applied,
        window,
        cost: c.cost,
        algorithm,
        shadow: c.shadow,
        block: c.block_for,
        deferred: c.deferred(),
        max_delay: c.max_delay,
    }
}

/// The gateway's clock, in microseconds since the Unix epoch.
pub(super) fn unix_now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
