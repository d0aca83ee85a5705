//! Arrow record batches → the JSON rows, column names and ClickHouse-style type names PostHog
//! clients read.

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Number, Value};

/// The ClickHouse name of an Arrow type (what PostHog's `types` lists).
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Null => "Nullable(Nothing)".into(),
        DataType::Boolean => "Bool".into(),
        DataType::Int8 => "Int8".into(),
        DataType::Int16 => "Int16".into(),
        DataType::Int32 => "Int32".into(),
        DataType::Int64 => "Int64".into(),
        DataType::UInt8 => "UInt8".into(),
        DataType::UInt16 => "UInt16".into(),
        DataType::UInt32 => "UInt32".into(),
        DataType::UInt64 => "UInt64".into(),
        DataType::Float16 | DataType::Float32 => "Float32".into(),
        DataType::Float64 | DataType::Decimal128(..) | DataType::Decimal256(..) => "Float64".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "String".into(),
        DataType::Date32 | DataType::Date64 => "Date".into(),
        DataType::Timestamp(unit, _) => {
            let digits = match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            };
            format!("DateTime64({digits}, 'UTC')")
        }
        DataType::List(f) | DataType::LargeList(f) => {
            format!("Array({})", type_name(f.data_type()))
        }
        other => other.to_string(),
    }
}

fn float(f: f64) -> Value {
    Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn timestamp(micros: i64) -> Value {
    DateTime::<Utc>::from_timestamp_micros(micros)
        .map(|t| Value::String(t.to_rfc3339_opts(SecondsFormat::AutoSi, true)))
        .unwrap_or(Value::Null)
}

/// One cell as JSON.
pub fn cell(array: &ArrayRef, row: usize) -> Value {
    if array.is_null(row) {
        return Value::Null;
    }
    macro_rules! int {
        ($t:ty) => {
            Value::from(array.as_primitive::<$t>().value(row))
        };
    }
    match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float32 => float(f64::from(array.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => Value::String(array.as_string::<i32>().value(row).to_string()),
        DataType::LargeUtf8 => Value::String(array.as_string::<i64>().value(row).to_string()),
        DataType::Utf8View => Value::String(array.as_string_view().value(row).to_string()),
        DataType::Date32 => {
            let days = array.as_primitive::<Date32Type>().value(row);
            chrono::NaiveDate::from_num_days_from_ce_opt(days + 719_163)
                .map(|d| Value::String(d.format("%Y-%m-%d").to_string()))
                .unwrap_or(Value::Null)
        }
        DataType::Timestamp(unit, _) => {
            let micros = match unit {
                TimeUnit::Second => array
                    .as_primitive::<TimestampSecondType>()
                    .value(row)
                    .saturating_mul(1_000_000),
                TimeUnit::Millisecond => array
                    .as_primitive::<TimestampMillisecondType>()
                    .value(row)
                    .saturating_mul(1_000),
                TimeUnit::Microsecond => {
                    array.as_primitive::<TimestampMicrosecondType>().value(row)
                }
                TimeUnit::Nanosecond => array
                    .as_primitive::<TimestampNanosecondType>()
                    .value(row)
                    .div_euclid(1_000),
            };
            timestamp(micros)
        }
        DataType::List(_) => {
            let list = array.as_list::<i32>().value(row);
            Value::Array((0..list.len()).map(|i| cell(&list, i)).collect())
        }
        DataType::Decimal128(..) | DataType::Decimal256(..) | DataType::Float16 => {
            formatted(array, row)
                .parse::<f64>()
                .map(float)
                .unwrap_or(Value::Null)
        }
        _ => Value::String(formatted(array, row)),
    }
}

fn formatted(array: &ArrayRef, row: usize) -> String {
    ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default())
        .map(|f| f.value(row).to_string())
        .unwrap_or_default()
}

/// `[name, ClickHouse type]` per column of `schema`.
pub fn types(schema: &arrow::datatypes::Schema) -> Vec<(String, String)> {
    schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), type_name(f.data_type())))
        .collect()
}

/// Every row of `batches` as JSON arrays, at most `max` rows.
pub fn rows(batches: &[RecordBatch], max: usize) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            if out.len() == max {
                return out;
            }
            out.push(batch.columns().iter().map(|c| cell(c, row)).collect());
        }
    }
    out
}
