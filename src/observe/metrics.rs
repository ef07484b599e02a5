//! The Prometheus registry and every metric (docs/operations.md, "Metrics and health").
//!
//! Label values come only from the configuration (route and limit names) and
//! from fixed sets (status codes, decision, source, error kind) — never from a
//! request, so the series count is bounded by the config.

use crate::limiter::{LimiterError, RedisObserver, Source};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Handles to every sluice metric, registered in one private registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `sluice_requests_total{route,status}`.
    pub requests: IntCounterVec,
    /// `sluice_request_duration_seconds{route}`.
    pub request_duration: HistogramVec,
    /// `sluice_ratelimit_decisions_total{route,limit,decision,source}`.
    pub decisions: IntCounterVec,
    /// `sluice_ratelimit_reserve_units_total{route,limit,kind}`: units
    /// reserved, given back and overdrawn by limits that reserve (kinds in
    /// [`RESERVE_KINDS`]).
    pub reserve_units: IntCounterVec,
    /// `sluice_config_reloads_total{result}`.
    pub config_reloads: IntCounterVec,
    /// The Redis metrics, handed to the Redis backend.
    pub redis: RedisMetrics,
    /// The API-key metrics, handed to the identity.
    pub identity: IdentityMetrics,
    /// `sluice_downstream_connections`: client connections open now.
    pub downstream_connections: IntGauge,
    /// `sluice_downstream_rejected_total{reason}`, reasons in [`REJECT_REASONS`].
    pub downstream_rejected: IntCounterVec,
    /// `sluice_access_log_dropped_total`: lines dropped because the access
    /// log's queue was full.
    pub access_log_dropped: IntCounter,
    /// `sluice_tracing_dropped_total`: spans that never reached the
    /// collector (the export queue was full, or the collector refused them).
    pub tracing_dropped: IntCounter,
    /// `sluice_ratelimit_delay_seconds{route}`: how long delayed requests
    /// waited for their turn (`on_limit: delay`).
    pub delays: HistogramVec,
    /// `sluice_ratelimit_waiting`: requests waiting for their turn now.
    pub waiting: IntGauge,
    /// `sluice_ratelimit_leases_held`: concurrency leases this instance
    /// holds (and renews) now; set when the metrics are read.
    pub leases_held: IntGauge,
    /// `sluice_upstream_retries_total{route}`: tries after a request's first.
    pub upstream_retries: IntCounterVec,
    /// `sluice_rls_requests_total{code}`: the rate-limit service's answers,
    /// codes in [`RLS_CODES`].
    pub rls_requests: IntCounterVec,
    /// `sluice_upstream_server_up{upstream,server}`: 1 while a server is
    /// in selection (health check and passive health); set when read.
    pub upstream_server_up: prometheus::IntGaugeVec,
}

/// Why the front door closed or refused a client connection (the `reason`
/// label of `sluice_downstream_rejected_total`).
pub const REJECT_REASONS: [&str; 8] = [
    "max_connections",
    "handshake_timeout",
    "header_timeout",
    "body_timeout",
    "send_timeout",
    "header_too_large",
    "uri_too_long",
    "body_too_large",
];

/// The answers of the rate-limit service (the `code` label of
/// `sluice_rls_requests_total`): `ok` and `over_limit` (its overall code),
/// `unavailable` (no decision could be made, `on_error: deny`) and
/// `invalid_argument` (a malformed request).
pub const RLS_CODES: [&str; 4] = ["ok", "over_limit", "unavailable", "invalid_argument"];

/// The metrics the Redis backend updates.
#[derive(Clone)]
pub struct RedisMetrics {
    /// `sluice_redis_duration_seconds`: successful decision round trips.
    pub duration: Histogram,
    /// `sluice_redis_errors_total{kind}`.
    pub errors: IntCounterVec,
    /// `sluice_redis_up`: 1 after a successful call, 0 after a connection failure.
    pub up: IntGauge,
}

impl RedisMetrics {
    /// The round-trip histogram's buckets as (upper bound in seconds,
    /// cumulative count), the last one `+Inf`.
    pub fn duration_buckets(&self) -> Vec<(f64, u64)> {
        use prometheus::core::Metric;
        let metric = self.duration.metric();
        let histogram = metric.get_histogram();
        let mut buckets: Vec<(f64, u64)> = histogram
            .get_bucket()
            .iter()
            .map(|b| (b.upper_bound(), b.cumulative_count()))
            .collect();
        buckets.push((f64::INFINITY, histogram.get_sample_count()));
        buckets
    }
}

impl RedisObserver for RedisMetrics {
    fn call_succeeded(&self, elapsed: std::time::Duration) {
        self.duration.observe(elapsed.as_secs_f64());
    }

    fn call_failed(&self, error: &LimiterError) {
        self.errors.with_label_values(&[error.kind()]).inc();
    }

    fn set_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }
}

/// The decision label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionLabel {
    /// Admitted.
    Allow,
    /// Denied.
    Deny,
    /// A shadow limit would have denied; the request was not denied for it.
    ShadowDeny,
    /// Admitted after waiting for its turn (`on_limit: delay`).
    Delayed,
}

impl DecisionLabel {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            DecisionLabel::Allow => "allow",
            DecisionLabel::Deny => "deny",
            DecisionLabel::ShadowDeny => "shadow_deny",
            DecisionLabel::Delayed => "delayed",
        }
    }
}

/// A limit's decisions so far (see [`LimitCounters::totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecisionTotals {
    /// Admitted (at once or after a delay).
    pub allowed: u64,
    /// Denied.
    pub denied: u64,
    /// Would have been denied by a shadow limit.
    pub shadow_denied: u64,
    /// Decided in process (`backend: local`, or Redis failing with `on_error: local`).
    pub local: u64,
    /// Decided by `on_error: allow` or `deny` while Redis failed.
    pub failed_over: u64,
}

/// What a limit's decisions can be, which decides the series it has:
/// only pairs of `decision` and `source` that can happen are exported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitShape {
    /// A shadow limit (`decision="shadow_deny"`).
    pub shadow: bool,
    /// Some `exempt:` rule applies to it (`decision="exempt"`).
    pub exemptible: bool,
    /// It delays (`on_limit: delay`: `decision="delayed"`).
    pub delays: bool,
    /// A remembered denial may answer for it (the deny cache is on, and
    /// the limit is neither shadow nor `concurrency`).
    pub deny_cache: bool,
    /// Who may decide for it.
    pub sources: Deciders,
}

/// Who may decide a limit: the limiter's backend and its `on_error`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deciders {
    /// Redis (`backend: redis`).
    pub redis: bool,
    /// The in-process limiter (`backend: local`, or `on_error: local`).
    pub local: bool,
    /// `on_error: allow` (admits only).
    pub fail_open: bool,
    /// `on_error: deny` (refuses only).
    pub fail_closed: bool,
}

impl LimitShape {
    /// A plain limit decided in process only (`backend: local`).
    pub fn local() -> Self {
        LimitShape {
            sources: Deciders {
                local: true,
                ..Deciders::default()
            },
            ..LimitShape::default()
        }
    }

    /// Whether `decision` can come from `source`.
    fn can(&self, decision: DecisionLabel, source: Source) -> bool {
        use DecisionLabel::{Allow, Delayed, Deny, ShadowDeny};
        let by_a_limiter = match source {
            Source::Redis => self.sources.redis,
            Source::Local => self.sources.local,
            _ => false,
        };
        match decision {
            Allow => by_a_limiter || (source == Source::FailOpen && self.sources.fail_open),
            Deny => {
                by_a_limiter
                    || (source == Source::FailClosed && self.sources.fail_closed)
                    || (source == Source::DenyCache && self.deny_cache)
            }
            ShadowDeny => self.shadow && by_a_limiter,
            Delayed => self.delays && by_a_limiter,
        }
    }
}

/// The `kind` label of `sluice_ratelimit_reserve_units_total`: units taken
/// before requests were proxied, units given back when their responses
/// cost less, and units charged beyond the reservation.
pub const RESERVE_KINDS: [&str; 3] = ["reserved", "given_back", "overdraft"];

/// Pre-resolved reservation counters of one limit that reserves.
#[derive(Clone)]
pub struct ReserveCounters {
    /// Units reserved.
    pub reserved: IntCounter,
    /// Units given back at settlement.
    pub given_back: IntCounter,
    /// Units charged beyond the reservation at settlement.
    pub overdraft: IntCounter,
}

/// Pre-resolved decision counters of one limit, one per (decision, source)
/// pair that can happen, so the request path does no label hashing.
#[derive(Clone)]
pub struct LimitCounters {
    counters: Vec<(DecisionLabel, Source, IntCounter)>,
    /// `decision="exempt", source="exempt"`: requests the limit did not
    /// count; only for a limit some `exempt:` rule applies to (no series of
    /// zeros for the others).
    exempt: Option<IntCounter>,
}

impl LimitCounters {
    /// Adds one request the limit did not count (see `exempt`).
    pub fn inc_exempt(&self) {
        if let Some(exempt) = &self.exempt {
            exempt.inc();
        }
    }

    /// What the limit decided so far, summed over sources: admitted
    /// (delayed ones included), denied, shadow-denied, and the decisions a
    /// fallback made (`local`, `fail_open`, `fail_closed`), whatever they said.
    pub fn totals(&self) -> DecisionTotals {
        let mut totals = DecisionTotals::default();
        for (decision, source, counter) in &self.counters {
            let count = counter.get();
            match decision {
                DecisionLabel::Allow | DecisionLabel::Delayed => totals.allowed += count,
                DecisionLabel::Deny => totals.denied += count,
                DecisionLabel::ShadowDeny => totals.shadow_denied += count,
            }
            match source {
                Source::Local => totals.local += count,
                Source::FailOpen | Source::FailClosed => totals.failed_over += count,
                Source::Redis | Source::DenyCache => {}
            }
        }
        totals
    }

    /// Adds one to the counter of (`decision`, `source`). A pair the
    /// limit's [`LimitShape`] says cannot happen has no series: it is
    /// logged (a bug to report) rather than counted.
    pub fn inc(&self, decision: DecisionLabel, source: Source) {
        match self
            .counters
            .iter()
            .find(|(d, s, _)| *d == decision && *s == source)
        {
            Some((_, _, counter)) => counter.inc(),
            None => log::error!(
                "no decision series for decision={} source={}: please report this",
                decision.name(),
                source.label()
            ),
        }
    }
}

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Registers `metric` in `registry` and hands it back.
fn register<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> Result<M, prometheus::Error> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// `sluice_identity_lookups_total{store,result}` and
/// `sluice_identity_failures_total`: API keys looked up, and unknown keys
/// counted against their client's `failures`.
#[derive(Clone)]
pub struct IdentityMetrics {
    /// Lookups by store (`file`, `redis`) and result (`hit`, `miss`, `error`).
    pub lookups: IntCounterVec,
    /// Unknown keys counted against a client's `failures`.
    pub failures: IntCounter,
    /// Requests by the identity method that decided (`header`, `jwt`,
    /// `api_key`, `client_cert`, `none`) and what it found (`known`,
    /// `invalid`, `absent`).
    pub requests: IntCounterVec,
    /// Auth-service answers by result (`ok`, `denied`, `error`, `timeout`,
    /// `cached`).
    pub auth_requests: IntCounterVec,
    /// How long the auth service took to answer.
    pub auth_request_seconds: Histogram,
    /// JWKS fetches by result (`ok`, `error`).
    pub jwks_fetches: IntCounterVec,
    /// Keys in the JWKS set tokens are verified with.
    pub jwks_keys: IntGauge,
    /// When a JWKS fetch last succeeded (Unix seconds; 0: never).
    pub jwks_last_success: IntGauge,
}

impl IdentityMetrics {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let opts = Opts::new(
            "sluice_identity_lookups_total",
            "API-key lookups, by store and result.",
        );
        let lookups = register(registry, IntCounterVec::new(opts, &["store", "result"])?)?;
        for store in ["file", "redis"] {
            for result in ["hit", "miss", "error"] {
                lookups.with_label_values(&[store, result]);
            }
        }
        let failures = IntCounter::new(
            "sluice_identity_failures_total",
            "Unknown API keys counted against their client IP's failures limit.",
        )?;
        let opts = Opts::new(
            "sluice_identity_jwks_fetches_total",
            "Fetches of identity.jwt.jwks_url, by result (a failed one keeps the last good keys).",
        );
        let jwks_fetches = register(registry, IntCounterVec::new(opts, &["result"])?)?;
        for result in ["ok", "error"] {
            jwks_fetches.with_label_values(&[result]);
        }
        let jwks_keys = IntGauge::new(
            "sluice_identity_jwks_keys",
            "Signing keys in the JWKS set tokens are verified with.",
        )?;
        let jwks_last_success = IntGauge::new(
            "sluice_identity_jwks_last_success_timestamp_seconds",
            "When a fetch of identity.jwt.jwks_url last succeeded (Unix time; 0: never).",
        )?;
        let opts = Opts::new(
            "sluice_identity_requests_total",
            "Requests by the identity method whose credential decided (none: no credential) and what it found.",
        );
        let requests = register(registry, IntCounterVec::new(opts, &["method", "result"])?)?;
        let opts = Opts::new(
            "sluice_identity_auth_requests_total",
            "Answers of identity.auth_request, by result (cached: reused for the same credential).",
        );
        let auth_requests = register(registry, IntCounterVec::new(opts, &["result"])?)?;
        for result in ["ok", "denied", "error", "timeout", "cached"] {
            auth_requests.with_label_values(&[result]);
        }
        let opts = HistogramOpts::new(
            "sluice_identity_auth_request_seconds",
            "How long identity.auth_request took to answer (or to time out).",
        )
        .buckets(vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ]);
        let auth_request_seconds = register(registry, Histogram::with_opts(opts)?)?;
        Ok(Self {
            lookups,
            requests,
            auth_requests,
            auth_request_seconds,
            jwks_fetches,
            jwks_keys: register(registry, jwks_keys)?,
            jwks_last_success: register(registry, jwks_last_success)?,
            failures: register(registry, failures)?,
        })
    }
}

/// A registered counter family with `labels`, every series of `values`
/// created at 0 (so that `increase()` and `rate()` see the first event).
fn counters(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    values: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    let family = register(registry, IntCounterVec::new(Opts::new(name, help), labels)?)?;
    for value in values {
        family.with_label_values(&[value]);
    }
    Ok(family)
}

/// A registered counter family by `route` (series made as routes load).
fn by_route(
    registry: &Registry,
    name: &str,
    help: &str,
) -> Result<IntCounterVec, prometheus::Error> {
    counters(registry, name, help, &["route"], &[])
}

/// `sluice_ratelimit_decisions_total{route,limit,decision,source}`.
fn decisions(registry: &Registry) -> Result<IntCounterVec, prometheus::Error> {
    counters(
        registry,
        "sluice_ratelimit_decisions_total",
        "Rate-limit decisions, by route, limit, decision and source.",
        &["route", "limit", "decision", "source"],
        &[],
    )
}

/// `sluice_ratelimit_reserve_units_total{route,limit,kind}`.
fn reserve_units(registry: &Registry) -> Result<IntCounterVec, prometheus::Error> {
    counters(
        registry,
        "sluice_ratelimit_reserve_units_total",
        "Units limits reserved before proxying, gave back when responses cost less, and charged beyond reservations (overdraft), by route, limit and kind.",
        &["route", "limit", "kind"],
        &[],
    )
}

/// `sluice_rls_requests_total{code}`, every code at 0.
fn rls_requests(registry: &Registry) -> Result<IntCounterVec, prometheus::Error> {
    counters(
        registry,
        "sluice_rls_requests_total",
        "ShouldRateLimit calls answered by the rate-limit service, by code.",
        &["code"],
        &RLS_CODES,
    )
}

/// A registered counter.
fn counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter, prometheus::Error> {
    register(registry, IntCounter::new(name, help)?)
}

/// A registered gauge.
fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    register(registry, IntGauge::new(name, help)?)
}

/// A registered latency histogram family.
fn latencies(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<HistogramVec, prometheus::Error> {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    register(registry, HistogramVec::new(opts, labels)?)
}

impl RedisMetrics {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let opts = HistogramOpts::new(
            "sluice_redis_duration_seconds",
            "Round trip of successful Redis rate-limit calls.",
        )
        .buckets(LATENCY_BUCKETS.to_vec());
        Ok(Self {
            duration: register(registry, Histogram::with_opts(opts)?)?,
            errors: counters(
                registry,
                "sluice_redis_errors_total",
                "Failed Redis rate-limit calls, by kind.",
                &["kind"],
                &["timeout", "io", "server", "circuit_open"],
            )?,
            up: register(
                registry,
                IntGauge::new(
                    "sluice_redis_up",
                    "1 when the last Redis call succeeded, 0 when Redis is unreachable.",
                )?,
            )?,
        })
    }
}

/// `sluice_upstream_server_up{upstream,server}`, registered.
fn server_up_gauge(registry: &Registry) -> Result<prometheus::IntGaugeVec, prometheus::Error> {
    let opts = Opts::new(
        "sluice_upstream_server_up",
        "1 while a server is in selection (its health check passes and it is not out for its failures), by upstream and server as written.",
    );
    register(
        registry,
        prometheus::IntGaugeVec::new(opts, &["upstream", "server"])?,
    )
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        Ok(Self {
            downstream_connections: gauge(
                &registry,
                "sluice_downstream_connections",
                "Client connections open now.",
            )?,
            downstream_rejected: counters(
                &registry,
                "sluice_downstream_rejected_total",
                "Client connections closed or requests refused by the front door, by reason.",
                &["reason"],
                &REJECT_REASONS,
            )?,
            access_log_dropped: counter(
                &registry,
                "sluice_access_log_dropped_total",
                "Access-log lines dropped because the writer could not keep up.",
            )?,
            tracing_dropped: counter(
                &registry,
                "sluice_tracing_dropped_total",
                "Spans that never reached the OTLP collector: queue full or export failed.",
            )?,
            delays: latencies(
                &registry,
                "sluice_ratelimit_delay_seconds",
                "How long requests over a limit that delays waited for their turn, by route.",
                &["route"],
            )?,
            waiting: gauge(
                &registry,
                "sluice_ratelimit_waiting",
                "Requests waiting for their turn now (on_limit: delay).",
            )?,
            leases_held: gauge(
                &registry,
                "sluice_ratelimit_leases_held",
                "Concurrency leases this instance holds now, renewed while their requests last.",
            )?,
            upstream_server_up: server_up_gauge(&registry)?,
            rls_requests: rls_requests(&registry)?,
            upstream_retries: by_route(
                &registry,
                "sluice_upstream_retries_total",
                "Tries of a request at the upstream after its first, by route.",
            )?,
            requests: counters(
                &registry,
                "sluice_requests_total",
                "Requests served, by route and response status.",
                &["route", "status"],
                &[],
            )?,
            request_duration: latencies(
                &registry,
                "sluice_request_duration_seconds",
                "Time from request start to response end, by route.",
                &["route"],
            )?,
            decisions: decisions(&registry)?,
            reserve_units: reserve_units(&registry)?,
            config_reloads: counters(
                &registry,
                "sluice_config_reloads_total",
                "Configuration reloads, by result.",
                &["result"],
                &["success", "failure"],
            )?,
            redis: RedisMetrics::new(&registry)?,
            identity: IdentityMetrics::new(&registry)?,
            registry,
        })
    }

    /// Counters for one limit of one route, created at zero so that dashboards
    /// and alerts see every series from the start — only the pairs of
    /// decision and source that `shape` says can happen.
    pub fn limit_counters(&self, route: &str, limit: &str, shape: LimitShape) -> LimitCounters {
        use DecisionLabel::{Allow, Delayed, Deny, ShadowDeny};
        let mut counters = Vec::new();
        for decision in [Allow, Deny, ShadowDeny, Delayed] {
            for source in Source::ALL {
                if shape.can(decision, source) {
                    let labels = [route, limit, decision.name(), source.label()];
                    let counter = self.decisions.with_label_values(&labels);
                    counters.push((decision, source, counter));
                }
            }
        }
        let exempt = shape.exemptible.then(|| {
            self.decisions
                .with_label_values(&[route, limit, "exempt", "exempt"])
        });
        LimitCounters { counters, exempt }
    }

    /// The reservation counters of limit `limit` of `route`.
    pub fn reserve_counters(&self, route: &str, limit: &str) -> ReserveCounters {
        let [reserved, given_back, overdraft] =
            RESERVE_KINDS.map(|kind| self.reserve_units.with_label_values(&[route, limit, kind]));
        ReserveCounters {
            reserved,
            given_back,
            overdraft,
        }
    }

    /// Counts one request of `route` answered with `status` (0: no
    /// answer was sent).
    pub fn count_request(&self, route: &str, status: u16) {
        let code = http::StatusCode::from_u16(status).ok();
        let status_label = code.as_ref().map_or("0", |c| c.as_str());
        self.requests
            .with_label_values(&[route, status_label])
            .inc();
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            log::error!("cannot encode metrics: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_design_metric_is_exported() {
        let metrics = Metrics::new().unwrap();
        metrics.requests.with_label_values(&["r", "200"]).inc();
        metrics
            .request_duration
            .with_label_values(&["r"])
            .observe(0.01);
        metrics
            .limit_counters("r", "l", LimitShape::local())
            .inc(DecisionLabel::Deny, Source::Local);
        metrics.redis.duration.observe(0.001);
        let text = String::from_utf8(metrics.encode()).unwrap();
        for name in [
            "sluice_requests_total",
            "sluice_request_duration_seconds",
            "sluice_ratelimit_decisions_total",
            "sluice_redis_duration_seconds",
            "sluice_redis_errors_total",
            "sluice_redis_up",
            "sluice_config_reloads_total",
            "sluice_ratelimit_leases_held",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains(
            r#"sluice_ratelimit_decisions_total{decision="deny",limit="l",route="r",source="local"} 1"#
        ));
    }
}
