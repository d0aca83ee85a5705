//! `/flags` request decoding and parsing (`PostHog/posthog:rust/feature-flags/src/flags/flag_request.rs`), and the runtime and
//! evaluation-context filters (§7.1–7.2).

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::model::FlagDefinition;
use corvid_kernel::wire::{decode_text, WireError, WireInput};

mod walk;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlagRequestError {
    #[error("Failed to decode request: {0}")]
    Decoding(String),
    #[error("Failed to parse request: {0}")]
    Parsing(String),
    #[error("Request body is over the limit of {0} bytes once decompressed")]
    TooLarge(usize),
    #[error("The request has no distinct_id")]
    MissingDistinctId,
}

/// The parsed body of a `/flags` request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlagRequest {
    pub token: Option<String>,
    pub distinct_id: Option<String>,
    pub groups: Map<String, Value>,
    pub person_properties: Map<String, Value>,
    pub group_properties: Map<String, Value>,
    pub anon_distinct_id: Option<String>,
    pub device_id: Option<String>,
    pub flag_keys: Option<Vec<String>>,
    pub evaluation_contexts: Vec<String>,
    pub evaluation_runtime: Option<Runtime>,
    pub geoip_disable: bool,
    pub disable_flags: bool,
    /// Evaluate only survey flags (`only_evaluate_survey_feature_flags=true` in the query).
    pub only_survey_flags: bool,
}

/// Decodes a `/flags` body with the wire decoder capture uses, then reads its JSON straight
/// into a request: members other than the fields are skipped unbuilt, and the fields are not
/// collected into a map first. The body is read by a walk ([`walk`]); text the walk leaves is
/// read by a parse, whose errors the client then gets.
pub fn decode_request(input: WireInput<'_>, limit: usize) -> Result<FlagRequest, FlagRequestError> {
    let text = decode_text(input, limit).map_err(|err| match err {
        WireError::TooLarge { limit } => FlagRequestError::TooLarge(limit),
        other => FlagRequestError::Decoding(other.to_string()),
    })?;
    // Filled where it stands: the fields are a kilobyte of slots, and each move copies them.
    let mut fields = Fields::default();
    if walk::fields(&text, &mut fields).is_none() {
        fields = serde_json::from_str::<Fields>(&text)
            .map_err(|e| FlagRequestError::Parsing(e.to_string()))?;
    }
    fields.take_request()
}

/// The fields a body is read for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Token,
    DistinctId,
    Groups,
    PersonProperties,
    GroupProperties,
    AnonDistinctId,
    DeviceId,
    FlagKeys,
    EvaluationContexts,
    EvaluationRuntime,
    GeoipDisable,
    DisableFlags,
}

/// The most names a field has.
const MAX_NAMES: usize = 3;

impl Field {
    const ALL: [Field; 12] = [
        Field::Token,
        Field::DistinctId,
        Field::Groups,
        Field::PersonProperties,
        Field::GroupProperties,
        Field::AnonDistinctId,
        Field::DeviceId,
        Field::FlagKeys,
        Field::EvaluationContexts,
        Field::EvaluationRuntime,
        Field::GeoipDisable,
        Field::DisableFlags,
    ];

    /// PostHog's names for the field, preferred first: a field takes the first of its names
    /// given with a non-null value.
    fn names(self) -> &'static [&'static str] {
        match self {
            Field::Token => &["token", "api_key", "$token"],
            Field::DistinctId => &["distinct_id", "$distinct_id"],
            Field::Groups => &["groups", "$groups"],
            Field::PersonProperties => &["person_properties", "$properties"],
            Field::GroupProperties => &["group_properties", "$group_properties"],
            Field::AnonDistinctId => &["anon_distinct_id", "$anon_distinct_id"],
            Field::DeviceId => &["device_id", "$device_id"],
            Field::FlagKeys => &["flag_keys_to_evaluate", "flag_keys"],
            Field::EvaluationContexts => &["evaluation_contexts", "evaluation_environments"],
            Field::EvaluationRuntime => &["evaluation_runtime"],
            Field::GeoipDisable => &["geoip_disable"],
            Field::DisableFlags => &["disable_flags"],
        }
    }

    /// The field a member name stands for, and the name's place among the field's names.
    fn of(name: &str) -> Option<(Field, usize)> {
        Field::ALL.iter().find_map(|&field| {
            let at = field.names().iter().position(|n| *n == name)?;
            Some((field, at))
        })
    }
}

/// The values a body gave under each name of each field (a name given twice keeps its last
/// value, as a JSON object read into a map does).
#[derive(Default)]
struct Fields([[Option<Value>; MAX_NAMES]; Field::ALL.len()]);

impl Fields {
    /// The field's value under its first name given a non-null value.
    fn take(&mut self, field: Field) -> Option<Value> {
        self.0
            .get_mut(field as usize)?
            .iter_mut()
            .find(|v| v.as_ref().is_some_and(|v| !v.is_null()))?
            .take()
    }

    fn take_request(&mut self) -> Result<FlagRequest, FlagRequestError> {
        let request = FlagRequest {
            token: self.take(Field::Token).and_then(text),
            distinct_id: self.take(Field::DistinctId).and_then(text).map(truncated),
            groups: object(self.take(Field::Groups)),
            person_properties: object(self.take(Field::PersonProperties)),
            group_properties: object(self.take(Field::GroupProperties)),
            anon_distinct_id: self.take(Field::AnonDistinctId).and_then(text),
            device_id: self.take(Field::DeviceId).and_then(text),
            flag_keys: self.take(Field::FlagKeys).map(|v| strings(Some(v))),
            evaluation_contexts: strings(self.take(Field::EvaluationContexts)),
            evaluation_runtime: self
                .take(Field::EvaluationRuntime)
                .as_ref()
                .and_then(Value::as_str)
                .map(Runtime::parse),
            geoip_disable: matches!(self.take(Field::GeoipDisable), Some(Value::Bool(true))),
            disable_flags: matches!(self.take(Field::DisableFlags), Some(Value::Bool(true))),
            only_survey_flags: false,
        };
        if request.distinct_id.is_none() && !request.disable_flags {
            return Err(FlagRequestError::MissingDistinctId);
        }
        Ok(request)
    }
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Fields, D::Error> {
        deserializer.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
        let mut fields = Fields::default();
        while let Some(name) = map.next_key_seed(FieldName)? {
            match name.and_then(|(field, at)| fields.0.get_mut(field as usize)?.get_mut(at)) {
                Some(slot) => *slot = Some(map.next_value()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(fields)
    }
}

/// A member's name as (field, position among the field's names); `None`: not a field.
struct FieldName;

impl<'de> DeserializeSeed<'de> for FieldName {
    type Value = Option<(Field, usize)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for FieldName {
    type Value = Option<(Field, usize)>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(Field::of(name))
    }
}

/// A string field's text (numbers are accepted as their text).
fn text(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn object(v: Option<Value>) -> Map<String, Value> {
    match v {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

fn strings(v: Option<Value>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) => items.into_iter().filter_map(text).collect(),
        _ => Vec::new(),
    }
}

/// At most 200 characters of a distinct id, as PostHog keeps.
fn truncated(id: String) -> String {
    if id.len() <= 200 {
        return id;
    }
    id.chars().take(200).collect()
}

/// Where the flags will be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Client,
    Server,
    All,
}

impl Runtime {
    pub fn parse(text: &str) -> Runtime {
        match text.to_ascii_lowercase().as_str() {
            "client" => Runtime::Client,
            "server" => Runtime::Server,
            _ => Runtime::All,
        }
    }
}

/// The runtime a request comes from, from its headers (spec §4.4); `None` when unknown.
pub fn detect_runtime(user_agent: Option<&str>, has_browser_headers: bool) -> Option<Runtime> {
    if let Some(ua) = user_agent {
        if ["Mozilla/", "Chrome/", "Safari/", "Firefox/", "Edge/"]
            .iter()
            .any(|m| ua.contains(m))
        {
            return Some(Runtime::Client);
        }
        let server_sdks = [
            "python", "ruby", "php", "java", "go", "node", "dotnet", "elixir",
        ];
        if server_sdks
            .iter()
            .any(|s| ua.starts_with(&format!("posthog-{s}/")))
            || ua.contains("python-requests/")
            || ua.contains("curl/")
        {
            return Some(Runtime::Server);
        }
        let mobile_sdks = ["android", "ios", "react-native", "flutter"];
        if mobile_sdks
            .iter()
            .any(|s| ua.starts_with(&format!("posthog-{s}/")))
        {
            return Some(Runtime::Client);
        }
    }
    has_browser_headers.then_some(Runtime::Client)
}

/// Whether a flag restricted to `flag_runtime` is evaluated for a request from `runtime`.
pub fn runtime_allows(runtime: Option<Runtime>, flag_runtime: Option<Runtime>) -> bool {
    match (runtime, flag_runtime) {
        (_, None) | (_, Some(Runtime::All)) | (Some(Runtime::All), _) => true,
        (Some(r), Some(f)) => r == f,
        (None, Some(_)) => false,
    }
}

/// Whether a flag's tags let a request with `contexts` evaluate it (no tags on either side:
/// yes; else one shared tag).
pub fn contexts_allow(flag: &FlagDefinition, contexts: &[String]) -> bool {
    contexts.is_empty()
        || flag.evaluation_contexts.is_empty()
        || flag
            .evaluation_contexts
            .iter()
            .any(|t| contexts.contains(t))
}

/// What choosing a flag for a request reads, kept per flag apart from its definition: a
/// request reads it for every flag of the set, and with hundreds of flags one dense array
/// costs far fewer cache misses than the definitions (a few hundred bytes apart each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    pub active: bool,
    /// `evaluation_runtime`, parsed once.
    pub runtime: Option<Runtime>,
    /// The flag has `evaluation_contexts` (then they are read from the definition).
    pub has_contexts: bool,
    /// A survey-targeting flag (its key starts with [`crate::SURVEY_FLAG_PREFIX`]).
    pub survey: bool,
}

impl Selection {
    pub fn of(flag: &FlagDefinition) -> Selection {
        Selection {
            active: flag.active,
            runtime: flag.evaluation_runtime.as_deref().map(Runtime::parse),
            has_contexts: !flag.evaluation_contexts.is_empty(),
            survey: flag.key.starts_with(super::SURVEY_FLAG_PREFIX),
        }
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use serde_json::json;

    use super::*;

    /// Runtime filter then evaluation-context filter, as `selected_flags` applies them.
    fn is_selected(flag: &FlagDefinition, runtime: Option<Runtime>, contexts: &[String]) -> bool {
        let selection = Selection::of(flag);
        runtime_allows(runtime, selection.runtime)
            && (!selection.has_contexts || contexts_allow(flag, contexts))
    }

    /// A body of JSON text, read as `/flags` reads one.
    fn parse_request(value: Value) -> Result<FlagRequest, FlagRequestError> {
        parse_text(&value.to_string())
    }

    fn parse_text(body: &str) -> Result<FlagRequest, FlagRequestError> {
        let input = WireInput {
            body: body.as_bytes(),
            ..WireInput::default()
        };
        decode_request(input, 1 << 20)
    }

    #[test]
    fn every_field_has_a_slot_for_each_of_its_names() {
        for (at, field) in Field::ALL.iter().enumerate() {
            assert_eq!(*field as usize, at, "{field:?} is listed in its place");
            assert!((1..=MAX_NAMES).contains(&field.names().len()), "{field:?}");
            for (place, name) in field.names().iter().enumerate() {
                assert_eq!(Field::of(name), Some((*field, place)));
            }
        }
        assert_eq!(Field::of("unknown"), None);
    }

    #[test]
    fn a_field_takes_its_first_name_given_a_value() {
        // A null under the preferred name gives way to the next name; the last of a repeated
        // name counts, as in a JSON object read into a map.
        let r = parse_text(
            r#"{"token": null, "api_key": "k1", "$token": "k2", "distinct_id": "a",
                "distinct_id": "b", "extra": {"deep": [1, {"x": null}]},
                "$properties": {"plan": "pro"}, "geoip_disable": true, "disable_flags": "yes"}"#,
        )
        .expect("ok");
        assert_eq!(r.token.as_deref(), Some("k1"));
        assert_eq!(r.distinct_id.as_deref(), Some("b"));
        assert_eq!(r.person_properties.get("plan"), Some(&json!("pro")));
        assert!(r.geoip_disable && !r.disable_flags);
        let r = parse_text(r#"{"distinct_id": "a", "distinct_id": null, "$distinct_id": "c"}"#)
            .expect("ok");
        assert_eq!(r.distinct_id.as_deref(), Some("c"));
        let r = parse_text(r#"{"disable_flags": true, "evaluation_runtime": "server"}"#)
            .expect("no distinct id needed");
        assert_eq!(r.evaluation_runtime, Some(Runtime::Server));
        for bad in [
            r#"["token"]"#,
            r#""text""#,
            r#"{"token": "t""#,
            r#"{"a": 1} x"#,
        ] {
            assert!(
                matches!(parse_text(bad), Err(FlagRequestError::Parsing(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn aliases_numbers_and_truncation() {
        let r = parse_request(json!({"$token": "phc_x", "$distinct_id": 8675309, "evaluation_environments": ["web"], "flag_keys_to_evaluate": ["a"]})).expect("ok");
        assert_eq!(r.token.as_deref(), Some("phc_x"));
        assert_eq!(r.distinct_id.as_deref(), Some("8675309"));
        assert_eq!(r.evaluation_contexts, vec!["web"]);
        assert_eq!(r.flag_keys, Some(vec!["a".to_string()]));
        let r = parse_request(json!({"token": "t", "distinct_id": 123.45})).expect("ok");
        assert_eq!(r.distinct_id.as_deref(), Some("123.45"));
        let r = parse_request(json!({"token": "t", "distinct_id": "a".repeat(210)})).expect("ok");
        assert_eq!(r.distinct_id.map(|d| d.len()), Some(200));
        assert_eq!(
            parse_request(json!({"token": "t"})),
            Err(FlagRequestError::MissingDistinctId)
        );
    }

    #[test]
    fn bodies_in_every_encoding() {
        let decode = |body: &[u8], compression: Option<&str>, ct: Option<&str>| {
            decode_request(
                WireInput {
                    body,
                    query_compression: compression,
                    content_type: ct,
                    ..WireInput::default()
                },
                1 << 20,
            )
        };
        let v = decode(
            b"eyJ0b2tlbiI6ICJ0ZXN0IiwgImRpc3RpbmN0X2lkIjogInVzZXIifQo%3D",
            Some("base64"),
            None,
        )
        .expect("base64");
        assert_eq!(
            (v.token.as_deref(), v.distinct_id.as_deref()),
            (Some("test"), Some("user"))
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, br#"{"token":"t","distinct_id":"d"}"#).expect("gz");
        let gz = gz.finish().expect("gz");
        assert_eq!(
            decode(&gz, None, None).expect("magic bytes").distinct_id,
            Some("d".to_string())
        );
        let form = format!(
            "data={}",
            base64::engine::general_purpose::STANDARD
                .encode(br#"{"token":"t","distinct_id":"f"}"#)
                .replace('=', "%3D")
        );
        let v = decode(
            form.as_bytes(),
            None,
            Some("application/x-www-form-urlencoded"),
        )
        .expect("form");
        assert_eq!(v.distinct_id.as_deref(), Some("f"));
        let lz = format!(
            "data={}",
            lz_str::compress_to_base64(r#"{"token":"t","distinct_id":"lz"}"#).replace('+', "%2B")
        );
        let v = decode(
            lz.as_bytes(),
            Some("lz64"),
            Some("application/x-www-form-urlencoded"),
        )
        .expect("lz64");
        assert_eq!(v.distinct_id.as_deref(), Some("lz"));
        assert!(matches!(
            decode(b"{nope", None, None),
            Err(FlagRequestError::Parsing(_))
        ));
    }

    #[test]
    fn runtime_detection_and_filters() {
        assert_eq!(
            detect_runtime(Some("Mozilla/5.0 (X11)"), false),
            Some(Runtime::Client)
        );
        assert_eq!(
            detect_runtime(Some("posthog-python/7.0"), false),
            Some(Runtime::Server)
        );
        assert_eq!(
            detect_runtime(Some("posthog-node/5.0"), true),
            Some(Runtime::Server)
        );
        assert_eq!(detect_runtime(Some("curl/8"), false), Some(Runtime::Server));
        assert_eq!(
            detect_runtime(Some("posthog-ios/3"), false),
            Some(Runtime::Client)
        );
        assert_eq!(
            detect_runtime(Some("custom/1"), true),
            Some(Runtime::Client)
        );
        assert_eq!(detect_runtime(None, false), None);
        let f = |runtime: Option<&str>, tags: &[&str]| FlagDefinition {
            id: 1,
            key: "k".into(),
            name: String::new(),
            filters: Default::default(),
            active: true,
            deleted: false,
            ensure_experience_continuity: false,
            version: 1,
            evaluation_runtime: runtime.map(str::to_string),
            evaluation_contexts: tags.iter().map(|t| t.to_string()).collect(),
            bucketing_identifier: None,
        };
        let flags = [
            f(None, &[]),
            f(Some("client"), &[]),
            f(Some("server"), &[]),
            f(Some("all"), &[]),
        ];
        let kept = |r: Option<Runtime>| -> Vec<usize> {
            (0..4).filter(|i| is_selected(&flags[*i], r, &[])).collect()
        };
        assert_eq!(kept(None), vec![0, 3]);
        assert_eq!(kept(Some(Runtime::Client)), vec![0, 1, 3]);
        assert_eq!(kept(Some(Runtime::Server)), vec![0, 2, 3]);
        assert_eq!(kept(Some(Runtime::All)), vec![0, 1, 2, 3]);
        assert!(
            is_selected(&f(Some("weird"), &[]), None, &[]),
            "unknown runtime behaves as all"
        );
        let tagged = f(None, &["web", "docs"]);
        assert!(is_selected(&tagged, None, &[]));
        assert!(is_selected(&tagged, None, &["docs".into()]));
        assert!(!is_selected(&tagged, None, &["mobile".into()]));
        assert!(is_selected(&f(None, &[]), None, &["mobile".into()]));
    }
}
