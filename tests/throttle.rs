//! Throttling instead of rejecting (`on_limit: delay`): a request that would
//! fit within `max_delay` has its units reserved in Redis for the time they
//! free and waits until then; longer waits are denied as before. Through the
//! real binary, two instances on one Redis: the limit still holds in every
//! window, waits stay within `max_delay`, a client that leaves gives its turn
//! back, and waiters are bounded per key and per instance.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn config(redis: &RedisServer, upstream: &Upstream, limiter_extra: &str, limit: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
{limiter_extra}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {limit}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

/// The stamps of the one sliding log in Redis (admit and reservation
/// times, µs), oldest first.
fn log_scores(redis: &RedisServer) -> Vec<i64> {
    let mut connection = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*!l")
        .query(&mut connection)
        .expect("KEYS");
    let Some(key) = keys.first() else {
        return Vec::new();
    };
    let key = key.strip_suffix("!l").expect("a packed log key");
    packed_stamps(&mut connection, key)
        .into_iter()
        .map(|stamp| stamp as i64)
        .collect()
}

/// Sends `count` requests at once, alternating between `instances`; the
/// status and client-side latency of each.
fn burst(instances: &[&Sluice], count: usize, headers: &[(&str, &str)]) -> Vec<(u16, Duration)> {
    let results = Arc::new(Mutex::new(Vec::new()));
    let barrier = Arc::new(std::sync::Barrier::new(count));
    let owned: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let handles: Vec<_> = (0..count)
        .map(|i| {
            let addr = instances[i % instances.len()].addr;
            let (results, barrier, owned) = (results.clone(), barrier.clone(), owned.clone());
            thread::spawn(move || {
                let headers: Vec<(&str, &str)> = owned
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                barrier.wait();
                let response = get(addr, "/", &headers);
                results
                    .lock()
                    .unwrap()
                    .push((response.status, response.elapsed));
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("request thread");
    }
    let results = results.lock().unwrap().clone();
    results
}

#[test]
fn a_burst_waits_its_turn_and_no_window_admits_more_than_the_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(
        &redis,
        &upstream,
        "",
        "{ name: per-key, key: [{header: X-Key}], limit: 4, window: 1s, on_limit: delay, max_delay: 1500ms }",
    );
    let a = Sluice::start(&body);
    let b = Sluice::start(&body);
    let results = burst(&[&a, &b], 16, &[("X-Key", "k")]);
    let admitted: Vec<Duration> = results
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, t)| *t)
        .collect();
    let denied = results.iter().filter(|(s, _)| *s == 429).count();
    // 4 now, 4 at the second (1 s ≤ 1.5 s), the rest would wait 2 s.
    assert_eq!((admitted.len(), denied), (8, 8), "{results:?}");
    let waited = admitted
        .iter()
        .filter(|t| **t >= Duration::from_millis(800))
        .count();
    assert_eq!(waited, 4, "four waited their turn: {admitted:?}");
    assert!(
        admitted
            .iter()
            .all(|t| *t < Duration::from_millis(1500 + 1500)),
        "no wait beyond max_delay (with a loaded machine's margin): {admitted:?}"
    );

    // Exact in Redis: the 8 admit and reservation times hold at most 4 in
    // any window of 1 s.
    let scores = log_scores(&redis);
    assert_eq!(scores.len(), 8, "{scores:?}");
    for pair in scores.windows(5) {
        assert!(pair[4] - pair[0] >= 1_000_000, "{scores:?}");
    }
    // At the upstream: the delayed four arrived about a second after the
    // first four (a margin for the machine's jitter).
    let mut arrivals = upstream.arrivals();
    arrivals.sort();
    assert_eq!(arrivals.len(), 8);
    // (A late wake-up only delays a request; 400 ms of margin for the
    // first four arriving late on a loaded machine.)
    for pair in arrivals.windows(5) {
        assert!(
            pair[4] - pair[0] >= Duration::from_millis(600),
            "{arrivals:?}"
        );
    }

    let delayed = a.decisions("api", "per-key", "delayed", "redis")
        + b.decisions("api", "per-key", "delayed", "redis");
    let allowed = a.decisions("api", "per-key", "allow", "redis")
        + b.decisions("api", "per-key", "allow", "redis");
    assert_eq!((allowed, delayed), (4, 4));
    let metrics = a.metrics();
    assert!(
        metrics.contains("sluice_ratelimit_delay_seconds_count{route=\"api\"}"),
        "{metrics}"
    );
    assert_eq!(metric_value(&metrics, "sluice_ratelimit_waiting"), 0);
}

#[test]
fn a_token_bucket_spaces_a_burst_at_its_rate() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(
        &redis,
        &upstream,
        "",
        "{ name: paced, key: [ip], limit: 10, window: 1s, algorithm: token_bucket, burst: 1, on_limit: delay, max_delay: 500ms }",
    );
    let sluice = Sluice::start(&body);
    let results = burst(&[&sluice], 10, &[]);
    let admitted = results.iter().filter(|(s, _)| *s == 200).count();
    // One now, then one every 100 ms up to 500 ms: 6.
    assert_eq!(admitted, 6, "{results:?}");
    let mut arrivals = upstream.arrivals();
    arrivals.sort();
    let span = arrivals[arrivals.len() - 1] - arrivals[0];
    assert!(
        span >= Duration::from_millis(450),
        "paced at the refill rate: {span:?} {results:?} {arrivals:?}"
    );
    // The i-th arrives no earlier than its turn, i × 100 ms after the
    // first (less 100 ms, should the first itself be late): waking late
    // only ever delays a request.
    for (i, at) in arrivals.iter().enumerate() {
        let turn = Duration::from_millis(100 * i as u64).saturating_sub(Duration::from_millis(100));
        assert!(*at - arrivals[0] >= turn, "{arrivals:?}");
    }
}

#[test]
fn a_client_that_leaves_while_waiting_gives_its_turn_back() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(
        &redis,
        &upstream,
        "",
        "{ name: one, key: [ip], limit: 1, window: 2s, on_limit: delay, max_delay: 3s }",
    );
    let sluice = Sluice::start(&body);
    assert_eq!(sluice.get("/", &[]).status, 200);
    // A second request is reserved ~2 s ahead; its client leaves at once.
    let mut leaving = TcpStream::connect(sluice.addr).expect("connect");
    leaving
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    wait_until(Duration::from_secs(5), "the reservation", || {
        log_scores(&redis).len() == 2
    });
    drop(leaving);
    wait_until(Duration::from_secs(5), "the turn given back", || {
        log_scores(&redis).len() == 1
    });
    wait_until(Duration::from_secs(5), "the 499 counted", || {
        metric_value(
            &sluice.metrics(),
            "sluice_requests_total{route=\"api\",status=\"499\"}",
        ) == 1
    });
    assert_eq!(
        upstream.hits(),
        1,
        "the leaving request never reached the upstream"
    );
    assert_eq!(
        metric_value(&sluice.metrics(), "sluice_ratelimit_waiting"),
        0
    );
    // The next request takes the freed turn: it waits less than 2 s, not 4.
    let next = sluice.get("/", &[]);
    assert_eq!(next.status, 200);
    assert!(
        next.elapsed < Duration::from_millis(2500),
        "{:?}",
        next.elapsed
    );
    assert!(
        sluice.log().contains("\"status\":499"),
        "the access log names the 499:\n{}",
        sluice.log()
    );
}

#[test]
fn waiters_are_bounded_per_key_and_per_instance() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(
        &redis,
        &upstream,
        "  max_waiting: 3",
        "{ name: per-key, key: [{header: X-Key}], limit: 2, window: 2s, on_limit: delay, max_delay: 3s, max_waiting: 2 }",
    );
    let sluice = Sluice::start(&body);
    for key in ["a", "b"] {
        for _ in 0..2 {
            assert_eq!(sluice.get("/", &[("X-Key", key)]).status, 200);
        }
    }
    // Key a: 2 may wait, the third is denied at once although Redis
    // would have reserved it a turn.
    let started = Instant::now();
    let results = burst(&[&sluice], 3, &[("X-Key", "a")]);
    let denied: Vec<Duration> = results
        .iter()
        .filter(|(s, _)| *s == 429)
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(denied.len(), 1, "{results:?}");
    assert!(denied[0] < Duration::from_millis(1000), "{denied:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "two waited"
    );

    // The instance holds 3 waiters at most: 2 of key c, then 1 of key d.
    for key in ["c", "d"] {
        for _ in 0..2 {
            assert_eq!(sluice.get("/", &[("X-Key", key)]).status, 200);
        }
    }
    let addr = sluice.addr;
    let waiting_c: Vec<_> = (0..2)
        .map(|_| thread::spawn(move || get(addr, "/", &[("X-Key", "c")]).status))
        .collect();
    wait_until(Duration::from_secs(5), "two waiters", || {
        metric_value(&sluice.metrics(), "sluice_ratelimit_waiting") == 2
    });
    let d = burst(&[&sluice], 2, &[("X-Key", "d")]);
    let mut statuses: Vec<u16> = d.iter().map(|(s, _)| *s).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 429], "one place left for key d: {d:?}");
    let c: Vec<u16> = waiting_c.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(c, [200, 200]);
}

/// How closely a delayed request keeps to its planned wait: on an idle
/// machine the 99th percentile is within 20 ms of it. Timing-sensitive, so
/// run on its own: `cargo test --release --test throttle -- --ignored`.
#[test]
#[ignore]
fn delays_are_kept_within_20ms_at_p99_on_an_idle_machine() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(
        &redis,
        &upstream,
        "",
        "{ name: paced, key: [{header: X-Key}], limit: 20, window: 1s, algorithm: token_bucket, burst: 1, on_limit: delay, max_delay: 500ms }",
    );
    let sluice = Sluice::start(&body);
    let mut lateness = Vec::new();
    for round in 0..20 {
        let key = format!("k{round}");
        let results = burst(&[&sluice], 10, &[("X-Key", key.as_str())]);
        let mut times: Vec<Duration> = results.iter().map(|(_, t)| *t).collect();
        times.sort();
        // The i-th request's turn is i × 50 ms after the first's.
        for (i, t) in times.iter().enumerate() {
            let planned = times[0] + Duration::from_millis(50 * i as u64);
            lateness.push(t.saturating_sub(planned));
        }
    }
    lateness.sort();
    let p99 = lateness[lateness.len() * 99 / 100];
    eprintln!(
        "lateness p50 {:?} p99 {p99:?}",
        lateness[lateness.len() / 2]
    );
    assert!(p99 <= Duration::from_millis(20), "p99 {p99:?}");
}
