//! `sliding_log` stays exact when Redis's clock steps back: thousands of
//! random decisions (cost 1–3, some refunded) on a clock that now and then
//! jumps back by up to a window, hundreds of times, and no window of the
//! log's own timeline ever holds more than `limit` units. Run on both of
//! the log's layouts: the packed string and a large limit's sorted set.
//!
//! Redis's clock cannot be stepped from a test, so the decide code runs here
//! with `TIME` replaced by a clock the test sets (a key it writes before each
//! call); everything else is the code the gateway loads. The fake clock runs
//! ten minutes ahead of Redis's own, so the keys' expiry (set from the fake
//! clock, kept by Redis's) never ends a log early. Each unit's stamp is read
//! back from Redis after its admission: the ledger checked is what Redis
//! really logged, minus what refunds really removed.

mod common;

use common::*;
use sluice::limiter::wire::{take_args, DECIDE_SCRIPT, PACKED_LOG_MAX};
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
    pairs.into_iter().map(|(_, score)| score as u64).collect()
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

/// Runs `steps` random decisions at `limit`, advancing the fake clock by up
/// to `stride` µs a step and stepping it back by up to `back_by` µs one step
/// in five. Returns the ledger of stamps (admitted, not refunded) and the
/// number of steps back.
fn run(
    redis: &RedisServer,
    limit: u64,
    (stride, back_by): (u64, u64),
    steps: usize,
) -> (Vec<u64>, usize) {
    let script = script_on_a_fake_clock();
    let mut conn = redis.connection();
    let key = format!("sluice:{{clock:steps:{limit}}}");
    let packed = limit <= PACKED_LOG_MAX;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
    let mut now = (secs + 600) * 1_000_000 + micros;
    let mut rng = Lcg(limit);
    let mut ledger = Vec::new();
    let mut back = 0;
    for step in 0..steps {
        if rng.below(5) == 0 {
            now -= rng.below(back_by);
            back += 1;
        } else {
            now += rng.below(stride);
        }
        let _: () = redis::cmd("SET")
            .arg(CLOCK)
            .arg(now)
            .query(&mut conn)
            .expect("SET clock");
        let cost = 1 + rng.below(3);
        let check = LimitCheck {
            cost,
            ..LimitCheck::plain(
                &key,
                limit,
                Duration::from_micros(WINDOW_US),
                Algorithm::SlidingLog,
            )
        };
        let member = format!("0123456789abcdef-{step:x}");
        let args = take_args(&[check], &member);
        let mut invocation = script.key(&key);
        for arg in &args {
            invocation.arg(arg.as_slice());
        }
        let reply: Vec<i64> = invocation.invoke(&mut conn).expect("decide");
        if reply[0] != 1 {
            continue;
        }
        let logged = stamps(&mut conn, &key, packed);
        ledger.extend_from_slice(&logged[logged.len() - cost as usize..]);
        if rng.below(5) == 0 {
            // A refund of this admission, at the time the reply gave (as
            // a cluster's all-or-nothing refund sends it).
            let mut refund = script.key(&key);
            refund.arg(member.as_str()).arg("refund").arg(reply[1]);
            for arg in &args[3..] {
                refund.arg(arg.as_slice());
            }
            let _: redis::Value = refund.invoke(&mut conn).expect("refund");
            remove_each(
                &mut ledger,
                &removed(&logged, &stamps(&mut conn, &key, packed)),
            );
        }
    }
    ledger.sort_unstable();
    (ledger, back)
}

/// The first window of the ledger holding more than `limit` units, if any.
fn over_the_limit(ledger: &[u64], limit: u64) -> Option<&[u64]> {
    ledger
        .windows(limit as usize + 1)
        .find(|units| units[limit as usize] - units[0] < WINDOW_US)
}

#[test]
fn a_packed_log_stays_exact_when_the_clock_steps_back() {
    let redis = RedisServer::start();
    let limit = 5;
    let (ledger, back) = run(&redis, limit, (600_000, WINDOW_US), 3000);
    assert!(back >= 300, "the clock stepped back {back} times");
    assert!(ledger.len() > 500, "only {} units admitted", ledger.len());
    assert_eq!(over_the_limit(&ledger, limit), None);
}

#[test]
fn a_large_limits_log_stays_exact_when_the_clock_steps_back() {
    let redis = RedisServer::start();
    let limit = PACKED_LOG_MAX + 44;
    let (ledger, back) = run(&redis, limit, (3_000, 3_000), 6000);
    assert!(back >= 300, "the clock stepped back {back} times");
    assert!(
        ledger.len() as u64 > 3 * limit,
        "only {} units admitted",
        ledger.len()
    );
    assert_eq!(over_the_limit(&ledger, limit), None);
}
