//! In-process twin of `lua/sliding_log.lua`: a log of admit times.

use super::{Counter, Params};
use std::collections::VecDeque;

/// Admit times (µs) of the units in the window, oldest first.
#[derive(Debug, Default)]
pub(super) struct SlidingLog {
    admitted: VecDeque<u64>,
    window: u64,
}

impl SlidingLog {
    fn frees(&self, rank: usize, now: u64) -> u64 {
        self.admitted
            .get(rank)
            .map_or(0, |&t| (t + self.window).saturating_sub(now))
    }
}

impl Counter for SlidingLog {
    fn peek(&mut self, now: u64, p: &Params) -> bool {
        self.window = p.window;
        while let Some(&t) = self.admitted.front() {
            if now.saturating_sub(t) >= self.window {
                self.admitted.pop_front();
            } else {
                break;
            }
        }
        self.admitted.len() as u64 + p.cost <= p.limit
    }

    fn take(&mut self, now: u64, p: &Params, _member: &str) -> (u64, u64) {
        let count = self.admitted.len() as u64;
        let reset = if count > 0 {
            self.frees(0, now)
        } else {
            p.window
        };
        self.admitted
            .extend(std::iter::repeat_n(now, p.cost as usize));
        (p.limit.saturating_sub(count + p.cost), reset)
    }

    fn report(&self, now: u64, p: &Params) -> (u64, u64, u64) {
        let count = self.admitted.len() as u64;
        if count == 0 {
            return (p.limit, 0, 0);
        }
        let excess = (count + p.cost).saturating_sub(p.limit);
        let retry = if excess > 0 {
            self.frees(excess as usize - 1, now)
        } else {
            0
        };
        (p.limit.saturating_sub(count), self.frees(0, now), retry)
    }

    fn is_idle(&self, now: u64) -> bool {
        self.admitted
            .back()
            .is_none_or(|&t| now.saturating_sub(t) >= self.window)
    }
}
