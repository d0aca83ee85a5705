//! Where persons, distinct ids, groups, group types and usage counters live.
//!
//! [`PersonRecords`] is the storage trait ([`EmbeddedPersons`] in the embedded default; every
//! implementation passes [`contract::suite`]). Read-modify-write cycles are serialized by the
//! domain's writer ([`super::PersonStore`]); an implementation shared by several processes
//! must make [`PersonRecords::put_person`] and [`PersonRecords::ensure_group_type`] safe
//! against concurrent writers itself.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::erasure::Erasure;
use super::model::{Group, Person, UsageKind, UsageRow};
use corvid_activity::ActivityEntry;
use corvid_kernel::StoreError;

/// What another node wrote, for this node's read cache to drop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PersonChange {
    /// The person of these distinct ids was written.
    Persons {
        project: u64,
        distinct_ids: Vec<String>,
    },
    /// A group was written.
    Group {
        project: u64,
        index: u8,
        key: String,
    },
    /// Anything of the project may have changed (a person deleted, a group type added).
    Project { project: u64 },
}

/// Something a person or group read-modify-write touches. A store shared by several nodes
/// locks each for the length of the write ([`PersonRecords::exclusively`]), so writes of
/// different persons run at once on different nodes and writes of one person take turns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Touched {
    /// A distinct id the event names (its own, or the one it merges with).
    DistinctId(String),
    /// A person one of those distinct ids belongs to.
    Person(Uuid),
    /// A group `$groupidentify` writes.
    Group { group_type: String, key: String },
}

impl Touched {
    /// A 64-bit advisory-lock key for this thing of `project_id`: FNV-1a over a tag, the
    /// project and the name, the same on every node and every build (two things sharing a key
    /// only wait for each other).
    pub fn lock_key(&self, project_id: u64) -> i64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for b in bytes {
                hash ^= u64::from(*b);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        feed(b"corvid-person-write");
        feed(&project_id.to_le_bytes());
        match self {
            Touched::DistinctId(id) => {
                feed(b"d");
                feed(id.as_bytes());
            }
            Touched::Person(id) => {
                feed(b"p");
                feed(id.as_bytes());
            }
            Touched::Group { group_type, key } => {
                feed(b"g");
                feed(group_type.as_bytes());
                feed(&[0]);
                feed(key.as_bytes());
            }
        }
        i64::from_le_bytes(hash.to_le_bytes())
    }
}

/// One write of [`PersonRecords::write_persons`].
#[derive(Debug, Clone)]
pub enum PersonWrite {
    /// As [`PersonRecords::put_person`]; `new_ids` says which distinct ids may not point at
    /// the person yet.
    Put {
        project: u64,
        person: Arc<Person>,
        new_ids: NewIds,
    },
    /// As [`PersonRecords::delete_person`].
    Delete { project: u64, id: Uuid },
}

/// Which distinct ids of a person written may not point at it in storage yet. A
/// read-modify-write under the writer lock knows (the ids it added, or every id of a person
/// it created), and a store may then skip reading the others' mappings.
#[derive(Debug, Clone, PartialEq)]
pub enum NewIds {
    /// Any of them.
    Any,
    /// Only these; the person's other ids already point at it.
    Only(Vec<String>),
}

/// Called with each change another node announced; `None` when changes may have been missed.
pub type OnPersonChange = Arc<dyn Fn(Option<PersonChange>) + Send + Sync>;

pub trait PersonRecords: Send + Sync {
    /// Runs `work` while no other node sharing these records runs a read-modify-write that
    /// touches any of `touched` (this process's callers are serialized by the domain's writer
    /// lock). A store one process owns just runs it.
    fn exclusively(
        &self,
        project_id: u64,
        touched: &[Touched],
        work: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let _ = (project_id, touched);
        work()
    }

    /// Whether other processes write these records too. Then this process's read cache may
    /// lag their writes, and a read-modify-write reads the records themselves.
    fn shared(&self) -> bool {
        false
    }

    /// Announces other nodes' writes to `on_change`. A store only this process writes never
    /// calls it: its writes go through the cache.
    fn watch(&self, on_change: OnPersonChange) {
        let _ = on_change;
    }

    fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError>;
    fn person_id_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Uuid>, StoreError>;
    /// Writes a person and points all its distinct ids at it.
    fn put_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError>;
    /// Deletes a person record (its distinct ids must already point elsewhere).
    fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError>;
    /// Applies `writes` in order, as one commit where the store can.
    fn write_persons(&self, writes: &[PersonWrite]) -> Result<(), StoreError> {
        for write in writes {
            match write {
                PersonWrite::Put {
                    project, person, ..
                } => self.put_person(*project, person)?,
                PersonWrite::Delete { project, id } => self.delete_person(*project, *id)?,
            }
        }
        Ok(())
    }
    /// All persons of a project.
    fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError>;
    /// Up to `limit` persons of every project, in (project, person id) order, starting
    /// after `after` (for loading them all a page at a time).
    fn scan_persons(
        &self,
        after: Option<(u64, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(u64, Person)>, StoreError>;
    /// Deletes a person and those of its distinct ids that still point at it.
    fn remove_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError>;

    /// Stores erasure records of `project_id`, new or changed (keyed by their id), with the
    /// activity entries that record them, in one commit; other nodes drop their copies of the
    /// project's erasures.
    fn put_erasures(
        &self,
        project_id: u64,
        erasures: &[Erasure],
        log: &[ActivityEntry],
    ) -> Result<(), StoreError>;
    /// The erasure records of a project, or of every project.
    fn erasures(&self, project_id: Option<u64>) -> Result<Vec<Erasure>, StoreError>;
    /// Deletes the finished erasure records (verified, or without events to erase) requested
    /// before `before`; returns how many went. Pending ones stay, however old.
    fn expire_erasures(&self, before: DateTime<Utc>) -> Result<usize, StoreError>;

    /// Group types of a project as `(name, index)`, by index.
    fn group_types(&self, project_id: u64) -> Result<Vec<(String, u8)>, StoreError>;
    /// The index of `group_type`, assigning the next one when the project has fewer than
    /// `max` types; `None` when it is full.
    fn ensure_group_type(
        &self,
        project_id: u64,
        group_type: &str,
        max: u8,
    ) -> Result<Option<u8>, StoreError>;
    fn group(
        &self,
        project_id: u64,
        index: u8,
        group_key: &str,
    ) -> Result<Option<Group>, StoreError>;
    /// Groups of a project, optionally of one type.
    fn groups(&self, project_id: u64, index: Option<u8>) -> Result<Vec<Group>, StoreError>;
    fn put_group(&self, project_id: u64, group: &Group) -> Result<(), StoreError>;

    /// Adds `n` to a usage counter of the month containing `at`, atomically.
    fn add_usage(
        &self,
        project_id: u64,
        at: DateTime<Utc>,
        kind: UsageKind,
        n: u64,
    ) -> Result<(), StoreError>;
    /// Stored usage by month, oldest first.
    fn usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError>;

    /// Waits until every person write accepted so far is in the records as a completed
    /// [`PersonRecords::put_person`] leaves it: written behind, a write is accepted before it
    /// is made ([`super::WriteBehind`]). Others have nothing to wait for.
    fn settle(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Makes every write so far durable.
    fn flush(&self) -> Result<(), StoreError>;
}

/// Implements the [`PersonRecords`] methods that are not about persons (erasure records,
/// group types, groups, usage) and `flush` by calling the same methods of `self.$inner`: for
/// wrappers that change how persons are written or read and nothing else.
#[macro_export]
macro_rules! delegate_other_person_records {
    ($inner:ident) => {
        fn put_erasures(
            &self,
            project_id: u64,
            erasures: &[$crate::Erasure],
            log: &[$crate::delegated::ActivityEntry],
        ) -> Result<(), $crate::delegated::StoreError> {
            self.$inner.put_erasures(project_id, erasures, log)
        }
        fn erasures(
            &self,
            project_id: Option<u64>,
        ) -> Result<Vec<$crate::Erasure>, $crate::delegated::StoreError> {
            self.$inner.erasures(project_id)
        }
        fn expire_erasures(
            &self,
            before: $crate::delegated::DateTime<$crate::delegated::Utc>,
        ) -> Result<usize, $crate::delegated::StoreError> {
            self.$inner.expire_erasures(before)
        }
        fn group_types(
            &self,
            project_id: u64,
        ) -> Result<Vec<(String, u8)>, $crate::delegated::StoreError> {
            self.$inner.group_types(project_id)
        }
        fn ensure_group_type(
            &self,
            project_id: u64,
            group_type: &str,
            max: u8,
        ) -> Result<Option<u8>, $crate::delegated::StoreError> {
            self.$inner.ensure_group_type(project_id, group_type, max)
        }
        fn group(
            &self,
            project_id: u64,
            index: u8,
            group_key: &str,
        ) -> Result<Option<$crate::Group>, $crate::delegated::StoreError> {
            self.$inner.group(project_id, index, group_key)
        }
        fn groups(
            &self,
            project_id: u64,
            index: Option<u8>,
        ) -> Result<Vec<$crate::Group>, $crate::delegated::StoreError> {
            self.$inner.groups(project_id, index)
        }
        fn put_group(
            &self,
            project_id: u64,
            group: &$crate::Group,
        ) -> Result<(), $crate::delegated::StoreError> {
            self.$inner.put_group(project_id, group)
        }
        fn add_usage(
            &self,
            project_id: u64,
            at: $crate::delegated::DateTime<$crate::delegated::Utc>,
            kind: $crate::UsageKind,
            n: u64,
        ) -> Result<(), $crate::delegated::StoreError> {
            self.$inner.add_usage(project_id, at, kind, n)
        }
        fn usage(
            &self,
            project_id: u64,
        ) -> Result<Vec<$crate::UsageRow>, $crate::delegated::StoreError> {
            self.$inner.usage(project_id)
        }
    };
}

/// The behaviour every [`PersonRecords`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use serde_json::json;

    use super::*;

    /// A person of plan "pro" with these distinct ids.
    pub(crate) fn person(distinct_ids: &[&str]) -> Person {
        Person {
            id: Uuid::new_v4(),
            created_at: Utc::now(),
            properties: json!({"plan": "pro"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            is_identified: false,
            version: 0,
            distinct_ids: distinct_ids.iter().map(|d| d.to_string()).collect(),
        }
    }

    /// Runs every check against an empty store.
    pub fn suite(records: &dyn PersonRecords) {
        persons_are_found_by_every_distinct_id(records);
        a_merge_moves_distinct_ids_and_deletes_the_loser(records);
        a_batch_leaves_each_key_as_its_last_write_does(records);
        group_types_are_numbered_up_to_the_limit(records);
        groups_are_kept_per_type(records);
        usage_adds_up_per_month_and_kind(records);
        a_removed_person_takes_its_distinct_ids_along(records);
        erasures_are_kept_per_project_until_they_expire(records);
        every_person_is_scanned_once_a_page_at_a_time(records);
    }

    fn every_person_is_scanned_once_a_page_at_a_time(records: &dyn PersonRecords) {
        let mut expected: Vec<(u64, Uuid)> = Vec::new();
        let mut after = None;
        loop {
            let page = records.scan_persons(after, usize::MAX).expect("scan");
            let Some((project, last)) = page.last() else {
                break;
            };
            after = Some((*project, last.id));
            expected.extend(page.iter().map(|(p, person)| (*p, person.id)));
        }
        for (project, ids) in [(21, vec!["s1"]), (20, vec!["s2", "s3"]), (21, vec!["s4"])] {
            let p = person(&ids);
            records.put_person(project, &p).expect("put");
            expected.push((project, p.id));
        }
        expected.sort();
        let mut scanned = Vec::new();
        let mut after = None;
        loop {
            let page = records.scan_persons(after, 2).expect("scan");
            assert!(page.len() <= 2);
            let Some((project, last)) = page.last() else {
                break;
            };
            after = Some((*project, last.id));
            for (project, person) in page {
                assert_eq!(
                    records.person(project, person.id).expect("read"),
                    Some(person.clone())
                );
                scanned.push((project, person.id));
            }
        }
        assert_eq!(scanned, expected);
    }

    fn a_removed_person_takes_its_distinct_ids_along(records: &dyn PersonRecords) {
        let gone = person(&["g1", "g2"]);
        let stays = person(&["s"]);
        records.put_person(9, &gone).expect("put");
        records.put_person(9, &stays).expect("put");
        records.remove_person(9, &gone).expect("remove");
        assert_eq!(records.person(9, gone.id).expect("read"), None);
        for did in ["g1", "g2"] {
            assert_eq!(
                records.person_id_by_distinct_id(9, did).expect("read"),
                None
            );
        }
        assert_eq!(records.persons(9).expect("list"), vec![stays.clone()]);
        // A distinct id that moved to another person meanwhile stays with it.
        let moved = person(&["m"]);
        records.put_person(9, &moved).expect("put");
        let mut stale = moved.clone();
        stale.id = Uuid::new_v4();
        records.remove_person(9, &stale).expect("remove");
        assert_eq!(
            records.person_id_by_distinct_id(9, "m").expect("read"),
            Some(moved.id)
        );
    }

    fn erasures_are_kept_per_project_until_they_expire(records: &dyn PersonRecords) {
        let erasure = |project: u64, at: &str| Erasure {
            id: Uuid::new_v4(),
            project_id: project,
            person_uuid: Uuid::new_v4(),
            distinct_ids: vec!["a".into()],
            requested_at: at.parse().expect("time"),
            requested_by: Some("someone@example.com".into()),
            person_deleted: true,
            events: true,
            verified_at: None,
            events_removed: 0,
        };
        let mut old = erasure(10, "2026-01-01T00:00:00Z");
        old.verified_at = Some("2026-01-01T00:05:00Z".parse().expect("time"));
        let mut new = erasure(10, "2026-03-01T00:00:00Z");
        let mut other = erasure(11, "2026-02-01T00:00:00Z");
        other.events = false;
        let pending = erasure(12, "2025-01-01T00:00:00Z");
        records
            .put_erasures(10, &[old.clone(), new.clone()], &[])
            .expect("put");
        records
            .put_erasures(11, std::slice::from_ref(&other), &[])
            .expect("put");
        records
            .put_erasures(12, std::slice::from_ref(&pending), &[])
            .expect("put");
        let sorted = |mut v: Vec<Erasure>| {
            v.sort_by_key(|e| e.requested_at);
            v
        };
        assert_eq!(
            sorted(records.erasures(Some(10)).expect("list")),
            vec![old.clone(), new.clone()]
        );
        new.verified_at = Some(Utc::now());
        new.events_removed = 12;
        records
            .put_erasures(10, &[new.clone()], &[])
            .expect("update");
        assert_eq!(
            sorted(records.erasures(None).expect("all")),
            vec![pending.clone(), old, other.clone(), new.clone()]
        );
        let expired = records
            .expire_erasures("2026-02-15T00:00:00Z".parse().expect("time"))
            .expect("expire");
        assert_eq!(expired, 2, "finished ones go, pending ones stay");
        assert_eq!(
            sorted(records.erasures(None).expect("all")),
            vec![pending, new]
        );
    }

    fn persons_are_found_by_every_distinct_id(records: &dyn PersonRecords) {
        let p = person(&["a", "b"]);
        records.put_person(1, &p).expect("put");
        for did in ["a", "b"] {
            assert_eq!(
                records.person_id_by_distinct_id(1, did).expect("read"),
                Some(p.id)
            );
        }
        assert_eq!(
            records.person_id_by_distinct_id(2, "a").expect("read"),
            None,
            "per project"
        );
        assert_eq!(records.person(1, p.id).expect("read"), Some(p.clone()));
        assert_eq!(records.persons(1).expect("list"), vec![p]);
        records.flush().expect("flush");
    }

    fn a_merge_moves_distinct_ids_and_deletes_the_loser(records: &dyn PersonRecords) {
        let winner = person(&["w"]);
        let loser = person(&["l"]);
        records.put_person(3, &winner).expect("put");
        records.put_person(3, &loser).expect("put");
        let mut merged = winner.clone();
        merged.distinct_ids.push("l".into());
        merged.version += 1;
        records.put_person(3, &merged).expect("put");
        records.delete_person(3, loser.id).expect("delete");
        assert_eq!(
            records.person_id_by_distinct_id(3, "l").expect("read"),
            Some(winner.id)
        );
        assert_eq!(records.person(3, loser.id).expect("read"), None);
        assert_eq!(records.persons(3).expect("list"), vec![merged]);
    }

    /// The same merge as one batch: each key ends as the batch's last write of it leaves it.
    fn a_batch_leaves_each_key_as_its_last_write_does(records: &dyn PersonRecords) {
        let winner = person(&["bw"]);
        let loser = person(&["bl"]);
        let mut merged = winner.clone();
        merged.distinct_ids.push("bl".into());
        merged.version += 1;
        let put = |p: &Person, new_ids: NewIds| PersonWrite::Put {
            project: 5,
            person: Arc::new(p.clone()),
            new_ids,
        };
        records
            .write_persons(&[
                put(&winner, NewIds::Any),
                put(&loser, NewIds::Only(vec!["bl".into()])),
                put(&merged, NewIds::Only(vec!["bl".into()])),
                PersonWrite::Delete {
                    project: 5,
                    id: loser.id,
                },
            ])
            .expect("write");
        assert_eq!(
            records.person_id_by_distinct_id(5, "bl").expect("read"),
            Some(winner.id)
        );
        assert_eq!(
            records.person_id_by_distinct_id(5, "bw").expect("read"),
            Some(winner.id)
        );
        assert_eq!(records.person(5, loser.id).expect("read"), None);
        assert_eq!(records.persons(5).expect("list"), vec![merged.clone()]);

        // A change of properties alone names no new id; the mappings stay.
        let mut updated = merged;
        updated.properties.insert("plan".into(), "team".into());
        updated.version += 1;
        records
            .write_persons(&[put(&updated, NewIds::Only(Vec::new()))])
            .expect("write");
        assert_eq!(
            records.person_id_by_distinct_id(5, "bl").expect("read"),
            Some(winner.id)
        );
        assert_eq!(records.persons(5).expect("list"), vec![updated]);
    }

    fn group_types_are_numbered_up_to_the_limit(records: &dyn PersonRecords) {
        assert_eq!(
            records.ensure_group_type(4, "company", 2).expect("ensure"),
            Some(0)
        );
        assert_eq!(
            records.ensure_group_type(4, "team", 2).expect("ensure"),
            Some(1)
        );
        assert_eq!(
            records.ensure_group_type(4, "company", 2).expect("again"),
            Some(0)
        );
        assert_eq!(
            records.ensure_group_type(4, "region", 2).expect("full"),
            None
        );
        assert_eq!(
            records.group_types(4).expect("list"),
            vec![("company".to_string(), 0), ("team".to_string(), 1)]
        );
        assert!(records.group_types(5).expect("list").is_empty());
    }

    fn groups_are_kept_per_type(records: &dyn PersonRecords) {
        let group = |index: u8, key: &str| Group {
            group_type_index: index,
            group_type: format!("t{index}"),
            group_key: key.into(),
            properties: Default::default(),
            created_at: Utc::now(),
        };
        records.put_group(6, &group(0, "acme")).expect("put");
        records.put_group(6, &group(1, "acme")).expect("put");
        records.put_group(6, &group(1, "globex")).expect("put");
        assert_eq!(
            records.group(6, 1, "acme").expect("read"),
            Some(group(1, "acme")).map(|mut g| {
                g.created_at = records
                    .group(6, 1, "acme")
                    .expect("read")
                    .expect("found")
                    .created_at;
                g
            })
        );
        assert!(records.group(6, 2, "acme").expect("read").is_none());
        assert_eq!(records.groups(6, Some(1)).expect("list").len(), 2);
        assert_eq!(records.groups(6, None).expect("list").len(), 3);
    }

    fn usage_adds_up_per_month_and_kind(records: &dyn PersonRecords) {
        let jan = "2026-01-15T00:00:00Z".parse().expect("time");
        let feb = "2026-02-01T00:00:00Z".parse().expect("time");
        records
            .add_usage(7, jan, UsageKind::BillableEvents, 3)
            .expect("add");
        records
            .add_usage(7, jan, UsageKind::BillableEvents, 4)
            .expect("add");
        records
            .add_usage(7, jan, UsageKind::FlagRequests, 2)
            .expect("add");
        records
            .add_usage(7, feb, UsageKind::HistoricalEvents, 5)
            .expect("add");
        records
            .add_usage(8, feb, UsageKind::HistoricalEvents, 9)
            .expect("other project");
        let rows = records.usage(7).expect("usage");
        assert_eq!(
            rows,
            vec![
                UsageRow {
                    month: "2026-01".into(),
                    billable_events: 7,
                    historical_events: 0,
                    flag_requests: 2
                },
                UsageRow {
                    month: "2026-02".into(),
                    billable_events: 0,
                    historical_events: 5,
                    flag_requests: 0
                },
            ]
        );
    }
}
