//! The metastore's schema, as numbered migrations applied in order, each in one transaction.
//!
//! Nodes of one cluster may start together: every run takes a transaction-scoped advisory lock
//! first, so exactly one applies a migration and the others see it applied. A node refuses a
//! schema newer than the migrations it knows ([`StoreError::SchemaTooNew`]).

use super::Pg;
use crate::StoreError;

/// `(version, name, SQL)`, in order. Never edit a released entry: add the next one.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "metadata", include_str!("0001_metadata.sql")),
    (2, "oauth", include_str!("0002_oauth.sql")),
    (3, "persons", include_str!("0003_persons.sql")),
    (4, "records", include_str!("0004_flags_and_records.sql")),
    (5, "endpoints", include_str!("0005_endpoints.sql")),
    (6, "claims", include_str!("0006_claims.sql")),
    (7, "segments", include_str!("0007_segments.sql")),
    (8, "unique keys", include_str!("0008_unique_keys.sql")),
];

/// Advisory-lock key under which migrations run (any constant unique to Corvid).
const MIGRATION_LOCK: i64 = 0x636f_7276_6964; // "corvid"

/// The newest schema version this build knows.
pub fn latest() -> i32 {
    MIGRATIONS.last().map(|(v, _, _)| *v).unwrap_or(0)
}

/// Applies every migration the database lacks; returns the versions applied (empty when it
/// was up to date).
pub fn migrate(pg: &Pg) -> Result<Vec<i32>, StoreError> {
    pg.run(|mut client| async move {
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS corvid_schema (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await?;
        let current: i32 = tx
            .query_one("SELECT coalesce(max(version), 0) FROM corvid_schema", &[])
            .await?
            .get(0);
        refuse_newer(current)?;
        let mut applied = Vec::new();
        for (version, name, sql) in MIGRATIONS.iter().filter(|(v, _, _)| *v > current) {
            tx.batch_execute(sql).await?;
            tx.execute(
                "INSERT INTO corvid_schema (version, name) VALUES ($1, $2)",
                &[version, name],
            )
            .await?;
            applied.push(*version);
        }
        tx.commit().await?;
        Ok(applied)
    })
}

/// The database's schema version (0 before the first migration).
pub fn current(pg: &Pg) -> Result<i32, StoreError> {
    pg.run(|client| async move {
        let exists: bool = client
            .query_one("SELECT to_regclass('corvid_schema') IS NOT NULL", &[])
            .await?
            .get(0);
        if !exists {
            return Ok(0);
        }
        Ok(client
            .query_one("SELECT coalesce(max(version), 0) FROM corvid_schema", &[])
            .await?
            .get(0))
    })
}

fn refuse_newer(current: i32) -> Result<(), StoreError> {
    if current > latest() {
        return Err(StoreError::SchemaTooNew {
            found: current as u32,
            supported: latest() as u32,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::testing::TestPostgres;

    #[test]
    fn migrations_apply_once_even_from_nodes_starting_together_and_newer_schemas_are_refused() {
        let server = TestPostgres::start();
        let db = server.database();
        let pools: Vec<Pg> = (0..3).map(|_| db.connect()).collect();
        let applied: Vec<Vec<i32>> = std::thread::scope(|s| {
            let runs: Vec<_> = pools
                .iter()
                .map(|pg| s.spawn(move || migrate(pg).expect("migrate")))
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("thread"))
                .collect()
        });
        let all: Vec<i32> = (1..=latest()).collect();
        assert_eq!(
            applied.iter().filter(|a| **a == all).count(),
            1,
            "{applied:?}"
        );
        assert_eq!(
            applied.iter().filter(|a| a.is_empty()).count(),
            2,
            "{applied:?}"
        );
        assert_eq!(current(&pools[0]).expect("version"), latest());
        assert!(migrate(&pools[1]).expect("again").is_empty());

        pools[0]
            .run(|client| async move {
                client
                    .execute(
                        "INSERT INTO corvid_schema (version, name) VALUES ($1, 'from the future')",
                        &[&(latest() + 1)],
                    )
                    .await?;
                Ok(())
            })
            .expect("newer version");
        assert!(matches!(
            migrate(&pools[2]),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }
}
