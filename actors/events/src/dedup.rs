//! The event uuids a shard has seen recently, so a retried event is stored once.

use ahash::HashSet;

use uuid::Uuid;

/// Remembers at least the last `window / 2` and at most the last `window` uuids, in two
/// generations of `window / 2`. When the current generation is full it becomes the previous
/// one and the old previous one is dropped whole.
///
/// Each generation is allocated at its full size up front. A single set grown on demand
/// rehashed everything it held at each doubling (about 20 ms at half a million uuids) on
/// the shard thread, and every acknowledgement waiting on the shard waited for it.
pub struct RecentUuids {
    current: HashSet<Uuid>,
    previous: HashSet<Uuid>,
    generation: usize,
}

impl RecentUuids {
    pub fn new(window: usize) -> RecentUuids {
        let generation = (window / 2).max(1);
        RecentUuids {
            current: HashSet::with_capacity_and_hasher(generation, Default::default()),
            previous: HashSet::default(),
            generation,
        }
    }

    /// Records `uuid`; false when it was already remembered.
    pub fn insert(&mut self, uuid: Uuid) -> bool {
        if self.current.contains(&uuid) || self.previous.contains(&uuid) {
            return false;
        }
        if self.current.len() >= self.generation {
            let fresh = HashSet::with_capacity_and_hasher(self.generation, Default::default());
            self.previous = std::mem::replace(&mut self.current, fresh);
        }
        self.current.insert(uuid);
        true
    }

    /// Forgets `uuid`: an event that was not stored after all, whose retry must be.
    pub fn forget(&mut self, uuid: &Uuid) {
        self.current.remove(uuid);
        self.previous.remove(uuid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_at_least_half_the_window_and_forgets_beyond_it() {
        let mut recent = RecentUuids::new(10);
        let ids: Vec<Uuid> = (0..30).map(|_| Uuid::now_v7()).collect();
        for id in &ids[..12] {
            assert!(recent.insert(*id), "a new uuid is not a duplicate");
        }
        // The last five (half the window) are always remembered.
        for id in &ids[7..12] {
            assert!(!recent.insert(*id), "a recent uuid must be caught");
        }
        for id in &ids[12..30] {
            assert!(recent.insert(*id));
        }
        // Far older than the window: forgotten, so memory stays bounded.
        assert!(recent.insert(ids[0]));
        assert!(recent.current.len() + recent.previous.len() <= 10);
    }
}
