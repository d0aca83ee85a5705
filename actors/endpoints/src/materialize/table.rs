//! A materialized result loaded in memory, and how a run's variables select from it: filter
//! the variable columns, merge rows again where range variables need it, then apply the
//! query's own ORDER BY / LIMIT / OFFSET. Nothing here reads raw events.

use std::cmp::Ordering;
use std::collections::HashMap;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use chrono::{NaiveDate, NaiveDateTime};
use serde_json::{Map, Value};

use corvid_query::{Aggregate, Op, SqlPlan, VariableFilter, VARIABLE_COLUMN};

/// A stored SQL result: the query's own columns, then one column per variable.
#[derive(Debug)]
pub struct SqlTable {
    pub columns: Vec<String>,
    pub types: Vec<(String, String)>,
    pub rows: Vec<Vec<Value>>,
    /// Per row, the variable columns' values.
    pub variable_cells: Vec<Vec<Value>>,
    /// Whether each variable column holds dates or times.
    variable_is_time: Vec<bool>,
}

impl SqlTable {
    pub fn from_arrow(schema: &SchemaRef, batches: &[RecordBatch]) -> SqlTable {
        let types = corvid_query::result_types(schema);
        let split = types
            .iter()
            .position(|(name, _)| name.starts_with(VARIABLE_COLUMN))
            .unwrap_or(types.len());
        let variable_is_time = types[split..]
            .iter()
            .map(|(_, t)| t.contains("Date"))
            .collect();
        let mut rows = Vec::new();
        let mut variable_cells = Vec::new();
        for mut row in corvid_query::result_rows(batches, usize::MAX) {
            variable_cells.push(row.split_off(split));
            rows.push(row);
        }
        let types: Vec<(String, String)> = types.into_iter().take(split).collect();
        SqlTable {
            columns: types.iter().map(|(n, _)| n.clone()).collect(),
            types,
            rows,
            variable_cells,
            variable_is_time,
        }
    }

    /// The rows `values` (code name → value) select, after the plan's merge and LIMIT/OFFSET.
    pub fn select(&self, plan: &SqlPlan, values: &HashMap<String, Value>) -> Vec<Vec<Value>> {
        let filters: Vec<(&VariableFilter, &Value)> = plan
            .variables
            .iter()
            .filter_map(|(name, f)| values.get(name).map(|v| (f, v)))
            .collect();
        let matching = self
            .rows
            .iter()
            .zip(&self.variable_cells)
            .filter(|(_, cells)| {
                filters.iter().all(|(f, value)| {
                    let time = self
                        .variable_is_time
                        .get(f.column)
                        .copied()
                        .unwrap_or(false);
                    let cell = cells.get(f.column).unwrap_or(&Value::Null);
                    f.ops
                        .iter()
                        .all(|op| matches(cell, *op, value, time, f.bucket_day))
                })
            });
        let mut rows: Vec<Vec<Value>> = match &plan.reaggregate {
            Some(r) => {
                let merged = merge(matching.map(|(row, _)| row), &r.columns);
                sort(merged, &r.order)
            }
            None => matching.map(|(row, _)| row.clone()).collect(),
        };
        if rows.is_empty() {
            if let Some(aggs) = &plan.scalar {
                rows.push(aggs.iter().map(empty_aggregate).collect());
            }
        }
        let rows = rows.into_iter().skip(plan.offset);
        match plan.limit {
            Some(n) => rows.take(n).collect(),
            None => rows.collect(),
        }
    }
}

/// An aggregate over no rows, as the query engine answers it (count 0, others NULL).
fn empty_aggregate(a: &Aggregate) -> Value {
    match a {
        Aggregate::Count
        | Aggregate::Other {
            zero_when_empty: true,
        } => Value::from(0),
        _ => Value::Null,
    }
}

/// `cell op value`, comparing as times, numbers or text as the data suggests.
fn matches(cell: &Value, op: Op, value: &Value, time: bool, bucket_day: bool) -> bool {
    if cell.is_null() || value.is_null() {
        return false;
    }
    let ord = if time {
        match (parse_time(cell), parse_time(value)) {
            (Some(c), Some(mut v)) => {
                if bucket_day {
                    v = v.date().and_hms_opt(0, 0, 0).unwrap_or(v);
                }
                c.cmp(&v)
            }
            _ => return false,
        }
    } else {
        match compare(cell, value) {
            Some(o) => o,
            None => return false,
        }
    };
    match op {
        Op::Eq => ord == Ordering::Equal,
        Op::Gt => ord == Ordering::Greater,
        Op::GtEq => ord != Ordering::Less,
        Op::Lt => ord == Ordering::Less,
        Op::LtEq => ord != Ordering::Greater,
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

/// Numbers numerically (a numeric string counts), everything else as text.
fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    if a.is_number() || b.is_number() {
        return number(a)?.partial_cmp(&number(b)?);
    }
    Some(text(a).cmp(&text(b)))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn parse_time(v: &Value) -> Option<NaiveDateTime> {
    parse_time_text(v.as_str()?)
}

/// A date or time as UTC wall-clock: RFC 3339, `YYYY-MM-DD[ T]HH:MM[:SS[.f]]` or `YYYY-MM-DD`.
pub fn parse_time_text(s: &str) -> Option<NaiveDateTime> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.naive_utc());
    }
    for f in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Some(t);
        }
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
}

/// Folds rows with equal dimension columns, in order of first appearance.
fn merge<'a>(rows: impl Iterator<Item = &'a Vec<Value>>, columns: &[Aggregate]) -> Vec<Vec<Value>> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<Vec<Value>> = Vec::new();
    for row in rows {
        let key: Vec<&Value> = row
            .iter()
            .zip(columns)
            .filter(|(_, a)| **a == Aggregate::Group)
            .map(|(v, _)| v)
            .collect();
        let key = serde_json::to_string(&key).unwrap_or_default();
        match index.get(&key) {
            None => {
                index.insert(key, out.len());
                out.push(row.clone());
            }
            Some(&i) => {
                for (c, agg) in columns.iter().enumerate() {
                    let merged = fold(*agg, &out[i][c], &row[c]);
                    out[i][c] = merged;
                }
            }
        }
    }
    out
}

fn fold(agg: Aggregate, acc: &Value, next: &Value) -> Value {
    if acc.is_null() {
        return next.clone();
    }
    if next.is_null() {
        return acc.clone();
    }
    match agg {
        Aggregate::Count | Aggregate::Sum => match (acc.as_i64(), next.as_i64()) {
            (Some(a), Some(b)) => Value::from(a.saturating_add(b)),
            _ => Value::from(number(acc).unwrap_or(0.0) + number(next).unwrap_or(0.0)),
        },
        Aggregate::Min => pick(acc, next, Ordering::Less),
        Aggregate::Max => pick(acc, next, Ordering::Greater),
        Aggregate::Group | Aggregate::Other { .. } => acc.clone(),
    }
}

fn pick(acc: &Value, next: &Value, want: Ordering) -> Value {
    if compare(next, acc) == Some(want) {
        next.clone()
    } else {
        acc.clone()
    }
}

fn sort(mut rows: Vec<Vec<Value>>, order: &[(usize, bool)]) -> Vec<Vec<Value>> {
    if order.is_empty() {
        return rows;
    }
    rows.sort_by(|a, b| {
        for (col, desc) in order {
            let o = match (&a[*col], &b[*col]) {
                (Value::Null, Value::Null) => Ordering::Equal,
                (Value::Null, _) => Ordering::Greater,
                (_, Value::Null) => Ordering::Less,
                (x, y) => compare(x, y).unwrap_or(Ordering::Equal),
            };
            let o = if *desc { o.reverse() } else { o };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    });
    rows
}

/// A stored insight result: one JSON object (series or cohort) per row.
#[derive(Debug)]
pub struct InsightTable {
    pub items: Vec<Value>,
}

impl InsightTable {
    pub const COLUMN: &'static str = "result";

    pub fn from_arrow(batches: &[RecordBatch]) -> InsightTable {
        let items = corvid_query::result_rows(batches, usize::MAX)
            .into_iter()
            .filter_map(|row| row.into_iter().next())
            .filter_map(|cell| cell.as_str().and_then(|s| serde_json::from_str(s).ok()))
            .collect();
        InsightTable { items }
    }

    /// The series or cohorts whose breakdown values equal every given one (`breakdowns` is the
    /// endpoint's breakdown order; `''` selects the "no value" bucket).
    pub fn select(&self, breakdowns: &[String], values: &Map<String, Value>) -> Vec<Value> {
        self.items
            .iter()
            .filter(|item| {
                breakdowns.iter().enumerate().all(|(i, property)| {
                    let Some(wanted) = values.get(property) else {
                        return true;
                    };
                    let actual = match item.get("breakdown_value") {
                        Some(Value::Array(list)) => list.get(i).cloned().unwrap_or(Value::Null),
                        Some(v) => v.clone(),
                        None => Value::Null,
                    };
                    breakdown_matches(&actual, wanted)
                })
            })
            .cloned()
            .collect()
    }
}

fn breakdown_matches(actual: &Value, wanted: &Value) -> bool {
    let wanted = text(wanted);
    match actual {
        Value::Null => wanted.is_empty(),
        Value::String(s) if s == corvid_query::BREAKDOWN_NULL => wanted.is_empty(),
        other => text(other) == wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_query::{materialization_plan as plan, MaterializationPlan as Plan};
    use serde_json::json;

    fn sql_plan(q: &str) -> SqlPlan {
        match plan(&json!({"kind": "HogQLQuery", "query": q})).expect("eligible") {
            Plan::Sql(p) => p,
            Plan::Insight { .. } => panic!("sql"),
        }
    }

    fn table(rows: Vec<Value>, vars: Vec<Value>, time: bool) -> SqlTable {
        let rows: Vec<Vec<Value>> = rows
            .into_iter()
            .map(|r| r.as_array().cloned().unwrap_or_default())
            .collect();
        SqlTable {
            columns: vec!["event".into(), "c".into()],
            types: vec![],
            variable_cells: vars.into_iter().map(|v| vec![v]).collect(),
            variable_is_time: vec![time],
            rows,
        }
    }

    #[test]
    fn range_variables_merge_matching_days_and_reorder() {
        let p = sql_plan("SELECT event, count() AS c FROM events WHERE timestamp >= {variables.from} GROUP BY event ORDER BY c DESC");
        let t = table(
            vec![
                json!(["a", 5]),
                json!(["b", 4]),
                json!(["b", 3]),
                json!(["a", 1]),
            ],
            vec![
                json!("2024-01-01T00:00:00Z"),
                json!("2024-01-01T00:00:00Z"),
                json!("2024-01-02T00:00:00Z"),
                json!("2024-01-03T00:00:00Z"),
            ],
            true,
        );
        let pick = |from: &str| t.select(&p, &HashMap::from([("from".to_string(), json!(from))]));
        assert_eq!(
            pick("2024-01-01"),
            vec![vec![json!("b"), json!(7)], vec![json!("a"), json!(6)]]
        );
        // The value's day counts whole: 12:00 on the 2nd still includes the 2nd's bucket.
        assert_eq!(
            pick("2024-01-02 12:00:00"),
            vec![vec![json!("b"), json!(3)], vec![json!("a"), json!(1)]]
        );
        assert!(pick("2024-02-01").is_empty());
    }

    #[test]
    fn scalar_queries_answer_one_row_even_when_nothing_matches() {
        let p = sql_plan("SELECT count() AS c FROM events WHERE event = {variables.ev}");
        let t = SqlTable {
            columns: vec!["c".into()],
            types: vec![],
            rows: vec![vec![json!(3)]],
            variable_cells: vec![vec![json!("signup")]],
            variable_is_time: vec![false],
        };
        let pick = |ev: &str| t.select(&p, &HashMap::from([("ev".to_string(), json!(ev))]));
        assert_eq!(pick("signup"), vec![vec![json!(3)]]);
        assert_eq!(pick("other"), vec![vec![json!(0)]]);
    }

    #[test]
    fn numbers_compare_numerically() {
        assert!(matches(&json!(10), Op::Gt, &json!("9"), false, false));
        assert!(matches(&json!("b"), Op::Gt, &json!("a"), false, false));
        assert!(!matches(&json!(null), Op::Eq, &json!(null), false, false));
    }

    #[test]
    fn insight_items_are_picked_by_breakdown_value() {
        let t = InsightTable {
            items: vec![
                json!({"breakdown_value": ["Chrome", "Mac"], "data": [1]}),
                json!({"breakdown_value": ["Chrome", corvid_query::BREAKDOWN_NULL], "data": [2]}),
                json!({"breakdown_value": ["Safari", "Mac"], "data": [3]}),
            ],
        };
        let b = vec!["$browser".to_string(), "$os".to_string()];
        let pick = |v: Value| t.select(&b, v.as_object().expect("object"));
        assert_eq!(pick(json!({"$browser": "Chrome", "$os": "Mac"})).len(), 1);
        assert_eq!(
            pick(json!({"$browser": "Chrome", "$os": ""}))[0]["data"],
            json!([2])
        );
        assert_eq!(pick(json!({"$browser": "Chrome"})).len(), 2);
    }
}
