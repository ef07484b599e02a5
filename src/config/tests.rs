use super::*;

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_text(Path::new("test.yaml"), text, |name| match name {
        "REDIS_URL" => Some("redis://127.0.0.1:7000/1".into()),
        _ => None,
    })
}

fn error_of(text: &str) -> String {
    load(text)
        .expect_err("config should be rejected")
        .to_string()
}

const GOOD: &str = r#"
server:
  listen: ["127.0.0.1:8080"]
  admin: "127.0.0.1:9091"
client_ip:
  trusted_proxies: [10.0.0.0/8, "192.168.1.1"]
identity:
  header: X-User-Id
limiter:
  redis:
    url: "${REDIS_URL}"
    timeout: 50ms
upstreams:
  api:
    servers: ["127.0.0.1:3000"]
    health_check: { interval: 1s }
routes:
  - name: sms-send
    match: { path_prefix: /sms/, methods: [post], host: API.example.com }
    upstream: api
    limits:
      - name: per-user
        key: [user, {header: X-Api-Key}, ip, method, path]
        limit: 5
        window: 10s
  - name: demo
    match: { path: /demo }
    respond: { status: 200, body: "hi" }
"#;

#[test]
fn good_config_loads_with_defaults() {
    let config = load(GOOD).unwrap();
    assert_eq!(config.server.threads, 2);
    assert_eq!(config.limiter.redis.url, "redis://127.0.0.1:7000/1");
    assert_eq!(config.limiter.redis.timeout, Duration::from_millis(50));
    assert_eq!(config.limiter.on_error, OnError::Local);
    assert_eq!(config.identity, IdentityConfig::Header("x-user-id".into()));
    assert_eq!(config.client_ip.trusted_proxies.len(), 2);
    let route = &config.routes[0];
    assert_eq!(route.methods, vec!["POST"]);
    assert_eq!(route.host.as_deref(), Some("api.example.com"));
    assert_eq!(route.limits[0].key[1], KeyPart::Header("x-api-key".into()));
    assert_eq!(route.limits[0].window, Duration::from_secs(10));
    assert!(matches!(route.action, RouteAction::Upstream(0)));
    assert_eq!(
        config.upstreams[0].health_check,
        Some(Duration::from_secs(1))
    );
}

#[test]
fn unknown_key_is_reported_at_its_line() {
    let err = error_of("server:\n  listen: [\"127.0.0.1:1\"]\n  thread: 2\n");
    assert!(err.starts_with("test.yaml:3:"), "{err}");
    assert!(err.contains("unknown field `thread`"), "{err}");
}

#[test]
fn semantic_errors_carry_positions() {
    let text = "upstreams:\n  api: { servers: [\"127.0.0.1:1\"] }\nroutes:\n  - name: a\n    upstream: nope\n    limits:\n      - name: l\n        key: [ip]\n        limit: 0\n        window: 10\n";
    let err = error_of(text);
    assert!(
        err.contains("test.yaml:5:15: unknown upstream `nope` (defined: api)"),
        "{err}"
    );
    assert!(
        err.contains("test.yaml:9:16: `limit` must be at least 1"),
        "{err}"
    );
    assert!(
        err.contains("test.yaml:10:17: window: invalid duration `10`: missing unit"),
        "{err}"
    );
}

#[test]
fn duplicates_are_rejected() {
    let err = error_of("routes:\n  - name: a\n    respond: {}\n  - name: a\n    respond: {}\n");
    assert!(
        err.contains("test.yaml:4:11: duplicate route name `a`"),
        "{err}"
    );
    let err = error_of("routes:\n  - name: a\n    respond: {}\n    limits:\n      - {name: x, key: [ip], limit: 1, window: 1s}\n      - {name: x, key: [ip], limit: 1, window: 1s}\n");
    assert!(err.contains("duplicate limit name `x`"), "{err}");
}

#[test]
fn unimplemented_features_say_so() {
    for (text, needle) in [
        ("identity:\n  jwt: {claim: sub}\n", "JWT identity"),
        ("limiter:\n  redis:\n    url: \"rediss://a:1\"\n", "TLS to Redis"),
        ("response:\n  headers: draft\n", "draft"),
        ("server:\n  tls: {cert: x}\n", "TLS listeners"),
        (
            "routes:\n  - name: a\n    respond: {}\n    limits:\n      - {name: x, key: [ip], limit: 1, window: 1s, algorithm: token_bucket}\n",
            "algorithm `token_bucket` is not supported yet",
        ),
    ] {
        let err = error_of(text);
        assert!(err.contains(needle) && err.contains("not supported yet"), "{text}: {err}");
    }
}

#[test]
fn unset_variable_is_an_error_with_position() {
    let err = error_of("limiter:\n  redis:\n    url: ${NOT_SET_ANYWHERE}\n");
    assert!(
        err.starts_with("test.yaml:3:10: environment variable `NOT_SET_ANYWHERE` is not set"),
        "{err}"
    );
}

#[test]
fn empty_file_is_a_valid_config() {
    let config = load("").unwrap();
    assert!(config.routes.is_empty());
    assert_eq!(config.server.listen, vec!["0.0.0.0:8080"]);
}

#[test]
fn bad_values_are_rejected() {
    for text in [
        "server:\n  listen: [\"localhost\"]\n",
        "server:\n  threads: 0\n",
        "client_ip:\n  trusted_proxies: [\"10.0.0.0/33\"]\n",
        "limiter:\n  redis:\n    timeout: 0ms\n",
        "limiter:\n  redis:\n    key_prefix: \"{x}\"\n",
        "limiter:\n  backend: memcached\n",
        "response:\n  status: 200\n",
        "upstreams:\n  api: { servers: [] }\n",
        "upstreams:\n  api: { servers: [\"http://127.0.0.1:1\"] }\n",
        "routes:\n  - name: Bad Name\n    respond: {}\n",
        "routes:\n  - name: a\n    match: { path: x }\n    respond: {}\n",
        "routes:\n  - name: a\n    respond: {}\n    limits:\n      - {name: x, key: [], limit: 1, window: 1s}\n",
        "routes:\n  - name: a\n    respond: {}\n    limits:\n      - {name: x, key: [ip], limit: 1, window: 1s, cost: 2}\n",
        "routes:\n  - name: a\n    respond: {}\n    limits:\n      - {name: x, key: [ip], limit: 1}\n",
        "routes:\n  - name: a\n    respond: {}\n    limits:\n      - {name: x, key: [cookie], limit: 1, window: 1s}\n",
        "routes:\n  - name: a\n",
        "routes: [",
    ] {
        let err = error_of(text);
        assert!(err.starts_with("test.yaml:"), "{text}: {err}");
    }
}

#[test]
fn durations_format_as_written() {
    assert_eq!(format_duration(Duration::from_secs(10)), "10s");
    assert_eq!(format_duration(Duration::from_secs(60)), "1m");
    assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    assert_eq!(format_duration(Duration::from_micros(7)), "7us");
}

#[test]
fn local_share_accepts_fractions() {
    let share = |text: &str| {
        load(&format!("limiter:\n  local:\n    share: {text}\n")).map(|c| c.limiter.local_share)
    };
    assert_eq!(share("\"1/4\"").unwrap(), 0.25);
    assert_eq!(share("0.5").unwrap(), 0.5);
    assert_eq!(share("1").unwrap(), 1.0);
    for bad in ["0", "\"3/2\"", "-1", "\"x\"", "\"1/0\""] {
        let err = share(bad).unwrap_err().to_string();
        assert!(
            err.contains("test.yaml:3:12: `share` must be a fraction"),
            "{bad}: {err}"
        );
    }
    assert_eq!(load("").unwrap().limiter.local_share, 1.0);
}

#[test]
fn cluster_nodes_are_checked() {
    let config = load("limiter:\n  redis:\n    cluster: [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n").unwrap();
    assert_eq!(config.limiter.redis.cluster.len(), 2);
    let err = error_of("limiter:\n  redis:\n    cluster: [\"127.0.0.1:7000\"]\n");
    assert!(
        err.starts_with("test.yaml:3:15: `127.0.0.1:7000` is not a Redis URL"),
        "{err}"
    );
}
