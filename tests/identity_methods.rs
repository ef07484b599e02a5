//! `identity` as a list of methods, through the real binary with a real
//! upstream: the first method whose credential a request carries decides;
//! a credential that is present but invalid is a failure and never falls
//! through to the next method (or a client could pick the weakest); the
//! method that decided is named in the access log and the metrics, and only
//! an API key makes the upstream's `x-consumer-id`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use std::time::Duration;

const SECRET: &str = "an HS256 test secret of 32+ bytes!";
const ACME_KEY: &str = "acme-key-0123456789abcdef0123456789";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token(sub: &str, exp: u64) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": sub, "exp": exp}),
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("sign")
}

fn consumers_file(dir: &std::path::Path) -> std::path::PathBuf {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["key", "hash", ACME_KEY])
        .output()
        .expect("sluice key hash");
    let hash = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    let path = dir.join("consumers.yaml");
    std::fs::write(
        &path,
        format!("consumers:\n  - id: acme\n    keys: [\"{hash}\"]\n"),
    )
    .expect("write consumers");
    path
}

fn start(upstream: &Upstream, consumers: &std::path::Path) -> Sluice {
    let addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let text = format!(
        r#"{server}
identity:
  - jwt: {{ algorithms: [HS256], required: true }}
  - api_key: {{ header: x-api-key, file: "{file}", required: true }}
limiter:
  backend: local
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-user, key: [user], limit: 1000, window: 1m }}
"#,
        server = server_section(addr, admin),
        file = consumers.display(),
        upstream = upstream.addr,
    );
    Sluice::start_with(&text, addr, admin, &[("SLUICE_JWT_SECRET", SECRET)])
}

#[test]
fn the_first_credential_present_decides_and_an_invalid_one_never_falls_through() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let sluice = start(&upstream, &consumers_file(dir.path()));
    let bearer = |t: &str| format!("Bearer {t}");

    // A valid key, no token: admitted as its consumer.
    let by_key = sluice.get("/orders", &[("X-Api-Key", ACME_KEY)]);
    assert_eq!(by_key.status, 200, "{}", by_key.body);
    assert_eq!(
        upstream.last_header("x-consumer-id").as_deref(),
        Some("acme")
    );
    assert_eq!(
        upstream.last_header("x-api-key"),
        None,
        "the key stays at the gateway"
    );

    // A valid token, no key: admitted as its subject; no consumer upstream.
    let alice = token("alice", now() + 300);
    let by_token = sluice.get("/orders", &[("Authorization", &bearer(&alice))]);
    assert_eq!(by_token.status, 200);
    assert_eq!(upstream.last_header("x-consumer-id"), None);

    // An invalid token with a valid key: the token decides, and fails.
    let expired = token("alice", now() - 120);
    for bad in [expired.as_str(), "garbage"] {
        let refused = sluice.get(
            "/orders",
            &[("Authorization", &bearer(bad)), ("X-Api-Key", ACME_KEY)],
        );
        assert_eq!(refused.status, 401, "no fall-through to the key ({bad})");
    }
    // A client-sent x-consumer-id never reaches the upstream as is.
    let forged = sluice.get(
        "/orders",
        &[
            ("Authorization", &bearer(&alice)),
            ("X-Consumer-Id", "acme"),
        ],
    );
    assert_eq!(forged.status, 200);
    assert_eq!(upstream.last_header("x-consumer-id"), None);

    // An unknown key, and nothing at all: refused.
    assert_eq!(
        sluice
            .get("/orders", &[("X-Api-Key", "invented-key-000000000000")])
            .status,
        401
    );
    assert_eq!(sluice.get("/orders", &[]).status, 401);

    let metrics = sluice.metrics();
    let count = |method: &str, result: &str| {
        metric_value(
            &metrics,
            &format!("sluice_identity_requests_total{{method=\"{method}\",result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("api_key", "known"), 1);
    assert_eq!(count("api_key", "invalid"), 1);
    assert_eq!(count("jwt", "known"), 2);
    assert_eq!(count("jwt", "invalid"), 2);
    assert_eq!(count("none", "absent"), 1);
    // The access log is written by a thread of its own: its lines come
    // shortly after the answers.
    wait_until(Duration::from_secs(10), "the access log lines", || {
        let log = sluice.log();
        log.contains(r#""identity":"api_key""#)
            && log.contains(r#""identity":"jwt""#)
            && log.contains(r#""consumer":"acme""#)
    });
}

#[test]
fn a_list_of_methods_is_checked_where_written() {
    for (identity, at, message) in [
        (
            "identity: []\n",
            ":1:",
            "`identity` needs at least one method",
        ),
        (
            "identity:\n  - header: x-user\n  - header: x-other\n",
            ":3:",
            "lists `header` twice",
        ),
        (
            "identity:\n  - header: x-user\n  - { jwt: {}, header: x-user }\n",
            ":3:",
            "exactly one of",
        ),
        ("identity:\n  - jwtt: {}\n", ":2:", "unknown field `jwtt`"),
    ] {
        let (code, out) = check_config(&format!(
            "{identity}routes:\n  - name: r\n    respond: {{}}\n"
        ));
        assert_eq!(code, Some(1), "{identity}: {out}");
        assert!(
            out.contains(at) && out.contains(message),
            "{identity}: {out}"
        );
    }
}

#[test]
fn a_junk_credential_of_an_optional_method_never_skips_a_required_one() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let consumers = consumers_file(dir.path());
    let addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let identity = format!(
        "identity:\n  - jwt: {{ algorithms: [HS256], required: false }}\n  - api_key: {{ header: x-api-key, file: \"{}\", required: true }}\n",
        consumers.display()
    );
    let routes = format!(
        "limiter:\n  backend: local\nupstreams:\n  api: {{ servers: [\"{}\"] }}\nroutes:\n  - name: api\n    upstream: api\n",
        upstream.addr
    );
    let text = format!("{}{identity}{routes}", server_section(addr, admin));
    // `--check` says what the mix means.
    let dir_of_config = tempfile::tempdir().unwrap();
    let path = dir_of_config.path().join("sluice.yaml");
    std::fs::write(&path, &text).unwrap();
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--check")
        .arg("--config")
        .arg(&path)
        .env("SLUICE_JWT_SECRET", SECRET)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&checked.stderr);
    assert_eq!(checked.status.code(), Some(0), "{out}");
    assert!(
        out.contains("warning") && out.contains("`jwt` is optional but another method"),
        "{out}"
    );
    let sluice = Sluice::start_with(&text, addr, admin, &[("SLUICE_JWT_SECRET", SECRET)]);
    let status = |headers: &[(&str, &str)]| sluice.get("/orders", headers).status;
    assert_eq!(status(&[]), 401, "no credential");
    let expired = format!("Bearer {}", token("alice", now() - 120));
    for junk in [
        "Bearer garbage",
        "Bearer ",
        "Basic YWxpY2U6cHc=",
        expired.as_str(),
    ] {
        assert_eq!(status(&[("Authorization", junk)]), 401, "{junk}");
    }
    let twice = [("Authorization", "Bearer a"), ("Authorization", "Bearer b")];
    assert_eq!(status(&twice), 401, "a token sent twice");
    assert_eq!(upstream.hits(), 0, "nothing went upstream anonymously");
    // Valid credentials of either method are served.
    let alice = format!("Bearer {}", token("alice", now() + 300));
    assert_eq!(status(&[("Authorization", &alice)]), 200);
    assert_eq!(status(&[("X-Api-Key", ACME_KEY)]), 200);
    assert_eq!(upstream.hits(), 2);
}

/// A 401's `WWW-Authenticate` names what the client can do: for a missing
/// credential, the schemes of the configured methods (a bearer token
/// without an error: the client has no token to get wrong; where the API
/// key goes); for an invalid one, the method that failed — never a bearer
/// token's `invalid_token` for a missing or unknown API key.
#[test]
fn a_401_challenges_with_the_method_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let sluice = start(&upstream, &consumers_file(dir.path()));
    let challenge = |headers: &[(&str, &str)]| {
        let response = sluice.get("/x", headers);
        assert_eq!(response.status, 401, "{headers:?}");
        response.header("www-authenticate").map(str::to_string)
    };
    assert_eq!(
        challenge(&[]).as_deref(),
        Some(r#"Bearer, ApiKey header="x-api-key""#)
    );
    assert_eq!(
        challenge(&[("x-api-key", "not-a-known-key")]).as_deref(),
        Some(r#"ApiKey header="x-api-key""#)
    );
    assert_eq!(
        challenge(&[("Authorization", "Bearer garbage")]).as_deref(),
        Some(r#"Bearer error="invalid_token""#)
    );
    let expired = format!("Bearer {}", token("alice", now() - 3600));
    assert_eq!(
        challenge(&[("Authorization", &expired)]).as_deref(),
        Some(r#"Bearer error="invalid_token""#)
    );
}

/// API keys alone: a missing key's 401 names the key's header, no bearer
/// token.
#[test]
fn an_api_key_401_names_the_key_not_a_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&format!(
        r#"identity:
  api_key: {{ query: api_key, file: "{file}", required: true }}
limiter: {{ backend: local }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - {{ name: api, upstream: api }}
"#,
        file = consumers_file(dir.path()).display(),
        upstream = upstream.addr,
    ));
    for path in ["/x", "/x?api_key=wrong"] {
        let response = sluice.get(path, &[]);
        assert_eq!(response.status, 401);
        assert_eq!(
            response.header("www-authenticate"),
            Some(r#"ApiKey query="api_key""#),
            "{path}"
        );
    }
}
