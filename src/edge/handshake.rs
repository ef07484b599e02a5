//! The TLS handshake under the front door's limits.
//!
//! Pingora gives a client 60 s to finish its TLS handshake and hands the
//! connection to the application only once it has: until then the
//! connection is under no limit of `server:`. A client that connects to a
//! TLS listener and sends nothing, or half a ClientHello, would hold a socket
//! for a minute, beyond `max_connections`.
//!
//! [`HandshakeGuard`] runs before every handshake (Pingora's pre-TLS
//! callback). It counts the connection among the handshakes in progress,
//! refuses it when those and the open connections reach `max_connections`,
//! and sets a deadline of `client_header_timeout` (the same time a plain
//! connection has for its first request head) after which the socket is
//! shut down. The front door ends the watch when the connection reaches it
//! ([`Handshakes::finished`]), handshaken.
//!
//! A watch holds a duplicate of the socket's descriptor, so that it can only
//! ever shut down the socket it was set for, even after Pingora has closed
//! the original and its number is reused. It checks every 250 ms that the
//! original still names that socket, and lets go (closing its duplicate)
//! as soon as it does not: a failed handshake's socket is not kept open.

use crate::observe::metrics::Metrics;
use crate::policy::state::SharedState;
use async_trait::async_trait;
use pingora::listeners::PreTlsProcess;
use pingora::protocols::l4::stream::Stream as L4Stream;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// How often a watch checks that Pingora still holds its socket.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The handshakes in progress on the TLS listeners, by socket descriptor.
#[derive(Default)]
pub struct Handshakes {
    /// Each watch's number and the sender that ends it (dropping it does).
    watches: Mutex<HashMap<RawFd, (u64, oneshot::Sender<()>)>>,
    next: AtomicU64,
}

impl Handshakes {
    /// Handshakes begun and not yet finished, failed or timed out.
    pub fn in_progress(&self) -> usize {
        self.locked().len()
    }

    /// Ends the watch of the connection on `fd`: its handshake is done (a
    /// descriptor without a watch, a plain connection's, is left alone).
    pub fn finished(&self, fd: RawFd) {
        self.locked().remove(&fd);
    }

    fn locked(&self) -> MutexGuard<'_, HashMap<RawFd, (u64, oneshot::Sender<()>)>> {
        // A watch map poisoned by a panic elsewhere is still a valid map.
        self.watches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Watches the socket on `fd` (`socket` is its duplicate): shut down
    /// after `deadline` unless [`Handshakes::finished`] comes first or the
    /// original descriptor is closed.
    fn watch(
        self: &Arc<Self>,
        fd: RawFd,
        socket: OwnedFd,
        deadline: Duration,
        metrics: Arc<Metrics>,
    ) {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let (end, mut ended) = oneshot::channel();
        // A watch left on this number belongs to a socket already closed
        // (the number was free to be reused): replacing it ends that watch.
        self.locked().insert(fd, (number, end));
        let handshakes = Arc::clone(self);
        tokio::spawn(async move {
            let expiry = tokio::time::sleep(deadline);
            tokio::pin!(expiry);
            let mut check = tokio::time::interval(CHECK_EVERY);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut ended => return,
                    () = &mut expiry => {
                        shut_down(&socket);
                        metrics
                            .downstream_rejected
                            .with_label_values(&["handshake_timeout"])
                            .inc();
                        break;
                    }
                    _ = check.tick() => {
                        if !same_socket(fd, &socket) {
                            break;
                        }
                    }
                }
            }
            let mut watches = handshakes.locked();
            if watches.get(&fd).is_some_and(|(n, _)| *n == number) {
                watches.remove(&fd);
            }
        });
    }
}

/// Whether the descriptor `fd` still names the socket `socket` duplicates.
fn same_socket(fd: RawFd, socket: &OwnedFd) -> bool {
    match (identity(fd), identity(socket.as_raw_fd())) {
        (Some(original), Some(duplicate)) => original == duplicate,
        _ => false,
    }
}

/// The device and inode `fd` names, if it is open.
fn identity(fd: RawFd) -> Option<(u64, u64)> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat only writes the stat buffer, which it fills entirely on
    // success; a closed or reused descriptor number is an error or another
    // file, never undefined behaviour.
    let result = unsafe { libc::fstat(fd, stat.as_mut_ptr()) };
    if result != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it initialised the buffer.
    let stat = unsafe { stat.assume_init() };
    Some((stat.st_dev, stat.st_ino))
}

/// Shuts both directions of `socket` down: the handshake's next read or
/// write fails and Pingora drops the connection.
fn shut_down(socket: &OwnedFd) {
    // SAFETY: `socket` is an open descriptor this watch owns.
    unsafe {
        libc::shutdown(socket.as_raw_fd(), libc::SHUT_RDWR);
    }
}

/// Pingora's pre-TLS callback of the TLS listeners: the connection cap and
/// the handshake deadline (see the module's documentation).
pub struct HandshakeGuard {
    handshakes: Arc<Handshakes>,
    /// The front door's count of open (handshaken) connections.
    open: Arc<AtomicUsize>,
    state: SharedState,
    metrics: Arc<Metrics>,
}

impl HandshakeGuard {
    /// A guard counting `handshakes` and `open` together against
    /// `max_connections`, with the limits of `state` at each accept.
    pub fn new(
        handshakes: Arc<Handshakes>,
        open: Arc<AtomicUsize>,
        state: SharedState,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            handshakes,
            open,
            state,
            metrics,
        }
    }
}

#[async_trait]
impl PreTlsProcess for HandshakeGuard {
    async fn process(&self, stream: &mut L4Stream) -> pingora::Result<()> {
        let limits = self.state.load().config.server.front_door;
        let held = self.handshakes.in_progress() + self.open.load(Ordering::Acquire);
        if held >= limits.max_connections {
            self.metrics
                .downstream_rejected
                .with_label_values(&["max_connections"])
                .inc();
            return pingora::Error::e_explain(
                pingora::ErrorType::AcceptError,
                "max_connections reached before the TLS handshake",
            );
        }
        let fd = stream.as_raw_fd();
        // SAFETY: `stream` owns `fd` and is borrowed for the whole call.
        let original = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = original.try_clone_to_owned().map_err(|e| {
            pingora::Error::because(
                pingora::ErrorType::AcceptError,
                "cannot watch the TLS handshake",
                e,
            )
        })?;
        self.handshakes.watch(
            fd,
            socket,
            limits.client_header_timeout,
            Arc::clone(&self.metrics),
        );
        Ok(())
    }
}
