//! An experiment's results: exposures per variant, and each metric per variant with the
//! Bayesian comparison of every test variant (and the holdout) against control.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::bayes::{self, MetricKind, Sample};
use super::metrics::{self, Exposure, Measure, Metric, MULTIPLE};
use super::ExperimentView;
use crate::surface::RecordError;
use corvid_query::QueryEngine;

/// The default credible level (PostHog's `ci_level`).
const LEVEL: f64 = 0.95;

/// One variant's numbers for one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantNumbers {
    pub key: String,
    pub number_of_samples: u64,
    pub sum: f64,
    pub sum_squares: f64,
    /// Mean per exposed person (conversion rate, for a funnel).
    pub mean: f64,
    /// Against control; absent for control itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chance_to_win: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credible_interval: Option<[f64; 2]>,
    /// Relative lift over control.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effect: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub significant: Option<bool>,
    /// Why no comparison could be made (too little data, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One metric's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricResult {
    pub metric: Value,
    pub metric_type: &'static str,
    pub baseline: VariantNumbers,
    pub variant_results: Vec<VariantNumbers>,
}

/// What `GET …/experiments/{id}/results/` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExperimentResults {
    pub experiment_id: u64,
    pub feature_flag_key: String,
    pub status: super::Status,
    pub start_date: Option<DateTime<Utc>>,
    pub end_date: Option<DateTime<Utc>>,
    /// Exposed people per variant (people seen in several variants under `$multiple` when
    /// they are excluded).
    pub exposures: BTreeMap<String, u64>,
    pub stats_method: &'static str,
    pub credible_level: f64,
    pub metrics: Vec<MetricResult>,
    pub secondary_metrics: Vec<MetricResult>,
}

fn number(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// Rows `(variant, n, sum, sum_squares)` → samples by variant.
fn samples(rows: &[Vec<Value>]) -> BTreeMap<String, Sample> {
    rows.iter()
        .filter_map(|row| match row.as_slice() {
            [variant, n, s, ss] => Some((
                variant.as_str()?.to_string(),
                Sample {
                    n: n.as_u64().unwrap_or(0),
                    sum: number(s),
                    sum_squares: number(ss),
                },
            )),
            _ => None,
        })
        .collect()
}

fn numbers(key: &str, s: Sample) -> VariantNumbers {
    VariantNumbers {
        key: key.to_string(),
        number_of_samples: s.n,
        sum: s.sum,
        sum_squares: s.sum_squares,
        mean: if s.n == 0 { 0.0 } else { s.sum / s.n as f64 },
        chance_to_win: None,
        credible_interval: None,
        effect: None,
        significant: None,
        error: None,
    }
}

pub(super) async fn compute(
    engine: &QueryEngine,
    project: u64,
    view: &ExperimentView,
    now: DateTime<Utc>,
) -> Result<ExperimentResults, RecordError> {
    let e = &view.experiment;
    let mut results = ExperimentResults {
        experiment_id: e.id,
        feature_flag_key: e.feature_flag_key.clone(),
        status: e.status(),
        start_date: e.start_date,
        end_date: e.end_date,
        exposures: BTreeMap::new(),
        stats_method: "bayesian",
        credible_level: LEVEL,
        metrics: Vec::new(),
        secondary_metrics: Vec::new(),
    };
    let Some(from) = e.start_date else {
        return Ok(results);
    };
    let exposure = Exposure {
        flag_key: e.feature_flag_key.clone(),
        from,
        to: e.end_date.unwrap_or(now),
        first_seen_wins: e.first_seen_wins(),
    };
    let out = engine
        .generated(project, &metrics::variant_sql(&exposure, None))
        .await?;
    results.exposures = samples(&out.rows)
        .into_iter()
        .map(|(k, s)| (k, s.n))
        .collect();
    // Compared arms: the experiment's variants, then its holdout.
    let mut arms: Vec<String> = e.variants.iter().map(|v| v.key.clone()).collect();
    if let Some(h) = &view.holdout {
        arms.push(h.variant());
    }
    for (list, out) in [
        (&e.metrics, &mut results.metrics),
        (&e.metrics_secondary, &mut results.secondary_metrics),
    ] {
        for definition in list {
            let metric = metrics::parse(definition, "metrics")?;
            let rows = engine
                .generated(project, &metrics::variant_sql(&exposure, Some(&metric)))
                .await?
                .rows;
            out.push(metric_result(definition, &metric, &samples(&rows), &arms));
        }
    }
    Ok(results)
}

fn metric_result(
    definition: &Value,
    metric: &Metric,
    by_variant: &BTreeMap<String, Sample>,
    arms: &[String],
) -> MetricResult {
    let (kind, metric_type) = match metric.measure {
        Measure::Funnel { .. } => (MetricKind::Funnel, "funnel"),
        _ => (MetricKind::Mean, "mean"),
    };
    let empty = Sample {
        n: 0,
        sum: 0.0,
        sum_squares: 0.0,
    };
    let sample = |key: &str| by_variant.get(key).copied().unwrap_or(empty);
    let control_key = arms.first().map(String::as_str).unwrap_or("control");
    let control = sample(control_key);
    let variant_results = arms
        .iter()
        .skip(1)
        .filter(|k| k.as_str() != MULTIPLE)
        .map(|key| {
            let test = sample(key);
            let mut n = numbers(key, test);
            match bayes::compare(kind, &control, &test, LEVEL, metric.lower_is_better) {
                Ok(c) => {
                    n.chance_to_win = Some(c.chance_to_win);
                    n.credible_interval = Some(c.credible_interval);
                    n.effect = Some(c.effect);
                    n.significant = Some(c.significant);
                }
                Err(why) => n.error = Some(why.to_string()),
            }
            n
        })
        .collect();
    MetricResult {
        metric: definition.clone(),
        metric_type,
        baseline: numbers(control_key, control),
        variant_results,
    }
}
