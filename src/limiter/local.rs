//! The in-process `sliding_log` limiter: `backend: local`, and the fallback of
//! `on_error: local`.
//!
//! Same semantics as the Redis script, for one instance: per key, a log of
//! admit times; an entry counts while `now - t < window`; all or nothing over
//! the checks of one request. Memory is bounded by `max_keys` keys of at most
//! `limit` entries each. When more keys than that are live, the table first
//! drops keys whose log has emptied, then (still full) forgets about a tenth of
//! its keys — those keys restart from zero, which errs on the side of admitting.

use super::{Decision, LimitCheck, Limiter, LimiterError};
use async_trait::async_trait;
use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const SHARDS: usize = 16;

/// A monotonic microsecond clock. Tests substitute a fake one.
pub trait Clock: Send + Sync {
    /// Microseconds since an arbitrary fixed origin; never decreases.
    fn now_us(&self) -> u64;
}

/// The real clock: `Instant` since construction.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
}

#[derive(Debug)]
struct Log {
    admitted: VecDeque<u64>,
    window_us: u64,
}

impl Log {
    fn trim(&mut self, now: u64) {
        while let Some(&t) = self.admitted.front() {
            if now.saturating_sub(t) >= self.window_us {
                self.admitted.pop_front();
            } else {
                break;
            }
        }
    }
}

type Shard = HashMap<String, Log>;

/// In-process sliding-log limiter, safe to share between threads.
pub struct LocalLimiter<C: Clock = MonotonicClock> {
    shards: Vec<Mutex<Shard>>,
    shard_capacity: usize,
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
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            shard_capacity: max_keys.div_ceil(SHARDS).max(1),
            clock,
        }
    }

    /// Number of keys currently held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides `checks` all or nothing, like the Redis script.
    pub fn decide(&self, checks: &[LimitCheck<'_>]) -> Vec<Decision> {
        let now = self.clock.now_us();
        let shard_of: Vec<usize> = checks.iter().map(|c| shard_index(c.key)).collect();
        let mut order: Vec<usize> = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        // Lock in ascending shard order: no two requests can deadlock.
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let guard_for =
            |shard: usize| -> usize { guards.iter().position(|(i, _)| *i == shard).unwrap_or(0) };
        let slots: Vec<usize> = shard_of.iter().map(|&s| guard_for(s)).collect();

        // Pass 1: trim and count.
        let mut counts = Vec::with_capacity(checks.len());
        let mut admit = true;
        for (check, &slot) in checks.iter().zip(&slots) {
            let window_us = window_us(check.window);
            let count = match guards[slot].1.get_mut(check.key) {
                Some(log) => {
                    log.window_us = window_us;
                    log.trim(now);
                    log.admitted.len() as u64
                }
                None => 0,
            };
            admit &= count + check.cost <= check.limit;
            counts.push(count);
        }

        // Pass 2: consume (if admitted) and report.
        let capacity = self.shard_capacity;
        checks
            .iter()
            .zip(&slots)
            .zip(counts)
            .map(|((check, &slot), count)| {
                let window_us = window_us(check.window);
                let shard = &mut guards[slot].1;
                if admit {
                    if !shard.contains_key(check.key) {
                        make_room(shard, capacity, now);
                    }
                    let log = match shard.entry(check.key.to_string()) {
                        Entry::Occupied(e) => e.into_mut(),
                        Entry::Vacant(e) => e.insert(Log {
                            admitted: VecDeque::new(),
                            window_us,
                        }),
                    };
                    log.admitted
                        .extend(std::iter::repeat_n(now, check.cost as usize));
                    let oldest = log.admitted.front().copied().unwrap_or(now);
                    Decision {
                        allowed: true,
                        remaining: check.limit.saturating_sub(count + check.cost),
                        reset: micros(oldest + window_us - now),
                        retry_after: Duration::ZERO,
                    }
                } else {
                    let log = shard.get(check.key);
                    let excess = (count + check.cost).saturating_sub(check.limit);
                    let retry_after = match (excess, log) {
                        (0, _) | (_, None) => Duration::ZERO,
                        (e, Some(log)) => log
                            .admitted
                            .get(e as usize - 1)
                            .map(|&t| micros(t + window_us - now))
                            .unwrap_or(check.window),
                    };
                    let reset = log
                        .and_then(|l| l.admitted.front())
                        .map(|&t| micros(t + window_us - now))
                        .unwrap_or_default();
                    Decision {
                        allowed: count + check.cost <= check.limit,
                        remaining: check.limit.saturating_sub(count),
                        reset,
                        retry_after,
                    }
                }
            })
            .collect()
    }
}

#[async_trait]
impl<C: Clock> Limiter for LocalLimiter<C> {
    /// Never fails and never waits.
    async fn check(&self, checks: &[LimitCheck<'_>]) -> Result<Vec<Decision>, LimiterError> {
        Ok(self.decide(checks))
    }
}

fn make_room(shard: &mut Shard, capacity: usize, now: u64) {
    if shard.len() < capacity {
        return;
    }
    shard.retain(|_, log| {
        log.trim(now);
        !log.admitted.is_empty()
    });
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

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a log half-written in a way
    // that matters (worst case: one entry too few), so poisoning is ignored.
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn shard_index(key: &str) -> usize {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() as usize) % SHARDS
}

fn window_us(window: Duration) -> u64 {
    window.as_micros().min(u64::MAX as u128) as u64
}

fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct FakeClock(Arc<AtomicU64>);
    impl FakeClock {
        fn set_ms(&self, ms: u64) {
            self.0.store(ms * 1000, Ordering::SeqCst);
        }
    }
    impl Clock for FakeClock {
        fn now_us(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn check(key: &str, limit: u64, window_ms: u64) -> LimitCheck<'_> {
        LimitCheck {
            key,
            limit,
            window: Duration::from_millis(window_ms),
            cost: 1,
        }
    }

    #[test]
    fn seed_scenario_five_per_ten_seconds() {
        let clock = FakeClock::default();
        let limiter = LocalLimiter::with_clock(100, clock.clone());
        let mut allowed = 0;
        for i in 0..7 {
            clock.set_ms(1000 + i * 500);
            let d = limiter.decide(&[check("u", 5, 10_000)])[0];
            if d.allowed {
                allowed += 1;
            } else {
                // Oldest entry (t = 1000 ms) frees at 11 000 ms.
                assert_eq!(
                    d.retry_after,
                    Duration::from_millis(11_000 - (1000 + i * 500))
                );
                assert_eq!(d.remaining, 0);
            }
        }
        assert_eq!(allowed, 5);
        // Exactly when the window slides past the first entry, one unit frees.
        clock.set_ms(10_999);
        assert!(!limiter.decide(&[check("u", 5, 10_000)])[0].allowed);
        clock.set_ms(11_000);
        assert!(limiter.decide(&[check("u", 5, 10_000)])[0].allowed);
    }

    #[test]
    fn no_boundary_double_burst() {
        let clock = FakeClock::default();
        let limiter = LocalLimiter::with_clock(100, clock.clone());
        clock.set_ms(1_900);
        for _ in 0..5 {
            assert!(limiter.decide(&[check("k", 5, 2_000)])[0].allowed);
        }
        // A fixed window would reset at 2 000 ms; the sliding log does not.
        clock.set_ms(2_100);
        assert!(!limiter.decide(&[check("k", 5, 2_000)])[0].allowed);
        clock.set_ms(3_900);
        assert!(limiter.decide(&[check("k", 5, 2_000)])[0].allowed);
    }

    #[test]
    fn all_or_nothing_across_keys() {
        let clock = FakeClock::default();
        let limiter = LocalLimiter::with_clock(100, clock.clone());
        clock.set_ms(5);
        assert!(limiter.decide(&[check("ip", 1, 1000)])[0].allowed);
        let both = limiter.decide(&[check("user", 3, 1000), check("ip", 1, 1000)]);
        assert!(both[0].allowed && !both[1].allowed);
        // The denied request consumed nothing from `user`.
        assert_eq!(limiter.decide(&[check("user", 3, 1000)])[0].remaining, 2);
    }

    #[test]
    fn cost_consumes_several_units() {
        let limiter = LocalLimiter::with_clock(100, FakeClock::default());
        let c = LimitCheck {
            key: "c",
            limit: 5,
            window: Duration::from_secs(1),
            cost: 3,
        };
        assert!(limiter.decide(&[c])[0].allowed);
        let second = limiter.decide(&[c])[0];
        assert!(!second.allowed);
        assert_eq!(second.remaining, 2);
    }

    #[test]
    fn key_count_is_bounded() {
        let clock = FakeClock::default();
        let limiter = LocalLimiter::with_clock(160, clock.clone());
        for i in 0..10_000 {
            let key = format!("k{i}");
            limiter.decide(&[check(&key, 10, 60_000)]);
        }
        assert!(limiter.len() <= 160, "{}", limiter.len());
        // Expired keys are dropped before live ones.
        clock.set_ms(120_000);
        limiter.decide(&[check("fresh", 10, 60_000)]);
        assert!(limiter.len() <= 160);
    }
}
