//! `identity.jwt` with an identity provider's keys: a JWKS server of the
//! test's own (plain HTTP on loopback) serving keys made by `openssl`, and
//! the real binary verifying tokens signed with them.
//!
//! - a token whose `kid` is in the set is admitted; the provider rotates (a
//!   new key added, the old one removed) and a token with the new `kid` is
//!   admitted without a restart or a reload, within `jwks_min_refresh`; the
//!   old key's tokens are refused after the rotation;
//! - a thousand tokens naming invented `kid`s make at most one fetch per
//!   `jwks_min_refresh`;
//! - the JWKS server down at start: sluice starts and is ready, tokens are
//!   refused (`required`), `/metrics` counts the failed fetches, and once the
//!   server is up a token is admitted;
//! - `alg: none`, HS256 signed with the RSA public key, a `kid` the set lacks,
//!   a wrong `iss`, another application's `aud`, expired and not-yet-valid
//!   tokens are all refused; EC (P-256, P-384) and Ed25519 keys verify.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ISSUER: &str = "https://id.example.test/";
const AUDIENCE: &str = "orders-api";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A private key made by `openssl genpkey` with `args`, as PEM.
fn openssl_key(dir: &Path, name: &str, args: &[&str]) -> Vec<u8> {
    let path = dir.join(name);
    let status = installed("openssl", "openssl")
        .arg("genpkey")
        .args(args)
        .arg("-out")
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl genpkey {args:?}");
    std::fs::read(path).expect("read the key")
}

/// One signing key: how tokens are signed with it and its public JWK.
struct Key {
    kid: String,
    algorithm: Algorithm,
    signing: EncodingKey,
    jwk: serde_json::Value,
}

impl Key {
    fn rsa(dir: &Path, kid: &str) -> Self {
        let pem = openssl_key(
            dir,
            kid,
            &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        );
        Self::from_pem(
            kid,
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(&pem).expect("RSA key"),
        )
    }

    fn ec(dir: &Path, kid: &str, curve: &str, algorithm: Algorithm) -> Self {
        let pem = openssl_key(
            dir,
            kid,
            &[
                "-algorithm",
                "EC",
                "-pkeyopt",
                &format!("ec_paramgen_curve:{curve}"),
            ],
        );
        Self::from_pem(
            kid,
            algorithm,
            EncodingKey::from_ec_pem(&pem).expect("EC key"),
        )
    }

    fn ed25519(dir: &Path, kid: &str) -> Self {
        let pem = openssl_key(dir, kid, &["-algorithm", "ed25519"]);
        // The public key: the last 32 bytes of its DER form.
        let der = installed("openssl", "openssl")
            .args(["pkey", "-pubout", "-outform", "DER", "-in"])
            .arg(dir.join(kid))
            .output()
            .expect("openssl pkey");
        let public = &der.stdout[der.stdout.len() - 32..];
        use base64::Engine as _;
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public);
        Key {
            kid: kid.into(),
            algorithm: Algorithm::EdDSA,
            signing: EncodingKey::from_ed_pem(&pem).expect("Ed25519 key"),
            jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig"}),
        }
    }

    fn from_pem(kid: &str, algorithm: Algorithm, signing: EncodingKey) -> Self {
        let mut jwk =
            serde_json::to_value(Jwk::from_encoding_key(&signing, algorithm).expect("JWK"))
                .expect("JWK as JSON");
        jwk["kid"] = kid.into();
        jwk["use"] = "sig".into();
        Key {
            kid: kid.into(),
            algorithm,
            signing,
            jwk,
        }
    }

    /// A token for `sub` with the usual claims and `extra` ones on top.
    fn token(&self, sub: &str, extra: serde_json::Value) -> String {
        let mut claims = json!({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 300});
        for (name, value) in extra.as_object().into_iter().flatten() {
            claims[name] = value.clone();
        }
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        encode(&header, &claims, &self.signing).expect("sign")
    }
}

/// A JWKS document of `keys`.
fn document(keys: &[&Key]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

/// The test's identity provider: serves its current JWKS document over
/// plain HTTP and counts the fetches.
struct Provider {
    port: u16,
    document: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
}

impl Provider {
    fn start(document: String) -> Self {
        Self::start_on(free_port(), document)
    }

    fn start_on(port: u16, document: String) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the JWKS server");
        let shared = Arc::new(Mutex::new(document));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (Arc::clone(&shared), Arc::clone(&fetches));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let body = served.lock().unwrap().clone();
                let mut stream = &stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Provider {
            port,
            document: shared,
            fetches,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/.well-known/jwks.json", self.port)
    }

    fn serve(&self, document: String) {
        *self.document.lock().unwrap() = document;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// sluice with `required` JWT identity from `jwks_url`, answering 200.
fn start(url: &str, algorithms: &str, min_refresh: &str) -> Sluice {
    Sluice::start(&format!(
        r#"identity:
  jwt:
    jwks_url: "{url}"
    jwks_refresh: 1h
    jwks_min_refresh: {min_refresh}
    algorithms: [{algorithms}]
    issuer: "{ISSUER}"
    audiences: [{AUDIENCE}, billing-api]
    required: true
limiter:
  backend: local
routes:
  - name: api
    respond: {{ body: ok }}
    limits:
      - {{ name: per-user, key: [user], limit: 1000, window: 1m }}
"#
    ))
}

fn status(sluice: &Sluice, token: &str) -> u16 {
    sluice
        .get("/", &[("Authorization", &format!("Bearer {token}"))])
        .status
}

#[test]
fn a_rotation_is_followed_without_a_restart_and_the_old_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let old = Key::rsa(dir.path(), "2026-old");
    let new = Key::rsa(dir.path(), "2026-new");
    let provider = Provider::start(document(&[&old]));
    let sluice = start(&provider.url(), "RS256", "1s");
    let alice = old.token("alice", json!({}));
    wait_until(Duration::from_secs(10), "the first JWKS fetch", || {
        status(&sluice, &alice) == 200
    });
    assert_eq!(
        status(&sluice, &new.token("bob", json!({}))),
        401,
        "not yet published"
    );

    // The provider rotates: the new key added, the old one removed.
    provider.serve(document(&[&new]));
    let started = Instant::now();
    let bob = new.token("bob", json!({}));
    wait_until(
        Duration::from_secs(10),
        "the new key's token admitted",
        || status(&sluice, &bob) == 200,
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "admitted after {:?}: an unknown kid fetches within jwks_min_refresh (1s)",
        started.elapsed()
    );
    assert_eq!(
        status(&sluice, &alice),
        401,
        "the removed key's token is refused"
    );
    let metrics = sluice.metrics();
    assert!(
        metric_value(
            &metrics,
            "sluice_identity_jwks_fetches_total{result=\"ok\"}"
        ) >= 2
    );
    assert_eq!(metric_value(&metrics, "sluice_identity_jwks_keys"), 1);
}

#[test]
fn invented_kids_fetch_at_most_once_per_min_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::rsa(dir.path(), "real");
    let provider = Provider::start(document(&[&key]));
    let sluice = start(&provider.url(), "RS256", "2s");
    let real = key.token("alice", json!({}));
    wait_until(Duration::from_secs(10), "the first JWKS fetch", || {
        status(&sluice, &real) == 200
    });
    let before = provider.fetches();
    let started = Instant::now();
    let mut header = Header::new(Algorithm::RS256);
    for n in 0..1000 {
        header.kid = Some(format!("invented-{n}"));
        let claims = json!({"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 300});
        let token = encode(&header, &claims, &key.signing).expect("sign");
        assert_eq!(status(&sluice, &token), 401, "kid invented-{n}");
    }
    let seconds = started.elapsed().as_secs_f64();
    let fetched = provider.fetches() - before;
    let most = (seconds / 2.0).ceil() as usize + 1;
    assert!(
        fetched <= most,
        "{fetched} fetches in {seconds:.1} s of invented kids (at most {most})"
    );
    assert_eq!(status(&sluice, &real), 200, "the real key still verifies");
}

#[test]
fn a_provider_down_at_start_keeps_sluice_up_and_its_keys_arrive_later() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::rsa(dir.path(), "k1");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/jwks");
    let sluice = start(&url, "RS256", "1s");
    let token = key.token("alice", json!({}));
    assert_eq!(
        status(&sluice, &token),
        401,
        "no keys: the identity is missing"
    );
    wait_until(Duration::from_secs(10), "a failed fetch counted", || {
        metric_value(
            &sluice.metrics(),
            "sluice_identity_jwks_fetches_total{result=\"error\"}",
        ) >= 1
    });
    assert_eq!(
        metric_value(
            &sluice.metrics(),
            "sluice_identity_jwks_last_success_timestamp_seconds"
        ),
        0
    );
    assert_eq!(
        get(sluice.admin, "/readyz", &[]).status,
        200,
        "ready without the provider's keys"
    );
    let _provider = Provider::start_on(port, document(&[&key]));
    wait_until(
        Duration::from_secs(10),
        "the key fetched once the provider is up",
        || status(&sluice, &token) == 200,
    );
}

#[test]
fn forged_confused_and_misaddressed_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = Key::rsa(dir.path(), "rsa");
    let p256 = Key::ec(dir.path(), "p256", "P-256", Algorithm::ES256);
    let p384 = Key::ec(dir.path(), "p384", "P-384", Algorithm::ES384);
    let ed = Key::ed25519(dir.path(), "ed");
    let provider = Provider::start(document(&[&rsa, &p256, &p384, &ed]));
    let sluice = start(&provider.url(), "RS256, ES256, ES384, EdDSA", "1s");
    for key in [&rsa, &p256, &p384, &ed] {
        let token = key.token("alice", json!({}));
        wait_until(
            Duration::from_secs(10),
            &format!("{} verifies", key.kid),
            || status(&sluice, &token) == 200,
        );
    }
    assert_eq!(
        status(
            &sluice,
            &rsa.token("alice", json!({"aud": ["spa", "billing-api"]}))
        ),
        200
    );

    // The algorithm-confusion attack: HS256 with the RSA public key (its
    // JWK's modulus, and its PEM) as the secret, naming the RSA key.
    let n = rsa.jwk["n"].as_str().unwrap().to_string();
    let public_pem = installed("openssl", "openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(dir.path().join("rsa"))
        .output()
        .expect("openssl pkey")
        .stdout;
    let claims = json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 300});
    let mut hs256 = Header::new(Algorithm::HS256);
    hs256.kid = Some("rsa".into());
    let confused_pem = encode(&hs256, &claims, &EncodingKey::from_secret(&public_pem)).unwrap();
    let confused_n = encode(&hs256, &claims, &EncodingKey::from_secret(n.as_bytes())).unwrap();
    // ES256 naming the P-384 key; RS256 naming the EC key.
    let mut wrong_curve = Header::new(Algorithm::ES256);
    wrong_curve.kid = Some("p384".into());
    let wrong_curve = encode(&wrong_curve, &claims, &p256.signing).unwrap();
    let mut no_kid = Header::new(Algorithm::RS256);
    no_kid.kid = None;
    let no_kid = encode(&no_kid, &claims, &rsa.signing).unwrap();
    // {"alg":"none","kid":"rsa"} . claims . (no signature)
    use base64::Engine as _;
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "kid": "rsa"})),
        b64(&claims)
    );
    let unlisted = {
        let other = Key::rsa(dir.path(), "unlisted");
        other.token("alice", json!({}))
    };
    for (what, token) in [
        ("HS256 with the public key's PEM", confused_pem),
        ("HS256 with the modulus", confused_n),
        ("ES256 naming a P-384 key", wrong_curve),
        ("no kid", no_kid),
        ("alg none", none),
        ("a kid the set lacks", unlisted),
        (
            "wrong issuer",
            rsa.token("alice", json!({"iss": "https://evil.example.test/"})),
        ),
        (
            "another application's audience",
            rsa.token("alice", json!({"aud": "another-teams-spa"})),
        ),
        (
            "no audience",
            rsa.token("alice", json!({"aud": serde_json::Value::Null})),
        ),
        ("expired", rsa.token("alice", json!({"exp": now() - 120}))),
        (
            "not yet valid",
            rsa.token("alice", json!({"nbf": now() + 120})),
        ),
    ] {
        assert_eq!(status(&sluice, &token), 401, "{what}");
    }
}

#[test]
fn a_jwks_file_verifies_without_a_url_and_a_bad_one_is_refused_where_written() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::ec(dir.path(), "file-key", "P-256", Algorithm::ES256);
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, document(&[&key])).unwrap();
    let sluice = Sluice::start(&format!(
        "identity:\n  jwt: {{ jwks_file: \"{}\", algorithms: [ES256], audiences: [{AUDIENCE}], required: true }}\nlimiter:\n  backend: local\nroutes:\n  - name: api\n    respond: {{ body: ok }}\n",
        file.display()
    ));
    assert_eq!(status(&sluice, &key.token("alice", json!({}))), 200);

    std::fs::write(
        &file,
        r#"{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}"#,
    )
    .unwrap();
    let (code, out) = check_config(&format!(
        "identity:\n  jwt: {{ jwks_file: \"{}\" }}\nroutes:\n  - name: api\n    respond: {{}}\n",
        file.display()
    ));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(":2:21:") && out.contains("no usable signing key"),
        "{out}"
    );
    // Fetching keys in the clear from another host is refused; a JWKS
    // without `audiences` is accepted with a warning.
    let (code, out) = check_config(
        "identity:\n  jwt: { jwks_url: \"http://id.example.test/jwks\" }\nroutes:\n  - name: api\n    respond: {}\n",
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("must be an https:// URL"), "{out}");
    let (code, out) = check_config(
        "identity:\n  jwt: { jwks_url: \"https://id.example.test/jwks\" }\nroutes:\n  - name: api\n    respond: {}\n",
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("warning") && out.contains("set `audiences`"),
        "{out}"
    );
}

#[test]
fn two_keys_under_one_kid_are_a_config_error_in_a_file_and_refused_from_a_url() {
    let dir = tempfile::tempdir().unwrap();
    let first = Key::ec(dir.path(), "shared", "P-256", Algorithm::ES256);
    let second = Key::ec(dir.path(), "shared-2", "P-256", Algorithm::ES256);
    let mut twin = second.jwk.clone();
    twin["kid"] = "shared".into();
    let other = Key::ec(dir.path(), "other", "P-256", Algorithm::ES256);
    let both = json!({"keys": [first.jwk, twin, other.jwk]}).to_string();

    let file = dir.path().join("jwks.json");
    std::fs::write(&file, &both).unwrap();
    let (code, out) = check_config(&format!(
        "identity:\n  jwt: {{ jwks_file: \"{}\", algorithms: [ES256], audiences: [a] }}\nroutes:\n  - name: api\n    respond: {{}}\n",
        file.display()
    ));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(":2:21:") && out.contains("two usable keys share the kid `shared`"),
        "{out}"
    );

    // From a URL: a warning, and the kid names no key; the others work.
    let provider = Provider::start(both);
    let sluice = start(&provider.url(), "ES256", "1s");
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("shared".into());
    let claims = json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 300});
    let by_second = encode(&header, &claims, &second.signing).unwrap();
    let by_first = first.token("alice", json!({}));
    wait_until(std::time::Duration::from_secs(10), "the keys", || {
        status(&sluice, &other.token("bob", json!({}))) == 200
    });
    assert_eq!(
        status(&sluice, &by_first),
        401,
        "the first key under `shared`"
    );
    assert_eq!(
        status(&sluice, &by_second),
        401,
        "the second key under `shared`"
    );
    let log = sluice.log();
    assert!(
        log.contains("two usable keys share the kid `shared`"),
        "{log}"
    );
}

#[test]
fn refresh_intervals_and_leeway_are_bounded() {
    for (jwt, at, message) in [
        (
            "{ jwks_url: \"https://id.example.test/j\", audiences: [a], jwks_refresh: 0s }",
            ":2:",
            "`jwks_refresh` must be at least 1s",
        ),
        (
            "{ jwks_url: \"https://id.example.test/j\", audiences: [a], jwks_min_refresh: 500ms }",
            ":2:",
            "`jwks_min_refresh` must be at least 1s",
        ),
        (
            "{ secret_env: HOME, leeway: 30000d }",
            ":2:",
            "`leeway` must be at most 1h",
        ),
        (
            "{ secret_env: HOME, leeway: 61m }",
            ":2:",
            "`leeway` must be at most 1h",
        ),
    ] {
        let (code, out) = check_config(&format!(
            "identity:\n  jwt: {jwt}\nroutes:\n  - name: api\n    respond: {{}}\n"
        ));
        assert_eq!(code, Some(1), "{jwt}: {out}");
        assert!(out.contains(at) && out.contains(message), "{jwt}: {out}");
    }
    let (code, out) = check_config(
        "identity:\n  jwt: { jwks_url: \"https://id.example.test/j\", audiences: [a], jwks_refresh: 1s, jwks_min_refresh: 1s, leeway: 1h }\nroutes:\n  - name: api\n    respond: {}\n",
    );
    assert_eq!(code, Some(0), "the bounds themselves: {out}");
}
