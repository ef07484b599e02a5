//! Client certificates on a TLS listener (`server.tls[].client_auth`),
//! through the real binary with `curl --cert`, over HTTP/1.1 and HTTP/2:
//! `required` refuses no certificate and one from another CA at the
//! handshake; a certificate's SAN becomes the `user` and two certificates
//! get separate limits; the CA file rotates on SIGHUP (the new CA's
//! clients admitted, the old CA's refused); `optional` serves a client
//! without a valid certificate as one without a certificate.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Two CAs; the server's certificate; alice and bob from `ca`, mallory
/// from `rogue`.
fn certificates(dir: &Path) {
    make_ca(dir, "ca");
    make_ca(dir, "rogue");
    make_cert(dir, "ca", "server", "DNS:api.example.test");
    make_cert(
        dir,
        "ca",
        "alice",
        "URI:spiffe://example.test/alice,DNS:alice.example.test",
    );
    make_cert(dir, "ca", "bob", "URI:spiffe://example.test/bob");
    make_cert(dir, "rogue", "mallory", "URI:spiffe://example.test/alice");
}

fn start(dir: &Path, mode: &str, client_ca: &Path, body: &str) -> (Sluice, SocketAddr) {
    let tls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let file = |name: &str| dir.join(name).display().to_string();
    let server = format!(
        "  tls:\n    - listen: \"{tls}\"\n      certs:\n        - {{ cert: \"{}\", key: \"{}\" }}\n      client_auth: {{ ca: \"{}\", mode: {mode} }}\n",
        file("server.crt"),
        file("server.key"),
        client_ca.display(),
    );
    let sluice = Sluice::start_with_server(&server, body, &[]);
    wait_until(Duration::from_secs(10), "the TLS listener", || {
        TcpStream::connect(tls).is_ok()
    });
    (sluice, tls)
}

/// `curl` over `version` with the client certificate `name` (if any):
/// the status, or "000" when the handshake failed.
fn curl(dir: &Path, tls: SocketAddr, version: &str, name: Option<&str>) -> String {
    let mut command = Command::new("curl");
    command.args([
        "-s",
        version,
        "--cacert",
        &dir.join("ca.crt").display().to_string(),
        "--resolve",
        &format!("api.example.test:{}:127.0.0.1", tls.port()),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
    ]);
    if let Some(name) = name {
        command
            .arg("--cert")
            .arg(dir.join(format!("{name}.crt")))
            .arg("--key")
            .arg(dir.join(format!("{name}.key")));
    }
    command.arg(format!("https://api.example.test:{}/", tls.port()));
    let out = command
        .output()
        .expect("curl must be on PATH (apt-get install curl)");
    String::from_utf8_lossy(&out.stdout).to_string()
}

const LIMITED_BY_USER: &str = r#"
identity:
  client_cert: { from: san_uri, required: true }
limiter: { backend: local }
routes:
  - name: api
    respond: { status: 200, body: "hello" }
    limits:
      - { name: per-service, key: [user], limit: 2, window: 1m }
"#;

#[test]
fn required_certificates_key_by_their_san_over_http1_and_http2() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let (sluice, tls) = start(
        dir.path(),
        "required",
        &dir.path().join("ca.crt"),
        LIMITED_BY_USER,
    );
    for version in ["--http1.1", "--http2"] {
        assert_eq!(
            curl(dir.path(), tls, version, None),
            "000",
            "{version}: no certificate"
        );
        assert_eq!(
            curl(dir.path(), tls, version, Some("mallory")),
            "000",
            "{version}: another CA's certificate naming alice"
        );
    }
    let alice: Vec<String> = ["--http1.1", "--http2", "--http2"]
        .iter()
        .map(|v| curl(dir.path(), tls, v, Some("alice")))
        .collect();
    assert_eq!(
        alice,
        ["200", "200", "429"],
        "alice's own limit, across protocols"
    );
    assert_eq!(
        curl(dir.path(), tls, "--http2", Some("bob")),
        "200",
        "bob's own limit"
    );
    let metrics = sluice.metrics();
    assert_eq!(
        metric_value(
            &metrics,
            "sluice_identity_requests_total{method=\"client_cert\",result=\"known\"}"
        ),
        4
    );
    let log = sluice.log();
    assert!(log.contains(r#""identity":"client_cert""#), "{log}");
}

#[test]
fn the_client_ca_rotates_on_sighup() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    make_ca(dir.path(), "next");
    make_cert(
        dir.path(),
        "next",
        "carol",
        "URI:spiffe://example.test/carol",
    );
    let client_ca = dir.path().join("client-ca.crt");
    std::fs::copy(dir.path().join("ca.crt"), &client_ca).unwrap();
    let (sluice, tls) = start(dir.path(), "required", &client_ca, LIMITED_BY_USER);
    assert_eq!(curl(dir.path(), tls, "--http1.1", Some("alice")), "200");
    assert_eq!(curl(dir.path(), tls, "--http1.1", Some("carol")), "000");

    std::fs::copy(dir.path().join("next.crt"), &client_ca).unwrap();
    sluice.signal("-HUP");
    wait_until(
        Duration::from_secs(10),
        "the new CA's client admitted",
        || curl(dir.path(), tls, "--http1.1", Some("carol")) == "200",
    );
    for version in ["--http1.1", "--http2"] {
        assert_eq!(
            curl(dir.path(), tls, version, Some("alice")),
            "000",
            "{version}: the old CA's client refused"
        );
    }
    assert!(sluice.reloads("success") >= 1);
}

#[test]
fn optional_certificates_serve_clients_without_a_valid_one_as_without_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let body = r#"
limiter: { backend: local }
routes:
  - name: api
    respond: { status: 200, body: "hello" }
    limits:
      - { name: per-cert, key: [client_cert], limit: 1, window: 1m, on_missing: skip }
      - { name: per-subject, key: [client_subject], limit: 5, window: 1m, on_missing: skip }
"#;
    let (sluice, tls) = start(dir.path(), "optional", &dir.path().join("ca.crt"), body);
    // No certificate, or another CA's: served, and limited by nothing.
    for _ in 0..3 {
        assert_eq!(curl(dir.path(), tls, "--http1.1", None), "200");
        assert_eq!(curl(dir.path(), tls, "--http2", Some("mallory")), "200");
    }
    // A verified certificate: its own fingerprint's limit of 1.
    assert_eq!(curl(dir.path(), tls, "--http1.1", Some("alice")), "200");
    assert_eq!(curl(dir.path(), tls, "--http2", Some("alice")), "429");
    assert_eq!(curl(dir.path(), tls, "--http1.1", Some("bob")), "200");
    assert_eq!(sluice.decisions("api", "per-cert", "allow", "local"), 2);
}

#[test]
fn client_auth_and_certificate_identity_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing-ca.crt");
    let (code, out) = check_config(&format!(
        "server:\n  tls:\n    - listen: \"127.0.0.1:8443\"\n      certs: []\n      client_auth: {{ ca: \"{}\" }}\nroutes:\n  - name: r\n    respond: {{}}\n",
        missing.display()
    ));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(":5:") && out.contains("cannot read"), "{out}");
    let (code, out) = check_config(
        "identity:\n  client_cert: { from: san_dns }\nroutes:\n  - name: r\n    respond: {}\n",
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("a server.tls listener with client_auth"),
        "{out}"
    );
}

/// A kept-alive TLS connection of `openssl s_client` presenting the
/// certificate `cert` with the key `key`; requests are written to it one
/// at a time.
struct KeptConnection {
    child: std::process::Child,
    reader: std::io::BufReader<std::process::ChildStdout>,
}

impl KeptConnection {
    fn open(dir: &Path, tls: SocketAddr, cert: &str, key: &str) -> Self {
        let mut child = Command::new("openssl")
            .args(["s_client", "-quiet", "-connect", &tls.to_string()])
            .args(["-servername", "api.example.test"])
            .arg("-cert")
            .arg(dir.join(format!("{cert}.crt")))
            .arg("-key")
            .arg(dir.join(format!("{key}.key")))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("openssl must be on PATH");
        let reader = std::io::BufReader::new(child.stdout.take().unwrap());
        KeptConnection { child, reader }
    }

    /// Sends `GET /` and returns the status.
    fn get(&mut self) -> u16 {
        use std::io::{Read, Write};
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin
            .write_all(b"GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
            .unwrap();
        stdin.flush().unwrap();
        let (status_line, length) = read_head(&mut self.reader).expect("a response");
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).unwrap();
        status_line.split(' ').nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for KeptConnection {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_certificate_is_an_identity_only_on_the_connection_and_listener_that_verified_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let upstream = Upstream::start();
    // A: required, trusts `ca`. B: optional, trusts `rogue`. C: required,
    // trusts `rogue`.
    let listeners: Vec<SocketAddr> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()).parse().unwrap())
        .collect();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let mut server = String::from("  tls:\n");
    for (listen, ca, mode) in [
        (listeners[0], "ca.crt", "required"),
        (listeners[1], "rogue.crt", "optional"),
        (listeners[2], "rogue.crt", "required"),
    ] {
        server.push_str(&format!(
            "    - listen: \"{listen}\"\n      certs:\n        - {{ cert: \"{}\", key: \"{}\" }}\n      client_auth: {{ ca: \"{}\", mode: {mode} }}\n",
            file("server.crt"),
            file("server.key"),
            file(ca),
        ));
    }
    let body = format!(
        r#"
identity:
  client_cert: {{ from: san_uri, required: false }}
limiter: {{ backend: local }}
upstreams:
  api: {{ servers: ["{}"] }}
routes:
  - name: api
    upstream: api
    request_headers: {{ set: {{ x-user: "{{user}}" }} }}
"#,
        upstream.addr
    );
    let _sluice = Sluice::start_with_server(&server, &body, &[]);
    for tls in &listeners {
        wait_until(Duration::from_secs(10), "the TLS listeners", || {
            TcpStream::connect(tls).is_ok()
        });
    }
    let (a, b, c) = (listeners[0], listeners[1], listeners[2]);
    let alice = "spiffe://example.test/alice";
    let bob = "spiffe://example.test/bob";

    // alice's certificate on B, whose CA did not sign it: no identity...
    let mut on_b = KeptConnection::open(dir.path(), b, "alice", "alice");
    assert_eq!(on_b.get(), 200);
    assert_eq!(upstream.last_header("x-user"), None);
    // ... and still none after the same certificate was verified on A.
    let on_a = curl(dir.path(), a, "--http1.1", Some("alice"));
    assert_eq!(on_a, "200");
    assert_eq!(upstream.last_header("x-user").as_deref(), Some(alice));
    assert_eq!(on_b.get(), 200);
    assert_eq!(
        upstream.last_header("x-user"),
        None,
        "A's verification on B"
    );

    // bob verified on A keeps his identity whatever fails elsewhere: his
    // certificate refused at C, whose CA did not sign it.
    let mut bob_on_a = KeptConnection::open(dir.path(), a, "bob", "bob");
    assert_eq!(bob_on_a.get(), 200);
    assert_eq!(upstream.last_header("x-user").as_deref(), Some(bob));
    assert_eq!(curl(dir.path(), c, "--http1.1", Some("bob")), "000");
    assert_eq!(curl(dir.path(), c, "--http2", Some("bob")), "000");
    assert_eq!(bob_on_a.get(), 200);
    assert_eq!(
        upstream.last_header("x-user").as_deref(),
        Some(bob),
        "a failed handshake elsewhere took bob's identity"
    );
}
