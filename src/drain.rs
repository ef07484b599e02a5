//! Graceful drain of the proxy listener on shutdown and upgrade.
//!
//! When Pingora stops a listening service it stops accepting and then calls
//! the application's `cleanup`, which makes the HTTP proxy drop every
//! connection still waiting for its request — including one accepted an
//! instant earlier whose request bytes are still on their way. Under load that
//! turns a handful of requests per upgrade into "connection closed without a
//! response". [`Draining`] waits a short settle time before that cleanup, so a
//! connection accepted before the listener stopped gets its request served
//! (with `Connection: close`); idle keep-alive connections close after it.

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use std::sync::Arc;
use std::time::Duration;

/// A server application whose connection cleanup on shutdown is delayed by
/// `settle`; everything else is the inner application's.
pub struct Draining<A> {
    inner: Arc<A>,
    settle: Duration,
}

impl<A> Draining<A> {
    /// Wraps `inner`, delaying its shutdown cleanup by `settle`.
    pub fn new(inner: A, settle: Duration) -> Self {
        Self {
            inner: Arc::new(inner),
            settle,
        }
    }
}

/// The settle time for a server that drains for `grace_period`: a
/// second, or half the grace period if that is shorter, so that requests
/// it lets in still have time to finish.
pub fn settle_time(grace_period: Duration) -> Duration {
    (grace_period / 2).min(Duration::from_secs(1))
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Draining<A> {
    async fn process_new(
        self: &Arc<Self>,
        session: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.inner.process_new(session, shutdown).await
    }

    async fn cleanup(&self) {
        tokio::time::sleep(self.settle).await;
        self.inner.cleanup().await;
    }
}
