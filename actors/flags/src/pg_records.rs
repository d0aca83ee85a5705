//! Flag and cohort definitions in PostgreSQL (cluster mode), shared by every node.

use std::sync::Arc;

use super::records::{key_taken, CohortRecord, FlagChange, FlagRecord, FlagRecords};
use corvid_activity::{insert_all, ActivityEntry};
use corvid_kernel::pg::{
    bigint, is_unique_violation, next_in_sequence, record_json, record_of, Pg, RESYNC,
};
use corvid_kernel::StoreError;

/// The channel flag and cohort writes are announced on (payload: the project id).
const CHANNEL: &str = "corvid_flags";

pub struct PgFlags {
    pg: Arc<Pg>,
}

impl PgFlags {
    /// The store over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgFlags {
        PgFlags { pg }
    }

    fn next(&self, sequence: &'static str) -> Result<i64, StoreError> {
        let id = self
            .pg
            .run(move |client| async move { next_in_sequence(&client, sequence).await })?;
        i64::try_from(id).map_err(|_| StoreError::Sequence {
            name: sequence.into(),
        })
    }

    fn list<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        table: &'static str,
        project_id: u64,
    ) -> Result<Vec<T>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let statement =
                format!("SELECT id, record FROM {table} WHERE project_id = $1 ORDER BY id");
            let rows = client.query(&statement, &[&p]).await?;
            rows.iter()
                .map(|r| record_of(r, table, r.get::<_, i64>(0)))
                .collect()
        })
    }

    fn one<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        table: &'static str,
        project_id: u64,
        id: i64,
    ) -> Result<Option<T>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let statement = format!("SELECT record FROM {table} WHERE project_id = $1 AND id = $2");
            let row = client.query_opt(&statement, &[&p, &id]).await?;
            row.map(|r| record_of(&r, table, id)).transpose()
        })
    }

    /// Writes a record and its activity-log entries in one transaction, and notifies every
    /// node's listener of its project (delivered when it commits).
    fn put(
        &self,
        table: &'static str,
        project_id: u64,
        id: i64,
        record: serde_json::Value,
        log: &[ActivityEntry],
    ) -> Result<(), StoreError> {
        let p = bigint(project_id);
        let record = tokio_postgres::types::Json(record);
        let mut tx = self.pg.begin()?;
        tx.step(move |client| async move {
            let statement = format!(
                "WITH written AS (
                     INSERT INTO {table} (project_id, id, record) VALUES ($1, $2, $3)
                     ON CONFLICT (project_id, id) DO UPDATE SET record = $3
                     RETURNING project_id
                 )
                 SELECT pg_notify('{CHANNEL}', project_id::text) FROM written"
            );
            let done = client.query(&statement, &[&p, &id, &record]).await;
            (client, done.map(|_| ()).map_err(StoreError::from))
        })?;
        insert_all(&mut tx, log)?;
        tx.commit()
    }
}

impl FlagRecords for PgFlags {
    fn next_flag_id(&self) -> Result<i64, StoreError> {
        self.next("flags/feature_flags")
    }

    fn next_cohort_id(&self) -> Result<i64, StoreError> {
        self.next("flags/cohorts")
    }

    fn flags(&self, project_id: u64) -> Result<Vec<FlagRecord>, StoreError> {
        self.list("feature_flags", project_id)
    }

    fn flag(&self, project_id: u64, id: i64) -> Result<Option<FlagRecord>, StoreError> {
        self.one("feature_flags", project_id, id)
    }

    fn create_flag(&self, record: &FlagRecord, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let (p, id) = (bigint(record.project_id), record.definition.id);
        let json = record_json("feature flag", record)?;
        let flag_key = record.definition.key.clone();
        let mut tx = self.pg.begin()?;
        tx.step(move |client| async move {
            let inserted = client
                .query(
                    &format!(
                        "WITH created AS (
                             INSERT INTO feature_flags (project_id, id, record) VALUES ($1, $2, $3)
                             RETURNING project_id
                         )
                         SELECT pg_notify('{CHANNEL}', project_id::text) FROM created"
                    ),
                    &[&p, &id, &json],
                )
                .await;
            let done = match inserted {
                Ok(_) => Ok(()),
                Err(e) if is_unique_violation(&e) => Err(key_taken(&flag_key)),
                Err(e) => Err(e.into()),
            };
            (client, done)
        })?;
        insert_all(&mut tx, log)?;
        tx.commit()
    }

    fn update_flag(
        &self,
        project_id: u64,
        id: i64,
        change: &mut FlagChange<'_>,
    ) -> Result<Option<FlagRecord>, StoreError> {
        let p = bigint(project_id);
        let mut tx = self.pg.begin()?;
        let row = tx.step(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM feature_flags WHERE project_id = $1 AND id = $2
                     FOR UPDATE",
                    &[&p, &id],
                )
                .await;
            let found = row.map_err(StoreError::from).and_then(|r| {
                r.map(|r| record_of::<FlagRecord>(&r, "feature_flags", id))
                    .transpose()
            });
            (client, found)
        })?;
        let Some(mut record) = row else {
            tx.commit()?;
            return Ok(None);
        };
        let stored = record.clone();
        let Some(log) = change(&mut record)? else {
            // Nothing to write: the record is as stored.
            tx.commit()?;
            return Ok(Some(stored));
        };
        let json = record_json("feature flag", &record)?;
        let flag_key = record.definition.key.clone();
        tx.step(move |client| async move {
            let done = client
                .query(
                    &format!(
                        "WITH changed AS (
                             UPDATE feature_flags SET record = $3
                             WHERE project_id = $1 AND id = $2 RETURNING project_id
                         )
                         SELECT pg_notify('{CHANNEL}', project_id::text) FROM changed"
                    ),
                    &[&p, &id, &json],
                )
                .await;
            let done = match done {
                Ok(_) => Ok(()),
                Err(e) if is_unique_violation(&e) => Err(key_taken(&flag_key)),
                Err(e) => Err(e.into()),
            };
            (client, done)
        })?;
        insert_all(&mut tx, &log)?;
        tx.commit()?;
        Ok(Some(record))
    }

    fn cohorts(&self, project_id: u64) -> Result<Vec<CohortRecord>, StoreError> {
        self.list("cohorts", project_id)
    }

    fn cohort(&self, project_id: u64, id: i64) -> Result<Option<CohortRecord>, StoreError> {
        self.one("cohorts", project_id, id)
    }

    fn put_cohort(&self, record: &CohortRecord, log: &[ActivityEntry]) -> Result<(), StoreError> {
        let json = record_json("cohort", record)?.0;
        self.put(
            "cohorts",
            record.project_id,
            record.definition.id,
            json,
            log,
        )
    }

    fn watch(&self, on_change: Arc<dyn Fn(Option<u64>) + Send + Sync>) {
        self.pg.listen(
            CHANNEL,
            RESYNC,
            Arc::new(move |payload: Option<&str>| match payload {
                Some(p) => match p.parse() {
                    Ok(project) => on_change(Some(project)),
                    Err(_) => on_change(None),
                },
                None => on_change(None),
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::pg::migrations::migrate;
    use corvid_kernel::pg::testing::TestPostgres;

    #[test]
    fn a_flag_saved_on_one_node_is_in_another_nodes_snapshot_within_a_second() {
        use crate::store::FlagStore;
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[
            corvid_kernel::MIGRATIONS,
            corvid_activity::MIGRATIONS,
            crate::MIGRATIONS,
        ]);
        let node1 = FlagStore::new(Arc::new(PgFlags::new(Arc::new(db.connect()))));
        let node3 = FlagStore::new(Arc::new(PgFlags::new(Arc::new(db.connect()))));
        assert!(node3.snapshot(1).expect("snapshot").flags.is_empty());
        // Let node 3's listener connect before the change it must hear about.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let definition = serde_json::from_value(
            serde_json::json!({"id": 0, "key": "beta", "active": true, "version": 0}),
        )
        .expect("definition");
        let saved = node1
            .create_flag(1, &corvid_activity::Actor::system(), definition)
            .expect("save");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            let seen = node3
                .cached_snapshot(1)
                .map(|s| s.flags.iter().any(|f| f.id == saved.definition.id));
            if seen == Some(true) || node3.cached_snapshot(1).is_none() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node 3 still serves its old snapshot after 1 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let rebuilt = node3.snapshot(1).expect("snapshot");
        assert_eq!(rebuilt.flags.len(), 1);
        assert_eq!(rebuilt.flags[0].key, "beta");
    }

    #[test]
    fn postgres_flags_pass_the_contract() {
        let server = TestPostgres::start();
        let db = server.database();
        let pg = Arc::new(db.connect());
        migrate(
            &pg,
            &[
                corvid_kernel::MIGRATIONS,
                corvid_activity::MIGRATIONS,
                crate::MIGRATIONS,
            ],
        )
        .expect("migrate");
        super::super::records::contract::suite(
            &PgFlags::new(Arc::clone(&pg)),
            &corvid_activity::PgActivity::new(Arc::clone(&pg)),
        );
        let other = Arc::new(db.connect());
        super::super::records::contract::race(
            Arc::new(PgFlags::new(pg)),
            Arc::new(PgFlags::new(other)),
        );
    }
}
