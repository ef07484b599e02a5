//! `identity.auth_request` against an auth service of the test's own (an
//! HTTP server on loopback that answers by the `Authorization` it is sent),
//! through the real binary: a 2xx admits with the user and plan it names; a
//! 401 or 403 reaches the client with the service's body and
//! `WWW-Authenticate`; a slow, failing or absent service never lets a
//! request in as anonymous on a required identity; the cache cuts the calls
//! to one per question (credential, method, target) per `cache_ttl`; the
//! service is asked about the canonical path the upstream gets, never the
//! path as the client spelled it, and a cached answer is never replayed for
//! another path or method.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The test's auth service: its port, the calls it took and the
/// `X-Original-URI`s it was sent.
struct AuthServer {
    port: u16,
    calls: Arc<AtomicUsize>,
    targets: Arc<Mutex<Vec<String>>>,
}

impl AuthServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the auth service");
        let port = listener.local_addr().unwrap().port();
        let calls = Arc::new(AtomicUsize::new(0));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let (counted, seen) = (Arc::clone(&calls), Arc::clone(&targets));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (counted, seen) = (Arc::clone(&counted), Arc::clone(&seen));
                std::thread::spawn(move || serve(stream, &counted, &seen));
            }
        });
        AuthServer {
            port,
            calls,
            targets,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Answers every request on one connection by the token it carries.
fn serve(stream: std::net::TcpStream, calls: &AtomicUsize, targets: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(&stream);
    loop {
        let (mut token, mut target, mut method) = (String::new(), String::new(), String::new());
        let mut line = String::new();
        if reader.read_line(&mut line).map_or(true, |n| n == 0) {
            return;
        }
        loop {
            line.clear();
            if reader.read_line(&mut line).map_or(true, |n| n == 0) || line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("authorization: bearer ") {
                token = value.trim().to_string();
            }
            if let Some(value) = line.strip_prefix("x-original-uri: ") {
                target = value.trim().to_string();
            }
            if let Some(value) = line.strip_prefix("x-original-method: ") {
                method = value.trim().to_string();
            }
        }
        calls.fetch_add(1, Ordering::SeqCst);
        let public_read = method == "GET" && target.starts_with("/public/");
        targets.lock().unwrap().push(target);
        let answer = match token.as_str() {
            // A token the service allows to read /public/* only.
            "scoped" if public_read => "HTTP/1.1 200 OK\r\nx-auth-user: scoped\r\nx-auth-plan: pro\r\ncontent-length: 0\r\n\r\n".to_string(),
            "scoped" => "HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n".to_string(),
            "alice" => "HTTP/1.1 200 OK\r\nx-auth-user: alice\r\nx-auth-plan: pro\r\ncontent-length: 0\r\n\r\n".to_string(),
            "bob" => "HTTP/1.1 200 OK\r\nx-auth-user: bob\r\ncontent-length: 0\r\n\r\n".to_string(),
            "nameless" => "HTTP/1.1 204 No Content\r\n\r\n".to_string(),
            "forbidden" => "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ncontent-length: 9\r\n\r\nforbidden".to_string(),
            "slow" => {
                std::thread::sleep(Duration::from_millis(1500));
                "HTTP/1.1 200 OK\r\nx-auth-user: slow\r\ncontent-length: 0\r\n\r\n".to_string()
            }
            "broken" => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n".to_string(),
            _ => {
                let body = r#"{"error":"invalid_token"}"#;
                format!(
                    "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer realm=\"test\", error=\"invalid_token\"\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
            }
        };
        let mut out = &stream;
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// sluice asking the service on `port`, with `timeout` and `cache_ttl`.
fn start(port: u16, timeout: &str, cache_ttl: &str) -> Sluice {
    Sluice::start(&config(port, timeout, cache_ttl, "respond: { body: ok }"))
}

/// The config of [`start`], the route going to `target` (`respond:` or
/// `upstream:`); an upstream at `upstream` when one is given.
fn config(port: u16, timeout: &str, cache_ttl: &str, target: &str) -> String {
    format!(
        r#"identity:
  auth_request:
    url: "http://127.0.0.1:{port}/auth"
    timeout: {timeout}
    headers: [authorization]
    user_header: x-auth-user
    plan_header: x-auth-plan
    cache_ttl: {cache_ttl}
    required: true
limiter:
  backend: local
routes:
  - name: api
    {target}
    limits:
      - {{ name: per-user, key: [user], limit: 1, window: 1m, limit_from: {{ consumer: plan }}, plans: {{ pro: 3 }} }}
"#
    )
}

/// sluice asking the service on `port` and proxying to `upstream`.
fn start_proxy(port: u16, upstream: &Upstream, cache_ttl: &str) -> Sluice {
    let body = config(port, "5s", cache_ttl, "upstream: api");
    Sluice::start(&format!(
        "upstreams:\n  api:\n    servers: [\"{}\"]\n{body}",
        upstream.addr
    ))
}

/// The status of `method path` with the `scoped` token.
fn scoped(sluice: &Sluice, method: &str, path: &str) -> u16 {
    request(
        sluice.addr,
        method,
        path,
        &[("Authorization", "Bearer scoped")],
    )
    .status
}

fn as_user(sluice: &Sluice, token: &str) -> Response {
    sluice.get(
        "/orders?page=2",
        &[("Authorization", &format!("Bearer {token}"))],
    )
}

#[test]
fn the_service_names_the_user_and_plan_and_its_refusals_reach_the_client() {
    let service = AuthServer::start();
    let sluice = start(service.port, "5s", "0s");
    let alice: Vec<u16> = (0..4).map(|_| as_user(&sluice, "alice").status).collect();
    assert_eq!(alice, [200, 200, 200, 429], "alice's plan, pro: 3");
    let bob: Vec<u16> = (0..2).map(|_| as_user(&sluice, "bob").status).collect();
    assert_eq!(bob, [200, 429], "bob has no plan: the limit's 1");
    assert!(service
        .targets
        .lock()
        .unwrap()
        .iter()
        .all(|t| t == "/orders?page=2"));

    let refused = as_user(&sluice, "mallory");
    assert_eq!(refused.status, 401);
    assert_eq!(refused.body, r#"{"error":"invalid_token"}"#);
    assert_eq!(
        refused.header("www-authenticate"),
        Some(r#"Bearer realm="test", error="invalid_token""#)
    );
    let forbidden = as_user(&sluice, "forbidden");
    assert_eq!(
        (forbidden.status, forbidden.body.as_str()),
        (403, "forbidden")
    );
    assert_eq!(
        as_user(&sluice, "nameless").status,
        401,
        "a 2xx naming no user"
    );
    assert_eq!(sluice.get("/orders", &[]).status, 401, "no credential");
    let twice = sluice.get(
        "/orders",
        &[
            ("Authorization", "Bearer alice"),
            ("Authorization", "Bearer mallory"),
        ],
    );
    assert_eq!(
        twice.status, 401,
        "a credential sent twice is not asked about"
    );
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_identity_auth_requests_total{result=\"ok\"}"
        ),
        7
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_identity_auth_requests_total{result=\"denied\"}"
        ),
        2
    );
}

#[test]
fn a_slow_failing_or_absent_service_never_admits_anonymously() {
    let service = AuthServer::start();
    // The slow answer takes 1.5 s: over a 300 ms timeout however loaded
    // the machine is.
    let sluice = start(service.port, "300ms", "0s");
    assert_eq!(as_user(&sluice, "slow").status, 503, "over the timeout");
    assert_eq!(as_user(&sluice, "broken").status, 503, "a 500");
    let down = start(free_port(), "300ms", "0s");
    assert_eq!(as_user(&down, "alice").status, 503, "nobody listening");
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_identity_auth_requests_total{result=\"timeout\"}"
        ),
        1
    );
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_identity_auth_requests_total{result=\"error\"}"
        ),
        1
    );
}

#[test]
fn the_cache_asks_once_per_credential_per_ttl() {
    let service = AuthServer::start();
    let sluice = start(service.port, "5s", "30s");
    for _ in 0..3 {
        assert_eq!(as_user(&sluice, "alice").status, 200);
    }
    assert_eq!(
        as_user(&sluice, "alice").status,
        429,
        "cached, still counted"
    );
    assert_eq!(service.calls(), 1, "one call for alice's credential");
    assert_eq!(as_user(&sluice, "bob").status, 200);
    assert_eq!(service.calls(), 2, "another credential, another call");
    // Refusals are not cached: each is asked again.
    as_user(&sluice, "mallory");
    as_user(&sluice, "mallory");
    assert_eq!(service.calls(), 4);
}

#[test]
fn the_service_is_asked_about_the_path_the_upstream_gets() {
    let service = AuthServer::start();
    let upstream = Upstream::start();
    let sluice = start_proxy(service.port, &upstream, "0s");
    assert_eq!(scoped(&sluice, "GET", "/admin/x"), 403);
    // Each spelling of /admin/x through /public/: the service must be told
    // /admin/x (and refuse), or the request refused before it is asked.
    for attack in [
        "/public/../admin/x",
        "/public/%2e%2e/admin/x",
        "/public/%2E%2E/admin/x",
        "/public/.%2e/admin/x",
        "/public/./../admin/x",
        "//public/../admin/x",
        "/public//../../admin/x",
        "/public/%2e%2e%2fadmin/x",
        "/public%2f..%2fadmin/x",
        "/public/..%5cadmin/x",
        "http://localhost/public/../admin/x",
    ] {
        let status = scoped(&sluice, "GET", attack);
        assert!(matches!(status, 400 | 403), "{attack}: {status}");
    }
    assert_eq!(upstream.hits(), 0, "nothing reached the upstream");
    let asked = service.targets.lock().unwrap().clone();
    assert!(
        asked.iter().all(|t| !t.contains("..") && !t.contains("%2")),
        "the service saw only canonical paths: {asked:?}"
    );
    // A second Host is refused before anyone is asked.
    let twice = request(
        sluice.addr,
        "GET",
        "/public/x",
        &[
            ("Authorization", "Bearer scoped"),
            ("Host", "localhost"),
            ("Host", "evil.example"),
        ],
    );
    assert_eq!(twice.status, 400, "two Host headers");
    // What is allowed goes through, the query exactly as sent.
    assert_eq!(scoped(&sluice, "GET", "/public/./x?a=%2F&b=..&c"), 200);
    assert_eq!(upstream.targets(), ["/public/x?a=%2F&b=..&c"]);
    assert_eq!(
        service.targets.lock().unwrap().last().map(String::as_str),
        Some("/public/x?a=%2F&b=..&c")
    );
}

#[test]
fn a_cached_answer_is_reused_only_for_the_same_question() {
    let service = AuthServer::start();
    let upstream = Upstream::start();
    let sluice = start_proxy(service.port, &upstream, "30s");
    assert_eq!(scoped(&sluice, "GET", "/admin/x"), 403);
    assert_eq!(scoped(&sluice, "GET", "/public/x"), 200, "asked, cached");
    assert_eq!(service.calls(), 2);
    assert_eq!(
        scoped(&sluice, "GET", "/admin/x"),
        403,
        "not the cached 2xx"
    );
    assert_eq!(scoped(&sluice, "POST", "/public/x"), 403, "another method");
    assert_eq!(
        scoped(&sluice, "GET", "/public/x?more"),
        200,
        "another query: asked"
    );
    assert_eq!(service.calls(), 5, "each new question asked");
    assert_eq!(
        scoped(&sluice, "GET", "/public/./x"),
        200,
        "the same question, cached"
    );
    assert_eq!(service.calls(), 5);
    assert_eq!(upstream.hits(), 3, "pro: 3 a minute");
}
