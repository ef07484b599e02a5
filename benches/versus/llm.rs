//! What reserve + settle costs a streamed LLM answer (`--parts llm`): one
//! sluice (one worker thread) in front of an upstream streaming OpenAI-style
//! answers — 64 events of 1 KiB, then the usage chunk and `[DONE]` — in
//! interleaved rounds of two cases:
//!
//! - `no limit`: the route proxies the stream;
//! - `reserve + settle by a header`: a `sliding_window` token budget (never
//!   reached) reserves `max_tokens` on Redis before the request and settles
//!   to the upstream's `x-usage-tokens` header: the Redis work alone;
//! - `reserve + settle by the stream`: the same budget settling to
//!   `usage.total_tokens`, read from the events as they pass. The
//!   difference between the two is what reading the stream costs.
//!
//! Each round drives each case twice: closed loop over several connections
//! for the serving process's CPU time per streamed MiB (from `/proc`), then
//! one connection, one request at a time, for the time to the first event
//! (from the request's last byte sent to the first event's last byte
//! received) at p50 and p99. The targets: reading the stream costs at most
//! 5 % of no limit's CPU per MiB, and the first event comes within 1 ms of
//! no limit's at p99.

use crate::common::{free_port, RedisServer, Sluice};
use crate::options::Options;
use crate::process::{clock_ticks_per_second, command_line, cpu_model, cpu_ticks};
use crate::report::{median, range};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Events of text in one answer, and the size of each.
const EVENTS: usize = 64;
const EVENT_BYTES: usize = 1024;

/// The cases: name and route path. The second settles by a response
/// header, the third by reading the stream: the difference between the two
/// is what reading the stream costs.
const CASES: [(&str, &str); 3] = [
    ("no limit", "/plain/v1/chat/completions"),
    (
        "reserve + settle by a header",
        "/header/v1/chat/completions",
    ),
    ("reserve + settle by the stream", "/v1/chat/completions"),
];

/// One round's figures for one case.
#[derive(Clone, Copy)]
struct Sample {
    answers_per_s: f64,
    mib_per_s: f64,
    cpu_ms_per_mib: f64,
    ttfb_p50_ms: f64,
    ttfb_p99_ms: f64,
}

/// The answer the upstream streams: its chunks, each one event.
fn events() -> Vec<Vec<u8>> {
    let text_event = |i: usize| {
        let head = format!("data: {{\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{i:04} ");
        let tail = "\"},\"finish_reason\":null}],\"usage\":null}\n\n";
        let pad = EVENT_BYTES.saturating_sub(head.len() + tail.len());
        format!("{head}{}{tail}", "x".repeat(pad)).into_bytes()
    };
    let mut events: Vec<Vec<u8>> = (0..EVENTS).map(text_event).collect();
    events.push(b"data: {\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":54,\"total_tokens\":64}}\n\n".to_vec());
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// The upstream: a thread per connection, each request answered by the
/// stream, every event its own chunk and its own write.
fn spawn_upstream(stop: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let events = Arc::new(events());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let Ok(stream) = stream else { continue };
            let events = Arc::clone(&events);
            std::thread::spawn(move || serve(stream, &events));
        }
    });
    port
}

fn serve(stream: TcpStream, events: &[Vec<u8>]) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        let Some(length) = read_head(&mut reader) else {
            return;
        };
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-usage-tokens: 64\r\ntransfer-encoding: chunked\r\n\r\n";
        if writer.write_all(head).is_err() {
            return;
        }
        for event in events {
            let chunk = [format!("{:x}\r\n", event.len()).as_bytes(), event, b"\r\n"].concat();
            if writer.write_all(&chunk).is_err() {
                return;
            }
        }
        if writer.write_all(b"0\r\n\r\n").is_err() {
            return;
        }
    }
}

/// Reads a request head; its `Content-Length` (0 without one), `None` at
/// the end of the connection.
fn read_head(reader: &mut impl BufRead) -> Option<usize> {
    let mut length = 0;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() && !first {
            return Some(length);
        }
        first = false;
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
}

/// One streamed answer on `conn`: its body bytes and the time from the
/// request sent to the first event received.
fn one_answer(conn: &mut BufReader<TcpStream>, path: &str, key: usize) -> (usize, Duration) {
    let body = r#"{"model":"bench","max_tokens":100,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer key-{key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.get_mut().write_all(request.as_bytes()).expect("send");
    let sent = Instant::now();
    let mut line = String::new();
    loop {
        line.clear();
        conn.read_line(&mut line).expect("head");
        assert!(!line.is_empty(), "connection closed");
        if line == "\r\n" {
            break;
        }
        if line.starts_with("HTTP/1.1 ") {
            assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        }
    }
    let (mut bytes, mut first) = (0, None);
    loop {
        line.clear();
        conn.read_line(&mut line).expect("chunk size");
        let size = usize::from_str_radix(line.trim(), 16).expect("chunk size");
        let mut chunk = vec![0; size + 2];
        conn.read_exact(&mut chunk).expect("chunk");
        if size == 0 {
            break;
        }
        first.get_or_insert_with(|| sent.elapsed());
        bytes += size;
    }
    (bytes, first.unwrap_or_default())
}

/// Closed loop over `connections` for `seconds`: answers and bytes.
fn throughput(
    addr: SocketAddr,
    path: &str,
    connections: usize,
    seconds: u64,
) -> (usize, usize, Duration) {
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..connections)
        .map(|c| {
            let path = path.to_string();
            std::thread::spawn(move || {
                let stream = TcpStream::connect(addr).expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                let mut conn = BufReader::new(stream);
                let (mut answers, mut bytes) = (0, 0);
                while Instant::now() < until {
                    bytes += one_answer(&mut conn, &path, c).0;
                    answers += 1;
                }
                (answers, bytes)
            })
        })
        .collect();
    let (answers, bytes) = threads
        .into_iter()
        .map(|t| t.join().expect("client"))
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    (answers, bytes, started.elapsed())
}

/// One request at a time for `seconds`: the times to the first event.
fn first_events(addr: SocketAddr, path: &str, seconds: u64) -> Vec<Duration> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut conn = BufReader::new(stream);
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut times = Vec::new();
    while Instant::now() < until {
        times.push(one_answer(&mut conn, path, 0).1);
    }
    times.sort();
    times
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The reader itself, in this process: the CPU (ms) it takes per MiB of the
/// upstream's answer fed as the proxy feeds it, one event a chunk — the
/// cost of reading the stream without the noise of a loaded machine.
fn reader_ms_per_mib() -> f64 {
    use sluice::config::usage::JsonPointers;
    use sluice::policy::usage::{UsageReader, USAGE_READ_MAX};
    let events = events();
    let bytes: usize = events.iter().map(Vec::len).sum();
    let pointers = JsonPointers::new(vec!["/usage/total_tokens".into()]).expect("pointer");
    let answers = 20_000;
    let started = Instant::now();
    for _ in 0..answers {
        let mut reader = UsageReader::new(pointers.clone(), "text/event-stream", USAGE_READ_MAX);
        for event in &events {
            reader.feed(std::hint::black_box(event));
        }
        assert_eq!(reader.finish(), Some(64));
    }
    let mib = (bytes * answers) as f64 / (1024.0 * 1024.0);
    started.elapsed().as_secs_f64() * 1e3 / mib
}

/// The gateway's config: the budgeted route and the plain one.
fn config(
    addr: SocketAddr,
    admin: SocketAddr,
    dir: &Path,
    redis: &RedisServer,
    upstream: u16,
) -> String {
    format!(
        "server:\n  listen: [\"{addr}\"]\n  admin: \"{admin}\"\n  threads: 1\n  work_stealing: false\n  access_log: off\n  grace_period: 1s\n  pid_file: {dir}/pid\n  upgrade_sock: {dir}/sock\n\
limiter:\n  redis: {{ url: \"{url}\", timeout: 50ms }}\n\
upstreams:\n  llm: {{ servers: [\"127.0.0.1:{upstream}\"] }}\n\
routes:\n  - name: plain\n    match: {{ path: /plain/v1/chat/completions }}\n    upstream: llm\n  - name: header\n    match: {{ path: /header/v1/chat/completions }}\n    upstream: llm\n    rate_headers: openai\n    limits:\n      - name: tokens\n        key: [{{header: authorization}}]\n        algorithm: sliding_window\n        limit: 1000000000\n        window: 1m\n        reserve: {{ request_json: /max_tokens, default: 1024 }}\n        cost_from: {{ response_header: x-usage-tokens }}\n  - name: chat\n    match: {{ path: /v1/chat/completions }}\n    upstream: llm\n    rate_headers: openai\n    limits:\n      - name: tokens\n        key: [{{header: authorization}}]\n        algorithm: sliding_window\n        limit: 1000000000\n        window: 1m\n        reserve: {{ request_json: /max_tokens, default: 1024 }}\n        cost_from: {{ response_json: /usage/total_tokens }}\n",
        dir = dir.display(),
        url = redis.url(),
    )
}

/// Runs the part and returns its section of the report.
pub fn run(options: &Options) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = RedisServer::start();
    let stop = Arc::new(AtomicBool::new(false));
    let upstream = spawn_upstream(Arc::clone(&stop));
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("admin");
    let sluice = Sluice::start_binary(
        Path::new(env!("CARGO_BIN_EXE_sluice")),
        &config(addr, admin, dir.path(), &redis, upstream),
        addr,
        admin,
        &[("RUST_LOG", "warn")],
    );
    let connections = options.connections.clamp(1, 16);
    for (_, path) in CASES {
        throughput(addr, path, connections, 1);
    }
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); CASES.len()];
    for round in 1..=options.rounds {
        for (i, (name, path)) in CASES.iter().enumerate() {
            let cpu_before = cpu_ticks(sluice.pid());
            let (answers, bytes, took) = throughput(addr, path, connections, options.seconds);
            let cpu = (cpu_ticks(sluice.pid()) - cpu_before) as f64 / clock_ticks_per_second();
            let mib = bytes as f64 / (1024.0 * 1024.0);
            let firsts = first_events(addr, path, options.seconds);
            let sample = Sample {
                answers_per_s: answers as f64 / took.as_secs_f64(),
                mib_per_s: mib / took.as_secs_f64(),
                cpu_ms_per_mib: cpu * 1e3 / mib.max(1e-9),
                ttfb_p50_ms: percentile(&firsts, 0.50),
                ttfb_p99_ms: percentile(&firsts, 0.99),
            };
            eprintln!(
                "llm round {round}: {name}: {:.0} answers/s, {:.1} MiB/s, {:.2} ms CPU/MiB, first event p50 {:.3} ms p99 {:.3} ms ({} answers)",
                sample.answers_per_s, sample.mib_per_s, sample.cpu_ms_per_mib, sample.ttfb_p50_ms, sample.ttfb_p99_ms, firsts.len()
            );
            samples[i].push(sample);
        }
    }
    drop(sluice);
    stop.store(true, Ordering::Relaxed);
    let reader: Vec<f64> = (0..options.rounds).map(|_| reader_ms_per_mib()).collect();
    section(options, connections, &samples, median(&reader, |x| *x))
}

/// The report's section: a row per case, its ratios to no limit, and the
/// targets.
fn section(
    options: &Options,
    connections: usize,
    samples: &[Vec<Sample>],
    reader_ms: f64,
) -> String {
    let date = command_line("date", &["+%Y-%m-%d"]);
    let mut out = format!(
        "**Streamed LLM answers**: `cargo bench --bench versus -- --parts llm --rounds {rounds} --seconds {seconds}` on {date}: {cpu}.\n\n\
{rounds} rounds of {seconds} s per case, interleaved; one sluice (one worker thread, Redis) in front of an upstream streaming {EVENTS} events of {EVENT_BYTES} bytes then OpenAI's usage chunk, each event its own chunk. CPU per MiB: {connections} connections in a closed loop; first event: one connection, one request at a time.\n\n\
| case | answers/s | MiB/s (range) | sluice CPU ms/MiB | ratio | first event p50 ms | p99 ms | p99 added |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        rounds = options.rounds,
        seconds = options.seconds,
        cpu = cpu_model(),
    );
    let base_cpu = median(&samples[0], |s| s.cpu_ms_per_mib);
    let base_p99 = median(&samples[0], |s| s.ttfb_p99_ms);
    for ((name, _), rounds) in CASES.iter().zip(samples) {
        let (low, high) = range(rounds, |s| s.mib_per_s);
        let cpu = median(rounds, |s| s.cpu_ms_per_mib);
        let p99 = median(rounds, |s| s.ttfb_p99_ms);
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {:.1} ({low:.1}–{high:.1}) | {cpu:.2} | {:.3}× | {:.3} | {p99:.3} | {:+.3} |",
            median(rounds, |s| s.answers_per_s),
            median(rounds, |s| s.mib_per_s),
            cpu / base_cpu,
            median(rounds, |s| s.ttfb_p50_ms),
            p99 - base_p99,
        );
    }
    let cpu = |i: usize| median(&samples[i], |s| s.cpu_ms_per_mib);
    // Round by round (the cases of a round ran back to back, under the
    // same conditions): what reading the stream added, as a share of no
    // limit's CPU per MiB in that round; the median of the rounds.
    let per_round: Vec<f64> = (0..samples[0].len())
        .map(|r| {
            let (base, header, stream) = (&samples[0][r], &samples[1][r], &samples[2][r]);
            (stream.cpu_ms_per_mib - header.cpu_ms_per_mib) / base.cpu_ms_per_mib
        })
        .collect();
    let parsing = median(&per_round, |x| *x);
    let (low, high) = range(&per_round, |x| *x);
    let added = median(&samples[2], |s| s.ttfb_p99_ms) - base_p99;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let _ = writeln!(
        out,
        "\nReading the stream costs {reader_ms:.3} ms of CPU per MiB, timed on its own in this process ({:.1} % of no limit's {base_cpu:.2} ms per MiB), target ≤ 5 % ({}); through the gateway, by the stream − by a header, round by round: {:+.1} % (median of the rounds; {:+.1} to {:+.1} %, the machine's noise). The whole of reserve + settle by the stream costs {:.3}× no limit's CPU per MiB (two Redis calls per answer: the reservation and the settle). The first event through it: {added:+.3} ms at p99 over no limit, target ≤ +1 ms ({}).\n",
        reader_ms / base_cpu * 100.0,
        verdict(reader_ms / base_cpu <= 0.05),
        parsing * 100.0,
        low * 100.0,
        high * 100.0,
        cpu(2) / base_cpu,
        verdict(added <= 1.0),
    );
    out
}
