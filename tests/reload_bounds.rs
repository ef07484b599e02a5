//! A reload that changes a limit's window (or lease) never produces an absurd
//! answer: for every algorithm and both backends, with the window made larger
//! and smaller over a used-up key, Retry-After and X-RateLimit-Reset stay
//! within the new window × (1 + 1/buckets) — token bucket: Retry-After within
//! the time to refill the request's cost; concurrency: Reset within a lease
//! and Retry-After one second.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

fn config(server: &str, backend: &str, upstream: &Upstream, limit: &str) -> String {
    format!(
        r#"{server}limiter:
  {backend}
  on_error: deny
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - name: per-client
        key: [{{header: x-client}}]
        {limit}
"#,
        upstream = upstream.addr,
    )
}

fn backend(redis: &RedisServer, which: &str) -> String {
    match which {
        "redis" => format!("redis: {{ url: \"{}\", timeout: 2s }}", redis.url()),
        _ => "backend: local".into(),
    }
}

fn seconds(response: &Response, header: &str) -> u64 {
    response
        .header(header)
        .unwrap_or_else(|| panic!("no {header}: {response:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{header} is not a number: {response:?}"))
}

/// For both backends: uses up the key under a 10 s window, then reloads to
/// 60 s and to 2 s and checks the answers' bounds after each.
fn used_up_key_then_window_changes(algorithm: &str, extra: &str) {
    for which in ["redis", "local"] {
        used_up_key_on(which, algorithm, extra);
    }
}

fn used_up_key_on(which: &str, algorithm: &str, extra: &str) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = server_section(addr, admin);
    let store = backend(&redis, which);
    let limit = |window: &str| {
        format!("limit: 3\n        window: {window}\n        algorithm: {algorithm}{extra}")
    };
    let sluice = Sluice::start_with(
        &config(&server, &store, &upstream, &limit("10s")),
        addr,
        admin,
        &[],
    );
    // A fixed window of 10 s starts afresh on each multiple of 10 s: a
    // burst that straddles one (a loaded machine) is seen, by the clock,
    // and tried again with another key, rather than taken for a failure.
    let window_of = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_secs() / 10
    };
    let mut key = String::new();
    for attempt in 0..3 {
        key = format!("alice-{attempt}");
        let started = window_of();
        let statuses: Vec<u16> = (0..4)
            .map(|_| sluice.get("/x", &[("X-Client", &key)]).status)
            .collect();
        let straddled = algorithm == "fixed_window" && window_of() != started;
        if statuses.last() == Some(&429) || !straddled {
            assert_eq!(
                statuses.last(),
                Some(&429),
                "{algorithm}/{which}: {statuses:?}"
            );
            break;
        }
    }
    let send = || sluice.get("/x", &[("X-Client", key.as_str())]);

    for (window, window_secs) in [("60s", 60.0), ("2s", 2.0)] {
        assert!(
            sluice.reload(&config(&server, &store, &upstream, &limit(window))),
            "{}",
            sluice.log()
        );
        // window × (1 + 1/buckets), buckets = 10 where it applies.
        let bound = (window_secs * 1.1_f64).ceil() as u64;
        for _ in 0..3 {
            let response = send();
            let reset = seconds(&response, "x-ratelimit-reset");
            assert!(
                reset <= bound,
                "{algorithm}/{which}, window → {window}: X-RateLimit-Reset {reset} > {bound}"
            );
            if response.status == 429 {
                let retry = seconds(&response, "retry-after");
                let retry_bound = if algorithm == "token_bucket" {
                    // cost (1) × refill interval (window / limit), rounded up.
                    (window_secs / 3.0).ceil() as u64
                } else {
                    bound
                };
                assert!(
                    retry <= retry_bound.max(1),
                    "{algorithm}/{which}, window → {window}: Retry-After {retry} > {retry_bound}"
                );
            } else {
                assert_eq!(response.status, 200);
            }
        }
    }
}

#[test]
fn sliding_log_window_changes() {
    used_up_key_then_window_changes("sliding_log", "");
}

#[test]
fn sliding_window_window_changes() {
    used_up_key_then_window_changes("sliding_window", "\n        buckets: 10");
}

#[test]
fn fixed_window_window_changes() {
    used_up_key_then_window_changes("fixed_window", "");
}

#[test]
fn token_bucket_window_changes() {
    used_up_key_then_window_changes("token_bucket", "");
}

#[test]
fn concurrency_lease_changes() {
    for which in ["redis", "local"] {
        let redis = RedisServer::start();
        let upstream = Upstream::start();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let server = server_section(addr, admin);
        let store = backend(&redis, which);
        let limit = |lease: &str| {
            format!("limit: 1\n        algorithm: concurrency\n        lease: {lease}")
        };
        let sluice = Sluice::start_with(
            &config(&server, &store, &upstream, &limit("60s")),
            addr,
            admin,
            &[],
        );
        // One lease held under `lease: 60s` by a slow request.
        let target = sluice.addr;
        let held = thread::spawn(move || get(target, "/slow/3000", &[("X-Client", "alice")]));
        wait_until(
            Duration::from_secs(10),
            "the slow request in flight",
            || upstream.in_flight() == 1,
        );
        for (lease, bound) in [("120s", 120), ("2s", 2)] {
            assert!(
                sluice.reload(&config(&server, &store, &upstream, &limit(lease))),
                "{}",
                sluice.log()
            );
            // Redis keeps the old lease: denied, and the wait is told in
            // terms of the new lease. The in-process limiter starts a limit
            // whose parameters changed afresh: admitted.
            let response = sluice.get("/x", &[("X-Client", "alice")]);
            let expected = if which == "redis" { 429 } else { 200 };
            assert_eq!(response.status, expected, "{which}: {response:?}");
            let reset = seconds(&response, "x-ratelimit-reset");
            assert!(
                reset <= bound,
                "{which}, lease → {lease}: X-RateLimit-Reset {reset} > {bound}"
            );
            if response.status == 429 {
                assert_eq!(seconds(&response, "retry-after"), 1);
            }
        }
        assert_eq!(held.join().expect("slow request").status, 200);
    }
}
