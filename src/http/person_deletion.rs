//! PostHog's person-deletion routes: one person (`DELETE …/persons/{id}/`), many
//! (`bulk_delete`), only their events (`delete_events`), the queue of event erasures
//! (`deletion_status`), the deletions' activity, one property (`delete_property`) and
//! `reset_person_distinct_id`. Decoding and answers are PostHog's; what happens is the persons
//! facade's.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use corvid_persons::{
    BulkErasure, Erasure, ErasureOptions, ErasureTargets, PersonRef, StatusFilter,
};
use serde_json::{json, Value};
use uuid::Uuid;

use super::project_route;
use crate::auth::scope::{PersonRead, PersonWrite};
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

/// The routes that name no person come first: `{person_id}` would match them too.
pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/persons/bulk_delete", || web::post().to(bulk_delete));
    project_route(cfg, "/persons/deletion_status", || {
        web::get().to(deletion_status)
    });
    project_route(cfg, "/persons/reset_person_distinct_id", || {
        web::post().to(reset_distinct_id)
    });
    project_route(cfg, "/persons/activity", || web::get().to(activity));
    project_route(cfg, "/persons/{person_id}/delete_events", || {
        web::post().to(delete_events)
    });
    project_route(cfg, "/persons/{person_id}/delete_property", || {
        web::post().to(delete_property)
    });
    project_route(cfg, "/persons/{person_id}", || web::get().to(retrieve));
    project_route(cfg, "/persons/{person_id}", || web::delete().to(destroy));
}

type Params = web::Query<HashMap<String, String>>;

/// The `{person_id}` of the path (the project's is resolved by [`ProjectAccess`]).
fn person_ref(path: &web::Path<(String, String)>) -> Result<PersonRef, ApiError> {
    PersonRef::parse(&path.1).map_err(|detail| ApiError::validation(detail, None))
}

fn requested_by<S: crate::auth::scope::RequiredScope>(access: &ProjectAccess<S>) -> Option<String> {
    Some(access.credential.user.email.clone())
}

/// The person a path names, or PostHog's 404.
async fn existing(
    state: &AppState,
    project: u64,
    person: PersonRef,
) -> Result<corvid_persons::Person, ApiError> {
    state
        .engine
        .persons
        .person(project, person)
        .await?
        .ok_or_else(|| ApiError::not_found("Person"))
}

async fn retrieve(
    access: ProjectAccess<PersonRead>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let person = existing(&state, access.project.id, person_ref(&path)?).await?;
    Ok(HttpResponse::Ok().json(super::persons::person_json(&person)))
}

/// Erases the one person a path names, as `delete_events` and `keep_person` say. 202.
async fn erase_one(
    access: &ProjectAccess<PersonWrite>,
    state: &AppState,
    path: &web::Path<(String, String)>,
    delete_events: bool,
    keep_person: bool,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let person = existing(state, project, person_ref(path)?).await?;
    let request = BulkErasure {
        targets: ErasureTargets::Ids(vec![person.id.to_string()]),
        options: ErasureOptions {
            delete_events,
            keep_person,
            requested_by: requested_by(access),
        },
    };
    let actor = crate::auth::actor(&access.credential);
    state.engine.persons.erase(project, &actor, request).await?;
    Ok(HttpResponse::Accepted().finish())
}

/// `DELETE …/persons/{id}/`: `delete_events` and `keep_person` count by their presence
/// (PostHog ignores their values).
async fn destroy(
    access: ProjectAccess<PersonWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let delete_events = params.contains_key("delete_events");
    let keep_person = params.contains_key("keep_person");
    erase_one(&access, &state, &path, delete_events, keep_person).await
}

/// `POST …/persons/{id}/delete_events/`: the person's events go, the person stays.
async fn delete_events(
    access: ProjectAccess<PersonWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    erase_one(&access, &state, &path, true, true).await
}

async fn bulk_delete(
    access: ProjectAccess<PersonWrite>,
    state: web::Data<AppState>,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let request = BulkErasure::from_json(&body.0, requested_by(&access))
        .map_err(|detail| ApiError::validation(detail, None))?;
    let summary = state
        .engine
        .persons
        .erase(
            access.project.id,
            &crate::auth::actor(&access.credential),
            request,
        )
        .await?;
    Ok(HttpResponse::Accepted().json(summary))
}

/// `GET …/persons/deletion_status/`: the event erasures, newest first.
async fn deletion_status(
    req: actix_web::HttpRequest,
    access: ProjectAccess<PersonRead>,
    state: web::Data<AppState>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let status = StatusFilter::parse(params.get("status").map(String::as_str))
        .map_err(|detail| ApiError::validation(detail, Some("status")))?;
    let person = params
        .get("person_uuid")
        .map(|text| {
            Uuid::try_parse(text)
                .map_err(|_| ApiError::validation("Must be a valid UUID.", Some("person_uuid")))
        })
        .transpose()?;
    let rows = state
        .engine
        .persons
        .deletion_status(access.project.id, status, person)
        .await?
        .iter()
        .map(|e| {
            json!({
                "person_uuid": e.person_uuid,
                "created_at": e.requested_at,
                "status": e.status(),
                "delete_verified_at": e.verified_at,
            })
        })
        .collect();
    super::paged(&req, &state, &params, rows)
}

/// One deletion as an activity-log entry (PostHog's shape), with what was asked for and how
/// many events were removed.
fn activity_json(e: &Erasure) -> Value {
    json!({
        "user": e.requested_by.as_ref().map(|email| json!({"email": email})),
        "activity": "deleted",
        "scope": "Person",
        "item_id": e.person_uuid,
        "is_system": false,
        "detail": {
            "name": e.person_uuid.to_string(),
            "distinct_ids": e.distinct_ids,
            "person_deleted": e.person_deleted,
            "delete_events": e.events,
            "events_removed": e.events_removed,
            "status": if e.events { Some(e.status()) } else { None },
            "delete_verified_at": e.verified_at,
        },
        "created_at": e.requested_at,
    })
}

/// `GET …/persons/activity/`: every deletion, newest first.
async fn activity(
    req: actix_web::HttpRequest,
    access: ProjectAccess<PersonRead>,
    state: web::Data<AppState>,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let rows = state
        .engine
        .persons
        .deletions(access.project.id)
        .await?
        .iter()
        .map(activity_json)
        .collect();
    super::paged(&req, &state, &params, rows)
}

/// `POST …/persons/reset_person_distinct_id/` `{distinct_id}`: a deleted person's distinct
/// id already makes a new person when it is seen again (Corvid keeps no tombstone that would
/// hide it), so this only checks the id is known. 202.
async fn reset_distinct_id(
    access: ProjectAccess<PersonWrite>,
    state: web::Data<AppState>,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let distinct_id = match body.0.get("distinct_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err(ApiError::validation("distinct_id is required", None)),
    };
    if !state
        .engine
        .persons
        .distinct_id_known(access.project.id, &distinct_id)
        .await?
    {
        return Err(ApiError::Missing {
            detail: format!("Distinct id {distinct_id} not found"),
        });
    }
    Ok(HttpResponse::Accepted().finish())
}

/// `POST …/persons/{id}/delete_property/` `{"$unset": key}`: 201 `{success: true}`.
async fn delete_property(
    access: ProjectAccess<PersonWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: crate::body::ValidJson<Value>,
) -> Result<HttpResponse, ApiError> {
    let project = access.project.id;
    let person = existing(&state, project, person_ref(&path)?).await?;
    let Some(Value::String(key)) = body.0.get("$unset") else {
        return Err(ApiError::validation("$unset is required", Some("$unset")));
    };
    if !state
        .engine
        .persons
        .unset_property(project, person.id, key)
        .await?
    {
        return Err(ApiError::not_found("Person"));
    }
    Ok(HttpResponse::Created().json(json!({"success": true})))
}
