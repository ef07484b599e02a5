//! A map from counter key to per-key state, split into shards behind their
//! own locks so requests on different keys rarely contend, with a memory
//! bound per shard. The in-process limiter and the deny cache both keep
//! their entries here.

use crate::sync::Locked;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, MutexGuard};

/// The number of shards.
const SHARDS: usize = 16;

/// One shard: the entries whose key hashes to it.
pub type Shard<V> = HashMap<String, V>;

/// Keys → `V` in `SHARDS` locked shards of at most `shard_capacity`
/// entries each (the owner enforces the bound when it inserts, with
/// [`ShardedMap::shard_capacity`], since only it knows what may be dropped).
pub struct ShardedMap<V> {
    shards: Vec<Mutex<Shard<V>>>,
    shard_capacity: usize,
}

impl<V> ShardedMap<V> {
    /// A map meant to hold at most about `max_keys` entries.
    pub fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            shard_capacity: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// The most entries one shard should hold.
    pub fn shard_capacity(&self) -> usize {
        self.shard_capacity
    }

    /// The shard holding `key`, locked.
    pub fn shard(&self, key: &str) -> MutexGuard<'_, Shard<V>> {
        self.shards[shard_index(key)].locked()
    }

    /// Locks the shards holding `keys`, in ascending order so that no two
    /// callers can deadlock; returns the guards and, per key, the index of
    /// its guard.
    pub fn lock_all<'k>(
        &self,
        keys: impl Iterator<Item = &'k str>,
    ) -> (Vec<MutexGuard<'_, Shard<V>>>, Vec<usize>) {
        let shard_of: Vec<usize> = keys.map(shard_index).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| self.shards[i].locked()).collect();
        let guard_of = shard_of
            .iter()
            .map(|s| order.binary_search(s).unwrap_or(0))
            .collect();
        (guards, guard_of)
    }

    /// The number of entries held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.locked().len()).sum()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn shard_index(key: &str) -> usize {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() as usize) % SHARDS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_lock_their_own_shard_once_in_order() {
        let map: ShardedMap<u32> = ShardedMap::new(160);
        assert_eq!(map.shard_capacity(), 10);
        map.shard("a").insert("a".into(), 1);
        map.shard("b").insert("b".into(), 2);
        assert_eq!(map.len(), 2);
        let keys = ["a", "b", "a"];
        let (guards, guard_of) = map.lock_all(keys.iter().copied());
        assert!(guards.len() <= 2);
        assert_eq!(guard_of[0], guard_of[2], "one key, one guard");
        for (key, &g) in keys.iter().zip(&guard_of) {
            assert!(guards[g].contains_key(*key));
        }
    }

    #[test]
    fn a_tiny_bound_still_allows_one_entry_per_shard() {
        let map: ShardedMap<()> = ShardedMap::new(0);
        assert_eq!(map.shard_capacity(), 1);
        assert!(map.is_empty());
    }
}
