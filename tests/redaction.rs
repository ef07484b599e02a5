//! No credential's value, raw, anywhere an operator or another tenant of
//! Redis can read: limits keyed by an API key's header, a cookie, the
//! `Authorization` header and a header the auth service reads are flooded,
//! then every admin answer (`/v1/top`, `/v1/usage`, `/v1/status`),
//! `/metrics`, the access log and every key in Redis is searched for the
//! values sent. The counters still work: the usage API, asked with the
//! value itself, finds the hashed key.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;

const TOKEN: &str = "redaction-admin-token";
/// Short and made only of the bytes a key keeps raw: the values a key
/// would otherwise hold as they are.
const API_KEY: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
const SESSION: &str = "sess-0123456789abcdef";
const BASIC: &str = "Basic:c2VjcmV0";
const CUSTOM: &str = "cust-secret-42";

fn config(redis: &RedisServer, consumers: &std::path::Path) -> String {
    format!(
        r#"  access_log: stderr
identity:
  - api_key:
      header: x-api-key
      file: "{file}"
  - auth_request:
      url: "http://127.0.0.1:{closed}/auth"
      timeout: 200ms
      headers: [x-custom-cred]
      user_header: x-user
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
routes:
  - name: api
    respond: {{ body: ok }}
    limits:
      - {{ name: by-key, key: [{{header: x-api-key}}], limit: 1, window: 1h }}
      - {{ name: by-session, key: [{{cookie: session}}], limit: 1, window: 1h }}
      - {{ name: by-auth, key: [{{header: authorization}}, method], limit: 1, window: 1h }}
      - {{ name: by-custom, key: [{{header: x-custom-cred}}], limit: 1, window: 1h, on_missing: skip }}
"#,
        file = consumers.display(),
        closed = free_port(),
        url = redis.url()
    )
}

fn admin_get(sluice: &Sluice, path: &str) -> Response {
    let bearer = format!("Bearer {TOKEN}");
    get(sluice.admin, path, &[("Authorization", &bearer)])
}

/// Every place a value could leak to: admin answers, metrics, the log,
/// Redis's keys.
fn everything_readable(sluice: &Sluice, redis: &RedisServer) -> String {
    let mut all = String::new();
    for path in [
        "/v1/top",
        "/v1/top?route=api&limit=by-key",
        "/v1/top?route=api&limit=by-session",
        "/v1/top?route=api&limit=by-auth",
        "/v1/top?route=api&limit=by-custom",
        "/v1/status",
        "/v1/rates",
        "/metrics",
    ] {
        let answer = admin_get(sluice, path);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        all.push_str(&answer.body);
    }
    all.push_str(&sluice.log());
    for key in redis.keys("*") {
        all.push_str(&String::from_utf8_lossy(&key));
        all.push('\n');
    }
    all
}

#[test]
fn no_credential_is_readable_in_admin_answers_metrics_logs_or_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let consumers = dir.path().join("consumers.yaml");
    std::fs::write(&consumers, "consumers: []\n").unwrap();
    let env = [("REDACTION_TOKEN", TOKEN)];
    let sluice = Sluice::start_with_server(
        "  admin_token_env: REDACTION_TOKEN\n",
        &config(&redis, &consumers),
        &env,
    );
    let cookie = format!("session={SESSION}");
    // Unknown API keys, a session cookie and basic credentials: each key
    // is denied on its second request, so each enters the top keys.
    let statuses: Vec<u16> = (0..2)
        .map(|_| {
            sluice
                .get(
                    "/",
                    &[
                        ("X-Api-Key", API_KEY),
                        ("Cookie", &cookie),
                        ("Authorization", BASIC),
                    ],
                )
                .status
        })
        .collect();
    assert_eq!(statuses, [200, 429]);
    // The auth service is down: the credential it reads is still counted
    // (the identity is not required), and its value must not show.
    let custom: Vec<u16> = (0..2)
        .map(|_| sluice.get("/", &[("X-Custom-Cred", CUSTOM)]).status)
        .collect();
    assert_eq!(custom, [200, 429]);

    let readable = everything_readable(&sluice, &redis);
    for secret in [API_KEY, SESSION, BASIC, "c2VjcmV0", CUSTOM] {
        assert!(
            !readable.contains(secret),
            "{secret} is readable:\n{readable}"
        );
    }
    // The top keys still say which limit denied whom, by hash.
    let top = admin_get(&sluice, "/v1/top?route=api&limit=by-key");
    let json: serde_json::Value = serde_json::from_str(&top.body).unwrap();
    let key = json["keys"][0]["key"].as_str().unwrap();
    assert!(key.starts_with('#'), "{key}");

    // The usage API takes the value itself and finds the hashed counter;
    // its answer does not repeat the value.
    let usage = admin_get(
        &sluice,
        &format!("/v1/usage?route=api&limit=by-key&header.x-api-key={API_KEY}"),
    );
    assert_eq!(usage.status, 200, "{}", usage.body);
    assert!(!usage.body.contains(API_KEY), "{}", usage.body);
    let used: serde_json::Value = serde_json::from_str(&usage.body).unwrap();
    assert_eq!(used["used"], 1, "{}", usage.body);
    // The limit's counter in Redis is the hashed key the top keys name.
    let counters: Vec<String> = redis
        .keys("*by-key*")
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert!(counters.iter().any(|c| c.contains(key)), "{counters:?}");
}
