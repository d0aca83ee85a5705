//! Definition records whose every write is logged: each `put` and `delete` of the product
//! surfaces' records (surveys, experiments, holdouts, early-access features) also writes an
//! activity entry (the record's JSON before and after, under the user the caller runs as,
//! [`current_actor`]), in the same commit: one sled transaction over the records' tree and the
//! log's, or one PostgreSQL transaction. Their rules need not know of the log.

use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::ConflictableTransactionError;
use sled::Transactional;

use super::acting::current_actor;
use super::entry::{ActivityEntry, Recorded};
use super::pg::insert_all;
use super::records::{stage, TREE};
use corvid_kernel::codec::encode;
use corvid_kernel::records::record_key;
use corvid_kernel::{DefinitionRecords, PgRecords, SledRecords, StoreError};

/// Where the records and the log are, written together.
enum Backing<T> {
    Embedded {
        records: SledRecords<T>,
        log: sled::Tree,
    },
    Cluster(PgRecords<T>),
}

pub struct LoggedRecords<T> {
    backing: Backing<T>,
    scope: &'static str,
}

impl<T> LoggedRecords<T> {
    /// The embedded records of tree `name` of `db`, their writes logged under `scope`
    /// (PostHog's name for the kind of item) in the same database's log.
    pub fn embedded(
        db: &sled::Db,
        name: &'static str,
        scope: &'static str,
    ) -> Result<LoggedRecords<T>, StoreError> {
        Ok(LoggedRecords {
            backing: Backing::Embedded {
                records: SledRecords::open(db, name)?,
                log: db.open_tree(TREE)?,
            },
            scope,
        })
    }

    /// The cluster's records `records`, their writes logged in the same database's log.
    pub fn cluster(records: PgRecords<T>, scope: &'static str) -> LoggedRecords<T> {
        LoggedRecords {
            backing: Backing::Cluster(records),
            scope,
        }
    }

    fn inner(&self) -> &dyn DefinitionRecords<T>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        match &self.backing {
            Backing::Embedded { records, .. } => records,
            Backing::Cluster(records) => records,
        }
    }
}

fn json<T: Serialize>(record: &T) -> serde_json::Value {
    serde_json::to_value(record).unwrap_or_default()
}

fn name_of(v: &serde_json::Value) -> Option<String> {
    v.get("name").and_then(|n| n.as_str()).map(String::from)
}

/// What a write does to the record: put this value, or remove it.
enum Write<'a, T> {
    Put(&'a T),
    Delete,
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> LoggedRecords<T> {
    /// Writes the record and `entry` (if any) in one commit.
    fn commit(
        &self,
        project: u64,
        id: &str,
        write: Write<'_, T>,
        entry: Option<ActivityEntry>,
    ) -> Result<(), StoreError> {
        match &self.backing {
            Backing::Embedded { records, log } => {
                let (tree, db) = records.tree();
                let key = record_key(project, id);
                let value = match write {
                    Write::Put(record) => Some(encode(record)?),
                    Write::Delete => None,
                };
                (tree, log)
                    .transaction(|(tree, log)| {
                        match &value {
                            Some(value) => tree.insert(&key[..], value.clone())?,
                            None => tree.remove(&key[..])?,
                        };
                        if let Some(entry) = &entry {
                            stage(log, entry)?;
                        }
                        Ok::<(), ConflictableTransactionError<StoreError>>(())
                    })
                    .map_err(StoreError::from)?;
                db.flush()?;
                Ok(())
            }
            Backing::Cluster(records) => {
                let mut tx = records.pg().begin()?;
                match write {
                    Write::Put(record) => records.put_in(&mut tx, project, id, record)?,
                    Write::Delete => {
                        records.delete_in(&mut tx, project, id)?;
                    }
                }
                insert_all(&mut tx, entry.as_slice())?;
                tx.commit()
            }
        }
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> DefinitionRecords<T>
    for LoggedRecords<T>
{
    fn list(&self, project: u64) -> Result<Vec<T>, StoreError> {
        self.inner().list(project)
    }

    fn list_all(&self) -> Result<Vec<(u64, T)>, StoreError> {
        self.inner().list_all()
    }

    fn get(&self, project: u64, id: &str) -> Result<Option<T>, StoreError> {
        self.inner().get(project, id)
    }

    fn put(&self, project: u64, id: &str, record: &T) -> Result<(), StoreError> {
        let before = self.inner().get(project, id)?.map(|r| json(&r));
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
        self.commit(project, id, Write::Put(record), entry)
    }

    fn delete(&self, project: u64, id: &str) -> Result<bool, StoreError> {
        let Some(before) = self.inner().get(project, id)? else {
            return Ok(false);
        };
        let name = name_of(&json(&before));
        let entry =
            ActivityEntry::removal(project, &current_actor(), self.scope, id.to_string(), name);
        self.commit(project, id, Write::Delete, Some(entry))?;
        Ok(true)
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        self.inner().next_id()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};
    use uuid::Uuid;

    use super::*;
    use crate::acting::acting_as;
    use crate::entry::Actor;
    use crate::records::{ActivityQuery, ActivityRecords, SledActivity};

    #[test]
    fn every_put_and_delete_is_logged_as_the_acting_user() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let log: Arc<dyn ActivityRecords> = Arc::new(SledActivity::open(&db).expect("log"));
        let records = LoggedRecords::<Value>::embedded(&db, "surveys", "Survey").expect("records");
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
