//! Experiment metrics: their definitions (PostHog's `ExperimentMetric` JSON) and the SQL that
//! measures them per variant (as in PostHog).
//!
//! Exposure: a person is exposed to a variant by a `$feature_flag_called` event for the flag
//! (variant from `$feature_flag_response`) or by any event carrying `$feature/<flag key>` (the
//! variant attribution server SDKs send, spec §4.5 rule 1), within the experiment's dates. A
//! person seen in several variants is excluded (`$multiple`) unless the experiment counts the
//! first variant seen (`multiple_variant_handling: first_seen`). Metrics count only events at
//! or after the person's first exposure.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::surface::RecordError;
use corvid_query::{utc_text, Generated};

/// The bucket of people seen in several variants when they are excluded.
pub const MULTIPLE: &str = "$multiple";

/// What a metric measures per exposed person.
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    /// How many times the person did `event`.
    Count { event: String },
    /// The sum of `property` over the person's `event`s.
    Sum { event: String, property: String },
    /// 1 when the person did every step, in order, after exposure; else 0.
    Funnel { steps: Vec<String> },
}

/// A validated metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub measure: Measure,
    /// `goal: decrease`: a lower value wins.
    pub lower_is_better: bool,
}

fn event_of(node: &Value, attr: &'static str) -> Result<String, RecordError> {
    node.get("event")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .ok_or_else(|| RecordError::invalid("Each metric source and step needs an `event`.", attr))
}

/// Parses one metric definition.
pub fn parse(metric: &Value, attr: &'static str) -> Result<Metric, RecordError> {
    let invalid = |detail: &str| RecordError::invalid(detail.to_string(), attr);
    let lower_is_better = metric.get("goal").and_then(Value::as_str) == Some("decrease");
    let measure = match metric.get("metric_type").and_then(Value::as_str) {
        Some("mean") => {
            let source = metric
                .get("source")
                .ok_or_else(|| invalid("A mean metric needs a `source`."))?;
            let event = event_of(source, attr)?;
            match source
                .get("math")
                .and_then(Value::as_str)
                .unwrap_or("total")
            {
                "total" => Measure::Count { event },
                "sum" => {
                    let property = source
                        .get("math_property")
                        .and_then(Value::as_str)
                        .filter(|p| !p.is_empty())
                        .ok_or_else(|| invalid("A sum metric needs a `math_property`."))?;
                    Measure::Sum {
                        event,
                        property: property.to_string(),
                    }
                }
                other => {
                    return Err(invalid(&format!(
                        "Unsupported metric math `{other}`: use total or sum."
                    )))
                }
            }
        }
        Some("funnel") => {
            let series = metric
                .get("series")
                .and_then(Value::as_array)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| invalid("A funnel metric needs a non-empty `series` of steps."))?;
            Measure::Funnel {
                steps: series
                    .iter()
                    .map(|s| event_of(s, attr))
                    .collect::<Result<_, _>>()?,
            }
        }
        Some(other) => {
            return Err(invalid(&format!(
                "Unsupported metric_type `{other}`: use mean or funnel."
            )))
        }
        None => {
            return Err(invalid(
                "Each metric needs a `metric_type` (mean or funnel).",
            ))
        }
    };
    Ok(Metric {
        measure,
        lower_is_better,
    })
}

/// Who was exposed, and when.
#[derive(Debug, Clone)]
pub struct Exposure {
    pub flag_key: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub first_seen_wins: bool,
}

/// The CTEs ending in `assigned (person_id, variant, first_ts)`: one row per exposed person.
fn assigned(sql: &mut Generated, e: &Exposure) -> String {
    let called = sql.bind("$feature_flag_called");
    let flag_prop = sql.bind("$feature_flag");
    let response = sql.bind("$feature_flag_response");
    let feature = sql.bind(format!("$feature/{}", e.flag_key));
    let key = sql.bind(e.flag_key.clone());
    let from = sql.bind(utc_text(e.from));
    let to = sql.bind(utc_text(e.to));
    let multiple = sql.bind(MULTIPLE);
    let exclude = if e.first_seen_wins { "FALSE" } else { "TRUE" };
    format!(
        "exposed AS (SELECT person_id, timestamp, coalesce(CASE WHEN event = {called} \
           THEN corvid_prop(properties, {response}) END, corvid_prop(properties, {feature})) AS variant \
           FROM events WHERE timestamp >= {from} AND timestamp <= {to} AND \
           ((event = {called} AND corvid_prop(properties, {flag_prop}) = {key}) \
            OR corvid_prop(properties, {feature}) IS NOT NULL)), \
         pv AS (SELECT person_id, variant, min(timestamp) AS ts FROM exposed \
           WHERE variant IS NOT NULL GROUP BY person_id, variant), \
         pp AS (SELECT person_id, min(ts) AS first_ts, count(*) AS nvar FROM pv GROUP BY person_id), \
         assigned AS (SELECT pp.person_id AS person_id, \
           CASE WHEN pp.nvar > 1 AND {exclude} THEN {multiple} ELSE min(pv.variant) END AS variant, \
           pp.first_ts AS first_ts FROM pp JOIN pv ON pv.person_id = pp.person_id AND pv.ts = pp.first_ts \
           GROUP BY pp.person_id, pp.nvar, pp.first_ts)"
    )
}

/// SQL answering `(variant, n, sum, sum_squares)` per variant for `metric`, or with no metric
/// just the exposures (`sum` and `sum_squares` zero).
pub fn variant_sql(exposure: &Exposure, metric: Option<&Metric>) -> Generated {
    let mut sql = Generated::default();
    let ctes = assigned(&mut sql, exposure);
    let to = sql.bind(utc_text(exposure.to));
    sql.sql = match metric.map(|m| &m.measure) {
        None => format!(
            "WITH {ctes} SELECT variant, count(*) AS n, CAST(0 AS DOUBLE) AS s, \
             CAST(0 AS DOUBLE) AS ss FROM assigned GROUP BY variant"
        ),
        Some(Measure::Count { event }) | Some(Measure::Sum { event, .. }) => {
            let value = match metric.map(|m| &m.measure) {
                Some(Measure::Sum { property, .. }) => {
                    let p = sql.bind(property.clone());
                    format!("coalesce(corvid_prop_num(e.properties, {p}), CAST(0 AS DOUBLE))")
                }
                _ => "CAST(1 AS DOUBLE)".to_string(),
            };
            let event = sql.bind(event.clone());
            format!(
                "WITH {ctes}, \
                 m AS (SELECT a.person_id, a.variant, \
                   sum(CASE WHEN e.uuid IS NULL THEN CAST(0 AS DOUBLE) ELSE {value} END) AS v \
                   FROM assigned a LEFT JOIN events e ON e.person_id = a.person_id \
                   AND e.event = {event} AND e.timestamp >= a.first_ts AND e.timestamp <= {to} \
                   GROUP BY a.person_id, a.variant) \
                 SELECT variant, count(*) AS n, sum(v) AS s, sum(v * v) AS ss FROM m GROUP BY variant"
            )
        }
        Some(Measure::Funnel { steps }) => {
            let mut ctes = ctes;
            let mut previous = ("assigned", "first_ts");
            let names: Vec<String> = (1..=steps.len()).map(|i| format!("s{i}")).collect();
            for (step, name) in steps.iter().zip(&names) {
                let event = sql.bind(step.clone());
                ctes.push_str(&format!(
                    ", {name} AS (SELECT p.person_id, min(e.timestamp) AS t FROM {prev} p \
                     JOIN events e ON e.person_id = p.person_id AND e.event = {event} \
                     AND e.timestamp >= p.{col} AND e.timestamp <= {to} GROUP BY p.person_id)",
                    prev = previous.0,
                    col = previous.1,
                ));
                previous = (name.as_str(), "t");
            }
            let last = previous.0;
            format!(
                "WITH {ctes} SELECT a.variant, count(*) AS n, \
                 CAST(count({last}.person_id) AS DOUBLE) AS s, \
                 CAST(count({last}.person_id) AS DOUBLE) AS ss \
                 FROM assigned a LEFT JOIN {last} ON {last}.person_id = a.person_id GROUP BY a.variant"
            )
        }
    };
    sql
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn metric_definitions_parse_or_say_what_is_wrong() {
        let mean = parse(
            &json!({"metric_type": "mean", "source": {"kind": "EventsNode", "event": "buy",
                     "math": "sum", "math_property": "amount"}, "goal": "increase"}),
            "metrics",
        )
        .expect("mean");
        assert_eq!(
            mean.measure,
            Measure::Sum {
                event: "buy".into(),
                property: "amount".into()
            }
        );
        let funnel = parse(
            &json!({"metric_type": "funnel", "goal": "decrease",
                     "series": [{"event": "cart"}, {"event": "pay"}]}),
            "metrics",
        )
        .expect("funnel");
        assert!(funnel.lower_is_better);
        for bad in [
            json!({"metric_type": "ratio"}),
            json!({"source": {"event": "x"}}),
            json!({"metric_type": "mean", "source": {"math": "total"}}),
            json!({"metric_type": "mean", "source": {"event": "x", "math": "sum"}}),
            json!({"metric_type": "funnel", "series": []}),
        ] {
            assert!(parse(&bad, "metrics").is_err(), "{bad}");
        }
    }
}
