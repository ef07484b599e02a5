//! The Redis backend: one shared multiplexed connection, the decide script
//! (every algorithm, `lua/*.lua`) by `EVALSHA` (reloaded on `NOSCRIPT`), every
//! call bounded by the configured budget.
//!
//! The connection is made lazily, on first use, inside the runtime that serves
//! requests (a connection made before Pingora starts its runtimes would die
//! with the temporary runtime). One background task connects at a time; requests
//! wait for it within their budget. Failures feed the [`CircuitBreaker`]: once
//! it opens, Redis is not called (nor connected to) until its probe, so a dead
//! Redis costs no latency; the connection is replaced when the circuit opens.
//!
//! Concurrent decisions are coalesced ("smart batching"): a request whose
//! Redis connection is idle is sent at once; while a call is in flight, later
//! requests queue, and the next call carries all of them: one `EVALSHA` of the
//! decide script in batch mode (up to [`MAX_BATCH`] decisions; more go in the
//! same pipeline). At low load this adds no latency; under load batches grow
//! with the round trip. The script runs the batch's decisions one after the
//! other inside one atomic execution, exactly as separate calls would, so
//! exactness is untouched; what is saved is Redis's per-call overhead (command
//! dispatch, the script's set-up), the client's per-command encoding and
//! parsing, and syscalls. A queued request whose budget has run out is never
//! sent, so it cannot consume a unit after its client was answered by
//! `on_error`.
//!
//! The budget is kept without a timer per request: each queued decision
//! carries its deadline; a batch's call runs until the latest deadline in it,
//! and one timer, re-armed at the next deadline, answers each decision whose
//! budget runs out first. So every decision is answered by its own deadline,
//! none fails because another member of its batch ran out of budget, and the
//! timers cost one per distinct deadline wave instead of one per request.

use super::circuit::{CircuitBreaker, Permit, Transition};
use super::lazy::LazyConnection;
use super::reconcile::{FallbackLedger, Refund};
use super::{Algorithm, Decision, LimitCheck, Limiter, LimiterError, RedisObserver};
use crate::config::RedisConfig;
use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The one script every decision runs: each algorithm's functions, then the
/// driver that applies them to all keys of a request, all or nothing (see
/// `lua/decide.lua` for the contract).
pub const DECIDE_SCRIPT: &str = concat!(
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/concurrency.lua"),
    include_str!("lua/decide.lua"),
);

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
    }
    for check in checks {
        let (code, param) = match check.algorithm {
            Algorithm::SlidingLog => (1, 0),
            Algorithm::SlidingWindow { buckets } => (2, u64::from(buckets)),
            Algorithm::FixedWindow => (3, 0),
            Algorithm::TokenBucket { burst } => (4, burst),
            Algorithm::Concurrency { lease } => (5, lease.as_micros() as u64),
        };
        sink.push(code);
        sink.push(check.limit);
        sink.push(check.window.as_micros() as u64);
        sink.push(check.cost);
        sink.push(param);
        sink.push(u8::from(check.shadow));
    }
}

/// TCP settings for every Redis connection: `TCP_NODELAY`, as every Redis
/// client sets it. redis-rs leaves Nagle's algorithm on by default; with it, a
/// write that follows one not yet acknowledged waits for the peer's delayed
/// ACK (up to 40 ms on Linux): a stall in the decision's budget.
pub(super) fn no_delay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// A batch call on its way: one reply per script call of the pipeline.
type PendingCall = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = redis::RedisResult<Vec<redis::RedisResult<redis::Value>>>>
            + Send,
    >,
>;

/// The decide script's code of `concurrency` (see [`push_args`]).
const CONCURRENCY_CODE: &str = "5";

/// The most decisions one script call carries: bounds how long one call
/// holds Redis (a few hundred microseconds at most).
pub const MAX_BATCH: usize = 64;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Redis-backed limiter, shared by all request tasks.
pub struct RedisLimiter {
    client: redis::Client,
    budget: Duration,
    script: redis::Script,
    connection: LazyConnection<MultiplexedConnection>,
    /// Whether the last failed connect was refused (nothing listening).
    connect_refused: AtomicBool,
    circuit: CircuitBreaker,
    queue: std::sync::Mutex<Queue>,
    observer: Arc<dyn RedisObserver>,
    /// The fallback's verdicts on decisions that timed out (see `reconcile`).
    ledger: FallbackLedger,
}

/// Decisions waiting to be sent, and whether a flush loop is running.
#[derive(Default)]
struct Queue {
    pending: Vec<Queued>,
    flushing: bool,
}

/// One decision waiting for the next flush: its keys and its own arguments
/// of the decide script.
struct Queued {
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
    /// When its budget runs out.
    deadline: Instant,
    /// Taken when it is answered (by its reply, or at its deadline).
    reply: Option<oneshot::Sender<Result<Vec<i64>, LimiterError>>>,
}

impl Queued {
    /// Answers the decision, unless it already was.
    fn answer(&mut self, result: Result<Vec<i64>, LimiterError>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(result);
        }
    }
}

impl RedisLimiter {
    /// Prepares a client for `config.url`; connects nothing yet.
    pub fn new(
        config: &RedisConfig,
        observer: Arc<dyn RedisObserver>,
    ) -> Result<Self, LimiterError> {
        use redis::IntoConnectionInfo;
        let info = config
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| LimiterError::Server(format!("invalid Redis URL: {e}")))?
            .set_tcp_settings(no_delay());
        let client = redis::Client::open(info)
            .map_err(|e| LimiterError::Server(format!("invalid Redis URL: {e}")))?;
        Ok(Self {
            client,
            budget: config.timeout,
            script: redis::Script::new(DECIDE_SCRIPT),
            connection: LazyConnection::new(),
            connect_refused: AtomicBool::new(false),
            circuit: CircuitBreaker::new(CONNECT_TIMEOUT.max(config.timeout * 2)),
            queue: std::sync::Mutex::new(Queue::default()),
            observer,
            ledger: FallbackLedger::default(),
        })
    }

    /// Records what `on_error` told the request `member` after its decision
    /// timed out, for when Redis runs that decision late.
    pub fn note_fallback(&self, member: &str, admitted: bool) {
        self.ledger.record(member, admitted);
    }

    /// False while the circuit is open (Redis found unhealthy, not called).
    pub fn is_healthy(&self) -> bool {
        !self.circuit.is_open()
    }

    fn current(&self) -> Option<MultiplexedConnection> {
        self.connection.current()
    }

    fn drop_connection(&self) {
        self.connection.clear();
    }

    /// The shared connection, connecting (once, in the background) if needed.
    async fn connection(self: &Arc<Self>) -> Result<MultiplexedConnection, LimiterError> {
        let this = Arc::clone(self);
        let conn = self
            .connection
            .get(move || {
                tokio::spawn(async move { this.connect().await });
            })
            .await;
        conn.ok_or_else(|| {
            if self.connect_refused.load(Ordering::Relaxed) {
                LimiterError::Refused("cannot connect to Redis".into())
            } else {
                LimiterError::Io("cannot connect to Redis".into())
            }
        })
    }

    async fn connect(self: Arc<Self>) {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            // Bounds each flush task when Redis stops answering; every request is
            // separately bounded by the (shorter) decision budget.
            .set_response_timeout(Some(RESPONSE_TIMEOUT.max(self.budget)));
        let result = tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await;
        let conn = match result {
            Ok(Ok(conn)) => {
                log::info!("connected to Redis");
                Some(conn)
            }
            Ok(Err(e)) => {
                self.connect_refused
                    .store(e.is_connection_refusal(), Ordering::Relaxed);
                log::debug!("cannot connect to Redis: {e}");
                None
            }
            Err(_) => {
                self.connect_refused.store(false, Ordering::Relaxed);
                log::debug!("cannot connect to Redis: no answer within {CONNECT_TIMEOUT:?}");
                None
            }
        };
        self.connection.finish(conn);
    }

    async fn evaluate(
        self: &Arc<Self>,
        checks: &[LimitCheck<'_>],
        member: &str,
        mode: Mode,
        deadline: Instant,
    ) -> Result<Vec<i64>, LimiterError> {
        let conn = match self.current() {
            Some(conn) => conn,
            None => tokio::time::timeout_at(deadline.into(), self.connection())
                .await
                .unwrap_or(Err(LimiterError::Timeout(self.budget)))?,
        };
        let keys = checks.iter().map(|c| c.key.to_string()).collect();
        let mut args = Vec::with_capacity(3 + 6 * checks.len());
        push_args(&mut args, checks, member, mode);
        let (reply, receive) = oneshot::channel();
        let start_flushing = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.pending.push(Queued {
                keys,
                args,
                deadline,
                reply: Some(reply),
            });
            !std::mem::replace(&mut queue.flushing, true)
        };
        if start_flushing {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.flush_loop(conn).await });
        }
        receive
            .await
            .unwrap_or_else(|_| Err(LimiterError::Io("connection closed".into())))
    }

    /// Sends queued decisions, one pipeline at a time, until the queue is empty.
    async fn flush_loop(self: Arc<Self>, mut conn: MultiplexedConnection) {
        loop {
            let batch = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if queue.pending.is_empty() {
                    queue.flushing = false;
                    return;
                }
                std::mem::take(&mut queue.pending)
            };
            if let Some(current) = self.current() {
                conn = current;
            }
            Arc::clone(&self).send_batch(&mut conn, batch).await;
        }
    }

    /// Sends one batch (one script call per [`MAX_BATCH`] decisions, in one
    /// pipeline) and hands out the replies.
    async fn send_batch(self: Arc<Self>, conn: &mut MultiplexedConnection, batch: Vec<Queued>) {
        // Decisions out of budget are answered now and never sent: they must
        // not consume quota after their client was answered by on_error.
        let now = Instant::now();
        let (late, live): (Vec<Queued>, Vec<Queued>) =
            batch.into_iter().partition(|queued| queued.deadline <= now);
        for mut queued in late {
            queued.answer(Err(LimiterError::Timeout(self.budget)));
        }
        let mut batch: Vec<Queued> = live
            .into_iter()
            .filter(|queued| queued.reply.as_ref().is_some_and(|r| !r.is_closed()))
            .collect();
        // The call may run until its last decision's deadline; each decision
        // is answered by its own (see run_answering_expired).
        let Some(deadline) = batch.iter().map(|q| q.deadline).max() else {
            return;
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut chunks = Vec::with_capacity(batch.len().div_ceil(MAX_BATCH));
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(MAX_BATCH));
            pipe.add_command(self.batch_command(&batch));
            chunks.push(std::mem::replace(&mut batch, rest));
        }
        let call = {
            let (mut conn, pipe) = (conn.clone(), pipe.clone());
            Box::pin(async move {
                pipe.query_async::<Vec<redis::RedisResult<redis::Value>>>(&mut conn)
                    .await
            })
        };
        let Some(mut results) = self.answer_expired_while(call, deadline, &mut chunks).await else {
            return;
        };
        // NOSCRIPT: Redis lost the script (restart, SCRIPT FLUSH). Load it once
        // and run again only the calls that did not execute.
        let lost: Vec<usize> = match &results {
            Ok(values) => values
                .iter()
                .enumerate()
                .filter(|(_, v)| is_noscript(v))
                .map(|(i, _)| i)
                .collect(),
            Err(_) => Vec::new(),
        };
        if !lost.is_empty() {
            log::info!("Redis has no sluice script (restarted?): loading it");
            let mut retry = redis::pipe();
            retry.ignore_errors();
            let commands: Vec<&redis::Cmd> = pipe.cmd_iter().collect();
            for &i in &lost {
                retry.add_command(commands[i].clone());
            }
            let load = tokio::time::timeout_at(deadline.into(), self.script.load_async(conn));
            let reloaded = match load.await {
                Ok(Ok(_)) => self.run(conn, &retry, deadline).await,
                Ok(Err(e)) => Err(self.classify(e)),
                Err(_) => Err(LimiterError::Timeout(self.budget)),
            };
            results = match (results, reloaded) {
                (Ok(mut values), Ok(again)) => {
                    for (&i, value) in lost.iter().zip(again) {
                        values[i] = value;
                    }
                    Ok(values)
                }
                (_, Err(e)) | (Err(e), _) => Err(e),
            };
        }
        match results {
            Ok(values) => {
                for (chunk, value) in chunks.into_iter().zip(values) {
                    self.hand_out(chunk, value);
                }
            }
            Err(e) => {
                for mut queued in chunks.into_iter().flatten() {
                    queued.answer(Err(e.clone()));
                }
            }
        }
    }

    /// Waits for `call` until `deadline` (the latest of its decisions'),
    /// answering each decision whose own deadline passes first with a
    /// timeout: no decision waits past its budget, and none fails because
    /// another member of its batch ran out of budget. Once every decision
    /// has been answered, the call is left to finish in the background
    /// (bounded by the connection's response timeout) so that what Redis
    /// admits late is reconciled; then `None`.
    async fn answer_expired_while(
        self: &Arc<Self>,
        mut call: PendingCall,
        deadline: Instant,
        chunks: &mut Vec<Vec<Queued>>,
    ) -> Option<Result<Vec<redis::RedisResult<redis::Value>>, LimiterError>> {
        loop {
            let next = chunks
                .iter()
                .flatten()
                .filter(|q| q.reply.is_some())
                .map(|q| q.deadline)
                .min();
            let Some(next) = next else {
                let this = Arc::clone(self);
                let chunks = std::mem::take(chunks);
                tokio::spawn(async move {
                    if let Ok(values) = call.await {
                        for (chunk, value) in chunks.into_iter().zip(values) {
                            this.hand_out(chunk, value);
                        }
                    }
                });
                return None;
            };
            tokio::select! {
                biased;
                result = &mut call => return Some(result.map_err(|e| self.classify(e))),
                _ = tokio::time::sleep_until(next.min(deadline).into()) => {
                    let now = Instant::now();
                    for queued in chunks.iter_mut().flatten().filter(|q| q.deadline <= now) {
                        queued.answer(Err(LimiterError::Timeout(self.budget)));
                    }
                }
            }
        }
    }

    /// Gives back what Redis admitted, late, for a decision already answered
    /// by `on_error` (see `reconcile`): `taken_us` is Redis's clock when it
    /// ran it.
    fn reconcile(&self, queued: &Queued, taken_us: i64) {
        let member = queued
            .args
            .first()
            .map(|m| String::from_utf8_lossy(m).into_owned());
        let Some(member) = member else {
            return;
        };
        let refund = Refund::for_verdict(self.ledger.take(&member));
        let mut command = redis::cmd("EVALSHA");
        let mut keys = Vec::new();
        let mut limits = Vec::new();
        for (i, key) in queued.keys.iter().enumerate() {
            let Some(limit) = queued.args.get(3 + 6 * i..9 + 6 * i) else {
                return;
            };
            let lease = limit[0].as_slice() == CONCURRENCY_CODE.as_bytes();
            if refund == Refund::All || lease {
                keys.push(key.as_str());
                limits.push(limit);
            }
        }
        if keys.is_empty() {
            return;
        }
        log::debug!("Redis ran a timed-out decision late: refunding ({refund:?}) for {member}");
        command
            .arg(self.script.get_hash())
            .arg(keys.len())
            .arg(&keys);
        command.arg(member.as_str()).arg("refund").arg(taken_us);
        for limit in limits {
            for arg in limit {
                command.arg(arg.as_slice());
            }
        }
        let Some(mut conn) = self.current() else {
            return;
        };
        tokio::spawn(async move {
            if let Err(e) = command.query_async::<redis::Value>(&mut conn).await {
                log::debug!("refund of a late admission failed (leases expire by themselves): {e}");
            }
        });
    }

    /// `EVALSHA` of the decide script in batch mode for `chunk`.
    fn batch_command(&self, chunk: &[Queued]) -> redis::Cmd {
        let keys: usize = chunk.iter().map(|q| q.keys.len()).sum();
        let mut command = redis::cmd("EVALSHA");
        command.arg(self.script.get_hash()).arg(keys);
        for queued in chunk {
            for key in &queued.keys {
                command.arg(key.as_str());
            }
        }
        command.arg("*").arg(chunk.len());
        for queued in chunk {
            command.arg(queued.keys.len());
            for arg in &queued.args {
                command.arg(arg.as_slice());
            }
        }
        command
    }

    /// Gives each decision of `chunk` its own reply (or error) from the
    /// batch call's reply: one line per decision.
    fn hand_out(&self, chunk: Vec<Queued>, value: redis::RedisResult<redis::Value>) {
        let text = match value {
            Ok(redis::Value::BulkString(text)) => text,
            Ok(other) => {
                let error = LimiterError::Server(format!("unexpected batch reply: {other:?}"));
                for mut queued in chunk {
                    queued.answer(Err(error.clone()));
                }
                return;
            }
            Err(e) => {
                let error = self.classify(e);
                for mut queued in chunk {
                    queued.answer(Err(error.clone()));
                }
                return;
            }
        };
        let mut lines = text.split(|&b| b == b'\n');
        for mut queued in chunk {
            let decoded = match lines.next() {
                Some(line) => parse_batch_line(line),
                None => Err(LimiterError::Server("batch reply too short".into())),
            };
            match (&queued.reply, &decoded) {
                // Answered by on_error already, and Redis admitted it.
                (None, Ok(values)) if values.first() == Some(&1) => {
                    self.reconcile(&queued, values.get(1).copied().unwrap_or(0));
                }
                _ => queued.answer(decoded),
            }
        }
    }

    /// Runs `pipe`, giving up at `deadline` (the earliest of its decisions'):
    /// has already been answered by `on_error` by then, and the flush loop
    /// must not be held up for the requests queued behind it.
    async fn run(
        &self,
        conn: &mut MultiplexedConnection,
        pipe: &redis::Pipeline,
        deadline: Instant,
    ) -> Result<Vec<redis::RedisResult<redis::Value>>, LimiterError> {
        match tokio::time::timeout_at(deadline.into(), pipe.query_async(conn)).await {
            Ok(result) => result.map_err(|e| self.classify(e)),
            Err(_) => Err(LimiterError::Timeout(self.budget)),
        }
    }

    fn classify(&self, error: redis::RedisError) -> LimiterError {
        if error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal() {
            self.drop_connection();
            LimiterError::Io(error.to_string())
        } else if error.is_timeout() {
            LimiterError::Timeout(self.budget)
        } else if error
            .code()
            .is_some_and(|code| UNHEALTHY_CODES.contains(&code))
        {
            LimiterError::Unavailable(error.to_string())
        } else {
            LimiterError::Server(error.to_string())
        }
    }

    /// Reports the outcome of one call to the observer and the circuit breaker.
    fn record(&self, result: &Result<Vec<Decision>, LimiterError>, started: Instant) {
        match result {
            Ok(_) => {
                self.observer.call_succeeded(started.elapsed());
                self.observer.set_up(true);
                if self.circuit.on_success() == Transition::Closed {
                    log::info!("Redis answers again: circuit closed, decisions come from Redis");
                }
            }
            Err(e) => {
                self.observer.call_failed(e);
                let Some(failure) = e.circuit_failure() else {
                    log::warn!("rate-limit decision failed for one key: {e}");
                    return;
                };
                let now = Instant::now();
                if let Transition::Opened(wait) = self.circuit.on_failure(now, started, failure) {
                    log::warn!(
                        "Redis unhealthy ({e}): circuit open for {wait:?}, on_error applies"
                    );
                    self.observer.set_up(false);
                    self.drop_connection();
                }
            }
        }
    }
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

#[async_trait]
impl Limiter for Arc<RedisLimiter> {
    async fn check(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
    ) -> Result<Vec<Decision>, LimiterError> {
        if self.circuit.permit(Instant::now()) == Permit::Reject {
            let error = LimiterError::CircuitOpen;
            self.observer.call_failed(&error);
            return Err(error);
        }
        let started = Instant::now();
        // Answered by started + budget: see "The budget is kept" above.
        let result = self
            .evaluate(checks, member, Mode::Take, started + self.budget)
            .await
            .and_then(|reply| decode_reply(&reply, checks.len()).map(|(d, _)| d));
        self.record(&result, started);
        result
    }

    /// Bounded by the budget; not counted by the circuit (an unreleased lease
    /// only costs its remaining lease time).
    async fn release(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError> {
        if self.circuit.is_open() {
            return Err(LimiterError::CircuitOpen);
        }
        let deadline = Instant::now() + self.budget;
        self.evaluate(checks, member, Mode::Refund { taken_us: 0 }, deadline)
            .await
            .map(|_| ())
    }
}

fn is_noscript(value: &redis::RedisResult<redis::Value>) -> bool {
    matches!(value, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
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

/// One decision's line of a batch reply: its numbers, or `!` and its error.
fn parse_batch_line(line: &[u8]) -> Result<Vec<i64>, LimiterError> {
    if let Some(message) = line.strip_prefix(b"!") {
        let message = String::from_utf8_lossy(message).into_owned();
        let code = message.split(' ').next().unwrap_or("");
        return Err(if UNHEALTHY_CODES.contains(&code) {
            LimiterError::Unavailable(message)
        } else {
            LimiterError::Server(message)
        });
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

fn decode_reply(reply: &[i64], n: usize) -> Result<(Vec<Decision>, i64), LimiterError> {
    if reply.len() != 2 + 4 * n {
        return Err(LimiterError::Server(format!(
            "script returned {} values for {n} keys",
            reply.len()
        )));
    }
    let admitted = reply[0] == 1;
    let micros = |v: i64| Duration::from_micros(v.max(0) as u64);
    let decisions = reply[2..]
        .chunks_exact(4)
        .map(|c| Decision {
            allowed: c[0] == 1,
            remaining: c[1].max(0) as u64,
            reset: micros(c[2]),
            retry_after: if admitted && c[0] == 1 {
                Duration::ZERO
            } else {
                micros(c[3])
            },
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
        ] {
            let check = LimitCheck {
                key: "k",
                limit: 1,
                window: lease,
                cost: 1,
                algorithm,
                shadow: false,
            };
            let mut args: Vec<Vec<u8>> = Vec::new();
            push_args(&mut args, &[check], "m-1", Mode::Take);
            let code: usize = std::str::from_utf8(&args[3]).unwrap().parse().unwrap();
            assert_eq!(lua.get(code - 1), Some(&algorithm.name()), "code {code}");
        }
        assert_eq!(lua.len(), 5);
    }

    #[test]
    fn the_concurrency_code_is_what_push_args_writes() {
        let check = LimitCheck {
            key: "k",
            limit: 1,
            window: Duration::from_secs(1),
            cost: 1,
            algorithm: Algorithm::Concurrency {
                lease: Duration::from_secs(30),
            },
            shadow: false,
        };
        let mut args: Vec<Vec<u8>> = Vec::new();
        push_args(&mut args, &[check], "m-1", Mode::Take);
        assert_eq!(args[3], CONCURRENCY_CODE.as_bytes());
        assert_eq!(args.len(), 3 + 6);
    }

    #[test]
    fn batch_lines() {
        assert_eq!(
            parse_batch_line(b"1 1764000000000000 1 4 10000000 0").unwrap(),
            vec![1, 1_764_000_000_000_000, 1, 4, 10_000_000, 0]
        );
        assert!(matches!(
            parse_batch_line(b"!WRONGTYPE Operation against a key"),
            Err(LimiterError::Server(m)) if m.starts_with("WRONGTYPE")
        ));
        assert!(matches!(
            parse_batch_line(b"!BUSY Redis is busy"),
            Err(LimiterError::Unavailable(_))
        ));
        assert!(parse_batch_line(b"1 x").is_err());
        assert!(parse_batch_line(b"").is_err());
    }
}
