//! What a route changes on the way to an existing API and back: the path
//! (`rewrite`), the `Host` (`upstream_host`), header edits, request IDs and
//! the request body cap, with a real upstream and the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn forwarding_config(upstream: &Upstream) -> String {
    format!(
        r#"
client_ip: {{ trusted_proxies: [127.0.0.1/32] }}
upstreams:
  api: {{ servers: ["127.0.0.1:{port}"] }}
routes:
  - name: users
    match: {{ path_prefix: /api/users/ }}
    upstream: api
    rewrite: {{ strip_prefix: true }}
    upstream_host: upstream
    request_headers:
      set: {{ x-env: prod, x-client-ip: "{{client_ip}}", x-route: "route={{route}}" }}
      add: {{ x-trace: "{{request_id}}" }}
      remove: [x-debug]
    response_headers:
      set: {{ x-frame-options: DENY, x-seen-as: "{{client_ip}}" }}
      remove: [x-powered-by]
  - name: v1
    match: {{ path_prefix: /v1/ }}
    upstream: api
    rewrite: {{ prefix: /v2/ }}
    upstream_host: api.internal
  - name: items
    match: {{ path: "/items/{{id}}/price" }}
    upstream: api
    rewrite: {{ path: "/internal/items/{{id}}" }}
  - name: plain
    upstream: api
"#,
        port = upstream.addr.port()
    )
}

#[test]
fn a_rewritten_path_keeps_the_query_as_sent() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&forwarding_config(&upstream));
    let cases = [
        ("/api/users/7?x=1&y=%2F", "/7?x=1&y=%2F"),
        ("/api/users/", "/"),
        // Made canonical first, then rewritten.
        ("/api/users/a/../b//c?q", "/b/c?q"),
        ("/v1/orders/9?z", "/v2/orders/9?z"),
        (
            "/items/42/price?currency=eur",
            "/internal/items/42?currency=eur",
        ),
        ("/other/path?a", "/other/path?a"),
    ];
    for (sent, _) in cases {
        assert_eq!(sluice.get(sent, &[]).status, 200, "{sent}");
    }
    let expected: Vec<&str> = cases.iter().map(|(_, got)| *got).collect();
    assert_eq!(upstream.targets(), expected);
    // A path that leaves the prefix by `..` is not the route's: not stripped.
    assert_eq!(sluice.get("/api/users/../admin", &[]).status, 200);
    assert_eq!(
        upstream.targets().last().map(String::as_str),
        Some("/api/admin")
    );
}

#[test]
fn the_upstream_gets_the_host_and_headers_the_route_says() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&forwarding_config(&upstream));
    let response = sluice.get(
        "/api/users/7",
        &[
            ("Host", "public.example.com"),
            ("X-Debug", "1"),
            ("X-Env", "forged"),
            ("X-Trace", "client"),
            ("X-Forwarded-For", "203.0.113.9"),
        ],
    );
    assert_eq!(response.status, 200);
    let port = upstream.addr.port();
    assert_eq!(
        upstream.last_header("host"),
        Some(format!("127.0.0.1:{port}"))
    );
    assert_eq!(upstream.last_header("x-debug"), None);
    assert_eq!(upstream.last_header("x-env").as_deref(), Some("prod"));
    assert_eq!(
        upstream.last_header("x-client-ip").as_deref(),
        Some("203.0.113.9")
    );
    assert_eq!(
        upstream.last_header("x-route").as_deref(),
        Some("route=users")
    );
    let id = response
        .header("x-request-id")
        .expect("a request id")
        .to_string();
    // `add` appends to the client's value.
    assert_eq!(upstream.last_header("x-trace").as_deref(), Some("client"));
    assert_eq!(upstream.last_header("x-request-id"), Some(id));
    // The response: the upstream's X-Powered-By gone, the route's header set.
    assert_eq!(response.header("x-powered-by"), None);
    assert_eq!(response.header("x-frame-options"), Some("DENY"));
    assert_eq!(response.header("x-seen-as"), Some("203.0.113.9"));

    assert_eq!(
        sluice
            .get("/v1/x", &[("Host", "public.example.com")])
            .status,
        200
    );
    assert_eq!(
        upstream.last_header("host").as_deref(),
        Some("api.internal")
    );
    // Without upstream_host the client's Host is preserved.
    assert_eq!(
        sluice.get("/p", &[("Host", "public.example.com")]).status,
        200
    );
    assert_eq!(
        upstream.last_header("host").as_deref(),
        Some("public.example.com")
    );
    assert_eq!(
        sluice.get("/p", &[]).header("x-powered-by"),
        Some("test-upstream")
    );
}

fn limited_config(upstream: &Upstream, redis: &RedisServer, trusted: &str) -> String {
    format!(
        r#"
client_ip: {{ trusted_proxies: [{trusted}] }}
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
upstreams:
  api: {{ servers: ["{addr}"] }}
  gone: {{ servers: ["127.0.0.1:{closed}"] }}
routes:
  - name: limited
    match: {{ path_prefix: /limited }}
    upstream: api
    limits: [{{ name: one, key: [ip], limit: 1, window: 1m }}]
  - name: broken
    match: {{ path_prefix: /broken }}
    upstream: gone
  - name: api
    match: {{ path_prefix: /api }}
    upstream: api
"#,
        url = redis.url(),
        addr = upstream.addr,
        closed = free_port(),
    )
}

#[test]
fn every_answer_carries_the_request_id_the_log_and_the_upstream_see() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // 127.0.0.2 is trusted, not this client: its IDs are replaced.
    let sluice = Sluice::start(&limited_config(&upstream, &redis, "127.0.0.2/32"));
    let ok = sluice.get("/limited", &[("X-Request-Id", "chosen-by-client")]);
    let denied = sluice.get("/limited", &[]);
    let bad_gateway = sluice.get("/broken", &[]);
    let not_found = sluice.get("/nowhere", &[]);
    assert_eq!(
        [
            ok.status,
            denied.status,
            bad_gateway.status,
            not_found.status
        ],
        [200, 429, 502, 404]
    );
    let mut ids = Vec::new();
    for response in [&ok, &denied, &bad_gateway, &not_found] {
        let id = response
            .header("x-request-id")
            .expect("an id on every answer");
        assert_eq!(id.len(), 36, "a UUID: {id}");
        assert_ne!(id, "chosen-by-client");
        ids.push(id.to_string());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "each request its own id");
    assert_eq!(
        upstream.last_header("x-request-id").as_deref(),
        ok.header("x-request-id")
    );
    let denied_id = denied
        .header("x-request-id")
        .unwrap_or_default()
        .to_string();
    wait_until(Duration::from_secs(5), "the 429's log line", || {
        sluice.log().lines().any(|line| {
            line.contains(&format!("\"request_id\":\"{denied_id}\""))
                && line.contains("\"status\":429")
        })
    });
}

#[test]
fn a_trusted_proxy_chooses_the_request_id() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&limited_config(&upstream, &redis, "127.0.0.1/32"));
    let response = sluice.get("/api", &[("X-Request-Id", "edge-42")]);
    assert_eq!(response.header("x-request-id"), Some("edge-42"));
    assert_eq!(
        upstream.last_header("x-request-id").as_deref(),
        Some("edge-42")
    );
    // Not an ID: a space, or sent twice.
    let spaced = sluice.get("/api", &[("X-Request-Id", "a b")]);
    assert_eq!(spaced.header("x-request-id").map(str::len), Some(36));
    let twice = sluice.get("/api", &[("X-Request-Id", "a"), ("X-Request-Id", "b")]);
    assert_eq!(twice.header("x-request-id").map(str::len), Some(36));
}

fn capped_config(upstream: &Upstream) -> String {
    format!(
        r#"
upstreams:
  api: {{ servers: ["{addr}"] }}
routes:
  - name: uploads
    match: {{ path_prefix: /uploads }}
    upstream: api
    max_body_bytes: 4096
  - name: api
    upstream: api
"#,
        addr = upstream.addr
    )
}

/// Sends `head` and then `body` in pieces, and reads the answer.
fn send_in_pieces(sluice: &Sluice, head: &str, body: &[&[u8]]) -> (Response, bool) {
    let mut stream = TcpStream::connect(sluice.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream.write_all(head.as_bytes()).expect("head");
    for piece in body {
        // The gateway may refuse and close before the body is all sent.
        if stream.write_all(piece).is_err() {
            break;
        }
    }
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            // Reset after the answer: closed too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&bytes).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let response = Response {
        status,
        headers: Vec::new(),
        body: text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
        elapsed: Duration::ZERO,
    };
    (response, closed)
}

#[test]
fn a_body_over_the_cap_is_refused_before_the_upstream_in_both_framings() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&capped_config(&upstream));
    // Declared too long: refused at once, nothing sent upstream.
    let head = "POST /uploads/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n";
    let body = vec![b'x'; 5000];
    let (response, closed) = send_in_pieces(&sluice, head, &[&body]);
    assert_eq!(response.status, 413);
    assert!(
        response.body.contains("\"error\":\"payload_too_large\""),
        "{}",
        response.body
    );
    assert!(
        response.body.contains("\"route\":\"uploads\""),
        "{}",
        response.body
    );
    assert!(closed, "the connection is closed, its body unread");
    assert_eq!(upstream.hits(), 0);

    // Chunked, crossing the cap in its second chunk: cut and refused.
    let head = "POST /uploads/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    let chunk = format!("bb8\r\n{}\r\n", "y".repeat(3000));
    let (response, closed) = send_in_pieces(
        &sluice,
        head,
        &[chunk.as_bytes(), chunk.as_bytes(), b"0\r\n\r\n"],
    );
    assert_eq!(response.status, 413, "{}", response.body);
    assert!(closed);
    assert_eq!(upstream.hits(), 0, "the upstream never answered a cut body");

    // Under the cap, in either framing: proxied.
    let head = "POST /uploads/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    let (response, _) = send_in_pieces(&sluice, head, &[chunk.as_bytes(), b"0\r\n\r\n"]);
    assert_eq!(response.status, 200);
    // The server's default cap (1 MiB) for other routes.
    let head = "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 1048577\r\n\r\n";
    let (response, _) = send_in_pieces(&sluice, head, &[]);
    assert_eq!(response.status, 413);
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_downstream_rejected_total{reason=\"body_too_large\"}"
        ),
        3
    );
}
