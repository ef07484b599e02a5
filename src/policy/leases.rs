//! What an admitted request holds until it ends: its concurrency leases
//! and deferred limits ([`HeldLeases`]), the wait of a delayed request, and
//! what its response settles (`count_when`, `cost_from`).

use crate::config::Algorithm;
use crate::limiter::leases::LeaseHold;
use crate::limiter::waiters::WaitPermit;
use crate::limiter::Outcome;
use crate::policy::checks::checks;
use crate::policy::checks::Keyed;
use crate::policy::state::{CompiledRoute, GatewayState};
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

    /// Hands the leases back to the limiter that granted them (and counts
    /// the deferred limits by `status`, if that has not happened yet).
    pub async fn release(mut self, state: &GatewayState, route: &CompiledRoute, status: u16) {
        // Off the book first: a renewal never runs after the release.
        drop(self.renewing.take());
        self.settle(state, route, status, &|_| None).await;
        let checks = checks(route, &self.keys);
        state.decider.release(&checks, &self.outcome).await;
    }

    /// Counts the deferred limits for a response of `status` whose headers
    /// `header` looks up (lower-case name): a `count_when` limit only when
    /// the status matches; a `cost_from` limit the header's whole number
    /// (its `cost` when the header is absent or not a number, nothing when
    /// it is 0). Once: later calls do nothing.
    pub async fn settle<'h>(
        &mut self,
        state: &GatewayState,
        route: &CompiledRoute,
        status: u16,
        header: &(dyn Fn(&str) -> Option<&'h [u8]> + Sync),
    ) {
        let deferred = std::mem::take(&mut self.deferred);
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
                Some(name) => response_cost(header(name)).unwrap_or(c.cost),
                None => c.cost,
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
        }
    }
    if held.is_empty() && deferred.is_empty() && delayed.is_empty() {
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
    })
}
