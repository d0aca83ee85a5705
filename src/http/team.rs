//! A team on PostHog's routes: an organization's members (`…/members/`, a level each: 1
//! member, 8 admin, 15 owner; PATCH a level or `is_active`, DELETE deactivates), invites
//! (`…/invites/`) whose link the invitee opens to set a password (`/signup/{id}` in a browser,
//! `/api/signup/{id}/` as JSON), and a user's own password change (`PATCH /api/users/@me/`).
//! No mail is sent: the link is in the answer to the inviter and in the server's log.

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_oauth::OAuth;
use corvid_tenancy::{Invite, Level, MemberUpdate, NewInvite, User};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::oauth::pages;
use super::session;
use super::uuid_path;
use crate::auth::scope::{OrganizationRead, OrganizationWrite, UserWrite};
use crate::auth::Authed;
use crate::body::ValidJson;
use crate::error::ApiError;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    let org = "/api/organizations/{org}";
    cfg.route(&format!("{org}/members"), web::get().to(members))
        .route(
            &format!("{org}/members/{{member}}"),
            web::patch().to(update_member),
        )
        .route(
            &format!("{org}/members/{{member}}"),
            web::delete().to(deactivate),
        )
        .route(&format!("{org}/invites"), web::get().to(invites))
        .route(&format!("{org}/invites"), web::post().to(invite))
        .route(
            &format!("{org}/invites/{{invite}}"),
            web::delete().to(cancel_invite),
        )
        .route("/api/signup/{invite}", web::get().to(signup_info))
        .route("/api/signup/{invite}", web::post().to(signup_json))
        .route("/signup/{invite}", web::get().to(signup_page))
        .route("/signup/{invite}", web::post().to(signup_form))
        .route("/api/users/@me", web::patch().to(update_me));
}

/// The caller's organization when `raw` names it (`@current` or its id); any other is 404.
fn own_org(user: &User, raw: &str) -> Result<Uuid, ApiError> {
    if raw == "@current" || raw.parse::<Uuid>().ok() == Some(user.organization_id) {
        Ok(user.organization_id)
    } else {
        Err(ApiError::not_found("Organization"))
    }
}

fn member_json(u: &User) -> Value {
    json!({
        "id": u.uuid,
        "user": {
            "id": u.id,
            "uuid": u.uuid,
            "distinct_id": u.uuid,
            "first_name": u.first_name,
            "email": u.email,
            "is_active": u.is_active,
        },
        "level": u8::from(u.level),
        "level_name": u.level.name(),
        "is_active": u.is_active,
        "joined_at": u.created_at,
        "deactivated_at": u.deactivated_at,
    })
}

fn invite_link(state: &AppState, id: Uuid) -> String {
    format!("{}/signup/{id}", state.public_url)
}

fn invite_json(state: &AppState, i: &Invite) -> Value {
    json!({
        "id": i.id,
        "target_email": i.target_email,
        "first_name": i.first_name,
        "level": u8::from(i.level),
        "message": i.message,
        "created_by": i.created_by,
        "created_at": i.created_at,
        "expires_at": i.expires_at,
        "is_expired": i.expires_at <= Utc::now(),
        "emailing_attempt_made": false,
        "invite_link": invite_link(state, i.id),
    })
}

fn level(raw: Option<u8>) -> Result<Option<Level>, ApiError> {
    raw.map(|n| Level::try_from(n).map_err(|e| ApiError::validation(e, Some("level"))))
        .transpose()
}

async fn members(
    req: HttpRequest,
    auth: Authed<OrganizationRead>,
    state: web::Data<AppState>,
    path: web::Path<String>,
    params: web::Query<std::collections::HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let org = own_org(&auth.credential.user, &path)?;
    let team = state.engine.tenancy.members(org).await?;
    super::paged(
        &req,
        &state,
        &params,
        team.iter().map(member_json).collect(),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberBody {
    level: Option<u8>,
    is_active: Option<bool>,
}

async fn update_member(
    auth: Authed<OrganizationWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: ValidJson<MemberBody>,
) -> Result<HttpResponse, ApiError> {
    let by = &auth.credential.user;
    let org = own_org(by, &path.0)?;
    let member = uuid_path(&path.1, "Member")?;
    let update = MemberUpdate {
        level: level(body.0.level)?,
        is_active: body.0.is_active,
    };
    let updated = state
        .engine
        .tenancy
        .update_member(by, org, member, update)
        .await?;
    Ok(HttpResponse::Ok().json(member_json(&updated)))
}

/// Removing a member deactivates them (a user belongs to one organization): they cannot
/// sign in, and their keys, tokens and sessions stop working.
async fn deactivate(
    auth: Authed<OrganizationWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let by = &auth.credential.user;
    let org = own_org(by, &path.0)?;
    let member = uuid_path(&path.1, "Member")?;
    let update = MemberUpdate {
        level: None,
        is_active: Some(false),
    };
    state
        .engine
        .tenancy
        .update_member(by, org, member, update)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn invites(
    req: HttpRequest,
    auth: Authed<OrganizationRead>,
    state: web::Data<AppState>,
    path: web::Path<String>,
    params: web::Query<std::collections::HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let org = own_org(&auth.credential.user, &path)?;
    let list = state.engine.tenancy.invites(org).await?;
    let rows = list.iter().map(|i| invite_json(&state, i)).collect();
    super::paged(&req, &state, &params, rows)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InviteBody {
    target_email: String,
    first_name: Option<String>,
    level: Option<u8>,
    message: Option<String>,
    /// PostHog's flag for sending the email; no mail is sent here either way.
    #[serde(default)]
    #[allow(dead_code)]
    is_email_sent: Option<bool>,
}

async fn invite(
    auth: Authed<OrganizationWrite>,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: ValidJson<InviteBody>,
) -> Result<HttpResponse, ApiError> {
    let by = &auth.credential.user;
    let org = own_org(by, &path)?;
    let body = body.0;
    let new = NewInvite {
        target_email: body.target_email,
        first_name: body.first_name,
        level: level(body.level)?.unwrap_or(Level::Member),
        message: body.message,
    };
    let made = state.engine.tenancy.create_invite(by, org, new).await?;
    // No mail is sent: whoever invited hands the link over; it is also in the log.
    tracing::info!(invite = %made.id, email = %made.target_email, link = %invite_link(&state, made.id),
        "invitation made; the invitee sets a password at its link");
    Ok(HttpResponse::Created().json(invite_json(&state, &made)))
}

async fn cancel_invite(
    auth: Authed<OrganizationWrite>,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let by = &auth.credential.user;
    let org = own_org(by, &path.0)?;
    let id = uuid_path(&path.1, "Invite")?;
    state.engine.tenancy.delete_invite(by, org, id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// What an invitee sees before accepting (PostHog's signup prevalidation).
async fn signup_info(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path, "Invite")?;
    let (invite, org) = state
        .engine
        .tenancy
        .open_invite(id)
        .await?
        .ok_or_else(|| ApiError::not_found("Invite"))?;
    Ok(HttpResponse::Ok().json(json!({
        "id": invite.id,
        "target_email": invite.target_email,
        "first_name": invite.first_name,
        "organization_name": org.name,
        "expires_at": invite.expires_at,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignupBody {
    password: String,
    first_name: Option<String>,
}

/// Accepts an invite: 201 with the new user, signed in (a session cookie).
async fn signup_json(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: ValidJson<SignupBody>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path(&path, "Invite")?;
    let body = body.0;
    let user = state
        .engine
        .tenancy
        .accept_invite(id, body.first_name, body.password)
        .await?;
    let [session_cookie, csrf_cookie] = session::sign_in(&state, user.id).await?;
    Ok(HttpResponse::Created()
        .append_header((header::SET_COOKIE, session_cookie))
        .append_header((header::SET_COOKIE, csrf_cookie))
        .json(json!({
            "id": user.id,
            "uuid": user.uuid,
            "email": user.email,
            "first_name": user.first_name,
            "level": u8::from(user.level),
        })))
}

/// Where the browser goes once signed up.
const AFTER_SIGNUP: &str = "/console";

fn signup_html(invite: &Invite, org: &str, csrf: &str, failed: Option<&str>) -> String {
    let message = failed
        .map(|m| format!("<p class=\"error\" role=\"alert\">{}</p>", pages::esc(m)))
        .unwrap_or_default();
    format!(
        "<h1>Join {org}</h1><p>You were invited as <strong>{email}</strong>.</p>{message}\
         <form method=\"post\" action=\"/signup/{id}\">{csrf}\
         <label for=\"first_name\">Your name</label>\
         <input id=\"first_name\" name=\"first_name\" autocomplete=\"name\" value=\"{name}\">\
         <label for=\"password\">Choose a password (at least 8 characters)</label>\
         <input id=\"password\" name=\"password\" type=\"password\" autocomplete=\"new-password\" minlength=\"8\" required>\
         <div class=\"actions\"><button class=\"primary\" type=\"submit\">Join</button></div></form>",
        org = pages::esc(org),
        email = pages::esc(&invite.target_email),
        id = invite.id,
        csrf = pages::hidden("csrf_token", csrf),
        name = pages::esc(&invite.first_name),
    )
}

fn expired_page() -> HttpResponse {
    pages::error(
        StatusCode::NOT_FOUND,
        "Invitation not found",
        "This invitation does not exist, was used already or has expired. Ask for a new one.",
    )
}

/// The invitation's page: a form to set a password. Its CSRF token is a double-submit cookie
/// (there is no session yet), as on the sign-in page.
async fn signup_page(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let Ok(id) = path.parse::<Uuid>() else {
        return Ok(expired_page());
    };
    let Some((invite, org)) = state.engine.tenancy.open_invite(id).await? else {
        return Ok(expired_page());
    };
    Ok(form_page(&state, &invite, &org.name, None, StatusCode::OK))
}

fn form_page(
    state: &AppState,
    invite: &Invite,
    org: &str,
    failed: Option<&str>,
    status: StatusCode,
) -> HttpResponse {
    let csrf = OAuth::new_csrf_token();
    let mut res = pages::page(status, "Join", &signup_html(invite, org, &csrf, failed));
    if let Ok(value) = header::HeaderValue::from_str(&session::set_cookie(
        state,
        session::LOGIN_CSRF_COOKIE,
        &csrf,
        3600,
    )) {
        res.headers_mut().append(header::SET_COOKIE, value);
    }
    res
}

#[derive(Deserialize)]
struct SignupForm {
    #[serde(default)]
    first_name: Option<String>,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf_token: Option<String>,
}

async fn signup_form(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<SignupForm>,
) -> Result<HttpResponse, ApiError> {
    let Ok(id) = path.parse::<Uuid>() else {
        return Ok(expired_page());
    };
    let Some((invite, org)) = state.engine.tenancy.open_invite(id).await? else {
        return Ok(expired_page());
    };
    let form = form.into_inner();
    let expected = session::cookie(&req, session::LOGIN_CSRF_COOKIE).unwrap_or_default();
    if !session::csrf_matches(&expected, form.csrf_token.as_deref()) {
        return Ok(pages::error(
            StatusCode::FORBIDDEN,
            "Form expired",
            "The form was missing its security token or it did not match. Reload the page and try again.",
        ));
    }
    let accepted = state
        .engine
        .tenancy
        .accept_invite(id, form.first_name, form.password)
        .await;
    let user = match accepted {
        Ok(user) => user,
        Err(corvid_tenancy::StoreError::Invalid { detail, .. }) => {
            return Ok(form_page(
                &state,
                &invite,
                &org.name,
                Some(&detail),
                StatusCode::BAD_REQUEST,
            ))
        }
        Err(err) => return Err(err.into()),
    };
    let [session_cookie, csrf_cookie] = session::sign_in(&state, user.id).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, AFTER_SIGNUP))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .append_header((header::SET_COOKIE, session_cookie))
        .append_header((header::SET_COOKIE, csrf_cookie))
        .append_header((
            header::SET_COOKIE,
            session::set_cookie(&state, session::LOGIN_CSRF_COOKIE, "", 0),
        ))
        .finish())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MeBody {
    current_password: Option<String>,
    password: Option<String>,
}

/// A user's own change: the password, with the current one.
async fn update_me(
    auth: Authed<UserWrite>,
    state: web::Data<AppState>,
    body: ValidJson<MeBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.0;
    let Some(password) = body.password else {
        return Err(ApiError::validation(
            "Nothing to change: send password (with current_password).",
            Some("password"),
        ));
    };
    let current = body
        .current_password
        .ok_or_else(|| ApiError::validation("This field is required.", Some("current_password")))?;
    let user = state
        .engine
        .tenancy
        .change_password(&auth.credential.user, current, password)
        .await?;
    Ok(HttpResponse::Ok().json(json!({
        "id": user.id,
        "uuid": user.uuid,
        "email": user.email,
        "first_name": user.first_name,
        "level": u8::from(user.level),
    })))
}
