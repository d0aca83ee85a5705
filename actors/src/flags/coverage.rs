//! When a `/flags` request can be answered without the stored person: PostHog skips the
//! person read when the request's own `person_properties` hold every property the flags look
//! at. Computed once per snapshot; checked per request.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

use super::model::{CohortDefinition, CohortNode, FlagDefinition};
use super::properties::PropertyFilter;

/// The person property keys a project's flags read (their conditions, super groups, early-access
/// enrollment and the dynamic cohorts they name, nested cohorts included), or `None` when the stored person is
/// needed whatever the request sends: a flag that keeps experience continuity (the person's
/// distinct ids), or static cohorts (membership by any of the person's distinct ids).
pub(crate) fn person_keys(
    flags: &[FlagDefinition],
    cohorts: &HashMap<i64, CohortDefinition>,
    static_members: &HashMap<String, Vec<i64>>,
) -> Option<Vec<String>> {
    if !static_members.is_empty() || flags.iter().any(|f| f.ensure_experience_continuity) {
        return None;
    }
    let mut keys = BTreeSet::new();
    let mut seen_cohorts = BTreeSet::new();
    for flag in flags {
        // An early-access flag is decided first by the person's enrollment property.
        if flag.filters.feature_enrollment == Some(true) {
            keys.insert(format!("$feature_enrollment/{}", flag.key));
        }
        for condition in flag.filters.groups.iter().chain(&flag.filters.super_groups) {
            for filter in &condition.properties {
                collect(filter, cohorts, &mut keys, &mut seen_cohorts)?;
            }
        }
    }
    Some(keys.into_iter().collect())
}

fn collect(
    filter: &PropertyFilter,
    cohorts: &HashMap<i64, CohortDefinition>,
    keys: &mut BTreeSet<String>,
    seen: &mut BTreeSet<i64>,
) -> Option<()> {
    match filter.kind.as_deref() {
        // Flag dependencies and group properties are not person properties.
        Some("flag") | Some("group") => Some(()),
        Some("cohort") => {
            let id = match &filter.value {
                Value::Number(n) => n.as_i64()?,
                Value::String(s) => s.parse().ok()?,
                _ => return None,
            };
            if !seen.insert(id) {
                return Some(());
            }
            let cohort = cohorts.get(&id)?;
            if cohort.is_static {
                return None;
            }
            let Some(tree) = &cohort.filters else {
                return Some(());
            };
            walk(&tree.properties.values, cohorts, keys, seen)
        }
        _ => {
            keys.insert(filter.key.clone());
            Some(())
        }
    }
}

fn walk(
    nodes: &[CohortNode],
    cohorts: &HashMap<i64, CohortDefinition>,
    keys: &mut BTreeSet<String>,
    seen: &mut BTreeSet<i64>,
) -> Option<()> {
    for node in nodes {
        match node {
            CohortNode::Group(group) => walk(&group.values, cohorts, keys, seen)?,
            CohortNode::Filter(filter) => collect(filter, cohorts, keys, seen)?,
        }
    }
    Some(())
}

/// Whether the request alone decides every flag: no groups named, and each key in `keys`
/// present in its person properties.
pub(crate) fn covered(
    keys: Option<&[String]>,
    person_properties: &Map<String, Value>,
    groups: &Map<String, Value>,
) -> bool {
    groups.is_empty()
        && keys.is_some_and(|keys| keys.iter().all(|k| person_properties.contains_key(k)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn flag(body: Value) -> FlagDefinition {
        serde_json::from_value(body).expect("flag")
    }

    fn cohort(body: Value) -> (i64, CohortDefinition) {
        let c: CohortDefinition = serde_json::from_value(body).expect("cohort");
        (c.id, c)
    }

    #[test]
    fn keys_come_from_conditions_super_groups_and_nested_cohorts() {
        let cohorts: HashMap<i64, CohortDefinition> = [
            cohort(
                json!({"id": 1, "filters": {"properties": {"type": "OR", "values": [
                {"type": "AND", "values": [{"key": "plan", "value": "pro", "type": "person"},
                                            {"key": "id", "value": 2, "type": "cohort"}]}]}}}),
            ),
            cohort(
                json!({"id": 2, "filters": {"properties": {"type": "AND", "values": [
                {"key": "country", "value": "US", "type": "person"}]}}}),
            ),
        ]
        .into();
        let flags = vec![
            flag(
                json!({"id": 1, "key": "a", "filters": {"groups": [{"properties": [
                {"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person"},
                {"key": "b", "value": true, "type": "flag"}]}]}}),
            ),
            flag(json!({"id": 2, "key": "b", "filters": {
                "feature_enrollment": true,
                "groups": [{"properties": [{"key": "id", "value": 1, "type": "cohort"}]}],
                "super_groups": [{"properties": [{"key": "$feature_enrollment/b", "value": ["true"], "type": "person"}]}]}})),
        ];
        let keys = person_keys(&flags, &cohorts, &HashMap::new()).expect("coverable");
        assert_eq!(
            keys,
            vec!["$feature_enrollment/b", "country", "email", "plan"]
        );
        let props = |v: Value| v.as_object().cloned().unwrap_or_default();
        let all = props(
            json!({"email": "a@b", "plan": "pro", "country": "US", "$feature_enrollment/b": true}),
        );
        assert!(covered(Some(&keys), &all, &Map::new()));
        let partial = props(json!({"email": "a@b", "plan": "pro"}));
        assert!(
            !covered(Some(&keys), &partial, &Map::new()),
            "a missing key needs the stored person"
        );
        let groups = props(json!({"company": "acme"}));
        assert!(
            !covered(Some(&keys), &all, &groups),
            "groups are read from storage"
        );
    }

    #[test]
    fn continuity_and_static_cohorts_always_need_the_stored_person() {
        let continuity = vec![flag(
            json!({"id": 1, "key": "a", "ensure_experience_continuity": true,
            "filters": {"groups": [{"rollout_percentage": 50}]}}),
        )];
        assert_eq!(
            person_keys(&continuity, &HashMap::new(), &HashMap::new()),
            None
        );
        let plain = vec![flag(
            json!({"id": 1, "key": "a", "filters": {"groups": [{"rollout_percentage": 50}]}}),
        )];
        let members: HashMap<String, Vec<i64>> = [("u1".to_string(), vec![3])].into();
        assert_eq!(person_keys(&plain, &HashMap::new(), &members), None);
        assert_eq!(
            person_keys(&plain, &HashMap::new(), &HashMap::new()),
            Some(Vec::new())
        );
        let missing_cohort = vec![flag(json!({"id": 1, "key": "a", "filters": {"groups": [
            {"properties": [{"key": "id", "value": 9, "type": "cohort"}]}]}}))];
        assert_eq!(
            person_keys(&missing_cohort, &HashMap::new(), &HashMap::new()),
            None
        );
    }
}
