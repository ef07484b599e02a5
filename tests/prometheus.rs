//! sluice's metrics through the real Prometheus tools (Debian's `prometheus`
//! package): a Prometheus server scrapes sluice and a PromQL query returns the
//! decisions the test made; `promtool` accepts `/metrics` and the shipped
//! alert rules.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn limited_sluice() -> Sluice {
    Sluice::start(
        r#"
limiter: { backend: local }
routes:
  - name: sms-send
    match: { path_prefix: /sms/ }
    respond: { status: 200, body: "sent" }
    limits:
      - name: per-ip
        key: [ip]
        limit: 5
        window: 1m
"#,
    )
}

#[test]
fn promtool_accepts_the_metrics_output() {
    let sluice = limited_sluice();
    for _ in 0..7 {
        sluice.get("/sms/send", &[]);
    }
    let metrics = sluice.metrics();
    assert!(metrics.contains("sluice_ratelimit_decisions_total"));
    let mut child = installed("promtool", "prometheus")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .expect("write metrics");
    let output = child.wait_with_output().expect("promtool output");
    assert!(
        output.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let rules = Path::new(ROOT).join("docker/alerts.yml");
    let output = installed("promtool", "prometheus")
        .arg("check")
        .arg("rules")
        .arg(&rules)
        .output()
        .expect("run promtool");
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}");
    // The alerts the operator needs are there.
    let rules = std::fs::read_to_string(&rules).unwrap();
    for alert in [
        "SluiceRedisDown",
        "SluiceRedisCircuitOpen",
        "SluiceDenyRatioSpike",
        "SluiceConfigReloadFailed",
    ] {
        assert!(
            rules.contains(&format!("alert: {alert}")),
            "{alert} missing"
        );
    }
}

/// A Prometheus server on loopback, killed on drop.
struct Prometheus {
    child: Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: std::net::SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = installed("prometheus", "prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("start prometheus");
        let prometheus = Self {
            child,
            addr,
            _dir: dir,
        };
        wait_until(Duration::from_secs(60), "prometheus to be ready", || {
            try_get(addr, "/-/ready", &[]).is_ok_and(|r| r.status == 200)
        });
        prometheus
    }

    /// Runs an instant PromQL query; returns (decision label, value) pairs.
    fn query(&self, promql: &str) -> Vec<(String, f64)> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let Ok(response) = try_get(self.addr, &path, &[]) else {
            return Vec::new();
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&response.body) else {
            return Vec::new();
        };
        json["data"]["result"]
            .as_array()
            .map(|results| {
                results
                    .iter()
                    .filter_map(|r| {
                        let label = r["metric"]["decision"].as_str()?.to_string();
                        let value = r["value"][1].as_str()?.parse().ok()?;
                        Some((label, value))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_real_prometheus_scrapes_the_decisions() {
    let sluice = limited_sluice();
    let statuses: Vec<u16> = (0..7)
        .map(|_| sluice.get("/sms/send", &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);

    let prometheus = Prometheus::start(sluice.admin);
    let query =
        r#"sum by (decision) (sluice_ratelimit_decisions_total{route="sms-send",limit="per-ip"})"#;
    let mut seen = Vec::new();
    wait_until(
        Duration::from_secs(60),
        "prometheus to scrape the decisions",
        || {
            seen = prometheus.query(query);
            seen.sort_by(|a, b| a.0.cmp(&b.0));
            !seen.is_empty()
        },
    );
    assert_eq!(
        seen,
        [("allow".to_string(), 5.0), ("deny".to_string(), 2.0)],
        "PromQL: {query}"
    );
    let up = prometheus
        .query(r#"sum by (decision) (label_replace(up{job="sluice"}, "decision", "up", "", ""))"#);
    assert_eq!(up, [("up".to_string(), 1.0)]);
}

/// The `sluice_ratelimit_decisions_total` series of limit `l`, as
/// `decision/source` pairs, sorted.
fn series_of(metrics: &str) -> Vec<String> {
    let mut pairs: Vec<String> = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_ratelimit_decisions_total{") && l.contains("limit=\"l\""))
        .map(|l| {
            let label = |name: &str| {
                let start = l.find(&format!("{name}=\"")).expect("label") + name.len() + 2;
                l[start..].split('"').next().unwrap_or("").to_string()
            };
            format!("{}/{}", label("decision"), label("source"))
        })
        .collect();
    pairs.sort();
    pairs
}

/// Only the decision/source pairs that can happen for a limit's
/// configuration are exported (no `allow` from `fail_closed`, no
/// `deny_cache` on allows, no `local` where nothing decides locally).
#[test]
fn only_series_that_can_happen_are_exported() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "backend: local",
            "",
            &["allow/local", "deny/deny_cache", "deny/local"],
        ),
        (
            "backend: local, deny_cache: false",
            "",
            &["allow/local", "deny/local"],
        ),
        (
            "on_error: deny, redis: {url: \"redis://127.0.0.1:1\"}",
            "",
            &[
                "allow/redis",
                "deny/deny_cache",
                "deny/fail_closed",
                "deny/redis",
            ],
        ),
        (
            "on_error: allow, deny_cache: false, redis: {url: \"redis://127.0.0.1:1\"}",
            ", shadow: true",
            &[
                "allow/fail_open",
                "allow/redis",
                "deny/redis",
                "shadow_deny/redis",
            ],
        ),
        (
            "on_error: local, redis: {url: \"redis://127.0.0.1:1\"}",
            ", on_limit: delay",
            &[
                "allow/local",
                "allow/redis",
                "delayed/local",
                "delayed/redis",
                "deny/deny_cache",
                "deny/local",
                "deny/redis",
            ],
        ),
        (
            "on_error: deny, redis: {url: \"redis://127.0.0.1:1\"}",
            ", algorithm: concurrency",
            &["allow/redis", "deny/fail_closed", "deny/redis"],
        ),
    ];
    for (limiter, extra, expected) in cases {
        let window = if extra.contains("concurrency") {
            ""
        } else {
            ", window: 1m"
        };
        let sluice = Sluice::start(&format!(
            "limiter: {{ {limiter} }}\nroutes:\n  - name: r\n    respond: {{}}\n    limits:\n      - {{ name: l, key: [ip], limit: 5{window}{extra} }}\n"
        ));
        assert_eq!(series_of(&sluice.metrics()), *expected, "{limiter} {extra}");
    }
}

/// The PromQL operators are given in docs/operations.md parses and runs
/// in a real Prometheus, and the decision counts it sums are the test's.
#[test]
fn the_documented_queries_run_in_prometheus() {
    let page = std::fs::read_to_string(format!("{ROOT}/docs/operations.md")).expect("read docs");
    let section = page
        .split("#### Reading the decisions")
        .nth(1)
        .expect("the section");
    let block = section.split("```").nth(1).expect("its queries");
    let queries: Vec<&str> = block
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert!(queries.len() >= 5, "{queries:?}");
    let sluice = limited_sluice();
    for _ in 0..7 {
        sluice.get("/sms/send", &[]);
    }
    let prometheus = Prometheus::start(sluice.admin);
    wait_until(Duration::from_secs(60), "a first scrape", || {
        !prometheus
            .query(r#"sum by (decision) (sluice_ratelimit_decisions_total)"#)
            .is_empty()
    });
    for query in &queries {
        let path = format!("/api/v1/query?query={}", percent_encode(query));
        let response = try_get(prometheus.addr, &path, &[]).expect("query");
        let json: serde_json::Value = serde_json::from_str(&response.body).expect("json");
        assert_eq!(json["status"], "success", "{query}: {json}");
    }
    // The first question over the whole run: 5 allowed, 2 denied.
    let summed = queries[0].replace("rate(", "(").replace("[5m]", "");
    let mut seen = prometheus.query(&summed);
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        [("allow".to_string(), 5.0), ("deny".to_string(), 2.0)],
        "{summed}"
    );
}
