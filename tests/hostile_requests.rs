//! Requests spelt to get around a limit: other spellings of a path or a host,
//! duplicated or forged identity headers, foreign upgrades. Each must be
//! answered 429 (or 400) once the limit is used, and the upstream must see
//! exactly the one request the limit admitted, in canonical form.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;

fn limited(redis: &RedisServer, upstream: &Upstream, extra: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: sms
    match: {{ path_prefix: /api/sms/ }}
    upstream: api
    limits:
      - {{ name: per-ip, key: [ip], limit: 1, window: 1m }}
  - name: files
    match: {{ path_prefix: /files/ }}
    upstream: api
    limits:
      - {{ name: per-path, key: [ip, path], limit: 1, window: 1m }}
  - name: host-only
    match: {{ host: api.example.com, path_prefix: /s/ }}
    upstream: api
    limits:
      - {{ name: per-ip, key: [ip], limit: 1, window: 1m }}
  - name: catch-all
    upstream: api
{extra}"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

/// Every one of `spellings` is answered 429 once the limit is used.
fn assert_denied(sluice: &Sluice, spellings: &[&str]) {
    for spelling in spellings {
        let response = sluice.get(spelling, &[]);
        assert_eq!(response.status, 429, "{spelling}: {}", response.body);
    }
}

#[test]
fn path_spellings_never_get_around_a_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&limited(&redis, &upstream, ""));

    assert_eq!(sluice.get("/api/sms/a", &[]).status, 200);
    assert_denied(
        &sluice,
        &[
            "/api/sms/a",
            "//api/sms/a",
            "/api//sms/a",
            "/api/./sms/a",
            "/api/x/../sms/a",
            "/api/%73ms/a",
            "/%61pi/sms/a",
            "/API/../api/sms/a",
            "/api/sms/b/../a",
            "/api/%2e/sms/a",
        ],
    );
    assert_eq!(
        upstream.hits(),
        1,
        "only the admitted request reached the upstream"
    );
    assert_eq!(upstream.targets(), vec!["/api/sms/a"]);
}

#[test]
fn a_path_key_counts_every_spelling_as_one_counter() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&limited(&redis, &upstream, ""));

    assert_eq!(sluice.get("/files//a?x=1", &[]).status, 200);
    assert_denied(
        &sluice,
        &[
            "/files/a",
            "/files/./a",
            "/files/%61",
            "/files/b/../a",
            "/files///a",
        ],
    );
    assert_eq!(upstream.hits(), 1);
    // Forwarded canonical, the query as sent.
    assert_eq!(upstream.targets(), vec!["/files/a?x=1"]);
}

#[test]
fn targets_that_cannot_be_made_canonical_are_400() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&limited(&redis, &upstream, ""));

    for target in [
        "/api/sms/a%00",
        "/api/sms/%0d%0aX:1",
        "/api/sms/%zz",
        "/api/sms/a%",
        "/..",
        "/api/../../etc/passwd",
        "/api/sms%2Fa",
        "/api/sms%5ca",
        "/api\\sms/a",
    ] {
        let response = sluice.get(target, &[]);
        assert_eq!(response.status, 400, "{target}: {}", response.body);
        assert_eq!(response.body, r#"{"error":"bad_request"}"#);
    }
    assert_eq!(upstream.hits(), 0);
}

#[test]
fn escaped_slashes_can_be_kept_for_apis_that_need_them() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = limited(&redis, &upstream, "");
    let sluice = Sluice::start_with_server("  escaped_slashes: keep\n", &body, &[]);
    assert_eq!(sluice.get("/ids/a%2fb//c", &[]).status, 200);
    assert_eq!(upstream.targets(), vec!["/ids/a%2Fb/c"]);
}

#[test]
fn host_spellings_never_get_around_a_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&limited(&redis, &upstream, ""));

    // Absolute-form, no Host: the authority is the host; forwarded origin-form.
    let response = raw_request(
        sluice.addr,
        b"GET http://api.example.com/s/x HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(upstream.targets(), vec!["/s/x"]);
    assert_eq!(
        upstream.last_header("host").as_deref(),
        Some("api.example.com")
    );

    for host in [
        "api.example.com",
        "API.Example.COM.",
        "api.example.com:8080",
        "Api.Example.Com.:80",
    ] {
        let raw = format!("GET /s/x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let response = raw_request(sluice.addr, raw.as_bytes());
        assert_eq!(response.status, 429, "Host: {host}");
    }
    let absolute = raw_request(
        sluice.addr,
        b"GET http://API.EXAMPLE.COM./s/./x HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n",
    );
    // Pingora's parser itself refuses an authority spelt unlike its Host
    // and an upper-case scheme: 400, never a bypass.
    assert!(matches!(absolute.status, 400 | 429), "{}", absolute.status);
    let upper = raw_request(
        sluice.addr,
        b"GET HTTP://API.EXAMPLE.COM/s/x HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert!(matches!(upper.status, 400 | 429), "{}", upper.status);
    assert_eq!(upstream.hits(), 1);
}

#[test]
fn missing_repeated_or_conflicting_hosts_are_400() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&limited(&redis, &upstream, ""));

    for raw in [
        &b"GET /s/x HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
        b"GET /s/x HTTP/1.1\r\nHost: a.example\r\nHost: api.example.com\r\nConnection: close\r\n\r\n",
        b"GET http://api.example.com/s/x HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n",
        b"GET http://user@api.example.com/s/x HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET /s/x HTTP/1.1\r\nHost: api example\r\nConnection: close\r\n\r\n",
    ] {
        let response = raw_request(sluice.addr, raw);
        assert_eq!(response.status, 400, "{}", String::from_utf8_lossy(raw));
    }
    // HTTP/1.0 may omit Host.
    let old = raw_request(sluice.addr, b"GET /other HTTP/1.0\r\n\r\n");
    assert_eq!(old.status, 200);
    assert_eq!(upstream.hits(), 1);
}

fn identity_config(redis: &RedisServer, upstream: &Upstream, trusted: &str) -> String {
    format!(
        r#"
client_ip:
  trusted_proxies: ["{trusted}"]
identity:
  header: x-user-id
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: login
    match: {{ path_prefix: /login }}
    upstream: api
    limits:
      - {{ name: per-user, key: [user], limit: 1, window: 1m, on_missing: ip }}
  - name: open
    upstream: api
"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

#[test]
fn a_repeated_identity_header_is_no_identity() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&identity_config(&redis, &upstream, "127.0.0.1/32"));

    // An auth layer that appends: the client chooses the first value. Either
    // way the user is missing, so the client's IP is the key.
    let first = sluice.get(
        "/login",
        &[("X-User-Id", "rotated-1"), ("X-User-Id", "alice")],
    );
    assert_eq!(first.status, 200);
    for n in 2..5 {
        let rotated = format!("rotated-{n}");
        let again = sluice.get("/login", &[("X-User-Id", &rotated), ("X-User-Id", "alice")]);
        assert_eq!(again.status, 429, "rotation {n}");
    }
    // A single value from the trusted proxy is the user.
    assert_eq!(sluice.get("/login", &[("X-User-Id", "bob")]).status, 200);
    assert_eq!(sluice.get("/login", &[("X-User-Id", "bob")]).status, 429);
    assert_eq!(upstream.hits(), 2);
}

#[test]
fn an_untrusted_peers_identity_header_never_reaches_the_upstream() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Loopback (the test client) is not a trusted proxy here.
    let sluice = Sluice::start(&identity_config(&redis, &upstream, "192.0.2.1/32"));

    let response = sluice.get("/open", &[("X-User-Id", "admin"), ("X-Other", "kept")]);
    assert_eq!(response.status, 200);
    assert_eq!(upstream.last_header("x-user-id"), None);
    assert_eq!(upstream.last_header("x-other").as_deref(), Some("kept"));
}

#[test]
fn required_identity_guards_routes_without_limits() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let text = format!(
        r#"
identity:
  jwt: {{ algorithms: [HS256], secret_env: SLUICE_JWT_SECRET, required: true }}
limiter:
  redis: {{ url: "{url}" }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: unlimited
    upstream: api
"#,
        url = redis.url(),
        upstream = upstream.addr,
    );
    let secret = [("SLUICE_JWT_SECRET", "0123456789abcdef0123456789abcdef")];
    let sluice = Sluice::start_with_server("", &text, &secret);
    let response = sluice.get("/anything", &[]);
    assert_eq!(response.status, 401);
    let forged = sluice.get("/anything", &[("Authorization", "Bearer e30.e30.")]);
    assert_eq!(forged.status, 401);
    assert_eq!(upstream.hits(), 0);
}

#[test]
fn only_websocket_upgrades_pass_through() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&limited(&redis, &upstream, ""));

    let raw = b"GET /h2c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    let response = raw_request(sluice.addr, raw);
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(upstream.last_header("upgrade"), None);
    assert_eq!(upstream.last_header("http2-settings"), None);
    let connection = upstream.last_header("connection").unwrap_or_default();
    assert!(
        !connection.to_ascii_lowercase().contains("upgrade"),
        "Connection: {connection}"
    );
}
