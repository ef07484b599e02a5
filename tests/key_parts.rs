//! Query, cookie and path-parameter key parts, on real Redis: every
//! spelling of one value counts on one key, and a part a request carries
//! twice with different values is refused rather than guessed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;

fn gateway(redis: &RedisServer) -> Sluice {
    Sluice::start(&format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
  deny_cache: false
routes:
  - name: search
    match: {{ path: /search }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-key, key: [{{query: key}}], limit: 3, window: 1m, on_missing: skip }}
  - name: session
    match: {{ path: /session }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-session, key: [{{cookie: session}}], limit: 2, window: 1m, on_missing: skip }}
  - name: orders
    match: {{ path: "/users/{{id}}/orders" }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-user, key: [{{param: id}}], limit: 2, window: 1m }}
"#,
        url = redis.url()
    ))
}

fn statuses(sluice: &Sluice, requests: &[(&str, &[(&str, &str)])]) -> Vec<u16> {
    requests
        .iter()
        .map(|(path, headers)| sluice.get(path, headers).status)
        .collect()
}

#[test]
fn a_query_parameter_counts_every_spelling_of_one_value_together() {
    let redis = RedisServer::start();
    let sluice = gateway(&redis);
    let got = statuses(
        &sluice,
        &[
            ("/search?key=abc", &[]),
            ("/search?key=%61bc", &[]),
            ("/search?other=1&%6Bey=abc", &[]),
            ("/search?key=abc", &[]),
            ("/search?key=abc&key=abc", &[]),
            ("/search?key=xyz", &[]),
        ],
    );
    assert_eq!(got, [200, 200, 200, 429, 429, 200], "{}", sluice.log());
    // Two different values: which one the upstream reads is unknown.
    let twice = sluice.get("/search?key=fresh&key=abc", &[]);
    assert_eq!(twice.status, 400);
    assert_eq!(twice.body, r#"{"error":"bad_request"}"#);
    // Absent, with on_missing: skip, the limit does not apply.
    for _ in 0..5 {
        assert_eq!(sluice.get("/search?keys=abc", &[]).status, 200);
    }
    assert_eq!(redis.log_len("sluice:{search:per-key:abc}"), 3);
    // A value no key may hold raw is hashed, and still one key.
    let nasty = "/search?key=%7Bslot%7D%0D%0A";
    let none: &[(&str, &str)] = &[];
    assert_eq!(statuses(&sluice, &[(nasty, none); 4]), [200, 200, 200, 429]);
}

#[test]
fn a_cookie_counts_quoted_and_plain_together() {
    let redis = RedisServer::start();
    let sluice = gateway(&redis);
    let got = statuses(
        &sluice,
        &[
            ("/session", &[("Cookie", "session=s1")]),
            ("/session", &[("Cookie", "theme=dark; session=\"s1\"")]),
            ("/session", &[("Cookie", "session=s1 ; theme=dark")]),
            ("/session", &[("Cookie", "session=s2")]),
            ("/session", &[("Cookie", "Session=s1")]),
        ],
    );
    assert_eq!(got, [200, 200, 429, 200, 200], "{}", sluice.log());
    let split = sluice.get(
        "/session",
        &[("Cookie", "session=s9"), ("Cookie", "session=s1")],
    );
    assert_eq!(split.status, 400, "two cookies of one name, two values");
    // A cookie is a credential: its value is in the key only as its hash.
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(b"s1");
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        redis.log_len(&format!("sluice:{{session:per-session:#{hex}}}")),
        2
    );
    assert!(redis.keys("*s1*").is_empty(), "a cookie's value in Redis");
}

#[test]
fn a_path_parameter_counts_on_the_canonical_segment() {
    let redis = RedisServer::start();
    let sluice = gateway(&redis);
    let got = statuses(
        &sluice,
        &[
            ("/users/1/orders", &[]),
            ("/users/%31/orders", &[]),
            ("/users/1/./orders", &[]),
            ("/users/2/orders", &[]),
        ],
    );
    assert_eq!(got, [200, 200, 429, 200], "{}", sluice.log());
    for path in ["/users//orders", "/users/1/orders/", "/users/1/2/orders"] {
        assert_eq!(sluice.get(path, &[]).status, 404, "{path}");
    }
    assert_eq!(redis.log_len("sluice:{orders:per-user:1}"), 2);
}
