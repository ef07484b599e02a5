//! Retries: a refused connection goes to another server, a 5xx is tried
//! again for idempotent methods only, and the limits count a request once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;

fn config(redis: &RedisServer, servers: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
upstreams:
  api: {{ servers: [{servers}], max_fails: 0 }}   # no passive health: every turn tried
routes:
  - name: retried
    match: {{ path_prefix: /retried/ }}
    upstream: api
    rewrite: {{ strip_prefix: true }}
    timeouts: {{ connect: 500ms, read: 5s }}
    retries: {{ attempts: 2, on: [connect_error, 502, 503, 504] }}
    limits: [{{ name: all, key: [method], limit: 1000, window: 1m }}]
  - name: hurried
    match: {{ path_prefix: /slow/ }}
    upstream: api
    timeouts: {{ read: 300ms }}
  - name: once
    upstream: api
    limits: [{{ name: all, key: [method], limit: 1000, window: 1m }}]
"#,
        url = redis.url()
    )
}

#[test]
fn a_refused_connection_is_tried_on_another_server_and_counted_once() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let refused = format!("127.0.0.1:{}", free_port());
    let servers = format!("\"{refused}\", \"{}\"", upstream.addr);
    let sluice = Sluice::start(&config(&redis, &servers));
    for i in 0..10 {
        assert_eq!(
            sluice.get(&format!("/retried/{i}"), &[]).status,
            200,
            "request {i}"
        );
    }
    assert_eq!(upstream.hits(), 10);
    let metrics = sluice.metrics();
    let retries = metric_value(&metrics, "sluice_upstream_retries_total{route=\"retried\"}");
    // Round robin: a first try lands on the refused server at least every
    // other request; each is tried once more, never twice.
    assert!(
        (5..=10).contains(&retries),
        "{retries} retries for 10 requests"
    );
    assert_eq!(
        sluice.decisions("retried", "all", "allow", "redis"),
        10,
        "each request counted once"
    );
    assert_eq!(redis.log_len("sluice:{retried:all:GET}"), 10);
    // Without retries, the refused server's turn is a 502.
    let statuses: Vec<u16> = (0..10)
        .map(|i| sluice.get(&format!("/{i}"), &[]).status)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count(),
        5,
        "{statuses:?}"
    );
}

#[test]
fn a_5xx_is_tried_again_only_for_idempotent_methods() {
    let redis = RedisServer::start();
    let (a, b) = (Upstream::start(), Upstream::start());
    let servers = format!("\"{}\", \"{}\"", a.addr, b.addr);
    let sluice = Sluice::start(&config(&redis, &servers));
    // Both servers answer 503: two tries, then the last answer as it is.
    let response = sluice.get("/retried/status/503", &[]);
    assert_eq!(response.status, 503);
    assert_eq!(response.body, "upstream ok");
    assert_eq!(
        (a.hits(), b.hits()),
        (1, 1),
        "the second try went to the other server"
    );
    // A POST is not repeated.
    let response = request(
        sluice.addr,
        "POST",
        "/retried/status/503",
        &[("Content-Length", "0")],
    );
    assert_eq!(response.status, 503);
    assert_eq!(a.hits() + b.hits(), 3);
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(&metrics, "sluice_upstream_retries_total{route=\"retried\"}"),
        1
    );
    assert_eq!(
        redis.log_len("sluice:{retried:all:GET}"),
        1,
        "the GET counted once"
    );
}

#[test]
fn a_route_shortens_its_upstreams_read_timeout() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &format!("\"{}\"", upstream.addr)));
    // The upstream's own read_timeout is 30 s; the route's is 300 ms.
    let response = sluice.get("/slow/3000", &[]);
    assert_eq!(response.status, 504, "{}", response.body);
    assert!(
        response.elapsed < std::time::Duration::from_millis(2500),
        "{:?}",
        response.elapsed
    );
}
