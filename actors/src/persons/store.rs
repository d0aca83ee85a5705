use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Datelike, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::kernel::codec::{encode, get, scan_prefix};
use crate::kernel::StoreError;

/// At most this many group types per project (PostHog's `MAX_GROUP_TYPES_PER_TEAM`).
pub const MAX_GROUP_TYPES: u8 = 5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Person {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub properties: Map<String, Value>,
    pub is_identified: bool,
    pub version: u64,
    pub distinct_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub group_type_index: u8,
    pub group_type: String,
    pub group_key: String,
    pub properties: Map<String, Value>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageKind {
    BillableEvents,
    HistoricalEvents,
    FlagRequests,
}

impl UsageKind {
    fn tag(self) -> u8 {
        match self {
            UsageKind::BillableEvents => 0,
            UsageKind::HistoricalEvents => 1,
            UsageKind::FlagRequests => 2,
        }
    }
}

/// One month of a project's usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageRow {
    /// `YYYY-MM` (UTC).
    pub month: String,
    pub billable_events: u64,
    pub historical_events: u64,
    pub flag_requests: u64,
}

/// Bounded in-memory copies of persons, groups and group types for flag evaluation, so the
/// common `/flags` request needs no sled read. Every write through [`PersonStore`] updates it
/// under the writer lock, so it is never stale in this process; when full it is emptied.
#[derive(Default)]
struct ReadCache {
    persons: dashmap::DashMap<(u64, String), Option<Arc<Person>>>,
    groups: dashmap::DashMap<(u64, u8, String), Option<Arc<Group>>>,
    group_types: dashmap::DashMap<u64, Arc<Vec<(String, u8)>>>,
}

/// Entries the read cache holds at most (persons and groups each).
pub const READ_CACHE_ENTRIES: usize = 200_000;

pub struct PersonStore {
    cache: ReadCache,
    /// Flag requests counted in memory, `(project, month)` → count, until the next flush.
    pending_flag_requests: dashmap::DashMap<(u64, String), u64>,
    db: sled::Db,
    persons: sled::Tree,
    distinct_ids: sled::Tree,
    group_types: sled::Tree,
    groups: sled::Tree,
    usage: sled::Tree,
    writer: Mutex<()>,
}

fn key(project_id: u64, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + rest.len());
    k.extend_from_slice(&project_id.to_be_bytes());
    k.extend_from_slice(rest);
    k
}

impl PersonStore {
    pub fn open(db: &sled::Db) -> Result<PersonStore, StoreError> {
        Ok(PersonStore {
            persons: db.open_tree("persons")?,
            distinct_ids: db.open_tree("person_distinct_ids")?,
            group_types: db.open_tree("group_type_mappings")?,
            groups: db.open_tree("groups")?,
            usage: db.open_tree("usage")?,
            db: db.clone(),
            writer: Mutex::new(()),
            cache: ReadCache::default(),
            pending_flag_requests: dashmap::DashMap::new(),
        })
    }

    /// The writer lock: hold it across a read-modify-write of persons or groups.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    pub fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError> {
        get(&self.persons, "persons", &key(project_id, id.as_bytes()))
    }

    pub fn person_id_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(self
            .distinct_ids
            .get(key(project_id, distinct_id.as_bytes()))?
            .and_then(|v| Uuid::from_slice(&v).ok()))
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
        self.persons
            .insert(key(project_id, person.id.as_bytes()), encode(person)?)?;
        for did in &person.distinct_ids {
            self.distinct_ids.insert(
                key(project_id, did.as_bytes()),
                person.id.as_bytes().as_slice(),
            )?;
        }
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

    /// Reads a person from sled and caches the answer (also "no person").
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
        let person = self
            .person_by_distinct_id(project_id, distinct_id)?
            .map(Arc::new);
        self.cache_person(project_id, distinct_id, person.clone());
        Ok(person)
    }

    /// Group types from memory, if cached.
    pub fn cached_group_types(&self, project_id: u64) -> Option<Arc<Vec<(String, u8)>>> {
        self.cache
            .group_types
            .get(&project_id)
            .map(|g| Arc::clone(&g))
    }

    /// Group types from sled, cached.
    pub fn load_group_types(&self, project_id: u64) -> Result<Arc<Vec<(String, u8)>>, StoreError> {
        let _writer = self.lock();
        let types = Arc::new(self.group_types(project_id)?);
        self.cache
            .group_types
            .insert(project_id, Arc::clone(&types));
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

    /// A group from sled, cached (also "no group").
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
        let group = self.group(project_id, index, group_key)?.map(Arc::new);
        self.cache_group(project_id, index, group_key, group.clone());
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
        self.persons.remove(key(project_id, id.as_bytes()))?;
        Ok(())
    }

    /// All persons of a project (for queries and exports).
    pub fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError> {
        scan_prefix(&self.persons, "persons", project_id.to_be_bytes())
    }

    /// Group types of a project as `(name, index)`, by index.
    pub fn group_types(&self, project_id: u64) -> Result<Vec<(String, u8)>, StoreError> {
        let mut out: Vec<(String, u8)> = self
            .group_types
            .scan_prefix(project_id.to_be_bytes())
            .filter_map(|item| item.ok())
            .filter_map(|(k, v)| {
                let name = String::from_utf8(k[8..].to_vec()).ok()?;
                Some((name, *v.first()?))
            })
            .collect();
        out.sort_by_key(|(_, i)| *i);
        Ok(out)
    }

    pub fn group_type_index(
        &self,
        project_id: u64,
        group_type: &str,
    ) -> Result<Option<u8>, StoreError> {
        Ok(self
            .group_types
            .get(key(project_id, group_type.as_bytes()))?
            .and_then(|v| v.first().copied()))
    }

    /// The index of `group_type`, creating it when the project has fewer than 5 types.
    /// Caller holds the writer lock.
    pub fn ensure_group_type(
        &self,
        project_id: u64,
        group_type: &str,
    ) -> Result<Option<u8>, StoreError> {
        if let Some(i) = self.group_type_index(project_id, group_type)? {
            return Ok(Some(i));
        }
        let next = self.group_types(project_id)?.len() as u8;
        if next >= MAX_GROUP_TYPES {
            return Ok(None);
        }
        self.group_types
            .insert(key(project_id, group_type.as_bytes()), &[next])?;
        self.cache.group_types.remove(&project_id);
        Ok(Some(next))
    }

    pub fn group(
        &self,
        project_id: u64,
        index: u8,
        group_key: &str,
    ) -> Result<Option<Group>, StoreError> {
        let mut rest = vec![index];
        rest.extend_from_slice(group_key.as_bytes());
        get(&self.groups, "groups", &key(project_id, &rest))
    }

    /// Groups of a project, optionally of one type.
    pub fn groups(&self, project_id: u64, index: Option<u8>) -> Result<Vec<Group>, StoreError> {
        let prefix = match index {
            Some(i) => key(project_id, &[i]),
            None => project_id.to_be_bytes().to_vec(),
        };
        scan_prefix(&self.groups, "groups", prefix)
    }

    /// Writes a group. Caller holds the writer lock.
    pub fn put_group(&self, project_id: u64, group: &Group) -> Result<(), StoreError> {
        let mut rest = vec![group.group_type_index];
        rest.extend_from_slice(group.group_key.as_bytes());
        self.groups.insert(key(project_id, &rest), encode(group)?)?;
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
        if n == 0 {
            return Ok(());
        }
        let month = at.format("%Y-%m").to_string();
        let mut rest = month.into_bytes();
        rest.push(kind.tag());
        self.usage.fetch_and_update(key(project_id, &rest), |old| {
            let current = old
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            Some((current + n).to_be_bytes().to_vec())
        })?;
        Ok(())
    }

    /// Counts one `/flags` request in memory (no disk I/O on the request path); see
    /// [`PersonStore::flush_pending_usage`].
    pub fn count_flag_request(&self, project_id: u64, at: DateTime<Utc>) {
        *self
            .pending_flag_requests
            .entry((project_id, format!("{:04}-{:02}", at.year(), at.month())))
            .or_insert(0) += 1;
    }

    /// Writes the in-memory flag-request counts to sled (called every second and on shutdown;
    /// a crash loses at most the counts since the last flush).
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
                self.add_usage(project_id, at, UsageKind::FlagRequests, count)?;
            }
        }
        Ok(())
    }

    /// Usage by month, oldest first (including flag requests not yet flushed).
    pub fn usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError> {
        let mut rows = self.stored_usage(project_id)?;
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

    fn stored_usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError> {
        let mut rows: Vec<UsageRow> = Vec::new();
        for item in self.usage.scan_prefix(project_id.to_be_bytes()) {
            let (k, v) = item?;
            if k.len() < 8 + 7 + 1 {
                continue;
            }
            let month = String::from_utf8_lossy(&k[8..15]).into_owned();
            let count = v.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0);
            if rows.last().is_none_or(|r| r.month != month) {
                rows.push(UsageRow {
                    month: month.clone(),
                    ..UsageRow::default()
                });
            }
            if let Some(row) = rows.last_mut() {
                match k[15] {
                    0 => row.billable_events = count,
                    1 => row.historical_events = count,
                    _ => row.flag_requests = count,
                }
            }
        }
        Ok(rows)
    }

    /// The number of group types in use by the project (for flag validation).
    pub fn group_type_count(&self, project_id: u64) -> Result<usize, StoreError> {
        Ok(self.group_types(project_id)?.len())
    }
}
