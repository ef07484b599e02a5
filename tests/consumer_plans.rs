//! Plans of API-key consumers kept in Redis: the usage API and the top
//! keys' usage link answer for the consumer's plan, a plan no limit lists
//! is refused wherever the admin API writes one, a consumer's plan is shown
//! and changed for all its keys on every instance, and a plan a reload
//! removes is reported with its count and gets each limit's own number.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

const TOKEN: &str = "admin-s3cret";

/// The config body with these plans (the smallest is the default).
fn body(redis: &RedisServer, upstream: &Upstream, plans: &str) -> String {
    let identity = "  api_key:\n    store: redis\n    cache_ttl: 2s\n    failures: { limit: 1000, window: 1m }";
    let limiter = format!("  redis: {{ url: \"{}\", timeout: 500ms }}", redis.url());
    config(identity, &limiter, upstream, plans)
}

/// A config with this `identity:` and `limiter:` (their indented lines),
/// one route to `upstream` and a limit per customer by these plans.
fn config(identity: &str, limiter: &str, upstream: &Upstream, plans: &str) -> String {
    format!(
        r#"identity:
{identity}
limiter:
{limiter}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-customer, key: [user], window: 1m, limit_from: {{ consumer: plan }}, plans: {{ {plans} }} }}
"#,
        upstream = upstream.addr,
    )
}

const FREE_AND_PRO: &str = "free: 5, pro: 50";

fn start(redis: &RedisServer, upstream: &Upstream, plans: &str) -> Sluice {
    Sluice::start_with_server(
        "  admin_token_env: SLUICE_ADMIN_TOKEN\n",
        &body(redis, upstream, plans),
        &[("SLUICE_ADMIN_TOKEN", TOKEN)],
    )
}

/// `method path` on the admin listener with the token and `body`.
fn admin(sluice: &Sluice, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    admin_call(sluice.admin, TOKEN, method, path, body)
}

/// A new key of `consumer`, created with this JSON body.
fn new_key(sluice: &Sluice, consumer: &str, body: &str) -> String {
    let (status, created) = admin(
        sluice,
        "POST",
        &format!("/v1/consumers/{consumer}/keys"),
        body,
    );
    assert_eq!(status, 201, "{created}");
    created["key"].as_str().expect("key").to_string()
}

fn with_key(sluice: &Sluice, key: &str) -> u16 {
    sluice.get("/x", &[("X-Api-Key", key)]).status
}

#[test]
fn usage_and_the_top_keys_answer_for_the_consumers_plan() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = start(&redis, &upstream, FREE_AND_PRO);
    let bob = new_key(&sluice, "bob", r#"{"plan": "pro"}"#);
    let alice = new_key(&sluice, "alice", "");
    let admitted = (0..53).filter(|_| with_key(&sluice, &bob) == 200).count();
    assert_eq!(admitted, 50, "pro is 50 a minute");
    assert_eq!(with_key(&sluice, &alice), 200);

    // Without plan=, the consumer's own plan: "Used 50 of 50", not 5 of 5.
    let (status, usage) = admin(
        &sluice,
        "GET",
        "/v1/usage?route=api&limit=per-customer&user=bob",
        "",
    );
    assert_eq!(status, 200, "{usage}");
    assert_eq!(
        (&usage["quota"], &usage["used"], &usage["plan"]),
        (
            &serde_json::json!(50),
            &serde_json::json!(50),
            &serde_json::json!("pro")
        ),
        "{usage}"
    );
    let (_, usage) = admin(
        &sluice,
        "GET",
        "/v1/usage?route=api&limit=per-customer&user=alice",
        "",
    );
    assert_eq!(
        (usage["quota"].as_u64(), usage["used"].as_u64()),
        (Some(5), Some(1)),
        "{usage}"
    );
    // An explicit plan= still answers for that plan.
    let (_, usage) = admin(
        &sluice,
        "GET",
        "/v1/usage?route=api&limit=per-customer&user=bob&plan=free",
        "",
    );
    assert_eq!(usage["quota"].as_u64(), Some(5), "{usage}");

    // The top keys' usage link (what the console's Usage follows).
    let (status, top) = admin(&sluice, "GET", "/v1/top?route=api&limit=per-customer", "");
    assert_eq!(status, 200, "{top}");
    let link = top["keys"][0]["usage"]
        .as_str()
        .expect("a usage link")
        .to_string();
    assert!(link.contains("user=bob"), "{top}");
    let (_, usage) = admin(&sluice, "GET", &format!("/v1/usage?{link}"), "");
    assert_eq!(
        (usage["quota"].as_u64(), usage["used"].as_u64()),
        (Some(50), Some(50)),
        "{usage}"
    );
}

#[test]
fn a_plan_no_limit_lists_is_refused_wherever_the_admin_api_writes_one() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = start(&redis, &upstream, FREE_AND_PRO);
    for plan in ["Pro", "enterprise", "pro ", ""] {
        let body = serde_json::json!({ "plan": plan }).to_string();
        let (status, answer) = admin(&sluice, "POST", "/v1/consumers/bob/keys", &body);
        assert_eq!(status, 400, "{plan:?}: {answer}");
        assert_eq!(answer["error"], "unknown_plan", "{answer}");
        assert_eq!(answer["plan"], plan, "{answer}");
        assert_eq!(
            answer["plans"],
            serde_json::json!(["free", "pro"]),
            "{answer}"
        );
        let (status, answer) = admin(&sluice, "PUT", "/v1/consumers/bob", &body);
        assert_eq!(
            (status, &answer["error"]),
            (400, &serde_json::json!("unknown_plan")),
            "{answer}"
        );
    }
    for body in [
        r#"{"plan": 5}"#,
        r#"{"plan": ["pro"]}"#,
        "[]",
        "not json",
        "{}",
    ] {
        let (status, answer) = admin(&sluice, "PUT", "/v1/consumers/bob", body);
        assert_eq!(
            (status, &answer["error"]),
            (400, &serde_json::json!("bad_body")),
            "{body}: {answer}"
        );
    }
    // Nothing was written: no key, no plan, nobody listed.
    assert!(redis.keys("sluice:*").is_empty(), "{:?}", redis.keys("*"));
    let (status, _) = admin(&sluice, "GET", "/v1/consumers/bob", "");
    assert_eq!(status, 404);
}

#[test]
fn a_consumers_plan_is_shown_and_changed_for_all_its_keys_on_every_instance() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let (a, b) = (
        start(&redis, &upstream, FREE_AND_PRO),
        start(&redis, &upstream, FREE_AND_PRO),
    );
    let first = new_key(&a, "carol", r#"{"plan": "free"}"#);
    let second = new_key(&a, "carol", "");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (status, shown) = admin(&b, "GET", "/v1/consumers/carol", "");
    assert_eq!(status, 200, "{shown}");
    assert_eq!(
        (&shown["plan"], &shown["applied_plan"]),
        (&serde_json::json!("free"), &serde_json::json!("free")),
        "{shown}"
    );
    let keys = shown["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 2, "{shown}");
    for key in keys {
        assert_eq!(key["key_id"].as_str().map(str::len), Some(12), "{shown}");
        let created = key["created"].as_u64().expect("created");
        assert!(created.abs_diff(now) < 60, "{shown}");
        assert!(!shown.to_string().contains(&first) && !shown.to_string().contains(&second));
    }

    // Free: 5 a minute across both keys and both instances.
    let mut admitted = 0;
    for i in 0..8 {
        let (instance, key) = if i % 2 == 0 {
            (&a, &first)
        } else {
            (&b, &second)
        };
        admitted += usize::from(with_key(instance, key) == 200);
    }
    assert_eq!(admitted, 5);

    // Moved to pro on A: A at once, B within cache_ttl (2 s); every key.
    let (status, answer) = admin(&a, "PUT", "/v1/consumers/carol", r#"{"plan": "pro"}"#);
    assert_eq!(
        (status, &answer["plan"]),
        (200, &serde_json::json!("pro")),
        "{answer}"
    );
    assert_eq!(with_key(&a, &second), 200);
    admitted += 1;
    for key in [&first, &second] {
        // Each key's cached answer on B lasts its own cache_ttl.
        wait_until(
            Duration::from_secs(10),
            "B to apply carol's new plan",
            || {
                let ok = with_key(&b, key) == 200;
                admitted += usize::from(ok);
                ok
            },
        );
    }
    let mut i = 0;
    loop {
        let (instance, key) = if i % 2 == 0 {
            (&a, &first)
        } else {
            (&b, &second)
        };
        match with_key(instance, key) {
            200 => admitted += 1,
            429 => break,
            other => panic!("unexpected {other}"),
        }
        i += 1;
        assert!(i < 100, "pro never ran out");
    }
    assert_eq!(admitted, 50, "one counter, now at pro's number");
    let log = a.log();
    assert!(
        log.contains("sluice::audit")
            && log.contains("PUT /v1/consumers/carol")
            && log.contains("consumer carol: plan set to pro"),
        "{log}"
    );
    let (_, usage) = admin(
        &b,
        "GET",
        "/v1/usage?route=api&limit=per-customer&user=carol",
        "",
    );
    assert_eq!(
        (usage["quota"].as_u64(), usage["plan"].as_str()),
        (Some(50), Some("pro")),
        "{usage}"
    );

    // A key written with a per-key plan (as earlier versions did) keeps
    // it while its consumer has none; the consumer's plan then wins.
    let legacy = "legacy-key-of-dave";
    let hash = sha256_hex(legacy.as_bytes());
    let mut conn = redis.connection();
    redis::cmd("HSET")
        .arg(format!("sluice:key:{hash}"))
        .arg("consumer")
        .arg("dave")
        .arg("plan")
        .arg("pro")
        .query::<()>(&mut conn)
        .unwrap();
    redis::cmd("SADD")
        .arg("sluice:consumer:dave:keys")
        .arg(&hash)
        .query::<()>(&mut conn)
        .unwrap();
    assert_eq!(
        (0..6).filter(|_| with_key(&a, legacy) == 200).count(),
        6,
        "pro, from the key"
    );
    let (_, shown) = admin(&a, "GET", "/v1/consumers/dave", "");
    assert_eq!(
        (
            &shown["plan"],
            &shown["applied_plan"],
            &shown["keys"][0]["plan"]
        ),
        (
            &serde_json::Value::Null,
            &serde_json::json!("pro"),
            &serde_json::json!("pro")
        ),
        "{shown}"
    );
    let (status, _) = admin(&a, "PUT", "/v1/consumers/dave", r#"{"plan": "free"}"#);
    assert_eq!(status, 200);
    assert_eq!(with_key(&a, legacy), 429, "free now: 6 used of 5");
    // null clears the consumer's plan: the key's own applies again.
    let (status, answer) = admin(&a, "PATCH", "/v1/consumers/dave", r#"{"plan": null}"#);
    assert_eq!(
        (status, &answer["plan"]),
        (200, &serde_json::Value::Null),
        "{answer}"
    );
    assert_eq!(with_key(&a, legacy), 200);
}

#[test]
fn a_plan_a_reload_removes_is_reported_with_its_count_and_gets_the_default() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let with_gold = "free: 5, pro: 50, gold: 100";
    let sluice = start(&redis, &upstream, with_gold);
    let erin = new_key(&sluice, "erin", r#"{"plan": "gold"}"#);
    new_key(&sluice, "frank", r#"{"plan": "gold"}"#);
    new_key(&sluice, "grace", r#"{"plan": "pro"}"#);
    assert_eq!(
        (0..6).filter(|_| with_key(&sluice, &erin) == 200).count(),
        6
    );
    assert!(!sluice.log().contains("have plan `gold`"));

    let config = std::fs::read_to_string(sluice.config_path())
        .unwrap()
        .replace(with_gold, FREE_AND_PRO);
    assert!(sluice.reload(&config));
    wait_until(
        Duration::from_secs(10),
        "the plans in use to be reported",
        || sluice.log().contains("2 consumer(s) have plan `gold`"),
    );
    assert!(
        !sluice.log().contains("have plan `pro`"),
        "{}",
        sluice.log()
    );
    // erin's requests now get the limit's own number (the smallest plan,
    // 5): she has used 6. Logged once, however many requests.
    for _ in 0..3 {
        assert_eq!(with_key(&sluice, &erin), 429);
    }
    let log = sluice.log();
    assert_eq!(
        log.matches("consumer plan `gold` is in no limit's `plans`")
            .count(),
        1,
        "{log}"
    );
}

/// The SHA-256 of `bytes` in lower-case hex.
fn sha256_hex(bytes: &[u8]) -> String {
    use sluice::config::consumers::{hex, key_hash};
    hex(&key_hash(bytes))
}

/// With a consumers file, too, the usage API answers for the consumer's
/// plan without `plan=`.
#[test]
fn usage_answers_for_the_plan_in_the_consumers_file() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    let line = |key: &str| format!("sha256:{}", sha256_hex(key.as_bytes()));
    std::fs::write(
        &consumers,
        format!(
            "consumers:\n  - {{ id: bob, plan: pro, keys: [\"{}\"] }}\n  - {{ id: alice, keys: [\"{}\"] }}\n",
            line("bob-key"),
            line("alice-key")
        ),
    )
    .expect("write consumers");
    let sluice = Sluice::start_with_server(
        "  admin_token_env: SLUICE_ADMIN_TOKEN\n",
        &config(
            &format!(
                "  api_key: {{ header: x-api-key, file: \"{}\" }}",
                consumers.display()
            ),
            "  backend: local",
            &upstream,
            FREE_AND_PRO,
        ),
        &[("SLUICE_ADMIN_TOKEN", TOKEN)],
    );
    assert_eq!(with_key(&sluice, "bob-key"), 200);
    for (user, quota, plan) in [("bob", 50, json!("pro")), ("alice", 5, json!(null))] {
        let path = format!("/v1/usage?route=api&limit=per-customer&user={user}");
        let (status, usage) = admin(&sluice, "GET", &path, "");
        assert_eq!(status, 200, "{usage}");
        assert_eq!(
            (usage["quota"].as_u64(), &usage["plan"]),
            (Some(quota), &plan),
            "{usage}"
        );
    }
}
