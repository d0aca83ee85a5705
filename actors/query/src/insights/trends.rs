//! `TrendsQuery`: series of events aggregated per interval, optionally broken down by event or
//! person properties. Compiles to one SQL statement (one CTE per series, `UNION ALL`), then
//! zero-fills buckets and shapes PostHog's series objects.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDateTime, Utc};
use chrono_tz::Tz;
use serde::Deserialize;
use serde_json::{json, Value};

use super::dates::{self, Interval, ResolvedRange};
use super::filters::{properties_sql, property_expr, Properties};
use super::{DateRangeSpec, BREAKDOWN_NULL, BREAKDOWN_OTHER};
use crate::hogql::Generated;
use crate::QueryError;

#[derive(Debug, Clone, Deserialize)]
pub struct TrendsQuery {
    #[serde(default)]
    pub series: Vec<SeriesNode>,
    #[serde(default)]
    pub interval: Interval,
    #[serde(rename = "dateRange", default)]
    pub date_range: DateRangeSpec,
    #[serde(default)]
    pub properties: Properties,
    #[serde(rename = "breakdownFilter", default)]
    pub breakdown_filter: Option<BreakdownFilter>,
    #[serde(rename = "trendsFilter", default)]
    pub trends_filter: Option<TrendsFilter>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct TrendsFilter {
    pub display: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SeriesNode {
    pub kind: Option<String>,
    pub event: Option<String>,
    pub name: Option<String>,
    pub custom_name: Option<String>,
    pub math: Option<String>,
    pub math_property: Option<String>,
    #[serde(default)]
    pub properties: Properties,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct BreakdownFilter {
    pub breakdown: Option<Value>,
    pub breakdown_type: Option<String>,
    pub breakdowns: Option<Vec<Breakdown>>,
    pub breakdown_limit: Option<usize>,
    pub breakdown_hide_other_aggregation: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Breakdown {
    pub property: Value,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
}

/// PostHog's default number of breakdown values kept before "Other".
pub const DEFAULT_BREAKDOWN_LIMIT: usize = 25;

impl BreakdownFilter {
    /// `(property, type)` of every breakdown, from `breakdowns` or the legacy `breakdown`.
    pub fn list(&self) -> Result<Vec<(String, Option<String>)>, QueryError> {
        let text = |v: &Value| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            _ => Err(QueryError::InvalidInsight(
                "A breakdown property must be a string.".into(),
            )),
        };
        if let Some(list) = &self.breakdowns {
            return list
                .iter()
                .map(|b| Ok((text(&b.property)?, b.kind.clone())))
                .collect();
        }
        match &self.breakdown {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| Ok((text(v)?, self.breakdown_type.clone())))
                .collect(),
            Some(v) => Ok(vec![(text(v)?, self.breakdown_type.clone())]),
        }
    }

    pub fn limit(&self) -> usize {
        self.breakdown_limit
            .unwrap_or(DEFAULT_BREAKDOWN_LIMIT)
            .max(1)
    }
}

/// Displays that show one number per series instead of a time series.
const TOTAL_VALUE_DISPLAYS: [&str; 6] = [
    "ActionsTable",
    "ActionsPie",
    "ActionsBarValue",
    "WorldMap",
    "BoldNumber",
    "CalendarHeatmap",
];

/// Everything needed to shape the rows the SQL returns.
#[derive(Debug)]
pub struct TrendsPlan {
    pub sql: Generated,
    query: TrendsQuery,
    interval: Interval,
    range: ResolvedRange,
    breakdowns: usize,
    total_value: bool,
    hide_other: bool,
}

fn math_aggregate(math: Option<&str>, property: Option<&str>) -> Result<String, QueryError> {
    let needs_property = || {
        if property.is_none() {
            Err(QueryError::InvalidInsight(format!(
                "math {} needs math_property.",
                math.unwrap_or_default()
            )))
        } else {
            Ok(())
        }
    };
    Ok(match math.unwrap_or("total") {
        "total" => "count(*)".into(),
        "dau" | "weekly_active" | "monthly_active" => "count(DISTINCT person_id)".into(),
        "unique_session" => "count(DISTINCT session_id)".into(),
        m @ ("sum" | "avg" | "min" | "max") => {
            needs_property()?;
            format!("coalesce({m}(v), 0)")
        }
        m @ ("median" | "p75" | "p90" | "p95" | "p99") => {
            needs_property()?;
            let q = match m {
                "median" => 0.5,
                "p75" => 0.75,
                "p90" => 0.9,
                "p95" => 0.95,
                _ => 0.99,
            };
            format!("coalesce(percentile_cont(v, {q}), 0)")
        }
        other => {
            return Err(QueryError::InvalidInsight(format!(
                "Unsupported math '{other}'."
            )))
        }
    })
}

/// WAU/MAU window in days, when the math is an active-users window the interval does not
/// already cover (weekly_active on weeks or monthly_active on months is plain `dau`).
fn active_window(math: Option<&str>, interval: Interval) -> Option<i64> {
    match (math, interval) {
        (Some("weekly_active"), Interval::Hour | Interval::Day) => Some(7),
        (Some("monthly_active"), Interval::Hour | Interval::Day | Interval::Week) => Some(30),
        _ => None,
    }
}

fn local_text(t: NaiveDateTime) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// Compiles `query` for a project in timezone `tz`.
pub fn compile(query: TrendsQuery, tz: Tz, now: DateTime<Utc>) -> Result<TrendsPlan, QueryError> {
    if query.series.is_empty() {
        return Err(QueryError::InvalidInsight(
            "A TrendsQuery needs at least one series.".into(),
        ));
    }
    let display = query
        .trends_filter
        .as_ref()
        .and_then(|f| f.display.as_deref())
        .unwrap_or("ActionsLineGraph");
    let total_value = TOTAL_VALUE_DISPLAYS.contains(&display);
    let interval = if total_value {
        Interval::Day
    } else {
        query.interval
    };
    let range = dates::resolve(
        query.date_range.date_from.as_deref(),
        query.date_range.date_to.as_deref(),
        interval,
        tz,
        now,
        None,
    )?;
    let breakdown = query.breakdown_filter.clone().unwrap_or_default();
    let breakdowns = breakdown.list()?;
    let mut sql = Generated::default();
    let tz_name = sql.bind(tz.name());
    let unit = sql.bind(interval.unit());
    let global = properties_sql(&mut sql, &query.properties)?;
    let null = sql.bind(BREAKDOWN_NULL);
    let other = sql.bind(BREAKDOWN_OTHER);
    let bcols: Vec<String> = (0..breakdowns.len()).map(|j| format!("b{j}")).collect();
    let mut ctes = Vec::new();
    let mut selects = Vec::new();
    for (i, node) in query.series.iter().enumerate() {
        if node.kind.as_deref().is_some_and(|k| k != "EventsNode") {
            return Err(QueryError::InvalidInsight(format!(
                "Series kind {} is not supported; use EventsNode.",
                node.kind.as_deref().unwrap_or_default()
            )));
        }
        let math = node.math.as_deref();
        let aggregate = math_aggregate(math, node.math_property.as_deref())?;
        let window = active_window(math, interval).filter(|_| !total_value);
        let from = match window {
            Some(days) => chrono::TimeDelta::try_days(days)
                .and_then(|d| corvid_kernel::time::sub(range.from, d))
                .unwrap_or(range.from),
            None => range.from,
        };
        let (from, to) = (
            sql.bind(dates::utc_text(from)),
            sql.bind(dates::utc_text(range.to)),
        );
        let event = match &node.event {
            Some(e) => format!("event = {}", sql.bind(e.clone())),
            None => "TRUE".into(),
        };
        let own = properties_sql(&mut sql, &node.properties)?;
        let value = match &node.math_property {
            Some(p) if aggregate.contains("(v") => {
                format!("corvid_prop_num(properties, {})", sql.bind(p.clone()))
            }
            _ => "CAST(NULL AS DOUBLE)".into(),
        };
        let bucket = if total_value {
            "CAST(NULL AS TIMESTAMP)".to_string()
        } else {
            format!("corvid_bucket(timestamp, {unit}, {tz_name})")
        };
        let local_ts = match window {
            Some(_) => format!("corvid_bucket(timestamp, 'none', {tz_name})"),
            None => "CAST(NULL AS TIMESTAMP)".into(),
        };
        let mut base_cols = vec![
            format!("{bucket} AS bucket"),
            format!("{local_ts} AS local_ts"),
            "person_id".into(),
            "\"$session_id\" AS session_id".into(),
            format!("{value} AS v"),
        ];
        for (j, (property, kind)) in breakdowns.iter().enumerate() {
            let expr = property_expr(&mut sql, kind.as_deref(), property)?;
            base_cols.push(format!("coalesce(nullif({expr}, ''), {null}) AS b{j}"));
        }
        ctes.push(format!(
            "s{i} AS (SELECT {} FROM events WHERE timestamp >= {from} AND timestamp <= {to} AND {event} AND {global} AND {own})",
            base_cols.join(", ")
        ));
        // Additive maths over breakdowns aggregate once per (bucket, value) and fold the tail
        // of values into "Other" from those partial results: one scan of the events.
        let combine = match math.unwrap_or("total") {
            "total" | "sum" => Some("sum"),
            "min" => Some("min"),
            "max" => Some("max"),
            _ => None,
        };
        if let (Some(combine), false, None) = (combine, breakdowns.is_empty(), window) {
            // DataFusion inlines a CTE wherever it is named, so the ranking reads the partial
            // results through window functions over `a{i}` instead of joining `a{i}` to an
            // aggregate of itself (which would scan the events twice). A breakdown value's
            // rank orders by its total count, then by value: `dense_rank` over that key
            // numbers distinct values 1, 2, … exactly as `row_number` over the values would.
            let list = bcols.join(", ");
            let ranked: Vec<String> = bcols
                .iter()
                .map(|c| {
                    format!(
                        "CASE WHEN rn <= {} THEN {c} ELSE {other} END AS r{c}",
                        breakdown.limit()
                    )
                })
                .collect();
            let out_b: Vec<String> = bcols.iter().map(|c| format!("r{c}")).collect();
            ctes.push(format!(
                "a{i} AS (SELECT bucket, {list}, {aggregate} AS value, count(*) AS n FROM s{i} GROUP BY bucket, {list})"
            ));
            ctes.push(format!(
                "w{i} AS (SELECT bucket, {list}, value, sum(n) OVER (PARTITION BY {list}) AS total FROM a{i})"
            ));
            ctes.push(format!(
                "t{i} AS (SELECT bucket, {list}, value, dense_rank() OVER (ORDER BY total DESC, {list}) AS rn FROM w{i})"
            ));
            selects.push(format!(
                "SELECT {i} AS series, bucket, {}, CAST({combine}(value) AS DOUBLE) AS value \
                 FROM t{i} GROUP BY bucket, {}",
                ranked.join(", "),
                out_b.join(", ")
            ));
            continue;
        }
        let source = if breakdowns.is_empty() {
            format!("s{i}")
        } else {
            let list = bcols.join(", ");
            let on = bcols
                .iter()
                .map(|c| format!("s{i}.{c} = t{i}.{c}"))
                .collect::<Vec<_>>()
                .join(" AND ");
            let ranked = bcols
                .iter()
                .map(|c| {
                    format!(
                        "CASE WHEN t{i}.rn <= {} THEN s{i}.{c} ELSE {other} END AS r{c}",
                        breakdown.limit()
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            ctes.push(format!(
                "t{i} AS (SELECT {list}, row_number() OVER (ORDER BY count(*) DESC, {list}) AS rn FROM s{i} GROUP BY {list})"
            ));
            ctes.push(format!(
                "r{i} AS (SELECT s{i}.bucket, s{i}.local_ts, s{i}.person_id, s{i}.session_id, s{i}.v, {ranked} FROM s{i} JOIN t{i} ON {on})"
            ));
            format!("r{i}")
        };
        let out_b: Vec<String> = bcols.iter().map(|c| format!("r{c}")).collect();
        let group_b = if out_b.is_empty() {
            String::new()
        } else {
            format!(", {}", out_b.join(", "))
        };
        match window {
            None => selects.push(format!(
                "SELECT {i} AS series, bucket{group_b}, CAST({aggregate} AS DOUBLE) AS value FROM {source} GROUP BY bucket{group_b}"
            )),
            Some(days) => {
                let buckets = range.buckets(interval);
                let rows = buckets
                    .iter()
                    .map(|b| {
                        let start = sql.bind(local_text(*b));
                        // The last bucket of chrono's range ends with it.
                        let end = sql.bind(local_text(interval.next(*b).unwrap_or(*b)));
                        format!("(CAST({start} AS TIMESTAMP), CAST({end} AS TIMESTAMP))")
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let qualified_b = out_b
                    .iter()
                    .map(|c| format!(", src.{c}"))
                    .collect::<String>();
                selects.push(format!(
                    "SELECT {i} AS series, bk.bucket AS bucket{qualified_b}, CAST(count(DISTINCT src.person_id) AS DOUBLE) AS value \
                     FROM (VALUES {rows}) AS bk(bucket, bucket_end) JOIN {source} src \
                     ON src.local_ts >= bk.bucket_end - INTERVAL {days} DAY AND src.local_ts < bk.bucket_end \
                     GROUP BY bk.bucket{qualified_b}"
                ));
            }
        }
    }
    sql.sql = format!(
        "WITH {} SELECT * FROM ({}) ORDER BY series, bucket",
        ctes.join(", "),
        selects.join(" UNION ALL ")
    );
    Ok(TrendsPlan {
        sql,
        interval,
        range,
        breakdowns: breakdowns.len(),
        total_value,
        hide_other: breakdown.breakdown_hide_other_aggregation.unwrap_or(false),
        query,
    })
}

fn bucket_key(v: &Value) -> Option<NaiveDateTime> {
    let s = v.as_str()?;
    DateTime::parse_from_rfc3339(s).ok().map(|d| d.naive_utc())
}

/// Shapes the SQL rows (`series, bucket, b0…, value`) into PostHog's series objects.
/// Returns `(results, has_more)`; `has_more` is true when an "Other" bucket exists.
pub fn shape(plan: &TrendsPlan, rows: &[Vec<Value>]) -> (Vec<Value>, bool) {
    let buckets = plan.range.buckets(plan.interval);
    let index: BTreeMap<NaiveDateTime, usize> =
        buckets.iter().enumerate().map(|(i, b)| (*b, i)).collect();
    // (series, breakdown values) → per-bucket data.
    let mut grouped: BTreeMap<(usize, Vec<String>), Vec<f64>> = BTreeMap::new();
    let mut has_other = false;
    for row in rows {
        let series = row.first().and_then(Value::as_u64).unwrap_or(0) as usize;
        let values: Vec<String> = row[2..2 + plan.breakdowns]
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect();
        if values.iter().any(|v| v == BREAKDOWN_OTHER) {
            has_other = true;
            if plan.hide_other {
                continue;
            }
        }
        let value = row.last().and_then(Value::as_f64).unwrap_or(0.0);
        let slots = if plan.total_value { 1 } else { buckets.len() };
        let data = grouped
            .entry((series, values))
            .or_insert_with(|| vec![0.0; slots]);
        if plan.total_value {
            data[0] += value;
        } else if let Some(i) = bucket_key(&row[1]).and_then(|b| index.get(&b)) {
            data[*i] += value;
        }
    }
    // Series without any row still appear (all zeros) when there is no breakdown.
    if plan.breakdowns == 0 {
        for i in 0..plan.query.series.len() {
            grouped
                .entry((i, Vec::new()))
                .or_insert_with(|| vec![0.0; if plan.total_value { 1 } else { buckets.len() }]);
        }
    }
    let days: Vec<String> = buckets
        .iter()
        .map(|b| dates::day(*b, plan.interval))
        .collect();
    let labels: Vec<String> = buckets
        .iter()
        .map(|b| dates::label(*b, plan.interval))
        .collect();
    let many_series = plan.query.series.len() > 1;
    // (series, is "Other", count, label, item)
    let mut out: Vec<(usize, bool, f64, String, Value)> = Vec::new();
    for ((series, values), data) in grouped {
        let other = values.iter().any(|v| v == BREAKDOWN_OTHER);
        let node = &plan.query.series[series];
        let name = node.event.clone().unwrap_or_else(|| "All events".into());
        let count: f64 = data.iter().sum();
        let breakdown_value = match values.len() {
            0 => None,
            1 => Some(Value::String(values[0].clone())),
            _ => Some(json!(values)),
        };
        let label = match values.len() {
            0 => name.clone(),
            _ if many_series => format!("{name} - {}", values.join("::")),
            _ => values.join("::"),
        };
        let action = json!({
            "id": node.event,
            "type": "events",
            "order": series,
            "name": name,
            "custom_name": node.custom_name,
            "math": node.math.clone().unwrap_or_else(|| "total".into()),
            "math_property": node.math_property,
            "days": days,
        });
        let mut item = json!({
            "label": label,
            "count": number(count),
            "action": action,
        });
        if plan.total_value {
            item["data"] = json!([]);
            item["aggregated_value"] = number(count);
            item["days"] = json!([]);
            item["labels"] = json!([]);
        } else {
            item["data"] = Value::Array(data.iter().map(|v| number(*v)).collect());
            item["labels"] = json!(labels);
            item["days"] = json!(days);
        }
        if let Some(b) = breakdown_value {
            item["breakdown_value"] = b;
        }
        out.push((series, other, count, label, item));
    }
    // Within a series: largest first, ties by label; "Other" (the folded tail) always last.
    out.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1.cmp(&b.1))
            .then(b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal))
            .then(a.3.cmp(&b.3))
    });
    (out.into_iter().map(|(.., item)| item).collect(), has_other)
}

/// Whole numbers print as integers (PostHog's counts are ints), others as floats.
fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}
