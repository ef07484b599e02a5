//! TLS and HTTP/2 at the edge: sluice against nginx with the same
//! certificate, one worker each, both limiting (sluice: `sliding_log` on
//! Redis; nginx: `limit_req`), 1,000 a minute per `?k=` key, over every
//! way a client arrives:
//!
//! - HTTP/1.1, plain and over TLS, 32 keep-alive connections;
//! - HTTP/2 over TLS with 32 connections of one stream, and with 4
//!   connections of 8 streams (the same 32 requests in flight);
//! - h2c (HTTP/2 with prior knowledge, no TLS), 4 connections × 8 streams;
//! - a new connection for every request, plain and TLS: wrk sends
//!   `Connection: close` and never resumes a session, so every TLS request
//!   pays a full handshake.
//!
//! h2load (nghttp2) drives the keep-alive rows, cycling through 20,000 keys
//! in a shuffled order; wrk drives the new-connection rows. The servers'
//! CPU time per request (from `/proc`) gives what TLS itself costs each:
//! the TLS row minus the plain row of the same server, per request and per
//! handshake. sluice terminates TLS with rustls, nginx with OpenSSL, so
//! the difference is the price of each library inside a real server.

use crate::common::{free_port, make_ca, make_cert, RedisServer, Sluice};
use crate::load::{run_wrk, WrkRun};
use crate::options::Options;
use crate::process::{
    clock_ticks_per_second, command_line, cpu_model, cpu_ticks, run_nginx, wait_for_port, Daemon,
};
use crate::report::{median, range};
use crate::upstream;
use crate::LIMIT;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Distinct `?k=` keys the h2load clients cycle through.
const KEYS: u64 = 20_000;

/// How a row's client reaches the server.
#[derive(Clone, Copy, PartialEq)]
enum Wire {
    /// HTTP/1.1 on keep-alive connections.
    Http1,
    /// HTTP/2 (ALPN `h2` over TLS, prior knowledge without).
    Http2 { connections: usize, streams: usize },
    /// One request per connection (HTTP/1.1, `Connection: close`).
    Fresh,
}

/// One row of the table: a protocol and whether it runs over TLS.
struct Row {
    name: &'static str,
    wire: Wire,
    tls: bool,
}

const HTTP1: &str = "HTTP/1.1, 32 connections";
const HTTP1_TLS: &str = "HTTP/1.1 over TLS, 32 connections";
const H2_TLS_32: &str = "HTTP/2 over TLS, 32 connections × 1 stream";
const H2_TLS_4X8: &str = "HTTP/2 over TLS, 4 connections × 8 streams";
const H2C_4X8: &str = "h2c, 4 connections × 8 streams";
const FRESH: &str = "new connection per request, plain";
const FRESH_TLS: &str = "new connection per request, TLS (full handshake)";

const ROWS: [Row; 7] = [
    Row {
        name: HTTP1,
        wire: Wire::Http1,
        tls: false,
    },
    Row {
        name: HTTP1_TLS,
        wire: Wire::Http1,
        tls: true,
    },
    Row {
        name: H2_TLS_32,
        wire: Wire::Http2 {
            connections: 32,
            streams: 1,
        },
        tls: true,
    },
    Row {
        name: H2_TLS_4X8,
        wire: Wire::Http2 {
            connections: 4,
            streams: 8,
        },
        tls: true,
    },
    Row {
        name: H2C_4X8,
        wire: Wire::Http2 {
            connections: 4,
            streams: 8,
        },
        tls: false,
    },
    Row {
        name: FRESH,
        wire: Wire::Fresh,
        tls: false,
    },
    Row {
        name: FRESH_TLS,
        wire: Wire::Fresh,
        tls: true,
    },
];

/// Where one server listens for each kind of client.
struct Target {
    name: &'static str,
    plain: SocketAddr,
    h2c: SocketAddr,
    tls: SocketAddr,
    /// The process whose CPU time is the server's (nginx: its worker).
    pid: u32,
}

const NGINX: &str = "nginx limit_req (OpenSSL)";
const SLUICE_LOCAL: &str = "sluice, backend: local (rustls)";
const SLUICE_REDIS: &str = "sluice + Redis, sliding_log (rustls)";

/// One run of one row against one server.
#[derive(Clone, Copy, Default)]
struct Sample {
    rps: f64,
    mean_ms: f64,
    server_cpu_us: f64,
    redis_cpu_us: f64,
    /// Requests answered with anything but 2xx, or not answered.
    failed: u64,
}

/// Everything started for the edge rounds; stopped when dropped.
struct Servers {
    redis: RedisServer,
    targets: Vec<Target>,
    _sluices: [Sluice; 2],
    _nginx: Daemon,
    _upstream: Daemon,
    dir: tempfile::TempDir,
}

/// Runs the edge rounds and returns their section of the report.
pub fn run(options: &Options) -> String {
    for tool in ["h2load", "wrk", "nginx", "openssl"] {
        assert!(
            !command_line("which", &[tool]).is_empty(),
            "`{tool}` is not installed: apt-get install nghttp2-client wrk nginx openssl"
        );
    }
    let servers = start();
    let mut samples: HashMap<(&str, &str), Vec<Sample>> = HashMap::new();
    let mut negotiated: HashMap<&str, String> = HashMap::new();
    for round in 0..=options.rounds {
        for row in &ROWS {
            for target in &servers.targets {
                // Round 0 warms up: connections, pools, the script cache.
                let seconds = if round == 0 { 1 } else { options.seconds };
                let (sample, tls) = measure(&servers, target, row, seconds);
                if let Some(tls) = tls {
                    negotiated.insert(target.name, tls);
                }
                if round == 0 {
                    continue;
                }
                eprintln!(
                    "edge {round} {:48} {:36} {:>8.0} req/s  mean {:.2} ms  CPU {:.1} µs/req  failed {}",
                    row.name,
                    target.name,
                    sample.rps,
                    sample.mean_ms,
                    sample.server_cpu_us,
                    sample.failed
                );
                samples
                    .entry((row.name, target.name))
                    .or_default()
                    .push(sample);
            }
        }
    }
    report(options, &samples, &negotiated)
}

fn start() -> Servers {
    let dir = tempfile::tempdir().expect("tempdir");
    make_ca(dir.path(), "ca");
    make_cert(dir.path(), "ca", "edge", "DNS:localhost,IP:127.0.0.1");
    let (cert, key) = (dir.path().join("edge.crt"), dir.path().join("edge.key"));
    let redis = RedisServer::start();
    let (upstream, upstream_port) = upstream::spawn(dir.path());
    let (nginx, nginx_target) = start_nginx(dir.path(), upstream_port, &cert, &key);
    let (local_sluice, local_target) = start_sluice(&redis, upstream_port, &cert, &key, "local");
    let (redis_sluice, redis_target) = start_sluice(&redis, upstream_port, &cert, &key, "redis");
    Servers {
        redis,
        targets: vec![nginx_target, local_target, redis_target],
        _sluices: [local_sluice, redis_sluice],
        _nginx: nginx,
        _upstream: upstream,
        dir,
    }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// sluice with one worker thread, no access log, h2c on its plain listener
/// and one TLS listener; limiting on Redis or in process.
fn start_sluice(
    redis: &RedisServer,
    upstream_port: u16,
    cert: &Path,
    key: &Path,
    backend: &str,
) -> (Sluice, Target) {
    let (plain, tls, admin) = (local(free_port()), local(free_port()), local(free_port()));
    let config = format!(
        "server:\n  listen: [\"{plain}\"]\n  admin: \"{admin}\"\n  h2c: true\n  threads: 1\n  work_stealing: false\n  grace_period: 1s\n  access_log: off\n\
         \x20 tls:\n    - listen: \"{tls}\"\n      certs: [{{ cert: \"{cert}\", key: \"{key}\" }}]\n\
         limiter:\n  backend: {backend}\n  redis: {{ url: \"{url}\", timeout: 50ms, key_prefix: \"edge:\" }}\n  on_error: deny\n\
         upstreams:\n  api: {{ servers: [\"127.0.0.1:{upstream_port}\"] }}\n\
         routes:\n  - name: bench\n    upstream: api\n    limits:\n      - {{ name: per-key, key: [{{query: k}}], limit: {LIMIT}, window: 1m, algorithm: sliding_log }}\n",
        cert = cert.display(),
        key = key.display(),
        url = redis.url(),
    );
    let sluice = Sluice::start_with(&config, plain, admin, &[("RUST_LOG", "warn")]);
    wait_for_port(tls.port());
    let target = Target {
        name: if backend == "redis" {
            SLUICE_REDIS
        } else {
            SLUICE_LOCAL
        },
        plain,
        h2c: plain,
        tls,
        pid: sluice.pid(),
    };
    (sluice, target)
}

/// nginx with one worker: a plain HTTP/1.1 port, a TLS port with HTTP/2 by
/// ALPN, and an h2c port (nginx serves prior-knowledge HTTP/2 only on a
/// port of its own). Keep-alive connections are not closed after 1,000
/// requests (sluice does not close them either).
fn start_nginx(dir: &Path, upstream_port: u16, cert: &Path, key: &Path) -> (Daemon, Target) {
    let prefix = dir.join("nginx-edge");
    let (plain, h2c, tls) = (free_port(), free_port(), free_port());
    let config = format!(
        "worker_processes 1;\ndaemon off;\npid {pid};\nerror_log {log} warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 10000000;\n\
         \x20 limit_req_zone $arg_k zone=per_key:64m rate={LIMIT}r/m;\n  limit_req_status 429;\n\
         \x20 upstream api {{ server 127.0.0.1:{upstream_port}; keepalive 128; }}\n\
         \x20 server {{\n    listen 127.0.0.1:{plain};\n    listen 127.0.0.1:{h2c} http2;\n    listen 127.0.0.1:{tls} ssl http2;\n\
         \x20   ssl_certificate {cert};\n    ssl_certificate_key {key};\n    ssl_protocols TLSv1.2 TLSv1.3;\n\
         \x20   location / {{\n      limit_req zone=per_key burst={LIMIT} nodelay;\n      proxy_pass http://api;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n",
        pid = prefix.join("nginx.pid").display(),
        log = prefix.join("logs/error.log").display(),
        cert = cert.display(),
        key = key.display(),
    );
    let (daemon, worker) = run_nginx("nginx-edge", &prefix, &config, &[plain, h2c, tls], dir);
    let target = Target {
        name: NGINX,
        plain: local(plain),
        h2c: local(h2c),
        tls: local(tls),
        pid: worker,
    };
    (daemon, target)
}

/// One run of `row` against `target`, with the CPU both spent meanwhile.
fn measure(
    servers: &Servers,
    target: &Target,
    row: &Row,
    seconds: u64,
) -> (Sample, Option<String>) {
    let cpu_before = cpu_ticks(target.pid);
    let redis_before = cpu_ticks(servers.redis.pid());
    let (scheme, addr) = match (row.tls, row.wire) {
        (true, _) => ("https", target.tls),
        (false, Wire::Http2 { .. }) => ("http", target.h2c),
        (false, _) => ("http", target.plain),
    };
    let run = match row.wire {
        Wire::Fresh => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/versus/wrk.lua");
            let url = format!("{scheme}://{addr}/bench");
            wrk_as_h2load(run_wrk(&url, &script, "fresh", seconds, 32))
        }
        Wire::Http1 => h2load(servers.dir.path(), scheme, addr, &["--h1", "-c32"], seconds),
        Wire::Http2 {
            connections,
            streams,
        } => h2load(
            servers.dir.path(),
            scheme,
            addr,
            &[&format!("-c{connections}"), &format!("-m{streams}")],
            seconds,
        ),
    };
    let cpu = cpu_ticks(target.pid) - cpu_before;
    let redis_cpu = cpu_ticks(servers.redis.pid()) - redis_before;
    let requests = run.requests.max(1) as f64;
    let tick_us = 1e6 / clock_ticks_per_second();
    let sample = Sample {
        rps: run.requests as f64 / run.seconds,
        mean_ms: run.mean_ms,
        server_cpu_us: cpu as f64 * tick_us / requests,
        redis_cpu_us: if target.name == SLUICE_REDIS {
            redis_cpu as f64 * tick_us / requests
        } else {
            0.0
        },
        failed: run.failed,
    };
    (sample, run.tls)
}

/// What one load-client run reports.
struct ClientRun {
    /// What TLS the client negotiated, as h2load prints it (protocol,
    /// cipher, key exchange), when it spoke TLS.
    tls: Option<String>,
    requests: u64,
    seconds: f64,
    mean_ms: f64,
    failed: u64,
}

fn wrk_as_h2load(run: WrkRun) -> ClientRun {
    ClientRun {
        tls: None,
        requests: run.requests,
        seconds: run.duration_us as f64 / 1e6,
        mean_ms: run.mean_us / 1e3,
        failed: run.socket_errors + run.status_errors,
    }
}

/// h2load for `seconds` against `addr`, its clients cycling through the
/// keys file of that address (written once).
fn h2load(dir: &Path, scheme: &str, addr: SocketAddr, args: &[&str], seconds: u64) -> ClientRun {
    let uris = uri_file(dir, scheme, addr);
    let output = Command::new("h2load")
        .args(args)
        .args(["-t1", &format!("-D{seconds}")])
        .arg("-i")
        .arg(&uris)
        .output()
        .expect("run h2load");
    let text = String::from_utf8_lossy(&output.stdout);
    parse_h2load(&text).unwrap_or_else(|| {
        panic!(
            "h2load printed no result:\n{text}{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// The figures of an h2load summary: `finished in 5.00s, 61234.40 req/s`,
/// `requests: … N succeeded, N failed, N errored, N timeout`,
/// `status codes: N 2xx, …` and the mean of `time for request:`.
fn parse_h2load(text: &str) -> Option<ClientRun> {
    let line = |prefix: &str| text.lines().find(|l| l.trim_start().starts_with(prefix));
    let finished = line("finished in ")?;
    let seconds =
        parse_duration_ms(finished.split_whitespace().nth(2)?.trim_end_matches(','))? / 1e3;
    let statuses = line("status codes:")?;
    let count_before = |l: &str, word: &str| -> Option<u64> {
        let words: Vec<&str> = l.split_whitespace().collect();
        let at = words.iter().position(|w| w.trim_end_matches(',') == word)?;
        words.get(at.checked_sub(1)?)?.parse().ok()
    };
    let ok = count_before(statuses, "2xx")?;
    let requests_line = line("requests:")?;
    let done = count_before(requests_line, "done")?;
    let not_ok = count_before(requests_line, "failed")? + count_before(requests_line, "errored")?;
    let request_times = line("time for request:")?;
    // min, max, mean, sd, ±sd
    let mean = request_times
        .trim_start()
        .strip_prefix("time for request:")?
        .split_whitespace()
        .nth(2)?;
    let tls: Vec<&str> = ["TLS Protocol:", "Cipher:", "Server Temp Key:"]
        .iter()
        .filter_map(|name| line(name).map(str::trim))
        .collect();
    Some(ClientRun {
        tls: (!tls.is_empty()).then(|| tls.join(", ")),
        requests: done,
        seconds,
        mean_ms: parse_duration_ms(mean)?,
        failed: not_ok + done.saturating_sub(ok),
    })
}

/// `512us`, `1.23ms`, `5.00s` in milliseconds.
fn parse_duration_ms(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else {
        (text.strip_suffix('s')?, 1e3)
    };
    number.parse::<f64>().ok().map(|v| v * scale)
}

/// The h2load input for `addr`: every key once, in a shuffled order (the
/// same for every server), as whole URIs.
fn uri_file(dir: &Path, scheme: &str, addr: SocketAddr) -> PathBuf {
    let path = dir.join(format!("uris-{scheme}-{}", addr.port()));
    if !path.exists() {
        let mut keys: Vec<u64> = (1..=KEYS).collect();
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in (1..keys.len()).rev() {
            // xorshift64: a fixed shuffle, no dependency.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            keys.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut text = String::with_capacity(keys.len() * 40);
        for key in keys {
            let _ = writeln!(text, "{scheme}://{addr}/bench?k={key}");
        }
        std::fs::write(&path, text).expect("write the h2load URIs");
    }
    path
}

/// The section: every row for both servers with their ratio, then what
/// TLS itself costs each server per request and per handshake.
fn report(
    options: &Options,
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    negotiated: &HashMap<&str, String>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**TLS and HTTP/2**: `cargo bench --bench versus -- --parts edge --rounds {} --seconds {}` on {}: {} ({} cores); {}, {}, {}. \
         sluice and nginx with the same P-256 certificate, one worker each, all limiting 1,000 a minute per `?k=` key \
         (nginx `limit_req`, sluice in process and on Redis). Medians of {} interleaved rounds, min–max in brackets. \
         Failed: answers other than 2xx, or none. CPU: the serving process's CPU time per request, and Redis's for sluice + Redis.\n",
        options.rounds,
        options.seconds,
        command_line("date", &["-u", "+%Y-%m-%d"]),
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        command_line("nginx", &["-v"]).replace("nginx version: ", ""),
        command_line("h2load", &["--version"]),
        command_line("wrk", &["-v"])
            .lines()
            .next()
            .unwrap_or("wrk")
            .split(" [")
            .next()
            .unwrap_or("wrk"),
        options.rounds,
    );
    for target in [NGINX, SLUICE_LOCAL] {
        if let Some(tls) = negotiated.get(target) {
            let _ = writeln!(out, "- {target} negotiated with h2load: {tls}");
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "| client | nginx limit_req req/s | sluice local req/s | local / nginx | sluice + Redis req/s | Redis / nginx | CPU µs/req: nginx · local · Redis (+ Redis server) | mean ms: nginx · local · Redis | failed |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    let get =
        |row: &'static str, target: &'static str| samples.get(&(row, target)).map(Vec::as_slice);
    for row in &ROWS {
        let (Some(nginx), Some(local), Some(redis)) = (
            get(row.name, NGINX),
            get(row.name, SLUICE_LOCAL),
            get(row.name, SLUICE_REDIS),
        ) else {
            continue;
        };
        let rps = |s: &[Sample]| {
            let (lo, hi) = range(s, |x| x.rps);
            format!("{:.0} [{:.0}–{:.0}]", median(s, |x| x.rps), lo, hi)
        };
        let ratio = |s: &[Sample]| median(s, |x| x.rps) / median(nginx, |x| x.rps).max(1.0);
        let cpu = |s: &[Sample]| median(s, |x| x.server_cpu_us);
        let mean = |s: &[Sample]| median(s, |x| x.mean_ms);
        let failed: u64 = [nginx, local, redis]
            .iter()
            .flat_map(|s| s.iter())
            .map(|x| x.failed)
            .sum();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2}× | {} | {:.2}× | {:.1} · {:.1} · {:.1} (+ {:.1}) | {:.2} · {:.2} · {:.2} | {failed} |",
            row.name,
            rps(nginx),
            rps(local),
            ratio(local),
            rps(redis),
            ratio(redis),
            cpu(nginx),
            cpu(local),
            cpu(redis),
            median(redis, |x| x.redis_cpu_us),
            mean(nginx),
            mean(local),
            mean(redis),
        );
    }
    let cpu = |row: &'static str, target: &'static str| {
        get(row, target).map(|s| median(s, |x| x.server_cpu_us))
    };
    let extra = |tls: &'static str, plain: &'static str, target: &'static str| {
        Some(cpu(tls, target)? - cpu(plain, target)?)
    };
    let _ = writeln!(
        out,
        "\nWhat TLS costs each server: its CPU time per request over TLS minus over plain HTTP, same client, same limit in process. \
         The rest of the server's work cancels out, leaving the TLS library's share: rustls in sluice, OpenSSL in nginx. \
         A new connection's figure is the full handshake (no resumption) and its one request's encryption.\n"
    );
    let _ = writeln!(
        out,
        "| TLS cost | nginx (OpenSSL) µs | sluice (rustls) µs | rustls / OpenSSL |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for (what, tls, plain) in [
        ("per request, HTTP/1.1 kept alive", HTTP1_TLS, HTTP1),
        ("per request, HTTP/2, 4 × 8 streams", H2_TLS_4X8, H2C_4X8),
        ("per new connection", FRESH_TLS, FRESH),
    ] {
        if let (Some(n), Some(s)) = (extra(tls, plain, NGINX), extra(tls, plain, SLUICE_LOCAL)) {
            // Below a microsecond the difference is within the rounds' noise.
            let ratio = if n >= 1.0 && s >= 1.0 {
                format!("{:.2}×", s / n)
            } else {
                "— (below 1 µs)".to_string()
            };
            let _ = writeln!(out, "| {what} | {n:.1} | {s:.1} | {ratio} |");
        }
    }
    out.push('\n');
    out
}
