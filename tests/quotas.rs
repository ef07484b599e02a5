//! Calendar quotas (`calendar: day | week | month`, `timezone`): one counter
//! per civil period, the period chosen by Redis's clock among the bounds the
//! gateway sends; through the library (gateway clocks ahead of and behind
//! Redis's) and end to end through the binary (a day in a far time zone,
//! shared by two instances, reported by the usage API).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use jiff::Timestamp;
use sluice::config::calendar::{Period, PeriodBounds};
use sluice::config::{Algorithm, RedisConfig};
use sluice::limiter::local::{Clock, LocalLimiter};
use sluice::limiter::redis::RedisLimiter;
use sluice::limiter::{LimitCheck, Limiter};
use sluice::observe::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SECOND: i64 = 1_000_000;

fn redis_time_us(redis: &RedisServer) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query(&mut redis.connection())
        .expect("TIME");
    secs * SECOND + micros
}

fn quota(key: &str, limit: u64, bounds: PeriodBounds) -> LimitCheck<'_> {
    let window = Duration::from_micros((bounds.end_us - bounds.start_us) as u64);
    let period = Period::Day;
    LimitCheck::plain(key, limit, window, Algorithm::Calendar { period, bounds })
}

/// The bounds a gateway whose clock reads `now` would send, for periods of
/// 20 s starting at `origin`.
fn bounds(origin: i64, now: i64) -> PeriodBounds {
    let period = 20 * SECOND;
    let start = origin + (now - origin).div_euclid(period) * period;
    PeriodBounds {
        start_us: start,
        end_us: start + period,
        next_end_us: start + 2 * period,
    }
}

/// Three gateways, one 12 s ahead of Redis, one on time and one 12 s behind,
/// share one period's counter: whatever bounds each sends, Redis's clock
/// picks the period, so the quota is not counted twice near a boundary.
#[test]
fn redis_clock_picks_the_period_whatever_the_gateway_clock_says() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let metrics = Metrics::new().expect("metrics");
    let limiter = RedisLimiter::new(
        &RedisConfig {
            url: redis.url(),
            cluster: Vec::new(),
            timeout: Duration::from_secs(2),
            key_prefix: "sluice:".into(),
            ..Default::default()
        },
        Arc::new(metrics.redis.clone()),
    )
    .expect("limiter");
    let now = redis_time_us(&redis);
    // Periods of 20 s, the current one (by Redis) ending 10 s from now.
    let origin = now + 10 * SECOND;
    let on_time = bounds(origin, now);
    let ahead = bounds(origin, now + 12 * SECOND);
    let behind = bounds(origin, now - 12 * SECOND);
    assert!(
        ahead.start_us > now && behind.end_us <= now,
        "the cases differ"
    );
    let decide = |b: PeriodBounds, member: &str| {
        runtime
            .block_on(limiter.check(&[quota("q", 3, b)], member))
            .expect("decision")[0]
    };
    let taken: Vec<bool> = [ahead, on_time, behind]
        .into_iter()
        .enumerate()
        .map(|(i, b)| decide(b, &format!("m{i}")).allowed)
        .collect();
    assert_eq!(taken, [true, true, true]);
    for (i, b) in [ahead, on_time, behind].into_iter().enumerate() {
        let d = decide(b, &format!("d{i}"));
        assert!(!d.allowed, "gateway {i}: the fourth unit of the period");
        assert!(
            d.retry_after <= Duration::from_secs(10) && d.retry_after >= Duration::from_secs(5),
            "retry at the period's end: {d:?}"
        );
    }
    let stored: (i64, u64) = redis::cmd("HMGET")
        .arg("q")
        .arg("w")
        .arg("c")
        .query(&mut redis.connection())
        .expect("HMGET");
    assert_eq!(stored, (on_time.end_us, 3), "one counter, named by its end");
    let ttl: i64 = redis::cmd("PTTL")
        .arg("q")
        .query(&mut redis.connection())
        .expect("PTTL");
    assert!(
        (5_000..=10_001).contains(&ttl),
        "kept until the period ends: {ttl}"
    );

    // Bounds a whole period off Redis's clock are an error, never a guess.
    let stale = bounds(origin, now - 45 * SECOND);
    let error = runtime.block_on(limiter.check(&[quota("q", 3, stale)], "x"));
    assert!(error.is_err(), "{error:?}");
}

#[derive(Clone, Default)]
struct FakeClock(Arc<AtomicU64>);

impl Clock for FakeClock {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The in-process twin counts the same way: one counter per period, picked
/// by its own clock among the bounds, starting afresh in the next period.
#[test]
fn the_in_process_limiter_counts_periods_like_redis() {
    let clock = FakeClock::default();
    let limiter = LocalLimiter::with_clock(100, clock.clone());
    let origin: i64 = 1_800_000_000 * SECOND;
    let at = |t: i64| {
        clock.0.store((origin + t) as u64, Ordering::SeqCst);
    };
    at(5 * SECOND);
    let on_time = bounds(origin, origin + 5 * SECOND);
    let ahead = bounds(origin, origin + 25 * SECOND);
    let allowed: Vec<bool> = (0..4)
        .map(|i| {
            let b = if i % 2 == 0 { on_time } else { ahead };
            limiter.decide(&[quota("q", 3, b)], &format!("m{i}"))[0].allowed
        })
        .collect();
    assert_eq!(allowed, [true, true, true, false]);
    let denied = limiter.decide(&[quota("q", 3, on_time)], "d")[0];
    assert_eq!(denied.retry_after, Duration::from_secs(15));
    at(21 * SECOND);
    let next = bounds(origin, origin + 21 * SECOND);
    let fresh = limiter.decide(&[quota("q", 3, next)], "n")[0];
    assert!(fresh.allowed && fresh.remaining == 2, "{fresh:?}");
}

/// The civil day in a zone far from UTC: the first instant of the next day
/// there, as Unix seconds.
fn next_midnight(zone: &str) -> i64 {
    let tz = jiff::tz::TimeZone::get(zone).expect("zone");
    let today = Timestamp::now().to_zoned_datetime(tz.clone()).date();
    let tomorrow = today.tomorrow().expect("tomorrow");
    tomorrow
        .to_datetime(jiff::civil::Time::midnight())
        .to_zoned_datetime(tz)
        .expect("midnight")
        .timestamp()
        .as_second()
}

#[test]
fn a_daily_quota_in_a_time_zone_ends_at_its_midnight_on_every_instance() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let zone = "Pacific/Kiritimati"; // UTC+14: its midnight is not UTC's.
    let body = format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
response:
  headers: both
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: daily, key: [{{header: X-Key}}], limit: 3, calendar: day, timezone: {zone} }}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    );
    let a = Sluice::start(&body);
    let b = Sluice::start(&body);
    let key = [("X-Key", "customer-1")];
    let statuses: Vec<u16> = [&a, &b, &a, &b, &a]
        .iter()
        .map(|s| s.get("/", &key).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429], "3 a day across both");
    let denied = b.get("/", &key);
    let retry: i64 = denied
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    let expected = next_midnight(zone) - Timestamp::now().as_second();
    assert!(
        (retry - expected).abs() <= 3,
        "Retry-After {retry} s, {expected} s to midnight in {zone}\n{}",
        b.log()
    );
    let policy = a.get("/", &[("X-Key", "customer-2")]);
    assert_eq!(
        policy.header("ratelimit-policy"),
        Some("\"daily\";q=3;w=86400")
    );

    let usage = request(
        a.admin,
        "GET",
        "/v1/usage?route=api&limit=daily&header.x-key=customer-1",
        &[],
    );
    let json: serde_json::Value = serde_json::from_str(&usage.body).expect("JSON");
    assert_eq!(
        (json["used"].as_u64(), json["quota"].as_u64()),
        (Some(3), Some(3)),
        "{json}"
    );
    let reset = json["reset_seconds"].as_i64().unwrap_or(-1);
    assert!((reset - expected).abs() <= 3, "{json}");

    // Redis holds one hash per key, named by the period's end, that
    // expires when the day ends there.
    let mut connection = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut connection)
        .expect("KEYS");
    let ends: Vec<i64> = keys
        .iter()
        .map(|k| {
            redis::cmd("HGET")
                .arg(k)
                .arg("w")
                .query::<i64>(&mut connection)
                .expect("HGET w")
        })
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for end in ends {
        assert_eq!(end, next_midnight(zone) * SECOND);
    }
}
