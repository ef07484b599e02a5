//! The rate-limit service's listener: gRPC over HTTP/2, in clear (h2c) or
//! over TLS (ALPN `h2`). Each connection is served by hyper on one of the
//! server's per-thread runtimes, picked at random, so connections spread
//! over the threads. On shutdown the listener closes and every connection
//! is sent GOAWAY, finishing the calls in flight.

use super::decide::{should_rate_limit, Refusal};
use super::proto::{RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer};
use crate::metrics::Metrics;
use crate::state::SharedState;
use async_trait::async_trait;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::IntCounter;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// The largest request message taken (Envoy's are a few hundred bytes).
const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Concurrent calls per connection.
const MAX_STREAMS: u32 = 1024;

/// Binds the listener at `listen` (with `SO_REUSEPORT` when `upgrading`,
/// so that a new sluice can bind while the old one still serves).
pub fn bind(listen: &str, upgrading: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if upgrading {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// The listener as a background service of the server.
pub struct RlsListener {
    listener: Mutex<Option<std::net::TcpListener>>,
    state: SharedState,
    handler: Handler,
}

impl RlsListener {
    /// Serves `ShouldRateLimit` on `listener` with the limits of `state`.
    pub fn new(listener: std::net::TcpListener, state: SharedState, metrics: &Metrics) -> Self {
        let code = |c: &str| metrics.rls_requests.with_label_values(&[c]);
        Self {
            listener: Mutex::new(Some(listener)),
            handler: Handler {
                state: Arc::clone(&state),
                answered: Arc::new([
                    code("ok"),
                    code("over_limit"),
                    code("unavailable"),
                    code("invalid_argument"),
                ]),
            },
            state,
        }
    }

    /// The TLS acceptor, when the listener has certificates.
    fn tls(&self) -> Option<TlsAcceptor> {
        let state = self.state.load();
        state.config.server.rls.as_ref()?.tls.as_ref()?;
        match crate::tls::rls_server_config(Arc::clone(&self.state)) {
            Ok(config) => Some(TlsAcceptor::from(config)),
            Err(e) => {
                log::error!("rate-limit service TLS: {e}");
                None
            }
        }
    }
}

#[async_trait]
impl BackgroundService for RlsListener {
    async fn start(&self, shutdown: ShutdownWatch) {
        let taken = self.listener.lock().ok().and_then(|mut l| l.take());
        let Some(listener) = taken.and_then(|l| TcpListener::from_std(l).ok()) else {
            log::error!("rate-limit service: no listener to serve");
            return;
        };
        let tls = self.tls();
        let service = RateLimitServiceServer::new(self.handler.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let mut stop = shutdown.clone();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.changed() => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    log::warn!("rate-limit service accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let connection = serve(stream, tls.clone(), service.clone(), shutdown.clone());
            pingora_runtime::current_handle().spawn(connection);
        }
    }
}

/// Serves one connection until it ends or the server shuts down.
async fn serve(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    service: RateLimitServiceServer<Handler>,
    shutdown: ShutdownWatch,
) {
    let _ = stream.set_nodelay(true);
    match tls {
        None => serve_h2(TokioIo::new(stream), service, shutdown).await,
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_h2(TokioIo::new(stream), service, shutdown).await,
                Ok(Err(e)) => log::debug!("rate-limit service TLS handshake: {e}"),
                Err(_) => log::debug!("rate-limit service TLS handshake timed out"),
            }
        }
    }
}

async fn serve_h2<I>(io: I, service: RateLimitServiceServer<Handler>, mut shutdown: ShutdownWatch)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(16 * 1024)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let connection = builder.serve_connection(io, TowerToHyperService::new(service));
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        _ = shutdown.changed() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = ended {
        log::debug!("rate-limit service connection: {e}");
    }
}

/// `ShouldRateLimit`, over the state current when each call starts.
#[derive(Clone)]
struct Handler {
    state: SharedState,
    /// `sluice_rls_requests_total` by code: ok, over_limit, unavailable,
    /// invalid_argument.
    answered: Arc<[IntCounter; 4]>,
}

#[async_trait]
impl RateLimitService for Handler {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let state = self.state.load_full();
        match should_rate_limit(&state, request.get_ref()).await {
            Ok(response) => {
                let over = response.overall_code == super::proto::Code::OverLimit as i32;
                self.answered[usize::from(over)].inc();
                Ok(tonic::Response::new(response))
            }
            Err(Refusal::Unavailable) => {
                self.answered[2].inc();
                Err(tonic::Status::unavailable(
                    "no rate-limit decision could be made (limiter.on_error: deny)",
                ))
            }
            Err(Refusal::Invalid(why)) => {
                self.answered[3].inc();
                Err(tonic::Status::invalid_argument(why))
            }
        }
    }
}
