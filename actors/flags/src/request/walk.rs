//! A `/flags` body read by one walk over its text instead of a parse through serde's visitors.
//! Nearly every body is an object of a few short strings and a flat `person_properties`; the
//! walk looks at each string once, eight bytes at a time, and takes plain strings, short
//! integers and literals as they stand.
//!
//! The walk takes only what the parse takes, and reads it the same way: keys and brackets are
//! checked by the walk, and every value it does not take as it stands (escapes, long numbers,
//! nested values) is read by its own parse. Any text it does not take (`None`) is left to the
//! parse of the whole body, which then reads it or says what is wrong with it.

use serde::de::IgnoredAny;
use serde_json::{Map, Value};

use super::{Field, Fields};
use corvid_kernel::json::{
    checked_scalar_value, is_json_space, may_nest_deeply, members_with_scalars_checked,
};

/// Reads the fields of the JSON object `text` into `fields`; `None` where the walk leaves
/// the text to the parse (`fields` may then hold some of them).
pub(super) fn fields(text: &str, fields: &mut Fields) -> Option<()> {
    let end = members_with_scalars_checked(text, |key, value, plain| {
        match Field::of(&key) {
            Some((field, at)) => {
                let slot = fields.0.get_mut(field as usize)?.get_mut(at)?;
                *slot = Some(value_of(value, plain)?);
            }
            None if plain => {}
            None => {
                if may_nest_deeply(value) {
                    return None;
                }
                serde_json::from_str::<IgnoredAny>(value).ok()?;
            }
        }
        Some(())
    })?;
    text.get(end..)?.bytes().all(is_json_space).then_some(())
}

/// A field's value: a plain scalar as it stands, an object by the walk (`person_properties`
/// and the other maps), anything else by its own parse.
fn value_of(value: &str, plain: bool) -> Option<Value> {
    if plain {
        return checked_scalar_value(value);
    }
    if value.starts_with('{') {
        return object(value).map(Value::Object);
    }
    parsed_alone(value)
}

/// The members of an object value; `value` is the object's whole text, as the walk cut it.
fn object(value: &str) -> Option<Map<String, Value>> {
    let mut map = Map::new();
    let end = members_with_scalars_checked(value, |key, value, plain| {
        let value = if plain {
            checked_scalar_value(value)?
        } else {
            parsed_alone(value)?
        };
        // A key given twice keeps its last value, as a parse into a map does.
        map.insert(key.into_owned(), value);
        Some(())
    })?;
    (end == value.len()).then_some(map)
}

/// A value the walk did not check, read by its own parse; `None` for one that may nest near
/// the parse's depth limit, which only the parse of the whole body can judge.
fn parsed_alone(value: &str) -> Option<Value> {
    if may_nest_deeply(value) {
        return None;
    }
    serde_json::from_str(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::json::{damaged_variants, TRICKY_JSON_VALUES};
    use proptest::prelude::*;

    /// The fields as the parse reads them (`None`: the parse refuses the text).
    fn parsed(text: &str) -> Option<Vec<[Option<Value>; super::super::MAX_NAMES]>> {
        serde_json::from_str::<Fields>(text)
            .ok()
            .map(|f| f.0.to_vec())
    }

    fn walked(text: &str) -> Option<Vec<[Option<Value>; super::super::MAX_NAMES]>> {
        let mut walked = Fields::default();
        fields(text, &mut walked).map(|()| walked.0.to_vec())
    }

    #[test]
    fn typical_bodies_are_walked_and_read_as_the_parse_reads_them() {
        for text in [
            r#"{"token":"phc_x","distinct_id":"known-17","person_properties":{"country":"DE"}}"#,
            r#"{"token":"phc_x","distinct_id":"user-1-2","person_properties":{"email":"u1@corp.com",
                "plan":"pro","age":42,"country":"US","app_version":"2.1.3",
                "signed_up_at":"2025-03-01T10:00:00Z"}}"#,
            r#" {"api_key": "k", "$distinct_id": 8675309, "groups": {"company": "acme"},
                "group_properties": {"company": {"size": 12, "tier": "gold"}},
                "flag_keys_to_evaluate": ["a", "b"], "geoip_disable": true,
                "$anon_distinct_id": null, "extra": {"deep": [1, {"x": -0}]}} "#,
            r#"{"distinct_id":"a","distinct_id":"b","person_properties":{"k":1,"k":2.5}}"#,
            r#"{"token":"t","distinct_id":"d","person_properties":{"esc\u00e9":"x\"y"}}"#,
            "{}",
        ] {
            assert!(walked(text).is_some(), "the walk takes {text}");
            assert_eq!(walked(text), parsed(text), "{text}");
        }
    }

    #[test]
    fn text_the_parse_refuses_is_left_to_it() {
        for text in [
            r#"["token"]"#,
            r#""text""#,
            r#"{"token": "t""#,
            r#"{"a": 1} x"#,
            r#"{"a": 1,}"#,
            r#"{"person_properties": {"a": 1,}}"#,
            r#"{"person_properties": {"a": tru}}"#,
            "{\"token\": \"a\u{1}b\"}",
            r#"{"ignored": [1, }"#,
        ] {
            assert_eq!(walked(text), None, "{text}");
            assert_eq!(parsed(text), None, "{text}");
        }
    }

    #[test]
    fn values_that_may_nest_near_the_depth_limit_are_left_to_the_parse() {
        // Alone, 127 levels parse into a value; inside the body they do not.
        let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
        assert!(serde_json::from_str::<Value>(&deep).is_ok());
        for text in [
            format!(r#"{{"person_properties": {{"k": {deep}}}}}"#),
            format!(r#"{{"groups": {deep}}}"#),
        ] {
            assert_eq!(walked(&text), None);
            assert_eq!(parsed(&text), None);
        }
        // A member that is not a field is skipped by the parse at any depth.
        let text = format!(r#"{{"extra": {deep}, "distinct_id": "d"}}"#);
        assert_eq!(walked(&text), None);
        assert!(parsed(&text).is_some());
    }

    /// A key of the body: a field's name, another name, or a key with escapes.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(vec![
                "token",
                "distinct_id",
                "$distinct_id",
                "person_properties",
                "$properties",
                "groups",
                "flag_keys",
                "disable_flags",
                "other",
            ])
            .prop_map(|k| format!("\"{k}\"")),
            Just(r#""distinct\u005fid""#.to_string()),
            Just("\"a\u{1}\"".to_string()),
        ]
    }

    /// A value: a tricky scalar or bracket text, or an object of them.
    fn value() -> impl Strategy<Value = String> {
        let scalar = proptest::sample::select(TRICKY_JSON_VALUES.to_vec()).prop_map(String::from);
        prop_oneof![
            scalar.clone(),
            proptest::collection::vec((key(), scalar), 0..4).prop_map(|members| {
                let members: Vec<String> =
                    members.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Whatever the walk takes, the parse takes and reads the same way, on bodies of
        /// tricky values, also cut or given a byte of noise anywhere.
        #[test]
        fn the_walk_reads_what_the_parse_reads(
            members in proptest::collection::vec((key(), value()), 0..6),
            space in prop_oneof![Just(""), Just(" "), Just("\n\t")],
            cut in any::<proptest::sample::Index>(),
            noise in proptest::sample::select(vec!['"', '\\', '{', '}', ',', ':', ' ', '\u{1}']),
        ) {
            let body: Vec<String> = members
                .iter()
                .map(|(k, v)| format!("{k}{space}:{space}{v}"))
                .collect();
            let object = format!("{space}{{{}}}{space}", body.join(","));
            for text in damaged_variants(&object, cut.index(object.len() + 1), noise) {
                if let Some(walked) = walked(&text) {
                    prop_assert_eq!(Some(walked), parsed(&text), "{}", text);
                }
            }
        }
    }
}
