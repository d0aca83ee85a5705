//! People: a project's persons (find by distinct id or email, their properties, deletion and
//! the deletion queue) and the organization's team (members, invitations, deactivation; an
//! admin's page).

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use corvid_persons::{BulkErasure, ErasureOptions, ErasureTargets, StatusFilter};
use corvid_tenancy::{Level, MemberUpdate, NewInvite};
use serde::Deserialize;

use super::{check_csrf, project, render, respond, see_other, short, viewer, Nav, Page, Params};
use crate::error::ApiError;
use crate::state::AppState;

fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

struct PersonView {
    id: String,
    name: String,
    created: String,
    distinct_ids: String,
    properties: Vec<(String, String)>,
}

#[derive(Template)]
#[template(path = "persons.html")]
struct Persons {
    nav: Nav,
    query: String,
    searched: bool,
    notice: Option<String>,
    persons: Vec<PersonView>,
    /// person, requested, by, events erased, status.
    deletions: Vec<(String, String, String, &'static str, String)>,
}

pub async fn persons(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    params: Params,
) -> HttpResponse {
    respond(build_persons(&req, &state, &path, &params).await)
}

async fn build_persons(req: &HttpRequest, state: &AppState, raw: &str, params: &Params) -> Page {
    let viewer = viewer(req, state, "person:read").await?;
    let project = project(&viewer, raw)?;
    let query = params.get("distinct_id").cloned().unwrap_or_default();
    let searched = !query.trim().is_empty();
    let persons_facade = &state.engine.persons;
    let mut found = if searched {
        persons_facade
            .persons(project.id, Some(query.trim().to_string()))
            .await?
    } else {
        Vec::new()
    };
    if searched && found.is_empty() && query.contains('@') {
        let needle = query.trim().to_lowercase();
        found = persons_facade
            .persons(project.id, None)
            .await?
            .into_iter()
            .filter(|p| {
                p.properties
                    .get("email")
                    .and_then(|e| e.as_str())
                    .is_some_and(|e| e.to_lowercase() == needle)
            })
            .take(20)
            .collect();
    }
    let deletions = persons_facade
        .deletion_status(project.id, StatusFilter::All, None)
        .await?
        .iter()
        .take(100)
        .map(|e| {
            (
                e.person_uuid.to_string(),
                when(e.requested_at),
                e.requested_by.clone().unwrap_or_default(),
                if e.events { "yes" } else { "no" },
                format!("{:?}", e.status()).to_lowercase(),
            )
        })
        .collect();
    render(&Persons {
        nav: viewer.nav(project.id, "persons"),
        notice: params.get("notice").cloned(),
        persons: found
            .iter()
            .map(|p| PersonView {
                id: p.id.to_string(),
                name: p
                    .properties
                    .get("email")
                    .and_then(|e| e.as_str())
                    .map(str::to_string)
                    .or_else(|| p.distinct_ids.first().cloned())
                    .unwrap_or_default(),
                created: when(p.created_at),
                distinct_ids: p.distinct_ids.join(", "),
                properties: p
                    .properties
                    .iter()
                    .map(|(k, v)| (k.clone(), short(v)))
                    .collect(),
            })
            .collect(),
        query,
        searched,
        deletions,
    })
}

#[derive(Deserialize)]
pub struct DeleteForm {
    csrf_token: Option<String>,
    person: String,
    delete_events: Option<String>,
}

pub async fn delete_person(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<DeleteForm>,
) -> HttpResponse {
    respond(erase(&req, &state, &path, form.into_inner()).await)
}

async fn erase(req: &HttpRequest, state: &AppState, raw: &str, form: DeleteForm) -> Page {
    let viewer = viewer(req, state, "person:write").await?;
    check_csrf(&viewer, form.csrf_token.as_deref())?;
    let project = project(&viewer, raw)?;
    let request = BulkErasure {
        targets: ErasureTargets::Ids(vec![form.person]),
        options: ErasureOptions {
            delete_events: form.delete_events.is_some(),
            keep_person: false,
            requested_by: Some(viewer.credential.user.email.clone()),
        },
    };
    state
        .engine
        .persons
        .erase(project.id, &viewer.actor(), request)
        .await?;
    see_other(&format!(
        "/console/projects/{}/persons?notice=Deletion+requested",
        project.id
    ))
}

struct MemberRow {
    uuid: String,
    email: String,
    name: String,
    level: &'static str,
    active: bool,
    joined: String,
    me: bool,
}

#[derive(Template)]
#[template(path = "team.html")]
struct Team {
    nav: Nav,
    invite_link: Option<String>,
    members: Vec<MemberRow>,
    /// email, level, expires.
    invites: Vec<(String, &'static str, String)>,
}

pub async fn team(req: HttpRequest, state: web::Data<AppState>, params: Params) -> HttpResponse {
    respond(build_team(&req, &state, &params).await)
}

async fn build_team(req: &HttpRequest, state: &AppState, params: &Params) -> Page {
    let viewer = viewer(req, state, "organization:write").await?;
    let me = &viewer.credential.user;
    let tenancy = &state.engine.tenancy;
    let members = tenancy.members(me.organization_id).await?;
    let invites = tenancy.invites(me.organization_id).await?;
    render(&Team {
        nav: viewer.nav(viewer.first_project(), "team"),
        invite_link: params
            .get("invite")
            .and_then(|id| uuid::Uuid::parse_str(id).ok())
            .map(|id| format!("{}/signup/{id}", state.public_url)),
        members: members
            .iter()
            .map(|u| MemberRow {
                uuid: u.uuid.to_string(),
                email: u.email.clone(),
                name: u.first_name.clone(),
                level: u.level.name(),
                active: u.is_active,
                joined: when(u.created_at),
                me: u.id == me.id,
            })
            .collect(),
        invites: invites
            .iter()
            .map(|i| (i.target_email.clone(), i.level.name(), when(i.expires_at)))
            .collect(),
    })
}

#[derive(Deserialize)]
pub struct InviteForm {
    csrf_token: Option<String>,
    target_email: String,
    level: u8,
}

pub async fn invite(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<InviteForm>,
) -> HttpResponse {
    respond(make_invite(&req, &state, form.into_inner()).await)
}

async fn make_invite(req: &HttpRequest, state: &AppState, form: InviteForm) -> Page {
    let viewer = viewer(req, state, "organization:write").await?;
    check_csrf(&viewer, form.csrf_token.as_deref())?;
    let level = Level::try_from(form.level).map_err(|e| ApiError::validation(e, Some("level")))?;
    let by = &viewer.credential.user;
    let made = state
        .engine
        .tenancy
        .create_invite(
            by,
            by.organization_id,
            NewInvite {
                target_email: form.target_email,
                first_name: None,
                level,
                message: None,
            },
        )
        .await?;
    tracing::info!(invite = %made.id, email = %made.target_email,
        link = %format!("{}/signup/{}", state.public_url, made.id),
        "invitation made; the invitee sets a password at its link");
    see_other(&format!("/console/team?invite={}", made.id))
}

/// A change to a member: deactivate (`/console/team/deactivate`), or set `level` and/or
/// `is_active` (`/console/team/member`).
#[derive(Deserialize)]
pub struct MemberForm {
    csrf_token: Option<String>,
    member: String,
    level: Option<u8>,
    is_active: Option<bool>,
}

pub async fn deactivate(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<MemberForm>,
) -> HttpResponse {
    let form = MemberForm {
        level: None,
        is_active: Some(false),
        ..form.into_inner()
    };
    respond(change_member(&req, &state, form).await)
}

pub async fn member(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<MemberForm>,
) -> HttpResponse {
    respond(change_member(&req, &state, form.into_inner()).await)
}

async fn change_member(req: &HttpRequest, state: &AppState, form: MemberForm) -> Page {
    let viewer = viewer(req, state, "organization:write").await?;
    check_csrf(&viewer, form.csrf_token.as_deref())?;
    let member = uuid::Uuid::parse_str(&form.member).map_err(|_| ApiError::not_found("Member"))?;
    let level = form
        .level
        .map(Level::try_from)
        .transpose()
        .map_err(|e| ApiError::validation(e, Some("level")))?;
    let by = &viewer.credential.user;
    state
        .engine
        .tenancy
        .update_member(
            by,
            by.organization_id,
            member,
            MemberUpdate {
                level,
                is_active: form.is_active,
            },
        )
        .await?;
    see_other("/console/team")
}
