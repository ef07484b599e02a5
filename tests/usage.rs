//! The usage API on the admin listener, on real Redis: it agrees with Redis
//! before and after traffic, never consumes, resets a key, refuses bad
//! questions with JSON, and guards itself with a token.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::SocketAddr;

fn body(redis: &RedisServer) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
routes:
  - name: api
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-key, key: [{{header: X-Key}}, {{query: region}}], limit: 5, window: 1m, block_for: 1h }}
"#,
        url = redis.url()
    )
}

fn usage(
    admin: SocketAddr,
    method: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> (u16, serde_json::Value) {
    let response = request(admin, method, &format!("/v1/usage?{query}"), headers);
    let json = serde_json::from_str(&response.body).unwrap_or(serde_json::Value::Null);
    (response.status, json)
}

const KEY: &str = "route=api&limit=per-key&header.x-key=k%201&query.region=eu";

#[test]
fn usage_agrees_with_redis_and_a_reset_clears_the_key() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(&body(&redis));
    let (status, before) = usage(sluice.admin, "GET", KEY, &[]);
    assert_eq!(status, 200, "{before}");
    assert_eq!(
        before,
        serde_json::json!({"route": "api", "limit": "per-key", "quota": 5, "used": 0, "remaining": 5, "reset_seconds": 0})
    );
    let send = || sluice.get("/?region=eu", &[("X-Key", "k 1")]).status;
    assert_eq!((0..3).map(|_| send()).collect::<Vec<_>>(), [200; 3]);
    for _ in 0..5 {
        let (_, now) = usage(sluice.admin, "GET", KEY, &[]);
        assert_eq!(
            (now["used"].as_u64(), now["remaining"].as_u64()),
            (Some(3), Some(2))
        );
        assert!(
            (30..=60).contains(&now["reset_seconds"].as_u64().unwrap_or(0)),
            "{now}"
        );
    }
    let key = "sluice:{api:per-key:#";
    let keys = redis.keys(&format!("{key}*"));
    assert_eq!(keys.len(), 1, "one counter, hashed parts");
    let counter = String::from_utf8(keys[0].clone()).unwrap();
    let counter = counter.trim_end_matches("!l");
    assert_eq!(redis.log_len(counter), 3, "asking consumed nothing");
    // Used up and boxed, then reset by support: the key passes again.
    assert_eq!((0..3).map(|_| send()).collect::<Vec<_>>(), [200, 200, 429]);
    let (_, full) = usage(sluice.admin, "GET", KEY, &[]);
    assert_eq!(full["remaining"], 0, "{full}");
    let (status, reset) = usage(sluice.admin, "DELETE", KEY, &[]);
    assert_eq!(status, 200, "{reset}");
    assert_eq!(reset["reset"], true);
    assert!(redis.keys("sluice:*").is_empty(), "count and box deleted");
    let (_, after) = usage(sluice.admin, "GET", KEY, &[]);
    assert_eq!(after["used"], 0);
    assert_eq!(send(), 200);
}

#[test]
fn bad_questions_get_json_errors() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(&body(&redis));
    let cases = [
        ("GET", "limit=per-key", 400, "missing_parameter"),
        ("GET", "route=nope&limit=per-key", 404, "unknown_route"),
        ("GET", "route=api&limit=nope", 404, "unknown_limit"),
        (
            "GET",
            "route=api&limit=per-key&query.region=eu",
            400,
            "missing_part",
        ),
        (
            "GET",
            "route=api&route=x&limit=per-key",
            400,
            "ambiguous_parameter",
        ),
        ("POST", KEY, 405, "method_not_allowed"),
    ];
    for (method, query, want_status, want_error) in cases {
        let (status, json) = usage(sluice.admin, method, query, &[]);
        assert_eq!(
            (status, json["error"].as_str()),
            (want_status, Some(want_error)),
            "{query}: {json}"
        );
    }
    let (_, missing) = usage(
        sluice.admin,
        "GET",
        "route=api&limit=per-key&query.region=eu",
        &[],
    );
    assert_eq!(missing["part"], "header.x-key");
}

#[test]
fn the_api_needs_its_token_or_a_loopback_listener() {
    let redis = RedisServer::start();
    let guarded = Sluice::start_with_server(
        "  admin_token_env: SLUICE_TEST_ADMIN_TOKEN\n",
        &body(&redis),
        &[("SLUICE_TEST_ADMIN_TOKEN", "s3cret-token")],
    );
    assert_eq!(usage(guarded.admin, "GET", KEY, &[]).0, 401);
    assert_eq!(
        usage(
            guarded.admin,
            "GET",
            KEY,
            &[("Authorization", "Bearer wrong")]
        )
        .0,
        401
    );
    let (status, _) = usage(
        guarded.admin,
        "GET",
        KEY,
        &[("Authorization", "Bearer s3cret-token")],
    );
    assert_eq!(status, 200);
    // /metrics stays open for scrapers.
    assert_eq!(get(guarded.admin, "/metrics", &[]).status, 200);

    // A public admin listener without a token: the API refuses.
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let port = free_port();
    let public: SocketAddr = format!("0.0.0.0:{port}").parse().unwrap();
    let text = format!(
        "server:\n  listen: [\"{addr}\"]\n  admin: \"{public}\"\n  threads: 1\n  grace_period: 1s\n{}",
        body(&redis)
    );
    let open = Sluice::start_with(
        &text,
        addr,
        format!("127.0.0.1:{port}").parse().unwrap(),
        &[],
    );
    let (status, json) = usage(open.admin, "GET", KEY, &[]);
    assert_eq!(
        (status, json["error"].as_str()),
        (403, Some("forbidden")),
        "{json}"
    );
}
