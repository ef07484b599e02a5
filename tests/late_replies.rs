//! A decision that ran out of budget was answered by `on_error`, but Redis
//! ran its script when a short stall ended (the reply came back). What Redis
//! keeps must agree with what the client was told: nothing when the fallback
//! refused the request, its units when it admitted it, and no concurrency
//! lease held for `lease`. Stalls past the connection's response timeout,
//! on every algorithm, are `tests/stalls.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::{Duration, Instant};

fn config(redis: &RedisServer, upstream: &Upstream, on_error: &str, limit: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 50ms }}
  on_error: {on_error}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - name: per-user
        key: [{{header: X-User}}]
        {limit}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

/// Pauses Redis for `millis`, sends one request for `user` during the pause,
/// then waits until a later decision has come from Redis: by then the
/// stalled script has run (one connection, in order). Returns the status.
fn request_during_a_stall(sluice: &Sluice, redis: &RedisServer, user: &str, millis: u64) -> u16 {
    // Connected before the stall, so the request's script is sent during it.
    wait_until(
        Duration::from_secs(10),
        "a first decision from Redis",
        || {
            sluice.get("/x", &[("X-User", "warm-up")]);
            sluice.decisions("api", "per-user", "allow", "redis") > 0
        },
    );
    redis.pause_clients(millis);
    let paused = Instant::now();
    let status = sluice.get("/x", &[("X-User", user)]).status;
    assert!(
        paused.elapsed() < Duration::from_millis(millis),
        "answered within the stall"
    );
    let from_redis = sluice.decisions("api", "per-user", "allow", "redis");
    let mut probes = 0;
    wait_until(
        Duration::from_secs(10),
        "a decision from Redis after the stall",
        || {
            probes += 1;
            sluice.get("/x", &[("X-User", &format!("probe-{probes}"))]);
            sluice.decisions("api", "per-user", "allow", "redis") > from_redis
        },
    );
    status
}

/// Waits for `key` to hold `n` entries, then checks it still does a moment later.
fn settles_at(redis: &RedisServer, key: &str, n: u64) {
    wait_until(
        Duration::from_secs(5),
        &format!("{key} to hold {n}"),
        || redis.log_len(key) == n,
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(redis.log_len(key), n, "{key}");
}

#[test]
fn a_late_admission_of_a_refused_request_is_refunded() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(
        &redis,
        &upstream,
        "deny",
        "limit: 5\n        window: 1m",
    ));
    assert_eq!(request_during_a_stall(&sluice, &redis, "alice", 600), 503);
    settles_at(&redis, "sluice:{api:per-user:alice}", 0);
}

#[test]
fn a_late_admission_of_an_admitted_request_is_kept() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(
        &redis,
        &upstream,
        "local",
        "limit: 5\n        window: 1m",
    ));
    assert_eq!(request_during_a_stall(&sluice, &redis, "bob", 600), 200);
    // The request did pass: Redis keeps counting it.
    settles_at(&redis, "sluice:{api:per-user:bob}", 1);
}

#[test]
fn a_late_lease_is_released_at_once() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(
        &redis,
        &upstream,
        "allow",
        "limit: 1\n        algorithm: concurrency\n        lease: 60s",
    ));
    assert_eq!(request_during_a_stall(&sluice, &redis, "carol", 600), 200);
    // Failed open: the request's end releases nothing in Redis, so the lease
    // taken late would block carol for a minute.
    settles_at(&redis, "sluice:{api:per-user:carol}", 0);
    assert_eq!(sluice.get("/x", &[("X-User", "carol")]).status, 200);
}
