//! The side-by-side load benchmark: sluice against nginx `limit_req`
//! and nginx + Lua + Redis, in one run, on one machine, one worker each.
//!
//!   cargo bench --bench versus                      # 3 rounds of 5 s
//!   cargo bench --bench versus -- --rounds 5 --seconds 10 --connections 32
//!   cargo bench --bench versus -- --scenarios allowed,flood --no-readme --out /tmp/r.md
//!
//! It starts one Redis, one fast upstream (this binary again, in `--upstream`
//! mode: Pingora answering `200 ok`, one thread), and:
//!
//! - sluice without limits, with a `sliding_log` limit on Redis, with
//!   `sliding_window` on Redis, and with `backend: local` (one worker thread);
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
//! open-loop client in this process, for the latency the limiter adds below
//! saturation (Redis emptied first, so that the earlier rounds' keys do not
//! expire during it), and so is the upstream alone, for the noise floor.
//!
//! Columns: req/s; wrk's p50/p99; the ratio to nginx `limit_req` in the same
//! scenario; the share of requests the upstream saw (admitted); Redis script
//! calls per request (from `INFO commandstats`); CPU time per request of the
//! serving process and of Redis (from `/proc`), the per-core cost the req/s of
//! a shared 2-core machine only hints at.
//!
//! The tables are printed, written to `benches/results.md`, and put into
//! `docs/benchmarks.md` between the `<!-- versus:begin -->` /
//! `<!-- versus:end -->` markers (`--no-readme` leaves that file alone).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{free_port, wait_until, RedisServer, Sluice};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LIMIT: u64 = 1000;
const WINDOW_US: u64 = 60_000_000;
const NGINX_MODULES: &str = "/usr/lib/nginx/modules";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--upstream") {
        let addr = args.get(i + 1).expect("--upstream ADDR");
        upstream::run(addr);
    }
    let options = Options::parse(&args);
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
    run(&options);
}

/// Command-line options (after `cargo bench --bench versus --`).
struct Options {
    rounds: usize,
    seconds: u64,
    connections: usize,
    out: PathBuf,
    readme: Option<PathBuf>,
    /// Scenarios to run (all by default).
    scenarios: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut options = Self {
            rounds: 3,
            seconds: 5,
            connections: 32,
            out: root.join("benches/results.md"),
            readme: Some(root.join("docs/benchmarks.md")),
            scenarios: SCENARIOS.iter().map(|s| s.to_string()).collect(),
        };
        let mut i = 1;
        while i < args.len() {
            let value = || args.get(i + 1).expect("option needs a value").clone();
            match args[i].as_str() {
                "--rounds" => options.rounds = value().parse().expect("--rounds N"),
                "--seconds" => options.seconds = value().parse().expect("--seconds N"),
                "--connections" => options.connections = value().parse().expect("--connections N"),
                "--out" => options.out = PathBuf::from(value()),
                "--scenarios" => {
                    options.scenarios = value().split(',').map(str::to_string).collect();
                    assert!(
                        options
                            .scenarios
                            .iter()
                            .all(|s| SCENARIOS.contains(&s.as_str())),
                        "--scenarios: a comma-separated subset of {SCENARIOS:?}"
                    );
                }
                "--no-readme" => {
                    options.readme = None;
                    i += 1;
                    continue;
                }
                "--bench" => {
                    i += 1; // passed by cargo
                    continue;
                }
                other => panic!(
                    "unknown option {other:?}: use --rounds N, --seconds N, --connections N, \
                     --scenarios a,b, --out FILE, --no-readme"
                ),
            }
            i += 2;
        }
        options
    }
}

// ------------------------------------------------------------------ the cases

/// One server under test.
struct Case {
    name: &'static str,
    addr: SocketAddr,
    /// The process whose CPU time is the server's (nginx: its worker).
    pid: u32,
    /// Whether it limits (a no-limit case runs only the `allowed` scenario).
    limits: bool,
    /// Whether it calls Redis per request.
    redis: bool,
}

const NGINX_LIMIT_REQ: &str = "nginx limit_req";
const NGINX_LUA: &str = "nginx + Lua + Redis (sliding_log)";
const SLUICE_NOLIMIT: &str = "sluice, no limit";
const SLUICE_LOG: &str = "sluice + Redis, sliding_log";
const SLUICE_WINDOW: &str = "sluice + Redis, sliding_window";
const SLUICE_LOCAL: &str = "sluice, backend: local";
const UPSTREAM_ALONE: &str = "upstream alone (no proxy)";
const SCENARIOS: [&str; 3] = ["allowed", "flood", "mix"];

/// Everything started for the run; dropped (killed) at the end.
struct Bench {
    redis: RedisServer,
    _upstream: Daemon,
    upstream_addr: SocketAddr,
    upstream_case: Case,
    _sluices: Vec<Sluice>,
    _nginx: Vec<Daemon>,
    cases: Vec<Case>,
    _dir: tempfile::TempDir,
}

fn start_all() -> Bench {
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = RedisServer::start();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(sluice::limiter::wire::DECIDE_SCRIPT)
        .query(&mut redis.connection())
        .expect("SCRIPT LOAD");
    let upstream_port = free_port();
    let upstream = Daemon::spawn(
        "upstream",
        Command::new(std::env::current_exe().expect("current exe"))
            .args(["--upstream", &format!("127.0.0.1:{upstream_port}")]),
        dir.path(),
    );
    wait_for_port(upstream_port);

    let mut cases = Vec::new();
    let mut sluices = Vec::new();
    let limit = |algorithm: &str| {
        format!(
            "    limits:\n      - {{ name: per-key, key: [{{header: X-Key}}], limit: {LIMIT}, window: 1m, algorithm: {algorithm} }}\n"
        )
    };
    for (name, backend, prefix, limits) in [
        (
            SLUICE_NOLIMIT,
            "redis",
            "nolimit:",
            "    limits: []\n".to_string(),
        ),
        (SLUICE_LOG, "redis", "log:", limit("sliding_log")),
        (SLUICE_WINDOW, "redis", "window:", limit("sliding_window")),
        (SLUICE_LOCAL, "local", "local:", limit("sliding_log")),
    ] {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let run_dir = dir.path().join(prefix.trim_end_matches(':'));
        std::fs::create_dir_all(&run_dir).expect("mkdir");
        // One worker thread, as nginx has one worker; no access log (nginx's
        // is off too); a Redis failure denies, so it cannot pass for speed.
        let config = format!(
            "server:\n  listen: [\"{addr}\"]\n  admin: \"{admin}\"\n  threads: 1\n  grace_period: 1s\n  access_log: off\n  pid_file: {pid}\n  upgrade_sock: {sock}\n\
             limiter:\n  backend: {backend}\n  redis: {{ url: \"{url}\", timeout: 50ms, key_prefix: \"{prefix}\" }}\n  on_error: deny\n\
             upstreams:\n  api: {{ servers: [\"127.0.0.1:{upstream_port}\"] }}\n\
             routes:\n  - name: bench\n    upstream: api\n{limits}",
            pid = run_dir.join("pid").display(),
            sock = run_dir.join("sock").display(),
            url = redis.url(),
        );
        let sluice = Sluice::start_with(&config, addr, admin, &[("RUST_LOG", "warn")]);
        cases.push(Case {
            name,
            addr,
            pid: sluice.pid(),
            limits: name != SLUICE_NOLIMIT,
            redis: backend == "redis" && name != SLUICE_NOLIMIT,
        });
        sluices.push(sluice);
    }

    let mut nginx = Vec::new();
    for (name, lua) in [(NGINX_LIMIT_REQ, false), (NGINX_LUA, true)] {
        let (daemon, addr, worker) = start_nginx(dir.path(), lua, upstream_port, redis.port, &sha);
        cases.push(Case {
            name,
            addr,
            pid: worker,
            limits: true,
            redis: lua,
        });
        nginx.push(daemon);
    }
    let upstream_pid = upstream.child.id();
    Bench {
        redis,
        _upstream: upstream,
        upstream_addr: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
        upstream_case: Case {
            name: UPSTREAM_ALONE,
            addr: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            pid: upstream_pid,
            limits: false,
            redis: false,
        },
        _sluices: sluices,
        _nginx: nginx,
        cases,
        _dir: dir,
    }
}

impl Bench {
    /// The cases of the fixed-rate pass: every server, then the upstream
    /// alone (the floor: what the machine and the client add by themselves).
    fn paced_cases(&self) -> impl Iterator<Item = &Case> {
        self.cases
            .iter()
            .chain(std::iter::once(&self.upstream_case))
    }
}

/// Starts nginx (master + one worker); returns it, its address and the
/// worker's pid.
fn start_nginx(
    dir: &Path,
    lua: bool,
    upstream_port: u16,
    redis_port: u16,
    sha: &str,
) -> (Daemon, SocketAddr, u32) {
    let name = if lua { "nginx-lua" } else { "nginx" };
    let prefix = dir.join(name);
    std::fs::create_dir_all(prefix.join("logs")).expect("mkdir");
    let port = free_port();
    let lua_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/versus");
    let (modules, http, access) = if lua {
        (
            format!(
                "load_module {NGINX_MODULES}/ndk_http_module.so;\nload_module {NGINX_MODULES}/ngx_http_lua_module.so;\n"
            ),
            format!(
                "lua_package_path \"{}/?.lua;;\";\n  init_by_lua_block {{\n    redis_limit = require \"redis_limit\"\n    redis_limit.configure {{ port = {redis_port}, sha = \"{sha}\", prefix = \"nginx:\", limit = \"{LIMIT}\", window_us = \"{WINDOW_US}\", timeout_ms = 50 }}\n  }}\n",
                lua_dir.display()
            ),
            "access_by_lua_block { redis_limit.check() }".to_string(),
        )
    } else {
        (
            String::new(),
            // The same 1,000 a minute, as nginx expresses it: a leaky bucket
            // that lets a burst of 1,000 through at once.
            "limit_req_zone $http_x_key zone=per_key:64m rate=1000r/m;\n  limit_req_status 429;\n"
                .to_string(),
            "limit_req zone=per_key burst=1000 nodelay;".to_string(),
        )
    };
    let config = format!(
        "{modules}worker_processes 1;\ndaemon off;\npid {pid};\nerror_log {log} warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  {http}\n  upstream api {{ server 127.0.0.1:{upstream_port}; keepalive 128; }}\n\
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      {access}\n      proxy_pass http://api;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n",
        pid = prefix.join("nginx.pid").display(),
        log = prefix.join("logs/error.log").display(),
    );
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, config).expect("write nginx.conf");
    let daemon = Daemon::spawn(
        name,
        Command::new("nginx")
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf_path),
        dir,
    );
    wait_for_port(port);
    let master = daemon.child.id();
    let mut worker = None;
    wait_until(Duration::from_secs(10), "the nginx worker", || {
        worker = children_of(master).first().copied();
        worker.is_some()
    });
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    (daemon, addr, worker.unwrap_or(master))
}

// --------------------------------------------------------------- the rounds

/// One wrk run's figures.
#[derive(Clone, Copy, Default)]
struct Sample {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    admitted: f64,
    redis_calls_per_request: f64,
    server_cpu_us: f64,
    redis_cpu_us: f64,
    errors: u64,
}

fn run(options: &Options) {
    let bench = start_all();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/versus/wrk.lua");
    let plan: Vec<(&str, &Case)> = SCENARIOS
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
    for (scenario, case) in &plan {
        // Warm-up: connections, pools, the script cache, the JIT.
        wrk(&bench, case, scenario, &script, 1, options.connections);
    }
    let mut samples: HashMap<(&str, &str), Vec<Sample>> = HashMap::new();
    for round in 1..=options.rounds {
        for (scenario, case) in &plan {
            let sample = wrk(
                &bench,
                case,
                scenario,
                &script,
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

    // Latency below saturation: every case at one rate, half of the peak of
    // sluice + Redis sliding_log on allowed traffic.
    let peak = samples
        .get(&("allowed", SLUICE_LOG))
        .map_or(2000.0, |s| median(s, |x| x.rps));
    let rate = (peak / 2.0).max(100.0);
    // The throughput rounds leave ~100,000 keys that expire a minute after
    // their last request; Redis's expiry cycle would then stall the Redis
    // cases' tails (up to 25 ms per cycle) for reasons of this benchmark's
    // own history, not of the case measured. Start from an empty Redis.
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut bench.redis.connection())
        .expect("FLUSHALL");
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

    let report = report(options, &bench, &samples, rate, &paced_results);
    println!("{report}");
    std::fs::write(&options.out, &report).expect("write results");
    eprintln!("written to {}", options.out.display());
    if let Some(readme) = &options.readme {
        embed(readme, &report);
    }
    drop(bench);
}

fn wrk(
    bench: &Bench,
    case: &Case,
    scenario: &str,
    script: &Path,
    seconds: u64,
    connections: usize,
) -> Sample {
    let hits_before = upstream::hits(bench.upstream_addr);
    let calls_before = redis_script_calls(&bench.redis);
    let cpu_before = cpu_ticks(case.pid);
    let redis_cpu_before = cpu_ticks(bench.redis.pid());
    let output = Command::new("wrk")
        .args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s")])
        .arg("-s")
        .arg(script)
        .arg(format!("http://{}/bench", case.addr))
        .args(["--", scenario])
        .output()
        .expect("run wrk");
    let cpu = cpu_ticks(case.pid) - cpu_before;
    let redis_cpu = cpu_ticks(bench.redis.pid()) - redis_cpu_before;
    let calls = redis_script_calls(&bench.redis) - calls_before;
    let hits = upstream::hits(bench.upstream_addr) - hits_before;
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
    let requests = field("requests").max(1.0);
    let tick_us = 1e6 / clock_ticks_per_second();
    Sample {
        rps: requests / (field("duration_us") / 1e6),
        p50_ms: field("p50_us") / 1e3,
        p99_ms: field("p99_us") / 1e3,
        admitted: hits as f64 / requests,
        redis_calls_per_request: calls as f64 / requests,
        server_cpu_us: cpu as f64 * tick_us / requests,
        redis_cpu_us: redis_cpu as f64 * tick_us / requests,
        errors: field("socket_errors") as u64,
    }
}

// ---------------------------------------------------------------- the report

/// One figure's median and range over the rounds.
fn median<T>(samples: &[T], figure: impl Fn(&T) -> f64) -> f64 {
    let mut values: Vec<f64> = samples.iter().map(figure).collect();
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn range<T>(samples: &[T], figure: impl Fn(&T) -> f64) -> (f64, f64) {
    samples
        .iter()
        .map(figure)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

fn report(
    options: &Options,
    bench: &Bench,
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    rate: f64,
    paced: &HashMap<&str, Vec<Paced>>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`cargo bench --bench versus -- --rounds {} --seconds {} --connections {}` on {}: {} ({} cores), {}; {}, {}, wrk 4 (one thread).\n",
        options.rounds,
        options.seconds,
        options.connections,
        command_line("date", &["-u", "+%Y-%m-%d"]),
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        command_line("uname", &["-sr"]),
        command_line("nginx", &["-v"]).replace("nginx version: ", ""),
        command_line("redis-server", &["--version"])
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    );
    let _ = writeln!(
        out,
        "Every server has one worker (thread or process); wrk, the upstream and Redis share the same cores. \
         Medians of {} interleaved rounds, min–max in brackets. Admitted: the share of requests the upstream saw \
         (requests still in flight when wrk stops can put it a little over 100 %). \
         CPU: the serving process's and Redis's CPU time per request.\n",
        options.rounds
    );
    for scenario in SCENARIOS {
        let reference = samples
            .get(&(scenario, NGINX_LIMIT_REQ))
            .map_or(1.0, |s| median(s, |x| x.rps));
        let _ = writeln!(out, "{}\n", scenario_title(scenario));
        let _ = writeln!(
            out,
            "| case | req/s | vs nginx limit_req | p50 ms | p99 ms | admitted | Redis calls/req | CPU µs/req (server + Redis) | errors |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for case in &bench.cases {
            let Some(s) = samples.get(&(scenario, case.name)) else {
                continue;
            };
            let (lo, hi) = range(s, |x| x.rps);
            let _ = writeln!(
                out,
                "| {} | {:.0} ({:.0}–{:.0}) | {:.2}× | {:.2} | {:.2} | {:.1} % | {} | {:.1} + {:.1} | {} |",
                case.name,
                median(s, |x| x.rps),
                lo,
                hi,
                median(s, |x| x.rps) / reference,
                median(s, |x| x.p50_ms),
                median(s, |x| x.p99_ms),
                median(s, |x| x.admitted) * 100.0,
                if case.redis {
                    format!("{:.4}", median(s, |x| x.redis_calls_per_request))
                } else {
                    "—".into()
                },
                median(s, |x| x.server_cpu_us),
                median(s, |x| x.redis_cpu_us),
                s.iter().map(|x| x.errors).sum::<u64>(),
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "**Latency below saturation**: every case driven at {rate:.0} req/s (half the peak of sluice + Redis sliding_log), allowed traffic, open loop (a late response delays the next send, and that delay counts). \
         The upstream alone, driven the same way, shows this machine's own latency noise.\n"
    );
    let _ = writeln!(
        out,
        "| case | sent req/s | p50 ms | p99 ms | p99 over sluice, no limit |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    let base_p99 = paced
        .get(SLUICE_NOLIMIT)
        .map_or(0.0, |p| median(p, |x| x.p99_ms));
    for case in bench.paced_cases() {
        let Some(p) = paced.get(case.name) else {
            continue;
        };
        let p99 = median(p, |x| x.p99_ms);
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2} | {:.2} | {:+.2} ms |",
            case.name,
            median(p, |x| x.achieved),
            median(p, |x| x.p50_ms),
            p99,
            p99 - base_p99
        );
    }
    out.push('\n');
    out.push_str(&targets(samples, paced));
    out
}

fn scenario_title(scenario: &str) -> &'static str {
    match scenario {
        "allowed" => "**Allowed traffic** (100,000 keys at random; nothing is denied)",
        "flood" => "**Flood on one key** (all but 1,000 a minute denied)",
        _ => "**Mix** (90 % allowed over 100,000 keys, 10 % on one flooded key)",
    }
}

/// The targets, each with its measured figure.
fn targets(
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    paced: &HashMap<&str, Vec<Paced>>,
) -> String {
    let rps = |scenario: &str, case: &str| {
        samples
            .get(&(scenario, case))
            .map_or(0.0, |s| median(s, |x| x.rps))
    };
    let p99 = |case: &str| paced.get(case).map_or(0.0, |p| median(p, |x| x.p99_ms));
    let flood_calls = samples
        .get(&("flood", SLUICE_LOG))
        .map_or(f64::NAN, |s| median(s, |x| x.redis_calls_per_request));
    let mut rows = vec![
        (
            "sluice + Redis sliding_log ≥ 1.0× nginx limit_req (allowed)".to_string(),
            rps("allowed", SLUICE_LOG) / rps("allowed", NGINX_LIMIT_REQ),
            1.0,
            true,
        ),
        (
            "sluice + Redis sliding_log ≥ 2× nginx + Lua + Redis (allowed)".to_string(),
            rps("allowed", SLUICE_LOG) / rps("allowed", NGINX_LUA),
            2.0,
            true,
        ),
        (
            "sluice + Redis ≥ 0.90× sluice without limits (allowed)".to_string(),
            rps("allowed", SLUICE_LOG) / rps("allowed", SLUICE_NOLIMIT),
            0.90,
            true,
        ),
        (
            "flood: ≤ 0.01 Redis calls per request".to_string(),
            flood_calls,
            0.01,
            false,
        ),
        (
            "flood: ≥ 2× the allowed-traffic req/s".to_string(),
            rps("flood", SLUICE_LOG) / rps("allowed", SLUICE_LOG),
            2.0,
            true,
        ),
    ];
    for case in [SLUICE_LOG, SLUICE_WINDOW, SLUICE_LOCAL] {
        rows.push((
            format!("p99 at half load: {case} adds ≤ 0.5 ms over no limit (ms added)"),
            p99(case) - p99(SLUICE_NOLIMIT),
            0.5,
            false,
        ));
    }
    let mut out = String::from("| target | measured | met |\n|---|---|---|\n");
    for (what, value, bound, at_least) in rows {
        let met = if at_least {
            value >= bound
        } else {
            value <= bound
        };
        let _ = writeln!(
            out,
            "| {what} | {value:.3} | {} |",
            if met { "yes" } else { "**no**" }
        );
    }
    out
}

/// Replaces the text between the benchmark document's markers with `report`.
fn embed(readme: &Path, report: &str) {
    const BEGIN: &str = "<!-- versus:begin -->";
    const END: &str = "<!-- versus:end -->";
    let Ok(text) = std::fs::read_to_string(readme) else {
        return;
    };
    match (text.find(BEGIN), text.find(END)) {
        (Some(b), Some(e)) if b < e => {
            let updated = format!("{}{BEGIN}\n{report}{}", &text[..b], &text[e..]);
            std::fs::write(readme, updated).expect("update the benchmark document");
            eprintln!("{} updated", readme.display());
        }
        _ => eprintln!(
            "{} has no {BEGIN} … {END} block; not updated",
            readme.display()
        ),
    }
}

// ------------------------------------------------------------------ helpers

/// A child process stopped with SIGTERM (then SIGKILL) when dropped.
struct Daemon {
    child: Child,
}

impl Daemon {
    fn spawn(name: &str, command: &mut Command, dir: &Path) -> Self {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Self { child }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for_port(port: u16) {
    wait_until(Duration::from_secs(30), &format!("port {port}"), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// Processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state, ppid, …
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        if after.split_whitespace().nth(1) == Some(&pid.to_string()) {
            children.push(child);
        }
    }
    children
}

/// User + system CPU time of `pid` (all its threads), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat: 12 and 13 after the ')'.
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    field(11).unwrap_or(0) + field(12).unwrap_or(0)
}

fn clock_ticks_per_second() -> f64 {
    command_line("getconf", &["CLK_TCK"])
        .parse()
        .unwrap_or(100.0)
}

/// `EVALSHA` + `EVAL` calls Redis has served so far.
fn redis_script_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.connection())
        .unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split([':', ',', '='])
                .skip_while(|p| *p != "calls")
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text).trim().to_string()
        })
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into())
}

// ------------------------------------------------------------ the upstream

/// The shared upstream: Pingora answering `200 ok` on one thread, counting
/// what it serves (`GET /__hits` answers the count, and is not counted).
mod upstream {
    use super::*;
    use async_trait::async_trait;
    use http::Response;
    use pingora::apps::http_app::ServeHttp;
    use pingora::protocols::http::ServerSession;
    use pingora::server::configuration::{Opt, ServerConf};
    use pingora::server::Server;
    use pingora::services::listening::Service;

    struct Ok200 {
        hits: Arc<AtomicU64>,
    }

    #[async_trait]
    impl ServeHttp for Ok200 {
        async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
            let body = if session.req_header().uri.path() == "/__hits" {
                self.hits.load(Ordering::Relaxed).to_string().into_bytes()
            } else {
                self.hits.fetch_add(1, Ordering::Relaxed);
                b"ok".to_vec()
            };
            let length = body.len();
            let mut response = Response::new(body);
            response
                .headers_mut()
                .insert(http::header::CONTENT_LENGTH, length.into());
            response
        }
    }

    pub fn run(addr: &str) -> ! {
        let conf = ServerConf {
            threads: 1,
            ..ServerConf::default()
        };
        let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
        server.bootstrap();
        let mut service = Service::new(
            "bench upstream".into(),
            Ok200 {
                hits: Arc::new(AtomicU64::new(0)),
            },
        );
        service.add_tcp(addr);
        server.add_service(service);
        server.run_forever()
    }

    /// Requests served so far (other than `/__hits`).
    pub fn hits(addr: SocketAddr) -> u64 {
        common::get(addr, "/__hits", &[])
            .body
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

// ---------------------------------------------------------- the paced client

/// One paced run's figures.
struct Paced {
    achieved: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// An open-loop client: `connections` keep-alive connections, each sending on
/// its own schedule so that together they send `rate` requests a second. A
/// request's latency runs from when it was due, so a slow response that
/// delays the next request counts against the server (no coordinated
/// omission).
mod paced {
    use super::Paced;
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    pub fn run(addr: SocketAddr, rate: f64, seconds: u64, connections: usize) -> Paced {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let interval = Duration::from_secs_f64(connections as f64 / rate);
            let start = Instant::now() + Duration::from_millis(50);
            let end = start + Duration::from_secs(seconds);
            let tasks: Vec<_> = (0..connections)
                .map(|c| {
                    let offset = interval.mul_f64(c as f64 / connections as f64);
                    tokio::spawn(connection(addr, start + offset, interval, end, c as u64))
                })
                .collect();
            let mut latencies = Vec::new();
            for task in tasks {
                latencies.extend(task.await.unwrap_or_default());
            }
            latencies.sort_unstable();
            let at = |q: f64| {
                latencies
                    .get(
                        ((latencies.len() as f64 * q) as usize)
                            .min(latencies.len().saturating_sub(1)),
                    )
                    .map_or(f64::NAN, |us| *us as f64 / 1e3)
            };
            Paced {
                achieved: latencies.len() as f64 / seconds as f64,
                p50_ms: at(0.50),
                p99_ms: at(0.99),
            }
        })
    }

    async fn connection(
        addr: SocketAddr,
        first: Instant,
        interval: Duration,
        end: Instant,
        seed: u64,
    ) -> Vec<u64> {
        let mut latencies = Vec::new();
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            return latencies;
        };
        let _ = stream.set_nodelay(true);
        let mut buffer = vec![0u8; 16 * 1024];
        let mut key = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut due = first;
        while due < end {
            tokio::time::sleep_until(due.into()).await;
            let now = Instant::now();
            // Timers tick in milliseconds: a request sent up to 2 ms after it
            // was due is timed from its send; a later one (held up by a slow
            // response) from when it was due.
            let from = if now > due + Duration::from_millis(2) {
                due
            } else {
                now
            };
            key = key
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let request = format!(
                "GET /bench HTTP/1.1\r\nHost: bench\r\nX-Key: {}\r\n\r\n",
                (key >> 33) % 100_000
            );
            if stream.write_all(request.as_bytes()).await.is_err()
                || !read_response(&mut stream, &mut buffer).await
            {
                break;
            }
            latencies.push(from.elapsed().as_micros() as u64);
            due += interval;
        }
        latencies
    }

    /// Reads one response with a Content-Length body; false on error.
    async fn read_response(stream: &mut TcpStream, buffer: &mut [u8]) -> bool {
        let mut filled = 0;
        loop {
            let Ok(n) = stream.read(&mut buffer[filled..]).await else {
                return false;
            };
            if n == 0 {
                return false;
            }
            filled += n;
            let Some(head_end) = find(&buffer[..filled], b"\r\n\r\n") else {
                if filled == buffer.len() {
                    return false;
                }
                continue;
            };
            let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let total = (head_end + 4 + length).min(buffer.len());
            while filled < total {
                let Ok(n) = stream.read(&mut buffer[filled..total]).await else {
                    return false;
                };
                if n == 0 {
                    return false;
                }
                filled += n;
            }
            return true;
        }
    }

    fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        haystack.windows(needle.len()).position(|w| w == needle)
    }
}
