//! The bound on requests waiting for their turn (`on_limit: delay`), per
//! key and in total, on this instance. A request takes a permit before its
//! decision may delay it; without one it is decided as if its limit did not
//! delay (denied when it does not fit now), so a flood of one key cannot
//! park more than its share of connections and tasks here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Requests that may be waiting now, by key and in total.
#[derive(Debug)]
pub struct Waiters {
    total: AtomicUsize,
    max_total: AtomicUsize,
    by_key: Mutex<HashMap<String, usize>>,
}

/// One request's place among the waiters; given back when dropped.
#[derive(Debug)]
pub struct WaitPermit {
    waiters: Arc<Waiters>,
    key: String,
}

impl Waiters {
    /// At most `max_total` permits at once.
    pub fn new(max_total: usize) -> Arc<Self> {
        Arc::new(Self {
            total: AtomicUsize::new(0),
            max_total: AtomicUsize::new(max_total),
            by_key: Mutex::new(HashMap::new()),
        })
    }

    /// Changes the total bound (a reload); permits held stay valid.
    pub fn set_max_total(&self, max_total: usize) {
        self.max_total.store(max_total, Ordering::Relaxed);
    }

    /// Permits held now.
    pub fn held(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// A permit for `key`, unless `max_per_key` are held for it or the
    /// total bound is reached.
    pub fn try_enter(self: &Arc<Self>, key: &str, max_per_key: usize) -> Option<WaitPermit> {
        let max_total = self.max_total.load(Ordering::Relaxed);
        self.total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_total).then_some(n + 1)
            })
            .ok()?;
        let entered = match self.by_key.lock() {
            Ok(mut by_key) => match by_key.get_mut(key) {
                Some(held) if *held < max_per_key => {
                    *held += 1;
                    true
                }
                Some(_) => false,
                None if max_per_key > 0 => {
                    by_key.insert(key.to_string(), 1);
                    true
                }
                None => false,
            },
            Err(_) => false,
        };
        if !entered {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(WaitPermit {
            waiters: Arc::clone(self),
            key: key.to_string(),
        })
    }
}

impl Drop for WaitPermit {
    fn drop(&mut self) {
        if let Ok(mut by_key) = self.waiters.by_key.lock() {
            if let Some(held) = by_key.get_mut(&self.key) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    by_key.remove(&self.key);
                }
            }
        }
        self.waiters.total.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_bounded_per_key_and_in_total_and_come_back() {
        let waiters = Waiters::new(3);
        let a1 = waiters.try_enter("a", 2).expect("first a");
        let _a2 = waiters.try_enter("a", 2).expect("second a");
        assert!(waiters.try_enter("a", 2).is_none(), "a third of one key");
        let _b = waiters.try_enter("b", 2).expect("b");
        assert!(waiters.try_enter("c", 2).is_none(), "a fourth in all");
        drop(a1);
        assert_eq!(waiters.held(), 2);
        assert!(waiters.try_enter("c", 2).is_some(), "a place came back");
        assert_eq!(waiters.held(), 2, "the temporary permit is gone");
    }
}
