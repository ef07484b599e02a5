//! gRPC through the gateway, with a real client and server (Python grpcio,
//! `tests/fixtures/grpc_echo.py`): calls pass over HTTP/2 both ways (h2c to
//! the gateway, `protocol: h2c` to the server), a `{header:}` key reads
//! gRPC metadata, a route matches the method path, and a denied call fails
//! on the client with RESOURCE_EXHAUSTED and the retry delay.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/grpc_echo.py");

/// `python3 -c 'import grpc'`, with the install hint if it fails.
fn python_with_grpc() -> Command {
    let ok = Command::new("python3")
        .args(["-c", "import grpc"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 with grpcio is needed: pip install grpcio (.ci/run does)"
    );
    Command::new("python3")
}

/// The echo server on a free port, killed on drop.
struct EchoServer {
    child: Child,
    port: u16,
}

impl EchoServer {
    fn start() -> Self {
        let port = free_port();
        let child = python_with_grpc()
            .args([SCRIPT, "server", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the gRPC server");
        wait_until(Duration::from_secs(20), "the gRPC server", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Self { child, port }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` calls with metadata `x-key: key` through `addr`: one line each,
/// `ok <reply>` or `<CODE> <details>`.
fn calls(addr: std::net::SocketAddr, key: &str, n: usize) -> Vec<String> {
    let out = python_with_grpc()
        .args([SCRIPT, "client", &addr.to_string(), key, &n.to_string()])
        .output()
        .expect("run the gRPC client");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn a_denied_call_fails_with_resource_exhausted_on_a_real_client() {
    let server = EchoServer::start();
    let sluice = Sluice::start_with_server(
        "  h2c: true\n",
        &format!(
            r#"
limiter: {{ backend: local }}
upstreams:
  echo: {{ servers: ["127.0.0.1:{port}"], protocol: h2c }}
routes:
  - name: say
    match: {{ path: /sluice.Echo/Say, methods: [POST] }}
    upstream: echo
    limits:
      - {{ name: per-key, key: [{{header: x-key}}], limit: 2, window: 1m }}
"#,
            port = server.port
        ),
        &[],
    );
    let lines = calls(sluice.addr, "customer-1", 3);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(&lines[..2], ["ok hello 0", "ok hello 1"], "{lines:?}");
    assert!(
        lines[2].starts_with("RESOURCE_EXHAUSTED rate limited: route say, limit per-key; retry in"),
        "{lines:?}"
    );
    // Metadata is the key: another customer has its own count.
    assert_eq!(calls(sluice.addr, "customer-2", 1), ["ok hello 0"]);
    assert_eq!(sluice.decisions("say", "per-key", "allow", "local"), 3);
}
