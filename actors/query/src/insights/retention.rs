//! `RetentionQuery`: of the actors who did the target event in a period (a cohort), how many
//! came back with the returning event k periods later. Compiles to one SQL statement; cohort
//! and interval indexes are assigned here from local period starts.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDateTime, Utc};
use chrono_tz::Tz;
use serde::Deserialize;
use serde_json::{json, Value};

use super::dates::{self, Interval};
use super::filters::{properties_sql, property_expr, Properties};
use super::trends::BreakdownFilter;
use super::{DateRangeSpec, BREAKDOWN_NULL, BREAKDOWN_OTHER};
use crate::hogql::Generated;
use crate::QueryError;

#[derive(Debug, Clone, Deserialize)]
pub struct RetentionQuery {
    #[serde(rename = "retentionFilter", default)]
    pub retention_filter: RetentionFilter,
    #[serde(rename = "dateRange", default)]
    pub date_range: DateRangeSpec,
    #[serde(default)]
    pub properties: Properties,
    #[serde(rename = "breakdownFilter", default)]
    pub breakdown_filter: Option<BreakdownFilter>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RetentionFilter {
    pub period: Option<String>,
    pub total_intervals: Option<usize>,
    pub target_entity: Option<Entity>,
    pub returning_entity: Option<Entity>,
    pub retention_type: Option<String>,
    pub minimum_occurrences: Option<u32>,
    pub cumulative: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Entity {
    pub id: Option<Value>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub properties: Properties,
}

/// Default number of cohorts (PostHog's current schema default).
pub const DEFAULT_TOTAL_INTERVALS: usize = 8;
/// Most cohorts one query may ask for.
pub const MAX_TOTAL_INTERVALS: usize = 400;

#[derive(Debug)]
pub struct RetentionPlan {
    pub sql: Generated,
    period_name: &'static str,
    cohorts: Vec<NaiveDateTime>,
    tz: Tz,
    breakdown: bool,
    breakdown_limit: usize,
    cumulative: bool,
}

fn entity_condition(sql: &mut Generated, e: Option<&Entity>) -> Result<String, QueryError> {
    let (event, props) = match e {
        None => (Some("$pageview".to_string()), Properties::default()),
        Some(e) => {
            if e.kind.as_deref().is_some_and(|k| k != "events") {
                return Err(QueryError::InvalidInsight(
                    "Only events entities are supported for retention.".into(),
                ));
            }
            let event = match &e.id {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(other) => Some(other.to_string()),
            };
            (event, e.properties.clone())
        }
    };
    let event = match event {
        Some(name) => format!("event = {}", sql.bind(name)),
        None => "TRUE".into(),
    };
    Ok(format!("({event} AND {})", properties_sql(sql, &props)?))
}

pub fn compile(
    query: RetentionQuery,
    tz: Tz,
    now: DateTime<Utc>,
) -> Result<RetentionPlan, QueryError> {
    let f = &query.retention_filter;
    let (period, period_name) = match f.period.as_deref().unwrap_or("Day") {
        "Hour" => (Interval::Hour, "Hour"),
        "Day" => (Interval::Day, "Day"),
        "Week" => (Interval::Week, "Week"),
        "Month" => (Interval::Month, "Month"),
        other => {
            return Err(QueryError::InvalidInsight(format!(
                "Unknown retention period '{other}' (Hour, Day, Week or Month)."
            )))
        }
    };
    let n = f.total_intervals.unwrap_or(DEFAULT_TOTAL_INTERVALS);
    if n == 0 || n > MAX_TOTAL_INTERVALS {
        return Err(QueryError::InvalidInsight(format!(
            "totalIntervals must be between 1 and {MAX_TOTAL_INTERVALS}."
        )));
    }
    // The last cohort is the period holding date_to; the first is n − 1 periods before it.
    let to = dates::resolve(
        query.date_range.date_to.as_deref(),
        query.date_range.date_to.as_deref(),
        period,
        tz,
        now,
        None,
    )?;
    let last = period.floor(to.to_local);
    let out_of_range =
        || QueryError::InvalidInsight("The retention range is out of the range of dates.".into());
    let mut cohorts = vec![last];
    let mut first = last;
    while cohorts.len() < n {
        first = previous(period, first).ok_or_else(out_of_range)?;
        cohorts.insert(0, first);
    }
    let from_local = first;
    let end_local = period.next(last).ok_or_else(out_of_range)?;
    let from = dates::to_utc(tz, from_local);
    let end = dates::to_utc(tz, end_local);

    let mut sql = Generated::default();
    let tz_name = sql.bind(tz.name());
    let unit = sql.bind(period.unit());
    let target = entity_condition(&mut sql, f.target_entity.as_ref())?;
    let returning = entity_condition(&mut sql, f.returning_entity.as_ref())?;
    let global = properties_sql(&mut sql, &query.properties)?;
    let (from_b, end_b) = (
        sql.bind(dates::utc_text(from)),
        sql.bind(dates::utc_text(end)),
    );
    let breakdown = query.breakdown_filter.clone().unwrap_or_default();
    let breakdowns = breakdown.list()?;
    if breakdowns.len() > 1 {
        return Err(QueryError::InvalidInsight(
            "Retention supports one breakdown.".into(),
        ));
    }
    let null = sql.bind(BREAKDOWN_NULL);
    let bd = match breakdowns.first() {
        Some((property, kind)) => {
            let expr = property_expr(&mut sql, kind.as_deref(), property)?;
            format!("coalesce(nullif({expr}, ''), {null})")
        }
        None => null.clone(),
    };
    let bucket = format!("corvid_bucket(timestamp, {unit}, {tz_name})");
    let first_time = f.retention_type.as_deref() == Some("retention_first_time");
    let starts = if first_time {
        // The period of each actor's first target event ever, kept when inside the range.
        let from_local = sql.bind(from_local.format("%Y-%m-%d %H:%M:%S").to_string());
        format!(
            "te AS (SELECT person_id, timestamp, {bd} AS b FROM events WHERE timestamp < {end_b} AND {target} AND {global}), \
             firsts AS (SELECT person_id, min(timestamp) AS first_ts FROM te GROUP BY person_id), \
             starts AS (SELECT f.person_id, corvid_bucket(f.first_ts, {unit}, {tz_name}) AS start_p, min(te.b) AS b \
               FROM firsts f JOIN te ON te.person_id = f.person_id AND te.timestamp = f.first_ts \
               WHERE corvid_bucket(f.first_ts, {unit}, {tz_name}) >= CAST({from_local} AS TIMESTAMP) GROUP BY f.person_id, f.first_ts)"
        )
    } else {
        "starts AS (SELECT person_id, p AS start_p, min(b) AS b FROM e WHERE is_target GROUP BY person_id, p)".to_string()
    };
    let occurrences = f.minimum_occurrences.unwrap_or(1).max(1);
    let cumulative = f.cumulative.unwrap_or(false);
    let returned = if cumulative {
        "SELECT b, start_p, max_p AS p, count(*) AS c FROM (SELECT s.person_id, s.b, s.start_p, max(r.p) AS max_p FROM starts s JOIN returns r ON r.person_id = s.person_id AND r.p > s.start_p GROUP BY s.person_id, s.b, s.start_p) GROUP BY b, start_p, max_p"
    } else {
        "SELECT s.b AS b, s.start_p AS start_p, r.p AS p, count(DISTINCT s.person_id) AS c FROM starts s JOIN returns r ON r.person_id = s.person_id AND r.p > s.start_p GROUP BY s.b, s.start_p, r.p"
    };
    sql.sql = format!(
        "WITH e AS (SELECT person_id, {bucket} AS p, {target} AS is_target, {returning} AS is_return, {bd} AS b \
           FROM events WHERE timestamp >= {from_b} AND timestamp < {end_b} AND ({target} OR {returning}) AND {global}), \
         {starts}, \
         returns AS (SELECT person_id, p FROM e WHERE is_return GROUP BY person_id, p HAVING count(*) >= {occurrences}) \
         SELECT b, start_p, start_p AS p, count(DISTINCT person_id) AS c FROM starts GROUP BY b, start_p \
         UNION ALL {returned}"
    );
    Ok(RetentionPlan {
        sql,
        period_name,
        cohorts,
        tz,
        breakdown: !breakdowns.is_empty(),
        breakdown_limit: breakdown.limit(),
        cumulative,
    })
}

/// The start of the period before the one starting at `t`; `None` past chrono's range.
fn previous(period: Interval, t: NaiveDateTime) -> Option<NaiveDateTime> {
    use corvid_kernel::time::sub;
    match period {
        Interval::Hour => sub(t, chrono::TimeDelta::hours(1)),
        Interval::Day => sub(t, chrono::TimeDelta::days(1)),
        Interval::Week => sub(t, chrono::TimeDelta::weeks(1)),
        Interval::Month => {
            sub(t, chrono::TimeDelta::days(1)).map(|prev| Interval::Month.floor(prev))
        }
    }
}

fn period_key(v: &Value) -> Option<NaiveDateTime> {
    DateTime::parse_from_rfc3339(v.as_str()?)
        .ok()
        .map(|d| d.naive_utc())
}

/// Rows `b, start_p, p, c` → PostHog's cohorts, ordered by breakdown then cohort.
pub fn shape(plan: &RetentionPlan, rows: &[Vec<Value>]) -> (Vec<Value>, bool) {
    let n = plan.cohorts.len();
    let index: HashMap<NaiveDateTime, usize> = plan
        .cohorts
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, i))
        .collect();
    // breakdown → cohort → counts per k.
    let mut table: BTreeMap<String, Vec<Vec<f64>>> = BTreeMap::new();
    for row in rows {
        let b = row[0].as_str().unwrap_or(BREAKDOWN_NULL).to_string();
        let (Some(start), Some(p)) = (
            period_key(&row[1]).and_then(|s| index.get(&s).copied()),
            period_key(&row[2]).and_then(|p| index.get(&p).copied()),
        ) else {
            continue;
        };
        if p < start {
            continue;
        }
        let count = row[3].as_f64().unwrap_or(0.0);
        let cohorts = table
            .entry(b)
            .or_insert_with(|| (0..n).map(|i| vec![0.0; n - i]).collect());
        let k = p - start;
        if plan.cumulative && k > 0 {
            let last = k.min(n - start - 1);
            for slot in cohorts[start].iter_mut().take(last + 1).skip(1) {
                *slot += count;
            }
        } else if k < n - start {
            cohorts[start][k] += count;
        }
    }
    if !plan.breakdown && table.is_empty() {
        table.insert(
            BREAKDOWN_NULL.to_string(),
            (0..n).map(|i| vec![0.0; n - i]).collect(),
        );
    }
    // Rank breakdown values by the size of their period-0 cohorts; the rest become Other.
    let mut ranked: Vec<(String, Vec<Vec<f64>>)> = table.into_iter().collect();
    ranked.sort_by(|a, b| {
        let size = |t: &Vec<Vec<f64>>| t.iter().map(|c| c[0]).sum::<f64>();
        size(&b.1)
            .partial_cmp(&size(&a.1))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.0.cmp(&b.0))
    });
    let mut has_more = false;
    if plan.breakdown && ranked.len() > plan.breakdown_limit {
        has_more = true;
        let rest = ranked.split_off(plan.breakdown_limit);
        let mut other: Vec<Vec<f64>> = (0..n).map(|i| vec![0.0; n - i]).collect();
        for (_, t) in rest {
            for (c, row) in t.iter().enumerate() {
                for (k, v) in row.iter().enumerate() {
                    other[c][k] += v;
                }
            }
        }
        ranked.push((BREAKDOWN_OTHER.to_string(), other));
    }
    let mut out = Vec::new();
    for (b, cohorts) in ranked {
        for (i, values) in cohorts.iter().enumerate() {
            let date = dates::to_utc(plan.tz, plan.cohorts[i])
                .with_timezone(&plan.tz)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let mut item = json!({
                "date": date,
                "label": format!("{} {i}", plan.period_name),
                "values": values.iter().enumerate().map(|(k, c)| json!({
                    "count": *c as u64,
                    "label": format!("{} {k}", plan.period_name),
                })).collect::<Vec<_>>(),
            });
            if plan.breakdown {
                item["breakdown_value"] = json!(b);
            }
            out.push(item);
        }
    }
    (out, has_more)
}
