//! The Redis plumbing both Redis backends share: the decide script and its
//! arguments, reply decoding, the one classification of Redis errors into
//! [`LimiterError`]s, connection timeouts, and how a call's end is reported
//! to the observer and the circuit breaker. The standalone backend adds
//! batching on top (`redis.rs`), the cluster backend slots and refunds
//! (`cluster.rs`).

use crate::redis::circuit::{CircuitBreaker, Transition};
use crate::redis::reconcile::Units;
use crate::settings::RedisTlsConfig;
use crate::{Algorithm, Decision, LimitCheck, LimiterError, RedisObserver};
use std::time::{Duration, Instant};

/// The least a connection waits for a reply before giving up on it (every
/// decision is separately bounded by its own, shorter, budget).
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// A circuit breaker for a Redis node reached within `budget` per decision
/// and `connect` per connect: its probe may take a connect, or two budgets.
pub(super) fn circuit_for(budget: Duration, connect: Duration) -> CircuitBreaker {
    CircuitBreaker::new(connect.max(budget * 2))
}

/// The TLS material of `limiter.redis.tls` as the redis crate takes it;
/// `None` when neither a CA nor a client certificate is set (a `rediss://`
/// URL then trusts the system's roots).
pub(super) fn tls_certificates(tls: &RedisTlsConfig) -> Option<redis::TlsCertificates> {
    if tls.ca_pem.is_none() && tls.client_pem.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: tls
            .client_pem
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    })
}

/// A client for `info`, over TLS with `tls`'s material when it has any.
pub(super) fn client_for(
    info: redis::ConnectionInfo,
    tls: &RedisTlsConfig,
) -> redis::RedisResult<redis::Client> {
    ensure_tls_provider();
    match tls_certificates(tls) {
        Some(certificates) => redis::Client::build_with_tls(info, certificates),
        None => redis::Client::open(info),
    }
}

/// Logs a failed connection attempt. One a person must fix (a wrong
/// password or user, a certificate that does not verify, TLS that does not
/// agree) is a warning, at most every 30 s; an unreachable Redis is only
/// debug (the circuit and `sluice_redis_up` say it). Never names the URL,
/// which may hold a password.
pub(super) fn connect_failed(place: &str, error: &redis::RedisError) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_WARNED_S: AtomicU64 = AtomicU64::new(0);
    let text = error.to_string();
    let lower = text.to_ascii_lowercase();
    let fixable = error.kind() == redis::ErrorKind::AuthenticationFailed
        || [
            "wrongpass",
            "noauth",
            "noperm",
            "certificate",
            "tls",
            "handshake",
        ]
        .iter()
        .any(|word| lower.contains(word));
    if !fixable || error.is_connection_refusal() {
        log::debug!("cannot connect to Redis {place}: {text}");
        return;
    }
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_WARNED_S.load(Ordering::Relaxed);
    if now_s >= last + 30
        && LAST_WARNED_S
            .compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        log::warn!("cannot connect to Redis {place}: {text}");
    } else {
        log::debug!("cannot connect to Redis {place}: {text}");
    }
}

/// rustls needs one process-wide crypto provider: ring, installed once
/// (a provider already installed is kept).
pub(super) fn ensure_tls_provider() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The one script every decision runs: each algorithm's functions, then the
/// driver that applies them to all keys of a request, all or nothing (see
/// `lua/decide.lua` for the contract).
pub const DECIDE_SCRIPT: &str = concat!(
    include_str!("lua/clock.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/concurrency.lua"),
    include_str!("lua/calendar.lua"),
    include_str!("lua/decide.lua"),
    "return run(KEYS, ARGV)\n",
);

/// How a Redis server runs the decide code: as a Redis Function (Redis 7:
/// `FUNCTION LOAD` once, `FCALL` per call; kept by the server across restarts
/// with its data, and replicated) or as a script (`EVALSHA`, any Redis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallForm {
    /// `FCALL <function> numkeys …`.
    Function(String),
    /// `EVALSHA <sha1> numkeys …`.
    Script(String),
}

impl CallForm {
    /// A command calling the decide code with `keys` keys; arguments follow.
    pub fn command(&self, keys: usize) -> redis::Cmd {
        let mut command = match self {
            CallForm::Function(name) => {
                let mut c = redis::cmd("FCALL");
                c.arg(name.as_str());
                c
            }
            CallForm::Script(sha) => {
                let mut c = redis::cmd("EVALSHA");
                c.arg(sha.as_str());
                c
            }
        };
        command.arg(keys);
        command
    }
}

/// The decide code as a Redis Function library: named after the script's
/// SHA1, so that two versions of sluice sharing one Redis (an upgrade in
/// progress) each call their own code. The function may touch keys of several
/// slots (`allow-cross-slot-keys`): a Redis Cluster node's batch carries keys
/// of every slot that node serves. Returns the library and its function.
pub fn function_library(script_sha: &str) -> (String, String) {
    let version = &script_sha[..script_sha.len().min(12)];
    let function = format!("sluice_decide_{version}");
    let body = DECIDE_SCRIPT
        .strip_suffix("return run(KEYS, ARGV)\n")
        .unwrap_or(DECIDE_SCRIPT);
    let library = format!(
        "#!lua name=sluice_{version}\n{body}\nredis.register_function{{function_name = '{function}', callback = function(keys, args) return run(keys, args) end, flags = {{ 'allow-cross-slot-keys' }}}}\n"
    );
    (library, function)
}

/// Whether Redis lost the decide code: `NOSCRIPT` for a script, "Function
/// not found" for a function (a restart without persistence, a flush).
pub(super) fn lost_code(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || error.to_string().contains("Function not found")
}

/// What a script call does.
#[derive(Debug, Clone, Copy)]
pub(super) enum Mode {
    /// Decide and consume.
    Take,
    /// Give back what the member took at `taken_us` (Redis time).
    Refund {
        /// When the units were taken, in Redis microseconds.
        taken_us: i64,
    },
    /// Consume each check's cost whatever the limit holds (a deferred
    /// limit's counted response).
    Add,
    /// Report as `Take` would, consuming nothing.
    Peek,
    /// Delete the keys (and their penalty boxes).
    Reset,
}

/// Something script arguments can be appended to.
pub(super) trait ArgSink {
    /// Appends one argument.
    fn push<T: redis::ToRedisArgs>(&mut self, value: T);
}

impl ArgSink for Vec<Vec<u8>> {
    fn push<T: redis::ToRedisArgs>(&mut self, value: T) {
        value.write_redis_args(self);
    }
}

impl ArgSink for redis::Cmd {
    fn push<T: redis::ToRedisArgs>(&mut self, value: T) {
        self.arg(value);
    }
}

impl ArgSink for redis::ScriptInvocation<'_> {
    fn push<T: redis::ToRedisArgs>(&mut self, value: T) {
        self.arg(value);
    }
}

/// An algorithm on the wire: its 1-based index in `decide.lua`'s
/// `algorithms` table (a test holds the two in step), and its parameter.
pub(super) fn wire_code(algorithm: Algorithm) -> (u8, u64) {
    match algorithm {
        Algorithm::SlidingLog => (1, 0),
        Algorithm::SlidingWindow { buckets } => (2, u64::from(buckets)),
        Algorithm::FixedWindow => (3, 0),
        Algorithm::TokenBucket { burst } => (4, burst),
        Algorithm::Concurrency { lease } => (5, lease.as_micros() as u64),
        // Its window and parameter are the period bounds (see `push_args`).
        Algorithm::Calendar { .. } => (6, 0),
    }
}

/// The largest `sliding_log` limit whose log Redis keeps as a packed string
/// of stamps (`lua/sliding_log.lua`'s `PACKED_MAX`; a test holds the two
/// equal). Larger limits keep a sorted set of members.
pub const PACKED_LOG_MAX: u64 = 1024;

/// How a limit's units are given back, from its wire arguments (its six, as
/// [`push_args`] writes them). A packed `sliding_log` gives back by stamp
/// (the oldest units stamped at or after the decision's time), which is
/// only safe once the decision is known to have run: counted like a count.
pub(super) fn refund_units(args: &[Vec<u8>]) -> Units {
    let is = |algorithm: Algorithm| {
        let code = wire_code(algorithm).0.to_string();
        args.first()
            .is_some_and(|first| first.as_slice() == code.as_bytes())
    };
    let limit = || {
        args.get(1)
            .and_then(|limit| std::str::from_utf8(limit).ok()?.parse::<u64>().ok())
    };
    if is(Algorithm::Concurrency {
        lease: Duration::ZERO,
    }) {
        Units::Lease
    } else if is(Algorithm::SlidingLog) && limit().is_some_and(|l| l > PACKED_LOG_MAX) {
        Units::LogEntry
    } else {
        Units::Count
    }
}

/// Appends the ARGV of `lua/decide.lua` for `checks`.
pub(super) fn push_args(
    sink: &mut impl ArgSink,
    checks: &[LimitCheck<'_>],
    member: &str,
    mode: Mode,
) {
    sink.push(member);
    match mode {
        Mode::Take => {
            sink.push("take");
            sink.push(0);
        }
        Mode::Refund { taken_us } => {
            sink.push("refund");
            sink.push(taken_us);
        }
        Mode::Add => {
            sink.push("add");
            sink.push(0);
        }
        Mode::Peek => {
            sink.push("peek");
            sink.push(0);
        }
        Mode::Reset => {
            sink.push("reset");
            sink.push(0);
        }
    }
    for check in checks {
        let (code, param) = wire_code(check.algorithm);
        sink.push(code);
        sink.push(check.limit);
        if let Algorithm::Calendar { bounds, .. } = check.algorithm {
            // The period's end as the window, and the previous period's end
            // and the next one's as the parameter: Redis's clock picks.
            sink.push(bounds.end_us);
            sink.push(check.cost);
            sink.push(format!("{}:{}", bounds.start_us, bounds.next_end_us));
        } else {
            sink.push(check.window.as_micros() as u64);
            sink.push(check.cost);
            sink.push(param);
        }
        // The mode: shadow + 2 deferred + 4 × the penalty box in µs.
        let block = check.block.as_micros().min(1 << 50) as u64;
        let mode = u64::from(check.shadow) + 2 * u64::from(check.deferred) + 4 * block;
        if check.max_delay.is_zero() {
            sink.push(mode);
        } else {
            sink.push(format!("{mode}:{}", check.max_delay.as_micros()));
        }
    }
}

/// The arguments of one `take` decision of `checks` under `member`, as a
/// batch carries them (see [`push_batch`]): what the gateway sends for a
/// request, byte for byte.
pub fn take_args(checks: &[LimitCheck<'_>], member: &str) -> Vec<Vec<u8>> {
    let mut args = Vec::with_capacity(3 + 6 * checks.len());
    push_args(&mut args, checks, member, Mode::Take);
    args
}

/// Appends the batch-mode arguments of the decide code to `command` (a
/// call that already carries every decision's keys, in order), from each
/// decision's key count and its own arguments (from [`push_args`] or
/// [`take_args`]): `+`, each distinct limit once (its six arguments), then
/// per decision a head and its limits' indices — head `k` for a `take` that
/// needs no member, else `k:op:taken` and the member after the indices (see
/// `lua/decide.lua`). A batch of requests to a few routes sends each
/// route's limits once instead of once per request.
pub fn push_batch<'a>(
    command: &mut redis::Cmd,
    decisions: impl ExactSizeIterator<Item = (usize, &'a [Vec<u8>])> + Clone,
) {
    let mut specs: Vec<&'a [Vec<u8>]> = Vec::new();
    for (keys, args) in decisions.clone() {
        for spec in limits_of(args, keys) {
            if !specs.contains(&spec) {
                specs.push(spec);
            }
        }
    }
    command.arg("+").arg(specs.len());
    for spec in &specs {
        for arg in *spec {
            command.arg(arg.as_slice());
        }
    }
    command.arg(decisions.len());
    for (keys, args) in decisions {
        let (member, op, taken) = match args {
            [member, op, taken, ..] => (member.as_slice(), op.as_slice(), taken.as_slice()),
            _ => (&b""[..], &b"take"[..], &b"0"[..]),
        };
        let limits: Vec<&[Vec<u8>]> = limits_of(args, keys).collect();
        let with_member = op != b"take" || limits.iter().any(|spec| needs_member(spec));
        if with_member {
            let mut head = format!("{keys}:").into_bytes();
            head.extend_from_slice(op);
            head.push(b':');
            head.extend_from_slice(taken);
            command.arg(head);
        } else {
            command.arg(keys);
        }
        for spec in &limits {
            let index = specs.iter().position(|s| s == spec).unwrap_or(0) + 1;
            command.arg(index);
        }
        if with_member {
            command.arg(member);
        }
    }
}

/// The six arguments of each of a decision's `keys` limits, after its
/// member, op and time.
fn limits_of(args: &[Vec<u8>], keys: usize) -> impl Iterator<Item = &[Vec<u8>]> {
    args.get(3..).unwrap_or_default().chunks_exact(6).take(keys)
}

/// Whether a limit (its six arguments) keeps its units under the request's
/// member: a `concurrency` lease, or a `sliding_log` kept as a sorted set.
fn needs_member(spec: &[Vec<u8>]) -> bool {
    let code = |algorithm: Algorithm| wire_code(algorithm).0.to_string().into_bytes();
    let limit = std::str::from_utf8(&spec[1])
        .ok()
        .and_then(|l| l.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    spec[0]
        == code(Algorithm::Concurrency {
            lease: Duration::ZERO,
        })
        || (spec[0] == code(Algorithm::SlidingLog) && limit > PACKED_LOG_MAX)
}

/// TCP settings for every Redis connection: `TCP_NODELAY`, as every Redis
/// client sets it. redis-rs leaves Nagle's algorithm on by default; with it, a
/// write that follows one not yet acknowledged waits for the peer's delayed
/// ACK (up to 40 ms on Linux): a stall in the decision's budget.
pub(super) fn no_delay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// Server error codes that mean Redis itself cannot serve (not one key's problem).
pub(super) const UNHEALTHY_CODES: &[&str] = &[
    "LOADING",
    "BUSY",
    "OOM",
    "READONLY",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "TRYAGAIN",
    "NOREPLICAS",
];

/// What a Redis error means for sluice, for both backends alike: refused
/// (nothing listening), I/O (the connection broke), a timeout (reported as
/// the `budget` it ran out of), Redis unable to serve (`UNHEALTHY_CODES`, or
/// a cluster redirection the client could not follow), or an error confined
/// to this one call.
/// Runs `cmd` on `conn` within `timeout`, its errors made a
/// [`LimiterError`] by `classify`: one command on one key, for both backends.
pub(super) async fn query_within<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    cmd: &redis::Cmd,
    timeout: Duration,
    classify: impl Fn(redis::RedisError) -> LimiterError,
) -> Result<redis::Value, LimiterError> {
    match tokio::time::timeout(timeout, cmd.query_async(conn)).await {
        Ok(result) => result.map_err(classify),
        Err(_) => Err(LimiterError::Timeout(timeout)),
    }
}

pub(super) fn classify(error: &redis::RedisError, budget: Duration) -> LimiterError {
    // A timeout is an I/O error to redis-rs too: ask about it first.
    if error.is_timeout() {
        LimiterError::Timeout(budget)
    } else if error.is_connection_refusal() {
        LimiterError::Refused(error.to_string())
    } else if error.is_io_error() || error.is_connection_dropped() {
        LimiterError::Io(error.to_string())
    } else if error.is_cluster_error() {
        // MOVED/ASK reaching us means the client could not follow them: the
        // owner of the slot is unreachable or the topology is in flux.
        LimiterError::Unavailable(error.to_string())
    } else {
        server_error(error.code().unwrap_or(""), error.to_string())
    }
}

/// A Redis error reply with `code` (its first word) and `message`.
fn server_error(code: &str, message: String) -> LimiterError {
    if UNHEALTHY_CODES.contains(&code) {
        LimiterError::Unavailable(message)
    } else {
        LimiterError::Server(message)
    }
}

/// Reports a call that answered after `elapsed`: the observer hears of it,
/// and the circuit closes if it was probing (logged, naming `node`).
pub(super) fn record_success(
    observer: &dyn RedisObserver,
    circuit: &CircuitBreaker,
    elapsed: Duration,
    node: &str,
) {
    observer.call_succeeded(elapsed);
    observer.set_up(true);
    circuit_success(circuit, node);
}

/// Closes `circuit` if it was probing, and says so.
pub(super) fn circuit_success(circuit: &CircuitBreaker, node: &str) {
    if circuit.on_success() == Transition::Closed {
        log::info!("Redis {node} answers again: circuit closed, decisions come from Redis");
    }
}

/// Reports a call started at `started` that failed with `error`. Returns
/// whether this failure opened the circuit (the caller then drops its
/// connection or refreshes its map). An error confined to one call never
/// counts against the circuit.
pub(super) fn record_failure(
    observer: &dyn RedisObserver,
    circuit: &CircuitBreaker,
    error: &LimiterError,
    started: Instant,
    node: &str,
) -> bool {
    observer.call_failed(error);
    let Some(failure) = error.circuit_failure() else {
        log::warn!("rate-limit decision failed for one key: {error}");
        return false;
    };
    match circuit.on_failure(Instant::now(), started, failure) {
        Transition::Opened(wait) => {
            log::warn!(
                "Redis {node} unhealthy ({error}): circuit open for {wait:?}, on_error applies"
            );
            observer.set_up(false);
            true
        }
        _ => false,
    }
}

/// Whether a pipeline reply says Redis lost the decide code.
pub(super) fn is_noscript(value: &redis::RedisResult<redis::Value>) -> bool {
    matches!(value, Err(e) if lost_code(e))
}

/// Parses the decide script's reply `{admitted, now, (allowed, remaining,
/// reset_us, retry_us) × n}` into the decisions and Redis's `now` (µs).
pub(super) fn parse_reply(
    reply: redis::Value,
    n: usize,
) -> Result<(Vec<Decision>, i64), LimiterError> {
    let values: Vec<i64> = redis::from_redis_value(reply)
        .map_err(|e| LimiterError::Server(format!("unexpected script reply: {e}")))?;
    decode_reply(&values, n)
}

/// One decision's line of a batch reply (whose first line is `now`): its
/// numbers with `now` put back second, as a single decision's reply has
/// them, or `!` and its error.
pub(super) fn parse_batch_line(line: &[u8], now: i64) -> Result<Vec<i64>, LimiterError> {
    let mut values = parse_line(line)?;
    if values.is_empty() {
        return Err(LimiterError::Server("empty line in a batch reply".into()));
    }
    values.insert(1, now);
    Ok(values)
}

/// A line of numbers separated by spaces, or `!` and an error.
pub(super) fn parse_line(line: &[u8]) -> Result<Vec<i64>, LimiterError> {
    if let Some(message) = line.strip_prefix(b"!") {
        let message = String::from_utf8_lossy(message).into_owned();
        let code = message.split(' ').next().unwrap_or("").to_string();
        return Err(server_error(&code, message));
    }
    line.split(|&b| b == b' ')
        .map(|field| {
            std::str::from_utf8(field)
                .ok()
                .and_then(|f| f.parse::<i64>().ok())
                .ok_or_else(|| {
                    LimiterError::Server(format!(
                        "unexpected script reply: {}",
                        String::from_utf8_lossy(line)
                    ))
                })
        })
        .collect()
}

pub(super) fn decode_reply(reply: &[i64], n: usize) -> Result<(Vec<Decision>, i64), LimiterError> {
    if reply.len() != 2 + 4 * n {
        return Err(LimiterError::Server(format!(
            "script returned {} values for {n} keys",
            reply.len()
        )));
    }
    let micros = |v: i64| Duration::from_micros(v.max(0) as u64);
    let decisions = reply[2..]
        .chunks_exact(4)
        .map(|c| Decision {
            allowed: c[0] == 1,
            remaining: c[1].max(0) as u64,
            reset: micros(c[2]),
            // For an admitted request, zero; or the wait of a limit that
            // delays it (`on_limit: delay`).
            retry_after: micros(c[3]),
        })
        .collect();
    Ok((decisions, reply[1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::circuit::Failure;

    #[test]
    fn reply_shapes() {
        let (d, now) = decode_reply(&[1, 77, 1, 4, 10_000_000, 0], 1).unwrap();
        assert!(d[0].allowed);
        assert_eq!(now, 77);
        assert_eq!(d[0].remaining, 4);
        assert_eq!(d[0].reset, Duration::from_secs(10));
        let (d, _) = decode_reply(&[0, 0, 1, 5, 0, 0, 0, 0, 1_000, 2_500_000], 2).unwrap();
        assert!(d[0].allowed && !d[1].allowed);
        assert_eq!(d[1].retry_after, Duration::from_micros(2_500_000));
        assert!(decode_reply(&[1, 2], 1).is_err());
    }

    /// The decide script dispatches on `algorithms[code]`: the codes that
    /// `push_args` writes must name the same algorithms, in the same order.
    #[test]
    fn wire_codes_match_the_lua_dispatch_table() {
        let table = DECIDE_SCRIPT
            .lines()
            .find_map(|l| l.trim().strip_prefix("local algorithms = {"))
            .and_then(|rest| rest.strip_suffix('}'))
            .expect("decide.lua has `local algorithms = { … }`");
        let lua: Vec<&str> = table.split(',').map(str::trim).collect();
        let lease = Duration::from_secs(1);
        for algorithm in [
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow { buckets: 10 },
            Algorithm::FixedWindow,
            Algorithm::TokenBucket { burst: 1 },
            Algorithm::Concurrency { lease },
            Algorithm::Calendar {
                period: crate::calendar::Period::Day,
                bounds: Default::default(),
            },
        ] {
            let check = LimitCheck::plain("k", 1, lease, algorithm);
            let mut args: Vec<Vec<u8>> = Vec::new();
            push_args(&mut args, &[check], "m-1", Mode::Take);
            let code: usize = std::str::from_utf8(&args[3]).unwrap().parse().unwrap();
            assert_eq!(lua.get(code - 1), Some(&algorithm.name()), "code {code}");
        }
        assert_eq!(lua.len(), 6);
    }

    /// The packed log's largest limit is one fact, written in Lua and Rust.
    #[test]
    fn the_packed_log_bound_is_the_same_in_lua() {
        let lua = DECIDE_SCRIPT
            .lines()
            .find_map(|l| l.trim().strip_prefix("local PACKED_MAX = "))
            .expect("sliding_log.lua has `local PACKED_MAX = …`");
        assert_eq!(lua.trim().parse::<u64>().ok(), Some(PACKED_LOG_MAX));
    }

    /// How far a clock may step back is one fact, written in Lua and Rust.
    #[test]
    fn the_clock_step_back_bound_is_the_same_in_lua() {
        let lua = DECIDE_SCRIPT
            .lines()
            .find_map(|l| l.trim().strip_prefix("local CLOCK_STEP_BACK_MAX = "))
            .expect("clock.lua has `local CLOCK_STEP_BACK_MAX = …`");
        assert_eq!(
            lua.trim().parse::<u64>().ok(),
            Some(crate::local::CLOCK_STEP_BACK_MAX_US)
        );
    }

    #[test]
    fn refund_units_are_read_from_what_push_args_writes() {
        let check = |algorithm, limit| LimitCheck {
            key: "k",
            limit,
            window: Duration::from_secs(1),
            cost: 1,
            algorithm,
            shadow: false,
            block: Duration::ZERO,
            deferred: false,
            max_delay: Duration::ZERO,
        };
        let lease = Duration::from_secs(30);
        let large = PACKED_LOG_MAX + 1;
        for (algorithm, limit, units) in [
            (Algorithm::Concurrency { lease }, 1, Units::Lease),
            (Algorithm::SlidingLog, large, Units::LogEntry),
            (Algorithm::SlidingLog, PACKED_LOG_MAX, Units::Count),
            (Algorithm::FixedWindow, 1, Units::Count),
            (Algorithm::SlidingWindow { buckets: 10 }, 1, Units::Count),
            (Algorithm::TokenBucket { burst: 1 }, 1, Units::Count),
        ] {
            let mut args: Vec<Vec<u8>> = Vec::new();
            push_args(&mut args, &[check(algorithm, limit)], "m-1", Mode::Take);
            assert_eq!(args.len(), 3 + 6);
            assert_eq!(refund_units(&args[3..]), units, "{algorithm:?}");
        }
    }

    #[test]
    fn batch_lines() {
        let now = 1_764_000_000_000_000;
        assert_eq!(
            parse_batch_line(b"1 1 4 10000000 0", now).unwrap(),
            vec![1, now, 1, 4, 10_000_000, 0]
        );
        assert!(matches!(
            parse_batch_line(b"!WRONGTYPE Operation against a key", now),
            Err(LimiterError::Server(m)) if m.starts_with("WRONGTYPE")
        ));
        assert!(matches!(
            parse_batch_line(b"!BUSY Redis is busy", now),
            Err(LimiterError::Unavailable(_))
        ));
        assert!(parse_batch_line(b"1 x", now).is_err());
        assert!(parse_batch_line(b"", now).is_err());
    }

    /// Each distinct limit goes once; a decision names its limits by index,
    /// and carries a member only where a limit keeps one (or it is not a
    /// `take`).
    #[test]
    fn a_batch_sends_each_limit_once() {
        let window = Duration::from_secs(60);
        let log = LimitCheck::plain("a", 5, window, Algorithm::SlidingLog);
        let big = LimitCheck::plain("b", PACKED_LOG_MAX + 1, window, Algorithm::SlidingLog);
        let decisions = [
            take_args(&[log], "m-1"),
            take_args(&[LimitCheck { key: "c", ..log }], "m-2"),
            take_args(&[log, big], "m-3"),
        ];
        let mut command = redis::cmd("FCALL");
        push_batch(
            &mut command,
            decisions
                .iter()
                .map(|args| ((args.len() - 3) / 6, args.as_slice())),
        );
        let args: Vec<String> = command
            .args_iter()
            .filter_map(|arg| match arg {
                redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            })
            .collect();
        let spec = |limit: u64| {
            vec![
                "1".to_string(),
                limit.to_string(),
                "60000000".into(),
                "1".into(),
                "0".into(),
                "0".into(),
            ]
        };
        let mut expected: Vec<String> = vec!["FCALL".into(), "+".into(), "2".into()];
        expected.extend(spec(5));
        expected.extend(spec(PACKED_LOG_MAX + 1));
        expected.extend(["3", "1", "1", "1", "1", "2:take:0", "1", "2", "m-3"].map(String::from));
        assert_eq!(args, expected);
    }

    /// I/O errors as redis-rs reports them, what each must classify as,
    /// and what it must tell the circuit breaker.
    fn io_errors() -> Vec<(redis::RedisError, &'static str, Option<Failure>)> {
        use redis::RedisError;
        use std::io;
        let io_error = |kind: io::ErrorKind| RedisError::from(io::Error::new(kind, "x"));
        vec![
            (
                io_error(io::ErrorKind::ConnectionRefused),
                "refused",
                Some(Failure::Refused),
            ),
            (
                io_error(io::ErrorKind::ConnectionReset),
                "io",
                Some(Failure::Down),
            ),
            (
                io_error(io::ErrorKind::BrokenPipe),
                "io",
                Some(Failure::Down),
            ),
            (
                io_error(io::ErrorKind::TimedOut),
                "timeout",
                Some(Failure::Slow),
            ),
        ]
    }

    /// Error replies as Redis sends them on the wire, what each must
    /// classify as, and what it must tell the circuit breaker.
    fn reply_errors() -> Vec<(redis::RedisError, &'static str, Option<Failure>)> {
        let reply = |text: &str| {
            let wire = format!("-{text}\r\n");
            redis::parse_redis_value(wire.as_bytes())
                .and_then(redis::Value::extract_error)
                .expect_err("an error reply")
        };
        vec![
            (
                reply("LOADING Redis is loading the dataset in memory"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("BUSY Redis is busy running a script"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("OOM command not allowed when used memory > 'maxmemory'"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("READONLY You can't write against a read only replica"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("MASTERDOWN Link with MASTER is down"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("CLUSTERDOWN The cluster is down"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("TRYAGAIN Multiple keys request during rehashing"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("MOVED 3999 127.0.0.1:6381"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
                "server",
                None,
            ),
            (reply("ERR user_script:1: bad"), "server", None),
            (reply("NOSCRIPT No matching script"), "server", None),
        ]
    }

    /// One table of Redis errors and what they mean, for both backends.
    #[test]
    fn redis_errors_are_classified_once_for_both_backends() {
        let budget = Duration::from_millis(20);
        for (error, expected, failure) in io_errors().into_iter().chain(reply_errors()) {
            let classified = classify(&error, budget);
            let kind = match &classified {
                LimiterError::Refused(_) => "refused",
                LimiterError::Io(_) => "io",
                LimiterError::Timeout(b) => {
                    assert_eq!(*b, budget, "a timeout reports the budget");
                    "timeout"
                }
                LimiterError::Unavailable(_) => "unavailable",
                LimiterError::Server(_) => "server",
                LimiterError::CircuitOpen => "circuit_open",
            };
            assert_eq!(kind, expected, "{error:?}");
            assert_eq!(classified.circuit_failure(), failure, "{error:?}");
        }
    }
}
