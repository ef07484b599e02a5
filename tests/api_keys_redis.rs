//! API keys kept in Redis (`store: redis`), managed through the admin
//! API, with two sluice instances on one real Redis: a key created on one
//! works on the other at once, one written by another tool within 1 s of
//! a miss, a revoked one is refused by both within `cache_ttl`; invented
//! keys cost Redis at most one lookup each.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::{Duration, Instant};

const TOKEN: &str = "admin-s3cret";

/// An instance whose clients may send `failures` unknown keys a minute.
fn start(redis: &RedisServer, upstream: &Upstream, failures: u32) -> Sluice {
    start_with_ttl(redis, upstream, failures, "2s")
}

/// [`start`] with this `cache_ttl`.
fn start_with_ttl(redis: &RedisServer, upstream: &Upstream, failures: u32, ttl: &str) -> Sluice {
    let body = format!(
        r#"identity:
  api_key:
    store: redis
    cache_ttl: {ttl}
    failures: {{ limit: {failures}, window: 1m }}
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-consumer, key: [user], limit: 1000, window: 1m, limit_from: {{ consumer: plan }}, plans: {{ pro: 5 }} }}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    );
    Sluice::start_with_server(
        "  admin_token_env: SLUICE_ADMIN_TOKEN\n",
        &body,
        &[("SLUICE_ADMIN_TOKEN", TOKEN)],
    )
}

/// `method path` on the admin listener with the token and `body`.
fn admin(sluice: &Sluice, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    admin_call(sluice.admin, TOKEN, method, path, body)
}

fn with_key(sluice: &Sluice, key: &str) -> u16 {
    sluice.get("/x", &[("X-Api-Key", key)]).status
}

#[test]
fn keys_created_and_revoked_through_the_admin_api_are_seen_by_every_instance() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    // Polling a revoked key counts failures: room for them.
    let (a, b) = (
        start(&redis, &upstream, 100_000),
        start(&redis, &upstream, 100_000),
    );
    let (status, created) = admin(&a, "POST", "/v1/consumers/acme/keys", r#"{"plan": "pro"}"#);
    assert_eq!(status, 201, "{created}");
    let key = created["key"].as_str().expect("key").to_string();
    let key_id = created["key_id"].as_str().expect("key_id").to_string();
    assert_eq!(key_id.len(), 12);
    // Stored hashed, in the documented layout.
    let stored = redis.keys("sluice:key:*");
    assert_eq!(stored.len(), 1);
    assert!(String::from_utf8_lossy(&stored[0]).starts_with(&format!("sluice:key:{key_id}")));
    assert!(!redis
        .keys("*")
        .iter()
        .any(|k| String::from_utf8_lossy(k).contains(&key)));

    // The pro plan (5 a minute) is exact across both instances.
    let admitted = (0..12)
        .filter(|i| with_key(if i % 2 == 0 { &a } else { &b }, &key) == 200)
        .count();
    assert_eq!(admitted, 5);
    assert_eq!(
        upstream.last_header("x-consumer-id").as_deref(),
        Some("acme")
    );
    assert_eq!(upstream.last_header("x-api-key"), None);
    let (status, listed) = admin(&b, "GET", "/v1/consumers/acme/keys", "");
    assert_eq!(
        (status, listed["keys"][0].as_str()),
        (200, Some(key_id.as_str()))
    );

    // Revoked on A: A refuses at once (its cache is dropped), B within
    // cache_ttl (2 s). Without a key the request is anonymous: 200.
    let (status, _) = admin(
        &a,
        "DELETE",
        &format!("/v1/consumers/acme/keys/{key_id}"),
        "",
    );
    assert_eq!(status, 200);
    let (status, _) = admin(
        &a,
        "DELETE",
        &format!("/v1/consumers/acme/keys/{key_id}"),
        "",
    );
    assert_eq!(status, 404);
    let revoked_at = Instant::now();
    wait_until(
        Duration::from_secs(15),
        "both to refuse the revoked key",
        || {
            let (on_a, on_b) = (
                a.get("/x", &[("X-Api-Key", &key)]),
                b.get("/x", &[("X-Api-Key", &key)]),
            );
            on_a.status == 200
                && on_b.status == 200
                && on_a.header("x-ratelimit-limit") == Some("1000")
                && on_b.header("x-ratelimit-limit") == Some("1000")
        },
    );
    assert!(
        revoked_at.elapsed() < Duration::from_millis(2000 + 1500),
        "{:?}",
        revoked_at.elapsed()
    );
}

#[test]
fn a_key_another_tool_writes_works_within_a_second_of_a_miss() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = start(&redis, &upstream, 100_000);
    let key = "written-by-another-tool";
    // A miss first: the unknown answer is cached (for at most 1 s).
    let response = sluice.get("/x", &[("X-Api-Key", key)]);
    assert_eq!(response.header("x-ratelimit-limit"), Some("1000"));
    let line = sluice::config::consumers::key_line(key.as_bytes());
    let hash = line.trim_start_matches("sha256:");
    let _: () = redis::cmd("HSET")
        .arg(format!("sluice:key:{hash}"))
        .arg("consumer")
        .arg("initech")
        .arg("plan")
        .arg("pro")
        .query(&mut redis.connection())
        .expect("HSET");
    let started = Instant::now();
    wait_until(Duration::from_secs(15), "the new key to work", || {
        sluice
            .get("/x", &[("X-Api-Key", key)])
            .header("x-ratelimit-limit")
            == Some("5")
    });
    assert!(
        started.elapsed() < Duration::from_millis(1000 + 1500),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn invented_keys_cost_redis_one_lookup_each_and_the_api_needs_the_token() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = start(&redis, &upstream, 20);
    let before = redis.command_calls("hgetall");
    let statuses: Vec<u16> = (0..1000)
        .map(|i| with_key(&sluice, &format!("invented-{i}")))
        .collect();
    assert!(statuses[..20].iter().all(|s| *s == 200));
    assert!(statuses[20..].iter().all(|s| *s == 429));
    let lookups = redis.command_calls("hgetall") - before;
    assert!(lookups <= 1000, "{lookups} lookups for 1,000 keys");
    assert!(redis
        .keys("*")
        .iter()
        .all(|k| !String::from_utf8_lossy(k).contains("invented")));
    // The same invented key again within a second: no second lookup.
    let again = redis.command_calls("hgetall");
    with_key(&sluice, "invented-999");
    assert_eq!(redis.command_calls("hgetall"), again);

    let raw = "POST /v1/consumers/acme/keys HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_request(sluice.admin, raw.as_bytes()).status, 401);
    let wrong = raw.replace("Host: a\r\n", "Host: a\r\nAuthorization: Bearer nope\r\n");
    assert_eq!(raw_request(sluice.admin, wrong.as_bytes()).status, 401);
    assert_eq!(
        admin(&sluice, "POST", "/v1/consumers/ac%20me/keys", "").0,
        400
    );
    assert_eq!(
        admin(&sluice, "POST", "/v1/consumers/acme/keys", "{\"plan\": 5}").0,
        400
    );
    assert_eq!(
        admin(&sluice, "DELETE", "/v1/consumers/acme/keys/XYZ", "").0,
        400
    );
    assert_eq!(admin(&sluice, "PUT", "/v1/consumers/acme/keys", "").0, 405);
}

#[test]
fn with_redis_gone_a_cached_key_still_works_and_an_uncached_one_is_anonymous() {
    let (mut redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = start_with_ttl(&redis, &upstream, 100_000, "1m");
    let (status, created) = admin(&sluice, "POST", "/v1/consumers/acme/keys", "");
    assert_eq!(status, 201, "{created}");
    let key = created["key"].as_str().expect("key").to_string();
    assert_eq!(with_key(&sluice, &key), 200);
    redis.kill();
    // Within cache_ttl the answer is still trusted.
    let response = sluice.get("/x", &[("X-Api-Key", &key)]);
    assert_eq!(response.status, 200);
    assert_eq!(
        upstream.last_header("x-consumer-id").as_deref(),
        Some("acme")
    );
    // An uncached key cannot be looked up: on_error (local) lets it through
    // as no one, and the error is counted.
    let response = sluice.get("/x", &[("X-Api-Key", "never-seen")]);
    assert_eq!(response.status, 200);
    assert_eq!(upstream.last_header("x-consumer-id"), None);
    let metrics = sluice.metrics();
    assert!(
        metrics.contains("sluice_identity_lookups_total{result=\"error\",store=\"redis\"} 1"),
        "{metrics}"
    );
}
