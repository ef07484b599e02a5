//! concurrency limits (nginx `limit_conn`, Traefik
//! `InFlightReq`) across instances, with leases in Redis.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::thread;
use std::time::{Duration, Instant};

fn config(redis: &RedisServer, upstream: &Upstream, lease: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
upstreams:
  api: {{ servers: ["{upstream}"], read_timeout: 60s }}
routes:
  - name: reports
    upstream: api
    limits:
      - {{ name: in-flight, key: [ip], limit: 2, algorithm: concurrency, lease: {lease} }}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

const KEY: &str = "sluice:{reports:in-flight:127.0.0.1}";

fn slow_request(addr: std::net::SocketAddr, ms: u64) -> thread::JoinHandle<u16> {
    thread::spawn(move || get(addr, &format!("/slow/{ms}"), &[]).status)
}

#[test]
fn the_third_concurrent_request_waits_for_one_to_finish() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, "30s"));

    let first = slow_request(sluice.addr, 1500);
    let second = slow_request(sluice.addr, 4000);
    wait_until(Duration::from_secs(10), "two requests in flight", || {
        upstream.in_flight() == 2
    });
    let third = sluice.get("/fast", &[]);
    assert_eq!(third.status, 429, "{}", third.body);
    assert_eq!(third.header("retry-after"), Some("1"));
    assert_eq!(redis.log_len(KEY), 2);

    // When the first response completes its lease is released at once, long
    // before the 30 s lease would expire.
    assert_eq!(first.join().unwrap(), 200);
    wait_until(Duration::from_secs(5), "a lease released", || {
        redis.log_len(KEY) == 1
    });
    assert_eq!(sluice.get("/fast", &[]).status, 200);
    assert_eq!(second.join().unwrap(), 200);
    wait_until(Duration::from_secs(5), "all leases released", || {
        redis.log_len(KEY) == 0
    });
    assert_eq!(sluice.decisions("reports", "in-flight", "deny", "redis"), 1);
}

#[test]
fn the_limit_holds_across_instances_and_a_dead_instance_frees_its_leases_after_lease() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let text = config(&redis, &upstream, "3s");
    let mut a = Sluice::start(&text);
    let b = Sluice::start(&text);

    // Instance A holds both slots with responses that will never complete.
    let _held = [slow_request(a.addr, 30_000), slow_request(a.addr, 30_000)];
    wait_until(Duration::from_secs(10), "two requests in flight", || {
        upstream.in_flight() == 2
    });
    assert_eq!(b.get("/fast", &[]).status, 429, "B sees A's leases");

    a.stop_with("-KILL");
    let killed = Instant::now();
    assert_eq!(
        b.get("/fast", &[]).status,
        429,
        "the leases outlive their instance until they expire"
    );
    // A's two leases end 3 s after they were taken; B is admitted then.
    wait_until(Duration::from_secs(8), "B admitted after the lease", || {
        b.get("/fast", &[]).status == 200
    });
    let freed = killed.elapsed();
    assert!(freed <= Duration::from_secs(4), "freed after {freed:?}");
}
