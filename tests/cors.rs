//! CORS: sluice answers a browser's preflight itself, before any limit, and
//! marks every answer to an allowed origin (proxied, 429) readable by the
//! page, `Retry-After` and the rate-limit headers included; an origin not
//! listed gets no CORS header. Checked on the wire, then in a real browser
//! (headless Chromium) that loads a page from one origin and calls sluice
//! on another with `fetch()`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

#[path = "console/cdp.rs"]
mod cdp;
mod common;

use cdp::Chromium;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

fn config(redis: &RedisServer, upstream: SocketAddr, origin: &str) -> String {
    let url = redis.url();
    format!(
        r#"limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
upstreams:
  api:
    servers: ["{upstream}"]
routes:
  - name: api
    match: {{ path_prefix: /api/, methods: [GET, POST] }}
    upstream: api
    cors:
      origins: ["{origin}"]
      methods: [GET, POST]
      headers: [content-type, x-demo]
      max_age: 10m
    limits:
      - {{ name: per-ip, key: [ip], limit: 3, window: 1m }}
"#
    )
}

const ALLOWED: &str = "https://app.example.com";

fn preflight(sluice: &Sluice, origin: &str) -> Response {
    let headers = [
        ("Origin", origin),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "content-type"),
    ];
    request(sluice.addr, "OPTIONS", "/api/items", &headers)
}

#[test]
fn a_preflight_is_answered_by_sluice_and_counted_by_no_limit() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = Sluice::start(&config(&redis, upstream.addr, ALLOWED));
    for _ in 0..10 {
        let response = preflight(&sluice, ALLOWED);
        assert_eq!(response.status, 204, "{}", response.body);
        assert_eq!(
            response.header("access-control-allow-origin"),
            Some(ALLOWED)
        );
        assert_eq!(
            response.header("access-control-allow-methods"),
            Some("GET, POST")
        );
        assert_eq!(
            response.header("access-control-allow-headers"),
            Some("content-type, x-demo")
        );
        assert_eq!(response.header("access-control-max-age"), Some("600"));
        assert_eq!(response.header("vary"), Some("Origin"));
        assert!(response.header("x-request-id").is_some());
        assert_eq!(response.header("content-length"), None);
    }
    assert_eq!(upstream.hits(), 0, "a preflight reached the upstream");
    // The limit (3) is whole after ten preflights.
    let origin = [("Origin", ALLOWED)];
    for remaining in ["2", "1", "0"] {
        let response = request(sluice.addr, "POST", "/api/items", &origin);
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(
            response.header("access-control-allow-origin"),
            Some(ALLOWED)
        );
        let exposed = response
            .header("access-control-expose-headers")
            .unwrap_or("");
        for name in ["retry-after", "x-ratelimit-remaining", "x-request-id"] {
            assert!(exposed.contains(name), "{exposed}");
        }
    }
    let denied = request(sluice.addr, "POST", "/api/items", &origin);
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("access-control-allow-origin"), Some(ALLOWED));
    assert!(denied.header("access-control-expose-headers").is_some());
    // Preflights still answered while the limit denies.
    assert_eq!(preflight(&sluice, ALLOWED).status, 204);
}

#[test]
fn an_origin_not_listed_gets_no_cors_header() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let text = config(&redis, upstream.addr, ALLOWED).replace("limit: 3,", "limit: 100,");
    let sluice = Sluice::start(&text);
    for origin in [
        "https://evil.example.com",
        "https://app.example.com.evil.example",
        "http://app.example.com",
        "null",
    ] {
        let response = preflight(&sluice, origin);
        assert_eq!(response.status, 204);
        let response = request(sluice.addr, "GET", "/api/items", &[("Origin", origin)]);
        assert_eq!(response.status, 200);
        for (name, _) in &response.headers {
            assert!(!name.starts_with("access-control-"), "{origin}: {name}");
        }
        assert_eq!(response.header("vary"), Some("Origin"));
    }
    assert_eq!(upstream.hits(), 4, "only the GETs reach the upstream");
}

#[test]
fn an_options_that_is_not_a_preflight_goes_upstream_as_before() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = Sluice::start(
        &config(&redis, upstream.addr, ALLOWED)
            .replace("methods: [GET, POST] }", "methods: [GET, POST, OPTIONS] }"),
    );
    let response = request(sluice.addr, "OPTIONS", "/api/items", &[("Origin", ALLOWED)]);
    assert_eq!(response.status, 200);
    assert_eq!(upstream.hits(), 1);
    assert_eq!(
        response.header("access-control-allow-origin"),
        Some(ALLOWED)
    );
}

// ------------------------------------------------------------ in a browser

/// The page both origins serve. On the allowed origin it calls sluice with
/// a preflighted POST until it is denied, reads what it may, reports, and
/// goes to the other origin's page; there the same calls must be blocked.
const PAGE: &str = r#"<!doctype html><html><body><script>
const api = "http://SLUICE/api/items";
const other = "http://OTHER/";
const post = () => fetch(api, {method: "POST", body: "{}",
  headers: {"content-type": "application/json", "x-demo": "1"}});
async function allowed() {
  const out = {allowed: 0};
  try {
    for (let i = 0; i < 10; i++) {
      const r = await post();
      if (r.status === 429) {
        out.retryAfter = r.headers.get("retry-after");
        out.json = await r.json();
        break;
      }
      out.allowed++;
      if (i === 0) {
        out.remaining = r.headers.get("x-ratelimit-remaining");
        out.body = await r.text();
      }
    }
  } catch (e) { out.error = String(e); }
  return out;
}
async function blocked() {
  const out = {};
  try { await post(); out.post = "read"; } catch (e) { out.post = String(e); }
  try { await fetch(api); out.get = "read"; } catch (e) { out.get = String(e); }
  return out;
}
(async () => {
  const mine = location.host === "OTHER";
  const out = mine ? await blocked() : await allowed();
  await fetch("/report", {method: "POST", body: JSON.stringify(out)});
  if (!mine) location.href = other;
})();
</script></body></html>"#;

/// Serves [`PAGE`] on two ports (two origins) and keeps what each reports.
struct PageServer {
    reports: Arc<Mutex<Vec<(u16, String)>>>,
}

impl PageServer {
    fn start(listeners: Vec<TcpListener>, page: String) -> PageServer {
        let reports = Arc::new(Mutex::new(Vec::new()));
        for listener in listeners {
            let (reports, page) = (Arc::clone(&reports), page.clone());
            thread::spawn(move || {
                let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
                for stream in listener.incoming().flatten() {
                    if let Some(report) = serve_page(stream, &page) {
                        reports.lock().unwrap().push((port, report));
                    }
                }
            });
        }
        PageServer { reports }
    }

    fn report_from(&self, port: u16) -> Option<String> {
        let reports = self.reports.lock().unwrap();
        reports
            .iter()
            .find(|(p, _)| *p == port)
            .map(|(_, r)| r.clone())
    }
}

/// Answers one request: the page for GET, "ok" for the report (returned).
fn serve_page(stream: TcpStream, page: &str) -> Option<String> {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let (content, report) = if line.starts_with("POST /report") {
        (
            "ok".to_string(),
            Some(String::from_utf8_lossy(&body).into_owned()),
        )
    } else if line.starts_with("GET / ") {
        (page.to_string(), None)
    } else {
        (String::new(), None)
    };
    let status = if line.starts_with("GET /favicon") {
        "404 Not Found"
    } else {
        "200 OK"
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{content}",
        content.len()
    );
    let mut stream = stream;
    let _ = stream.write_all(response.as_bytes());
    report
}

#[test]
fn a_browser_page_reads_an_allowed_answer_and_is_blocked_from_another_origin() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let page_listener = TcpListener::bind("127.0.0.1:0").expect("bind page");
    let other_listener = TcpListener::bind("127.0.0.1:0").expect("bind page");
    let page_port = page_listener.local_addr().unwrap().port();
    let other_port = other_listener.local_addr().unwrap().port();
    let allowed = format!("http://127.0.0.1:{page_port}");
    let sluice = Sluice::start(&config(&redis, upstream.addr, &allowed));
    let page = PAGE
        .replace("SLUICE", &sluice.addr.to_string())
        .replace("OTHER", &format!("127.0.0.1:{other_port}"));
    let pages = PageServer::start(vec![page_listener, other_listener], page);
    let chromium = Chromium::start();
    let mut tab = chromium.tab();
    tab.open(&format!("{allowed}/"));

    let mut reports = (None, None);
    wait_until(Duration::from_secs(90), "both pages to report", || {
        reports = (pages.report_from(page_port), pages.report_from(other_port));
        reports.0.is_some() && reports.1.is_some()
    });
    let (read, blocked) = (reports.0.unwrap(), reports.1.unwrap());
    let read: serde_json::Value = serde_json::from_str(&read).expect(&read);
    // Three allowed (the preflights took nothing), then a 429 it could read.
    assert_eq!(read["allowed"], 3, "{read}");
    assert_eq!(read["remaining"], "2", "{read}");
    assert_eq!(read["body"], "upstream ok", "{read}");
    assert_eq!(read["json"]["error"], "too_many_requests", "{read}");
    assert!(
        read["retryAfter"].as_str().is_some_and(|s| !s.is_empty()),
        "{read}"
    );
    assert!(read.get("error").is_none(), "{read}");
    // The preflights were answered by sluice: the upstream saw the POSTs only.
    assert!(
        sluice.log().contains("\"method\":\"OPTIONS\""),
        "{}",
        sluice.log()
    );
    let blocked: serde_json::Value = serde_json::from_str(&blocked).expect(&blocked);
    assert!(
        blocked["post"]
            .as_str()
            .is_some_and(|s| s.contains("TypeError")),
        "{blocked}"
    );
    assert!(
        blocked["get"]
            .as_str()
            .is_some_and(|s| s.contains("TypeError")),
        "{blocked}"
    );
    assert_eq!(
        upstream.hits(),
        3,
        "the other origin's preflighted POST was sent"
    );
}
