//! In-process twin of `lua/concurrency.lua`: leases in flight.

use super::{Counter, Params};

/// Leases held: (member, end time µs, units).
#[derive(Debug, Default)]
pub(super) struct Concurrency {
    leases: Vec<(String, u64, u64)>,
}

impl Concurrency {
    fn count(&self) -> u64 {
        self.leases.iter().map(|&(_, _, units)| units).sum()
    }

    /// Time until the first lease ends, never more than one `lease`.
    fn first_expiry(&self, now: u64, lease: u64) -> u64 {
        self.leases
            .iter()
            .map(|&(_, ends, _)| ends)
            .min()
            .map_or(0, |ends| ends.saturating_sub(now).min(lease))
    }
}

impl Counter for Concurrency {
    /// Leases are released by member ([`Counter::release`]), never refunded.
    fn refund(&mut self, _at: u64, _now: u64, _p: &Params) {}

    fn peek(&mut self, now: u64, p: &Params) -> bool {
        self.leases.retain(|&(_, ends, _)| ends > now);
        self.count() + p.cost <= p.limit
    }

    fn take(&mut self, now: u64, p: &Params, member: &str) -> (u64, u64) {
        let count = self.count();
        self.leases
            .push((member.to_string(), now + p.param, p.cost));
        (
            p.limit.saturating_sub(count + p.cost),
            self.first_expiry(now, p.param),
        )
    }

    fn report(&self, now: u64, p: &Params) -> (u64, u64, u64) {
        (
            p.limit.saturating_sub(self.count()),
            self.first_expiry(now, p.param),
            0,
        )
    }

    fn release(&mut self, member: &str) {
        self.leases.retain(|(m, _, _)| m != member);
    }

    fn renew(&mut self, member: &str, now: u64, ends: u64) {
        for lease in self.leases.iter_mut() {
            if lease.0 == member && lease.1 > now {
                lease.1 = ends;
            }
        }
    }

    fn is_idle(&self, now: u64) -> bool {
        self.leases.iter().all(|&(_, ends, _)| ends <= now)
    }
}
