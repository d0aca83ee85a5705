//! Definitions for SDK local evaluation (`/flags/definitions`,
//! `/api/feature_flag/local_evaluation`): active flags, group type names and dynamic cohorts,
//! with an ETag so pollers get a 304 when nothing changed. Flag-dependency filters name the
//! dependency by key and carry its `dependency_chain`, as the SDKs expect; static cohorts are
//! not shipped (their members need the server).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};

use super::evaluation::dependencies;
use super::model::FlagDefinition;
use super::Flags;
use corvid_kernel::{blocking, secrets, StoreError};

/// The definitions document and its ETag (a quoted SHA-256 of the body).
#[derive(Debug, Clone, PartialEq)]
pub struct LocalEvaluation {
    pub body: String,
    pub etag: String,
}

impl Flags {
    /// The local-evaluation definitions of `project`.
    pub async fn local_evaluation(&self, project_id: u64) -> Result<LocalEvaluation, StoreError> {
        let (flags, persons) = (Arc::clone(&self.store), Arc::clone(&self.persons));
        let (snapshot, group_types) = blocking(move || {
            Ok::<_, StoreError>((
                flags.snapshot(project_id)?,
                persons.group_types(project_id)?,
            ))
        })
        .await?;
        let render = move || -> Result<String, serde_json::Error> {
            let keys_by_id: HashMap<i64, String> = snapshot
                .flags
                .iter()
                .map(|f| (f.id, f.key.clone()))
                .collect();
            let flag_list: Vec<Value> = snapshot
                .flags
                .iter()
                .map(|f| {
                    let mut filters = serde_json::to_value(&f.filters)?;
                    rewrite_dependencies(&mut filters, &keys_by_id, &snapshot.flags);
                    Ok(json!({
                        "id": f.id, "team_id": project_id, "name": f.name, "key": f.key, "filters": filters,
                        "deleted": false, "active": f.active, "ensure_experience_continuity": f.ensure_experience_continuity,
                        "version": f.version, "evaluation_runtime": f.evaluation_runtime.as_deref().unwrap_or("all"),
                        "evaluation_contexts": f.evaluation_contexts, "bucketing_identifier": f.bucketing_identifier,
                    }))
                })
                .collect::<Result<_, serde_json::Error>>()?;
            let cohorts: BTreeMap<String, Value> = snapshot
                .cohorts
                .values()
                .filter(|c| !c.is_static)
                .filter_map(|c| Some((c.id.to_string(), c.filters.as_ref()?)))
                .map(|(id, f)| Ok((id, serde_json::to_value(&f.properties)?)))
                .collect::<Result<_, serde_json::Error>>()?;
            let mapping: BTreeMap<String, String> = group_types
                .into_iter()
                .map(|(name, i)| (i.to_string(), name))
                .collect();
            let body =
                json!({"flags": flag_list, "group_type_mapping": mapping, "cohorts": cohorts});
            Ok(body.to_string())
        };
        let body = render().map_err(|e| StoreError::Encode {
            what: "local evaluation definitions",
            source: e,
        })?;
        let etag = format!("\"{}\"", secrets::sha256_hex(&body));
        Ok(LocalEvaluation { body, etag })
    }
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
