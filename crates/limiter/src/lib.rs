//! Exact, distributed rate-limit decisions, independent of HTTP: the limiter
//! of the sluice gateway, usable from any Rust service.
//!
//! A [`Limiter`] answers "may these units pass?" for one or more counter keys
//! at once, all or nothing: if any key denies, no key consumes anything.
//! Two kinds exist: Redis (standalone, Sentinel or Cluster; one atomic
//! script per batch of decisions, with Redis's own clock, so every instance
//! sharing the Redis shares the limit exactly) and in-process ([`local`],
//! one twin per algorithm giving the same decisions). [`Decider`] puts the
//! primary one together with the `on_error` policy (fail open, fail closed,
//! or fall back to the in-process twin with a share of each limit), a
//! circuit breaker and a cache of denials, so callers get an [`Outcome`]
//! within the decision budget and never a Redis error.
//!
//! The algorithms ([`Algorithm`]): an exact sliding log, a sliding window of
//! sub-window counters, fixed windows, a token bucket (GCRA), concurrency
//! leases, and calendar quotas (day, week, month in a time zone).
//! [`settings`] holds every setting with the gateway's defaults.
//!
//! ```
//! use sluice_limiter::settings::{Backend, LimiterConfig};
//! use sluice_limiter::{Algorithm, Decider, LimitCheck, Unobserved};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! // In-process here, so that the example needs no Redis; `Backend::Redis`
//! // with `redis.url` shares the limit across every process that uses it
//! // (`cargo run -p sluice-limiter --example redis`).
//! let settings = LimiterConfig { backend: Backend::Local, ..LimiterConfig::default() };
//! let decider = Decider::new(&settings, Arc::new(Unobserved)).unwrap();
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//!
//! // 3 requests a minute for one user, on an exact sliding log.
//! let check = LimitCheck::plain("api:user:42", 3, Duration::from_secs(60), Algorithm::SlidingLog);
//! let admitted: Vec<bool> = (0..5)
//!     .map(|_| runtime.block_on(decider.decide(&[check])).admitted)
//!     .collect();
//! assert_eq!(admitted, [true, true, true, false, false]);
//!
//! // A denial says when to come back.
//! let denied = runtime.block_on(decider.decide(&[check]));
//! assert!(denied.decisions[0].retry_after > Duration::from_secs(59));
//! ```
//!
//! The crate depends on no HTTP, proxy or metrics library: it reports its
//! Redis calls through [`RedisObserver`], which the caller implements (or
//! [`Unobserved`]).

pub mod calendar;
mod decider;
pub mod deny_cache;
pub mod leases;
pub mod local;
pub mod redis;
pub mod settings;
pub mod sharded;
pub mod sync;
pub mod waiters;

pub use crate::settings::Algorithm;
use async_trait::async_trait;
pub use decider::{Decider, Readiness};
use std::time::Duration;

/// One limit to check for one request.
#[derive(Debug, Clone, Copy)]
pub struct LimitCheck<'a> {
    /// Counter key (see `keys::build_key`).
    pub key: &'a str,
    /// Units admitted per window, or in flight for `concurrency` (≥ 1).
    pub limit: u64,
    /// Window length (≥ 1 ms; unused by `concurrency`).
    pub window: Duration,
    /// Units this request consumes (≥ 1, and never more than can ever pass).
    pub cost: u64,
    /// How the limit counts.
    pub algorithm: Algorithm,
    /// Counts and reports but never denies the request.
    pub shadow: bool,
    /// The penalty box (`block_for`): once this limit denies the key, it
    /// denies it this long whatever the count. Zero: none.
    pub block: Duration,
    /// Checked but not consumed: the response decides what is counted
    /// (`count_when`, `cost_from`), with [`Limiter::record`].
    pub deferred: bool,
    /// `on_limit: delay`: a request that would fit within this wait is
    /// admitted after it, its units reserved at the time they free (the
    /// decision is allowed with that wait as `retry_after`). Zero: a request
    /// that does not fit now is denied.
    pub max_delay: Duration,
}

impl<'a> LimitCheck<'a> {
    /// An enforced check of one unit on `key`: not shadow, no penalty box,
    /// not deferred, never delayed. Fields can be changed after.
    pub fn plain(key: &'a str, limit: u64, window: Duration, algorithm: Algorithm) -> Self {
        LimitCheck {
            key,
            limit,
            window,
            cost: 1,
            algorithm,
            shadow: false,
            block: Duration::ZERO,
            deferred: false,
            max_delay: Duration::ZERO,
        }
    }
}

/// The state of one limit after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether this limit alone would admit the request now.
    pub allowed: bool,
    /// Units left in the window after this decision.
    pub remaining: u64,
    /// Time until the window frees a unit (oldest entry expires); zero if empty.
    pub reset: Duration,
    /// Time until this limit alone would admit the request: zero if it
    /// admits it now; for an allowed decision of a limit that delays, the
    /// wait before the request may proceed.
    pub retry_after: Duration,
    /// When this limit took the request's units, on the clock of the
    /// backend that decided (Redis's `TIME`, or the in-process clock), in
    /// µs since the Unix epoch: what [`Limiter::refund`] gives back at.
    /// 0 when it took none or the time is not known.
    pub taken_us: i64,
}

impl Decision {
    /// The wait an allowed decision puts before the request (`on_limit:
    /// delay`); zero for one that admits it now, and for a denial.
    pub fn delay(&self) -> Duration {
        if self.allowed {
            self.retry_after
        } else {
            Duration::ZERO
        }
    }
}

impl Decision {
    /// The decision with `reset` and `retry_after` held to the most `check`
    /// can ever need, whatever its counter held (state written under other
    /// parameters before a reload, or by something other than sluice): a
    /// window (`sliding_window`: a window and one sub-window); `token_bucket`:
    /// `burst` refill intervals until full, `cost` of them until admitted;
    /// `concurrency`: one `lease`, and a retry of at most a second; or the
    /// penalty box, when it is longer. An allowed decision's wait (its delay)
    /// is at most the check's `max_delay`: zero when it does not delay. The backends already keep within
    /// these bounds; this is the last guard.
    pub fn bounded(self, check: &LimitCheck<'_>) -> Self {
        let window = check.window;
        let (reset, retry) = match check.algorithm {
            Algorithm::SlidingLog | Algorithm::FixedWindow => (window, window),
            Algorithm::SlidingWindow { buckets } => {
                let bound = window + window / buckets.max(1);
                (bound, bound)
            }
            Algorithm::TokenBucket { burst } => {
                let interval =
                    Duration::from_micros((window.as_micros() as u64).div_ceil(check.limit.max(1)));
                let units = |n: u64| interval.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
                (units(burst.max(check.cost)), units(check.cost))
            }
            Algorithm::Concurrency { lease } => (lease, Duration::from_secs(1)),
            Algorithm::Calendar { period, .. } => (period.longest(), period.longest()),
        };
        // A penalty box (`block_for`) holds the key that long; an admitted
        // request waits at most `max_delay` (`on_limit: delay`).
        let (reset, retry) = (reset.max(check.block), retry.max(check.block));
        let retry = if self.allowed { check.max_delay } else { retry };
        Self {
            reset: self.reset.min(reset),
            retry_after: self.retry_after.min(retry),
            ..self
        }
    }
}

/// Why a limiter could not decide. Always a backend problem, never the request's.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    /// The decision did not finish within the configured budget.
    #[error("redis timed out after {0:?}")]
    Timeout(Duration),
    /// The connection to Redis broke or could not be made (reset, closed,
    /// unreachable).
    #[error("redis connection error: {0}")]
    Io(String),
    /// Nothing accepts connections at the Redis address (down or restarting).
    #[error("redis refused the connection: {0}")]
    Refused(String),
    /// Redis answered with an error confined to this decision (WRONGTYPE on
    /// a clobbered key, a reply of the wrong shape).
    #[error("redis error: {0}")]
    Server(String),
    /// Redis answered that it cannot serve (LOADING, BUSY, OOM, READONLY,
    /// CLUSTERDOWN, …).
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// The circuit breaker is open: Redis was not called.
    #[error("redis not called: circuit open")]
    CircuitOpen,
}

impl LimiterError {
    /// The `kind` label of `sluice_redis_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            LimiterError::Timeout(_) => "timeout",
            LimiterError::Io(_) | LimiterError::Refused(_) => "io",
            LimiterError::Server(_) | LimiterError::Unavailable(_) => "server",
            LimiterError::CircuitOpen => "circuit_open",
        }
    }

    /// What the failure says to the circuit breaker: `None` for an error
    /// confined to one key or reply (it does not count), else how Redis is
    /// unhealthy.
    pub fn circuit_failure(&self) -> Option<crate::redis::circuit::Failure> {
        match self {
            LimiterError::Refused(_) => Some(crate::redis::circuit::Failure::Refused),
            LimiterError::Timeout(_) => Some(crate::redis::circuit::Failure::Slow),
            LimiterError::Io(_) | LimiterError::Unavailable(_) => {
                Some(crate::redis::circuit::Failure::Down)
            }
            LimiterError::Server(_) | LimiterError::CircuitOpen => None,
        }
    }
}

/// What the Redis backends report about their calls. The limiter owns this
/// trait and the metrics implement it, so the limiter depends on no metrics
/// library; an observer sees calls, it never affects a decision.
pub trait RedisObserver: Send + Sync {
    /// A call succeeded after `elapsed`.
    fn call_succeeded(&self, elapsed: Duration);
    /// A call failed (or was not made: circuit open) with `error`.
    fn call_failed(&self, error: &LimiterError);
    /// Whether Redis is taken to be reachable.
    fn set_up(&self, up: bool);
}

/// An observer that reports nothing, for callers without metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl RedisObserver for Unobserved {
    fn call_succeeded(&self, _: Duration) {}
    fn call_failed(&self, _: &LimiterError) {}
    fn set_up(&self, _: bool) {}
}

/// Where a remote backend's connection stands, for readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// The first connect has not ended yet: decisions wait for it (within
    /// the connect budget) rather than fall back.
    Starting,
    /// Connected, with the decide code loaded.
    Connected,
    /// Not connected: the last attempt failed, or the connection was
    /// dropped; the next decision (or the circuit's probe) connects again.
    Unreachable,
}

/// One concurrency lease a request holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The limit's counter key.
    pub key: String,
    /// The request's member (its units are `member`, `member.2`, …).
    pub member: String,
    /// The limit's `lease`: how long after a renewal the lease ends by itself.
    pub lease: Duration,
    /// Units the request holds (its cost).
    pub cost: u64,
}

/// A rate-limit backend.
#[async_trait]
pub trait Limiter: Send + Sync {
    /// Connects now, and loads the decide code, unless already connected;
    /// bounded by the connect budget. Called before the listeners accept,
    /// so that the first decisions find a connection. A backend without a
    /// connection has nothing to do.
    async fn connect(&self) -> Result<(), LimiterError> {
        Ok(())
    }

    /// Where its connection stands (see [`Link`]).
    fn link(&self) -> Link {
        Link::Connected
    }

    /// Decides `checks` all or nothing: the request is admitted only if every
    /// non-shadow check is `allowed`; then every allowed check consumes its
    /// cost, recorded under `member` (unique per request). A denied request
    /// consumes nothing. Returns one [`Decision`] per check, in order.
    async fn check(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
    ) -> Result<Vec<Decision>, LimiterError>;

    /// Releases the `concurrency` leases `member` took on `checks` (the
    /// response ended). Leases not released expire by themselves.
    async fn release(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError>;

    /// Moves the end of each of `leases` (concurrency leases this instance
    /// holds) `lease` from now, in one call per [`leases::MAX_RENEWALS`]; a
    /// lease released or already ended stays so. Backends without leases
    /// of their own do nothing.
    async fn renew(&self, _leases: &[Lease]) -> Result<(), LimiterError> {
        Ok(())
    }

    /// Consumes each check's cost under `member` whatever the limit holds:
    /// a deferred limit's counted response (its request was admitted).
    async fn record(&self, checks: &[LimitCheck<'_>], member: &str) -> Result<(), LimiterError>;

    /// Gives back each check's `cost` units that `member` took when the
    /// backend's clock read `taken_us[i]` (that decision's
    /// [`Decision::taken_us`]): a reservation settled below what it
    /// reserved. As if only the rest had been taken then: a window that has
    /// ended since keeps its count, units already out of the window are not
    /// given back twice, and another request's units are never removed.
    async fn refund(
        &self,
        checks: &[LimitCheck<'_>],
        member: &str,
        taken_us: &[i64],
    ) -> Result<(), LimiterError>;

    /// Reports each check as [`Limiter::check`] would decide it now,
    /// consuming nothing (the usage API).
    async fn peek(&self, checks: &[LimitCheck<'_>]) -> Result<Vec<Decision>, LimiterError>;

    /// Forgets what `checks`' keys hold (counts and penalty boxes).
    async fn reset(&self, checks: &[LimitCheck<'_>]) -> Result<(), LimiterError>;

    /// Whether it is taken to be able to decide now: false while a remote
    /// backend's circuit is open (then it is not even called).
    fn is_healthy(&self) -> bool {
        true
    }

    /// Told what `on_error` answered the request `member` whose decision
    /// ran out of budget, for a backend that may still run it late.
    fn note_fallback(&self, _member: &str, _admitted: bool) {}

    /// Runs `cmd`, a command on one key, on that key's Redis within
    /// `timeout`: the API-key store's reads and writes. A backend without
    /// Redis cannot.
    async fn query(
        &self,
        _cmd: ::redis::Cmd,
        _timeout: Duration,
    ) -> Result<::redis::Value, LimiterError> {
        Err(LimiterError::Unavailable("no Redis backend".into()))
    }
}

/// Whether `checks` admit the request, given one decision per check: every
/// non-shadow decision must allow it.
pub fn admits(checks: &[LimitCheck<'_>], decisions: &[Decision]) -> bool {
    checks
        .iter()
        .zip(decisions)
        .all(|(c, d)| c.shadow || d.allowed)
}

/// Where a decision came from (the `source` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Redis answered.
    Redis,
    /// A remembered denial answered, without asking Redis.
    DenyCache,
    /// The in-process limiter answered (`backend: local`, or `on_error: local`).
    Local,
    /// Redis failed and `on_error: allow` admitted.
    FailOpen,
    /// Redis failed and `on_error: deny` refused (answer 503).
    FailClosed,
}

impl Source {
    /// Every source, in label order.
    pub const ALL: [Source; 5] = [
        Source::Redis,
        Source::DenyCache,
        Source::Local,
        Source::FailOpen,
        Source::FailClosed,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::DenyCache => "deny_cache",
            Source::Local => "local",
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
        }
    }
}

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Who decided.
    pub source: Source,
    /// Whether the request may proceed.
    pub admitted: bool,
    /// One per check; empty for `FailOpen` and `FailClosed`.
    pub decisions: Vec<Decision>,
    /// The unique member this request's units were recorded under; hand it
    /// back to [`Decider::release`] when the request held leases.
    pub member: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(algorithm: Algorithm) -> LimitCheck<'static> {
        LimitCheck::plain("k", 4, Duration::from_secs(60), algorithm)
    }

    #[test]
    fn decisions_are_held_to_what_the_limit_can_need() {
        let absurd = Decision {
            allowed: false,
            remaining: 0,
            reset: Duration::from_secs(8_981_536_051),
            retry_after: Duration::from_secs(8_981_536_051),
            taken_us: 0,
        };
        let cases = [
            (Algorithm::SlidingLog, 60_000, 60_000),
            (Algorithm::FixedWindow, 60_000, 60_000),
            (Algorithm::SlidingWindow { buckets: 10 }, 66_000, 66_000),
            // 4 per minute: a unit every 15 s; burst 2.
            (Algorithm::TokenBucket { burst: 2 }, 30_000, 15_000),
            (
                Algorithm::Concurrency {
                    lease: Duration::from_secs(30),
                },
                30_000,
                1_000,
            ),
        ];
        for (algorithm, reset_ms, retry_ms) in cases {
            let d = absurd.bounded(&check(algorithm));
            assert_eq!(d.reset, Duration::from_millis(reset_ms), "{algorithm:?}");
            assert_eq!(
                d.retry_after,
                Duration::from_millis(retry_ms),
                "{algorithm:?}"
            );
        }
        let sane = Decision {
            allowed: true,
            remaining: 3,
            reset: Duration::from_secs(7),
            retry_after: Duration::ZERO,
            taken_us: 0,
        };
        assert_eq!(sane.bounded(&check(Algorithm::SlidingLog)), sane);
    }
}
