//! The keys a limit denied most in the last minute, in fixed memory.
//!
//! Each limit keeps [`SLICES`] Space-Saving sketches (Metwally, Agrawal and
//! El Abbadi, 2005) of [`CAPACITY`] counters each, one per [`SLICE`] of time,
//! reused in turn. A sketch counts every denial; a key it does not hold
//! takes the place of the key with the smallest count, inheriting that
//! count as its possible error. So a sketch never holds more than
//! [`CAPACITY`] keys whatever the number of keys denied, every key denied
//! more than N / [`CAPACITY`] times in a slice (N: the slice's denials) is
//! in it, and each count it reports is at most N / [`CAPACITY`] over the
//! true one.
//!
//! [`DeniedKeys::top`] merges the slices of the last minute: a key's count
//! is the sum of its counts, and its `error` the sum of their errors plus,
//! for each slice that does not hold it, that slice's smallest count (all
//! it can have had there). The true count lies within `error` of `count`,
//! and `error` ≤ N / [`CAPACITY`] with N the limit's denials in the window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Counters per sketch: the error bound's denominator.
pub const CAPACITY: usize = 100;
/// How long one sketch counts.
pub const SLICE: Duration = Duration::from_secs(10);
/// Sketches kept: the current one and the five before it, so a report
/// covers the last 50 to 60 seconds.
pub const SLICES: usize = 6;

/// One Space-Saving sketch. Its counters lie in parallel vectors, so that
/// finding the smallest (on each new key once full) scans 100 contiguous
/// numbers; keys are found by a keyed 64-bit hash (a collision, which
/// clients cannot aim for, only makes a key take a new counter), and a
/// replaced key's string is overwritten in place, not reallocated.
#[derive(Debug, Default)]
struct Sketch {
    hasher: std::collections::hash_map::RandomState,
    /// Key hash → its counter.
    index: HashMap<u64, usize>,
    keys: Vec<String>,
    /// How each key's parts are shown (taken when the key takes a counter).
    shown: Vec<Shown>,
    hashes: Vec<u64>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    /// Denials counted (N).
    total: u64,
}

/// One part of a denied key as an operator sees it: the value the request
/// carried (`exact` when it is that value whole, so the usage API can be
/// asked about it), or what stands for it — a credential's hash prefix, a
/// long value's beginning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownPart {
    /// The text shown.
    pub text: String,
    /// Whether `text` is the value the request carried, whole.
    pub exact: bool,
}

/// A key's parts as shown, in the limit's order (empty: not known).
pub type Shown = Arc<[ShownPart]>;

impl Sketch {
    fn add(&mut self, key: &str, shown: impl FnOnce() -> Shown) {
        use std::hash::BuildHasher;
        self.total += 1;
        let hash = self.hasher.hash_one(key);
        if let Some(&i) = self.index.get(&hash) {
            if self.keys[i] == key {
                self.counts[i] += 1;
                return;
            }
        }
        if self.counts.len() < CAPACITY {
            self.index.insert(hash, self.counts.len());
            self.keys.push(key.to_string());
            self.shown.push(shown());
            self.hashes.push(hash);
            self.counts.push(1);
            self.errors.push(0);
            return;
        }
        // Full: the key with the smallest count gives its place.
        let Some((i, &min)) = self.counts.iter().enumerate().min_by_key(|(_, c)| **c) else {
            return;
        };
        self.index.remove(&self.hashes[i]);
        self.index.insert(hash, i);
        self.keys[i].clear();
        self.keys[i].push_str(key);
        self.shown[i] = shown();
        self.hashes[i] = hash;
        self.counts[i] = min + 1;
        self.errors[i] = min;
    }

    /// Each key held, with how it is shown, its count and error.
    fn entries(&self) -> impl Iterator<Item = (&str, &Shown, u64, u64)> {
        let counts = self.counts.iter().zip(&self.errors);
        self.keys
            .iter()
            .zip(&self.shown)
            .zip(counts)
            .map(|((k, shown), (c, e))| (k.as_str(), shown, *c, *e))
    }

    fn holds(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key)
    }

    /// What a key it does not hold can have had: 0 until it is full.
    fn floor(&self) -> u64 {
        if self.counts.len() < CAPACITY {
            return 0;
        }
        self.counts.iter().copied().min().unwrap_or(0)
    }

    fn clear(&mut self) {
        self.index.clear();
        self.keys.clear();
        self.shown.clear();
        self.hashes.clear();
        self.counts.clear();
        self.errors.clear();
        self.total = 0;
    }
}

/// The sketches of one limit, by slice.
#[derive(Debug, Default)]
struct Ring {
    /// (slice number, its sketch); the slot of slice s is s % SLICES.
    slots: [(u64, Sketch); SLICES],
}

/// One key of a report: its estimated denials, and how far off that can be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopKey {
    /// The key's parts as its counter key writes them (`|`-separated;
    /// long or unsafe values as `#` + their hash).
    pub key: String,
    /// Its parts as shown (empty when not known).
    pub shown: Shown,
    /// Denials counted for it in the window.
    pub count: u64,
    /// The true count lies within this of `count`.
    pub error: u64,
}

/// The keys one limit denied, by time slice (see the module's doc).
#[derive(Debug, Default)]
pub struct DeniedKeys {
    ring: Mutex<Ring>,
}

/// The key parts of counter key `key` of the limit counted as
/// `(route, limit)` (see `keys::build_key`): what follows
/// `{route:limit:` up to the closing `}`; the whole key if it is not so built.
pub fn parts_of<'k>(key: &'k str, (route, limit): (&str, &str)) -> &'k str {
    let parts = key.find('{').and_then(|open| {
        let rest = key
            .get(open + 1..)?
            .strip_prefix(route)?
            .strip_prefix(':')?;
        rest.strip_prefix(limit)?
            .strip_prefix(':')?
            .strip_suffix('}')
    });
    parts.unwrap_or(key)
}

/// The instant slices are numbered from.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn slice_at(now: Instant) -> u64 {
    let elapsed = now.saturating_duration_since(origin());
    (elapsed.as_millis() / SLICE.as_millis()) as u64 + SLICES as u64
}

impl DeniedKeys {
    /// Counts one denial of `key` at `now` (its parts shown as not known).
    pub fn record(&self, key: &str, now: Instant) {
        self.record_with(key, now, || Arc::from([]));
    }

    /// Counts one denial of `key` at `now`; `shown` says how its parts are
    /// shown, asked only when the key takes a counter (a flooding key,
    /// once held, costs nothing more).
    pub fn record_with(&self, key: &str, now: Instant, shown: impl FnOnce() -> Shown) {
        let slice = slice_at(now);
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let (number, sketch) = &mut ring.slots[slice as usize % SLICES];
        if *number != slice {
            *number = slice;
            sketch.clear();
        }
        sketch.add(key, shown);
    }

    /// The `n` keys denied most in the window ending at `now`, most first,
    /// and the denials counted in it (N).
    pub fn top(&self, n: usize, now: Instant) -> (Vec<TopKey>, u64) {
        let slice = slice_at(now);
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let live: Vec<&Sketch> = ring
            .slots
            .iter()
            .filter(|(number, _)| *number + (SLICES as u64) > slice && *number <= slice)
            .map(|(_, sketch)| sketch)
            .collect();
        let mut merged: HashMap<&str, TopKey> = HashMap::new();
        for sketch in &live {
            for (key, shown, count, error) in sketch.entries() {
                let entry = merged.entry(key).or_insert_with(|| TopKey {
                    key: key.to_string(),
                    shown: Arc::clone(shown),
                    count: 0,
                    error: 0,
                });
                if entry.shown.is_empty() {
                    entry.shown = Arc::clone(shown);
                }
                entry.count += count;
                entry.error += error;
            }
        }
        for sketch in &live {
            let floor = sketch.floor();
            for (key, entry) in merged.iter_mut() {
                if !sketch.holds(key) {
                    entry.error += floor;
                }
            }
        }
        let total = live.iter().map(|s| s.total).sum();
        let mut keys: Vec<TopKey> = merged.into_values().collect();
        keys.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(n);
        (keys, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_cut_from_counter_keys() {
        assert_eq!(parts_of("p:{api:per-ip:::1}", ("api", "per-ip")), "::1");
        assert_eq!(parts_of("{*:shared:a|#00ff}", ("*", "shared")), "a|#00ff");
        assert_eq!(parts_of("other", ("api", "x")), "other");
    }

    #[test]
    fn memory_is_bounded_whatever_the_number_of_keys() {
        let keys = DeniedKeys::default();
        let now = Instant::now();
        for i in 0..200_000 {
            keys.record(&format!("k{i}"), now);
        }
        let ring = keys.ring.lock().unwrap();
        let held: usize = ring.slots.iter().map(|(_, s)| s.keys.len()).sum();
        let indexed: usize = ring.slots.iter().map(|(_, s)| s.index.len()).sum();
        assert_eq!(held, indexed);
        assert!(held <= CAPACITY, "{held} keys held");
    }

    #[test]
    fn heavy_hitters_come_first_within_the_error_bound() {
        let keys = DeniedKeys::default();
        let now = Instant::now();
        // 10,000 keys denied once each, five denied 300 times each,
        // interleaved.
        let mut truth = HashMap::new();
        for i in 0..10_000u64 {
            keys.record(&format!("k{i}"), now);
            if i % 7 == 0 {
                for f in 0..5 {
                    let hitter = format!("flood{f}");
                    keys.record(&hitter, now);
                    *truth.entry(hitter).or_insert(0u64) += 1;
                }
            }
        }
        let (top, total) = keys.top(20, now);
        assert_eq!(total, 10_000 + truth.values().sum::<u64>());
        let bound = total / CAPACITY as u64;
        for (entry, rank) in top.iter().take(5).zip(0..) {
            let true_count = truth[&entry.key];
            assert!(entry.key.starts_with("flood"), "rank {rank}: {entry:?}");
            assert!(entry.error <= bound, "{entry:?} over N/m = {bound}");
            assert!(entry.count.abs_diff(true_count) <= entry.error, "{entry:?}");
        }
    }

    #[test]
    fn the_window_forgets_what_is_older_than_a_minute() {
        let keys = DeniedKeys::default();
        let start = origin() + Duration::from_secs(1000);
        keys.record("old", start);
        keys.record("new", start + Duration::from_secs(55));
        let (top, _) = keys.top(10, start + Duration::from_secs(55));
        assert_eq!(top.len(), 2, "{top:?}");
        let (top, total) = keys.top(10, start + Duration::from_secs(61));
        assert_eq!(
            top.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
            ["new"]
        );
        assert_eq!(total, 1);
        // A slot reused for a later slice starts empty.
        keys.record("later", start + Duration::from_secs(1060));
        let (top, _) = keys.top(10, start + Duration::from_secs(1060));
        assert_eq!(
            top.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
            ["later"]
        );
    }
}
