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
mod sentinel;

use crate::leases::MAX_RENEWALS;
use crate::redis::batch_size;
use crate::redis::circuit::{CircuitBreaker, Permit};
use crate::redis::client;
use crate::redis::client::RESPONSE_TIMEOUT;
use crate::redis::deadline::RedisClock;
use crate::redis::lazy::LazyConnection;
use crate::redis::reconcile::FallbackLedger;
use crate::redis::wire::{self, decode_reply, push_args, CallForm, Mode, DECIDE_SCRIPT};
use crate::settings::{RedisConfig, RedisTlsConfig};
use crate::sync::Locked;
use crate::sync::ReadWriteLocked;
use crate::Lease;
use crate::{Decision, LimitCheck, Limiter, LimiterError, Link, RedisObserver};
use async_trait::async_trait;
use batch::{Queue, Queued};
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
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

/// How [`RedisLimiter::load_function`] says Redis did not answer in time.
const NO_ANSWER: &str = "no answer within";

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

/// One thread's connection to this Redis and its queue of decisions to
/// send on it. Only that thread's decisions use it, so its flush loop and
/// the connection's reader run where the decisions are made.
pub(super) struct Lane {
    connection: LazyConnection<MultiplexedConnection>,
    queue: std::sync::Mutex<Queue>,
}

impl Lane {
    fn new() -> Self {
        Self {
            connection: LazyConnection::new(),
            queue: std::sync::Mutex::new(Queue::default()),
        }
    }
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

    /// This thread's lane (made on its first use).
    fn lane(&self) -> Arc<Lane> {
        self.lanes.get_or(|| Arc::new(Lane::new())).clone()
    }

    /// This thread's connection, if it has one.
    fn current(&self) -> Option<MultiplexedConnection> {
        self.lanes.get()?.connection.current()
    }

    /// Some established connection: this thread's, or else any lane's.
    fn any_connection(&self) -> Option<MultiplexedConnection> {
        self.current()
            .or_else(|| self.lanes.iter().find_map(|lane| lane.connection.current()))
    }

    /// Forgets every lane's connection: what broke one (Redis gone, a
    /// failover) broke them all; each lane connects again on its next call.
    fn drop_connection(&self) {
        for lane in self.lanes.iter() {
            lane.connection.clear();
        }
    }

    /// Another lane with a connection, and that connection: what a thread
    /// whose own lane is still connecting sends on meanwhile, so that a
    /// decision never waits for (or falls back because of) a connect that
    /// another thread no longer needs.
    fn connected_lane(&self) -> Option<(Arc<Lane>, MultiplexedConnection)> {
        self.lanes
            .iter()
            .find_map(|lane| Some((lane.clone(), lane.connection.current()?)))
    }

    /// Starts connecting `lane` in the background (on this thread's
    /// runtime), unless it is connected or connecting.
    fn connect_soon(&self, lane: &Arc<Lane>) {
        let (this, dialing) = (self.clone(), lane.clone());
        lane.connection.start(move || {
            tokio::spawn(async move { this.dial(dialing).await });
        });
    }

    /// This thread's connection, connecting (once, in the background) if needed.
    async fn connection(&self) -> Result<MultiplexedConnection, LimiterError> {
        self.lane_connection(&self.lane()).await
    }

    /// `lane`'s connection, connecting it (once, in the background, on this
    /// thread's runtime) if needed.
    async fn lane_connection(
        &self,
        lane: &Arc<Lane>,
    ) -> Result<MultiplexedConnection, LimiterError> {
        let (this, dialing) = (self.clone(), lane.clone());
        let conn = lane
            .connection
            .get(move || {
                tokio::spawn(async move { this.dial(dialing).await });
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

    /// One connect attempt of `lane`, ended with [`LazyConnection::finish`].
    async fn dial(self, lane: Arc<Lane>) {
        let connect_timeout = self.connect_timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Bounds each flush task when Redis stops answering; every request is
            // separately bounded by the (shorter) decision budget.
            .set_response_timeout(Some(RESPONSE_TIMEOUT.max(self.budget)));
        let result = tokio::time::timeout(connect_timeout, async {
            let client = match &self.target {
                Target::Direct(client) => client.clone(),
                Target::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
            };
            let conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok::<_, redis::RedisError>((conn, client.get_connection_info().addr().to_string()))
        })
        .await;
        let conn = match result {
            Ok(Ok((mut conn, addr))) => {
                log::info!("connected to Redis {addr} {}", self.place);
                self.choose_call_form(&mut conn).await;
                Some(conn)
            }
            Ok(Err(e)) => {
                self.connect_refused
                    .store(e.is_connection_refusal(), Ordering::Relaxed);
                client::connect_failed(&self.place, &e);
                None
            }
            Err(_) => {
                self.connect_refused.store(false, Ordering::Relaxed);
                log::debug!("cannot connect to Redis: no answer within {connect_timeout:?}");
                None
            }
        };
        self.observer.set_up(conn.is_some());
        self.attempted.store(true, Ordering::Release);
        lane.connection.finish(conn);
    }

    /// Loads the decide code as a Redis Function where the server has them
    /// (Redis 7 and later) and calls it with `FCALL` from then on; otherwise
    /// (an older server, `FUNCTION` disabled or denied by an ACL) calls go on
    /// as `EVALSHA` of the script. Either form decides alike. Chosen once,
    /// by the first connect Redis answers; a `FUNCTION LOAD` that gets no
    /// answer (a stall) chooses nothing, and a later connect asks again.
    async fn choose_call_form(&self, conn: &mut MultiplexedConnection) {
        if self.form_chosen.load(Ordering::Acquire) {
            return;
        }
        let form = match self.load_function(conn).await {
            Ok(()) => CallForm::Function(self.library.1.clone()),
            Err(e) if e.starts_with(NO_ANSWER) => {
                log::info!(
                    "Redis did not answer FUNCTION LOAD ({e}): asking again on the next connect"
                );
                return;
            }
            Err(e) => {
                log::info!(
                    "Redis Functions not used ({e}): calling the decide script with EVALSHA"
                );
                CallForm::Script(self.script.get_hash().to_string())
            }
        };
        *self.call_form.write_locked() = form;
        self.form_chosen.store(true, Ordering::Release);
    }

    /// `FUNCTION LOAD` of the library; one already loaded is as good.
    async fn load_function(&self, conn: &mut MultiplexedConnection) -> Result<(), String> {
        let mut command = redis::cmd("FUNCTION");
        command.arg("LOAD").arg(self.library.0.as_str());
        let load = command.query_async::<redis::Value>(conn);
        match tokio::time::timeout(self.connect_timeout, load).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if e.to_string().contains("already exists") => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("{NO_ANSWER} {:?}", self.connect_timeout)),
        }
    }

    /// Loads the decide code again in the form calls use (Redis lost it).
    async fn reload_code(&self, conn: &mut MultiplexedConnection) -> Result<(), LimiterError> {
        let form = self.call_form.read_locked().clone();
        match form {
            CallForm::Function(_) => self.load_function(conn).await.map_err(LimiterError::Server),
            CallForm::Script(_) => self
                .script
                .load_async(conn)
                .await
                .map(|_| ())
                .map_err(|e| self.classify(e)),
        }
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
