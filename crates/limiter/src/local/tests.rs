//! The in-process limiter on a fake clock: each twin's decisions, the
//! bounded key map, and clock steps.

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
        algorithm: Algorithm::SlidingLog,
        shadow: false,
        block: Duration::ZERO,
        deferred: false,
        max_delay: Duration::ZERO,
    }
}

/// `on_limit: delay` in process: a sliding log reserves each waiting
/// unit at the time the unit blocking it leaves the window (never more
/// than the limit in any window), denies what would wait longer than
/// `max_delay`, and a unit given back frees its turn.
#[test]
fn a_sliding_log_that_delays_reserves_turns_and_takes_them_back() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    let delaying = LimitCheck {
        max_delay: Duration::from_millis(1_500),
        ..check("d", 2, 1_000)
    };
    clock.set_ms(10_000);
    let waits: Vec<(bool, Duration)> = (0..5)
        .map(|i| {
            let d = limiter.decide(&[delaying], &format!("m{i}"))[0];
            (d.allowed, d.delay())
        })
        .collect();
    let ms = Duration::from_millis;
    assert_eq!(
        waits,
        [
            (true, ms(0)),
            (true, ms(0)),
            (true, ms(1_000)),
            (true, ms(1_000)),
            (false, ms(0)),
        ]
    );
    // m2 leaves: its turn at 11 s is free for the next request.
    limiter.give_back(&[delaying], "m2");
    clock.set_ms(10_400);
    let next = limiter.decide(&[delaying], "m5")[0];
    assert_eq!((next.allowed, next.delay()), (true, ms(600)));
    // At 11 s the two reserved units are admitted, and the log holds
    // no more than 2 in any window.
    clock.set_ms(11_000);
    let full = limiter.decide(&[delaying], "m6")[0];
    assert_eq!((full.allowed, full.delay()), (true, ms(1_000)));
}

#[test]
fn a_token_bucket_that_delays_paces_at_its_rate() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    let paced = LimitCheck {
        algorithm: Algorithm::TokenBucket { burst: 1 },
        max_delay: Duration::from_millis(300),
        ..check("t", 10, 1_000)
    };
    clock.set_ms(5_000);
    let delays: Vec<Option<u64>> = (0..6)
        .map(|i| {
            let d = limiter.decide(&[paced], &format!("m{i}"))[0];
            d.allowed.then(|| d.delay().as_millis() as u64)
        })
        .collect();
    assert_eq!(
        delays,
        [Some(0), Some(100), Some(200), Some(300), None, None]
    );
    limiter.give_back(&[paced], "m3");
    let again = limiter.decide(&[paced], "m6")[0];
    assert_eq!(
        (again.allowed, again.delay()),
        (true, Duration::from_millis(300))
    );
}

#[test]
fn a_denied_key_stays_in_its_penalty_box() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    let boxed = LimitCheck {
        block: Duration::from_secs(60),
        deferred: false,
        max_delay: Duration::ZERO,
        ..check("b", 2, 1_000)
    };
    clock.set_ms(1_000);
    assert!(limiter.decide(&[boxed], "m1")[0].allowed);
    assert!(limiter.decide(&[boxed], "m2")[0].allowed);
    let denied = limiter.decide(&[boxed], "m3")[0];
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after, Duration::from_secs(60));
    // The window has long freed, the box has not.
    clock.set_ms(31_000);
    let still = limiter.decide(&[boxed], "m4")[0];
    assert!(!still.allowed);
    assert_eq!(still.retry_after, Duration::from_secs(30));
    // A limit without a box on the same key pattern is not affected.
    assert!(limiter.decide(&[check("other", 2, 1_000)], "m5")[0].allowed);
    clock.set_ms(61_000);
    assert!(limiter.decide(&[boxed], "m6")[0].allowed, "the box ended");
}

#[test]
fn seed_scenario_five_per_ten_seconds() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    let mut allowed = 0;
    for i in 0..7 {
        clock.set_ms(1000 + i * 500);
        let d = limiter.decide(&[check("u", 5, 10_000)], "m")[0];
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
    assert!(!limiter.decide(&[check("u", 5, 10_000)], "m")[0].allowed);
    clock.set_ms(11_000);
    assert!(limiter.decide(&[check("u", 5, 10_000)], "m")[0].allowed);
}

#[test]
fn no_boundary_double_burst() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    clock.set_ms(1_900);
    for _ in 0..5 {
        assert!(limiter.decide(&[check("k", 5, 2_000)], "m")[0].allowed);
    }
    // A fixed window would reset at 2 000 ms; the sliding log does not.
    clock.set_ms(2_100);
    assert!(!limiter.decide(&[check("k", 5, 2_000)], "m")[0].allowed);
    clock.set_ms(3_900);
    assert!(limiter.decide(&[check("k", 5, 2_000)], "m")[0].allowed);
}

/// A clock that steps back over a window boundary keeps counting in the
/// window it counted in (a fixed window, a sliding window's sub-window),
/// until it reaches that window again; a stored window further ahead
/// than any step back (written under another window size) is not.
#[test]
fn counters_keep_their_window_when_the_clock_steps_back() {
    let fixed = Algorithm::FixedWindow;
    let sliding = Algorithm::SlidingWindow { buckets: 4 };
    for algorithm in [fixed, sliding] {
        let clock = FakeClock::default();
        let limiter = LocalLimiter::with_clock(100, clock.clone());
        let c = LimitCheck {
            algorithm,
            ..check("k", 5, 2_000)
        };
        let allowed = |at_ms| {
            clock.set_ms(at_ms);
            limiter.decide(&[c], "m")[0].allowed
        };
        for _ in 0..5 {
            assert!(allowed(2_100), "{algorithm:?}");
        }
        assert!(!allowed(1_900), "{algorithm:?}: stepped back");
        assert!(!allowed(3_900), "{algorithm:?}: still the same window");
        assert!(allowed(4_600), "{algorithm:?}: the window ended");
    }
    // A full window of 1 s at index 9,000, then the window is 2 s (a
    // reload): index 9,000 is 4,500 windows ahead of the clock's, more
    // than a step back could be, so the new window starts from zero.
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    let window = |ms| LimitCheck {
        algorithm: fixed,
        ..check("r", 5, ms)
    };
    clock.set_ms(9_000_500);
    for _ in 0..5 {
        assert!(limiter.decide(&[window(1_000)], "m")[0].allowed);
    }
    assert!(!limiter.decide(&[window(1_000)], "m")[0].allowed);
    assert!(limiter.decide(&[window(2_000)], "m")[0].allowed);
}

#[test]
fn all_or_nothing_across_keys() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    clock.set_ms(5);
    assert!(limiter.decide(&[check("ip", 1, 1000)], "m")[0].allowed);
    let both = limiter.decide(&[check("user", 3, 1000), check("ip", 1, 1000)], "m");
    assert!(both[0].allowed && !both[1].allowed);
    // The denied request consumed nothing from `user`.
    assert_eq!(
        limiter.decide(&[check("user", 3, 1000)], "m")[0].remaining,
        2
    );
}

#[test]
fn cost_consumes_several_units() {
    let limiter = LocalLimiter::with_clock(100, FakeClock::default());
    let c = LimitCheck {
        key: "c",
        limit: 5,
        window: Duration::from_secs(1),
        cost: 3,
        algorithm: Algorithm::SlidingLog,
        shadow: false,
        block: Duration::ZERO,
        deferred: false,
        max_delay: Duration::ZERO,
    };
    assert!(limiter.decide(&[c], "m")[0].allowed);
    let second = limiter.decide(&[c], "m")[0];
    assert!(!second.allowed);
    assert_eq!(second.remaining, 2);
}

#[test]
fn key_count_is_bounded() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(160, clock.clone());
    for i in 0..10_000 {
        let key = format!("k{i}");
        limiter.decide(&[check(&key, 10, 60_000)], "m");
    }
    assert!(limiter.len() <= 160, "{}", limiter.len());
    // Expired keys are dropped before live ones.
    clock.set_ms(120_000);
    limiter.decide(&[check("fresh", 10, 60_000)], "m");
    assert!(limiter.len() <= 160);
}

#[test]
fn concurrency_leases_are_released_by_member() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    let lease = LimitCheck {
        algorithm: Algorithm::Concurrency {
            lease: Duration::from_secs(30),
        },
        ..check("c", 2, 0)
    };
    assert!(limiter.decide(&[lease], "r1")[0].allowed);
    assert!(limiter.decide(&[lease], "r2")[0].allowed);
    let third = limiter.decide(&[lease], "r3")[0];
    assert!(!third.allowed);
    assert_eq!(third.remaining, 0);
    limiter.release(&[lease], "r1");
    assert!(limiter.decide(&[lease], "r4")[0].allowed);
    // Unreleased leases expire by themselves.
    clock.set_ms(30_000);
    assert_eq!(limiter.decide(&[lease], "r5")[0].remaining, 1);
}

#[test]
fn shadow_checks_never_deny_and_consume_only_what_they_admit() {
    let limiter = LocalLimiter::with_clock(100, FakeClock::default());
    let shadow = LimitCheck {
        shadow: true,
        ..check("s", 1, 1000)
    };
    let first = limiter.decide(&[check("e", 10, 1000), shadow], "m1");
    assert!(first[0].allowed && first[1].allowed);
    let second = limiter.decide(&[check("e", 10, 1000), shadow], "m2");
    assert!(second[0].allowed, "the request is admitted");
    assert!(!second[1].allowed, "the shadow limit reports a denial");
    assert_eq!(second[0].remaining, 8, "the enforced limit consumed");
    // A request the enforced limit denies consumes no shadow unit.
    let full = limiter.decide(&[check("x", 1, 1000)], "m3");
    assert!(full[0].allowed);
    let denied = limiter.decide(
        &[
            check("x", 1, 1000),
            LimitCheck {
                shadow: true,
                ..check("s2", 5, 1000)
            },
        ],
        "m4",
    );
    assert!(!denied[0].allowed);
    assert_eq!(
        limiter.decide(&[check("s2", 5, 1000)], "m5")[0].remaining,
        4
    );
}
