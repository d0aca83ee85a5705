//! Persons kept in memory within a byte budget, so `/flags` and ingest read a known person
//! without a storage read and without handing the request to a blocking thread.
//!
//! Each distinct id maps to a compact copy of its person ([`codec`]: property keys interned,
//! values tagged) in one of [`SHARDS`] arenas. Two keyed 64-bit hashes of (project, distinct
//! id) find it: one is the index key, the low half of the other (the check) sits in the index
//! entry beside the record's offset and is compared on every read, so an id whose index key
//! another id also has is never given that id's person (it is read from disk instead, and
//! from then on both are). A record in the arena is its length (varint) and its bytes.
//!
//! When a shard's records pass its share of the budget, records overwritten since are dropped
//! (the shard is compacted); when live records alone fill most of it, an eighth of its persons
//! leave memory but keep a marker ([`Lookup::OnDisk`]), so an id memory knows nothing about is
//! still known to have no person. Only when the markers themselves do not fit are they
//! dropped, and then memory stops answering "no person".
//!
//! Whether memory is *complete* (every stored person has an entry or a marker) is up to the
//! owner: [`ResidentPersons::set_complete`] after loading every record, while every write
//! goes through it. Until then an id without an entry is [`Lookup::Unknown`].

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use ahash::RandomState;

use corvid_kernel::prehashed::PreHashed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::model::Person;

mod codec;

pub use codec::CompactPerson;

/// Shards of the map (each with its own lock and its share of the budget): enough that a
/// compaction copies little while it holds its lock.
pub const SHARDS: usize = 256;

/// What a bucket of the index costs: the 8-byte key, the 8-byte slot and the table's control
/// byte. A table holds 7 entries for every 8 buckets.
const INDEX_BUCKET_BYTES: usize = 17;

/// The least an arena grows by (it grows by a quarter of its records otherwise, never past
/// its shard's budget while a record still fits).
const MIN_ARENA_GROWTH: usize = 4096;

/// The smallest budget a shard gets, so a tiny budget still holds a few persons.
const MIN_SHARD_BYTES: usize = 16 * 1024;

/// The largest: a shard's arena stays well inside 32-bit offsets (its records may pass the
/// budget by one record before it is compacted).
const MAX_SHARD_BYTES: usize = 1 << 30;

/// What memory knows about a distinct id.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<P = Person> {
    /// Its person.
    Person(P),
    /// It has no person (memory is complete and holds nothing for it).
    Absent,
    /// It has a person, kept on disk only (or shares its index key: read storage).
    OnDisk,
    /// Memory does not know: read storage.
    Unknown,
}

/// An index entry: where a record (its length first) starts in the shard's arena; or a
/// marker (`at == ON_DISK`); or a key several ids share (`at == SHARED`), read from disk for
/// good. `check`: the low half of the id's check hash (records and markers).
#[derive(Debug, Clone, Copy)]
struct Slot {
    at: u32,
    check: u32,
}

const ON_DISK: u32 = u32::MAX;
const SHARED: u32 = u32::MAX - 1;

impl Slot {
    fn is_record(self) -> bool {
        self.at < SHARED
    }

    fn marker(check: u32) -> Slot {
        Slot { at: ON_DISK, check }
    }
}

/// Where an id lives: its index key and its check hash (the low half of a second hash).
#[derive(Clone, Copy)]
struct Key {
    index: u64,
    check: u32,
}

impl Key {
    /// The shard: bits the table itself uses neither for buckets (low) nor for its control
    /// bytes (high).
    fn shard(self) -> usize {
        ((self.index >> 32) as usize) % SHARDS
    }
}

#[derive(Default)]
struct Shard {
    /// Keyed by one of the id's keyed hashes, used as is ([`PreHashed`]).
    index: HashMap<u64, Slot, PreHashed>,
    arena: Vec<u8>,
    /// Bytes of the arena no slot points at (records overwritten or removed).
    garbage: usize,
    /// Which eighth of the keys the next eviction moves to disk (turns, so evictions spread).
    next_eighth: u8,
    /// Entries that are markers or shared keys.
    markers: usize,
}

impl Shard {
    /// The memory the shard holds: the arena as allocated (not only the bytes in use: a
    /// doubling `Vec` could hold nearly twice its records) and the index's buckets.
    fn cost(&self) -> usize {
        self.arena.capacity() + self.index_cost()
    }

    fn index_cost(&self) -> usize {
        (self.index.capacity() * 8).div_ceil(7) * INDEX_BUCKET_BYTES
    }

    /// The arena room `budget` leaves for records beside the index.
    fn arena_room(&self, budget: usize) -> usize {
        budget.saturating_sub(self.index_cost())
    }

    /// Makes room in the arena for `need` more bytes, growing it by a quarter (at least
    /// [`MIN_ARENA_GROWTH`]) but not past `budget` unless `need` itself does not fit, which
    /// [`Shard::fit`] then settles.
    fn reserve(&mut self, need: usize, budget: usize) {
        let len = self.arena.len();
        if self.arena.capacity() - len >= need {
            return;
        }
        let room = self.arena_room(budget).saturating_sub(len);
        let grow = (len / 4).max(MIN_ARENA_GROWTH).min(room).max(need);
        self.arena.reserve_exact(grow);
    }

    /// The record a slot points at, and the arena bytes it spans (its length prefix too).
    fn record(&self, slot: Slot) -> Option<(&[u8], usize)> {
        codec::unframe(self.arena.get(slot.at as usize..)?)
    }

    fn span(&self, slot: Slot) -> usize {
        span_in(&self.arena, slot)
    }

    /// Whether `slot` is the entry of the id whose check is `check`.
    fn owned_by(slot: Slot, check: u32) -> bool {
        slot.at != SHARED && slot.check == check
    }

    fn set(&mut self, key: u64, slot: Slot) {
        if !slot.is_record() {
            self.markers += 1;
        }
        // Replaced in place: an insert of a key the table has may still grow a full table.
        let old = match self.index.get_mut(&key) {
            Some(entry) => Some(std::mem::replace(entry, slot)),
            None => self.index.insert(key, slot),
        };
        if let Some(old) = old {
            if old.is_record() {
                self.garbage += self.span(old);
            } else {
                self.markers -= 1;
            }
        }
    }

    /// Copies the live records into a fresh arena, with room for a quarter more within
    /// `budget`.
    fn compact(&mut self, budget: usize) {
        let live = self.arena.len().saturating_sub(self.garbage);
        let room = self.arena_room(budget).saturating_sub(live);
        let mut arena = Vec::with_capacity(live + (live / 4).max(MIN_ARENA_GROWTH).min(room));
        let old = &self.arena;
        for slot in self.index.values_mut() {
            if slot.is_record() {
                let frame = frame_in(old, *slot);
                slot.at = arena.len() as u32;
                arena.extend_from_slice(frame);
            }
        }
        self.arena = arena;
        self.garbage = 0;
    }

    /// Brings the shard within `budget`: compacts, moves eighths of the records to disk
    /// when that is not enough (leaving a sixteenth of the budget for what comes next), and
    /// drops markers when even they do not fit (returns false then: memory no longer knows
    /// every id).
    fn fit(&mut self, budget: usize) -> bool {
        if self.cost() <= budget {
            return true;
        }
        let index_cost = self.index_cost();
        let mut live = self.arena.len().saturating_sub(self.garbage);
        for _ in 0..8 {
            if index_cost + live <= budget / 16 * 15 {
                break;
            }
            let eighth = u64::from(self.next_eighth);
            self.next_eighth = (self.next_eighth + 1) % 8;
            // In place: an insert, even of a key the table has, may grow a full table.
            let Shard {
                index,
                arena,
                garbage,
                markers,
                ..
            } = self;
            for (key, slot) in index.iter_mut() {
                if slot.is_record() && (*key >> 61) == eighth {
                    let span = span_in(arena, *slot);
                    live = live.saturating_sub(span);
                    *garbage += span;
                    *markers += 1;
                    *slot = Slot::marker(slot.check);
                }
            }
        }
        self.compact(budget);
        if self.cost() <= budget {
            return true;
        }
        let before = self.index.len();
        self.index.retain(|_, slot| slot.is_record());
        self.index.shrink_to_fit();
        self.markers = 0;
        before == self.index.len()
    }
}

/// The arena bytes a record's slot spans, its length prefix included (empty for a damaged
/// frame, never written so).
fn frame_in(arena: &[u8], slot: Slot) -> &[u8] {
    let at = slot.at as usize;
    arena
        .get(at..)
        .and_then(codec::unframe)
        .and_then(|(_, span)| arena.get(at..at + span))
        .unwrap_or_default()
}

fn span_in(arena: &[u8], slot: Slot) -> usize {
    frame_in(arena, slot).len()
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
            // Offsets into a shard's arena are 32-bit.
            shard_budget: (budget / SHARDS).clamp(MIN_SHARD_BYTES, MAX_SHARD_BYTES),
            keys: (RandomState::new(), RandomState::new()),
            names: codec::Names::default(),
            complete: AtomicBool::new(false),
            markers_dropped: AtomicBool::new(false),
        }
    }

    fn key(&self, project_id: u64, distinct_id: &str) -> Key {
        let hash = |state: &RandomState| {
            let mut h = state.build_hasher();
            h.write_u64(project_id);
            h.write(distinct_id.as_bytes());
            h.finish()
        };
        Key {
            index: hash(&self.keys.0),
            check: hash(&self.keys.1) as u32,
        }
    }

    fn shard(&self, key: Key) -> MutexGuard<'_, Shard> {
        self.shards[key.shard()]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, project_id: u64, distinct_id: &str) -> Lookup {
        self.lookup(self.key(project_id, distinct_id))
    }

    /// Like [`ResidentPersons::get`], with only the properties whose key `wanted` accepts.
    pub fn get_reading(
        &self,
        project_id: u64,
        distinct_id: &str,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Lookup {
        self.read(self.key(project_id, distinct_id), |record| {
            codec::decode_reading(record, &self.names, wanted).map(|(_, person)| person)
        })
    }

    /// Like [`ResidentPersons::get`], with the person left in its compact form.
    pub fn get_compact(&self, project_id: u64, distinct_id: &str) -> Lookup<CompactPerson> {
        self.read(self.key(project_id, distinct_id), CompactPerson::of)
    }

    /// The person of a compact form [`ResidentPersons::get_compact`] gave.
    pub fn decode(&self, person: &CompactPerson) -> Option<Person> {
        person.decode(&self.names)
    }

    fn lookup(&self, key: Key) -> Lookup {
        self.read(key, |record| {
            codec::decode(record, &self.names).map(|(_, person)| person)
        })
    }

    /// What memory knows about `key`, its record read by `read` (`None`: a damaged record,
    /// never written so, taken as unknown).
    fn read<P>(&self, key: Key, read: impl FnOnce(&[u8]) -> Option<P>) -> Lookup<P> {
        let shard = self.shard(key);
        match shard.index.get(&key.index) {
            Some(slot) if !slot.is_record() => Lookup::OnDisk,
            Some(slot) => {
                if slot.check != key.check {
                    return Lookup::Unknown;
                }
                match shard.record(*slot).and_then(|(r, _)| read(r)) {
                    Some(person) => Lookup::Person(person),
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
    fn place(&self, key: Key, record: Option<&[u8]>, replace: bool) {
        let mut shard = self.shard(key);
        if let Some(old) = shard.index.get(&key.index).copied() {
            if !Shard::owned_by(old, key.check) {
                // Another id has this index key: both are read from disk from now on.
                if old.at != SHARED {
                    shard.set(
                        key.index,
                        Slot {
                            at: SHARED,
                            check: 0,
                        },
                    );
                }
                return;
            }
            if old.is_record() && !replace {
                return;
            }
        }
        let slot = match record {
            Some(bytes) if bytes.len() <= self.shard_budget / 4 => {
                let slot = Slot {
                    at: shard.arena.len() as u32,
                    check: key.check,
                };
                shard.reserve(codec::framed_len(bytes.len()), self.shard_budget);
                codec::frame(&mut shard.arena, bytes);
                slot
            }
            _ => Slot::marker(key.check),
        };
        shard.set(key.index, slot);
        if !shard.fit(self.shard_budget) {
            self.drop_markers();
        }
    }

    /// Forgets a distinct id (its person was deleted or now lives elsewhere). A key other
    /// ids share stays as it is.
    pub fn remove(&self, project_id: u64, distinct_id: &str) {
        self.remove_key(self.key(project_id, distinct_id));
    }

    fn remove_key(&self, key: Key) {
        let mut shard = self.shard(key);
        if let Some(old) = shard.index.get(&key.index).copied() {
            if Shard::owned_by(old, key.check) {
                shard.index.remove(&key.index);
                if old.is_record() {
                    shard.garbage += shard.span(old);
                } else {
                    shard.markers -= 1;
                }
            }
        }
    }

    /// Forgets a distinct id whose person may still exist (another node wrote it): memory
    /// stops answering for it, and so can no longer be complete.
    pub fn invalidate(&self, project_id: u64, distinct_id: &str) {
        let key = self.key(project_id, distinct_id);
        let mut shard = self.shard(key);
        if let Some(old) = shard.index.remove(&key.index) {
            if old.is_record() {
                shard.garbage += shard.span(old);
            } else {
                shard.markers -= 1;
            }
        }
        drop(shard);
        self.drop_markers();
    }

    /// Forgets every person of a project.
    pub fn remove_project(&self, project_id: u64) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let Shard { index, arena, .. } = &mut *shard;
            let mut freed = 0;
            index.retain(|_, slot| {
                let record = match slot.is_record() {
                    true => arena.get(slot.at as usize..).and_then(codec::unframe),
                    false => None,
                };
                let Some((record, span)) = record else {
                    return true;
                };
                let keep = codec::project_of(record) != Some(project_id);
                if !keep {
                    freed += span;
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

    /// Ingest tells an unchanged person by its encoded properties: they stay equal while only
    /// the version or the distinct ids change, and differ when a property does.
    #[test]
    fn a_compact_person_decodes_whole_and_its_properties_encoding_follows_them() {
        let memory = ResidentPersons::new(1 << 20);
        let p = person("u1", json!({"plan": "pro", "seen": "2024-05-01T10:00:00Z"}));
        memory.put(1, &p);
        let compact = |did: &str| match memory.get_compact(1, did) {
            Lookup::Person(compact) => compact,
            other => panic!("{did}: {other:?}"),
        };
        let first = compact("u1");
        assert_eq!(first.id(), p.id);
        assert_eq!(memory.decode(&first), Some(p.clone()));
        assert_eq!(compact("u1-anon"), first);

        let mut merged = p.clone();
        merged.version += 1;
        merged.distinct_ids.push("u1-other".into());
        memory.put(1, &merged);
        let after_merge = compact("u1-other");
        assert_eq!(memory.decode(&after_merge), Some(merged.clone()));
        assert_ne!(after_merge, first, "another record");
        assert_eq!(
            after_merge.encoded_properties(),
            first.encoded_properties(),
            "the same properties"
        );

        let mut changed = merged;
        changed.properties.insert("plan".into(), json!("team"));
        memory.put(1, &changed);
        let after_change = compact("u1");
        assert_ne!(
            after_change.encoded_properties(),
            first.encoded_properties()
        );
        assert_eq!(memory.decode(&after_change), Some(changed));
        assert_eq!(memory.get_compact(2, "u1"), Lookup::Unknown);
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
        // About 310 persons a shard: twice what a shard's share holds.
        let n = 80_000;
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
        let allocated: usize = memory
            .shards
            .iter()
            .map(|s| {
                let s = s.lock().expect("test value");
                s.arena.capacity() + s.index.capacity() * 17
            })
            .sum();
        assert!(allocated <= budget, "arenas as allocated: {allocated}");
        assert!(memory.is_complete());
        assert_eq!(memory.get(1, "stranger"), Lookup::Absent);
        let on_disk = (0..n)
            .filter(|k| memory.get(1, &format!("user-{k}")) == Lookup::OnDisk)
            .count();
        assert_eq!(on_disk, markers);
    }

    #[test]
    fn a_typical_identified_person_costs_little_more_than_100_bytes() {
        let memory = ResidentPersons::new(1 << 30);
        let n = 200_000u64;
        for k in 0..n {
            let h = k.wrapping_mul(2_654_435_761) % (1 << 32);
            let p = Person {
                id: Uuid::new_v4(),
                created_at: chrono::Utc::now(),
                properties: json!({"email": format!("u{h}@gmail.com"), "plan": "pro",
                    "age": 16 + h % 60, "country": "DE", "app_version": format!("2.{}.{}", h % 10, h % 7),
                    "signed_up_at": format!("2025-{:02}-{:02}T{:02}:00:00Z", 1 + h % 12, 1 + h % 28, h % 24)})
                .as_object()
                .cloned()
                .expect("test value"),
                is_identified: true,
                version: 1,
                distinct_ids: vec![format!("known-{k}")],
            };
            memory.put(1, &p);
        }
        let per_person = memory.bytes() as u64 / n;
        assert!(per_person <= 130, "{per_person} bytes a person");
    }

    #[test]
    fn when_even_markers_do_not_fit_memory_stops_answering_no_person() {
        let budget = SHARDS * MIN_SHARD_BYTES;
        let memory = ResidentPersons::new(budget);
        memory.set_complete();
        // About 1,560 ids a shard: their index alone (2,048 buckets) is twice a shard's share.
        for k in 0..400_000 {
            let mut p = person(&format!("user-{k}"), json!({}));
            p.distinct_ids.truncate(1);
            memory.put(1, &p);
        }
        assert!(memory.bytes() <= budget, "{} > {budget}", memory.bytes());
        assert!(!memory.is_complete());
        assert_eq!(memory.get(1, "stranger"), Lookup::Unknown);
    }

    #[test]
    fn ids_sharing_an_index_key_are_never_given_each_others_person() {
        let memory = ResidentPersons::new(1 << 20);
        memory.set_complete();
        let (a, b) = (person("a", json!({"x": 1})), person("b", json!({"x": 2})));
        let record = |p: &Person| codec::encode(1, p, &memory.names).expect("record");
        let (ka, kb) = (Key { index: 7, check: 1 }, Key { index: 7, check: 2 });
        memory.place(ka, Some(&record(&a)), true);
        assert_eq!(memory.lookup(ka), Lookup::Person(a.clone()));
        assert_eq!(memory.lookup(kb), Lookup::Unknown, "a's record is not b's");
        memory.place(kb, Some(&record(&b)), false);
        assert_eq!(memory.lookup(ka), Lookup::OnDisk);
        assert_eq!(memory.lookup(kb), Lookup::OnDisk);
        memory.place(ka, Some(&record(&a)), true);
        memory.remove_key(kb);
        assert_eq!(memory.lookup(ka), Lookup::OnDisk, "the shared key stays");
        assert_eq!(memory.lookup(kb), Lookup::OnDisk);
        let kc = Key { index: 8, check: 3 };
        memory.place(kc, None, true);
        memory.remove_key(Key { index: 8, check: 4 });
        assert_eq!(
            memory.lookup(kc),
            Lookup::OnDisk,
            "another id's marker is kept"
        );
        memory.remove_key(kc);
        assert_eq!(memory.lookup(kc), Lookup::Absent);
        assert_eq!(memory.counts(), (0, 1));
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
