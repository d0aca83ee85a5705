//! Running an endpoint: validation, the rate limit, then the cache, the materialized result
//! or a direct query, with one execution-log entry per run whatever happened.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::error::EndpointError;
use super::logs::{Level, LogEntry};
use super::materialize::Loaded;
use super::model::{Endpoint, EndpointVersion, MaterializationStatus};
use super::request::{Refresh, RunRequest};
use crate::{cache, materialize, request, Answer, Caller, Endpoints};
use corvid_query::{Page, QueryKind, QueryResponse, RowLimits, BREAKDOWN_NULL, BREAKDOWN_OTHER};

/// What an endpoint run answers: PostHog's query answer and the run's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct RunAnswer {
    #[serde(flatten)]
    pub response: QueryResponse,
    /// Always `null`: runs are synchronous (PostHog keeps the key).
    pub query_status: Option<String>,
    pub name: String,
    /// The id of this run's execution-log entries.
    pub execution_id: Uuid,
    pub endpoint_version: u32,
    pub endpoint_version_created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_query_id: Option<String>,
    /// Whether the answer was read from the materialized result.
    pub endpoint_materialized: bool,
    /// When that result was computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_materialized_at: Option<DateTime<Utc>>,
}

impl Endpoints {
    /// Runs endpoint `name`: checks the request against its versions, answers from the cache,
    /// the materialized result or the events, and logs the execution either way.
    pub async fn run(
        &self,
        caller: &Caller,
        name: &str,
        req: RunRequest,
    ) -> Result<RunAnswer, EndpointError> {
        let endpoint = self.active(caller.project_id, name).await?;
        let execution_id = Uuid::new_v4();
        let version = match request::check(&endpoint, &req) {
            Ok(version) => version.clone(),
            Err(e) => return Err(self.refuse_invalid(&endpoint, execution_id, e)),
        };
        self.run_version(caller, &endpoint, version, req, execution_id)
            .await
    }

    /// Answers a run whose request could not be decoded (`RunRequest::from_parts` failed):
    /// a missing endpoint wins (404); otherwise the failure is logged and returned.
    pub async fn refuse(&self, caller: &Caller, name: &str, error: EndpointError) -> EndpointError {
        match self.active(caller.project_id, name).await {
            Ok(endpoint) => self.refuse_invalid(&endpoint, Uuid::new_v4(), error),
            Err(missing) => missing,
        }
    }

    async fn active(&self, project_id: u64, name: &str) -> Result<Arc<Endpoint>, EndpointError> {
        self.load(project_id, name)
            .await?
            .filter(|e| e.is_active)
            .ok_or(EndpointError::NotFound)
    }

    fn refuse_invalid(
        &self,
        endpoint: &Endpoint,
        execution_id: Uuid,
        error: EndpointError,
    ) -> EndpointError {
        let why = format!("invalid request · {}", flattened(&error));
        self.failed(endpoint, execution_id, why, error)
    }

    async fn run_version(
        &self,
        caller: &Caller,
        endpoint: &Endpoint,
        version: EndpointVersion,
        req: RunRequest,
        execution_id: Uuid,
    ) -> Result<RunAnswer, EndpointError> {
        let started = Instant::now();
        // An answer computed before the newest erasure or retention drop may hold what was
        // removed: neither a stored result nor a cached answer older than it is served.
        let erased_at = match self.engine.last_removal(caller.project_id).await {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(error = %e, "removals unreadable; computing the answer afresh");
                Some(Utc::now())
            }
        };
        let usable = usable_materialization(&version, req.refresh, erased_at);
        let path = if usable.is_some() {
            "materialized"
        } else {
            "inline"
        };
        if let Err(wait) = self.throttle.check(&caller.credential, usable.is_some()) {
            let refused = EndpointError::Throttled {
                retry_after_secs: wait.as_secs().max(1),
            };
            let why = failure(path, &version, &refused, started);
            return Err(self.failed(endpoint, execution_id, why, refused));
        }
        let key = self.cache_key(endpoint, &version, &req);
        let (answer, is_cached) = match self.cached(&key, &version, req.refresh, erased_at) {
            Some(hit) => (hit, true),
            None => match self.compute(caller, endpoint, &version, &req, usable).await {
                Ok(answer) => {
                    self.cache.put(key, answer.clone());
                    (answer, false)
                }
                Err((e, path)) => {
                    let why = failure(path, &version, &e, started);
                    return Err(self.failed(endpoint, execution_id, why, e));
                }
            },
        };
        let duration_ms = started.elapsed().as_millis();
        self.record(
            endpoint,
            execution_id,
            Level::Info,
            format!(
                "Endpoint executed · path={} cache={} duration_ms={duration_ms} rows={} version={}",
                answer.path,
                if is_cached { "hit" } else { "miss" },
                answer.rows,
                version.version
            ),
        );
        self.touch(endpoint, version.version);
        let mut response = answer.response;
        response.is_cached = is_cached;
        response.timezone = caller.timezone.name().to_string();
        if !req.debug {
            response.hogql = None;
            response.timings = None;
        }
        Ok(RunAnswer {
            response,
            query_status: None,
            name: endpoint.name.clone(),
            execution_id,
            endpoint_version: version.version,
            endpoint_version_created_at: version.created_at,
            client_query_id: req.client_query_id,
            endpoint_materialized: answer.materialized_at.is_some(),
            endpoint_materialized_at: answer.materialized_at,
        })
    }

    /// Logs a run that failed (`why` follows "Endpoint execution failed · ", the status its
    /// answer has comes last) and hands its error back.
    fn failed(
        &self,
        endpoint: &Endpoint,
        execution_id: Uuid,
        why: String,
        error: EndpointError,
    ) -> EndpointError {
        let message = format!(
            "Endpoint execution failed · {why} status={}",
            error.http_status()
        );
        self.record(endpoint, execution_id, Level::Error, message);
        error
    }

    fn cache_key(
        &self,
        endpoint: &Endpoint,
        version: &EndpointVersion,
        req: &RunRequest,
    ) -> String {
        cache::key(
            endpoint.id,
            version.version,
            &req.variables,
            req.limit,
            req.offset,
        )
    }

    /// A fresh cached answer computed after `erased_at`, unless the request skips the cache.
    fn cached(
        &self,
        key: &str,
        version: &EndpointVersion,
        refresh: Refresh,
        erased_at: Option<DateTime<Utc>>,
    ) -> Option<Answer> {
        if refresh != Refresh::Cache {
            return None;
        }
        let materialized_at = version.materialization.as_ref().and_then(|m| m.last_run_at);
        let not_before = materialized_at.max(erased_at);
        let mut hit = self
            .cache
            .get(key, version.data_freshness_seconds, not_before)?;
        if hit.materialized_at.is_none() {
            hit.path = "inline";
        }
        Some(hit)
    }

    pub(super) fn record(
        &self,
        endpoint: &Endpoint,
        instance_id: Uuid,
        level: Level,
        message: String,
    ) {
        self.log.record(LogEntry {
            project_id: endpoint.project_id,
            endpoint_id: endpoint.id,
            instance_id,
            timestamp: Utc::now(),
            level,
            message,
        });
    }

    /// Writes `last_executed_at` at most every 30 minutes (PostHog's throttle).
    pub(super) fn touch(&self, endpoint: &Endpoint, version: u32) {
        let now = Utc::now();
        if endpoint
            .last_executed_at
            .is_some_and(|t| now.signed_duration_since(t) < chrono::TimeDelta::minutes(30))
        {
            return;
        }
        let store = Arc::clone(&self.store);
        let (project, name, id) = (endpoint.project_id, endpoint.name.clone(), endpoint.id);
        tokio::task::spawn_blocking(move || {
            let _ = store.update_by_id(project, &name, id, |e| {
                e.last_executed_at = Some(now);
                if let Some(v) = e.version_mut(version) {
                    v.last_executed_at = Some(now);
                }
            });
        });
    }

    pub(super) async fn compute(
        &self,
        caller: &Caller,
        endpoint: &Endpoint,
        version: &EndpointVersion,
        req: &RunRequest,
        usable: Option<(String, DateTime<Utc>)>,
    ) -> Result<Answer, (EndpointError, &'static str)> {
        if let Some((key, at)) = usable {
            match self
                .read_materialized(caller.timezone, version, req, &key, at)
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(e) => {
                    tracing::warn!(endpoint = %endpoint.name, version = version.version, error = %e,
                        "materialized read failed; running the query directly");
                    return self
                        .inline(caller, version, req, "materialized_fallback")
                        .await;
                }
            }
        }
        let path = if version.is_materialized() && req.refresh != Refresh::Direct {
            tracing::info!(endpoint = %endpoint.name, version = version.version,
                "materialization not ready or stale; running the query directly");
            "materialized_fallback"
        } else {
            "inline"
        };
        self.inline(caller, version, req, path).await
    }

    pub(super) async fn read_materialized(
        &self,
        timezone: Tz,
        version: &EndpointVersion,
        req: &RunRequest,
        key: &str,
        at: DateTime<Utc>,
    ) -> Result<Answer, EndpointError> {
        let loaded = self.results.load(key, &version.query).await?;
        let mut response = match loaded.as_ref() {
            Loaded::Sql { table, plan } => {
                let values: HashMap<String, Value> = req
                    .variables
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let all = table.select(plan, &values);
                let (page, has_more) = paginate(all, req.limit, req.offset);
                QueryResponse {
                    columns: Some(table.columns.clone()),
                    types: Some(table.types.clone()),
                    hogql: Some(plan.sql.clone()),
                    has_more,
                    ..QueryResponse::of(page.into_iter().map(Value::Array).collect(), timezone)
                }
            }
            Loaded::Insight { table, breakdowns } => {
                let mut items = table.select(breakdowns, &req.variables);
                clean_sentinels(&mut items);
                QueryResponse {
                    hogql: Some(String::new()),
                    ..QueryResponse::of(items, timezone)
                }
            }
        };
        if let Some(limit) = req.limit {
            response.limit = Some(limit);
            response.offset = Some(req.offset.unwrap_or(0));
        }
        response.timings = Some(Vec::new());
        Ok(Answer {
            rows: response.results.len(),
            response,
            path: "materialized",
            materialized_at: Some(at),
        })
    }

    pub(super) async fn inline(
        &self,
        caller: &Caller,
        version: &EndpointVersion,
        req: &RunRequest,
        path: &'static str,
    ) -> Result<Answer, (EndpointError, &'static str)> {
        let fail = |e: EndpointError| (e, path);
        // Only runs that query count against the credential's concurrent queries.
        let _running = self
            .engine
            .admit(&caller.credential)
            .map_err(|e| fail(e.into()))?;
        let mut query = version.query.clone();
        let mut overrides = HashMap::new();
        if version.is_hogql() {
            overrides = req
                .variables
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        } else {
            materialize::prepare_insight(&mut query);
            apply_insight_variables(&mut query, &req.variables).map_err(fail)?;
        }
        let kind: QueryKind = serde_json::from_value(query)
            .map_err(|e| fail(EndpointError::invalid("query", e.to_string())))?;
        let max = self.engine.settings().max_rows;
        let limits = RowLimits {
            default_rows: max,
            max_rows: max,
            page: req.limit.map(|limit| Page {
                limit,
                offset: req.offset.unwrap_or(0),
            }),
        };
        let answer = self
            .engine
            .insight_within(caller.project_id, caller.timezone, kind, &overrides, limits)
            .await
            .map_err(|e| fail(e.into()))?;
        let has_more = req.limit.is_some() && answer.has_more;
        let mut response = answer.into_response(caller.timezone);
        if !version.is_hogql() {
            clean_sentinels(&mut response.results);
        }
        // Without pagination the whole result is returned: hasMore only describes pages.
        response.has_more = has_more;
        if let Some(limit) = req.limit {
            response.limit = Some(limit);
            response.offset = Some(req.offset.unwrap_or(0));
        }
        Ok(Answer {
            rows: response.results.len(),
            response,
            path,
            materialized_at: None,
        })
    }
}

/// Where a run failed, as its log entry says it: the path, the version and the error's code.
/// A failed run's fields (logfmt, as log search reads them).
fn failure(
    path: &str,
    version: &EndpointVersion,
    error: &EndpointError,
    started: std::time::Instant,
) -> String {
    format!(
        "path={path} version={} error={} duration_ms={}",
        version.version,
        error.log_code(),
        started.elapsed().as_millis()
    )
}

/// The stored result a run may read: enabled, completed, fresh, computed after the newest
/// erasure (`erased_at`), and not bypassed.
pub(super) fn usable_materialization(
    version: &EndpointVersion,
    refresh: Refresh,
    erased_at: Option<DateTime<Utc>>,
) -> Option<(String, DateTime<Utc>)> {
    if refresh == Refresh::Direct {
        return None;
    }
    let m = version.materialization.as_ref()?;
    if m.status != MaterializationStatus::Completed {
        return None;
    }
    let at = m.last_run_at?;
    if erased_at.is_some_and(|erased| at < erased) {
        return None;
    }
    let fresh_until = corvid_kernel::time::add_or_max(
        at,
        corvid_kernel::time::seconds(version.data_freshness_seconds),
    );
    let key = m.object_key.clone()?;
    (Utc::now() < fresh_until).then_some((key, at))
}

pub(super) fn paginate(
    rows: Vec<Vec<Value>>,
    limit: Option<usize>,
    offset: Option<usize>,
) -> (Vec<Vec<Value>>, bool) {
    let Some(limit) = limit else {
        return (rows, false);
    };
    let total = rows.len();
    let start = offset.unwrap_or(0).min(total);
    let end = start.saturating_add(limit).min(total);
    let has_more = end < total;
    (
        rows.into_iter().skip(start).take(end - start).collect(),
        has_more,
    )
}

/// Insight variables: breakdown values become exact property filters (all must match; `''`
/// means "not set"); `date_from` / `date_to` replace the date range.
pub(super) fn apply_insight_variables(
    query: &mut Value,
    variables: &Map<String, Value>,
) -> Result<(), EndpointError> {
    if variables.is_empty() {
        return Ok(());
    }
    let breakdowns: Vec<(String, Option<String>)> = query
        .get("breakdownFilter")
        .filter(|f| !f.is_null())
        .and_then(|f| serde_json::from_value::<corvid_query::BreakdownFilter>(f.clone()).ok())
        .and_then(|f| f.list().ok())
        .unwrap_or_default();
    let mut filters = Vec::new();
    for (key, value) in variables {
        if key == "date_from" || key == "date_to" {
            let Some(text) = value.as_str() else {
                return Err(EndpointError::invalid(
                    "variables",
                    format!("{key} must be a date (YYYY-MM-DD)."),
                ));
            };
            if chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").is_err() {
                return Err(EndpointError::invalid(
                    "variables",
                    format!("{key} must be a date (YYYY-MM-DD), got '{text}'."),
                ));
            }
            member_object(query, "dateRange")?.insert(key.clone(), json!(text));
            continue;
        }
        let Some((_, kind)) = breakdowns.iter().find(|(p, _)| p == key) else {
            return Err(EndpointError::invalid(
                "variables",
                format!("Could not apply filter for breakdown variable '{key}'"),
            ));
        };
        let kind = kind.clone().unwrap_or_else(|| "event".into());
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        filters.push(if text.is_empty() {
            json!({"key": key, "type": kind, "operator": "is_not_set"})
        } else {
            json!({"key": key, "type": kind, "operator": "exact", "value": text})
        });
    }
    if !filters.is_empty() {
        let existing = query.get("properties").cloned().unwrap_or(Value::Null);
        let mut groups = vec![json!({"type": "AND", "values": filters})];
        match existing {
            Value::Null => {}
            Value::Array(list) if list.is_empty() => {}
            Value::Array(list) => groups.push(json!({"type": "AND", "values": list})),
            group => groups.push(group),
        }
        let Some(object) = query.as_object_mut() else {
            return Err(not_an_object("query"));
        };
        object.insert(
            "properties".into(),
            json!({"type": "AND", "values": groups}),
        );
    }
    Ok(())
}

fn not_an_object(what: &str) -> EndpointError {
    EndpointError::invalid(
        "query",
        format!("The endpoint's {what} is not a JSON object."),
    )
}

/// `query[name]` as an object to add members to (created when missing or null). A stored query
/// of another shape is refused, never indexed into (which would panic).
fn member_object<'a>(
    query: &'a mut Value,
    name: &str,
) -> Result<&'a mut Map<String, Value>, EndpointError> {
    let member = query
        .as_object_mut()
        .ok_or_else(|| not_an_object("query"))?
        .entry(name)
        .or_insert(Value::Null);
    if member.is_null() {
        *member = Value::Object(Map::new());
    }
    member.as_object_mut().ok_or_else(|| not_an_object(name))
}

/// Endpoint answers show breakdown sentinels as `null` and `"Other"`.
pub(super) fn clean_sentinels(items: &mut [Value]) {
    pub(super) fn clean(v: &mut Value) {
        match v {
            Value::String(s) if s == BREAKDOWN_NULL || s.is_empty() => *v = Value::Null,
            Value::String(s) if s == BREAKDOWN_OTHER => *v = Value::String("Other".into()),
            Value::Array(list) => list.iter_mut().for_each(clean),
            _ => {}
        }
    }
    for item in items {
        if let Some(b) = item.get_mut("breakdown_value") {
            clean(b);
        }
        if let Some(Value::String(label)) = item.get_mut("label") {
            if label.contains(BREAKDOWN_NULL) || label.contains(BREAKDOWN_OTHER) {
                *label = label
                    .replace(BREAKDOWN_NULL, "null")
                    .replace(BREAKDOWN_OTHER, "Other");
            }
        }
    }
}

/// A validation error as one log line: `attr: detail`.
pub(super) fn flattened(e: &EndpointError) -> String {
    match e {
        EndpointError::Invalid {
            attr: Some(a),
            detail,
        } => format!("{a}: {detail}"),
        other => other.to_string(),
    }
}
