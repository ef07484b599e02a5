//! The running configuration: everything a request needs that comes from the
//! config file, built from one validated [`Config`] and swapped whole on
//! reload (docs/operations.md).
//!
//! A request takes a reference to the current [`GatewayState`] when it starts
//! and keeps it to the end, so a reload never changes the route, limits or
//! upstream of a request in flight; the next request sees the new state.

use crate::config::{Config, LimitConfig, RouteAction};
use crate::limiter::{Decider, LimiterError};
use crate::observe::metrics::{Deciders, LimitShape};
use crate::observe::metrics::{LimitCounters, Metrics, ReserveCounters};
use crate::observe::top_keys::DeniedKeys;
use crate::observe::trace::Tracer;
use crate::policy::consumer_plans::ConsumerPlans;
use crate::policy::identity::{Identity, IdentityDecisions};
use crate::policy::route::RouteTable;
use crate::request::parts::ClientIpResolver;
use crate::upstream::Upstream;
use arc_swap::ArcSwap;
use prometheus::Histogram;
use std::sync::Arc;

/// The state new requests start with; a reload stores a new one.
pub type SharedState = Arc<ArcSwap<GatewayState>>;

/// Everything built from one configuration.
pub struct GatewayState {
    /// The configuration this state was built from.
    pub config: Config,
    /// Route matching, index-aligned with `compiled`.
    pub routes: RouteTable,
    /// Per route: its limits with their metric handles.
    pub compiled: Vec<CompiledRoute>,
    /// Upstream pools, in `config.upstreams` order.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Who the client is.
    pub client_ip: ClientIpResolver,
    /// What the key part `user` is.
    pub identity: Identity,
    /// Requests counted by the identity method that decided.
    pub identity_decisions: IdentityDecisions,
    /// The limiter and its failure policy.
    pub decider: Arc<Decider>,
    /// The rate-limit service's decision counters, with `server.rls`.
    pub rls: Option<CompiledRls>,
    /// The tracer of `tracing:`, if a collector is named.
    pub tracer: Option<Arc<Tracer>>,
    /// The plans a consumer may have; unknown ones reported.
    pub consumer_plans: ConsumerPlans,
}

/// The decision counters of the rate-limit service's limits.
pub struct CompiledRls {
    /// Per limit of the rules, index-aligned with their `limits`.
    pub counters: Vec<LimitCounters>,
    /// Per domain: limits a request descriptor brings itself (`limit`).
    pub overrides: std::collections::HashMap<String, LimitCounters>,
}

impl CompiledRls {
    /// The counters of `config`'s rate-limit service, if it has one:
    /// `route` is the domain, `limit` the entry's name or path (or
    /// `request_limit` for a descriptor's own limit).
    pub fn build(config: &Config, metrics: &Metrics) -> Option<Self> {
        let rules = &config.server.rls.as_ref()?.rules;
        let counters = rules
            .limits
            .iter()
            .map(|l| {
                let shape = limit_shape(config, l.shadow, true);
                metrics.limit_counters(&l.domain, &l.label, shape)
            })
            .collect();
        let overrides = rules
            .domains
            .keys()
            .map(|domain| {
                let shape = limit_shape(config, false, true);
                let counters = metrics.limit_counters(domain, "request_limit", shape);
                (domain.clone(), counters)
            })
            .collect();
        Some(Self {
            counters,
            overrides,
        })
    }
}

/// One route, ready to serve.
pub struct CompiledRoute {
    /// Its name.
    pub name: String,
    /// Proxy or respond.
    pub action: RouteAction,
    /// Its limits, in file order.
    pub limits: Vec<CompiledLimit>,
    /// Requests none of its limits count.
    pub exempt: crate::config::ExemptConfig,
    /// What it changes on the way upstream and back.
    pub forward: crate::config::forward::ForwardConfig,
    /// Whether the request's identity is kept for its header edits or its
    /// upstream's consistent hashing.
    pub keeps_user: bool,
    /// Its request body cap; 0: none.
    pub max_body_bytes: u64,
    /// Whether a limit reads the request body before the decision
    /// (`reserve: {request_json}`).
    pub reads_body: bool,
    /// The rate-limit headers its responses carry.
    pub rate_headers: crate::config::HeaderStyle,
    /// The shape of its error bodies.
    pub errors: crate::config::ErrorStyle,
    /// Its path template, whose parameters key parts may name.
    pub template: Option<crate::config::template::PathTemplate>,
    /// `sluice_request_duration_seconds{route}`.
    pub duration: Histogram,
    /// `sluice_ratelimit_delay_seconds{route}`, for a route with a limit
    /// that delays (`on_limit: delay`); its series start at zero.
    pub delays: Option<Histogram>,
}

/// One limit of a route, with its decision counters.
pub struct CompiledLimit {
    /// The limit as configured.
    pub config: LimitConfig,
    /// Its `sluice_ratelimit_decisions_total` series.
    pub counters: LimitCounters,
    /// The keys it denied most lately (`/v1/top`).
    pub denied: DeniedKeys,
    /// Its `sluice_ratelimit_reserve_units_total` series, when it reserves.
    pub units: Option<ReserveCounters>,
}

/// Why a validated configuration could not be put into service.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The Redis backend could not be set up (a bad URL the parser accepted).
    #[error("limiter: {0}")]
    Limiter(#[from] LimiterError),
    /// The span export thread could not start.
    #[error("tracing: cannot start the export thread: {0}")]
    Tracing(std::io::Error),
    /// An upstream pool could not be built.
    #[error("upstream `{name}`: {source}")]
    Upstream {
        /// The upstream's name.
        name: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// JWT key material that validation accepted does not parse.
    #[error("identity.jwt key: {0}")]
    Jwt(#[from] jsonwebtoken::errors::Error),
}

/// Whether `route`'s upstream chooses servers by the `user` key part.
fn hashes_user(config: &Config, route: &crate::config::RouteConfig) -> bool {
    let RouteAction::Upstream(u) = route.action else {
        return false;
    };
    matches!(
        config.upstreams.get(u).map(|u| &u.balance),
        Some(crate::config::Balance::ConsistentHash(parts)) if parts.contains(&crate::config::KeyPart::User)
    )
}

impl GatewayState {
    /// Builds the state for `config`. With `previous` (a reload), the parts
    /// whose settings did not change are kept: the limiter's Redis
    /// connections and in-process counters (see [`Decider::reconfigure`]),
    /// and each unchanged upstream pool with its servers' health.
    pub fn build(
        config: Config,
        metrics: &Metrics,
        previous: Option<&GatewayState>,
    ) -> Result<Self, BuildError> {
        let decider = match previous {
            Some(previous) => previous.decider.reconfigure(&config.limiter)?,
            None => Decider::new(&config.limiter, Arc::new(metrics.redis.clone()))?,
        };
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for upstream in &config.upstreams {
            let kept = previous.and_then(|p| {
                p.upstreams
                    .iter()
                    .find(|old| old.config == *upstream)
                    .cloned()
            });
            let pool =
                match kept {
                    Some(pool) => pool,
                    None => Arc::new(Upstream::build(upstream).map_err(|source| {
                        BuildError::Upstream {
                            name: upstream.name.clone(),
                            source,
                        }
                    })?),
                };
            upstreams.push(pool);
        }
        let compiled = config
            .routes
            .iter()
            .map(|route| compile_route(&config, route, metrics))
            .collect();
        Ok(Self {
            routes: RouteTable::new(&config.routes),
            compiled,
            upstreams,
            client_ip: ClientIpResolver::new(&config.client_ip),
            identity: Identity::new(
                &config.identity,
                &config.limiter.redis.key_prefix,
                &metrics.identity,
            )?,
            identity_decisions: IdentityDecisions::new(&metrics.identity),
            decider: Arc::new(decider),
            rls: CompiledRls::build(&config, metrics),
            tracer: tracer(&config, metrics, previous)?,
            consumer_plans: ConsumerPlans::new(config.consumer_plans()),
            config,
        })
    }

    /// Logs the consumers of the Redis key store whose plan no limit
    /// lists, with their number (run after a start and after each reload).
    pub async fn report_consumer_plans(&self) {
        if let Some(store) = self.identity.api_keys().and_then(|k| k.redis_store()) {
            self.consumer_plans.report_store(store, &self.decider).await;
        }
    }
}

/// The tracer of `config`: the previous one when its `tracing:` did not
/// change (its export thread and queue go on), else a new one.
fn tracer(
    config: &Config,
    metrics: &Metrics,
    previous: Option<&GatewayState>,
) -> Result<Option<Arc<Tracer>>, BuildError> {
    let Some(tracing) = &config.tracing else {
        return Ok(None);
    };
    if let Some(previous) = previous.filter(|p| p.config.tracing.as_ref() == Some(tracing)) {
        return Ok(previous.tracer.clone());
    }
    let dropped = metrics.tracing_dropped.clone();
    let tracer = Tracer::new(tracing, dropped).map_err(BuildError::Tracing)?;
    Ok(Some(Arc::new(tracer)))
}

/// `route` with its limits' counters and its metric handles.
fn compile_route(
    config: &Config,
    route: &crate::config::RouteConfig,
    metrics: &Metrics,
) -> CompiledRoute {
    CompiledRoute {
        name: route.name.clone(),
        action: route.action.clone(),
        limits: route
            .limits
            .iter()
            .map(|limit| CompiledLimit {
                denied: DeniedKeys::default(),
                units: limit
                    .reserve
                    .as_ref()
                    .map(|_| metrics.reserve_counters(&route.name, &limit.name)),
                config: limit.clone(),
                counters: metrics.limit_counters(
                    &route.name,
                    &limit.name,
                    LimitShape {
                        exemptible: !(config.exempt.is_empty()
                            && route.exempt.is_empty()
                            && limit.exempt.is_empty()),
                        delays: !limit.max_delay.is_zero(),
                        ..limit_shape(
                            config,
                            limit.shadow,
                            !matches!(
                                limit.algorithm,
                                crate::config::Algorithm::Concurrency { .. }
                            ),
                        )
                    },
                ),
            })
            .collect(),
        exempt: route.exempt.clone(),
        forward: route.forward.clone(),
        keeps_user: route.forward.uses_user() || hashes_user(config, route),
        max_body_bytes: route.max_body_bytes,
        rate_headers: route.rate_headers,
        errors: route.errors,
        reads_body: route
            .limits
            .iter()
            .any(|l| l.reserve.as_ref().is_some_and(|r| r.reads_body())),
        template: match &route.path {
            crate::config::PathMatch::Template(t) => Some(t.clone()),
            _ => None,
        },
        duration: metrics
            .request_duration
            .with_label_values(&[route.name.as_str()]),
        delays: route
            .limits
            .iter()
            .any(|l| !l.max_delay.is_zero())
            .then(|| metrics.delays.with_label_values(&[route.name.as_str()])),
    }
}

/// The decisions a limit of `config` can have: who may decide it (the
/// limiter's backend and `on_error`), and whether a remembered denial may
/// answer for it (the deny cache is on, and the limit is neither `shadow`
/// nor without a timed denial — `timed_denial` is false for
/// `concurrency`).
fn limit_shape(config: &Config, shadow: bool, timed_denial: bool) -> LimitShape {
    use crate::config::{Backend, OnError};
    let limiter = &config.limiter;
    let redis = limiter.backend == Backend::Redis;
    LimitShape {
        shadow,
        deny_cache: limiter.deny_cache && !shadow && timed_denial,
        sources: Deciders {
            redis,
            local: !redis || limiter.on_error == OnError::Local,
            fail_open: redis && limiter.on_error == OnError::Allow,
            fail_closed: redis && limiter.on_error == OnError::Deny,
        },
        ..LimitShape::default()
    }
}
