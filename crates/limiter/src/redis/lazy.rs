//! A connection made on first use by one background task at a time.
//!
//! Requests that find no connection start (at most) one connect task and wait
//! for it; the caller's own timeout bounds the wait while the connect goes on,
//! so a slow connect never holds a request past its budget and never runs
//! twice at once. Used by the standalone and the cluster Redis backends.
//!
//! The slot also remembers whether a connect attempt has ever ended: until
//! then the backend is still starting, and a decision may wait for the
//! connect (within the connect budget) instead of falling back.

use crate::sync::ReadWriteLocked;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use tokio::sync::Notify;

/// Slot for a shared, cloneable connection.
pub(super) struct LazyConnection<C> {
    slot: RwLock<Option<C>>,
    connecting: AtomicBool,
    /// Whether any connect attempt has ended (succeeded or failed).
    attempted: AtomicBool,
    done: Notify,
}

impl<C: Clone> LazyConnection<C> {
    /// An empty slot.
    pub(super) fn new() -> Self {
        Self {
            slot: RwLock::new(None),
            connecting: AtomicBool::new(false),
            attempted: AtomicBool::new(false),
            done: Notify::new(),
        }
    }

    /// The connection, if one is established.
    pub(super) fn current(&self) -> Option<C> {
        self.slot.read_locked().clone()
    }

    /// Whether a connect attempt has ever ended, in success or failure:
    /// false while the first one is still running (or none has started).
    pub(super) fn attempted(&self) -> bool {
        self.attempted.load(Ordering::Acquire)
    }

    /// Where the slot stands: connected, the first connect still running,
    /// or not connected after an attempt.
    pub(super) fn link(&self) -> crate::Link {
        if self.current().is_some() {
            crate::Link::Connected
        } else if self.attempted() {
            crate::Link::Unreachable
        } else {
            crate::Link::Starting
        }
    }

    /// Forgets the connection; the next `get` connects again.
    pub(super) fn clear(&self) {
        *self.slot.write_locked() = None;
    }

    /// The connection; if there is none, calls `start_connect` (which must
    /// spawn a task that ends with [`LazyConnection::finish`]) unless a
    /// connect is already running, and waits for it. `None`: it failed.
    pub(super) async fn get(&self, start_connect: impl FnOnce()) -> Option<C> {
        if let Some(conn) = self.current() {
            return Some(conn);
        }
        let notified = self.done.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(conn) = self.current() {
            return Some(conn);
        }
        if !self.connecting.swap(true, Ordering::AcqRel) {
            start_connect();
        }
        notified.await;
        self.current()
    }

    /// Starts a connect with `start_connect` (as [`LazyConnection::get`]
    /// would) unless there is a connection or one is being made; does not
    /// wait for it.
    pub(super) fn start(&self, start_connect: impl FnOnce()) {
        if self.current().is_none() && !self.connecting.swap(true, Ordering::AcqRel) {
            start_connect();
        }
    }

    /// Ends a connect attempt: stores `conn` (if it succeeded) and wakes the waiters.
    pub(super) fn finish(&self, conn: Option<C>) {
        if let Some(conn) = conn {
            *self.slot.write_locked() = Some(conn);
        }
        self.attempted.store(true, Ordering::Release);
        self.connecting.store(false, Ordering::Release);
        self.done.notify_waiters();
    }
}
