//! A decision's deadline on Redis's clock: the moment after which Redis must
//! not run it, because the gateway has given up on it and answered by
//! `on_error`.
//!
//! The gateway's clock and Redis's never need to agree. Every batch reply
//! carries Redis's `now`; the difference between it and this process's
//! monotonic clock at the moment the reply is read is the offset
//! ([`RedisClock::observe`]). A deadline on the local clock plus that offset
//! is the deadline on Redis's ([`RedisClock::deadline`]).
//!
//! Why that is safe: the offset is read after the reply travelled back, so
//! it is smaller than the true one by that trip, and the deadline it gives
//! falls *before* the gateway's own. Redis running the decision after it
//! has therefore run it after the gateway gave up, and skips it; a decision
//! Redis runs before it, the gateway is still waiting for (or, rarely, its
//! reply comes back just after the budget: then it is reconciled from that
//! reply, see `reconcile`). The one exception is Redis's clock stepping
//! back between the last reply and the run, by more than the trip: the
//! offset follows the newest reply, so that window is one round trip long.
//! Until a first reply, no deadline is sent (and late runs are reconciled
//! as before).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// No offset observed yet.
const UNKNOWN: i64 = i64::MIN;

/// Redis's clock as seen from this process.
#[derive(Debug)]
pub struct RedisClock {
    /// Redis's µs minus this process's monotonic µs, or [`UNKNOWN`].
    offset: AtomicI64,
}

impl Default for RedisClock {
    fn default() -> Self {
        // Starts the local clock's count before any instant it is given.
        local_micros(Instant::now());
        Self {
            offset: AtomicI64::new(UNKNOWN),
        }
    }
}

impl RedisClock {
    /// Takes `redis_now` (µs since the epoch, Redis's `TIME`), read from a
    /// reply at `received`.
    pub fn observe(&self, redis_now: i64, received: Instant) {
        let offset = redis_now.saturating_sub(local_micros(received));
        if offset != UNKNOWN {
            self.offset.store(offset, Ordering::Relaxed);
        }
    }

    /// The local instant `at` on Redis's clock (µs since the epoch), once
    /// a reply has told where that clock stands.
    pub fn deadline(&self, at: Instant) -> Option<i64> {
        match self.offset.load(Ordering::Relaxed) {
            UNKNOWN => None,
            offset => Some(local_micros(at).saturating_add(offset)),
        }
    }
}

/// Microseconds of this process's monotonic clock since its first use.
fn local_micros(at: Instant) -> i64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    let micros = at.saturating_duration_since(origin).as_micros();
    i64::try_from(micros).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn no_deadline_before_a_reply_then_the_local_instant_on_redis_clock() {
        let clock = RedisClock::default();
        let now = Instant::now();
        assert_eq!(clock.deadline(now), None);
        clock.observe(1_700_000_000_000_000, now);
        let later = now + Duration::from_millis(20);
        assert_eq!(clock.deadline(later), Some(1_700_000_000_020_000));
        // The newest reply wins: Redis's clock stepped back 1 s.
        clock.observe(1_699_999_999_000_000, now);
        assert_eq!(clock.deadline(later), Some(1_699_999_999_020_000));
    }

    #[test]
    fn a_reply_read_late_gives_an_earlier_deadline() {
        let clock = RedisClock::default();
        let ran = Instant::now();
        // Redis ran at `ran`; the reply is read 5 ms later.
        clock.observe(1_700_000_000_000_000, ran + Duration::from_millis(5));
        let give_up = ran + Duration::from_millis(100);
        let deadline = clock.deadline(give_up).expect("a deadline");
        assert_eq!(deadline, 1_700_000_000_095_000, "5 ms before the gateway's");
    }
}
