//! Scalar functions HogQL needs that DataFusion lacks: reading fields out of the JSON text of
//! `properties` / `person_properties`.
//!
//! Each row's JSON is scanned once per call and only the requested path is materialised: the
//! scanner skips every other value without building it, which is what keeps `properties.$x`
//! cheap enough for analytics over millions of rows.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanBuilder, Float64Builder, Int64Array, Int64Builder, StringArray,
    StringBuilder,
};
use arrow::array::{AsArray, StringViewArray, TimestampMicrosecondArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, TimeUnit, TimestampMicrosecondType};
use chrono::{DateTime, Utc};
use chrono::{Offset, TimeZone};
use chrono_tz::Tz;
use datafusion::common::{exec_err, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::insights::dates::Interval;

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

use serde::Deserializer as _;

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
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
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
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
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

/// What a JSON function returns for the value it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JsonKind {
    /// HogQL `properties.x`: strings unquoted, other scalars as their JSON text, objects and
    /// arrays as JSON text, `null`/missing as NULL.
    Property,
    /// A property compared with a number: numbers, and strings that parse as numbers; else NULL.
    PropertyNumber,
    /// `JSONExtractString`: the string, else `''`.
    ExtractString,
    /// `JSONExtractInt`: the number truncated to an integer, else 0.
    ExtractInt,
    /// `JSONExtractFloat`: the number, else 0.
    ExtractFloat,
    /// `JSONExtractBool`: the boolean, else false.
    ExtractBool,
    /// `JSONExtractRaw`: the JSON text, else `''`.
    ExtractRaw,
    /// `JSONHas`: whether the path exists.
    Has,
}

impl JsonKind {
    pub const ALL: [JsonKind; 8] = [
        JsonKind::Property,
        JsonKind::PropertyNumber,
        JsonKind::ExtractString,
        JsonKind::ExtractInt,
        JsonKind::ExtractFloat,
        JsonKind::ExtractBool,
        JsonKind::ExtractRaw,
        JsonKind::Has,
    ];

    /// The name the rewritten SQL calls.
    pub fn function_name(self) -> &'static str {
        match self {
            JsonKind::Property => "corvid_prop",
            JsonKind::PropertyNumber => "corvid_prop_num",
            JsonKind::ExtractString => "corvid_json_string",
            JsonKind::ExtractInt => "corvid_json_int",
            JsonKind::ExtractFloat => "corvid_json_float",
            JsonKind::ExtractBool => "corvid_json_bool",
            JsonKind::ExtractRaw => "corvid_json_raw",
            JsonKind::Has => "corvid_json_has",
        }
    }

    fn data_type(self) -> DataType {
        match self {
            JsonKind::Property | JsonKind::ExtractString | JsonKind::ExtractRaw => DataType::Utf8,
            JsonKind::PropertyNumber | JsonKind::ExtractFloat => DataType::Float64,
            JsonKind::ExtractInt => DataType::Int64,
            JsonKind::ExtractBool | JsonKind::Has => DataType::Boolean,
        }
    }
}

/// The value of a property as HogQL shows it (see [`JsonKind::Property`]).
pub fn property_text(raw: &str) -> Option<Cow<'_, str>> {
    match raw.as_bytes().first()? {
        b'"' => serde_json::from_str::<Cow<'_, str>>(raw).ok(),
        b'n' => None,
        _ => Some(Cow::Borrowed(raw)),
    }
}

/// A property read as a number (see [`JsonKind::PropertyNumber`]).
pub fn property_number(raw: &str) -> Option<f64> {
    match raw.as_bytes().first()? {
        b'"' => serde_json::from_str::<Cow<'_, str>>(raw)
            .ok()?
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

#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonFunction {
    kind: JsonKind,
    signature: Signature,
}

impl ScalarUDFImpl for JsonFunction {
    fn name(&self) -> &str {
        self.kind.function_name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        if args.len() < 2 {
            return exec_err!(
                "{} needs a JSON value and at least one key",
                self.kind.function_name()
            );
        }
        Ok(self.kind.data_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let json = as_strings(&arrays[0])?;
        let steps: Vec<StepColumn> = arrays[1..]
            .iter()
            .map(StepColumn::new)
            .collect::<DfResult<_>>()?;
        let rows = args.number_rows;
        let path_at = |row: usize| -> Option<Vec<PathStep<'_>>> {
            steps.iter().map(|s| s.step(row)).collect()
        };
        let found = |row: usize| -> Option<&str> {
            if json.is_null(row) {
                return None;
            }
            json_path(json.value(row), &path_at(row)?)
        };
        let out: ArrayRef = match self.kind {
            JsonKind::Property | JsonKind::ExtractString | JsonKind::ExtractRaw => {
                let mut b = StringBuilder::with_capacity(rows, rows * 8);
                for row in 0..rows {
                    let raw = found(row);
                    match self.kind {
                        JsonKind::Property => b.append_option(raw.and_then(property_text)),
                        JsonKind::ExtractString => b.append_value(
                            raw.filter(|r| r.starts_with('"'))
                                .and_then(property_text)
                                .unwrap_or_default(),
                        ),
                        _ => b.append_value(raw.unwrap_or_default()),
                    }
                }
                Arc::new(b.finish())
            }
            JsonKind::PropertyNumber | JsonKind::ExtractFloat => {
                let mut b = Float64Builder::with_capacity(rows);
                for row in 0..rows {
                    let raw = found(row);
                    if self.kind == JsonKind::PropertyNumber {
                        b.append_option(raw.and_then(property_number));
                    } else {
                        b.append_value(
                            raw.filter(|r| !r.starts_with('"'))
                                .and_then(property_number)
                                .unwrap_or(0.0),
                        );
                    }
                }
                Arc::new(b.finish())
            }
            JsonKind::ExtractInt => {
                let mut b = Int64Builder::with_capacity(rows);
                for row in 0..rows {
                    let n = found(row)
                        .filter(|r| !r.starts_with('"'))
                        .and_then(property_number)
                        .unwrap_or(0.0);
                    b.append_value(n.trunc() as i64);
                }
                Arc::new(b.finish())
            }
            JsonKind::ExtractBool | JsonKind::Has => {
                let mut b = BooleanBuilder::with_capacity(rows);
                for row in 0..rows {
                    let raw = found(row);
                    b.append_value(match self.kind {
                        JsonKind::Has => raw.is_some(),
                        _ => raw == Some("true"),
                    });
                }
                Arc::new(b.finish())
            }
        };
        Ok(ColumnarValue::Array(out))
    }
}

/// A string column as stored (`Utf8` or `Utf8View`), read without copying.
enum Strings {
    Utf8(StringArray),
    View(StringViewArray),
}

impl Strings {
    fn is_null(&self, row: usize) -> bool {
        match self {
            Strings::Utf8(a) => a.is_null(row),
            Strings::View(a) => a.is_null(row),
        }
    }

    fn value(&self, row: usize) -> &str {
        match self {
            Strings::Utf8(a) => a.value(row),
            Strings::View(a) => a.value(row),
        }
    }
}

fn as_strings(array: &ArrayRef) -> DfResult<Strings> {
    if let Some(v) = array.as_any().downcast_ref::<StringViewArray>() {
        return Ok(Strings::View(v.clone()));
    }
    let utf8 = match array.data_type() {
        DataType::Utf8 => Arc::clone(array),
        _ => cast(array, &DataType::Utf8)?,
    };
    match utf8.as_any().downcast_ref::<StringArray>() {
        Some(s) => Ok(Strings::Utf8(s.clone())),
        None => exec_err!("expected a string column"),
    }
}

/// A path argument: integer indexes stay integers, everything else is a key.
enum StepColumn {
    Keys(Strings),
    Indexes(Int64Array),
}

impl StepColumn {
    fn new(array: &ArrayRef) -> DfResult<StepColumn> {
        if array.data_type().is_integer() {
            let ints = cast(array, &DataType::Int64)?;
            if let Some(i) = ints.as_any().downcast_ref::<Int64Array>() {
                return Ok(StepColumn::Indexes(i.clone()));
            }
        }
        Ok(StepColumn::Keys(as_strings(array)?))
    }

    fn step(&self, row: usize) -> Option<PathStep<'_>> {
        match self {
            StepColumn::Keys(k) if !k.is_null(row) => {
                Some(PathStep::Key(Cow::Borrowed(k.value(row))))
            }
            StepColumn::Indexes(i) if !i.is_null(row) => Some(PathStep::Index(i.value(row))),
            _ => None,
        }
    }
}

/// `corvid_bucket(timestamp, unit, timezone)`: the start of the `unit` ("hour", "day", "week"
/// with Sunday starts, "month", or "none" for the instant itself) holding `timestamp`, as a
/// wall-clock time in `timezone`. Insight queries bucket by local time with it: DST-correct,
/// which fixed UTC offsets are not.
#[derive(Debug, PartialEq, Eq, Hash)]
struct LocalBucket {
    signature: Signature,
}

pub const LOCAL_BUCKET: &str = "corvid_bucket";

const QUARTER_HOUR: i64 = 900_000_000;
const HOUR: i64 = 3_600_000_000;
const DAY: i64 = 86_400_000_000;

impl ScalarUDFImpl for LocalBucket {
    fn name(&self) -> &str {
        LOCAL_BUCKET
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Timestamp(TimeUnit::Microsecond, None))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let [ts, unit, tz] = args.args.as_slice() else {
            return exec_err!("{LOCAL_BUCKET} takes (timestamp, unit, timezone)");
        };
        let scalar_text = |v: &ColumnarValue| -> Option<String> {
            match v {
                ColumnarValue::Scalar(s) => s.try_as_str().flatten().map(str::to_string),
                ColumnarValue::Array(_) => None,
            }
        };
        let (Some(unit), Some(tz)) = (scalar_text(unit), scalar_text(tz)) else {
            return exec_err!("{LOCAL_BUCKET}: unit and timezone must be constant strings");
        };
        let interval = match unit.as_str() {
            "hour" => Some(Interval::Hour),
            "day" => Some(Interval::Day),
            "week" => Some(Interval::Week),
            "month" => Some(Interval::Month),
            "none" => None,
            other => return exec_err!("{LOCAL_BUCKET}: unknown unit {other}"),
        };
        let Ok(tz) = tz.parse::<Tz>() else {
            return exec_err!("{LOCAL_BUCKET}: unknown timezone {tz}");
        };
        let micros = cast(
            &ts.to_array(args.number_rows)?,
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        )?;
        let micros = micros.as_primitive::<TimestampMicrosecondType>();
        // Rows come mostly in time order, so the zone offset is looked up once per 15-minute
        // slot (every offset change falls on one) and buckets are integer arithmetic.
        let slot_of = |v: i64| v.div_euclid(QUARTER_HOUR);
        let last = std::cell::Cell::new((i64::MIN, 0i64));
        let out: TimestampMicrosecondArray = micros.unary_opt(|v| {
            let (slot, cached) = last.get();
            let offset = if slot == slot_of(v) {
                cached
            } else {
                let utc = DateTime::<Utc>::from_timestamp_micros(v)?.naive_utc();
                let offset = i64::from(tz.offset_from_utc_datetime(&utc).fix().local_minus_utc())
                    * 1_000_000;
                last.set((slot_of(v), offset));
                offset
            };
            let local = v + offset;
            Some(match interval {
                None => local,
                Some(Interval::Hour) => local - local.rem_euclid(HOUR),
                Some(Interval::Day) => local - local.rem_euclid(DAY),
                Some(Interval::Week) => {
                    // 1970-01-01 was a Thursday: four days after a Sunday.
                    let day = local.div_euclid(DAY);
                    (day - (day + 4).rem_euclid(7)) * DAY
                }
                Some(Interval::Month) => {
                    let t = DateTime::<Utc>::from_timestamp_micros(local)?.naive_utc();
                    Interval::Month.floor(t).and_utc().timestamp_micros()
                }
            })
        });
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// Every Corvid scalar function, for registration in each query's session.
pub fn all() -> Vec<ScalarUDF> {
    let mut out: Vec<ScalarUDF> = JsonKind::ALL
        .into_iter()
        .map(|kind| {
            ScalarUDF::new_from_impl(JsonFunction {
                kind,
                signature: Signature::variadic_any(Volatility::Immutable),
            })
        })
        .collect();
    out.push(ScalarUDF::new_from_impl(LocalBucket {
        signature: Signature::any(3, Volatility::Immutable),
    }));
    out
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
        assert_eq!(property_text("12.5").as_deref(), Some("12.5"));
        assert_eq!(property_text("true").as_deref(), Some("true"));
        assert_eq!(property_text("null"), None);
        assert_eq!(property_number(r#"" 42 ""#), Some(42.0));
        assert_eq!(property_number("1e3"), Some(1000.0));
        assert_eq!(property_number(r#""abc""#), None);
        assert_eq!(property_number("[1]"), None);
    }
}
