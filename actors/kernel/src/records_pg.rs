//! [`DefinitionRecords`] in PostgreSQL (cluster mode): every store's records in one table,
//! `definition_records`, told apart by the store's name.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::pg::{
    bigint, is_unique_violation, next_in_sequence, record_json, record_of, BlockingTx, Pg,
};
use super::records::DefinitionRecords;
use super::StoreError;

pub struct PgRecords<T> {
    pg: Arc<Pg>,
    name: &'static str,
    _records: PhantomData<fn() -> T>,
}

impl<T> PgRecords<T> {
    /// The records of the store `name` (the embedded tree's name) over `pg`.
    pub fn new(pg: Arc<Pg>, name: &'static str) -> PgRecords<T> {
        PgRecords {
            pg,
            name,
            _records: PhantomData,
        }
    }
}

impl<T: Serialize> PgRecords<T> {
    /// Inserts or replaces a record within `tx`, so it commits with the transaction's other
    /// writes (the activity log's entry of the change).
    pub fn put_in(
        &self,
        tx: &mut BlockingTx<'_>,
        project_id: u64,
        id: &str,
        record: &T,
    ) -> Result<(), StoreError> {
        let (name, p, id) = (self.name, bigint(project_id), id.to_string());
        let record = record_json(name, record)?;
        tx.step(move |client| async move {
            let written = client
                .execute(
                    "INSERT INTO definition_records (kind, project_id, id, record)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (kind, project_id, id) DO UPDATE SET record = $4",
                    &[&name, &p, &id, &record],
                )
                .await;
            let done = match written {
                Ok(_) => Ok(()),
                Err(e) if is_unique_violation(&e) => Err(StoreError::Conflict {
                    what: format!("a live {name} record with these unique fields"),
                }),
                Err(e) => Err(e.into()),
            };
            (client, done)
        })
    }

    /// Removes a record within `tx`; whether it existed.
    pub fn delete_in(
        &self,
        tx: &mut BlockingTx<'_>,
        project_id: u64,
        id: &str,
    ) -> Result<bool, StoreError> {
        let (name, p, id) = (self.name, bigint(project_id), id.to_string());
        tx.step(move |client| async move {
            let n = client
                .execute(
                    "DELETE FROM definition_records WHERE kind = $1 AND project_id = $2 AND id = $3",
                    &[&name, &p, &id],
                )
                .await;
            (client, n.map(|n| n > 0).map_err(StoreError::from))
        })
    }

    /// The database the records are in.
    pub fn pg(&self) -> &Arc<Pg> {
        &self.pg
    }
}

impl<T: Serialize + DeserializeOwned + Send + 'static> DefinitionRecords<T> for PgRecords<T> {
    fn list(&self, project_id: u64) -> Result<Vec<T>, StoreError> {
        let (name, p) = (self.name, bigint(project_id));
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM definition_records
                     WHERE kind = $1 AND project_id = $2 ORDER BY id COLLATE \"C\"",
                    &[&name, &p],
                )
                .await?;
            rows.iter()
                .map(|r| record_of(r, name, r.get::<_, String>(0)))
                .collect()
        })
    }

    fn list_all(&self) -> Result<Vec<(u64, T)>, StoreError> {
        let name = self.name;
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT project_id, id, record FROM definition_records
                     WHERE kind = $1 ORDER BY project_id, id COLLATE \"C\"",
                    &[&name],
                )
                .await?;
            rows.iter()
                .map(|r| {
                    let project = u64::try_from(r.get::<_, i64>(0)).unwrap_or(0);
                    Ok((project, record_of(r, name, r.get::<_, String>(1))?))
                })
                .collect()
        })
    }

    fn get(&self, project_id: u64, id: &str) -> Result<Option<T>, StoreError> {
        let (name, p, id) = (self.name, bigint(project_id), id.to_string());
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT record FROM definition_records
                     WHERE kind = $1 AND project_id = $2 AND id = $3",
                    &[&name, &p, &id],
                )
                .await?;
            row.map(|r| record_of(&r, name, &id)).transpose()
        })
    }

    fn put(&self, project_id: u64, id: &str, record: &T) -> Result<(), StoreError> {
        let mut tx = self.pg.begin()?;
        self.put_in(&mut tx, project_id, id, record)?;
        tx.commit()
    }

    fn delete(&self, project_id: u64, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pg.begin()?;
        let existed = self.delete_in(&mut tx, project_id, id)?;
        tx.commit()?;
        Ok(existed)
    }

    fn next_id(&self) -> Result<u64, StoreError> {
        let sequence = format!("records/{}", self.name);
        self.pg
            .run(move |client| async move { next_in_sequence(&client, &sequence).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::migrations::migrate;
    use crate::pg::testing::TestPostgres;
    use crate::records::contract;

    #[test]
    fn postgres_records_pass_the_contract_and_stores_stay_apart() {
        let server = TestPostgres::start();
        let db = server.database();
        let pg = Arc::new(db.connect());
        migrate(&pg, &[crate::MIGRATIONS]).expect("migrate");
        let notes: PgRecords<contract::Note> = PgRecords::new(Arc::clone(&pg), "notes");
        contract::suite(&notes);
        let other: PgRecords<contract::Note> = PgRecords::new(pg, "other_notes");
        assert!(other.list_all().expect("list").is_empty());
        assert_eq!(other.next_id().expect("id"), 1);
    }
}
