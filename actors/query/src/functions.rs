//! Scalar functions HogQL needs that DataFusion lacks: reading fields out of the JSON text of
//! `properties` / `person_properties`.
//!
//! Each row's JSON is scanned once per call and only the requested path is materialised: the
//! scanner skips every other value without building it, which is what keeps `properties.$x`
//! cheap enough for analytics over millions of rows.

use std::borrow::Cow;
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

use super::insights::dates::Interval;
use corvid_kernel::json::{json_path, property_number, property_text, PathStep};

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
