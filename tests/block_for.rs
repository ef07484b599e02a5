//! `block_for`: a key a limit denies stays denied for the penalty, on every
//! instance (the box is held in Redis), even after its window frees.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::{Duration, Instant};

fn gateway(redis: &RedisServer) -> Sluice {
    Sluice::start(&format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
routes:
  - name: login
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: 2, window: 1s, block_for: 8s }}
"#,
        url = redis.url()
    ))
}

#[test]
fn a_denied_key_stays_denied_on_every_instance_for_the_penalty() {
    let redis = RedisServer::start();
    let (a, b) = (gateway(&redis), gateway(&redis));
    let user = [("X-User", "mallory")];
    let boxed_at = Instant::now();
    let first: Vec<u16> = (0..3).map(|_| a.get("/login", &user).status).collect();
    assert_eq!(first, [200, 200, 429]);
    // The box is in Redis, for the penalty.
    let left: i64 = redis::cmd("PTTL")
        .arg("sluice:{login:per-user:mallory}!b")
        .query(&mut redis.connection())
        .expect("PTTL");
    assert!((6_000..=8_000).contains(&left), "penalty left: {left} ms");
    // The other instance agrees, and says how long.
    let denied = b.get("/login", &user);
    assert_eq!(denied.status, 429);
    let retry: u64 = denied
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!((6..=8).contains(&retry), "retry-after {retry}: {denied:?}");
    // The 1 s window frees long before the penalty ends: still denied.
    std::thread::sleep(Duration::from_millis(1500));
    if boxed_at.elapsed() < Duration::from_secs(7) {
        assert_eq!(b.get("/login", &user).status, 429, "still in the box");
        assert_eq!(a.get("/login", &user).status, 429, "still in the box");
    }
    // Others are not affected.
    assert_eq!(b.get("/login", &[("X-User", "alice")]).status, 200);
    // When the penalty ends, the key passes again.
    wait_until(Duration::from_secs(20), "the penalty to end", || {
        b.get("/login", &user).status == 200
    });
    assert!(
        boxed_at.elapsed() >= Duration::from_secs(7),
        "box ended early"
    );
}
