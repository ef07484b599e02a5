//! In-process twin of `lua/calendar.lua`: one counter per civil period, the
//! period picked among the check's bounds by this limiter's clock.

use super::{Counter, Params};

/// The current period's end and the units admitted in it.
#[derive(Debug, Default)]
pub(super) struct CalendarCounter {
    ends: u64,
    count: u64,
}

/// The end of the period holding `now`. A clock beyond the bounds (they are
/// computed from the same clock, so never in practice) counts in the last.
fn period_end(now: u64, p: &Params) -> u64 {
    let b = p.bounds;
    let (start, end, after) = (
        b.start_us.max(0) as u64,
        b.end_us.max(0) as u64,
        b.next_end_us.max(0) as u64,
    );
    if now < start {
        start
    } else if now < end {
        end
    } else {
        after
    }
}

impl Counter for CalendarCounter {
    fn peek(&mut self, now: u64, p: &Params) -> bool {
        let ends = period_end(now, p);
        if ends != self.ends {
            self.ends = ends;
            self.count = 0;
        }
        self.count + p.cost <= p.limit
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
