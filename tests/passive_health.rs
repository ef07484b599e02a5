//! Passive health: a server that fails is taken out for `fail_timeout` and
//! comes back after it; when every server is out, all are tried.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::Duration;

fn config(servers: &[String], fail_timeout: &str) -> String {
    let list = servers
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "upstreams:\n  api:\n    servers: [{list}]\n    max_fails: 1\n    fail_timeout: {fail_timeout}\nroutes:\n  - name: api\n    upstream: api\n"
    )
}

fn server_up(sluice: &Sluice, server: &str) -> u64 {
    let series = format!("sluice_upstream_server_up{{server=\"{server}\",upstream=\"api\"}}");
    metric_value(&sluice.metrics(), &series)
}

#[test]
fn a_failing_server_is_taken_out_and_comes_back_after_fail_timeout() {
    let good = Upstream::start();
    let port = free_port();
    let dead = format!("127.0.0.1:{port}");
    let sluice = Sluice::start(&config(&[dead.clone(), good.addr.to_string()], "2s"));
    let statuses: Vec<u16> = (0..10)
        .map(|i| sluice.get(&format!("/{i}"), &[]).status)
        .collect();
    // Its first failure takes it out: one 502 at most, then the good server.
    assert!(
        statuses.iter().filter(|s| **s == 502).count() <= 1,
        "{statuses:?}"
    );
    assert!(statuses[2..].iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(server_up(&sluice, &dead), 0);
    assert_eq!(server_up(&sluice, &good.addr.to_string()), 1);

    // It comes back; after fail_timeout it is in selection again.
    let revived = Upstream::start_on(port);
    wait_until(
        Duration::from_secs(10),
        "the revived server to serve",
        || sluice.get("/again", &[]).status == 200 && revived.hits() > 0,
    );
    assert_eq!(server_up(&sluice, &dead), 1);
}

#[test]
fn when_every_server_is_out_all_are_tried() {
    let (a, b) = (free_port(), free_port());
    let servers = [format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}")];
    // Out for far longer than the test: only "all out, all tried" lets a
    // request through.
    let sluice = Sluice::start(&config(&servers, "5m"));
    for i in 0..4 {
        assert_eq!(sluice.get(&format!("/{i}"), &[]).status, 502);
    }
    assert_eq!(server_up(&sluice, &servers[0]), 0);
    assert_eq!(server_up(&sluice, &servers[1]), 0);
    let revived = Upstream::start_on(a);
    let served = (0..4)
        .filter(|i| sluice.get(&format!("/late/{i}"), &[]).status == 200)
        .count();
    assert!(served >= 1, "an all-out upstream still tries its servers");
    assert!(revived.hits() >= 1);
}

/// A server that accepts connections and never answers.
fn black_hole() -> (std::net::SocketAddr, std::sync::mpsc::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while stopped.try_recv().is_err() {
            match listener.accept() {
                Ok((stream, _)) => held.push(stream),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    (addr, stop)
}

/// Python's `http.server` in its own process, on a free port, serving an
/// empty directory (`GET /` is 200).
struct PythonServer {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl PythonServer {
    fn start() -> PythonServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let child = std::process::Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3");
        let addr = format!("127.0.0.1:{port}");
        wait_until(Duration::from_secs(20), "python's http.server", || {
            std::net::TcpStream::connect(&addr).is_ok()
        });
        PythonServer {
            child,
            addr,
            _dir: dir,
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn a_slow_server_and_one_killed_mid_test_cost_one_answer_at_most() {
    let good = Upstream::start();
    let mut doomed = PythonServer::start();
    let (slow, _hold) = black_hole();
    let servers = [good.addr.to_string(), doomed.addr.clone(), slow.to_string()];
    let list = servers.clone().map(|s| format!("\"{s}\"")).join(", ");
    let sluice = Sluice::start(&format!(
        "upstreams:\n  api:\n    servers: [{list}]\n    max_fails: 1\n    fail_timeout: 5m\nroutes:\n  - name: api\n    upstream: api\n    timeouts: {{ read: 500ms }}\n    retries: {{ attempts: 3, on: [connect_error] }}\n"
    ));
    // The slow server answers nothing: its one request times out (504,
    // not retried: it may have reached the application), and it is out.
    let statuses: Vec<u16> = (0..30)
        .map(|i| sluice.get(&format!("/?a={i}"), &[]).status)
        .collect();
    assert!(
        statuses.iter().filter(|s| **s == 504).count() <= 1,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 504),
        "{statuses:?}"
    );
    assert_eq!(server_up(&sluice, &servers[2]), 0);
    assert_eq!(server_up(&sluice, &servers[1]), 1);

    // Killed: its refusals are retried on the good server, so no client
    // sees them, and it is taken out.
    doomed.kill();
    let statuses: Vec<u16> = (0..30)
        .map(|i| sluice.get(&format!("/?b={i}"), &[]).status)
        .collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(server_up(&sluice, &servers[1]), 0);
    assert_eq!(server_up(&sluice, &servers[0]), 1);
}
