//! Flags: the list (with search) and a flag's page: its conditions and payloads, a form per
//! condition to change its rollout, "evaluate for a distinct id" (the answer, the reason, the
//! matched condition and the hash bucket), and its history with field diffs and a revert.

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use chrono::Utc;
use corvid_activity::{ActivityEntry, ActivityQuery};
use corvid_flags::{Caller, FlagChanges, FlagRecord, Flags, Served};
use corvid_kernel::wire::WireInput;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_csrf, project, render, respond, see_other, short, viewer, Nav, Page, Params};
use crate::error::ApiError;
use crate::state::AppState;

struct FlagRow {
    id: i64,
    key: String,
    name: String,
    active: bool,
    rollout: String,
    version: i64,
    updated_at: String,
}

#[derive(Template)]
#[template(path = "flags.html")]
struct List {
    nav: Nav,
    q: String,
    flags: Vec<FlagRow>,
    total: usize,
}

fn rollout_summary(f: &FlagRecord) -> String {
    let groups = &f.definition.filters.groups;
    if groups.is_empty() {
        return "no conditions".into();
    }
    groups
        .iter()
        .map(|g| format!("{}%", g.rollout_percentage.unwrap_or(100.0)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn when(t: chrono::DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

pub async fn list(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    params: Params,
) -> HttpResponse {
    respond(build_list(&req, &state, &path, &params).await)
}

async fn build_list(req: &HttpRequest, state: &AppState, raw: &str, params: &Params) -> Page {
    let viewer = viewer(req, state, "feature_flag:read").await?;
    let project = project(&viewer, raw)?;
    let q = params.get("q").cloned().unwrap_or_default();
    let needle = q.to_lowercase();
    let all = state.engine.flags.list_flags(project.id).await?;
    let total = all.len();
    let flags = all
        .iter()
        .filter(|f| !f.definition.deleted)
        .filter(|f| {
            needle.is_empty()
                || f.definition.key.to_lowercase().contains(&needle)
                || f.definition.name.to_lowercase().contains(&needle)
        })
        .take(500)
        .map(|f| FlagRow {
            id: f.definition.id,
            key: f.definition.key.clone(),
            name: f.definition.name.clone(),
            active: f.definition.active,
            rollout: rollout_summary(f),
            version: f.definition.version,
            updated_at: when(f.updated_at),
        })
        .collect();
    render(&List {
        nav: viewer.nav(project.id, "flags"),
        q,
        flags,
        total,
    })
}

struct ConditionRow {
    index: usize,
    properties: String,
    rollout: String,
    rollout_value: f64,
    variant: String,
}

struct ChangeRow {
    field: String,
    before: String,
    after: String,
}

struct HistoryRow {
    id: String,
    when: String,
    who: String,
    activity: String,
    version: Option<i64>,
    changes: Vec<ChangeRow>,
    revertible: bool,
}

struct EvaluationView {
    answer: String,
    reason: String,
    condition: String,
    bucket: String,
    payload: String,
}

#[derive(Template)]
#[template(path = "flag.html")]
struct Detail {
    nav: Nav,
    id: i64,
    key: String,
    name: String,
    active: bool,
    version: i64,
    updated_at: String,
    notice: Option<String>,
    conditions: Vec<ConditionRow>,
    variants: String,
    payloads: String,
    distinct_id: String,
    evaluation: Option<EvaluationView>,
    history: Vec<HistoryRow>,
}

fn flag_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found("Feature flag"))
}

fn history_row(e: &ActivityEntry) -> HistoryRow {
    HistoryRow {
        id: e.id.to_string(),
        when: when(e.created_at),
        who: e
            .user
            .email
            .clone()
            .unwrap_or_else(|| e.user.first_name.clone()),
        activity: e.activity.clone(),
        version: e.version,
        changes: e
            .detail
            .changes
            .iter()
            .map(|c| ChangeRow {
                field: c.field.clone().unwrap_or_else(|| c.action.clone()),
                before: short(&c.before),
                after: short(&c.after),
            })
            .collect(),
        revertible: matches!(e.activity.as_str(), "updated" | "reverted"),
    }
}

pub async fn detail(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    params: Params,
) -> HttpResponse {
    respond(build_detail(&req, &state, &path, &params).await)
}

async fn build_detail(
    req: &HttpRequest,
    state: &AppState,
    (raw_project, raw_id): &(String, String),
    params: &Params,
) -> Page {
    let viewer = viewer(req, state, "feature_flag:read").await?;
    let project = project(&viewer, raw_project)?;
    let id = flag_id(raw_id)?;
    let flag = state.engine.flags.flag(project.id, id).await?;
    let d = &flag.definition;
    let history = state
        .engine
        .activity
        .list(
            project.id,
            ActivityQuery {
                scopes: vec!["FeatureFlag".into()],
                item_id: Some(id.to_string()),
                limit: 50,
                ..ActivityQuery::default()
            },
        )
        .await?;
    let distinct_id = params.get("distinct_id").cloned().unwrap_or_default();
    let evaluation = if distinct_id.is_empty() {
        None
    } else {
        Some(evaluate(state, &project, &flag, &distinct_id).await?)
    };
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
    render(&Detail {
        nav: viewer.nav(project.id, "flags"),
        id,
        key: d.key.clone(),
        name: d.name.clone(),
        active: d.active,
        version: d.version,
        updated_at: when(flag.updated_at),
        notice: params.get("notice").cloned(),
        conditions: d
            .filters
            .groups
            .iter()
            .enumerate()
            .map(|(index, g)| ConditionRow {
                index,
                properties: if g.properties.is_empty() {
                    "everyone".into()
                } else {
                    pretty(&json!(g.properties))
                },
                rollout: format!("{}%", g.rollout_percentage.unwrap_or(100.0)),
                rollout_value: g.rollout_percentage.unwrap_or(100.0),
                variant: g.variant.clone().unwrap_or_default(),
            })
            .collect(),
        variants: d
            .filters
            .multivariate
            .as_ref()
            .map(|m| pretty(&json!(m)))
            .unwrap_or_default(),
        payloads: if d.filters.payloads.is_empty() {
            String::new()
        } else {
            pretty(&Value::Object(d.filters.payloads.clone()))
        },
        distinct_id,
        evaluation,
        history: history.entries.iter().map(history_row).collect(),
    })
}

/// Evaluates the project's flags for `distinct_id` as `/flags` would (with what Corvid knows
/// of the person) and reports this flag's answer.
async fn evaluate(
    state: &AppState,
    project: &corvid_tenancy::Project,
    flag: &FlagRecord,
    distinct_id: &str,
) -> Result<EvaluationView, ApiError> {
    let body = json!({"token": project.api_token, "distinct_id": distinct_id}).to_string();
    let request = Flags::decode_request(
        WireInput {
            body: body.as_bytes(),
            content_type: Some("application/json"),
            ..WireInput::default()
        },
        64 * 1024,
    )
    .map_err(|e| ApiError::validation(e.to_string(), Some("distinct_id")))?;
    let caller = Caller {
        user_agent: None,
        browser_headers: false,
        ip: None,
    };
    let served = state
        .engine
        .flags
        .serve(project, request, caller, Utc::now())
        .await?;
    let key = &flag.definition.key;
    let bucket = format!(
        "{:.2} of 100 (the condition matches when this is below its rollout)",
        corvid_flags::rollout_hash(key, distinct_id) * 100.0
    );
    let Served::Evaluated(outcome) = served else {
        return Ok(EvaluationView {
            answer: "not evaluated: the organization is over its flag quota".into(),
            reason: String::new(),
            condition: String::new(),
            bucket,
            payload: String::new(),
        });
    };
    let found = outcome
        .returned()
        .find(|(i, _)| outcome.flag(*i).id == flag.definition.id);
    Ok(match found {
        Some((_, e)) => EvaluationView {
            answer: match (&e.variant, e.enabled) {
                (_, false) => "false".into(),
                (Some(v), true) => format!("\"{v}\""),
                (None, true) => "true".into(),
            },
            reason: format!("{} — {}", e.reason.code, e.reason.description()),
            condition: e
                .reason
                .condition_index
                .map_or_else(|| "none".into(), |i| format!("condition {}", i + 1)),
            bucket,
            payload: e
                .payload
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_default(),
        },
        None => EvaluationView {
            answer: "not returned (inactive or deleted)".into(),
            reason: String::new(),
            condition: String::new(),
            bucket,
            payload: String::new(),
        },
    })
}

#[derive(Deserialize)]
pub struct RolloutForm {
    csrf_token: Option<String>,
    condition: usize,
    rollout_percentage: f64,
}

pub async fn rollout(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    form: web::Form<RolloutForm>,
) -> HttpResponse {
    respond(change_rollout(&req, &state, &path, form.into_inner()).await)
}

async fn change_rollout(
    req: &HttpRequest,
    state: &AppState,
    (raw_project, raw_id): &(String, String),
    form: RolloutForm,
) -> Page {
    let viewer = viewer(req, state, "feature_flag:write").await?;
    check_csrf(&viewer, form.csrf_token.as_deref())?;
    let project = project(&viewer, raw_project)?;
    let id = flag_id(raw_id)?;
    if !(0.0..=100.0).contains(&form.rollout_percentage) {
        return Err(ApiError::validation(
            "The rollout is a percentage from 0 to 100.",
            Some("rollout_percentage"),
        )
        .into());
    }
    let flag = state.engine.flags.flag(project.id, id).await?;
    let mut filters = flag.definition.filters.clone();
    let group = filters
        .groups
        .get_mut(form.condition)
        .ok_or_else(|| ApiError::validation("No such condition.", Some("condition")))?;
    group.rollout_percentage = Some(form.rollout_percentage);
    let changes = FlagChanges {
        filters: Some(filters),
        ..FlagChanges::default()
    };
    state
        .engine
        .flags
        .update_flag(project.id, id, &viewer.actor(), changes)
        .await?;
    see_other(&format!(
        "/console/projects/{}/flags/{id}?notice=Rollout+saved",
        project.id
    ))
}

#[derive(Deserialize)]
pub struct RevertForm {
    csrf_token: Option<String>,
    activity_log_id: Option<String>,
}

pub async fn revert(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    form: web::Form<RevertForm>,
) -> HttpResponse {
    respond(revert_flag(&req, &state, &path, form.into_inner()).await)
}

async fn revert_flag(
    req: &HttpRequest,
    state: &AppState,
    (raw_project, raw_id): &(String, String),
    form: RevertForm,
) -> Page {
    let viewer = viewer(req, state, "feature_flag:write").await?;
    check_csrf(&viewer, form.csrf_token.as_deref())?;
    let project = project(&viewer, raw_project)?;
    let id = flag_id(raw_id)?;
    let entry = form
        .activity_log_id
        .filter(|s| !s.is_empty())
        .map(|s| uuid::Uuid::parse_str(&s))
        .transpose()
        .map_err(|_| ApiError::validation("Not an entry id.", Some("activity_log_id")))?;
    let reverted = state
        .engine
        .flags
        .revert_flag(project.id, id, &viewer.actor(), entry)
        .await?;
    see_other(&format!(
        "/console/projects/{}/flags/{id}?notice=Reverted+to+version+{}",
        project.id, reverted.restored_version
    ))
}
