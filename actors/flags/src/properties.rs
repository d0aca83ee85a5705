//! Property matching for flag conditions, with the server's semantics
//! (`PostHog/posthog:rust/feature-flags/src/properties/property_matching.rs`): non-partial mode, where a missing property is decided by
//! the operator and any matcher error means "no match".

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use super::matcher::Compiled;
pub use super::values::MatchContext;

/// One filter of a condition, in PostHog's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PropertyFilter {
    pub key: String,
    #[serde(default)]
    pub value: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negation: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_type_index: Option<i64>,
    /// The operator and value read for matching (built on first use; never serialized).
    #[serde(skip)]
    pub compiled: Compiled,
}

/// Every operator Corvid evaluates on person and group properties.
pub const PROPERTY_OPERATORS: &[&str] = &[
    "exact",
    "is_not",
    "icontains",
    "not_icontains",
    "icontains_multi",
    "not_icontains_multi",
    "starts_with",
    "not_starts_with",
    "ends_with",
    "not_ends_with",
    "regex",
    "not_regex",
    "gt",
    "gte",
    "lt",
    "lte",
    "between",
    "not_between",
    "semver_eq",
    "semver_neq",
    "semver_gt",
    "semver_gte",
    "semver_lt",
    "semver_lte",
    "semver_tilde",
    "semver_caret",
    "semver_wildcard",
    "is_set",
    "is_not_set",
    "is_date_before",
    "is_date_after",
    "is_date_exact",
];

/// Where a filter reads its property: a plain map, or layers read in place.
pub trait Properties {
    fn property(&self, key: &str) -> Option<&Value>;
}

impl Properties for Map<String, Value> {
    fn property(&self, key: &str) -> Option<&Value> {
        self.get(key)
    }
}

/// Whether `filter` matches `properties` (server semantics).
pub fn match_property(
    filter: &PropertyFilter,
    properties: &(impl Properties + ?Sized),
    ctx: &MatchContext,
) -> bool {
    let matcher = filter
        .compiled
        .get_or_init(filter.operator.as_deref(), &filter.value);
    match properties.property(&filter.key) {
        Some(value) => matcher.matches(value, ctx),
        None => matcher.matches_missing(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> MatchContext {
        MatchContext::for_tests()
    }

    fn filter(key: &str, operator: &str, value: Value) -> PropertyFilter {
        PropertyFilter {
            key: key.into(),
            value,
            operator: Some(operator.into()),
            kind: Some("person".into()),
            negation: None,
            group_type_index: None,
            compiled: Compiled::default(),
        }
    }

    fn matches(operator: &str, expected: Value, actual: Value) -> bool {
        let props = json!({"key": actual}).as_object().cloned().expect("object");
        match_property(&filter("key", operator, expected), &props, &ctx())
    }

    #[test]
    fn exact_and_is_not_vectors() {
        for v in ["us", "Us", "US", "ca", "uk", "UK"] {
            assert!(matches("exact", json!(["US", "CA", "Uk"]), json!(v)), "{v}");
        }
        assert!(!matches("exact", json!(["US", "CA", "Uk"]), json!("de")));
        assert!(!matches("exact", json!([]), json!("anything")));
        for v in [json!("value2"), json!(""), Value::Null] {
            assert!(!matches("exact", json!("value"), v.clone()), "{v}");
            assert!(matches("is_not", json!("value"), v.clone()), "{v}");
        }
        assert!(matches("exact", json!(5), json!("5")));
        assert!(!matches("exact", json!(5), json!(5.0)));
        assert!(matches("exact", json!(true), json!("TRUE")));
        assert!(matches("exact", json!(["true"]), json!(true)));
        assert!(!matches("exact", json!("false"), json!(true)));
    }

    #[test]
    fn contains_regex_and_numeric_vectors() {
        assert!(matches("icontains", json!("valUe"), json!("343tfvalue5")));
        assert!(!matches("icontains", json!("valUe"), json!("Alakazam")));
        assert!(!matches("icontains", json!("valUe"), json!(123)));
        assert!(matches("icontains", json!("3"), json!(323)));
        assert!(!matches("icontains", json!("3"), json!("three")));
        assert!(matches("regex", json!(r"^\d+@x\.com$"), json!("42@x.com")));
        assert!(matches("not_regex", json!("^a"), json!("bca")));
        assert!(!matches("regex", json!("(unclosed"), json!("x")));
        assert!(
            !matches("not_regex", json!("(unclosed"), json!("x")),
            "invalid: false for both"
        );
        assert!(
            matches("gt", json!(5), json!("10")),
            "strings compare numerically"
        );
        assert!(!matches("gt", json!("ten"), json!(11)));
        assert!(matches("lte", json!("2.5"), json!(2.5)));
        assert!(matches("between", json!([1, 3]), json!(3)));
        assert!(!matches("between", json!([3, 1]), json!(2)));
    }

    #[test]
    fn missing_keys_follow_the_operator() {
        let empty = Map::new();
        let check = |op: &str| match_property(&filter("gone", op, json!("x")), &empty, &ctx());
        assert!(!check("exact"));
        assert!(check("is_not"));
        assert!(!check("is_set"));
        assert!(check("is_not_set"));
        assert!(check("not_icontains"));
        assert!(check("not_regex"));
        assert!(!check("gt"));
        let set = json!({"k": null}).as_object().cloned().expect("obj");
        assert!(
            match_property(&filter("k", "is_set", json!("")), &set, &ctx()),
            "null counts as set"
        );
    }

    #[test]
    fn semver_operators() {
        assert!(matches("semver_gt", json!("1.2.3"), json!("1.10.0")));
        assert!(matches("semver_lt", json!("1.0.0"), json!("1.0.0-beta")));
        assert!(matches("semver_tilde", json!("1.2.3"), json!("1.2.9")));
        assert!(!matches("semver_tilde", json!("1.2.3"), json!("1.3.0")));
        assert!(matches("semver_caret", json!("0.2.3"), json!("0.2.9")));
        assert!(!matches("semver_caret", json!("0.2.3"), json!("0.3.0")));
        assert!(matches("semver_wildcard", json!("1.2.*"), json!("1.2.7")));
        assert!(!matches("semver_wildcard", json!("1.2.*"), json!("1.3.0")));
        assert!(!matches("semver_wildcard", json!("1.*.3"), json!("1.2.3")));
        assert!(!matches(
            "semver_eq",
            json!("1.0.0"),
            json!("not.a.version")
        ));
    }

    #[test]
    fn numbers_in_exponent_form_are_epoch_seconds() {
        // A number in exponent form is still epoch seconds.
        assert!(!matches(
            "is_date_after",
            json!("2020-01-01"),
            json!("1.0e-5")
        ));
        assert!(matches(
            "is_date_before",
            json!("2020-01-01"),
            json!("1.0e-5")
        ));
    }

    #[test]
    fn date_operators_compare_instants() {
        assert!(matches(
            "is_date_before",
            json!("2020-01-01"),
            json!("2019-12-31")
        ));
        assert!(
            matches("is_date_after", json!("-7d"), json!(1_577_836_800)),
            "epoch seconds"
        );
        assert!(matches("is_date_after", json!("-7d"), json!("1577836800")));
        assert!(!matches(
            "is_date_after",
            json!("garbage"),
            json!("2020-01-01")
        ));
        assert!(matches(
            "is_date_exact",
            json!("2019-06-01T00:00:00Z"),
            json!("2019-06-01T00:00:00+00:00")
        ));
        let paris = MatchContext {
            timezone: chrono_tz::Europe::Paris,
            ..ctx()
        };
        let props = json!({"d": "2019-12-31T23:30:00Z"})
            .as_object()
            .cloned()
            .expect("obj");
        // Midnight of 2020-01-01 in Paris is 23:00 UTC on 2019-12-31.
        assert!(match_property(
            &filter("d", "is_date_after", json!("2020-01-01")),
            &props,
            &paris
        ));
        assert!(!match_property(
            &filter("d", "is_date_after", json!("2020-01-01")),
            &props,
            &ctx()
        ));
    }
}
