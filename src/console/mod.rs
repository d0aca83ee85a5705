//! The console: server-rendered pages at `/console` for the people who run Corvid. Each page
//! reads through the same facades as the API, signed in with the browser session of `/login`
//! and gated by the scope its API route needs (a member's session lacks `organization:write`,
//! so the team's admin page refuses them). Templates are askama's, checked at compile time;
//! the only script is `console.js` (the live log tail), served from the binary under a strict
//! Content-Security-Policy. Every page reads with JavaScript off; changes are plain forms
//! carrying the session's CSRF token.

mod activity;
mod assets;
mod endpoints;
mod flags;
mod overview;
mod people;
mod settings;

use std::sync::Arc;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use askama::Template;
use corvid_tenancy::{Credential, Project, Scope};

use crate::error::ApiError;
use crate::http::session;
use crate::state::AppState;

/// Sent with every console page: nothing but the binary's own script, style and images.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn configure(cfg: &mut web::ServiceConfig) {
    let project = "/console/projects/{project}";
    cfg.route("/console", web::get().to(overview::page))
        // Browsers ask every site for one; there is none, and "none" is not an error.
        .route(
            "/favicon.ico",
            web::get().to(|| async {
                HttpResponse::NoContent()
                    .insert_header((header::CACHE_CONTROL, "public, max-age=86400"))
                    .finish()
            }),
        )
        .route("/console/assets/{name}", web::get().to(assets::serve))
        .route(&format!("{project}/flags"), web::get().to(flags::list))
        .route(
            &format!("{project}/flags/{{id}}"),
            web::get().to(flags::detail),
        )
        .route(
            &format!("{project}/flags/{{id}}/rollout"),
            web::post().to(flags::rollout),
        )
        .route(
            &format!("{project}/flags/{{id}}/revert"),
            web::post().to(flags::revert),
        )
        .route(
            &format!("{project}/endpoints"),
            web::get().to(endpoints::list),
        )
        .route(
            &format!("{project}/endpoints/{{name}}"),
            web::get().to(endpoints::detail),
        )
        .route(
            &format!("{project}/activity"),
            web::get().to(activity::page),
        )
        .route(
            &format!("{project}/events"),
            web::get().to(activity::events),
        )
        .route(
            &format!("{project}/webhooks"),
            web::get().to(settings::webhooks),
        )
        .route(
            &format!("{project}/persons"),
            web::get().to(people::persons),
        )
        .route(
            &format!("{project}/persons/delete"),
            web::post().to(people::delete_person),
        )
        .route("/console/team", web::get().to(people::team))
        .route("/console/team/invite", web::post().to(people::invite))
        .route(
            "/console/team/deactivate",
            web::post().to(people::deactivate),
        )
        .route("/console/team/member", web::post().to(people::member))
        .route("/console/keys", web::get().to(settings::keys));
}

/// The signed-in person looking at a page.
pub struct Viewer {
    pub credential: Arc<Credential>,
    pub csrf: String,
    /// The projects they can open, by id.
    pub projects: Vec<Project>,
}

/// What every page's frame shows: who is signed in, the project picker and the CSRF token
/// forms carry.
pub struct Nav {
    pub email: String,
    pub csrf: String,
    pub project: u64,
    pub projects: Vec<(u64, String)>,
    pub section: &'static str,
    pub css: String,
    pub js: String,
}

impl Viewer {
    pub fn nav(&self, project: u64, section: &'static str) -> Nav {
        Nav {
            email: self.credential.user.email.clone(),
            csrf: self.csrf.clone(),
            project,
            projects: self
                .projects
                .iter()
                .map(|p| (p.id, p.name.clone()))
                .collect(),
            section,
            css: assets::css(),
            js: assets::js(),
        }
    }

    /// The first project they can open (the overview's).
    pub fn first_project(&self) -> u64 {
        self.projects.first().map_or(0, |p| p.id)
    }

    pub fn actor(&self) -> corvid_activity::Actor {
        crate::auth::actor(&self.credential)
    }
}

/// Why a page is not shown: the answer to send instead (boxed: a response is large, and
/// pages pass refusals up with `?`).
pub struct Refusal(Box<HttpResponse>);

impl From<ApiError> for Refusal {
    fn from(err: ApiError) -> Refusal {
        let status = err.status_code();
        if status.is_server_error() {
            tracing::error!(error = %err, "a console page failed");
        }
        let detail = if status.is_server_error() {
            "Something went wrong on the server; the log says what.".to_string()
        } else {
            err.to_string()
        };
        Refusal::page(message(status, "Not possible", &detail))
    }
}

/// The domains' errors, answered as the API would word them.
macro_rules! refused_as_api {
    ($($error:ty),*) => {
        $(impl From<$error> for Refusal {
            fn from(err: $error) -> Refusal {
                Refusal::from(ApiError::from(err))
            }
        })*
    };
}

refused_as_api!(
    corvid_tenancy::StoreError,
    corvid_endpoints::EndpointError,
    corvid_webhooks::WebhookError,
    actix_web::error::BlockingError
);

/// A page's outcome: the page, or what to send instead.
pub type Page = Result<HttpResponse, Refusal>;

impl Refusal {
    fn page(res: HttpResponse) -> Refusal {
        Refusal(Box::new(res))
    }
}

/// Unwraps a page's outcome into the response.
pub fn respond(page: Page) -> HttpResponse {
    page.unwrap_or_else(|Refusal(res)| *res)
}

#[derive(Template)]
#[template(path = "message.html")]
struct Message<'a> {
    title: &'a str,
    detail: &'a str,
}

/// A page with only a message (refusals, errors).
fn message(status: StatusCode, title: &str, detail: &str) -> HttpResponse {
    html(status, Message { title, detail }.render())
}

/// A rendered page with the console's headers.
fn html(status: StatusCode, rendered: askama::Result<String>) -> HttpResponse {
    match rendered {
        Ok(body) => HttpResponse::build(status)
            .content_type("text/html; charset=utf-8")
            .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .insert_header(("Referrer-Policy", "same-origin"))
            .body(body),
        Err(err) => {
            tracing::error!(error = %err, "a console template failed to render");
            HttpResponse::InternalServerError().finish()
        }
    }
}

/// Renders a page template.
pub fn render(template: &impl Template) -> Page {
    Ok(html(StatusCode::OK, template.render()))
}

/// A redirect after a form (POST, then GET the page again).
pub fn see_other(to: &str) -> Page {
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, to.to_string()))
        .finish())
}

/// The viewer of a request that holds `scope`: without a session, the browser is sent to sign
/// in (and back); without the scope, 403.
pub async fn viewer(
    req: &HttpRequest,
    state: &AppState,
    scope: &'static str,
) -> Result<Viewer, Refusal> {
    let Some(s) = session::current(req, state).await? else {
        let next = req
            .uri()
            .path_and_query()
            .map_or("/console", |p| p.as_str());
        let query = serde_urlencoded::to_string([("next", next)]).unwrap_or_default();
        return Err(Refusal::page(
            HttpResponse::SeeOther()
                .insert_header((header::LOCATION, format!("/login?{query}")))
                .finish(),
        ));
    };
    let csrf = s.record.csrf.clone();
    let Some(credential) = Credential::from_session(s.user, s.record.expires_at) else {
        return Err(Refusal::page(message(
            StatusCode::FORBIDDEN,
            "Deactivated",
            "This account was deactivated.",
        )));
    };
    let wanted = Scope::parse(scope).ok_or_else(|| {
        Refusal::from(ApiError::Internal(anyhow::anyhow!("unknown scope {scope}")))
    })?;
    if !credential.grants(&wanted) {
        return Err(Refusal::page(message(
            StatusCode::FORBIDDEN,
            "Not for your role",
            &format!("This page needs the scope {scope}, which your role does not have."),
        )));
    }
    let projects = state
        .engine
        .tenancy
        .projects_of_organization(credential.user.organization_id)
        .await?
        .into_iter()
        .filter(|p| credential.allows_project(p))
        .collect();
    Ok(Viewer {
        credential: Arc::new(credential),
        csrf,
        projects,
    })
}

/// The project a page names, if the viewer can open it.
pub fn project(viewer: &Viewer, raw: &str) -> Result<Project, Refusal> {
    raw.parse::<u64>()
        .ok()
        .and_then(|id| viewer.projects.iter().find(|p| p.id == id).cloned())
        .ok_or_else(|| {
            Refusal::page(message(
                StatusCode::NOT_FOUND,
                "Not found",
                "No such project.",
            ))
        })
}

/// A form's CSRF token must be the session's.
pub fn check_csrf(viewer: &Viewer, given: Option<&str>) -> Result<(), Refusal> {
    if session::csrf_matches(&viewer.csrf, given) {
        Ok(())
    } else {
        Err(Refusal::page(message(
            StatusCode::FORBIDDEN,
            "Form expired",
            "The form's security token did not match your session. Reload the page and try again.",
        )))
    }
}

/// Query parameters of a page.
pub type Params = web::Query<std::collections::HashMap<String, String>>;

/// A JSON value as short text for a table cell.
pub fn short(value: &serde_json::Value) -> String {
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "—".into(),
        other => other.to_string(),
    };
    if text.chars().count() > 200 {
        format!("{}…", text.chars().take(200).collect::<String>())
    } else {
        text
    }
}
