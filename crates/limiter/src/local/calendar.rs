//! In-process twin of `lua/calendar.lua`: one counter per civil period, the
//! period picked among the check's bounds by this limiter's clock, counted
//! as a fixed window whose index is the period's end.

use super::fixed_window::FixedWindow;
use super::{Counter, Params};

/// The current period's counter.
#[derive(Debug, Default)]
pub(super) struct CalendarCounter(FixedWindow);

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
    fn refund(&mut self, at: u64, _now: u64, p: &Params) {
        self.0.give(period_end(at, p), p.cost);
    }

    fn peek(&mut self, now: u64, p: &Params) -> bool {
        let ends = period_end(now, p);
        let latest = p.bounds.next_end_us.max(0) as u64;
        self.0.enter(ends, ends, latest, p)
    }

    fn take(&mut self, now: u64, p: &Params, member: &str) -> (u64, u64) {
        self.0.take(now, p, member)
    }

    fn report(&self, now: u64, p: &Params) -> (u64, u64, u64) {
        self.0.report(now, p)
    }

    fn is_idle(&self, now: u64) -> bool {
        self.0.is_idle(now)
    }
}
