//! Token budgets for LLM APIs, tried with the official `openai` and
//! `anthropic` Python clients (tests/fixtures/llm_clients.py) against an
//! upstream speaking both APIs in JSON and streamed
//! (tests/fixtures/fake_llm.py), through two sluice instances sharing one
//! Redis: a request reserves its `max_tokens` before it is proxied and is
//! settled to the usage its answer reports.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The upstream: fake_llm.py on a free port, killed on drop.
struct FakeLlm {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeLlm {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests.jsonl");
        let mut child = Command::new("python3")
            .arg(fixture("fake_llm.py"))
            .arg("0")
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ready: Value = serde_json::from_str(&line).expect("the upstream's port");
        FakeLlm {
            child,
            port: ready["port"].as_u64().unwrap() as u16,
            log,
            _dir: dir,
        }
    }

    /// Every request logged so far whose `x-test-id` starts with `prefix`
    /// (every request: `""`).
    fn records(&self, prefix: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| {
                prefix.is_empty() || r["id"].as_str().is_some_and(|id| id.starts_with(prefix))
            })
            .collect()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Runs a scenario of llm_clients.py; its JSON answer.
fn clients(scenario: &str, spec: Value) -> Value {
    let output = Command::new("python3")
        .arg(fixture("llm_clients.py"))
        .arg(scenario)
        .arg(spec.to_string())
        .output()
        .expect("python3 with openai and anthropic (pip3 install openai anthropic)");
    assert!(
        output.status.success(),
        "{scenario} {spec} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{scenario}: {e}: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

const OPENAI_COST: &str = "{ response_json: /usage/total_tokens }";
const ANTHROPIC_COST: &str =
    "{ response_json: [/usage/input_tokens, /usage/output_tokens, /message/usage/input_tokens] }";

/// One route fronting an API: `prefix` + the API's path, its budget of
/// `budget` tokens per `window` keyed by the API's key header, reserved
/// by `reserve` (none: counted when the answer ends).
fn route(name: &str, api: &str, prefix: &str, budget: u64, window: &str, reserve: &str) -> String {
    // Both clients send their key as `Authorization: Bearer` (the
    // anthropic package's releases since 2026; older ones sent `x-api-key`).
    let (path, cost) = match api {
        "openai" => ("v1/chat/completions", OPENAI_COST),
        _ => ("v1/messages", ANTHROPIC_COST),
    };
    let reserve = if reserve.is_empty() {
        String::new()
    } else {
        format!("\n        reserve: {reserve}")
    };
    format!(
        "  - name: {name}
    match: {{ path: {prefix}/{path} }}
    upstream: llm
    rate_headers: openai
    errors: {api}
    limits:
      - name: tokens
        key: [{{header: authorization}}]
        limit: {budget}
        window: {window}{reserve}
        cost_from: {cost}
"
    )
}

fn config(redis: &RedisServer, upstream: &FakeLlm) -> String {
    let max_tokens =
        "{ request_json: [/max_completion_tokens, /max_tokens], default: 256, max: 4096 }";
    let routes = [
        route("openai", "openai", "", 2000, "1m", max_tokens),
        route("anthropic", "anthropic", "", 2000, "1m", max_tokens),
        route("deferred", "openai", "/deferred", 2000, "1m", ""),
        route("quick", "openai", "/quick", 300, "2s", max_tokens),
        route(
            "quick-anthropic",
            "anthropic",
            "/quick",
            300,
            "2s",
            max_tokens,
        ),
        route(
            "strict",
            "openai",
            "/strict",
            2000,
            "1m",
            "{ request_json: /max_tokens, required: true }",
        ),
    ];
    format!(
        "limiter:\n  backend: redis\n  redis:\n    url: {}\n    timeout: 500ms\nupstreams:\n  llm:\n    servers: [\"127.0.0.1:{}\"]\nroutes:\n{}",
        redis.url(),
        upstream.port,
        routes.concat()
    )
}

/// Two instances sharing one Redis, in front of one upstream.
struct Fleet {
    /// Kept for the instances' lifetime (killed on drop).
    _redis: RedisServer,
    upstream: FakeLlm,
    a: Sluice,
    b: Sluice,
}

impl Fleet {
    fn start() -> Self {
        let redis = RedisServer::start();
        let upstream = FakeLlm::start();
        let body = config(&redis, &upstream);
        let a = Sluice::start(&body);
        let b = Sluice::start(&body);
        Fleet {
            _redis: redis,
            upstream,
            a,
            b,
        }
    }

    fn url(sluice: &Sluice) -> String {
        format!("http://{}", sluice.addr)
    }

    /// Tokens the limit of `route` counts for API key `key` now.
    fn used(&self, route: &str, key: &str) -> u64 {
        let path =
            format!("/v1/usage?route={route}&limit=tokens&header.authorization=Bearer%20{key}");
        let answer = get(self.a.admin, &path, &[]);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        let usage: Value = serde_json::from_str(&answer.body).unwrap();
        usage["used"].as_u64().unwrap()
    }
}

/// The most tokens the upstream served at once for the admitted requests
/// of `records`: at each request's start, every request then in flight
/// holding its reservation `reserved` and every finished one its usage.
fn peak_held(records: &[Value], reserved: u64) -> u64 {
    let admitted: Vec<(f64, f64, u64)> = records
        .iter()
        .filter(|r| r["complete"] == true)
        .map(|r| {
            (
                r["start"].as_f64().unwrap(),
                r["end"].as_f64().unwrap(),
                r["usage"].as_u64().unwrap(),
            )
        })
        .collect();
    admitted
        .iter()
        .map(|&(at, _, _)| {
            admitted
                .iter()
                .map(|&(start, end, usage)| {
                    if end <= at {
                        usage
                    } else if start <= at {
                        reserved
                    } else {
                        0
                    }
                })
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// 50 streams of one customer at once, spread over two instances: usage
/// 20 to 100 each, `max_tokens` 100, budget 2,000 a minute.
fn burst(fleet: &Fleet, api: &str, prefix: &str, key: &str) -> (Value, Vec<Value>) {
    let usages: Vec<u64> = (0..50).map(|i| 20 + (i * 37) % 81).collect();
    let urls = [
        format!("{}{prefix}", Fleet::url(&fleet.a)),
        format!("{}{prefix}", Fleet::url(&fleet.b)),
    ];
    let spec = json!({"api": api, "urls": urls, "key": key, "n": 50, "max_tokens": 100,
        "usages": usages, "events": 6, "pace_ms": 120});
    let answer = clients("burst", spec);
    let records = fleet.upstream.records("");
    let records: Vec<Value> = records
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{prefix}/v1/"))
        })
        .collect();
    (answer, records)
}

#[test]
fn fifty_concurrent_streams_never_get_past_the_budget_and_redis_holds_their_usage() {
    let fleet = Fleet::start();
    for (api, route, key) in [
        ("openai", "openai", "exact-o"),
        ("anthropic", "anthropic", "exact-a"),
    ] {
        let (answer, records) = burst(&fleet, api, "", key);
        let results = answer["results"].as_array().unwrap();
        let admitted: Vec<&Value> = results.iter().filter(|r| r["status"] == 200).collect();
        let refused = results.iter().filter(|r| r["status"] == 429).count();
        assert_eq!(
            admitted.len() + refused,
            50,
            "{api}: only 200 or 429: {results:?}"
        );
        let upstream: Vec<&Value> = records
            .iter()
            .filter(|r| {
                r["path"].as_str().unwrap().ends_with(if api == "openai" {
                    "completions"
                } else {
                    "messages"
                })
            })
            .collect();
        assert_eq!(
            upstream.len(),
            admitted.len(),
            "{api}: only admitted requests reach the upstream"
        );
        let upstream: Vec<Value> = upstream.into_iter().cloned().collect();
        let peak = peak_held(&upstream, 100);
        let total: u64 = upstream.iter().map(|r| r["usage"].as_u64().unwrap()).sum();
        let reported: u64 = admitted.iter().map(|r| r["usage"].as_u64().unwrap()).sum();
        println!(
            "{api} reserve + settle: {} of 50 admitted, {refused} refused, peak held {peak} of 2000, usage {total}",
            admitted.len()
        );
        assert!(
            peak <= 2000,
            "{api}: {peak} tokens held at once, budget 2000"
        );
        assert!(
            admitted.len() >= 20,
            "{api}: the budget admits at least 20 reservations of 100"
        );
        assert_eq!(
            reported, total,
            "{api}: the client saw the usage the upstream reported"
        );
        assert_eq!(
            fleet.used(route, key),
            total,
            "{api}: Redis holds exactly the usage"
        );
    }
    // The same burst with the cost counted only when each answer ends.
    let (answer, records) = burst(&fleet, "openai", "/deferred", "deferred");
    let admitted = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == 200)
        .count();
    let total: u64 = records.iter().map(|r| r["usage"].as_u64().unwrap()).sum();
    let peak = peak_held(&records, 100);
    println!(
        "deferred cost_from (for comparison): {admitted} of 50 admitted, usage {total} of a 2000 budget ({:+} tokens over), peak {peak}",
        total as i64 - 2000
    );
    assert!(
        total > 2000,
        "the deferred count overshoots (that is why reserve exists): {total}"
    );
}

/// The access-log lines of `sluice` for route `route`, as JSON.
fn access_lines(sluice: &Sluice, route: &str) -> Vec<Value> {
    sluice
        .log()
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["route"] == route)
        .collect()
}

/// Waits for the `n`th access-log line of `route` on `sluice` (its request
/// ended and was settled); that line.
fn nth_line(sluice: &Sluice, route: &str, n: usize) -> Value {
    wait_until(Duration::from_secs(10), "the request's log line", || {
        access_lines(sluice, route).len() >= n
    });
    access_lines(sluice, route)[n - 1].clone()
}

fn one(fleet: &Fleet, api: &str, key: &str, extra: Value) -> Value {
    let mut spec = json!({"api": api, "url": Fleet::url(&fleet.a), "key": key,
        "max_tokens": 100, "usage": 30});
    for (name, value) in extra.as_object().unwrap() {
        spec[name] = value.clone();
    }
    clients("call", spec)
}

#[test]
fn what_the_client_saw_settles_a_stream_cut_short() {
    let fleet = Fleet::start();
    // OpenAI reports usage in the last chunk only: cut before it, the
    // reservation stands.
    let cut = json!({"api": "openai", "url": Fleet::url(&fleet.a), "key": "cut-o",
        "max_tokens": 100, "usage": 40, "events": 10, "pace_ms": 150, "after": 3});
    assert_eq!(clients("cut", cut)["events"], 3);
    let line = nth_line(&fleet.a, "openai", 1);
    assert_eq!(line["reserved"], 100, "{line}");
    assert_eq!(line["cost"], Value::Null, "no usage seen: {line}");
    assert_eq!(fleet.used("openai", "cut-o"), 100, "the reservation stands");
    // Anthropic reports the input tokens in message_start: cut after it,
    // they are what is billed.
    let cut = json!({"api": "anthropic", "url": Fleet::url(&fleet.a), "key": "cut-a",
        "max_tokens": 100, "usage": 40, "events": 10, "pace_ms": 150, "after": 3});
    assert_eq!(clients("cut", cut)["events"], 3);
    let line = nth_line(&fleet.a, "anthropic", 1);
    assert_eq!(
        (line["reserved"].as_u64(), line["cost"].as_u64()),
        (Some(100), Some(20)),
        "{line}"
    );
    assert_eq!(
        fleet.used("anthropic", "cut-a"),
        20,
        "the input tokens seen"
    );
    // The upstream saw both clients go: it logs a stream when it ends.
    wait_until(
        Duration::from_secs(10),
        "both streams to end upstream",
        || fleet.upstream.records("").len() == 2,
    );
    let records = fleet.upstream.records("");
    assert!(
        records.iter().all(|r| r["complete"] == false),
        "both streams were cut: {records:?}"
    );
}

#[test]
fn answers_without_usage_keep_the_reservation_and_requests_without_max_tokens_take_the_default() {
    let fleet = Fleet::start();
    for (api, route, stream) in [
        ("openai", "openai", false),
        ("openai", "openai", true),
        ("anthropic", "anthropic", true),
    ] {
        let key = format!("none-{api}-{stream}");
        let n = access_lines(&fleet.a, route).len() + 1;
        let answer = one(
            &fleet,
            api,
            &key,
            json!({"no_usage": true, "stream": stream}),
        );
        assert_eq!(answer["status"], 200);
        let line = nth_line(&fleet.a, route, n);
        assert_eq!(line["cost"], Value::Null, "{line}");
        assert_eq!(
            fleet.used(route, &key),
            100,
            "{api} stream={stream}: settled at the reservation"
        );
    }
    // No max_tokens: the default (256) is reserved, then settled.
    let answer = one(
        &fleet,
        "openai",
        "default",
        json!({"max_tokens": null, "stream": true}),
    );
    assert_eq!(answer["status"], 200);
    assert_eq!(
        answer["headers"]["x-ratelimit-remaining-tokens"], "1744",
        "2000 - 256 in flight"
    );
    let line = nth_line(&fleet.a, "openai", 3);
    assert_eq!(
        (line["reserved"].as_u64(), line["cost"].as_u64()),
        (Some(256), Some(30)),
        "{line}"
    );
    assert_eq!(fleet.used("openai", "default"), 30);
}

#[test]
fn a_reservation_in_flight_counts_as_used() {
    let fleet = Fleet::start();
    let spec = json!({"api": "openai", "url": Fleet::url(&fleet.a), "key": "flight",
        "max_tokens": 300, "usage": 42, "stream": true, "events": 8, "pace_ms": 250});
    let client = std::thread::spawn(move || clients("call", spec));
    wait_until(Duration::from_secs(10), "the stream to start", || {
        !fleet.upstream.records("").is_empty() || fleet.used("openai", "flight") > 0
    });
    assert_eq!(
        fleet.used("openai", "flight"),
        300,
        "/v1/usage counts the reservation"
    );
    let answer = client.join().unwrap();
    assert_eq!(answer["headers"]["x-ratelimit-remaining-tokens"], "1700");
    assert_eq!(answer["headers"]["x-ratelimit-limit-tokens"], "2000");
    nth_line(&fleet.a, "openai", 1);
    assert_eq!(fleet.used("openai", "flight"), 42, "settled to the usage");
}

#[test]
fn bodies_pass_byte_for_byte_and_bad_ones_get_the_apis_own_errors() {
    let fleet = Fleet::start();
    // A long conversation (300 KiB) reaches the upstream whole; the answer
    // the client reads is the upstream's, streamed or not.
    for (api, stream) in [("openai", false), ("openai", true), ("anthropic", true)] {
        let id = format!("bytes-{api}-{stream}");
        let answer = one(
            &fleet,
            api,
            "bytes",
            json!({"content_bytes": 300_000, "stream": stream, "id": id}),
        );
        assert_eq!(answer["status"], 200, "{answer}");
        let record = &fleet.upstream.records(&id)[0];
        assert!(answer["sent_length"].as_u64().unwrap() > 300_000);
        assert_eq!(
            record["length"], answer["sent_length"],
            "{api}: the whole body"
        );
        assert_eq!(
            record["sha256"], answer["sent_sha256"],
            "{api}: byte for byte"
        );
        assert_eq!(
            record["sent_sha256"], answer["received_sha256"],
            "{api} stream={stream}: the answer unchanged"
        );
    }
    // 2 MiB: over the route's body cap, refused before the upstream.
    let before = fleet.upstream.records("").len();
    for api in ["openai", "anthropic"] {
        let answer = one(
            &fleet,
            api,
            "large",
            json!({"content_bytes": 2 * 1024 * 1024}),
        );
        assert_eq!(answer["status"], 413, "{answer}");
        // The openai package keeps the inner `error` object as the body.
        let body = &answer["error"]["body"];
        match api {
            "openai" => assert_eq!(body["type"], "invalid_request_error", "{body}"),
            _ => assert_eq!(body["error"]["type"], "request_too_large", "{body}"),
        }
    }
    assert_eq!(
        fleet.upstream.records("").len(),
        before,
        "nothing reached the upstream"
    );
    // A body that is not JSON: the default reservation, or, where the
    // route requires the number, 400 in the API's shape.
    let post = |path: &str, body: &str| {
        let raw = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer raw\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        raw_request(fleet.a.addr, raw.as_bytes())
    };
    assert_eq!(post("/v1/chat/completions", "not json").status, 200);
    let refused = post("/strict/v1/chat/completions", "not json");
    assert_eq!(refused.status, 400);
    let body: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["code"], "bad_body");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not JSON"),
        "{body}"
    );
    let refused = post("/strict/v1/chat/completions", r#"{"max_tokens": null}"#);
    assert_eq!(refused.status, 400);
    assert!(
        refused.body.contains("does not say how many units"),
        "{}",
        refused.body
    );
    assert_eq!(
        fleet.used("strict", "raw"),
        0,
        "a refused request reserves nothing"
    );
}

#[test]
fn the_sdks_raise_their_rate_limit_error_and_a_retry_after_its_wait_succeeds() {
    let fleet = Fleet::start();
    for api in ["openai", "anthropic"] {
        // Each request reserves the whole budget (300 per 2 s): the one
        // after the first, while the first's 20 tokens count, is refused
        // however slowly the machine runs them.
        let spec = json!({"api": api, "url": format!("{}/quick", Fleet::url(&fleet.a)), "key": format!("retry-{api}"), "max_tokens": 300});
        let answer = clients("retry", spec);
        let error = &answer["error"];
        assert_eq!(error["class"], "RateLimitError", "{answer}");
        assert_eq!(error["status"], 429);
        let headers = &error["headers"];
        let wait: u64 = headers["retry-after-ms"].as_str().unwrap().parse().unwrap();
        assert!((1..=2000).contains(&wait), "within the 2 s window: {wait}");
        assert!(headers["retry-after"].as_str().is_some());
        assert_eq!(headers["x-ratelimit-limit-tokens"], "300");
        let reset = headers["x-ratelimit-reset-tokens"].as_str().unwrap();
        assert!(
            reset.ends_with("ms") || reset.ends_with('s'),
            "a Go duration: {reset}"
        );
        match api {
            "openai" => {
                // The openai package keeps the inner `error` object.
                assert_eq!(error["body"]["code"], "rate_limit_exceeded", "{error}");
                assert_eq!(error["body"]["type"], "tokens");
            }
            _ => {
                assert_eq!(error["body"]["type"], "error", "{error}");
                assert_eq!(error["body"]["error"]["type"], "rate_limit_error");
            }
        }
        assert_eq!(
            answer["retry_status"], 200,
            "{api}: the retry after retry-after-ms"
        );
    }
}

/// conf/examples/llm.yaml as shipped (only its addresses from the
/// environment): the consumer's plan sets its budgets, the OpenAI client
/// reads them, and a key the consumers file does not hold is refused in
/// OpenAI's shape.
#[test]
fn the_shipped_example_budgets_each_consumer_by_its_plan() {
    let redis = RedisServer::start();
    let upstream = FakeLlm::start();
    let root = env!("CARGO_MANIFEST_DIR");
    let config = std::fs::read_to_string(format!("{root}/conf/examples/llm.yaml")).unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let env = [
        ("SLUICE_LISTEN", addr.to_string()),
        ("SLUICE_ADMIN", admin.to_string()),
        ("SLUICE_REDIS_URL", redis.url()),
        ("SLUICE_UPSTREAM", format!("127.0.0.1:{}", upstream.port)),
        (
            "SLUICE_CONSUMERS",
            format!("{root}/conf/examples/consumers.yaml"),
        ),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice = Sluice::start_with(&config, addr, admin, &env);
    let url = format!("http://{addr}");
    for (key, requests, tokens) in [
        ("demo-globex-key", "20", "10000"),
        ("demo-acme-key", "500", "400000"),
    ] {
        let spec = json!({"api": "openai", "url": url, "key": key, "max_tokens": 500,
            "usage": 120, "stream": true});
        let answer = clients("call", spec);
        assert_eq!(answer["status"], 200, "{answer}");
        let headers = &answer["headers"];
        assert_eq!(
            headers["x-ratelimit-limit-requests"], requests,
            "{key}: {headers}"
        );
        assert_eq!(headers["x-ratelimit-limit-tokens"], tokens, "{key}");
        let left: u64 = headers["x-ratelimit-remaining-tokens"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            left,
            tokens.parse::<u64>().unwrap() - 500,
            "{key}: the reservation in flight"
        );
    }
    let anthropic = json!({"api": "anthropic", "url": url, "key": "demo-acme-key",
        "max_tokens": 300, "usage": 50, "stream": true});
    assert_eq!(clients("call", anthropic)["status"], 200);
    let wrong = json!({"api": "openai", "url": url, "key": "sk-not-a-key", "max_tokens": 5});
    let answer = clients("call", wrong);
    assert_eq!(answer["status"], 401);
    assert_eq!(answer["error"]["class"], "AuthenticationError", "{answer}");
    assert_eq!(answer["error"]["body"]["type"], "invalid_request_error");
    drop(sluice);
}

/// An answer that costs more than its reservation is charged the rest on
/// top (the overdraft), and the units are counted per limit by kind.
#[test]
fn an_answer_over_its_reservation_is_charged_its_overdraft_and_counted() {
    let fleet = Fleet::start();
    let answer = one(
        &fleet,
        "openai",
        "over",
        json!({"max_tokens": 100, "usage": 150, "stream": true}),
    );
    assert_eq!(answer["status"], 200);
    let line = nth_line(&fleet.a, "openai", 1);
    assert_eq!(
        (line["reserved"].as_u64(), line["cost"].as_u64()),
        (Some(100), Some(150)),
        "{line}"
    );
    assert_eq!(
        fleet.used("openai", "over"),
        150,
        "the overdraft is charged"
    );
    let answer = one(
        &fleet,
        "openai",
        "under",
        json!({"max_tokens": 100, "usage": 30}),
    );
    assert_eq!(answer["status"], 200);
    nth_line(&fleet.a, "openai", 2);
    let metrics = fleet.a.metrics();
    let units = |kind: &str| {
        metric_value(
            &metrics,
            &format!("sluice_ratelimit_reserve_units_total{{kind=\"{kind}\",limit=\"tokens\",route=\"openai\"}} "),
        )
    };
    assert_eq!(units("reserved"), 200);
    assert_eq!(units("overdraft"), 50);
    assert_eq!(units("given_back"), 70);
    // Limits that do not reserve have no such series.
    assert!(!metrics.contains("sluice_ratelimit_reserve_units_total{kind=\"reserved\",limit=\"tokens\",route=\"deferred\"}"));
}
