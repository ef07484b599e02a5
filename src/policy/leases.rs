//! What an admitted request holds until it ends: its concurrency leases,
//! deferred limits and reservations ([`HeldLeases`]), the wait of a delayed
//! request, and what its response settles (`count_when`, `cost_from`,
//! `reserve`), read from its head or, as it passes, its body.

use crate::config::usage::CostFrom;
use crate::config::{Algorithm, LimitConfig};
use crate::limiter::leases::LeaseHold;
use crate::limiter::waiters::WaitPermit;
use crate::limiter::Outcome;
use crate::policy::checks::checks;
use crate::policy::checks::Keyed;
use crate::policy::settle::{self, Reserved, Settlement};
use crate::policy::state::{CompiledRoute, GatewayState};
use crate::policy::usage::{UsageReader, USAGE_READ_MAX};
use std::time::Duration;

/// What an admitted request holds until it ends: its concurrency leases,
/// and its deferred limits (`count_when`, `cost_from`), which count once
/// its response head is known.
#[derive(Debug)]
pub struct HeldLeases {
    keys: Vec<Keyed>,
    deferred: Vec<Keyed>,
    outcome: Outcome,
    /// The wait before the request may proceed (`on_limit: delay`), the
    /// limits that reserved units for it, and its places among the waiters.
    delay: Duration,
    delayed: Vec<Keyed>,
    permits: Vec<WaitPermit>,
    /// The concurrency leases on the book of held leases (renewed while
    /// the request lives).
    renewing: Option<LeaseHold>,
    /// The units its limits that reserve took, until settled.
    reserved: Vec<Reserved>,
    /// The response body's usage as it passes, per limit index, for the
    /// limits whose cost the body says (`cost_from: {response_json}`).
    readers: Vec<(usize, UsageReader)>,
    /// What its reservation came to.
    settlement: Settlement,
}

/// Whether limit `c` learns its cost from the response body.
fn by_body(c: &LimitConfig) -> bool {
    matches!(c.cost_from, Some(CostFrom::Json(_)))
}

impl HeldLeases {
    /// The wait the request must do before it proceeds (`on_limit:
    /// delay`); zero when it may proceed now.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The request's wait is over: its places among the waiters are free.
    pub fn waited(&mut self) {
        self.delay = Duration::ZERO;
        self.permits.clear();
    }

    /// The client left while the request waited: the units reserved for it
    /// are given back (the next request of the key can have them), and its
    /// deferred limits count nothing, as no response will come.
    pub async fn give_back(&mut self, state: &GatewayState, route: &CompiledRoute) {
        self.deferred.clear();
        let delayed = std::mem::take(&mut self.delayed);
        let checks = checks(route, &delayed);
        state.decider.give_back(&checks, &self.outcome).await;
        self.waited();
    }

    /// Hands the leases back to the limiter that granted them, counts the
    /// deferred limits by `status` if that has not happened yet, and
    /// settles what is left: by the usage the body said so far (a response
    /// cut short, or a client that left), or, without any, a deferred limit
    /// at its `cost` and a reservation as it stands. Returns what the
    /// reservation came to.
    pub async fn release(
        mut self,
        state: &GatewayState,
        route: &CompiledRoute,
        status: u16,
    ) -> Settlement {
        // Off the book first: a renewal never runs after the release.
        drop(self.renewing.take());
        self.settle(state, route, status, &|_| None).await;
        self.settle_by_body(state, route).await;
        let checks = checks(route, &self.keys);
        state.decider.release(&checks, &self.outcome).await;
        self.settlement
    }

    /// The response's `Content-Type` is `content_type`: its body's usage is
    /// read as it passes for the limits whose cost it says.
    pub fn read_body(&mut self, route: &CompiledRoute, content_type: &str) {
        let deferred = self.deferred.iter().map(|k| k.index);
        let indices = deferred.chain(self.reserved.iter().map(|r| r.keyed.index));
        let readers = indices.filter_map(|index| match &route.limits[index].config.cost_from {
            Some(CostFrom::Json(pointers)) => {
                let reader = UsageReader::new(pointers.clone(), content_type, USAGE_READ_MAX);
                Some((index, reader))
            }
            _ => None,
        });
        self.readers.extend(readers);
    }

    /// Whether the response body is read for usage.
    pub fn reads_body(&self) -> bool {
        !self.readers.is_empty()
    }

    /// The next bytes of the response body (already passed on); `end`:
    /// it is complete.
    pub fn body_passed(&mut self, chunk: &[u8], end: bool) {
        for (_, reader) in &mut self.readers {
            reader.feed(chunk);
            if end {
                reader.finish();
            }
        }
    }

    /// The usage the body said so far for limit `index`.
    fn body_usage(&self, index: usize) -> Option<u64> {
        let (_, reader) = self.readers.iter().find(|(i, _)| *i == index)?;
        reader.usage()
    }

    /// Counts the deferred limits and settles the reservations whose cost
    /// the body says, by what it said (see [`HeldLeases::release`]).
    async fn settle_by_body(&mut self, state: &GatewayState, route: &CompiledRoute) {
        let deferred = std::mem::take(&mut self.deferred);
        let mut counted = Vec::with_capacity(deferred.len());
        for k in deferred {
            let cost = self
                .body_usage(k.index)
                .unwrap_or(route.limits[k.index].config.cost);
            if cost > 0 {
                counted.push(Keyed { cost, ..k });
            }
        }
        if !counted.is_empty() {
            state
                .decider
                .record(&checks(route, &counted), &self.outcome)
                .await;
        }
        let reserved = std::mem::take(&mut self.reserved);
        let usage: Vec<(Reserved, Option<u64>)> = reserved
            .into_iter()
            .map(|r| {
                let used = self.body_usage(r.keyed.index);
                (r, used)
            })
            .collect();
        self.settle_reserved(state, route, usage).await;
    }

    /// Settles `usage` (see [`settle::settle`]), noting the first one's
    /// cost for the access log.
    async fn settle_reserved(
        &mut self,
        state: &GatewayState,
        route: &CompiledRoute,
        usage: Vec<(Reserved, Option<u64>)>,
    ) {
        if usage.is_empty() {
            return;
        }
        if self.settlement.cost.is_none() {
            self.settlement.cost = usage.first().and_then(|(_, used)| *used);
        }
        settle::settle(state, route, &self.outcome, usage).await;
    }

    /// Counts the deferred limits for a response of `status` whose headers
    /// `header` looks up (lower-case name): a `count_when` limit only when
    /// the status matches; a `cost_from: {response_header}` limit the
    /// header's whole number (its `cost` when the header is absent or not a
    /// number, nothing when it is 0); and settles the reservations whose
    /// cost such a header says (as they stand when it is absent). Once:
    /// later calls do nothing. Limits whose cost the body says wait for it.
    pub async fn settle<'h>(
        &mut self,
        state: &GatewayState,
        route: &CompiledRoute,
        status: u16,
        header: &(dyn Fn(&str) -> Option<&'h [u8]> + Sync),
    ) {
        let (later, deferred): (Vec<Keyed>, Vec<Keyed>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|k| by_body(&route.limits[k.index].config));
        self.deferred = later;
        let (later, by_head): (Vec<Reserved>, Vec<Reserved>) = std::mem::take(&mut self.reserved)
            .into_iter()
            .partition(|r| by_body(&route.limits[r.keyed.index].config));
        self.reserved = later;
        let usage = by_head
            .into_iter()
            .map(|r| {
                let used = match &route.limits[r.keyed.index].config.cost_from {
                    Some(CostFrom::Header(name)) => response_cost(header(name)),
                    _ => None,
                };
                (r, used)
            })
            .collect();
        self.settle_reserved(state, route, usage).await;
        let mut counted = Vec::with_capacity(deferred.len());
        let mut costs = Vec::with_capacity(deferred.len());
        for k in deferred {
            let c = &route.limits[k.index].config;
            if let Some(when) = &c.count_when {
                if !when.iter().any(|m| m.matches(status)) {
                    continue;
                }
            }
            let cost = match &c.cost_from {
                Some(CostFrom::Header(name)) => response_cost(header(name)).unwrap_or(c.cost),
                _ => c.cost,
            };
            if cost > 0 {
                counted.push(k);
                costs.push(cost);
            }
        }
        if counted.is_empty() {
            return;
        }
        let mut checks = checks(route, &counted);
        for (check, cost) in checks.iter_mut().zip(costs) {
            check.cost = cost;
        }
        state.decider.record(&checks, &self.outcome).await;
    }
}

/// The most units one response may report (`cost_from`): a header beyond it
/// counts this much.
pub const MAX_RESPONSE_COST: u64 = 1_000_000_000;

/// A `cost_from` header's units: a whole number, capped at
/// [`MAX_RESPONSE_COST`]; `None` when absent or not a number.
pub(super) fn response_cost(value: Option<&[u8]>) -> Option<u64> {
    let text = std::str::from_utf8(value?).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        text.parse::<u64>()
            .unwrap_or(MAX_RESPONSE_COST)
            .min(MAX_RESPONSE_COST),
    )
}

/// What an admitted request holds until it ends: its concurrency leases,
/// its deferred limits, and, when a limit delays it, the wait, the limits
/// that reserved units for it and its places among the waiters
/// (`permits`, by index in `keys`).
pub(super) fn held_leases(
    state: &GatewayState,
    route: &CompiledRoute,
    keys: Vec<Keyed>,
    outcome: Outcome,
    mut permits: Vec<(usize, WaitPermit)>,
) -> Option<HeldLeases> {
    let is_lease = |i: usize| {
        matches!(
            route.limits[i].config.algorithm,
            Algorithm::Concurrency { .. }
        )
    };
    let mut held = Vec::new();
    let mut deferred = Vec::new();
    let mut reserved = Vec::new();
    let mut settlement = Settlement::default();
    let mut delayed = Vec::new();
    let mut delay = Duration::ZERO;
    let mut waiting = Vec::new();
    for (i, (k, d)) in keys.into_iter().zip(&outcome.decisions).enumerate() {
        if !d.delay().is_zero() {
            delay = delay.max(d.delay());
            if let Some(at) = permits.iter().position(|(p, _)| *p == i) {
                waiting.push(permits.swap_remove(at).1);
            }
            delayed.push(k);
        } else if d.allowed && is_lease(k.index) {
            held.push(k);
        } else if route.limits[k.index].config.deferred() {
            deferred.push(k);
        } else if d.allowed && d.taken_us != 0 && route.limits[k.index].config.reserve.is_some() {
            let limit = &route.limits[k.index];
            limit.units.as_ref().inspect(|c| c.reserved.inc_by(k.cost));
            if settlement.reserved == 0 {
                settlement.reserved = k.cost;
            }
            reserved.push(Reserved {
                keyed: k,
                taken_us: d.taken_us,
            });
        }
    }
    if held.is_empty() && deferred.is_empty() && delayed.is_empty() && reserved.is_empty() {
        return None;
    }
    let renewing = state.decider.hold(&checks(route, &held), &outcome);
    Some(HeldLeases {
        keys: held,
        deferred,
        outcome,
        delay,
        delayed,
        permits: waiting,
        renewing,
        reserved,
        readers: Vec::new(),
        settlement,
    })
}
