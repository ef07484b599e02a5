//! `sluice --check`: bad configs are refused with `PATH:LINE:COLUMN: message`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

use std::path::Path;
use std::process::{Command, Output};

fn check(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--check")
        .arg("--config")
        .arg(path)
        .output()
        .expect("run sluice --check")
}

/// Writes `text` to a temp file, runs `--check`, and returns (exit code, stderr, path).
fn check_text(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, text).unwrap();
    let out = check(&path);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        path.display().to_string(),
    )
}

/// Runs the gateway on `text`, which it must refuse to start; its stderr.
fn refused_to_start(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(&file)
        .output()
        .expect("run sluice");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "it started:\n{stderr}");
    stderr
}

const ROUTE_HEAD: &str = "routes:\n  - name: sms\n    respond: {}\n    limits:\n";

#[test]
fn bad_configs_name_file_line_column_and_reason() {
    let cases: &[(&str, usize, &str)] = &[
        // (config, line of the problem, words the message must contain)
        ("server:\n  listen: [\"127.0.0.1:8080\"]\n  threds: 2\n", 3, "unknown field `threds`"),
        (
            "limiter:\n  redis:\n    timeout: 20\n",
            3,
            "invalid duration `20`: missing unit",
        ),
        (&format!("{ROUTE_HEAD}      - {{name: per-ip, key: [ip], limit: 0, window: 10s}}\n"), 5, "`limit` must be at least 1"),
        (&format!("{ROUTE_HEAD}      - {{name: per-ip, key: [ip], limit: 5, window: 0s}}\n"), 5, "`window` must be at least 1ms"),
        ("routes:\n  - name: a\n    respond: {}\n  - name: a\n    respond: {}\n", 4, "duplicate route name `a`"),
        ("routes:\n  - name: a\n    upstream: payments\n", 3, "unknown upstream `payments`"),
        (
            &format!("{ROUTE_HEAD}      - {{name: x, key: [ip], limit: 5, algorithm: token_bucket}}\n"),
            5,
            "needs a `window`",
        ),
        ("server:\n  tls:\n    - listen: \"127.0.0.1:8443\"\n      certs: [{cert: /nonexistent/x.pem, key: /nonexistent/x.key}]\n", 4, "cannot read `/nonexistent/x.pem`"),
        ("upstreams:\n  api:\n    servers: [\"127.0.0.1:3000\"]\n    tls: {ca_file: /nonexistent/ca.pem}\n", 4, "cannot read `/nonexistent/ca.pem`"),
        ("limiter:\n  on_error: maybe\n", 2, "unknown variant `maybe`"),
        ("routes:\n  - name: x\n    respond: {}\n    limits:\n      - {name: l, key: [cookies], limit: 1, window: 1s}\n", 5, "unknown key part `cookies`"),
        ("routes:\n  - name: x\n    respond: {}\n    limits:\n      - {name: l, key: [cookie], limit: 1, window: 1s}\n", 5, "write a cookie key part as {cookie: NAME}"),
        ("routes:\n  - name: x\n    respond: {}\n    limits:\n      - {name: l, key: [{param: id}], limit: 1, window: 1s}\n", 5, "`{param: id}` needs a templated route path"),
        ("routes:\n  - name: x\n    match: {path: \"/u/{id}\"}\n    respond: {}\n    limits:\n      - {name: l, key: [{param: user}], limit: 1, window: 1s}\n", 6, "the route's path `/u/{id}` defines no parameter `user`"),
        ("routes:\n  - name: a\n    respond: {}\n    rewrite: {strip_prefix: true}\n", 4, "`rewrite.strip_prefix` replaces the matched prefix: the route needs `match.path_prefix`"),
        ("routes:\n  - name: a\n    match: {path_prefix: /a/}\n    respond: {}\n    rewrite: {strip_prefix: true, prefix: /b/}\n", 5, "`rewrite` takes exactly one of strip_prefix, prefix or path"),
        ("routes:\n  - name: a\n    match: {path: \"/u/{id}\"}\n    respond: {}\n    rewrite:\n      path: \"/x/{user}\"\n", 6, "`rewrite.path` names `{user}`, which the route's path `/u/{id}` does not define"),
        ("routes:\n  - name: a\n    respond: {}\n    request_headers:\n      set:\n        x-a: \"{host}\"\n", 6, "`{host}` is not a variable"),
        ("routes:\n  - name: a\n    respond: {}\n    request_headers:\n      remove: [x-ok, Host]\n", 5, "`Host` cannot be set or removed here"),
        ("routes:\n  - name: a\n    respond: {}\n    response_headers:\n      add: {x-request-id: a}\n", 5, "sluice sets the request ID header itself"),
        ("routes:\n  - name: a\n    respond: {}\n    upstream_host: \"bad host\"\n", 4, "`upstream_host` is preserve, upstream or a host name"),
        ("upstreams:\n  api:\n    servers:\n      - {addr: \"127.0.0.1:1\", weight: 0}\n", 4, "`weight` must be between 1 and 1000"),
        ("upstreams:\n  api:\n    servers: [\"127.0.0.1:1\"]\n    hash_key: [ip]\n", 4, "`hash_key` chooses a server only with `balance: consistent_hash`"),
        ("routes:\n  - name: a\n    respond: {}\n    retries:\n      on: [connect_error, 404]\n", 5, "`retries.on` takes connect_error and 5xx statuses"),
        ("routes:\n  - name: a\n    respond: {}\n    retries: {attempts: 11}\n", 4, "`attempts` must be between 1 and 10"),
        (&format!("{ROUTE_HEAD}      - {{name: q, key: [ip], limit: 5, calendar: month, window: 30d}}\n"), 5, "a calendar quota has no `window`"),
        (&format!("{ROUTE_HEAD}      - {{name: q, key: [ip], limit: 5, calendar: day, algorithm: sliding_log}}\n"), 5, "`algorithm: sliding_log` cannot apply"),
        (&format!("{ROUTE_HEAD}      - {{name: q, key: [ip], limit: 5, window: 1d, timezone: Europe/Paris}}\n"), 5, "`timezone` applies to calendar quotas only"),
        (&format!("{ROUTE_HEAD}      - {{name: q, key: [ip], limit: 5, calendar: day, timezone: Europe/Pariss}}\n"), 5, "unknown time zone `Europe/Pariss`"),
        (&format!("{ROUTE_HEAD}      - {{name: q, key: [ip], limit: 5, calendar: fortnight}}\n"), 5, "unknown variant `fortnight`"),
        (&format!("{ROUTE_HEAD}      - {{name: d, key: [ip], limit: 5, algorithm: concurrency, on_limit: delay}}\n"), 5, "`on_limit: delay` cannot apply to this algorithm"),
        (&format!("{ROUTE_HEAD}      - {{name: d, key: [ip], limit: 5, calendar: day, on_limit: delay}}\n"), 5, "`on_limit: delay` cannot apply to a calendar quota"),
        (&format!("{ROUTE_HEAD}      - {{name: d, key: [ip], limit: 5, window: 1s, max_delay: 200ms}}\n"), 5, "`max_delay` applies to `on_limit: delay` only"),
        (&format!("{ROUTE_HEAD}      - {{name: d, key: [ip], limit: 5, window: 1s, on_limit: delay, max_delay: 2m}}\n"), 5, "`max_delay` must be at most 60s"),
        (&format!("{ROUTE_HEAD}      - {{name: d, key: [ip], limit: 5, window: 1s, on_limit: delay, count_when: {{status: [401]}}}}\n"), 5, "cannot apply to a limit counted by its response"),
        (&format!("{ROUTE_HEAD}      - {{name: d, key: [ip], limit: 5, window: 1s, on_limit: wait}}\n"), 5, "unknown variant `wait`"),
        ("upstreams:\n  api:\n    servers: [\"127.0.0.1:3000\"]\n    protocol: h2\n", 4, "`protocol: h2` is HTTP/2 over TLS"),
        ("routes: [\n", 2, ""),
    ];
    for (text, line, needle) in cases {
        let (code, stderr, path) = check_text(text);
        assert_eq!(code, 1, "{text}\n{stderr}");
        let prefix = format!("{path}:{line}:");
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&prefix),
            "expected `{prefix}…` for\n{text}\ngot: {stderr}"
        );
        let column = first[prefix.len()..].split(':').next().unwrap_or_default();
        assert!(column.parse::<usize>().is_ok(), "no column in {first}");
        assert!(
            stderr.contains(needle),
            "expected `{needle}` for\n{text}\ngot: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let (code, stderr, _) = check_text("routes:\n  - name: A\n    upstream: nope\n");
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 2, "{stderr}");
}

#[test]
fn missing_file_and_unset_variable() {
    let out = check(Path::new("/nonexistent/sluice.yaml"));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("/nonexistent/sluice.yaml: cannot read")
    );

    // --check goes on without a secret (a warning naming it); the
    // gateway refuses (an_unset_variable_is_a_warning_for_check_…).
    let (code, stderr, path) =
        check_text("identity:\n  jwt:\n    secret_env: SLUICE_TEST_UNSET_SECRET\n");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "{path}:3:17: warning: environment variable `SLUICE_TEST_UNSET_SECRET` (the JWT secret) is not set or empty"
        )),
        "{stderr}"
    );
}

#[test]
fn shipped_config_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--check")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("SLUICE_REDIS_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("conf/sluice.yaml: OK"), "{stdout}");
    assert!(stdout.contains("route demo"), "{stdout}");
}

/// The example of sluice in front of an existing API is valid as shipped.
#[test]
fn the_existing_api_example_is_valid() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/conf/examples/existing-api.yaml"
    );
    let out = check(Path::new(example));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The API-key example and its consumers file are valid as shipped, and
/// the example keys they name are what the consumers file hashes.
#[test]
fn the_api_keys_example_is_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--check", "--config", "conf/examples/api-keys.yaml"])
        .current_dir(root)
        .output()
        .expect("run sluice --check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let consumers = std::fs::read_to_string(format!("{root}/conf/examples/consumers.yaml"))
        .expect("read consumers.yaml");
    let hash = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["key", "hash", "demo-acme-key"])
        .output()
        .expect("run sluice key hash");
    let line = String::from_utf8_lossy(&hash.stdout).trim().to_string();
    assert!(consumers.contains(&line), "{line} not in consumers.yaml");
}

/// The identity-provider example is valid as shipped, without a warning
/// (its JWKS keys have an audience to check).
#[test]
fn the_oidc_example_is_valid() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--check", "--config", "conf/examples/oidc.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sluice --check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

/// The rate-limit service's example and its rules directory are valid as
/// shipped.
#[test]
fn the_rate_limit_service_example_is_valid() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--check", "--config", "conf/examples/rls.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sluice --check");
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(summary.contains("2 domains"), "{summary}");
    assert!(
        summary.contains("limit per_user: 60 per minute (sliding_log)"),
        "{summary}"
    );
}

/// The limits the shipped config shows as comments are valid as written:
/// uncommented, the file still passes `--check`.
#[test]
fn shipped_config_examples_are_valid() {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/sluice.yaml"))
        .expect("read conf/sluice.yaml");
    let uncommented: String = shipped
        .lines()
        .map(|line| match line.strip_prefix("      # - {") {
            Some(rest) => format!("      - {{{rest}\n"),
            None => format!("{line}\n"),
        })
        .collect();
    assert!(
        uncommented.matches("      - {").count() >= 6,
        "{uncommented}"
    );
    let (code, stderr, _) = check_text(&uncommented);
    assert_eq!(code, 0, "{stderr}");
}

/// The Redis key store's example is valid as shipped, checked without its
/// secret (CI holds none): the unset admin token is a warning naming it,
/// and the gateway itself refuses to start without it.
#[test]
fn the_redis_api_keys_example_checks_without_its_secret() {
    let run = |check: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        if check {
            command.arg("--check");
        }
        command
            .args(["--config", "conf/examples/api-keys-redis.yaml"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("SLUICE_ADMIN_TOKEN")
            .env("SLUICE_LISTEN", "127.0.0.1:1")
            .output()
            .expect("run sluice")
    };
    let out = run(true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("api-keys-redis.yaml:")
            && stderr.contains("warning: environment variable `SLUICE_ADMIN_TOKEN` (the admin token) is not set or empty (checked without it; the gateway refuses to start until it is set)"),
        "{stderr}"
    );
    let out = run(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "environment variable `SLUICE_ADMIN_TOKEN` (the admin token) is not set or empty"
        ) && !stderr.contains("warning"),
        "{stderr}"
    );
}

/// A `${VAR}` without a default that is unset: `--check` warns, naming it
/// at its line and column, and checks the rest; the gateway refuses it.
#[test]
fn an_unset_variable_is_a_warning_for_check_and_an_error_for_the_gateway() {
    let text = "limiter:\n  redis:\n    url: \"redis://:${SLUICE_TEST_UNSET_PASSWORD}@127.0.0.1:6379\"\nroutes:\n  - name: r\n    respond: {}\n";
    let (code, stderr, path) = check_text(text);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{path}:3:20: warning: environment variable `SLUICE_TEST_UNSET_PASSWORD` is not set"
        )),
        "{stderr}"
    );
    // Still checked: a real problem elsewhere is still reported.
    let (code, stderr, _) = check_text(&text.replace(
        "respond: {}",
        "respond: {}\n    limits: [{name: x, key: [ip], limit: 0, window: 1s}]",
    ));
    assert_eq!(code, 1, "{stderr}");
    // The gateway refuses to start.
    let stderr = refused_to_start(text);
    assert!(
        stderr.contains(":3:20: environment variable `SLUICE_TEST_UNSET_PASSWORD` is not set"),
        "{stderr}"
    );
}

/// The whole Redis URL from a Secret (`url: "${SLUICE_REDIS_URL}"`, as the
/// Kubernetes manifests have it): `--check` without the Secret warns and
/// checks the rest — TLS settings included — and the gateway refuses it.
#[test]
fn a_redis_url_wholly_from_an_unset_variable_is_checked_without_it() {
    let text = "limiter:\n  redis:\n    url: \"${SLUICE_TEST_UNSET_URL}\"\n    tls: {}\nroutes:\n  - name: r\n    respond: {}\n";
    let (code, stderr, path) = check_text(text);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("{path}:3:10: warning: the Redis URL is empty")),
        "{stderr}"
    );
    assert!(!stderr.contains("not a Redis URL"), "{stderr}");
    // A URL that is there but wrong is still an error; so is an empty one
    // written as such, to run.
    let (code, stderr, _) = check_text(&text.replace("${SLUICE_TEST_UNSET_URL}", "127.0.0.1:6379"));
    assert_eq!(code, 1, "{stderr}");
    let stderr = refused_to_start(&text.replace("${SLUICE_TEST_UNSET_URL}", ""));
    assert!(stderr.contains(":3:10: the Redis URL is empty"), "{stderr}");
}

/// A Redis key store with no admin token: `--check` warns that its key API
/// will refuse every call.
#[test]
fn a_redis_key_store_without_an_admin_token_is_warned_about() {
    let text = "identity:\n  api_key:\n    store: redis\nroutes:\n  - name: r\n    respond: {}\n";
    let (code, stderr, path) = check_text(text);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("{path}:3:12: warning: with store: redis, keys are made and revoked through the admin API, which needs server.admin_token_env")),
        "{stderr}"
    );
}

/// `sluice key --help` says the command is for a consumers file, and where
/// keys kept in Redis are made instead.
#[test]
fn the_key_command_says_it_is_for_the_file_store() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["key", "--help"])
        .output()
        .expect("run sluice key --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(
        help.contains("store: file") && help.contains("POST /v1/consumers/{id}/keys"),
        "{help}"
    );
}

/// Every duration unit the parser takes is in docs/configuration.md's
/// list, and each is accepted.
#[test]
fn every_duration_unit_is_documented_and_accepted() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .expect("read docs/configuration.md");
    let units = docs
        .lines()
        .skip_while(|l| !l.contains("Durations:"))
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    for unit in ["us", "ms", "s", "m", "h", "d"] {
        assert!(units.contains(&format!("`{unit}`")), "`{unit}` in: {units}");
        let (code, stderr, _) = check_text(&format!(
            "limiter:\n  backend: local\n  redis:\n    timeout: 500{unit}\n"
        ));
        assert_eq!(code, 0, "500{unit}: {stderr}");
    }
    let (code, _, _) = check_text("limiter:\n  redis:\n    timeout: 500ns\n");
    assert_eq!(code, 1, "an undocumented unit is refused");
}
