//! Execution logs in PostgreSQL (cluster mode): every node appends to one table, so a search
//! from any node sees every node's runs.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{ExecutionLogRecords, Level, LogEntry, LogQuery};
use corvid_kernel::pg::Pg;
use corvid_kernel::StoreError;

pub struct PgExecutionLog {
    pg: Arc<Pg>,
}

impl PgExecutionLog {
    /// The store over `pg`, whose schema is migrated.
    pub fn new(pg: Arc<Pg>) -> PgExecutionLog {
        PgExecutionLog { pg }
    }
}

fn level_text(level: Level) -> &'static str {
    match level {
        Level::Info => "INFO",
        Level::Error => "ERROR",
    }
}

impl ExecutionLogRecords for PgExecutionLog {
    fn append(&self, entries: Vec<LogEntry>) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut projects = Vec::with_capacity(entries.len());
        let mut endpoints = Vec::with_capacity(entries.len());
        let mut instances = Vec::with_capacity(entries.len());
        let mut times = Vec::with_capacity(entries.len());
        let mut levels = Vec::with_capacity(entries.len());
        let mut messages = Vec::with_capacity(entries.len());
        for e in entries {
            projects.push(i64::try_from(e.project_id).unwrap_or(i64::MAX));
            endpoints.push(e.endpoint_id);
            instances.push(e.instance_id);
            times.push(e.timestamp);
            levels.push(level_text(e.level).to_string());
            messages.push(e.message);
        }
        self.pg.run(move |client| async move {
            // One statement for the batch, rows in the order given.
            client
                .execute(
                    "INSERT INTO endpoint_logs
                         (project_id, endpoint_id, instance_id, ts, level, message)
                     SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::uuid[],
                                          $4::timestamptz[], $5::text[], $6::text[])",
                    &[
                        &projects, &endpoints, &instances, &times, &levels, &messages,
                    ],
                )
                .await?;
            Ok(())
        })
    }

    fn search(
        &self,
        project_id: u64,
        endpoint_id: Option<Uuid>,
        query: &LogQuery,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let p = i64::try_from(project_id).unwrap_or(i64::MAX);
        let levels: Option<Vec<String>> = (!query.levels.is_empty()).then(|| {
            query
                .levels
                .iter()
                .map(|l| level_text(*l).to_string())
                .collect()
        });
        let search = query.search.clone();
        let (after, before, instance) = (query.after, query.before, query.instance_id);
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        self.pg.run(move |client| async move {
            let rows = client
                .query(
                    "SELECT instance_id, ts, level, message, endpoint_id FROM endpoint_logs
                     WHERE project_id = $1 AND ($2::uuid IS NULL OR endpoint_id = $2)
                       AND ($3::text[] IS NULL OR level = ANY($3))
                       AND ($4::text IS NULL OR strpos(lower(message), lower($4)) > 0)
                       AND ($5::timestamptz IS NULL OR ts > $5)
                       AND ($6::timestamptz IS NULL OR ts < $6)
                       AND ($7::uuid IS NULL OR instance_id = $7)
                     ORDER BY ts DESC, seq DESC
                     LIMIT $8",
                    &[
                        &p,
                        &endpoint_id,
                        &levels,
                        &search,
                        &after,
                        &before,
                        &instance,
                        &limit,
                    ],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| LogEntry {
                    project_id,
                    endpoint_id: r.get(4),
                    instance_id: r.get(0),
                    timestamp: r.get::<_, DateTime<Utc>>(1),
                    level: Level::parse(r.get::<_, &str>(2)).unwrap_or(Level::Info),
                    message: r.get(3),
                })
                .collect())
        })
    }

    fn prune(&self, cutoff: DateTime<Utc>) -> Result<usize, StoreError> {
        self.pg.run(move |client| async move {
            let n = client
                .execute("DELETE FROM endpoint_logs WHERE ts < $1", &[&cutoff])
                .await?;
            Ok(n as usize)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::pg::migrations::migrate;
    use corvid_kernel::pg::testing::TestPostgres;

    #[test]
    fn postgres_execution_logs_pass_the_contract() {
        let server = TestPostgres::start();
        super::super::contract::suite(&|| -> Box<dyn ExecutionLogRecords> {
            let db = server.database();
            let pg = Arc::new(db.connect());
            migrate(&pg, &[corvid_kernel::MIGRATIONS, crate::MIGRATIONS]).expect("migrate");
            Box::new(PgExecutionLog::new(pg))
        });
    }
}
