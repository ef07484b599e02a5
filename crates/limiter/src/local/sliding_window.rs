//! In-process twin of `lua/sliding_window.lua`: sub-window counters.

use super::{Counter, Params};
use std::collections::VecDeque;

/// (sub-window index, units), ascending; only sub-windows that still count.
#[derive(Debug, Default)]
pub(super) struct SlidingWindow {
    buckets: VecDeque<(u64, u64)>,
    oldest_counted: u64,
    /// The sub-window counted in: the clock's, or a later one it stepped
    /// back from.
    current: u64,
    size: u64,
    buckets_per_window: u64,
}

fn size(p: &Params) -> u64 {
    (p.window / p.param).max(1)
}

/// Time until sub-window `at` stops counting.
fn frees(p: &Params, now: u64, at: u64) -> u64 {
    ((at + p.param + 1) * size(p)).saturating_sub(now)
}

impl SlidingWindow {
    fn count(&self) -> u64 {
        self.buckets.iter().map(|&(_, units)| units).sum()
    }
}

impl Counter for SlidingWindow {
    fn refund(&mut self, at: u64, _now: u64, p: &Params) {
        let index = at / size(p);
        if let Some(i) = self.buckets.iter().position(|&(b, _)| b == index) {
            let units = &mut self.buckets[i].1;
            *units = units.saturating_sub(p.cost);
            if *units == 0 {
                self.buckets.remove(i);
            }
        }
    }

    fn peek(&mut self, now: u64, p: &Params) -> bool {
        self.size = size(p);
        self.buckets_per_window = p.param;
        // A clock that stepped back keeps counting in the newest stored
        // sub-window; one further ahead was written with another size.
        let latest = super::latest_after_step_back(now / self.size, self.size);
        while self.buckets.back().is_some_and(|&(at, _)| at > latest) {
            self.buckets.pop_back();
        }
        let newest = self.buckets.back().map_or(0, |&(at, _)| at);
        let current = super::counted_window(now / self.size, newest, latest);
        self.current = current;
        self.oldest_counted = current.saturating_sub(p.param);
        while self
            .buckets
            .front()
            .is_some_and(|&(at, _)| at < self.oldest_counted)
        {
            self.buckets.pop_front();
        }
        self.count() + p.cost <= p.limit
    }

    fn take(&mut self, now: u64, p: &Params, _member: &str) -> (u64, u64) {
        let current = self.current;
        let count = self.count();
        let first = self.buckets.front().map_or(current, |&(at, _)| at);
        match self.buckets.back_mut() {
            Some((at, units)) if *at == current => *units += p.cost,
            _ => self.buckets.push_back((current, p.cost)),
        }
        (p.limit.saturating_sub(count + p.cost), frees(p, now, first))
    }

    fn report(&self, now: u64, p: &Params) -> (u64, u64, u64) {
        let count = self.count();
        let Some(&(first, _)) = self.buckets.front() else {
            return (p.limit, 0, 0);
        };
        let mut retry = 0;
        if count + p.cost > p.limit {
            let mut left = count;
            for &(at, units) in &self.buckets {
                left -= units;
                if left + p.cost <= p.limit {
                    retry = frees(p, now, at);
                    break;
                }
            }
        }
        (p.limit.saturating_sub(count), frees(p, now, first), retry)
    }

    fn is_idle(&self, now: u64) -> bool {
        self.buckets
            .back()
            .is_none_or(|&(at, _)| at + self.buckets_per_window < now / self.size.max(1))
    }
}
