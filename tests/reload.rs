//! SIGHUP reload against the real binary, real Redis and a real upstream:
//! limits change under load without a failed request, counters survive, an
//! invalid file changes nothing, requests in flight finish on their config.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::thread;
use std::time::Duration;

/// A config with one route `api` (any path) proxied to `upstream`, limited
/// per `X-Client` header by `limit` per minute with `algorithm`.
fn config(sluice_server: &str, redis: &RedisServer, upstream: &str, limit: &str) -> String {
    format!(
        r#"{sluice_server}
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
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
        window: 1m
"#,
        url = redis.url(),
    )
}

fn start(redis: &RedisServer, upstream: &Upstream, limit: &str) -> (Sluice, String) {
    let addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = server_section(addr, admin);
    let text = config(&server, redis, &upstream.addr.to_string(), limit);
    (Sluice::start_with(&text, addr, admin, &[]), server)
}

fn probe(sluice: &Sluice) -> Response {
    sluice.get("/x", &[("X-Client", "probe")])
}

#[test]
fn limits_change_under_load_without_a_failed_request() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let (sluice, server) = start(&redis, &upstream, "limit: 100");
    let with_limit = |limit: &str| config(&server, &redis, &upstream.addr.to_string(), limit);

    let load = Load::start(sluice.addr, 4, "/load");
    for _ in 0..8 {
        let r = probe(&sluice);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit"), Some("100"));
    }

    // 100 → 10: the very next request sees 10, and the 8 units already
    // counted in Redis survive the reload.
    assert!(sluice.reload(&with_limit("limit: 10")), "{}", sluice.log());
    let statuses: Vec<(u16, Option<String>)> = (0..3)
        .map(|_| {
            let r = probe(&sluice);
            (
                r.status,
                r.header("x-ratelimit-remaining").map(String::from),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [
            (200, Some("1".into())),
            (200, Some("0".into())),
            (429, Some("0".into()))
        ]
    );

    // An invalid file: refused, counted, the old config keeps serving.
    assert!(!sluice.reload(&with_limit("limit: ten")));
    assert_eq!(sluice.reloads("failure"), 1);
    let denied = probe(&sluice);
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-ratelimit-limit"), Some("10"));
    let log = sluice.log();
    assert!(
        log.contains("config reload failed; still serving the previous config")
            && log.contains(&format!("{}:", sluice.config_path().display())),
        "{log}"
    );

    // And back to 100: the 10 counted units are still there.
    assert!(sluice.reload(&with_limit("limit: 100")));
    let allowed = probe(&sluice);
    assert_eq!(allowed.status, 200, "{}", allowed.body);
    assert_eq!(allowed.header("x-ratelimit-limit"), Some("100"));
    assert_eq!(allowed.header("x-ratelimit-remaining"), Some("89"));

    let after_last_reload = upstream.hits();
    wait_until(Duration::from_secs(10), "load past the last reload", || {
        upstream.hits() > after_last_reload + 20
    });
    let report = load.stop();
    let total = report.assert_no_failures("reloads under load");
    assert!(total >= 40, "too little load: {total}");
    assert_eq!(sluice.reloads("success"), 2);
    let log = sluice.log();
    assert!(
        log.contains("limit `api/per-client` modified: 100 per 1m (sliding_log, key header.x-client) → 10 per 1m (sliding_log, key header.x-client)"),
        "{log}"
    );
}

#[test]
fn a_request_in_flight_finishes_on_the_config_it_started_with() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let (sluice, server) = start(&redis, &upstream, "limit: 100");
    let addr = sluice.addr;
    let slow = thread::spawn(move || get(addr, "/slow/3000", &[("X-Client", "slow")]));
    wait_until(Duration::from_secs(10), "the slow request upstream", || {
        upstream.in_flight() == 1
    });
    assert!(sluice.reload(&config(
        &server,
        &redis,
        &upstream.addr.to_string(),
        "limit: 10"
    )));
    assert_eq!(
        upstream.in_flight(),
        1,
        "the slow request must still be running"
    );
    assert_eq!(probe(&sluice).header("x-ratelimit-limit"), Some("10"));
    let slow = slow.join().unwrap();
    assert_eq!(slow.status, 200);
    assert_eq!(slow.header("x-ratelimit-limit"), Some("100"));
}

#[test]
fn routes_and_upstreams_are_swapped_and_redis_connections_kept() {
    let redis = RedisServer::start();
    let (first, second) = (Upstream::start(), Upstream::start());
    let (sluice, server) = start(&redis, &first, "limit: 100");
    assert_eq!(probe(&sluice).status, 200);
    // sluice's connections to Redis, by id (each deciding thread has its
    // own, made on its first decision; this test's own is left out).
    let mut own = redis.connection();
    let own_id: u64 = redis::cmd("CLIENT").arg("ID").query(&mut own).unwrap();
    let mut connections = || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut own).unwrap();
        list.lines()
            .filter_map(|l| {
                l.strip_prefix("id=")?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .filter(|&id| id != own_id)
            .collect::<std::collections::BTreeSet<u64>>()
    };
    let before = connections();
    assert!(!before.is_empty(), "sluice holds a connection to Redis");

    // Another upstream and a lower limit, same Redis settings.
    assert!(sluice.reload(&config(
        &server,
        &redis,
        &second.addr.to_string(),
        "limit: 50"
    )));
    for _ in 0..3 {
        assert_eq!(probe(&sluice).status, 200);
    }
    assert_eq!((first.hits(), second.hits()), (1, 3));
    // Every connection sluice held is still open: none was made again.
    let after = connections();
    assert!(
        before.is_subset(&after),
        "the reload reconnected to Redis: {before:?} then {after:?}"
    );
    let log = sluice.log();
    assert!(log.contains("upstream `api` modified"), "{log}");
    assert!(
        log.contains("limit `api/per-client` modified: 100 per 1m"),
        "{log}"
    );
}

#[test]
fn a_changed_algorithm_starts_afresh_instead_of_failing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let (sluice, server) = start(&redis, &upstream, "limit: 3");
    for _ in 0..3 {
        assert_eq!(probe(&sluice).status, 200);
    }
    assert_eq!(probe(&sluice).status, 429);
    // The sliding log's sorted set is still in Redis; the token bucket keeps
    // a number under the same key. on_error is deny: a WRONGTYPE would be 503.
    assert!(sluice.reload(&config(
        &server,
        &redis,
        &upstream.addr.to_string(),
        "limit: 3\n        algorithm: token_bucket"
    )));
    let statuses: Vec<u16> = (0..4).map(|_| probe(&sluice).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(
        metric_value(
            &sluice.metrics(),
            "sluice_redis_errors_total{kind=\"server\"} "
        ),
        0
    );
    assert!(sluice.log().contains("(its counters restart)"));
}

#[test]
fn a_restart_only_setting_is_reported_and_kept() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let (sluice, server) = start(&redis, &upstream, "limit: 100");
    let moved = server.replace("threads: 2", "threads: 3");
    assert!(sluice.reload(&config(
        &moved,
        &redis,
        &upstream.addr.to_string(),
        "limit: 100"
    )));
    assert!(sluice.log().contains("server.threads changed in"));
    assert_eq!(probe(&sluice).status, 200);
}
