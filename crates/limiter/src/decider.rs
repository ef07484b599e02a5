//! The [`Decider`]: the primary limiter (Redis, a Redis Cluster, or
//! in-process) together with the `on_error` policy, the deny cache, the
//! in-process fallback's share of each limit, held leases and waiting
//! requests, so that callers get an [`Outcome`] within the decision budget
//! and never a Redis error.

use crate::settings::{Backend, LimiterConfig, OnError};
use crate::{
    admits, deny_cache, leases, local, waiters, Algorithm, Decision, Lease, LimitCheck, Limiter,
    LimiterError, Link, Outcome, RedisObserver, Source,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an admitted request does on the backend that admitted it, later.
#[derive(Debug, Clone, Copy)]
enum AfterAdmission {
    /// Its response ended: release its concurrency leases.
    Release,
    /// Its client left while it waited: give back its reserved units.
    GiveBack,
    /// Its response head came: count its deferred limits.
    Record,
}

/// The primary limiter plus the failure policy.
pub struct Decider {
    settings: LimiterConfig,
    /// The shared backend (Redis or a Redis Cluster); `None` for `backend: local`.
    redis: Option<Arc<dyn Limiter>>,
    local: Arc<local::LocalLimiter>,
    deny_cache: Option<Arc<deny_cache::DenyCache>>,
    observer: Arc<dyn RedisObserver>,
    member_prefix: String,
    sequence: Arc<AtomicU64>,
    waiters: Arc<waiters::Waiters>,
    leases: Arc<leases::LeaseBook>,
}

impl Decider {
    /// Builds the backends from validated settings. No connection is made here:
    /// Redis connects on first use, inside the runtime that serves requests.
    pub fn new(
        config: &LimiterConfig,
        observer: Arc<dyn RedisObserver>,
    ) -> Result<Self, LimiterError> {
        let remote = Self::remote(config, &observer)?;
        Ok(Self::with_backend(config, remote, observer))
    }

    /// A decider whose shared backend is `remote` (`None`: in-process
    /// only), whatever `config.backend` says: the seam for embedding sluice's
    /// policy over another backend, and for testing it.
    pub fn with_backend(
        config: &LimiterConfig,
        remote: Option<Arc<dyn Limiter>>,
        observer: Arc<dyn RedisObserver>,
    ) -> Self {
        Self {
            settings: config.clone(),
            redis: remote,
            local: Arc::new(local::LocalLimiter::new(config.local_max_keys)),
            deny_cache: Self::deny_cache(config),
            observer,
            member_prefix: instance_id(),
            sequence: Arc::new(AtomicU64::new(0)),
            waiters: waiters::Waiters::new(config.max_waiting),
            leases: leases::LeaseBook::new(),
        }
    }

    /// A decider for `config` (a reload) that keeps what this one has where
    /// its settings did not change: the Redis connections and circuit breaker
    /// when `backend` and `redis` are the same, the in-process counters when
    /// `local.max_keys` is, the deny cache when it stays on. Both deciders can
    /// serve at once (requests in flight finish on the old one).
    pub fn reconfigure(&self, config: &LimiterConfig) -> Result<Self, LimiterError> {
        let old = &self.settings;
        let redis = if self.keeps_connections(config) {
            self.redis.clone()
        } else {
            Self::remote(config, &self.observer)?
        };
        let local = if old.local_max_keys == config.local_max_keys {
            Arc::clone(&self.local)
        } else {
            Arc::new(local::LocalLimiter::new(config.local_max_keys))
        };
        let deny_cache = match (&self.deny_cache, config.deny_cache) {
            (Some(cache), true) if old.local_max_keys == config.local_max_keys => {
                Some(Arc::clone(cache))
            }
            _ => Self::deny_cache(config),
        };
        Ok(Self {
            settings: config.clone(),
            redis,
            local,
            deny_cache,
            observer: Arc::clone(&self.observer),
            member_prefix: self.member_prefix.clone(),
            sequence: Arc::clone(&self.sequence),
            waiters: {
                // Requests waiting under the old configuration still count.
                self.waiters.set_max_total(config.max_waiting);
                Arc::clone(&self.waiters)
            },
            // Leases held under the old configuration are still renewed.
            leases: Arc::clone(&self.leases),
        })
    }

    /// Whether a decider reconfigured to `config` keeps this one's Redis
    /// connections (the same backend and Redis settings).
    fn keeps_connections(&self, config: &LimiterConfig) -> bool {
        (self.settings.backend, &self.settings.redis) == (config.backend, &config.redis)
    }

    fn remote(
        config: &LimiterConfig,
        observer: &Arc<dyn RedisObserver>,
    ) -> Result<Option<Arc<dyn Limiter>>, LimiterError> {
        let observer = Arc::clone(observer);
        Ok(match config.backend {
            Backend::Redis if !config.redis.cluster.is_empty() => {
                Some(Arc::new(crate::redis::cluster::ClusterLimiter::new(
                    &config.redis.cluster,
                    &config.redis.tls,
                    (config.redis.timeout, config.redis.connect_timeout),
                    observer,
                )?))
            }
            Backend::Redis => Some(Arc::new(crate::redis::RedisLimiter::new(
                &config.redis,
                observer,
            )?)),
            Backend::Local => None,
        })
    }

    fn deny_cache(config: &LimiterConfig) -> Option<Arc<deny_cache::DenyCache>> {
        config
            .deny_cache
            .then(|| Arc::new(deny_cache::DenyCache::new(config.local_max_keys)))
    }

    fn next_member(&self) -> String {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        format!("{}-{sequence:x}", self.member_prefix)
    }

    /// Releases the concurrency leases an admitted request took (`checks`:
    /// its concurrency limits; `outcome`: what [`Decider::decide`] answered).
    /// A lease that cannot be released expires after its `lease` time.
    pub async fn release(&self, checks: &[LimitCheck<'_>], outcome: &Outcome) {
        self.after_admission(AfterAdmission::Release, checks, outcome)
            .await;
    }

    /// Puts the concurrency leases an admitted request took on `checks`
    /// (those of its checks that are `concurrency` limits it holds) on the
    /// book of held leases, renewed on the backend that granted them until
    /// the returned hold is dropped. `None` when it holds none, or none that
    /// a backend keeps (fail open).
    pub fn hold(&self, checks: &[LimitCheck<'_>], outcome: &Outcome) -> Option<leases::LeaseHold> {
        if !outcome.admitted {
            return None;
        }
        let grantor = match outcome.source {
            Source::Redis => leases::Grantor::Remote(Arc::clone(self.redis.as_ref()?)),
            Source::Local => leases::Grantor::Local(Arc::clone(&self.local)),
            Source::DenyCache | Source::FailOpen | Source::FailClosed => return None,
        };
        let held = checks
            .iter()
            .filter_map(|check| match check.algorithm {
                Algorithm::Concurrency { lease } => Some(Lease {
                    key: check.key.to_string(),
                    member: outcome.member.clone(),
                    lease,
                    cost: check.cost,
                }),
                _ => None,
            })
            .collect();
        self.leases.hold(grantor, held)
    }

    /// Concurrency leases this instance holds now (renewed while held).
    pub fn leases_held(&self) -> u64 {
        self.leases.held()
    }

    /// A place among the requests that may wait for their turn on `key`
    /// (`on_limit: delay`): `None` when `max_per_key` of that key, or the
    /// instance's `limiter.max_waiting`, are waiting already.
    pub fn wait_permit(&self, key: &str, max_per_key: usize) -> Option<waiters::WaitPermit> {
        self.waiters.try_enter(key, max_per_key)
    }

    /// Requests holding a place to wait now.
    pub fn waiting(&self) -> usize {
        self.waiters.held()
    }

    /// Gives back the units a delayed request reserved on `checks` (its
    /// client left before its turn), on the backend that reserved them. Best
    /// effort: units not given back free with the window, as if used.
    pub async fn give_back(&self, checks: &[LimitCheck<'_>], outcome: &Outcome) {
        self.after_admission(AfterAdmission::GiveBack, checks, outcome)
            .await;
    }

    /// Counts a deferred limit's response: consumes each check's cost under
    /// the request's member, on the backend that admitted it. Best effort:
    /// a failure is logged and the units are not counted (bounded by the
    /// budget).
    pub async fn record(&self, checks: &[LimitCheck<'_>], outcome: &Outcome) {
        self.after_admission(AfterAdmission::Record, checks, outcome)
            .await;
    }

    /// Settles an admitted request's reservations on the backend that
    /// admitted it: gives back each of `returned`'s `cost` units (reserved
    /// beyond what the request used), as taken at `taken_us` (its decisions'
    /// [`Decision::taken_us`]), and charges each of `overdraft`'s `cost`
    /// units on top (used beyond the reservation), now. Denials this instance
    /// remembers for the returned keys are forgotten: the units are free
    /// again. Best effort, like [`Decider::record`]: units not given back
    /// free with their window, as if used.
    pub async fn settle(
        &self,
        returned: &[LimitCheck<'_>],
        taken_us: &[i64],
        overdraft: &[LimitCheck<'_>],
        outcome: &Outcome,
    ) {
        if !outcome.admitted {
            return;
        }
        if let Some(cache) = self.deny_cache.as_ref().filter(|_| !returned.is_empty()) {
            cache.forget(returned);
        }
        // The overdraft's own member: a sorted-set log keeps the
        // reservation's units under the request's member.
        let member = || format!("{}+", outcome.member);
        match outcome.source {
            Source::Redis => {
                let Some(redis) = &self.redis else {
                    return;
                };
                if !returned.is_empty() {
                    if let Err(e) = redis.refund(returned, &outcome.member, taken_us).await {
                        log::warn!("a reservation's unused units could not be given back: {e}");
                    }
                }
                if !overdraft.is_empty() {
                    if let Err(e) = redis.record(overdraft, &member()).await {
                        log::warn!("a reservation's overdraft could not be recorded in Redis: {e}");
                    }
                }
            }
            Source::Local => {
                self.local.refund(returned, taken_us);
                if !overdraft.is_empty() {
                    self.local.record(overdraft, &member());
                }
            }
            Source::DenyCache | Source::FailOpen | Source::FailClosed => {}
        }
    }

    /// Does `step` for an admitted request's `checks` on the backend that
    /// admitted it (nothing for one admitted without a backend: deny cache,
    /// fail open). A Redis failure is logged, never returned.
    async fn after_admission(
        &self,
        step: AfterAdmission,
        checks: &[LimitCheck<'_>],
        outcome: &Outcome,
    ) {
        if checks.is_empty() || !outcome.admitted {
            return;
        }
        let member = outcome.member.as_str();
        match outcome.source {
            Source::Redis => {
                let Some(redis) = &self.redis else {
                    return;
                };
                let result = match step {
                    AfterAdmission::Release | AfterAdmission::GiveBack => {
                        redis.release(checks, member).await
                    }
                    AfterAdmission::Record => redis.record(checks, member).await,
                };
                if let Err(e) = result {
                    match step {
                        AfterAdmission::Release => {
                            log::debug!("lease release failed (it expires by itself): {e}")
                        }
                        AfterAdmission::GiveBack => {
                            log::debug!("a delayed request's units could not be given back: {e}")
                        }
                        AfterAdmission::Record => {
                            log::warn!("a counted response could not be recorded in Redis: {e}")
                        }
                    }
                }
            }
            Source::Local => match step {
                AfterAdmission::Release => self.local.release(checks, member),
                AfterAdmission::GiveBack => self.local.give_back(checks, member),
                AfterAdmission::Record => self.local.record(checks, member),
            },
            Source::DenyCache | Source::FailOpen | Source::FailClosed => {}
        }
    }

    /// The authoritative backend's report on `checks`, consuming nothing.
    pub async fn peek(&self, checks: &[LimitCheck<'_>]) -> Result<Vec<Decision>, LimiterError> {
        match &self.redis {
            Some(redis) => redis.peek(checks).await,
            None => self.local.peek(checks).await,
        }
    }

    /// Forgets `checks`' keys on the authoritative backend (and in process:
    /// the fallback's counts and the deny cache).
    pub async fn reset(&self, checks: &[LimitCheck<'_>]) -> Result<(), LimiterError> {
        self.local.reset(checks).await?;
        if let Some(cache) = &self.deny_cache {
            cache.forget(checks);
        }
        match &self.redis {
            Some(redis) => redis.reset(checks).await,
            None => Ok(()),
        }
    }

    /// Runs `cmd` (a command on one key) on the shared Redis within
    /// `timeout`; an error with `backend: local`.
    pub async fn query(
        &self,
        cmd: ::redis::Cmd,
        timeout: Duration,
    ) -> Result<::redis::Value, LimiterError> {
        match &self.redis {
            Some(redis) => redis.query(cmd, timeout).await,
            None => Err(LimiterError::Unavailable(
                "backend: local has no Redis".into(),
            )),
        }
    }

    /// The budget of one Redis call (`limiter.redis.timeout`).
    pub fn budget(&self) -> Duration {
        self.settings.redis.timeout
    }

    /// The remembered denial of `checks`, without any I/O: what the deny
    /// cache holds now (`None` when it holds nothing, or is off).
    pub fn cached_denial(&self, checks: &[LimitCheck<'_>]) -> Option<Vec<Decision>> {
        self.deny_cache.as_ref()?.lookup(checks, Instant::now())
    }

    /// Decides `checks`. Never fails: a Redis failure becomes the `on_error`
    /// outcome. Bounded in time by the Redis timeout budget; answered without
    /// any I/O when the deny cache holds one of the keys.
    pub async fn decide(&self, checks: &[LimitCheck<'_>]) -> Outcome {
        let member = self.next_member();
        if let Some(cache) = &self.deny_cache {
            if let Some(decisions) = cache.lookup(checks, Instant::now()) {
                return Outcome {
                    source: Source::DenyCache,
                    admitted: admits(checks, &decisions),
                    decisions,
                    member,
                };
            }
        }
        let (source, mut decisions) = self.decide_uncached(checks, &member).await;
        for (decision, check) in decisions.iter_mut().zip(checks) {
            *decision = decision.bounded(check);
        }
        let admitted = match source {
            Source::FailOpen => true,
            Source::FailClosed => false,
            _ => admits(checks, &decisions),
        };
        // Only the authoritative backend's denials are remembered: a denial
        // of the fallback (scaled to this instance's share) must not outlive
        // the Redis failure that made it.
        let authoritative = match source {
            Source::Redis => true,
            Source::Local => self.redis.is_none(),
            Source::DenyCache | Source::FailOpen | Source::FailClosed => false,
        };
        if let Some(cache) = &self.deny_cache {
            if !admitted && authoritative {
                cache.remember(checks, &decisions, Instant::now());
            }
        }
        Outcome {
            source,
            admitted,
            decisions,
            member,
        }
    }

    async fn decide_uncached(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
    ) -> (Source, Vec<Decision>) {
        let Some(redis) = &self.redis else {
            return (Source::Local, self.local.decide(checks, member));
        };
        match redis.check(checks, member).await {
            Ok(decisions) => (Source::Redis, decisions),
            Err(e) => {
                log::debug!("rate-limit decision falls back to on_error: {e}");
                let (source, decisions, admitted) = match self.settings.on_error {
                    OnError::Allow => (Source::FailOpen, Vec::new(), true),
                    OnError::Deny => (Source::FailClosed, Vec::new(), false),
                    OnError::Local => {
                        let decisions = self.fallback(checks, member);
                        let admitted = admits(checks, &decisions);
                        (Source::Local, decisions, admitted)
                    }
                };
                // Redis may still run a decision that ran out of budget.
                if matches!(e, LimiterError::Timeout(_)) {
                    redis.note_fallback(member, admitted);
                }
                (source, decisions)
            }
        }
    }

    /// The in-process decision standing in for Redis: each limit scaled to
    /// this instance's `local.share` (never below one request's cost).
    fn fallback(&self, checks: &[LimitCheck<'_>], member: &str) -> Vec<Decision> {
        if self.settings.local_share >= 1.0 {
            return self.local.decide(checks, member);
        }
        let share = |units: u64, cost: u64| {
            ((units as f64 * self.settings.local_share).floor() as u64).max(cost)
        };
        let scaled: Vec<LimitCheck<'_>> = checks
            .iter()
            .map(|c| LimitCheck {
                limit: share(c.limit, c.cost),
                // A full bucket's burst is this instance's share too.
                algorithm: match c.algorithm {
                    Algorithm::TokenBucket { burst } => Algorithm::TokenBucket {
                        burst: share(burst, c.cost),
                    },
                    other => other,
                },
                ..*c
            })
            .collect();
        self.local.decide(&scaled, member)
    }

    /// Connects the shared backend now (see [`Limiter::connect`]); with
    /// `backend: local`, nothing to do. A failure is logged by the backend
    /// and left to `on_error`: the caller goes on either way.
    pub async fn connect(&self) -> Result<(), LimiterError> {
        match &self.redis {
            Some(redis) => redis.connect().await,
            None => Ok(()),
        }
    }

    /// Where the shared backend's connection stands ([`Link::Connected`]
    /// with `backend: local`, which has none).
    pub fn link(&self) -> Link {
        self.redis
            .as_ref()
            .map_or(Link::Connected, |redis| redis.link())
    }

    /// Whether the shared backend's circuit is open: Redis was found
    /// failing and is not called until a probe succeeds (false with
    /// `backend: local`).
    pub fn circuit_open(&self) -> bool {
        self.redis.as_ref().is_some_and(|redis| !redis.is_healthy())
    }

    /// Whether this instance should get traffic, and why not (or why it
    /// is ready although Redis is not there).
    pub fn readiness(&self) -> Readiness {
        let Some(redis) = &self.redis else {
            return Readiness::Ready;
        };
        let fallback = match self.settings.on_error {
            OnError::Deny => None,
            OnError::Allow => Some("on_error: allow admits"),
            OnError::Local => Some("on_error: local limits in process"),
        };
        match (redis.link(), redis.is_healthy(), fallback) {
            (Link::Starting, _, _) => Readiness::NotReady("connecting to Redis"),
            (Link::Connected, true, _) => Readiness::Ready,
            (_, _, Some(fallback)) => Readiness::Degraded(fallback),
            (_, _, None) => Readiness::NotReady("Redis is unreachable and on_error is deny"),
        }
    }

    /// Whether `/readyz` says ready (see [`Decider::readiness`]).
    pub fn is_ready(&self) -> bool {
        !matches!(self.readiness(), Readiness::NotReady(_))
    }
}

/// What `/readyz` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Decisions come from the shared backend (or there is none).
    Ready,
    /// Redis is not reachable, and `on_error` keeps serving: ready, with
    /// what decides meanwhile.
    Degraded(&'static str),
    /// Not ready, and why: still connecting at the start, or decisions
    /// would fail closed.
    NotReady(&'static str),
}

/// A per-process random prefix for request members, so that requests
/// admitted in the same microsecond by different instances stay distinct.
pub(crate) fn instance_id() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
#[path = "decider_tests.rs"]
mod tests;
