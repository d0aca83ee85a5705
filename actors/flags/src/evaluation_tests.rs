//! Engine tests: the published test vectors of PostHog's flag service (`rust/feature-flags`,
//! `flag_matching_utils.rs` and `flag_matching.rs` tests) and its matching rules.

use serde_json::{json, Value};

use super::evaluation::*;
use super::model::{CohortDefinition, Cohorts, FlagDefinition};
use super::properties::MatchContext;

fn flag(value: Value) -> FlagDefinition {
    serde_json::from_value(value).expect("flag parses")
}

fn ctx() -> MatchContext {
    MatchContext {
        now: "2024-06-01T00:00:00Z".parse().expect("now"),
        timezone: chrono_tz::UTC,
    }
}

fn subject(distinct_id: &str, props: Value) -> Subject<'static> {
    Subject {
        distinct_id: distinct_id.to_string().into(),
        person_properties: props.as_object().cloned().unwrap_or_default().into(),
        ..Subject::default()
    }
}

fn eval(f: &FlagDefinition, s: &Subject) -> Evaluation {
    let cohorts = Cohorts::default();
    let values = Default::default();
    evaluate_flag(
        f,
        s,
        &Environment {
            cohorts: &cohorts,
            flag_values: &values,
            ctx: ctx(),
            cohort_memo: &Default::default(),
            filters: Default::default(),
        },
    )
}

#[test]
fn simple_rollout_matches_the_python_sdk_suite() {
    let f = flag(
        json!({"id": 1, "key": "simple-flag", "filters": {"groups": [{"properties": [], "rollout_percentage": 45}]}}),
    );
    let enabled: Vec<usize> = (0..30)
        .filter(|i| eval(&f, &subject(&format!("distinct_id_{i}"), json!({}))).enabled)
        .collect();
    assert_eq!(
        enabled,
        vec![1, 2, 4, 7, 9, 11, 12, 14, 18, 19, 21, 24, 26, 27]
    );
    let total = (0..1000)
        .filter(|i| eval(&f, &subject(&format!("distinct_id_{i}"), json!({}))).enabled)
        .count();
    assert_eq!(total, 446);
}

#[test]
fn multivariate_matches_the_python_sdk_suite() {
    let f = flag(json!({"id": 2, "key": "multivariate-flag", "filters": {
        "groups": [{"properties": [], "rollout_percentage": 55}],
        "multivariate": {"variants": [
            {"key": "first", "rollout_percentage": 50}, {"key": "second", "rollout_percentage": 20},
            {"key": "third", "rollout_percentage": 20}, {"key": "fourth", "rollout_percentage": 5},
            {"key": "fifth", "rollout_percentage": 5}]}}}));
    let expected = [
        "second", "second", "first", "", "", "second", "first", "", "", "", "first", "third", "",
        "first", "second", "first", "", "", "fourth", "first",
    ];
    for (i, want) in expected.iter().enumerate() {
        let e = eval(&f, &subject(&format!("distinct_id_{i}"), json!({})));
        assert_eq!(e.variant.as_deref().unwrap_or(""), *want, "distinct_id_{i}");
        assert_eq!(e.enabled, !want.is_empty());
    }
    let total = (0..1000)
        .filter(|i| eval(&f, &subject(&format!("distinct_id_{i}"), json!({}))).enabled)
        .count();
    assert_eq!(total, 556);
}

#[test]
fn reasons_payloads_and_variant_overrides() {
    let f = flag(json!({"id": 3, "key": "beta", "version": 4, "filters": {
        "groups": [
            {"properties": [{"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person"}], "rollout_percentage": 100, "variant": "test"},
            {"properties": [], "rollout_percentage": 0}
        ],
        "multivariate": {"variants": [{"key": "control", "rollout_percentage": 50}, {"key": "test", "rollout_percentage": 50}]},
        "payloads": {"test": "{\"color\": \"blue\"}"}}}));
    let hit = eval(&f, &subject("u1", json!({"email": "a@corp.com"})));
    assert!(hit.enabled);
    assert_eq!(
        hit.variant.as_deref(),
        Some("test"),
        "condition override wins"
    );
    assert_eq!(
        hit.reason,
        Reason {
            code: ReasonCode::ConditionMatch,
            condition_index: Some(0),
            detail: None
        }
    );
    assert_eq!(hit.reason.description(), "Matched condition set 1");
    assert_eq!(hit.payload, Some(json!("{\"color\": \"blue\"}")));
    let miss = eval(&f, &subject("u1", json!({"email": "a@gmail.com"})));
    assert!(!miss.enabled);
    assert_eq!(
        miss.reason.code, "out_of_rollout_bound",
        "higher priority than the no_condition_match of condition 0"
    );
    assert_eq!(miss.reason.condition_index, Some(1));
    assert_eq!(miss.payload, None);
    let empty = flag(json!({"id": 4, "key": "empty", "filters": {"groups": []}}));
    assert_eq!(
        eval(&empty, &subject("u", json!({}))).reason.code,
        "no_group_type"
    );
    let off = flag(
        json!({"id": 5, "key": "off", "active": false, "filters": {"groups": [{"rollout_percentage": 100}]}}),
    );
    assert_eq!(
        eval(&off, &subject("u", json!({}))).reason.code,
        "flag_disabled"
    );
    // A group condition skipped for want of the group, then a person condition that does not
    // match: no match, saying the group conditions were not evaluated.
    let mixed = flag(json!({"id": 6, "key": "mixed", "filters": {"groups": [
        {"aggregation_group_type_index": 0, "properties": [], "rollout_percentage": 100},
        {"properties": [{"key": "plan", "value": "pro", "operator": "exact", "type": "person"}]}
    ]}}));
    let skipped = eval(&mixed, &subject("u", json!({"plan": "free"})));
    assert_eq!(
        (
            skipped.enabled,
            skipped.reason.code,
            skipped.reason.condition_index
        ),
        (false, ReasonCode::NoConditionMatch, Some(1))
    );
    assert_eq!(
        skipped.reason.description(),
        "No matching condition set (group conditions were not evaluated because no group type was provided)"
    );
    let plain = eval(&person_only_flag(), &subject("u", json!({"plan": "free"})));
    assert_eq!(plain.reason.description(), "No matching condition set");
}

fn person_only_flag() -> FlagDefinition {
    flag(
        json!({"id": 7, "key": "person-only", "filters": {"groups": [
            {"properties": [{"key": "plan", "value": "pro", "operator": "exact", "type": "person"}]}
        ]}}),
    )
}

#[test]
fn group_flags_hash_on_the_group_key() {
    let f = flag(
        json!({"id": 6, "key": "group-flag", "filters": {"aggregation_group_type_index": 0, "groups": [{"properties": [], "rollout_percentage": 50}]}}),
    );
    let mut s = subject("u", json!({}));
    let e = eval(&f, &s);
    assert_eq!(e.reason.code, "no_group_type");
    s.groups[0] = Some(GroupData {
        key: "acme-inc".into(),
        properties: Default::default(),
    });
    // rollout hash of acme-inc is 0.4429… (vector 5): inside 50 %.
    assert!(eval(&f, &s).enabled);
}

#[test]
fn holdouts_and_early_access() {
    let f = flag(json!({"id": 7, "key": "exp", "filters": {
        "holdout": {"id": 12, "exclusion_percentage": 50},
        "groups": [{"rollout_percentage": 100}], "payloads": {"holdout-12": "\"held\""}}}));
    // holdout hash: some_distinct_id 0.727 (out), test-identifier 0.449 (in).
    let held = eval(&f, &subject("test-identifier", json!({})));
    assert_eq!(held.variant.as_deref(), Some("holdout-12"));
    assert_eq!(held.reason.code, "holdout_condition_value");
    assert_eq!(held.reason.condition_index, None);
    assert_eq!(held.payload, Some(json!("\"held\"")));
    assert_eq!(
        eval(&f, &subject("some_distinct_id", json!({})))
            .reason
            .code,
        "condition_match"
    );

    let ea = flag(
        json!({"id": 8, "key": "beta-ui", "filters": {"feature_enrollment": true, "groups": [{"rollout_percentage": 0}]}}),
    );
    let opted = eval(
        &ea,
        &subject("u", json!({"$feature_enrollment/beta-ui": true})),
    );
    assert!(opted.enabled);
    assert_eq!(opted.reason.code, "super_condition_value");
    assert!(
        !eval(
            &ea,
            &subject("u", json!({"$feature_enrollment/beta-ui": "false"}))
        )
        .enabled
    );
    assert_eq!(
        eval(&ea, &subject("u", json!({}))).reason.code,
        "out_of_rollout_bound"
    );
}

#[test]
fn experience_continuity_hashes_the_anonymous_id() {
    let f = flag(
        json!({"id": 9, "key": "my-flag", "ensure_experience_continuity": true, "filters": {"groups": [{"rollout_percentage": 50}]}}),
    );
    // user_3 is inside 50 % for my-flag, user_0 is not (vector 6).
    let mut s = subject("user_0", json!({}));
    assert!(!eval(&f, &s).enabled);
    s.anon_distinct_id = Some("user_3".into());
    assert!(
        eval(&f, &s).enabled,
        "the anonymous id keeps the pre-login bucket"
    );
}

#[test]
fn dependencies_follow_the_value_rules_and_cycles_fail() {
    let base = flag(
        json!({"id": 10, "key": "base", "filters": {"groups": [{"rollout_percentage": 100}], "multivariate": {"variants": [{"key": "control", "rollout_percentage": 100}]}}}),
    );
    let on = flag(
        json!({"id": 11, "key": "needs-on", "filters": {"groups": [{"properties": [{"key": "10", "type": "flag", "operator": "flag_evaluates_to", "value": true}]}]}}),
    );
    let variant = flag(
        json!({"id": 12, "key": "needs-control", "filters": {"groups": [{"properties": [{"key": "10", "type": "flag", "operator": "flag_evaluates_to", "value": "Control"}]}]}}),
    );
    let missing = flag(
        json!({"id": 13, "key": "needs-ghost", "filters": {"groups": [{"properties": [{"key": "999", "type": "flag", "value": true}]}]}}),
    );
    let a = flag(
        json!({"id": 14, "key": "a", "filters": {"groups": [{"properties": [{"key": "15", "type": "flag", "value": true}]}]}}),
    );
    let b = flag(
        json!({"id": 15, "key": "b", "filters": {"groups": [{"properties": [{"key": "14", "type": "flag", "value": true}]}]}}),
    );
    let flags = [&on, &variant, &base, &missing, &a, &b];
    let (results, errors) =
        evaluate_all(&flags, &subject("u", json!({})), &Cohorts::default(), ctx());
    assert!(
        results[0].enabled,
        "true matches any variant (evaluated after its dependency)"
    );
    assert!(!results[1].enabled, "variant names are case-sensitive");
    assert!(results[2].enabled);
    assert_eq!(results[3].reason.code, "missing_dependency");
    assert_eq!(results[4].reason.code, "missing_dependency");
    assert_eq!(results[5].reason.code, "missing_dependency");
    assert!(errors, "a cycle is an error");
}

#[test]
fn cohorts_dynamic_nested_static_and_negated() {
    let cohorts: Cohorts = [
        json!({"id": 1, "filters": {"properties": {"type": "OR", "values": [
            {"type": "AND", "values": [{"key": "plan", "value": "pro", "type": "person"}, {"key": "country", "value": "FR", "type": "person", "negation": true}]}]}}}),
        json!({"id": 2, "filters": {"properties": {"type": "AND", "values": [{"type": "AND", "values": [{"key": "id", "value": 1, "type": "cohort"}]}]}}}),
        json!({"id": 3, "is_static": true}),
        json!({"id": 4, "filters": {"properties": {"type": "AND", "values": [{"type": "AND", "values": [{"key": "id", "value": 5, "type": "cohort"}]}]}}}),
        json!({"id": 5, "filters": {"properties": {"type": "AND", "values": [{"type": "AND", "values": [{"key": "id", "value": 4, "type": "cohort"}]}]}}}),
    ]
    .into_iter()
    .map(|c| {
        let c: CohortDefinition = serde_json::from_value(c).expect("cohort");
        (c.id, c)
    })
    .collect();
    let values = Default::default();
    // Memberships are memoized per subject (one request), so each check gets a fresh memo.
    let memo = CohortMemo::default();
    let forget = |memo: &CohortMemo| {
        memo.borrow_mut().clear();
    };
    let env = Environment {
        cohorts: &cohorts,
        flag_values: &values,
        ctx: ctx(),
        cohort_memo: &memo,
        filters: Default::default(),
    };
    let pro_de = subject("u", json!({"plan": "pro", "country": "DE"}));
    let pro_fr = subject("u", json!({"plan": "pro", "country": "FR"}));
    forget(&memo);
    assert!(in_cohort(1, &pro_de, &env, &mut Vec::new()));
    forget(&memo);
    assert!(!in_cohort(1, &pro_fr, &env, &mut Vec::new()), "negation");
    forget(&memo);
    assert!(
        in_cohort(2, &pro_de, &env, &mut Vec::new()),
        "nested cohort"
    );
    forget(&memo);
    assert!(!in_cohort(3, &pro_de, &env, &mut Vec::new()));
    let mut listed = pro_de.clone();
    listed.static_cohorts.insert(3);
    forget(&memo);
    assert!(
        in_cohort(3, &listed, &env, &mut Vec::new()),
        "static membership"
    );
    forget(&memo);
    assert!(
        !in_cohort(4, &pro_de, &env, &mut Vec::new()),
        "a cycle is a non-member, not a hang"
    );
    let f = flag(
        json!({"id": 20, "key": "cohort-flag", "filters": {"groups": [{"properties": [{"key": "id", "value": 2, "type": "cohort", "operator": "in"}]}]}}),
    );
    forget(&memo);
    assert!(evaluate_flag(&f, &pro_de, &env).enabled);
    forget(&memo);
    assert!(!evaluate_flag(&f, &pro_fr, &env).enabled);
}

#[test]
fn person_properties_read_the_request_over_the_stored_person() {
    let object = |v: Value| v.as_object().cloned().expect("object");
    let request = object(json!({"plan": "pro", "gone": null}));
    let stored = object(json!({"plan": "free", "country": "US", "gone": "x"}));
    let props = PersonProperties::layered(&request, Some(&stored), "user-1");
    assert_eq!(props.get("plan"), Some(&json!("pro")));
    assert_eq!(props.get("country"), Some(&json!("US")));
    assert_eq!(
        props.get("gone"),
        Some(&Value::Null),
        "a sent null hides the stored value"
    );
    assert_eq!(props.get("distinct_id"), Some(&json!("user-1")));
    assert_eq!(props.get("absent"), None);
    let sent = object(json!({"distinct_id": "sent"}));
    let props = PersonProperties::layered(&sent, None, "user-1");
    assert_eq!(props.get("distinct_id"), Some(&json!("sent")));
    // A flag on a stored property matches through the layers.
    let f = flag(json!({"id": 1, "key": "us", "filters": {"groups": [
        {"properties": [{"key": "country", "value": ["US"], "operator": "exact", "type": "person"}],
         "rollout_percentage": 100}]}}));
    let layered = Subject {
        distinct_id: "user-1".into(),
        person_properties: PersonProperties::layered(&request, Some(&stored), "user-1"),
        ..Subject::default()
    };
    assert!(eval(&f, &layered).enabled);
    assert!(!eval(&f, &subject("user-1", json!({"plan": "pro"}))).enabled);
}

#[test]
fn group_properties_read_the_group_key_then_the_request_then_the_stored_group() {
    let object = |v: Value| v.as_object().cloned().expect("object");
    let sent = object(json!({"size": 5, "$group_key": "sent"}));
    let stored = object(json!({"size": 250, "industry": "retail"}));
    let props = GroupProperties::layered("acme", Some(&sent), Some(&stored));
    assert_eq!(
        props.get("$group_key"),
        Some(&json!("acme")),
        "the key wins"
    );
    assert_eq!(
        props.get("size"),
        Some(&json!(5)),
        "the request over the stored group"
    );
    assert_eq!(props.get("industry"), Some(&json!("retail")));
    assert_eq!(props.get("absent"), None);
    let alone = GroupProperties::layered("acme", None, None);
    assert_eq!(alone.get("$group_key"), Some(&json!("acme")));
    assert_eq!(alone.get("size"), None);
    let f = flag(
        json!({"id": 7, "key": "big", "filters": {"aggregation_group_type_index": 0,
        "groups": [{"properties": [{"key": "size", "value": 100, "operator": "gte",
        "type": "group", "group_type_index": 0}], "rollout_percentage": 100}]}}),
    );
    let mut s = subject("u", json!({}));
    s.groups[0] = Some(GroupData {
        key: "acme".into(),
        properties: GroupProperties::layered("acme", None, Some(&stored)),
    });
    assert!(eval(&f, &s).enabled, "size 250 is stored");
    s.groups[0] = Some(GroupData {
        key: "acme".into(),
        properties: props,
    });
    assert!(!eval(&f, &s).enabled, "the request says 5");
}

#[test]
fn flags_repeating_a_filter_match_as_each_would_alone() {
    let person = |key: &str, operator: &str, value: Value| json!({"key": key, "value": value, "operator": operator, "type": "person"});
    let condition = |filters: Vec<Value>| json!({"properties": filters, "rollout_percentage": 100});
    let us = person("country", "exact", json!(["US"]));
    let de = person("country", "exact", json!(["DE"]));
    let corp = person("email", "icontains", json!("@corp.com"));
    let defs = [
        vec![condition(vec![us.clone()])],
        // The same filter in a later condition, after one that differs in its value only.
        vec![condition(vec![de.clone()]), condition(vec![us.clone()])],
        // Same key and value, another operator; then the filter again, beside a cohort filter.
        vec![condition(vec![person("country", "is_not", json!(["US"]))])],
        vec![condition(vec![
            json!({"key": "id", "value": 7, "type": "cohort"}),
            corp.clone(),
            us.clone(),
        ])],
        vec![condition(vec![corp.clone(), de.clone()])],
        vec![condition(vec![person(
            "email",
            "icontains",
            json!("@CORP.com"),
        )])],
        vec![condition(vec![
            corp.clone(),
            person("email", "is_set", json!("is_set")),
        ])],
        // Person filters shared with other flags, around cohort filters (one negated).
        vec![
            condition(vec![
                json!({"key": "id", "value": 8, "type": "cohort", "operator": "not_in"}),
                us.clone(),
            ]),
            condition(vec![
                corp,
                json!({"key": "id", "value": 8, "type": "cohort"}),
            ]),
        ],
    ];
    // Cohort 7: persons on the pro plan; cohort 8: persons at corp.com.
    let cohorts: Cohorts = [
        json!({"id": 7, "filters": {"properties": {"type": "AND", "values": [person("plan", "exact", json!("pro"))]}}}),
        json!({"id": 8, "filters": {"properties": {"type": "OR", "values": [person("email", "icontains", json!("corp.com"))]}}}),
    ]
    .into_iter()
    .map(|c| {
        let c: CohortDefinition = serde_json::from_value(c).expect("cohort");
        (c.id, c)
    })
    .collect();
    let flags: Vec<FlagDefinition> = defs
        .into_iter()
        .enumerate()
        .map(|(i, groups)| {
            flag(json!({"id": i + 1, "key": format!("f{i}"), "filters": {"groups": groups}}))
        })
        .collect();
    let refs: Vec<&FlagDefinition> = flags.iter().collect();
    for props in [
        json!({"country": "US", "email": "a@corp.com"}),
        json!({"country": "US", "email": "a@corp.com", "plan": "pro"}),
        json!({"country": "DE", "email": "b@corp.com"}),
        json!({"country": "US", "email": "c@shop.io"}),
        json!({"country": "FR"}),
    ] {
        let s = subject("u", props.clone());
        let (shared, _) = evaluate_all(&refs, &s, &cohorts, ctx());
        let values = Default::default();
        let alone: Vec<Evaluation> = flags
            .iter()
            .map(|f| {
                let env = Environment {
                    cohorts: &cohorts,
                    flag_values: &values,
                    ctx: ctx(),
                    cohort_memo: &Default::default(),
                    filters: Default::default(),
                };
                evaluate_flag(f, &s, &env)
            })
            .collect();
        assert_eq!(shared, alone, "{props}");
        // The cohort flags decide as their conditions say.
        let us = props["country"] == "US";
        let corp = props["email"]
            .as_str()
            .is_some_and(|e| e.contains("corp.com"));
        let pro = props["plan"] == "pro";
        assert_eq!(shared[3].enabled, pro && corp && us, "{props}");
        // Flag 7: US and not at corp (condition 0), or at corp (condition 1).
        assert_eq!(shared[7].enabled, us || corp, "{props}");
    }
}
