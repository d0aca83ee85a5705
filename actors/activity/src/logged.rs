//! Definition records whose every write is logged: a [`DefinitionRecords`] wrapped so each
//! `put` and `delete` also writes an activity entry (the record's JSON before and after, under
//! the user the caller runs as, [`current_actor`]). The product surfaces' records (surveys,
//! experiments, holdouts, early-access features) are kept this way, so their rules need not
//! know of the log.
//!
//! The entry is written right after the record, not in its transaction: a crash between the
//! two loses the entry, never the change.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::acting::current_actor;
use super::entry::{ActivityEntry, Recorded};
use super::records::ActivityRecords;
use corvid_kernel::{DefinitionRecords, StoreError};

pub struct LoggedRecords<T> {
    inner: Arc<dyn DefinitionRecords<T>>,
    log: Arc<dyn ActivityRecords>,
    scope: &'static str,
    _records: PhantomData<fn() -> T>,
}

impl<T> LoggedRecords<T> {
    /// `inner`'s writes logged under `scope` (PostHog's name for the kind of item).
    pub fn new(
        inner: Arc<dyn DefinitionRecords<T>>,
        log: Arc<dyn ActivityRecords>,
        scope: &'static str,
    ) -> LoggedRecords<T> {
        LoggedRecords {
            inner,
            log,
            scope,
            _records: PhantomData,
        }
    }
}

fn json<T: Serialize>(record: &T) -> serde_json::Value {
    serde_json::to_value(record).unwrap_or_default()
}

fn name_of(v: &serde_json::Value) -> Option<String> {
    v.get("name").and_then(|n| n.as_str()).map(String::from)
}

impl<T: Serialize + DeserializeOwned + Send + Sync> DefinitionRecords<T> for LoggedRecords<T> {
    fn list(&self, project: u64) -> Result<Vec<T>, StoreError> {
        self.inner.list(project)
    }

    fn list_all(&self) -> Result<Vec<(u64, T)>, StoreError> {
        self.inner.list_all()
    }

    fn get(&self, project: u64, id: &str) -> Result<Option<T>, StoreError> {
        self.inner.get(project, id)
    }

    fn put(&self, project: u64, id: &str, record: &T) -> Result<(), StoreError> {
        let before = self.inner.get(project, id)?.map(|r| json(&r));
        self.inner.put(project, id, record)?;
        let after = json(record);
        let entry = Recorded {
            project_id: project,
            actor: &current_actor(),
            scope: self.scope,
            item_id: id.to_string(),
            name: name_of(&after),
            before: before.as_ref(),
            after: &after,
        }
        .entry();
        match entry {
            Some(entry) => self.log.append(&entry),
            None => Ok(()),
        }
    }

    fn delete(&self, project: u64, id: &str) -> Result<bool, StoreError> {
        let before = self.inner.get(project, id)?;
        let existed = self.inner.delete(project, id)?;
        if existed {
            let name = before.as_ref().map(json).as_ref().and_then(name_of);
            let entry =
                ActivityEntry::removal(project, &current_actor(), self.scope, id.to_string(), name);
            self.log.append(&entry)?;
        }
        Ok(existed)
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        self.inner.next_id()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};
    use uuid::Uuid;

    use super::*;
    use crate::acting::acting_as;
    use crate::entry::Actor;
    use crate::records::{ActivityQuery, SledActivity};
    use corvid_kernel::SledRecords;

    #[test]
    fn every_put_and_delete_is_logged_as_the_acting_user() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let log: Arc<dyn ActivityRecords> = Arc::new(SledActivity::open(&db).expect("log"));
        let records = LoggedRecords::<Value>::new(
            Arc::new(SledRecords::open(&db, "surveys").expect("records")),
            Arc::clone(&log),
            "Survey",
        );
        let ada = Actor::user(7, Uuid::nil(), "ada@example.com", "Ada");
        acting_as(&ada, || {
            records
                .put(1, "s1", &json!({"name": "NPS", "questions": 1}))
                .expect("put");
            records
                .put(1, "s1", &json!({"name": "NPS", "questions": 1}))
                .expect("same");
            records
                .put(1, "s1", &json!({"name": "NPS", "questions": 2}))
                .expect("put");
        });
        assert!(records.delete(1, "s1").expect("delete"));
        assert!(!records.delete(1, "s1").expect("gone"));
        let entries = log
            .query(
                1,
                &ActivityQuery {
                    limit: 10,
                    ..ActivityQuery::default()
                },
            )
            .expect("query")
            .entries;
        let seen: Vec<(&str, bool)> = entries
            .iter()
            .map(|e| (e.activity.as_str(), e.user.is_system))
            .collect();
        assert_eq!(
            seen,
            vec![("deleted", true), ("updated", false), ("created", false)],
            "an unchanged put is not logged; outside acting_as it is the system"
        );
        assert_eq!(
            entries[1].detail.changes[0].field.as_deref(),
            Some("questions")
        );
        assert_eq!(entries[0].detail.name.as_deref(), Some("NPS"));
    }
}
