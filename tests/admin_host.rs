//! The admin listener's `Host` guard on every path it serves: on a loopback
//! listener, a request naming it by another name (a DNS-rebinding page's
//! own) is refused on `/metrics`, `/healthz`, `/readyz` and the console,
//! with an admin token or without, and on the APIs without a token (with
//! one, the token guards them); loopback names, a scrape of
//! `127.0.0.1:port` and a request without `Host` are answered. A listener
//! on every address keeps answering the names an operator gives it (a
//! compose file's `sluice:9091`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::SocketAddr;

const BODY: &str = "limiter: { backend: local }\nroutes:\n  - name: api\n    respond: { body: ok }\n    limits:\n      - { name: per-ip, key: [ip], limit: 5, window: 1m }\n";

const PATHS: [&str; 6] = [
    "/metrics",
    "/healthz",
    "/readyz",
    "/console/",
    "/v1/status",
    "/v1/top",
];

fn status(admin: SocketAddr, path: &str, host: Option<&str>, token: Option<&str>) -> u16 {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|b| ("Authorization", b.as_str()))
        .collect();
    let raw_host;
    match host {
        Some(host) => headers.push(("Host", host)),
        None => {
            // HTTP/1.0 without Host: no browser sends this.
            let raw = format!("GET {path} HTTP/1.0\r\nConnection: close\r\n\r\n");
            raw_host = raw_request(admin, raw.as_bytes());
            return raw_host.status;
        }
    }
    get(admin, path, &headers).status
}

#[test]
fn a_loopback_listener_answers_only_loopback_names_on_every_path() {
    for token in [None, Some("host-guard-token")] {
        let env: Vec<(&str, &str)> = token.iter().map(|t| ("HOST_TOKEN", *t)).collect();
        let server = if token.is_some() {
            "  admin_token_env: HOST_TOKEN\n"
        } else {
            ""
        };
        let sluice = Sluice::start_with_server(server, BODY, &env);
        let port = sluice.admin.port();
        for path in PATHS {
            let guarded_by_token = token.is_some() && path.starts_with("/v1/");
            for rebound in [
                format!("evil.example:{port}"),
                "evil.example".to_string(),
                format!("127.0.0.1.evil.example:{port}"),
                format!("localhost.evil.example:{port}"),
                format!("10.0.0.5:{port}"),
            ] {
                let expected = if guarded_by_token { 200 } else { 403 };
                assert_eq!(
                    status(sluice.admin, path, Some(&rebound), token),
                    expected,
                    "{path} with Host {rebound} (token: {token:?})"
                );
            }
            for own in [
                format!("127.0.0.1:{port}"),
                format!("localhost:{port}"),
                format!("LOCALHOST:{port}"),
                format!("[::1]:{port}"),
                "127.0.0.2".to_string(),
            ] {
                assert_eq!(
                    status(sluice.admin, path, Some(&own), token),
                    200,
                    "{path} with Host {own} (token: {token:?})"
                );
            }
        }
        assert_eq!(
            status(sluice.admin, "/metrics", None, token),
            200,
            "no Host"
        );
        let twice = get(
            sluice.admin,
            "/metrics",
            &[("Host", "127.0.0.1"), ("Host", "evil.example")],
        );
        assert_ne!(twice.status, 200, "two Hosts");
    }
}

#[test]
fn a_listener_on_every_address_answers_the_names_it_is_given() {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let port = free_port();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = format!(
        "server:\n  listen: [\"{addr}\"]\n  admin: \"0.0.0.0:{port}\"\n  threads: 1\n  grace_period: 1s\n{BODY}"
    );
    let sluice = Sluice::start_with(&config, addr, admin, &[]);
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(
            status(sluice.admin, path, Some("sluice:9091"), None),
            200,
            "{path}"
        );
    }
}
