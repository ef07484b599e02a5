//! Traces over OTLP/HTTP from the real binary to a real receiver that
//! decodes them with the official OpenTelemetry protos: the spans of an
//! allowed, a denied and a proxied-then-502 request, their links, a
//! continued `traceparent` that the upstream sees, the access log's
//! `trace_id`; and, with the collector down, requests unaffected and
//! the spans counted as dropped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span};
use prost::Message;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// A resource's string attributes, as (key, value) pairs.
type Attributes = Vec<(String, String)>;

/// An OTLP/HTTP receiver: every span posted to it, with its service name.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    /// Each export's resource, as its string attributes.
    resources: Arc<Mutex<Vec<Attributes>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let resources = Arc::new(Mutex::new(Vec::new()));
        let (sink, resource_sink) = (spans.clone(), resources.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (sink, resource_sink) = (sink.clone(), resource_sink.clone());
                thread::spawn(move || serve(stream, &sink, &resource_sink));
            }
        });
        Receiver {
            addr,
            spans,
            resources,
        }
    }

    fn spans(&self) -> Vec<(String, Span)> {
        self.spans.lock().unwrap().clone()
    }
}

/// Serves one kept-alive connection: each POST body decoded as an
/// `ExportTraceServiceRequest`, answered 200 with an empty response.
fn serve(stream: TcpStream, sink: &Mutex<Vec<(String, Span)>>, resources: &Mutex<Vec<Attributes>>) {
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    while let Some((line, length)) = read_head(&mut reader) {
        assert!(line.starts_with("POST /v1/traces "), "{line}");
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        for resource in request.resource_spans {
            let attributes = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some((kv.key.clone(), s.clone())),
                    _ => None,
                })
                .collect();
            resources.lock().unwrap().push(attributes);
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                let mut spans = sink.lock().unwrap();
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        let answer =
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn config(redis: &RedisServer, upstream: &Upstream, collector: SocketAddr, ratio: &str) -> String {
    let closed = free_port();
    format!(
        r#"
limiter:
  redis: {{ url: "{redis}", timeout: 2s }}
tracing:
  otlp_endpoint: http://{collector}
  sample_ratio: {ratio}
  service_name: edge-gateway
upstreams:
  api: {{ servers: ["{upstream}"] }}
  gone: {{ servers: ["127.0.0.1:{closed}"] }}
routes:
  - name: broken
    match: {{ path_prefix: /broken }}
    upstream: gone
  - name: llm
    match: {{ path_prefix: /llm }}
    upstream: api
    limits:
      - {{ name: tokens, key: [{{header: X-Key}}], limit: 1000, window: 1m, reserve: 40, cost_from: {{ response_header: x-usage-tokens }} }}
  - name: api
    upstream: api
    limits:
      - {{ name: per-key, key: [{{header: X-Key}}], limit: 1, window: 1m }}
"#,
        redis = redis.url(),
        upstream = upstream.addr,
    )
}

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";
const BROKEN_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// The spans of trace `trace_id` once its server span has arrived.
fn trace_of(receiver: &Receiver, trace_id: &str) -> Vec<Span> {
    let mine = || -> Vec<Span> {
        let spans = receiver.spans();
        spans
            .into_iter()
            .map(|(_, s)| s)
            .filter(|s| hex(&s.trace_id) == trace_id)
            .collect()
    };
    wait_until(Duration::from_secs(15), "the trace's spans", || {
        mine().iter().any(|s| s.kind == SpanKind::Server as i32)
    });
    mine()
}

fn kind(spans: &[Span], kind: SpanKind) -> Vec<&Span> {
    spans.iter().filter(|s| s.kind == kind as i32).collect()
}

#[test]
fn allowed_denied_and_failed_requests_are_traced_with_their_children() {
    let (redis, upstream, receiver) = (RedisServer::start(), Upstream::start(), Receiver::start());
    let sluice = Sluice::start_with_server(
        "  access_log: stderr\n",
        &config(&redis, &upstream, receiver.addr, "0"),
        &[],
    );
    // Continued: the caller sampled it, so it is traced whatever the ratio.
    let parent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let allowed = sluice.get(
        "/pay",
        &[
            ("X-Key", "a"),
            ("traceparent", &parent),
            ("tracestate", "vendor=1"),
        ],
    );
    assert_eq!(allowed.status, 200);
    let sent = upstream
        .last_header("traceparent")
        .expect("traceparent upstream");
    assert_eq!(
        upstream.last_header("tracestate").as_deref(),
        Some("vendor=1")
    );
    // Not sampled (ratio 0), allowed: not exported.
    assert_eq!(sluice.get("/pay", &[("X-Key", "b")]).status, 200);
    let unsampled = upstream
        .last_header("traceparent")
        .expect("traceparent upstream");
    assert!(
        unsampled.starts_with("00-") && unsampled.ends_with("-00"),
        "{unsampled}"
    );
    // Denied: always traced.
    assert_eq!(sluice.get("/pay", &[("X-Key", "a")]).status, 429);
    let broken = format!("00-{BROKEN_TRACE}-{PARENT_SPAN}-01");
    assert_eq!(
        sluice.get("/broken", &[("traceparent", &broken)]).status,
        502
    );

    let spans = trace_of(&receiver, PARENT_TRACE);
    assert!(receiver
        .spans()
        .iter()
        .all(|(service, _)| service == "edge-gateway"));
    let server = kind(&spans, SpanKind::Server);
    assert_eq!(server.len(), 1, "{spans:?}");
    let server = server[0];
    assert_eq!(server.name, "GET api");
    assert_eq!(hex(&server.parent_span_id), PARENT_SPAN);
    assert_eq!(
        attribute(server, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        attribute(server, "sluice.decision").as_deref(),
        Some("allow")
    );
    assert_eq!(attribute(server, "http.route").as_deref(), Some("api"));
    assert_eq!(
        attribute(server, "client.address").as_deref(),
        Some("127.0.0.1")
    );
    let limit = spans
        .iter()
        .find(|s| s.name == "sluice.limit")
        .expect("limit span");
    assert_eq!(limit.parent_span_id, server.span_id);
    assert_eq!(
        attribute(limit, "sluice.limiter.backend").as_deref(),
        Some("redis")
    );
    assert_eq!(
        attribute(limit, "sluice.limiter.source").as_deref(),
        Some("redis")
    );
    assert_eq!(
        attribute(limit, "sluice.limit.algorithm").as_deref(),
        Some("sliding_log")
    );
    // Alone on the gateway, its decision went to Redis in a batch of one.
    assert_eq!(
        attribute(limit, "sluice.limiter.batch_size").as_deref(),
        Some("1")
    );
    let client = kind(&spans, SpanKind::Client);
    assert_eq!(client.len(), 1, "{spans:?}");
    assert_eq!(client[0].parent_span_id, server.span_id);
    assert_eq!(attribute(client[0], "sluice.attempt").as_deref(), Some("1"));
    assert_eq!(
        attribute(client[0], "server.address"),
        Some(upstream.addr.to_string())
    );
    assert!(server.start_time_unix_nano <= limit.start_time_unix_nano);
    assert!(limit.end_time_unix_nano <= client[0].start_time_unix_nano);
    assert!(client[0].end_time_unix_nano <= server.end_time_unix_nano);
    // The upstream saw the same trace, its parent the upstream call's span.
    assert_eq!(
        sent,
        format!("00-{PARENT_TRACE}-{}-01", hex(&client[0].span_id))
    );

    let failed = trace_of(&receiver, BROKEN_TRACE);
    let server = kind(&failed, SpanKind::Server)[0];
    assert_eq!(
        attribute(server, "http.response.status_code").as_deref(),
        Some("502")
    );
    assert_eq!(
        server.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    let tries = kind(&failed, SpanKind::Client);
    assert!(!tries.is_empty(), "{failed:?}");
    assert!(tries
        .iter()
        .all(|t| t.status.as_ref().map(|s| s.code) == Some(StatusCode::Error as i32)));

    // The denial started its own trace: a server span answered 429, its
    // limit span, no upstream call.
    let all = receiver.spans();
    let denied: Vec<&Span> = all
        .iter()
        .map(|(_, s)| s)
        .filter(|s| attribute(s, "http.response.status_code").as_deref() == Some("429"))
        .collect();
    assert_eq!(denied.len(), 1, "{all:?}");
    assert_eq!(
        attribute(denied[0], "sluice.decision").as_deref(),
        Some("deny")
    );
    assert_eq!(
        attribute(denied[0], "sluice.limit").as_deref(),
        Some("per-key")
    );
    assert!(denied[0].parent_span_id.is_empty() || denied[0].parent_span_id == [0; 8]);
    let denied_trace = denied[0].trace_id.clone();
    let children: Vec<&Span> = all
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.trace_id == denied_trace)
        .collect();
    assert_eq!(children.len(), 2, "{children:?}");
    // The unsampled allowed request was not exported: three server spans.
    let servers = all
        .iter()
        .filter(|(_, s)| s.kind == SpanKind::Server as i32)
        .count();
    assert_eq!(servers, 3, "{all:?}");

    // The access log names each request's trace.
    let log = sluice.log();
    let traced: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ids: Vec<&str> = traced
        .iter()
        .filter_map(|l| l["trace_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 4, "{log}");
    assert_eq!(ids[0], PARENT_TRACE);
    assert_eq!(ids[2], hex(&denied_trace));
    assert!(unsampled.contains(ids[1]), "{unsampled} {}", ids[1]);
}

#[test]
fn a_collector_that_is_down_slows_nothing_and_drops_are_counted() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let nobody: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let sluice = Sluice::start(&config(&redis, &upstream, nobody, "1.0"));
    for i in 0..20 {
        assert_eq!(
            sluice.get("/pay", &[("X-Key", &format!("k{i}"))]).status,
            200
        );
    }
    // Each request's three spans (server, limit, upstream) never arrive.
    wait_until(
        Duration::from_secs(15),
        "60 spans counted as dropped",
        || metric_value(&sluice.metrics(), "sluice_tracing_dropped_total") >= 60,
    );
    assert_eq!(upstream.hits(), 20);
}

#[test]
fn decisions_queued_behind_a_slow_redis_say_which_batch_they_shared() {
    let (redis, upstream, receiver) = (RedisServer::start(), Upstream::start(), Receiver::start());
    let sluice = Sluice::start(&config(&redis, &upstream, receiver.addr, "1.0"));
    // Redis holds the first decision for a second; those that come
    // meanwhile queue behind it and go to Redis together.
    redis.pause_clients(1000);
    let addr = sluice.addr;
    let statuses = concurrent(9, move |i| {
        get(addr, "/pay", &[("X-Key", &format!("queued-{i}"))])
    });
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let batches = || -> Vec<i64> {
        receiver
            .spans()
            .iter()
            .filter(|(_, s)| s.name == "sluice.limit")
            .filter_map(|(_, s)| attribute(s, "sluice.limiter.batch_size")?.parse().ok())
            .collect()
    };
    wait_until(Duration::from_secs(15), "nine limit spans", || {
        batches().len() == 9
    });
    let batches = batches();
    assert!(batches.iter().all(|&b| (1..=9).contains(&b)), "{batches:?}");
    assert!(batches.iter().any(|&b| b >= 2), "{batches:?}");
    // A batch of n is reported by each of its n decisions.
    for &size in &batches {
        let sharing = batches.iter().filter(|&&b| b == size).count() as i64;
        assert_eq!(sharing % size, 0, "{batches:?}");
    }
}

/// An auth service that admits every request as `alice`, one connection
/// per request.
fn admitting_auth_service() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nx-auth-user: alice\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    addr
}

#[test]
fn an_auth_service_call_is_a_child_span_and_the_method_is_named() {
    let receiver = Receiver::start();
    let auth = admitting_auth_service();
    let sluice = Sluice::start(&format!(
        r#"
identity:
  auth_request: {{ url: "http://{auth}/auth", headers: [authorization], required: true }}
limiter: {{ backend: local }}
tracing:
  otlp_endpoint: http://{collector}
  sample_ratio: 1.0
routes:
  - name: api
    respond: {{ body: ok }}
"#,
        collector = receiver.addr,
    ));
    let parent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let response = sluice.get(
        "/",
        &[
            ("Authorization", "Bearer x"),
            ("traceparent", parent.as_str()),
        ],
    );
    assert_eq!(response.status, 200);
    let spans = trace_of(&receiver, PARENT_TRACE);
    let server = kind(&spans, SpanKind::Server)[0];
    assert_eq!(
        attribute(server, "sluice.identity.method").as_deref(),
        Some("auth_request")
    );
    let asked = spans
        .iter()
        .find(|s| s.name == "sluice.auth_request")
        .expect("the auth service's span");
    assert_eq!(asked.parent_span_id, server.span_id);
    assert_eq!(
        attribute(asked, "sluice.auth_request.result").as_deref(),
        Some("ok")
    );
    assert!(asked.end_time_unix_nano >= asked.start_time_unix_nano);
}

/// Kubernetes' downward API, in the OpenTelemetry way: the pod's name and
/// namespace reach the traces' resource, the access log and `/v1/status`.
#[test]
fn the_pod_and_namespace_reach_the_traces_the_access_log_and_the_status() {
    let (redis, upstream, receiver) = (RedisServer::start(), Upstream::start(), Receiver::start());
    let sluice = Sluice::start_with_server(
        "",
        &config(&redis, &upstream, receiver.addr, "1.0"),
        &[(
            "OTEL_RESOURCE_ATTRIBUTES",
            "k8s.pod.name=sluice-5f7c9-qx2lp,k8s.namespace.name=edge",
        )],
    );
    assert_eq!(sluice.get("/x", &[("X-Key", "k")]).status, 200);
    let mut resource = Vec::new();
    wait_until(Duration::from_secs(20), "a span's resource", || {
        resource = receiver
            .resources
            .lock()
            .unwrap()
            .first()
            .cloned()
            .unwrap_or_default();
        !resource.is_empty()
    });
    for (key, value) in [
        ("k8s.pod.name", "sluice-5f7c9-qx2lp"),
        ("k8s.namespace.name", "edge"),
        ("service.instance.id", "sluice-5f7c9-qx2lp"),
        ("service.name", "edge-gateway"),
    ] {
        assert!(
            resource.contains(&(key.to_string(), value.to_string())),
            "{key}={value} in {resource:?}"
        );
    }
    wait_until(Duration::from_secs(10), "the access log line", || {
        sluice
            .log()
            .contains(r#""pod":"sluice-5f7c9-qx2lp","namespace":"edge""#)
    });
    let status: serde_json::Value =
        serde_json::from_str(&get(sluice.admin, "/v1/status", &[]).body).expect("JSON");
    assert_eq!(status["instance"]["name"], "sluice-5f7c9-qx2lp", "{status}");
    assert_eq!(status["instance"]["namespace"], "edge", "{status}");
    assert_eq!(status["instance"]["pod"], true, "{status}");
}

/// A request that reserved units carries its reservation and the cost that
/// settled it on its server span.
#[test]
fn a_reservation_and_its_settled_cost_are_on_the_trace() {
    let (redis, upstream, receiver) = (RedisServer::start(), Upstream::start(), Receiver::start());
    let sluice = Sluice::start(&config(&redis, &upstream, receiver.addr, "1"));
    const TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4736";
    let parent = format!("00-{TRACE}-{PARENT_SPAN}-01");
    let answer = sluice.get(
        "/llm?tokens=12",
        &[("X-Key", "a"), ("traceparent", &parent)],
    );
    assert_eq!(answer.status, 200);
    let spans = trace_of(&receiver, TRACE);
    let server = kind(&spans, SpanKind::Server)[0];
    assert_eq!(attribute(server, "sluice.reserved").as_deref(), Some("40"));
    assert_eq!(attribute(server, "sluice.cost").as_deref(), Some("12"));
}
