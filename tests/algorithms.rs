//! End to end through the real binary and a real Redis: the boundary
//! behaviour of the window algorithms, the token bucket's burst and rate,
//! shadow limits, shared counters, and the IETF draft headers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::thread;
use std::time::{Duration, Instant};

fn redis_time_us(redis: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query(&mut redis.connection())
        .expect("TIME");
    secs * 1_000_000 + micros
}

fn routes_config(redis: &RedisServer, upstream: &Upstream, routes: &str, extra: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
{extra}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
{routes}"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

fn admitted(sluice: &Sluice, path: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| sluice.get(path, &[]).status == 200)
        .count()
}

/// 5 requests just before a window boundary and 5 just
/// after. The fixed window admits all 10 (twice its limit within half a
/// window); the sliding log and the sliding window admit none of the second 5.
#[test]
fn only_fixed_window_has_the_boundary_double_burst() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut routes = String::new();
    for (name, algorithm) in [
        ("fixed", "fixed_window"),
        ("log", "sliding_log"),
        ("window", "sliding_window"),
    ] {
        routes.push_str(&format!(
            "  - name: {name}\n    match: {{ path: /{name} }}\n    upstream: api\n    limits:\n      - {{ name: per-ip, key: [ip], limit: 5, window: 2s, algorithm: {algorithm} }}\n"
        ));
    }
    let sluice = Sluice::start(&routes_config(&redis, &upstream, &routes, ""));
    assert_eq!(sluice.get("/log", &[]).status, 200, "warm-up");
    redis::cmd("FLUSHALL")
        .query::<()>(&mut redis.connection())
        .unwrap();

    for attempt in 0..5 {
        // The windows are aligned to Redis's epoch clock: aim the first burst
        // at 500 ms before a 2 s boundary and the second at 100 ms after it.
        let asked = Instant::now();
        let now = redis_time_us(&redis);
        let local_now = asked + asked.elapsed() / 2;
        let mut boundary = (now / 2_000_000 + 1) * 2_000_000;
        if boundary - now < 700_000 {
            boundary += 2_000_000;
        }
        let at_boundary = local_now + Duration::from_micros(boundary - now);
        thread::sleep(at_boundary - Duration::from_millis(500) - Instant::now());
        let before: Vec<usize> = ["/fixed", "/log", "/window"]
            .iter()
            .map(|p| admitted(&sluice, p, 5))
            .collect();
        let first_done = Instant::now();
        thread::sleep(
            (at_boundary + Duration::from_millis(100)).saturating_duration_since(Instant::now()),
        );
        let after: Vec<usize> = ["/fixed", "/log", "/window"]
            .iter()
            .map(|p| admitted(&sluice, p, 5))
            .collect();
        let second_done = Instant::now();
        if first_done + Duration::from_millis(50) > at_boundary
            || second_done > at_boundary + Duration::from_millis(1500)
        {
            eprintln!("attempt {attempt}: too slow to straddle the boundary; retrying");
            redis::cmd("FLUSHALL")
                .query::<()>(&mut redis.connection())
                .unwrap();
            continue;
        }
        assert_eq!(before, [5, 5, 5], "each limit admits its first 5");
        assert_eq!(
            after,
            [5, 0, 0],
            "fixed_window admits 5 more right after the boundary; sliding_log and sliding_window none"
        );
        return;
    }
    panic!("could not time the bursts around a boundary in 5 attempts");
}

/// sliding_window never admits more than
/// `limit` in any interval of length `window`. Checked on the in-process twin
/// (the conformance tests tie it to the script) with a fake clock over
/// thousands of random arrivals; the fixed window, same traffic, breaks it.
#[test]
fn sliding_window_stays_within_its_bound() {
    use sluice::config::Algorithm;
    use sluice::limiter::local::{Clock, LocalLimiter};
    use sluice::limiter::LimitCheck;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct FakeClock(Arc<AtomicU64>);
    impl Clock for FakeClock {
        fn now_us(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn worst_window(algorithm: Algorithm) -> usize {
        let clock = FakeClock::default();
        let limiter = LocalLimiter::with_clock(10, clock.clone());
        let window_us = 1_000_000;
        let mut admitted = Vec::new();
        let mut t: u64 = 1_700_000_000_000_000;
        let mut seed: u64 = 42;
        for i in 0..20_000 {
            // Bursty arrivals: mostly 0–2 ms apart, now and then a pause.
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let gap = if (seed >> 60) == 0 {
                (seed >> 33) % 400_000
            } else {
                (seed >> 33) % 2_000
            };
            t += gap;
            clock.0.store(t, Ordering::SeqCst);
            let window = Duration::from_micros(window_us);
            let check = LimitCheck::plain("k", 50, window, algorithm);
            if limiter.decide(&[check], &format!("m{i}"))[0].allowed {
                admitted.push(t);
            }
        }
        // Most units admitted in any half-open interval of length `window`.
        let mut worst = 0;
        let mut start = 0;
        for end in 0..admitted.len() {
            while admitted[end] - admitted[start] >= window_us {
                start += 1;
            }
            worst = worst.max(end - start + 1);
        }
        worst
    }

    assert_eq!(worst_window(Algorithm::SlidingLog), 50);
    let sliding = worst_window(Algorithm::SlidingWindow { buckets: 10 });
    assert!(
        sliding <= 50,
        "sliding_window admitted {sliding} in one window"
    );
    assert!(
        sliding >= 45,
        "sliding_window should stay close to the limit: {sliding}"
    );
    let fixed = worst_window(Algorithm::FixedWindow);
    assert!(fixed > 50, "the fixed window's double burst: {fixed}");
}

/// a token bucket of 10/s with burst 5 admits 5 at once,
/// then 10 per second.
#[test]
fn token_bucket_admits_its_burst_then_the_refill_rate() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let routes = "  - name: tb\n    upstream: api\n    limits:\n      - { name: per-ip, key: [ip], limit: 10, window: 1s, algorithm: token_bucket, burst: 5 }\n";
    let sluice = Sluice::start(&routes_config(
        &redis,
        &upstream,
        routes,
        "  deny_cache: false",
    ));
    let addr = sluice.addr;
    let burst_started = Instant::now();
    let statuses = concurrent(20, move |_| get(addr, "/x", &[]));
    let burst_took = burst_started.elapsed();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    // Exactly the burst, plus whatever refilled (one unit per 100 ms) while a
    // loaded machine took its time to deliver the 20 requests.
    let refilled_meanwhile = (burst_took.as_millis() / 100) as usize;
    assert!(
        (5..=5 + refilled_meanwhile).contains(&admitted),
        "{admitted} admitted in a burst of 20 that took {burst_took:?}: {statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        20 - admitted
    );

    // Then keep asking for 2 s: the bucket refills one unit every 100 ms.
    let start = Instant::now();
    let mut refilled = 0;
    while start.elapsed() < Duration::from_secs(2) {
        if sluice.get("/x", &[]).status == 200 {
            refilled += 1;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let expected = elapsed * 10.0;
    assert!(
        (refilled as f64 - expected).abs() <= 2.0,
        "{refilled} admitted in {elapsed:.2}s; the refill rate allows {expected:.1}"
    );
}

/// a shadow limit never denies, counts shadow_deny exactly,
/// and leaves the headers to the enforced limits.
#[test]
fn shadow_limits_count_but_never_deny() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let routes = "  - name: only-shadow\n    match: { path: /shadow }\n    respond: { body: ok }\n    limits:\n      - { name: trial, key: [ip], limit: 2, window: 10s, shadow: true, algorithm: fixed_window }\n  - name: api\n    upstream: api\n    limits:\n      - { name: enforced, key: [ip], limit: 100, window: 10s }\n      - { name: trial, key: [ip], limit: 3, window: 10s, shadow: true }\n";
    let sluice = Sluice::start(&routes_config(&redis, &upstream, routes, ""));
    for i in 0..8 {
        let response = sluice.get("/x", &[]);
        assert_eq!(response.status, 200, "request {i}");
        assert_eq!(response.header("x-ratelimit-limit"), Some("100"));
        assert_eq!(
            response.header("x-ratelimit-remaining"),
            Some((99 - i).to_string().as_str())
        );
    }
    for _ in 0..5 {
        let response = sluice.get("/shadow", &[]);
        assert_eq!(response.status, 200);
        assert_eq!(
            response.header("x-ratelimit-limit"),
            None,
            "headers unchanged"
        );
    }
    assert_eq!(upstream.hits(), 8);
    assert_eq!(sluice.decisions("api", "trial", "allow", "redis"), 3);
    assert_eq!(sluice.decisions("api", "trial", "shadow_deny", "redis"), 5);
    assert_eq!(sluice.decisions("api", "trial", "deny", "redis"), 0);
    assert_eq!(sluice.decisions("api", "enforced", "allow", "redis"), 8);
    assert_eq!(
        sluice.decisions("only-shadow", "trial", "allow", "redis"),
        2
    );
    assert_eq!(
        sluice.decisions("only-shadow", "trial", "shadow_deny", "redis"),
        3
    );
    // A shadow limit that would deny consumes nothing, as if enforced.
    assert_eq!(redis.log_len("sluice:{api:trial:127.0.0.1}"), 3);
}

/// `share: NAME`: one counter for every route that names it.
#[test]
fn shared_limits_count_across_routes() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let routes = "  - name: sms\n    match: { path: /sms }\n    upstream: api\n    limits:\n      - { name: budget, key: [ip], limit: 4, window: 10s, share: messaging }\n  - name: email\n    match: { path: /email }\n    upstream: api\n    limits:\n      - { name: budget, key: [ip], limit: 4, window: 10s, share: messaging, cost: 2 }\n";
    let sluice = Sluice::start(&routes_config(&redis, &upstream, routes, ""));
    assert_eq!(sluice.get("/sms", &[]).status, 200);
    assert_eq!(sluice.get("/email", &[]).status, 200); // 3 of 4 used
    assert_eq!(
        sluice.get("/email", &[]).status,
        429,
        "cost 2 does not fit in 1"
    );
    assert_eq!(sluice.get("/sms", &[]).status, 200); // 4 of 4
    assert_eq!(sluice.get("/sms", &[]).status, 429);
    assert_eq!(redis.log_len("sluice:{*:messaging:127.0.0.1}"), 4);
    assert_eq!(sluice.decisions("email", "budget", "deny", "redis"), 1);
}

fn sf_list(text: &str) -> Vec<(String, Vec<(String, i64)>)> {
    use sfv::{BareItem, ListEntry, Parser};
    let list = Parser::new(text)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("`{text}` is not an RFC 8941 list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let BareItem::String(name) = &item.bare_item else {
                    panic!("`{text}`: list members must be strings");
                };
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| match v {
                        BareItem::Integer(i) => (k.as_str().to_string(), i64::from(*i)),
                        other => panic!("`{text}`: parameter {k} is {other:?}, not an integer"),
                    })
                    .collect();
                (name.as_str().to_string(), params)
            }
            ListEntry::InnerList(_) => panic!("`{text}`: no inner lists expected"),
        })
        .collect()
}

/// `headers: both` sends the legacy headers and the IETF
/// `RateLimit-Policy` / `RateLimit`, which parse as RFC 8941 lists, one member
/// per limit, the most restrictive first.
#[test]
fn draft_headers_are_structured_fields() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let routes = "  - name: api\n    upstream: api\n    limits:\n      - { name: per-ip, key: [ip], limit: 10, window: 1m }\n      - { name: burst, key: [ip], limit: 3, window: 10s, algorithm: sliding_window }\n      - { name: inflight, key: [ip], limit: 5, algorithm: concurrency }\n";
    let sluice = Sluice::start(&routes_config(
        &redis,
        &upstream,
        routes,
        "response:\n  headers: both",
    ));
    let response = sluice.get("/x", &[]);
    assert_eq!(response.status, 200);
    let policy = sf_list(
        response
            .header("ratelimit-policy")
            .expect("RateLimit-Policy"),
    );
    let state = sf_list(response.header("ratelimit").expect("RateLimit"));
    let names: Vec<&str> = policy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["burst", "inflight", "per-ip"],
        "most restrictive first"
    );
    assert_eq!(policy[0].1, [("q".to_string(), 3), ("w".to_string(), 10)]);
    assert_eq!(
        policy[1].1,
        [("q".to_string(), 5)],
        "concurrency has no window"
    );
    assert_eq!(policy[2].1, [("q".to_string(), 10), ("w".to_string(), 60)]);
    assert_eq!(state[0].0, "burst");
    assert_eq!(state[0].1[0], ("r".to_string(), 2));
    assert_eq!(state[0].1[1].0, "t");
    assert!((1..=11).contains(&state[0].1[1].1), "{state:?}");
    assert_eq!(state[2].1[0], ("r".to_string(), 9));
    assert_eq!(response.header("x-ratelimit-limit"), Some("3"));

    sluice.get("/x", &[]);
    sluice.get("/x", &[]);
    let denied = sluice.get("/x", &[]);
    assert_eq!(denied.status, 429);
    let state = sf_list(denied.header("ratelimit").expect("RateLimit on a denial"));
    assert_eq!(state[0].0, "burst");
    assert_eq!(state[0].1[0], ("r".to_string(), 0));
    assert!(state[0].1[1].1 >= 1, "t says when to come back: {state:?}");
    sf_list(
        denied
            .header("ratelimit-policy")
            .expect("policy on a denial"),
    );
}

/// A request denied by one limit consumes nothing from the route's other
/// limits, whatever their algorithms (one script over all keys).
#[test]
fn mixed_algorithms_are_all_or_nothing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let routes = "  - name: login\n    upstream: api\n    limits:\n      - { name: log, key: [{header: X-User}], limit: 1, window: 1m }\n      - { name: window, key: [{header: X-User}], limit: 1, window: 1m, algorithm: sliding_window }\n      - { name: fixed, key: [{header: X-User}], limit: 1, window: 1h, algorithm: fixed_window }\n      - { name: bucket, key: [{header: X-User}], limit: 1, window: 1h, algorithm: token_bucket }\n      - { name: flight, key: [{header: X-User}], limit: 1, algorithm: concurrency }\n      - { name: per-ip, key: [ip], limit: 1, window: 1m }\n";
    let sluice = Sluice::start(&routes_config(
        &redis,
        &upstream,
        routes,
        "  deny_cache: false\nclient_ip:\n  trusted_proxies: [127.0.0.1]",
    ));
    let send = |user: &str, ip: &str| {
        sluice
            .get("/login", &[("X-User", user), ("X-Forwarded-For", ip)])
            .status
    };
    assert_eq!(send("a", "10.0.0.1"), 200);
    assert_eq!(send("a", "10.0.0.2"), 429, "a's own limits are used up");
    let denied = sluice.get(
        "/login",
        &[("X-User", "b"), ("X-Forwarded-For", "10.0.0.1")],
    );
    assert_eq!(denied.status, 429);
    assert!(
        denied.body.contains(r#""limit":"per-ip""#),
        "{}",
        denied.body
    );
    assert_eq!(send("b", "10.0.0.3"), 200, "b's limits were untouched");
    assert_eq!(upstream.hits(), 2);
}
