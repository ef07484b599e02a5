//! The decider's policy over a fake shared backend: fallback per `on_error`,
//! the fallback's share of each limit, what the deny cache may remember,
//! readiness, and what a reload keeps.

use super::*;
use crate::settings::RedisConfig;
use crate::sync::Locked;
use crate::Unobserved;
use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;

/// A shared backend that answers as told and counts its calls.
#[derive(Default)]
struct Fake {
    /// `None`: admit everything; `Some(e)`: fail with `e`.
    failure: Mutex<Option<LimiterError>>,
    /// Deny every check, for this long.
    deny_for: Mutex<Option<Duration>>,
    calls: AtomicUsize,
    unhealthy: AtomicBool,
    /// Where its connection stands (`None`: connected).
    link: Mutex<Option<Link>>,
    fallbacks: Mutex<Vec<(String, bool)>>,
}

#[async_trait]
impl Limiter for Fake {
    async fn check(
        &self,
        checks: &[LimitCheck<'_>],
        _member: &str,
    ) -> Result<Vec<Decision>, LimiterError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(error) = self.failure.locked().clone() {
            return Err(error);
        }
        let deny = *self.deny_for.locked();
        Ok(checks
            .iter()
            .map(|c| Decision {
                allowed: deny.is_none(),
                remaining: if deny.is_some() { 0 } else { c.limit - 1 },
                reset: c.window,
                retry_after: deny.unwrap_or(Duration::ZERO),
                taken_us: 0,
            })
            .collect())
    }

    async fn release(&self, _: &[LimitCheck<'_>], _: &str) -> Result<(), LimiterError> {
        Ok(())
    }

    async fn record(&self, _: &[LimitCheck<'_>], _: &str) -> Result<(), LimiterError> {
        Ok(())
    }

    async fn refund(&self, _: &[LimitCheck<'_>], _: &str, _: &[i64]) -> Result<(), LimiterError> {
        Ok(())
    }

    async fn peek(&self, _: &[LimitCheck<'_>]) -> Result<Vec<Decision>, LimiterError> {
        Ok(Vec::new())
    }

    async fn reset(&self, _: &[LimitCheck<'_>]) -> Result<(), LimiterError> {
        Ok(())
    }

    fn is_healthy(&self) -> bool {
        !self.unhealthy.load(Ordering::Relaxed)
    }

    fn link(&self) -> Link {
        self.link.locked().unwrap_or(Link::Connected)
    }

    fn note_fallback(&self, member: &str, admitted: bool) {
        self.fallbacks.locked().push((member.to_string(), admitted));
    }
}

/// The default settings with `on_error` and the fallback's `share`.
fn settings(on_error: OnError, share: f64) -> LimiterConfig {
    LimiterConfig {
        on_error,
        local_share: share,
        ..LimiterConfig::default()
    }
}

fn decider(on_error: OnError, share: f64) -> (Decider, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let remote: Arc<dyn Limiter> = fake.clone();
    let decider = Decider::with_backend(
        &settings(on_error, share),
        Some(remote),
        Arc::new(Unobserved),
    );
    (decider, fake)
}

fn check(key: &str, limit: u64) -> LimitCheck<'_> {
    LimitCheck::plain(key, limit, Duration::from_secs(60), Algorithm::SlidingLog)
}

fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// How many of `n` requests on one key the decider admits, and from where.
fn admitted_of(decider: &Decider, key: &str, limit: u64, n: usize) -> (usize, Vec<Source>) {
    let mut admitted = 0;
    let mut sources = Vec::new();
    for _ in 0..n {
        let outcome = run(decider.decide(&[check(key, limit)]));
        admitted += usize::from(outcome.admitted);
        sources.push(outcome.source);
    }
    (admitted, sources)
}

#[test]
fn a_failing_backend_falls_back_to_this_instances_share() {
    let (decider, fake) = decider(OnError::Local, 0.5);
    *fake.failure.locked() = Some(LimiterError::Timeout(Duration::from_millis(20)));
    let (admitted, sources) = admitted_of(&decider, "k", 10, 8);
    assert_eq!(admitted, 5, "half of 10");
    assert!(sources.iter().all(|s| *s == Source::Local));
    // Each timed-out decision is reported back with what on_error said.
    let fallbacks = fake.fallbacks.locked();
    assert_eq!(fallbacks.len(), 8);
    assert_eq!(fallbacks.iter().filter(|(_, a)| *a).count(), 5);
}

#[test]
fn a_share_never_scales_a_limit_below_one_requests_cost() {
    let (decider, fake) = decider(OnError::Local, 0.01);
    *fake.failure.locked() = Some(LimiterError::Refused("down".into()));
    assert_eq!(admitted_of(&decider, "k", 3, 4).0, 1);
    // Only timeouts may still run late: a refused call is not reported.
    assert!(fake.fallbacks.locked().is_empty());
}

#[test]
fn on_error_allow_and_deny_answer_without_decisions() {
    for (policy, admitted, source) in [
        (OnError::Allow, true, Source::FailOpen),
        (OnError::Deny, false, Source::FailClosed),
    ] {
        let (decider, fake) = decider(policy, 1.0);
        *fake.failure.locked() = Some(LimiterError::Io("reset".into()));
        let outcome = run(decider.decide(&[check("k", 5)]));
        assert_eq!((outcome.admitted, outcome.source), (admitted, source));
        assert!(outcome.decisions.is_empty());
    }
}

#[test]
fn readiness_fails_only_when_decisions_would_fail_closed() {
    for (policy, ready_when_down) in [
        (OnError::Deny, false),
        (OnError::Allow, true),
        (OnError::Local, true),
    ] {
        let (decider, fake) = decider(policy, 1.0);
        assert!(decider.is_ready());
        fake.unhealthy.store(true, Ordering::Relaxed);
        assert_eq!(decider.is_ready(), ready_when_down, "{policy:?}");
    }
}

/// Not ready while the first connect runs, whatever `on_error` says; once
/// it failed, ready as `on_error` allows, saying what decides meanwhile.
#[test]
fn readiness_waits_for_the_first_connect() {
    for (policy, ready_when_unreachable) in [
        (OnError::Deny, false),
        (OnError::Allow, true),
        (OnError::Local, true),
    ] {
        let (decider, fake) = decider(policy, 1.0);
        *fake.link.locked() = Some(Link::Starting);
        assert_eq!(
            decider.readiness(),
            Readiness::NotReady("connecting to Redis"),
            "{policy:?}"
        );
        *fake.link.locked() = Some(Link::Unreachable);
        assert_eq!(decider.is_ready(), ready_when_unreachable, "{policy:?}");
        if ready_when_unreachable {
            assert!(matches!(decider.readiness(), Readiness::Degraded(_)));
        }
        *fake.link.locked() = Some(Link::Connected);
        assert_eq!(decider.readiness(), Readiness::Ready, "{policy:?}");
    }
}

#[test]
fn only_the_backends_own_denials_are_remembered() {
    let (decider, fake) = decider(OnError::Local, 0.5);
    // The fallback denies the third request (share 2 of 4)...
    *fake.failure.locked() = Some(LimiterError::Timeout(Duration::from_millis(20)));
    assert_eq!(admitted_of(&decider, "k", 4, 3).0, 2);
    // ...but once the backend answers again, it decides, not a remembered
    // fallback denial.
    *fake.failure.locked() = None;
    let calls = fake.calls.load(Ordering::Relaxed);
    let outcome = run(decider.decide(&[check("k", 4)]));
    assert_eq!((outcome.source, outcome.admitted), (Source::Redis, true));
    assert_eq!(fake.calls.load(Ordering::Relaxed), calls + 1);

    // A denial of the backend answers the next request without a call.
    *fake.deny_for.locked() = Some(Duration::from_secs(30));
    let denied = run(decider.decide(&[check("k", 4)]));
    assert_eq!((denied.source, denied.admitted), (Source::Redis, false));
    let calls = fake.calls.load(Ordering::Relaxed);
    let cached = run(decider.decide(&[check("k", 4)]));
    assert_eq!((cached.source, cached.admitted), (Source::DenyCache, false));
    assert_eq!(fake.calls.load(Ordering::Relaxed), calls, "no call made");
}

#[test]
fn a_reload_keeps_what_did_not_change() {
    let (decider, _fake) = decider(OnError::Local, 1.0);
    let same = decider
        .reconfigure(&settings(OnError::Allow, 1.0))
        .expect("reload");
    let (old, new) = (decider.redis.as_ref(), same.redis.as_ref());
    assert!(
        Arc::ptr_eq(old.expect("old"), new.expect("new")),
        "the same Redis settings keep the backend and its connections"
    );
    assert!(Arc::ptr_eq(&decider.local, &same.local));

    let moved = decider
        .reconfigure(&LimiterConfig {
            redis: RedisConfig {
                url: "redis://127.0.0.1:1/0".into(),
                ..RedisConfig::default()
            },
            ..settings(OnError::Local, 1.0)
        })
        .expect("reload");
    assert!(!Arc::ptr_eq(
        old.expect("old"),
        moved.redis.as_ref().expect("new")
    ));

    let resized = decider
        .reconfigure(&LimiterConfig {
            local_max_keys: 10,
            ..settings(OnError::Local, 1.0)
        })
        .expect("reload");
    assert!(!Arc::ptr_eq(&decider.local, &resized.local));
}
