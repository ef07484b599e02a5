//! The limiter's connection, made before the listeners accept.
//!
//! A background service the proxy and the rate-limit service depend on:
//! Pingora starts their listeners only once it says it is ready, and it says
//! so once Redis is connected and the decide code loaded, or once that
//! failed within `limiter.redis.connect_timeout` (then `on_error` decides
//! until Redis answers, and `/readyz` says why). So the first request is
//! decided by Redis, not by a fallback standing in while the connection is
//! still being made.
//!
//! This first connection is made here, on this service's runtime, which
//! lives as long as the server (a connection made before Pingora starts its
//! runtimes would die with a temporary one). It proves Redis reachable and
//! loads the decide code; it does not carry the requests' decisions: each
//! worker thread makes a connection of its own on its first decision (and
//! sends on this one until its own is ready), so that a batch never wakes
//! another thread. Afterwards the service keeps a backend that is not
//! connected trying once a second, so that readiness comes back when Redis
//! does, even while no request arrives to connect it.

use crate::limiter::Link;
use crate::policy::state::SharedState;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;
use std::time::Duration;

/// How often a backend that is not connected is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Connects the current state's limiter at the start, then keeps an
/// unconnected one trying (see the module doc).
pub struct LimiterWarmUp {
    state: SharedState,
}

impl LimiterWarmUp {
    /// The warm-up of whatever limiter `state` holds (a reload may swap it).
    pub fn new(state: SharedState) -> Self {
        Self { state }
    }

    /// One connect of the current limiter, unless it is connected.
    async fn connect_current(&self) -> Result<(), crate::limiter::LimiterError> {
        let decider = std::sync::Arc::clone(&self.state.load().decider);
        if decider.link() == Link::Connected {
            return Ok(());
        }
        decider.connect().await
    }
}

#[async_trait]
impl BackgroundService for LimiterWarmUp {
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        if let Err(e) = self.connect_current().await {
            log::warn!("Redis is not connected at start ({e}): on_error decides until it is");
        }
        ready.notify_ready();
        self.state.load_full().report_consumer_plans().await;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
            let _ = self.connect_current().await;
        }
    }
}
