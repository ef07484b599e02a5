//! Keys from client IPs and hostile headers, metrics without key values, the
//! shipped config, signals.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;

fn ip_limited(redis: &RedisServer, upstream: &Upstream, trusted: &str) -> String {
    format!(
        r#"
client_ip:
  trusted_proxies: [{trusted}]
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
  on_error: deny
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - name: per-ip
        key: [ip]
        limit: 1
        window: 1m
"#,
        url = redis.url(),
        upstream = upstream.addr
    )
}

#[test]
fn forwarded_for_from_untrusted_peer_does_not_change_the_key() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&ip_limited(&redis, &upstream, "10.0.0.0/8"));
    assert_eq!(
        sluice.get("/a", &[("X-Forwarded-For", "1.1.1.1")]).status,
        200
    );
    // A different claimed address from the same untrusted peer: same key, denied.
    assert_eq!(
        sluice.get("/a", &[("X-Forwarded-For", "2.2.2.2")]).status,
        429
    );
    assert_eq!(
        redis.limit_keys("sluice:*"),
        vec![b"sluice:{api:per-ip:127.0.0.1}".to_vec()]
    );
    // The upstream learns the real peer, appended to the client's claim.
    assert_eq!(
        upstream.last_header("x-forwarded-for").as_deref(),
        Some("1.1.1.1, 127.0.0.1")
    );
}

#[test]
fn forwarded_for_from_trusted_proxy_changes_the_key() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&ip_limited(&redis, &upstream, "127.0.0.1/32"));
    assert_eq!(
        sluice.get("/a", &[("X-Forwarded-For", "1.1.1.1")]).status,
        200
    );
    assert_eq!(
        sluice.get("/a", &[("X-Forwarded-For", "2.2.2.2")]).status,
        200
    );
    assert_eq!(
        sluice
            .get("/a", &[("X-Forwarded-For", "9.9.9.9, 2.2.2.2")])
            .status,
        429
    );
    // IPv6 clients are keyed by their /64.
    assert_eq!(
        sluice
            .get("/a", &[("X-Forwarded-For", "2001:db8:0:1::7")])
            .status,
        200
    );
    assert_eq!(
        sluice
            .get("/a", &[("X-Forwarded-For", "2001:db8:0:1::8")])
            .status,
        429
    );
    // Garbage: the last trustworthy address (the proxy itself) is used.
    assert_eq!(
        sluice.get("/a", &[("X-Forwarded-For", "not-an-ip")]).status,
        200
    );
    let mut keys: Vec<String> = redis
        .limit_keys("sluice:*")
        .into_iter()
        .map(|k| String::from_utf8(k).unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "sluice:{api:per-ip:1.1.1.1}",
            "sluice:{api:per-ip:127.0.0.1}",
            "sluice:{api:per-ip:2.2.2.2}",
            "sluice:{api:per-ip:2001:db8:0:1::/64}",
        ]
    );
}

fn header_keyed(redis: &RedisServer) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
  on_error: deny
routes:
  - name: hello
    match: {{ path: /hello }}
    respond: {{ status: 200, body: "hi" }}
    limits:
      - name: per-key
        key: [{{header: X-Api-Key}}, method]
        limit: 3
        window: 1m
"#,
        url = redis.url()
    )
}

#[test]
fn metrics_count_decisions_and_never_show_keys() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(&header_keyed(&redis));
    let secret = "secret-key-value-7f3a";
    let statuses: Vec<u16> = (0..5)
        .map(|_| sluice.get("/hello", &[("X-Api-Key", secret)]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(sluice.get("/nowhere", &[]).status, 404);

    let metrics = sluice.metrics();
    assert_eq!(sluice.decisions("hello", "per-key", "allow", "redis"), 3);
    // The first denial comes from Redis, the second from the deny cache.
    assert_eq!(sluice.decisions("hello", "per-key", "deny", "redis"), 1);
    assert_eq!(
        sluice.decisions("hello", "per-key", "deny", "deny_cache"),
        1
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_requests_total{route=\"hello\",status=\"200\"} "
        ),
        3
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_requests_total{route=\"hello\",status=\"429\"} "
        ),
        2
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_requests_total{route=\"_unmatched\",status=\"404\"} "
        ),
        1
    );
    assert_eq!(
        metric_value(&metrics, "sluice_redis_duration_seconds_count "),
        4,
        "3 admitted + 1 denied asked Redis; the cached denial did not"
    );
    assert!(metrics.contains("sluice_redis_up 1"));
    assert!(metrics.contains("sluice_request_duration_seconds_bucket{route=\"hello\""));
    assert!(
        !metrics.contains(secret),
        "a key value leaked into /metrics"
    );
    assert!(
        !metrics.contains("127.0.0.1"),
        "a client address leaked into /metrics"
    );
}

#[test]
fn hostile_header_values_get_no_5xx_and_bounded_keys() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(&header_keyed(&redis));
    let long = "a".repeat(8_000);
    let mut raw_values: Vec<Vec<u8>> = vec![
        long.into_bytes(),
        b"\x80\xff\xfe binary \x01".to_vec(),
        b"{slot}".to_vec(),
        b"a|b".to_vec(),
        b"".to_vec(),
        b"ip=127.0.0.1".to_vec(),
    ];
    raw_values.push((0u8..=255).filter(|b| *b != b'\r' && *b != b'\n').collect());
    for value in &raw_values {
        let mut raw =
            b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Api-Key: ".to_vec();
        raw.extend_from_slice(value);
        raw.extend_from_slice(b"\r\n\r\n");
        let status = raw_request(sluice.addr, &raw).status;
        assert!(
            (200..500).contains(&status),
            "value {:?} got {status}",
            String::from_utf8_lossy(value)
        );
    }
    // CR/LF games: a bare CR, a bare LF, obsolete line folding, a NUL.
    for raw in [
        &b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Api-Key: a\rb\r\n\r\n"[..],
        b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Api-Key: a\nX-Other: b\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Api-Key: a\r\n b\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Api-Key: a\x00b\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Api-Key: a\r\nX-Api-Key: b\r\n\r\n",
    ] {
        let status = raw_request(sluice.addr, raw).status;
        assert!((200..500).contains(&status), "{:?} got {status}", String::from_utf8_lossy(raw));
    }
    let keys = redis.limit_keys("sluice:*");
    assert!(!keys.is_empty());
    for key in &keys {
        assert!(
            key.len() <= 64,
            "key of {} bytes: {:?}",
            key.len(),
            String::from_utf8_lossy(key)
        );
        assert!(
            key.iter().all(|b| b.is_ascii_graphic()),
            "{:?}",
            String::from_utf8_lossy(key)
        );
        let inner = &key[b"sluice:{".len()..key.len() - 1];
        assert!(!inner.contains(&b'{') && !inner.contains(&b'}'));
    }
    // sluice is still serving.
    assert_eq!(sluice.get("/hello", &[("X-Api-Key", "fine")]).status, 200);
}

#[test]
fn shipped_config_starts_without_redis_or_upstream_and_limits_demo() {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/sluice.yaml")).unwrap();
    let dead_redis = format!("redis://127.0.0.1:{}/0", free_port());
    let sluice = Sluice::start_with(
        &shipped,
        addr,
        admin,
        &[
            ("SLUICE_LISTEN", &addr.to_string()),
            ("SLUICE_ADMIN", &admin.to_string()),
            ("SLUICE_REDIS_URL", &dead_redis),
        ],
    );
    let statuses: Vec<u16> = (0..7).map(|_| sluice.get("/demo", &[]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(
        sluice
            .get("/demo", &[])
            .header("retry-after")
            .map(|v| v.parse::<u64>().is_ok()),
        Some(true)
    );
    // The example upstream is not running: a clean 502, never a crash.
    assert_eq!(sluice.get("/api/users", &[]).status, 502);
    assert_eq!(sluice.get("/", &[]).status, 404);
}

#[test]
fn sigint_stops_fast_and_sigterm_within_the_grace_period() {
    let redis = RedisServer::start();
    let mut fast = Sluice::start(&header_keyed(&redis));
    let took = fast.stop_with("-INT");
    // Milliseconds, bounded at 300 ms by sluice's own watch (Pingora's
    // fast stop alone sometimes never ended); the rest is headroom for a
    // busy machine.
    assert!(
        took < Duration::from_secs(2),
        "SIGINT took {took:?}\n{}",
        fast.log()
    );

    let mut graceful = Sluice::start(&header_keyed(&redis));
    assert_eq!(graceful.get("/hello", &[("X-Api-Key", "k")]).status, 200);
    let took = graceful.stop_with("-TERM");
    // grace_period is 1 s, plus Pingora's 1 s runtime shutdown timeout.
    assert!(took < Duration::from_secs(8), "SIGTERM took {took:?}");
    assert!(graceful.log().contains("graceful"), "{}", graceful.log());
}

#[test]
fn local_backend_limits_without_redis_and_honours_response_settings() {
    let sluice = Sluice::start(
        r#"
limiter:
  backend: local
response:
  status: 403
  headers: none
routes:
  - name: hello
    match: { path: /hello, methods: [GET] }
    respond: { status: 201, body: "made" }
    limits:
      - name: per-ip
        key: [ip]
        limit: 2
        window: 1m
"#,
    );
    let responses: Vec<Response> = (0..3).map(|_| sluice.get("/hello", &[])).collect();
    assert_eq!(
        responses.iter().map(|r| r.status).collect::<Vec<_>>(),
        [201, 201, 403]
    );
    assert_eq!(responses[0].body, "made");
    assert!(
        responses
            .iter()
            .all(|r| r.header("x-ratelimit-limit").is_none()),
        "headers: none"
    );
    assert!(
        responses[2].header("retry-after").is_some(),
        "Retry-After is always sent on denial"
    );
    assert_eq!(sluice.decisions("hello", "per-ip", "allow", "local"), 2);
    assert_eq!(sluice.decisions("hello", "per-ip", "deny", "local"), 1);
    // Method mismatch: no route.
    assert_eq!(request(sluice.addr, "POST", "/hello", &[]).status, 404);
    assert_eq!(get(sluice.admin, "/readyz", &[]).status, 200);
}
