//! The metastore's schema, as numbered migrations applied in order, each version in one
//! transaction.
//!
//! Each crate keeps the migrations of the tables it owns beside its code (`<crate>/migrations/`)
//! and lists them as its `MIGRATIONS`; the engine hands every crate's list to [`migrate`]. A
//! version may have parts in several crates (when one change touched tables of several
//! owners): they are applied together, as one version.
//!
//! Nodes of one cluster may start together: every run takes a transaction-scoped advisory lock
//! first, so exactly one applies a migration and the others see it applied. A node refuses a
//! schema newer than the migrations it knows ([`StoreError::SchemaTooNew`]).

use std::collections::BTreeMap;

use super::Pg;
use crate::StoreError;

/// One part of a schema version, owned by the crate whose tables it changes. Never edit a
/// released one: add the next version.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// The kernel's own tables: id sequences, the definition records of the record store, job
/// leases.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "sequences",
        sql: include_str!("../../migrations/0001_sequences.sql"),
    },
    Migration {
        version: 4,
        name: "records",
        sql: include_str!("../../migrations/0004_records.sql"),
    },
    Migration {
        version: 6,
        name: "claims",
        sql: include_str!("../../migrations/0006_claims.sql"),
    },
];

/// Advisory-lock key under which migrations run (any constant unique to Corvid).
const MIGRATION_LOCK: i64 = 0x636f_7276_6964; // "corvid"

/// The parts of every version, in version order (parts of one version in the order given).
fn versions(sets: &[&[Migration]]) -> BTreeMap<i32, Vec<Migration>> {
    let mut out: BTreeMap<i32, Vec<Migration>> = BTreeMap::new();
    for m in sets.iter().flat_map(|set| set.iter()) {
        out.entry(m.version).or_default().push(*m);
    }
    out
}

/// The newest schema version `sets` know.
pub fn latest(sets: &[&[Migration]]) -> i32 {
    versions(sets).keys().next_back().copied().unwrap_or(0)
}

/// Applies every migration of `sets` the database lacks; returns the versions applied (empty
/// when it was up to date).
pub fn migrate(pg: &Pg, sets: &[&[Migration]]) -> Result<Vec<i32>, StoreError> {
    let versions = versions(sets);
    let newest = latest(sets);
    pg.run(move |mut client| async move {
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
        refuse_newer(current, newest)?;
        let mut applied = Vec::new();
        for (version, parts) in versions.range(current.saturating_add(1)..) {
            for part in parts {
                tx.batch_execute(part.sql).await?;
            }
            let name = parts.iter().map(|p| p.name).collect::<Vec<_>>().join(", ");
            tx.execute(
                "INSERT INTO corvid_schema (version, name) VALUES ($1, $2)",
                &[version, &name],
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

fn refuse_newer(current: i32, newest: i32) -> Result<(), StoreError> {
    if current > newest {
        return Err(StoreError::SchemaTooNew {
            found: current as u32,
            supported: newest as u32,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::testing::TestPostgres;

    /// The kernel's migrations and another crate's version of two parts.
    const OTHER: &[Migration] = &[
        Migration {
            version: 9,
            name: "other crate",
            sql: "CREATE TABLE other_a (id bigint PRIMARY KEY)",
        },
        Migration {
            version: 9,
            name: "second part",
            sql: "CREATE TABLE other_b (a bigint NOT NULL)",
        },
    ];
    const SETS: &[&[Migration]] = &[MIGRATIONS, OTHER];

    #[test]
    fn migrations_apply_once_even_from_nodes_starting_together_and_newer_schemas_are_refused() {
        let server = TestPostgres::start();
        let db = server.database();
        let pools: Vec<Pg> = (0..3).map(|_| db.connect()).collect();
        let applied: Vec<Vec<i32>> = std::thread::scope(|s| {
            let runs: Vec<_> = pools
                .iter()
                .map(|pg| s.spawn(move || migrate(pg, SETS).expect("migrate")))
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("thread"))
                .collect()
        });
        let all = vec![1, 4, 6, 9];
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
        assert_eq!(current(&pools[0]).expect("version"), latest(SETS));
        let names: Vec<String> = pools[0]
            .run(|client| async move {
                let rows = client
                    .query("SELECT name FROM corvid_schema ORDER BY version", &[])
                    .await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .expect("names");
        assert_eq!(
            names,
            ["sequences", "records", "claims", "other crate, second part"]
        );
        assert!(migrate(&pools[1], SETS).expect("again").is_empty());

        pools[0]
            .run(|client| async move {
                client
                    .execute(
                        "INSERT INTO corvid_schema (version, name) VALUES ($1, 'from the future')",
                        &[&(latest(SETS) + 1)],
                    )
                    .await?;
                Ok(())
            })
            .expect("newer version");
        assert!(matches!(
            migrate(&pools[2], SETS),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }
}
