//! The client's stream, guarded: the head and idle deadlines, the send
//! timeout, and the head scan on what is read, in front of Pingora's own
//! reading; every other stream trait passes through.

use super::LINGER;
use crate::config::FrontDoorConfig;
use crate::edge::front_door::head::HeadProgress;
use crate::edge::front_door::head::HeadRefusal;
use crate::edge::front_door::head::HeadScan;
use crate::observe::metrics::Metrics;
use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Where a connection is between requests.
#[derive(Debug)]
pub(super) enum Phase {
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
    pub(super) fn new(inner: Stream, limits: FrontDoorConfig, metrics: Arc<Metrics>) -> Self {
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

    pub(super) fn count(&self, reason: &str) {
        self.metrics
            .downstream_rejected
            .with_label_values(&[reason])
            .inc();
    }

    /// When the current read must have made progress by.
    pub(super) fn read_deadline(&self) -> Option<Instant> {
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
    pub(super) fn expired(
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
    pub(super) fn on_read_deadline(&mut self) -> Poll<io::Result<()>> {
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
    pub(super) fn refuse(&mut self, cx: &mut Context<'_>, refusal: HeadRefusal) {
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
    pub(super) fn poll_linger(
        &mut self,
        cx: &mut Context<'_>,
        until: Instant,
    ) -> Poll<io::Result<()>> {
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
    pub(super) fn scan(&mut self, cx: &mut Context<'_>, chunk: &[u8], now: Instant) {
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
    pub(super) fn bound_write<T>(
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
