//! API keys (`identity.api_key`, file store) against real Redis, a real
//! upstream and two sluice instances: per-consumer limits from the
//! consumer's plan, exact across both; the key never reaches the upstream
//! or the log; invented keys end in 429 and leave no counter of their own;
//! the consumers file reloads with the config.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::path::Path;
use std::time::Duration;

const ACME_KEY: &str = "acme-key-0123456789abcdef0123456789";
const GLOBEX_KEY: &str = "globex-key-0123456789abcdef012345678";

/// `sluice key hash KEY`, run as a user would.
fn key_line(key: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["key", "hash", key])
        .output()
        .expect("sluice key hash");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string()
}

fn write_consumers(path: &Path, consumers: &[(&str, &str, &str)]) {
    let mut text = String::from("consumers:\n");
    for (id, plan, key) in consumers {
        text.push_str(&format!(
            "  - id: {id}\n    plan: {plan}\n    keys: [\"{}\"]\n",
            key_line(key)
        ));
    }
    std::fs::write(path, text).expect("write consumers");
}

fn config(redis: &RedisServer, upstream: &Upstream, consumers: &Path, required: bool) -> String {
    format!(
        r#"identity:
  api_key:
    header: x-api-key
    file: "{file}"
    required: {required}
    failures: {{ limit: 20, window: 1m }}
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-consumer, key: [user], limit_from: {{ consumer: plan }}, plans: {{ free: 3, pro: 6 }}, limit: 1000, window: 1m }}
"#,
        file = consumers.display(),
        url = redis.url(),
        upstream = upstream.addr,
    )
}

fn with_key(sluice: &Sluice, key: &str) -> Response {
    sluice.get("/orders", &[("X-Api-Key", key)])
}

#[test]
fn a_consumers_plan_limits_it_exactly_across_two_instances_and_its_key_stays_at_the_gateway() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    write_consumers(
        &consumers,
        &[("acme", "pro", ACME_KEY), ("globex", "free", GLOBEX_KEY)],
    );
    let text = config(&redis, &upstream, &consumers, false);
    let (a, b) = (Sluice::start(&text), Sluice::start(&text));
    let mut admitted = [0, 0];
    for i in 0..20 {
        let sluice = if i % 2 == 0 { &a } else { &b };
        for (n, key) in [ACME_KEY, GLOBEX_KEY].iter().enumerate() {
            let response = with_key(sluice, key);
            if response.status == 200 {
                admitted[n] += 1;
                let limit = if n == 0 { "6" } else { "3" };
                assert_eq!(response.header("x-ratelimit-limit"), Some(limit));
            } else {
                assert_eq!(response.status, 429, "{}", response.body);
            }
        }
    }
    assert_eq!(
        admitted,
        [6, 3],
        "pro and free plans, across both instances"
    );

    // The upstream sees the consumer, never the key, and never a
    // consumer id the client made up.
    let fresh = Sluice::start(&config(&redis, &upstream, &consumers, false).replace(
        "plans: { free: 3, pro: 6 }",
        "plans: { free: 300, pro: 600 }",
    ));
    let response = fresh.get(
        "/x",
        &[("X-Api-Key", ACME_KEY), ("X-Consumer-Id", "globex")],
    );
    assert_eq!(response.status, 200);
    assert_eq!(
        upstream.last_header("x-consumer-id").as_deref(),
        Some("acme")
    );
    assert_eq!(upstream.last_header("x-api-key"), None);
    let response = fresh.get("/x", &[("X-Consumer-Id", "globex")]);
    assert_eq!(response.status, 200);
    assert_eq!(
        upstream.last_header("x-consumer-id"),
        None,
        "a forged consumer id went upstream"
    );
    for sluice in [&a, &b, &fresh] {
        let log = sluice.log();
        assert!(
            !log.contains(ACME_KEY) && !log.contains(GLOBEX_KEY),
            "a key in the log:\n{log}"
        );
    }
    // The access log is written by its own thread: wait for the line.
    wait_until(Duration::from_secs(10), "the access log line", || {
        fresh.log().contains("\"consumer\":\"acme\"")
    });
    assert!(
        a.metrics()
            .contains("sluice_identity_lookups_total{result=\"hit\",store=\"file\"} 20"),
        "{}",
        a.metrics()
    );
}

#[test]
fn invented_keys_end_in_429_and_leave_no_counter_of_their_own() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    write_consumers(&consumers, &[("acme", "pro", ACME_KEY)]);
    let sluice = Sluice::start(&config(&redis, &upstream, &consumers, false));
    let before = redis.command_calls("evalsha");
    let statuses: Vec<u16> = (0..1000)
        .map(|i| with_key(&sluice, &format!("invented-{i:04}")).status)
        .collect();
    // The first 20 are anonymous requests (on_missing: ip), then 429.
    assert!(
        statuses[..20].iter().all(|s| *s == 200),
        "{:?}",
        &statuses[..20]
    );
    assert!(
        statuses[20..].iter().all(|s| *s == 429),
        "{:?}",
        &statuses[20..40]
    );
    let denied = with_key(&sluice, "invented-again");
    assert_eq!(denied.status, 429);
    assert!(denied.body.contains("api_key_failures"), "{}", denied.body);
    assert!(denied.header("retry-after").is_some());
    // Over its failures, the client's valid key is refused too: a right
    // guess among wrong ones is not told apart.
    assert_eq!(with_key(&sluice, ACME_KEY).status, 429);
    // No counter per invented key: the failures counter and the IP's.
    let keys = redis.keys("*");
    assert!(
        keys.len() <= 2,
        "{:?}",
        keys.iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect::<Vec<_>>()
    );
    assert!(keys
        .iter()
        .all(|k| !String::from_utf8_lossy(k).contains("invented")));
    // At most one Redis call per invented key (the deny cache answers the rest).
    let calls = redis.command_calls("evalsha") - before;
    assert!(
        calls <= 1000 + 40,
        "{calls} Redis calls for 1,000 invented keys"
    );
    let metrics = sluice.metrics();
    assert!(
        metrics.contains("sluice_identity_failures_total 1001"),
        "{metrics}"
    );
}

#[test]
fn a_required_key_is_401_without_one_and_the_file_reloads_on_sighup() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    write_consumers(&consumers, &[("acme", "pro", ACME_KEY)]);
    let text = config(&redis, &upstream, &consumers, true);
    let sluice = Sluice::start(&text);
    assert_eq!(sluice.get("/x", &[]).status, 401);
    assert_eq!(with_key(&sluice, GLOBEX_KEY).status, 401);
    assert_eq!(with_key(&sluice, ACME_KEY).status, 200);
    // globex is added to the file: a reload makes its key work, and one
    // removed (acme's) stops working.
    write_consumers(&consumers, &[("globex", "free", GLOBEX_KEY)]);
    assert!(sluice.reload(&text));
    assert_eq!(with_key(&sluice, GLOBEX_KEY).status, 200);
    assert_eq!(with_key(&sluice, ACME_KEY).status, 401);
}

#[test]
fn a_consumers_file_is_checked_at_its_own_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    let good = key_line(ACME_KEY);
    std::fs::write(
        &consumers,
        format!("consumers:\n  - id: acme\n    plan: gold\n    keys: [\"{good}\"]\n  - id: acme\n    keys: [\"{ACME_KEY}\", \"{good}\"]\n"),
    )
    .unwrap();
    let config = dir.path().join("sluice.yaml");
    std::fs::write(
        &config,
        format!(
            "identity:\n  api_key:\n    file: \"{}\"\nroutes:\n  - name: a\n    respond: {{}}\n",
            consumers.display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--check", "--config"])
        .arg(&config)
        .output()
        .expect("sluice --check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let at = |line: u32, column: u32| format!("{}:{line}:{column}: ", consumers.display());
    assert!(
        stderr.contains(&format!("{}consumer `acme` is listed twice", at(5, 9))),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{}a key is written as `sha256:`", at(6, 12))),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{}this key is listed twice",
            at(6, 12 + ACME_KEY.len() as u32 + 4)
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains(ACME_KEY),
        "the key itself was printed: {stderr}"
    );
}

#[test]
fn a_key_in_the_query_is_read_there_and_removed_from_what_goes_upstream() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    write_consumers(&consumers, &[("acme", "pro", ACME_KEY)]);
    let text =
        config(&redis, &upstream, &consumers, true).replace("header: x-api-key", "query: api_key");
    let sluice = Sluice::start(&text);
    let response = sluice.get(&format!("/orders?page=2&api_key={ACME_KEY}&sort=asc"), &[]);
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.header("x-ratelimit-limit"), Some("6"));
    assert_eq!(
        upstream.targets().last().map(String::as_str),
        Some("/orders?page=2&sort=asc")
    );
    assert_eq!(
        upstream.last_header("x-consumer-id").as_deref(),
        Some("acme")
    );
    // Percent-encoded, the same key; in a header, no key at all.
    let encoded = ACME_KEY.replace('-', "%2D");
    assert_eq!(
        sluice
            .get(&format!("/orders?api%5Fkey={encoded}"), &[])
            .status,
        200
    );
    assert_eq!(
        upstream.targets().last().map(String::as_str),
        Some("/orders")
    );
    assert_eq!(
        sluice.get("/orders", &[("X-Api-Key", ACME_KEY)]).status,
        401
    );
    wait_until(Duration::from_secs(10), "the access log lines", || {
        sluice.log().matches("\"consumer\":\"acme\"").count() == 2
    });
    assert!(!sluice.log().contains(ACME_KEY));
}

#[test]
fn a_key_in_the_query_stays_out_of_the_error_log_of_a_failed_upstream() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    write_consumers(&consumers, &[("acme", "pro", ACME_KEY)]);
    let dead = Upstream::start();
    let text = config(&redis, &dead, &consumers, false)
        .replace("header: x-api-key", "query: api_key")
        .replace(
            &dead.addr.to_string(),
            &format!("127.0.0.1:{}", free_port()),
        );
    drop(dead);
    let sluice = Sluice::start(&text);
    let response = sluice.get(&format!("/orders?api_key={ACME_KEY}"), &[]);
    assert_eq!(response.status, 502, "{}", response.body);
    let id = response
        .header("x-request-id")
        .expect("request id")
        .to_string();
    // The error line names the request by path and ID, not by its query.
    wait_until(Duration::from_secs(10), "the error log line", || {
        sluice.log().contains(&format!(
            "GET /orders, Host: {}, request ID: {id}",
            sluice.addr
        ))
    });
    assert!(!sluice.log().contains(ACME_KEY), "{}", sluice.log());
}
