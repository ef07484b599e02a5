//! The JSON access log of the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::{Duration, Instant};

fn config(upstream: &Upstream) -> String {
    format!(
        r#"
limiter: {{ backend: local }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: sms-send
    match: {{ path_prefix: /sms/ }}
    upstream: api
    limits:
      - name: per-ip
        key: [ip]
        limit: 1
        window: 1m
"#,
        upstream = upstream.addr
    )
}

/// The access-log lines (JSON objects) sluice wrote so far.
fn lines(sluice: &Sluice) -> Vec<serde_json::Value> {
    sluice
        .log()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn a_denied_request_names_route_and_limit_and_no_token() {
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&upstream));
    let token = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzZWNyZXQtdXNlciJ9.c2lnbmF0dXJlLXNlY3JldA";
    let bearer = format!("Bearer {token}");
    let headers = [("Authorization", bearer.as_str())];
    assert_eq!(
        sluice
            .get("/sms/send?access_token=query-secret", &headers)
            .status,
        200
    );
    assert_eq!(
        sluice
            .get("/sms/send?access_token=query-secret", &headers)
            .status,
        429
    );
    assert_eq!(sluice.get("/nowhere", &[]).status, 404);

    let mut log = Vec::new();
    wait_until(Duration::from_secs(5), "three access-log lines", || {
        log = lines(&sluice);
        log.len() >= 3
    });
    let (allowed, denied, unmatched) = (&log[0], &log[1], &log[2]);
    assert_eq!(allowed["status"], 200);
    assert_eq!(allowed["decision"], "allow");
    assert_eq!(allowed["upstream"], "api");
    assert_eq!(allowed["upstream_addr"], upstream.addr.to_string());
    assert_eq!(denied["route"], "sms-send");
    assert_eq!(denied["method"], "GET");
    assert_eq!(denied["path"], "/sms/send");
    assert_eq!(denied["status"], 429);
    assert_eq!(denied["decision"], "deny");
    assert_eq!(denied["limit"], "per-ip");
    assert_eq!(denied["source"], "local");
    assert_eq!(denied["client"], "127.0.0.1");
    assert!(denied["upstream"].is_null());
    assert!(denied["duration_ms"].as_f64().is_some());
    assert_eq!(unmatched["route"], "_unmatched");
    assert_eq!(unmatched["status"], 404);
    assert!(unmatched["decision"].is_null());

    let text = sluice.log();
    for secret in [token, "query-secret", "secret-user", "Bearer"] {
        assert!(!text.contains(secret), "the log holds `{secret}`:\n{text}");
    }
}

#[test]
fn access_log_off_writes_no_lines() {
    let upstream = Upstream::start();
    let addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let text = format!(
        "{}  access_log: off\n{}",
        server_section(addr, admin),
        config(&upstream)
    );
    let sluice = Sluice::start_with(&text, addr, admin, &[]);
    assert_eq!(sluice.get("/sms/send", &[]).status, 200);
    assert_eq!(sluice.get("/sms/send", &[]).status, 429);
    // Both requests are counted in `logging`, where their lines would be written.
    wait_until(Duration::from_secs(5), "both requests counted", || {
        let metrics = sluice.metrics();
        metric_value(
            &metrics,
            "sluice_requests_total{route=\"sms-send\",status=\"429\"} ",
        ) == 1
            && metric_value(
                &metrics,
                "sluice_requests_total{route=\"sms-send\",status=\"200\"} ",
            ) == 1
    });
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        assert!(lines(&sluice).is_empty(), "{}", sluice.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}
