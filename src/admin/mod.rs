//! The admin layer: what operators use to run the gateway. Here, the admin
//! listener: `/metrics`, `/healthz`, `/readyz` (docs/operations.md,
//! "Metrics and health"), the operator console at `/console/`
//! ([`console`], docs/console.md) and the routes to the APIs it reads:
//! the usage API `/v1/usage` ([`usage`]), the top limited keys `/v1/top`
//! ([`top`]), the consumers API `/v1/consumers…` ([`consumers`]), the
//! status `/v1/status` ([`status`]), the rates `/v1/rates` ([`rates`], from
//! the counters' [`history`]) and the upstreams `/v1/upstreams`
//! ([`upstreams`]), which share one answer type, error body and token
//! check ([`api`]) and one guard against other sites ([`same_site`]).
//! Also the config's reloads on `SIGHUP` ([`reload`], recorded in
//! [`config_status`]) and the file watch that triggers them ([`watch`]).
//!
//! The top of the library: may use every layer below (`edge` excepted: the
//! admin listener is its own Pingora service and shares only the state).

pub mod api;
pub mod config_status;
pub mod console;
pub mod consumers;
pub mod history;
pub mod rates;
pub mod reload;
pub mod same_site;
pub mod status;
pub mod top;
pub mod upstreams;
pub mod usage;
pub mod watch;

use crate::admin::api::{authorize, error, Answer, Guard};
use crate::admin::config_status::ConfigStatus;
use crate::admin::history::History;
use crate::edge::shutdown_delay::Draining;
use crate::limiter::Readiness;
use crate::observe::metrics::Metrics;
use crate::policy::state::SharedState;
use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::json;
use std::sync::Arc;

/// Serves the admin endpoints. Everything it reads is shared, lock-free
/// state, or records the request path never waits on.
pub struct AdminApp {
    metrics: Arc<Metrics>,
    state: SharedState,
    config: Arc<ConfigStatus>,
    history: Arc<History>,
    draining: Arc<Draining>,
}

impl AdminApp {
    /// An admin app over the gateway's metrics, its current state, the
    /// running configuration's record and the counters' history.
    pub fn new(
        metrics: Arc<Metrics>,
        state: SharedState,
        config: Arc<ConfigStatus>,
        history: Arc<History>,
        draining: Arc<Draining>,
    ) -> Self {
        Self {
            metrics,
            state,
            config,
            history,
            draining,
        }
    }

    /// Answers a `/v1/` API call, and leaves an audit line for each that
    /// may change state (whatever its answer).
    async fn api(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let answer = self
            .route_api(session)
            .await
            .unwrap_or_else(|refusal| refusal);
        let head = session.req_header();
        if head.method != Method::GET && head.method != Method::HEAD {
            let peer = session
                .client_addr()
                .map_or_else(|| "?".to_string(), ToString::to_string);
            // The path names the consumer and key id at most; the query
            // (key parts' values) is left out.
            log::info!(
                target: "sluice::audit",
                "admin API: {} {} from {peer}: {}",
                head.method,
                head.uri.path(),
                answer.0.as_u16()
            );
        }
        json_answer(answer)
    }

    /// A `/v1/` API call's answer (`Err`: refused before the API was
    /// asked: another site sent it, or named the listener by a name it may
    /// not have, or it lacks the token, or its body is too large).
    async fn route_api(&self, session: &mut ServerSession) -> Result<Answer, Answer> {
        let state = self.state.load_full();
        let head = session.req_header();
        same_site::check(&state, head)?;
        let path = head.uri.path().to_string();
        let method = head.method.clone();
        let query = head.uri.query().unwrap_or("").as_bytes().to_vec();
        let authorization = head
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes().to_vec());
        let authorization = authorization.as_deref();
        Ok(match path.as_str() {
            "/v1/usage" => usage::answer(&state, &method, &query, authorization).await,
            "/v1/top" => top::answer(&state, &method, &query, authorization),
            "/v1/status" | "/v1/rates" | "/v1/upstreams" => {
                authorize(&state, authorization, Guard::LoopbackOpen)?;
                if method != Method::GET {
                    return Err(error(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "method_not_allowed",
                        json!({}),
                    ));
                }
                match path.as_str() {
                    "/v1/status" => status::answer(&state, &self.config, &self.history),
                    "/v1/rates" => rates::answer(&state, &self.history),
                    _ => upstreams::answer(&state, &self.history),
                }
            }
            _ if consumers::handles(&path) => {
                let body = read_body(session).await?;
                consumers::answer(&state, &method, &path, authorization, &body).await
            }
            _ => error(StatusCode::NOT_FOUND, "not_found", json!({})),
        })
    }
}

/// An API answer as a response.
fn json_answer((status, body): Answer) -> Response<Vec<u8>> {
    text(status, "application/json", body.to_string().into_bytes())
}

/// A response of `status` with `body` of `content_type`, carrying the
/// console's security headers (every admin answer does).
fn text(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Ok(value) = content_type.parse() {
        headers.insert(http::header::CONTENT_TYPE, value);
    }
    for (name, value) in console::SECURITY_HEADERS {
        headers.insert(name, http::HeaderValue::from_static(value));
    }
    let length = response.body().len();
    response
        .headers_mut()
        .insert(http::header::CONTENT_LENGTH, length.into());
    response
}

/// A redirect to the console.
fn to_console() -> Response<Vec<u8>> {
    let mut response = text(
        StatusCode::FOUND,
        "text/plain; charset=utf-8",
        b"see /console/\n".to_vec(),
    );
    response.headers_mut().insert(
        http::header::LOCATION,
        http::HeaderValue::from_static("/console/"),
    );
    response
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let plain = "text/plain; charset=utf-8";
        let path = session.req_header().uri.path().to_string();
        if path.starts_with("/v1/") {
            return self.api(session).await;
        }
        if let Err(reason) = same_site::host_check(&self.state.load(), session.req_header()) {
            return text(
                StatusCode::FORBIDDEN,
                plain,
                format!("forbidden: {reason}\n").into_bytes(),
            );
        }
        if path == "/" || path == "/console" {
            return to_console();
        }
        if path.starts_with("/console/") {
            let method = &session.req_header().method;
            return match console::asset(&path) {
                Some(_) if method != Method::GET && method != Method::HEAD => text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    plain,
                    b"method not allowed\n".to_vec(),
                ),
                Some((content_type, body)) => {
                    text(StatusCode::OK, content_type, body.as_bytes().to_vec())
                }
                None => text(StatusCode::NOT_FOUND, plain, b"not found\n".to_vec()),
            };
        }
        match path.as_str() {
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
            "/readyz" if self.draining.is_draining() => text(
                StatusCode::SERVICE_UNAVAILABLE,
                plain,
                b"not ready: shutting down (server.shutdown_delay: draining before the graceful stop)\n".to_vec(),
            ),
            "/readyz" => readyz(self.state.load().decider.readiness()),
            _ => text(
                StatusCode::NOT_FOUND,
                plain,
                b"not found: try /console/, /metrics, /healthz, /readyz or the /v1/ APIs\n"
                    .to_vec(),
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
            format!("degraded: Redis is unreachable, {why}\n"),
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

/// The request's body, up to [`MAX_BODY`] (a larger one: 413).
async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Answer> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = session.read_request_body().await {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_BODY {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                json!({}),
            ));
        }
    }
    Ok(body)
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
