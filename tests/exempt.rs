//! `exempt:` on real Redis: exempt requests consume nothing and are counted
//! as `decision="exempt"`; only what the gateway can believe exempts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;

const SECRET: &str = "an HS256 test secret of 32+ bytes!";

fn token(claims: serde_json::Value) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 300;
    let mut claims = claims;
    claims["exp"] = json!(exp);
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    let signed = encode(&Header::default(), &claims, &key).expect("sign");
    format!("Bearer {signed}")
}

/// The gateway: every loopback peer is a trusted proxy (so `X-Forwarded-For`
/// names the client), one network exempt everywhere, a header exempt on
/// one route, a claim exempt on one limit.
fn gateway(redis: &RedisServer) -> Sluice {
    Sluice::start_with_server(
        "",
        &format!(
            r#"
client_ip:
  trusted_proxies: [127.0.0.1]
identity:
  jwt: {{ algorithms: [HS256], claim: sub }}
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
  deny_cache: false
exempt:
  cidrs: [10.0.0.0/8]
routes:
  - name: api
    match: {{ path: /api }}
    respond: {{ status: 200, body: "ok" }}
    exempt:
      headers: {{ x-internal: ["yes"] }}
    limits:
      - {{ name: per-ip, key: [ip], limit: 2, window: 1m }}
  - name: admin
    match: {{ path: /admin }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - name: per-user
        key: [user]
        limit: 1
        window: 1m
        exempt: {{ claims: {{ role: [admin] }} }}
      - {{ name: per-ip, key: [ip], limit: 3, window: 1m }}
"#,
            url = redis.url()
        ),
        &[("SLUICE_JWT_SECRET", SECRET)],
    )
}

fn statuses(sluice: &Sluice, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    (0..n).map(|_| sluice.get(path, headers).status).collect()
}

#[test]
fn an_exempt_network_consumes_nothing_and_is_counted() {
    let redis = RedisServer::start();
    let sluice = gateway(&redis);
    let inside = [("X-Forwarded-For", "10.9.8.7")];
    assert_eq!(statuses(&sluice, "/api", &inside, 5), [200; 5]);
    assert!(
        redis.keys("sluice:*10.9.8.7*").is_empty(),
        "nothing consumed"
    );
    let outside = [("X-Forwarded-For", "11.9.8.7")];
    assert_eq!(statuses(&sluice, "/api", &outside, 3), [200, 200, 429]);
    assert_eq!(sluice.decisions("api", "per-ip", "exempt", "exempt"), 5);
    assert_eq!(sluice.decisions("api", "per-ip", "allow", "redis"), 2);
    // A spoofed address in front of a real one is not believed: the client is
    // the rightmost untrusted entry.
    let spoofed = [("X-Forwarded-For", "10.0.0.1, 11.9.8.7")];
    assert_eq!(statuses(&sluice, "/api", &spoofed, 1), [429]);
}

#[test]
fn a_header_exempts_only_from_a_trusted_peer_and_only_once_sent() {
    let redis = RedisServer::start();
    let sluice = gateway(&redis);
    let client = ("X-Forwarded-For", "11.1.1.1");
    let internal = [client, ("X-Internal", "yes")];
    assert_eq!(statuses(&sluice, "/api", &internal, 4), [200; 4]);
    // Another value, or the header twice (which one counts?), exempts nothing.
    let wrong = [client, ("X-Internal", "YES")];
    let twice = [client, ("X-Internal", "yes"), ("X-Internal", "no")];
    assert_eq!(statuses(&sluice, "/api", &wrong, 1), [200]);
    assert_eq!(statuses(&sluice, "/api", &twice, 2), [200, 429]);
    assert_eq!(sluice.decisions("api", "per-ip", "exempt", "exempt"), 4);

    // Without trusted proxies the header is never believed (and --check warns).
    let strict = Sluice::start(&format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s, key_prefix: "strict:" }}
  on_error: deny
  deny_cache: false
routes:
  - name: api
    respond: {{ status: 200, body: "ok" }}
    exempt:
      headers: {{ x-internal: ["yes"] }}
    limits:
      - {{ name: per-ip, key: [ip], limit: 1, window: 1m }}
"#,
        url = redis.url()
    ));
    let got = statuses(&strict, "/api", &[("X-Internal", "yes")], 2);
    assert_eq!(got, [200, 429]);
    assert!(
        strict.log().contains("this exemption never applies"),
        "{}",
        strict.log()
    );
}

#[test]
fn a_verified_claim_exempts_its_limit_only() {
    let redis = RedisServer::start();
    let sluice = gateway(&redis);
    let admin = token(json!({"sub": "root", "role": ["ops", "admin"]}));
    let user = token(json!({"sub": "bob", "role": "user"}));
    let as_admin = [
        ("Authorization", admin.as_str()),
        ("X-Forwarded-For", "11.2.2.2"),
    ];
    // The per-user limit (1) does not count the admin; per-ip (3) still does.
    assert_eq!(
        statuses(&sluice, "/admin", &as_admin, 4),
        [200, 200, 200, 429]
    );
    assert_eq!(sluice.decisions("admin", "per-user", "exempt", "exempt"), 4);
    let as_user = [
        ("Authorization", user.as_str()),
        ("X-Forwarded-For", "11.3.3.3"),
    ];
    assert_eq!(statuses(&sluice, "/admin", &as_user, 2), [200, 429]);
    // A forged token's claims are not believed.
    let forged = {
        let key = EncodingKey::from_secret(b"another secret of at least 32 bytes");
        let claims = json!({"sub": "eve", "role": "admin", "exp": 4_000_000_000u64});
        format!(
            "Bearer {}",
            encode(&Header::default(), &claims, &key).unwrap()
        )
    };
    let as_forger = [
        ("Authorization", forged.as_str()),
        ("X-Forwarded-For", "11.4.4.4"),
    ];
    // Its user part is missing (on_missing: ip), so the per-user limit counts
    // it on its IP: 1 admitted.
    assert_eq!(statuses(&sluice, "/admin", &as_forger, 2), [200, 429]);
}
