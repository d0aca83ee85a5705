//! Flag and cohort definitions in sled, and the per-project in-memory snapshots evaluation
//! reads. Writes go through [`FlagStore`], which rebuilds the project's snapshot, so a change
//! reaches `/flags` as soon as the write returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::Utc;
use dashmap::DashMap;

use super::coverage::{PersonKeys, ReadKeys};
use super::evaluation::EvaluationPlan;
use super::model::{Cohorts, FlagDefinition, StaticMembers};
use super::records::{FlagRecords, SledFlags};
use super::request::Selection;
use super::v2_entry::V2Entry;
use corvid_activity::{ActivityEntry, Actor, Recorded};
use corvid_kernel::StoreError;

pub use super::records::{CohortRecord, FlagRecord};

/// What evaluation reads for one project: immutable, swapped whole on every change. Built
/// only by [`ProjectFlags::new`], so the derived parts always match `flags`.
#[derive(Debug)]
pub struct ProjectFlags {
    /// Active, non-deleted flags, in id order.
    pub flags: Vec<FlagDefinition>,
    pub cohorts: Cohorts,
    /// distinct id → static cohorts containing it.
    pub static_members: StaticMembers,
    /// Dependency order of `flags`, computed once per snapshot.
    pub plan: EvaluationPlan,
    /// Indexes of `flags` sorted by key: the order responses list flags in.
    pub by_key: Vec<usize>,
    /// Per flag (same index as `flags`), its `/flags?v=2` entry's fixed JSON and whole entries
    /// for common outcomes, so the hot path copies them instead of escaping and formatting
    /// them on every request.
    pub v2_entries: Vec<V2Entry>,
    /// The person and group property keys the flags read, when a request that sends them all
    /// needs no stored person or group (see [`super::coverage`]).
    pub read_keys: Option<ReadKeys>,
    /// Every person property key the flags may read: the stored person's properties decoded
    /// for a request.
    pub person_keys: PersonKeys,
    /// Per flag (same index as `flags`), what choosing it for a request reads.
    pub selection: Vec<Selection>,
}

impl ProjectFlags {
    /// Compiles a snapshot: dependency plan, response order and response fragments.
    pub fn new(
        flags: Vec<FlagDefinition>,
        cohorts: Cohorts,
        static_members: StaticMembers,
    ) -> ProjectFlags {
        let plan = EvaluationPlan::new(&flags.iter().collect::<Vec<_>>());
        let mut by_key: Vec<usize> = (0..flags.len()).collect();
        by_key.sort_by(|&a, &b| flags[a].key.cmp(&flags[b].key));
        let v2_entries = flags.iter().map(V2Entry::new).collect();
        let read_keys = super::coverage::read_keys(&flags, &cohorts, &static_members);
        let person_keys = super::coverage::person_keys(&flags, &cohorts);
        let selection = flags.iter().map(Selection::of).collect();
        ProjectFlags {
            read_keys,
            person_keys,
            selection,
            flags,
            cohorts,
            static_members,
            plan,
            by_key,
            v2_entries,
        }
    }
}

/// How a flag write is logged: by whom, and for a revert, what it undid.
struct Logged<'a> {
    actor: &'a Actor,
    revert: Option<serde_json::Value>,
}

/// The activity entry of a flag change (`before` is `None` for a creation), keeping the whole
/// flag after the change and its version; `None` when no recorded field changed.
fn flag_entry(
    project_id: u64,
    how: &Logged<'_>,
    before: Option<&FlagDefinition>,
    after: &FlagDefinition,
) -> Option<ActivityEntry> {
    let json = |d: &FlagDefinition| serde_json::to_value(d).unwrap_or_default();
    let after_json = json(after);
    let entry = Recorded {
        project_id,
        actor: how.actor,
        scope: "FeatureFlag",
        item_id: after.id.to_string(),
        name: Some(after.key.clone()),
        before: before.map(json).as_ref(),
        after: &after_json,
    }
    .entry()?
    .keeping(after_json, after.version);
    Some(match &how.revert {
        Some(context) => {
            let mut entry = entry.with_context(context.clone());
            entry.activity = "reverted".into();
            entry
        }
        None => entry,
    })
}

/// A cohort as its activity entries show it: the definition, and a static cohort's member
/// count (not the members).
fn cohort_json(c: &CohortRecord) -> serde_json::Value {
    let mut v = serde_json::to_value(&c.definition).unwrap_or_default();
    if let Some(map) = v.as_object_mut() {
        map.insert("deleted".into(), c.deleted.into());
        if c.definition.is_static {
            map.insert("count".into(), c.static_distinct_ids.len().into());
        }
    }
    v
}

/// Flag and cohort definitions with their rules (versions count every write), and the
/// per-project in-memory snapshots evaluation reads. Records live behind [`FlagRecords`],
/// which keeps live keys unique and makes each update exclusive, for writers on every node.
pub struct FlagStore {
    records: Arc<dyn FlagRecords>,
    snapshots: Arc<DashMap<u64, Arc<ProjectFlags>>>,
    /// Counts changes announced by other nodes: a refresh that read the records before one
    /// does not keep its (possibly stale) snapshot.
    remote_changes: Arc<AtomicU64>,
    /// How many times each project's snapshot was built: 1 on first use, +1 per change.
    snapshot_versions: DashMap<u64, u64>,
}

impl FlagStore {
    pub fn new(records: Arc<dyn FlagRecords>) -> FlagStore {
        let snapshots: Arc<DashMap<u64, Arc<ProjectFlags>>> = Arc::new(DashMap::new());
        let remote_changes = Arc::new(AtomicU64::new(0));
        let (dropped, changes) = (Arc::clone(&snapshots), Arc::clone(&remote_changes));
        records.watch(Arc::new(move |project| {
            changes.fetch_add(1, Ordering::SeqCst);
            match project {
                Some(p) => {
                    dropped.remove(&p);
                }
                None => dropped.clear(),
            }
        }));
        FlagStore {
            records,
            snapshots,
            remote_changes,
            snapshot_versions: DashMap::new(),
        }
    }

    /// Over the embedded records in `db`.
    pub fn open(db: &sled::Db) -> Result<FlagStore, StoreError> {
        Ok(FlagStore::new(Arc::new(SledFlags::open(db)?)))
    }

    /// All flags of a project, deleted ones included.
    pub fn flags(&self, project_id: u64) -> Result<Vec<FlagRecord>, StoreError> {
        self.records.flags(project_id)
    }

    pub fn flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError> {
        self.records.flag(project_id, id)
    }
    /// The live (not deleted) flag with this key.
    pub fn live_flag_by_key(
        &self,
        project_id: u64,
        flag_key: &str,
    ) -> Result<Option<FlagRecord>, StoreError> {
        Ok(self
            .flags(project_id)?
            .into_iter()
            .find(|f| !f.definition.deleted && f.definition.key == flag_key))
    }

    /// The live flag with this id.
    pub fn live_flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError> {
        Ok(self.flag(project_id, id)?.filter(|f| !f.definition.deleted))
    }

    /// Applies `change` to a live flag and stores it (a new version) when `check` accepts the
    /// result, logged as `actor`'s. `None` when the flag is gone; the change is skipped (no new
    /// version) when it leaves the definition as it was.
    pub fn modify_flag(
        &self,
        project_id: u64,
        id: i64,
        actor: &Actor,
        change: impl FnOnce(&mut FlagDefinition),
        check: impl Fn(&FlagDefinition) -> Result<(), StoreError>,
    ) -> Result<Option<FlagRecord>, StoreError> {
        let mut change = Some(change);
        let how = Logged {
            actor,
            revert: None,
        };
        self.rewrite(project_id, id, true, &how, &mut |definition| {
            if let Some(change) = change.take() {
                change(definition);
            }
            check(definition)
        })
    }

    /// An update of a live flag (PostHog's PATCH): `change` edits the stored definition (an
    /// error aborts), and the result is stored with the next version even when nothing
    /// changed. Exclusive against every other writer on any node, so concurrent updates each
    /// count. `None` when the flag is gone (or deleted). Logged as `actor`'s, in the write.
    pub fn update_flag(
        &self,
        project_id: u64,
        id: i64,
        actor: &Actor,
        mut change: impl FnMut(&mut FlagDefinition) -> Result<(), StoreError>,
    ) -> Result<Option<FlagRecord>, StoreError> {
        let how = Logged {
            actor,
            revert: None,
        };
        self.rewrite(project_id, id, false, &how, &mut change)
    }

    /// Puts a live flag back to `restored` (an earlier version's definition), as the next
    /// version; logged as a `reverted` activity with `context` (which change it undid).
    pub fn restore_flag(
        &self,
        project_id: u64,
        id: i64,
        actor: &Actor,
        restored: FlagDefinition,
        context: serde_json::Value,
        check: impl Fn(&FlagDefinition) -> Result<(), StoreError>,
    ) -> Result<Option<FlagRecord>, StoreError> {
        let how = Logged {
            actor,
            revert: Some(context),
        };
        self.rewrite(project_id, id, false, &how, &mut |definition| {
            *definition = restored.clone();
            check(definition)
        })
    }

    /// Read-modify-write of a live flag through the records' exclusive update; with
    /// `skip_unchanged`, a definition `change` left as it was is not written. The activity
    /// entry is written with the flag.
    fn rewrite(
        &self,
        project_id: u64,
        id: i64,
        skip_unchanged: bool,
        how: &Logged<'_>,
        change: &mut dyn FnMut(&mut FlagDefinition) -> Result<(), StoreError>,
    ) -> Result<Option<FlagRecord>, StoreError> {
        let mut live = true;
        let record = self.records.update_flag(project_id, id, &mut |record| {
            if record.definition.deleted {
                live = false;
                return Ok(None);
            }
            let mut definition = record.definition.clone();
            change(&mut definition)?;
            definition.id = record.definition.id;
            if skip_unchanged && definition == record.definition {
                return Ok(None);
            }
            definition.version = record.definition.version.saturating_add(1);
            let entry = flag_entry(project_id, how, Some(&record.definition), &definition);
            record.definition = definition;
            record.updated_at = Utc::now();
            Ok(Some(entry.into_iter().collect()))
        })?;
        if record.is_some() && live {
            self.refresh(project_id)?;
        }
        Ok(record.filter(|_| live))
    }

    /// Inserts a new flag, assigning its id and version 1, logged as `actor`'s. A live flag
    /// of the project with the same key makes it fail with
    /// [`key_taken`](super::records::key_taken), checked by the store for every writer on
    /// every node.
    pub fn create_flag(
        &self,
        project_id: u64,
        actor: &Actor,
        mut definition: FlagDefinition,
    ) -> Result<FlagRecord, StoreError> {
        let now = Utc::now();
        definition.id = self.records.next_flag_id()?;
        definition.version = 1;
        let how = Logged {
            actor,
            revert: None,
        };
        let entry = flag_entry(project_id, &how, None, &definition);
        let record = FlagRecord {
            definition,
            project_id,
            created_at: now,
            updated_at: now,
        };
        self.records
            .create_flag(&record, &entry.into_iter().collect::<Vec<_>>())?;
        self.refresh(project_id)?;
        Ok(record)
    }

    pub fn cohorts(&self, project_id: u64) -> Result<Vec<CohortRecord>, StoreError> {
        self.records.cohorts(project_id)
    }

    pub fn cohort(&self, project_id: u64, id: i64) -> Result<Option<CohortRecord>, StoreError> {
        self.records.cohort(project_id, id)
    }

    /// Inserts (id 0) or replaces a cohort, logged as `actor`'s in the same write.
    pub fn save_cohort(
        &self,
        project_id: u64,
        actor: &Actor,
        mut record: CohortRecord,
    ) -> Result<CohortRecord, StoreError> {
        let before = if record.definition.id == 0 {
            record.definition.id = self.records.next_cohort_id()?;
            None
        } else {
            self.records.cohort(project_id, record.definition.id)?
        };
        record.project_id = project_id;
        let entry = Recorded {
            project_id,
            actor,
            scope: "Cohort",
            item_id: record.definition.id.to_string(),
            name: Some(record.definition.name.clone()),
            before: before.as_ref().map(cohort_json).as_ref(),
            after: &cohort_json(&record),
        }
        .entry();
        self.records
            .put_cohort(&record, &entry.into_iter().collect::<Vec<_>>())?;
        self.refresh(project_id)?;
        Ok(record)
    }

    /// The project's snapshot when it is already in memory (no sled read; safe on the event
    /// loop). `None`: call [`FlagStore::snapshot`] off the event loop.
    pub fn cached_snapshot(&self, project_id: u64) -> Option<Arc<ProjectFlags>> {
        self.snapshots.get(&project_id).map(|s| Arc::clone(&s))
    }

    /// The project's evaluation snapshot (built on first use).
    pub fn snapshot(&self, project_id: u64) -> Result<Arc<ProjectFlags>, StoreError> {
        if let Some(s) = self.snapshots.get(&project_id) {
            return Ok(Arc::clone(&s));
        }
        self.refresh(project_id)
    }

    /// Rebuilds and swaps in the project's snapshot.
    pub fn refresh(&self, project_id: u64) -> Result<Arc<ProjectFlags>, StoreError> {
        let seen = self.remote_changes.load(Ordering::SeqCst);
        let mut flags: Vec<FlagDefinition> = self
            .flags(project_id)?
            .into_iter()
            .map(|r| r.definition)
            .filter(|f| !f.deleted)
            .collect();
        flags.sort_by_key(|f| f.id);
        let mut cohorts = Cohorts::default();
        let mut static_members = StaticMembers::default();
        for c in self.cohorts(project_id)?.into_iter().filter(|c| !c.deleted) {
            for did in &c.static_distinct_ids {
                static_members
                    .entry(did.clone())
                    .or_default()
                    .push(c.definition.id);
            }
            cohorts.insert(c.definition.id, c.definition);
        }
        let snapshot = Arc::new(ProjectFlags::new(flags, cohorts, static_members));
        self.snapshots.insert(project_id, Arc::clone(&snapshot));
        if self.remote_changes.load(Ordering::SeqCst) != seen {
            // Another node changed something while this one read: serve what was read this
            // once, but rebuild on the next request.
            self.snapshots.remove(&project_id);
        }
        *self.snapshot_versions.entry(project_id).or_insert(0) += 1;
        Ok(snapshot)
    }

    /// `(project, snapshot version)` of every project whose flags are in memory.
    pub fn snapshot_versions(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .snapshot_versions
            .iter()
            .map(|e| (*e.key(), *e.value()))
            .collect();
        out.sort_unstable();
        out
    }
}
