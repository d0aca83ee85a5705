//! Query kinds of `POST /api/projects/{id}/query/`: `HogQLQuery`, `TrendsQuery` and
//! `RetentionQuery`, each compiled to one SQL statement for the engine.

pub(crate) mod dates;
pub(crate) mod filters;
pub(crate) mod retention;
pub(crate) mod trends;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Deserialize;
use serde_json::{Map, Value};

pub use super::hogql::Generated;
use super::hogql::{self, Bindings, Prepared};
use super::{QueryEngine, QueryError, QueryOutput};
use filters::{properties_sql, Properties};

/// Breakdown value standing for "no value" (PostHog's sentinel).
pub const BREAKDOWN_NULL: &str = "$$_posthog_breakdown_null_$$";
/// Breakdown value standing for every value past the breakdown limit.
pub const BREAKDOWN_OTHER: &str = "$$_posthog_breakdown_other_$$";

#[derive(Debug, Clone, Deserialize, Default)]
pub struct DateRangeSpec {
    pub date_from: Option<String>,
    pub date_to: Option<String>,
}

/// `HogQLQuery`: SQL text with optional `{variables.x}` values, `{name}` values and `{filters}`.
#[derive(Debug, Clone, Deserialize)]
pub struct HogQlQuery {
    pub query: String,
    /// Values of `{variables.<code_name>}`, keyed by variable id, as PostHog stores them.
    pub variables: Option<Map<String, Value>>,
    pub filters: Option<HogQlFilters>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct HogQlFilters {
    #[serde(rename = "dateRange", default)]
    pub date_range: Option<DateRangeSpec>,
    #[serde(default)]
    pub properties: Properties,
}

/// The `query` object of a query request, by `kind`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind")]
pub enum QueryKind {
    #[serde(rename = "HogQLQuery")]
    HogQl(HogQlQuery),
    #[serde(rename = "TrendsQuery")]
    Trends(Box<trends::TrendsQuery>),
    #[serde(rename = "RetentionQuery")]
    Retention(Box<retention::RetentionQuery>),
}

impl QueryKind {
    /// Checks what can be checked without data: an insight compiles (dates, intervals,
    /// breakdowns, series), so one that could never run is refused when it is saved rather
    /// than failing every run or the materializer.
    pub fn check(&self) -> Result<(), QueryError> {
        let now = Utc::now();
        match self {
            QueryKind::HogQl(_) => Ok(()),
            QueryKind::Trends(q) => trends::compile((**q).clone(), Tz::UTC, now).map(|_| ()),
            QueryKind::Retention(q) => retention::compile((**q).clone(), Tz::UTC, now).map(|_| ()),
        }
    }
}

/// What a query answers, whatever its kind.
#[derive(Debug, Clone)]
pub struct QueryAnswer {
    /// Row arrays for SQL; series or cohort objects for insights.
    pub results: Vec<Value>,
    /// Column names and `[name, type]` pairs (SQL only).
    pub columns: Option<Vec<String>>,
    pub types: Option<Vec<(String, String)>>,
    pub has_more: bool,
    /// The statement as run.
    pub hogql: String,
    pub elapsed_secs: f64,
}

impl From<QueryOutput> for QueryAnswer {
    fn from(out: QueryOutput) -> Self {
        QueryAnswer {
            results: out.rows.into_iter().map(Value::Array).collect(),
            columns: Some(out.columns),
            types: Some(out.types),
            has_more: out.has_more,
            hogql: out.sql,
            elapsed_secs: out.elapsed.as_secs_f64(),
        }
    }
}

/// `{variables.x}` values from a `HogQLQuery.variables` map (`{id: {code_name, value}}`),
/// overridden by `overrides` (code name → value).
pub fn variable_values(
    stored: Option<&Map<String, Value>>,
    overrides: &HashMap<String, Value>,
) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    for v in stored.into_iter().flat_map(|m| m.values()) {
        let Some(code) = v.get("code_name").and_then(Value::as_str) else {
            continue;
        };
        let value = if v.get("isNull").and_then(Value::as_bool) == Some(true) {
            Value::Null
        } else {
            match v.get("value") {
                Some(value) => value.clone(),
                None => continue,
            }
        };
        out.insert(code.to_string(), value);
    }
    out.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// What `{filters}` becomes for `filters`.
pub fn hogql_filters(
    filters: &HogQlFilters,
    tz: Tz,
    now: DateTime<Utc>,
) -> Result<Generated, QueryError> {
    let mut sql = Generated::default();
    let mut parts = Vec::new();
    if let Some(range) = &filters.date_range {
        let r = dates::resolve(
            range.date_from.as_deref(),
            range.date_to.as_deref(),
            dates::Interval::Day,
            tz,
            now,
            None,
        )?;
        let from = sql.bind(dates::utc_text(r.from));
        let to = sql.bind(dates::utc_text(r.to));
        parts.push(format!("timestamp >= {from} AND timestamp <= {to}"));
    }
    parts.push(properties_sql(&mut sql, &filters.properties)?);
    sql.sql = parts.join(" AND ");
    Ok(sql)
}

/// Runs a query of any kind for `project_id` (timezone `tz`), with run-time variable values.
impl QueryEngine {
    /// Runs a HogQL, trends or retention query for `project_id` within the configured row
    /// limits.
    pub async fn insight(
        &self,
        project_id: u64,
        tz: Tz,
        query: QueryKind,
        variables: &HashMap<String, Value>,
    ) -> Result<QueryAnswer, QueryError> {
        run(self, project_id, tz, query, variables).await
    }

    /// [`QueryEngine::insight`] with explicit row limits for SQL (endpoint runs page through
    /// results).
    pub async fn insight_within(
        &self,
        project_id: u64,
        tz: Tz,
        query: QueryKind,
        variables: &HashMap<String, Value>,
        limits: hogql::RowLimits,
    ) -> Result<QueryAnswer, QueryError> {
        run_with_limits(self, project_id, tz, query, variables, limits).await
    }

    /// Runs SQL another domain generated for its own reports (survey statistics, experiment
    /// results), with every value bound apart; it may return up to the insight row ceiling.
    pub async fn generated(
        &self,
        project_id: u64,
        sql: &Generated,
    ) -> Result<QueryOutput, QueryError> {
        run_generated(self, project_id, sql).await
    }
}

pub async fn run(
    engine: &QueryEngine,
    project_id: u64,
    tz: Tz,
    query: QueryKind,
    variables: &HashMap<String, Value>,
) -> Result<QueryAnswer, QueryError> {
    let limits = engine.settings().row_limits();
    run_with_limits(engine, project_id, tz, query, variables, limits).await
}

/// [`run`] with explicit row limits for SQL (endpoint runs page through results).
pub async fn run_with_limits(
    engine: &QueryEngine,
    project_id: u64,
    tz: Tz,
    query: QueryKind,
    variables: &HashMap<String, Value>,
    limits: hogql::RowLimits,
) -> Result<QueryAnswer, QueryError> {
    let now = Utc::now();
    match query {
        QueryKind::HogQl(q) => {
            let filters = q
                .filters
                .as_ref()
                .map(|f| hogql_filters(f, tz, now))
                .transpose()?;
            let bindings = Bindings {
                variables: variable_values(q.variables.as_ref(), variables),
                filters: filters.as_ref(),
                variable_markers: false,
            };
            let prepared = hogql::prepare_user_sql(&q.query, &bindings, limits)?;
            Ok(engine.run(project_id, prepared).await?.into())
        }
        QueryKind::Trends(q) => {
            let plan = trends::compile(*q, tz, now)?;
            let out = engine.run(project_id, generated(&plan.sql)?).await?;
            let (results, has_more) = trends::shape(&plan, &out.rows);
            Ok(insight_answer(results, has_more, out))
        }
        QueryKind::Retention(q) => {
            let plan = retention::compile(*q, tz, now)?;
            let out = engine.run(project_id, generated(&plan.sql)?).await?;
            let (results, has_more) = retention::shape(&plan, &out.rows);
            Ok(insight_answer(results, has_more, out))
        }
    }
}

/// Runs SQL another domain generated for its own reports (survey statistics, experiment
/// results), with every value bound apart; it may return up to the insight row ceiling.
pub async fn run_generated(
    engine: &QueryEngine,
    project_id: u64,
    sql: &Generated,
) -> Result<QueryOutput, QueryError> {
    engine.run(project_id, generated(sql)?).await
}

/// Insight SQL returns whatever rows it computes; the user row limits do not apply.
fn generated(sql: &Generated) -> Result<Prepared, QueryError> {
    hogql::prepare_generated(
        sql,
        hogql::RowLimits {
            default_rows: INSIGHT_MAX_ROWS,
            max_rows: INSIGHT_MAX_ROWS,
            page: None,
        },
    )
}

/// Rows an insight's SQL may produce (buckets × breakdown values × series).
const INSIGHT_MAX_ROWS: usize = 5_000_000;

fn insight_answer(results: Vec<Value>, has_more: bool, out: QueryOutput) -> QueryAnswer {
    QueryAnswer {
        results,
        columns: None,
        types: None,
        has_more,
        hogql: out.sql,
        elapsed_secs: out.elapsed.as_secs_f64(),
    }
}

#[cfg(test)]
mod tests;
