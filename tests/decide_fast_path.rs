//! The decide code's fast path (one limit, `take`, cost 1, plain mode, on
//! every algorithm but `calendar`, both layouts of `sliding_log`) answers
//! exactly what its general path answers, and leaves the same state. Each call of the batch form carries the same decision twice on
//! two keys, with the same Redis clock: once as the gateway sends it (the
//! fast path), once with its mode spelt `0:0` (no delay: the same limit, but
//! one the fast path leaves to the general one). Their lines must be equal,
//! through admissions, denials, expiry, and keys holding something else.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use sluice::limiter::redis::wire::{push_batch, take_args};
use sluice::limiter::{Algorithm, LimitCheck};
use std::time::Duration;

const LIMIT: u64 = 5;
const WINDOW: Duration = Duration::from_secs(1);
/// A `sliding_log` limit kept as a sorted set (above the packed log's
/// largest), filled to within [`LIMIT`] of it before the test.
const LARGE_LIMIT: u64 = sluice::limiter::redis::wire::PACKED_LOG_MAX + 1;

/// One batch call deciding `algorithm` with `limit` on `fast_key` and
/// `general_key`; returns their two lines.
fn decide_both(
    redis: &RedisServer,
    function: &str,
    (algorithm, limit): (Algorithm, u64),
    (fast_key, general_key): (&str, &str),
    sequence: u64,
) -> (String, String) {
    let args = |key: &str, member: &str| {
        let check = LimitCheck::plain(key, limit, WINDOW, algorithm);
        take_args(&[check], member)
    };
    let fast = args(fast_key, &format!("0123456789abcdef-{sequence:x}"));
    let mut general = args(general_key, &format!("0123456789abcdef-{sequence:x}"));
    assert_eq!(general.last().map(Vec::as_slice), Some(&b"0"[..]));
    if let Some(mode) = general.last_mut() {
        *mode = b"0:0".to_vec();
    }
    let mut command = redis::cmd("FCALL");
    command.arg(function).arg(2).arg(fast_key).arg(general_key);
    push_batch(
        &mut command,
        None,
        [(1, fast.as_slice()), (1, general.as_slice())].into_iter(),
    );
    let reply: String = command.query(&mut redis.connection()).expect("FCALL batch");
    let mut lines = reply.lines().map(str::to_string);
    let now = lines.next().expect("the batch's time");
    assert!(now.parse::<u64>().is_ok(), "{reply}");
    let first = lines.next().expect("the fast decision's line");
    let second = lines.next().expect("the general decision's line");
    (first, second)
}

fn redis_time_us(redis: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query(&mut redis.connection())
        .expect("TIME");
    secs * 1_000_000 + micros
}

/// Fills the sorted-set logs at `keys` with `units` units stamped now
/// (the same on both), so that [`LIMIT`] more reach [`LARGE_LIMIT`].
fn fill_large_logs(redis: &RedisServer, keys: (&str, &str), units: u64) {
    let now = redis_time_us(redis);
    for key in [keys.0, keys.1] {
        let mut fill = redis::pipe();
        for i in 0..units {
            fill.cmd("ZADD")
                .arg(key)
                .arg(now)
                .arg(format!("fedcba9876543210-{:x}", 0x10_0000 + i))
                .ignore();
        }
        fill.cmd("PEXPIRE").arg(key).arg(5_000).ignore();
        let () = fill.query(&mut redis.connection()).expect("fill the log");
    }
}

/// Every algorithm the fast path takes, with its limit.
fn fast_algorithms() -> Vec<(&'static str, Algorithm, u64)> {
    vec![
        ("log", Algorithm::SlidingLog, LIMIT),
        ("large_log", Algorithm::SlidingLog, LARGE_LIMIT),
        ("fixed", Algorithm::FixedWindow, LIMIT),
        ("window", Algorithm::SlidingWindow { buckets: 10 }, LIMIT),
        ("bucket", Algorithm::TokenBucket { burst: LIMIT }, LIMIT),
        ("leases", Algorithm::Concurrency { lease: WINDOW }, LIMIT),
    ]
}

#[test]
fn the_fast_path_answers_what_the_general_path_answers() {
    let redis = RedisServer::start();
    let function = redis.load_decide_function();
    for (name, algorithm, limit) in fast_algorithms() {
        let keys = (
            format!("t:{{{name}:fast}}"),
            format!("t:{{{name}:general}}"),
        );
        let keys = (keys.0.as_str(), keys.1.as_str());
        if limit > LIMIT {
            fill_large_logs(&redis, keys, limit - LIMIT);
        }
        let mut sequence = 0;
        let mut admitted = 0;
        let decide = |sequence: u64| {
            let (fast, general) =
                decide_both(&redis, &function, (algorithm, limit), keys, sequence);
            assert_eq!(fast, general, "{name}: decision {sequence}");
            u64::from(fast.starts_with("1 "))
        };
        // Two rounds of: one decision, half a window, the rest of a burst,
        // until the first has left the window (the key lives on, held by the
        // later ones): the second round begins by dropping expired entries.
        for _ in 0..2 {
            let first = redis_time_us(&redis);
            sequence += 1;
            admitted += decide(sequence);
            let half = first + WINDOW.as_micros() as u64 / 2;
            wait_until(Duration::from_secs(10), "half a window", || {
                redis_time_us(&redis) > half
            });
            for _ in 0..LIMIT + 1 {
                sequence += 1;
                admitted += decide(sequence);
            }
            let past = first + WINDOW.as_micros() as u64 + 50_000;
            wait_until(
                Duration::from_secs(10),
                "the first to leave the window",
                || redis_time_us(&redis) > past,
            );
        }
        // Each burst fills the limit at least once.
        assert!(admitted >= LIMIT, "{name}: admitted {admitted}");
        assert!(admitted < 2 * (LIMIT + 2), "{name}: nothing denied");
    }
}

#[test]
fn keys_holding_something_else_take_the_general_path() {
    let redis = RedisServer::start();
    let function = redis.load_decide_function();
    let mut conn = redis.connection();
    // Not sluice's: the decision fails on its own line, on both paths (the
    // packed log lives at KEY!l).
    for key in ["t:{x:fast}!l", "t:{x:general}!l"] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("f")
            .arg("not a log")
            .query(&mut conn)
            .expect("HSET");
    }
    let keys = ("t:{x:fast}", "t:{x:general}");
    let log = (Algorithm::SlidingLog, LIMIT);
    let (fast, general) = decide_both(&redis, &function, log, keys, 1);
    assert!(
        fast.starts_with('!') && fast.contains("WRONGTYPE"),
        "{fast}"
    );
    assert_eq!(fast, general);
    // Left by another of sluice's algorithms (a reload changed it): dropped,
    // and the decision is made afresh.
    let keys = ("t:{y:fast}", "t:{y:general}");
    decide_both(&redis, &function, log, keys, 2);
    let fixed = (Algorithm::FixedWindow, LIMIT);
    let (fast, general) = decide_both(&redis, &function, fixed, keys, 3);
    assert!(fast.starts_with("1 "), "{fast}");
    assert_eq!(fast, general);
    // An earlier version's sorted-set log at KEY (a rolling upgrade) is
    // left to it: the packed log keeps its own count beside it.
    for key in ["t:{z:fast}", "t:{z:general}"] {
        let _: () = redis::cmd("ZADD")
            .arg(key)
            .arg(1)
            .arg("0123456789abcdef-1")
            .query(&mut conn)
            .expect("ZADD");
    }
    let keys = ("t:{z:fast}", "t:{z:general}");
    let (fast, general) = decide_both(&redis, &function, log, keys, 4);
    assert!(fast.starts_with("1 "), "{fast}");
    assert_eq!(fast, general);
    assert_eq!(redis.zcard("t:{z:fast}"), 1, "the old log is untouched");
}
