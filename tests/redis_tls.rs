//! Managed Redis: `rediss://` to a real TLS `redis-server` with an ACL user
//! (`rediss://user:pass@`), the server verified against
//! `limiter.redis.tls.ca_file`; a wrong CA or password fails decisions the
//! way `on_error` says, and the password is never printed. A Redis Cluster
//! whose nodes and bus speak TLS, reached the same way.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// A throwaway CA and a certificate for 127.0.0.1 / localhost signed by it
/// (`ca.crt`, `server.crt`, `server.key`); every call makes a new CA.
fn certificates(dir: &Path) {
    make_ca(dir, "ca");
    make_cert(dir, "ca", "server", "DNS:localhost,IP:127.0.0.1");
}

/// A redis-server with a plain port (for the test's own looks) and a TLS
/// port, with the ACL user `alice` / `s3cret`.
fn tls_redis(dir: &Path) -> (RedisServer, u16) {
    let tls_port = free_port();
    let file = |name: &str| dir.join(name).display().to_string();
    let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
    let tls_port_text = tls_port.to_string();
    let redis = RedisServer::start_with_args(
        free_port(),
        &[
            "--tls-port",
            &tls_port_text,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
            "--user",
            "alice",
            "on",
            ">s3cret",
            "~*",
            "&*",
            "+@all",
        ],
    );
    (redis, tls_port)
}

fn config(tls_port: u16, password: &str, ca_file: &Path) -> String {
    format!(
        r#"
limiter:
  redis:
    url: "rediss://alice:{password}@127.0.0.1:{tls_port}/0"
    timeout: 1s
    tls: {{ ca_file: "{ca}" }}
  on_error: deny
routes:
  - name: api
    respond: {{ status: 200, body: ok }}
    limits:
      - {{ name: per-ip, key: [ip], limit: 3, window: 1m }}
"#,
        ca = ca_file.display()
    )
}

#[test]
fn a_tls_redis_with_an_acl_user_limits_exactly_and_the_password_stays_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let (redis, tls_port) = tls_redis(dir.path());
    let sluice = Sluice::start(&config(tls_port, "s3cret", &dir.path().join("ca.crt")));
    let statuses: Vec<u16> = (0..5).map(|_| sluice.get("/", &[]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    // The decisions ran on Redis, as alice, over TLS.
    assert_eq!(redis.keys("sluice:*").len(), 1);
    let clients = redis.client_list();
    assert!(
        clients.lines().any(|l| l.contains("user=alice")),
        "{clients}"
    );
    assert!(!sluice.log().contains("s3cret"), "{}", sluice.log());

    // `--check` names the URL without its password.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--check")
        .arg("--config")
        .arg(sluice.config_path())
        .output()
        .expect("sluice --check");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("rediss://"), "{printed}");
    assert!(!printed.contains("s3cret"), "{printed}");
}

#[test]
fn a_wrong_password_or_an_unknown_ca_fails_closed_and_says_why_without_the_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let (_redis, tls_port) = tls_redis(dir.path());

    let wrong_password = Sluice::start(&config(tls_port, "guess", &dir.path().join("ca.crt")));
    assert_eq!(wrong_password.get("/", &[]).status, 503);
    let log = wrong_password.log();
    assert!(!log.contains("guess"), "{log}");
    assert!(log.contains("cannot connect to Redis"), "{log}");

    // A CA that did not sign the server's certificate.
    let other = tempfile::tempdir().expect("tempdir");
    certificates(other.path());
    let unknown_ca = Sluice::start(&config(tls_port, "s3cret", &other.path().join("ca.crt")));
    assert_eq!(unknown_ca.get("/", &[]).status, 503);
    assert!(!unknown_ca.log().contains("s3cret"));
    assert!(
        unknown_ca.log().contains("certificate"),
        "{}",
        unknown_ca.log()
    );
}

#[test]
fn a_cluster_over_tls_with_an_acl_user_limits_exactly_on_every_primary() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let cluster = RedisCluster::start_tls(3, dir.path());
    let seeds: Vec<String> = cluster
        .tls_ports
        .iter()
        .map(|p| format!("\"rediss://alice:s3cret@127.0.0.1:{p}\""))
        .collect();
    let body = format!(
        r#"
limiter:
  redis:
    cluster: [{seeds}]
    timeout: 2s
    tls: {{ ca_file: "{ca}" }}
  on_error: deny
  deny_cache: false
routes:
  - name: login
    respond: {{ status: 200, body: ok }}
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: 2, window: 1m }}
"#,
        seeds = seeds.join(", "),
        ca = dir.path().join("ca.crt").display(),
    );
    let instances = [Sluice::start(&body), Sluice::start(&body)];
    let users: Vec<String> = (0..12).map(|i| format!("user{i}")).collect();
    for user in &users {
        // Two instances, one counter per user on its slot's primary.
        let statuses: Vec<u16> = (0..4)
            .map(|n| instances[n % 2].get("/", &[("X-User", user)]).status)
            .collect();
        assert_eq!(statuses, [200, 200, 429, 429], "{user}");
        assert_eq!(
            cluster.log_len(&format!("sluice:{{login:per-user:{user}}}")),
            2
        );
    }
    // The users' keys landed on every primary, each reached over TLS.
    for &port in &cluster.ports {
        assert!(cluster.dbsize(port) > 0, "no key landed on node {port}");
    }
    for sluice in &instances {
        assert_eq!(sluice.decisions("login", "per-user", "deny", "redis"), 12);
        assert!(!sluice.log().contains("s3cret"), "{}", sluice.log());
    }
    let clients: String = cluster.query(cluster.ports[0], redis::cmd("CLIENT").arg("LIST"));
    assert!(
        clients.lines().any(|l| l.contains("user=alice")),
        "{clients}"
    );
}

#[test]
fn check_refuses_a_missing_ca_file_and_tls_settings_without_rediss() {
    let check = check_config;
    let (code, stderr) = check(
        "limiter:\n  redis:\n    url: \"rediss://u:topsecret@127.0.0.1:6380/0\"\n    tls: { ca_file: /nonexistent/ca.pem }\n",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(":4:"), "{stderr}");
    assert!(stderr.contains("/nonexistent/ca.pem"), "{stderr}");
    assert!(!stderr.contains("topsecret"), "{stderr}");
    let (code, stderr) = check(
        "limiter:\n  redis:\n    url: \"redis://127.0.0.1:6379/0\"\n    tls: { ca_file: /etc/hostname }\n",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("rediss://"), "{stderr}");
    let (code, stderr) = check(
        "limiter:\n  redis:\n    url: \"rediss://127.0.0.1:6380/0\"\n    tls: { cert_file: /etc/hostname }\n",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("key_file"), "{stderr}");
}
