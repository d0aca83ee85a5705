//! Where flag and cohort definitions live.
//!
//! [`FlagRecords`] is the storage trait ([`SledFlags`] in the embedded default; every
//! implementation passes [`contract::suite`]). The rules (live key uniqueness, versions) and
//! the in-memory evaluation snapshots are [`super::store::FlagStore`]'s.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::model::{CohortDefinition, FlagDefinition};
use crate::kernel::codec::{encode, get, scan_prefix};
use crate::kernel::StoreError;

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

/// Flags and cohorts by project and id. Writes are durable when they return.
pub trait FlagRecords: Send + Sync {
    /// A new flag id, never handed out before.
    fn next_flag_id(&self) -> Result<i64, StoreError>;
    /// A new cohort id, never handed out before.
    fn next_cohort_id(&self) -> Result<i64, StoreError>;
    /// All flags of a project (deleted ones included), by id.
    fn flags(&self, project_id: u64) -> Result<Vec<FlagRecord>, StoreError>;
    fn flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError>;
    /// Inserts or replaces the flag `record.definition.id` of `record.project_id`.
    fn put_flag(&self, record: &FlagRecord) -> Result<(), StoreError>;
    /// All cohorts of a project (deleted ones included), by id.
    fn cohorts(&self, project_id: u64) -> Result<Vec<CohortRecord>, StoreError>;
    fn cohort(&self, project_id: u64, id: i64) -> Result<Option<CohortRecord>, StoreError>;
    /// Inserts or replaces the cohort `record.definition.id` of `record.project_id`.
    fn put_cohort(&self, record: &CohortRecord) -> Result<(), StoreError>;
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

fn key(project_id: u64, id: i64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&project_id.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The embedded flag records (sled).
pub struct SledFlags {
    db: sled::Db,
    flags: sled::Tree,
    cohorts: sled::Tree,
    sequences: sled::Tree,
}

impl SledFlags {
    pub fn open(db: &sled::Db) -> Result<SledFlags, StoreError> {
        Ok(SledFlags {
            flags: db.open_tree("feature_flags")?,
            cohorts: db.open_tree("cohorts")?,
            sequences: db.open_tree("flag_sequences")?,
            db: db.clone(),
        })
    }

    fn next_id(&self, name: &str) -> Result<i64, StoreError> {
        let id = crate::kernel::sequence::next(&self.sequences, name)?;
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

    fn put_flag(&self, record: &FlagRecord) -> Result<(), StoreError> {
        self.flags.insert(
            key(record.project_id, record.definition.id),
            encode(record)?,
        )?;
        self.db.flush()?;
        Ok(())
    }

    fn cohorts(&self, project_id: u64) -> Result<Vec<CohortRecord>, StoreError> {
        scan_prefix(&self.cohorts, "cohorts", project_id.to_be_bytes())
    }

    fn cohort(&self, project_id: u64, id: i64) -> Result<Option<CohortRecord>, StoreError> {
        get(&self.cohorts, "cohorts", &key(project_id, id))
    }

    fn put_cohort(&self, record: &CohortRecord) -> Result<(), StoreError> {
        self.cohorts.insert(
            key(record.project_id, record.definition.id),
            encode(record)?,
        )?;
        self.db.flush()?;
        Ok(())
    }
}

/// The behaviour every [`FlagRecords`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use chrono::Utc;
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

    /// Runs every check against an empty store.
    pub fn suite(records: &dyn FlagRecords) {
        ids_are_never_reused(records);
        flags_are_kept_per_project_in_id_order(records);
        cohorts_are_kept_per_project(records);
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
        records.put_flag(&flag(1, 12, "b")).expect("put");
        records.put_flag(&flag(1, 3, "a")).expect("put");
        records.put_flag(&flag(2, 5, "a")).expect("other project");
        let ids: Vec<i64> = records
            .flags(1)
            .expect("list")
            .iter()
            .map(|f| f.definition.id)
            .collect();
        assert_eq!(ids, vec![3, 12]);
        let mut changed = flag(1, 12, "b");
        changed.definition.version = 2;
        changed.definition.active = false;
        records.put_flag(&changed).expect("replace");
        assert_eq!(records.flag(1, 12).expect("read"), Some(changed));
        assert_eq!(records.flag(3, 12).expect("read"), None);
    }

    fn cohorts_are_kept_per_project(records: &dyn FlagRecords) {
        let c = cohort(1, 7);
        records.put_cohort(&c).expect("put");
        records.put_cohort(&cohort(2, 8)).expect("put");
        assert_eq!(records.cohort(1, 7).expect("read"), Some(c.clone()));
        assert_eq!(records.cohorts(1).expect("list"), vec![c.clone()]);
        let mut deleted = c;
        deleted.deleted = true;
        records.put_cohort(&deleted).expect("replace");
        assert_eq!(
            records.cohort(1, 7).expect("read").map(|c| c.deleted),
            Some(true)
        );
    }

    #[test]
    fn sled_flags_pass_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        suite(&SledFlags::open(&db).expect("open"));
    }
}
