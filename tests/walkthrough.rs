//! docs/operations.md's "API keys in Redis, step by step" runs as written:
//! its commands, in order, in one shell, against a fresh Redis, a real
//! upstream and the shipped `conf/examples/api-keys-redis.yaml` — and each
//! prints what the page shows (keys, ids and times aside).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::process::Command;

/// Values that differ on every run.
const VARYING: [&str; 5] = ["key", "key_id", "revoked", "created", "reset_seconds"];

/// The commands of the walkthrough's code block, each with the output the
/// page shows for it.
fn walkthrough() -> Vec<(String, Vec<String>)> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("read docs/operations.md");
    let section = page
        .split("#### API keys in Redis, step by step")
        .nth(1)
        .expect("the walkthrough's heading");
    let block = section
        .split("```")
        .nth(1)
        .expect("the walkthrough's code block");
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    let mut continued = false;
    for line in block.lines().skip(1) {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push((command.to_string(), Vec::new()));
        } else if continued {
            let (command, _) = steps.last_mut().expect("a command");
            command.push('\n');
            command.push_str(line);
        } else if let Some((_, output)) = steps.last_mut() {
            output.push(line.to_string());
        }
        continued = line.ends_with('\\');
    }
    steps
}

/// Whether `actual` is what the page shows (`shown`): the same JSON but
/// for the [`VARYING`] values, or the same text.
fn same(shown: &str, actual: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(shown),
        serde_json::from_str::<serde_json::Value>(actual),
    ) {
        (Ok(shown), Ok(actual)) => same_json(&shown, &actual),
        _ => shown.trim_end() == actual.trim_end(),
    }
}

fn same_json(shown: &serde_json::Value, actual: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (shown, actual) {
        (Value::Object(s), Value::Object(a)) => {
            s.len() == a.len()
                && s.iter().all(|(name, value)| match a.get(name) {
                    Some(_) if VARYING.contains(&name.as_str()) => true,
                    Some(got) => same_json(value, got),
                    None => false,
                })
        }
        (Value::Array(s), Value::Array(a)) => {
            s.len() == a.len() && s.iter().zip(a).all(|(s, a)| same_json(s, a))
        }
        _ => shown == actual,
    }
}

#[test]
fn the_redis_key_store_walkthrough_runs_as_written() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let steps = walkthrough();
    assert!(steps.len() >= 12, "{steps:?}");
    let (listen, admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(
        concat!(env!("CARGO_MANIFEST_DIR"), "/conf"),
        dir.path().join("conf"),
    )
    .expect("link conf/");
    let binary_dir = std::path::Path::new(env!("CARGO_BIN_EXE_sluice"))
        .parent()
        .expect("the binary's directory");
    let mut script = String::from("set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    for (i, (command, _)) in steps.iter().enumerate() {
        let command = command
            .replace("127.0.0.1:9091", &admin)
            .replace("127.0.0.1:8080", &listen);
        script.push_str(&format!("{command}\necho '@@@ {i}'\n"));
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", format!("{}:{path}", binary_dir.display()))
        .env("SLUICE_LISTEN", &listen)
        .env("SLUICE_ADMIN", &admin)
        .env("SLUICE_REDIS_URL", redis.url())
        .env("SLUICE_UPSTREAM", upstream.addr.to_string())
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(dir.path().join("sluice.log")).unwrap_or_default();
    let context = format!(
        "stdout:\n{stdout}\nstderr:\n{}\nsluice.log:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{context}");
    let mut outputs = stdout.split("@@@ ");
    let mut before = outputs.next().unwrap_or("").to_string();
    for (i, (command, shown)) in steps.iter().enumerate() {
        let actual: Vec<&str> = before.lines().filter(|l| !l.is_empty()).collect();
        let shown: Vec<&String> = shown.iter().filter(|l| !l.is_empty()).collect();
        assert_eq!(
            actual.len(),
            shown.len(),
            "step {i} `{command}`: {actual:?}\n{context}"
        );
        for (s, a) in shown.iter().zip(&actual) {
            assert!(
                same(s, a),
                "step {i} `{command}`: shown {s}, got {a}\n{context}"
            );
        }
        let next = outputs.next().unwrap_or("");
        // What follows the marker's number is the next step's output.
        before = next
            .split_once('\n')
            .map_or("", |(_, rest)| rest)
            .to_string();
    }
    // The customer is limited in Redis, under its id, never its key.
    assert!(!redis.keys("sluice:*acme*").is_empty());
    assert!(upstream.hits() >= 6, "{context}");
}

/// The README's quick start goes build and run, `curl`, console, with the
/// build's time on 2 cores — the tests and their prerequisites in a
/// section of their own after it.
#[test]
fn the_readme_quick_start_runs_the_gateway_before_any_test() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read README.md");
    let start = readme.find("## Quick start").expect("a quick start");
    let tests = readme
        .find("## Running the tests")
        .expect("a tests section");
    assert!(start < tests);
    let quick = &readme[start..tests];
    let run = quick
        .find("cargo run --release -- --config conf/sluice.yaml")
        .expect("the run command");
    let curl = quick.find("curl ").expect("a curl");
    let console = quick.find("/console/").expect("the console");
    assert!(run < curl && curl < console, "{quick}");
    assert!(
        !quick.contains("cargo test") && !quick.contains("redis-server"),
        "{quick}"
    );
    assert!(quick.contains("on 2 cores"), "{quick}");
    assert!(readme[tests..].contains("```sh\ncargo test\n```"));
}
