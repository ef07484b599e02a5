//! One closed-loop load run: wrk (one thread, a separate process) against
//! one case, with what the case, Redis and the upstream spent meanwhile.

use crate::cases::{Bench, Case};
use crate::process::{clock_ticks_per_second, context_switches, cpu_ticks, SyscallCount};
use crate::upstream;
use std::path::Path;
use std::process::Command;

/// One wrk run's figures.
#[derive(Clone, Copy, Default)]
pub struct Sample {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub admitted: f64,
    pub redis_calls_per_request: f64,
    pub server_cpu_us: f64,
    pub redis_cpu_us: f64,
    /// Context switches of the serving process (voluntary or not), per request.
    pub switches_per_request: f64,
    /// System calls of the serving process per request (NaN: perf could
    /// not count them).
    pub syscalls_per_request: f64,
    /// Socket errors (connect, read, write, timeout).
    pub errors: u64,
    /// Responses with a status of 400 or more.
    pub non_2xx: u64,
}

pub fn wrk(
    bench: &Bench,
    case: &Case,
    scenario: &str,
    script: &Path,
    seconds: u64,
    connections: usize,
) -> Sample {
    let hits_before = upstream::hits(bench.upstream_addr);
    let calls_before = bench.redis_calls(case);
    let redis_pids = bench.redis_pids(case);
    let redis_ticks = || redis_pids.iter().map(|&pid| cpu_ticks(pid)).sum::<u64>();
    let cpu_before = cpu_ticks(case.pid);
    let redis_cpu_before = redis_ticks();
    let switches_before = context_switches(case.pid);
    let syscalls = SyscallCount::start(case.pid);
    let url = format!("http://{}/bench", case.addr);
    let run = run_wrk(&url, script, scenario, seconds, connections);
    let syscalls = syscalls.stop();
    let cpu = cpu_ticks(case.pid) - cpu_before;
    let redis_cpu = redis_ticks() - redis_cpu_before;
    let switches = context_switches(case.pid) - switches_before;
    let calls = bench.redis_calls(case) - calls_before;
    let hits = upstream::hits(bench.upstream_addr) - hits_before;
    let requests = run.requests.max(1) as f64;
    let tick_us = 1e6 / clock_ticks_per_second();
    Sample {
        rps: run.requests as f64 / (run.duration_us as f64 / 1e6),
        p50_ms: run.p50_us / 1e3,
        p99_ms: run.p99_us / 1e3,
        admitted: hits as f64 / requests,
        redis_calls_per_request: calls as f64 / requests,
        server_cpu_us: cpu as f64 * tick_us / requests,
        redis_cpu_us: redis_cpu as f64 * tick_us / requests,
        switches_per_request: switches as f64 / requests,
        syscalls_per_request: syscalls.map_or(f64::NAN, |n| n as f64 / requests),
        errors: run.socket_errors,
        non_2xx: run.status_errors,
    }
}

/// What one wrk run printed on its `RESULT` line.
pub struct WrkRun {
    pub requests: u64,
    pub duration_us: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Connect, read, write and timeout errors.
    pub socket_errors: u64,
    /// Responses with a status of 400 or more.
    pub status_errors: u64,
}

/// wrk (one thread) against `url` with `script` and its `scenario`.
pub fn run_wrk(
    url: &str,
    script: &Path,
    scenario: &str,
    seconds: u64,
    connections: usize,
) -> WrkRun {
    let output = Command::new("wrk")
        .args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s")])
        .arg("-s")
        .arg(script)
        .arg(url)
        .args(["--", scenario])
        .output()
        .expect("run wrk");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "wrk printed no result: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let field = |name: &str| -> f64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    WrkRun {
        requests: field("requests") as u64,
        duration_us: field("duration_us") as u64,
        mean_us: field("mean_us"),
        p50_us: field("p50_us"),
        p99_us: field("p99_us"),
        socket_errors: field("socket_errors") as u64,
        status_errors: field("status_errors") as u64,
    }
}
