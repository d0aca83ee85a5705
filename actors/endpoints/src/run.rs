//! Running an endpoint: validation, the rate limit, then the cache, the materialized result
//! or a direct query, with one execution-log entry per run whatever happened.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::error::EndpointError;
use super::logs::{Level, LogEntry};
use super::materialize::Loaded;
use super::model::{Endpoint, EndpointVersion, MaterializationStatus};
use super::request::{Refresh, RunRequest};
use crate::{cache, materialize, request, Answer, Caller, Endpoints};
use corvid_query::{Page, QueryKind, RowLimits, BREAKDOWN_NULL, BREAKDOWN_OTHER};

impl Endpoints {
    /// Runs endpoint `name`: validates the request, answers from the cache, the materialized
    /// result or the events, and logs the execution either way.
    pub async fn run(
        &self,
        caller: &Caller,
        name: &str,
        body: Option<Value>,
        query: &HashMap<String, String>,
    ) -> Result<Value, EndpointError> {
        let endpoint = self
            .load(caller.project_id, name)
            .await?
            .filter(|e| e.is_active)
            .ok_or(EndpointError::NotFound)?;
        let started = Instant::now();
        let execution_id = Uuid::new_v4();
        let parsed = request::parse(body, query).and_then(|req| {
            let version = request::check(&endpoint, &req)?.clone();
            Ok((req, version))
        });
        let (req, version) = match parsed {
            Ok(ok) => ok,
            Err(e) => {
                self.record(
                    &endpoint,
                    execution_id,
                    Level::Error,
                    format!(
                        "Endpoint execution failed · invalid request · {}",
                        flattened(&e)
                    ),
                );
                return Err(e);
            }
        };
        let usable = usable_materialization(&version, req.refresh);
        if let Err(wait) = self.throttle.check(&caller.credential, usable.is_some()) {
            let refused = EndpointError::Throttled {
                retry_after_secs: wait.as_secs().max(1),
            };
            self.record(
                &endpoint,
                execution_id,
                Level::Error,
                format!(
                    "Endpoint execution failed · path={} version={} error={}",
                    if usable.is_some() {
                        "materialized"
                    } else {
                        "inline"
                    },
                    version.version,
                    refused.log_code()
                ),
            );
            return Err(refused);
        }
        let key = cache::key(
            endpoint.id,
            version.version,
            &req.variables,
            req.limit,
            req.offset,
        );
        let materialized_at = version.materialization.as_ref().and_then(|m| m.last_run_at);
        let cached = (req.refresh == Refresh::Cache)
            .then(|| {
                self.cache
                    .get(&key, version.data_freshness_seconds, materialized_at)
            })
            .flatten();
        let (mut body, rows, path, is_cached, computed_at) = match cached {
            Some(hit) => (
                hit.body.clone(),
                hit.rows,
                if hit.materialized {
                    "materialized"
                } else {
                    "inline"
                },
                true,
                hit.computed_at,
            ),
            None => {
                let now = Utc::now();
                match self
                    .compute(caller, &endpoint, &version, &req, usable)
                    .await
                {
                    Ok(answer) => {
                        self.cache.put(
                            key,
                            cache::Cached {
                                body: answer.body.clone(),
                                computed_at: now,
                                rows: answer.rows,
                                materialized: answer.path == "materialized",
                            },
                        );
                        (answer.body, answer.rows, answer.path, false, now)
                    }
                    Err((e, path)) => {
                        self.record(
                            &endpoint,
                            execution_id,
                            Level::Error,
                            format!(
                                "Endpoint execution failed · path={path} version={} error={}",
                                version.version,
                                e.log_code()
                            ),
                        );
                        return Err(e);
                    }
                }
            }
        };
        body.insert("is_cached".into(), Value::Bool(is_cached));
        body.insert("last_refresh".into(), json!(computed_at));
        body.insert("timezone".into(), json!(caller.timezone.name()));
        body.insert("query_status".into(), Value::Null);
        body.insert("error".into(), Value::Null);
        body.insert("name".into(), json!(endpoint.name));
        body.insert("execution_id".into(), json!(execution_id));
        body.insert("endpoint_version".into(), json!(version.version));
        body.insert(
            "endpoint_version_created_at".into(),
            json!(version.created_at),
        );
        if let Some(id) = &req.client_query_id {
            body.insert("client_query_id".into(), json!(id));
        }
        if !req.debug {
            body.remove("hogql");
            body.remove("timings");
        }
        let duration_ms = started.elapsed().as_millis();
        self.record(&endpoint, execution_id, Level::Info, format!(
            "Endpoint executed · path={path} cache={} duration_ms={duration_ms} rows={rows} version={}",
            if is_cached { "hit" } else { "miss" },
            version.version
        ));
        self.touch(&endpoint, version.version);
        // `results` first, as PostHog orders it.
        let mut out = Map::new();
        if let Some(results) = body.remove("results") {
            out.insert("results".into(), results);
        }
        out.extend(body);
        Ok(Value::Object(out))
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
            match self.read_materialized(version, req, &key, at).await {
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
        version: &EndpointVersion,
        req: &RunRequest,
        key: &str,
        at: DateTime<Utc>,
    ) -> Result<Answer, EndpointError> {
        let loaded = self.results.load(key, &version.query).await?;
        let mut body = Map::new();
        let rows = match loaded.as_ref() {
            Loaded::Sql { table, plan } => {
                let values: HashMap<String, Value> = req
                    .variables
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let all = table.select(plan, &values);
                let (page, has_more) = paginate(all, req.limit, req.offset);
                body.insert("columns".into(), json!(table.columns));
                body.insert("types".into(), json!(table.types));
                body.insert("hogql".into(), json!(plan.sql));
                let n = page.len();
                body.insert("results".into(), json!(page));
                body.insert("hasMore".into(), json!(has_more));
                n
            }
            Loaded::Insight { table, breakdowns } => {
                let mut items = table.select(breakdowns, &req.variables);
                clean_sentinels(&mut items);
                body.insert("hogql".into(), Value::String(String::new()));
                let n = items.len();
                body.insert("results".into(), Value::Array(items));
                body.insert("hasMore".into(), json!(false));
                n
            }
        };
        if let Some(limit) = req.limit {
            body.insert("limit".into(), json!(limit));
            body.insert("offset".into(), json!(req.offset.unwrap_or(0)));
        }
        body.insert("timings".into(), json!([]));
        body.insert("endpoint_materialized".into(), json!(true));
        body.insert("endpoint_materialized_at".into(), json!(at));
        Ok(Answer {
            body,
            rows,
            path: "materialized",
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
        let mut body = Map::new();
        let mut results = answer.results;
        if !version.is_hogql() {
            clean_sentinels(&mut results);
        }
        let rows = results.len();
        body.insert("results".into(), Value::Array(results));
        if let Some(c) = answer.columns {
            body.insert("columns".into(), json!(c));
        }
        if let Some(t) = answer.types {
            body.insert("types".into(), json!(t));
        }
        // Without pagination the whole result is returned: hasMore only describes pages.
        body.insert(
            "hasMore".into(),
            json!(req.limit.is_some() && answer.has_more),
        );
        if let Some(limit) = req.limit {
            body.insert("limit".into(), json!(limit));
            body.insert("offset".into(), json!(req.offset.unwrap_or(0)));
        }
        body.insert("hogql".into(), json!(answer.hogql));
        body.insert(
            "timings".into(),
            json!([{"k": "./execute", "t": answer.elapsed_secs}]),
        );
        body.insert("endpoint_materialized".into(), json!(false));
        Ok(Answer { body, rows, path })
    }
}

/// The stored result a run may read: enabled, completed, fresh, and not bypassed.
pub(super) fn usable_materialization(
    version: &EndpointVersion,
    refresh: Refresh,
) -> Option<(String, DateTime<Utc>)> {
    if refresh == Refresh::Direct {
        return None;
    }
    let m = version.materialization.as_ref()?;
    if m.status != MaterializationStatus::Completed {
        return None;
    }
    let at = m.last_run_at?;
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
