//! `/api/{projects|environments}/{id}/endpoints/…`: endpoint CRUD by name, versions, runs,
//! the per-endpoint OpenAPI document and execution logs. Handlers decode and authorize; the
//! rules live in `corvid_endpoints`.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use corvid_endpoints::{
    endpoint_json, materialization_json, parse_version, pick_version, version_json, Caller,
    EndpointRequest, LogQuery, RunRequest, UpdateOutcome,
};
use serde_json::{json, Value};

use super::project_route;
use super::query::project_timezone;
use crate::auth::scope::{EndpointRead, EndpointWrite};
use crate::auth::{actor, ProjectAccess};
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
    Ok(parse_version(
        query_map(req).get("version").map(String::as_str),
    )?)
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
    let all = state.engine.endpoints.list(project, filter_active).await?;
    let results: Vec<Value> = all
        .iter()
        .map(|e| endpoint_json(e, &state.public_url, None))
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
    let request = EndpointRequest::from_json(body)?;
    let created_by = Some(access.credential.user.email.clone());
    let endpoint = state
        .engine
        .endpoints
        .create(
            access.project.id,
            &actor(&access.credential),
            request,
            created_by,
        )
        .await?;
    Ok(HttpResponse::Created().json(endpoint_json(&endpoint, &state.public_url, None)))
}

async fn get(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let endpoint = state
        .engine
        .endpoints
        .endpoint(access.project.id, &name)
        .await?;
    match version_param(&req)? {
        Some(n) => {
            let v = pick_version(&endpoint, Some(n))?;
            Ok(HttpResponse::Ok().json(version_json(&endpoint, v, &state.public_url)))
        }
        None => Ok(HttpResponse::Ok().json(endpoint_json(&endpoint, &state.public_url, None))),
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
    let request = EndpointRequest::from_json(body)?;
    let outcome = state
        .engine
        .endpoints
        .update(
            access.project.id,
            &actor(&access.credential),
            &name,
            request,
            target,
        )
        .await?;
    let body = match outcome {
        UpdateOutcome::Deleted => json!({"success": true}),
        UpdateOutcome::Changed { endpoint, version } => {
            match version.and_then(|n| endpoint.version(n)) {
                Some(v) => version_json(&endpoint, v, &state.public_url),
                None => endpoint_json(&endpoint, &state.public_url, None),
            }
        }
    };
    Ok(HttpResponse::Ok().json(body))
}

async fn delete(
    access: ProjectAccess<EndpointWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    state
        .engine
        .endpoints
        .delete(access.project.id, &actor(&access.credential), &name)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn versions(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let endpoint = state
        .engine
        .endpoints
        .endpoint(access.project.id, &name)
        .await?;
    let mut results: Vec<Value> = endpoint
        .versions
        .iter()
        .map(|v| version_json(&endpoint, v, &state.public_url))
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
    let endpoint = state
        .engine
        .endpoints
        .endpoint(access.project.id, &name)
        .await?;
    let v = pick_version(&endpoint, version_param(&req)?)?;
    Ok(HttpResponse::Ok().json(materialization_json(v)))
}

/// The rate-limit bucket of a credential (the "per-key" limit).
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
        credential: access.credential.limit_key(),
    };
    let endpoints = &state.engine.endpoints;
    let request = match RunRequest::from_parts(body, &query_map(&req)) {
        Ok(request) => request,
        Err(invalid) => return Err(endpoints.refuse(&caller, &name, invalid).await.into()),
    };
    let answer = endpoints.run(&caller, &name, request).await?;
    Ok(HttpResponse::Ok().json(answer))
}

async fn spec(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let endpoints = &state.engine.endpoints;
    let endpoint = endpoints.endpoint(access.project.id, &name).await?;
    let version = pick_version(&endpoint, version_param(&req)?)?;
    let document = endpoints
        .openapi(&endpoint, version, &state.public_url)
        .await?;
    Ok(HttpResponse::Ok().json(document))
}

async fn logs(
    access: ProjectAccess<EndpointRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (_, name) = path.into_inner();
    let project = access.project.id;
    let endpoint = state.engine.endpoints.endpoint(project, &name).await?;
    let pairs: Vec<(String, String)> =
        web::Query::<Vec<(String, String)>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default();
    let q = LogQuery::from_params(&pairs)?;
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
