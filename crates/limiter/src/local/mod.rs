//! The in-process limiter: `backend: local`, and the fallback of
//! `on_error: local`.
//!
//! Every algorithm has a twin here of its Redis script (`lua/*.lua`), with the
//! same semantics and the same return shape, for one instance: all or nothing
//! over the checks of one request, shadow limits never deny. Times are
//! microseconds since the Unix epoch (windows align as in Redis). Memory is
//! bounded by `max_keys`: when more keys than that are live, the table first
//! drops idle keys, then (still full) forgets about a tenth of its keys —
//! those keys restart from zero, which errs on the side of admitting.

mod calendar;
mod concurrency;
mod fixed_window;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use super::sharded::ShardedMap;
use super::{Algorithm, Decision, LimitCheck, Limiter, LimiterError};
use crate::calendar::PeriodBounds;
use async_trait::async_trait;
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic microsecond clock. Tests substitute a fake one.
pub trait Clock: Send + Sync {
    /// Microseconds since the Unix epoch (or a fixed origin); never decreases.
    fn now_us(&self) -> u64;
}

/// The real clock: the Unix time at construction, advanced by `Instant`, so
/// it is monotonic and its windows align with Redis's.
#[derive(Debug)]
pub struct MonotonicClock {
    origin_us: u64,
    started: Instant,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self {
            origin_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or_default(),
            started: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        self.origin_us + self.started.elapsed().as_micros() as u64
    }
}

/// How far (µs) a clock may step back and the counters still count in the
/// window they counted in before (`lua/clock.lua`'s `CLOCK_STEP_BACK_MAX`; a
/// test holds the two equal). A stored window further ahead than this was
/// written under another window size (a reload) and is not counted.
pub const CLOCK_STEP_BACK_MAX_US: u64 = 3_600_000_000;

/// The window to count in: `current` (the clock's), or `stored` when it is
/// ahead of the clock by no more than `latest` allows (the clock stepped
/// back from it). The twin of `lua/clock.lua`'s `counted_window`.
fn counted_window(current: u64, stored: u64, latest: u64) -> u64 {
    if stored > current && stored <= latest {
        stored
    } else {
        current
    }
}

/// The latest index of a window of `size` µs that a step back can leave
/// ahead of window `current`.
fn latest_after_step_back(current: u64, size: u64) -> u64 {
    current + CLOCK_STEP_BACK_MAX_US / size.max(1)
}

/// One check's numbers in microseconds, as the scripts get them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Params {
    limit: u64,
    window: u64,
    cost: u64,
    /// buckets, burst, or lease µs (by algorithm).
    param: u64,
    /// A calendar quota's periods (zero for the other algorithms).
    bounds: PeriodBounds,
    /// `on_limit: delay`: the longest wait, µs (zero: none).
    max_delay: u64,
}

impl Params {
    fn of(check: &LimitCheck<'_>) -> Self {
        let param = match check.algorithm {
            Algorithm::SlidingWindow { buckets } => u64::from(buckets),
            Algorithm::TokenBucket { burst } => burst,
            Algorithm::Concurrency { lease } => micros_of(lease),
            Algorithm::SlidingLog | Algorithm::FixedWindow | Algorithm::Calendar { .. } => 0,
        };
        let bounds = match check.algorithm {
            Algorithm::Calendar { bounds, .. } => bounds,
            _ => PeriodBounds::default(),
        };
        Self {
            limit: check.limit,
            window: micros_of(check.window),
            cost: check.cost,
            param,
            bounds,
            max_delay: micros_of(check.max_delay),
        }
    }
}

/// One key's state under one algorithm: the twin of that algorithm's script.
pub(super) trait Counter: Send {
    /// Drops what no longer counts; whether `cost` more units fit at `now`.
    fn peek(&mut self, now: u64, p: &Params) -> bool;
    /// Consumes `cost` units for `member` (after `peek` said they fit);
    /// returns (remaining, reset µs).
    fn take(&mut self, now: u64, p: &Params, member: &str) -> (u64, u64);
    /// Without consuming (after `peek`): (remaining, reset µs, retry_after µs).
    fn report(&self, now: u64, p: &Params) -> (u64, u64, u64);
    /// Releases what `member` holds (concurrency leases); others ignore it.
    fn release(&mut self, _member: &str) {}
    /// Moves the end of `member`'s lease to `ends` (µs) if it still holds
    /// one at `now` (concurrency); others ignore it.
    fn renew(&mut self, _member: &str, _now: u64, _ends: u64) {}
    /// For a limit that delays, after `peek` said no: the wait (µs) until
    /// `cost` more units fit, if waiting can make them fit.
    fn wait(&mut self, _now: u64, _p: &Params) -> Option<u64> {
        None
    }
    /// Reserves `cost` units for `member` at the time `wait` found; returns
    /// (remaining, reset µs).
    fn reserve(&mut self, now: u64, p: &Params, member: &str) -> (u64, u64) {
        self.take(now, p, member)
    }
    /// Gives back the units `member` reserved (it left while waiting).
    fn give_back(&mut self, _member: &str, _p: &Params) {}
    /// Gives back `cost` of the units taken at `at` (µs), as the script's
    /// `refund` does: a window that ended keeps its count, units out of the
    /// window are not given back.
    fn refund(&mut self, at: u64, now: u64, p: &Params);
    /// Whether nothing it holds still counts at `now`.
    fn is_idle(&self, now: u64) -> bool;
}

struct Slot {
    algorithm: Algorithm,
    counter: Box<dyn Counter>,
    /// The key is in its penalty box (`block_for`) until then (µs).
    boxed_until: u64,
}

impl Slot {
    fn new(algorithm: Algorithm) -> Self {
        let counter: Box<dyn Counter> = match algorithm {
            Algorithm::SlidingLog => Box::<sliding_log::SlidingLog>::default(),
            Algorithm::SlidingWindow { .. } => Box::<sliding_window::SlidingWindow>::default(),
            Algorithm::FixedWindow => Box::<fixed_window::FixedWindow>::default(),
            Algorithm::TokenBucket { .. } => Box::<token_bucket::TokenBucket>::default(),
            Algorithm::Concurrency { .. } => Box::<concurrency::Concurrency>::default(),
            Algorithm::Calendar { .. } => Box::<calendar::CalendarCounter>::default(),
        };
        Self {
            algorithm,
            counter,
            boxed_until: 0,
        }
    }
}

impl Slot {
    /// Pass 1 for `check`: (whether it fits at `now`, the wait for a limit
    /// that delays). A limit that delays admits what fits within its
    /// longest wait; a key in its penalty box fits nothing.
    fn fits(&mut self, check: &LimitCheck<'_>, now: u64) -> (bool, u64) {
        let boxed = !check.block.is_zero() && self.boxed_until > now;
        let p = Params::of(check);
        if boxed {
            return (false, 0);
        }
        if self.counter.peek(now, &p) {
            return (true, 0);
        }
        if p.max_delay == 0 {
            return (false, 0);
        }
        match self.counter.wait(now, &p) {
            Some(w) if w <= p.max_delay => (true, w),
            _ => (false, 0),
        }
    }

    /// Pass 2 for `check`: consumes its cost under `member` when the request
    /// is `admit`ted and the limit takes now (or reserves it after `wait`),
    /// else reports it (a denial puts the key in its penalty box).
    fn conclude(
        &mut self,
        check: &LimitCheck<'_>,
        admit: bool,
        (ok, wait): (bool, u64),
        now: u64,
        member: &str,
    ) -> Decision {
        let p = Params::of(check);
        if admit && ok && !check.deferred && wait > 0 {
            // Admitted after `wait`: its units reserved for then.
            let (remaining, reset) = self.counter.reserve(now, &p, member);
            return Decision {
                allowed: true,
                remaining,
                reset: micros(reset),
                retry_after: micros(wait),
                taken_us: now as i64,
            };
        }
        if admit && ok && !check.deferred {
            let (remaining, reset) = self.counter.take(now, &p, member);
            return Decision {
                allowed: true,
                remaining,
                reset: micros(reset),
                retry_after: Duration::ZERO,
                taken_us: now as i64,
            };
        }
        if !check.block.is_zero() && self.boxed_until > now {
            let left = micros(self.boxed_until - now);
            return Decision {
                allowed: false,
                remaining: 0,
                reset: left,
                retry_after: left,
                taken_us: 0,
            };
        }
        let (remaining, mut reset, mut retry) = self.counter.report(now, &p);
        if !ok && !check.block.is_zero() {
            // This limit denied the key: into the penalty box.
            let block = micros_of(check.block);
            self.boxed_until = now.saturating_add(block);
            reset = reset.max(block);
            retry = retry.max(block);
        }
        Decision {
            allowed: ok,
            remaining,
            reset: micros(reset),
            retry_after: micros(retry),
            taken_us: 0,
        }
    }
}

type Shard = HashMap<String, Slot>;

/// In-process limiter, safe to share between threads.
pub struct LocalLimiter<C: Clock = MonotonicClock> {
    slots: ShardedMap<Slot>,
    clock: C,
}

impl LocalLimiter<MonotonicClock> {
    /// A limiter holding at most about `max_keys` keys, on the real clock.
    pub fn new(max_keys: usize) -> Self {
        Self::with_clock(max_keys, MonotonicClock::default())
    }
}

impl<C: Clock> LocalLimiter<C> {
    /// A limiter on `clock`.
    pub fn with_clock(max_keys: usize, clock: C) -> Self {
        Self {
            slots: ShardedMap::new(max_keys),
            clock,
        }
    }

    /// Number of keys currently held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides `checks` all or nothing, like the Redis script; admitted units
    /// are recorded under `member`.
    pub fn decide(&self, checks: &[LimitCheck<'_>], member: &str) -> Vec<Decision> {
        let now = self.clock.now_us();
        let (mut guards, slots) = self.slots.lock_all(checks.iter().map(|c| c.key));
        let capacity = self.slots.shard_capacity();

        // Pass 1: trim and see what fits.
        let mut fits = Vec::with_capacity(checks.len());
        let mut admit = true;
        for (check, &g) in checks.iter().zip(&slots) {
            let slot = slot_for(&mut guards[g], check, capacity, now);
            let (ok, wait) = slot.fits(check, now);
            admit &= ok || check.shadow;
            fits.push((ok, wait));
        }

        // Pass 2: consume (if admitted) and report.
        checks
            .iter()
            .zip(&slots)
            .zip(fits)
            .map(|((check, &g), (ok, wait))| {
                let Some(slot) = guards[g].get_mut(check.key) else {
                    return Decision {
                        allowed: ok,
                        remaining: check.limit,
                        reset: Duration::ZERO,
                        retry_after: Duration::ZERO,
                        taken_us: 0,
                    };
                };
                slot.conclude(check, admit, (ok, wait), now, member)
            })
            .collect()
    }

    /// Gives back the units `member` reserved on `checks` (a delayed
    /// request whose client left while it waited).
    pub fn give_back(&self, checks: &[LimitCheck<'_>], member: &str) {
        let (mut guards, slots) = self.slots.lock_all(checks.iter().map(|c| c.key));
        for (check, &g) in checks.iter().zip(&slots) {
            if let Some(slot) = guards[g].get_mut(check.key) {
                slot.counter.give_back(member, &Params::of(check));
            }
        }
    }

    /// Gives back each check's `cost` units taken at `taken_us[i]` (see
    /// [`Limiter::refund`]).
    pub fn refund(&self, checks: &[LimitCheck<'_>], taken_us: &[i64]) {
        let now = self.clock.now_us();
        let (mut guards, slots) = self.slots.lock_all(checks.iter().map(|c| c.key));
        for ((check, &g), &at) in checks.iter().zip(&slots).zip(taken_us) {
            if let Some(slot) = guards[g].get_mut(check.key) {
                let at = u64::try_from(at).unwrap_or(0);
                slot.counter.refund(at, now, &Params::of(check));
            }
        }
    }

    /// Consumes each check's cost under `member` whatever the limit holds
    /// (a deferred limit's counted response).
    pub fn record(&self, checks: &[LimitCheck<'_>], member: &str) {
        let now = self.clock.now_us();
        let (mut guards, slots) = self.slots.lock_all(checks.iter().map(|c| c.key));
        let capacity = self.slots.shard_capacity();
        for (check, &g) in checks.iter().zip(&slots) {
            let slot = slot_for(&mut guards[g], check, capacity, now);
            let p = Params::of(check);
            slot.counter.peek(now, &p);
            slot.counter.take(now, &p, member);
        }
    }

    /// Renews `leases` (see [`Limiter::renew`]): each one still held ends
    /// its `lease` from now.
    pub fn renew(&self, leases: &[super::Lease]) {
        let now = self.clock.now_us();
        let (mut guards, slots) = self.slots.lock_all(leases.iter().map(|l| l.key.as_str()));
        for (lease, &g) in leases.iter().zip(&slots) {
            if let Some(slot) = guards[g].get_mut(&lease.key) {
                let ends = now.saturating_add(micros_of(lease.lease));
                slot.counter.renew(&lease.member, now, ends);
            }
        }
    }

    /// Releases the concurrency leases `member` holds on `checks`.
    pub fn release(&self, checks: &[LimitCheck<'_>], member: &str) {
        let (mut guards, slots) = self.slots.lock_all(checks.iter().map(|c| c.key));
        for (check, &g) in checks.iter().zip(&slots) {
            if let Some(slot) = guards[g].get_mut(check.key) {
                slot.counter.release(member);
            }
        }
    }
}

#[async_trait]
impl<C: Clock> Limiter for LocalLimiter<C> {
    /// Never fails and never waits.
    async fn check(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
    ) -> Result<Vec<Decision>, LimiterError> {
        Ok(self.decide(checks, member))
    }

    async fn release(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError> {
        LocalLimiter::release(self, checks, member);
        Ok(())
    }

    async fn record(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError> {
        LocalLimiter::record(self, checks, member);
        Ok(())
    }

    async fn refund(
        &self,
        checks: &[LimitCheck<'_>],
        _member: &str,
        taken_us: &[i64],
    ) -> Result<(), LimiterError> {
        LocalLimiter::refund(self, checks, taken_us);
        Ok(())
    }

    async fn peek(&self, checks: &[LimitCheck<'_>]) -> Result<Vec<Decision>, LimiterError> {
        let peeks: Vec<LimitCheck<'_>> = checks
            .iter()
            .map(|c| LimitCheck {
                deferred: true,
                max_delay: Duration::ZERO,
                block: Duration::ZERO,
                ..*c
            })
            .collect();
        Ok(self.decide(&peeks, "peek"))
    }

    async fn reset(&self, checks: &[LimitCheck<'_>]) -> Result<(), LimiterError> {
        let (mut guards, slots) = self.slots.lock_all(checks.iter().map(|c| c.key));
        for (check, &g) in checks.iter().zip(&slots) {
            guards[g].remove(check.key);
        }
        Ok(())
    }
}

/// `check`'s slot in `shard`, made (room first) when absent, and started
/// afresh when it held another algorithm (a reload changed it).
fn slot_for<'s>(
    shard: &'s mut Shard,
    check: &LimitCheck<'_>,
    capacity: usize,
    now: u64,
) -> &'s mut Slot {
    if !shard.contains_key(check.key) {
        make_room(shard, capacity, now);
    }
    let slot = shard
        .entry(check.key.to_string())
        .or_insert_with(|| Slot::new(check.algorithm.counter()));
    if slot.algorithm != check.algorithm.counter() {
        *slot = Slot::new(check.algorithm.counter());
    }
    slot
}

fn make_room(shard: &mut Shard, capacity: usize, now: u64) {
    if shard.len() < capacity {
        return;
    }
    shard.retain(|_, slot| !slot.counter.is_idle(now) || slot.boxed_until > now);
    if shard.len() >= capacity {
        let excess = shard.len() + 1 - capacity;
        let drop = excess.max(capacity / 10).max(1);
        let victims: Vec<String> = shard.keys().take(drop).cloned().collect();
        for key in victims {
            shard.remove(&key);
        }
        log::warn!("local limiter full ({capacity} keys per shard): forgot {drop} live keys; raise limiter.local.max_keys");
    }
}

fn micros_of(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

#[cfg(test)]
mod tests;
