//! Locking without poisoning. Every lock in sluice guards state that a panic
//! cannot leave harmfully half-written (counters, queues, caches, the reload
//! slot): the worst a panicking holder leaves is one unit miscounted. So a
//! poisoned lock is used as it is rather than spreading the panic to every
//! request that touches it afterwards.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `lock()` that ignores poisoning (see the module documentation).
pub trait Locked<T: ?Sized> {
    /// Locks, taking the value as it is if a holder panicked.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `read()` / `write()` that ignore poisoning.
pub trait ReadWriteLocked<T: ?Sized> {
    /// Shared access, taking the value as it is if a writer panicked.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Exclusive access, taking the value as it is if a writer panicked.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWriteLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_serves() {
        let shared = std::sync::Arc::new(Mutex::new(1));
        let holder = std::sync::Arc::clone(&shared);
        let _ = std::thread::spawn(move || {
            let _guard = holder.locked();
            panic!("holder panics");
        })
        .join();
        assert!(shared.is_poisoned());
        *shared.locked() += 1;
        assert_eq!(*shared.locked(), 2);
    }
}
