//! `identity.jwt` keys by a verified claim only. Expired,
//! not-yet-valid, wrongly signed, `alg: none`, algorithm-confused and garbage
//! tokens never key by the claim they carry.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const SECRET: &str = "an HS256 test secret of 32+ bytes!";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn sign(algorithm: Algorithm, key: &EncodingKey, claims: serde_json::Value) -> String {
    encode(&Header::new(algorithm), &claims, key).expect("sign")
}

fn hs256(claims: serde_json::Value) -> String {
    sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(SECRET.as_bytes()),
        claims,
    )
}

fn start(redis: &RedisServer, identity: &str, limit: u64) -> Sluice {
    let addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let text = format!(
        r#"{server}
identity:
{identity}
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
routes:
  - name: api
    respond: {{ body: ok }}
    limits:
      - {{ name: per-user, key: [user], limit: {limit}, window: 30s, on_missing: skip }}
"#,
        server = server_section(addr, admin),
        url = redis.url(),
    );
    Sluice::start_with(&text, addr, admin, &[("SLUICE_JWT_SECRET", SECRET)])
}

fn with_token(sluice: &Sluice, token: &str) -> u16 {
    sluice
        .get("/", &[("Authorization", &format!("Bearer {token}"))])
        .status
}

/// The limits' keys in Redis (a packed log's, without its `!l`).
fn keys(redis: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis
        .keys("sluice:*")
        .into_iter()
        .map(|k| {
            String::from_utf8_lossy(&k)
                .trim_end_matches("!l")
                .to_string()
        })
        .collect();
    keys.sort();
    keys
}

#[test]
fn hs256_tokens_key_by_their_verified_claim_only() {
    let redis = RedisServer::start();
    let sluice = start(&redis, "  jwt: { algorithms: [HS256], claim: sub }", 2);
    let alice = hs256(json!({"sub": "alice", "exp": now() + 300}));
    assert_eq!(with_token(&sluice, &alice), 200);
    assert_eq!(with_token(&sluice, &alice), 200);
    assert_eq!(with_token(&sluice, &alice), 429, "alice's own limit");
    let bob = hs256(json!({"sub": "bob", "exp": now() + 300}));
    assert_eq!(with_token(&sluice, &bob), 200, "bob has his own counter");

    // Every one of these claims to be alice, whose counter is full: were any
    // keyed by the claim, it would be denied. Unverified, the user part is
    // missing and `on_missing: skip` lets it through unlimited.
    let expired = hs256(json!({"sub": "alice", "exp": now() - 120}));
    let not_yet = hs256(json!({"sub": "alice", "exp": now() + 300, "nbf": now() + 120}));
    let forged = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(b"not the secret, but just as long!!"),
        json!({"sub": "alice", "exp": now() + 300}),
    );
    let no_exp = hs256(json!({"sub": "alice"}));
    let hs512 = sign(
        Algorithm::HS512,
        &EncodingKey::from_secret(SECRET.as_bytes()),
        json!({"sub": "alice", "exp": now() + 300}),
    );
    // {"alg":"none"} . {"sub":"alice","exp":9999999999} . (no signature)
    let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0.";
    let mut tampered = alice.clone();
    tampered.pop();
    tampered.push(if alice.ends_with('A') { 'B' } else { 'A' });
    for (what, token) in [
        ("expired", expired.as_str()),
        ("not yet valid", not_yet.as_str()),
        ("wrong signature", forged.as_str()),
        ("no exp", no_exp.as_str()),
        ("algorithm not configured", hs512.as_str()),
        ("alg none", none),
        ("tampered", tampered.as_str()),
        ("garbage", "not.a.token"),
        ("empty", ""),
    ] {
        assert_eq!(with_token(&sluice, token), 200, "{what}");
    }
    assert_eq!(
        sluice.get("/", &[("Authorization", alice.as_str())]).status,
        200,
        "a token without the Bearer scheme is not believed"
    );
    assert_eq!(
        keys(&redis),
        ["sluice:{api:per-user:alice}", "sluice:{api:per-user:bob}"]
    );
    assert_eq!(redis.log_len("sluice:{api:per-user:alice}"), 2);
}

#[test]
fn required_tokens_answer_401_without_one() {
    let redis = RedisServer::start();
    let sluice = start(&redis, "  jwt: { algorithms: [HS256], required: true }", 5);
    let missing = sluice.get("/", &[]);
    assert_eq!(missing.status, 401);
    assert!(missing
        .header("www-authenticate")
        .is_some_and(|v| v.starts_with("Bearer")));
    let expired = hs256(json!({"sub": "alice", "exp": now() - 120}));
    assert_eq!(with_token(&sluice, &expired), 401);
    assert_eq!(with_token(&sluice, "garbage"), 401);
    let alice = hs256(json!({"sub": "alice", "exp": now() + 300}));
    assert_eq!(with_token(&sluice, &alice), 200);
    assert_eq!(keys(&redis), ["sluice:{api:per-user:alice}"]);
}

fn public_key_case(algorithm: Algorithm, name: &str, private: &str, public: &str) {
    let redis = RedisServer::start();
    let sluice = start(
        &redis,
        &format!(
            "  jwt: {{ algorithms: [{name}], public_key_file: \"{}\", claim: uid }}",
            fixture(public)
        ),
        1,
    );
    let pem = std::fs::read(fixture(private)).unwrap();
    let key = match algorithm {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
        _ => EncodingKey::from_ec_pem(&pem),
    }
    .unwrap();
    let carol = sign(algorithm, &key, json!({"uid": 1234, "exp": now() + 300}));
    assert_eq!(with_token(&sluice, &carol), 200);
    assert_eq!(with_token(&sluice, &carol), 429, "{name}: keyed by uid");
    // The algorithm-confusion attack: HS256 with the public key as secret.
    let public_pem = std::fs::read(fixture(public)).unwrap();
    let confused = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&public_pem),
        json!({"uid": 1234, "exp": now() + 300}),
    );
    assert_eq!(
        with_token(&sluice, &confused),
        200,
        "{name}: confusion ignored"
    );
    assert_eq!(keys(&redis), ["sluice:{api:per-user:1234}"]);
}

#[test]
fn rs256_tokens_verify_with_the_public_key() {
    public_key_case(Algorithm::RS256, "RS256", "jwt_rs256.key", "jwt_rs256.pub");
}

#[test]
fn es256_tokens_verify_with_the_public_key() {
    public_key_case(Algorithm::ES256, "ES256", "jwt_es256.key", "jwt_es256.pub");
}

/// An HS256 token whose header is `header` as written, signed with the
/// test secret.
fn hs256_with_header(header: &str, claims: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let message = format!(
        "{}.{}",
        b64(header.as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256).expect("sign");
    format!("{message}.{signature}")
}

#[test]
fn a_token_with_a_critical_extension_is_refused() {
    let redis = RedisServer::start();
    let sluice = start(&redis, "  jwt: { algorithms: [HS256], required: true }", 5);
    let claims = json!({"sub": "alice", "exp": now() + 300});
    let plain = hs256_with_header(r#"{"alg":"HS256","typ":"JWT"}"#, claims.clone());
    assert_eq!(with_token(&sluice, &plain), 200);
    for header in [
        r#"{"alg":"HS256","crit":["b64"],"b64":false}"#,
        r#"{"alg":"HS256","crit":["http://example.test/ext"]}"#,
        r#"{"alg":"HS256","crit":"b64"}"#,
    ] {
        let token = hs256_with_header(header, claims.clone());
        assert_eq!(with_token(&sluice, &token), 401, "{header}");
    }
}
