//! The rate-limit service against sluice's own gateway path, in one run:
//! one sluice (one worker thread) serving both, on one Redis, every limit
//! 1,000 a minute per key over 100,000 keys at random (never denied), so
//! every call is a full decision on Redis.
//!
//! - `gateway`: `GET /rl?k=KEY` over h2c to a `respond:` route limited by
//!   `sliding_log` on the `k` query parameter — the gateway's decision with
//!   no upstream behind it;
//! - `rls, sliding_log`: `ShouldRateLimit` with one descriptor `k=KEY`;
//! - `rls, fixed_window`: the same on a `fixed_window` rule, the algorithm
//!   envoyproxy/ratelimit counts with;
//! - `rls, 4 descriptors`: four descriptors a call, all decided at once.
//!
//! One client drives all of them the same way (this process, HTTP/2 with
//! prior knowledge, 4 connections × 8 streams, one thread), in interleaved
//! rounds. Columns: decisions per second (a call of four descriptors is
//! four decisions), and the CPU time per decision of sluice and of Redis
//! (from `/proc`).

use crate::common::{free_port, RedisServer, Sluice};
use crate::options::Options;
use crate::process::{clock_ticks_per_second, command_line, cpu_model, cpu_ticks};
use crate::report::{median, range};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use sluice::rls::proto::{rate_limit_descriptor::Entry, RateLimitDescriptor, RateLimitRequest};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Keys the client picks from at random.
const KEYS: u64 = 100_000;
const CONNECTIONS: usize = 4;
const STREAMS: usize = 8;

/// What one case sends.
#[derive(Clone, Copy, PartialEq)]
enum Call {
    Gateway,
    Rls { key: &'static str, descriptors: u64 },
}

struct Case {
    name: &'static str,
    call: Call,
}

const CASES: [Case; 4] = [
    Case {
        name: "gateway, sliding_log (h2c, respond:)",
        call: Call::Gateway,
    },
    Case {
        name: "rls, sliding_log",
        call: Call::Rls {
            key: "k",
            descriptors: 1,
        },
    },
    Case {
        name: "rls, fixed_window",
        call: Call::Rls {
            key: "f",
            descriptors: 1,
        },
    },
    Case {
        name: "rls, sliding_log, 4 descriptors a call",
        call: Call::Rls {
            key: "k",
            descriptors: 4,
        },
    },
];

/// One timed run of one case.
struct Sample {
    /// Decisions per second.
    rate: f64,
    /// Share of calls answered OK (all, in this benchmark).
    admitted: f64,
    sluice_us: f64,
    redis_us: f64,
}

impl Call {
    fn decisions(self) -> u64 {
        match self {
            Call::Gateway => 1,
            Call::Rls { descriptors, .. } => descriptors,
        }
    }

    fn request(self, addr: SocketAddr, key: u64) -> http::Request<Full<Bytes>> {
        match self {
            Call::Gateway => http::Request::get(format!("http://{addr}/rl?k={key}"))
                .body(Full::new(Bytes::new()))
                .expect("request"),
            Call::Rls {
                key: name,
                descriptors,
            } => {
                let message = RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: (0..descriptors)
                        .map(|i| RateLimitDescriptor {
                            entries: vec![Entry {
                                key: name.into(),
                                value: format!("{}", (key + i * 7919) % KEYS),
                            }],
                            ..RateLimitDescriptor::default()
                        })
                        .collect(),
                    hits_addend: 0,
                };
                let encoded = message.encode_to_vec();
                let mut frame = Vec::with_capacity(5 + encoded.len());
                frame.push(0);
                frame.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
                frame.extend_from_slice(&encoded);
                http::Request::post(format!(
                    "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
                ))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(Full::new(Bytes::from(frame)))
                .expect("request")
            }
        }
    }

    /// Whether the answer admitted the call.
    fn admitted(self, status: http::StatusCode, body: &[u8]) -> bool {
        match self {
            Call::Gateway => status == http::StatusCode::OK,
            Call::Rls { .. } => body
                .get(5..)
                .and_then(|m| sluice::rls::proto::RateLimitResponse::decode(m).ok())
                .is_some_and(|r| r.overall_code == 1),
        }
    }
}

/// Drives `call` at `addr` for `seconds`: (calls answered, calls admitted).
fn drive(addr: SocketAddr, call: Call, seconds: f64) -> (u64, u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let until = Instant::now() + Duration::from_secs_f64(seconds);
        let mut tasks = Vec::new();
        for c in 0..CONNECTIONS {
            let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let _ = tcp.set_nodelay(true);
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                    .await
                    .expect("h2 handshake");
            tokio::spawn(connection);
            for s in 0..STREAMS {
                let mut sender = sender.clone();
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ ((c * STREAMS + s) as u64 + 1);
                tasks.push(tokio::spawn(async move {
                    let (mut done, mut admitted) = (0u64, 0u64);
                    while Instant::now() < until {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let response = sender
                            .send_request(call.request(addr, seed % KEYS))
                            .await
                            .expect("send");
                        let status = response.status();
                        let body = response.into_body().collect().await.expect("body");
                        done += 1;
                        admitted += u64::from(call.admitted(status, &body.to_bytes()));
                    }
                    (done, admitted)
                }));
            }
        }
        let mut total = (0, 0);
        for task in tasks {
            let (done, admitted) = task.await.expect("client task");
            total = (total.0 + done, total.1 + admitted);
        }
        total
    })
}

fn start(redis: &RedisServer) -> (Sluice, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = format!(
        "domain: bench\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n  - key: f\n    algorithm: fixed_window\n    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n",
        limit = crate::LIMIT
    );
    std::fs::write(dir.path().join("bench.yaml"), rules).expect("rules");
    let rls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let config = format!(
        "server:\n  listen: [\"{addr}\"]\n  admin: \"{admin}\"\n  threads: 1\n  h2c: true\n  access_log: off\n  rls:\n    listen: \"{rls}\"\n    config: \"{}\"\nlimiter:\n  redis:\n    url: \"{}\"\n    timeout: 200ms\nroutes:\n  - name: rl\n    match: {{ path: /rl }}\n    respond: {{ status: 200, body: ok }}\n    limits:\n      - {{ name: per-key, key: [{{query: k}}], limit: {}, window: 1m }}\n",
        dir.path().display(),
        redis.url(),
        crate::LIMIT
    );
    let sluice = Sluice::start_with(&config, addr, admin, &[("RUST_LOG", "warn")]);
    crate::process::wait_for_port(rls.port());
    (sluice, rls, dir)
}

/// The section of the report: the table and how it was made.
pub fn run(options: &Options) -> String {
    let redis = RedisServer::start();
    let (sluice, rls, _rules) = start(&redis);
    let ticks = clock_ticks_per_second();
    let seconds = options.seconds as f64;
    let target = |call: Call| {
        if call == Call::Gateway {
            sluice.addr
        } else {
            rls
        }
    };
    for case in &CASES {
        drive(target(case.call), case.call, 1.0);
    }
    let mut samples: Vec<Vec<Sample>> = CASES.iter().map(|_| Vec::new()).collect();
    for round in 1..=options.rounds {
        for (case, samples) in CASES.iter().zip(&mut samples) {
            let before = (cpu_ticks(sluice.pid()), cpu_ticks(redis.pid()));
            let start = Instant::now();
            let (done, admitted) = drive(target(case.call), case.call, seconds);
            let elapsed = start.elapsed().as_secs_f64();
            let after = (cpu_ticks(sluice.pid()), cpu_ticks(redis.pid()));
            let decisions = (done * case.call.decisions()).max(1) as f64;
            let per = |a: u64, b: u64| (a - b) as f64 / ticks * 1e6 / decisions;
            let sample = Sample {
                rate: decisions / elapsed,
                admitted: admitted as f64 / done.max(1) as f64,
                sluice_us: per(after.0, before.0),
                redis_us: per(after.1, before.1),
            };
            eprintln!(
                "rls round {round} {:40} {:>8.0} decisions/s  sluice {:.1} µs  redis {:.1} µs",
                case.name, sample.rate, sample.sluice_us, sample.redis_us
            );
            samples.push(sample);
        }
    }
    table(options, &samples)
}

fn table(options: &Options, samples: &[Vec<Sample>]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**Rate-limit service**: `cargo bench --bench versus -- --parts rls --rounds {rounds} --seconds {seconds}` on {date}.\n\n{rounds} rounds of {seconds} s, {CONNECTIONS} connections × {STREAMS} streams (h2c), {KEYS} keys at random, 1,000 a minute each; sluice with one worker thread; {cpu}.\n",
        rounds = options.rounds,
        seconds = options.seconds,
        date = command_line("date", &["+%Y-%m-%d"]),
        cpu = cpu_model()
    );
    let _ = writeln!(
        out,
        "| case | decisions/s (min–max) | vs gateway | admitted | sluice CPU per decision | Redis CPU per decision |\n|---|---|---|---|---|---|"
    );
    let gateway = median(&samples[0], |s| s.rate);
    for (case, s) in CASES.iter().zip(samples) {
        let (low, high) = range(s, |x| x.rate);
        let _ = writeln!(
            out,
            "| {} | {:.0} ({:.0}–{:.0}) | {:.2}× | {:.1} % | {:.1} µs | {:.1} µs |",
            case.name,
            median(s, |x| x.rate),
            low,
            high,
            median(s, |x| x.rate) / gateway,
            median(s, |x| x.admitted) * 100.0,
            median(s, |x| x.sluice_us),
            median(s, |x| x.redis_us),
        );
    }
    out.push('\n');
    out
}
