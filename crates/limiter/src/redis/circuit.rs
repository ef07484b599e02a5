//! The circuit breaker (docs/operations.md, "When Redis fails").
//!
//! Closed: calls go to Redis; 3 consecutive failures open the circuit. Open:
//! no call is made for the back-off (1 s, doubling to 30 s, ±20 % jitter) and
//! decisions follow `on_error` at once. When the back-off ends, exactly one
//! call is let through as a probe: its success closes the circuit (and resets
//! the back-off), its failure opens it again for twice as long. A probe that
//! never reports (its request was cancelled) is replaced after `probe_timeout`.
//!
//! Failures are counted per wave, not per decision: a failure of a call that
//! started before the last counted failure is part of that failure (one
//! stalled round trip or one dropped connection fails every decision in
//! flight at once, and must count once). A timeout says Redis is slow, not
//! down: timeouts open the circuit only once they have lasted
//! [`SLOW_STREAK_TO_OPEN`], so a stall of a few hundred milliseconds costs
//! the decisions made during it and no more, and decisions return to Redis
//! as soon as it answers. Refused connections, I/O errors and
//! `LOADING`-style replies open it after 3 waves as before.
//!
//! Only failures that say Redis itself is unhealthy count (timeouts, I/O,
//! LOADING, BUSY, OOM, READONLY, CLUSTERDOWN …); an error confined to one key
//! (WRONGTYPE) does not. A probe refused at connect (nothing listens: Redis is
//! restarting) does not double the back-off: probing a closed port costs Redis
//! nothing, and keeping the 1 s rhythm lets a restarted Redis be used again
//! within about a second. Time is passed in, so the state machine is tested
//! with a fake clock.

use crate::sync::Locked;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Consecutive failures that open the circuit.
pub const FAILURES_TO_OPEN: u32 = 3;
/// How long timeouts alone must go on before they open the circuit.
pub const SLOW_STREAK_TO_OPEN: Duration = Duration::from_secs(1);

/// How a call failed, as far as the circuit is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Nothing accepts connections (Redis down or restarting).
    Refused,
    /// The connection broke, or Redis answered that it cannot serve.
    Down,
    /// No answer within the budget.
    Slow,
}
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What a caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call Redis (circuit closed).
    Call,
    /// Call Redis as the one probe of an open circuit.
    Probe,
    /// Do not call Redis: the circuit is open.
    Reject,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// `failures` waves so far, the first at `first`, the last at `last`.
    Closed {
        failures: u32,
        first: Option<Instant>,
        last: Option<Instant>,
    },
    Open {
        until: Instant,
        backoff: Duration,
    },
    Probing {
        since: Instant,
        backoff: Duration,
    },
}

/// A thread-safe circuit breaker. The lock is never held across an await.
#[derive(Debug)]
pub struct CircuitBreaker {
    phase: Mutex<Phase>,
    probe_timeout: Duration,
}

/// What a state change means, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changed that a person needs to know.
    None,
    /// The circuit opened (or re-opened after a failed probe) for this long.
    Opened(Duration),
    /// The circuit closed: Redis answers again.
    Closed,
}

impl CircuitBreaker {
    /// A closed circuit; a probe that has not reported after `probe_timeout`
    /// is presumed lost.
    pub fn new(probe_timeout: Duration) -> Self {
        Self {
            phase: Mutex::new(CLOSED),
            probe_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        // Phase is a plain value, always whole: poisoning cannot corrupt it.
        self.phase.locked()
    }

    /// Whether a call may be made at `now`.
    pub fn permit(&self, now: Instant) -> Permit {
        let mut phase = self.lock();
        match *phase {
            Phase::Closed { .. } => Permit::Call,
            Phase::Open { until, backoff } if now >= until => {
                *phase = Phase::Probing {
                    since: now,
                    backoff,
                };
                Permit::Probe
            }
            Phase::Probing { since, backoff } if now >= since + self.probe_timeout => {
                *phase = Phase::Probing {
                    since: now,
                    backoff,
                };
                Permit::Probe
            }
            Phase::Open { .. } | Phase::Probing { .. } => Permit::Reject,
        }
    }

    /// Records a successful call.
    pub fn on_success(&self) -> Transition {
        let mut phase = self.lock();
        let was_closed = matches!(*phase, Phase::Closed { .. });
        *phase = CLOSED;
        if was_closed {
            Transition::None
        } else {
            Transition::Closed
        }
    }

    /// Records a call, started at `started`, that failed at `now` because
    /// Redis is unhealthy in the way `failure` says.
    pub fn on_failure(&self, now: Instant, started: Instant, failure: Failure) -> Transition {
        let mut phase = self.lock();
        match *phase {
            // Part of the wave already counted.
            Phase::Closed {
                last: Some(last), ..
            } if started <= last => Transition::None,
            Phase::Closed {
                failures, first, ..
            } => {
                let failures = failures + 1;
                let first = first.unwrap_or(now);
                let lasted = now.saturating_duration_since(first);
                if failures >= FAILURES_TO_OPEN
                    && (failure != Failure::Slow || lasted >= SLOW_STREAK_TO_OPEN)
                {
                    let wait = jittered(FIRST_BACKOFF);
                    *phase = Phase::Open {
                        until: now + wait,
                        backoff: FIRST_BACKOFF,
                    };
                    return Transition::Opened(wait);
                }
                *phase = Phase::Closed {
                    failures,
                    first: Some(first),
                    last: Some(now),
                };
                Transition::None
            }
            Phase::Probing { backoff, .. } => {
                let backoff = if failure == Failure::Refused {
                    FIRST_BACKOFF
                } else {
                    (backoff * 2).min(MAX_BACKOFF)
                };
                let wait = jittered(backoff);
                *phase = Phase::Open {
                    until: now + wait,
                    backoff,
                };
                Transition::Opened(wait)
            }
            // A call started before the circuit opened: already counted.
            Phase::Open { .. } => Transition::None,
        }
    }

    /// Whether calls are currently refused (open, or waiting on a probe).
    pub fn is_open(&self) -> bool {
        !matches!(*self.lock(), Phase::Closed { .. })
    }
}

const CLOSED: Phase = Phase::Closed {
    failures: 0,
    first: None,
    last: None,
};

/// `d` ± 20 %, so that many instances do not probe a recovering Redis in step.
fn jittered(d: Duration) -> Duration {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(d.as_nanos() as u64);
    let unit = (hasher.finish() % 10_001) as f64 / 10_000.0; // 0.0 ..= 1.0
    d.mul_f64(0.8 + 0.4 * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

    /// A failure of a call that started after every earlier failure.
    fn fail(cb: &CircuitBreaker, at: Instant, failure: Failure) -> Transition {
        cb.on_failure(at, at, failure)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn opens_after_three_failures_and_rejects() {
        let cb = CircuitBreaker::new(PROBE_TIMEOUT);
        let t0 = Instant::now();
        assert_eq!(fail(&cb, t0, Failure::Down), Transition::None);
        assert_eq!(fail(&cb, t0 + ms(1), Failure::Down), Transition::None);
        assert_eq!(cb.permit(t0), Permit::Call);
        let Transition::Opened(wait) = fail(&cb, t0 + ms(2), Failure::Down) else {
            panic!("should open")
        };
        assert!(
            wait >= Duration::from_millis(800) && wait <= Duration::from_millis(1200),
            "{wait:?}"
        );
        assert!(cb.is_open());
        assert_eq!(cb.permit(t0 + Duration::from_millis(500)), Permit::Reject);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let cb = CircuitBreaker::new(PROBE_TIMEOUT);
        let t0 = Instant::now();
        fail(&cb, t0, Failure::Down);
        fail(&cb, t0 + ms(1), Failure::Down);
        assert_eq!(cb.on_success(), Transition::None);
        fail(&cb, t0 + ms(2), Failure::Down);
        fail(&cb, t0 + ms(3), Failure::Down);
        assert!(!cb.is_open());
    }

    #[test]
    fn one_probe_closes_or_doubles_the_backoff() {
        let cb = CircuitBreaker::new(PROBE_TIMEOUT);
        let t0 = Instant::now();
        for i in 0..3 {
            fail(&cb, t0 + ms(i), Failure::Down);
        }
        let t1 = t0 + Duration::from_millis(1300);
        assert_eq!(cb.permit(t1), Permit::Probe);
        assert_eq!(cb.permit(t1), Permit::Reject, "only one probe at a time");
        let Transition::Opened(wait) = fail(&cb, t1, Failure::Down) else {
            panic!("failed probe re-opens")
        };
        assert!(
            wait >= Duration::from_millis(1600) && wait <= Duration::from_millis(2400),
            "{wait:?}"
        );
        let t2 = t1 + Duration::from_millis(2500);
        assert_eq!(cb.permit(t2), Permit::Probe);
        assert_eq!(cb.on_success(), Transition::Closed);
        assert_eq!(cb.permit(t2), Permit::Call);
    }

    #[test]
    fn refused_probes_keep_the_first_backoff() {
        let cb = CircuitBreaker::new(PROBE_TIMEOUT);
        let mut now = Instant::now();
        for _ in 0..3 {
            now += ms(1);
            fail(&cb, now, Failure::Refused);
        }
        for _ in 0..5 {
            now += Duration::from_millis(1300);
            assert_eq!(cb.permit(now), Permit::Probe);
            let Transition::Opened(wait) = fail(&cb, now, Failure::Refused) else {
                panic!()
            };
            assert!(wait <= Duration::from_millis(1200), "{wait:?}");
        }
    }

    #[test]
    fn backoff_is_capped_and_lost_probes_are_replaced() {
        let cb = CircuitBreaker::new(PROBE_TIMEOUT);
        let mut now = Instant::now();
        for _ in 0..3 {
            now += ms(1);
            fail(&cb, now, Failure::Down);
        }
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            now += Duration::from_secs(40);
            assert_eq!(cb.permit(now), Permit::Probe);
            if let Transition::Opened(wait) = fail(&cb, now, Failure::Down) {
                last = wait;
            }
        }
        assert!(last <= Duration::from_secs(36), "{last:?}");
        now += Duration::from_secs(40);
        assert_eq!(cb.permit(now), Permit::Probe);
        // The probe's request vanished without reporting: another is allowed later.
        assert_eq!(cb.permit(now + Duration::from_millis(100)), Permit::Reject);
        assert_eq!(cb.permit(now + PROBE_TIMEOUT), Permit::Probe);
    }

    #[test]
    fn one_wave_of_failures_counts_once() {
        let cb = CircuitBreaker::new(PROBE_TIMEOUT);
        let t0 = Instant::now();
        // 64 decisions in flight when the connection drops: one failure.
        for _ in 0..64 {
            cb.on_failure(t0 + ms(5), t0, Failure::Down);
        }
        assert!(!cb.is_open());
        // Calls made after it fail too: the second and third waves open it.
        cb.on_failure(t0 + ms(10), t0 + ms(6), Failure::Down);
        let opened = cb.on_failure(t0 + ms(15), t0 + ms(11), Failure::Down);
        assert!(matches!(opened, Transition::Opened(_)));
    }

    #[test]
    fn timeouts_open_the_circuit_only_when_they_last() {
        let cb = CircuitBreaker::new(PROBE_TIMEOUT);
        let t0 = Instant::now();
        // A 500 ms stall with a 20 ms budget: 25 waves of timeouts.
        for i in 0..25 {
            assert_eq!(fail(&cb, t0 + ms(20 * i), Failure::Slow), Transition::None);
        }
        assert!(!cb.is_open(), "a short stall must not open the circuit");
        assert_eq!(cb.on_success(), Transition::None);
        // Redis answering nothing for over a second does open it.
        let t1 = t0 + ms(2000);
        let mut opened = false;
        for i in 0..60 {
            opened |= matches!(
                fail(&cb, t1 + ms(20 * i), Failure::Slow),
                Transition::Opened(_)
            );
        }
        assert!(opened && cb.is_open());
    }
}
