//! Materialization: eligibility and transform ([`plan`]), computing and storing results as
//! Arrow IPC ([`storage`]), reading them back into memory and selecting rows by variables
//! ([`table`]), and the [`Materializer`] actor that keeps them fresh.

mod actor;
pub(crate) mod storage;
pub(crate) mod table;

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use chrono_tz::Tz;
use dashmap::DashMap;
use serde_json::{json, Value};

pub use actor::{GetMaterializerStats, Kick, Materializer, MaterializerStats};
use corvid_query::{MaterializationPlan as Plan, SqlPlan};
use storage::ResultStorage;
use table::{InsightTable, SqlTable};

use super::error::EndpointError;
use corvid_query::QueryEngine;
use corvid_query::{Bindings, QueryKind, RowLimits};

/// Breakdown values kept per insight on endpoints (PostHog's `ENDPOINT_BREAKDOWN_LIMIT`).
pub const ENDPOINT_BREAKDOWN_LIMIT: usize = 10_000;

/// A stored result in memory, with the plan that reads it.
#[derive(Debug)]
pub enum Loaded {
    Sql {
        table: SqlTable,
        plan: Box<SqlPlan>,
    },
    Insight {
        table: InsightTable,
        breakdowns: Vec<String>,
    },
}

/// Stored results, each loaded once per object key (objects are never rewritten in place).
pub struct Results {
    storage: ResultStorage,
    loaded: DashMap<String, Arc<Loaded>>,
    /// Rows a materialized SQL result may hold.
    max_rows: usize,
}

impl Results {
    pub fn new(storage: ResultStorage, max_rows: usize) -> Results {
        Results {
            storage,
            loaded: DashMap::new(),
            max_rows,
        }
    }

    pub fn storage(&self) -> &ResultStorage {
        &self.storage
    }

    /// The result at `key`, computed from `query` (the version's query), loading it once.
    pub async fn load(&self, key: &str, query: &Value) -> Result<Arc<Loaded>, EndpointError> {
        if let Some(hit) = self.loaded.get(key) {
            return Ok(Arc::clone(hit.value()));
        }
        let plan = corvid_query::materialization_plan(query)
            .map_err(|refusal| EndpointError::Storage(refusal.into()))?;
        let (schema, batches) = self.storage.read(key).await?;
        let loaded = Arc::new(match plan {
            Plan::Sql(plan) => Loaded::Sql {
                table: SqlTable::from_arrow(&schema, &batches),
                plan: Box::new(plan),
            },
            Plan::Insight { breakdowns } => Loaded::Insight {
                table: InsightTable::from_arrow(&batches),
                breakdowns,
            },
        });
        self.loaded.insert(key.to_string(), Arc::clone(&loaded));
        Ok(loaded)
    }

    /// Forgets a loaded result (its object was superseded).
    pub fn evict(&self, key: &str) {
        self.loaded.remove(key);
    }

    /// Computes `query`'s materialized result for `project_id`.
    pub async fn compute(
        &self,
        engine: &QueryEngine,
        project_id: u64,
        tz: Tz,
        query: &Value,
    ) -> Result<(SchemaRef, Vec<RecordBatch>), EndpointError> {
        match corvid_query::materialization_plan(query)
            .map_err(|r| EndpointError::invalid("query", r))?
        {
            Plan::Sql(plan) => {
                let limits = RowLimits {
                    default_rows: self.max_rows,
                    max_rows: self.max_rows,
                    page: None,
                };
                let prepared =
                    corvid_query::prepare_user_sql(&plan.sql, &Bindings::default(), limits)?;
                let out = engine.run_arrow(project_id, prepared).await?;
                let rows: usize = out.batches.iter().map(|b| b.num_rows()).sum();
                if rows > self.max_rows {
                    return Err(EndpointError::Storage(
                        format!(
                            "the materialized result has more than {} rows; narrow the query",
                            self.max_rows
                        )
                        .into(),
                    ));
                }
                Ok((out.schema, out.batches))
            }
            Plan::Insight { .. } => {
                let mut query = query.clone();
                prepare_insight(&mut query);
                let kind: QueryKind = serde_json::from_value(query)
                    .map_err(|e| EndpointError::invalid("query", e.to_string()))?;
                let answer = engine
                    .insight(project_id, tz, kind, &Default::default())
                    .await?;
                insight_batch(&answer.results)
            }
        }
    }
}

/// Endpoints keep every breakdown value: no "Other" bucket hides one a run may ask for.
pub fn prepare_insight(query: &mut Value) {
    if let Some(filter) = query.get_mut("breakdownFilter").filter(|f| f.is_object()) {
        filter["breakdown_limit"] = json!(ENDPOINT_BREAKDOWN_LIMIT);
        filter["breakdown_hide_other_aggregation"] = json!(false);
    }
}

fn insight_batch(items: &[Value]) -> Result<(SchemaRef, Vec<RecordBatch>), EndpointError> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        InsightTable::COLUMN,
        DataType::Utf8,
        false,
    )]));
    let texts: Vec<String> = items.iter().map(Value::to_string).collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(StringArray::from(texts))],
    )
    .map_err(|e| EndpointError::Storage(Box::new(e)))?;
    Ok((schema, vec![batch]))
}
