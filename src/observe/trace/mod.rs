//! Traces over OTLP (`tracing:`): W3C trace context continued or started on
//! every request and sent upstream, and, for the sampled requests (and
//! every denied one with `always_sample_denied`), a server span with child
//! spans for the limit decision and each upstream try.
//!
//! Nothing is built for a request that is not exported: it carries its IDs
//! and a few instants; its spans are made when it ends, and only if it is
//! exported (see [`export`] for the queue).

pub mod context;
pub mod export;

use crate::config::TracingConfig;
use context::Parent;
use export::Exporter;
use http::HeaderValue;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};
use pingora::http::RequestHeader;
use pingora::protocols::l4::socket::SocketAddr as PeerAddress;
use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::time::{Instant, SystemTime};

/// Denied requests traced at most per second beyond the sampled ones
/// (`always_sample_denied`): a flood of 429s would otherwise build and
/// queue spans for every one of them.
pub const DENIED_PER_SECOND: u64 = 100;

/// One configuration's tracer: its sampling and its export queue.
#[derive(Debug)]
pub struct Tracer {
    config: TracingConfig,
    exporter: Exporter,
    ids: RandomIdGenerator,
    scope: InstrumentationScope,
    /// The second (since `epoch`) of the denied traces counted, shifted
    /// left 32 bits, plus their count in it.
    denied_budget: AtomicU64,
    epoch: Instant,
}

/// The auth service asked about one request (`identity.auth_request`), as
/// its child span shows it.
#[derive(Debug, Clone, Copy)]
pub struct AuthSpan {
    /// When the auth service was asked.
    pub start: Instant,
    /// When it answered (or the timeout ended the wait).
    pub end: Instant,
    /// `ok`, `denied` or `failed`.
    pub result: &'static str,
}

/// The limit decision of a request, for its span.
#[derive(Debug, Clone)]
pub struct DecisionSpan {
    /// When the limiter was asked and when it answered.
    pub start: Instant,
    /// When it answered.
    pub end: Instant,
    /// `redis` or `local`.
    pub backend: &'static str,
    /// Who decided (`redis`, `deny_cache`, `fail_open`, …).
    pub source: &'static str,
    /// The algorithm of the limit the decision is named by.
    pub algorithm: &'static str,
    /// The limit keys decided together.
    pub keys: usize,
    /// The decisions sent to Redis in the same round trip as this one;
    /// `None` when Redis was not asked (local backend, deny cache, failure
    /// policy).
    pub batch: Option<usize>,
}

/// One try at the upstream.
#[derive(Debug, Clone)]
struct Try {
    span_id: u64,
    /// Written out only if the trace is exported.
    server: PeerAddress,
    start: Instant,
    end: Option<Instant>,
    status: Option<u16>,
    error: Option<String>,
}

/// What one request carries for its trace.
#[derive(Debug)]
pub struct RequestTrace {
    /// Its trace: the caller's, or a new one.
    pub trace_id: u128,
    /// Its server span.
    pub span_id: u64,
    parent: Option<u64>,
    /// Sampled by its parent or by the ratio.
    pub sampled: bool,
    tracestate: Option<HeaderValue>,
    wall: SystemTime,
    started: Instant,
    decision: Option<DecisionSpan>,
    auth: Option<AuthSpan>,
    tries: Vec<Try>,
}

/// How a request ended, for its server span.
#[derive(Debug)]
pub struct Ending<'a> {
    /// Its method.
    pub method: &'a str,
    /// Its path, without the query.
    pub path: &'a str,
    /// Its route's name (`_unmatched` when none).
    pub route: &'a str,
    /// Its upstream's name, if it was proxied.
    pub upstream: Option<&'a str>,
    /// The status answered.
    pub status: u16,
    /// The client IP as the limits resolve it.
    pub client: String,
    /// The limiter's decision label (`allow`, `deny`, …), if asked.
    pub decision: Option<&'static str>,
    /// The limit that denied (or would have).
    pub limit: Option<&'a str>,
    /// The identity method that decided who the request is, if any.
    pub identity: Option<&'static str>,
    /// Units its limits reserved before it was proxied (`reserve`), if any.
    pub reserved: Option<u64>,
    /// The cost its response reported, that settled the reservation.
    pub cost: Option<u64>,
}

/// The attributes of a request's server span.
fn server_attributes(ending: &Ending<'_>) -> Vec<KeyValue> {
    let mut server = vec![
        KeyValue::new("http.request.method", ending.method.to_string()),
        KeyValue::new("url.path", ending.path.to_string()),
        KeyValue::new("http.route", ending.route.to_string()),
        KeyValue::new("http.response.status_code", i64::from(ending.status)),
        KeyValue::new("client.address", ending.client.clone()),
    ];
    if let Some(decision) = ending.decision {
        server.push(KeyValue::new("sluice.decision", decision));
    }
    if let Some(limit) = ending.limit {
        server.push(KeyValue::new("sluice.limit", limit.to_string()));
    }
    if let Some(method) = ending.identity {
        server.push(KeyValue::new("sluice.identity.method", method));
    }
    let units = [
        ("sluice.reserved", ending.reserved),
        ("sluice.cost", ending.cost),
    ];
    for (name, value) in units {
        if let Some(value) = value.and_then(|v| i64::try_from(v).ok()) {
            server.push(KeyValue::new(name, value));
        }
    }
    server
}

impl Tracer {
    /// A tracer for `config`, exporting on a thread of its own; spans that
    /// never reach the collector are counted on `dropped`.
    pub fn new(config: &TracingConfig, dropped: prometheus::IntCounter) -> std::io::Result<Self> {
        let exporter = Exporter::start(&config.otlp_endpoint, &config.service_name, dropped)?;
        let scope = InstrumentationScope::builder("sluice")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Ok(Tracer {
            config: config.clone(),
            exporter,
            ids: RandomIdGenerator::default(),
            scope,
            denied_budget: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// The trace of a request arriving with `head`: its caller's, whose
    /// sampled flag decides, or a new one sampled at `sample_ratio` (by its
    /// ID, as OpenTelemetry's ratio sampler does).
    pub fn start(&self, head: &RequestHeader) -> RequestTrace {
        let incoming = context::incoming(head);
        let (trace_id, parent, sampled, tracestate) = match incoming {
            Some((
                Parent {
                    trace_id,
                    span_id,
                    sampled,
                },
                state,
            )) => (trace_id, Some(span_id), sampled, state),
            None => {
                let id = u128::from_be_bytes(self.ids.new_trace_id().to_bytes());
                (id, None, self.by_ratio(id), None)
            }
        };
        RequestTrace {
            trace_id,
            span_id: new_span_id(),
            parent,
            sampled,
            tracestate,
            wall: SystemTime::now(),
            started: Instant::now(),
            decision: None,
            auth: None,
            tries: Vec::new(),
        }
    }

    /// Whether one more denied request may be traced this second.
    fn denied_allowed(&self) -> bool {
        let second = self.epoch.elapsed().as_secs() << 32;
        let update = |budget: u64| match budget & !0xffff_ffff == second {
            true if budget & 0xffff_ffff >= DENIED_PER_SECOND => None,
            true => Some(budget + 1),
            false => Some(second + 1),
        };
        let ordering = std::sync::atomic::Ordering::Relaxed;
        self.denied_budget
            .fetch_update(ordering, ordering, update)
            .is_ok()
    }

    fn by_ratio(&self, trace_id: u128) -> bool {
        let bound = (self.config.sample_ratio * (1u64 << 63) as f64) as u64;
        ((trace_id as u64) >> 1) < bound
    }

    /// Whether the request's spans are exported: it was sampled, or it was
    /// `denied` with `always_sample_denied` (within [`DENIED_PER_SECOND`]).
    /// Asked before anything is built for them.
    pub fn exports(&self, trace: &RequestTrace, denied: bool) -> bool {
        let denied = denied && self.config.always_sample_denied;
        trace.sampled || (denied && self.denied_allowed())
    }

    /// Builds the request's spans and queues them for export.
    pub fn export(&self, trace: &RequestTrace, ending: &Ending<'_>) {
        self.exporter.send(self.spans(trace, ending));
    }

    fn spans(&self, trace: &RequestTrace, ending: &Ending<'_>) -> Vec<SpanData> {
        let end = Instant::now();
        let at = |instant: Instant| trace.wall + instant.saturating_duration_since(trace.started);
        let server = server_attributes(ending);
        let name = format!("{} {}", ending.method, ending.route);
        let status = if ending.status >= 500 {
            error(ending.status)
        } else {
            Status::Unset
        };
        let root = (trace.span_id, trace.parent.unwrap_or(0));
        let mut spans = vec![self.span(
            trace,
            Shape {
                ids: root,
                kind: SpanKind::Server,
                name,
                times: (trace.wall, at(end)),
                attributes: server,
                status,
            },
        )];
        if let Some(d) = &trace.decision {
            let mut attributes = vec![
                KeyValue::new("sluice.limiter.backend", d.backend),
                KeyValue::new("sluice.limiter.source", d.source),
                KeyValue::new("sluice.limit.algorithm", d.algorithm),
                KeyValue::new("sluice.limit.keys", d.keys as i64),
            ];
            if let Some(batch) = d.batch {
                attributes.push(KeyValue::new("sluice.limiter.batch_size", batch as i64));
            }
            let ids = (new_span_id(), trace.span_id);
            let times = (at(d.start), at(d.end));
            let shape = Shape {
                ids,
                kind: SpanKind::Internal,
                name: "sluice.limit".into(),
                times,
                attributes,
                status: Status::Unset,
            };
            spans.push(self.span(trace, shape));
        }
        if let Some(a) = &trace.auth {
            let shape = Shape {
                ids: (new_span_id(), trace.span_id),
                kind: SpanKind::Client,
                name: "sluice.auth_request".into(),
                times: (at(a.start), at(a.end)),
                attributes: vec![KeyValue::new("sluice.auth_request.result", a.result)],
                status: Status::Unset,
            };
            spans.push(self.span(trace, shape));
        }
        spans.extend(self.try_spans(trace, ending, end));
        spans
    }

    /// One client span per upstream try, children of the server span.
    fn try_spans(&self, trace: &RequestTrace, ending: &Ending<'_>, end: Instant) -> Vec<SpanData> {
        let at = |instant: Instant| trace.wall + instant.saturating_duration_since(trace.started);
        let mut spans = Vec::with_capacity(trace.tries.len());
        for (i, t) in trace.tries.iter().enumerate() {
            let mut attributes = vec![
                KeyValue::new("server.address", t.server.to_string()),
                KeyValue::new("sluice.attempt", i as i64 + 1),
            ];
            if let Some(upstream) = ending.upstream {
                attributes.push(KeyValue::new("sluice.upstream", upstream.to_string()));
            }
            let status = match (&t.error, t.status) {
                (Some(why), _) => Status::error(why.clone()),
                (None, Some(code)) => {
                    attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
                    if code >= 500 {
                        error(code)
                    } else {
                        Status::Unset
                    }
                }
                (None, None) => Status::Unset,
            };
            let name = format!("upstream {}", ending.upstream.unwrap_or(""));
            let times = (at(t.start), at(t.end.unwrap_or(end)));
            let ids = (t.span_id, trace.span_id);
            let kind = SpanKind::Client;
            spans.push(self.span(
                trace,
                Shape {
                    ids,
                    kind,
                    name,
                    times,
                    attributes,
                    status,
                },
            ));
        }
        spans
    }

    /// One span of `trace`, shaped by `shape`.
    fn span(&self, trace: &RequestTrace, shape: Shape) -> SpanData {
        let Shape {
            ids: (span_id, parent),
            kind: span_kind,
            name,
            times,
            attributes,
            status,
        } = shape;
        let (start_time, end_time) = times;
        let state = trace
            .tracestate
            .as_ref()
            .and_then(|v| v.to_str().ok()?.parse().ok());
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(trace.trace_id.to_be_bytes()),
                SpanId::from_bytes(span_id.to_be_bytes()),
                TraceFlags::SAMPLED,
                false,
                state.unwrap_or(TraceState::NONE),
            ),
            parent_span_id: SpanId::from_bytes(parent.to_be_bytes()),
            parent_span_is_remote: parent != 0 && parent == trace.parent.unwrap_or(0),
            span_kind,
            name: Cow::Owned(name),
            start_time,
            end_time,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

/// What tells one span of a request from another.
struct Shape {
    /// Its ID and its parent's (0: none).
    ids: (u64, u64),
    kind: SpanKind,
    name: String,
    times: (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
    status: Status,
}

/// A random span ID (never zero).
fn new_span_id() -> u64 {
    u64::from_be_bytes(RandomIdGenerator::default().new_span_id().to_bytes()).max(1)
}

fn error(status: u16) -> Status {
    Status::error(format!("status {status}"))
}

impl RequestTrace {
    /// The `traceparent` the upstream gets: this trace, with the current
    /// upstream try's span as the parent.
    pub fn upstream_traceparent(&self) -> HeaderValue {
        let span = self.tries.last().map_or(self.span_id, |t| t.span_id);
        context::traceparent(self.trace_id, span, self.sampled)
    }

    /// The caller's `tracestate`, passed on with the trace.
    pub fn tracestate(&self) -> Option<&HeaderValue> {
        self.tracestate.as_ref()
    }

    /// The trace ID as logs write it (32 hex digits).
    pub fn trace_id_hex(&self) -> String {
        let mut hex = [0; 32];
        context::write_hex(&mut hex, &self.trace_id.to_be_bytes());
        String::from_utf8_lossy(&hex).into_owned()
    }

    /// A new try at `server` begins (the one before it, if any, ended).
    pub fn upstream_try(&mut self, server: &PeerAddress) {
        let now = Instant::now();
        if let Some(last) = self.tries.last_mut() {
            last.end.get_or_insert(now);
        }
        let span_id = new_span_id();
        self.tries.push(Try {
            span_id,
            server: server.clone(),
            start: now,
            end: None,
            status: None,
            error: None,
        });
    }

    /// Takes in the limit decision.
    pub fn decided(&mut self, decision: DecisionSpan) {
        self.decision = Some(decision);
    }

    /// The auth service was asked about the request.
    pub fn asked_auth(&mut self, auth: AuthSpan) {
        self.auth = Some(auth);
    }

    /// The current try got a response head with `status`.
    pub fn try_answered(&mut self, status: u16) {
        if let Some(t) = self.tries.last_mut() {
            t.status = Some(status);
            t.end.get_or_insert(Instant::now());
        }
    }

    /// The current try failed (`why`).
    pub fn try_failed(&mut self, why: String) {
        if let Some(t) = self.tries.last_mut() {
            t.error = Some(why);
            t.end.get_or_insert(Instant::now());
        }
    }
}
