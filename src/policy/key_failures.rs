//! `identity.api_key.failures`: the unknown API keys one client IP may
//! send per window. Each unknown key counts one unit of a sliding-log limit
//! on the client IP, decided like any limit (on Redis, exact across
//! instances); over it, the client gets 429 for every key it sends, a
//! valid one included, until the window frees a unit — so guessing keys
//! ends in 429 and a right guess among wrong ones is not told apart. A
//! known key is refused from the deny cache only (no I/O on the way of a
//! valid request).

use crate::config::consumers::Failures;
use crate::config::Algorithm;
use crate::limiter::LimitCheck;
use crate::policy::state::GatewayState;
use std::net::IpAddr;
use std::time::Duration;

/// The name the failures limit is reported under.
pub(crate) const LIMIT_NAME: &str = "api_key_failures";

/// The counter key of `client`'s failures: `!` is in no route name, so it
/// never meets a route's counter.
fn counter_key(prefix: &str, client: IpAddr) -> String {
    format!("{prefix}{{!identity:{LIMIT_NAME}:{client}}}")
}

fn check(key: &str, failures: Failures) -> LimitCheck<'_> {
    LimitCheck {
        key,
        limit: failures.limit,
        window: failures.window,
        cost: 1,
        algorithm: Algorithm::SlidingLog,
        shadow: false,
        block: Duration::ZERO,
        deferred: false,
        max_delay: Duration::ZERO,
    }
}

/// Whether `client`, which sent an API key, is over its failures: the
/// whole seconds to wait when it is. An `unknown` key is counted first.
pub async fn over_limit(state: &GatewayState, client: IpAddr, unknown: bool) -> Option<u64> {
    let keys = state.identity.api_keys()?;
    let key = counter_key(&state.config.limiter.redis.key_prefix, client);
    let checks = [check(&key, keys.failures)];
    let wait = if unknown {
        keys.failed.inc();
        let outcome = state.decider.decide(&checks).await;
        if outcome.admitted {
            return None;
        }
        outcome.decisions.first().map(|d| d.retry_after)
    } else {
        state
            .decider
            .cached_denial(&checks)?
            .first()
            .map(|d| d.retry_after)
    };
    let wait = wait.unwrap_or(keys.failures.window);
    Some((wait.as_secs_f64().ceil() as u64).max(1))
}
