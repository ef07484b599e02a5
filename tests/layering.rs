//! The dependency rules of docs/architecture.md, checked on the source: a
//! module that imports what it must not know fails this test, naming the line.
//!
//! - `limiter` knows nothing of HTTP, Pingora, the proxy or the metrics (it
//!   reports through the `RedisObserver` trait it owns);
//! - `config` knows nothing of Redis, Pingora or the limiter;
//! - `policy` and `request` decide from the request head alone: no Pingora
//!   session, no proxy, no per-request context;
//! - `target` (the canonical request target) and `sync` are pure;
//! - the rate-limit service matches and decides apart from its listener.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read source dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The lines of `files` that name any of `forbidden` as code, not in a comment.
fn offending(files: &[PathBuf], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let named = |name: &&str| {
                code.match_indices(*name).any(|(at, _)| {
                    // A whole path segment: not part of a longer identifier.
                    !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
                })
            };
            if forbidden.iter().any(named) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

fn src(part: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(part)
}

#[test]
fn the_limiter_knows_nothing_of_http_pingora_proxy_or_metrics() {
    let files = sources(&src("limiter"));
    assert!(files.len() > 5, "no limiter sources found");
    let forbidden = [
        "crate::edge::proxy",
        "crate::observe::metrics",
        "crate::edge::front_door",
        "crate::policy::rate_headers",
        "crate::policy",
        "crate::edge::context",
        "crate::request",
        "crate::observe::access_log",
        "crate::admin",
        "pingora",
        "http::",
        "prometheus",
    ];
    let found = offending(&files, &forbidden);
    assert!(
        found.is_empty(),
        "the limiter imports what it must not know:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_config_knows_nothing_of_redis_pingora_or_the_limiter() {
    let files = sources(&src("config"));
    let forbidden = [
        "redis::",
        "pingora",
        "crate::limiter",
        "crate::edge::proxy",
        "crate::policy::state",
    ];
    let found = offending(&files, &forbidden);
    assert!(
        found.is_empty(),
        "the config imports what it must not know:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_canonical_target_is_pure() {
    let files = vec![src("target.rs")];
    let forbidden = ["crate::", "pingora", "http::", "redis::", "tokio"];
    let found = offending(&files, &forbidden);
    assert!(found.is_empty(), "target.rs imports:\n{}", found.join("\n"));
}

#[test]
fn the_policy_step_never_sees_a_session() {
    let files = vec![
        src("policy.rs"),
        src("request.rs"),
        src("exempt.rs"),
        src("usage.rs"),
    ];
    let forbidden = [
        "pingora::proxy",
        "Session",
        "crate::edge::proxy",
        "crate::edge::context",
        "crate::edge::front_door",
    ];
    let found = offending(&files, &forbidden);
    assert!(
        found.is_empty(),
        "the policy step reaches into the proxy:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_lock_helpers_are_pure() {
    let found = offending(&[src("sync.rs")], &["crate::", "pingora", "tokio"]);
    assert!(found.is_empty(), "sync.rs imports:\n{}", found.join("\n"));
}

#[test]
fn exemptions_match_on_what_they_are_given() {
    let forbidden = [
        "crate::limiter",
        "crate::policy::state",
        "crate::policy",
        "pingora",
        "redis::",
    ];
    let found = offending(&[src("exempt.rs")], &forbidden);
    assert!(found.is_empty(), "exempt.rs imports:\n{}", found.join("\n"));
}

#[test]
fn the_rate_limit_service_decides_apart_from_its_transport() {
    // Which rule and which counter, and the decision: no listener, no
    // gRPC runtime, no gateway request path.
    let files = vec![src("rls/matching.rs"), src("rls/decide.rs")];
    let forbidden = [
        "pingora",
        "hyper",
        "tonic",
        "crate::edge::proxy",
        "crate::edge::context",
        "crate::policy",
        "crate::edge::front_door",
    ];
    let found = offending(&files, &forbidden);
    assert!(
        found.is_empty(),
        "the rate-limit service's decision reaches into its transport:\n{}",
        found.join("\n")
    );
}
