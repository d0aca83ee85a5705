//! The persons domain's store: the records ([`PersonRecords`]), a bounded read cache for flag
//! evaluation, in-memory flag-request counts, and the writer lock that serializes
//! read-modify-write cycles.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Datelike, Utc};
use uuid::Uuid;

use super::model::{Group, Person, UsageKind, UsageRow, MAX_GROUP_TYPES};
use super::records::{PersonChange, PersonRecords};
use super::sled_store::SledPersons;
use crate::kernel::StoreError;

/// Bounded in-memory copies of persons, groups and group types for flag evaluation, so the
/// common `/flags` request needs no storage read. Every write through [`PersonStore`] updates
/// it under the writer lock, so it is never stale because of this process; writes of other
/// nodes (records shared in a cluster) drop what they changed when announced. When full it is
/// emptied.
#[derive(Default)]
struct ReadCache {
    persons: dashmap::DashMap<(u64, String), Option<Arc<Person>>>,
    groups: dashmap::DashMap<(u64, u8, String), Option<Arc<Group>>>,
    group_types: dashmap::DashMap<u64, Arc<Vec<(String, u8)>>>,
    /// Counts other nodes' announced changes: a fill that read before one is not kept.
    remote_changes: AtomicU64,
}

impl ReadCache {
    /// Drops what another node changed (`None`: everything).
    fn forget(&self, change: Option<PersonChange>) {
        self.remote_changes.fetch_add(1, Ordering::SeqCst);
        match change {
            Some(PersonChange::Persons {
                project,
                distinct_ids,
            }) => {
                for did in distinct_ids {
                    self.persons.remove(&(project, did));
                }
            }
            Some(PersonChange::Group {
                project,
                index,
                key,
            }) => {
                self.groups.remove(&(project, index, key));
            }
            Some(PersonChange::Project { project }) => {
                self.persons.retain(|(p, _), _| *p != project);
                self.groups.retain(|(p, _, _), _| *p != project);
                self.group_types.remove(&project);
            }
            None => {
                self.persons.clear();
                self.groups.clear();
                self.group_types.clear();
            }
        }
    }

    /// The change count to compare against before keeping a fill.
    fn epoch(&self) -> u64 {
        self.remote_changes.load(Ordering::SeqCst)
    }
}

/// Entries the read cache holds at most (persons and groups each).
pub const READ_CACHE_ENTRIES: usize = 200_000;

pub struct PersonStore {
    records: Arc<dyn PersonRecords>,
    cache: Arc<ReadCache>,
    /// Flag requests counted in memory, `(project, month)` → count, until the next flush.
    pending_flag_requests: dashmap::DashMap<(u64, String), u64>,
    writer: Mutex<()>,
}

impl PersonStore {
    pub fn new(records: Arc<dyn PersonRecords>) -> PersonStore {
        let cache = Arc::new(ReadCache::default());
        let changed = Arc::clone(&cache);
        records.watch(Arc::new(move |change| changed.forget(change)));
        PersonStore {
            records,
            cache,
            pending_flag_requests: dashmap::DashMap::new(),
            writer: Mutex::new(()),
        }
    }

    /// Over the embedded records in `db`.
    pub fn open(db: &sled::Db) -> Result<PersonStore, StoreError> {
        Ok(PersonStore::new(Arc::new(SledPersons::open(db)?)))
    }

    /// The writer lock: hold it across a read-modify-write of persons or groups.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a read-modify-write of `project_id`'s persons or groups while no other node
    /// sharing the records runs one. Take [`PersonStore::lock`] first.
    pub fn exclusively<T>(
        &self,
        project_id: u64,
        work: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut work = Some(work);
        let mut out = None;
        self.records.exclusively(project_id, &mut || {
            if let Some(work) = work.take() {
                out = Some(work()?);
            }
            Ok(())
        })?;
        out.ok_or_else(|| StoreError::TaskFailed("person write did not run".into()))
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.records.flush()
    }

    pub fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError> {
        self.records.person(project_id, id)
    }

    pub fn person_id_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        self.records
            .person_id_by_distinct_id(project_id, distinct_id)
    }

    pub fn person_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Person>, StoreError> {
        match self.person_id_by_distinct_id(project_id, distinct_id)? {
            Some(id) => self.person(project_id, id),
            None => Ok(None),
        }
    }

    /// Writes a person and points all its distinct ids at it. Caller holds the writer lock.
    pub fn put_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        self.records.put_person(project_id, person)?;
        let shared = Arc::new(person.clone());
        for did in &person.distinct_ids {
            self.cache_person(project_id, did, Some(Arc::clone(&shared)));
        }
        Ok(())
    }

    fn cache_person(&self, project_id: u64, distinct_id: &str, person: Option<Arc<Person>>) {
        if self.cache.persons.len() >= READ_CACHE_ENTRIES {
            self.cache.persons.clear();
        }
        self.cache
            .persons
            .insert((project_id, distinct_id.to_string()), person);
    }

    /// The person of a distinct id from memory: `Some(None)` when known to have none, `None`
    /// when not cached (call [`PersonStore::load_person`] off the event loop).
    pub fn cached_person(&self, project_id: u64, distinct_id: &str) -> Option<Option<Arc<Person>>> {
        self.cache
            .persons
            .get(&(project_id, distinct_id.to_string()))
            .map(|p| p.clone())
    }

    /// Reads a person from storage and caches the answer (also "no person").
    pub fn load_person(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Arc<Person>>, StoreError> {
        // Under the writer lock, so a concurrent write cannot be overwritten by an older read.
        let _writer = self.lock();
        if let Some(cached) = self.cached_person(project_id, distinct_id) {
            return Ok(cached);
        }
        let epoch = self.cache.epoch();
        let person = self
            .person_by_distinct_id(project_id, distinct_id)?
            .map(Arc::new);
        if self.cache.epoch() == epoch {
            self.cache_person(project_id, distinct_id, person.clone());
        }
        Ok(person)
    }

    /// Group types from memory, if cached.
    pub fn cached_group_types(&self, project_id: u64) -> Option<Arc<Vec<(String, u8)>>> {
        self.cache
            .group_types
            .get(&project_id)
            .map(|g| Arc::clone(&g))
    }

    /// Group types from storage, cached.
    pub fn load_group_types(&self, project_id: u64) -> Result<Arc<Vec<(String, u8)>>, StoreError> {
        let _writer = self.lock();
        let epoch = self.cache.epoch();
        let types = Arc::new(self.group_types(project_id)?);
        if self.cache.epoch() == epoch {
            self.cache
                .group_types
                .insert(project_id, Arc::clone(&types));
        }
        Ok(types)
    }

    /// A group from memory: `Some(None)` when known not to exist, `None` when not cached.
    pub fn cached_group(
        &self,
        project_id: u64,
        index: u8,
        group_key: &str,
    ) -> Option<Option<Arc<Group>>> {
        self.cache
            .groups
            .get(&(project_id, index, group_key.to_string()))
            .map(|g| g.clone())
    }

    /// A group from storage, cached (also "no group").
    pub fn load_group(
        &self,
        project_id: u64,
        index: u8,
        group_key: &str,
    ) -> Result<Option<Arc<Group>>, StoreError> {
        let _writer = self.lock();
        if let Some(cached) = self.cached_group(project_id, index, group_key) {
            return Ok(cached);
        }
        let epoch = self.cache.epoch();
        let group = self.group(project_id, index, group_key)?.map(Arc::new);
        if self.cache.epoch() == epoch {
            self.cache_group(project_id, index, group_key, group.clone());
        }
        Ok(group)
    }

    fn cache_group(&self, project_id: u64, index: u8, group_key: &str, group: Option<Arc<Group>>) {
        if self.cache.groups.len() >= READ_CACHE_ENTRIES {
            self.cache.groups.clear();
        }
        self.cache
            .groups
            .insert((project_id, index, group_key.to_string()), group);
    }

    /// Deletes a person record (its distinct ids must already point elsewhere).
    pub fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError> {
        self.records.delete_person(project_id, id)
    }

    /// All persons of a project (for queries and exports).
    pub fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError> {
        self.records.persons(project_id)
    }

    /// Group types of a project as `(name, index)`, by index.
    pub fn group_types(&self, project_id: u64) -> Result<Vec<(String, u8)>, StoreError> {
        self.records.group_types(project_id)
    }

    pub fn group_type_index(
        &self,
        project_id: u64,
        group_type: &str,
    ) -> Result<Option<u8>, StoreError> {
        Ok(self
            .group_types(project_id)?
            .into_iter()
            .find(|(name, _)| name == group_type)
            .map(|(_, index)| index))
    }

    /// The index of `group_type`, creating it when the project has fewer than
    /// [`MAX_GROUP_TYPES`] types. Caller holds the writer lock.
    pub fn ensure_group_type(
        &self,
        project_id: u64,
        group_type: &str,
    ) -> Result<Option<u8>, StoreError> {
        let index = self
            .records
            .ensure_group_type(project_id, group_type, MAX_GROUP_TYPES)?;
        self.cache.group_types.remove(&project_id);
        Ok(index)
    }

    pub fn group(
        &self,
        project_id: u64,
        index: u8,
        group_key: &str,
    ) -> Result<Option<Group>, StoreError> {
        self.records.group(project_id, index, group_key)
    }

    /// Groups of a project, optionally of one type.
    pub fn groups(&self, project_id: u64, index: Option<u8>) -> Result<Vec<Group>, StoreError> {
        self.records.groups(project_id, index)
    }

    /// Writes a group. Caller holds the writer lock.
    pub fn put_group(&self, project_id: u64, group: &Group) -> Result<(), StoreError> {
        self.records.put_group(project_id, group)?;
        self.cache_group(
            project_id,
            group.group_type_index,
            &group.group_key,
            Some(Arc::new(group.clone())),
        );
        Ok(())
    }

    /// Adds `n` to a usage counter of the month containing `at`.
    pub fn add_usage(
        &self,
        project_id: u64,
        at: DateTime<Utc>,
        kind: UsageKind,
        n: u64,
    ) -> Result<(), StoreError> {
        self.records.add_usage(project_id, at, kind, n)
    }

    /// Counts one `/flags` request in memory (no disk I/O on the request path); see
    /// [`PersonStore::flush_pending_usage`].
    pub fn count_flag_request(&self, project_id: u64, at: DateTime<Utc>) {
        *self
            .pending_flag_requests
            .entry((project_id, format!("{:04}-{:02}", at.year(), at.month())))
            .or_insert(0) += 1;
    }

    /// Writes the in-memory flag-request counts to storage (called every second and on
    /// shutdown; a crash loses at most the counts since the last flush).
    pub fn flush_pending_usage(&self) -> Result<(), StoreError> {
        let keys: Vec<(u64, String)> = self
            .pending_flag_requests
            .iter()
            .map(|e| e.key().clone())
            .collect();
        for key in keys {
            if let Some((_, count)) = self.pending_flag_requests.remove(&key) {
                let (project_id, month) = key;
                let at = chrono::NaiveDate::parse_from_str(&format!("{month}-01"), "%Y-%m-%d")
                    .ok()
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
                    .map(|t| t.and_utc())
                    .unwrap_or_else(Utc::now);
                if let Err(err) = self.add_usage(project_id, at, UsageKind::FlagRequests, count) {
                    // Put the count back so the next flush retries it.
                    *self
                        .pending_flag_requests
                        .entry((project_id, month))
                        .or_insert(0) += count;
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Usage by month, oldest first (including flag requests not yet flushed).
    pub fn usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError> {
        let mut rows = self.records.usage(project_id)?;
        for entry in self.pending_flag_requests.iter() {
            let (project, month) = entry.key();
            if *project != project_id {
                continue;
            }
            match rows.iter_mut().find(|r| &r.month == month) {
                Some(row) => row.flag_requests += *entry.value(),
                None => rows.push(UsageRow {
                    month: month.clone(),
                    flag_requests: *entry.value(),
                    ..UsageRow::default()
                }),
            }
        }
        rows.sort_by(|a, b| a.month.cmp(&b.month));
        Ok(rows)
    }

    /// The number of group types in use by the project (for flag validation).
    pub fn group_type_count(&self, project_id: u64) -> Result<usize, StoreError> {
        Ok(self.group_types(project_id)?.len())
    }
}
