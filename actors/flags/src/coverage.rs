//! When a `/flags` request can be answered without the stored person and groups: PostHog skips
//! the stored read when the request's own `person_properties` (and `group_properties`) hold
//! every property the flags look at. Computed once per snapshot; checked per request.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde_json::Value;

use super::model::{CohortNode, Cohorts, FlagDefinition, StaticMembers};
use super::properties::PropertyFilter;
use super::request::FlagRequest;

/// The property keys a project's flags read from stored data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadKeys {
    /// Person property keys.
    pub person: Vec<String>,
    /// Group property keys by group type index.
    pub group: BTreeMap<u8, Vec<String>>,
}

/// The keys a project's flags read (their conditions, super groups, early-access enrollment
/// and the dynamic cohorts they name, nested cohorts included), or `None` when the stored
/// person is needed whatever the request sends: a flag that keeps experience continuity (the
/// person's distinct ids), static cohorts (membership by any of the person's distinct ids), or
/// a group filter that names no group type.
pub(crate) fn read_keys(
    flags: &[FlagDefinition],
    cohorts: &Cohorts,
    static_members: &StaticMembers,
) -> Option<ReadKeys> {
    if !static_members.is_empty() || flags.iter().any(|f| f.ensure_experience_continuity) {
        return None;
    }
    let (keys, coverable) = gather(flags, cohorts);
    coverable.then(|| ReadKeys {
        person: keys.person.into_iter().collect(),
        group: keys
            .group
            .into_iter()
            .map(|(index, keys)| (index, keys.into_iter().collect()))
            .collect(),
    })
}

/// Every person property key a project's flags may read, whether or not a request can cover
/// them: a stored person is decoded with these properties only (see [`PersonKeys`]).
pub(crate) fn person_keys(flags: &[FlagDefinition], cohorts: &Cohorts) -> PersonKeys {
    PersonKeys(gather(flags, cohorts).0.person.into_iter().collect())
}

/// The person property keys a project's flags read. A stored person's other properties are
/// left undecoded when it is read for `/flags`: persons carry dozens of properties apps set
/// (`$initial_…`, `$geoip_…`), and a flag set reads a handful.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PersonKeys(HashSet<String, ahash::RandomState>);

impl PersonKeys {
    pub fn contains(&self, key: &str) -> bool {
        self.0.contains(key)
    }
}

/// The keys every flag reads, and whether a request could cover them all (`false`: a group
/// filter without its type, a static, missing or unreadable cohort).
fn gather(flags: &[FlagDefinition], cohorts: &Cohorts) -> (Keys, bool) {
    let mut keys = Keys::default();
    let mut seen_cohorts = BTreeSet::new();
    let mut coverable = true;
    for flag in flags {
        // An early-access flag is decided first by the person's enrollment property.
        if flag.filters.feature_enrollment == Some(true) {
            keys.person
                .insert(format!("$feature_enrollment/{}", flag.key));
        }
        for condition in flag.filters.groups.iter().chain(&flag.filters.super_groups) {
            for filter in &condition.properties {
                coverable &= collect(filter, cohorts, &mut keys, &mut seen_cohorts);
            }
        }
    }
    (keys, coverable)
}

#[derive(Default)]
struct Keys {
    person: BTreeSet<String>,
    group: BTreeMap<u8, BTreeSet<String>>,
}

/// Adds the keys `filter` reads; `false` when a request could not cover them.
fn collect(
    filter: &PropertyFilter,
    cohorts: &Cohorts,
    keys: &mut Keys,
    seen: &mut BTreeSet<i64>,
) -> bool {
    match filter.kind.as_deref() {
        // Flag dependencies are evaluated, not read.
        Some("flag") => true,
        Some("group") => {
            let Some(index) = filter.group_type_index.and_then(|i| u8::try_from(i).ok()) else {
                return false;
            };
            keys.group
                .entry(index)
                .or_default()
                .insert(filter.key.clone());
            true
        }
        Some("cohort") => {
            let id = match &filter.value {
                Value::Number(n) => n.as_i64(),
                Value::String(s) => s.parse().ok(),
                _ => None,
            };
            let Some(id) = id else {
                return false;
            };
            if !seen.insert(id) {
                return true;
            }
            match cohorts.get(&id) {
                None => false,
                Some(cohort) if cohort.is_static => false,
                Some(cohort) => match &cohort.filters {
                    None => true,
                    Some(tree) => walk(&tree.properties.values, cohorts, keys, seen),
                },
            }
        }
        _ => {
            keys.person.insert(filter.key.clone());
            true
        }
    }
}

fn walk(
    nodes: &[CohortNode],
    cohorts: &Cohorts,
    keys: &mut Keys,
    seen: &mut BTreeSet<i64>,
) -> bool {
    let mut coverable = true;
    for node in nodes {
        coverable &= match node {
            CohortNode::Group(group) => walk(&group.values, cohorts, keys, seen),
            CohortNode::Filter(filter) => collect(filter, cohorts, keys, seen),
        };
    }
    coverable
}

/// Whether the request alone decides every flag: each person key in its person properties and,
/// for each group it names of a known type (`group_types`: `(name, index)`; `None` when not at
/// hand), each group key of that type in its group properties.
pub(crate) fn covered(
    keys: Option<&ReadKeys>,
    request: &FlagRequest,
    group_types: Option<&[(String, u8)]>,
) -> bool {
    let Some(keys) = keys else {
        return false;
    };
    if !keys
        .person
        .iter()
        .all(|k| request.person_properties.contains_key(k))
    {
        return false;
    }
    if request.groups.is_empty() {
        return true;
    }
    let Some(types) = group_types else {
        return false;
    };
    types.iter().all(|(name, index)| {
        let needed = keys.group.get(index).map(Vec::as_slice).unwrap_or_default();
        if needed.is_empty() || !request.groups.contains_key(name) {
            return true;
        }
        matches!(request.group_properties.get(name),
            Some(Value::Object(props)) if needed.iter().all(|k| props.contains_key(k)))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map};

    use super::super::model::CohortDefinition;
    use super::*;

    fn flag(body: Value) -> FlagDefinition {
        serde_json::from_value(body).expect("flag")
    }

    fn cohort(body: Value) -> (i64, CohortDefinition) {
        let c: CohortDefinition = serde_json::from_value(body).expect("cohort");
        (c.id, c)
    }

    fn object(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn request(person: Value, groups: Value, group_properties: Value) -> FlagRequest {
        FlagRequest {
            person_properties: object(person),
            groups: object(groups),
            group_properties: object(group_properties),
            ..FlagRequest::default()
        }
    }

    #[test]
    fn keys_come_from_conditions_super_groups_and_nested_cohorts() {
        let cohorts: Cohorts = [
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
        .into_iter()
        .collect();
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
        let keys = read_keys(&flags, &cohorts, &StaticMembers::default()).expect("coverable");
        assert_eq!(
            keys.person,
            vec!["$feature_enrollment/b", "country", "email", "plan"]
        );
        assert!(keys.group.is_empty());
        let all =
            json!({"email": "a@b", "plan": "pro", "country": "US", "$feature_enrollment/b": true});
        assert!(covered(
            Some(&keys),
            &request(all.clone(), json!({}), json!({})),
            None
        ));
        let partial = json!({"email": "a@b", "plan": "pro"});
        assert!(
            !covered(Some(&keys), &request(partial, json!({}), json!({})), None),
            "a missing key needs the stored person"
        );
        assert!(
            !covered(
                Some(&keys),
                &request(all.clone(), json!({"company": "acme"}), json!({})),
                None
            ),
            "groups of types not at hand are read from storage"
        );
        let types = [("company".to_string(), 0u8)];
        assert!(
            covered(
                Some(&keys),
                &request(all, json!({"company": "acme"}), json!({})),
                Some(&types)
            ),
            "no flag reads company properties"
        );
    }

    #[test]
    fn group_properties_in_the_request_cover_the_group_keys_of_their_type() {
        let flags = vec![
            flag(
                json!({"id": 1, "key": "big", "filters": {"aggregation_group_type_index": 0, "groups": [
                {"properties": [{"key": "size", "value": 100, "operator": "gte", "type": "group", "group_type_index": 0}]}]}}),
            ),
            flag(
                json!({"id": 2, "key": "project", "filters": {"aggregation_group_type_index": 1, "groups": [
                {"properties": [{"key": "tier", "value": "gold", "type": "group", "group_type_index": 1}]}]}}),
            ),
            flag(json!({"id": 3, "key": "pro", "filters": {"groups": [
                {"properties": [{"key": "plan", "value": "pro", "type": "person"}]}]}})),
        ];
        let keys =
            read_keys(&flags, &Cohorts::default(), &StaticMembers::default()).expect("coverable");
        assert_eq!(keys.person, vec!["plan"]);
        assert_eq!(
            keys.group,
            BTreeMap::from([(0, vec!["size".to_string()]), (1, vec!["tier".to_string()])])
        );
        let types = [("company".to_string(), 0u8), ("project".to_string(), 1u8)];
        let covers = |groups: Value, group_properties: Value| {
            covered(
                Some(&keys),
                &request(json!({"plan": "free"}), groups, group_properties),
                Some(&types),
            )
        };
        assert!(covers(
            json!({"company": "acme"}),
            json!({"company": {"size": 5}})
        ));
        assert!(covers(
            json!({"company": "acme", "project": "p1"}),
            json!({"company": {"size": 5}, "project": {"tier": "gold"}})
        ));
        assert!(
            !covers(
                json!({"company": "acme"}),
                json!({"company": {"name": "Acme"}})
            ),
            "size is read from the stored company"
        );
        assert!(
            !covers(
                json!({"company": "acme", "project": "p1"}),
                json!({"company": {"size": 5}})
            ),
            "the project's tier is read from storage"
        );
        assert!(
            covers(json!({"team": "t1"}), json!({})),
            "a group of an unknown type is not evaluated"
        );

        let unindexed = vec![flag(json!({"id": 1, "key": "g", "filters": {"groups": [
            {"properties": [{"key": "size", "value": 1, "type": "group"}]}]}}))];
        assert_eq!(
            read_keys(&unindexed, &Cohorts::default(), &StaticMembers::default()),
            None,
            "a group filter without its type cannot be covered"
        );
    }

    #[test]
    fn person_keys_are_every_key_read_even_where_no_request_covers_them() {
        let cohorts: Cohorts = [
            cohort(
                json!({"id": 1, "filters": {"properties": {"type": "AND", "values": [
                {"key": "plan", "value": "pro", "type": "person"},
                {"key": "id", "value": 2, "type": "cohort"},
                {"key": "id", "value": 9, "type": "cohort"}]}}}),
            ),
            cohort(json!({"id": 2, "is_static": true})),
        ]
        .into_iter()
        .collect();
        let flags = vec![
            flag(
                json!({"id": 1, "key": "a", "ensure_experience_continuity": true,
                "filters": {"groups": [{"properties": [
                {"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person"},
                {"key": "size", "value": 1, "type": "group"},
                {"key": "id", "value": 1, "type": "cohort"}]}]}}),
            ),
            flag(json!({"id": 2, "key": "b", "filters": {
                "feature_enrollment": true,
                "super_groups": [{"properties": [{"key": "$feature_enrollment/b", "value": ["true"], "type": "person"}]}],
                "groups": [{"properties": [{"key": "distinct_id", "value": "u1", "type": "person"},
                                           {"key": "a", "value": true, "type": "flag"}]}]}})),
        ];
        assert_eq!(
            read_keys(&flags, &cohorts, &StaticMembers::default()),
            None,
            "continuity, a static and a missing cohort, an unindexed group filter"
        );
        let keys = person_keys(&flags, &cohorts);
        for key in ["email", "plan", "$feature_enrollment/b", "distinct_id"] {
            assert!(keys.contains(key), "{key}");
        }
        for key in ["size", "a", "id", "country"] {
            assert!(!keys.contains(key), "{key}");
        }
    }

    #[test]
    fn continuity_and_static_cohorts_always_need_the_stored_person() {
        let continuity = vec![flag(
            json!({"id": 1, "key": "a", "ensure_experience_continuity": true,
            "filters": {"groups": [{"rollout_percentage": 50}]}}),
        )];
        assert_eq!(
            read_keys(&continuity, &Cohorts::default(), &StaticMembers::default()),
            None
        );
        let plain = vec![flag(
            json!({"id": 1, "key": "a", "filters": {"groups": [{"rollout_percentage": 50}]}}),
        )];
        let members: StaticMembers = [("u1".to_string(), vec![3])].into_iter().collect();
        assert_eq!(read_keys(&plain, &Cohorts::default(), &members), None);
        assert_eq!(
            read_keys(&plain, &Cohorts::default(), &StaticMembers::default()),
            Some(ReadKeys::default())
        );
        let missing_cohort = vec![flag(json!({"id": 1, "key": "a", "filters": {"groups": [
            {"properties": [{"key": "id", "value": 9, "type": "cohort"}]}]}}))];
        assert_eq!(
            read_keys(
                &missing_cohort,
                &Cohorts::default(),
                &StaticMembers::default()
            ),
            None
        );
    }
}
