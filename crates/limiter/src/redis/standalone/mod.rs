//! The Redis backend: a multiplexed connection per thread, the decide script
//! (every algorithm, `lua/*.lua`) by `EVALSHA` (reloaded on `NOSCRIPT`), every
//! call bounded by the configured budget.
//!
//! **A lane per thread.** Each thread that decides has its own connection
//! and its own batch queue (a [`Lane`]): the connection's reader, the flush
//! loop and the requests waiting on them all run on the runtime of the
//! thread that decides, so a batch never crosses threads — no wake-up of
//! another thread per batch, no `eventfd` write, no context switch. A
//! Pingora worker with `threads: N` keeps N connections (per Redis node);
//! more threads scale the way the proxy does.
//!
//! [`Limiter::connect`] proves Redis reachable and loads the decide code
//! when the server starts (inside one of its runtimes: a connection made
//! before Pingora starts them would die with a temporary runtime); each
//! worker thread's lane connects on its first decision. One background
//! task per lane connects at a time. Decisions made while the first connect is still
//! running wait for it within the connect budget; after that, requests wait
//! for a reconnect only within their decision budget. Failures feed the [`CircuitBreaker`]: once
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

mod batch;
mod lanes;
mod sentinel;

use crate::leases::MAX_RENEWALS;
use crate::redis::batch_size;
use crate::redis::circuit::{CircuitBreaker, Permit};
use crate::redis::client;
use crate::redis::client::RESPONSE_TIMEOUT;
use crate::redis::deadline::RedisClock;
use crate::redis::reconcile::FallbackLedger;
use crate::redis::wire::{self, decode_reply, push_args, CallForm, Mode, DECIDE_SCRIPT};
use crate::settings::{RedisConfig, RedisTlsConfig};
use crate::sync::Locked;
use crate::Lease;
use crate::{Decision, LimitCheck, Limiter, LimiterError, Link, RedisObserver};
use async_trait::async_trait;
use batch::Queued;
use lanes::Lane;
use redis::aio::MultiplexedConnection;
use sentinel::sentinel_client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A batch call on its way: one reply per script call of the pipeline.
type PendingCall = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = redis::RedisResult<Vec<redis::RedisResult<redis::Value>>>>
            + Send,
    >,
>;

/// The most decisions one script call carries: bounds how long one call
/// holds Redis (a few hundred microseconds at most).
pub const MAX_BATCH: usize = 64;

/// Redis-backed limiter: a cheap handle to one shared state (connection,
/// queue, circuit), cloned into the background tasks that connect and flush.
#[derive(Clone)]
pub struct RedisLimiter(Arc<Shared>);

impl std::ops::Deref for RedisLimiter {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// How a call hands the decide code its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyPassing {
    /// As declared keys (`numkeys` > 0): one Redis server.
    Declared,
    /// As arguments after `@` (`numkeys` 0): a Redis Cluster node, whose
    /// batch spans slots that declared keys may not.
    AsArguments,
}

/// Which server a [`RedisLimiter`] connects to.
enum Target {
    /// The configured URL's (or a cluster node's).
    Direct(redis::Client),
    /// Whichever the sentinels name as the primary when it connects: after a
    /// failover the broken connection is dropped and the next one goes to
    /// the new primary.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

/// What every clone of a [`RedisLimiter`] shares.
pub struct Shared {
    target: Target,
    budget: Duration,
    /// How long connecting (and loading the decide code) may take.
    connect_timeout: Duration,
    keys: KeyPassing,
    /// Where this Redis is, for logs: "at the configured URL" or a node.
    place: String,
    script: redis::Script,
    /// The decide code as a Function library, and its function's name.
    library: (String, String),
    /// How calls run the decide code: chosen by the first connect that
    /// gets Redis's answer to `FUNCTION LOAD`.
    call_form: std::sync::RwLock<CallForm>,
    /// Whether `call_form` was chosen (a lane connecting later, perhaps
    /// during a stall, keeps it).
    form_chosen: AtomicBool,
    /// Each deciding thread's connection and queue.
    lanes: thread_local::ThreadLocal<Arc<Lane>>,
    /// Whether any lane's connect attempt has ended (succeeded or failed):
    /// until then the backend is still starting.
    attempted: AtomicBool,
    /// Whether the last failed connect was refused (nothing listening).
    connect_refused: AtomicBool,
    circuit: CircuitBreaker,
    observer: Arc<dyn RedisObserver>,
    /// The fallback's verdicts on decisions that timed out (see `reconcile`).
    ledger: FallbackLedger,
    /// Where Redis's clock stands, for the batches' deadlines.
    clock: RedisClock,
}

impl RedisLimiter {
    /// Prepares a client for `config.url`, or for the primary the sentinels
    /// name; connects nothing yet.
    pub fn new(
        config: &RedisConfig,
        observer: Arc<dyn RedisObserver>,
    ) -> Result<Self, LimiterError> {
        use redis::IntoConnectionInfo;
        let info = config
            .url
            .as_str()
            .into_connection_info()
            .map_err(|e| LimiterError::Server(format!("invalid Redis URL: {e}")))?;
        let (target, place) = match &config.sentinel {
            Some(sentinel) => (
                Target::Sentinel(tokio::sync::Mutex::new(sentinel_client(
                    sentinel,
                    &info,
                    &config.tls,
                )?)),
                format!("(primary of sentinel master {})", sentinel.master),
            ),
            None => {
                let client =
                    client::client_for(info.set_tcp_settings(client::no_delay()), &config.tls)
                        .map_err(|e| {
                            LimiterError::Server(format!("invalid Redis settings: {e}"))
                        })?;
                (Target::Direct(client), "at the configured URL".into())
            }
        };
        Ok(Self::at(
            target,
            (config.timeout, config.connect_timeout),
            KeyPassing::Declared,
            place,
            observer,
        ))
    }

    /// Prepares a batching client for one Redis Cluster primary at `info`
    /// (see `cluster`); connects nothing yet. Its batches carry their keys
    /// as arguments; a key the node does not serve fails its own decision.
    pub(super) fn for_cluster_node(
        info: redis::ConnectionInfo,
        tls: &RedisTlsConfig,
        budgets: (Duration, Duration),
        node: &str,
        observer: Arc<dyn RedisObserver>,
    ) -> Result<Self, LimiterError> {
        let keys = KeyPassing::AsArguments;
        let client = client::client_for(info.set_tcp_settings(client::no_delay()), tls)
            .map_err(|e| LimiterError::Server(format!("invalid Redis settings: {e}")))?;
        Ok(Self::at(
            Target::Direct(client),
            budgets,
            keys,
            node.into(),
            observer,
        ))
    }

    /// `budgets`: one decision's, and one connect's.
    fn at(
        target: Target,
        (budget, connect_timeout): (Duration, Duration),
        keys: KeyPassing,
        place: String,
        observer: Arc<dyn RedisObserver>,
    ) -> Self {
        let script = redis::Script::new(DECIDE_SCRIPT);
        Self(Arc::new(Shared {
            target,
            budget,
            connect_timeout,
            keys,
            place,
            library: wire::function_library(script.get_hash()),
            call_form: std::sync::RwLock::new(CallForm::Script(script.get_hash().to_string())),
            form_chosen: AtomicBool::new(false),
            script,
            lanes: thread_local::ThreadLocal::new(),
            attempted: AtomicBool::new(false),
            connect_refused: AtomicBool::new(false),
            circuit: client::circuit_for(budget, connect_timeout),
            observer,
            ledger: FallbackLedger::default(),
            clock: RedisClock::default(),
        }))
    }

    async fn evaluate(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
        mode: Mode,
        deadline: Instant,
    ) -> Result<Vec<i64>, LimiterError> {
        let own = self.lane();
        let (lane, conn, deadline) = match own.connection.current() {
            Some(conn) => (own, conn, deadline),
            None => match self.connected_lane() {
                Some((lane, conn)) => {
                    self.connect_soon(&own);
                    (lane, conn, deadline)
                }
                None => {
                    let (conn, deadline) = self.connected_by(&own, deadline).await?;
                    (own, conn, deadline)
                }
            },
        };
        let keys = checks.iter().map(|c| c.key.to_string()).collect();
        let mut args = Vec::with_capacity(3 + 6 * checks.len());
        push_args(&mut args, checks, member, mode);
        let (reply, receive) = oneshot::channel();
        let start_flushing = {
            let mut queue = lane.queue.locked();
            queue.pending.push(Queued {
                keys,
                args,
                deadline,
                reply: Some(reply),
                batch: 0,
                skippable: false,
            });
            !std::mem::replace(&mut queue.flushing, true)
        };
        if start_flushing {
            let this = self.clone();
            tokio::spawn(async move { this.flush_loop(lane, conn).await });
        }
        match receive.await {
            Ok((result, batch)) => {
                batch_size::note(batch);
                result
            }
            Err(_) => Err(LimiterError::Io("connection closed".into())),
        }
    }

    /// A connection for a decision due by `deadline`, which has none yet.
    /// While the first connect is still running (the start, or a reload that
    /// changed the Redis settings), it is waited for within the connect
    /// budget and the decision's own budget starts once it is there: falling
    /// back meanwhile would decide in process what Redis is about to decide.
    /// Later reconnects are waited for only until `deadline`.
    async fn connected_by(
        &self,
        lane: &Arc<Lane>,
        deadline: Instant,
    ) -> Result<(MultiplexedConnection, Instant), LimiterError> {
        if self.attempted.load(Ordering::Acquire) {
            return tokio::time::timeout_at(deadline.into(), self.lane_connection(lane))
                .await
                .unwrap_or(Err(LimiterError::Timeout(self.budget)))
                .map(|conn| (conn, deadline));
        }
        let conn = tokio::time::timeout(self.connect_timeout, self.lane_connection(lane))
            .await
            .unwrap_or(Err(LimiterError::Timeout(self.connect_timeout)))?;
        Ok((conn, deadline.max(Instant::now() + self.budget)))
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

    /// Classifies a Redis error; one that broke the connection drops it,
    /// so the next call reconnects.
    fn classify(&self, error: redis::RedisError) -> LimiterError {
        let classified = client::classify(&error, self.budget);
        // A primary turned replica (a failover) answers READONLY: the next
        // connection asks the sentinels again.
        let demoted = error.code() == Some("READONLY");
        if demoted || matches!(classified, LimiterError::Io(_) | LimiterError::Refused(_)) {
            self.drop_connection();
        }
        classified
    }

    /// Reports the outcome of one call to the observer and the circuit breaker.
    fn record(&self, result: &Result<Vec<Decision>, LimiterError>, started: Instant) {
        let (observer, circuit) = (&*self.observer, &self.circuit);
        match result {
            Ok(_) => client::record_success(observer, circuit, started.elapsed(), &self.place),
            Err(e) => {
                if client::record_failure(observer, circuit, e, started, &self.place) {
                    self.drop_connection();
                }
            }
        }
    }
}

#[async_trait]
impl Limiter for RedisLimiter {
    async fn connect(&self) -> Result<(), LimiterError> {
        if self.current().is_some() {
            return Ok(());
        }
        tokio::time::timeout(self.connect_timeout, self.connection())
            .await
            .unwrap_or(Err(LimiterError::Timeout(self.connect_timeout)))
            .map(|_| ())
    }

    fn link(&self) -> Link {
        if self
            .lanes
            .iter()
            .any(|lane| lane.connection.current().is_some())
        {
            Link::Connected
        } else if self.attempted.load(Ordering::Acquire) {
            Link::Unreachable
        } else {
            Link::Starting
        }
    }

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

    /// One script call per [`MAX_RENEWALS`] leases, on the shared
    /// connection; bounded by the response timeout (a renewal is not on any
    /// request's path); not counted by the circuit, and not sent while it
    /// is open (the leases then end after `lease`, as a dead instance's).
    async fn renew(&self, leases: &[Lease]) -> Result<(), LimiterError> {
        if self.circuit.is_open() {
            return Err(LimiterError::CircuitOpen);
        }
        let deadline = Instant::now() + RESPONSE_TIMEOUT.max(self.budget);
        let mut conn = match self.current() {
            Some(conn) => conn,
            None => tokio::time::timeout_at(deadline.into(), self.connection())
                .await
                .unwrap_or(Err(LimiterError::Timeout(self.budget)))?,
        };
        for chunk in leases.chunks(MAX_RENEWALS) {
            let command = self.renewal_command(chunk);
            let call = command.query_async::<redis::Value>(&mut conn);
            let result = match tokio::time::timeout_at(deadline.into(), call).await {
                Ok(Err(e)) if wire::lost_code(&e) => {
                    self.reload_code(&mut conn).await?;
                    let again = self.renewal_command(chunk);
                    tokio::time::timeout_at(deadline.into(), again.query_async(&mut conn)).await
                }
                other => other,
            };
            match result {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(self.classify(e)),
                Err(_) => return Err(LimiterError::Timeout(RESPONSE_TIMEOUT)),
            }
        }
        Ok(())
    }

    /// Bounded by the budget, like a decision.
    async fn peek(&self, checks: &[LimitCheck<'_>]) -> Result<Vec<Decision>, LimiterError> {
        let deadline = Instant::now() + self.budget;
        let reply = self.evaluate(checks, "peek", Mode::Peek, deadline).await?;
        decode_reply(&reply, checks.len()).map(|(d, _)| d)
    }

    /// Bounded by the budget, like a decision.
    async fn reset(&self, checks: &[LimitCheck<'_>]) -> Result<(), LimiterError> {
        let deadline = Instant::now() + self.budget;
        self.evaluate(checks, "reset", Mode::Reset, deadline)
            .await
            .map(|_| ())
    }

    /// Bounded by the budget, like a decision.
    async fn record(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError> {
        if self.circuit.is_open() {
            return Err(LimiterError::CircuitOpen);
        }
        let deadline = Instant::now() + self.budget;
        self.evaluate(checks, member, Mode::Add, deadline)
            .await
            .map(|_| ())
    }

    /// One call per distinct time (the checks of one decision share
    /// Redis's clock reading: one call); bounded by the budget.
    async fn refund(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
        taken_us: &[i64],
    ) -> Result<(), LimiterError> {
        if self.circuit.is_open() {
            return Err(LimiterError::CircuitOpen);
        }
        let deadline = Instant::now() + self.budget;
        let mut times: Vec<i64> = taken_us.to_vec();
        times.sort_unstable();
        times.dedup();
        for at in times {
            let same: Vec<LimitCheck<'_>> = checks
                .iter()
                .zip(taken_us)
                .filter(|(_, t)| **t == at)
                .map(|(c, _)| *c)
                .collect();
            let mode = Mode::Refund { taken_us: at };
            self.evaluate(&same, member, mode, deadline).await?;
        }
        Ok(())
    }

    async fn query(
        &self,
        cmd: redis::Cmd,
        timeout: Duration,
    ) -> Result<redis::Value, LimiterError> {
        let mut conn = self.connection().await?;
        client::query_within(&mut conn, &cmd, timeout, |e| self.classify(e)).await
    }

    /// False while the circuit is open (Redis found unhealthy, not called).
    fn is_healthy(&self) -> bool {
        !self.circuit.is_open()
    }

    /// Remembered for when Redis runs (or skips) the timed-out decision
    /// late; if it skipped it already and the fallback admitted it, its
    /// units are written now (see `reconcile`).
    fn note_fallback(&self, member: &str, admitted: bool) {
        if let Some(write) = self.ledger.record(member, admitted) {
            match self.any_connection() {
                Some(conn) => self.send_write(write, &conn),
                None => log::warn!(
                    "no Redis connection to write a request the fallback admitted during a stall"
                ),
            }
        }
    }
}
