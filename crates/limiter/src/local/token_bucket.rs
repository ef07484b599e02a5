//! In-process twin of `lua/token_bucket.lua`: GCRA.

use super::{Counter, Params};

/// The theoretical arrival time (µs): when the bucket is full again.
#[derive(Debug, Default)]
pub(super) struct TokenBucket {
    tat: u64,
}

/// The GCRA quantities of one request of `p.cost` units at `now`.
struct Gcra {
    interval: i128,
    tat: i128,
    new_tat: i128,
    allow_at: i128,
}

fn gcra(stored: u64, now: u64, p: &Params) -> Gcra {
    let interval = p.window.div_ceil(p.limit).max(1) as i128;
    // A TAT past a full wait (and the longest delay) under these parameters
    // was written under others (a reload): read as an empty bucket.
    let tat = (stored as i128)
        .max(now as i128)
        .min(now as i128 + interval * p.param as i128 + p.max_delay as i128);
    let new_tat = tat + interval * p.cost as i128;
    Gcra {
        interval,
        tat,
        new_tat,
        allow_at: new_tat - interval * p.param as i128,
    }
}

impl Counter for TokenBucket {
    fn refund(&mut self, _at: u64, _now: u64, p: &Params) {
        self.give_back("", p);
    }

    fn peek(&mut self, now: u64, p: &Params) -> bool {
        gcra(self.tat, now, p).allow_at <= now as i128
    }

    fn take(&mut self, now: u64, p: &Params, _member: &str) -> (u64, u64) {
        let g = gcra(self.tat, now, p);
        self.tat = g.new_tat as u64;
        let now = now as i128;
        (
            ((now - g.allow_at) / g.interval).max(0) as u64,
            (g.new_tat - now).max(0) as u64,
        )
    }

    fn report(&self, now: u64, p: &Params) -> (u64, u64, u64) {
        let g = gcra(self.tat, now, p);
        let now = now as i128;
        let retry = (g.allow_at - now).max(0) as u64;
        let used = (g.tat - now + g.interval - 1) / g.interval;
        let remaining = (p.param as i128 - used).max(0) as u64;
        (remaining, (g.tat - now).max(0) as u64, retry)
    }

    fn wait(&mut self, now: u64, p: &Params) -> Option<u64> {
        Some((gcra(self.tat, now, p).allow_at - now as i128).max(0) as u64)
    }

    fn reserve(&mut self, now: u64, p: &Params, _member: &str) -> (u64, u64) {
        let g = gcra(self.tat, now, p);
        self.tat = g.new_tat as u64;
        (0, (g.new_tat - now as i128).max(0) as u64)
    }

    fn give_back(&mut self, _member: &str, p: &Params) {
        let interval = p.window.div_ceil(p.limit).max(1);
        self.tat = self.tat.saturating_sub(interval * p.cost);
    }

    fn is_idle(&self, now: u64) -> bool {
        self.tat <= now
    }
}
