//! The admin layer: what operators use to run the gateway. Here, the admin
//! listener: `/metrics`, `/healthz`, `/readyz` (docs/operations.md,
//! "Metrics and health") and the routes to its APIs: the usage API
//! `/v1/usage` ([`usage`]), the top limited keys `/v1/top` ([`top`]) and the
//! consumers API `/v1/consumers/…` ([`consumers`]), which share one answer
//! type, error body and token check ([`api`]). Also the config's
//! reloads on `SIGHUP` ([`reload`]) and the file watch that triggers them
//! ([`watch`]).
//!
//! The top of the library: may use every layer below (`edge` excepted: the
//! admin listener is its own Pingora service and shares only the state).

pub mod api;
pub mod consumers;
pub mod reload;
pub mod top;
pub mod usage;
pub mod watch;

use crate::limiter::Readiness;
use crate::observe::metrics::Metrics;
use crate::policy::state::SharedState;
use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use std::sync::Arc;

/// Serves the admin endpoints. Everything it reads is shared, lock-free state.
pub struct AdminApp {
    metrics: Arc<Metrics>,
    state: SharedState,
}

impl AdminApp {
    /// An admin app over the gateway's metrics and its current state's limiter.
    pub fn new(metrics: Arc<Metrics>, state: SharedState) -> Self {
        Self { metrics, state }
    }
}

fn text(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    let length = response.body().len();
    response
        .headers_mut()
        .insert(http::header::CONTENT_LENGTH, length.into());
    response
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let plain = "text/plain; charset=utf-8";
        if session.req_header().uri.path() == "/v1/usage" {
            let state = self.state.load();
            let head = session.req_header();
            let authorization = head
                .headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes().to_vec());
            let query = head.uri.query().unwrap_or("").as_bytes().to_vec();
            let method = head.method.clone();
            let (status, body) =
                crate::admin::usage::answer(&state, &method, &query, authorization.as_deref())
                    .await;
            return text(status, "application/json", body.to_string().into_bytes());
        }
        if session.req_header().uri.path() == "/v1/top" {
            let state = self.state.load();
            let head = session.req_header();
            let authorization = head.headers.get(http::header::AUTHORIZATION);
            let query = head.uri.query().unwrap_or("").as_bytes();
            let authorization = authorization.map(|v| v.as_bytes());
            let (status, body) =
                crate::admin::top::answer(&state, &head.method, query, authorization);
            return text(status, "application/json", body.to_string().into_bytes());
        }
        if crate::admin::consumers::handles(session.req_header().uri.path()) {
            return consumers(&self.state, session).await;
        }
        match session.req_header().uri.path() {
            "/metrics" => {
                let state = self.state.load();
                set_servers_up(&self.metrics.upstream_server_up, &state.upstreams);
                let held = state.decider.leases_held();
                self.metrics
                    .leases_held
                    .set(held.try_into().unwrap_or(i64::MAX));
                let body = self.metrics.encode();
                text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    body,
                )
            }
            "/healthz" => text(StatusCode::OK, plain, b"ok\n".to_vec()),
            "/readyz" => readyz(self.state.load().decider.readiness()),
            _ => text(
                StatusCode::NOT_FOUND,
                plain,
                b"not found: try /metrics, /healthz, /readyz, /v1/usage or /v1/top\n".to_vec(),
            ),
        }
    }
}

/// `/readyz`: 200 when ready (saying what decides if Redis is not there),
/// 503 with the reason when not.
fn readyz(readiness: Readiness) -> Response<Vec<u8>> {
    let plain = "text/plain; charset=utf-8";
    let (status, body) = match readiness {
        Readiness::Ready => (StatusCode::OK, "ready\n".to_string()),
        Readiness::Degraded(why) => (
            StatusCode::OK,
            format!("ready: Redis is unreachable, {why}\n"),
        ),
        Readiness::NotReady(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    };
    text(status, plain, body.into_bytes())
}

/// The largest body the consumers API reads.
const MAX_BODY: usize = 4096;

/// Answers a consumers API call (reading its small JSON body).
async fn consumers(
    state: &crate::policy::state::SharedState,
    session: &mut ServerSession,
) -> Response<Vec<u8>> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = session.read_request_body().await {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_BODY {
            let answer = serde_json::json!({ "error": "payload_too_large" });
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "application/json",
                answer.to_string().into_bytes(),
            );
        }
    }
    let state = state.load();
    let head = session.req_header();
    let authorization = head
        .headers
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let (status, answer) = crate::admin::consumers::answer(
        &state,
        &head.method,
        head.uri.path(),
        authorization,
        &body,
    )
    .await;
    text(status, "application/json", answer.to_string().into_bytes())
}

/// Sets `sluice_upstream_server_up` for the servers of `upstreams` (and
/// only those: a reload's removed servers leave no series).
fn set_servers_up(gauge: &prometheus::IntGaugeVec, upstreams: &[Arc<crate::upstream::Upstream>]) {
    gauge.reset();
    for upstream in upstreams {
        for (i, spec) in upstream.config.addresses.iter().enumerate() {
            let up = i64::from(upstream.server_up(i));
            gauge
                .with_label_values(&[upstream.name(), spec.addr.as_str()])
                .set(up);
        }
    }
}
