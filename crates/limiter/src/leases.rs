//! Keeping this instance's concurrency leases alive while their requests
//! live (docs/algorithms.md, "Concurrency").
//!
//! A `concurrency` lease ends by itself `lease` after it was last renewed,
//! so that the leases of an instance that dies come back. A request that
//! outlives `lease` (a WebSocket, a long poll, a streamed download, a gRPC
//! stream) must keep its slot: the [`LeaseBook`] lists every lease the
//! instance holds, and one task renews them on a tick of a third of the
//! shortest `lease` held. Each tick makes one renewal call per backend that
//! granted leases — one script call to a Redis (per [`MAX_RENEWALS`]
//! leases), one per Redis Cluster primary, none to the network for the
//! in-process limiter — however many leases are held. A renewal never
//! brings back a lease that was released or had already ended, and never
//! admits anything: it only moves a held lease's end `lease` from now.
//!
//! A request's [`LeaseHold`] takes its leases off the book when it is
//! dropped (the request ended, or its context was dropped without ending
//! cleanly): from then on they are released, or end `lease` after their
//! last renewal. An instance that dies renews nothing, so its leases end
//! within `lease`.

use super::local::LocalLimiter;
use super::{Lease, Limiter, LimiterError};
use crate::sync::Locked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most leases one renewal call carries: bounds how long one call
/// holds Redis (a few milliseconds at most).
pub const MAX_RENEWALS: usize = 1000;

/// The shortest renewal tick, whatever `lease` is.
const MIN_TICK: Duration = Duration::from_millis(10);

/// The backend that granted a lease: its renewals go there.
#[derive(Clone)]
pub enum Grantor {
    /// Redis or a Redis Cluster.
    Remote(Arc<dyn Limiter>),
    /// The in-process limiter (`backend: local`, or the `on_error: local`
    /// fallback).
    Local(Arc<LocalLimiter>),
}

impl Grantor {
    /// Whether both are the same backend.
    fn is(&self, other: &Grantor) -> bool {
        match (self, other) {
            (Grantor::Remote(a), Grantor::Remote(b)) => {
                std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
            }
            (Grantor::Local(a), Grantor::Local(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Renews `leases` with one call (per [`MAX_RENEWALS`]).
    async fn renew(&self, leases: &[Lease]) -> Result<(), LimiterError> {
        match self {
            Grantor::Remote(remote) => remote.renew(leases).await,
            Grantor::Local(local) => {
                local.renew(leases);
                Ok(())
            }
        }
    }
}

/// One request's leases on the book.
struct Held {
    grantor: Grantor,
    leases: Vec<Lease>,
    /// When they were granted or last sent for renewal.
    renewed: Instant,
}

impl Held {
    /// The shortest `lease` among them.
    fn shortest(&self) -> Duration {
        self.leases
            .iter()
            .map(|l| l.lease)
            .min()
            .unwrap_or(Duration::MAX)
    }
}

/// What the renewal task reads and the requests write.
#[derive(Default)]
struct Book {
    held: HashMap<u64, Held>,
    /// Whether a renewal task is running (it stops when the book is empty).
    renewing: bool,
}

/// Every concurrency lease this instance holds, renewed while held. Shared
/// by every configuration's decider (a reload keeps it), so that requests
/// admitted before a reload keep their slots.
#[derive(Default)]
pub struct LeaseBook {
    book: Mutex<Book>,
    next_id: AtomicU64,
    /// Leases held now (the gauge's value).
    count: AtomicU64,
    /// The task's current tick, µs (0: no task), so that a shorter `lease`
    /// wakes it.
    tick_us: AtomicU64,
    wake: tokio::sync::Notify,
}

impl std::fmt::Debug for LeaseBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBook")
            .field("held", &self.held())
            .finish()
    }
}

/// A request's leases on the book: dropping it takes them off (they are no
/// longer renewed).
pub struct LeaseHold {
    book: Arc<LeaseBook>,
    id: u64,
}

impl std::fmt::Debug for LeaseHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseHold").field("id", &self.id).finish()
    }
}

impl Drop for LeaseHold {
    fn drop(&mut self) {
        self.book.forget(self.id);
    }
}

impl LeaseBook {
    /// An empty book.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Leases held now.
    pub fn held(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Puts `leases`, granted by `grantor` just now, on the book; they are
    /// renewed until the returned hold is dropped. Starts the renewal task
    /// on the current Tokio runtime if none is running (without a runtime,
    /// nothing renews them: they end after `lease`).
    pub fn hold(self: &Arc<Self>, grantor: Grantor, leases: Vec<Lease>) -> Option<LeaseHold> {
        if leases.is_empty() {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let held = Held {
            grantor,
            renewed: Instant::now(),
            leases,
        };
        let tick = tick_for(held.shortest());
        self.count
            .fetch_add(held.leases.len() as u64, Ordering::Relaxed);
        let start = {
            let mut book = self.book.locked();
            book.held.insert(id, held);
            let start = !book.renewing && tokio::runtime::Handle::try_current().is_ok();
            book.renewing |= start;
            start
        };
        if start {
            tokio::spawn(Arc::clone(self).renew_while_held());
        } else if micros(tick) < self.tick_us.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
        Some(LeaseHold {
            book: Arc::clone(self),
            id,
        })
    }

    fn forget(&self, id: u64) {
        if let Some(held) = self.book.locked().held.remove(&id) {
            self.count
                .fetch_sub(held.leases.len() as u64, Ordering::Relaxed);
        }
    }

    /// The renewal task: one round of renewals per tick while the book
    /// holds leases; it ends when the book is empty.
    async fn renew_while_held(self: Arc<Self>) {
        loop {
            let tick = {
                let mut book = self.book.locked();
                let shortest = book.held.values().map(Held::shortest).min();
                let Some(shortest) = shortest else {
                    book.renewing = false;
                    self.tick_us.store(0, Ordering::Relaxed);
                    return;
                };
                tick_for(shortest)
            };
            self.tick_us.store(micros(tick), Ordering::Relaxed);
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                // A lease shorter than the tick was taken: tick again sooner.
                () = self.wake.notified() => continue,
            }
            for (grantor, leases) in self.due(tick, Instant::now()) {
                for chunk in leases.chunks(MAX_RENEWALS) {
                    if let Err(e) = grantor.renew(chunk).await {
                        log::debug!("{} concurrency leases not renewed: {e}", chunk.len());
                    }
                }
            }
        }
    }

    /// The leases due for renewal at `now` on a tick of `tick`, grouped by
    /// the backend that granted them: those renewed a third of their
    /// `lease` ago, or that would be by the middle of the next tick. So a
    /// lease is renewed at most half its `lease` after its last renewal.
    fn due(&self, tick: Duration, now: Instant) -> Vec<(Grantor, Vec<Lease>)> {
        let mut groups: Vec<(Grantor, Vec<Lease>)> = Vec::new();
        let mut book = self.book.locked();
        for held in book.held.values_mut() {
            let after = (held.shortest() / 3).saturating_sub(tick / 2);
            if now.saturating_duration_since(held.renewed) < after {
                continue;
            }
            held.renewed = now;
            match groups.iter_mut().find(|(g, _)| g.is(&held.grantor)) {
                Some((_, leases)) => leases.extend(held.leases.iter().cloned()),
                None => groups.push((held.grantor.clone(), held.leases.clone())),
            }
        }
        groups
    }
}

/// The renewal tick for leases of `lease`: a third of it, so that a lease
/// survives a missed renewal.
fn tick_for(lease: Duration) -> Duration {
    (lease / 3).max(MIN_TICK)
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(key: &str, member: &str, lease_ms: u64) -> Lease {
        Lease {
            key: key.into(),
            member: member.into(),
            lease: Duration::from_millis(lease_ms),
            cost: 1,
        }
    }

    #[test]
    fn a_hold_counts_its_leases_until_it_is_dropped() {
        let book = LeaseBook::new();
        let local = Grantor::Local(Arc::new(LocalLimiter::new(100)));
        let a = book.hold(local.clone(), vec![lease("k", "m1", 3000)]);
        let b = book.hold(
            local.clone(),
            vec![lease("k", "m2", 3000), lease("j", "m2", 3000)],
        );
        assert!(book.hold(local, Vec::new()).is_none());
        assert_eq!(book.held(), 3);
        drop(a);
        assert_eq!(book.held(), 2);
        drop(b);
        assert_eq!(book.held(), 0);
    }

    #[test]
    fn leases_are_due_by_a_third_of_their_lease_and_grouped_by_grantor() {
        let book = LeaseBook::new();
        let one = Grantor::Local(Arc::new(LocalLimiter::new(100)));
        let two = Grantor::Local(Arc::new(LocalLimiter::new(100)));
        let _a = book.hold(one.clone(), vec![lease("k", "a", 3000)]);
        let _b = book.hold(two, vec![lease("k", "b", 3000)]);
        let _c = book.hold(one, vec![lease("k", "c", 30_000)]);
        let tick = tick_for(Duration::from_millis(3000));
        let start = Instant::now();
        // Just granted: nothing is due.
        assert!(book.due(tick, start).is_empty());
        // A tick later the 3 s leases are (one group per grantor); the 30 s
        // one is not.
        let due = book.due(tick, start + tick);
        let members: Vec<Vec<&str>> = due
            .iter()
            .map(|(_, leases)| leases.iter().map(|l| l.member.as_str()).collect())
            .collect();
        assert_eq!(due.len(), 2, "{members:?}");
        assert!(members.contains(&vec!["a"]) && members.contains(&vec!["b"]));
        // Renewed: not due again until a tick after that.
        assert!(book.due(tick, start + tick).is_empty());
        assert_eq!(book.due(tick, start + tick * 2).len(), 2);
    }
}
