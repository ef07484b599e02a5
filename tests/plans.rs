//! Plans and overrides on real Redis, across three gateway instances: the
//! limit a request gets comes from its verified plan claim or its key value,
//! a reload changes it on the next request, and it stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;
use std::net::SocketAddr;

const SECRET: &str = "an HS256 test secret of 32+ bytes!";

fn bearer(sub: &str, plan: Option<&str>) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let mut claims = json!({"sub": sub, "exp": exp});
    if let Some(plan) = plan {
        claims["plan"] = json!(plan);
    }
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    format!(
        "Bearer {}",
        encode(&Header::default(), &claims, &key).unwrap()
    )
}

/// A complete config for listeners `addr`/`admin` with pro's number `pro`.
fn config(addr: SocketAddr, admin: SocketAddr, redis: &RedisServer, pro: u64) -> String {
    format!(
        r#"{server}
identity:
  jwt: {{ algorithms: [HS256], claim: sub }}
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
routes:
  - name: api
    respond: {{ status: 200, body: "ok" }}
    limits:
      - name: per-user
        key: [user]
        limit: 2
        window: 1m
        limit_from: {{ claim: plan }}
        plans: {{ free: 2, pro: {pro} }}
        overrides:
          - {{ match: {{ user: acme }}, limit: 8 }}
          - {{ match: {{ user: initech }}, plan: pro }}
"#,
        server = server_section(addr, admin),
        url = redis.url(),
    )
}

struct Fleet {
    instances: Vec<(Sluice, SocketAddr, SocketAddr)>,
}

impl Fleet {
    fn start(redis: &RedisServer, pro: u64) -> Self {
        let instances = (0..3)
            .map(|_| {
                let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
                let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
                let text = config(addr, admin, redis, pro);
                let sluice =
                    Sluice::start_with(&text, addr, admin, &[("SLUICE_JWT_SECRET", SECRET)]);
                (sluice, addr, admin)
            })
            .collect();
        Self { instances }
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.instances.iter().map(|(s, _, _)| s.addr).collect()
    }

    /// `n` concurrent requests with `token`, spread over the instances;
    /// returns how many were admitted.
    fn admitted(&self, token: &str, n: usize) -> usize {
        let addrs = self.addrs();
        let token = token.to_string();
        let statuses = concurrent(n, move |i| {
            get(addrs[i % addrs.len()], "/", &[("Authorization", &token)])
        });
        assert!(
            statuses.iter().all(|s| [200, 429].contains(s)),
            "{statuses:?}"
        );
        statuses.iter().filter(|&&s| s == 200).count()
    }

    fn reload(&self, redis: &RedisServer, pro: u64) {
        for (sluice, addr, admin) in &self.instances {
            assert!(
                sluice.reload(&config(*addr, *admin, redis, pro)),
                "{}",
                sluice.log()
            );
        }
    }
}

#[test]
fn plans_and_overrides_set_each_key_its_limit_exactly_across_instances() {
    let redis = RedisServer::start();
    let fleet = Fleet::start(&redis, 5);
    assert_eq!(fleet.admitted(&bearer("alice", Some("free")), 30), 2);
    assert_eq!(fleet.admitted(&bearer("bob", Some("pro")), 30), 5);
    // No plan, or one the config does not list: the default limit.
    assert_eq!(fleet.admitted(&bearer("carol", None), 30), 2);
    assert_eq!(fleet.admitted(&bearer("dave", Some("platinum")), 30), 2);
    // Overrides win over plans; one may name a plan.
    assert_eq!(fleet.admitted(&bearer("acme", Some("free")), 30), 8);
    assert_eq!(fleet.admitted(&bearer("initech", None), 30), 5);
    assert_eq!(redis.log_len("sluice:{api:per-user:acme}"), 8);

    // The headers report the limit that applied.
    let (sluice, _, _) = &fleet.instances[0];
    let fresh = bearer("erin", Some("pro"));
    let response = sluice.get("/", &[("Authorization", &fresh)]);
    assert_eq!(response.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(response.header("x-ratelimit-remaining"), Some("4"));
}

#[test]
fn a_new_plan_or_number_applies_on_the_next_request() {
    let redis = RedisServer::start();
    let fleet = Fleet::start(&redis, 5);
    // alice uses up free, and her denial is remembered (deny cache on).
    let free = bearer("alice", Some("free"));
    assert_eq!(fleet.admitted(&free, 10), 2);
    // She upgrades: her next token says pro, and she gets pro's remaining 3
    // at once, not a stale denial.
    let pro = bearer("alice", Some("pro"));
    assert_eq!(fleet.admitted(&pro, 10), 3);
    // The operator raises pro to 7 on every instance: 2 more, exactly.
    fleet.reload(&redis, 7);
    assert_eq!(fleet.admitted(&pro, 10), 2);
    assert_eq!(redis.log_len("sluice:{api:per-user:alice}"), 7);
    // And down to 3: she is over it, so nothing passes.
    fleet.reload(&redis, 3);
    assert_eq!(fleet.admitted(&pro, 5), 0);
}
