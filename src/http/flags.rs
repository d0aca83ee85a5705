//! Feature flags: definitions (`/api/projects/{id}/feature_flags/`), evaluation (`POST /flags`)
//! and definitions for SDK local evaluation (`/flags/definitions`,
//! `/api/feature_flag/local_evaluation`).

use std::collections::{BTreeMap, HashMap};

use actix_web::http::header;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_actors::flags::engine::dependencies;
use corvid_actors::flags::evaluate::{
    cached_stored, evaluate, load_stored, selected_flags, FlagsOutcome, StoredData,
};
use corvid_actors::flags::model::{FlagDefinition, FlagFilters};
use corvid_actors::flags::properties::MatchContext;
use corvid_actors::flags::request::{decode_body, detect_runtime, parse_request, FlagRequestError};
use corvid_actors::flags::store::FlagRecord;
use corvid_actors::flags::validate::validate_flag;
use corvid_actors::wire::WireInput;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::body::{read_body, ValidJson};
use super::project_route;
use crate::auth::scope::{FeatureFlagRead, FeatureFlagWrite};
use crate::auth::{resolve_project_token, Authed, ProjectAccess};
use crate::error::ApiError;
use crate::state::AppState;
use crate::telemetry::RequestProject;

pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/feature_flags", || web::get().to(list));
    project_route(cfg, "/feature_flags", || web::post().to(create));
    project_route(cfg, "/feature_flags/{flag_id}", || web::get().to(get));
    project_route(cfg, "/feature_flags/{flag_id}", || web::patch().to(update));
    project_route(cfg, "/feature_flags/{flag_id}", || web::delete().to(delete));
}

/// The public evaluation and definitions routes (static paths; registered first, see
/// [`super::configure`]).
pub fn configure_public(cfg: &mut web::ServiceConfig) {
    cfg.route("/flags", web::post().to(flags))
        .route("/decide", web::post().to(decide))
        .route("/flags/definitions", web::get().to(definitions))
        .route(
            "/api/feature_flag/local_evaluation",
            web::get().to(definitions),
        );
}

fn flag_json(r: &FlagRecord) -> Value {
    let d = &r.definition;
    json!({
        "id": d.id,
        "key": d.key,
        "name": d.name,
        "filters": d.filters,
        "active": d.active,
        "deleted": d.deleted,
        "ensure_experience_continuity": d.ensure_experience_continuity,
        "version": d.version,
        "evaluation_runtime": d.evaluation_runtime.as_deref().unwrap_or("all"),
        "evaluation_contexts": d.evaluation_contexts,
        "bucketing_identifier": d.bucketing_identifier,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
    })
}

/// A create or update body in PostHog's shape; on update every field is optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FlagBody {
    key: Option<String>,
    name: Option<String>,
    filters: Option<FlagFilters>,
    active: Option<bool>,
    deleted: Option<bool>,
    ensure_experience_continuity: Option<bool>,
    evaluation_runtime: Option<String>,
    #[serde(alias = "tags", alias = "evaluation_tags")]
    evaluation_contexts: Option<Vec<String>>,
    bucketing_identifier: Option<String>,
}

impl FlagBody {
    fn apply(self, mut d: FlagDefinition) -> FlagDefinition {
        if let Some(v) = self.key {
            d.key = v;
        }
        if let Some(v) = self.name {
            d.name = v;
        }
        if let Some(v) = self.filters {
            d.filters = v;
        }
        if let Some(v) = self.active {
            d.active = v;
        }
        if let Some(v) = self.deleted {
            d.deleted = v;
        }
        if let Some(v) = self.ensure_experience_continuity {
            d.ensure_experience_continuity = v;
        }
        if let Some(v) = self.evaluation_runtime {
            d.evaluation_runtime = Some(v);
        }
        if let Some(v) = self.evaluation_contexts {
            d.evaluation_contexts = v;
        }
        if let Some(v) = self.bucketing_identifier {
            d.bucketing_identifier = Some(v);
        }
        d
    }
}

fn blank_flag() -> FlagDefinition {
    FlagDefinition {
        id: 0,
        key: String::new(),
        name: String::new(),
        filters: FlagFilters::default(),
        active: true,
        deleted: false,
        ensure_experience_continuity: false,
        version: 0,
        evaluation_runtime: None,
        evaluation_contexts: Vec::new(),
        bucketing_identifier: None,
    }
}

async fn list(
    access: ProjectAccess<FeatureFlagRead>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let flags = state.flags_op(move |f| f.flags(project)).await?;
    let results: Vec<Value> = flags
        .iter()
        .filter(|f| !f.definition.deleted)
        .map(flag_json)
        .collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn create(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    ValidJson(body): ValidJson<FlagBody>,
) -> Result<HttpResponse, ApiError> {
    if body.key.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::validation("This field is required.", Some("key")));
    }
    let project = access.project.id;
    let persons = state.persons.clone();
    let definition = body.apply(blank_flag());
    let record = state
        .flags_op(move |f| {
            validate_flag(&definition, persons.group_type_count(project)?)?;
            f.save_flag(project, definition, None)
        })
        .await?;
    Ok(HttpResponse::Created().json(flag_json(&record)))
}

async fn existing(state: &AppState, project: u64, raw: &str) -> Result<FlagRecord, ApiError> {
    let id: i64 = raw
        .parse()
        .map_err(|_| ApiError::not_found("Feature flag"))?;
    let found = state.flags_op(move |f| f.flag(project, id)).await?;
    found
        .filter(|r| !r.definition.deleted)
        .ok_or_else(|| ApiError::not_found("Feature flag"))
}

async fn get(
    access: ProjectAccess<FeatureFlagRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let record = existing(&state, access.project.id, &path.1).await?;
    Ok(HttpResponse::Ok().json(flag_json(&record)))
}

async fn update(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    ValidJson(body): ValidJson<FlagBody>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let old = existing(&state, project, &path.1).await?;
    let definition = body.apply(old.definition.clone());
    let persons = state.persons.clone();
    let record = state
        .flags_op(move |f| {
            validate_flag(&definition, persons.group_type_count(project)?)?;
            f.save_flag(project, definition, Some(&old))
        })
        .await?;
    Ok(HttpResponse::Ok().json(flag_json(&record)))
}

async fn delete(
    access: ProjectAccess<FeatureFlagWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let old = existing(&state, project, &path.1).await?;
    let mut definition = old.definition.clone();
    definition.deleted = true;
    state
        .flags_op(move |f| f.save_flag(project, definition, Some(&old)))
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

fn flag_error(err: FlagRequestError) -> ApiError {
    match err {
        FlagRequestError::TooLarge(limit) => ApiError::PayloadTooLarge { limit },
        FlagRequestError::MissingDistinctId => {
            ApiError::validation("The request has no distinct_id.", Some("distinct_id"))
        }
        other => ApiError::validation(other.to_string(), None),
    }
}

fn header_str(req: &HttpRequest, name: header::HeaderName) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Which endpoint answers: they differ only in response shapes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Flags,
    /// Legacy `/decide` for old SDKs.
    Decide,
}

/// `POST /flags`: evaluates every selected flag for the request's subject.
async fn flags(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    evaluate_http(req, payload, state, query, Endpoint::Flags).await
}

/// `POST /decide`: `v` 1 → list of enabled keys; 2 → map of enabled flags; 3 → the legacy
/// `/flags` shape; 4 and above → the v2 shape. Config is included unless `config=false`.
async fn decide(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    evaluate_http(req, payload, state, query, Endpoint::Decide).await
}

async fn evaluate_http(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
    endpoint: Endpoint,
) -> Result<HttpResponse, ApiError> {
    let limit = state.config.limits.max_body_bytes;
    let body = read_body(&req, payload.into_inner(), limit).await?;
    let content_type = header_str(&req, header::CONTENT_TYPE);
    let content_encoding = header_str(&req, header::CONTENT_ENCODING);
    let decoded = decode_body(
        WireInput {
            body: &body,
            query_data: query.get("data").map(String::as_str),
            query_compression: query.get("compression").map(String::as_str),
            content_type: content_type.as_deref(),
            content_encoding: content_encoding.as_deref(),
        },
        state.config.capture.max_decompressed_bytes,
    )
    .map_err(flag_error)?;
    let mut request = parse_request(&decoded).map_err(flag_error)?;
    if let (Some(geoip), false) = (&state.geoip, request.geoip_disable) {
        let ip = super::client_ip(&req).and_then(|ip| ip.parse().ok());
        if let Some(ip) = ip {
            geoip.enrich(ip, &mut request.person_properties);
        }
    }
    let project =
        resolve_project_token(&state, request.token.as_deref().unwrap_or_default()).await?;
    req.extensions_mut().insert(RequestProject(project.id));

    let user_agent = header_str(&req, header::USER_AGENT);
    let browser_headers = ["origin", "referer", "sec-fetch-mode", "sec-fetch-site"]
        .iter()
        .any(|h| req.headers().contains_key(*h));
    let runtime = detect_runtime(user_agent.as_deref(), browser_headers);
    let timezone = project.timezone.parse().unwrap_or(chrono_tz::UTC);
    let ctx = MatchContext {
        now: Utc::now(),
        timezone,
    };
    let project_id = project.id;
    let snapshot = match state.flags.cached_snapshot(project_id) {
        Some(snapshot) => snapshot,
        None => state.flags_op(move |f| f.snapshot(project_id)).await?,
    };
    let selected = selected_flags(&snapshot, &request, runtime);
    let request = std::sync::Arc::new(request);

    // Fast path: an organization known to be unlimited and everything needed in memory.
    let needs_data = !selected.is_empty() && !request.disable_flags;
    let fast = if state.cache.org_quota(project.organization_id) == Some(None) {
        if needs_data {
            cached_stored(&state.persons, project_id, &request)
        } else {
            Some(StoredData::default())
        }
    } else {
        None
    };
    let stored = match fast {
        Some(stored) => Some(stored),
        None => {
            // One trip to the blocking pool, under a deadline: the quota check and the stored person
            // and groups. Past the deadline the request is still answered, with the flags that needed
            // stored data marked `failed`.
            let (persons, meta, cache) = (
                state.persons.clone(),
                state.meta.clone(),
                state.cache.clone(),
            );
            let (org_id, needs_data) = (
                project.organization_id,
                !selected.is_empty() && !request.disable_flags,
            );
            let load_request = std::sync::Arc::clone(&request);
            let load = web::block(move || {
                if quota_exceeded(&meta, &cache, &persons, org_id, ctx.now)? {
                    return Ok(None);
                }
                let stored = if needs_data {
                    load_stored(&persons, project_id, &load_request)?
                } else {
                    StoredData::default()
                };
                Ok::<_, corvid_actors::meta::StoreError>(Some(stored))
            });
            let deadline = state.config.flags.stored_read_deadline;
            let started = std::time::Instant::now();
            let stored = match tokio::time::timeout(deadline, load).await {
                // An answer that took longer than the deadline is as late as no answer.
                Ok(Ok(Ok(Some(_)))) if started.elapsed() > deadline => {
                    tracing::warn!(project_id, "stored flag data read after the deadline");
                    None
                }
                Ok(Ok(Ok(Some(stored)))) => Some(stored),
                Ok(Ok(Ok(None))) => {
                    // Over quota: not an error status; flags are empty and `quotaLimited` says why.
                    return Ok(HttpResponse::Ok().json(json!({
                        "flags": {},
                        "errorsWhileComputingFlags": false,
                        "quotaLimited": ["feature_flags"],
                        "requestId": uuid::Uuid::new_v4(),
                        "evaluatedAt": Utc::now().timestamp_millis(),
                    })));
                }
                Ok(Ok(Err(err))) => {
                    tracing::warn!(error = %err, project_id, "stored flag data unavailable");
                    None
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, project_id, "stored flag data unavailable");
                    None
                }
                Err(_) => {
                    tracing::warn!(project_id, "stored flag data not read within the deadline");
                    None
                }
            };
            stored
        }
    };

    let evaluated = evaluate(snapshot, &selected, stored.as_ref(), &request, ctx);
    if !evaluated.is_empty() {
        state.persons.count_flag_request(project_id, ctx.now);
    }

    let version: u32 = query
        .get("v")
        .or_else(|| query.get("version"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let config = query.get("config").map(|c| c == "true" || c == "1");
    let (v2, with_config) = match (
        query.contains_key("v") || query.contains_key("version"),
        config,
    ) {
        (false, None) => (true, true),
        (_, config) => (version >= 2, config.unwrap_or(false)),
    };
    let (mut body, with_config) = match endpoint {
        Endpoint::Flags if v2 => return Ok(v2_response(&evaluated, with_config)),
        Endpoint::Flags => (legacy_body(&evaluated), with_config),
        Endpoint::Decide => {
            let with_config = config.unwrap_or(true);
            match version {
                0 | 1 => (decide_list_body(&evaluated), with_config),
                2 => (decide_map_body(&evaluated), with_config),
                3 => (legacy_body(&evaluated), with_config),
                _ => return Ok(v2_response(&evaluated, with_config)),
            }
        }
    };
    if with_config {
        add_config(&mut body);
    }
    Ok(HttpResponse::Ok().json(body))
}

/// Whether the organization used up its monthly flag-request quota (`None` = unlimited).
fn quota_exceeded(
    meta: &corvid_actors::meta::MetaStore,
    cache: &corvid_actors::meta::MetaCache,
    persons: &corvid_actors::persons::PersonStore,
    org: uuid::Uuid,
    now: chrono::DateTime<Utc>,
) -> Result<bool, corvid_actors::meta::StoreError> {
    let quota = meta
        .organization(org)?
        .and_then(|o| o.feature_flag_request_quota);
    cache.put_org_quota(org, quota);
    let Some(quota) = quota else {
        return Ok(false);
    };
    let month = now.format("%Y-%m").to_string();
    let mut used = 0;
    for project in meta.projects_of_organization(org)? {
        used += persons
            .usage(project.id)?
            .iter()
            .filter(|row| row.month == month)
            .map(|row| row.flag_requests)
            .sum::<u64>();
    }
    Ok(used >= quota)
}

/// The `v=2` response (the hot path: written straight into bytes, see `flags_v2`).
fn v2_response(outcome: &FlagsOutcome, with_config: bool) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header(header::ContentType::json())
        .body(super::flags_v2::write(outcome, with_config))
}

fn legacy_body(outcome: &FlagsOutcome) -> Value {
    let mut values = Map::new();
    let mut payloads = Map::new();
    for (index, e) in outcome.returned() {
        let key = outcome.flag(index).key.clone();
        let value = match (&e.variant, e.enabled) {
            (Some(v), true) => Value::String(v.clone()),
            (_, enabled) => Value::Bool(enabled),
        };
        if let Some(p) = &e.payload {
            payloads.insert(key.clone(), p.clone());
        }
        values.insert(key, value);
    }
    json!({
        "featureFlags": values,
        "featureFlagPayloads": payloads,
        "errorsWhileComputingFlags": outcome.errors,
        "requestId": uuid::Uuid::new_v4(),
        "evaluatedAt": Utc::now().timestamp_millis(),
    })
}

fn decide_list_body(outcome: &FlagsOutcome) -> Value {
    let enabled: Vec<&str> = outcome
        .returned()
        .filter(|(_, e)| e.enabled)
        .map(|(i, _)| outcome.flag(i).key.as_str())
        .collect();
    json!({"featureFlags": enabled, "errorsWhileComputingFlags": outcome.errors})
}

fn decide_map_body(outcome: &FlagsOutcome) -> Value {
    let mut legacy = legacy_body(outcome);
    if let Some(Value::Object(flags)) = legacy.get_mut("featureFlags") {
        flags.retain(|_, v| *v != Value::Bool(false));
    }
    legacy
}

/// Adds [`super::flags_v2::CONFIG_FIELDS`] to a legacy or `/decide` body.
fn add_config(body: &mut Value) {
    let fields: Map<String, Value> =
        serde_json::from_str(&format!("{{{}}}", super::flags_v2::CONFIG_FIELDS))
            .unwrap_or_default();
    if let Some(obj) = body.as_object_mut() {
        obj.extend(fields);
    }
}

/// Definitions for SDK local evaluation. Flag-dependency filters name the dependency by key and
/// carry its `dependency_chain`, as the SDKs expect.
async fn definitions(
    req: HttpRequest,
    auth: Authed<FeatureFlagRead>,
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let token = query
        .get("token")
        .or_else(|| query.get("api_key"))
        .cloned()
        .unwrap_or_default();
    let project = resolve_project_token(&state, &token).await?;
    if !auth.credential.allows_project(&project) {
        return Err(ApiError::PermissionDenied {
            detail: "This API key does not have access to that project.".into(),
        });
    }
    req.extensions_mut().insert(RequestProject(project.id));
    let project_id = project.id;
    let (flags, persons) = (state.flags.clone(), state.persons.clone());
    let (snapshot, group_types) = web::block(move || {
        Ok::<_, corvid_actors::meta::StoreError>((
            flags.snapshot(project_id)?,
            persons.group_types(project_id)?,
        ))
    })
    .await??;
    let keys_by_id: HashMap<i64, String> = snapshot
        .flags
        .iter()
        .map(|f| (f.id, f.key.clone()))
        .collect();
    let flag_list: Vec<Value> = snapshot
        .flags
        .iter()
        .map(|f| {
            let mut filters = serde_json::to_value(&f.filters).unwrap_or_default();
            rewrite_dependencies(&mut filters, &keys_by_id, &snapshot.flags);
            json!({
                "id": f.id, "team_id": project_id, "name": f.name, "key": f.key, "filters": filters,
                "deleted": false, "active": f.active, "ensure_experience_continuity": f.ensure_experience_continuity,
                "version": f.version, "evaluation_runtime": f.evaluation_runtime.as_deref().unwrap_or("all"),
                "evaluation_contexts": f.evaluation_contexts, "bucketing_identifier": f.bucketing_identifier,
            })
        })
        .collect();
    let cohorts: BTreeMap<String, Value> = snapshot
        .cohorts
        .values()
        .filter(|c| !c.is_static)
        .filter_map(|c| {
            Some((
                c.id.to_string(),
                serde_json::to_value(&c.filters.as_ref()?.properties).ok()?,
            ))
        })
        .collect();
    let mapping: BTreeMap<String, String> = group_types
        .into_iter()
        .map(|(name, i)| (i.to_string(), name))
        .collect();
    let body = json!({"flags": flag_list, "group_type_mapping": mapping, "cohorts": cohorts});
    let text = body.to_string();
    let etag = format!("\"{}\"", corvid_actors::meta::secrets::sha256_hex(&text));
    let matches = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    if matches {
        return Ok(HttpResponse::NotModified()
            .insert_header((header::ETAG, etag))
            .finish());
    }
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag))
        .content_type("application/json")
        .body(text))
}

/// In `filters`, flag-dependency filters get the dependency's key and `dependency_chain`.
fn rewrite_dependencies(
    filters: &mut Value,
    keys_by_id: &HashMap<i64, String>,
    flags: &[FlagDefinition],
) {
    let Some(groups) = filters.get_mut("groups").and_then(Value::as_array_mut) else {
        return;
    };
    for group in groups {
        let Some(props) = group.get_mut("properties").and_then(Value::as_array_mut) else {
            continue;
        };
        for prop in props {
            if prop.get("type").and_then(Value::as_str) != Some("flag") {
                continue;
            }
            let Some(id) = prop
                .get("key")
                .and_then(Value::as_str)
                .and_then(|k| k.parse::<i64>().ok())
            else {
                continue;
            };
            let chain =
                dependency_chain(id, flags, keys_by_id, &mut Vec::new()).unwrap_or_default();
            if let Some(key) = keys_by_id.get(&id) {
                prop["key"] = Value::String(key.clone());
            }
            prop["dependency_chain"] = json!(chain);
        }
    }
}

/// Keys to evaluate before `id`, dependencies first, ending with `id`'s own key; `None` on a cycle.
fn dependency_chain(
    id: i64,
    flags: &[FlagDefinition],
    keys: &HashMap<i64, String>,
    stack: &mut Vec<i64>,
) -> Option<Vec<String>> {
    if stack.contains(&id) {
        return None;
    }
    stack.push(id);
    let mut chain = Vec::new();
    if let Some(flag) = flags.iter().find(|f| f.id == id) {
        for dep in dependencies(flag) {
            for key in dependency_chain(dep, flags, keys, stack)? {
                if !chain.contains(&key) {
                    chain.push(key);
                }
            }
        }
    }
    stack.pop();
    chain.push(keys.get(&id)?.clone());
    Some(chain)
}
