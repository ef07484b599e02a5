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

use crate::config::FrontDoorConfig;
use crate::edge::handshake::{HandshakeGuard, Handshakes};
use crate::observe::metrics::Metrics;
use crate::policy::state::SharedState;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::server::ShutdownWatch;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

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
        }
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

/// Why the front door refused a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRefusal {
    /// The request target is longer than `max_uri_bytes`: 414.
    UriTooLong,
    /// The head is larger than `max_header_bytes`: 431.
    HeaderTooLarge,
}

impl HeadRefusal {
    fn reason(self) -> &'static str {
        match self {
            HeadRefusal::UriTooLong => "uri_too_long",
            HeadRefusal::HeaderTooLarge => "header_too_large",
        }
    }

    fn response(self) -> &'static [u8] {
        match self {
            HeadRefusal::UriTooLong => {
                b"HTTP/1.1 414 URI Too Long\r\nContent-Type: application/json\r\nContent-Length: 24\r\nConnection: close\r\n\r\n{\"error\":\"uri_too_long\"}"
            }
            HeadRefusal::HeaderTooLarge => {
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"error\":\"header_too_large\"}"
            }
        }
    }
}

/// Where a request head is, byte by byte: its size, its target's size, and
/// whether it is complete.
#[derive(Debug, Clone, Default)]
pub struct HeadScan {
    /// Bytes of the head so far (leading empty lines not counted).
    bytes: usize,
    /// The request line has ended.
    line_done: bool,
    /// Offset of the first space of the request line, once seen.
    first_space: Option<usize>,
    /// Offset of the last space of the request line so far.
    last_space: Option<usize>,
    /// 0: inside a line; 1: just after LF; 2: after LF then CR.
    after_newline: u8,
}

/// What a scanned chunk says about the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadProgress {
    /// The head goes on.
    Partial,
    /// The head ended within this chunk.
    Complete,
    /// The head breaks a limit.
    Refused(HeadRefusal),
}

impl HeadScan {
    /// Feeds the next bytes of the head. Looks only at line ends and the
    /// request line's spaces (memchr), so a head costs a few instructions
    /// per line rather than per byte.
    pub fn feed(&mut self, chunk: &[u8], limits: &FrontDoorConfig) -> HeadProgress {
        let mut rest = chunk;
        if self.bytes == 0 {
            // Empty lines before a request line are ignored.
            let start = rest
                .iter()
                .position(|&b| b != b'\r' && b != b'\n')
                .unwrap_or(rest.len());
            rest = &rest[start..];
            if rest.is_empty() {
                return HeadProgress::Partial;
            }
        }
        if !self.line_done {
            match self.request_line(rest, limits) {
                Ok(Some(after)) => rest = &rest[after..],
                Ok(None) => return HeadProgress::Partial,
                Err(refusal) => return HeadProgress::Refused(refusal),
            }
        }
        self.header_lines(rest, limits)
    }

    /// Follows the request line through `part`: `Ok(Some(n))` when it ends
    /// within `part` (n bytes of it belong to the line, LF included).
    fn request_line(
        &mut self,
        part: &[u8],
        limits: &FrontDoorConfig,
    ) -> Result<Option<usize>, HeadRefusal> {
        let end = memchr::memchr(b'\n', part);
        let line = &part[..end.unwrap_or(part.len())];
        if let Some(i) = memchr::memchr(b' ', line) {
            self.first_space.get_or_insert(self.bytes + i);
        }
        if let Some(i) = memchr::memrchr(b' ', line) {
            self.last_space = Some(self.bytes + i);
        }
        let Some(end) = end else {
            self.bytes += part.len();
            // Still in the target: refused as soon as it is certainly too
            // long (" HTTP/1.1\r\n" is all that may follow it).
            let too_long = self.first_space.is_some_and(|first| {
                self.bytes - first > limits.max_uri_bytes + " HTTP/1.1\r\n".len()
            });
            return match () {
                _ if too_long => Err(HeadRefusal::UriTooLong),
                _ if self.bytes > limits.max_header_bytes => Err(HeadRefusal::HeaderTooLarge),
                _ => Ok(None),
            };
        };
        self.bytes += end + 1;
        self.line_done = true;
        self.after_newline = 1;
        if let (Some(first), Some(last)) = (self.first_space, self.last_space) {
            if last > first && last - first - 1 > limits.max_uri_bytes {
                return Err(HeadRefusal::UriTooLong);
            }
        }
        if self.bytes > limits.max_header_bytes {
            return Err(HeadRefusal::HeaderTooLarge);
        }
        Ok(Some(end + 1))
    }

    /// Looks for the empty line that ends the head (LF, optional CR, LF).
    fn header_lines(&mut self, part: &[u8], limits: &FrontDoorConfig) -> HeadProgress {
        let mut state = self.after_newline;
        let mut at = 0;
        while at < part.len() {
            match (state, part[at]) {
                (1 | 2, b'\n') => {
                    self.bytes += at + 1;
                    if self.bytes > limits.max_header_bytes {
                        return HeadProgress::Refused(HeadRefusal::HeaderTooLarge);
                    }
                    return HeadProgress::Complete;
                }
                (1, b'\r') => {
                    state = 2;
                    at += 1;
                }
                _ => match memchr::memchr(b'\n', &part[at..]) {
                    // The LF that ends this line: the next byte decides.
                    Some(i) => {
                        state = 1;
                        at += i + 1;
                    }
                    None => {
                        state = 0;
                        at = part.len();
                    }
                },
            }
        }
        self.bytes += part.len();
        self.after_newline = state;
        if self.bytes > limits.max_header_bytes {
            return HeadProgress::Refused(HeadRefusal::HeaderTooLarge);
        }
        HeadProgress::Partial
    }
}

/// Where a connection is between requests.
#[derive(Debug)]
enum Phase {
    /// Waiting for the first byte of a request; `fresh`: no request yet.
    Idle { since: Instant, fresh: bool },
    /// Reading a request head that started at `since`.
    Head { since: Instant, scan: HeadScan },
    /// The head is read; the body and the response are the proxy's.
    Request,
    /// Refused: discard what the client still sends until `until`, then fail.
    Lingering { until: Instant },
    /// Closed by the front door: every read fails.
    Closed,
}

/// A client stream under the front door's limits (see the module doc).
pub struct GuardedStream {
    inner: Stream,
    limits: FrontDoorConfig,
    metrics: Arc<Metrics>,
    phase: Phase,
    /// Set by the proxy when a request has been answered and logged.
    request_done: AtomicBool,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_timer: Option<Pin<Box<Sleep>>>,
    /// When the current write started waiting for the client.
    write_blocked_since: Option<Instant>,
}

impl std::fmt::Debug for GuardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedStream")
            .field("inner", &self.inner)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl GuardedStream {
    fn new(inner: Stream, limits: FrontDoorConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            limits,
            metrics,
            phase: Phase::Idle {
                since: Instant::now(),
                fresh: true,
            },
            request_done: AtomicBool::new(false),
            read_timer: None,
            write_timer: None,
            write_blocked_since: None,
        }
    }

    /// Says that the current request is over: the next bytes start a new
    /// head, and until they come the connection is idle.
    pub fn request_done(&self) {
        self.request_done.store(true, Ordering::Release);
    }

    /// The guarded stream under a Pingora stream, if it is one.
    pub fn of(stream: &Stream) -> Option<&GuardedStream> {
        stream.as_any().downcast_ref::<GuardedStream>()
    }

    fn count(&self, reason: &str) {
        self.metrics
            .downstream_rejected
            .with_label_values(&[reason])
            .inc();
    }

    /// When the current read must have made progress by.
    fn read_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Idle { since, fresh: true } | Phase::Head { since, .. } => {
                Some(*since + self.limits.client_header_timeout)
            }
            Phase::Idle {
                since,
                fresh: false,
            } => Some(*since + self.limits.keepalive_timeout),
            Phase::Lingering { until } => Some(*until),
            Phase::Request | Phase::Closed => None,
        }
    }

    /// Whether `deadline` has passed at `now`; if not, the task is woken
    /// by then.
    ///
    /// The timer is moved only when it must fire earlier. Each request of a
    /// keep-alive connection pushes its idle deadline later, and re-arming a
    /// timer per request would cost the runtime's timer wheel every time;
    /// instead a timer that fires before the current deadline (it was armed
    /// for an earlier one) is simply re-armed then.
    fn expired(
        timer: &mut Option<Pin<Box<Sleep>>>,
        cx: &mut Context<'_>,
        deadline: Instant,
        now: Instant,
    ) -> bool {
        if now >= deadline {
            return true;
        }
        let sleep = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        while sleep.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                return true;
            }
            sleep.as_mut().reset(deadline);
        }
        false
    }

    /// A read deadline passed in phase `self.phase`: what the read returns.
    fn on_read_deadline(&mut self) -> Poll<io::Result<()>> {
        let phase = std::mem::replace(&mut self.phase, Phase::Closed);
        match phase {
            // A keep-alive connection that stays idle: closed quietly (EOF).
            Phase::Idle { fresh: false, .. } => Poll::Ready(Ok(())),
            // A connection that never sent a whole head in time.
            Phase::Idle { fresh: true, .. } | Phase::Head { .. } => {
                self.count("header_timeout");
                Poll::Ready(Ok(()))
            }
            _ => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection refused by the front door",
            ))),
        }
    }

    /// Answers a refused head (best effort: the answer is small and the
    /// socket's buffer empty), half-closes, and lingers.
    fn refuse(&mut self, cx: &mut Context<'_>, refusal: HeadRefusal) {
        self.count(refusal.reason());
        let inner = Pin::new(&mut self.inner);
        let _ = inner.poll_write(cx, refusal.response());
        let _ = Pin::new(&mut self.inner).poll_flush(cx);
        let _ = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.phase = Phase::Lingering {
            until: Instant::now() + LINGER,
        };
    }

    /// Reads and discards until the client closes or the linger ends.
    fn poll_linger(&mut self, cx: &mut Context<'_>, until: Instant) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 4096];
        loop {
            let mut sink = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut sink) {
                Poll::Ready(Ok(())) if !sink.filled().is_empty() => continue,
                Poll::Ready(_) => break,
                Poll::Pending if Self::expired(&mut self.read_timer, cx, until, Instant::now()) => {
                    break
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        self.phase = Phase::Closed;
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "request head refused by the front door",
        )))
    }

    /// Follows the head through the bytes just read at `now`.
    fn scan(&mut self, cx: &mut Context<'_>, chunk: &[u8], now: Instant) {
        if let Phase::Idle { .. } = self.phase {
            self.phase = Phase::Head {
                since: now,
                scan: HeadScan::default(),
            };
        }
        let Phase::Head { scan, .. } = &mut self.phase else {
            return;
        };
        match scan.feed(chunk, &self.limits) {
            HeadProgress::Partial => {}
            HeadProgress::Complete => self.phase = Phase::Request,
            HeadProgress::Refused(refusal) => self.refuse(cx, refusal),
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.request_done.swap(false, Ordering::AcqRel) && matches!(this.phase, Phase::Request) {
            this.phase = Phase::Idle {
                since: Instant::now(),
                fresh: false,
            };
        }
        match this.phase {
            Phase::Request => return Pin::new(&mut this.inner).poll_read(cx, buf),
            Phase::Closed => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "connection closed by the front door",
                )))
            }
            Phase::Lingering { until } => return this.poll_linger(cx, until),
            Phase::Idle { .. } | Phase::Head { .. } => {}
        }
        let now = Instant::now();
        let deadline = this.read_deadline();
        if deadline.is_some_and(|d| now >= d) {
            return this.on_read_deadline();
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    this.scan(cx, read, now);
                    if let Phase::Lingering { until } = this.phase {
                        // What was read is not handed on: the head is refused.
                        buf.set_filled(before);
                        return this.poll_linger(cx, until);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match deadline {
                Some(d) if Self::expired(&mut this.read_timer, cx, d, now) => {
                    this.on_read_deadline()
                }
                _ => Poll::Pending,
            },
        }
    }
}

impl GuardedStream {
    /// Bounds a write the client leaves blocked by `send_timeout`.
    fn bound_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match result {
            Poll::Pending => {
                let now = Instant::now();
                let since = *self.write_blocked_since.get_or_insert(now);
                let deadline = since + self.limits.send_timeout;
                if Self::expired(&mut self.write_timer, cx, deadline, now) {
                    self.write_blocked_since = None;
                    self.count("send_timeout");
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client stopped reading (send_timeout)",
                    )));
                }
                Poll::Pending
            }
            ready => {
                self.write_blocked_since = None;
                ready
            }
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.bound_write(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.bound_write(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.bound_write(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for GuardedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for GuardedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for GuardedStream {
    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for GuardedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for GuardedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for GuardedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for GuardedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
