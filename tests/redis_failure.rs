//! When Redis is down, slow or comes back: `on_error` allow / deny / local.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::{Duration, Instant};

/// The decision budget these tests configure, and the slack allowed on top of
/// it for a whole HTTP exchange on a loaded 2-core machine. What this catches is
/// waiting on Redis itself: a reconnect loop or a paused server costs seconds.
const BUDGET: Duration = Duration::from_millis(100);
const SLACK: Duration = Duration::from_millis(900);

fn config(redis_url: &str, on_error: &str, upstream: &Upstream) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{redis_url}", timeout: 100ms }}
  on_error: {on_error}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: login
    upstream: api
    limits:
      - name: per-user
        key: [{{header: X-User}}]
        limit: 3
        window: 1m
"#,
        upstream = upstream.addr
    )
}

fn dead_redis_url() -> String {
    format!("redis://127.0.0.1:{}/0", free_port())
}

fn send(sluice: &Sluice, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| {
            let r = sluice.get("/login", &[("X-User", "alice")]);
            assert!(
                r.elapsed < BUDGET + SLACK,
                "a request waited {:?}",
                r.elapsed
            );
            r.status
        })
        .collect()
}

#[test]
fn redis_never_started_allow_fails_open() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&dead_redis_url(), "allow", &upstream));
    assert_eq!(send(&sluice, 6), [200; 6]);
    assert_eq!(
        sluice.decisions("login", "per-user", "allow", "fail_open"),
        6
    );
    // Three refused connects open the circuit; after that Redis is not even tried.
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(&metrics, "sluice_redis_errors_total{kind=\"io\"} "),
        3
    );
    assert!(
        metric_value(
            &metrics,
            "sluice_redis_errors_total{kind=\"circuit_open\"} "
        ) >= 1
    );
    assert_eq!(
        get(sluice.admin, "/readyz", &[]).status,
        200,
        "allow keeps the instance ready"
    );
    assert!(sluice.metrics().contains("sluice_redis_up 0"));
}

#[test]
fn redis_never_started_deny_fails_closed_with_503() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&dead_redis_url(), "deny", &upstream));
    let statuses = send(&sluice, 4);
    assert_eq!(statuses, [503; 4]);
    assert_eq!(upstream.hits(), 0);
    assert_eq!(
        sluice.decisions("login", "per-user", "deny", "fail_closed"),
        4
    );
    let ready = get(sluice.admin, "/readyz", &[]);
    assert_eq!(
        ready.status, 503,
        "deny + unreachable Redis is not ready: {}",
        ready.body
    );
}

#[test]
fn redis_never_started_local_limits_in_process() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&dead_redis_url(), "local", &upstream));
    assert_eq!(send(&sluice, 5), [200, 200, 200, 429, 429]);
    assert_eq!(upstream.hits(), 3);
    assert_eq!(sluice.decisions("login", "per-user", "allow", "local"), 3);
    // Both denials are the in-process fallback's: a fallback's denial is never
    // remembered by the deny cache, so it cannot outlive the Redis failure.
    assert_eq!(sluice.decisions("login", "per-user", "deny", "local"), 2);
    assert_eq!(
        sluice.decisions("login", "per-user", "deny", "deny_cache"),
        0
    );
}

#[test]
fn redis_killed_mid_test_falls_back_to_local() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis.url(), "local", &upstream));
    assert_eq!(send(&sluice, 2), [200, 200]);
    assert_eq!(sluice.decisions("login", "per-user", "allow", "redis"), 2);

    redis.kill();
    // The in-process limiter starts from zero (it never saw the Redis-admitted
    // requests): 3 more pass, then it denies. No 5xx, no wait beyond the budget.
    assert_eq!(send(&sluice, 5), [200, 200, 200, 429, 429]);
    assert_eq!(sluice.decisions("login", "per-user", "allow", "local"), 3);
    assert!(sluice.metrics().contains("sluice_redis_up 0"));
}

#[test]
fn starts_without_redis_and_uses_it_once_up() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&url, "allow", &upstream));
    assert_eq!(send(&sluice, 2), [200, 200]);
    assert_eq!(
        sluice.decisions("login", "per-user", "allow", "fail_open"),
        2
    );

    let redis = RedisServer::start_on(port);
    wait_until(
        Duration::from_secs(10),
        "decisions to come from Redis",
        || {
            sluice.get("/login", &[("X-User", "bob")]);
            sluice.decisions("login", "per-user", "allow", "redis") > 0
        },
    );
    assert!(redis.log_len("sluice:{login:per-user:bob}") >= 1);
    assert!(sluice.metrics().contains("sluice_redis_up 1"));
    assert_eq!(get(sluice.admin, "/readyz", &[]).status, 200);
}

#[test]
fn paused_redis_costs_at_most_the_budget() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis.url(), "allow", &upstream));
    assert_eq!(send(&sluice, 1), [200]);
    // Redis stops answering clients for 3 s; every decision must give up after
    // the budget and fail open instead of waiting.
    redis.pause_clients(3000);
    // Timeouts say Redis is slow, not down: they open the circuit only once
    // they have lasted a second. Until then each decision costs the budget
    // (100 ms); after it, decisions do not call Redis at all.
    let paused = Instant::now();
    let mut sent = 0;
    while paused.elapsed() < Duration::from_millis(2200) {
        let response = sluice.get("/login", &[("X-User", "alice")]);
        assert_eq!(response.status, 200, "fail open: {}", response.body);
        assert!(
            response.elapsed < Duration::from_millis(600),
            "{:?}",
            response.elapsed
        );
        sent += 1;
    }
    assert!(sluice.decisions("login", "per-user", "allow", "fail_open") >= sent);
    assert!(
        metric_value(
            &sluice.metrics(),
            "sluice_redis_errors_total{kind=\"timeout\"} "
        ) >= 3
    );
    assert!(
        metric_value(
            &sluice.metrics(),
            "sluice_redis_errors_total{kind=\"circuit_open\"} "
        ) >= 1,
        "a second of timeouts opens the circuit"
    );

    // Once the pause ends, decisions come from Redis again by themselves.
    let from_redis = sluice.decisions("login", "per-user", "allow", "redis");
    wait_until(
        Duration::from_secs(15),
        "decisions to come from Redis after the pause",
        || {
            sluice.get("/login", &[("X-User", "carol")]);
            sluice.decisions("login", "per-user", "allow", "redis") > from_redis
        },
    );
}

#[test]
fn local_fallback_admits_only_this_instances_share() {
    let upstream = Upstream::start();
    let body = config(&dead_redis_url(), "local", &upstream)
        .replace(
            "  on_error: local",
            "  on_error: local\n  local: { share: \"1/3\" }",
        )
        .replace("limit: 3", "limit: 6");
    let sluice = Sluice::start(&body);
    // 6 per minute across 3 instances: this one admits 2 while Redis is away.
    assert_eq!(send(&sluice, 4), [200, 200, 429, 429]);
    assert_eq!(upstream.hits(), 2);
}

/// Steady load from 4 threads while Redis is SIGKILLed and restarted empty
/// 5 s later on the same port. Returns (statuses, slowest request during the
/// outage, time from restart until decisions came from Redis again).
fn kill_and_restart_under_load(on_error: &str) -> (Vec<u16>, Duration, Duration) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let mut redis = RedisServer::start();
    let port = redis.port;
    let upstream = Upstream::start();
    let body = config(&redis.url(), on_error, &upstream).replace("limit: 3", "limit: 1000000");
    let sluice = Sluice::start(&body);
    let addr = sluice.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let outage = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new((Vec::new(), Duration::ZERO)));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (stop, outage, seen) = (stop.clone(), outage.clone(), seen.clone());
            std::thread::spawn(move || {
                let user = format!("user{t}");
                while !stop.load(Ordering::SeqCst) {
                    let during_outage = outage.load(Ordering::SeqCst);
                    let r = get(addr, "/login", &[("X-User", &user)]);
                    let mut seen = seen.lock().unwrap();
                    seen.0.push(r.status);
                    if during_outage {
                        seen.1 = seen.1.max(r.elapsed);
                    }
                }
            })
        })
        .collect();
    wait_until(Duration::from_secs(10), "load on Redis", || {
        sluice.decisions("login", "per-user", "allow", "redis") > 50
    });
    outage.store(true, Ordering::SeqCst);
    redis.kill();
    std::thread::sleep(Duration::from_secs(5)); // the outage itself, not a readiness wait
    let restarted = RedisServer::start_on(port);
    outage.store(false, Ordering::SeqCst);
    let restart = std::time::Instant::now();
    let before = sluice.decisions("login", "per-user", "allow", "redis");
    wait_until(
        Duration::from_secs(6),
        "decisions to come from the restarted Redis",
        || sluice.decisions("login", "per-user", "allow", "redis") > before,
    );
    let recovered_after = restart.elapsed();
    // The restarted Redis had no script: it was loaded again transparently,
    // and every client's decisions come from it again (not only the first
    // one to get through).
    wait_until(
        Duration::from_secs(6),
        "user0 counted by the restarted Redis",
        || restarted.log_len("sluice:{login:per-user:user0}") > 0,
    );
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    (seen.0.clone(), seen.1, recovered_after)
}

#[test]
fn redis_killed_under_load_allow_serves_everything() {
    let (statuses, slowest, recovered) = kill_and_restart_under_load("allow");
    assert!(statuses.len() > 100, "{} requests", statuses.len());
    assert!(
        statuses.iter().all(|&s| s == 200),
        "non-200 seen: {:?}",
        statuses.iter().filter(|&&s| s != 200).collect::<Vec<_>>()
    );
    assert!(
        slowest < BUDGET + SLACK,
        "a request took {slowest:?} while Redis was down"
    );
    assert!(
        recovered < Duration::from_secs(4),
        "Redis used again only after {recovered:?}"
    );
}

#[test]
fn redis_killed_under_load_local_serves_everything() {
    let (statuses, slowest, recovered) = kill_and_restart_under_load("local");
    assert!(statuses.iter().all(|&s| s == 200), "non-200 seen");
    assert!(
        slowest < BUDGET + SLACK,
        "a request took {slowest:?} while Redis was down"
    );
    assert!(
        recovered < Duration::from_secs(4),
        "Redis used again only after {recovered:?}"
    );
}

/// Sends 5 requests with `on_error: allow` while Redis answers every script
/// with an error that says it cannot serve; they must all pass, be counted as
/// `server` errors, and open the circuit.
fn assert_unhealthy_answers_open_the_circuit(redis: &RedisServer, what: &str) {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis.url(), "allow", &upstream));
    assert_eq!(send(&sluice, 5), [200; 5], "{what}");
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(&metrics, "sluice_redis_errors_total{kind=\"server\"} "),
        3,
        "{what}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_redis_errors_total{kind=\"circuit_open\"} "
        ),
        2,
        "{what}"
    );
    assert_eq!(
        sluice.decisions("login", "per-user", "allow", "fail_open"),
        5,
        "{what}"
    );
}

#[test]
fn oom_redis_opens_the_circuit_without_a_5xx() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut redis.connection())
        .unwrap();
    assert_unhealthy_answers_open_the_circuit(&redis, "OOM");
}

#[test]
fn readonly_replica_opens_the_circuit_without_a_5xx() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut replica.connection())
        .unwrap();
    assert_unhealthy_answers_open_the_circuit(&replica, "READONLY");
}

#[test]
fn busy_redis_opens_the_circuit_without_a_5xx() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg("50")
        .query(&mut redis.connection())
        .unwrap();
    // A runaway script keeps Redis busy: every other client gets BUSY.
    let mut blocked = redis.connection();
    let runaway = std::thread::spawn(move || {
        let _ = redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query::<()>(&mut blocked);
    });
    wait_until(Duration::from_secs(10), "Redis to answer BUSY", || {
        redis::cmd("PING")
            .query::<String>(&mut redis.connection())
            .is_err()
    });
    assert_unhealthy_answers_open_the_circuit(&redis, "BUSY");
    let _ = redis::cmd("SCRIPT")
        .arg("KILL")
        .query::<()>(&mut redis.connection());
    runaway.join().unwrap();
}
