//! What tracing costs a request, counted in instructions (`--parts
//! tracing`): a figure the shared machine's noise cannot move.
//!
//! CPU time per request on a shared 2-core VM wanders by more than the 3 %
//! tracing may cost; the instructions a request executes do not. sluice +
//! Redis `sliding_log` (one worker thread) runs under `valgrind
//! --tool=callgrind` in four configurations: tracing off; on and exporting
//! nothing (`sample_ratio: 0`, denials not traced: what every request pays,
//! its trace context and the `traceparent` sent upstream); on and exporting
//! every request (`sample_ratio: 1`: what an exported request adds, the
//! export thread's work included); and the shipped settings, 1 % with
//! denials always traced (at most 100 a second). wrk drives `allowed` and
//! `flood` against each; Callgrind's counters are zeroed after a warm-up,
//! dumped after the run and divided by the requests wrk completed. Every
//! thread of the process is counted; the kernel is not, so a request's
//! socket work is missing from the denominator and the ratios overstate
//! tracing's share of a request's CPU.
//!
//! Under Callgrind sluice runs some fifty times slower, so the 100 traced
//! denials a second are a far larger share of a flood than at full speed:
//! the shipped settings are also estimated at the rate the same
//! configuration reaches natively in the same run (exported share = 1 % +
//! 100/s ÷ rate, the rest at the not-exported cost), and the increase in
//! instructions is weighted by the share of that native run's CPU time
//! spent in user space, for tracing's share of the CPU per request.

use crate::common::{free_port, RedisServer, Sluice};
use crate::load::run_wrk;
use crate::options::Options;
use crate::process::{command_line, cpu_model, user_and_system_ticks};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Keep-alive connections of wrk against a sluice under Callgrind.
pub const CONNECTIONS: usize = 4;
/// Traced denials a second beyond the sampled ones (the gateway's cap).
const DENIED_TRACED_PER_SECOND: f64 = 100.0;

/// One configuration of tracing: `(sample_ratio, always_sample_denied)`,
/// or off.
struct Variant {
    name: &'static str,
    tracing: Option<(&'static str, bool)>,
}

const VARIANTS: [Variant; 4] = [
    Variant {
        name: "off",
        tracing: None,
    },
    Variant {
        name: "on, nothing exported",
        tracing: Some(("0", false)),
    },
    Variant {
        name: "on, every request exported",
        tracing: Some(("1.0", false)),
    },
    Variant {
        name: "on, 1 %, denials always",
        tracing: Some(("0.01", true)),
    },
];

/// Instructions per request of one variant in one scenario.
struct Counted {
    per_request: f64,
    requests: u64,
}

/// What an instruction-counting part runs against: a Redis, the upstream,
/// a directory for configs and dumps, and wrk's script.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub redis: RedisServer,
    _upstream: crate::process::Daemon,
    pub upstream_port: u16,
    pub script: PathBuf,
}

impl Rig {
    /// Checks that valgrind is there, and starts Redis and the upstream.
    pub fn start() -> Self {
        let valgrind = Command::new("valgrind").arg("--version").output();
        assert!(
            valgrind.is_ok_and(|o| o.status.success()),
            "`valgrind` is not installed: apt-get install valgrind"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let redis = RedisServer::start();
        let (upstream, upstream_port) = crate::upstream::spawn(dir.path());
        Rig {
            dir,
            redis,
            _upstream: upstream,
            upstream_port,
            script: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/versus/wrk.lua"),
        }
    }
}

pub fn run(options: &Options) -> String {
    let rig = Rig::start();
    let (dir, redis, upstream_port, script) =
        (&rig.dir, &rig.redis, rig.upstream_port, &rig.script);
    let sink = crate::cases::otlp_sink();
    let scenarios: Vec<&str> = ["allowed", "flood"]
        .into_iter()
        .filter(|s| options.scenarios.iter().any(|o| o == s))
        .collect();
    let mut counted: Vec<Vec<Counted>> = Vec::new();
    for (index, variant) in VARIANTS.iter().enumerate() {
        let config = Setup {
            tracing: variant.tracing.map(|(ratio, denied)| (sink, ratio, denied)),
            ..Setup::redis_log(format!("v{index}:"), redis, upstream_port)
        };
        let out = dir.path().join(format!("callgrind-{index}"));
        let sluice = config.start(&callgrind_wrapper(dir.path(), &out, sluice_binary()));
        let mut row = Vec::new();
        for &scenario in &scenarios {
            let url = format!("http://{}/bench", sluice.addr);
            warm_up(&url, script, scenario, || denies(&sluice));
            control(sluice.pid(), "--zero");
            let run = run_wrk(&url, script, scenario, options.seconds, CONNECTIONS);
            let instructions = dump(sluice.pid(), &out);
            let requests = run.requests.max(1);
            eprintln!(
                "tracing {:28} {scenario:8} {:>10.0} instructions/request over {requests} requests",
                variant.name,
                instructions as f64 / requests as f64
            );
            row.push(Counted {
                per_request: instructions as f64 / requests as f64,
                requests,
            });
        }
        counted.push(row);
    }
    let native = native_figures(redis, upstream_port, sink, script, &scenarios, options);
    table(options, &scenarios, &counted, &native)
}

/// What the shipped settings do at full speed, per scenario.
struct Native {
    /// Requests a second.
    rate: f64,
    /// The share of sluice's CPU time spent in user space (where tracing
    /// works; the kernel's socket work is the rest).
    user_share: f64,
}

/// Runs sluice natively (not under Callgrind) with tracing at 1 % and
/// denials always traced, for each scenario's rate and user/system split.
fn native_figures(
    redis: &RedisServer,
    upstream_port: u16,
    sink: SocketAddr,
    script: &Path,
    scenarios: &[&str],
    options: &Options,
) -> Vec<Native> {
    let sluice = Setup {
        tracing: VARIANTS[3]
            .tracing
            .map(|(ratio, denied)| (sink, ratio, denied)),
        ..Setup::redis_log("native:".into(), redis, upstream_port)
    }
    .start(sluice_binary());
    let url = format!("http://{}/bench", sluice.addr);
    scenarios
        .iter()
        .map(|scenario| {
            warm_up(&url, script, scenario, || denies(&sluice));
            let (user, system) = user_and_system_ticks(sluice.pid());
            let run = run_wrk(&url, script, scenario, options.seconds, 32);
            let (user_after, system_after) = user_and_system_ticks(sluice.pid());
            let (user, system) = (user_after - user, system_after - system);
            Native {
                rate: run.requests as f64 / (run.duration_us as f64 / 1e6),
                user_share: user as f64 / (user + system).max(1) as f64,
            }
        })
        .collect()
}

/// The sluice binary under test.
pub fn sluice_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_sluice"))
}

/// A sluice configuration of the instruction-counting parts: one worker
/// thread, one route `/bench`, and at most one limit of 1,000 a minute per
/// `X-Key`, `sliding_log`.
pub struct Setup<'a> {
    pub prefix: String,
    pub redis: &'a RedisServer,
    pub upstream_port: u16,
    /// `redis` or `local`.
    pub backend: &'static str,
    /// Whether the route has its limit.
    pub limited: bool,
    /// The OTLP sink, `sample_ratio` and `always_sample_denied`, if traced.
    pub tracing: Option<(SocketAddr, &'static str, bool)>,
}

impl<'a> Setup<'a> {
    /// sluice + Redis `sliding_log`, not traced.
    pub fn redis_log(prefix: String, redis: &'a RedisServer, upstream_port: u16) -> Self {
        Self {
            prefix,
            redis,
            upstream_port,
            backend: "redis",
            limited: true,
            tracing: None,
        }
    }

    /// Starts `binary` (sluice, or a wrapper that runs it) with this setup.
    pub fn start(&self, binary: &Path) -> Sluice {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let tracing = match self.tracing {
            Some((sink, ratio, denied)) => format!(
                "tracing:\n  otlp_endpoint: http://{sink}\n  sample_ratio: {ratio}\n  always_sample_denied: {denied}\n",
            ),
            None => String::new(),
        };
        let limits = if self.limited {
            format!(
                "    limits:\n      - {{ name: per-key, key: [{{header: X-Key}}], limit: {}, window: 1m, algorithm: sliding_log }}\n",
                crate::LIMIT
            )
        } else {
            String::new()
        };
        let config = format!(
            "server:\n  listen: [\"{addr}\"]\n  admin: \"{admin}\"\n  threads: 1\n  work_stealing: false\n  grace_period: 1s\n  access_log: off\n\
             limiter:\n  backend: {backend}\n  redis: {{ url: \"{redis}\", timeout: 2s, key_prefix: \"{prefix}\" }}\n  on_error: deny\n\
             upstreams:\n  api: {{ servers: [\"127.0.0.1:{port}\"] }}\n\
             routes:\n  - name: bench\n    upstream: api\n{limits}{tracing}",
            backend = self.backend,
            redis = self.redis.url(),
            prefix = self.prefix,
            port = self.upstream_port,
        );
        Sluice::start_binary(binary, &config, addr, admin, &[("RUST_LOG", "warn")])
    }
}

/// Whether `sluice` denies the flood's key now.
pub fn denies(sluice: &Sluice) -> bool {
    sluice.get("/bench", &[("X-Key", "flood")]).status == 429
}

/// A script that runs `binary` under Callgrind, writing its dumps to `out`
/// (`out.1`, `out.2`, … one per `--dump`).
pub fn callgrind_wrapper(dir: &Path, out: &Path, binary: &Path) -> PathBuf {
    let path = dir.join(format!(
        "{}.sh",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("sluice")
    ));
    let script = format!(
        "#!/bin/sh\nexec valgrind --tool=callgrind --quiet --callgrind-out-file={out} -- {binary} \"$@\"\n",
        out = out.display(),
        binary = binary.display(),
    );
    std::fs::write(&path, script).expect("write the Callgrind wrapper");
    let chmod = Command::new("chmod").arg("+x").arg(&path).status();
    assert!(chmod.is_ok_and(|s| s.success()), "chmod the wrapper");
    path
}

/// Brings `scenario` to its steady state: connections, Redis's script and
/// keys warm; under `flood`, the key's window filled so that every
/// measured request is denied (`denies` says when).
pub fn warm_up(url: &str, script: &Path, scenario: &str, denies: impl Fn() -> bool) {
    for _ in 0..20 {
        run_wrk(url, script, scenario, 2, CONNECTIONS);
        if scenario != "flood" || denies() {
            return;
        }
    }
    panic!("the flood key was not denied after 40 s of flooding");
}

/// Runs `callgrind_control ACTION PID`.
pub fn control(pid: u32, action: &str) {
    let status = Command::new("callgrind_control")
        .args([action, &pid.to_string()])
        .output()
        .expect("run callgrind_control");
    assert!(
        status.status.success(),
        "callgrind_control {action} {pid}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// Dumps the counters of `pid` and returns the instructions since they
/// were zeroed (the `totals:` line of the newest dump of `out`).
pub fn dump(pid: u32, out: &Path) -> u64 {
    let newest = dump_file(pid, out);
    let text = std::fs::read_to_string(newest).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("a totals line")
}

/// Dumps the counters of `pid`; returns the dump's file, once complete.
pub fn dump_file(pid: u32, out: &Path) -> PathBuf {
    let before = dumps(out).len();
    control(pid, "--dump");
    crate::common::wait_until(Duration::from_secs(60), "the Callgrind dump", || {
        dumps(out).len() > before
    });
    let newest = dumps(out)
        .into_iter()
        .max_by_key(|(n, _)| *n)
        .expect("a dump");
    // Callgrind writes the file in pieces: read until its last line,
    // `totals:`, is there.
    crate::common::wait_until(Duration::from_secs(60), "the dump's totals", || {
        let text = std::fs::read_to_string(&newest.1).unwrap_or_default();
        text.lines().any(|l| l.starts_with("totals:"))
    });
    newest.1
}

/// The dumps written so far: `(sequence number, path)`.
fn dumps(out: &Path) -> Vec<(u64, PathBuf)> {
    let (Some(dir), Some(stem)) = (out.parent(), out.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let rest = name.strip_prefix(stem)?.strip_prefix('.')?;
            let number = rest.split(['.', '-']).next_back()?.parse().ok()?;
            Some((number, entry.path()))
        })
        .collect()
}

fn table(
    options: &Options,
    scenarios: &[&str],
    counted: &[Vec<Counted>],
    native: &[Native],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**Tracing's cost in instructions**: `cargo bench --bench versus -- --parts tracing --seconds {seconds}` on {date}: {cpu}, {valgrind} (Callgrind).\n\n\
         Instructions per request of sluice + Redis `sliding_log` (one worker thread; every thread of the process counted, the kernel not), \
         wrk with {CONNECTIONS} connections for {seconds} s per cell after a warm-up; in brackets, the ratio to tracing off. \
         The last two columns are for the shipped settings at full speed: the share of requests exported there (1 %, plus up to 100 denials a second \
         at the rate sluice reached natively in the same run), the instructions that gives (not exported at the cost of the second column, exported at the third's), \
         and that increase weighted by the user-space share of sluice's CPU time in the native run: tracing's share of the CPU per request.\n",
        seconds = options.seconds,
        date = command_line("date", &["+%Y-%m-%d"]),
        cpu = cpu_model(),
        valgrind = command_line("valgrind", &["--version"]),
    );
    let _ = writeln!(
        out,
        "| scenario | off | on, nothing exported | on, every request exported | 1 %, denials always (as run under Callgrind) | 1 %, denials always, at full speed | ≈ CPU per request (≤ 1.03×) |\n|---|---|---|---|---|---|---|"
    );
    for (column, scenario) in scenarios.iter().enumerate() {
        let at = |variant: usize| counted[variant][column].per_request;
        let ratio = |x: f64| format!("{x:.0} ({:.3}×)", x / at(0));
        let native = &native[column];
        let denied_share = match *scenario {
            "flood" => 0.99 * (DENIED_TRACED_PER_SECOND / native.rate).min(1.0),
            _ => 0.0,
        };
        let exported_share = 0.01 + denied_share;
        let estimate = at(1) + exported_share * (at(2) - at(1));
        let cpu = 1.0 + (estimate / at(0) - 1.0) * native.user_share;
        let _ = writeln!(
            out,
            "| {scenario} ({} requests) | {:.0} | {} | {} | {} | {} ({:.2} % exported at {:.0} req/s) | {cpu:.3}× ({:.0} % of its CPU in user space) |",
            counted[0][column].requests,
            at(0),
            ratio(at(1)),
            ratio(at(2)),
            ratio(at(3)),
            ratio(estimate),
            exported_share * 100.0,
            native.rate,
            native.user_share * 100.0,
        );
    }
    out
}
