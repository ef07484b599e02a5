//! The export of finished spans: a bounded queue, drained on a thread of
//! its own that posts batches with OpenTelemetry's OTLP/HTTP exporter.
//!
//! A request only ever tries to enqueue its spans; when the queue is full
//! they are dropped and counted, so a slow or unreachable collector never
//! holds a request up. Spans in a batch the collector does not accept are
//! counted the same way: `sluice_tracing_dropped_total` is every span that
//! never reached the collector.

use opentelemetry::KeyValue;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::resource::EnvResourceDetector;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

/// Requests whose spans may wait in the queue.
pub(crate) const QUEUE: usize = 2048;
/// Spans posted at most in one request to the collector.
const BATCH: usize = 512;
/// How long a span waits at most before its batch is posted.
const LINGER: Duration = Duration::from_secs(1);
/// How long one post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// The sending end of the queue.
#[derive(Debug, Clone)]
pub(crate) struct Exporter {
    queue: SyncSender<Vec<SpanData>>,
    dropped: IntCounter,
}

impl Exporter {
    /// Starts the export thread posting to `endpoint` (the full URL) with
    /// `service_name` as the resource; drops are counted on `dropped`. The
    /// thread ends, after posting what is queued, when every `Exporter`
    /// clone is gone.
    pub fn start(endpoint: &str, service_name: &str, dropped: IntCounter) -> std::io::Result<Self> {
        let (queue, spans) = sync_channel(QUEUE);
        let (endpoint, service_name) = (endpoint.to_string(), service_name.to_string());
        let counter = dropped.clone();
        std::thread::Builder::new()
            .name("sluice-otlp".into())
            .spawn(move || drain(&endpoint, &service_name, &spans, &counter))?;
        Ok(Exporter { queue, dropped })
    }

    /// Queues one request's spans, or drops and counts them if the queue is full.
    pub fn send(&self, spans: Vec<SpanData>) {
        let count = spans.len() as u64;
        match self.queue.try_send(spans) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc_by(count);
            }
        }
    }
}

/// The export thread: batches of up to [`BATCH`] spans, each posted when
/// full or [`LINGER`] after its first span.
fn drain(
    endpoint: &str,
    service_name: &str,
    spans: &Receiver<Vec<SpanData>>,
    dropped: &IntCounter,
) {
    let built = SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .with_timeout(POST_TIMEOUT)
        .build();
    let mut exporter = match built {
        Ok(exporter) => exporter,
        Err(e) => {
            log::error!("tracing: cannot export to {endpoint}: {e}; spans are dropped");
            for batch in spans.iter() {
                dropped.inc_by(batch.len() as u64);
            }
            return;
        }
    };
    // OTEL_RESOURCE_ATTRIBUTES (Kubernetes' downward API: k8s.pod.name,
    // k8s.namespace.name) with the configured service name, and the
    // instance's name as service.instance.id.
    let instance = crate::observe::instance::Instance::current();
    exporter.set_resource(
        &Resource::builder_empty()
            .with_detector(Box::new(EnvResourceDetector::new()))
            .with_attribute(KeyValue::new("service.instance.id", instance.name.clone()))
            .with_service_name(service_name.to_string())
            .build(),
    );
    let mut batch: Vec<SpanData> = Vec::new();
    let mut first_at = Instant::now();
    loop {
        let wait = LINGER.saturating_sub(first_at.elapsed());
        let open = match spans.recv_timeout(if batch.is_empty() { LINGER } else { wait }) {
            Ok(more) => {
                if batch.is_empty() {
                    first_at = Instant::now();
                }
                batch.extend(more);
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        };
        let due = first_at.elapsed() >= LINGER || batch.len() >= BATCH || !open;
        if !batch.is_empty() && due {
            post(&exporter, std::mem::take(&mut batch), endpoint, dropped);
        }
        if !open {
            return;
        }
    }
}

/// Posts one batch; counts its spans as dropped if the collector did not take it.
fn post(exporter: &SpanExporter, batch: Vec<SpanData>, endpoint: &str, dropped: &IntCounter) {
    let count = batch.len() as u64;
    if let Err(e) = futures_executor::block_on(exporter.export(batch)) {
        dropped.inc_by(count);
        log::warn!("tracing: {count} spans not exported to {endpoint}: {e}");
    }
}
