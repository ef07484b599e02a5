//! When the upstream fails, sluice answers in its own voice: a JSON body
//! naming the route, 502 for an upstream that cannot be reached and 504 for
//! one that does not answer in time, counted in `sluice_requests_total`,
//! and no `Server: Pingora` (a `Server` header only when configured).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;

fn config(upstream: &str) -> String {
    format!(
        r#"
limiter: {{ backend: local }}
upstreams:
  api: {{ servers: ["{upstream}"], connect_timeout: 500ms, read_timeout: 300ms }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-ip, key: [ip], limit: 2, window: 1m }}
"#
    )
}

#[test]
fn an_unreachable_upstream_is_a_json_502_without_a_pingora_server_header() {
    // Nothing listens on this port.
    let dead = format!("127.0.0.1:{}", free_port());
    let sluice = Sluice::start(&config(&dead));
    let response = sluice.get("/orders", &[]);
    assert_eq!(response.status, 502, "{response:?}");
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&response.body).expect("JSON");
    assert_eq!(
        body,
        serde_json::json!({"error": "bad_gateway", "route": "api"})
    );
    assert_eq!(response.header("server"), None, "{:?}", response.headers);
    assert_eq!(
        metric_value(
            &sluice.metrics(),
            "sluice_requests_total{route=\"api\",status=\"502\"}"
        ),
        1
    );
    // The rate headers and the limit still apply to such requests.
    assert_eq!(sluice.get("/orders", &[]).status, 502);
    assert_eq!(sluice.get("/orders", &[]).status, 429);
}

#[test]
fn a_slow_upstream_is_a_json_504() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&upstream.addr.to_string()));
    let response = sluice.get("/slow/2000", &[]);
    assert_eq!(response.status, 504, "{response:?}");
    let body: serde_json::Value = serde_json::from_str(&response.body).expect("JSON");
    assert_eq!(
        body,
        serde_json::json!({"error": "gateway_timeout", "route": "api"})
    );
    assert_eq!(
        metric_value(
            &sluice.metrics(),
            "sluice_requests_total{route=\"api\",status=\"504\"}"
        ),
        1
    );
    assert_eq!(
        sluice.get("/fast", &[]).status,
        200,
        "the upstream is fine otherwise"
    );
}

#[test]
fn a_configured_server_header_names_every_response_sluice_writes() {
    let dead = format!("127.0.0.1:{}", free_port());
    let sluice = Sluice::start_with_server("  server_header: \"sluice\"\n", &config(&dead), &[]);
    for path in ["/a", "/b", "/c"] {
        let response = sluice.get(path, &[]);
        assert_eq!(response.header("server"), Some("sluice"), "{response:?}");
    }
    let unmatched = Sluice::start_with_server(
        "  server_header: \"sluice\"\n",
        "limiter: { backend: local }\nroutes:\n  - name: only\n    match: { path: /only }\n    respond: { status: 200, body: ok }\n",
        &[],
    );
    assert_eq!(unmatched.get("/nowhere", &[]).status, 404);
    assert_eq!(
        unmatched.get("/nowhere", &[]).header("server"),
        Some("sluice")
    );
    assert_eq!(unmatched.get("/only", &[]).header("server"), Some("sluice"));
}
