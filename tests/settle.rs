//! Reserve and settle through the library, on a real Redis, a Redis Cluster
//! and in process,
//! for every algorithm that stores units: a request takes its reservation
//! atomically with the decision, then gives back what it did not use (as
//! taken at the decision's time) or is charged its overdraft on top; the
//! counter ends holding exactly what was used, and what the refund freed is
//! admitted at once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::RedisServer;
use sluice::config::calendar::{Period, PeriodBounds};
use sluice::config::{Algorithm, RedisConfig};
use sluice::limiter::local::LocalLimiter;
use sluice::limiter::redis::RedisLimiter;
use sluice::limiter::{LimitCheck, Limiter};
use sluice::observe::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;

/// An hour: nothing refills or leaves the window while a case runs.
const WINDOW: Duration = Duration::from_secs(3600);
const LIMIT: u64 = 100;

fn algorithms() -> Vec<(&'static str, Algorithm, u64)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let day = 86_400_000_000;
    let start = now - now.rem_euclid(day);
    let bounds = PeriodBounds {
        start_us: start,
        end_us: start + day,
        next_end_us: start + 2 * day,
    };
    vec![
        ("sliding_log", Algorithm::SlidingLog, LIMIT),
        // Above 1,024: the sorted-set log, refunded by member.
        ("sliding_log_zset", Algorithm::SlidingLog, 2_000),
        (
            "sliding_window",
            Algorithm::SlidingWindow { buckets: 60 },
            LIMIT,
        ),
        ("fixed_window", Algorithm::FixedWindow, LIMIT),
        (
            "token_bucket",
            Algorithm::TokenBucket { burst: LIMIT },
            LIMIT,
        ),
        (
            "calendar",
            Algorithm::Calendar {
                period: Period::Day,
                bounds,
            },
            LIMIT,
        ),
    ]
}

fn check(key: &str, algorithm: Algorithm, limit: u64, cost: u64) -> LimitCheck<'_> {
    let window = match algorithm {
        Algorithm::Calendar { bounds, .. } => {
            Duration::from_micros((bounds.end_us - bounds.start_us) as u64)
        }
        _ => WINDOW,
    };
    LimitCheck {
        cost,
        ..LimitCheck::plain(key, limit, window, algorithm)
    }
}

/// The script of one case, scaled to `limit` (units are `limit / 100`):
/// reserve 60, a 50 is refused, settle the 60 at 20 used (40 given back),
/// an 80 now fits exactly, a 1 does not; settle the 80 at 90 used (an
/// overdraft of 10). Returns what the limiter reports as used at the end,
/// or `None` when a fixed window or period ended during the case.
async fn run_case(
    limiter: &dyn Limiter,
    key: &str,
    algorithm: Algorithm,
    limit: u64,
) -> Option<u64> {
    let u = limit / LIMIT;
    let at = |cost: u64| check(key, algorithm, limit, cost * u);
    let first = limiter.check(&[at(60)], "m1").await.unwrap()[0];
    assert!(first.allowed, "{key}: the reservation of 60 fits");
    assert!(first.taken_us > 0, "{key}: the decision says when it took");
    let refused = limiter.check(&[at(50)], "m2").await.unwrap()[0];
    assert!(!refused.allowed, "{key}: 60 reserved + 50 > 100");
    limiter
        .refund(&[at(40)], "m1", &[first.taken_us])
        .await
        .unwrap();
    let second = limiter.check(&[at(80)], "m3").await.unwrap()[0];
    assert!(second.allowed, "{key}: 20 used + 80 fits after the refund");
    let full = limiter.check(&[at(1)], "m4").await.unwrap()[0];
    assert!(!full.allowed, "{key}: 100 used, 1 more does not fit");
    limiter.record(&[at(10)], "m3+").await.unwrap();
    let period = |t: i64| match algorithm {
        Algorithm::FixedWindow => t / WINDOW.as_micros() as i64,
        Algorithm::Calendar { bounds, .. } => i64::from(t >= bounds.end_us),
        _ => 0,
    };
    if period(first.taken_us) != period(second.taken_us) {
        return None;
    }
    let report = limiter.peek(&[at(1)]).await.unwrap()[0];
    assert_eq!(report.remaining, 0, "{key}: 110 used of 100");
    // A refund of the second reservation's 80 (as if it had used 10 of its
    // 90): back to 30 used whatever the overdraft's member is.
    limiter
        .refund(&[at(80)], "m3", &[second.taken_us])
        .await
        .unwrap();
    let report = limiter.peek(&[at(1)]).await.unwrap()[0];
    Some(limit - report.remaining)
}

/// A limiter on `redis`.
fn redis_limiter(redis: &RedisServer) -> RedisLimiter {
    let metrics = Metrics::new().unwrap();
    RedisLimiter::new(
        &RedisConfig {
            url: redis.url(),
            timeout: Duration::from_secs(2),
            key_prefix: "sluice:".into(),
            ..Default::default()
        },
        Arc::new(metrics.redis.clone()),
    )
    .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Every algorithm, run until no window boundary fell inside it (a fixed
/// window of an hour, a day's period: almost always the first time).
async fn every_algorithm(limiter: &dyn Limiter, backend: &str) {
    for (name, algorithm, limit) in algorithms() {
        let mut used = None;
        for attempt in 0..3 {
            let key = format!("settle:{backend}:{name}:{attempt}");
            used = run_case(limiter, &key, algorithm, limit).await;
            if used.is_some() {
                break;
            }
        }
        let used = used.expect("a case ran within one window");
        let u = limit / LIMIT;
        // 20 (the first, settled) + 90 - 80 (the second, settled twice in
        // the script) = 30; a token bucket reports in whole units the same.
        assert_eq!(
            used,
            30 * u,
            "{backend} {name}: the counter holds the usage"
        );
    }
}

#[test]
fn a_reservation_settles_to_its_usage_on_redis_for_every_algorithm() {
    let redis = RedisServer::start();
    let runtime = runtime();
    let limiter = redis_limiter(&redis);
    runtime.block_on(every_algorithm(&limiter, "redis"));
}

#[test]
fn a_reservation_settles_to_its_usage_on_a_cluster_for_every_algorithm() {
    let cluster = common::RedisCluster::start(3);
    let nodes: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let metrics = Metrics::new().unwrap();
    let limiter = sluice::limiter::redis::cluster::ClusterLimiter::new(
        &nodes,
        &Default::default(),
        (Duration::from_secs(2), Duration::from_secs(5)),
        Arc::new(metrics.redis.clone()),
    )
    .unwrap();
    let runtime = runtime();
    runtime.block_on(async {
        limiter.connect().await.unwrap();
        every_algorithm(&limiter, "cluster").await;
    });
}

#[test]
fn a_reservation_settles_to_its_usage_in_process_for_every_algorithm() {
    let limiter = LocalLimiter::new(1000);
    runtime().block_on(every_algorithm(&limiter, "local"));
}

/// A reservation whose units have left the window gives nothing back: the
/// units there now are other requests', and stay counted.
#[test]
fn a_refund_after_the_window_removes_no_other_requests_units() {
    let redis = RedisServer::start();
    let runtime = runtime();
    let limiter = redis_limiter(&redis);
    let local = LocalLimiter::new(1000);
    let short = |cost| LimitCheck {
        cost,
        ..LimitCheck::plain(
            "late",
            10,
            Duration::from_millis(300),
            Algorithm::SlidingLog,
        )
    };
    for limiter in [&limiter as &dyn Limiter, &local] {
        runtime.block_on(async {
            let old = limiter.check(&[short(5)], "old").await.unwrap()[0];
            assert!(old.allowed);
            tokio::time::sleep(Duration::from_millis(400)).await;
            let new = limiter.check(&[short(8)], "new").await.unwrap()[0];
            assert!(new.allowed, "the old units left the window");
            limiter
                .refund(&[short(5)], "old", &[old.taken_us])
                .await
                .unwrap();
            let report = limiter.peek(&[short(1)]).await.unwrap()[0];
            assert_eq!(report.remaining, 2, "the new request's 8 stay counted");
        });
    }
}
