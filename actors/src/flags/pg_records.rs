//! Flag and cohort definitions in PostgreSQL (cluster mode), shared by every node.

use std::sync::Arc;

use super::records::{CohortRecord, FlagRecord, FlagRecords};
use crate::kernel::pg::{next_in_sequence, record_json, record_of, Pg};
use crate::kernel::StoreError;

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
        let p = project(project_id);
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
        let p = project(project_id);
        self.pg.run(move |client| async move {
            let statement = format!("SELECT record FROM {table} WHERE project_id = $1 AND id = $2");
            let row = client.query_opt(&statement, &[&p, &id]).await?;
            row.map(|r| record_of(&r, table, id)).transpose()
        })
    }

    fn put(
        &self,
        table: &'static str,
        project_id: u64,
        id: i64,
        record: serde_json::Value,
    ) -> Result<(), StoreError> {
        let p = project(project_id);
        let record = tokio_postgres::types::Json(record);
        self.pg.run(move |client| async move {
            let statement = format!(
                "INSERT INTO {table} (project_id, id, record) VALUES ($1, $2, $3)
                 ON CONFLICT (project_id, id) DO UPDATE SET record = $3"
            );
            client.execute(&statement, &[&p, &id, &record]).await?;
            Ok(())
        })
    }
}

fn project(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
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

    fn put_flag(&self, record: &FlagRecord) -> Result<(), StoreError> {
        let json = record_json("feature flag", record)?.0;
        self.put(
            "feature_flags",
            record.project_id,
            record.definition.id,
            json,
        )
    }

    fn cohorts(&self, project_id: u64) -> Result<Vec<CohortRecord>, StoreError> {
        self.list("cohorts", project_id)
    }

    fn cohort(&self, project_id: u64, id: i64) -> Result<Option<CohortRecord>, StoreError> {
        self.one("cohorts", project_id, id)
    }

    fn put_cohort(&self, record: &CohortRecord) -> Result<(), StoreError> {
        let json = record_json("cohort", record)?.0;
        self.put("cohorts", record.project_id, record.definition.id, json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::pg::migrations::migrate;
    use crate::kernel::pg::testing::TestPostgres;

    #[test]
    fn postgres_flags_pass_the_contract() {
        let server = TestPostgres::start();
        let db = server.database();
        let pg = Arc::new(db.connect());
        migrate(&pg).expect("migrate");
        super::super::records::contract::suite(&PgFlags::new(pg));
    }
}
