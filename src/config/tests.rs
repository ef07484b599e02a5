use super::*;
use std::time::Duration;

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
fn a_dns_refresh_under_a_second_is_refused() {
    let text = "upstreams:\n  api:\n    servers: [\"127.0.0.1:3000\"]\n    dns_refresh: 100ms\n";
    let err = error_of(text);
    assert!(
        err.contains("test.yaml:4:18: `dns_refresh` must be at least 1s"),
        "{text}: {err}"
    );
}

fn route_with(limits: &str) -> String {
    format!("routes:\n  - name: a\n    respond: {{}}\n    limits:\n{limits}")
}

#[test]
fn algorithms_and_their_parameters() {
    let config = load(&route_with(
        "      - {name: w, key: [ip], limit: 100, window: 1s, algorithm: sliding_window, buckets: 20}\n      - {name: f, key: [ip], limit: 5, window: 1s, algorithm: fixed_window}\n      - {name: t, key: [ip], limit: 5, window: 1s, algorithm: token_bucket, burst: 10, cost: 8}\n      - {name: c, key: [ip], limit: 2, algorithm: concurrency, lease: 5s}\n      - {name: s, key: [ip], limit: 2, window: 1s, shadow: true, share: global}\n",
    ))
    .unwrap();
    let limits = &config.routes[0].limits;
    assert_eq!(
        limits[0].algorithm,
        Algorithm::SlidingWindow { buckets: 20 }
    );
    assert_eq!(limits[1].algorithm, Algorithm::FixedWindow);
    assert_eq!(limits[2].algorithm, Algorithm::TokenBucket { burst: 10 });
    assert_eq!(
        limits[3].algorithm,
        Algorithm::Concurrency {
            lease: Duration::from_secs(5)
        }
    );
    assert!(limits[4].shadow);
    assert_eq!(limits[4].share.as_deref(), Some("global"));

    for (limits, needle) in [
        (
            "      - {name: x, key: [ip], limit: 5, window: 1s, burst: 3}\n",
            "test.yaml:5:59: `burst` applies to algorithm token_bucket only",
        ),
        (
            "      - {name: x, key: [ip], limit: 5, window: 1s, algorithm: concurrency}\n",
            "concurrency limit has no `window`",
        ),
        (
            "      - {name: x, key: [ip], limit: 5, window: 1s, algorithm: sliding_window, buckets: 7}\n",
            "does not divide into 7 equal sub-windows",
        ),
        (
            "      - {name: x, key: [ip], limit: 5, window: 1s, algorithm: token_bucket, burst: 2, cost: 3}\n",
            "`cost` 3 exceeds `burst` 2",
        ),
        (
            "      - {name: x, key: [ip], limit: 5, window: 1s, share: g}\n      - {name: y, key: [ip], limit: 5, window: 1s, share: g}\n",
            "uses share `g` twice",
        ),
    ] {
        let err = error_of(&route_with(limits));
        assert!(err.contains(needle), "{limits}: {err}");
    }
}

#[test]
fn shares_must_count_alike() {
    let text = "routes:\n  - name: a\n    respond: {}\n    limits: [{name: x, key: [ip], limit: 5, window: 1s, share: g}]\n  - name: b\n    respond: {}\n    limits: [{name: y, key: [ip], limit: 5, window: 1s, share: g, cost: 2}]\n  - name: c\n    respond: {}\n    limits: [{name: z, key: [ip], limit: 6, window: 1s, share: g}]\n";
    let err = error_of(text);
    assert!(
        err.contains("test.yaml:10:") && err.contains("route `a` limit `x`"),
        "{err}"
    );
    assert!(!err.contains("test.yaml:7:"), "{err}");
}

#[test]
fn large_sliding_logs_warn() {
    let config = load(&route_with(
        "      - {name: x, key: [ip], limit: 50000, window: 1h}\n",
    ))
    .unwrap();
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0].starts_with("test.yaml:5:37: warning: a sliding_log limit of 50000")
            && config.warnings[0].contains("sliding_window"),
        "{:?}",
        config.warnings
    );
}

#[test]
fn jwt_needs_its_key() {
    let err = error_of("identity:\n  jwt: {secret_env: SLUICE_TEST_NEVER_SET, claim: sub}\n");
    assert!(
        err.contains("test.yaml:2:21: environment variable `SLUICE_TEST_NEVER_SET`"),
        "{err}"
    );
    let err = error_of("identity:\n  jwt: {algorithms: [none]}\n");
    assert!(err.contains("`none` is never accepted"), "{err}");
    let err = error_of("identity:\n  jwt: {algorithms: [HS256, RS256]}\n");
    assert!(err.contains("one kind of key"), "{err}");
    let err =
        error_of("identity:\n  jwt: {algorithms: [ES256], public_key_file: /nonexistent.pem}\n");
    assert!(err.contains("cannot read `/nonexistent.pem`"), "{err}");
}

#[test]
fn jwt_issuer_and_audiences_are_checked_where_written() {
    let with = |extra: &str| {
        let text = format!(
            "identity:\n  jwt: {{ algorithms: [HS256], secret_env: TEST_ONLY_JWT_SECRET{extra} }}\n"
        );
        Config::from_text(Path::new("test.yaml"), &text, |_| {
            Some("0123456789abcdef0123456789abcdef".to_string())
        })
    };
    match with(", issuer: https://id.example.com/, audiences: [orders-api]").map(|c| c.identity) {
        Ok(IdentityConfig::Jwt(jwt)) => {
            assert_eq!(jwt.issuer.as_deref(), Some("https://id.example.com/"));
            assert_eq!(jwt.audiences, ["orders-api"]);
        }
        other => panic!("{other:?}"),
    }
    for (extra, at, message) in [
        (
            ", issuer: ''",
            "test.yaml:2:73:",
            "`issuer` must not be empty",
        ),
        (", audiences: []", "test.yaml:2:76:", "`audiences`"),
        (
            ", audiences: [a, '']",
            "test.yaml:2:80:",
            "`audiences` must not be empty",
        ),
    ] {
        let err = with(extra).expect_err(extra).to_string();
        assert!(err.contains(at) && err.contains(message), "{extra}: {err}");
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

#[test]
fn the_jwt_secret_comes_through_the_injected_environment() {
    let text = "identity:\n  jwt: { algorithms: [HS256], secret_env: TEST_ONLY_JWT_SECRET }\n";
    let secret = "0123456789abcdef0123456789abcdef";
    let with = Config::from_text(Path::new("test.yaml"), text, |name| {
        (name == "TEST_ONLY_JWT_SECRET").then(|| secret.to_string())
    });
    match with.map(|c| c.identity) {
        Ok(IdentityConfig::Jwt(jwt)) => {
            assert!(matches!(jwt.key, JwtKey::Secret(ref s) if s == secret.as_bytes()))
        }
        other => panic!("{other:?}"),
    }
    // Not in the injected lookup: refused, whatever the process has.
    let without = Config::from_text(Path::new("test.yaml"), text, |_| None);
    assert!(without.is_err());
}

/// The `yaml` block of the reference in docs/configuration.md.
fn documented_reference() -> String {
    let docs = include_str!("../../docs/configuration.md");
    let start = docs.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = start + docs[start..].find("```").expect("its end");
    docs[start..end].to_string()
}

/// Every section that has a default equals it in `config`, and so do the
/// upstream's and the limit's settings that have one.
fn assert_spells_the_defaults(config: &Config, source: &str) {
    assert_eq!(config.server, ServerConfig::default(), "{source}: server");
    assert_eq!(
        config.client_ip,
        ClientIpConfig::default(),
        "{source}: client_ip"
    );
    assert_eq!(
        config.limiter,
        LimiterConfig::default(),
        "{source}: limiter"
    );
    assert_eq!(
        config.response,
        ResponseConfig::default(),
        "{source}: response"
    );
    let upstream = &config.upstreams[0];
    assert_eq!(
        (
            upstream.health_check,
            upstream.connect_timeout,
            upstream.read_timeout,
            upstream.max_fails,
            upstream.fail_timeout,
        ),
        (
            Some(defaults::upstream::HEALTH_INTERVAL),
            defaults::upstream::CONNECT_TIMEOUT,
            defaults::upstream::READ_TIMEOUT,
            defaults::upstream::MAX_FAILS,
            defaults::upstream::FAIL_TIMEOUT,
        ),
        "{source}: upstream"
    );
    let limit = &config.routes[0].limits[0];
    assert_eq!(limit.cost, defaults::limit::COST, "{source}: cost");
    assert_eq!(
        limit.on_missing,
        defaults::limit::ON_MISSING,
        "{source}: on_missing"
    );
    assert_eq!(
        limit.algorithm,
        Algorithm::SlidingLog,
        "{source}: algorithm"
    );
}

#[test]
fn the_documented_reference_spells_the_defaults() {
    let text = documented_reference();
    let config = Config::from_text(Path::new("configuration.md"), &text, |_| None)
        .unwrap_or_else(|e| panic!("the documented reference does not load:\n{e}"));
    assert_spells_the_defaults(&config, "docs/configuration.md");
}

#[test]
fn the_shipped_config_spells_the_defaults() {
    let text = include_str!("../../conf/sluice.yaml");
    let config = Config::from_text(Path::new("conf/sluice.yaml"), text, |_| None)
        .unwrap_or_else(|e| panic!("conf/sluice.yaml does not load:\n{e}"));
    assert_spells_the_defaults(&config, "conf/sluice.yaml");
}

#[test]
fn a_changed_default_is_caught() {
    let text = documented_reference().replace("timeout: 20ms", "timeout: 25ms");
    let config = Config::from_text(Path::new("c.md"), &text, |_| None).expect("loads");
    assert_ne!(config.limiter, LimiterConfig::default());
}

#[test]
fn an_unresolvable_upstream_is_reported_where_it_is_written() {
    let text = "upstreams:\n  api:\n    servers: [\"no-such-host.invalid:80\"]\n";
    let error = load(text).expect_err("unresolvable").to_string();
    assert!(
        error.starts_with("test.yaml:3:15: cannot resolve `no-such-host.invalid:80`"),
        "{error}"
    );
}

#[test]
fn the_runtime_flavour_needs_a_restart() {
    let old = load(GOOD).expect("loads");
    let text = GOOD.replace(
        "  admin: \"127.0.0.1:9091\"\n",
        "  admin: \"127.0.0.1:9091\"\n  work_stealing: true\n",
    );
    let new = load(&text).expect("loads");
    assert!(!old.server.work_stealing && new.server.work_stealing);
    let changes = diff::diff(&old, &new);
    assert_eq!(changes.needs_restart, ["server.work_stealing"]);
}

/// A route with `path` as its match and one limit keyed by `part`.
fn templated(path: &str, part: &str) -> String {
    format!(
        "routes:\n  - name: r\n    match: {{ path: \"{path}\" }}\n    respond: {{ status: 200 }}\n    limits:\n      - {{ name: l, key: [{part}], limit: 1, window: 1s }}\n"
    )
}

#[test]
fn query_cookie_and_param_parts_are_checked() {
    let config = load(&templated("/users/{id}/orders", "{param: id}")).unwrap();
    assert_eq!(
        config.routes[0].limits[0].key,
        [KeyPart::Param("id".into())]
    );
    assert!(matches!(config.routes[0].path, PathMatch::Template(_)));
    let config = load(&templated("/a", "{query: api_key}")).unwrap();
    assert_eq!(
        config.routes[0].limits[0].key,
        [KeyPart::Query("api_key".into())]
    );
    let config = load(&templated("/a", "{cookie: session}")).unwrap();
    assert_eq!(
        config.routes[0].limits[0].key,
        [KeyPart::Cookie("session".into())]
    );

    let cases = [
        (
            templated("/users/{id}", "{param: user}"),
            "test.yaml:6:26: the route's path `/users/{id}` defines no parameter `user`",
        ),
        (
            templated("/users", "{param: id}"),
            "test.yaml:6:26: `{param: id}` needs a templated route path, like `match: {path: /users/{id}}`",
        ),
        (
            templated("/users/id{id}", "ip"),
            "test.yaml:3:20: a path parameter takes a whole segment (`/{name}/`), not `id{id}`",
        ),
        (
            templated("/users/{id}/{id}", "ip"),
            "test.yaml:3:20: the path parameter `id` appears twice",
        ),
        (
            templated("/users//{id}", "ip"),
            "test.yaml:3:20: `/users//{id}` is not a valid path: its literal segments are not canonical",
        ),
        (
            templated("/a", "{query: \"a&b\"}"),
            "test.yaml:6:26: `a&b` is not a query parameter name",
        ),
        (
            templated("/a", "{cookie: \"a b\"}"),
            "test.yaml:6:26: `a b` is not a valid cookie name",
        ),
        (
            "routes:\n  - name: r\n    match: { path_prefix: \"/u/{id}\" }\n    respond: { status: 200 }\n".to_string(),
            "test.yaml:3:27: `path_prefix` cannot hold path parameters",
        ),
        (
            templated("/a", "{params: id}"),
            "unknown key part `params`",
        ),
    ];
    for (text, want) in cases {
        let err = error_of(&text);
        assert!(err.contains(want), "want {want:?}, got {err}");
    }
}

#[test]
fn exemptions_are_checked_where_they_are_written() {
    let text = "client_ip:\n  trusted_proxies: [10.0.0.1]\nexempt:\n  cidrs: [10.0.0.0/8, \"2001:db8::/32\", 192.168.1.7]\n  headers: { X-Internal: [\"yes\"] }\nroutes:\n  - name: r\n    respond: {}\n    exempt: { cidrs: [127.0.0.1] }\n    limits:\n      - { name: l, key: [ip], limit: 1, window: 1s, exempt: { cidrs: [\"::1\"] } }\n";
    let config = load(text).unwrap();
    assert_eq!(config.exempt.cidrs.len(), 3);
    assert_eq!(
        config.exempt.headers,
        [("x-internal".to_string(), vec!["yes".to_string()])]
    );
    assert_eq!(config.routes[0].exempt.cidrs.len(), 1);
    assert_eq!(config.routes[0].limits[0].exempt.cidrs.len(), 1);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert!(config.routes[0].limits[0]
        .describe()
        .contains("exempt ::1/128"));

    let cases = [
        (
            "exempt:\n  cidrs: [10.0.0.0/33]\n",
            "test.yaml:2:11: `10.0.0.0/33` is not",
        ),
        (
            "exempt:\n  claims: { role: [admin] }\n",
            "test.yaml:2:11: exempting by claims needs `identity.jwt`",
        ),
        (
            "exempt:\n  headers: { x-a: [] }\n",
            "test.yaml:2:19: `headers.x-a` lists no values",
        ),
        (
            "exempt:\n  headers: { \"a b\": [x] }\n",
            "`a b` is not a valid header name",
        ),
        ("exempt:\n  hosts: [x]\n", "unknown field `hosts`"),
    ];
    for (text, want) in cases {
        let err = error_of(text);
        assert!(err.contains(want), "want {want:?}, got {err}");
    }
    // Headers with no trusted proxy to believe them: a warning, not an error.
    let config = load("exempt:\n  headers: { x-internal: [\"yes\"] }\n").unwrap();
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("this exemption never applies")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn plans_and_overrides_are_checked() {
    let jwt = "identity:\n  jwt: { algorithms: [HS256], secret_env: TEST_ONLY_JWT_SECRET }\n";
    let limit = |extra: &str| {
        format!("{jwt}routes:\n  - name: r\n    respond: {{}}\n    limits:\n      - {{ name: l, key: [user, {{header: X-Key}}], limit: 10, window: 1m{extra} }}\n")
    };
    let load_jwt = |text: &str| {
        Config::from_text(Path::new("test.yaml"), text, |name| {
            (name == "TEST_ONLY_JWT_SECRET").then(|| "s".repeat(32))
        })
    };
    let good = limit(", limit_from: {claim: plan}, plans: {free: 10, pro: 100}, overrides: [{match: {user: acme, header.X-Key: k1}, limit: 500}, {match: {user: initech}, plan: pro}]");
    let config = load_jwt(&good).unwrap();
    let l = &config.routes[0].limits[0];
    assert_eq!(l.limit_from, Some(PlanSource::Claim("plan".into())));
    assert_eq!(
        l.plans,
        [("free".to_string(), 10), ("pro".to_string(), 100)]
    );
    assert_eq!(l.overrides[0].limit, 500);
    assert!(l.overrides[0]
        .parts
        .contains(&(KeyPart::Header("x-key".into()), "k1".into())));
    assert_eq!(l.overrides[1].limit, 100);
    assert!(
        l.describe().contains("plans free=10 pro=100 by claim plan"),
        "{}",
        l.describe()
    );

    let cases = [
        (", overrides: [{match: {user: a}, plan: gold}]", "unknown plan `gold` (plans: none)"),
        (", limit_from: {claim: plan}, plans: {free: 1}, overrides: [{match: {user: a}, plan: gold}]", "unknown plan `gold` (plans: free)"),
        (", overrides: [{match: {ip: 1.2.3.4}, limit: 5}]", "`ip` is not a part of this limit's key (user, header.x-key)"),
        (", overrides: [{match: {}, limit: 5}]", "an override's `match` names at least one key part"),
        (", overrides: [{match: {user: a}}]", "an override sets either `limit` or `plan`"),
        (", overrides: [{match: {user: a}, limit: 0}]", "`limit` must be at least 1"),
        (", plans: {free: 1}", "`plans` needs `limit_from`"),
        (", limit_from: {claim: plan}", "`limit_from` needs `plans`"),
        (", limit_from: {claim: plan, header: x}, plans: {a: 1}", "`limit_from` takes exactly one of claim, header or consumer"),
        (", limit_from: {consumer: tier}, plans: {a: 1}", "`limit_from: {consumer: ...}` takes `plan`, not `tier`"),
        (", limit_from: {consumer: plan}, plans: {a: 1}", "`limit_from: {consumer: plan}` needs `identity.api_key`"),
        (", cost: 5, limit_from: {claim: plan}, plans: {tiny: 2}", "cost"),
    ];
    for (extra, want) in cases {
        let err = load_jwt(&limit(extra)).expect_err(extra).to_string();
        assert!(err.contains(want), "{extra}: want {want:?}, got {err}");
    }
    // A claim needs a verified token.
    let no_jwt = "routes:\n  - name: r\n    respond: {}\n    limits:\n      - { name: l, key: [ip], limit: 1, window: 1s, limit_from: {claim: plan}, plans: {a: 2} }\n";
    assert!(error_of(no_jwt).contains("`limit_from: {claim: ...}` needs `identity.jwt`"));
    // A header with no trusted proxy is never believed: a warning.
    let header = "routes:\n  - name: r\n    respond: {}\n    limits:\n      - { name: l, key: [ip], limit: 1, window: 1s, limit_from: {header: x-plan}, plans: {a: 2} }\n";
    let config = load(header).unwrap();
    assert!(config
        .warnings
        .iter()
        .any(|w| w.contains("every request gets the default limit")));
}

#[test]
fn block_for_needs_a_timed_enforced_limit() {
    let limit = |extra: &str| {
        format!("routes:\n  - name: r\n    respond: {{}}\n    limits:\n      - {{ name: l, key: [ip], limit: 2{extra} }}\n")
    };
    let config = load(&limit(", window: 1m, block_for: 10m")).unwrap();
    assert_eq!(
        config.routes[0].limits[0].block_for,
        Duration::from_secs(600)
    );
    assert!(config.routes[0].limits[0]
        .describe()
        .contains("block_for 10m"));
    for (extra, want) in [
        (
            ", window: 1m, block_for: 0s",
            "`block_for` must be at least 1ms",
        ),
        (
            ", window: 1m, block_for: 400d",
            "`block_for` must be at most 366d",
        ),
        (
            ", window: 1m, shadow: true, block_for: 1m",
            "a shadow limit never denies",
        ),
        (
            ", algorithm: concurrency, block_for: 1m",
            "a concurrency denial ends when a request does",
        ),
    ] {
        let err = error_of(&limit(extra));
        assert!(err.contains(want), "{extra}: want {want:?}, got {err}");
    }
}

#[test]
fn reserve_and_response_json_are_checked() {
    let limit = |extra: &str| {
        format!("routes:\n  - name: r\n    respond: {{}}\n    limits:\n      - {{ name: l, key: [ip], limit: 5000, window: 1m{extra} }}\n")
    };
    let config = load(&limit(
        ", reserve: {request_json: [/max_completion_tokens, /max_tokens], default: 1024, max: 4096, plus: 10}, cost_from: {response_json: /usage/total_tokens}",
    ))
    .unwrap();
    let l = &config.routes[0].limits[0];
    assert!(!l.deferred(), "a reservation is taken at admission");
    let reserve = l.reserve.as_ref().unwrap();
    assert_eq!(
        (reserve.default, reserve.max, reserve.plus),
        (1024, 4096, 10)
    );
    assert!(
        l.describe().contains("reserves /max_completion_tokens or /max_tokens + 10 (default 1024, max 4096), cost from /usage/total_tokens"),
        "{}",
        l.describe()
    );
    // Without `default`, `max` stands in; a constant reserves as written.
    let config = load(&limit(", reserve: {request_json: /max_tokens, max: 300}")).unwrap();
    assert_eq!(
        config.routes[0].limits[0].reserve.as_ref().unwrap().default,
        300
    );
    let config = load(&limit(
        ", reserve: 250, cost_from: {response_header: x-usage}",
    ))
    .unwrap();
    assert_eq!(
        config.routes[0].limits[0].reserve.as_ref().unwrap().plus,
        250
    );
    // Without `reserve`, a JSON cost is counted when the response ends.
    let config = load(&limit(
        ", cost_from: {response_json: [/usage/input_tokens, /usage/output_tokens]}",
    ))
    .unwrap();
    assert!(config.routes[0].limits[0].deferred());
}

#[test]
fn bad_reservations_and_json_costs_are_refused_where_written() {
    let limit = |extra: &str| {
        format!("routes:\n  - name: r\n    respond: {{}}\n    limits:\n      - {{ name: l, key: [ip], limit: 5000, window: 1m{extra} }}\n")
    };
    for (extra, want) in [
        (
            ", reserve: {request_json: usage.max}",
            "`usage.max` is not a JSON pointer",
        ),
        (
            ", reserve: {request_json: [/a, b~2], default: 1}",
            "test.yaml:5:85: `b~2` is not a JSON pointer",
        ),
        (
            ", cost_from: {response_json: total_tokens}",
            "`total_tokens` is not a JSON pointer",
        ),
        (
            ", cost_from: {response_json: /a, response_header: x}",
            "`cost_from` takes exactly one of `response_header` or `response_json`",
        ),
        (", cost_from: {}", "`cost_from` takes exactly one of"),
        (
            ", reserve: {request_json: /max_tokens}",
            "`reserve` needs a `default`",
        ),
        (", reserve: {default: 5}", "`reserve` needs `request_json`"),
        (", reserve: 0", "`reserve` must be at least 1"),
        (", reserve: -3", "a number of units"),
        (
            ", reserve: {request_json: /m, max: 0}",
            "`max` must be at least 1",
        ),
        (
            ", reserve: 10, cost: 2",
            "either `cost` or `reserve`, not both",
        ),
        (
            ", reserve: 10, count_when: {status: [200]}",
            "`reserve` cannot apply to a limit counted by status",
        ),
        (
            ", reserve: 10, on_limit: delay",
            "`reserve` cannot apply to a limit that delays",
        ),
        (
            ", reserve: {request_json: /m, default: 1, maximum: 3}",
            "unknown field `maximum`",
        ),
    ] {
        let err = error_of(&limit(extra));
        assert!(err.contains(want), "{extra}: want {want:?}, got {err}");
    }
    let concurrency = "routes:\n  - name: r\n    respond: {}\n    limits:\n      - { name: l, key: [ip], limit: 5, algorithm: concurrency, reserve: 2 }\n";
    let err = error_of(concurrency);
    assert!(
        err.contains("`reserve` cannot apply to a `concurrency` limit"),
        "{err}"
    );
    assert!(err.contains(":5:"), "the position is given: {err}");
}

#[test]
fn count_when_and_cost_from_are_checked() {
    let limit = |extra: &str| {
        format!("routes:\n  - name: r\n    respond: {{}}\n    limits:\n      - {{ name: l, key: [ip], limit: 5{extra} }}\n")
    };
    let config = load(&limit(", window: 1m, count_when: {status: [401, \"5xx\", 429]}, cost_from: {response_header: X-Usage}")).unwrap();
    let l = &config.routes[0].limits[0];
    assert!(l.deferred());
    let when = l.count_when.as_ref().unwrap();
    assert!(when.iter().any(|m| m.matches(401)) && when.iter().any(|m| m.matches(502)));
    assert!(!when.iter().any(|m| m.matches(200)) && !when.iter().any(|m| m.matches(403)));
    assert_eq!(
        l.cost_from,
        Some(crate::config::usage::CostFrom::Header("x-usage".into()))
    );
    assert!(
        l.describe()
            .contains("counts 401 5xx 429, cost from x-usage"),
        "{}",
        l.describe()
    );
    for (extra, want) in [
        (
            ", algorithm: concurrency, count_when: {status: [401]}",
            "`count_when` cannot apply to a `concurrency` limit",
        ),
        (
            ", algorithm: concurrency, cost_from: {response_header: x}",
            "`cost_from` cannot apply to a `concurrency` limit",
        ),
        (
            ", window: 1m, shadow: true, count_when: {status: [401]}",
            "`count_when` cannot apply to a shadow limit",
        ),
        (
            ", window: 1m, count_when: {status: [99]}",
            "`99` is not a status",
        ),
        (
            ", window: 1m, count_when: {status: [\"6xx\"]}",
            "`6xx` is not a status",
        ),
        (
            ", window: 1m, count_when: {status: []}",
            "at least one status",
        ),
        (
            ", window: 1m, cost_from: {response_header: \"a b\"}",
            "`a b` is not a valid header name",
        ),
        (
            ", window: 1m, cost_from: {header: x}",
            "unknown field `header`",
        ),
    ] {
        let err = error_of(&limit(extra));
        assert!(err.contains(want), "{extra}: want {want:?}, got {err}");
    }
}

#[test]
fn cors_that_browsers_would_refuse_is_refused() {
    let route = |cors: &str| format!("routes:\n  - name: a\n    respond: {{}}\n    cors: {cors}\n");
    let err = error_of(&route("{origins: [\"*\"], credentials: true}"));
    assert!(
        err.contains("test.yaml:4:41: browsers refuse credentials"),
        "{err}"
    );
    let err = error_of(&route("{origins: [\"https://app.example.com/\"]}"));
    assert!(
        err.contains("test.yaml:4:22: `https://app.example.com/` is not an origin"),
        "{err}"
    );
    let err = error_of(&route("{origins: []}"));
    assert!(
        err.contains("test.yaml:4:21: `origins` needs at least one"),
        "{err}"
    );
    let err = error_of(&route("{origins: [\"*\"], headers: [\"bad header\"]}"));
    assert!(
        err.contains("`bad header` is not a valid header name"),
        "{err}"
    );
    let err = error_of(&route("{origins: [\"*\"], methods: [\"GE T\"]}"));
    assert!(err.contains("`GE T` is not an HTTP method"), "{err}");
}

#[test]
fn a_limit_with_plans_may_leave_out_its_own_number() {
    let text = "routes:\n  - name: r\n    respond: {}\n    limits:\n      - { name: l, key: [ip], window: 1m, limit_from: {header: x-plan}, plans: {free: 100, pro: 5000} }\n";
    let config = load(text).expect("plans without limit");
    assert_eq!(config.routes[0].limits[0].limit, 100, "the smallest plan");
    let err = error_of("routes:\n  - name: r\n    respond: {}\n    limits:\n      - { name: l, key: [ip], window: 1m }\n");
    assert!(
        err.contains("test.yaml:5:9: a limit needs `limit` (or `plans`"),
        "{err}"
    );
}

#[test]
fn tracing_is_checked_with_positions() {
    let on = load("tracing:\n  otlp_endpoint: http://otel:4318\n").expect("valid");
    let tracing = on.tracing.expect("on");
    assert_eq!(tracing.otlp_endpoint, "http://otel:4318/v1/traces");
    assert_eq!(
        (tracing.sample_ratio, tracing.always_sample_denied),
        (0.01, true)
    );
    assert_eq!(tracing.service_name, "sluice");
    assert!(load("tracing: {sample_ratio: 0.5}\n")
        .expect("valid")
        .tracing
        .is_none());
    let err = error_of("tracing:\n  otlp_endpoint: otel:4318\n");
    assert!(
        err.contains("test.yaml:2:18") && err.contains("otlp_endpoint"),
        "{err}"
    );
    let err = error_of("tracing:\n  otlp_endpoint: http://o\n  sample_ratio: 1.5\n");
    assert!(
        err.contains("test.yaml:3:17") && err.contains("from 0 to 1"),
        "{err}"
    );
    let err = error_of("tracing:\n  otlp_endpoint: http://o\n  service_name: \" \"\n");
    assert!(
        err.contains("test.yaml:3:17") && err.contains("service_name"),
        "{err}"
    );
    let err = error_of("tracing:\n  otlp: http://o\n");
    assert!(
        err.contains("test.yaml:2:3") && err.contains("otlp"),
        "{err}"
    );
}
