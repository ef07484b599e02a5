//! The deployment files: the Compose file validates with Debian's
//! `docker-compose`, the Dockerfile builds with the commands CI runs, the
//! alert rules pass their unit tests, the dashboard and the systemd unit
//! refer only to what sluice has.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn compose_file_validates() {
    let output = installed("docker-compose", "docker-compose")
        .args(["-f", "docker/compose.yaml", "config"])
        .current_dir(ROOT)
        .output()
        .expect("run docker-compose");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}{}",
        text,
        String::from_utf8_lossy(&output.stderr)
    );
    for service in ["redis:", "sluice:", "demo-api:", "prometheus:", "grafana:"] {
        assert!(text.contains(service), "service {service} missing:\n{text}");
    }
}

#[test]
fn dockerfile_builds_with_the_commands_ci_runs() {
    let dockerfile = read("docker/Dockerfile");
    let ci = read(".ci/run");
    let ci_lines: BTreeSet<&str> = ci.lines().map(str::trim).collect();
    let build_commands: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("RUN "))
        .filter(|c| c.starts_with("cargo ") || c.starts_with("./target/"))
        .collect();
    assert_eq!(build_commands.len(), 2, "{build_commands:?}");
    for command in build_commands {
        assert!(
            ci_lines.contains(command),
            "the Dockerfile runs `{command}` but .ci/run does not"
        );
    }
    assert!(dockerfile.contains("USER sluice"), "must run as non-root");
    assert!(dockerfile.contains("HEALTHCHECK") && dockerfile.contains("/healthz"));
    assert!(dockerfile.contains("FROM debian:bookworm-slim"));
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let output = installed("promtool", "prometheus")
        .args(["test", "rules", "docker/alerts_test.yml"])
        .current_dir(ROOT)
        .output()
        .expect("run promtool");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Metric names (`sluice_…`) a text refers to, histogram suffixes removed.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("sluice_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = name
            .strip_suffix("_bucket")
            .or_else(|| name.strip_suffix("_count"))
            .or_else(|| name.strip_suffix("_sum"))
            .unwrap_or(name);
        names.insert(name.to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn dashboard_and_alerts_use_only_metrics_sluice_exports() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("docker/grafana/sluice-dashboard.json")).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    let exprs: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    assert!(exprs.len() >= panels.len());

    let sluice = Sluice::start(
        r#"
limiter: { backend: local }
routes:
  - name: demo
    respond: { status: 200, body: "ok" }
    limits:
      - { name: per-ip, key: [ip], limit: 5, window: 10s }
      - { name: paced, key: [ip], limit: 5, window: 1s, on_limit: delay }
"#,
    );
    sluice.get("/", &[]);
    let exported = metric_names(&sluice.metrics());
    let used: BTreeSet<String> = exprs
        .iter()
        .flat_map(|e| metric_names(e))
        .chain(metric_names(&read("docker/alerts.yml")))
        .collect();
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "not exported by sluice: {unknown:?}");
    for needed in [
        "sluice_ratelimit_decisions_total",
        "sluice_request_duration_seconds",
        "sluice_redis_duration_seconds",
    ] {
        assert!(
            used.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
}

#[test]
fn systemd_unit_matches_the_binary_and_config() {
    let unit = read("conf/sluice.service");
    let value = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(String::from)
            .collect()
    };
    let pid_file = value("PIDFile");
    assert_eq!(
        value("Environment")
            .iter()
            .find_map(|e| e.strip_prefix("SLUICE_PID_FILE="))
            .map(String::from),
        pid_file.first().cloned(),
        "PIDFile must be the pid file sluice writes"
    );
    assert_eq!(value("Type"), ["forking"]);
    assert!(value("ExecStart")[0].contains("--daemon"));
    let reload = value("ExecReload");
    assert!(reload.iter().any(|c| c.contains("kill -QUIT $MAINPID")));
    assert!(reload
        .iter()
        .any(|c| c.contains("--upgrade") && c.contains("--daemon")));
    // The shipped config takes the pid file and upgrade socket from the
    // environment the unit sets.
    let config = read("conf/sluice.yaml");
    assert!(config.contains("${SLUICE_PID_FILE:-"));
    assert!(config.contains("${SLUICE_UPGRADE_SOCK:-"));
    // Every flag the unit passes is one the binary accepts.
    let help = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--help")
        .output()
        .expect("sluice --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for command in value("ExecStart")
        .iter()
        .chain(value("ExecStartPre").iter())
        .chain(reload.iter())
        .filter(|c| c.starts_with("/usr/local/bin/sluice"))
    {
        for flag in command.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(help.contains(flag), "`sluice --help` has no {flag}");
        }
    }
}
