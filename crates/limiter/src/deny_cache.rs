//! The deny cache (docs/algorithms.md): a denial with `retry_after = r` is remembered
//! in process until `receipt + r`; until then that key is denied without
//! asking Redis.
//!
//! For `sliding_log` this never denies a request that Redis would have
//! admitted, except by at most one round trip: Redis computed `r` as the time
//! until the entry that blocks this request leaves the window, nothing but
//! time frees units, and every request to one limit has the same cost. Under a
//! flood on one key Redis then sees about one call per freed unit, not one per
//! request. Limits sharing a counter (`share:`) may differ in cost, so a
//! denial is remembered with its cost and only answers requests costing at
//! //! least as much. Shadow limits never deny and concurrency denials end when a
//! lease is released, at no known time: neither is remembered.
//!
//! A denial answers only checks of the same limit (limit, window, algorithm):
//! after a reload changes a limit, its remembered denials stop applying, so
//! the new limit takes effect on the very next request.
//!
//! Memory is bounded: when full, expired entries are dropped, and if none
//! expired a new denial is simply not remembered (the cache only ever saves
//! work; forgetting is always safe).

use super::sharded::ShardedMap;
use super::{Decision, LimitCheck};
use std::time::{Duration, Instant};

/// The longest a denial is answered in process before Redis is asked again:
/// a long wait (a penalty box, a day's window) is still known to Redis, and
/// a reset there (the usage API) reaches every instance within this time.
pub const MAX_REMEMBERED: Duration = Duration::from_secs(10);

/// A remembered denial.
#[derive(Debug, Clone, Copy)]
struct Denial {
    /// The key is denied in process before this instant (at most
    /// [`MAX_REMEMBERED`] after the denial).
    until: Instant,
    /// When Redis said the key may retry: what a remembered denial reports,
    /// however long before that the cache stops answering.
    retry_at: Instant,
    /// The cost of the denied request.
    cost: u64,
    /// The limit that denied it, as configured when it did.
    limit: u64,
    window: Duration,
    algorithm: crate::settings::Algorithm,
}

impl Denial {
    /// Whether this denial answers `check`: the same limit, and a cost at
    /// least the one denied.
    fn answers(&self, check: &LimitCheck<'_>) -> bool {
        check.cost >= self.cost
            && check.limit == self.limit
            && check.window == self.window
            && check.algorithm == self.algorithm
    }
}

/// Whether a denial of `check` may be answered from the cache.
fn cacheable(check: &LimitCheck<'_>) -> bool {
    !check.shadow && check.algorithm.denial_is_timed()
}

/// Keys denied until a known instant.
pub struct DenyCache {
    denials: ShardedMap<Denial>,
}

impl DenyCache {
    /// A cache holding at most about `max_keys` keys.
    pub fn new(max_keys: usize) -> Self {
        Self {
            denials: ShardedMap::new(max_keys),
        }
    }

    /// If any check's key is denied past `now`, the decisions to answer with:
    /// the cached keys deny with their remaining wait (the whole wait Redis
    /// gave, even when it is longer than the cache answers for); the others are reported
    /// as admitting (they were not asked, and nothing is consumed).
    pub fn lookup(&self, checks: &[LimitCheck<'_>], now: Instant) -> Option<Vec<Decision>> {
        let mut decisions: Option<Vec<Decision>> = None;
        for (i, check) in checks.iter().enumerate() {
            if !cacheable(check) {
                continue;
            }
            let Some(wait) = self.denied_for(check, now) else {
                continue;
            };
            let all = decisions.get_or_insert_with(|| {
                checks
                    .iter()
                    .map(|c| Decision {
                        allowed: true,
                        remaining: c.limit,
                        reset: Duration::ZERO,
                        retry_after: Duration::ZERO,
                        taken_us: 0,
                    })
                    .collect()
            });
            all[i] = Decision {
                allowed: false,
                remaining: 0,
                reset: wait,
                retry_after: wait,
                taken_us: 0,
            };
        }
        decisions
    }

    /// Remembers every denying decision of `checks` until `now + retry_after`.
    pub fn remember(&self, checks: &[LimitCheck<'_>], decisions: &[Decision], now: Instant) {
        for (check, decision) in checks.iter().zip(decisions) {
            if decision.allowed || decision.retry_after.is_zero() || !cacheable(check) {
                continue;
            }
            let capacity = self.denials.shard_capacity();
            let mut shard = self.denials.shard(check.key);
            if shard.len() >= capacity && !shard.contains_key(check.key) {
                shard.retain(|_, denial| denial.until > now);
                if shard.len() >= capacity {
                    continue;
                }
            }
            shard.insert(
                check.key.to_string(),
                Denial {
                    until: now + decision.retry_after.min(MAX_REMEMBERED),
                    retry_at: now + decision.retry_after,
                    cost: check.cost,
                    limit: check.limit,
                    window: check.window,
                    algorithm: check.algorithm,
                },
            );
        }
    }

    /// Forgets the remembered denials of `checks`' keys (their counts were
    /// reset).
    pub fn forget(&self, checks: &[LimitCheck<'_>]) {
        for check in checks {
            self.denials.shard(check.key).remove(check.key);
        }
    }

    fn denied_for(&self, check: &LimitCheck<'_>, now: Instant) -> Option<Duration> {
        let mut shard = self.denials.shard(check.key);
        let denial = *shard.get(check.key)?;
        if denial.until > now {
            // A limit that delays admits what fits within `max_delay`: the
            // denial answers only while the wait is longer than that.
            let wait = denial.retry_at.saturating_duration_since(now);
            (denial.answers(check) && wait > check.max_delay).then_some(wait)
        } else {
            shard.remove(check.key);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str) -> LimitCheck<'_> {
        LimitCheck {
            key,
            limit: 5,
            window: Duration::from_secs(10),
            cost: 1,
            algorithm: crate::settings::Algorithm::SlidingLog,
            shadow: false,
            block: Duration::ZERO,
            deferred: false,
            max_delay: Duration::ZERO,
        }
    }

    #[test]
    fn cheaper_requests_shadow_and_concurrency_are_not_answered() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        let costly = LimitCheck {
            cost: 3,
            ..check("shared")
        };
        cache.remember(&[costly], &[denied(1000)], t0);
        assert!(cache.lookup(&[check("shared")], t0).is_none());
        assert!(cache.lookup(&[costly], t0).is_some());
        let shadow = LimitCheck {
            shadow: true,
            ..check("s")
        };
        cache.remember(&[shadow], &[denied(1000)], t0);
        assert!(cache.lookup(&[check("s")], t0).is_none());
        let leases = LimitCheck {
            algorithm: crate::settings::Algorithm::Concurrency {
                lease: Duration::from_secs(30),
            },
            ..check("c")
        };
        cache.remember(&[leases], &[denied(1000)], t0);
        assert!(cache.lookup(&[leases], t0).is_none());
    }

    fn denied(retry_ms: u64) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            reset: Duration::from_millis(retry_ms),
            retry_after: Duration::from_millis(retry_ms),
            taken_us: 0,
        }
    }

    #[test]
    fn denies_until_the_exact_retry_time() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        cache.remember(&[check("a")], &[denied(1500)], t0);
        let hit = cache
            .lookup(&[check("a")], t0 + Duration::from_millis(500))
            .unwrap();
        assert!(!hit[0].allowed);
        assert_eq!(hit[0].retry_after, Duration::from_millis(1000));
        assert!(cache
            .lookup(&[check("a")], t0 + Duration::from_millis(1500))
            .is_none());
        assert!(cache.lookup(&[check("b")], t0).is_none());
    }

    #[test]
    fn a_long_wait_is_reported_whole_but_answered_ten_seconds_at_most() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        cache.remember(&[check("a")], &[denied(600_000)], t0);
        let hit = cache
            .lookup(&[check("a")], t0 + Duration::from_secs(4))
            .unwrap();
        assert_eq!(hit[0].retry_after, Duration::from_secs(596));
        assert!(cache.lookup(&[check("a")], t0 + MAX_REMEMBERED).is_none());
    }

    #[test]
    fn a_changed_limit_is_not_answered_by_its_old_denials() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        cache.remember(&[check("k")], &[denied(1000)], t0);
        let raised = LimitCheck {
            limit: 100,
            ..check("k")
        };
        let longer = LimitCheck {
            window: Duration::from_secs(60),
            ..check("k")
        };
        let other = LimitCheck {
            algorithm: crate::settings::Algorithm::FixedWindow,
            ..check("k")
        };
        for changed in [raised, longer, other] {
            assert!(cache.lookup(&[changed], t0).is_none(), "{changed:?}");
        }
        assert!(cache.lookup(&[check("k")], t0).is_some());
    }

    #[test]
    fn one_cached_key_denies_a_multi_limit_request() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        cache.remember(&[check("ip")], &[denied(1000)], t0);
        let hit = cache.lookup(&[check("user"), check("ip")], t0).unwrap();
        assert!(hit[0].allowed && !hit[1].allowed);
    }

    #[test]
    fn admitted_decisions_are_not_remembered_and_size_is_bounded() {
        let cache = DenyCache::new(16);
        let t0 = Instant::now();
        let allowed = Decision {
            allowed: true,
            remaining: 3,
            reset: Duration::ZERO,
            retry_after: Duration::ZERO,
            taken_us: 0,
        };
        cache.remember(&[check("x")], &[allowed], t0);
        assert!(cache.lookup(&[check("x")], t0).is_none());
        for i in 0..1000 {
            let key = format!("k{i}");
            cache.remember(&[check(&key)], &[denied(60_000)], t0);
        }
        let held = cache.denials.len();
        assert!(held <= 16, "{held}");
    }
}
