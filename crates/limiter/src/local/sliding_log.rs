//! In-process twin of `lua/sliding_log.lua`: a log of admit times, each
//! stamped max(now, the newest stamp), so stamps never go back.

use super::{Counter, Params};
use std::collections::VecDeque;

/// Admit times (µs) of the units in the window, oldest first (a delayed
/// request's units are reserved at a time still to come).
#[derive(Debug, Default)]
pub(super) struct SlidingLog {
    admitted: VecDeque<u64>,
    window: u64,
    /// The time the last `wait` found, for `reserve`.
    wait_until: u64,
    /// Reservations still to come: (time, member's tag), to give back.
    reserved: Vec<(u64, u64)>,
}

/// A short tag for a member (the entries themselves hold no member).
fn tag(member: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(member)
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
        // Stamps never go back: after a reservation still to come (or a
        // clock that stepped back), the units are stamped at the newest time.
        let stamp = self.admitted.back().map_or(now, |&last| last.max(now));
        self.admitted
            .extend(std::iter::repeat_n(stamp, p.cost as usize));
        (p.limit.saturating_sub(count + p.cost), reset)
    }

    fn refund(&mut self, at: u64, now: u64, p: &Params) {
        if at == 0 || now.saturating_sub(at) >= p.window {
            return;
        }
        // The oldest units stamped at or after `at`: the request's own, or
        // units as late (the script's rule).
        let first = self.admitted.partition_point(|&t| t < at);
        let last = (first + p.cost as usize).min(self.admitted.len());
        self.admitted.drain(first..last);
    }

    fn wait(&mut self, now: u64, p: &Params) -> Option<u64> {
        let count = self.admitted.len() as u64;
        let excess = (count + p.cost).checked_sub(p.limit).filter(|&e| e > 0)?;
        if p.cost > p.limit {
            return None;
        }
        let frees = self.admitted.get(excess as usize - 1)? + self.window;
        let last = self.admitted.back().copied().unwrap_or(0);
        self.wait_until = frees.max(last).max(now);
        Some(self.wait_until - now)
    }

    fn reserve(&mut self, now: u64, p: &Params, member: &str) -> (u64, u64) {
        let reset = self.frees(0, now);
        let at = self.wait_until;
        self.admitted
            .extend(std::iter::repeat_n(at, p.cost as usize));
        self.reserved.retain(|&(t, _)| t > now);
        self.reserved.push((at, tag(member)));
        (0, reset)
    }

    fn give_back(&mut self, member: &str, p: &Params) {
        let tag = tag(member);
        let Some(i) = self.reserved.iter().position(|&(_, m)| m == tag) else {
            return;
        };
        let (at, _) = self.reserved.swap_remove(i);
        // Exactly its own units: other reservations may share the time.
        for _ in 0..p.cost {
            match self.admitted.iter().rposition(|&t| t == at) {
                Some(j) => {
                    self.admitted.remove(j);
                }
                None => break,
            }
        }
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
