//! HTTPS upstreams (`upstreams.NAME.tls`): the upstream's certificate is
//! verified (on by default) against `ca_file` for the `sni` name; a
//! certificate that does not match is refused with sluice's JSON 502, and
//! the health check speaks TLS too. The HTTPS upstream is a second sluice
//! with a TLS listener.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

/// An HTTPS server answering `200 from https upstream`, its certificate for
/// `upstream.test` signed by the CA `ca` in `dir`.
fn https_upstream(dir: &Path) -> (Sluice, SocketAddr) {
    make_ca(dir, "ca");
    make_cert(dir, "ca", "upstream", "DNS:upstream.test");
    let tls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let file = |name: &str| dir.join(name).display().to_string();
    let server = format!(
        "  tls:\n    - listen: \"{tls}\"\n      certs: [{{ cert: \"{}\", key: \"{}\" }}]\n",
        file("upstream.crt"),
        file("upstream.key")
    );
    let upstream = Sluice::start_with_server(
        &server,
        "limiter: { backend: local }\nroutes:\n  - name: all\n    respond: { status: 200, body: \"from https upstream\" }\n",
        &[],
    );
    wait_until(Duration::from_secs(10), "the HTTPS upstream", || {
        TcpStream::connect(tls).is_ok()
    });
    (upstream, tls)
}

fn gateway(upstream: SocketAddr, tls: &str) -> Sluice {
    Sluice::start(&format!(
        r#"
limiter: {{ backend: local }}
upstreams:
  api:
    servers: ["{upstream}"]
    tls: {tls}
routes:
  - name: api
    upstream: api
"#
    ))
}

#[test]
fn a_verified_https_upstream_serves_and_a_wrong_name_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_upstream, addr) = https_upstream(dir.path());
    let ca = dir.path().join("ca.crt").display().to_string();

    let verified = gateway(
        addr,
        &format!("{{ sni: upstream.test, ca_file: \"{ca}\" }}"),
    );
    let response = verified.get("/x", &[]);
    assert_eq!(
        (response.status, response.body.as_str()),
        (200, "from https upstream")
    );

    // The certificate is not for this name: refused, in sluice's voice.
    let wrong = gateway(addr, &format!("{{ sni: other.test, ca_file: \"{ca}\" }}"));
    let response = wrong.get("/x", &[]);
    assert_eq!(response.status, 502, "{response:?}");
    assert!(response.body.contains("bad_gateway"), "{}", response.body);

    // Nor is a certificate whose CA the system does not know.
    let unknown_ca = gateway(addr, "{ sni: upstream.test }");
    assert_eq!(unknown_ca.get("/x", &[]).status, 502);

    // `verify: false` is the operator's explicit choice.
    let unverified = gateway(addr, "{ sni: other.test, verify: false }");
    assert_eq!(unverified.get("/x", &[]).status, 200);
}

#[test]
fn the_health_check_speaks_tls_and_a_plain_upstream_is_not_taken_for_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_upstream, addr) = https_upstream(dir.path());
    let ca = dir.path().join("ca.crt").display().to_string();
    let plain = Upstream::start();
    let sluice = Sluice::start(&format!(
        r#"
limiter: {{ backend: local }}
upstreams:
  api:
    servers: ["{addr}", "{plain}"]
    health_check: {{ interval: 200ms }}
    tls: {{ sni: upstream.test, ca_file: "{ca}" }}
routes:
  - name: api
    upstream: api
"#,
        plain = plain.addr
    ));
    // The plain server accepts TCP but fails the TLS health check: after a
    // check or two every request goes to the HTTPS one.
    wait_until(
        Duration::from_secs(10),
        "the plain server marked down",
        || (0..4).all(|_| sluice.get("/x", &[]).status == 200),
    );
    let statuses: Vec<u16> = (0..10).map(|_| sluice.get("/x", &[]).status).collect();
    assert_eq!(statuses, [200; 10]);
}

/// Two upstreams on one `host:port` with one SNI but different trust: a
/// connection pooled for the one that trusts the server's CA is never
/// used for one that does not, even right after it was made.
#[test]
fn a_pooled_connection_serves_only_the_upstream_whose_trust_made_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_upstream, addr) = https_upstream(dir.path());
    make_ca(dir.path(), "other");
    let file = |name: &str| dir.path().join(name).display().to_string();
    let sluice = Sluice::start(&format!(
        r#"
limiter: {{ backend: local }}
upstreams:
  trusting: {{ servers: ["{addr}"], tls: {{ sni: upstream.test, ca_file: "{ca}" }} }}
  other_ca: {{ servers: ["{addr}"], tls: {{ sni: upstream.test, ca_file: "{other}" }} }}
  system_roots: {{ servers: ["{addr}"], tls: {{ sni: upstream.test }} }}
  unverified: {{ servers: ["{addr}"], tls: {{ sni: upstream.test, verify: false }} }}
routes:
  - {{ name: trusting, match: {{ path_prefix: /trusting }}, upstream: trusting }}
  - {{ name: other_ca, match: {{ path_prefix: /other }}, upstream: other_ca }}
  - {{ name: system_roots, match: {{ path_prefix: /system }}, upstream: system_roots }}
  - {{ name: unverified, match: {{ path_prefix: /unverified }}, upstream: unverified }}
"#,
        ca = file("ca.crt"),
        other = file("other.crt"),
    ));
    for round in 0..3 {
        // Each refused request comes right after the trusting upstream
        // left a verified connection in the pool.
        for refused in ["/other", "/system"] {
            assert_eq!(sluice.get("/trusting", &[]).status, 200, "round {round}");
            let response = sluice.get(refused, &[]);
            assert_eq!(
                response.status, 502,
                "{refused}, round {round}: {response:?}"
            );
            assert!(response.body.contains("bad_gateway"), "{}", response.body);
        }
        // `verify: false` connects on its own and is served.
        assert_eq!(sluice.get("/unverified", &[]).status, 200, "round {round}");
        assert_eq!(sluice.get("/trusting", &[]).status, 200, "round {round}");
    }
}
