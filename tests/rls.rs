//! The rate-limit service (`server.rls`) against a real gRPC client built
//! from Envoy's own `rls.proto` (Python grpcio, tests/fixtures/rls_client.py),
//! real Redis servers and the real binary, with rules written in
//! envoyproxy/ratelimit's format.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::{free_port, metric_value, wait_until, RedisServer, Sluice};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// envoyproxy/ratelimit's `examples/ratelimit/config/example.yaml`
/// (Apache-2.0), as it is: nested descriptors, keys without a value,
/// `unlimited`, `shadow_mode`, a banned value.
const EXAMPLE: &str = "---
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: banned
        rate_limit:
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: bay
        rate_limit:
          unlimited: true
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 1
        shadow_mode: true
  - key: qux
    rate_limit:
      unlimited: true
";

/// envoyproxy/ratelimit's `examples/ratelimit/config/config.yaml`, as it is.
const MONGO: &str = "---
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: minute
      requests_per_unit: 5

  - key: database
    value: default
    rate_limit:
      unit: minute
      requests_per_unit: 5
";

/// A third file, sluice's own: `name` and `replaces`.
const ACCOUNTS: &str = "domain: accounts
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: per_user
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces:
        - name: per_user
";

/// A gRPC client of the service (a Python process answering JSON lines).
struct RlsClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl RlsClient {
    fn start() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new("python3")
            .arg(root.join("tests/fixtures/rls_client.py"))
            .arg(root.join("proto"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with grpcio and grpcio-tools (pip3 install grpcio grpcio-tools)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut client = Self {
            child,
            stdin,
            stdout,
        };
        let ready = client.read();
        assert_eq!(ready["ready"], true, "client did not start: {ready}");
        client
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read client");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad client line {line:?}: {e}"))
    }

    /// One `ShouldRateLimit` call: `call` holds the target, the domain and
    /// the descriptors (see the fixture).
    fn call(&mut self, call: Value) -> Value {
        writeln!(self.stdin, "{call}").expect("write client");
        self.stdin.flush().expect("flush client");
        self.read()
    }

    /// A call with one descriptor of `entries` in `domain`.
    fn one(&mut self, target: SocketAddr, domain: &str, entries: &[(&str, &str)]) -> Value {
        self.call(json!({
            "target": target.to_string(),
            "domain": domain,
            "descriptors": [{"entries": entries}],
        }))
    }
}

impl Drop for RlsClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory holding `files` (name, text).
fn rules_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write rules");
    }
    dir
}

/// A sluice with a proxy listener and the rate-limit service on `rls`,
/// its rules in `rules`, and `body` (limiter and the rest).
fn start(rls: SocketAddr, rules: &Path, extra: &str, body: &str) -> Sluice {
    let server = format!(
        "  rls:\n    listen: \"{rls}\"\n    config: \"{}\"\n{extra}",
        rules.display()
    );
    let sluice = Sluice::start_with_server(&server, body, &[]);
    wait_until(Duration::from_secs(10), "the rls listener", || {
        std::net::TcpStream::connect(rls).is_ok()
    });
    sluice
}

fn addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().expect("addr")
}

fn redis_body(redis: &RedisServer, on_error: &str) -> String {
    format!(
        "limiter:\n  redis:\n    url: \"{}\"\n    timeout: 2s\n  on_error: {on_error}\n",
        redis.url()
    )
}

fn overall(answer: &Value) -> &str {
    answer["overall"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer: {answer}"))
}

fn code(answer: &Value, i: usize) -> &str {
    answer["statuses"][i]["code"].as_str().unwrap_or("?")
}

#[test]
fn envoyproxy_ratelimit_example_rules_are_served_unchanged() {
    let redis = RedisServer::start();
    let rules = rules_dir(&[
        ("example.yaml", EXAMPLE),
        ("config.yaml", MONGO),
        ("accounts.yaml", ACCOUNTS),
    ]);
    let rls = addr();
    let sluice = start(rls, rules.path(), "", &redis_body(&redis, "deny"));
    let mut client = RlsClient::start();

    // Nested: the limit sits on the second entry.
    let nested = [("source_cluster", "proxy"), ("destination_cluster", "mock")];
    let first = client.one(rls, "rl", &nested);
    assert_eq!(overall(&first), "OK", "{first}");
    assert_eq!(first["statuses"][0]["limit"], 1);
    assert_eq!(first["statuses"][0]["unit"], "MINUTE");
    assert_eq!(first["statuses"][0]["remaining"], 0);
    assert_eq!(first["headers"]["RateLimit-Limit"], "1", "{first}");
    assert_eq!(first["headers"]["RateLimit-Remaining"], "0");
    assert_eq!(overall(&client.one(rls, "rl", &nested)), "OVER_LIMIT");
    // The first entry alone has no limit.
    let partial = client.one(rls, "rl", &[("source_cluster", "proxy")]);
    assert_eq!(overall(&partial), "OK");
    assert!(partial["statuses"][0].get("limit").is_none(), "{partial}");

    // A key without a value counts each value apart.
    for _ in 0..2 {
        assert_eq!(overall(&client.one(rls, "rl", &[("foo", "a")])), "OK");
    }
    assert_eq!(
        overall(&client.one(rls, "rl", &[("foo", "a")])),
        "OVER_LIMIT"
    );
    assert_eq!(overall(&client.one(rls, "rl", &[("foo", "b")])), "OK");
    // key + value beats the key alone: `bar: banned` is 0 per minute.
    let banned = client.one(rls, "rl", &[("foo", "x"), ("bar", "banned")]);
    assert_eq!(overall(&banned), "OVER_LIMIT", "{banned}");
    assert_eq!(banned["statuses"][0]["limit"], 0);
    let other = client.one(rls, "rl", &[("foo", "x"), ("bar", "fine")]);
    assert_eq!(other["statuses"][0]["limit"], 3, "{other}");
    let per_second = client.one(rls, "rl", &[("foo", "x"), ("baz", "plain")]);
    assert_eq!(per_second["statuses"][0]["unit"], "SECOND", "{per_second}");

    // Unlimited, at the root and nested.
    for _ in 0..5 {
        let qux = client.one(rls, "rl", &[("qux", "any")]);
        assert_eq!(overall(&qux), "OK");
        assert_eq!(qux["statuses"][0]["remaining"], u64::from(u32::MAX));
        assert_eq!(
            overall(&client.one(rls, "rl", &[("foo", "x"), ("bay", "y")])),
            "OK"
        );
    }

    // Shadow mode: over its limit of 1, still OK, and counted as such.
    for _ in 0..3 {
        let shady = client.one(rls, "rl", &[("foo", "x"), ("baz", "shady")]);
        assert_eq!(overall(&shady), "OK", "{shady}");
    }
    assert_eq!(
        sluice.decisions("rl", "foo.baz_shady", "shadow_deny", "redis"),
        2
    );
    assert_eq!(sluice.decisions("rl", "foo.baz_shady", "allow", "redis"), 1);
    assert_eq!(
        sluice.decisions(
            "rl",
            "source_cluster_proxy.destination_cluster_mock",
            "deny",
            "redis"
        ),
        1
    );

    // `replaces`: with `vip` in the request, `per_user` does not apply.
    for _ in 0..5 {
        assert_eq!(
            overall(&client.one(rls, "accounts", &[("user", "u1")])),
            "OK"
        );
    }
    assert_eq!(
        overall(&client.one(rls, "accounts", &[("user", "u1")])),
        "OVER_LIMIT"
    );
    let both = client.call(json!({
        "target": rls.to_string(), "domain": "accounts",
        "descriptors": [{"entries": [["user", "u1"]]}, {"entries": [["vip", "u1"]]}],
    }));
    assert_eq!(overall(&both), "OK", "{both}");
    assert!(both["statuses"][0].get("limit").is_none(), "{both}");
    assert_eq!(both["statuses"][1]["limit"], 100);

    // The second file's domain; an unknown domain has no limit.
    for _ in 0..5 {
        assert_eq!(
            overall(&client.one(rls, "mongo_cps", &[("database", "users")])),
            "OK"
        );
    }
    assert_eq!(
        overall(&client.one(rls, "mongo_cps", &[("database", "users")])),
        "OVER_LIMIT"
    );
    assert_eq!(
        overall(&client.one(rls, "mongo_cps", &[("database", "default")])),
        "OK"
    );
    assert_eq!(
        overall(&client.one(rls, "nowhere", &[("database", "users")])),
        "OK"
    );

    // Malformed requests are refused, not crashed on.
    let empty = client.call(json!({"target": rls.to_string(), "domain": "", "descriptors": [{"entries": [["a", "b"]]}]}));
    assert_eq!(empty["error"], "INVALID_ARGUMENT", "{empty}");
    let none = client.call(json!({"target": rls.to_string(), "domain": "rl", "descriptors": []}));
    assert_eq!(none["error"], "INVALID_ARGUMENT", "{none}");
    let metrics = sluice.metrics();
    assert!(
        metric_value(
            &metrics,
            "sluice_rls_requests_total{code=\"invalid_argument\"} "
        ) == 2
    );
    assert!(metric_value(&metrics, "sluice_rls_requests_total{code=\"over_limit\"} ") == 5);
}

#[test]
fn hits_addend_is_the_cost_and_a_denied_request_consumes_no_descriptor() {
    let redis = RedisServer::start();
    let rules = rules_dir(&[("example.yaml", EXAMPLE), ("accounts.yaml", ACCOUNTS)]);
    let rls = addr();
    let _sluice = start(rls, rules.path(), "", &redis_body(&redis, "deny"));
    let mut client = RlsClient::start();
    let target = rls.to_string();
    let user = |hits: u64| {
        json!({"target": target, "domain": "accounts", "hits_addend": hits,
               "descriptors": [{"entries": [["user", "h"]]}]})
    };
    // 5 per minute: 3, then 3 more does not fit (and takes nothing), 2 does.
    let three = client.call(user(3));
    assert_eq!(three["statuses"][0]["remaining"], 2, "{three}");
    assert_eq!(overall(&client.call(user(3))), "OVER_LIMIT");
    let two = client.call(user(2));
    assert_eq!(overall(&two), "OK", "{two}");
    assert_eq!(two["statuses"][0]["remaining"], 0);
    // More hits than the limit can ever hold: over, without asking Redis.
    let six = client.call(json!({"target": target, "domain": "accounts",
        "descriptors": [{"entries": [["user", "fresh"]], "hits_addend": 6}]}));
    assert_eq!(overall(&six), "OVER_LIMIT", "{six}");
    let fresh = client.one(rls, "accounts", &[("user", "fresh")]);
    assert_eq!(fresh["statuses"][0]["remaining"], 4, "{fresh}");

    // Two descriptors, one over its limit: neither is consumed.
    let pair = |foo: &str| {
        json!({"target": target, "domain": "rl", "descriptors": [
            {"entries": [["foo", foo]]},
            {"entries": [["source_cluster", "proxy"], ["destination_cluster", "mock"]]},
        ]})
    };
    assert_eq!(overall(&client.call(pair("p"))), "OK");
    for _ in 0..3 {
        let denied = client.call(pair("p"));
        assert_eq!(overall(&denied), "OVER_LIMIT", "{denied}");
        assert_eq!(code(&denied, 0), "OK", "{denied}");
        assert_eq!(code(&denied, 1), "OVER_LIMIT");
    }
    // foo=p was consumed once only (by the first pair): one of 2 left.
    let foo = client.one(rls, "rl", &[("foo", "p")]);
    assert_eq!(overall(&foo), "OK");
    assert_eq!(foo["statuses"][0]["remaining"], 0, "{foo}");
    // A descriptor named twice in one request is counted twice, in one check.
    let twice = client.call(json!({"target": target, "domain": "rl", "descriptors": [
        {"entries": [["foo", "q"]]}, {"entries": [["foo", "q"]]}, {"entries": [["foo", "q"]]}]}));
    assert_eq!(overall(&twice), "OVER_LIMIT", "{twice}");
    let left = client.one(rls, "rl", &[("foo", "q")]);
    assert_eq!(left["statuses"][0]["remaining"], 1, "{left}");
}

#[test]
fn the_limit_is_exact_across_two_instances_on_one_redis() {
    let redis = RedisServer::start();
    let rules = rules_dir(&[("config.yaml", MONGO)]);
    let (a, b) = (addr(), addr());
    let _one = start(a, rules.path(), "", &redis_body(&redis, "deny"));
    let _two = start(b, rules.path(), "", &redis_body(&redis, "deny"));
    let calls = |target: SocketAddr| {
        std::thread::spawn(move || {
            let mut client = RlsClient::start();
            (0..8)
                .filter(|_| {
                    overall(&client.one(target, "mongo_cps", &[("database", "users")])) == "OK"
                })
                .count()
        })
    };
    let (x, y, z) = (calls(a), calls(b), calls(a));
    let admitted = x.join().expect("a") + y.join().expect("b") + z.join().expect("c");
    assert_eq!(admitted, 5, "24 calls over two instances, 5 per minute");
}

/// Waits until the wall clock's fraction of a second is in `[from, to)`.
fn at_fraction(from: f64, to: f64) {
    wait_until(Duration::from_secs(3), "a point in the second", || {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
        let fraction = f64::from(now.subsec_millis()) / 1000.0;
        (from..to).contains(&fraction)
    });
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

#[test]
fn a_sliding_window_holds_the_burst_a_fixed_window_lets_through_at_its_boundary() {
    let rules = "domain: edge
descriptors:
  - key: fixed
    algorithm: fixed_window
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: sliding
    rate_limit: {unit: second, requests_per_unit: 5}
";
    let redis = RedisServer::start();
    let rules = rules_dir(&[("edge.yaml", rules)]);
    let rls = addr();
    let _sluice = start(rls, rules.path(), "", &redis_body(&redis, "deny"));
    let mut client = RlsClient::start();
    // 5 units (one call of hits_addend 5) at the end of one second and 5 at
    // the start of the next, on each key, fresh per attempt. An attempt
    // counts when the first calls ended before the second turned, the last
    // began after it, and all within one second (a stalled machine makes
    // another attempt).
    for attempt in 0..10 {
        let value = format!("v{attempt}");
        let mut five = |key: &str| {
            let call = json!({"target": rls.to_string(), "domain": "edge", "hits_addend": 5,
                              "descriptors": [{"entries": [[key, value]]}]});
            overall(&client.call(call)) == "OK"
        };
        at_fraction(0.6, 0.9);
        let first = now_secs();
        let (fixed_end, sliding_end) = (five("fixed"), five("sliding"));
        let first_done = now_secs();
        at_fraction(0.02, 0.3);
        let second = now_secs();
        let (fixed_next, sliding_next) = (five("fixed"), five("sliding"));
        let second_done = now_secs();
        let turned = first_done.floor() == first.floor() && second.floor() == first.floor() + 1.0;
        if !turned || second_done - first >= 1.0 {
            continue;
        }
        assert!(fixed_end && fixed_next, "the fixed window lets 10 through");
        assert!(
            sliding_end && !sliding_next,
            "the sliding log holds 5 per second"
        );
        return;
    }
    panic!("ten attempts missed the second's boundary");
}

#[test]
fn redis_down_follows_on_error_and_deny_is_unavailable_for_envoy() {
    let rules = rules_dir(&[("example.yaml", EXAMPLE)]);
    let mut redis = RedisServer::start();
    let body = |on_error: &str| redis_body(&redis, on_error);
    let (allow, deny, local) = (addr(), addr(), addr());
    let bodies = [body("allow"), body("deny"), body("local")];
    let _a = start(allow, rules.path(), "", &bodies[0]);
    let _d = start(deny, rules.path(), "", &bodies[1]);
    let _l = start(local, rules.path(), "", &bodies[2]);
    let mut client = RlsClient::start();
    assert_eq!(overall(&client.one(deny, "rl", &[("foo", "up")])), "OK");
    redis.kill();
    for _ in 0..4 {
        assert_eq!(overall(&client.one(allow, "rl", &[("foo", "r")])), "OK");
        let refused = client.one(deny, "rl", &[("foo", "r")]);
        assert_eq!(refused["error"], "UNAVAILABLE", "{refused}");
    }
    // The in-process limiter keeps the limit of 2 per minute.
    let local_codes: Vec<String> = (0..4)
        .map(|_| overall(&client.one(local, "rl", &[("foo", "r")])).to_string())
        .collect();
    assert_eq!(local_codes, ["OK", "OK", "OVER_LIMIT", "OVER_LIMIT"]);
}

#[test]
fn bad_rules_are_refused_at_file_line_column_and_a_reload_keeps_counters() {
    let rules = rules_dir(&[("a.yaml", MONGO), ("b.yaml", "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")]);
    // Hidden entries (a ConfigMap's `..data`) are not rules.
    std::fs::create_dir_all(rules.path().join("..data")).expect("dir");
    std::fs::write(rules.path().join(".notes"), "not yaml: [").expect("write");
    let only = addr();
    let text = format!(
        "server:\n  listen: []\n  admin: \"{}\"\n  rls:\n    listen: \"{only}\"\n    config: \"{}\"\nlimiter:\n  backend: local\n",
        addr(),
        rules.path().display()
    );
    let outside = tempfile::tempdir().expect("tempdir");
    let config_file: PathBuf = outside.path().join("sluice.yaml");
    std::fs::write(&config_file, &text).expect("write");
    let check = |file: &Path| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["--check", "--config"])
            .arg(file)
            .output()
            .expect("run --check")
    };
    let out = check(&config_file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let b = rules.path().join("b.yaml");
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "{}:4:24: invalid rate limit unit `fortnight`",
            b.display()
        )),
        "{stderr}"
    );
    std::fs::write(
        &b,
        "domain: x\ndescriptors:\n  - key: k\n    rate_limt: {unit: second}\n",
    )
    .expect("write");
    let stderr = String::from_utf8_lossy(&check(&config_file).stderr).to_string();
    assert!(
        stderr.contains(&format!(
            "{}:4:5: descriptors[0]: unknown field `rate_limt`",
            b.display()
        )),
        "{stderr}"
    );
    std::fs::write(&b, "domain: mongo_cps\ndescriptors: []\n").expect("write");
    let stderr = String::from_utf8_lossy(&check(&config_file).stderr).to_string();
    assert!(
        stderr.contains("domain `mongo_cps` is also defined in"),
        "{stderr}"
    );
    std::fs::write(&b, "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n").expect("write");
    let out = check(&config_file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("2 domains"), "{summary}");
    assert!(
        summary.contains("limit k: 3 per second (sliding_log)"),
        "{summary}"
    );

    // A process with no proxy listener, only the rate-limit service.
    let mut alone = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(&config_file)
        .stderr(Stdio::null())
        .spawn()
        .expect("start sluice");
    wait_until(Duration::from_secs(10), "the rls-only listener", || {
        std::net::TcpStream::connect(only).is_ok()
    });
    let mut client = RlsClient::start();
    assert_eq!(overall(&client.one(only, "x", &[("k", "1")])), "OK");
    let _ = alone.kill();
    let _ = alone.wait();

    // A reload keeps the counters.
    let redis = RedisServer::start();
    let rls = addr();
    let sluice = start(rls, rules.path(), "", &redis_body(&redis, "deny"));
    for _ in 0..3 {
        assert_eq!(
            overall(&client.one(rls, "mongo_cps", &[("database", "users")])),
            "OK"
        );
    }
    std::fs::write(&b, "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n").expect("write");
    assert!(sluice.reload(&std::fs::read_to_string(sluice.config_path()).expect("config")));
    let kept = client.one(rls, "mongo_cps", &[("database", "users")]);
    assert_eq!(kept["statuses"][0]["remaining"], 1, "{kept}");
    assert_eq!(overall(&client.one(rls, "x", &[("k", "1")])), "OK");
    assert_eq!(overall(&client.one(rls, "x", &[("k", "1")])), "OVER_LIMIT");
    // A broken rules file is refused and the old rules keep serving.
    std::fs::write(
        &b,
        "domain: x\ndescriptors: [{key: k, rate_limit: {unit: week}}]\n",
    )
    .expect("write");
    assert!(!sluice.reload(&std::fs::read_to_string(sluice.config_path()).expect("config")));
    assert_eq!(overall(&client.one(rls, "x", &[("k", "2")])), "OK");
}

#[test]
fn tls_with_certs_as_in_server_tls_and_watch_config_reloads_a_changed_rules_file() {
    let certs = tempfile::tempdir().expect("tempdir");
    common::make_ca(certs.path(), "ca");
    common::make_cert(certs.path(), "ca", "rls", "DNS:rls.example.test");
    let file = |name: &str| certs.path().join(name).display().to_string();
    let rules = rules_dir(&[("config.yaml", MONGO)]);
    let rls = addr();
    let extra = format!(
        "    certs:\n      - {{ cert: \"{}\", key: \"{}\" }}\n  watch_config: true\n",
        file("rls.crt"),
        file("rls.key")
    );
    let sluice = start(rls, rules.path(), &extra, "limiter: { backend: local }\n");
    let mut client = RlsClient::start();
    let call = |client: &mut RlsClient, value: &str| {
        client.call(json!({
            "target": rls.to_string(), "domain": "mongo_cps",
            "descriptors": [{"entries": [["database", value]]}],
            "ca": file("ca.crt"), "authority": "rls.example.test",
        }))
    };
    let answer = call(&mut client, "users");
    assert_eq!(overall(&answer), "OK", "{answer}");
    assert_eq!(answer["statuses"][0]["limit"], 5);

    // A rules file changed in the watched directory is reloaded.
    let tighter = MONGO.replace("requests_per_unit: 5\n\n", "requests_per_unit: 1\n\n");
    std::fs::write(rules.path().join("config.yaml"), tighter).expect("write");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sluice.reloads("success") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "not reloaded:\n{}\n{}",
            std::fs::read_to_string(sluice.config_path()).unwrap_or_default(),
            sluice.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = call(&mut client, "users");
    assert_eq!(after["statuses"][0]["limit"], 1, "{after}");
    assert_eq!(
        overall(&after),
        "OVER_LIMIT",
        "the one unit was taken before: {after}"
    );
}

#[test]
fn an_upgrade_hands_the_listener_over_and_the_counters_go_on() {
    let redis = RedisServer::start();
    let rules = rules_dir(&[("config.yaml", MONGO)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("upgrade.sock");
    let extra = format!(
        "  upgrade_sock: \"{}\"\n  pid_file: \"{}\"\n",
        sock.display(),
        dir.path().join("sluice.pid").display()
    );
    let rls = addr();
    let mut old = start(rls, rules.path(), &extra, &redis_body(&redis, "deny"));
    let mut client = RlsClient::start();
    for _ in 0..2 {
        assert_eq!(
            overall(&client.one(rls, "mongo_cps", &[("database", "users")])),
            "OK"
        );
    }
    let mut new = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--upgrade")
        .arg("--config")
        .arg(old.config_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the new sluice");
    wait_until(Duration::from_secs(20), "the upgrade socket", || {
        sock.exists()
    });
    old.signal("-QUIT");
    // Calls go on through the hand-over; every one is answered.
    while !old.exited() {
        let answer = client.one(rls, "mongo_cps", &[("database", "default")]);
        assert!(answer.get("overall").is_some(), "{answer}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = client.one(rls, "mongo_cps", &[("database", "users")]);
    assert_eq!(after["statuses"][0]["remaining"], 2, "{after}");
    let _ = new.kill();
    let _ = new.wait();
}

#[test]
fn exact_across_two_instances_on_a_redis_cluster_and_all_or_nothing_across_slots() {
    let cluster = common::RedisCluster::start(3);
    let body = format!(
        "limiter:\n  redis:\n    cluster: {}\n    timeout: 2s\n  on_error: deny\n",
        cluster.urls_yaml()
    );
    let rules = rules_dir(&[("example.yaml", EXAMPLE), ("config.yaml", MONGO)]);
    let (a, b) = (addr(), addr());
    let _one = start(a, rules.path(), "", &body);
    let _two = start(b, rules.path(), "", &body);
    let calls = |target: SocketAddr| {
        std::thread::spawn(move || {
            let mut client = RlsClient::start();
            let entries = [("database", "users")];
            (0..8)
                .filter(|_| overall(&client.one(target, "mongo_cps", &entries)) == "OK")
                .count()
        })
    };
    let (x, y) = (calls(a), calls(b));
    assert_eq!(x.join().expect("a") + y.join().expect("b"), 5);

    // Two descriptors whose counters live on different primaries, one of
    // them over its limit: the other is not consumed.
    let counter = |value: &str| format!("sluice:{{!rls|rl|foo|{value}}}");
    let other = (0..100)
        .map(|i| format!("d{i}"))
        .find(|d| cluster.owner(&counter(d)) != cluster.owner(&counter("c")))
        .expect("a value on another primary");
    let mut client = RlsClient::start();
    for _ in 0..2 {
        assert_eq!(overall(&client.one(a, "rl", &[("foo", "c")])), "OK");
    }
    assert_eq!(overall(&client.one(a, "rl", &[("foo", "c")])), "OVER_LIMIT");
    for _ in 0..3 {
        let pair = client.call(
            json!({"target": b.to_string(), "domain": "rl", "descriptors": [
            {"entries": [["foo", "c"]]}, {"entries": [["foo", other]]}]}),
        );
        assert_eq!(overall(&pair), "OVER_LIMIT", "{pair}");
    }
    let d = client.one(a, "rl", &[("foo", &other)]);
    assert_eq!(
        d["statuses"][0]["remaining"], 1,
        "foo=d was never taken: {d}"
    );
}
