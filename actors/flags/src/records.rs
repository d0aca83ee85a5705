//! Where flag and cohort definitions live.
//!
//! [`FlagRecords`] is the storage trait ([`SledFlags`] in the embedded default; every
//! implementation passes [`contract::suite`]). The rules (live key uniqueness, versions) and
//! the in-memory evaluation snapshots are [`super::store::FlagStore`]'s.

use std::sync::{Arc, Mutex, MutexGuard};

use sled::Transactional;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::model::{CohortDefinition, FlagDefinition};
use corvid_activity::{stage, ActivityEntry};
use corvid_kernel::codec::{encode, get, scan_prefix};
use corvid_kernel::StoreError;

/// A stored flag: the definition plus bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlagRecord {
    #[serde(flatten)]
    pub definition: FlagDefinition,
    pub project_id: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl FlagRecord {
    /// The short form other resources embed (PostHog's `MinimalFeatureFlagSerializer`).
    pub fn summary(&self) -> serde_json::Value {
        let d = &self.definition;
        serde_json::json!({
            "id": d.id,
            "team_id": self.project_id,
            "key": d.key,
            "name": d.name,
            "filters": d.filters,
            "active": d.active,
            "deleted": d.deleted,
            "version": d.version,
        })
    }
}

/// A stored cohort; static cohorts keep their members' distinct ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortRecord {
    #[serde(flatten)]
    pub definition: CohortDefinition,
    pub project_id: u64,
    #[serde(default)]
    pub static_distinct_ids: Vec<String>,
    #[serde(default)]
    pub deleted: bool,
    pub created_at: DateTime<Utc>,
}

/// A read-modify-write of one flag: `None` leaves it as it was; otherwise the activity-log
/// entries to write with it.
pub type FlagChange<'a> =
    dyn FnMut(&mut FlagRecord) -> Result<Option<Vec<ActivityEntry>>, StoreError> + 'a;

/// Flags and cohorts by project and id. Writes are durable when they return, and each writes
/// the activity-log entries it is given in the same transaction.
pub trait FlagRecords: Send + Sync {
    /// A new flag id, never handed out before.
    fn next_flag_id(&self) -> Result<i64, StoreError>;
    /// A new cohort id, never handed out before.
    fn next_cohort_id(&self) -> Result<i64, StoreError>;
    /// All flags of a project (deleted ones included), by id.
    fn flags(&self, project_id: u64) -> Result<Vec<FlagRecord>, StoreError>;
    fn flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError>;
    /// Stores a new flag. Concurrent writers, on any node: a live (not deleted) flag's key is
    /// unique in its project, so of two creates of one key exactly one succeeds; the other
    /// gets [`key_taken`].
    fn create_flag(&self, record: &FlagRecord, log: &[ActivityEntry]) -> Result<(), StoreError>;
    /// Read-modify-write of one flag, exclusive against every other writer of it on any node:
    /// `change` is called once with the stored record and answers `None` to leave it as it
    /// was, or the activity-log entries to write with it (an error aborts the update). No
    /// update is lost, so a version bumped inside `change` counts every write. A change that
    /// gives a live flag the key of another live flag gets [`key_taken`]. The record as it now
    /// is, or `None` when there is no such flag.
    fn update_flag(
        &self,
        project_id: u64,
        id: i64,
        change: &mut FlagChange<'_>,
    ) -> Result<Option<FlagRecord>, StoreError>;
    /// All cohorts of a project (deleted ones included), by id.
    fn cohorts(&self, project_id: u64) -> Result<Vec<CohortRecord>, StoreError>;
    fn cohort(&self, project_id: u64, id: i64) -> Result<Option<CohortRecord>, StoreError>;
    /// Inserts or replaces the cohort `record.definition.id` of `record.project_id`.
    fn put_cohort(&self, record: &CohortRecord, log: &[ActivityEntry]) -> Result<(), StoreError>;
    /// Calls `on_change` when another process changes a project's flags or cohorts (`None`:
    /// any project's may have changed), so in-memory snapshots can be dropped. A store only
    /// this process writes (the embedded one) never calls it: the [`FlagStore`] that wrote
    /// already refreshed its snapshot.
    ///
    /// [`FlagStore`]: super::store::FlagStore
    fn watch(&self, on_change: Arc<dyn Fn(Option<u64>) + Send + Sync>) {
        let _ = on_change;
    }
}

/// The error a write gets when a live flag of the project already has its key (PostHog's
/// text, on the `key` attribute).
pub fn key_taken(key: &str) -> StoreError {
    StoreError::invalid(
        format!("There is already a feature flag with the key `{key}`."),
        "key",
    )
}

/// Whether `record` is live and holds the key another live flag of `others` holds.
fn clashes(record: &FlagRecord, others: &[FlagRecord]) -> bool {
    !record.definition.deleted
        && others.iter().any(|f| {
            !f.definition.deleted
                && f.definition.key == record.definition.key
                && f.definition.id != record.definition.id
        })
}

fn key(project_id: u64, id: i64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&project_id.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The embedded flag records (sled). Only this process opens the database, so one lock per
/// handle makes each create's key check and each read-modify-write one step.
pub struct SledFlags {
    db: sled::Db,
    flags: sled::Tree,
    cohorts: sled::Tree,
    sequences: sled::Tree,
    activity: sled::Tree,
    write: Mutex<()>,
}

impl SledFlags {
    pub fn open(db: &sled::Db) -> Result<SledFlags, StoreError> {
        Ok(SledFlags {
            flags: db.open_tree("feature_flags")?,
            cohorts: db.open_tree("cohorts")?,
            sequences: db.open_tree("flag_sequences")?,
            activity: db.open_tree(corvid_activity::TREE)?,
            db: db.clone(),
            write: Mutex::new(()),
        })
    }

    /// A panic while holding it leaves nothing half-done: the guarded data is `()`.
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `value` at `key` of `tree` and the entries to the activity log, in one sled
    /// transaction, then flushes.
    fn write_logged(
        &self,
        tree: &sled::Tree,
        key: [u8; 16],
        value: Vec<u8>,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        (tree, &self.activity).transaction(|(records, activity)| {
            records.insert(&key[..], value.clone())?;
            for entry in log {
                stage(activity, entry)?;
            }
            Ok(())
        })?;
        self.db.flush()?;
        Ok(())
    }

    fn write_flag(&self, record: &FlagRecord, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let k = key(record.project_id, record.definition.id);
        self.write_logged(&self.flags, k, encode(record)?, log)
    }

    fn next_id(&self, name: &str) -> Result<i64, StoreError> {
        let id = corvid_kernel::sequence::next(&self.sequences, name)?;
        i64::try_from(id).map_err(|_| StoreError::Sequence { name: name.into() })
    }
}

impl FlagRecords for SledFlags {
    fn next_flag_id(&self) -> Result<i64, StoreError> {
        self.next_id("flags")
    }

    fn next_cohort_id(&self) -> Result<i64, StoreError> {
        self.next_id("cohorts")
    }

    fn flags(&self, project_id: u64) -> Result<Vec<FlagRecord>, StoreError> {
        scan_prefix(&self.flags, "feature_flags", project_id.to_be_bytes())
    }

    fn flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError> {
        get(&self.flags, "feature_flags", &key(project_id, id))
    }

    fn create_flag(&self, record: &FlagRecord, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let _write = self.lock();
        if clashes(record, &self.flags(record.project_id)?) {
            return Err(key_taken(&record.definition.key));
        }
        self.write_flag(record, log)
    }

    fn update_flag(
        &self,
        project_id: u64,
        id: i64,
        change: &mut FlagChange<'_>,
    ) -> Result<Option<FlagRecord>, StoreError> {
        let _write = self.lock();
        let Some(mut record) = self.flag(project_id, id)? else {
            return Ok(None);
        };
        let stored = record.clone();
        let Some(log) = change(&mut record)? else {
            return Ok(Some(stored));
        };
        let may_clash = record.definition.key != stored.definition.key || stored.definition.deleted;
        if may_clash && clashes(&record, &self.flags(project_id)?) {
            return Err(key_taken(&record.definition.key));
        }
        self.write_flag(&record, &log)?;
        Ok(Some(record))
    }

    fn cohorts(&self, project_id: u64) -> Result<Vec<CohortRecord>, StoreError> {
        scan_prefix(&self.cohorts, "cohorts", project_id.to_be_bytes())
    }

    fn cohort(&self, project_id: u64, id: i64) -> Result<Option<CohortRecord>, StoreError> {
        get(&self.cohorts, "cohorts", &key(project_id, id))
    }

    fn put_cohort(&self, record: &CohortRecord, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let k = key(record.project_id, record.definition.id);
        self.write_logged(&self.cohorts, k, encode(record)?, log)
    }
}

/// The behaviour every [`FlagRecords`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use chrono::Utc;
    use corvid_activity::{ActivityQuery, ActivityRecords, Actor, SledActivity};
    use serde_json::json;

    use super::*;

    fn flag(project_id: u64, id: i64, key: &str) -> FlagRecord {
        FlagRecord {
            definition: serde_json::from_value(json!({"id": id, "key": key, "version": 1}))
                .expect("a minimal flag"),
            project_id,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }
    }

    fn cohort(project_id: u64, id: i64) -> CohortRecord {
        CohortRecord {
            definition: serde_json::from_value(json!({"id": id, "name": "c", "is_static": true}))
                .expect("a minimal cohort"),
            project_id,
            static_distinct_ids: vec!["u1".into()],
            deleted: false,
            created_at: Utc::now(),
        }
    }

    /// Runs every check against an empty store; `log` reads the activity log of the same
    /// backing.
    pub fn suite(records: &dyn FlagRecords, log: &dyn ActivityRecords) {
        ids_are_never_reused(records);
        flags_are_kept_per_project_in_id_order(records);
        live_keys_are_unique(records);
        cohorts_are_kept_per_project(records);
        changes_are_logged_with_them(records, log);
    }

    fn logged(project: u64, item: &str) -> ActivityEntry {
        ActivityEntry::removal(project, &Actor::system(), "FeatureFlag", item.into(), None)
    }

    /// The entries given with a write are in the log once it returns; a write that is refused
    /// (an error in the change, a taken key) leaves none.
    fn changes_are_logged_with_them(records: &dyn FlagRecords, log: &dyn ActivityRecords) {
        let created = logged(20, "1");
        records
            .create_flag(&flag(20, 1, "logged"), std::slice::from_ref(&created))
            .expect("create");
        let refused = logged(20, "1");
        let taken = records.create_flag(&flag(20, 2, "logged"), std::slice::from_ref(&refused));
        assert!(taken.is_err());
        let updated = logged(20, "1");
        records
            .update_flag(20, 1, &mut |f| {
                f.definition.name = "n".into();
                Ok(Some(vec![updated.clone()]))
            })
            .expect("update");
        let err = records.update_flag(20, 1, &mut |_| Err(StoreError::invalid("no", "name")));
        assert!(err.is_err());
        let cohort_entry = logged(20, "c");
        records
            .put_cohort(&cohort(20, 5), std::slice::from_ref(&cohort_entry))
            .expect("put");
        let ids: Vec<_> = log
            .query(
                20,
                &ActivityQuery {
                    limit: 10,
                    ..ActivityQuery::default()
                },
            )
            .expect("log")
            .entries
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, vec![cohort_entry.id, updated.id, created.id]);
    }

    fn ids_are_never_reused(records: &dyn FlagRecords) {
        let a = records.next_flag_id().expect("id");
        let b = records.next_flag_id().expect("id");
        assert!(b > a && a > 0, "{a} then {b}");
        let c = records.next_cohort_id().expect("id");
        let d = records.next_cohort_id().expect("id");
        assert!(d > c && c > 0, "{c} then {d}");
    }

    fn flags_are_kept_per_project_in_id_order(records: &dyn FlagRecords) {
        records.create_flag(&flag(1, 12, "b"), &[]).expect("create");
        records.create_flag(&flag(1, 3, "a"), &[]).expect("create");
        records
            .create_flag(&flag(2, 5, "a"), &[])
            .expect("other project");
        let ids: Vec<i64> = records
            .flags(1)
            .expect("list")
            .iter()
            .map(|f| f.definition.id)
            .collect();
        assert_eq!(ids, vec![3, 12]);
        let mut changed = records.flag(1, 12).expect("read").expect("stored");
        changed.definition.version = 2;
        changed.definition.active = false;
        let written = records
            .update_flag(1, 12, &mut |f| {
                f.definition.version = 2;
                f.definition.active = false;
                f.updated_at = changed.updated_at;
                Ok(Some(Vec::new()))
            })
            .expect("update");
        assert_eq!(written.as_ref(), Some(&changed));
        assert_eq!(records.flag(1, 12).expect("read"), Some(changed));
        assert_eq!(records.flag(3, 12).expect("read"), None);
        // A change that is not written, and one that errs, leave the record as it was.
        let before = records.flag(1, 12).expect("read");
        let skipped = records
            .update_flag(1, 12, &mut |f| {
                f.definition.active = true;
                Ok(None)
            })
            .expect("update");
        assert_eq!(skipped, before);
        let refused = records.update_flag(1, 12, &mut |f| {
            f.definition.active = true;
            Err(StoreError::invalid("no", "active"))
        });
        assert!(matches!(refused, Err(StoreError::Invalid { .. })));
        assert_eq!(records.flag(1, 12).expect("read"), before);
        assert_eq!(
            records
                .update_flag(1, 999, &mut |_| Ok(Some(Vec::new())))
                .expect("update"),
            None
        );
    }

    /// A live key is unique in its project: a second create, or an update that takes the key
    /// of another live flag, is refused; a deleted flag's key is free again.
    fn live_keys_are_unique(records: &dyn FlagRecords) {
        records.create_flag(&flag(4, 1, "k"), &[]).expect("create");
        let again = records.create_flag(&flag(4, 2, "k"), &[]);
        assert!(
            matches!(
                again,
                Err(StoreError::Invalid {
                    attr: Some("key"),
                    ..
                })
            ),
            "{again:?}"
        );
        records
            .create_flag(&flag(4, 3, "other"), &[])
            .expect("create");
        let renamed = records.update_flag(4, 3, &mut |f| {
            f.definition.key = "k".into();
            Ok(Some(Vec::new()))
        });
        assert!(
            matches!(renamed, Err(StoreError::Invalid { .. })),
            "{renamed:?}"
        );
        records
            .update_flag(4, 1, &mut |f| {
                f.definition.deleted = true;
                Ok(Some(Vec::new()))
            })
            .expect("delete");
        records
            .create_flag(&flag(4, 2, "k"), &[])
            .expect("the key is free");
        let revived = records.update_flag(4, 1, &mut |f| {
            f.definition.deleted = false;
            Ok(Some(Vec::new()))
        });
        assert!(
            matches!(revived, Err(StoreError::Invalid { .. })),
            "{revived:?}"
        );
    }

    /// Two handles on one backing (two threads on one embedded store, two connections to one
    /// PostgreSQL), racing: of twelve creates of one key exactly one wins, and twelve
    /// concurrent version bumps of one flag all count.
    pub fn race(a: Arc<dyn FlagRecords>, b: Arc<dyn FlagRecords>) {
        let handles = [a, b];
        let created: Vec<bool> = std::thread::scope(|scope| {
            let tries: Vec<_> = (0..12i64)
                .map(|i| {
                    let records = Arc::clone(&handles[(i % 2) as usize]);
                    scope.spawn(move || records.create_flag(&flag(9, 100 + i, "same"), &[]).is_ok())
                })
                .collect();
            tries
                .into_iter()
                .map(|t| t.join().expect("create"))
                .collect()
        });
        assert_eq!(created.iter().filter(|won| **won).count(), 1, "{created:?}");
        let winner = handles[0]
            .flags(9)
            .expect("list")
            .into_iter()
            .find(|f| f.definition.key == "same")
            .expect("the winner is stored");
        let id = winner.definition.id;
        std::thread::scope(|scope| {
            for i in 0..12usize {
                let records = Arc::clone(&handles[i % 2]);
                scope.spawn(move || {
                    records
                        .update_flag(9, id, &mut |f| {
                            f.definition.version += 1;
                            f.definition.name = format!("edit {i}");
                            Ok(Some(Vec::new()))
                        })
                        .expect("update");
                });
            }
        });
        let last = handles[1].flag(9, id).expect("read").expect("stored");
        assert_eq!(last.definition.version, winner.definition.version + 12);
    }

    fn cohorts_are_kept_per_project(records: &dyn FlagRecords) {
        let c = cohort(1, 7);
        records.put_cohort(&c, &[]).expect("put");
        records.put_cohort(&cohort(2, 8), &[]).expect("put");
        assert_eq!(records.cohort(1, 7).expect("read"), Some(c.clone()));
        assert_eq!(records.cohorts(1).expect("list"), vec![c.clone()]);
        let mut deleted = c;
        deleted.deleted = true;
        records.put_cohort(&deleted, &[]).expect("replace");
        assert_eq!(
            records.cohort(1, 7).expect("read").map(|c| c.deleted),
            Some(true)
        );
    }

    #[test]
    fn sled_flags_pass_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let records: Arc<dyn FlagRecords> = Arc::new(SledFlags::open(&db).expect("open"));
        suite(records.as_ref(), &SledActivity::open(&db).expect("log"));
        race(Arc::clone(&records), records);
    }
}
