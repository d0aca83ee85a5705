//! A bounded concurrent map that starts over when full, for read caches whose entries are
//! cheap to load again. Starting over swaps in an empty map and frees the old entries on a
//! background thread: freeing a few hundred thousand entries takes tens of milliseconds, and
//! the writer that filled the map (an ingest shard holding the person writer lock) would
//! otherwise stall every request behind it.

use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

use dashmap::DashMap;

pub struct StartOverMap<K: Eq + Hash, V> {
    /// Read-locked by every use (entries have their own locks in the map); write-locked only
    /// to swap in an empty map.
    map: RwLock<DashMap<K, V>>,
    /// Inserts since the last start-over (overwrites included): an upper bound of the entries.
    inserts: AtomicUsize,
    capacity: usize,
}

impl<K, V> StartOverMap<K, V>
where
    K: Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A map that holds at most `capacity` entries.
    pub fn new(capacity: usize) -> StartOverMap<K, V> {
        StartOverMap {
            map: RwLock::new(DashMap::new()),
            inserts: AtomicUsize::new(0),
            capacity: capacity.max(1),
        }
    }

    fn map(&self) -> RwLockReadGuard<'_, DashMap<K, V>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.map().get(key).map(|v| v.clone())
    }

    pub fn insert(&self, key: K, value: V) {
        if self.inserts.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.start_over();
            self.inserts.store(1, Ordering::Relaxed);
        }
        self.map().insert(key, value);
    }

    pub fn remove(&self, key: &K) {
        self.map().remove(key);
    }

    pub fn retain(&self, keep: impl FnMut(&K, &mut V) -> bool) {
        self.map().retain(keep);
    }

    /// Empties the map at once; the entries are freed in the background.
    pub fn start_over(&self) {
        let old = std::mem::take(&mut *self.map.write().unwrap_or_else(|p| p.into_inner()));
        self.inserts.store(0, Ordering::Relaxed);
        drop_in_background(old);
    }

    /// Entries now held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

/// Frees `value` on a short-lived thread (inline when no thread can be started: the refused
/// closure, and `value` with it, is dropped here).
pub fn drop_in_background<T: Send + 'static>(value: T) {
    let _ = std::thread::Builder::new()
        .name("corvid-free".into())
        .spawn(move || {
            crate::sched::join_batch();
            drop(value)
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_starts_over_when_full_and_keeps_what_came_after() {
        let map = StartOverMap::new(3);
        for i in 0..3 {
            map.insert(i, i * 10);
        }
        assert_eq!(map.get(&2), Some(20));
        map.insert(3, 30);
        assert_eq!(map.len(), 1, "the fourth insert started over");
        assert_eq!(map.get(&0), None);
        assert_eq!(map.get(&3), Some(30));
        map.remove(&3);
        assert_eq!(map.get(&3), None);
    }

    #[test]
    fn retain_and_start_over_empty_what_they_should() {
        let map = StartOverMap::new(100);
        for i in 0..10 {
            map.insert(i, i);
        }
        map.retain(|k, _| k % 2 == 0);
        assert_eq!(map.len(), 5);
        assert_eq!(map.get(&3), None);
        map.start_over();
        assert_eq!(map.len(), 0);
    }
}
