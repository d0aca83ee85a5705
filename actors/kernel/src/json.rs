//! Reading JSON text without building it: the property scanner the segment writer (ingest)
//! and the query functions share. A leaf: it depends on nothing else in the crate.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// One step of a JSON path: an object key or an array index (ClickHouse indexes from 1;
/// negative counts from the end).
#[derive(Debug, Clone, PartialEq)]
pub enum PathStep<'a> {
    Key(Cow<'a, str>),
    Index(i64),
}

/// The raw JSON text at `path` inside `json`, or `None` when absent or not valid JSON.
pub fn json_path<'j>(json: &'j str, path: &[PathStep<'_>]) -> Option<&'j str> {
    let mut current: &'j str = json;
    for step in path {
        let mut de = serde_json::Deserializer::from_str(current);
        let found: Option<&'j RawValue> = match step {
            PathStep::Key(key) => de.deserialize_any(FindKey { key }).ok()?,
            PathStep::Index(i) => de.deserialize_any(FindIndex { index: *i }).ok()?,
        };
        current = found?.get();
    }
    Some(current)
}

/// Reads an object key (or any string) borrowed from the JSON text unless it holds escapes.
/// `Cow<str>`'s own `Deserialize` always allocates a `String`.
pub struct BorrowedKey;

impl<'de> DeserializeSeed<'de> for BorrowedKey {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The text of a JSON string literal that holds no escape, without its quotes; `None` for any
/// other text (which then needs a real parse).
fn plain_string(raw: &str) -> Option<&str> {
    raw.strip_prefix('"')?
        .strip_suffix('"')
        .filter(|s| s.bytes().all(|b| b != b'\\' && b != b'"' && b >= 0x20))
}

/// A JSON string literal's text, borrowed when it holds no escape.
fn string_literal(raw: &str) -> Option<Cow<'_, str>> {
    match plain_string(raw) {
        Some(plain) => Some(Cow::Borrowed(plain)),
        None => serde_json::from_str::<Cow<'_, str>>(raw).ok(),
    }
}

/// A path step into a scalar finds nothing.
macro_rules! scalars_find_nothing {
    () => {
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    };
}

struct FindKey<'k> {
    key: &'k str,
}

impl<'de> Visitor<'de> for FindKey<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            if found.is_none() && key == self.key {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_find_nothing!();
}

/// The raw JSON text of each of `keys` at the top level of `json`, in one pass: what
/// [`json_path`] finds for each key alone (the first occurrence; nothing when `json` is not a
/// valid object). Segment writers fill every property column of a row from one scan of its
/// JSON instead of one scan per column.
pub fn top_level_values<'j>(json: &'j str, keys: &[&str]) -> Vec<Option<&'j str>> {
    let mut de = serde_json::Deserializer::from_str(json);
    match de.deserialize_any(FindKeys { keys }) {
        Ok(Some(found)) => found.into_iter().map(|v| v.map(RawValue::get)).collect(),
        _ => vec![None; keys.len()],
    }
}

struct FindKeys<'k> {
    keys: &'k [&'k str],
}

impl<'de> Visitor<'de> for FindKeys<'_> {
    /// `None` when the value is not an object.
    type Value = Option<Vec<Option<&'de RawValue>>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = vec![None; self.keys.len()];
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            match self.keys.iter().position(|k| *k == key) {
                Some(i) if found[i].is_none() => {
                    found[i] = Some(map.next_value::<&'de RawValue>()?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(found))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_find_nothing!();
}

struct FindIndex {
    index: i64,
}

impl<'de> Visitor<'de> for FindIndex {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items: Vec<&'de RawValue> = Vec::new();
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            items.push(item);
        }
        let len = items.len() as i64;
        let at = match self.index {
            i if i > 0 => i - 1,
            i if i < 0 => len + i,
            _ => return Ok(None),
        };
        Ok(usize::try_from(at).ok().and_then(|i| items.get(i).copied()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_find_nothing!();
}

/// The value of a property as HogQL shows it (see [`JsonKind::Property`]).
pub fn property_text(raw: &str) -> Option<Cow<'_, str>> {
    match raw.as_bytes().first()? {
        b'"' => string_literal(raw),
        b'n' => None,
        _ => Some(Cow::Borrowed(raw)),
    }
}

/// A property read as a number (see [`JsonKind::PropertyNumber`]).
pub fn property_number(raw: &str) -> Option<f64> {
    match raw.as_bytes().first()? {
        b'"' => string_literal(raw)?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite()),
        b't' => Some(1.0),
        b'f' => Some(0.0),
        b'n' | b'{' | b'[' => None,
        _ => raw.parse::<f64>().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> PathStep<'_> {
        PathStep::Key(Cow::Borrowed(k))
    }

    #[test]
    fn finds_nested_keys_and_indexes() {
        let json = r#"{"a": {"b": [10, 20, {"c": "x"}]}, "$browser": "Chrome", "n": null}"#;
        assert_eq!(json_path(json, &[key("$browser")]), Some(r#""Chrome""#));
        assert_eq!(
            json_path(json, &[key("a"), key("b"), PathStep::Index(1)]),
            Some("10")
        );
        assert_eq!(
            json_path(json, &[key("a"), key("b"), PathStep::Index(-1), key("c")]),
            Some(r#""x""#)
        );
        assert_eq!(json_path(json, &[key("missing")]), None);
        assert_eq!(json_path(json, &[key("$browser"), key("deeper")]), None);
        assert_eq!(json_path("not json", &[key("a")]), None);
        assert_eq!(json_path(json, &[key("n")]), Some("null"));
    }

    #[test]
    fn escaped_keys_match() {
        let json = r#"{"we\"ird": 1, "caf\u00e9": 2}"#;
        assert_eq!(json_path(json, &[key("we\"ird")]), Some("1"));
        assert_eq!(json_path(json, &[key("café")]), Some("2"));
    }

    #[test]
    fn one_pass_extraction_finds_what_json_path_finds() {
        let keys = ["$browser", "a", "nested", "n", "missing", "dup"];
        for json in [
            r#"{"$browser":"Chrome","a":1,"nested":{"a":2},"n":null,"dup":1,"dup":2}"#,
            r#"{"a":"x\"y","$browser":["Safari"],"esc\u0061pe":true}"#,
            r#"{"\u0061":"escaped key","a":"plain"}"#,
            r#"{}"#,
            r#"[{"a":1}]"#,
            r#""a""#,
            "12",
            r#"{"a":1,"#,
            r#"{"a":1} trailing"#,
            "",
        ] {
            let expected: Vec<Option<&str>> = keys
                .iter()
                .map(|k| json_path(json, &[PathStep::Key(Cow::Borrowed(k))]))
                .collect();
            assert_eq!(top_level_values(json, &keys), expected, "{json}");
        }
        assert_eq!(
            top_level_values(r#"{"dup":1,"dup":2}"#, &["dup"]),
            vec![Some("1")]
        );
    }

    #[test]
    fn property_text_and_numbers_follow_hogql() {
        assert_eq!(property_text(r#""a\"b""#).as_deref(), Some("a\"b"));
        assert!(matches!(
            property_text(r#""plain é""#),
            Some(Cow::Borrowed("plain é"))
        ));
        assert_eq!(property_text(r#""\u00e9\t""#).as_deref(), Some("é\t"));
        assert_eq!(property_text(r#""""#).as_deref(), Some(""));
        // Not a string literal: no text, however it starts.
        assert_eq!(property_text(r#""a"b""#), None);
        assert_eq!(property_text("\"tab\there\""), None);
        assert_eq!(property_text("12.5").as_deref(), Some("12.5"));
        assert_eq!(property_text("true").as_deref(), Some("true"));
        assert_eq!(property_text("null"), None);
        assert_eq!(property_number(r#"" 42 ""#), Some(42.0));
        assert_eq!(property_number("1e3"), Some(1000.0));
        assert_eq!(property_number(r#""abc""#), None);
        assert_eq!(property_number("[1]"), None);
    }
}
