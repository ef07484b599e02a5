//! The rate-limit service's listener: gRPC over HTTP/2, in clear (h2c) or
//! over TLS (ALPN `h2`). Each connection is served by hyper on one of the
//! server's per-thread runtimes, picked at random, so connections spread
//! over the threads. On shutdown the listener closes and every connection
//! is sent GOAWAY, finishing the calls in flight.

use super::decide::{should_rate_limit, Refusal};
use super::proto::{RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer};
use crate::observe::metrics::Metrics;
use crate::policy::state::SharedState;
use async_trait::async_trait;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::{ServiceReadyNotifier, ServiceWithDependents};
use prometheus::IntCounter;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// The largest request message taken (Envoy's are a few hundred bytes).
const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Concurrent calls per connection.
const MAX_STREAMS: u32 = 1024;

/// Binds the listener at `listen`.
pub fn bind(listen: &str) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// The listener as a service of the server. Its socket is in the server's
/// table of listening sockets, so that a zero-downtime upgrade (`--upgrade`)
/// hands it to the new process as it hands over the proxy's.
pub struct RlsListener {
    listen: String,
    /// Bound at start-up (absent when upgrading: the old process's is taken).
    bound: Option<std::net::TcpListener>,
    threads: usize,
    state: SharedState,
    handler: Handler,
}

impl RlsListener {
    /// Serves `ShouldRateLimit` at `listen` (on `bound`, if bound already)
    /// with the limits of `state`, over `threads` threads.
    pub fn new(
        listen: String,
        bound: Option<std::net::TcpListener>,
        threads: usize,
        state: SharedState,
        metrics: &Metrics,
    ) -> Self {
        let code = |c: &str| metrics.rls_requests.with_label_values(&[c]);
        Self {
            listen,
            bound,
            threads,
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

    /// The listening socket: the one an upgrade handed over, else the one
    /// bound at start-up (or now), entered in the table for a later upgrade.
    fn listener(&mut self, fds: Option<&ListenFds>) -> std::io::Result<TcpListener> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let inherited = fds.and_then(|table| table.lock().get(&self.listen).copied());
        let listener = match (inherited, self.bound.take()) {
            // SAFETY: the table holds descriptors of listening sockets the
            // previous process handed over; nothing else in this process
            // owns this one.
            (Some(fd), _) => unsafe { std::net::TcpListener::from_raw_fd(fd) },
            (None, Some(bound)) => bound,
            (None, None) => bind(&self.listen)?,
        };
        if let (Some(table), None) = (fds, inherited) {
            table.lock().add(self.listen.clone(), listener.as_raw_fd());
        }
        listener.set_nonblocking(true)?;
        TcpListener::from_std(listener)
    }

    /// The TLS acceptor, when the listener has certificates.
    fn tls(&self) -> Option<TlsAcceptor> {
        let state = self.state.load();
        state.config.server.rls.as_ref()?.tls.as_ref()?;
        match crate::edge::tls::rls_server_config(Arc::clone(&self.state)) {
            Ok(config) => Some(TlsAcceptor::from(config)),
            Err(e) => {
                log::error!("rate-limit service TLS: {e}");
                None
            }
        }
    }

    /// Accepts connections until shutdown, each served on a thread of the
    /// service's runtime.
    async fn accept(&self, listener: TcpListener, shutdown: ShutdownWatch) {
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

#[async_trait]
impl ServiceWithDependents for RlsListener {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
        ready: ServiceReadyNotifier,
    ) {
        let listener = match self.listener(fds.as_ref()) {
            Ok(listener) => listener,
            Err(e) => {
                log::error!("rate-limit service listener {}: {e}", self.listen);
                return;
            }
        };
        ready.notify_ready();
        self.accept(listener, shutdown).await;
    }

    fn name(&self) -> &str {
        "sluice rls"
    }

    fn threads(&self) -> Option<usize> {
        Some(self.threads)
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
