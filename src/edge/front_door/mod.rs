//! The front door: what one client connection may hold of the gateway.
//!
//! Pingora's own downstream defaults are permissive: no cap on connections,
//! a 60 s timeout per read rather than per request head (a client trickling a
//! header line every few seconds is never cut off), heads up to about 1 MiB.
//! [`FrontDoor`] wraps the proxy application and every accepted stream in a
//! [`GuardedStream`] that enforces, with the values of `server:` in force
//! when the connection was accepted:
//!
//! - `max_connections`: a connection beyond the cap is closed at once;
//! - `client_header_timeout`: the whole request head (from its first byte,
//!   or from the accept for a connection's first request) must arrive in
//!   time, however it is trickled; then the connection is closed;
//! - `keepalive_timeout`: an idle connection between requests is closed;
//! - `max_header_bytes` / `max_uri_bytes`: a larger head is answered 431, a
//!   longer target 414, as soon as the limit is passed — the gateway never
//!   buffers more than the limit;
//! - `send_timeout`: a write that the client leaves blocked (it stopped
//!   reading) fails after this long.
//!
//! On the TLS listeners the same cap and `client_header_timeout` also cover
//! the handshake, before Pingora hands the connection over
//! ([`crate::edge::handshake`]).
//!
//! The body timeout (`client_body_timeout`, between two body reads) is
//! Pingora's own per-read timeout, set per request by the proxy, because
//! only the proxy knows when a body is being read.
//!
//! The stream learns where a head ends by scanning the bytes it hands to
//! Pingora's parser (an empty line ends it, with or without CR) and where a
//! response ends from the proxy ([`GuardedStream::request_done`], called when
//! a request is logged). Refusals and closes are counted in
//! `sluice_downstream_rejected_total{reason}`.
//!
//! Here: the cap and the application wrapper. The head scan is `head.rs`,
//! the guarded stream `stream.rs`.

mod head;
mod stream;

use crate::edge::handshake::{HandshakeGuard, Handshakes};
use crate::observe::metrics::Metrics;
use crate::policy::state::SharedState;
use async_trait::async_trait;
pub use head::{HeadProgress, HeadRefusal, HeadScan};
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
pub use stream::GuardedStream;

/// How long a refused connection keeps reading (and discarding) what the
/// client still sends after the refusal, so that closing it does not reset
/// the connection before the client has read the answer.
const LINGER: Duration = Duration::from_secs(1);

/// A server application behind the connection limits of `server:`.
pub struct FrontDoor<A> {
    inner: Arc<A>,
    state: SharedState,
    metrics: Arc<Metrics>,
    open: Arc<AtomicUsize>,
    /// The TLS handshakes in progress (see [`FrontDoor::handshake_guard`]).
    handshakes: Arc<Handshakes>,
    /// How long shutdown waits before the inner application drops the
    /// connections still waiting for a request (see `drain`).
    settle: Duration,
    /// The watch the inner application's connections follow instead of
    /// Pingora's (see [`FrontDoor::following`]).
    connections: Option<ShutdownWatch>,
}

impl<A> FrontDoor<A> {
    /// Wraps `inner`; the limits are read from `state` at each accept; on
    /// shutdown, connections get `settle` (see [`crate::edge::drain`]) before the
    /// inner application drops the idle ones.
    pub fn new(inner: A, settle: Duration, state: SharedState, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(inner),
            state,
            metrics,
            open: Arc::new(AtomicUsize::new(0)),
            handshakes: Arc::new(Handshakes::default()),
            settle,
            connections: None,
        }
    }

    /// Has the inner application's connections follow `connections` rather
    /// than Pingora's shutdown watch: they are told to go (HTTP/1
    /// `Connection: close`, HTTP/2 GOAWAY) when it turns true, while the
    /// listener still accepts (see `shutdown_delay`).
    pub fn following(mut self, connections: ShutdownWatch) -> Self {
        self.connections = Some(connections);
        self
    }

    /// The pre-TLS callback for the TLS listeners of this front door: their
    /// handshakes count against the same `max_connections` and end within
    /// `client_header_timeout`.
    pub fn handshake_guard(&self) -> HandshakeGuard {
        HandshakeGuard::new(
            Arc::clone(&self.handshakes),
            Arc::clone(&self.open),
            Arc::clone(&self.state),
            Arc::clone(&self.metrics),
        )
    }
}

/// Counts one open connection while it lives.
struct OpenConnection {
    open: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let now = self.open.fetch_sub(1, Ordering::AcqRel) - 1;
        self.metrics.downstream_connections.set(now as i64);
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for FrontDoor<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let limits = self.state.load().config.server.front_door;
        let now_open = self.open.fetch_add(1, Ordering::AcqRel) + 1;
        let _counted = OpenConnection {
            open: Arc::clone(&self.open),
            metrics: Arc::clone(&self.metrics),
        };
        self.metrics.downstream_connections.set(now_open as i64);
        // A TLS connection arrives handshaken: its handshake's watch ends.
        self.handshakes.finished(stream.id());
        if now_open > limits.max_connections {
            self.reject("max_connections");
            return None;
        }
        let guarded = GuardedStream::new(stream, limits, Arc::clone(&self.metrics));
        let shutdown = self.connections.as_ref().unwrap_or(shutdown);
        self.inner.process_new(Box::new(guarded), shutdown).await
    }

    async fn cleanup(&self) {
        tokio::time::sleep(self.settle).await;
        self.inner.cleanup().await;
    }
}

impl<A> FrontDoor<A> {
    fn reject(&self, reason: &str) {
        self.metrics
            .downstream_rejected
            .with_label_values(&[reason])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FrontDoorConfig;

    fn limits() -> FrontDoorConfig {
        FrontDoorConfig {
            max_header_bytes: 1024,
            max_uri_bytes: 64,
            ..FrontDoorConfig::default()
        }
    }

    #[test]
    fn a_head_ends_at_its_empty_line_whatever_the_chunks() {
        let head = b"\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\nBODY";
        for split in 0..head.len() {
            let mut scan = HeadScan::default();
            let first = scan.feed(&head[..split], &limits());
            let progress = if first == HeadProgress::Complete {
                first
            } else {
                scan.feed(&head[split..], &limits())
            };
            assert_eq!(progress, HeadProgress::Complete, "split at {split}");
        }
        let mut scan = HeadScan::default();
        assert_eq!(
            scan.feed(b"GET / HTTP/1.1\nHost: x\n\n", &limits()),
            HeadProgress::Complete
        );
        let mut scan = HeadScan::default();
        assert_eq!(
            scan.feed(b"GET / HTTP/1.1\r\nHost: x\r\n", &limits()),
            HeadProgress::Partial
        );
    }

    /// Found by fuzzing: a malformed request line (a long version after
    /// the last space) was refused when it came in pieces and passed when
    /// it came whole.
    #[test]
    fn a_malformed_long_line_is_refused_however_it_arrives() {
        let line = format!("GET /a HTTP/1.1{}\r\n\r\n", "x".repeat(80));
        let whole = HeadScan::default().feed(line.as_bytes(), &limits());
        let mut scan = HeadScan::default();
        let first = scan.feed(&line.as_bytes()[..90], &limits());
        assert_eq!(first, HeadProgress::Refused(HeadRefusal::UriTooLong));
        assert_eq!(whole, first);
        // A target of exactly the cap still passes, with CR or without.
        for end in ["\r\n\r\n", "\n\n"] {
            let exact = format!("GET /{} HTTP/1.1{end}", "a".repeat(63));
            let progress = HeadScan::default().feed(exact.as_bytes(), &limits());
            assert_eq!(progress, HeadProgress::Complete, "{end:?}");
        }
    }

    #[test]
    fn long_targets_and_large_heads_are_refused_early() {
        let mut scan = HeadScan::default();
        let target = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(63));
        assert_eq!(
            scan.feed(target.as_bytes(), &limits()),
            HeadProgress::Complete
        );

        let mut scan = HeadScan::default();
        let target = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(64));
        assert_eq!(
            scan.feed(target.as_bytes(), &limits()),
            HeadProgress::Refused(HeadRefusal::UriTooLong)
        );

        // Refused before the request line ends: nothing is buffered past it.
        let mut scan = HeadScan::default();
        let endless = format!("GET /{}", "a".repeat(200));
        assert_eq!(
            scan.feed(endless.as_bytes(), &limits()),
            HeadProgress::Refused(HeadRefusal::UriTooLong)
        );

        let mut scan = HeadScan::default();
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        head.extend(std::iter::repeat_n(b"X-Pad: 0123456789\r\n".as_slice(), 60).flatten());
        assert_eq!(
            scan.feed(&head, &limits()),
            HeadProgress::Refused(HeadRefusal::HeaderTooLarge)
        );
    }
}
