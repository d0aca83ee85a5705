//! An event's properties as capture decodes them: the object's text as the client sent it,
//! with only the keys capture itself reads parsed beside it.
//!
//! Capture reads about a dozen property keys (normalization's, person processing's, the
//! shard's), while an SDK sends dozens. Parsing every property into a `Value` tree, writing the
//! tree back to text for the WAL and the segment, and freeing it was most of a `/batch/`
//! request's work. So the text is kept as sent whenever every edit capture makes to it is an
//! added key ([`RawProperties::Text`]). A repeated key, a key that lets person processing edit
//! the properties, an event whose properties capture edits in place, or (at normalization) an
//! edit other than an addition parses every property as before ([`RawProperties::Parsed`]), so
//! what is stored means the same either way.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use corvid_kernel::json::{
    checked_scalar_value, is_json_space, may_nest_deeply, members_with_scalars_checked,
    parse_value, write_string_literal, BorrowedKey,
};

use super::property_keys::{
    DECODE_READS, NORMALIZE_READS, PROCESSING_READS, PROPERTY_EDITING_KEYS, SHARD_READS,
};

/// Whether capture reads `key` from an event's properties: only these are parsed on the text
/// path.
fn is_read(key: &str) -> bool {
    [
        &DECODE_READS[..],
        &NORMALIZE_READS[..],
        &PROCESSING_READS[..],
        &SHARD_READS[..],
    ]
    .iter()
    .any(|keys| keys.contains(&key))
}

/// An event's properties after decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum RawProperties {
    /// Every property, parsed.
    Parsed(Map<String, Value>),
    /// The JSON object as sent (no key repeated, none of [`PROPERTY_EDITING_KEYS`]) and the
    /// keys capture reads, parsed.
    Text {
        text: String,
        read: Map<String, Value>,
    },
}

impl Default for RawProperties {
    fn default() -> Self {
        RawProperties::Parsed(Map::new())
    }
}

impl RawProperties {
    /// Reads `text`, a JSON object. With `keep_text`, keeps it as sent when it allows (see the
    /// module's doc); otherwise parses every property. Fails as parsing it into a map would.
    pub fn read(text: &str, keep_text: bool) -> Result<RawProperties, serde_json::Error> {
        if keep_text {
            let scan = match Scan::walk(text) {
                Some((scan, end))
                    if text
                        .as_bytes()
                        .get(end..)
                        .is_some_and(|rest| rest.iter().all(|b| is_json_space(*b))) =>
                {
                    scan
                }
                _ => serde_json::from_str(text)?,
            };
            return ScannedProperties { text, scan }.into_raw(true);
        }
        serde_json::from_str(text).map(RawProperties::Parsed)
    }

    /// The value of `key`. On the text path only the keys capture reads are answered.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            RawProperties::Parsed(map) => map.get(key),
            RawProperties::Text { read, .. } => read.get(key),
        }
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every property, parsed.
    pub fn into_map(self) -> Result<Map<String, Value>, serde_json::Error> {
        match self {
            RawProperties::Parsed(map) => Ok(map),
            RawProperties::Text { text, .. } => serde_json::from_str(&text),
        }
    }
}

/// A properties object read from the start of a longer text (the rest of an event's text),
/// so the event's walk does not go over it a second time.
pub struct ScannedProperties<'t> {
    text: &'t str,
    scan: Scan<'t>,
}

impl<'t> ScannedProperties<'t> {
    /// Reads the JSON object that starts `text`, checking it as [`RawProperties::read`] does.
    /// Whatever follows the object is left unread.
    pub fn read_prefix(text: &'t str) -> Result<ScannedProperties<'t>, serde_json::Error> {
        if let Some((scan, end)) = Scan::walk(text) {
            if let Some(text) = text.get(..end) {
                return Ok(ScannedProperties { text, scan });
            }
        }
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Scan<'t>>();
        let scan = match stream.next() {
            Some(scan) => scan?,
            None => return Err(serde::de::Error::custom("no properties object")),
        };
        let text = text
            .get(..stream.byte_offset())
            .ok_or_else(|| serde::de::Error::custom("properties end inside a character"))?;
        Ok(ScannedProperties { text, scan })
    }

    /// The object's text.
    pub fn text(&self) -> &'t str {
        self.text
    }

    /// What [`RawProperties::read`] makes of the text with `keep_text`.
    pub fn into_raw(self, keep_text: bool) -> Result<RawProperties, serde_json::Error> {
        let ScannedProperties { text, scan } = self;
        if keep_text && !scan.edited && !repeats_a_key(scan.keys) {
            let mut kept = String::with_capacity(text.len() + APPEND_ROOM);
            kept.push_str(text);
            return Ok(RawProperties::Text {
                text: kept,
                read: scan.read,
            });
        }
        serde_json::from_str(text).map(RawProperties::Parsed)
    }
}

/// Room left after a kept properties text for the members normalization appends (`$ip`,
/// `$sent_at`), so appending them does not copy the text.
const APPEND_ROOM: usize = 96;

/// `text` (a JSON object) with `added` members after its own, appended in place. The caller
/// makes sure none of the keys is already there.
pub fn with_added(text: String, added: &[(&str, Value)]) -> String {
    let mut out = text.into_bytes();
    while out.last().is_some_and(u8::is_ascii_whitespace) {
        out.pop();
    }
    if out.last() == Some(&b'}') {
        out.pop();
    }
    let mut first = out.iter().rev().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    for (key, value) in added {
        if !first {
            out.push(b',');
        }
        first = false;
        write_string_literal(&mut out, key);
        out.push(b':');
        match value {
            Value::String(text) => write_string_literal(&mut out, text),
            // Writing a `Value` into a `Vec` cannot fail.
            other => drop(serde_json::to_writer(&mut out, other)),
        }
    }
    out.push(b'}');
    // Only ASCII was removed and JSON text appended, so this is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Whether two of `keys` are equal (as unescaped text). Up to 64 keys go into a small table by
/// a cheap hash of their ends and length, and only keys landing on each other's way are
/// compared: sorting an event's keys (most sharing a `$` prefix) cost more than parsing
/// their values.
fn repeats_a_key(keys: Vec<Cow<'_, str>>) -> bool {
    const SLOTS: usize = 128;
    const EMPTY: u8 = u8::MAX;
    if keys.len() > SLOTS / 2 {
        return repeats_by_sorting(keys);
    }
    let mut table = [EMPTY; SLOTS];
    for (i, key) in keys.iter().enumerate() {
        let mut slot = key_bucket(key) % SLOTS;
        loop {
            match table[slot] {
                // At most 64 keys: every index fits below `EMPTY`.
                EMPTY => {
                    table[slot] = i as u8;
                    break;
                }
                j if keys[usize::from(j)] == *key => return true,
                _ => slot = (slot + 1) % SLOTS,
            }
        }
    }
    false
}

/// [`repeats_a_key`] for many keys.
fn repeats_by_sorting(mut keys: Vec<Cow<'_, str>>) -> bool {
    keys.sort_unstable();
    keys.windows(2).any(|pair| pair[0] == pair[1])
}

/// A hash of a key's first and last eight bytes and its length: equal keys land together.
fn key_bucket(key: &str) -> usize {
    let bytes = key.as_bytes();
    let word = |part: &[u8]| {
        let mut word = [0u8; 8];
        word[..part.len()].copy_from_slice(part);
        u64::from_le_bytes(word)
    };
    let head = word(&bytes[..bytes.len().min(8)]);
    let tail = word(&bytes[bytes.len().saturating_sub(8)..]);
    let mixed =
        (head ^ tail.rotate_left(29) ^ bytes.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 57) as usize
}

/// One pass over a properties object: the keys, the values of the read ones, and whether a
/// key lets person processing edit the properties. Every other value is checked as parsing it
/// into a `Value` would check it, and kept nowhere.
struct Scan<'de> {
    keys: Vec<Cow<'de, str>>,
    read: Map<String, Value>,
    edited: bool,
}

impl<'t> Scan<'t> {
    /// The scan of the object that starts `text` and the index just past it, read by a walk
    /// instead of a parse: keys and brackets are checked by the walk, the read keys' values
    /// parsed, a string without escapes or a short number taken as it stands, and any other
    /// value checked by its own parse. `None` when the walk does not take the text: the parse
    /// then decides (it takes all the walk takes, and gives the same scan).
    fn walk(text: &'t str) -> Option<(Scan<'t>, usize)> {
        let mut scan = Scan {
            keys: Vec::with_capacity(32),
            read: Map::new(),
            edited: false,
        };
        let end = members_with_scalars_checked(text, |key, value, plain| {
            if !plain && may_nest_deeply(value) {
                return None;
            }
            scan.edited |= PROPERTY_EDITING_KEYS.contains(&key.as_ref());
            if is_read(&key) {
                let value = if plain {
                    checked_scalar_value(value)?
                } else {
                    parse_value(value)?
                };
                scan.read.insert(key.to_string(), value);
            } else if !plain {
                serde_json::from_str::<Checked>(value).ok()?;
            }
            scan.keys.push(key);
            Some(())
        })?;
        Some((scan, end))
    }
}

impl<'de> Deserialize<'de> for Scan<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScanVisitor;
        impl<'de> Visitor<'de> for ScanVisitor {
            type Value = Scan<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scan<'de>, A::Error> {
                let mut scan = Scan {
                    keys: Vec::with_capacity(map.size_hint().unwrap_or(32)),
                    read: Map::new(),
                    edited: false,
                };
                while let Some(key) = map.next_key_seed(BorrowedKey)? {
                    scan.edited |= PROPERTY_EDITING_KEYS.contains(&key.as_ref());
                    if is_read(&key) {
                        let value: Value = map.next_value()?;
                        scan.read.insert(key.to_string(), value);
                    } else {
                        map.next_value::<Checked>()?;
                    }
                    scan.keys.push(key);
                }
                Ok(scan)
            }
        }
        deserializer.deserialize_map(ScanVisitor)
    }
}

/// Any JSON value, read as `Value` reads it (numbers in range, strings unescaped) without
/// keeping it. `IgnoredAny` would skip numbers unread and let `1e400` through.
pub(crate) struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CheckedVisitor;
        impl<'de> Visitor<'de> for CheckedVisitor {
            type Value = Checked;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_unit<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_none<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Checked, D::Error> {
                Checked::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(Checked)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
                // Keys are read as text too: skipping one would not check its escapes.
                while map.next_key_seed(BorrowedKey)?.is_some() {
                    map.next_value::<Checked>()?;
                }
                Ok(Checked)
            }
        }
        deserializer.deserialize_any(CheckedVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_kernel::json::{damaged_variants, TRICKY_JSON_VALUES};
    use proptest::prelude::*;
    use serde_json::json;

    fn text_of(props: &RawProperties) -> Option<&str> {
        match props {
            RawProperties::Text { text, .. } => Some(text),
            RawProperties::Parsed(_) => None,
        }
    }

    #[test]
    fn keeps_the_text_and_parses_only_the_read_keys() {
        let text =
            r#"{"$browser":"Chrome","$set":{"plan":"pro"},"n":[1,{"a":null}],"$session_id":"s1"}"#;
        let props = RawProperties::read(text, true).expect("reads");
        assert_eq!(text_of(&props), Some(text));
        assert_eq!(props.get("$set"), Some(&json!({"plan": "pro"})));
        assert_eq!(props.get("$session_id"), Some(&json!("s1")));
        assert_eq!(props.get("$browser"), None, "not read on the text path");
        let all = props.into_map().expect("parses");
        assert_eq!(
            Value::Object(all),
            serde_json::from_str::<Value>(text).expect("json")
        );
    }

    #[test]
    fn repeated_keys_and_editing_keys_parse_every_property() {
        for text in [
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"a":1,"\u0061":3}"#,
            r#"{"$groups":{"company":"acme"},"x":1}"#,
            r#"{"$process_person_profile":false}"#,
        ] {
            let props = RawProperties::read(text, true).expect("reads");
            let RawProperties::Parsed(map) = props else {
                panic!("{text} kept as text");
            };
            assert_eq!(
                map,
                serde_json::from_str::<Map<String, Value>>(text).expect("json")
            );
        }
        assert!(matches!(
            RawProperties::read(r#"{"a":1}"#, false),
            Ok(RawProperties::Parsed(_))
        ));
    }

    #[test]
    fn rejects_what_a_parse_into_values_rejects() {
        for text in [
            r#"{"a":1e400}"#,
            r#"{"a":[1,-1e999]}"#,
            r#"{"a":{"b":"\ud800"}}"#,
            r#"{"a":{"\ud800":1}}"#,
            r#"{"a":"\x"}"#,
            r#"[1]"#,
        ] {
            assert!(
                serde_json::from_str::<Map<String, Value>>(text).is_err(),
                "{text} parses"
            );
            assert!(RawProperties::read(text, true).is_err(), "{text} kept");
        }
    }

    #[test]
    fn added_members_join_the_object() {
        let added = [("$ip", json!("203.0.113.1")), ("$sent_at", json!("t\"1"))];
        for (text, expected) in [
            ("{}", json!({"$ip": "203.0.113.1", "$sent_at": "t\"1"})),
            (
                " { \n } ",
                json!({"$ip": "203.0.113.1", "$sent_at": "t\"1"}),
            ),
            (
                r#"{"a":{"b":{}}} "#,
                json!({"a": {"b": {}}, "$ip": "203.0.113.1", "$sent_at": "t\"1"}),
            ),
        ] {
            let out = with_added(text.to_string(), &added);
            let back: Value = serde_json::from_str(&out).expect("valid JSON");
            assert_eq!(back, expected, "{text}");
        }
        assert_eq!(with_added(r#"{"a":1}"#.to_string(), &[]), r#"{"a":1}"#);
    }

    #[test]
    fn a_repeated_key_is_found_among_few_or_many() {
        let names: Vec<String> = (0..100)
            .map(|i| match i % 4 {
                0 => format!("${i}"),
                1 => format!("$screen_{i}"),
                2 => format!("a_long_common_prefix_{i}_and_suffix"),
                _ => "x".repeat(i),
            })
            .collect();
        for count in [0, 1, 2, 17, 64, 65, 100] {
            let keys: Vec<Cow<'_, str>> =
                names[..count].iter().map(|k| k.as_str().into()).collect();
            assert!(!repeats_a_key(keys.clone()), "{count} distinct keys");
            for (a, b) in [(0, count.saturating_sub(1)), (count / 2, count / 3)] {
                if count < 2 || a == b {
                    continue;
                }
                let mut repeated = keys.clone();
                repeated[b] = repeated[a].clone();
                assert!(repeats_a_key(repeated), "{count} keys, {a} at {b}");
            }
        }
    }

    /// What the parse makes of `text` as a properties prefix: the scan's parts and the
    /// object's length.
    type ScanParts = (Vec<String>, Map<String, Value>, bool, usize);

    fn parts(scan: Scan<'_>, len: usize) -> ScanParts {
        let keys = scan.keys.iter().map(|k| k.to_string()).collect();
        (keys, scan.read, scan.edited, len)
    }

    fn parsed_prefix(text: &str) -> Option<ScanParts> {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Scan<'_>>();
        let scan = stream.next()?.ok()?;
        Some(parts(scan, stream.byte_offset()))
    }

    fn walked_prefix(text: &str) -> Option<ScanParts> {
        Scan::walk(text).map(|(scan, end)| parts(scan, end))
    }

    /// Member texts mixing what the walk takes as it stands with what needs a parse, what a
    /// parse refuses and what sits at its depth limit.
    fn member_text() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just(r#""$browser""#.to_string()),
            Just(r#""$set""#.to_string()),
            Just(r#""token""#.to_string()),
            Just(r#""$groups""#.to_string()),
            Just(r#""\u0024set""#.to_string()),
            Just(r#""a\"b""#.to_string()),
            Just(r#""\ud800""#.to_string()),
            Just("\"ta\tb\"".to_string()),
            "[a-z$]{0,10}".prop_map(|k| format!("\"{k}\"")),
        ];
        let value = prop_oneof![
            8 => prop::sample::select(TRICKY_JSON_VALUES.to_vec()).prop_map(String::from),
            2 => (124usize..130).prop_map(|depth| format!("{}{}", "[".repeat(depth), "]".repeat(depth))),
            1 => any::<i64>().prop_map(|n| n.to_string()),
            1 => any::<f64>().prop_map(|n| n.to_string()),
        ];
        let space = prop_oneof![Just(""), Just(" "), Just("\n\t"), Just("\u{c}")];
        (key, space.clone(), value, space).prop_map(|(k, s1, v, s2)| format!("{k}{s1}:{s2}{v}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The walk takes only objects the parse takes, and gives the same scan of them; cut
        /// or changed anywhere, it still takes nothing the parse refuses.
        #[test]
        fn the_walk_takes_what_the_parse_takes_and_reads_it_alike(
            members in prop::collection::vec(member_text(), 0..8),
            tail in prop_oneof![Just(""), Just(" ,\"x\":1}"), Just("x")],
            cut in any::<prop::sample::Index>(),
            noise in prop::sample::select(vec!['"', '\\', '{', '}', '[', ']', ',', ':', ' ', '\u{1}', 'é']),
        ) {
            let object = format!("{{{}}}{tail}", members.join(","));
            for text in damaged_variants(&object, cut.index(object.len() + 1), noise) {
                let walked = walked_prefix(&text);
                if walked.is_some() {
                    prop_assert_eq!(&walked, &parsed_prefix(&text), "{}", text);
                }
                if let Ok(read) = ScannedProperties::read_prefix(&text) {
                    let parsed = parsed_prefix(&text);
                    prop_assert!(parsed.is_some(), "{} taken", text);
                    prop_assert_eq!(read.text().len(), parsed.map_or(0, |p| p.3));
                }
            }
        }
    }

    /// A value nested to the parse's limit inside the object is refused, as the parse refuses
    /// it, though on its own it would parse.
    #[test]
    fn a_value_at_the_depth_limit_is_refused_as_the_parse_refuses_it() {
        let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
        assert!(serde_json::from_str::<Value>(&deep).is_ok());
        let text = format!(r#"{{"a":{deep}}}"#);
        assert!(parsed_prefix(&text).is_none());
        assert!(ScannedProperties::read_prefix(&text).is_err());
        assert!(RawProperties::read(&text, true).is_err());
    }

    #[test]
    fn the_walk_takes_common_properties() {
        let text = r#"{"$browser": "Chrome", "$screen_width": 1920, "amount": 12.5, "ok": true, "$set": {"plan": "pro"}, "n": null} ,"#;
        let walked = walked_prefix(text).expect("walked");
        assert_eq!(Some(walked), parsed_prefix(text));
    }

    #[test]
    fn the_read_keys_include_every_reader() {
        for key in PROCESSING_READS
            .iter()
            .chain(&SHARD_READS)
            .chain(&NORMALIZE_READS)
            .chain(&DECODE_READS)
        {
            assert!(is_read(key), "{key}");
        }
        assert!(!is_read("$browser"));
    }
}
