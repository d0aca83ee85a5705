//! The activity log on PostHog's routes: the project's log (`/activity_log/`, filtered by
//! scope, item and user, paged by number or by cursor) and each scope's pair
//! (`/feature_flags/activity/` for every flag, `/feature_flags/{id}/activity/` for one), all
//! under scope `activity_log:read`.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use corvid_activity::{ActivityEntry, ActivityQuery};
use serde_json::json;
use uuid::Uuid;

use super::{page_link, project_route};
use crate::auth::scope::ActivityLogRead;
use crate::auth::ProjectAccess;
use crate::error::ApiError;
use crate::state::AppState;

/// The scopes with an activity pair of their own: the route's resource and the log's scope.
const SCOPED: &[(&str, &str)] = &[
    ("feature_flags", "FeatureFlag"),
    ("cohorts", "Cohort"),
    ("surveys", "Survey"),
    ("experiments", "Experiment"),
    ("experiment_holdouts", "ExperimentHoldout"),
    ("early_access_feature", "EarlyAccessFeature"),
];

/// Registers the log and every scope's pair. Called before the scopes' own `{id}` routes, so
/// `…/feature_flags/activity` is not read as a flag id.
pub fn configure(cfg: &mut web::ServiceConfig) {
    project_route(cfg, "/activity_log", || web::get().to(log));
    for (resource, scope) in SCOPED {
        let scope: &'static str = scope;
        project_route(cfg, &format!("/{resource}/activity"), move || {
            web::get().to(move |a, s, r, q| of_scope(a, s, r, q, scope))
        });
        project_route(
            cfg,
            &format!("/{resource}/{{item_id}}/activity"),
            move || web::get().to(move |a, s, r, p, q| of_item(a, s, r, p, q, scope)),
        );
    }
}

type Params = web::Query<HashMap<String, String>>;

fn number(params: &Params, name: &'static str, default: usize) -> Result<usize, ApiError> {
    params.get(name).map_or(Ok(default), |t| {
        t.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::validation(format!("{name} must be a positive integer"), Some(name))
        })
    })
}

/// The filters every listing takes: `scope`, `scopes` (comma-separated), `item_id`, `user`
/// (a user's id or uuid).
fn filters(params: &Params) -> Result<ActivityQuery, ApiError> {
    let mut scopes: Vec<String> = params
        .get("scopes")
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if let Some(scope) = params.get("scope").filter(|s| !s.is_empty()) {
        scopes.push(scope.clone());
    }
    let (mut user, mut user_uuid) = (None, None);
    if let Some(raw) = params.get("user").filter(|u| !u.is_empty()) {
        match raw.parse::<u64>() {
            Ok(id) => user = Some(id),
            Err(_) => {
                user_uuid = Some(Uuid::parse_str(raw).map_err(|_| {
                    ApiError::validation("user must be a user's id or uuid", Some("user"))
                })?)
            }
        }
    }
    Ok(ActivityQuery {
        scopes,
        item_id: params.get("item_id").filter(|i| !i.is_empty()).cloned(),
        user,
        user_uuid,
        ..ActivityQuery::default()
    })
}

/// `GET /api/projects/{id}/activity_log/`: with `page`, numbered pages of `page_size` (100,
/// at most 1000) with `count`; otherwise newest first by cursor (`next` carries it).
async fn log(
    access: ProjectAccess<ActivityLogRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
    params: Params,
) -> Result<HttpResponse, ApiError> {
    let mut query = filters(&params)?;
    let size = number(&params, "page_size", 100)?.min(1000);
    query.limit = size;
    if params.contains_key("page") {
        let page = number(&params, "page", 1)?;
        query.offset = (page - 1).saturating_mul(size);
        let found = state.engine.activity.list(access.project.id, query).await?;
        let more = (page.saturating_mul(size) as u64) < found.total;
        let link =
            |p: usize| page_link(&req, &state, &params, vec![("page".into(), p.to_string())]);
        return Ok(HttpResponse::Ok().json(json!({
            "count": found.total,
            "next": more.then(|| link(page + 1)),
            "previous": (page > 1).then(|| link(page - 1)),
            "results": found.entries.iter().map(ActivityEntry::api_json).collect::<Vec<_>>(),
        })));
    }
    if let Some(cursor) = params.get("cursor") {
        query.before = Some(
            Uuid::parse_str(cursor)
                .map_err(|_| ApiError::validation("Invalid cursor", Some("cursor")))?,
        );
    }
    let found = state.engine.activity.list(access.project.id, query).await?;
    let next = (found.total > found.entries.len() as u64)
        .then(|| found.entries.last())
        .flatten()
        .map(|last| {
            page_link(
                &req,
                &state,
                &params,
                vec![("cursor".into(), last.id.to_string())],
            )
        });
    Ok(HttpResponse::Ok().json(json!({
        "next": next,
        "previous": null,
        "results": found.entries.iter().map(ActivityEntry::api_json).collect::<Vec<_>>(),
    })))
}

/// PostHog's `activity_page_response`: `limit` (10) per `page` (1), with `total_count`.
/// The page and how many entries match in all.
async fn activity_page(
    state: &AppState,
    req: &HttpRequest,
    params: &Params,
    project: u64,
    mut query: ActivityQuery,
) -> Result<(HttpResponse, u64), ApiError> {
    let limit = number(params, "limit", 10)?.min(1000);
    let page = number(params, "page", 1)?;
    query.limit = limit;
    query.offset = (page - 1).saturating_mul(limit);
    let found = state.engine.activity.list(project, query).await?;
    let link = |p: usize| {
        page_link(
            req,
            state,
            params,
            vec![
                ("limit".into(), limit.to_string()),
                ("page".into(), p.to_string()),
            ],
        )
    };
    let body = HttpResponse::Ok().json(json!({
        "results": found.entries.iter().map(ActivityEntry::api_json).collect::<Vec<_>>(),
        "next": ((page.saturating_mul(limit) as u64) < found.total).then(|| link(page + 1)),
        "previous": (page > 1).then(|| link(page - 1)),
        "total_count": found.total,
    }));
    Ok((body, found.total))
}

/// `GET …/{resource}/activity/`: every item of one scope.
async fn of_scope(
    access: ProjectAccess<ActivityLogRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
    params: Params,
    scope: &'static str,
) -> Result<HttpResponse, ApiError> {
    let query = ActivityQuery {
        scopes: vec![scope.into()],
        ..ActivityQuery::default()
    };
    let (page, _) = activity_page(&state, &req, &params, access.project.id, query).await?;
    Ok(page)
}

/// `GET …/{resource}/{id}/activity/`: one item's entries; an item with none that the project
/// does not have is a 404.
async fn of_item(
    access: ProjectAccess<ActivityLogRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    params: Params,
    scope: &'static str,
) -> Result<HttpResponse, ApiError> {
    let item = path.1.clone();
    let query = ActivityQuery {
        scopes: vec![scope.into()],
        item_id: Some(item.clone()),
        ..ActivityQuery::default()
    };
    let (page, total) = activity_page(&state, &req, &params, access.project.id, query).await?;
    if total == 0 && item_exists(&state, access.project.id, scope, &item).await? == Some(false) {
        return Err(ApiError::not_found(scope));
    }
    Ok(page)
}

/// Whether the project has the item (`None`: not checked for this scope; an item without
/// entries then lists none).
async fn item_exists(
    state: &AppState,
    project: u64,
    scope: &str,
    item: &str,
) -> Result<Option<bool>, ApiError> {
    let check = match scope {
        "FeatureFlag" | "Cohort" => item.parse::<i64>().ok(),
        _ => return Ok(None),
    };
    let Some(id) = check else {
        return Ok(Some(false));
    };
    let found = if scope == "FeatureFlag" {
        state.engine.flags.flag(project, id).await.map(|_| ())
    } else {
        state.engine.flags.cohort(project, id).await.map(|_| ())
    };
    match found {
        Ok(()) => Ok(Some(true)),
        Err(corvid_kernel::StoreError::NotFound { .. }) => Ok(Some(false)),
        Err(e) => Err(e.into()),
    }
}
