//! Every algorithm that stores times stays within its bound when Redis's
//! clock steps back: thousands of random decisions (cost 1–3, some refunded)
//! on a clock that now and then jumps back by up to a window, hundreds of
//! times.
//!
//! - `sliding_log`: no window of the log's own timeline ever holds more than
//!   `limit` units, on both of the log's layouts (the packed string and a
//!   large limit's sorted set). Each unit's stamp is read back from Redis
//!   after its admission: the ledger checked is what Redis really logged,
//!   minus what refunds really removed.
//! - `sliding_window`, `fixed_window`, `token_bucket`: checked on real time
//!   (the test's clock without its steps back, which take no time): no
//!   interval of `window` holds more than `limit` units (`sliding_window`),
//!   or `2 × limit` (`fixed_window`, whose boundary allows that much), and
//!   no interval of `d` more than `burst + d / interval` (`token_bucket`).
//!   A refund is taken off the ledger by what Redis really gave back.
//!
//! Redis's clock cannot be stepped from a test, so the decide code runs here
//! with `TIME` replaced by a clock the test sets (a key it writes before each
//! call); everything else is the code the gateway loads. The fake clock runs
//! ten minutes ahead of Redis's own, so the keys' expiry (set from the fake
//! clock, kept by Redis's) never ends a count early: expiry by TTL is the
//! real-time tests' (`conformance.rs`, `algorithms.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use sluice::limiter::redis::wire::{take_args, DECIDE_SCRIPT, PACKED_LOG_MAX};
use sluice::limiter::{Algorithm, LimitCheck};
use std::time::Duration;

const WINDOW_US: u64 = 1_000_000;
const CLOCK: &str = "test:clock";

/// The decide code with Redis's clock replaced by the one at [`CLOCK`].
fn script_on_a_fake_clock() -> redis::Script {
    let call = "redis.call('TIME')";
    assert_eq!(DECIDE_SCRIPT.matches(call).count(), 1, "one clock reading");
    let fake = format!(
        "local function fake_time() local v = tonumber(redis.call('GET', '{CLOCK}')) return {{ math.floor(v / 1000000), v % 1000000 }} end\n{}",
        DECIDE_SCRIPT.replace(call, "fake_time()")
    );
    redis::Script::new(&fake)
}

/// A small deterministic generator (the same run every time).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The stamps logged at `key`, oldest first, in either layout.
fn stamps(conn: &mut redis::Connection, key: &str, packed: bool) -> Vec<u64> {
    if packed {
        return packed_stamps(conn, key);
    }
    let pairs: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .expect("ZRANGE");
    // The floor's marker (`!`, the set's last member) is not a unit.
    pairs
        .into_iter()
        .filter(|(member, _)| member != "!")
        .map(|(_, score)| score as u64)
        .collect()
}

/// Removes one occurrence of each of `gone` from `ledger`.
fn remove_each(ledger: &mut Vec<u64>, gone: &[u64]) {
    for stamp in gone {
        if let Some(i) = ledger.iter().position(|s| s == stamp) {
            ledger.swap_remove(i);
        }
    }
}

/// What `after` lacks of `before` (multisets).
fn removed(before: &[u64], after: &[u64]) -> Vec<u64> {
    let mut left = after.to_vec();
    let mut gone = Vec::new();
    for stamp in before {
        match left.iter().position(|s| s == stamp) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => gone.push(*stamp),
        }
    }
    gone
}

/// What a run left: each admission's real time (µs) and the units Redis
/// still holds for it, and (`sliding_log`) the stamps Redis logged for them.
#[derive(Default)]
struct Ledger {
    admitted: Vec<(u64, u64)>,
    stamps: Vec<u64>,
    back: usize,
}

/// The units Redis holds at `key` under `algorithm` (a counter's count).
fn held(conn: &mut redis::Connection, key: &str, algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::FixedWindow => {
            let count: Option<u64> = redis::cmd("HGET")
                .arg(key)
                .arg("c")
                .query(conn)
                .expect("HGET");
            count.unwrap_or(0)
        }
        Algorithm::SlidingWindow { .. } => {
            let counts: Vec<u64> = redis::cmd("HVALS").arg(key).query(conn).expect("HVALS");
            counts.iter().sum()
        }
        _ => panic!("{algorithm:?} is not a counter"),
    }
}

/// Runs `steps` random decisions under `check` (its cost replaced by 1–3),
/// advancing the fake clock by up to `stride` µs a step and stepping it back
/// by up to `back_by` µs one step in five; one admission in five is refunded
/// when `refunds`.
fn run(
    redis: &RedisServer,
    check: LimitCheck<'_>,
    (stride, back_by): (u64, u64),
    steps: usize,
    refunds: bool,
) -> Ledger {
    let script = script_on_a_fake_clock();
    let mut conn = redis.connection();
    let key = check.key;
    let is_log = check.algorithm == Algorithm::SlidingLog;
    let packed = check.limit <= PACKED_LOG_MAX;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
    let mut now = (secs + 600) * 1_000_000 + micros;
    let mut real = 0;
    let mut rng = Lcg(check.limit);
    let mut ledger = Ledger::default();
    for step in 0..steps {
        if rng.below(5) == 0 {
            now -= rng.below(back_by);
            ledger.back += 1;
        } else {
            let forward = rng.below(stride);
            now += forward;
            real += forward;
        }
        let _: () = redis::cmd("SET")
            .arg(CLOCK)
            .arg(now)
            .query(&mut conn)
            .expect("SET clock");
        let cost = 1 + rng.below(3);
        let check = LimitCheck { cost, ..check };
        let member = format!("0123456789abcdef-{step:x}");
        let args = take_args(&[check], &member);
        let mut invocation = script.key(key);
        for arg in &args {
            invocation.arg(arg.as_slice());
        }
        let reply: Vec<i64> = invocation.invoke(&mut conn).expect("decide");
        if reply[0] != 1 {
            continue;
        }
        let logged = if is_log {
            let logged = stamps(&mut conn, key, packed);
            ledger
                .stamps
                .extend_from_slice(&logged[logged.len() - cost as usize..]);
            logged
        } else {
            Vec::new()
        };
        let mut units = cost;
        if refunds && rng.below(5) == 0 {
            let before = if is_log {
                0
            } else {
                held(&mut conn, key, check.algorithm)
            };
            // A refund of this admission, at the time the reply gave (as
            // a cluster's all-or-nothing refund sends it).
            let mut refund = script.key(key);
            refund.arg(member.as_str()).arg("refund").arg(reply[1]);
            for arg in &args[3..] {
                refund.arg(arg.as_slice());
            }
            let _: redis::Value = refund.invoke(&mut conn).expect("refund");
            if is_log {
                let gone = removed(&logged, &stamps(&mut conn, key, packed));
                units -= gone.len() as u64;
                remove_each(&mut ledger.stamps, &gone);
            } else {
                units -= before - held(&mut conn, key, check.algorithm);
            }
        }
        ledger.admitted.push((real, units));
    }
    ledger.stamps.sort_unstable();
    ledger
}

/// The first run of admissions within `span` µs of real time holding more
/// than `bound(their span)` units, if any.
fn over_in_real_time(
    admitted: &[(u64, u64)],
    span: u64,
    bound: impl Fn(u64) -> u64,
) -> Option<&[(u64, u64)]> {
    (0..admitted.len()).find_map(|first| {
        let start = admitted[first].0;
        let mut units = 0;
        for (last, &(at, held)) in admitted.iter().enumerate().skip(first) {
            if at - start > span {
                break;
            }
            units += held;
            if units > bound(at - start) {
                return Some(&admitted[first..=last]);
            }
        }
        None
    })
}

/// The first window of the ledger holding more than `limit` units, if any.
fn over_the_limit(ledger: &[u64], limit: u64) -> Option<&[u64]> {
    ledger
        .windows(limit as usize + 1)
        .find(|units| units[limit as usize] - units[0] < WINDOW_US)
}

fn log_check(key: &str, limit: u64) -> LimitCheck<'_> {
    LimitCheck::plain(
        key,
        limit,
        Duration::from_micros(WINDOW_US),
        Algorithm::SlidingLog,
    )
}

#[test]
fn a_packed_log_stays_exact_when_the_clock_steps_back() {
    let redis = RedisServer::start();
    let limit = 5;
    let check = log_check("sluice:{clock:packed}", limit);
    let ledger = run(&redis, check, (600_000, WINDOW_US), 3000, true);
    assert!(
        ledger.back >= 300,
        "the clock stepped back {} times",
        ledger.back
    );
    assert!(
        ledger.stamps.len() > 500,
        "only {} units admitted",
        ledger.stamps.len()
    );
    assert_eq!(over_the_limit(&ledger.stamps, limit), None);
}

#[test]
fn a_large_limits_log_stays_exact_when_the_clock_steps_back() {
    let redis = RedisServer::start();
    let limit = PACKED_LOG_MAX + 44;
    let check = log_check("sluice:{clock:large}", limit);
    let ledger = run(&redis, check, (3_000, 3_000), 6000, true);
    assert!(
        ledger.back >= 300,
        "the clock stepped back {} times",
        ledger.back
    );
    assert!(
        ledger.stamps.len() as u64 > 3 * limit,
        "only {} units admitted",
        ledger.stamps.len()
    );
    assert_eq!(over_the_limit(&ledger.stamps, limit), None);
}

/// Runs `algorithm` at a limit of 5 a window and checks real time against
/// `bound` (units allowed in an interval of the given length, µs).
fn counter_stays_within(algorithm: Algorithm, refunds: bool, bound: impl Fn(u64) -> u64) {
    let redis = RedisServer::start();
    let key = format!("sluice:{{clock:{}}}", algorithm.name());
    let check = LimitCheck::plain(&key, 5, Duration::from_micros(WINDOW_US), algorithm);
    let ledger = run(&redis, check, (600_000, WINDOW_US), 3000, refunds);
    assert!(
        ledger.back >= 300,
        "the clock stepped back {} times",
        ledger.back
    );
    let units: u64 = ledger.admitted.iter().map(|&(_, units)| units).sum();
    assert!(units > 500, "{algorithm:?}: only {units} units admitted");
    assert_eq!(
        over_in_real_time(&ledger.admitted, WINDOW_US, bound),
        None,
        "{algorithm:?}: (real µs, units) over its bound"
    );
}

#[test]
fn a_sliding_window_stays_within_its_limit_when_the_clock_steps_back() {
    counter_stays_within(Algorithm::SlidingWindow { buckets: 4 }, true, |_| 5);
}

#[test]
fn a_fixed_window_stays_within_twice_its_limit_when_the_clock_steps_back() {
    counter_stays_within(Algorithm::FixedWindow, true, |_| 2 * 5);
}

/// Without refunds: a token bucket's refund gives its units back at once, so
/// a refund of an older admission may let a later one through sooner than
/// the admission's absence would have (a property of giving tokens back, not
/// of the clock).
#[test]
fn a_token_bucket_stays_within_its_rate_when_the_clock_steps_back() {
    let interval = WINDOW_US / 5;
    counter_stays_within(Algorithm::TokenBucket { burst: 5 }, false, |d| {
        5 + d / interval
    });
}
