//! The limiter's settings: which backend answers, how Redis is reached,
//! what a decision does when Redis fails, and each algorithm with its
//! parameters. Built by the gateway from its YAML file (`limiter:`), or by
//! hand by any other user of this crate.

use crate::calendar;
use std::time::Duration;

/// Which limiter answers decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Redis, shared by every instance.
    Redis,
    /// In-process, this instance only.
    Local,
}

/// What a decision does when Redis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Admit (fail open).
    Allow,
    /// Answer 503 (fail closed).
    Deny,
    /// Use the in-process limiter with the same limits.
    Local,
}

/// `limiter:`.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterConfig {
    /// Primary backend.
    pub backend: Backend,
    /// Redis connection settings (used when `backend` is Redis).
    pub redis: RedisConfig,
    /// Failure policy.
    pub on_error: OnError,
    /// Remember denials until their retry time (docs/algorithms.md).
    pub deny_cache: bool,
    /// Most keys the in-process limiter holds.
    pub local_max_keys: usize,
    /// Fraction (0, 1] of each limit the in-process fallback admits per
    /// instance (`on_error: local`), so that N instances falling back together
    /// admit about the limit, not N times it.
    pub local_share: f64,
    /// The most requests waiting at once on this instance (`on_limit:
    /// delay`); beyond it, a request that does not fit now is denied.
    pub max_waiting: usize,
}

/// `limiter.redis:`.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// `redis://` URL of a standalone Redis.
    pub url: String,
    /// Seed node URLs of a Redis Cluster; non-empty selects cluster mode.
    pub cluster: Vec<String>,
    /// Budget for one decision once connected (> 0).
    pub timeout: Duration,
    /// Budget for connecting (and loading the decide code) (> 0): the
    /// start waits this long for Redis before the listeners accept, and a
    /// decision made while the first connect is still running waits for it
    /// this long instead of falling back within `timeout`.
    pub connect_timeout: Duration,
    /// Prefix of every counter key; contains no `{` or `}`.
    pub key_prefix: String,
    /// TLS settings for `rediss://` (read when the config loads).
    pub tls: RedisTlsConfig,
    /// Sentinels that name the primary (`url` then gives only the primary's
    /// user, password, database and scheme); `None`: `url` is the primary.
    pub sentinel: Option<SentinelConfig>,
}

/// `limiter.redis.sentinel`: where to ask which server is the primary.
/// Its `Debug` leaves the password out.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The name the sentinels monitor the primary under.
    pub master: String,
    /// `host:port` of each sentinel (≥ 1).
    pub nodes: Vec<String>,
    /// The sentinels' own password, if they require one.
    pub password: Option<String>,
    /// The sentinels are reached over TLS, verified with `limiter.redis.tls`.
    pub tls: bool,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("master", &self.master)
            .field("nodes", &self.nodes)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// `limiter.redis.tls`: what a `rediss://` connection trusts and shows.
/// Never printed whole: its `Debug` leaves the key out.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTlsConfig {
    /// PEM CA certificates to trust instead of the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key, for servers that require one.
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTlsConfig")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("client", &self.client_pem.as_ref().map(|_| "<pem>"))
            .finish()
    }
}

/// Limiting algorithm, with its own parameters (docs/algorithms.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Exact sliding log (sorted set of admit times).
    SlidingLog,
    /// Sub-window counters; `buckets` ≥ 1 divides the window (in µs) exactly.
    SlidingWindow {
        /// Number of sub-windows.
        buckets: u32,
    },
    /// One counter per epoch-aligned window.
    FixedWindow,
    /// GCRA: refills `limit` per `window`, holds at most `burst` (≥ cost).
    TokenBucket {
        /// Bucket capacity in units.
        burst: u64,
    },
    /// At most `limit` units in flight; a lease ends by itself after `lease`.
    Concurrency {
        /// How long a lease lives if its response never completes.
        lease: Duration,
    },
    /// One counter per civil period (`calendar: day | week | month`).
    Calendar {
        /// Day, week or month.
        period: calendar::Period,
        /// The periods around the decision's time, by the gateway's clock
        /// (Redis's clock picks among them). All zero in the configuration;
        /// each decision's check carries them (`policy::limit_check`).
        bounds: calendar::PeriodBounds,
    },
}

impl Algorithm {
    /// The name used in the file.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::Concurrency { .. } => "concurrency",
            Algorithm::Calendar { .. } => "calendar",
        }
    }

    /// The algorithm with its per-decision parts cleared (a calendar
    /// quota's bounds): two checks of one limit count on the same state
    /// exactly when their algorithms agree here.
    pub fn counter(self) -> Self {
        match self {
            Algorithm::Calendar { period, .. } => Algorithm::Calendar {
                period,
                bounds: calendar::PeriodBounds::default(),
            },
            other => other,
        }
    }

    /// Whether a denial stays true until its `retry_after` unless time passes
    /// (every algorithm but `concurrency`, whose leases end at any moment).
    pub fn denial_is_timed(self) -> bool {
        !matches!(self, Algorithm::Concurrency { .. })
    }
}

impl OnError {
    /// The name used in the file.
    pub fn name(self) -> &'static str {
        match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        }
    }
}

/// The defaults of the gateway's `limiter:` section.
impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Redis,
            redis: RedisConfig::default(),
            on_error: OnError::Local,
            deny_cache: true,
            local_max_keys: 1_000_000,
            local_share: 1.0,
            max_waiting: 10_000,
        }
    }
}

/// The defaults of the gateway's `limiter.redis:` section.
impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379/0".into(),
            cluster: Vec::new(),
            timeout: Duration::from_millis(20),
            connect_timeout: Duration::from_secs(1),
            key_prefix: "sluice:".into(),
            tls: Default::default(),
            sentinel: None,
        }
    }
}
