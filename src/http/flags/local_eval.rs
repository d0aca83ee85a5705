//! Definitions for SDK local evaluation (`/flags/definitions`,
//! `/api/feature_flag/local_evaluation`), with an ETag.

use std::collections::{BTreeMap, HashMap};

use actix_web::http::header;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use corvid_actors::flags::engine::dependencies;
use corvid_actors::flags::model::FlagDefinition;
use serde_json::{json, Value};

use crate::auth::scope::FeatureFlagRead;
use crate::auth::{resolve_project_token, Authed};
use crate::error::ApiError;
use crate::state::AppState;
use crate::telemetry::RequestProject;

/// Definitions for SDK local evaluation. Flag-dependency filters name the dependency by key and
/// carry its `dependency_chain`, as the SDKs expect.
pub(super) async fn definitions(
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
    let etag = format!("\"{}\"", corvid_actors::kernel::secrets::sha256_hex(&text));
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
