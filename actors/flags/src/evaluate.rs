//! Evaluating a `/flags` request for a project, in two steps: [`load_stored`] reads the
//! stored person, groups and group types (sled: blocking, run under a deadline), then
//! [`evaluate`] overlays the request's properties and evaluates every selected flag. When the
//! stored data could not be read in time, flags that need it come back `failed` and the others
//! are still evaluated.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use super::evaluation::{
    evaluate_slots, Evaluation, GroupData, GroupProperties, PersonProperties, Reason, ReasonCode,
    Subject,
};
use super::model::{CohortIds, FlagDefinition};
use super::properties::MatchContext;
use super::request::{contexts_allow, runtime_allows, FlagRequest, Runtime};
use super::store::ProjectFlags;
use corvid_kernel::StoreError;
use corvid_persons::{Group, Person, PersonStore};

/// The evaluated flags of one request.
pub struct FlagsOutcome {
    pub snapshot: Arc<ProjectFlags>,
    /// One slot per flag of `snapshot.flags` (same index); `None`: not asked for.
    pub results: Vec<Option<Evaluation>>,
    pub errors: bool,
}

impl FlagsOutcome {
    pub fn flag(&self, index: usize) -> &FlagDefinition {
        &self.snapshot.flags[index]
    }

    /// The returned results as (index into `snapshot.flags`, result), in flag id order.
    pub fn returned(&self) -> impl Iterator<Item = (usize, &Evaluation)> {
        self.results
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i, e)))
    }

    /// Whether the request is billed: it evaluated a flag other than a survey's.
    pub fn billable(&self) -> bool {
        self.returned()
            .any(|(i, _)| !self.flag(i).key.starts_with(super::SURVEY_FLAG_PREFIX))
    }

    /// Whether no flag was evaluated for the caller.
    pub fn is_empty(&self) -> bool {
        self.results.iter().all(Option::is_none)
    }
}

/// What evaluation reads from the person store for one request.
#[derive(Debug, Clone, Default)]
pub struct StoredData {
    pub person: Option<Arc<Person>>,
    pub groups: StoredGroups,
}

/// `(type name, index, stored group)` for each group type named in the request.
pub type StoredGroups = Vec<(String, u8, Option<Arc<Group>>)>;

/// What evaluation gets when the request covers everything the flags read: no stored person,
/// and the request's groups of known types (`(name, index)`) with no stored properties.
pub fn request_only(request: &FlagRequest, group_types: Option<&[(String, u8)]>) -> StoredData {
    let groups = group_types
        .unwrap_or_default()
        .iter()
        .filter(|(name, _)| request.groups.get(name).and_then(group_key).is_some())
        .map(|(name, index)| (name.clone(), *index, None))
        .collect();
    StoredData {
        person: None,
        groups,
    }
}

/// The request's stored groups from memory alone, or `None` when any is not cached (then
/// call [`load_stored`] off the event loop).
pub fn cached_groups(
    persons: &PersonStore,
    project_id: u64,
    request: &FlagRequest,
) -> Option<StoredGroups> {
    let mut groups = Vec::new();
    if !request.groups.is_empty() {
        for (name, index) in persons.cached_group_types(project_id)?.iter() {
            if let Some(key) = request.groups.get(name).and_then(group_key) {
                let group = persons.cached_group(project_id, *index, &key)?;
                groups.push((name.clone(), *index, group));
            }
        }
    }
    Some(groups)
}

/// Reads (and caches) the stored person and the request's groups. Blocking: call off the event
/// loop.
pub fn load_stored(
    persons: &PersonStore,
    project_id: u64,
    request: &FlagRequest,
) -> Result<StoredData, StoreError> {
    let distinct_id = request.distinct_id.clone().unwrap_or_default();
    let person = persons.load_person(project_id, &distinct_id)?;
    let mut groups = Vec::new();
    if !request.groups.is_empty() {
        for (name, index) in persons.load_group_types(project_id)?.iter() {
            if let Some(key) = request.groups.get(name).and_then(group_key) {
                groups.push((
                    name.clone(),
                    *index,
                    persons.load_group(project_id, *index, &key)?,
                ));
            }
        }
    }
    Ok(StoredData { person, groups })
}

fn group_key(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The flags a request asks for, after the runtime, context and key filters, as indexes into
/// `snapshot.flags` in ascending order.
pub fn selected_flags(
    snapshot: &ProjectFlags,
    request: &FlagRequest,
    runtime: Option<Runtime>,
) -> Vec<usize> {
    let runtime = request.evaluation_runtime.or(runtime);
    // Room for every flag: nearly every request selects all of them, and growing the list
    // flag by flag copied it several times per request at hundreds of flags.
    let mut selected = Vec::with_capacity(snapshot.flags.len());
    // The definitions are read only for what the dense per-flag selection does not hold.
    selected.extend((0..snapshot.flags.len()).filter(|&i| {
        let Some(s) = snapshot.selection.get(i) else {
            return false;
        };
        s.active
            && (!request.only_survey_flags || s.survey)
            && runtime_allows(runtime, s.runtime)
            && (!s.has_contexts || contexts_allow(&snapshot.flags[i], &request.evaluation_contexts))
            && request
                .flag_keys
                .as_ref()
                .is_none_or(|keys| keys.contains(&snapshot.flags[i].key))
    }));
    selected
}

/// Whether a flag reads anything the request did not supply (stored person or group
/// properties, cohorts, groups).
fn needs_stored(flag: &FlagDefinition, request: &FlagRequest) -> bool {
    if flag.filters.aggregation_group_type_index.is_some() {
        return true;
    }
    flag.filters
        .groups
        .iter()
        .chain(&flag.filters.super_groups)
        .any(|c| {
            c.aggregation_group_type_index.flatten().is_some()
                || c.properties.iter().any(|p| match p.kind.as_deref() {
                    Some("flag") => false,
                    Some("cohort") | Some("group") => true,
                    _ => !request.person_properties.contains_key(&p.key),
                })
        })
}

/// Evaluates the selected flags. `stored` is `None` when the stored data could not be read.
pub fn evaluate(
    snapshot: Arc<ProjectFlags>,
    selected: &[usize],
    stored: Option<&StoredData>,
    request: &FlagRequest,
    ctx: MatchContext,
) -> FlagsOutcome {
    if selected.is_empty() || request.disable_flags {
        return FlagsOutcome {
            snapshot,
            results: Vec::new(),
            errors: false,
        };
    }
    let distinct_id = request.distinct_id.as_deref().unwrap_or_default();
    let person = stored.and_then(|s| s.person.as_deref());
    let person_properties = PersonProperties::layered(
        &request.person_properties,
        person.map(|p| &p.properties),
        distinct_id,
    );

    let mut static_cohorts = CohortIds::default();
    let mut add_static = |id: &str| {
        if let Some(cohorts) = snapshot.static_members.get(id) {
            static_cohorts.extend(cohorts.iter().copied());
        }
    };
    match person {
        Some(person) => person.distinct_ids.iter().for_each(|id| add_static(id)),
        None => add_static(distinct_id),
    }
    let mut groups: [Option<GroupData>; 5] = Default::default();
    for (name, index, group) in stored.map(|s| s.groups.as_slice()).unwrap_or_default() {
        let Some(key) = request.groups.get(name).and_then(group_key) else {
            continue;
        };
        let overrides = match request.group_properties.get(name) {
            Some(Value::Object(overrides)) => Some(overrides),
            _ => None,
        };
        let properties =
            GroupProperties::layered(&key, overrides, group.as_ref().map(|g| &g.properties));
        groups[usize::from((*index).min(4))] = Some(GroupData { key, properties });
    }
    let subject = Subject {
        distinct_id: Cow::Borrowed(distinct_id),
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
    let (mut results, mut errors) = evaluate_slots(
        &snapshot.flags,
        &snapshot.plan,
        &subject,
        &snapshot.cohorts,
        ctx,
    );
    // `selected` is in ascending order (see `selected_flags`): walked beside the slots, it
    // says which to keep without a table of its own.
    let mut wanted = selected.iter().copied().peekable();
    for (i, slot) in results.iter_mut().enumerate() {
        while wanted.next_if(|&w| w < i).is_some() {}
        if wanted.next_if_eq(&i).is_none() {
            *slot = None;
        } else if stored.is_none() && needs_stored(&snapshot.flags[i], request) {
            errors = true;
            *slot = Some(failed(
                ReasonCode::Timeout,
                "Stored properties could not be read in time",
            ));
        }
    }
    FlagsOutcome {
        snapshot,
        results,
        errors,
    }
}

fn failed(code: ReasonCode, description: &'static str) -> Evaluation {
    Evaluation {
        enabled: false,
        variant: None,
        reason: Reason {
            code,
            condition_index: None,
            detail: Some(description),
        },
        payload: None,
        failed: true,
    }
}
