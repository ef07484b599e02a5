//! What an open operator console costs the proxy (`--parts console`): one
//! sluice (one worker thread, Redis, `sliding_log` per `X-Key`) under wrk's
//! `allowed` load, in interleaved rounds:
//!
//! - `no console`: nobody asks the admin listener anything;
//! - `1 console`: what one open console asks — every API it reads
//!   (`/v1/status`, `/v1/rates`, `/v1/top`, `/v1/upstreams`) every 2 s, its
//!   polling period, each view's at once (more than one tab, which polls only
//!   the view it shows);
//! - `10 consoles`: the same, ten times.
//!
//! The poller is a thread of this process (a browser's own CPU is the
//! operator's machine's, not the gateway's). Columns: requests per second,
//! latency, and the serving process's CPU time per proxied request.

use crate::common::{free_port, RedisServer, Sluice};
use crate::load::run_wrk;
use crate::options::Options;
use crate::process::{clock_ticks_per_second, cpu_model, cpu_ticks};
use crate::report::{median, range};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The console's polling period.
const POLL: Duration = Duration::from_secs(2);

/// What an open console reads each period.
const APIS: [&str; 4] = ["/v1/status", "/v1/rates", "/v1/top?n=50", "/v1/upstreams"];

/// The cases: how many consoles poll.
const CASES: [(&str, usize); 3] = [("no console", 0), ("1 console", 1), ("10 consoles", 10)];

/// One round's figures for one case.
#[derive(Clone, Copy)]
struct Sample {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us: f64,
    polls: u64,
}

/// Consoles polling the admin listener until dropped.
struct Consoles {
    stop: Arc<AtomicBool>,
    polls: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Consoles {
    fn open(admin: SocketAddr, count: usize) -> Consoles {
        let stop = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let threads = (0..count)
            .map(|_| {
                let (stop, polls) = (Arc::clone(&stop), Arc::clone(&polls));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        for api in APIS {
                            let answer = crate::common::get(admin, api, &[]);
                            assert_eq!(answer.status, 200, "{api}: {}", answer.body);
                            polls.fetch_add(1, Ordering::Relaxed);
                        }
                        // Sleep the period in short steps, to stop promptly.
                        let mut slept = Duration::ZERO;
                        while slept < POLL && !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(50));
                            slept += Duration::from_millis(50);
                        }
                    }
                })
            })
            .collect();
        Consoles {
            stop,
            polls,
            threads,
        }
    }
}

impl Drop for Consoles {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Runs the part and returns its section of the report.
pub fn run(options: &Options) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = RedisServer::start();
    let (_upstream, upstream_port) = crate::upstream::spawn(dir.path());
    let (addr, admin) = (free_port(), free_port());
    let addr: SocketAddr = format!("127.0.0.1:{addr}").parse().expect("addr");
    let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().expect("admin");
    let config = format!(
        "server:\n  listen: [\"{addr}\"]\n  admin: \"{admin}\"\n  threads: 1\n  work_stealing: false\n  access_log: off\n  grace_period: 1s\n  pid_file: {dir}/pid\n  upgrade_sock: {dir}/sock\n\
limiter:\n  redis: {{ url: \"{url}\", timeout: 50ms }}\n\
upstreams:\n  up: {{ servers: [\"127.0.0.1:{upstream_port}\"] }}\n\
routes:\n  - name: bench\n    upstream: up\n    limits:\n      - {{ name: per-key, key: [{{header: X-Key}}], limit: 1000, window: 1m }}\n",
        dir = dir.path().display(),
        url = redis.url(),
    );
    let sluice = Sluice::start_binary(
        Path::new(env!("CARGO_BIN_EXE_sluice")),
        &config,
        addr,
        admin,
        &[("RUST_LOG", "warn")],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/versus/wrk.lua");
    let url = format!("http://{addr}/bench");
    // Warm-up: connections, pools, the script cache.
    run_wrk(&url, &script, "allowed", 1, options.connections);
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); CASES.len()];
    for round in 1..=options.rounds {
        for (i, (name, consoles)) in CASES.iter().enumerate() {
            let open = Consoles::open(admin, *consoles);
            let cpu_before = cpu_ticks(sluice.pid());
            let run = run_wrk(
                &url,
                &script,
                "allowed",
                options.seconds,
                options.connections,
            );
            let cpu = cpu_ticks(sluice.pid()) - cpu_before;
            let polls = open.polls.load(Ordering::Relaxed);
            drop(open);
            let requests = run.requests.max(1) as f64;
            let sample = Sample {
                rps: run.requests as f64 / (run.duration_us as f64 / 1e6),
                p50_ms: run.p50_us / 1e3,
                p99_ms: run.p99_us / 1e3,
                cpu_us: cpu as f64 * 1e6 / clock_ticks_per_second() / requests,
                polls,
            };
            eprintln!(
                "console round {round}: {name}: {:.0} req/s, p99 {:.2} ms, {:.1} µs CPU/request, {} admin calls",
                sample.rps, sample.p99_ms, sample.cpu_us, sample.polls
            );
            samples[i].push(sample);
        }
    }
    drop(sluice);
    section(options, &samples)
}

/// The report's section: a row per case, with its ratio to no console.
fn section(options: &Options, samples: &[Vec<Sample>]) -> String {
    let date = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut out = format!(
        "**An open console**: `cargo bench --bench versus -- --parts console --rounds {} --seconds {}` on {date}: {}.\n\n\
{} rounds of {} s, wrk with {} connections, `allowed` traffic (one of 100,000 keys a request, never denied) through one sluice (one worker thread, Redis `sliding_log`); a console reads {} every {} s.\n\n\
| case | req/s (median) | range | ratio to no console | p50 ms | p99 ms | sluice CPU µs/request | admin calls |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        options.rounds,
        options.seconds,
        cpu_model(),
        options.rounds,
        options.seconds,
        options.connections,
        APIS.join(", "),
        POLL.as_secs(),
    );
    let baseline = median(&samples[0], |s| s.rps);
    for ((name, _), rounds) in CASES.iter().zip(samples) {
        let rps = median(rounds, |s| s.rps);
        let (low, high) = range(rounds, |s| s.rps);
        let _ = writeln!(
            out,
            "| {name} | {rps:.0} | {low:.0}–{high:.0} | {:.3}× | {:.2} | {:.2} | {:.1} | {} |",
            rps / baseline,
            median(rounds, |s| s.p50_ms),
            median(rounds, |s| s.p99_ms),
            median(rounds, |s| s.cpu_us),
            rounds.iter().map(|s| s.polls).sum::<u64>(),
        );
    }
    out.push('\n');
    out
}
