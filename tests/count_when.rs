//! Limits that count by the response: `count_when` (only failed logins
//! consume) and `cost_from` (the upstream says what a request cost), on
//! real Redis and two gateway instances.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;

fn gateway(redis: &RedisServer, upstream: &Upstream) -> Sluice {
    Sluice::start(&format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
upstreams:
  app: {{ servers: ["{app}"] }}
routes:
  - name: login
    match: {{ path_prefix: /status/ }}
    upstream: app
    limits:
      - name: failures
        key: [{{header: X-User}}]
        limit: 3
        window: 1m
        count_when: {{ status: [401, 403, "5xx"] }}
  - name: llm
    match: {{ path_prefix: /complete }}
    upstream: app
    limits:
      - name: tokens
        key: [{{header: X-Key}}]
        limit: 100
        window: 1m
        cost_from: {{ response_header: x-usage-tokens }}
"#,
        url = redis.url(),
        app = upstream.addr
    ))
}

#[test]
fn only_failed_logins_consume_and_a_brute_force_is_stopped_at_the_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let (a, b) = (gateway(&redis, &upstream), gateway(&redis, &upstream));
    let user = [("X-User", "victim")];
    // Successful logins never consume.
    for i in 0..10 {
        let sluice = if i % 2 == 0 { &a } else { &b };
        assert_eq!(sluice.get("/status/200", &user).status, 200);
    }
    assert_eq!(redis.log_len("sluice:{login:failures:victim}"), 0);
    // A brute-force loop over both instances: three failures pass (and are
    // counted once their 401 is known), then everything is refused, a
    // correct password included, without reaching the upstream.
    let mut statuses = Vec::new();
    for i in 0..8 {
        let sluice = if i % 2 == 0 { &a } else { &b };
        statuses.push(sluice.get("/status/401", &user).status);
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429, 429, 429]);
    let hits = upstream.hits();
    assert_eq!(a.get("/status/200", &user).status, 429);
    assert_eq!(
        upstream.hits(),
        hits,
        "a refused attempt never reaches the app"
    );
    assert_eq!(redis.log_len("sluice:{login:failures:victim}"), 3);
    // Server errors count too (5xx), and other users are not affected.
    let other = [("X-User", "someone")];
    assert_eq!(a.get("/status/503", &other).status, 503);
    assert_eq!(redis.log_len("sluice:{login:failures:someone}"), 1);
}

#[test]
fn the_upstream_reports_the_cost_and_the_overshoot_stays_within_what_was_in_flight() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let (a, b) = (gateway(&redis, &upstream), gateway(&redis, &upstream));
    // One at a time, 30 tokens each: 0, 30, 60, 90 used when checked, so
    // four pass (the fourth ends at 120: the one in flight may overshoot)
    // and the fifth is refused.
    let key = [("X-Key", "k1")];
    let got: Vec<u16> = (0..5)
        .map(|_| a.get("/complete?tokens=30", &key).status)
        .collect();
    assert_eq!(got, [200, 200, 200, 200, 429]);
    assert_eq!(
        redis.log_len("sluice:{llm:tokens:k1}"),
        120,
        "exactly what was reported"
    );
    // A response without the header counts the limit's cost (1).
    let fresh = [("X-Key", "k2")];
    assert_eq!(b.get("/complete", &fresh).status, 200);
    assert_eq!(redis.log_len("sluice:{llm:tokens:k2}"), 1);

    // 50 concurrent requests of 10 tokens over two instances: each is
    // checked before any of the others' responses is counted, so more than
    // 10 may pass — at most the 50 in flight — and what is recorded is
    // exactly 10 per admitted request. Then the key is refused.
    let addrs = [a.addr, b.addr];
    let statuses = concurrent(50, move |i| {
        get(addrs[i % 2], "/complete?tokens=10", &[("X-Key", "k3")])
    });
    let admitted = statuses.iter().filter(|&&s| s == 200).count() as u64;
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "{statuses:?}"
    );
    assert!((10..=50).contains(&admitted), "{admitted} admitted");
    assert_eq!(redis.log_len("sluice:{llm:tokens:k3}"), 10 * admitted);
    assert_eq!(a.get("/complete?tokens=10", &[("X-Key", "k3")]).status, 429);
}
