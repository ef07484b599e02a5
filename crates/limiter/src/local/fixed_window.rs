//! In-process twin of `lua/fixed_window.lua`: one counter per window.

use super::{Counter, Params};

/// The current window's index and units admitted in it.
#[derive(Debug, Default)]
pub(super) struct FixedWindow {
    index: u64,
    count: u64,
    ends: u64,
}

impl FixedWindow {
    /// Counts in the period `index`, which ends at `ends` (µs): a new
    /// period starts from zero. A stored period ahead of `index` but not
    /// beyond `latest` (the clock stepped back from it) stays the one
    /// counted, with its end. Whether `cost` more units fit in it.
    pub(super) fn enter(&mut self, index: u64, ends: u64, latest: u64, p: &Params) -> bool {
        let counted = super::counted_window(index, self.index, latest);
        if counted != self.index {
            self.index = counted;
            self.count = 0;
        }
        if counted == index {
            self.ends = ends;
        }
        self.count + p.cost <= p.limit
    }
}

impl FixedWindow {
    /// Gives back `cost` units counted in the period `index`, if it is the
    /// one counted now.
    pub(super) fn give(&mut self, index: u64, cost: u64) {
        if index == self.index {
            self.count = self.count.saturating_sub(cost);
        }
    }
}

impl Counter for FixedWindow {
    fn refund(&mut self, at: u64, _now: u64, p: &Params) {
        self.give(at / p.window.max(1), p.cost);
    }

    fn peek(&mut self, now: u64, p: &Params) -> bool {
        let current = now / p.window;
        let latest = super::latest_after_step_back(current, p.window);
        self.enter(current, (current + 1) * p.window, latest, p)
    }

    fn take(&mut self, now: u64, p: &Params, _member: &str) -> (u64, u64) {
        let count = self.count;
        self.count += p.cost;
        (
            p.limit.saturating_sub(count + p.cost),
            self.ends.saturating_sub(now),
        )
    }

    fn report(&self, now: u64, p: &Params) -> (u64, u64, u64) {
        if self.count == 0 {
            return (p.limit, 0, 0);
        }
        let left = self.ends.saturating_sub(now);
        let retry = if self.count + p.cost > p.limit {
            left
        } else {
            0
        };
        (p.limit.saturating_sub(self.count), left, retry)
    }

    fn is_idle(&self, now: u64) -> bool {
        self.count == 0 || now >= self.ends
    }
}
