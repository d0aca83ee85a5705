//! Reading a project's events out in bulk: the rows an export selects, in PostHog's export
//! columns, streamed batch by batch with no row limit (a query returns at most
//! `query.max_rows`). Erased events are left out as from every other read.

use std::collections::BTreeSet;
use std::time::Duration;

use arrow::array::RecordBatch;
use chrono::{DateTime, SecondsFormat, Utc};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::parser::Parser;
use futures_util::StreamExt;

use super::engine::{session, QueryEngine};
use super::error::QueryError;
use super::hogql::{dialect, Prepared};

/// Which events an export reads: those captured (received by Corvid) in `[start, end)`,
/// only the `include`d event names when any are given, never the `exclude`d ones. Capture
/// time, not event time, so late events are never missed.
#[derive(Debug, Clone)]
pub struct ExportScan {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

/// Receives each batch of an export (on the query runtime); an `Err` stops the export.
pub type ExportSink = Box<dyn FnMut(&RecordBatch) -> Result<(), String> + Send>;

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn names(names: &[String]) -> String {
    names
        .iter()
        .map(|n| literal(n))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ExportScan {
    /// The statement: PostHog's default export columns (`uuid, timestamp, _inserted_at,
    /// created_at, event, properties, distinct_id, elements_chain, person_properties,
    /// person_id`), `properties` and `person_properties` as JSON text.
    fn sql(&self) -> String {
        let time = |t: DateTime<Utc>| literal(&t.to_rfc3339_opts(SecondsFormat::Micros, true));
        let mut sql = format!(
            "SELECT uuid, timestamp, created_at AS _inserted_at, created_at, event, properties, \
             distinct_id, '' AS elements_chain, person_properties, person_id FROM events \
             WHERE created_at >= {} AND created_at < {}",
            time(self.start),
            time(self.end)
        );
        if !self.include.is_empty() {
            sql.push_str(&format!(" AND event IN ({})", names(&self.include)));
        }
        if !self.exclude.is_empty() {
            sql.push_str(&format!(" AND event NOT IN ({})", names(&self.exclude)));
        }
        sql
    }
}

impl QueryEngine {
    /// Streams `project`'s events `scan` selects to `sink`, on the query runtime, within
    /// `deadline`; waits for a query slot rather than failing. Returns the rows written.
    pub async fn export_events(
        &self,
        project: u64,
        scan: ExportScan,
        deadline: Duration,
        sink: ExportSink,
    ) -> Result<u64, QueryError> {
        self.stream_sql(project, &scan.sql(), deadline, sink).await
    }

    /// When `project`'s first stored event was captured (`None`: it has none), within
    /// `deadline`: where a backfill "from the beginning" starts.
    pub async fn first_capture(
        &self,
        project: u64,
        deadline: Duration,
    ) -> Result<Option<DateTime<Utc>>, QueryError> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::TimestampMicrosecondType;
        let first = std::sync::Arc::new(std::sync::Mutex::new(None));
        let found = std::sync::Arc::clone(&first);
        self.stream_sql(
            project,
            "SELECT min(created_at) AS first FROM events",
            deadline,
            Box::new(move |batch| {
                let column = batch.column(0);
                let cast = arrow::compute::cast(
                    column,
                    &arrow::datatypes::DataType::Timestamp(
                        arrow::datatypes::TimeUnit::Microsecond,
                        None,
                    ),
                )
                .map_err(|e| e.to_string())?;
                let times = cast.as_primitive::<TimestampMicrosecondType>();
                if !times.is_empty() && !times.is_null(0) {
                    *found.lock().unwrap_or_else(|p| p.into_inner()) =
                        DateTime::<Utc>::from_timestamp_micros(times.value(0));
                }
                Ok(())
            }),
        )
        .await?;
        let first = *first.lock().unwrap_or_else(|p| p.into_inner());
        Ok(first)
    }

    /// Streams the rows of one statement over `project`'s events to `sink`.
    async fn stream_sql(
        &self,
        project: u64,
        sql: &str,
        deadline: Duration,
        mut sink: ExportSink,
    ) -> Result<u64, QueryError> {
        let statement = Parser::parse_sql(&dialect(), sql)
            .map_err(|e| QueryError::Internal(Box::new(e)))?
            .pop()
            .ok_or_else(|| QueryError::Invalid("empty export statement".into()))?;
        let prepared = Prepared {
            statement,
            returned_rows: usize::MAX,
            tables: BTreeSet::from(["events".to_string()]),
        };
        let (sources, settings, memory) = self.parts();
        let slot = QueryEngine::waiting(self.slot()).await?;
        let handle = self.runtime_handle().spawn(async move {
            let _slot = slot;
            let run = async {
                let internal =
                    |e: datafusion::error::DataFusionError| QueryError::Internal(Box::new(e));
                let (ctx, events) =
                    session(project, &prepared, &sources, &settings, memory).await?;
                if let Some(events) = events {
                    ctx.register_table("events", events.table(&BTreeSet::new()).map_err(internal)?)
                        .map_err(internal)?;
                }
                let plan = ctx
                    .state()
                    .statement_to_plan(DfStatement::Statement(Box::new(prepared.statement)))
                    .await
                    .map_err(internal)?;
                let mut stream = ctx
                    .execute_logical_plan(plan)
                    .await
                    .map_err(internal)?
                    .execute_stream()
                    .await
                    .map_err(internal)?;
                let mut rows = 0u64;
                while let Some(batch) = stream.next().await {
                    let batch = batch.map_err(internal)?;
                    rows += batch.num_rows() as u64;
                    sink(&batch).map_err(QueryError::Invalid)?;
                }
                Ok(rows)
            };
            match tokio::time::timeout(deadline, run).await {
                Ok(result) => result,
                Err(_) => Err(QueryError::Timeout(deadline)),
            }
        });
        handle
            .await
            .map_err(|e| QueryError::Internal(Box::new(e)))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_as_sql_literals() {
        let scan = ExportScan {
            start: "2026-01-01T00:00:00Z".parse().expect("time"),
            end: "2026-01-02T00:00:00Z".parse().expect("time"),
            include: vec!["it's".into()],
            exclude: vec!["$pageleave".into()],
        };
        let sql = scan.sql();
        assert!(sql.contains("event IN ('it''s')"), "{sql}");
        assert!(sql.contains("event NOT IN ('$pageleave')"), "{sql}");
        assert!(
            sql.contains("created_at >= '2026-01-01T00:00:00.000000Z'"),
            "{sql}"
        );
    }
}
