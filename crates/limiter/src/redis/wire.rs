//! What both Redis backends say to Redis: the decide script, how it is
//! called (a Function or `EVALSHA`), its arguments (one batch: each limit
//! once, then per decision its key, limit index and member) and the decoding
//! of its replies. How they reach Redis is `client.rs`; the standalone
//! backend adds batching (`standalone/`), the cluster backend slots and
//! refunds (`cluster.rs`).

use crate::redis::client::server_error;
use crate::redis::reconcile::Units;
use crate::{Algorithm, Decision, LimitCheck, LimiterError};
use std::time::Duration;

/// The one script every decision runs: each algorithm's functions, then the
/// driver that applies them to all keys of a request, all or nothing (see
/// `lua/decide.lua` for the contract).
pub const DECIDE_SCRIPT: &str = concat!(
    include_str!("lua/digits.lua"),
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
/// decision's key count and its own arguments (from `push_args` or
/// [`take_args`]): `+` (with `deadline`, on Redis's clock, after it: Redis
/// skips the batch past it), each distinct limit once (its six arguments), then
/// per decision a head and its limits' indices — head `k` for a `take` that
/// needs no member, else `k:op:taken` and the member after the indices (see
/// `lua/decide.lua`). A batch of requests to a few routes sends each
/// route's limits once instead of once per request.
pub fn push_batch<'a>(
    command: &mut redis::Cmd,
    deadline: Option<i64>,
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
    match deadline {
        Some(deadline) => command.arg(format!("+{deadline}")),
        None => command.arg("+"),
    };
    command.arg(specs.len());
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
pub fn parse_batch_line(line: &[u8], now: i64) -> Result<Vec<i64>, LimiterError> {
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

/// The decisions of a reply of `n` limits (`admitted, now`, then four
/// numbers per limit), and Redis's `now`; an error for any other length.
pub fn decode_reply(reply: &[i64], n: usize) -> Result<(Vec<Decision>, i64), LimiterError> {
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
            taken_us: if c[0] == 1 { reply[1] } else { 0 },
        })
        .collect();
    Ok((decisions, reply[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            None,
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
}
