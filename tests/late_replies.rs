//! A decision that ran out of budget was answered by `on_error`, but Redis
//! ran its script when the stall ended. What Redis admitted must agree with
//! what the client was told: refunded when the fallback refused the request,
//! kept when it admitted it, and a concurrency lease released at once.

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

/// A stall longer than the connection's 2 s response timeout: the late
/// replies never arrive. Runs `limit` (with a fallback share admitting one
/// request) through it: one request admitted by the fallback, one refused;
/// Redis runs both late. Returns Redis, sluice (kept running: a refund may
/// still be on its way) and the limit's key.
fn stall_past_the_response_timeout(
    limit: u64,
    share: &str,
    user: &str,
) -> (RedisServer, Sluice, String) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 100ms }}
  on_error: local
  local: {{ share: "{share}" }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: {limit}, window: 1m }}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    );
    let sluice = Sluice::start(&body);
    let headers = [("X-User", user)];
    let key = format!("sluice:{{api:per-user:{user}}}");
    assert_eq!(sluice.get("/x", &headers).status, 200);
    assert_eq!(redis.log_len(&key), 1);

    redis.pause_clients(2500);
    // The fallback's share is one request: it admits one, refuses one.
    let during: Vec<u16> = (0..2).map(|_| sluice.get("/x", &headers).status).collect();
    assert_eq!(during, [200, 429]);
    let local = sluice.decisions("api", "per-user", "allow", "local")
        + sluice.decisions("api", "per-user", "deny", "local");
    assert_eq!(local, 2, "both answered by the fallback during the stall");
    (redis, sluice, key)
}

/// A large limit's log is a sorted set of members: the refund of the
/// refused request is sent without a reply, behind the stalled call (it
/// removes only the request's own member, harmless if Redis never ran it).
#[test]
fn a_refused_request_is_refunded_after_a_stall_longer_than_the_response_timeout() {
    let (redis, _sluice, key) = stall_past_the_response_timeout(2000, "1/2000", "dave");
    // Redis runs both late (3 units), then the refund of the refused one.
    settles_at(&redis, &key, 2);
}

/// A packed log keeps no member to give back by; the batch's deadline
/// makes the late run change nothing instead: the refused request is never
/// counted, the admitted one is written once.
#[test]
fn a_packed_log_counts_only_what_was_admitted_when_no_reply_came() {
    let (redis, sluice, key) = stall_past_the_response_timeout(3, "0.4", "erin");
    // Redis skips both late runs; the fallback's admission is written.
    settles_at(&redis, &key, 2);
    // So one more request fits the limit of 3, and the next does not.
    let headers = [("X-User", "erin")];
    assert_eq!(sluice.get("/x", &headers).status, 200);
    assert_eq!(sluice.get("/x", &headers).status, 429);
}
