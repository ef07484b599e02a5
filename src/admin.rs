//! The admin listener: `/metrics`, `/healthz`, `/readyz` (docs/operations.md, "Metrics and health")
//! and the usage API, `/v1/usage` (see `usage`).

use crate::metrics::Metrics;
use crate::state::SharedState;
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
                crate::usage::answer(&state, &method, &query, authorization.as_deref()).await;
            return text(status, "application/json", body.to_string().into_bytes());
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
            "/readyz" if self.state.load().decider.is_ready() => {
                text(StatusCode::OK, plain, b"ready\n".to_vec())
            }
            "/readyz" => text(
                StatusCode::SERVICE_UNAVAILABLE,
                plain,
                b"not ready: Redis is unreachable and on_error is deny\n".to_vec(),
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                plain,
                b"not found: try /metrics, /healthz, /readyz or /v1/usage\n".to_vec(),
            ),
        }
    }
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
