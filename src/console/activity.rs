//! The activity log (filtered by scope and item, with each change's before and after) and
//! the project's recent events.

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use corvid_activity::ActivityQuery;
use corvid_events::EventFilter;

use super::{project, render, respond, short, viewer, Nav, Page, Params};
use crate::error::ApiError;
use crate::state::AppState;

struct EntryRow {
    when: String,
    who: String,
    scope: String,
    item: String,
    activity: String,
    changes: Vec<(String, String, String)>,
}

#[derive(Template)]
#[template(path = "activity.html")]
struct Activity {
    nav: Nav,
    scope: String,
    item_id: String,
    entries: Vec<EntryRow>,
    total: u64,
}

pub async fn page(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    params: Params,
) -> HttpResponse {
    respond(build(&req, &state, &path, &params).await)
}

async fn build(req: &HttpRequest, state: &AppState, raw: &str, params: &Params) -> Page {
    let viewer = viewer(req, state, "activity_log:read").await?;
    let project = project(&viewer, raw)?;
    let scope = params.get("scope").cloned().unwrap_or_default();
    let item_id = params.get("item_id").cloned().unwrap_or_default();
    let found = state
        .engine
        .activity
        .list(
            project.id,
            ActivityQuery {
                scopes: Some(scope.clone())
                    .filter(|s| !s.is_empty())
                    .into_iter()
                    .collect(),
                item_id: Some(item_id.clone()).filter(|s| !s.is_empty()),
                limit: 200,
                ..ActivityQuery::default()
            },
        )
        .await?;
    render(&Activity {
        nav: viewer.nav(project.id, "activity"),
        entries: found
            .entries
            .iter()
            .map(|e| EntryRow {
                when: e.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                who: e
                    .user
                    .email
                    .clone()
                    .unwrap_or_else(|| e.user.first_name.clone()),
                scope: e.scope.clone(),
                item: e.detail.name.clone().unwrap_or_else(|| e.item_id.clone()),
                activity: e.activity.clone(),
                changes: e
                    .detail
                    .changes
                    .iter()
                    .map(|c| {
                        (
                            c.field.clone().unwrap_or_else(|| c.action.clone()),
                            short(&c.before),
                            short(&c.after),
                        )
                    })
                    .collect(),
            })
            .collect(),
        total: found.total,
        scope,
        item_id,
    })
}

#[derive(Template)]
#[template(path = "events.html")]
struct Events {
    nav: Nav,
    event: String,
    distinct_id: String,
    /// time, event, distinct id, properties.
    events: Vec<(String, String, String, String)>,
}

pub async fn events(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    params: Params,
) -> HttpResponse {
    respond(build_events(&req, &state, &path, &params).await)
}

async fn build_events(req: &HttpRequest, state: &AppState, raw: &str, params: &Params) -> Page {
    let viewer = viewer(req, state, "query:read").await?;
    let project = project(&viewer, raw)?;
    let event = params.get("event").cloned().unwrap_or_default();
    let distinct_id = params.get("distinct_id").cloned().unwrap_or_default();
    let filter = EventFilter {
        project_id: project.id,
        event: Some(event.clone()).filter(|s| !s.is_empty()),
        distinct_id: Some(distinct_id.clone()).filter(|s| !s.is_empty()),
        after: None,
        before: None,
        before_uuid: None,
        limit: 100,
    };
    let ingest = state.engine.ingest.clone();
    let found = web::block(move || ingest.query_events(&filter))
        .await
        .map_err(ApiError::from)?
        .map_err(|e| ApiError::Internal(e.into()))?;
    render(&Events {
        nav: viewer.nav(project.id, "events"),
        events: found
            .iter()
            .map(|e| {
                (
                    e.timestamp.format("%Y-%m-%d %H:%M:%S").to_string(),
                    e.event.clone(),
                    e.distinct_id.clone(),
                    e.properties.chars().take(300).collect(),
                )
            })
            .collect(),
        event,
        distinct_id,
    })
}
