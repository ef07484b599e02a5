//! The last minutes of the gateway's counters, for the console's charts and
//! `/v1/rates`: every [`STEP`] a background service reads each limit's
//! decision counters, each upstream's 502/504 counts and the Redis
//! round-trip histogram, and keeps the last [`KEPT`] readings. Rates are the
//! differences between readings, so the request path does nothing more
//! than it did: it only counts, as it always has, and the sampler reads.

use crate::admin::config_status::unix_seconds;
use crate::observe::metrics::{DecisionTotals, Metrics};
use crate::policy::state::SharedState;
use crate::sync::Locked;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How often the counters are read.
pub const STEP: Duration = Duration::from_secs(2);

/// Readings kept: five minutes of them, and one more to difference the
/// first against.
pub const KEPT: usize = 151;

/// One limit's counters at a reading.
#[derive(Debug, Clone)]
pub(crate) struct LimitReading {
    /// The route's name.
    pub route: String,
    /// The limit's name.
    pub limit: String,
    /// Its decisions so far.
    pub totals: DecisionTotals,
}

/// Everything read at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    /// When.
    pub at: SystemTime,
    /// Each route's limits, in the configuration's order.
    pub limits: Vec<LimitReading>,
    /// Each upstream's name and its (502s, 504s) so far.
    pub upstreams: Vec<(String, (u64, u64))>,
    /// The Redis round-trip histogram (upper bound, cumulative count).
    pub redis_buckets: Vec<(f64, u64)>,
}

impl Reading {
    /// The limit `route`/`limit`'s totals in this reading.
    pub fn limit(&self, route: &str, limit: &str) -> Option<DecisionTotals> {
        self.limits
            .iter()
            .find(|l| l.route == route && l.limit == limit)
            .map(|l| l.totals)
    }

    /// The upstream `name`'s (502s, 504s) in this reading.
    pub fn upstream(&self, name: &str) -> Option<(u64, u64)> {
        self.upstreams
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, counts)| *counts)
    }

    /// Seconds from `earlier` to this reading (at least a millisecond).
    pub fn seconds_since(&self, earlier: &Reading) -> f64 {
        let elapsed = self.at.duration_since(earlier.at).unwrap_or_default();
        elapsed.as_secs_f64().max(0.001)
    }
}

/// The readings kept, oldest first.
#[derive(Debug, Default)]
pub struct History {
    readings: Mutex<VecDeque<Arc<Reading>>>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `reading`, dropping the oldest beyond [`KEPT`].
    pub(crate) fn push(&self, reading: Reading) {
        let mut readings = self.readings.locked();
        if readings.len() == KEPT {
            readings.pop_front();
        }
        readings.push_back(Arc::new(reading));
    }

    /// Every reading kept, oldest first.
    pub(crate) fn readings(&self) -> Vec<Arc<Reading>> {
        self.readings.locked().iter().cloned().collect()
    }

    /// The oldest reading at most `span` before the newest, and the
    /// newest: what a rate over the last `span` is taken between. `None`
    /// with fewer than two readings.
    pub(crate) fn span(&self, span: Duration) -> Option<(Arc<Reading>, Arc<Reading>)> {
        let readings = self.readings.locked();
        let newest = readings.back()?;
        let oldest = readings
            .iter()
            .find(|r| newest.at.duration_since(r.at).unwrap_or_default() <= span)?;
        (!Arc::ptr_eq(oldest, newest)).then(|| (Arc::clone(oldest), Arc::clone(newest)))
    }
}

/// A counter's growth from `before` to `after`; a counter that started
/// again (a rebuilt upstream pool) counts from zero.
pub(crate) fn growth(before: u64, after: u64) -> u64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

/// The background service that reads the counters every [`STEP`].
pub struct Sampler {
    history: Arc<History>,
    state: SharedState,
    metrics: Arc<Metrics>,
}

impl Sampler {
    /// A sampler of `state`'s limits and upstreams and of `metrics`' Redis
    /// histogram into `history`.
    pub fn new(history: Arc<History>, state: SharedState, metrics: Arc<Metrics>) -> Self {
        Sampler {
            history,
            state,
            metrics,
        }
    }

    /// Reads everything once, now.
    fn read(&self) -> Reading {
        let state = self.state.load();
        let limits = state
            .compiled
            .iter()
            .flat_map(|route| {
                route.limits.iter().map(|limit| LimitReading {
                    route: route.name.clone(),
                    limit: limit.config.name.clone(),
                    totals: limit.counters.totals(),
                })
            })
            .collect();
        let upstreams = state
            .upstreams
            .iter()
            .map(|u| (u.name().to_string(), u.gateway_errors.totals()))
            .collect();
        Reading {
            at: SystemTime::now(),
            limits,
            upstreams,
            redis_buckets: self.metrics.redis.duration_buckets(),
        }
    }
}

#[async_trait]
impl BackgroundService for Sampler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut every = tokio::time::interval(STEP);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = every.tick() => self.history.push(self.read()),
            }
        }
    }
}

/// The `q` quantile (0 to 1) of the observations between two readings of
/// a cumulative histogram: the upper bound of the first bucket that holds
/// it (`None` without observations; infinite past the last finite bound).
pub(crate) fn quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> Option<f64> {
    let count = |buckets: &[(f64, u64)], i: usize| buckets.get(i).map_or(0, |b| b.1);
    let last = after.len().checked_sub(1)?;
    let total = growth(count(before, last), count(after, last));
    if total == 0 {
        return None;
    }
    let wanted = (q * total as f64).ceil().max(1.0) as u64;
    after.iter().enumerate().find_map(|(i, (bound, _))| {
        (growth(count(before, i), count(after, i)) >= wanted).then_some(*bound)
    })
}

/// The series of `/v1/rates`: for each pair of consecutive readings, its
/// end time (Unix seconds), and per limit of `limits` (route, limit) the
/// rates per second of (allowed, denied, shadow-denied), `None` where a
/// reading lacks the limit.
pub(crate) type Series = (Vec<f64>, Vec<[Vec<Option<f64>>; 3]>);

/// The per-second rates of `limits` between consecutive `readings`.
pub(crate) fn rates(readings: &[Arc<Reading>], limits: &[(String, String)]) -> Series {
    let at = readings
        .iter()
        .skip(1)
        .map(|r| unix_seconds(r.at))
        .collect();
    let series = limits
        .iter()
        .map(|(route, limit)| {
            let mut columns: [Vec<Option<f64>>; 3] = Default::default();
            for pair in readings.windows(2) {
                let (before, after) = (&pair[0], &pair[1]);
                let seconds = after.seconds_since(before);
                let totals = before.limit(route, limit).zip(after.limit(route, limit));
                let rate = |pick: fn(&DecisionTotals) -> u64| {
                    totals.map(|(b, a)| growth(pick(&b), pick(&a)) as f64 / seconds)
                };
                columns[0].push(rate(|t| t.allowed));
                columns[1].push(rate(|t| t.denied));
                columns[2].push(rate(|t| t.shadow_denied));
            }
            columns
        })
        .collect();
    (at, series)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(seconds: u64, allowed: u64, denied: u64) -> Arc<Reading> {
        let totals = DecisionTotals {
            allowed,
            denied,
            ..DecisionTotals::default()
        };
        Arc::new(Reading {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(seconds),
            limits: vec![LimitReading {
                route: "api".into(),
                limit: "per-ip".into(),
                totals,
            }],
            upstreams: vec![],
            redis_buckets: vec![],
        })
    }

    #[test]
    fn rates_are_differences_per_second_between_readings() {
        let readings = [
            reading(100, 0, 0),
            reading(102, 10, 4),
            reading(104, 10, 10),
        ];
        let limits = [("api".to_string(), "per-ip".to_string())];
        let (at, series) = rates(&readings, &limits);
        assert_eq!(at, vec![102.0, 104.0]);
        assert_eq!(series[0][0], vec![Some(5.0), Some(0.0)]);
        assert_eq!(series[0][1], vec![Some(2.0), Some(3.0)]);
        let unknown = [("api".to_string(), "other".to_string())];
        assert_eq!(rates(&readings, &unknown).1[0][0], vec![None, None]);
    }

    #[test]
    fn the_history_keeps_the_last_readings_and_spans_a_window() {
        let history = History::new();
        for i in 0..(KEPT as u64 + 10) {
            history.push((*reading(i * 2, i, 0)).clone());
        }
        let readings = history.readings();
        assert_eq!(readings.len(), KEPT);
        let (oldest, newest) = history.span(Duration::from_secs(60)).unwrap();
        assert_eq!(newest.seconds_since(&oldest), 60.0);
        assert_eq!(growth(10, 4), 4, "a counter that started again");
    }

    #[test]
    fn a_quantile_is_the_bound_of_the_bucket_that_holds_it() {
        let before = [(0.001, 10), (0.01, 10), (f64::INFINITY, 10)];
        let after = [(0.001, 108), (0.01, 110), (f64::INFINITY, 110)];
        assert_eq!(quantile(&before, &after, 0.5), Some(0.001));
        assert_eq!(quantile(&before, &after, 0.99), Some(0.01));
        assert_eq!(quantile(&after, &after, 0.99), None);
    }
}
