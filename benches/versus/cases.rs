//! The servers under test: sluice in its configurations (and, with
//! `--before`, an earlier build of it), nginx `limit_req`, nginx + Lua +
//! Redis, and the upstream alone; all started for a run and stopped after.

use crate::common::{free_port, RedisCluster, RedisServer, Sluice};
use crate::process::{redis_script_calls, run_nginx, wait_for_port, Daemon};
use crate::{LIMIT, NGINX_MODULES, WINDOW_US};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

/// One server under test.
pub struct Case {
    pub name: &'static str,
    pub addr: SocketAddr,
    /// The process whose CPU time is the server's (nginx: its worker).
    pub pid: u32,
    /// Whether it limits (a no-limit case runs only the `allowed` scenario).
    pub limits: bool,
    /// Whether it calls Redis per request.
    pub redis: bool,
    /// Whether its Redis is the cluster (else the single server).
    pub cluster: bool,
}

pub const NGINX_LIMIT_REQ: &str = "nginx limit_req";
pub const NGINX_LUA: &str = "nginx + Lua + Redis (seed's script)";
pub const NGINX_LUA_SLUICE: &str = "nginx + Lua + Redis (sluice's decide script)";
pub const SLUICE_NOLIMIT: &str = "sluice, no limit";
pub const SLUICE_FORWARDING: &str = "sluice, no limit, rewrite + 2 header edits";
pub const SLUICE_LOG: &str = "sluice + Redis, sliding_log";
pub const SLUICE_WINDOW: &str = "sluice + Redis, sliding_window";
pub const SLUICE_LOCAL: &str = "sluice, backend: local";
pub const SLUICE_STEALING: &str = "sluice, no limit, work stealing";
pub const SLUICE_NOLIMIT_2T: &str = "sluice, no limit, 2 threads";
pub const SLUICE_LOG_2T: &str = "sluice + Redis, sliding_log, 2 threads";
pub const SLUICE_TRACED: &str = "sluice + Redis, sliding_log, tracing 1 %";
pub const SLUICE_AUTH: &str = "sluice + Redis, sliding_log, user from an auth service";
pub const SLUICE_CLUSTER: &str = "sluice + Redis Cluster (3 primaries), sliding_log";
pub const BARE: &str = "bare Pingora proxy";
pub const BARE_STEALING: &str = "bare Pingora proxy, work stealing";
pub const BARE_2T: &str = "bare Pingora proxy, 2 threads";
pub const BEFORE_NOLIMIT: &str = "sluice before, no limit";
pub const BEFORE_LOG: &str = "sluice before + Redis, sliding_log";
pub const UPSTREAM_ALONE: &str = "upstream alone (no proxy)";
pub use crate::options::SCENARIOS;

/// Everything started for the run; dropped (killed) at the end.
pub struct Bench {
    pub redis: RedisServer,
    pub cluster: RedisCluster,
    _upstream: Daemon,
    pub upstream_addr: SocketAddr,
    pub upstream_case: Case,
    _sluices: Vec<Sluice>,
    _nginx: Vec<Daemon>,
    _bare: Vec<Daemon>,
    pub cases: Vec<Case>,
    _dir: tempfile::TempDir,
}

pub fn start_all(before: Option<&Path>) -> Bench {
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = RedisServer::start();
    let cluster = RedisCluster::start(3);
    let load = |script: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query(&mut redis.connection())
            .expect("SCRIPT LOAD")
    };
    let decide_sha = load(sluice::limiter::redis::wire::DECIDE_SCRIPT);
    let seed_sha = load(include_str!("seed_limit.lua"));
    let (upstream, upstream_port) = crate::upstream::spawn(dir.path());

    let mut cases = Vec::new();
    let mut sluices = Vec::new();
    for (name, run) in sluice_runs(before) {
        let sluice = run.start(dir.path(), &redis, &cluster, upstream_port);
        let limited = run.limit.is_some();
        cases.push(Case {
            name,
            addr: sluice.addr,
            pid: sluice.pid(),
            limits: limited,
            redis: limited && run.backend == "redis",
            cluster: run.cluster,
        });
        sluices.push(sluice);
    }
    let mut bare = Vec::new();
    for (name, threads, work_stealing) in [
        (BARE, 1, false),
        (BARE_STEALING, 1, true),
        (BARE_2T, 2, false),
    ] {
        let port = free_port();
        let args = format!("127.0.0.1:{port},127.0.0.1:{upstream_port},{threads},{work_stealing}");
        let daemon = Daemon::spawn(
            &format!("bare-{port}"),
            Command::new(std::env::current_exe().expect("current exe")).args(["--bare", &args]),
            dir.path(),
        );
        wait_for_port(port);
        cases.push(Case {
            name,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            pid: daemon.child.id(),
            limits: false,
            redis: false,
            cluster: false,
        });
        bare.push(daemon);
    }

    let mut nginx = Vec::new();
    for (name, lua) in [
        (NGINX_LIMIT_REQ, None),
        (NGINX_LUA, Some(Lua::Seed(&seed_sha))),
        (NGINX_LUA_SLUICE, Some(Lua::Sluice(&decide_sha))),
    ] {
        let (daemon, addr, worker) = start_nginx(dir.path(), lua, upstream_port, redis.port);
        cases.push(Case {
            name,
            addr,
            pid: worker,
            limits: true,
            redis: lua.is_some(),
            cluster: false,
        });
        nginx.push(daemon);
    }
    let upstream_pid = upstream.child.id();
    Bench {
        redis,
        cluster,
        _upstream: upstream,
        upstream_addr: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
        upstream_case: Case {
            name: UPSTREAM_ALONE,
            addr: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            pid: upstream_pid,
            limits: false,
            redis: false,
            cluster: false,
        },
        _sluices: sluices,
        _nginx: nginx,
        _bare: bare,
        cases,
        _dir: dir,
    }
}

impl Bench {
    /// The Redis processes `case` calls (the single server for a case that
    /// calls none: its figure is then Redis idling).
    pub fn redis_pids(&self, case: &Case) -> Vec<u32> {
        if case.cluster {
            self.cluster.pids()
        } else {
            vec![self.redis.pid()]
        }
    }

    /// Decide calls served so far by the Redis `case` calls.
    pub fn redis_calls(&self, case: &Case) -> u64 {
        if case.cluster {
            self.cluster
                .ports
                .iter()
                .flat_map(|&port| {
                    ["evalsha", "eval", "fcall"].map(|c| self.cluster.command_calls(port, c))
                })
                .sum()
        } else {
            redis_script_calls(&self.redis)
        }
    }

    /// The pinned topology (`--pin`): every server under test on core 0;
    /// Redis, the cluster, the upstream and this process (so wrk and the
    /// paced client, started from it) on core 1.
    pub fn pin_topology(&self) {
        use crate::process::pin;
        let mut pinned = self.cases.iter().all(|case| pin(case.pid, "0"));
        let others = self.cluster.pids().into_iter().chain([
            self.redis.pid(),
            self.upstream_case.pid,
            std::process::id(),
        ]);
        for pid in others {
            pinned &= pin(pid, "1");
        }
        assert!(
            pinned,
            "--pin: taskset failed (is util-linux installed? are there 2 cores?)"
        );
    }

    /// Empties every Redis.
    pub fn flush_redis(&self) {
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut self.redis.connection())
            .expect("FLUSHALL");
        self.cluster.flush_all();
    }

    /// The cases of the fixed-rate pass: every server, then the upstream
    /// alone (the floor: what the machine and the client add by themselves).
    /// The runtime and scaling variants are left out: they answer a
    /// throughput question.
    pub fn paced_cases(&self) -> impl Iterator<Item = &Case> {
        const VARIANTS: [&str; 6] = [
            SLUICE_TRACED,
            BARE_STEALING,
            BARE_2T,
            SLUICE_STEALING,
            SLUICE_NOLIMIT_2T,
            SLUICE_LOG_2T,
        ];
        self.cases
            .iter()
            .filter(|c| !VARIANTS.contains(&c.name))
            .chain(std::iter::once(&self.upstream_case))
    }
}

/// One sluice configuration to start.
struct SluiceRun<'a> {
    backend: &'static str,
    /// Its Redis key prefix (and run directory's name).
    prefix: &'static str,
    /// The algorithm of its one limit (1,000 a minute per `X-Key`), if any.
    limit: Option<&'static str>,
    threads: usize,
    work_stealing: bool,
    /// Whether it uses the Redis Cluster instead of the single server.
    cluster: bool,
    /// Whether its route rewrites the path and edits a request and a
    /// response header (what fronting an existing API costs).
    forwarding: bool,
    /// Whether it traces 1 % of requests (and denials, at most 100 a second)
    /// to the run's OTLP sink.
    tracing: bool,
    /// Whether its limit keys on the user an auth service names
    /// (`identity.auth_request`, the upstream's `/__auth`, no cache).
    auth: bool,
    binary: &'a Path,
}

/// Every sluice case: the main four, the runtime and scaling variants, and
/// the `--before` build's two.
fn sluice_runs(before: Option<&Path>) -> Vec<(&'static str, SluiceRun<'_>)> {
    let current = Path::new(env!("CARGO_BIN_EXE_sluice"));
    let run = |backend, prefix, limit, threads, work_stealing, binary| SluiceRun {
        backend,
        prefix,
        limit,
        threads,
        work_stealing,
        cluster: false,
        forwarding: false,
        tracing: false,
        auth: false,
        binary,
    };
    let log = Some("sliding_log");
    let mut runs = vec![
        (
            SLUICE_NOLIMIT,
            run("redis", "nolimit:", None, 1, false, current),
        ),
        (
            SLUICE_FORWARDING,
            SluiceRun {
                forwarding: true,
                ..run("redis", "forwarding:", None, 1, false, current)
            },
        ),
        (SLUICE_LOG, run("redis", "log:", log, 1, false, current)),
        (
            SLUICE_WINDOW,
            run(
                "redis",
                "window:",
                Some("sliding_window"),
                1,
                false,
                current,
            ),
        ),
        (SLUICE_LOCAL, run("local", "local:", log, 1, false, current)),
        (
            SLUICE_TRACED,
            SluiceRun {
                tracing: true,
                ..run("redis", "traced:", log, 1, false, current)
            },
        ),
        (
            SLUICE_AUTH,
            SluiceRun {
                auth: true,
                ..run("redis", "auth:", log, 1, false, current)
            },
        ),
        (
            SLUICE_STEALING,
            run("redis", "stealing:", None, 1, true, current),
        ),
        (
            SLUICE_NOLIMIT_2T,
            run("redis", "nolimit2:", None, 2, false, current),
        ),
        (SLUICE_LOG_2T, run("redis", "log2:", log, 2, false, current)),
        (
            SLUICE_CLUSTER,
            SluiceRun {
                cluster: true,
                ..run("redis", "cluster:", log, 1, false, current)
            },
        ),
    ];
    if let Some(before) = before {
        runs.push((
            BEFORE_NOLIMIT,
            run("redis", "before-nolimit:", None, 1, true, before),
        ));
        runs.push((
            BEFORE_LOG,
            run("redis", "before-log:", log, 1, true, before),
        ));
    }
    runs
}

impl SluiceRun<'_> {
    /// One worker thread unless said otherwise, as nginx has one worker; no
    /// access log (nginx's is off too); a Redis failure denies, so it cannot
    /// pass for speed. The earlier build knows no `work_stealing` key (it
    /// always stole work), so the key is written only when it is off.
    fn start(
        &self,
        dir: &Path,
        redis: &RedisServer,
        cluster: &RedisCluster,
        upstream_port: u16,
    ) -> Sluice {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let run_dir = dir.join(self.prefix.trim_end_matches(':'));
        std::fs::create_dir_all(&run_dir).expect("mkdir");
        let config = format!(
            "server:\n  listen: [\"{addr}\"]\n  admin: \"{admin}\"\n  threads: {threads}\n{stealing}  grace_period: 1s\n  access_log: off\n  pid_file: {pid}\n  upgrade_sock: {sock}\n\
             limiter:\n  backend: {backend}\n  redis: {{ {server}, timeout: 50ms, key_prefix: \"{prefix}\" }}\n  on_error: deny\n\
             upstreams:\n  api: {{ servers: [\"127.0.0.1:{upstream_port}\"] }}\n\
             {identity}routes:\n  - name: bench\n    upstream: api\n{forwarding}{limits}{tracing}",
            identity = if self.auth {
                format!(
                    "identity:\n  auth_request: {{ url: \"http://127.0.0.1:{upstream_port}/__auth\", headers: [x-key], required: true }}\n"
                )
            } else {
                String::new()
            },
            pid = run_dir.join("pid").display(),
            sock = run_dir.join("sock").display(),
            server = if self.cluster {
                format!("cluster: {}", cluster.urls_yaml())
            } else {
                format!("url: \"{}\"", redis.url())
            },
            backend = self.backend,
            forwarding = if self.forwarding { FORWARDING } else { "" },
            tracing = if self.tracing {
                format!("tracing:\n  otlp_endpoint: http://{}\n  sample_ratio: 0.01\n", otlp_sink())
            } else {
                String::new()
            },
            prefix = self.prefix,
            threads = self.threads,
            stealing = if self.work_stealing { "" } else { "  work_stealing: false\n" },
            limits = match self.limit {
                Some(algorithm) => format!(
                    "    limits:\n      - {{ name: per-key, key: [{key}], limit: {LIMIT}, window: 1m, algorithm: {algorithm} }}\n",
                    key = if self.auth { "user" } else { "{header: X-Key}" },
                ),
                None => "    limits: []\n".to_string(),
            },
        );
        Sluice::start_binary(self.binary, &config, addr, admin, &[("RUST_LOG", "warn")])
    }
}

/// The run's OTLP collector: a thread of this process answering every
/// post `200` without decoding it (what a collector costs is not sluice's);
/// started once.
pub fn otlp_sink() -> SocketAddr {
    static SINK: std::sync::OnceLock<SocketAddr> = std::sync::OnceLock::new();
    *SINK.get_or_init(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the OTLP sink");
        let addr = listener.local_addr().expect("sink address");
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || answer_posts(stream));
            }
        });
        addr
    })
}

/// Reads each request on `stream` (head and `Content-Length` body) and
/// answers it `200` with an empty body, until the peer closes.
fn answer_posts(stream: std::net::TcpStream) {
    use std::io::{BufReader, Read, Write};
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    while let Some((_, length)) = crate::common::read_head(&mut reader) {
        let mut body = vec![0; length];
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        if reader.read_exact(&mut body).is_err() || writer.write_all(answer).is_err() {
            return;
        }
    }
}

/// The forwarding case's route: every path rewritten under `/v1`, the
/// client IP set on the request and a header set on the response (the
/// request ID, on in every case, is the third).
const FORWARDING: &str = "    match: { path_prefix: / }\n    rewrite: { prefix: /v1/ }\n    request_headers: { set: { x-client-ip: \"{client_ip}\" } }\n    response_headers: { set: { x-frame-options: DENY } }\n";

/// The script nginx + Lua calls on Redis, by its SHA1.
#[derive(Clone, Copy)]
pub enum Lua<'a> {
    /// The seed's sliding-window script (what users of Kong's and APISIX's
    /// Redis limits run).
    Seed(&'a str),
    /// sluice's own decide script, `sliding_log`.
    Sluice(&'a str),
}

/// Starts nginx (master + one worker), with `limit_req`, or calling `lua`
/// on Redis; returns it, its address and the worker's pid.
pub fn start_nginx(
    dir: &Path,
    lua: Option<Lua<'_>>,
    upstream_port: u16,
    redis_port: u16,
) -> (Daemon, SocketAddr, u32) {
    let name = match lua {
        None => "nginx",
        Some(Lua::Seed(_)) => "nginx-lua-seed",
        Some(Lua::Sluice(_)) => "nginx-lua",
    };
    let prefix = dir.join(name);
    std::fs::create_dir_all(prefix.join("logs")).expect("mkdir");
    let port = free_port();
    let lua_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/versus");
    let (modules, http, access) = if let Some(lua) = lua {
        let (sha, seed) = match lua {
            Lua::Seed(sha) => (sha, true),
            Lua::Sluice(sha) => (sha, false),
        };
        (
            format!(
                "load_module {NGINX_MODULES}/ndk_http_module.so;\nload_module {NGINX_MODULES}/ngx_http_lua_module.so;\n"
            ),
            format!(
                "lua_package_path \"{}/?.lua;;\";\n  init_by_lua_block {{\n    redis_limit = require \"redis_limit\"\n    redis_limit.configure {{ port = {redis_port}, sha = \"{sha}\", seed = {seed}, prefix = \"{name}:\", limit = \"{LIMIT}\", window_us = {WINDOW_US}, timeout_ms = 50 }}\n  }}\n",
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
    let (daemon, worker) = run_nginx(name, &prefix, &config, &[port], dir);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    (daemon, addr, worker)
}

// --------------------------------------------------------------- the rounds
