//! How many decisions one Redis core makes (`--parts redis`): the number
//! that bounds a fleet, since gateways scale out and the Redis they share
//! does not.
//!
//! One `redis-server`, pinned to its own core (`taskset`), is loaded by a
//! driver in this process, pinned to the other, with decisions over 100,000
//! keys at random (1,000 a minute each: never denied), the way gateway
//! instances send them: [`CONNECTIONS`] connections (one per gateway
//! instance), [`IN_FLIGHT`] calls in flight on each, [`BATCH`] decisions a
//! round trip, enough to keep Redis's core busy. Cases:
//!
//! - sluice, each algorithm: one `FCALL` of the decide code per batch of
//!   [`BATCH`] decisions, its arguments built by the gateway's own encoder
//!   ([`sluice::limiter::redis::wire::take_args`], [`sluice::limiter::redis::wire::push_batch`]);
//! - the seed's script (`seed_limit.lua`: `ZREMRANGEBYSCORE`, `ZCARD`,
//!   `ZADD`, `EXPIRE`), one `EVALSHA` per decision, pipelined [`BATCH`]
//!   deep — what a user of Kong's or APISIX's Redis limits, or of sluice's
//!   first version, runs;
//! - envoyproxy/ratelimit's fixed window: `INCRBY` + `EXPIRE` per
//!   descriptor, pipelined (its Redis client's pipelining);
//! - the floor of any Redis limiter: one `INCR` per decision, pipelined;
//! - reference variants of an exact log (`variants.lua`, not sluice's code):
//!   the least a batch call could do with each layout — the call alone,
//!   packed stamps read with `GET` (or one `MGET`) and `APPEND`ed, a list,
//!   the seed's sorted-set commands — with no header, clock-step rule,
//!   refunds or reply beyond a digit: where the ceiling lies.
//!
//! Columns: decisions per second, how busy Redis's core was (its CPU time
//! over the wall time: near 100 % means the figure is Redis's ceiling),
//! Redis CPU per decision (from `/proc`), and the decisions one Redis core
//! makes per second (the inverse of the CPU per decision), against the
//! seed's script and against the `INCR` floor.

use crate::common::RedisServer;
use crate::options::Options;
use crate::process::{
    clock_ticks_per_second, command_line, cpu_model, cpu_ticks, online_cpus, pin, unpin_self,
};
use crate::report::{median, range};
use sluice::limiter::redis::wire::{push_batch, take_args};
use sluice::limiter::Algorithm;
use sluice::limiter::LimitCheck;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Keys the driver picks from at random.
const KEYS: u64 = 100_000;
/// Hot keys (a flood): few keys, a small limit, nearly every decision a
/// denial.
const HOT_KEYS: u64 = 8;
/// The hot keys' limit (a minute).
const HOT_LIMIT: u64 = 10;
/// A limit above the packed log's largest: kept as a sorted set.
const LARGE_LIMIT: u64 = 1_000_000;
/// The large limit's window (µs): 1,000,000 per 10 s.
const LARGE_WINDOW_US: u64 = 10_000_000;

/// The keys a case decides on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// [`KEYS`] keys at random, 1,000 a minute each: every decision admits.
    Spread,
    /// [`HOT_KEYS`] keys at [`HOT_LIMIT`] a minute: nearly every decision denies.
    Hot,
    /// [`KEYS`] keys at random, [`LARGE_LIMIT`] per 10 s: a `sliding_log`
    /// kept as a sorted set, every decision admits.
    Large,
}

impl Keys {
    /// How many keys, each's limit, and its window (µs).
    fn scale(self) -> (u64, u64, u64) {
        match self {
            Keys::Spread => (KEYS, crate::LIMIT, crate::WINDOW_US),
            Keys::Hot => (HOT_KEYS, HOT_LIMIT, crate::WINDOW_US),
            Keys::Large => (KEYS, LARGE_LIMIT, LARGE_WINDOW_US),
        }
    }
}
/// Connections to Redis: one per gateway instance.
pub const CONNECTIONS: usize = 8;
/// Calls in flight on each connection.
pub const IN_FLIGHT: usize = 2;
/// Decisions a round trip: one batch call, or that many pipelined commands.
pub const BATCH: usize = 32;
/// The seed's sliding-window script.
const SEED_SCRIPT: &str = include_str!("seed_limit.lua");

/// What a case sends for its decisions.
#[derive(Clone, Copy)]
enum Load {
    /// sluice's decide code, batch mode, one `FCALL` a round trip.
    Sluice(Algorithm),
    /// The seed's script, one `EVALSHA` a decision.
    Seed,
    /// envoyproxy/ratelimit: `INCRBY` + `EXPIRE` a decision.
    IncrbyExpire,
    /// One `INCR` a decision.
    Incr,
    /// A reference variant of `variants.lua` (its function's name), one
    /// `FCALL` a round trip.
    Variant(&'static str),
}

struct Case {
    name: &'static str,
    load: Load,
    /// Decides [`HOT_KEYS`] keys at [`HOT_LIMIT`] instead of [`KEYS`] at
    /// the usual limit.
    keys: Keys,
}

pub const SEED: &str = "seed's script (EVALSHA per decision)";
pub const HOT_SEED: &str = "seed's script, 8 hot keys at their limit";
pub const LARGE_SEED: &str = "seed's script, 1,000,000 per 10 s";
pub const INCR_FLOOR: &str = "INCR floor (pipelined)";

fn cases() -> Vec<Case> {
    let lease = Duration::from_secs(60);
    vec![
        Case {
            name: "sluice sliding_log",
            load: Load::Sluice(Algorithm::SlidingLog),
            keys: Keys::Spread,
        },
        Case {
            name: "sluice sliding_window",
            load: Load::Sluice(Algorithm::SlidingWindow { buckets: 60 }),
            keys: Keys::Spread,
        },
        Case {
            name: "sluice fixed_window",
            load: Load::Sluice(Algorithm::FixedWindow),
            keys: Keys::Spread,
        },
        Case {
            name: "sluice token_bucket",
            load: Load::Sluice(Algorithm::TokenBucket {
                burst: crate::LIMIT,
            }),
            keys: Keys::Spread,
        },
        Case {
            name: "sluice concurrency",
            load: Load::Sluice(Algorithm::Concurrency { lease }),
            keys: Keys::Spread,
        },
        Case {
            name: "sluice sliding_log, 8 hot keys at their limit",
            load: Load::Sluice(Algorithm::SlidingLog),
            keys: Keys::Hot,
        },
        Case {
            name: "sluice sliding_log, 1,000,000 per 10 s (sorted set)",
            load: Load::Sluice(Algorithm::SlidingLog),
            keys: Keys::Large,
        },
        Case {
            name: LARGE_SEED,
            load: Load::Seed,
            keys: Keys::Large,
        },
        Case {
            name: HOT_SEED,
            load: Load::Seed,
            keys: Keys::Hot,
        },
        Case {
            name: SEED,
            load: Load::Seed,
            keys: Keys::Spread,
        },
        Case {
            name: "envoyproxy/ratelimit (INCRBY + EXPIRE, pipelined)",
            load: Load::IncrbyExpire,
            keys: Keys::Spread,
        },
        Case {
            name: INCR_FLOOR,
            load: Load::Incr,
            keys: Keys::Spread,
        },
    ]
    .into_iter()
    .chain(VARIANTS.iter().map(|&(name, function, hot)| Case {
        name,
        load: Load::Variant(function),
        keys: if hot { Keys::Hot } else { Keys::Spread },
    }))
    .collect()
}

/// The reference variants: row name, function, on the hot keys.
const VARIANTS: [(&str, &str, bool); 7] = [
    (
        "reference: the batch call alone, no command",
        "v_nocall",
        false,
    ),
    ("reference: packed stamps, GET + APPEND", "v_packed", false),
    (
        "reference: packed stamps, one MGET + APPEND",
        "v_mget",
        false,
    ),
    ("reference: list, LINDEX + RPUSH + PEXPIRE", "v_list", false),
    (
        "reference: the seed's sorted-set commands, batched",
        "v_sorted",
        false,
    ),
    (
        "reference: packed stamps, 8 hot keys at their limit",
        "v_packed",
        true,
    ),
    ("reference: list, 8 hot keys at their limit", "v_list", true),
];

/// The code each case calls, loaded once.
struct Code {
    function: String,
    seed_sha: String,
}

fn load_code(redis: &RedisServer) -> Code {
    let seed_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SEED_SCRIPT)
        .query(&mut redis.connection())
        .expect("SCRIPT LOAD seed");
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(include_str!("variants.lua"))
        .query(&mut redis.connection())
        .expect("FUNCTION LOAD variants");
    Code {
        function: redis.load_decide_function(),
        seed_sha,
    }
}

/// A xorshift generator: cheap, and each task its own.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One round trip's worth of decisions for `load`: the pipeline, and the
/// number of replies that are decisions (the others are `EXPIRE`s).
fn round_trip(
    (load, keys): (Load, Keys),
    code: &Code,
    rng: &mut Rng,
    member: &str,
    sequence: &mut u64,
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    let (keys, limit, window_us) = keys.scale();
    let key = |rng: &mut Rng, prefix: &str| {
        format!("{prefix}{{bench:per-key:h.x-key={}}}", rng.next() % keys)
    };
    match load {
        Load::Sluice(algorithm) => {
            let keys: Vec<String> = (0..BATCH).map(|_| key(rng, "sluice:")).collect();
            let args: Vec<Vec<Vec<u8>>> = keys
                .iter()
                .map(|key| {
                    *sequence += 1;
                    let window = Duration::from_micros(window_us);
                    let check = LimitCheck::plain(key, limit, window, algorithm);
                    take_args(&[check], &format!("{member}-{sequence:x}"))
                })
                .collect();
            let mut command = redis::cmd("FCALL");
            command.arg(&code.function).arg(BATCH).arg(&keys);
            push_batch(&mut command, None, args.iter().map(|a| (1, a.as_slice())));
            pipe.add_command(command);
        }
        Load::Seed => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            for _ in 0..BATCH {
                *sequence += 1;
                pipe.cmd("EVALSHA")
                    .arg(&code.seed_sha)
                    .arg(1)
                    .arg(key(rng, "seed:"))
                    .arg(now_ms)
                    .arg(window_us / 1000)
                    .arg(limit)
                    .arg(format!("{member}-{sequence:x}"));
            }
        }
        Load::IncrbyExpire => {
            let window_start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() / 60 * 60);
            for _ in 0..BATCH {
                let key = format!("bench_x-key_{}_{window_start}", rng.next() % KEYS);
                pipe.cmd("INCRBY").arg(&key).arg(1);
                pipe.cmd("EXPIRE").arg(&key).arg(60);
            }
        }
        Load::Incr => {
            for _ in 0..BATCH {
                pipe.cmd("INCR").arg(key(rng, "incr:"));
            }
        }
        Load::Variant(function) => {
            let keys: Vec<String> = (0..BATCH).map(|_| key(rng, function)).collect();
            pipe.cmd("FCALL")
                .arg(function)
                .arg(BATCH)
                .arg(&keys)
                .arg(limit)
                .arg(window_us)
                .arg(member);
        }
    }
    pipe
}

/// How many decisions of a round trip's replies admitted.
fn admitted(load: Load, replies: &[redis::Value]) -> u64 {
    use redis::Value;
    let count = |v: &Value| match v {
        Value::Int(n) => *n,
        _ => 0,
    };
    match load {
        Load::Sluice(_) | Load::Variant(_) => match replies.first() {
            Some(Value::BulkString(text)) => text
                .split(|&b| b == b'\n')
                .skip(1)
                .filter(|line| line.first() == Some(&b'1'))
                .count() as u64,
            other => panic!("unexpected decide reply: {other:?}"),
        },
        Load::Seed => replies.iter().filter(|v| count(v) == 1).count() as u64,
        Load::IncrbyExpire => replies
            .iter()
            .step_by(2)
            .filter(|v| (1..=crate::LIMIT as i64).contains(&count(v)))
            .count() as u64,
        Load::Incr => replies.len() as u64,
    }
}

/// Drives `load` for `seconds`: (decisions, admitted).
fn drive(redis: &RedisServer, (load, keys): (Load, Keys), code: &Code, seconds: f64) -> (u64, u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = redis::Client::open(redis.url()).expect("client");
        let until = Instant::now() + Duration::from_secs_f64(seconds);
        let mut tasks = Vec::new();
        for c in 0..CONNECTIONS {
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            for f in 0..IN_FLIGHT {
                let mut conn = conn.clone();
                let member = format!("{:016x}", 0x5EED_0000 + (c * IN_FLIGHT + f) as u64);
                let mut rng =
                    Rng(0x9E37_79B9_7F4A_7C15
                        ^ (member.len() as u64 + (c * IN_FLIGHT + f) as u64 + 1));
                let code = Code {
                    function: code.function.clone(),
                    seed_sha: code.seed_sha.clone(),
                };
                tasks.push(tokio::spawn(async move {
                    let (mut decisions, mut admits, mut sequence) = (0u64, 0u64, 0u64);
                    while Instant::now() < until {
                        let pipe =
                            round_trip((load, keys), &code, &mut rng, &member, &mut sequence);
                        let replies: Vec<redis::Value> =
                            pipe.query_async(&mut conn).await.expect("Redis call");
                        decisions += BATCH as u64;
                        admits += admitted(load, &replies);
                    }
                    (decisions, admits)
                }));
            }
        }
        let mut total = (0, 0);
        for task in tasks {
            let (d, a) = task.await.expect("driver task");
            total = (total.0 + d, total.1 + a);
        }
        total
    })
}

/// One timed run of one case.
struct Sample {
    rate: f64,
    admitted: f64,
    redis_us: f64,
    busy: f64,
}

/// The section of the report.
pub fn run(options: &Options) -> String {
    let redis = RedisServer::start();
    let cores = online_cpus();
    let pinned = cores >= 2 && pin(redis.pid(), "1") && pin(std::process::id(), "0");
    let code = load_code(&redis);
    let ticks = clock_ticks_per_second();
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|case| {
            options.only.as_deref().is_none_or(|only| {
                case.name.contains(only) || case.name.starts_with("seed") || case.name == INCR_FLOOR
            })
        })
        .collect();
    for case in &cases {
        drive(&redis, (case.load, case.keys), &code, 1.0);
    }
    let mut samples: Vec<Vec<Sample>> = cases.iter().map(|_| Vec::new()).collect();
    for round in 1..=options.rounds {
        for (case, samples) in cases.iter().zip(&mut samples) {
            let before = cpu_ticks(redis.pid());
            let start = Instant::now();
            let (decisions, admits) = drive(
                &redis,
                (case.load, case.keys),
                &code,
                options.seconds as f64,
            );
            let elapsed = start.elapsed().as_secs_f64();
            let redis_s = (cpu_ticks(redis.pid()) - before) as f64 / ticks;
            let sample = Sample {
                rate: decisions as f64 / elapsed,
                admitted: admits as f64 / decisions.max(1) as f64,
                redis_us: redis_s * 1e6 / decisions.max(1) as f64,
                busy: redis_s / elapsed,
            };
            eprintln!(
                "redis round {round} {:52} {:>8.0} decisions/s  Redis {:.2} µs/decision, {:.0} % busy",
                case.name,
                sample.rate,
                sample.redis_us,
                sample.busy * 100.0
            );
            samples.push(sample);
        }
    }
    let memory = memory_table(&redis, &code);
    if pinned {
        unpin_self();
    }
    table(options, &cases, &samples, pinned) + &memory
}

/// Keys of the memory table, per row (fewer for the longest logs, so that a
/// row logs at most [`MEMORY_UNITS`]).
const MEMORY_KEYS: u64 = 10_000;
/// The most units one row of the memory table logs.
const MEMORY_UNITS: u64 = 1_000_000;

/// Redis memory per logged admission (`MEMORY USAGE` over [`MEMORY_KEYS`]
/// keys, each holding `entries` units logged one decision at a time as the
/// gateway logs them) for the packed log and the sorted set, at 10, 100 and
/// 1,000 entries a key.
fn memory_table(redis: &RedisServer, code: &Code) -> String {
    let mut out = format!(
        "**Memory per logged admission** (`sliding_log`, `MEMORY USAGE` summed over 10,000 keys (1,000 at 1,000 entries), each built by single-unit decisions, divided by the units logged):\n\n\
         | entries a key | packed string (limits up to {max}) | sorted set (larger limits) |\n|---|---|---|\n",
        max = sluice::limiter::redis::wire::PACKED_LOG_MAX,
    );
    let mut conn = redis.connection();
    for entries in [10u64, 100, 1000] {
        let packed = (entries <= sluice::limiter::redis::wire::PACKED_LOG_MAX)
            .then(|| bytes_per_entry(&mut conn, code, "packed", entries, entries));
        let large = sluice::limiter::redis::wire::PACKED_LOG_MAX + 1;
        let sorted = bytes_per_entry(&mut conn, code, "sorted", entries, entries.max(large));
        let _ = writeln!(
            out,
            "| {entries} | {} | {sorted:.1} bytes |",
            packed.map_or("— (a sorted set)".to_string(), |b| format!(
                "{b:.1} bytes"
            ))
        );
    }
    out.push('\n');
    out
}

/// Logs `entries` units on each of up to [`MEMORY_KEYS`] keys under `limit` (an
/// hour's window), then returns Redis's memory per unit and deletes them.
fn bytes_per_entry(
    conn: &mut redis::Connection,
    code: &Code,
    layout: &str,
    entries: u64,
    limit: u64,
) -> f64 {
    let count = MEMORY_KEYS.min(MEMORY_UNITS / entries);
    let keys: Vec<String> = (0..count)
        .map(|i| format!("mem:{{{layout}:{entries}:{i}}}"))
        .collect();
    let hour = Duration::from_secs(3600);
    let mut sequence = 0u64;
    for _ in 0..entries {
        for chunk in keys.chunks(BATCH) {
            let args: Vec<Vec<Vec<u8>>> = chunk
                .iter()
                .map(|key| {
                    sequence += 1;
                    let check = LimitCheck::plain(key, limit, hour, Algorithm::SlidingLog);
                    take_args(&[check], &format!("0123456789abcdef-{sequence:x}"))
                })
                .collect();
            let mut command = redis::cmd("FCALL");
            command.arg(&code.function).arg(chunk.len()).arg(chunk);
            push_batch(&mut command, None, args.iter().map(|a| (1, a.as_slice())));
            let _: redis::Value = command.query(conn).expect("FCALL");
        }
    }
    let mut bytes = 0u64;
    for key in &keys {
        for stored in [format!("{key}!l"), key.clone()] {
            let usage: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&stored)
                .arg("SAMPLES")
                .arg(0)
                .query(conn)
                .expect("MEMORY USAGE");
            bytes += usage.unwrap_or(0);
        }
    }
    for chunk in keys.chunks(1000) {
        let stored: Vec<String> = chunk
            .iter()
            .flat_map(|key| [format!("{key}!l"), key.clone()])
            .collect();
        let _: () = redis::cmd("DEL").arg(stored).query(conn).expect("DEL");
    }
    bytes as f64 / (count * entries) as f64
}

fn table(options: &Options, cases: &[Case], samples: &[Vec<Sample>], pinned: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**Redis capacity**: `cargo bench --bench versus -- --parts redis --rounds {rounds} --seconds {seconds}` on {date}: {cpu}, {redis}.\n\n\
         One Redis {pinning}; the driver sends decisions over {KEYS} keys at random (1,000 a minute each, none denied) from {CONNECTIONS} connections, \
         or over {HOT_KEYS} hot keys at {HOT_LIMIT} a minute (nearly all denied), or over {KEYS} keys at 1,000,000 per 10 s (a log kept as a sorted set; none denied) — \
         these rows are compared with the seed's script on the same keys and limit; \
         {IN_FLIGHT} calls in flight on each, {BATCH} decisions a round trip (sluice: one batch call; the others: {BATCH} pipelined commands). \
         Medians of {rounds} interleaved rounds. Decisions per Redis core = 1 / Redis CPU per decision.\n",
        rounds = options.rounds,
        seconds = options.seconds,
        date = command_line("date", &["+%Y-%m-%d"]),
        cpu = cpu_model(),
        redis = command_line("redis-server", &["--version"])
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        pinning = if pinned {
            "pinned to core 1, the driver to core 0"
        } else {
            "sharing the cores with the driver (fewer than 2 cores: not pinned)"
        },
    );
    let _ = writeln!(
        out,
        "| case | decisions/s (min–max) | Redis busy | Redis CPU per decision | decisions per Redis core | vs seed's script | vs INCR floor | admitted |\n|---|---|---|---|---|---|---|---|"
    );
    let per_core = |s: &[Sample]| 1e6 / median(s, |x| x.redis_us).max(1e-9);
    let of = |name: &str| {
        cases
            .iter()
            .position(|c| c.name == name)
            .map_or(f64::NAN, |i| per_core(&samples[i]))
    };
    let (seed, hot_seed, large_seed, floor) =
        (of(SEED), of(HOT_SEED), of(LARGE_SEED), of(INCR_FLOOR));
    for (case, s) in cases.iter().zip(samples) {
        let (low, high) = range(s, |x| x.rate);
        let core = per_core(s);
        // Hot keys and the large limit are compared with the seed's script
        // on the same keys and limit.
        let seed = match case.keys {
            Keys::Spread => seed,
            Keys::Hot => hot_seed,
            Keys::Large => large_seed,
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} ({:.0}–{:.0}) | {:.0} % | {:.2} µs | {:.0} | {:.2}× | {:.2}× | {:.1} % |",
            case.name,
            median(s, |x| x.rate),
            low,
            high,
            median(s, |x| x.busy) * 100.0,
            median(s, |x| x.redis_us),
            core,
            core / seed,
            core / floor,
            median(s, |x| x.admitted) * 100.0,
        );
    }
    out.push('\n');
    out
}
