//! slowhttptest (Debian's package) in slowloris (`-H`), slow-body (`-B`) and
//! slow-read (`-X`) modes against the gateway with shortened timeouts, while
//! a probe keeps sending ordinary requests: each must be answered within 1 s
//! throughout. Prints one line of figures per mode (run with --nocapture).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Ordinary requests every 100 ms until stopped: (count, slowest, failures).
fn probe(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<(u32, Duration, Vec<String>)> {
    thread::spawn(move || {
        let (mut count, mut slowest, mut failures) = (0, Duration::ZERO, Vec::new());
        while !stop.load(Ordering::SeqCst) {
            let start = Instant::now();
            match try_get(addr, "/probe", &[]) {
                Ok(r) if r.status == 200 => {}
                Ok(r) => failures.push(format!("status {}", r.status)),
                Err(e) => failures.push(e.to_string()),
            }
            slowest = slowest.max(start.elapsed());
            count += 1;
            thread::sleep(Duration::from_millis(100));
        }
        (count, slowest, failures)
    })
}

/// slowhttptest's last connection counts and its exit status, without colours.
fn summary(output: &str) -> String {
    let mut plain = String::new();
    let mut chars = output.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let last = |field: &str| {
        plain
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix(field))
            .map(str::trim)
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "connected {}, closed {}, exit status: {}",
        last("connected:"),
        last("closed:"),
        last("Exit status:")
    )
}

#[test]
fn slow_clients_never_starve_ordinary_requests() {
    let upstream = Upstream::start();
    let timeouts = "  client_header_timeout: 2s\n  client_body_timeout: 2s\n  send_timeout: 2s\n  keepalive_timeout: 2s\n";
    let body = format!(
        "limiter:\n  backend: local\nupstreams:\n  api: {{ servers: [\"{}\"] }}\nroutes:\n  - name: all\n    upstream: api\n",
        upstream.addr
    );
    let sluice = Sluice::start_with_server(timeouts, &body, &[]);
    let addr = sluice.addr;
    let url = format!("http://{addr}/");
    let modes: [(&str, &[&str]); 3] = [
        ("slowloris (-H)", &["-H", "-i", "1", "-x", "10"]),
        (
            "slow body (-B)",
            &["-B", "-i", "3", "-s", "65536", "-x", "10"],
        ),
        (
            "slow read (-X)",
            &[
                "-X", "-k", "10", "-n", "1", "-w", "16", "-y", "32", "-z", "16",
            ],
        ),
    ];
    for (name, args) in modes {
        let stop = Arc::new(AtomicBool::new(false));
        let prober = probe(addr, Arc::clone(&stop));
        let output = installed("slowhttptest", "slowhttptest")
            .args(args)
            .args(["-c", "300", "-r", "150", "-l", "8", "-p", "2", "-u", &url])
            .output()
            .expect("run slowhttptest");
        stop.store(true, Ordering::SeqCst);
        let (count, slowest, failures) = prober.join().expect("probe");
        let stdout = String::from_utf8_lossy(&output.stdout);
        println!(
            "{name}: {count} probes, slowest {} ms, {} failed; slowhttptest: {}",
            slowest.as_millis(),
            failures.len(),
            summary(&stdout)
        );
        assert!(count > 20, "{name}: the probe ran {count} times");
        assert!(failures.is_empty(), "{name}: {failures:?}");
        assert!(
            slowest < Duration::from_secs(1),
            "{name}: an ordinary request waited {slowest:?}"
        );
    }
    let metrics = sluice.metrics();
    for reason in ["header_timeout", "body_timeout"] {
        let n = metric_value(
            &metrics,
            &format!("sluice_downstream_rejected_total{{reason=\"{reason}\"}}"),
        );
        println!("sluice_downstream_rejected_total{{reason=\"{reason}\"}} {n}");
        assert!(n > 0, "no {reason} was counted");
    }
}
