//! The persons domain's store: the records ([`PersonRecords`]), a bounded read cache for flag
//! evaluation and ingestion, in-memory usage counts, and the writer lock that serializes
//! read-modify-write cycles.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::embedded_store::EmbeddedPersons;
use super::erasure::{Erasure, ProjectErasures};
use super::files::PersonFiles;
use super::model::{Group, Person, UsageKind, UsageMonth, UsageRow, MAX_GROUP_TYPES};
use super::records::{NewIds, PersonChange, PersonRecords, PersonWrite, Touched};
use super::resident::{CompactPerson, Lookup, ResidentPersons};
use corvid_activity::{ActivityEntry, Actor};
use corvid_kernel::start_over::StartOverMap;
use corvid_kernel::StoreError;

/// The activity entry of an erasure request (scope `Person`, item the person's uuid).
fn erasure_entry(actor: &Actor, e: &Erasure) -> ActivityEntry {
    ActivityEntry::removal(
        e.project_id,
        actor,
        "Person",
        e.person_uuid.to_string(),
        e.distinct_ids.first().cloned(),
    )
    .with_context(serde_json::json!({
        "distinct_ids": e.distinct_ids,
        "person_deleted": e.person_deleted,
        "delete_events": e.events,
    }))
}

/// How many times a shared write locks again after a concurrent merge moved one of its
/// distinct ids (each retry follows a merge that completed, so this is never reached in
/// practice).
const MAX_LOCK_ATTEMPTS: usize = 8;

/// In-memory copies of persons, groups and group types for flag evaluation, so the common
/// `/flags` request needs no storage read. Persons are kept within a byte budget
/// ([`ResidentPersons`]); distinct ids read and found to have no person are remembered in a
/// bounded map. Every write through [`PersonStore`] updates them under the writer lock, so
/// they are never stale because of this process; writes of other nodes (records shared in a
/// cluster) drop what they changed when announced.
struct ReadCache {
    persons: ResidentPersons,
    /// Distinct ids read from storage and found to have no person (needed while
    /// `persons` is not complete).
    absent: StartOverMap<(u64, String), ()>,
    groups: StartOverMap<(u64, u8, String), Option<Arc<Group>>>,
    group_types: dashmap::DashMap<u64, Arc<Vec<(String, u8)>>>,
    /// Each project's erasure records and the sets readers hide by, with when they were read
    /// (re-read after [`ERASURES_KEPT_FOR`], so verified requests stop costing readers).
    erasures: dashmap::DashMap<u64, (std::time::Instant, Arc<ProjectErasures>)>,
    /// Counts other nodes' announced changes: a fill that read before one is not kept.
    remote_changes: AtomicU64,
    /// Counts persons this process erased: a page loaded before one is read again.
    removals: AtomicU64,
    /// Counts person writes of this process (puts, deletes, removals), each once it is
    /// written: a person read from storage while the count moved is read again (under the
    /// writer lock) before memory keeps it.
    writes: AtomicU64,
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
                    self.persons.invalidate(project, &did);
                    self.absent.remove(&(project, did));
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
                self.persons.remove_project(project);
                self.absent.retain(|(p, _), _| *p != project);
                self.groups.retain(|(p, _, _), _| *p != project);
                self.group_types.remove(&project);
                self.erasures.remove(&project);
            }
            None => {
                self.persons.clear();
                self.absent.start_over();
                self.groups.start_over();
                self.group_types.clear();
                self.erasures.clear();
            }
        }
    }

    fn new(person_budget: usize) -> ReadCache {
        ReadCache {
            persons: ResidentPersons::new(person_budget),
            absent: StartOverMap::new(READ_CACHE_ENTRIES),
            groups: StartOverMap::new(READ_CACHE_ENTRIES),
            group_types: dashmap::DashMap::new(),
            erasures: dashmap::DashMap::new(),
            remote_changes: AtomicU64::new(0),
            removals: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// The change count to compare against before keeping a fill.
    fn epoch(&self) -> u64 {
        self.remote_changes.load(Ordering::SeqCst)
    }
}

/// Entries the bounded maps of the read cache hold at most (groups, and distinct ids known to
/// have no person).
pub const READ_CACHE_ENTRIES: usize = 200_000;

/// Bytes of persons kept in memory when the owner names no budget (tests, tools).
pub const DEFAULT_PERSON_BUDGET: usize = 64 << 20;

/// Persons read per page (under the writer lock) while memory is loaded.
const LOAD_PAGE: usize = 1_000;

/// How long a project's erasures are used from memory before they are read again.
const ERASURES_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// What a write of `person` as a whole touches: each of its distinct ids, and the person.
fn touched_by(person: &Person) -> Vec<Touched> {
    person
        .distinct_ids
        .iter()
        .map(|d| Touched::DistinctId(d.clone()))
        .chain(std::iter::once(Touched::Person(person.id)))
        .collect()
}

/// What memory holds of the persons ([`PersonStore::memory`]), counted per distinct id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held (records and index).
    pub bytes: usize,
    /// Distinct ids whose person is in memory.
    pub held: usize,
    /// Distinct ids whose person is on disk only (memory knows they have one).
    pub on_disk: usize,
    /// Whether memory knows every distinct id that has a person (loaded, none forgotten).
    pub complete: bool,
    /// Persons `/flags` read from disk so far, and the batches they were read in.
    pub disk_reads: u64,
    pub disk_read_batches: u64,
}

/// What an erasure request asks for besides deleting the profile.
#[derive(Debug, Clone, Default)]
pub struct ErasureOptions {
    /// Erase the person's events captured before the request.
    pub delete_events: bool,
    /// Keep the person profile (only the events go).
    pub keep_person: bool,
    /// Who asked, for the activity list.
    pub requested_by: Option<String>,
}

/// How many persons `/flags` read from disk through batches (`disk_reads`), and in how many
/// batches.
#[derive(Default)]
pub(crate) struct DiskReadCounts {
    reads: AtomicU64,
    batches: AtomicU64,
}

impl DiskReadCounts {
    /// Counts one batch of `reads`.
    pub(crate) fn count_batch(&self, reads: usize) {
        self.reads.fetch_add(reads as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// `(reads, batches)` so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.reads.load(Ordering::Relaxed),
            self.batches.load(Ordering::Relaxed),
        )
    }
}

pub struct PersonStore {
    records: Arc<dyn PersonRecords>,
    cache: Arc<ReadCache>,
    /// Usage counted in memory until the next flush: `(project, month, kind)` → count.
    /// Hashed with aHash: every `/flags` request counts here, and ingest once a batch.
    pending_usage: dashmap::DashMap<(u64, UsageMonth, UsageKind), u64, ahash::RandomState>,
    writer: Mutex<()>,
    /// Persons read from disk through [`PersonStore::read_person`]'s batches.
    pub(crate) disk_reads: DiskReadCounts,
}

impl PersonStore {
    pub fn new(records: Arc<dyn PersonRecords>) -> PersonStore {
        PersonStore::with_budget(records, DEFAULT_PERSON_BUDGET)
    }

    /// Over `records`, keeping about `person_budget` bytes of persons in memory.
    pub fn with_budget(records: Arc<dyn PersonRecords>, person_budget: usize) -> PersonStore {
        let cache = Arc::new(ReadCache::new(person_budget));
        let changed = Arc::clone(&cache);
        records.watch(Arc::new(move |change| changed.forget(change)));
        PersonStore {
            records,
            cache,
            pending_usage: dashmap::DashMap::default(),
            writer: Mutex::new(()),
            disk_reads: DiskReadCounts::default(),
        }
    }

    /// Reads every stored person into memory (as far as the budget holds them; the rest keep
    /// a marker), a page at a time. A page is read without the writer lock, so writes and
    /// reads of persons not yet loaded go on meanwhile, and kept under it: a person written
    /// since is already in memory and is not replaced by the older read, and when an id was
    /// forgotten since (an erasure) the page is read again under the lock. Then memory
    /// answers "no person" for ids it has no entry for. Records other nodes also write are
    /// not loaded: memory stays a cache of them. Blocking; returns the persons read.
    pub fn load_resident(&self) -> Result<usize, StoreError> {
        if self.records.shared() {
            return Ok(0);
        }
        let mut after = None;
        let mut read = 0;
        loop {
            let removals = self.cache.removals.load(Ordering::SeqCst);
            let mut page = self.records.scan_persons(after, LOAD_PAGE)?;
            let _writer = self.lock();
            if self.cache.removals.load(Ordering::SeqCst) != removals {
                page = self.records.scan_persons(after, LOAD_PAGE)?;
            }
            let Some((project, last)) = page.last() else {
                self.cache.persons.set_complete();
                return Ok(read);
            };
            after = Some((*project, last.id));
            read += page.len();
            for (project, person) in &page {
                self.cache.persons.fill(*project, person);
            }
        }
    }

    /// What memory holds of the persons now.
    pub fn memory(&self) -> MemoryStats {
        let (held, on_disk) = self.cache.persons.counts();
        let (disk_reads, disk_read_batches) = self.disk_reads.get();
        MemoryStats {
            bytes: self.cache.persons.bytes(),
            held,
            on_disk,
            complete: self.cache.persons.is_complete(),
            disk_reads,
            disk_read_batches,
        }
    }

    /// Over the embedded records: the metadata store `db` and the person keyspaces `files`.
    pub fn open(db: &sled::Db, files: PersonFiles) -> Result<PersonStore, StoreError> {
        Ok(PersonStore::new(Arc::new(EmbeddedPersons::open(
            db, files,
        )?)))
    }

    /// The writer lock: hold it across a read-modify-write of persons or groups.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a read-modify-write of the persons and groups `touched` names while no other node
    /// sharing the records runs one that touches them. Take [`PersonStore::lock`] first.
    ///
    /// On shared records the persons of the named distinct ids are locked too (a `$set` on one
    /// distinct id and a merge through another of the same person take turns). They are read
    /// before locking and again under the locks: when a concurrent merge moved a distinct id
    /// meanwhile, the locks are released and taken again for the persons it now belongs to.
    pub fn exclusively<T>(
        &self,
        project_id: u64,
        mut touched: Vec<Touched>,
        work: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut work = Some(work);
        let mut out = None;
        if !self.records.shared() {
            self.records.exclusively(project_id, &touched, &mut || {
                if let Some(work) = work.take() {
                    out = Some(work()?);
                }
                Ok(())
            })?;
            return out.ok_or_else(|| StoreError::TaskFailed("person write did not run".into()));
        }
        let named: Vec<String> = touched
            .iter()
            .filter_map(|t| match t {
                Touched::DistinctId(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        let base = touched.len();
        for _ in 0..MAX_LOCK_ATTEMPTS {
            let persons = self.persons_of(project_id, &named)?;
            touched.truncate(base);
            touched.extend(persons.iter().map(|id| Touched::Person(*id)));
            self.records.exclusively(project_id, &touched, &mut || {
                if self.persons_of(project_id, &named)? != persons {
                    return Ok(());
                }
                if let Some(work) = work.take() {
                    out = Some(work()?);
                }
                Ok(())
            })?;
            if let Some(out) = out.take() {
                return Ok(out);
            }
        }
        Err(StoreError::TaskFailed(
            "the persons of this event kept moving; try again".into(),
        ))
    }

    /// The persons `distinct_ids` belong to in storage, sorted, without repeats.
    fn persons_of(
        &self,
        project_id: u64,
        distinct_ids: &[String],
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut out = Vec::new();
        for id in distinct_ids {
            if let Some(person) = self.records.person_id_by_distinct_id(project_id, id)? {
                out.push(person);
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.records.flush()
    }

    /// Waits until every person write so far is in the records (written behind, a write is
    /// accepted before it is made: [`crate::WriteBehind`]).
    pub fn settle(&self) -> Result<(), StoreError> {
        self.records.settle()
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

    /// The person of a distinct id for a read-modify-write (caller holds the writer lock).
    /// When only this process writes the records, every write went through the cache under
    /// the same lock, so a cached answer (also "no person") is current and storage is not
    /// read; records other nodes also write are always read.
    pub fn person_for_update(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Person>, StoreError> {
        if !self.records.shared() {
            if let Some(cached) = self.cached_person(project_id, distinct_id) {
                return Ok(cached.map(|person| Person::clone(&person)));
            }
        }
        self.person_by_distinct_id(project_id, distinct_id)
    }

    /// Writes a person and points all its distinct ids at it; returns the copy the read cache
    /// now holds. Caller holds the writer lock.
    pub fn put_person(&self, project_id: u64, person: Person) -> Result<Arc<Person>, StoreError> {
        self.write_person(project_id, person, NewIds::Any)
    }

    /// [`PersonStore::put_person`] for a read-modify-write that knows which of the person's
    /// distinct ids may not point at it yet: `new_ids` (the ids it added, or every id of a
    /// person it created). Storage then need not read the other ids' mappings.
    pub fn put_person_adding(
        &self,
        project_id: u64,
        person: Person,
        new_ids: Vec<String>,
    ) -> Result<Arc<Person>, StoreError> {
        self.write_person(project_id, person, NewIds::Only(new_ids))
    }

    fn write_person(
        &self,
        project_id: u64,
        person: Person,
        new_ids: NewIds,
    ) -> Result<Arc<Person>, StoreError> {
        let person = Arc::new(person);
        let write = PersonWrite::Put {
            project: project_id,
            person: Arc::clone(&person),
            new_ids,
        };
        // Counted once written (even when the write failed partway), so a reader that did
        // not see the count may have read the older record and reads again.
        let written = self.records.write_persons(std::slice::from_ref(&write));
        self.cache.writes.fetch_add(1, Ordering::SeqCst);
        written?;
        self.cache.persons.put(project_id, &person);
        for did in &person.distinct_ids {
            self.cache.absent.remove(&(project_id, did.clone()));
        }
        Ok(person)
    }

    /// Remembers that `distinct_id` has no person.
    fn cache_absent(&self, project_id: u64, distinct_id: &str) {
        self.cache.persons.remove(project_id, distinct_id);
        self.cache
            .absent
            .insert((project_id, distinct_id.to_string()), ());
    }

    /// The person of a distinct id from memory: `Some(None)` when known to have none, `None`
    /// when memory does not hold it (call [`PersonStore::load_person`] off the event loop).
    pub fn cached_person(&self, project_id: u64, distinct_id: &str) -> Option<Option<Arc<Person>>> {
        let lookup = self.cache.persons.get(project_id, distinct_id);
        self.known(project_id, distinct_id, lookup)
            .map(|person| person.map(Arc::new))
    }

    /// Like [`PersonStore::cached_person`], with only the properties whose key `wanted`
    /// accepts (for a reader that looks at a few keys, such as `/flags`; the person is not
    /// kept in this form).
    pub fn cached_person_reading(
        &self,
        project_id: u64,
        distinct_id: &str,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Option<Option<Arc<Person>>> {
        let lookup = self
            .cache
            .persons
            .get_reading(project_id, distinct_id, wanted);
        self.known(project_id, distinct_id, lookup)
            .map(|person| person.map(Arc::new))
    }

    /// Like [`PersonStore::cached_person`], with the person left in memory's compact form
    /// (decoded by [`PersonStore::decode`] when its properties are needed).
    pub fn cached_compact_person(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Option<Option<CompactPerson>> {
        let lookup = self.cache.persons.get_compact(project_id, distinct_id);
        self.known(project_id, distinct_id, lookup)
    }

    /// The person of a compact form [`PersonStore::cached_compact_person`] gave; `None` when
    /// its record is damaged (never written so: read the person from storage then).
    pub fn decode(&self, person: &CompactPerson) -> Option<Person> {
        self.cache.persons.decode(person)
    }

    /// What memory's `lookup` of a distinct id says, as [`PersonStore::cached_person`] does.
    fn known<P>(&self, project_id: u64, distinct_id: &str, lookup: Lookup<P>) -> Option<Option<P>> {
        match lookup {
            Lookup::Person(person) => Some(Some(person)),
            Lookup::Absent => Some(None),
            Lookup::OnDisk => None,
            Lookup::Unknown => self
                .cache
                .absent
                .get(&(project_id, distinct_id.to_string()))
                .map(|()| None),
        }
    }

    /// Reads a person from storage and caches the answer (also "no person"). The read takes
    /// no lock, so `/flags` requests for persons on disk read at once and never wait for
    /// ingest; the answer is kept under the writer lock, and read again there when this
    /// process wrote a person meanwhile (memory must never take an older copy over a write).
    pub fn load_person(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Arc<Person>>, StoreError> {
        if let Some(cached) = self.cached_person(project_id, distinct_id) {
            return Ok(cached);
        }
        let epoch = self.cache.epoch();
        let writes = self.cache.writes.load(Ordering::SeqCst);
        let mut person = self
            .person_by_distinct_id(project_id, distinct_id)?
            .map(Arc::new);
        let _writer = self.lock();
        if let Some(cached) = self.cached_person(project_id, distinct_id) {
            return Ok(cached);
        }
        if self.cache.writes.load(Ordering::SeqCst) != writes {
            person = self
                .person_by_distinct_id(project_id, distinct_id)?
                .map(Arc::new);
        }
        if self.cache.epoch() == epoch {
            match &person {
                Some(person) => self.cache.persons.fill(project_id, person),
                None => self.cache_absent(project_id, distinct_id),
            }
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
        self.cache
            .groups
            .insert((project_id, index, group_key.to_string()), group);
    }

    /// Deletes a person record (its distinct ids must already point elsewhere).
    pub fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError> {
        let deleted = self.records.delete_person(project_id, id);
        self.cache.writes.fetch_add(1, Ordering::SeqCst);
        deleted
    }

    /// `project_id`'s erasure records and the sets readers hide events by. From memory when
    /// read within the last minute and only this process writes the records; records other
    /// nodes share are read every time, so a request made on any node is honoured by the very
    /// next read here (an announcement could arrive after it).
    pub fn erasures(&self, project_id: u64) -> Result<Arc<ProjectErasures>, StoreError> {
        if self.records.shared() {
            return Ok(Arc::new(ProjectErasures::new(
                self.records.erasures(Some(project_id))?,
                Utc::now(),
            )));
        }
        if let Some(entry) = self.cache.erasures.get(&project_id) {
            if entry.0.elapsed() < ERASURES_KEPT_FOR {
                return Ok(Arc::clone(&entry.1));
            }
        }
        let epoch = self.cache.epoch();
        let loaded = Arc::new(ProjectErasures::new(
            self.records.erasures(Some(project_id))?,
            Utc::now(),
        ));
        if self.cache.epoch() == epoch {
            self.cache
                .erasures
                .insert(project_id, (std::time::Instant::now(), Arc::clone(&loaded)));
        }
        Ok(loaded)
    }

    /// `project_id`'s erasures when memory holds a recent copy (never reads storage; never
    /// for records other nodes share).
    pub fn cached_erasures(&self, project_id: u64) -> Option<Arc<ProjectErasures>> {
        if self.records.shared() {
            return None;
        }
        let entry = self.cache.erasures.get(&project_id)?;
        (entry.0.elapsed() < ERASURES_KEPT_FOR).then(|| Arc::clone(&entry.1))
    }

    /// Every project's erasure records.
    pub fn all_erasures(&self) -> Result<Vec<Erasure>, StoreError> {
        self.records.erasures(None)
    }

    /// Stores changed erasure records (the compactor's progress) and drops the project's copy.
    pub fn update_erasures(&self, project_id: u64, erasures: &[Erasure]) -> Result<(), StoreError> {
        self.records.put_erasures(project_id, erasures, &[])?;
        self.cache.erasures.remove(&project_id);
        Ok(())
    }

    /// Deletes erasure records requested before `before`.
    pub fn expire_erasures(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        let n = self.records.expire_erasures(before)?;
        self.cache.erasures.clear();
        Ok(n)
    }

    /// Erases `person` as `options` say, at `now`: the request is recorded first (readers
    /// hide the events it covers from then on), then the profile and its distinct ids are
    /// deleted. The request commits with its activity entry, as `actor`'s. Reads the person
    /// again under the writer lock (a merge may have moved ids); `None` when it is gone
    /// already.
    pub fn erase(
        &self,
        project_id: u64,
        person: Uuid,
        options: &ErasureOptions,
        actor: &Actor,
        now: DateTime<Utc>,
    ) -> Result<Option<Erasure>, StoreError> {
        let _writer = self.lock();
        let Some(found) = self.person(project_id, person)? else {
            return Ok(None);
        };
        self.exclusively(project_id, touched_by(&found), || {
            let Some(current) = self.person(project_id, person)? else {
                return Ok(None);
            };
            let erasure = Erasure {
                id: Uuid::new_v4(),
                project_id,
                person_uuid: current.id,
                distinct_ids: current.distinct_ids.clone(),
                requested_at: now,
                requested_by: options.requested_by.clone(),
                person_deleted: !options.keep_person,
                events: options.delete_events,
                verified_at: None,
                events_removed: 0,
            };
            let entry = erasure_entry(actor, &erasure);
            self.records
                .put_erasures(project_id, std::slice::from_ref(&erasure), &[entry])?;
            self.cache.erasures.remove(&project_id);
            if !options.keep_person {
                let removed = self.records.remove_person(project_id, &current);
                self.cache.writes.fetch_add(1, Ordering::SeqCst);
                removed?;
                self.cache.removals.fetch_add(1, Ordering::SeqCst);
                for did in &current.distinct_ids {
                    self.cache_absent(project_id, did);
                }
            }
            Ok(Some(erasure))
        })
    }

    /// Removes `key` from a person's properties (PostHog's `$unset` through
    /// `delete_property`); false when the person does not exist.
    pub fn unset_property(
        &self,
        project_id: u64,
        person: Uuid,
        key: &str,
    ) -> Result<bool, StoreError> {
        let _writer = self.lock();
        let Some(found) = self.person(project_id, person)? else {
            return Ok(false);
        };
        self.exclusively(project_id, touched_by(&found), || {
            let Some(mut current) = self.person(project_id, person)? else {
                return Ok(false);
            };
            if current.properties.remove(key).is_some() {
                current.version += 1;
                self.put_person(project_id, current)?;
                // No WAL holds this write: it is made before the request is answered.
                self.settle()?;
            }
            Ok(true)
        })
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

    /// Adds `n` to a usage counter of the month containing `at`, in memory (no storage write
    /// on the request or ingest path); [`PersonStore::flush_pending_usage`] writes it.
    pub fn count_usage(&self, project_id: u64, at: DateTime<Utc>, kind: UsageKind, n: u64) {
        if n == 0 {
            return;
        }
        *self
            .pending_usage
            .entry((project_id, UsageMonth::of(at), kind))
            .or_insert(0) += n;
    }

    /// Counts one `/flags` request in memory; see [`PersonStore::flush_pending_usage`].
    pub fn count_flag_request(&self, project_id: u64, at: DateTime<Utc>) {
        self.count_usage(project_id, at, UsageKind::FlagRequests, 1);
    }

    /// Writes the usage counted in memory to storage. Called every second, by each ingest
    /// flush before its checkpoint moves (so the counts of events the WAL may forget are
    /// stored), and on shutdown; a crash loses at most the flag requests since the last flush
    /// (events are counted again when the WAL is replayed).
    pub fn flush_pending_usage(&self) -> Result<(), StoreError> {
        let keys: Vec<(u64, UsageMonth, UsageKind)> =
            self.pending_usage.iter().map(|e| *e.key()).collect();
        for key in keys {
            let Some((_, count)) = self.pending_usage.remove(&key) else {
                continue;
            };
            let (project_id, month, kind) = key;
            if let Err(err) = self
                .records
                .add_usage(project_id, month.first_instant(), kind, count)
            {
                // Put the count back so the next flush retries it.
                *self.pending_usage.entry(key).or_insert(0) += count;
                return Err(err);
            }
        }
        Ok(())
    }

    /// Usage by month, oldest first (including counts not yet flushed).
    pub fn usage(&self, project_id: u64) -> Result<Vec<UsageRow>, StoreError> {
        let mut rows = self.records.usage(project_id)?;
        for entry in self.pending_usage.iter() {
            let (project, month, kind) = *entry.key();
            if project != project_id {
                continue;
            }
            let month = month.to_string();
            let row = match rows.iter().position(|r| r.month == month) {
                Some(i) => &mut rows[i],
                None => {
                    rows.push(UsageRow {
                        month,
                        ..UsageRow::default()
                    });
                    let last = rows.len() - 1;
                    &mut rows[last]
                }
            };
            *row.count_mut(kind) += *entry.value();
        }
        rows.sort_by(|a, b| a.month.cmp(&b.month));
        Ok(rows)
    }

    /// The number of group types in use by the project (for flag validation).
    pub fn group_type_count(&self, project_id: u64) -> Result<usize, StoreError> {
        Ok(self.group_types(project_id)?.len())
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::Map;

    use super::*;

    fn store() -> (PersonFiles, sled::Db, PersonStore) {
        let files = PersonFiles::temporary();
        let db = sled::Config::new().temporary(true).open().expect("sled");
        let store = PersonStore::open(&db, files.clone()).expect("store");
        (files, db, store)
    }

    #[test]
    fn usage_counted_in_memory_is_read_at_once_and_stored_by_a_flush() {
        let (files, db, store) = store();
        let jan = Utc.with_ymd_and_hms(2026, 1, 31, 23, 0, 0).unwrap();
        let feb = Utc.with_ymd_and_hms(2026, 2, 1, 0, 30, 0).unwrap();
        store.count_usage(7, jan, UsageKind::BillableEvents, 3);
        store.count_usage(7, jan, UsageKind::BillableEvents, 2);
        store.count_usage(7, feb, UsageKind::HistoricalEvents, 4);
        store.count_flag_request(7, feb);
        store.count_usage(8, jan, UsageKind::BillableEvents, 9);

        let expected = vec![
            UsageRow {
                month: "2026-01".into(),
                billable_events: 5,
                ..UsageRow::default()
            },
            UsageRow {
                month: "2026-02".into(),
                historical_events: 4,
                flag_requests: 1,
                ..UsageRow::default()
            },
        ];
        assert_eq!(store.usage(7).expect("usage"), expected);
        let stored = EmbeddedPersons::open(&db, files.clone()).expect("records");
        assert!(
            stored.usage(7).expect("stored").is_empty(),
            "nothing written yet"
        );

        store.flush_pending_usage().expect("flush");
        assert_eq!(stored.usage(7).expect("stored"), expected);
        assert_eq!(
            store.usage(7).expect("usage"),
            expected,
            "not counted twice"
        );

        store.count_usage(7, jan, UsageKind::BillableEvents, 1);
        assert_eq!(store.usage(7).expect("usage")[0].billable_events, 6);
        assert_eq!(store.usage(8).expect("usage")[0].billable_events, 9);
    }

    #[test]
    fn a_person_written_through_the_store_is_what_the_next_update_starts_from() {
        let (files, db, store) = store();
        let _writer = store.lock();
        assert_eq!(store.person_for_update(1, "a").expect("read"), None);
        let person = Person {
            id: Uuid::new_v4(),
            created_at: Utc::now(),
            properties: Map::new(),
            is_identified: false,
            version: 1,
            distinct_ids: vec!["a".into(), "b".into()],
        };
        let shared = store.put_person(1, person.clone()).expect("put");
        assert_eq!(*shared, person);
        for did in ["a", "b"] {
            assert_eq!(
                store.person_for_update(1, did).expect("read"),
                Some(person.clone())
            );
        }
        // A store opened later over the same records reads them from storage.
        let reopened = PersonStore::open(&db, files.clone()).expect("store");
        assert_eq!(
            reopened.person_for_update(1, "b").expect("read"),
            Some(person)
        );
        assert_eq!(store.person_for_update(2, "a").expect("read"), None);
    }

    #[test]
    fn persons_loaded_at_start_are_read_from_memory_and_strangers_have_none() {
        let (files, db, store) = store();
        let person = |ids: &[&str], plan: &str| Person {
            id: Uuid::new_v4(),
            created_at: Utc::now(),
            properties: serde_json::json!({ "plan": plan })
                .as_object()
                .cloned()
                .unwrap_or_default(),
            is_identified: true,
            version: 1,
            distinct_ids: ids.iter().map(|d| d.to_string()).collect(),
        };
        let stored: Vec<(u64, Person)> = (0..2_500)
            .map(|k| (k % 3, person(&[&format!("u{k}")], "pro")))
            .collect();
        {
            let _writer = store.lock();
            for (project, p) in &stored {
                store.put_person(*project, p.clone()).expect("put");
            }
        }
        let restarted = PersonStore::open(&db, files.clone()).expect("store");
        assert_eq!(
            restarted.cached_person(0, "stranger"),
            None,
            "before loading, memory does not know"
        );
        assert_eq!(restarted.load_resident().expect("load"), stored.len());
        for (project, p) in &stored {
            let did = &p.distinct_ids[0];
            assert_eq!(
                restarted.cached_person(*project, did),
                Some(Some(Arc::new(p.clone())))
            );
            assert_eq!(restarted.cached_person(project + 1, did).flatten(), None);
        }
        assert_eq!(restarted.cached_person(0, "stranger"), Some(None));

        // Writes keep memory current: a new person, and an erased one.
        let _writer = restarted.lock();
        let new = person(&["fresh"], "free");
        restarted.put_person(0, new.clone()).expect("put");
        assert_eq!(
            restarted.cached_person(0, "fresh"),
            Some(Some(Arc::new(new)))
        );
        drop(_writer);
        let (project, gone) = &stored[0];
        restarted
            .erase(
                *project,
                gone.id,
                &ErasureOptions::default(),
                &Actor::system(),
                Utc::now(),
            )
            .expect("erase");
        assert_eq!(
            restarted.cached_person(*project, &gone.distinct_ids[0]),
            Some(None)
        );
    }
}
