//! TLS listeners (`server.tls`): a client verifies the gateway's certificate
//! by SNI for two names (one a wildcard) and gets the default for others;
//! certificates rotate on SIGHUP under load with no failed request; HTTP/2
//! by ALPN is limited exactly like HTTP/1.1; `--check` refuses a missing
//! file, a key that is not a key and a key that is not the certificate's.
//! A handshake is under the front door's limits: a client that never
//! finishes one is closed after `client_header_timeout`, and handshakes in
//! progress count against `max_connections`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// A CA and two certificates: `api` for api.example.test (the default) and
/// `wild` for *.other.test.
fn certificates(dir: &Path) {
    make_ca(dir, "ca");
    make_cert(dir, "ca", "api", "DNS:api.example.test");
    make_cert(dir, "ca", "wild", "DNS:*.other.test");
}

fn tls_server_keys(dir: &Path, tls: SocketAddr) -> String {
    let file = |name: &str| dir.join(name).display().to_string();
    format!(
        "  tls:\n    - listen: \"{tls}\"\n      certs:\n        - {{ cert: \"{}\", key: \"{}\" }}\n        - {{ cert: \"{}\", key: \"{}\" }}\n",
        file("api.crt"),
        file("api.key"),
        file("wild.crt"),
        file("wild.key"),
    )
}

const BODY: &str = r#"
limiter: { backend: local }
routes:
  - name: api
    respond: { status: 200, body: "hello over tls" }
    limits:
      - { name: per-key, key: [{header: X-Key}], limit: 3, window: 1m, on_missing: skip }
"#;

/// A rustls client trusting only `ca.crt` of `dir`.
fn client_config(dir: &Path) -> Arc<rustls::ClientConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("ca.crt")).expect("ca.crt") {
        roots.add(cert.expect("a CA certificate")).expect("add CA");
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    // Every connection a full handshake: a resumed session would show the
    // certificate of the session it resumes.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// `GET /` over TLS to `addr` naming `name`, the certificate verified;
/// (status, the leaf certificate the server sent).
fn https_get(
    config: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    name: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, Vec<u8>), String> {
    let server_name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let connection = rustls::ClientConnection::new(Arc::clone(config), server_name)
        .map_err(|e| e.to_string())?;
    let socket = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(connection, socket);
    let mut request = format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n");
    for (n, v) in headers {
        request.push_str(&format!("{n}: {v}\r\n"));
    }
    request.push_str("\r\n");
    tls.write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    // A peer that closes without close_notify still gave a whole response.
    let _ = tls.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no response: {text:?}"))?;
    let leaf = tls
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    Ok((status, leaf))
}

fn der_of(dir: &Path, name: &str) -> Vec<u8> {
    CertificateDer::pem_file_iter(dir.join(format!("{name}.crt")))
        .expect("cert file")
        .next()
        .expect("a certificate")
        .expect("PEM")
        .as_ref()
        .to_vec()
}

fn start(dir: &Path) -> (Sluice, SocketAddr) {
    let tls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let sluice = Sluice::start_with_server(&tls_server_keys(dir, tls), BODY, &[]);
    wait_until(Duration::from_secs(10), "the TLS listener", || {
        TcpStream::connect(tls).is_ok()
    });
    (sluice, tls)
}

#[test]
fn a_client_verifies_the_certificate_chosen_by_sni_for_two_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let (_sluice, tls) = start(dir.path());
    let config = client_config(dir.path());

    let (status, leaf) = https_get(&config, tls, "api.example.test", &[]).expect("api");
    assert_eq!((status, leaf), (200, der_of(dir.path(), "api")));
    let (status, leaf) = https_get(&config, tls, "eu.other.test", &[]).expect("wildcard");
    assert_eq!((status, leaf), (200, der_of(dir.path(), "wild")));
    // A name no certificate covers gets the default, which the client
    // rightly refuses.
    let refused = https_get(&config, tls, "unknown.test", &[]);
    assert!(refused.is_err(), "{refused:?}");
}

#[test]
fn http2_by_alpn_is_limited_exactly_like_http1() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let (sluice, tls) = start(dir.path());
    let curl = |version: &str, key: &str| -> (String, String) {
        let out = Command::new("curl")
            .args([
                "-s",
                version,
                "--cacert",
                &dir.path().join("ca.crt").display().to_string(),
                "--resolve",
                &format!("api.example.test:{}:127.0.0.1", tls.port()),
                "-H",
                &format!("X-Key: {key}"),
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
                &format!("https://api.example.test:{}/", tls.port()),
            ])
            .output()
            .expect("curl must be on PATH (apt-get install curl)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (code, version) = text.split_once(' ').unwrap_or((&text, ""));
        (code.to_string(), version.to_string())
    };
    for version in ["--http2", "--http1.1"] {
        let key = format!("k{version}");
        let results: Vec<(String, String)> = (0..5).map(|_| curl(version, &key)).collect();
        let codes: Vec<&str> = results.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(
            codes,
            ["200", "200", "200", "429", "429"],
            "{version}: {results:?}"
        );
        let expected = if version == "--http2" { "2" } else { "1.1" };
        assert!(results.iter().all(|(_, v)| v == expected), "{results:?}");
    }
    // Both protocols count in the same series (a repeated denial is
    // answered by the deny cache).
    assert_eq!(sluice.decisions("api", "per-key", "allow", "local"), 6);
    let denied = sluice.decisions("api", "per-key", "deny", "local")
        + sluice.decisions("api", "per-key", "deny", "deny_cache");
    assert_eq!(denied, 4);
}

#[test]
fn certificates_rotate_on_sighup_under_load_without_a_failed_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let (sluice, tls) = start(dir.path());
    let config = client_config(dir.path());
    let before = der_of(dir.path(), "api");

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let (stop, sent, failures, config) =
                (stop.clone(), sent.clone(), failures.clone(), config.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match https_get(&config, tls, "api.example.test", &[]) {
                        Ok((200, _)) => {}
                        other => failures.lock().unwrap().push(format!("{other:?}")),
                    }
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    wait_until(Duration::from_secs(5), "load", || {
        sent.load(Ordering::SeqCst) > 20
    });

    // A new certificate for the same name, written over the old files.
    make_cert(dir.path(), "ca", "api", "DNS:api.example.test");
    let after = der_of(dir.path(), "api");
    assert_ne!(before, after);
    sluice.signal("-HUP");
    wait_until(
        Duration::from_secs(10),
        "the new certificate served",
        || https_get(&config, tls, "api.example.test", &[]).is_ok_and(|(_, leaf)| leaf == after),
    );
    let at_reload = sent.load(Ordering::SeqCst);
    wait_until(Duration::from_secs(5), "load after the reload", || {
        sent.load(Ordering::SeqCst) > at_reload + 20
    });
    stop.store(true, Ordering::SeqCst);
    for thread in load {
        thread.join().expect("load thread");
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed: {failures:?}",
        failures.len()
    );
    assert!(sluice.reloads("success") >= 1);
}

#[test]
fn check_refuses_missing_unreadable_and_mismatched_certificates() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    std::fs::write(dir.path().join("garbage.key"), "not a key\n").expect("write");
    let file = |name: &str| dir.path().join(name).display().to_string();
    let check = |cert: &str, key: &str| {
        let text = format!(
            "server:\n  tls:\n    - listen: \"127.0.0.1:8443\"\n      certs:\n        - {{ cert: \"{cert}\", key: \"{key}\" }}\n"
        );
        check_config(&text)
    };
    for (cert, key, needle) in [
        (file("missing.crt"), file("api.key"), "cannot read"),
        (
            file("api.crt"),
            file("garbage.key"),
            "is not a PEM private key",
        ),
        (file("api.crt"), file("wild.key"), "is not the key of"),
    ] {
        let (code, stderr) = check(&cert, &key);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(":5:"), "the entry's line: {stderr}");
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    let (code, stderr) = check(&file("api.crt"), &file("api.key"));
    assert_eq!(code, Some(0), "{stderr}");
}

/// The shipped TLS example passes `--check` with real certificates.
#[test]
fn the_shipped_tls_example_passes_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let file = |name: &str| dir.path().join(name).display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--check")
        .arg("--config")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/conf/examples/tls.yaml"
        ))
        .env("SLUICE_TLS_CERT", file("api.crt"))
        .env("SLUICE_TLS_KEY", file("api.key"))
        .env("SLUICE_TLS_WILDCARD_CERT", file("wild.crt"))
        .env("SLUICE_TLS_WILDCARD_KEY", file("wild.key"))
        .output()
        .expect("sluice --check");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("tls 0.0.0.0:8443 (2 certificates)"),
        "{printed}"
    );
}

/// `server.h2c: true`: HTTP/2 with prior knowledge on a plain listener,
/// limited like everything else.
#[test]
fn h2c_with_prior_knowledge_is_served_when_enabled() {
    let sluice = Sluice::start_with_server("  h2c: true\n", BODY, &[]);
    let curl = || {
        let out = Command::new("curl")
            .args([
                "-s",
                "--http2-prior-knowledge",
                "-H",
                "X-Key: h2c",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
                &format!("http://{}/", sluice.addr),
            ])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let results: Vec<String> = (0..4).map(|_| curl()).collect();
    assert_eq!(results, ["200 2", "200 2", "200 2", "429 2"]);
}

/// An HTTP/2 connection with no stream in progress is idle: it is closed
/// after `keepalive_timeout`, as a kept-alive HTTP/1.1 connection is.
#[test]
fn an_idle_http2_connection_is_closed_after_keepalive_timeout() {
    let sluice = Sluice::start_with_server("  h2c: true\n  keepalive_timeout: 1s\n", BODY, &[]);
    let mut socket = TcpStream::connect(sluice.addr).expect("connect");
    // The client preface and an empty SETTINGS frame, then nothing.
    socket
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .expect("preface");
    let started = std::time::Instant::now();
    assert!(
        closed_within(&mut socket, Duration::from_secs(10)),
        "an idle HTTP/2 connection stayed open"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before the timeout"
    );
}

/// HTTP/2 "rapid reset" (CVE-2023-44487): a client that opens streams and
/// cancels them at once, thousands in a burst, is sent GOAWAY
/// ENHANCE_YOUR_CALM and closed before a request is processed; other clients
/// are served.
#[test]
fn an_http2_rapid_reset_flood_is_cut_off() {
    let sluice = Sluice::start_with_server("  h2c: true\n", BODY, &[]);
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| -> Vec<u8> {
        let mut bytes = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        bytes.extend([kind, flags]);
        bytes.extend(stream.to_be_bytes());
        bytes.extend(payload);
        bytes
    };
    // GET / for localhost, HPACK: static :method GET, :scheme http, :path /,
    // :authority as a literal without indexing.
    let mut head = vec![0x82, 0x86, 0x84, 0x01, 9];
    head.extend(b"localhost");
    let mut attack = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    attack.extend(frame(0x4, 0, 0, &[]));
    for i in 0..5_000u32 {
        let stream = 1 + 2 * i;
        attack.extend(frame(0x1, 0x5, stream, &head)); // HEADERS, END_STREAM | END_HEADERS
        attack.extend(frame(0x3, 0, stream, &8u32.to_be_bytes())); // RST_STREAM CANCEL
    }
    let mut socket = TcpStream::connect(sluice.addr).expect("connect");
    // The server may close while the burst is still being written.
    let _ = socket.write_all(&attack);
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    // Walk the frames the server sent: one GOAWAY, error code 11.
    let mut goaway = None;
    let mut at = 0;
    while at + 9 <= answer.len() {
        let length = u32::from_be_bytes([0, answer[at], answer[at + 1], answer[at + 2]]) as usize;
        if answer[at + 3] == 0x7 && at + 17 <= answer.len() {
            let code = &answer[at + 13..at + 17];
            goaway = Some(u32::from_be_bytes([code[0], code[1], code[2], code[3]]));
        }
        at += 9 + length;
    }
    assert_eq!(
        goaway,
        Some(11),
        "no GOAWAY ENHANCE_YOUR_CALM in {answer:?}"
    );
    assert_eq!(sluice.get("/", &[]).status, 200, "others are still served");
    // That request is the only one the gateway ever processed (it is
    // counted once logged, just after its answer).
    let served = || {
        metric_value(
            &sluice.metrics(),
            "sluice_requests_total{route=\"api\",status=\"200\"}",
        )
    };
    wait_until(Duration::from_secs(5), "the request counted", || {
        served() >= 1
    });
    assert_eq!(served(), 1, "a cancelled stream reached the gateway");
}

/// Whether the server closed `socket` within `limit` (EOF or a reset).
fn closed_within(socket: &mut TcpStream, limit: Duration) -> bool {
    socket.set_read_timeout(Some(limit)).expect("read timeout");
    let mut buffer = [0u8; 1024];
    loop {
        match socket.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn a_handshake_that_never_ends_is_closed_and_counts_against_max_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let config = client_config(dir.path());
    let tls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server_keys = format!(
        "  client_header_timeout: 1s\n  max_connections: 3\n{}",
        tls_server_keys(dir.path(), tls)
    );
    let sluice = Sluice::start_with_server(&server_keys, BODY, &[]);
    // Ready when a whole handshake passes (a half-open probe would hold a
    // place until its watch notices it is gone).
    wait_until(Duration::from_secs(10), "the TLS listener", || {
        https_get(&config, tls, "api.example.test", &[]).is_ok()
    });
    let rejected = |reason: &str| {
        metric_value(
            &sluice.metrics(),
            &format!("sluice_downstream_rejected_total{{reason=\"{reason}\"}}"),
        )
    };
    let (timeouts_before, refusals_before) =
        (rejected("handshake_timeout"), rejected("max_connections"));
    // The probe's place is free once the gateway has seen it close (on a
    // loaded machine, after the next connects could begin).
    wait_until(
        Duration::from_secs(5),
        "the probe's connection closed",
        || metric_value(&sluice.metrics(), "sluice_downstream_connections") == 0,
    );

    // Silent, and half a ClientHello (a record header announcing 512 bytes,
    // then 10 of them): both closed after ~1 s, not Pingora's 60 s.
    let mut silent = TcpStream::connect(tls).expect("connect");
    let mut half = TcpStream::connect(tls).expect("connect");
    half.write_all(&[
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0, 0, 0, 0,
    ])
    .expect("write");
    // Meanwhile the two count against max_connections 3: one more fits, a
    // fourth is refused at once.
    let mut third = TcpStream::connect(tls).expect("connect");
    let mut fourth = TcpStream::connect(tls).expect("connect");
    wait_until(Duration::from_secs(5), "the fourth refused", || {
        rejected("max_connections") > refusals_before
    });
    assert_eq!(rejected("max_connections"), refusals_before + 1);
    assert!(
        closed_within(&mut fourth, Duration::from_secs(5)),
        "over the cap"
    );
    for socket in [&mut silent, &mut half, &mut third] {
        assert!(
            closed_within(socket, Duration::from_secs(5)),
            "not closed by the deadline"
        );
    }
    // Counted just after the shutdown that the client saw as EOF.
    wait_until(Duration::from_secs(5), "three handshake timeouts", || {
        rejected("handshake_timeout") >= timeouts_before + 3
    });
    assert_eq!(rejected("handshake_timeout"), timeouts_before + 3);

    // The places are free again, and a real client is served.
    let (status, _) = https_get(&config, tls, "api.example.test", &[])
        .expect("a handshake after the stalled ones");
    assert_eq!(status, 200);
}
