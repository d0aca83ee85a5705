//! The activity log in PostgreSQL (cluster mode): one row per entry, shared by every node.
//! Stores in the same database write an entry in their own transaction with [`insert`].

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Json;
use uuid::Uuid;

use super::entry::ActivityEntry;
use super::records::{ActivityPage, ActivityQuery, ActivityRecords};
use corvid_kernel::pg::{bigint, Pg};
use corvid_kernel::StoreError;

/// Inserts `entry` on `client` (a connection or a transaction), inside whatever transaction
/// it is in.
pub async fn insert(
    client: &impl tokio_postgres::GenericClient,
    entry: &ActivityEntry,
) -> Result<(), StoreError> {
    let record = serde_json::to_value(entry).map_err(|source| StoreError::Encode {
        what: "activity entry",
        source,
    })?;
    let user = entry.user.id.map(bigint);
    client
        .execute(
            "INSERT INTO activity_log (project_id, id, scope, item_id, user_id, created_at, record)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &bigint(entry.project_id),
                &entry.id,
                &entry.scope,
                &entry.item_id,
                &user,
                &entry.created_at,
                &Json(record),
            ],
        )
        .await?;
    Ok(())
}

/// Writes the entries on a blocking transaction's connection (they commit with it).
pub fn insert_all(
    tx: &mut corvid_kernel::pg::BlockingTx<'_>,
    log: &[ActivityEntry],
) -> Result<(), StoreError> {
    if log.is_empty() {
        return Ok(());
    }
    let log = log.to_vec();
    tx.step(move |client| async move {
        for entry in &log {
            let connection: &tokio_postgres::Client = &client;
            if let Err(e) = insert(connection, entry).await {
                return (client, Err(e));
            }
        }
        (client, Ok(()))
    })
}

fn decoded(row: &tokio_postgres::Row) -> Result<ActivityEntry, StoreError> {
    let id: Uuid = row.try_get("id")?;
    corvid_kernel::pg::record_of(row, "activity_log", id)
}

pub struct PgActivity {
    pg: Arc<Pg>,
}

impl PgActivity {
    /// The log over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgActivity {
        PgActivity { pg }
    }
}

impl ActivityRecords for PgActivity {
    fn append(&self, entry: &ActivityEntry) -> Result<(), StoreError> {
        let entry = entry.clone();
        self.pg.run(move |client| async move {
            let connection: &tokio_postgres::Client = &client;
            insert(connection, &entry).await
        })
    }

    fn query(&self, project_id: u64, query: &ActivityQuery) -> Result<ActivityPage, StoreError> {
        let p = bigint(project_id);
        let scopes = query.scopes.clone();
        let item = query.item_id.clone();
        let user = query.user.map(bigint);
        let user_uuid = query.user_uuid.map(|u| u.to_string());
        let (before, after) = (query.before, query.after);
        let offset = i64::try_from(query.offset).unwrap_or(i64::MAX);
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        self.pg.run(move |client| async move {
            // Each filter is off when its parameter is null (or the scope list empty).
            let filters = "project_id = $1
                 AND (cardinality($2::text[]) = 0 OR scope = ANY($2))
                 AND ($3::text IS NULL OR item_id = $3)
                 AND ($4::bigint IS NULL OR user_id = $4)
                 AND ($5::uuid IS NULL OR id < $5)
                 AND ($6::uuid IS NULL OR id > $6)
                 AND ($7::text IS NULL OR record->'user'->>'uuid' = $7)";
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                [&p, &scopes, &item, &user, &before, &after, &user_uuid];
            let rows = client
                .query(
                    &format!(
                        "SELECT id, record FROM activity_log WHERE {filters}
                         ORDER BY id DESC OFFSET {offset} LIMIT {limit}"
                    ),
                    &params,
                )
                .await?;
            let total: i64 = client
                .query_one(
                    &format!("SELECT count(*) FROM activity_log WHERE {filters}"),
                    &params,
                )
                .await?
                .try_get(0)?;
            Ok(ActivityPage {
                entries: rows.iter().map(decoded).collect::<Result<_, _>>()?,
                total: u64::try_from(total).unwrap_or(0),
            })
        })
    }

    fn entry(&self, project_id: u64, id: Uuid) -> Result<Option<ActivityEntry>, StoreError> {
        let p = bigint(project_id);
        self.pg.run(move |client| async move {
            let row = client
                .query_opt(
                    "SELECT id, record FROM activity_log WHERE project_id = $1 AND id = $2",
                    &[&p, &id],
                )
                .await?;
            row.as_ref().map(decoded).transpose()
        })
    }

    fn since(
        &self,
        project_id: u64,
        after: Uuid,
        limit: usize,
    ) -> Result<Vec<ActivityEntry>, StoreError> {
        let p = bigint(project_id);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT id, record FROM activity_log WHERE project_id = $1 AND id > $2
                     ORDER BY id LIMIT $3",
                    &[&p, &after, &limit],
                )
                .await?;
            rows.iter().map(decoded).collect()
        })
    }

    fn expire(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        self.pg.run(move |client| async move {
            Ok(client
                .execute("DELETE FROM activity_log WHERE created_at < $1", &[&cutoff])
                .await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::pg::testing::TestPostgres;

    #[test]
    fn postgres_activity_passes_the_contract() {
        let server = TestPostgres::start();
        let db = server.database();
        db.migrate(&[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]);
        crate::records::contract::suite(&PgActivity::new(Arc::new(db.connect())));
    }
}
