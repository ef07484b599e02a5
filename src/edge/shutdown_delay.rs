//! `server.shutdown_delay`: the drain before a graceful stop.
//!
//! Kubernetes removes a terminating pod from its Service's endpoints
//! asynchronously, and load balancers take a health check or two to stop
//! sending; meanwhile new connections keep arriving. So on `SIGTERM`, with
//! a delay set, sluice first *drains*: `/readyz` answers 503 at once (with
//! the reason), the listeners keep accepting and serving, and every HTTP/1
//! response carries `Connection: close` so kept-alive clients reconnect —
//! elsewhere. When the delay is over, Pingora's graceful stop runs as
//! without a delay (stop accepting, finish what is in flight within
//! `grace_period`). `SIGINT` during the drain stops at once; a second
//! `SIGTERM` ends the drain early.

use async_trait::async_trait;
use pingora::server::{
    ShutdownSignal, ShutdownSignalWatch, ShutdownWatch, UnixShutdownSignalWatch,
};
use pingora::services::background::BackgroundService;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Whether the process is draining; and the watch the
/// proxy's connections follow (true from the drain, or from Pingora's own
/// stop or upgrade, whichever comes first).
#[derive(Debug)]
pub struct Draining {
    draining: AtomicBool,
    connections: watch::Sender<bool>,
}

impl Default for Draining {
    fn default() -> Self {
        Self {
            draining: AtomicBool::new(false),
            connections: watch::channel(false).0,
        }
    }
}

impl Draining {
    /// Starts the drain (a second call changes nothing): `/readyz`
    /// answers 503, and connections are told to go (HTTP/1 `Connection:
    /// close` after their response, HTTP/2 GOAWAY).
    pub fn start(&self) {
        self.draining.store(true, Ordering::Release);
        self.connections.send_replace(true);
    }

    /// Whether the drain has started: the process will stop soon.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// What the proxy's connections take for Pingora's shutdown watch:
    /// true once they should end after their current work.
    pub fn connections(&self) -> ShutdownWatch {
        self.connections.subscribe()
    }
}

/// Passes Pingora's own stop or upgrade on to [`Draining::connections`]
/// (a stop without a delay, `SIGQUIT`): the connections follow it as they
/// would follow Pingora's watch.
pub struct ForwardStop(pub Arc<Draining>);

#[async_trait]
impl BackgroundService for ForwardStop {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if shutdown.changed().await.is_ok() && *shutdown.borrow() {
            self.0.connections.send_replace(true);
        }
    }
}

/// Pingora's shutdown signals, with `SIGTERM` held for `delay` while the
/// process drains.
pub struct DelayedTerminate {
    delay: Duration,
    draining: Arc<Draining>,
}

impl DelayedTerminate {
    /// The signal watch of a process that drains for `delay` on `SIGTERM`
    /// (none when it is zero), marking `draining`.
    pub fn new(delay: Duration, draining: Arc<Draining>) -> Self {
        Self { delay, draining }
    }
}

#[async_trait]
impl ShutdownSignalWatch for DelayedTerminate {
    async fn recv(&self) -> ShutdownSignal {
        let signal = UnixShutdownSignalWatch.recv().await;
        if !matches!(signal, ShutdownSignal::GracefulTerminate) || self.delay.is_zero() {
            return signal;
        }
        self.draining.start();
        log::info!(
            "SIGTERM: draining for {:?} (readyz 503, keep-alive connections closed after their response), then the graceful stop",
            self.delay
        );
        tokio::select! {
            () = tokio::time::sleep(self.delay) => ShutdownSignal::GracefulTerminate,
            next = UnixShutdownSignalWatch.recv() => match next {
                ShutdownSignal::FastShutdown => ShutdownSignal::FastShutdown,
                _ => {
                    log::info!("a second signal: the drain ends now");
                    ShutdownSignal::GracefulTerminate
                }
            },
        }
    }
}
