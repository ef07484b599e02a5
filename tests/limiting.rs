//! The sliding-log limit end to end: real Redis, real upstream, real sluice.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::thread;
use std::time::{Duration, Instant};

fn config(redis: &RedisServer, upstream: &Upstream, limit: u64, window: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: sms-send
    match: {{ path_prefix: /sms/ }}
    upstream: api
    limits:
      - name: per-user
        key: [{{header: X-User}}]
        limit: {limit}
        window: {window}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

const KEY: &str = "sluice:{sms-send:per-user:user_1001}";

#[test]
fn seed_scenario_five_per_ten_seconds() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, 5, "10s"));

    let mut statuses = Vec::new();
    let mut denied = Vec::new();
    for i in 0..7 {
        if i > 0 {
            thread::sleep(Duration::from_millis(500));
        }
        let response = sluice.get("/sms/send", &[("X-User", "user_1001")]);
        statuses.push(response.status);
        if response.status == 429 {
            denied.push(response);
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(
        upstream.hits(),
        5,
        "the upstream must see exactly the admitted requests"
    );
    for response in denied {
        let retry: u64 = response
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        // The first admitted entry leaves the window ~10 s after it was admitted,
        // i.e. 7.5 s and 7 s after requests 6 and 7.
        assert!((1..=10).contains(&retry), "Retry-After {retry}");
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert!(
            response.body.starts_with(r#"{"error":"too_many_requests","route":"sms-send","limit":"per-user","retry_after_seconds":"#),
            "{}",
            response.body
        );
        assert_eq!(response.header("x-ratelimit-remaining"), Some("0"));
    }
    assert_eq!(redis.log_len(KEY), 5);
}

#[test]
fn allowed_responses_carry_rate_limit_headers() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, 5, "10s"));
    let first = sluice.get("/sms/x", &[("X-User", "u")]);
    assert_eq!(first.status, 200);
    assert_eq!(first.body, "upstream ok");
    assert_eq!(first.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("4"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("10"));
    let second = sluice.get("/sms/x", &[("X-User", "u")]);
    assert_eq!(second.header("x-ratelimit-remaining"), Some("3"));
}

#[test]
fn no_boundary_double_burst() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, 5, "2s"));
    let burst = |n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| sluice.get("/sms/x", &[("X-User", "user_1001")]).status)
            .collect()
    };

    let t0 = Instant::now();
    assert_eq!(burst(5), [200; 5], "first burst fills the window");
    let first_burst_done = t0.elapsed();
    // A fixed 1 s or 2 s window would reset around here and admit a second
    // full burst; the sliding log keeps counting the first one for 2 s.
    thread::sleep(Duration::from_millis(1200).saturating_sub(first_burst_done));
    let second = burst(5);
    let second_done = t0.elapsed();
    assert!(
        second_done < Duration::from_millis(1950),
        "machine too slow for this check ({second_done:?}); the second burst must end inside the window"
    );
    assert_eq!(
        second, [429; 5],
        "second burst inside the window must be denied"
    );

    // Once the window has slid past the first burst, a full burst passes again.
    thread::sleep((first_burst_done + Duration::from_millis(2300)).saturating_sub(t0.elapsed()));
    assert_eq!(
        burst(5),
        [200; 5],
        "after the window slides, the limit frees up"
    );
    assert_eq!(upstream.hits(), 10);
}

#[test]
fn exact_across_three_instances() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(&redis, &upstream, 50, "1m");
    let instances: Vec<Sluice> = (0..3).map(|_| Sluice::start(&body)).collect();
    let addrs: Vec<_> = instances.iter().map(|s| s.addr).collect();

    let statuses = concurrent(240, move |i| {
        get(addrs[i % 3], "/sms/x", &[("X-User", "user_1001")])
    });
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((admitted, denied), (50, 190), "statuses: {statuses:?}");
    assert_eq!(upstream.hits(), 50);
    assert_eq!(
        redis.log_len(KEY),
        50,
        "the sorted set holds exactly the admitted requests"
    );
    // Each instance took part.
    for s in &instances {
        let seen = s.decisions("sms-send", "per-user", "allow", "redis")
            + s.decisions("sms-send", "per-user", "deny", "redis");
        assert!(seen > 0);
    }
}

#[test]
fn same_microsecond_members_never_collapse() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(&redis, &upstream, 1000, "1m");
    let instances: Vec<Sluice> = (0..3).map(|_| Sluice::start(&body)).collect();
    let addrs: Vec<_> = instances.iter().map(|s| s.addr).collect();

    let statuses = concurrent(100, move |i| {
        get(addrs[i % 3], "/sms/x", &[("X-User", "user_1001")])
    });
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(redis.log_len(KEY), 100);
}

#[test]
fn denied_flood_leaves_limit_entries() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, 10, "1m"));
    let addr = sluice.addr;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.extend(concurrent(30, move |_| {
            get(addr, "/sms/x", &[("X-User", "user_1001")])
        }));
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 10);
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 290);
    assert_eq!(
        redis.log_len(KEY),
        10,
        "denied requests must never be stored"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("{KEY}!l"))
        .query(&mut redis.connection())
        .unwrap();
    // Set half a window beyond the newest unit's, so that a busy key
    // only appends.
    assert!(ttl > 0 && ttl <= 90_002, "idle keys expire (PTTL {ttl})");
}

#[test]
fn lost_script_is_reloaded_without_failing_a_decision() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, 3, "1m"));
    assert_eq!(sluice.get("/sms/x", &[("X-User", "user_1001")]).status, 200);
    // What a Redis restart or failover does to the script cache.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut redis.connection())
        .unwrap();
    let statuses: Vec<u16> = (0..3)
        .map(|_| sluice.get("/sms/x", &[("X-User", "user_1001")]).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 429],
        "the count carried on through the reload"
    );
    assert_eq!(
        sluice.decisions("sms-send", "per-user", "allow", "redis"),
        3
    );
    assert_eq!(
        metric_value(
            &sluice.metrics(),
            "sluice_redis_errors_total{kind=\"server\"} "
        ),
        0
    );
}

/// Redis, the upstream and sluice (limit 3 a minute, on_error: deny), with
/// `user_1001`'s log key holding a hash instead of a packed log.
fn with_clobbered_key() -> (RedisServer, Upstream, Sluice) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, 3, "1m"));
    let _: () = redis::cmd("HSET")
        .arg(format!("{KEY}!l"))
        .arg("f")
        .arg("not a log")
        .query(&mut redis.connection())
        .unwrap();
    (redis, upstream, sluice)
}

#[test]
fn clobbered_key_follows_the_failure_policy_without_a_5xx() {
    // on_error: deny in this config → 503 for the broken key, others unaffected.
    let (_redis, _upstream, sluice) = with_clobbered_key();
    for _ in 0..4 {
        let broken = sluice.get("/sms/x", &[("X-User", "user_1001")]);
        assert_eq!(broken.status, 503, "{}", broken.body);
    }
    // One key's problem does not open the circuit: other keys keep exact limits.
    assert_eq!(
        sluice.get("/sms/x", &[("X-User", "someone_else")]).status,
        200
    );
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(&metrics, "sluice_redis_errors_total{kind=\"server\"} "),
        4
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_redis_errors_total{kind=\"circuit_open\"} "
        ),
        0
    );
    assert_eq!(
        sluice.decisions("sms-send", "per-user", "allow", "redis"),
        1
    );
}

#[test]
fn one_clobbered_key_in_a_batch_fails_only_its_own_decision() {
    // Concurrent decisions travel to Redis together, in one script call: a key
    // holding something foreign must fail its own decision only.
    let (_redis, upstream, sluice) = with_clobbered_key();
    let addr = sluice.addr;
    let statuses = concurrent(40, move |i| {
        let user = if i % 2 == 0 {
            "user_1001".to_string()
        } else {
            format!("user_{i}")
        };
        get(addr, "/sms/x", &[("X-User", &user)])
    });
    let (broken, fine): (Vec<_>, Vec<_>) =
        statuses.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    assert!(broken.iter().all(|(_, &s)| s == 503), "{statuses:?}");
    assert!(fine.iter().all(|(_, &s)| s == 200), "{statuses:?}");
    assert_eq!(upstream.hits(), 20);
    assert_eq!(
        sluice.decisions("sms-send", "per-user", "allow", "redis"),
        20
    );
}

/// Decide calls Redis executed: `FCALL` of the function, or `EVALSHA` of
/// the script where functions are not used (the first call of a fresh server
/// may fail for want of the code and is retried; failed calls do not count).
fn decide_calls(redis: &RedisServer) -> u64 {
    redis.command_calls("evalsha") + redis.command_calls("fcall")
}

#[test]
fn deny_cache_spares_redis_during_a_flood_and_expires_on_time() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, 10, "3s"));
    let addr = sluice.addr;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.extend(concurrent(25, move |_| {
            get(addr, "/sms/x", &[("X-User", "user_1001")])
        }));
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 10);
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 490);
    let calls = decide_calls(&redis);
    // 10 admissions, then the first denials of requests already in flight;
    // everything after that is answered in process.
    assert!(calls <= 10 + 60, "Redis saw {calls} calls for 500 requests");
    assert!(sluice.decisions("sms-send", "per-user", "deny", "deny_cache") >= 400);

    // The cached denial ends when Redis's window frees a unit: then the key is
    // asked again and admitted.
    wait_until(Duration::from_secs(10), "the window to free a unit", || {
        sluice.get("/sms/x", &[("X-User", "user_1001")]).status == 200
    });
    assert!(decide_calls(&redis) > calls);
}

#[test]
fn deny_cache_can_be_switched_off() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(&redis, &upstream, 1, "1m")
        .replace("  on_error: deny", "  on_error: deny\n  deny_cache: false");
    let sluice = Sluice::start(&body);
    let statuses: Vec<u16> = (0..4)
        .map(|_| sluice.get("/sms/x", &[("X-User", "u")]).status)
        .collect();
    assert_eq!(statuses, [200, 429, 429, 429]);
    assert_eq!(sluice.decisions("sms-send", "per-user", "deny", "redis"), 3);
    assert_eq!(decide_calls(&redis), 4);
}

#[test]
fn multi_limit_denial_consumes_nothing_anywhere() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
  deny_cache: false
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: login
    upstream: api
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: 10, window: 1m }}
      - {{ name: per-ip, key: [ip], limit: 3, window: 1m }}
"#,
        url = redis.url(),
        upstream = upstream.addr
    ));
    let mut denied_by = Vec::new();
    for user in ["a", "b", "c", "a", "b", "c"] {
        let r = sluice.get("/login", &[("X-User", user)]);
        if r.status == 429 {
            denied_by.push(r.body);
        } else {
            assert_eq!(r.status, 200);
        }
    }
    assert_eq!(denied_by.len(), 3);
    assert!(
        denied_by.iter().all(|b| b.contains(r#""limit":"per-ip""#)),
        "{denied_by:?}"
    );
    assert_eq!(redis.log_len("sluice:{login:per-ip:127.0.0.1}"), 3);
    for user in ["a", "b", "c"] {
        let key = format!("sluice:{{login:per-user:{user}}}");
        assert_eq!(
            redis.log_len(&key),
            1,
            "{user}'s denied request consumed a unit"
        );
    }
    assert_eq!(sluice.decisions("login", "per-ip", "deny", "redis"), 3);
    assert_eq!(sluice.decisions("login", "per-user", "deny", "redis"), 0);
    assert_eq!(sluice.decisions("login", "per-user", "allow", "redis"), 3);
}

#[test]
fn flood_of_twenty_thousand_requests_costs_redis_little() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // An hour: a loaded machine can take over a minute for the flood, and
    // the window must outlast it.
    let sluice = Sluice::start(&config(&redis, &upstream, 100, "1h"));
    let addr = sluice.addr;
    let mut statuses = Vec::with_capacity(20_000);
    let started = Instant::now();
    for _ in 0..400 {
        statuses.extend(concurrent(50, move |_| {
            get(addr, "/sms/x", &[("X-User", "user_1001")])
        }));
    }
    let elapsed = started.elapsed();
    assert_eq!(statuses.len(), 20_000);
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 100);
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 19_900);
    assert_eq!(upstream.hits(), 100);
    // Each of the 100 admissions is a Redis call by necessity; after the first
    // denial the deny cache answers everything
    // for ten seconds at a time, after which one round of 50 asks Redis again.
    // On a loaded machine the flood can outlast one such period.
    let asked_again = 50 * (1 + elapsed.as_secs() / 10);
    let calls = decide_calls(&redis);
    assert!(
        calls <= 100 + 10 + asked_again,
        "Redis saw {calls} calls for 20,000 requests in {elapsed:?}"
    );
    let from_cache = sluice.decisions("sms-send", "per-user", "deny", "deny_cache");
    assert!(
        from_cache >= 19_900 - asked_again,
        "{from_cache} denials from the cache in {elapsed:?}"
    );
}
