//! The side-by-side load benchmark: sluice against nginx `limit_req`
//! and nginx + Lua + Redis, in one run, on one machine, one worker each.
//!
//!   cargo bench --bench versus                      # 3 rounds of 5 s
//!   cargo bench --bench versus -- --rounds 5 --seconds 10 --connections 32
//!   cargo bench --bench versus -- --scenarios allowed,flood --out /tmp/r.md
//!   cargo bench --bench versus -- --before /tmp/sluice-old   # before/after
//!   cargo bench --bench versus -- --pin --scenarios allowed  # own core each
//!   cargo bench --bench versus -- --update-readme   # also docs/benchmarks.md
//!   cargo bench --bench versus -- --parts edge      # TLS and HTTP/2 only
//!   cargo bench --bench versus -- --parts rls       # the rate-limit service
//!   cargo bench --bench versus -- --parts redis     # decisions per Redis core
//!   cargo bench --bench versus -- --parts tracing   # tracing's cost, in instructions
//!   cargo bench --bench versus -- --parts overhead  # sluice's own cost, in instructions
//!   cargo bench --bench versus -- --parts console   # what an open console costs
//!   cargo bench --bench versus -- --parts llm       # reserve + settle on streamed answers
//!
//! It starts one Redis, one fast upstream (this binary again, in `--upstream`
//! mode: Pingora answering `200 ok`, one thread), and:
//!
//! - sluice without limits, with a `sliding_log` limit on Redis, with
//!   `sliding_window` on Redis, and with `backend: local` (one worker thread);
//!   with `--before BINARY`, that earlier build too, without limits and with
//!   `sliding_log`, for a before/after table measured in the same rounds;
//! - nginx with `limit_req` (Debian's nginx, one worker process);
//! - nginx + Lua (Debian's `libnginx-mod-http-lua`) calling sluice's own decide
//!   script (`sliding_log`) on the same Redis from `access_by_lua`, with
//!   keepalive connections: the architecture of Kong's and APISIX's
//!   Redis-backed limits (`benches/versus/redis_limit.lua`).
//!
//! Every limit is 1,000 per minute per `X-Key` header. Scenarios
//! (`benches/versus/wrk.lua`): `allowed` (100,000 keys at random, never
//! denied), `flood` (one key: all but the first 1,000 a minute denied) and
//! `mix` (10 % on the flooded key). wrk (one thread, a separate process on
//! loopback) drives each case in turn, interleaved: A B C … A B C …, several
//! rounds; the tables give medians and min–max. Then every case is driven at
//! one fixed rate, half of the peak of sluice + Redis `sliding_log`, by an
//! open-loop client in this process ([`paced`]), for the latency the limiter
//! adds below saturation (Redis emptied first, so that the earlier rounds'
//! keys do not expire during it), and so is the upstream alone, for the
//! noise floor.
//!
//! Columns: req/s; wrk's p50/p99; the ratio to nginx `limit_req` in the same
//! scenario; the share of requests the upstream saw (admitted); Redis script
//! calls per request (from `INFO commandstats`); CPU time per request of the
//! serving process and of Redis (from `/proc`), the per-core cost the req/s of
//! a shared 2-core machine only hints at.
//!
//! Then, in the same run (`--parts edge` alone), TLS and HTTP/2: sluice and
//! nginx with the same certificate over HTTP/1.1 and HTTP/2, plain and TLS,
//! kept-alive and one connection per request, and what TLS itself costs
//! each server ([`edge`]).
//!
//! And (`--parts rls`) the rate-limit service for Envoy against the
//! gateway's own decision, on one Redis ([`rls`]); and (`--parts redis`)
//! how many decisions one Redis core makes, sluice's algorithms against the
//! seed's script, envoyproxy/ratelimit's commands and the `INCR` floor
//! ([`capacity`]); and (`--parts tracing`) what tracing costs a request,
//! counted in instructions under Callgrind ([`instructions`]).
//!
//! The harness by job: [`options`] (clap), [`cases`] (what is started),
//! [`load`] (one wrk run), [`paced`] (the open-loop client), [`report`]
//! (tables and targets), [`process`] and [`upstream`]. The tables are
//! printed and written to `benches/results.md`; `--update-readme` also puts
//! them into `docs/benchmarks.md` between the `<!-- versus:begin -->` /
//! `<!-- versus:end -->` markers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark stops on what it did not expect

#[path = "../../tests/common/mod.rs"]
mod common;

mod bare;
mod capacity;
mod cases;
mod console;
mod edge;
mod instructions;
mod llm;
mod load;
mod options;
mod overhead;
mod paced;
mod process;
mod report;
mod rls;
mod upstream;

use cases::{start_all, Bench, Case, SCENARIOS, SLUICE_LOG};
use clap::Parser;
use load::{wrk, Sample};
use options::Options;
use paced::Paced;
use report::{embed, median, report};
use std::collections::HashMap;
use std::path::Path;

/// Every limit's number, per minute.
const LIMIT: u64 = 1000;
/// Every limit's window.
const WINDOW_US: u64 = 60_000_000;
/// Where Debian's nginx keeps its dynamic modules.
const NGINX_MODULES: &str = "/usr/lib/nginx/modules";

fn main() {
    let options = Options::parse();
    if let Some(addr) = &options.upstream {
        upstream::run(addr);
    }
    if let Some(spec) = &options.bare {
        let parts: Vec<&str> = spec.split(',').collect();
        let (&[listen, upstream, threads, stealing], deny) = parts.split_at(4.min(parts.len()))
        else {
            panic!("--bare LISTEN,UPSTREAM,THREADS,WORK_STEALING[,429]");
        };
        let upstream = upstream.parse().expect("--bare: upstream address");
        let threads = threads.parse().expect("--bare: threads");
        bare::run(
            listen,
            upstream,
            threads,
            stealing == "true",
            deny == ["429"],
        );
    }
    for (tool, package) in [
        ("wrk", "wrk"),
        ("nginx", "nginx"),
        ("redis-server", "redis-server"),
    ] {
        let on_path = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        assert!(
            on_path,
            "`{tool}` is not installed: apt-get install {package}"
        );
    }
    let lua_module = Path::new(NGINX_MODULES).join("ngx_http_lua_module.so");
    assert!(
        lua_module.exists(),
        "{} is missing: apt-get install libnginx-mod-http-lua",
        lua_module.display()
    );
    if let Some(before) = &options.before {
        assert!(
            before.is_file(),
            "--before {}: no such binary",
            before.display()
        );
    }
    run(&options);
}

fn run(options: &Options) {
    let mut report = String::new();
    if options.runs("limits") {
        let section = limits(options);
        if options.update_readme {
            let part = if options.pin {
                "versus-pinned"
            } else {
                "versus"
            };
            embed(&Options::benchmark_document(), part, &section);
        }
        report.push_str(&section);
    }
    if options.runs("rls") {
        let section = rls::run(options);
        if options.update_readme {
            embed(&Options::benchmark_document(), "rls", &section);
        }
        report.push_str(&section);
    }
    if options.runs("redis") {
        let section = capacity::run(options);
        if options.update_readme {
            embed(&Options::benchmark_document(), "capacity", &section);
        }
        report.push_str(&section);
    }
    if options.runs("tracing") {
        let section = instructions::run(options);
        if options.update_readme {
            embed(&Options::benchmark_document(), "tracing", &section);
        }
        report.push_str(&section);
    }
    if options.runs("overhead") {
        let section = overhead::run(options);
        if options.update_readme {
            embed(&Options::benchmark_document(), "overhead", &section);
        }
        report.push_str(&section);
    }
    if options.runs("llm") {
        let section = llm::run(options);
        if options.update_readme {
            embed(&Options::benchmark_document(), "llm", &section);
        }
        report.push_str(&section);
    }
    if options.runs("console") {
        let section = console::run(options);
        if options.update_readme {
            embed(&Options::benchmark_document(), "console", &section);
        }
        report.push_str(&section);
    }
    if options.runs("edge") {
        let section = edge::run(options);
        if options.update_readme {
            embed(&Options::benchmark_document(), "edge", &section);
        }
        report.push_str(&section);
    }
    println!("{report}");
    std::fs::write(&options.out, &report).expect("write results");
    eprintln!("written to {}", options.out.display());
}

/// The limiters side by side on plain HTTP/1.1: the throughput rounds of
/// every scenario, then the fixed-rate pass.
fn limits(options: &Options) -> String {
    let bench = start_all(options.before.as_deref());
    if options.pin {
        bench.pin_topology();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/versus/wrk.lua");
    let plan: Vec<(&'static str, &Case)> = SCENARIOS
        .iter()
        .filter(|s| options.scenarios.iter().any(|o| o == *s))
        .flat_map(|&scenario| {
            bench
                .cases
                .iter()
                .filter(move |c| c.limits || scenario == "allowed")
                .map(move |c| (scenario, c))
        })
        .collect();
    eprintln!(
        "versus: {} runs a round, {} rounds of {} s, {} connections",
        plan.len(),
        options.rounds,
        options.seconds,
        options.connections
    );
    let samples = throughput_rounds(options, &bench, &plan, &script);
    let (rate, paced_results) = paced_rounds(options, &bench, &samples);
    if options.pin {
        // The parts after this one start their own servers from this process.
        process::unpin_self();
    }
    report(options, &bench, &samples, rate, &paced_results)
}

/// Every (scenario, case) of `plan`, once to warm up, then in interleaved
/// rounds: A B C … A B C ….
fn throughput_rounds<'b>(
    options: &Options,
    bench: &'b Bench,
    plan: &[(&'static str, &'b Case)],
    script: &Path,
) -> HashMap<(&'static str, &'static str), Vec<Sample>> {
    for (scenario, case) in plan {
        // Warm-up: connections, pools, the script cache, the JIT.
        wrk(bench, case, scenario, script, 1, options.connections);
    }
    let mut samples: HashMap<(&str, &str), Vec<Sample>> = HashMap::new();
    for round in 1..=options.rounds {
        for (scenario, case) in plan {
            let sample = wrk(
                bench,
                case,
                scenario,
                script,
                options.seconds,
                options.connections,
            );
            eprintln!(
                "round {round} {scenario:8} {:38} {:>8.0} req/s  p99 {:.2} ms  admitted {:.1} %",
                case.name,
                sample.rps,
                sample.p99_ms,
                sample.admitted * 100.0
            );
            samples
                .entry((scenario, case.name))
                .or_default()
                .push(sample);
        }
    }

    samples
}

/// Every case at one rate, half of the peak of sluice + Redis `sliding_log`
/// on allowed traffic: the latency the limiter adds below saturation.
fn paced_rounds(
    options: &Options,
    bench: &Bench,
    samples: &HashMap<(&'static str, &'static str), Vec<Sample>>,
) -> (f64, HashMap<&'static str, Vec<Paced>>) {
    let peak = samples
        .get(&("allowed", SLUICE_LOG))
        .map_or(2000.0, |s| median(s, |x| x.rps));
    let rate = (peak / 2.0).max(100.0);
    // The throughput rounds leave ~100,000 keys that expire a minute after
    // their last request; Redis's expiry cycle would then stall the Redis
    // cases' tails (up to 25 ms per cycle) for reasons of this benchmark's
    // own history, not of the case measured. Start from an empty Redis.
    bench.flush_redis();
    let mut paced_results: HashMap<&str, Vec<Paced>> = HashMap::new();
    for round in 1..=options.rounds {
        for case in bench.paced_cases() {
            let paced = paced::run(case.addr, rate, options.seconds, options.connections);
            eprintln!(
                "paced {round} {:38} {:.0} req/s sent  p50 {:.2} ms  p99 {:.2} ms",
                case.name, paced.achieved, paced.p50_ms, paced.p99_ms
            );
            paced_results.entry(case.name).or_default().push(paced);
        }
    }

    (rate, paced_results)
}
