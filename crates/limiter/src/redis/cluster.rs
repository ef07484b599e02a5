//! The Redis Cluster backend (`limiter.redis.cluster`).
//!
//! Every limit's key carries a hash tag over all of it (see `keys`), so one
//! key lives in one slot on one primary. The slot → primary map comes from
//! `CLUSTER SLOTS`.
//!
//! **Per-node batches.** A request whose keys all live on one primary (every
//! request with one limit, and most with several) is decided by that node's
//! batching client, exactly as on a single Redis (see `redis`): concurrent
//! decisions for the node share one call of the decide code, with the keys
//! carried as arguments (declared keys would have to share one slot), each
//! decision atomic and answered on its own. The code is loaded on each
//! primary as a Redis Function where the node has them, else as a script.
//! A key the node no longer serves (its slot moved) fails only its own
//! decision, which is then decided on the routed path below, and the map is
//! reloaded.
//!
//! **The routed path.** A request whose keys span primaries is decided one
//! script per key, in order, through the cluster client (which follows
//! `MOVED`/`ASK`); if one denies, the units the earlier ones took are
//! refunded (the script's refund mode, per algorithm). Shadow limits are
//! asked too but never stop the request. Between the take and the refund
//! the other limits are briefly stricter than exact, never looser.
//!
//! Each primary has its own circuit breaker: a lost shard sends its keys to
//! `on_error` while the other shards keep exact limiting. The slot map is
//! reloaded whenever a node fails (at most once a second).

use crate::redis::circuit::{CircuitBreaker, Permit};
use crate::redis::client;
use crate::redis::lazy::LazyConnection;
use crate::redis::slots::{key_slot, parse_cluster_slots, SlotRange};
use crate::redis::standalone::RedisLimiter;
use crate::redis::wire::{parse_reply, push_args, Mode, DECIDE_SCRIPT};
use crate::settings::RedisTlsConfig;
use crate::sync::{Locked, ReadWriteLocked};
use crate::Lease;
use crate::{Decision, LimitCheck, Limiter, LimiterError, Link, RedisObserver};
use async_trait::async_trait;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Redis Cluster limiter: a cheap handle to one shared state (connection,
/// slot map, circuits), cloned into its background tasks.
#[derive(Clone)]
pub struct ClusterLimiter(Arc<Shared>);

impl std::ops::Deref for ClusterLimiter {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What every clone of a [`ClusterLimiter`] shares.
pub struct Shared {
    client: ClusterClient,
    /// The first seed's settings (password, user), for node connections.
    seed: redis::ConnectionInfo,
    /// `limiter.redis.tls`, for node connections over TLS.
    tls: RedisTlsConfig,
    budget: Duration,
    /// How long connecting (and loading the decide code) may take.
    connect_timeout: Duration,
    script: redis::Script,
    connection: LazyConnection<ClusterConnection>,
    slots: RwLock<Vec<SlotRange>>,
    /// The batching client of each primary, by `host:port`.
    nodes: Mutex<HashMap<String, RedisLimiter>>,
    /// The routed path's circuit of each primary.
    circuits: Mutex<HashMap<String, Arc<CircuitBreaker>>>,
    observer: Arc<dyn RedisObserver>,
    /// When the slot map was last reloaded after a failure (ms since
    /// `epoch`), or [`NEVER`].
    reloaded_ms: AtomicU64,
    epoch: Instant,
}

/// `reloaded_ms` before the first reload.
const NEVER: u64 = u64::MAX;

impl ClusterLimiter {
    /// Prepares a cluster client for the seed `nodes`, each decision within
    /// `budget` and each connect within `connect_timeout`; connects nothing yet.
    pub fn new(
        nodes: &[String],
        tls: &RedisTlsConfig,
        (budget, connect_timeout): (Duration, Duration),
        observer: Arc<dyn RedisObserver>,
    ) -> Result<Self, LimiterError> {
        use redis::IntoConnectionInfo;
        let seed = nodes
            .first()
            .ok_or_else(|| LimiterError::Server("no Redis Cluster nodes".into()))?
            .as_str()
            .into_connection_info()
            .map_err(|e| LimiterError::Server(format!("invalid Redis Cluster node: {e}")))?;
        client::ensure_tls_provider();
        let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(connect_timeout)
            .response_timeout(budget.max(Duration::from_millis(100)))
            .retries(1)
            .tcp_settings(client::no_delay());
        if let Some(certificates) = client::tls_certificates(tls) {
            builder = builder.certs(certificates);
        }
        let client = builder
            .build()
            .map_err(|e| LimiterError::Server(format!("invalid Redis Cluster nodes: {e}")))?;
        Ok(Self(Arc::new(Shared {
            client,
            seed,
            tls: tls.clone(),
            budget,
            connect_timeout,
            script: redis::Script::new(DECIDE_SCRIPT),
            connection: LazyConnection::new(),
            slots: RwLock::new(Vec::new()),
            nodes: Mutex::new(HashMap::new()),
            circuits: Mutex::new(HashMap::new()),
            observer,
            reloaded_ms: AtomicU64::new(NEVER),
            epoch: Instant::now(),
        })))
    }

    /// The primary serving every key of `checks`, if they share one and the
    /// slot map knows it.
    fn single_node(&self, checks: &[LimitCheck<'_>]) -> Option<String> {
        let (first, rest) = checks.split_first()?;
        let node = self.node_of(first.key)?;
        rest.iter()
            .all(|check| self.node_of(check.key).as_deref() == Some(node.as_str()))
            .then_some(node)
    }

    /// The batching client of `node` (`host:port`), made on first use.
    fn node_limiter(&self, node: &str) -> Option<RedisLimiter> {
        let mut nodes = self.nodes.locked();
        if let Some(limiter) = nodes.get(node) {
            return Some(limiter.clone());
        }
        let (host, port) = node.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let addr = match self.seed.addr() {
            redis::ConnectionAddr::Tcp(..) => redis::ConnectionAddr::Tcp(host.to_string(), port),
            redis::ConnectionAddr::TcpTls { insecure, .. } => redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => return None,
        };
        let info = self.seed.clone().set_addr(addr);
        let limiter = RedisLimiter::for_cluster_node(
            info,
            &self.tls,
            (self.budget, self.connect_timeout),
            &format!("node {node}"),
            Arc::clone(&self.observer),
        )
        .ok()?;
        nodes.insert(node.to_string(), limiter.clone());
        Some(limiter)
    }

    /// Reloads the slot map in the background after a failure, at most
    /// once a second (a lost node fails many requests at once).
    fn reload_slots_soon(&self) {
        let now_ms = self.epoch.elapsed().as_millis() as u64;
        let last = self.reloaded_ms.load(Ordering::Relaxed);
        if (last != NEVER && now_ms.saturating_sub(last) < 1000)
            || self
                .reloaded_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        if let Some(mut conn) = self.current() {
            let this = self.clone();
            tokio::spawn(async move { this.refresh_slots(&mut conn).await });
        }
    }

    fn current(&self) -> Option<ClusterConnection> {
        self.connection.current()
    }

    async fn connection(&self) -> Result<ClusterConnection, LimiterError> {
        let this = self.clone();
        self.connection
            .get(move || {
                tokio::spawn(async move { this.dial().await });
            })
            .await
            .ok_or_else(|| LimiterError::Io("cannot connect to the Redis Cluster".into()))
    }

    /// One connect attempt (and the slot map), ended with
    /// [`LazyConnection::finish`].
    async fn dial(self) {
        let connect_timeout = self.connect_timeout;
        let conn =
            match tokio::time::timeout(connect_timeout, self.client.get_async_connection()).await {
                Ok(Ok(mut conn)) => {
                    log::info!("connected to the Redis Cluster");
                    self.refresh_slots(&mut conn).await;
                    Some(conn)
                }
                Ok(Err(e)) => {
                    client::connect_failed("(cluster)", &e);
                    None
                }
                Err(_) => {
                    log::debug!("cannot connect to the Redis Cluster within {connect_timeout:?}");
                    None
                }
            };
        self.connection.finish(conn);
    }

    /// Reloads the slot → primary map from `CLUSTER SLOTS`.
    async fn refresh_slots(&self, conn: &mut ClusterConnection) {
        let reply = tokio::time::timeout(
            self.connect_timeout,
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<redis::Value>(conn),
        )
        .await;
        match reply {
            Ok(Ok(value)) => {
                let ranges = parse_cluster_slots(&value);
                if !ranges.is_empty() {
                    self.nodes
                        .locked()
                        .retain(|node, _| ranges.iter().any(|r| &r.node == node));
                    *self.slots.write_locked() = ranges;
                }
            }
            Ok(Err(e)) => log::debug!("CLUSTER SLOTS failed: {e}"),
            Err(_) => log::debug!("CLUSTER SLOTS timed out"),
        }
    }

    /// The primary serving `key`, as the slot map last said.
    fn node_of(&self, key: &str) -> Option<String> {
        let slot = key_slot(key.as_bytes());
        let slots = self.slots.read_locked();
        slots
            .iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .map(|r| r.node.clone())
    }

    fn circuit(&self, node: &str) -> Arc<CircuitBreaker> {
        let mut circuits = self.circuits.locked();
        Arc::clone(
            circuits.entry(node.to_string()).or_insert_with(|| {
                Arc::new(client::circuit_for(self.budget, self.connect_timeout))
            }),
        )
    }

    /// Reports a failed call to `node`; when that opens its circuit, the
    /// slot map is refreshed (the slots may have moved to a replica).
    fn record_failure(&self, node: &str, error: &LimiterError) {
        let circuit = self.circuit(node);
        let started = Instant::now();
        if client::record_failure(&*self.observer, &circuit, error, started, node) {
            self.reload_slots_soon();
        }
    }

    /// Runs the script on one key (one slot) within `deadline`.
    async fn call(
        &self,
        conn: &ClusterConnection,
        check: &LimitCheck<'_>,
        member: &str,
        mode: Mode,
        deadline: Instant,
    ) -> Result<redis::Value, LimiterError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.key(check.key);
        push_args(&mut invocation, std::slice::from_ref(check), member, mode);
        let mut call_conn = conn.clone();
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(
            left,
            invocation.invoke_async::<redis::Value>(&mut call_conn),
        )
        .await
        {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(client::classify(&e, self.budget)),
            Err(_) => Err(LimiterError::Timeout(self.budget)),
        }
    }

    /// Gives back, in the background, the units this request took.
    fn refund(&self, conn: &ClusterConnection, taken: Vec<Taken>, member: &str) {
        if taken.is_empty() {
            return;
        }
        let this = self.clone();
        let conn = conn.clone();
        let member = member.to_string();
        tokio::spawn(async move {
            for t in taken {
                let check = LimitCheck {
                    key: &t.key,
                    limit: t.limit,
                    window: t.window,
                    cost: t.cost,
                    algorithm: t.algorithm,
                    shadow: t.shadow,
                    block: t.block,
                    deferred: t.deferred,
                    max_delay: t.max_delay,
                };
                let deadline = Instant::now() + this.connect_timeout;
                let mode = Mode::Refund { taken_us: t.at_us };
                if this
                    .call(&conn, &check, &member, mode, deadline)
                    .await
                    .is_err()
                {
                    log::warn!(
                        "could not refund a unit of {}: it stays taken until the limit frees it",
                        t.key
                    );
                }
            }
        });
    }

    async fn decide(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
        deadline: Instant,
    ) -> Result<Vec<Decision>, LimiterError> {
        let conn = self.connection().await?;
        let nodes: Vec<String> = checks
            .iter()
            .map(|c| self.node_of(c.key).unwrap_or_else(|| "unknown".into()))
            .collect();
        for node in &nodes {
            if self.circuit(node).permit(Instant::now()) == Permit::Reject {
                let error = LimiterError::CircuitOpen;
                self.observer.call_failed(&error);
                return Err(error);
            }
        }
        let mut decisions = Vec::with_capacity(checks.len());
        let mut taken: Vec<Taken> = Vec::new();
        let mut denied = false;
        for (check, node) in checks.iter().zip(&nodes) {
            let reply = self
                .call(&conn, check, member, Mode::Take, deadline)
                .await
                .and_then(|value| parse_reply(value, 1));
            match reply {
                Ok((mut one, now)) => {
                    client::circuit_success(&self.circuit(node), node);
                    let decision = one.remove(0);
                    if decision.allowed {
                        taken.push(Taken {
                            key: check.key.to_string(),
                            limit: check.limit,
                            window: check.window,
                            cost: check.cost,
                            algorithm: check.algorithm,
                            shadow: check.shadow,
                            block: check.block,
                            deferred: check.deferred,
                            max_delay: check.max_delay,
                            at_us: now,
                        });
                    } else if !check.shadow {
                        denied = true;
                    }
                    decisions.push(decision);
                    if denied {
                        break;
                    }
                }
                Err(e) => {
                    self.record_failure(node, &e);
                    self.refund(&conn, taken, member);
                    return Err(e);
                }
            }
        }
        if denied {
            self.refund(&conn, taken, member);
            // Limits after the denying one were not asked: report them as
            // admitting, with nothing consumed.
            for check in &checks[decisions.len()..] {
                decisions.push(Decision {
                    allowed: true,
                    remaining: check.limit,
                    reset: Duration::ZERO,
                    retry_after: Duration::ZERO,
                    taken_us: 0,
                });
            }
        }
        Ok(decisions)
    }
}

/// Units one limit took for a request, to refund if a later limit denies.
struct Taken {
    key: String,
    limit: u64,
    window: Duration,
    cost: u64,
    algorithm: crate::Algorithm,
    shadow: bool,
    block: Duration,
    deferred: bool,
    max_delay: Duration,
    at_us: i64,
}

#[async_trait]
impl Limiter for ClusterLimiter {
    /// Connects to the cluster (and reads its slot map), then to every
    /// primary the map names, loading the decide code on each; all within
    /// the connect budget.
    async fn connect(&self) -> Result<(), LimiterError> {
        let within = self.connect_timeout;
        tokio::time::timeout(within, self.connection())
            .await
            .unwrap_or(Err(LimiterError::Timeout(within)))?;
        let primaries: Vec<String> = {
            let slots = self.slots.read_locked();
            let mut nodes: Vec<String> = slots.iter().map(|r| r.node.clone()).collect();
            nodes.sort();
            nodes.dedup();
            nodes
        };
        let mut connects = tokio::task::JoinSet::new();
        for node in primaries.iter().filter_map(|node| self.node_limiter(node)) {
            connects.spawn(async move { node.connect().await });
        }
        let mut result = Ok(());
        while let Some(joined) = connects.join_next().await {
            if let Ok(Err(e)) = joined {
                result = Err(e);
            }
        }
        result
    }

    /// Connected once the cluster connection is (a primary that is not
    /// only sends its keys to `on_error`, as its circuit says).
    fn link(&self) -> Link {
        self.connection.link()
    }

    async fn check(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
    ) -> Result<Vec<Decision>, LimiterError> {
        let started = Instant::now();
        let mut deadline = started + self.budget;
        if !self.connection.attempted() {
            // The first connect is running (the start): its map is waited
            // for within the connect budget, and the decision's own budget
            // starts then, rather than falling back meanwhile.
            let _ = tokio::time::timeout(self.connect_timeout, self.connection()).await;
            deadline = deadline.max(Instant::now() + self.budget);
        } else if self.slots.read_locked().is_empty() {
            // The map comes with a connection: wait for it (within the
            // budget) rather than send the first decisions one by one.
            let _ = tokio::time::timeout_at(deadline.into(), self.connection()).await;
        }
        if let Some(node) = self.single_node(checks) {
            if let Some(limiter) = self.node_limiter(&node) {
                match limiter.check(checks, member).await {
                    // The slot moved: decided on the routed path below.
                    Err(e) if is_misrouted(&e) => self.reload_slots_soon(),
                    Err(e) => {
                        if e.circuit_failure().is_some() {
                            self.reload_slots_soon();
                        }
                        return Err(e);
                    }
                    Ok(decisions) => return Ok(decisions),
                }
            }
        }
        let result =
            match tokio::time::timeout_at(deadline.into(), self.decide(checks, member, deadline))
                .await
            {
                Ok(result) => result,
                Err(_) => {
                    // Not attributable to one node (connecting, or the map is stale).
                    let error = LimiterError::Timeout(self.budget);
                    self.observer.call_failed(&error);
                    Err(error)
                }
            };
        if result.is_ok() {
            self.observer.call_succeeded(started.elapsed());
            self.observer.set_up(true);
        }
        result
    }

    async fn release(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError> {
        if let Some(limiter) = self.single_node(checks).and_then(|n| self.node_limiter(&n)) {
            match limiter.release(checks, member).await {
                Err(e) if is_misrouted(&e) => self.reload_slots_soon(),
                other => return other,
            }
        }
        let conn = self.current().ok_or(LimiterError::CircuitOpen)?;
        let deadline = Instant::now() + self.budget;
        for check in checks {
            self.call(&conn, check, member, Mode::Refund { taken_us: 0 }, deadline)
                .await?;
        }
        Ok(())
    }

    /// One call per primary that holds some of `leases` (its batching
    /// client's); a lease whose primary is not known yet is not renewed.
    async fn renew(&self, leases: &[Lease]) -> Result<(), LimiterError> {
        let mut by_node: HashMap<String, Vec<Lease>> = HashMap::new();
        for lease in leases {
            if let Some(node) = self.node_of(&lease.key) {
                by_node.entry(node).or_default().push(lease.clone());
            }
        }
        let mut result = Ok(());
        for (node, leases) in by_node {
            let Some(limiter) = self.node_limiter(&node) else {
                continue;
            };
            if let Err(e) = limiter.renew(&leases).await {
                result = Err(e);
            }
        }
        result
    }

    /// One routed call per key.
    async fn peek(&self, checks: &[LimitCheck<'_>]) -> Result<Vec<Decision>, LimiterError> {
        let conn = self.connection().await?;
        let deadline = Instant::now() + self.budget;
        let mut decisions = Vec::with_capacity(checks.len());
        for check in checks {
            let reply = self
                .call(&conn, check, "peek", Mode::Peek, deadline)
                .await?;
            decisions.push(parse_reply(reply, 1)?.0.remove(0));
        }
        Ok(decisions)
    }

    /// One routed call per key.
    async fn reset(&self, checks: &[LimitCheck<'_>]) -> Result<(), LimiterError> {
        let conn = self.connection().await?;
        let deadline = Instant::now() + self.budget;
        for check in checks {
            self.call(&conn, check, "reset", Mode::Reset, deadline)
                .await?;
        }
        Ok(())
    }

    /// On the key's primary (per node, or routed per key).
    async fn refund(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
        taken_us: &[i64],
    ) -> Result<(), LimiterError> {
        if let Some(limiter) = self.single_node(checks).and_then(|n| self.node_limiter(&n)) {
            match limiter.refund(checks, member, taken_us).await {
                Err(e) if is_misrouted(&e) => self.reload_slots_soon(),
                other => return other,
            }
        }
        let conn = self.current().ok_or(LimiterError::CircuitOpen)?;
        let deadline = Instant::now() + self.budget;
        for (check, &at) in checks.iter().zip(taken_us) {
            let mode = Mode::Refund { taken_us: at };
            self.call(&conn, check, member, mode, deadline).await?;
        }
        Ok(())
    }

    async fn record(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError> {
        if let Some(limiter) = self.single_node(checks).and_then(|n| self.node_limiter(&n)) {
            match limiter.record(checks, member).await {
                Err(e) if is_misrouted(&e) => self.reload_slots_soon(),
                other => return other,
            }
        }
        let conn = self.current().ok_or(LimiterError::CircuitOpen)?;
        let deadline = Instant::now() + self.budget;
        for check in checks {
            self.call(&conn, check, member, Mode::Add, deadline).await?;
        }
        Ok(())
    }

    /// Routed to the key's primary by the cluster connection.
    async fn query(
        &self,
        cmd: redis::Cmd,
        timeout: Duration,
    ) -> Result<redis::Value, LimiterError> {
        let mut conn = self.connection().await?;
        let classify = |e: redis::RedisError| client::classify(&e, self.budget);
        client::query_within(&mut conn, &cmd, timeout, classify).await
    }

    /// Healthy unless every known primary's circuit is open.
    fn is_healthy(&self) -> bool {
        let nodes = self.nodes.locked();
        let circuits = self.circuits.locked();
        (nodes.is_empty() && circuits.is_empty())
            || nodes.values().any(|n| n.is_healthy())
            || circuits.values().any(|c| !c.is_open())
    }

    /// Told to every primary's client: the late reply, if any, comes from
    /// the one the decision was sent to.
    fn note_fallback(&self, member: &str, admitted: bool) {
        for limiter in self.nodes.locked().values() {
            limiter.note_fallback(member, admitted);
        }
    }
}

/// Whether a node refused a decision because it does not serve one of its
/// keys (the slot moved since the map was read).
fn is_misrouted(error: &LimiterError) -> bool {
    match error {
        LimiterError::Server(message) | LimiterError::Unavailable(message) => {
            message.contains("non local key")
                || message.starts_with("MOVED")
                || message.starts_with("ASK")
        }
        _ => false,
    }
}
