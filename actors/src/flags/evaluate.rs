//! Evaluating a `/flags` request for a project: stored person and group properties overlaid
//! by the request's, static cohorts, runtime and context filters, then every selected flag.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::engine::{evaluate_all, Evaluation, GroupData, Subject};
use super::model::FlagDefinition;
use super::properties::MatchContext;
use super::request::{is_selected, FlagRequest, Runtime};
use super::store::{FlagStore, ProjectFlags};
use crate::meta::StoreError;
use crate::persons::PersonStore;

/// The evaluated flags of one request, in flag id order.
pub struct FlagsOutcome {
    pub snapshot: Arc<ProjectFlags>,
    pub results: Vec<(usize, Evaluation)>,
    pub errors: bool,
}

impl FlagsOutcome {
    pub fn flag(&self, index: usize) -> &FlagDefinition {
        &self.snapshot.flags[index]
    }
}

/// Evaluates the request's flags. Blocking (sled reads): call off the event loop.
pub fn evaluate_request(
    flags: &FlagStore,
    persons: &PersonStore,
    project_id: u64,
    request: &FlagRequest,
    runtime: Option<Runtime>,
    ctx: MatchContext,
) -> Result<FlagsOutcome, StoreError> {
    let snapshot = flags.snapshot(project_id)?;
    let runtime = request.evaluation_runtime.or(runtime);
    let selected: Vec<usize> = (0..snapshot.flags.len())
        .filter(|&i| {
            let f = &snapshot.flags[i];
            f.active
                && is_selected(f, runtime, &request.evaluation_contexts)
                && request
                    .flag_keys
                    .as_ref()
                    .is_none_or(|keys| keys.contains(&f.key))
        })
        .collect();
    if selected.is_empty() || request.disable_flags {
        return Ok(FlagsOutcome {
            snapshot,
            results: Vec::new(),
            errors: false,
        });
    }
    let distinct_id = request.distinct_id.clone().unwrap_or_default();

    // Stored person properties, overlaid by the request's (the request wins).
    let person = persons.person_by_distinct_id(project_id, &distinct_id)?;
    let mut person_properties = person
        .as_ref()
        .map(|p| p.properties.clone())
        .unwrap_or_default();
    person_properties.extend(request.person_properties.clone());
    person_properties
        .entry("distinct_id")
        .or_insert_with(|| Value::String(distinct_id.clone()));

    let mut static_cohorts = HashSet::new();
    let ids = person
        .as_ref()
        .map(|p| p.distinct_ids.clone())
        .unwrap_or_else(|| vec![distinct_id.clone()]);
    for id in &ids {
        if let Some(cohorts) = snapshot.static_members.get(id) {
            static_cohorts.extend(cohorts.iter().copied());
        }
    }

    let mut groups: [Option<GroupData>; 5] = Default::default();
    for (name, index) in persons.group_types(project_id)? {
        let Some(key) = request.groups.get(&name).and_then(|v| match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }) else {
            continue;
        };
        let mut properties = persons
            .group(project_id, index, &key)?
            .map(|g| g.properties)
            .unwrap_or_default();
        if let Some(Value::Object(overrides)) = request.group_properties.get(&name) {
            properties.extend(overrides.clone());
        }
        properties.insert("$group_key".into(), Value::String(key.clone()));
        groups[usize::from(index.min(4))] = Some(GroupData { key, properties });
    }

    let subject = Subject {
        distinct_id,
        anon_distinct_id: request.anon_distinct_id.clone(),
        device_id: request.device_id.clone().or_else(|| {
            request
                .person_properties
                .get("$device_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        }),
        person_properties,
        groups,
        static_cohorts,
    };
    // Dependencies are evaluated with every active flag; only the selected ones are returned.
    let all: Vec<&FlagDefinition> = snapshot.flags.iter().collect();
    let (evaluations, errors) = evaluate_all(&all, &subject, &snapshot.cohorts, ctx);
    let wanted: HashSet<usize> = selected.into_iter().collect();
    let results = evaluations
        .into_iter()
        .enumerate()
        .filter(|(i, _)| wanted.contains(i))
        .collect();
    Ok(FlagsOutcome {
        snapshot,
        results,
        errors,
    })
}
