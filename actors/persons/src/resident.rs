//! Persons kept in memory within a byte budget, so `/flags` and ingest read a known person
//! without a storage read and without handing the request to a blocking thread.
//!
//! Each distinct id maps to a compact copy of its person ([`codec`]: property keys interned,
//! values tagged) in one of [`SHARDS`] arenas, found by a 128-bit keyed hash of (project,
//! distinct id). When a shard's records pass its share of the budget, records overwritten
//! since are dropped (the shard is compacted); when live records alone fill most of it, a
//! quarter of its persons leave memory but keep a marker ([`Lookup::OnDisk`]), so an id
//! memory knows nothing about is still known to have no person. Only when the markers
//! themselves do not fit are they dropped, and then memory stops answering "no person".
//!
//! Whether memory is *complete* (every stored person has an entry or a marker) is up to the
//! owner: [`ResidentPersons::set_complete`] after loading every record, while every write
//! goes through it. Until then an id without an entry is [`Lookup::Unknown`].

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::model::Person;

mod codec;

/// Shards of the map (each with its own lock and its share of the budget): enough that a
/// compaction copies little while it holds its lock.
pub const SHARDS: usize = 256;

/// What an index entry costs beside its record: the 16-byte key, the 8-byte slot and the
/// table's control byte at its usual fill.
const INDEX_ENTRY_BYTES: usize = 33;

/// The smallest budget a shard gets, so a tiny budget still holds a few persons.
const MIN_SHARD_BYTES: usize = 16 * 1024;

/// What memory knows about a distinct id.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// Its person.
    Person(Person),
    /// It has no person (memory is complete and holds nothing for it).
    Absent,
    /// It has a person, kept on disk only.
    OnDisk,
    /// Memory does not know: read storage.
    Unknown,
}

/// Where a record lies in its shard's arena; `at == ON_DISK`: a marker.
#[derive(Debug, Clone, Copy)]
struct Slot {
    at: u32,
    len: u32,
}

const ON_DISK: u32 = u32::MAX;

/// The map's own hasher: the keys are already keyed hashes, so their low half is used as is.
#[derive(Clone, Copy, Default)]
struct KeyHash;

struct LowHalf(u64);

impl Hasher for LowHalf {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, key: u128) {
        self.0 = key as u64;
    }
}

impl BuildHasher for KeyHash {
    type Hasher = LowHalf;
    fn build_hasher(&self) -> LowHalf {
        LowHalf(0)
    }
}

#[derive(Default)]
struct Shard {
    index: HashMap<u128, Slot, KeyHash>,
    arena: Vec<u8>,
    /// Bytes of the arena no slot points at (records overwritten or removed).
    garbage: usize,
    /// Which quarter of the keys the next eviction drops (turns, so evictions spread).
    next_quarter: u8,
    /// Entries that are markers.
    markers: usize,
}

impl Shard {
    fn cost(&self) -> usize {
        self.arena.len() + self.index.capacity() * INDEX_ENTRY_BYTES
    }

    fn forget_slot(&mut self, slot: Slot) {
        if slot.at == ON_DISK {
            self.markers -= 1;
        } else {
            self.garbage += slot.len as usize;
        }
    }

    /// Copies the live records into a fresh arena.
    fn compact(&mut self) {
        let mut arena = Vec::with_capacity(self.arena.len() - self.garbage);
        for slot in self.index.values_mut() {
            if slot.at != ON_DISK {
                let (from, len) = (slot.at as usize, slot.len as usize);
                slot.at = arena.len() as u32;
                arena.extend_from_slice(&self.arena[from..from + len]);
            }
        }
        self.arena = arena;
        self.garbage = 0;
    }

    /// Brings the shard within `budget`: compacts, moves a quarter of the records to disk
    /// when that is not enough, and drops markers when even they do not fit (returns false
    /// then: memory no longer knows every id).
    fn fit(&mut self, budget: usize) -> bool {
        if self.cost() <= budget {
            return true;
        }
        let index_cost = self.index.capacity() * INDEX_ENTRY_BYTES;
        let mut live = self.arena.len() - self.garbage;
        for _ in 0..4 {
            if index_cost + live <= budget * 3 / 4 {
                break;
            }
            let quarter = u128::from(self.next_quarter);
            self.next_quarter = (self.next_quarter + 1) % 4;
            for (key, slot) in self.index.iter_mut() {
                if slot.at != ON_DISK && (key >> 126) == quarter {
                    self.garbage += slot.len as usize;
                    live -= slot.len as usize;
                    self.markers += 1;
                    slot.at = ON_DISK;
                }
            }
        }
        self.compact();
        if self.cost() <= budget {
            return true;
        }
        let before = self.index.len();
        self.index.retain(|_, slot| slot.at != ON_DISK);
        self.index.shrink_to_fit();
        self.markers = 0;
        before == self.index.len()
    }
}

pub struct ResidentPersons {
    shards: Vec<Mutex<Shard>>,
    shard_budget: usize,
    keys: (RandomState, RandomState),
    names: codec::Names,
    /// Every stored person has an entry or a marker (see the module doc).
    complete: AtomicBool,
    /// Set when a marker was dropped: memory can never be complete again.
    markers_dropped: AtomicBool,
}

impl ResidentPersons {
    /// Memory for persons of about `budget` bytes.
    pub fn new(budget: usize) -> ResidentPersons {
        ResidentPersons {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_budget: (budget / SHARDS).max(MIN_SHARD_BYTES),
            keys: (RandomState::new(), RandomState::new()),
            names: codec::Names::default(),
            complete: AtomicBool::new(false),
            markers_dropped: AtomicBool::new(false),
        }
    }

    fn key(&self, project_id: u64, distinct_id: &str) -> u128 {
        let half = |state: &RandomState| {
            let mut h = state.build_hasher();
            h.write_u64(project_id);
            h.write(distinct_id.as_bytes());
            h.finish()
        };
        (u128::from(half(&self.keys.0)) << 64) | u128::from(half(&self.keys.1))
    }

    fn shard(&self, key: u128) -> MutexGuard<'_, Shard> {
        // The high half picks the shard; the low half places the key in the shard's table.
        self.shards[((key >> 64) as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, project_id: u64, distinct_id: &str) -> Lookup {
        let key = self.key(project_id, distinct_id);
        let shard = self.shard(key);
        match shard.index.get(&key) {
            Some(slot) if slot.at == ON_DISK => Lookup::OnDisk,
            Some(slot) => {
                let record = &shard.arena[slot.at as usize..(slot.at + slot.len) as usize];
                match codec::decode(record, &self.names) {
                    Some((_, person)) => Lookup::Person(person),
                    None => Lookup::Unknown,
                }
            }
            None if self.complete.load(Ordering::Acquire) => Lookup::Absent,
            None => Lookup::Unknown,
        }
    }

    /// Keeps `person` for each of its distinct ids (replacing what they had).
    pub fn put(&self, project_id: u64, person: &Person) {
        let record = codec::encode(project_id, person, &self.names);
        for did in &person.distinct_ids {
            self.place(self.key(project_id, did), record.as_deref(), true);
        }
    }

    /// Keeps `person` for its distinct ids that have no entry yet (a read of storage that a
    /// write may have overtaken). Caller holds the persons' writer lock.
    pub fn fill(&self, project_id: u64, person: &Person) {
        let record = codec::encode(project_id, person, &self.names);
        for did in &person.distinct_ids {
            self.place(self.key(project_id, did), record.as_deref(), false);
        }
    }

    /// Stores `record` (`None`: a marker, for a person that cannot be kept) under `key`.
    fn place(&self, key: u128, record: Option<&[u8]>, replace: bool) {
        let mut shard = self.shard(key);
        if !replace && shard.index.get(&key).is_some_and(|s| s.at != ON_DISK) {
            return;
        }
        let slot = match record {
            Some(bytes) if bytes.len() <= self.shard_budget / 4 => {
                let slot = Slot {
                    at: shard.arena.len() as u32,
                    len: bytes.len() as u32,
                };
                shard.arena.extend_from_slice(bytes);
                slot
            }
            _ => {
                shard.markers += 1;
                Slot {
                    at: ON_DISK,
                    len: 0,
                }
            }
        };
        if let Some(old) = shard.index.insert(key, slot) {
            shard.forget_slot(old);
        }
        if !shard.fit(self.shard_budget) {
            self.drop_markers();
        }
    }

    /// Forgets a distinct id (its person was deleted or now lives elsewhere).
    pub fn remove(&self, project_id: u64, distinct_id: &str) {
        let key = self.key(project_id, distinct_id);
        let mut shard = self.shard(key);
        if let Some(old) = shard.index.remove(&key) {
            shard.forget_slot(old);
        }
    }

    /// Forgets a distinct id whose person may still exist (another node wrote it): memory
    /// stops answering for it, and so can no longer be complete.
    pub fn invalidate(&self, project_id: u64, distinct_id: &str) {
        self.remove(project_id, distinct_id);
        self.drop_markers();
    }

    /// Forgets every person of a project.
    pub fn remove_project(&self, project_id: u64) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let Shard { index, arena, .. } = &mut *shard;
            let mut freed = 0;
            index.retain(|_, slot| {
                let keep = slot.at == ON_DISK
                    || codec::project_of(&arena[slot.at as usize..]) != Some(project_id);
                if !keep {
                    freed += slot.len as usize;
                }
                keep
            });
            shard.garbage += freed;
        }
        self.drop_markers();
    }

    /// Forgets everything.
    pub fn clear(&self) {
        for shard in &self.shards {
            *shard.lock().unwrap_or_else(|p| p.into_inner()) = Shard::default();
        }
        self.drop_markers();
    }

    /// Declares memory complete: every stored person has been put or filled, and every
    /// write from now on goes through [`ResidentPersons::put`] and
    /// [`ResidentPersons::remove`]. Ignored once a marker was dropped.
    pub fn set_complete(&self) {
        if !self.markers_dropped.load(Ordering::Acquire) {
            self.complete.store(true, Ordering::Release);
        }
    }

    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    fn drop_markers(&self) {
        self.markers_dropped.store(true, Ordering::Release);
        self.complete.store(false, Ordering::Release);
    }

    /// Bytes held now (records, including overwritten ones not yet compacted, and index).
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).cost())
            .sum()
    }

    /// `(persons in memory, markers)` over every distinct id.
    pub fn counts(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(held, markers), s| {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            (held + s.index.len() - s.markers, markers + s.markers)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;
    use uuid::Uuid;

    fn person(id: &str, props: serde_json::Value) -> Person {
        Person {
            id: Uuid::new_v4(),
            created_at: chrono::Utc
                .timestamp_opt(1_700_000_000, 123_456_789)
                .single()
                .expect("test value"),
            properties: props.as_object().cloned().unwrap_or_default(),
            is_identified: true,
            version: 7,
            distinct_ids: vec![id.to_string(), format!("{id}-anon")],
        }
    }

    #[test]
    fn a_person_put_is_read_back_whole_under_each_of_its_ids() {
        let memory = ResidentPersons::new(1 << 20);
        let p = person(
            "u1",
            json!({"email": "a@b.c", "age": 31, "neg": -4, "ratio": 0.5, "big": u64::MAX,
                   "ok": true, "none": null, "tags": ["x", 1], "nested": {"k": "v"}}),
        );
        memory.put(1, &p);
        assert_eq!(memory.get(1, "u1"), Lookup::Person(p.clone()));
        assert_eq!(memory.get(1, "u1-anon"), Lookup::Person(p));
        assert_eq!(memory.get(2, "u1"), Lookup::Unknown, "another project's id");
    }

    #[test]
    fn a_complete_memory_answers_no_person_for_ids_it_does_not_hold() {
        let memory = ResidentPersons::new(1 << 20);
        memory.put(1, &person("u1", json!({})));
        assert_eq!(memory.get(1, "stranger"), Lookup::Unknown);
        memory.set_complete();
        assert_eq!(memory.get(1, "stranger"), Lookup::Absent);
        memory.remove(1, "u1");
        assert_eq!(memory.get(1, "u1"), Lookup::Absent);
        memory.invalidate(1, "u1-anon");
        assert_eq!(memory.get(1, "stranger"), Lookup::Unknown);
        memory.set_complete();
        assert_eq!(
            memory.get(1, "stranger"),
            Lookup::Unknown,
            "never complete again"
        );
    }

    #[test]
    fn a_write_replaces_and_a_fill_does_not() {
        let memory = ResidentPersons::new(1 << 20);
        let old = person("u1", json!({"plan": "free"}));
        let mut new = old.clone();
        new.properties.insert("plan".into(), json!("pro"));
        memory.put(1, &new);
        memory.fill(1, &old);
        assert_eq!(memory.get(1, "u1"), Lookup::Person(new.clone()));
        let mut newer = new.clone();
        newer.version += 1;
        memory.put(1, &newer);
        assert_eq!(memory.get(1, "u1"), Lookup::Person(newer));
    }

    #[test]
    fn past_the_budget_persons_move_to_disk_but_stay_known() {
        let budget = SHARDS * MIN_SHARD_BYTES;
        let memory = ResidentPersons::new(budget);
        memory.set_complete();
        let n = 40_000;
        for k in 0..n {
            let mut p = person(
                &format!("user-{k}"),
                json!({"email": format!("user-{k}@example.com")}),
            );
            p.distinct_ids.truncate(1);
            memory.put(1, &p);
        }
        let (held, markers) = memory.counts();
        assert_eq!(held + markers, n, "every id has an entry or a marker");
        assert!(markers > 0 && held > 0, "held {held}, markers {markers}");
        assert!(memory.bytes() <= budget, "{} > {budget}", memory.bytes());
        assert!(memory.is_complete());
        assert_eq!(memory.get(1, "stranger"), Lookup::Absent);
        let on_disk = (0..n)
            .filter(|k| memory.get(1, &format!("user-{k}")) == Lookup::OnDisk)
            .count();
        assert_eq!(on_disk, markers);
    }

    #[test]
    fn when_even_markers_do_not_fit_memory_stops_answering_no_person() {
        let budget = SHARDS * MIN_SHARD_BYTES;
        let memory = ResidentPersons::new(budget);
        memory.set_complete();
        for k in 0..200_000 {
            let mut p = person(&format!("user-{k}"), json!({}));
            p.distinct_ids.truncate(1);
            memory.put(1, &p);
        }
        assert!(memory.bytes() <= budget, "{} > {budget}", memory.bytes());
        assert!(!memory.is_complete());
        assert_eq!(memory.get(1, "stranger"), Lookup::Unknown);
    }

    #[test]
    fn a_project_is_forgotten_alone() {
        let memory = ResidentPersons::new(1 << 20);
        let (a, b) = (person("a", json!({"x": 1})), person("b", json!({"x": 2})));
        memory.put(1, &a);
        memory.put(2, &b);
        memory.remove_project(1);
        assert_eq!(memory.get(1, "a"), Lookup::Unknown);
        assert_eq!(memory.get(2, "b"), Lookup::Person(b));
    }
}
