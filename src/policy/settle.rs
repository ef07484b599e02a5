//! Reservations (`reserve`): the units each limit takes before the request
//! is proxied, read from its JSON body; and their settlement when the
//! response says what it cost — units beyond the cost given back as taken
//! at the decision, units beyond the reservation charged on top (the
//! overdraft).

use super::checks::{checks, Keyed};
use super::rejection::Rejection;
use crate::config::usage::{parse_body, NoReservation};
use crate::config::{Algorithm, LimitConfig};
use crate::limiter::Outcome;
use crate::policy::state::{CompiledRoute, GatewayState};
use serde_json::Value;

/// Sets the cost of each of `keys` whose limit reserves to what the request
/// reserves: read from `body` (parsed once for all of them), at least 1
/// and at most what the limit can ever hold for this request (its applied
/// number; a token bucket's burst). A request a `required` reservation
/// cannot read is refused (400).
pub(super) fn reserve<'a>(
    route: &'a CompiledRoute,
    keys: &mut [Keyed],
    body: Option<&[u8]>,
) -> Result<(), Rejection<'a>> {
    let mut parsed: Option<Result<Value, NoReservation>> = None;
    for k in keys.iter_mut() {
        let c = &route.limits[k.index].config;
        let Some(reserve) = &c.reserve else {
            continue;
        };
        let document = parsed.get_or_insert_with(|| parse_body(body.unwrap_or_default()));
        match reserve.units(document) {
            Ok(units) => k.cost = units.clamp(1, capacity(c, k.applied)),
            Err(reason) => {
                return Err(Rejection::UnreadableBody {
                    route: &route.name,
                    limit: &c.name,
                    reason,
                })
            }
        }
    }
    Ok(())
}

/// The most units one request can take of limit `c` whose applied number
/// is `applied`: a token bucket's burst (which follows the plan when it is
/// the limit's own number), else the number.
fn capacity(c: &LimitConfig, applied: u64) -> u64 {
    match c.algorithm {
        Algorithm::TokenBucket { burst } if burst != c.limit => burst,
        _ => applied,
    }
}

/// A reservation an admitted request holds: its limit's key and units
/// (`keyed.cost`), taken when the backend's clock read `taken_us`.
#[derive(Debug)]
pub(super) struct Reserved {
    pub(super) keyed: Keyed,
    pub(super) taken_us: i64,
}

/// What a request's reservation came to, for its access log line and
/// trace: the units its first reserving limit took, and what it was
/// settled to (`None`: no usage was reported, the reservation stands).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Units reserved (0: the request reserved nothing).
    pub reserved: u64,
    /// The cost the response reported, when one was.
    pub cost: Option<u64>,
}

/// Settles each reservation with its usage (`None`: none reported, the
/// reservation stands) on the backend that admitted the request: the
/// unused part given back, the overdraft charged (at most the applied
/// number: one whole window's worth).
pub(super) async fn settle(
    state: &GatewayState,
    route: &CompiledRoute,
    outcome: &Outcome,
    reservations: Vec<(Reserved, Option<u64>)>,
) {
    let mut returned = Vec::new();
    let mut taken = Vec::new();
    let mut overdraft = Vec::new();
    for (r, usage) in reservations {
        let Some(used) = usage else {
            continue;
        };
        let held = r.keyed.cost;
        let counters = route.limits[r.keyed.index].units.as_ref();
        if used < held {
            counters.inspect(|c| c.given_back.inc_by(held - used));
            taken.push(r.taken_us);
            returned.push(Keyed {
                cost: held - used,
                ..r.keyed
            });
        } else if used > held {
            let over = (used - held).min(r.keyed.applied);
            counters.inspect(|c| c.overdraft.inc_by(over));
            overdraft.push(Keyed {
                cost: over,
                ..r.keyed
            });
        }
    }
    if returned.is_empty() && overdraft.is_empty() {
        return;
    }
    let (returned, overdraft) = (checks(route, &returned), checks(route, &overdraft));
    state
        .decider
        .settle(&returned, &taken, &overdraft, outcome)
        .await;
}
