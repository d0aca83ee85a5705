//! `/api/{projects|environments}/{id}/endpoints/…`: endpoint CRUD by name, versions, runs,
//! the per-endpoint OpenAPI document and execution logs. Handlers decode and authorize; the
//! rules live in `corvid_actors::endpoints`.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use corvid_actors::endpoints::logs::{Level, LogQuery};
use corvid_actors::endpoints::materialize::table::parse_time_text;
use corvid_actors::endpoints::model::{Endpoint, EndpointVersion};
use corvid_actors::endpoints::{crud, openapi, Caller, EndpointError};
use corvid_actors::meta::{Credential, CredentialSource};
use serde_json::{json, Value};
use uuid::Uuid;

use super::project_route;
use super::query::project_timezone;
use crate::auth::scope::{EndpointRead, EndpointWrite};
use crate::auth::ProjectAccess;
use crate::body::{parse_json, read_body};
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    // Runs first: the router tries routes in order.
    project_route(cfg, "/endpoints/{name}/run", || web::post().to(run));
    project_route(cfg, "/endpoints/{name}/run", || web::get().to(run));
    project_route(cfg, "/endpoints", || web::get().to(list));
    project_route(cfg, "/endpoints", || web::post().to(create));
    project_route(cfg, "/endpoints/{name}", || web::get().to(get));
    project_route(cfg, "/endpoints/{name}", || web::patch().to(update));
    project_route(cfg, "/endpoints/{name}", || web::put().to(update));
    project_route(cfg, "/endpoints/{name}", || web::delete().to(delete));
    project_route(cfg, "/endpoints/{name}/versions", || {
        web::get().to(versions)
    });
    project_route(cfg, "/endpoints/{name}/openapi.json", || {
        web::get().to(spec)
    });
    project_route(cfg, "/endpoints/{name}/logs", || web::get().to(logs));
    project_route(cfg, "/endpoints/{name}/materialization_status", || {
        web::get().to(materialization_status)
    });
}

fn query_map(req: &HttpRequest) -> HashMap<String, String> {
    web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default()
}

/// `?version=N` as a number, or the PostHog error for a bad one.
fn version_param(req: &HttpRequest) -> Result<Option<u32>, ApiError> {
    match query_map(req).get("version") {
        None => Ok(None),
        Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| {
            ApiError::from(EndpointError::plain(
                400,
                format!("Invalid version parameter: {v}"),
            ))
        }),
    }
}

/// Version `n` of `endpoint`, or its newest when `n` is `None`.
fn pick_version(endpoint: &Endpoint, n: Option<u32>) -> Result<&EndpointVersion, ApiError> {
    let found = match n {
        Some(n) => endpoint
            .version(n)
            .ok_or_else(|| EndpointError::plain(404, format!("Version {n} not found"))),
        None => endpoint
            .latest()
            .ok_or_else(|| EndpointError::plain(404, "No version found for this endpoint")),
    };
    Ok(found?)
}

async fn load(state: &AppState, project_id: u64, name: &str) -> Result<Endpoint, ApiError> {
    state
        .engine
        .endpoints
        .load(project_id, name)
        .await?
        .map(|e| (*e).clone())
        .ok_or_else(|| ApiError::not_found("Endpoint"))
}

async fn json_body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<Option<Value>, ApiError> {
    let bytes = read_body(
        req,
        payload.into_inner(),
        state.config.limits.max_body_bytes,
    )
    .await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    parse_json(&bytes).map(Some)
}

async fn list(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let filter_active = query_map(&req)
        .get("is_active")
        .map(|v| v == "true" || v == "1");
    let all = state
        .endpoint_store(move |store| store.endpoints(project))
        .await?;
    let results: Vec<Value> = all
        .iter()
        .filter(|e| filter_active.is_none_or(|a| e.is_active == a))
        .map(|e| crud::endpoint_json(e, &state.public_url, None))
        .collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn create(
    access: ProjectAccess<EndpointWrite>,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = json_body(&req, payload, &state)
        .await?
        .ok_or_else(|| ApiError::validation("Request body is empty; expected JSON.", None))?;
    let request = crud::parse_request(body)?;
    let project = access.project.id;
    let created_by = Some(access.credential.user.email.clone());
    let endpoint = state
        .endpoint_store(move |store| -> Result<Endpoint, EndpointError> {
            let variables = store.variables(project)?;
            let endpoint = crud::create(project, request, &variables, created_by)?;
            store.create(&endpoint)?;
            Ok(endpoint)
        })
        .await?;
    if endpoint.versions.iter().any(|v| v.is_materialized()) {
        state.engine.endpoints.kick_materializer();
    }
    Ok(HttpResponse::Created().json(crud::endpoint_json(&endpoint, &state.public_url, None)))
}

async fn get(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let endpoint = load(&state, access.project.id, &name).await?;
    match version_param(&req)? {
        Some(n) => {
            let v = pick_version(&endpoint, Some(n))?;
            Ok(HttpResponse::Ok().json(crud::version_json(&endpoint, v, &state.public_url)))
        }
        None => {
            Ok(HttpResponse::Ok().json(crud::endpoint_json(&endpoint, &state.public_url, None)))
        }
    }
}

async fn update(
    access: ProjectAccess<EndpointWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let target = version_param(&req)?;
    let body = json_body(&req, payload, &state).await?.unwrap_or(json!({}));
    let request = crud::parse_request(body)?;
    let project = access.project.id;
    if request.deleted == Some(true) {
        let deleted = state
            .endpoint_store(move |store| store.delete(project, &name))
            .await?;
        let deleted = deleted.ok_or_else(|| ApiError::not_found("Endpoint"))?;
        state.engine.endpoints.forget(deleted.id);
        return Ok(HttpResponse::Ok().json(json!({"success": true})));
    }
    let updated = state
        .endpoint_store(move |store| {
            let variables = store.variables(project)?;
            store.update(project, &name, |e| {
                crud::update(e, request, target, &variables)
            })
        })
        .await?;
    let (endpoint, outcome) = updated.ok_or_else(|| ApiError::not_found("Endpoint"))?;
    state.engine.endpoints.forget(endpoint.id);
    if outcome.kick_materializer {
        state.engine.endpoints.kick_materializer();
    }
    let body = match outcome.version.and_then(|n| endpoint.version(n)) {
        Some(v) => crud::version_json(&endpoint, v, &state.public_url),
        None => crud::endpoint_json(&endpoint, &state.public_url, None),
    };
    Ok(HttpResponse::Ok().json(body))
}

async fn delete(
    access: ProjectAccess<EndpointWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let project = access.project.id;
    let deleted = state
        .endpoint_store(move |store| store.delete(project, &name))
        .await?;
    let deleted = deleted.ok_or_else(|| ApiError::not_found("Endpoint"))?;
    state.engine.endpoints.forget(deleted.id);
    Ok(HttpResponse::NoContent().finish())
}

async fn versions(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let endpoint = load(&state, access.project.id, &name).await?;
    let mut results: Vec<Value> = endpoint
        .versions
        .iter()
        .map(|v| crud::version_json(&endpoint, v, &state.public_url))
        .collect();
    results.reverse();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}

async fn materialization_status(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let endpoint = load(&state, access.project.id, &name).await?;
    let v = pick_version(&endpoint, version_param(&req)?)?;
    Ok(HttpResponse::Ok().json(crud::materialization_json(v)))
}

/// The rate-limit bucket of a credential (the "per-key" limit).
fn caller_key(credential: &Credential) -> String {
    match &credential.source {
        CredentialSource::PersonalApiKey { id, .. } => format!("key:{id}"),
        // Per user and application, so refreshing tokens does not reset the budget.
        CredentialSource::OAuthAccessToken { client_id, .. } => {
            format!("oauth:{}:{client_id}", credential.user.id)
        }
    }
}

async fn run(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let body = json_body(&req, payload, &state).await?;
    let caller = Caller {
        project_id: access.project.id,
        timezone: project_timezone(&access.project.timezone),
        credential: caller_key(&access.credential),
    };
    let answer = state
        .engine
        .endpoints
        .run(&caller, &name, body, &query_map(&req))
        .await?;
    Ok(HttpResponse::Ok().json(answer))
}

async fn spec(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let project = access.project.id;
    let endpoint = load(&state, project, &name).await?;
    let version = pick_version(&endpoint, version_param(&req)?)?;
    let variables = state
        .endpoint_store(move |store| store.variables(project))
        .await?;
    Ok(HttpResponse::Ok().json(openapi::document(
        &endpoint,
        version,
        &variables,
        &state.public_url,
    )))
}

fn parse_time(name: &str, v: &str) -> Result<DateTime<Utc>, ApiError> {
    parse_time_text(v).map(|t| t.and_utc()).ok_or_else(|| {
        ApiError::validation(format!("Invalid datetime for {name}: {v}"), Some(name))
    })
}

async fn logs(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let project = access.project.id;
    let endpoint = load(&state, project, &name).await?;
    let pairs: Vec<(String, String)> =
        web::Query::<Vec<(String, String)>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default();
    let mut q = LogQuery {
        limit: 50,
        ..LogQuery::default()
    };
    for (k, v) in &pairs {
        match k.as_str() {
            "level" => {
                for part in v.split(',').filter(|p| !p.trim().is_empty()) {
                    let level = Level::parse(part).ok_or_else(|| {
                        ApiError::validation(
                            format!("Unknown level '{part}': use INFO or ERROR."),
                            Some("level"),
                        )
                    })?;
                    q.levels.push(level);
                }
            }
            "search" => q.search = Some(v.clone()).filter(|s| !s.is_empty()),
            "limit" => {
                q.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=500).contains(n))
                    .ok_or_else(|| {
                        ApiError::validation("limit must be between 1 and 500.", Some("limit"))
                    })?
            }
            "after" => q.after = Some(parse_time("after", v)?),
            "before" => q.before = Some(parse_time("before", v)?),
            "instance_id" => {
                q.instance_id = Some(Uuid::parse_str(v).map_err(|_| {
                    ApiError::validation("instance_id must be a UUID.", Some("instance_id"))
                })?)
            }
            _ => {}
        }
    }
    let entries = state.engine.endpoints.logs(project, endpoint.id, q).await?;
    let results: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "log_source": "endpoints",
                "log_source_id": e.endpoint_id,
                "instance_id": e.instance_id,
                "timestamp": e.timestamp.format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
                "level": e.level,
                "message": e.message,
            })
        })
        .collect();
    Ok(HttpResponse::Ok()
        .json(json!({"count": results.len(), "next": null, "previous": null, "results": results})))
}
