//! How an experiment (and a holdout) is shown: its record with its flag and holdout resolved.

use serde_json::{json, Value};

use super::model::{Experiment, Holdout};
use corvid_flags::FlagRecord;

/// An experiment with its flag and holdout, ready to render.
#[derive(Debug, Clone)]
pub struct ExperimentView {
    pub experiment: Experiment,
    pub flag: Option<FlagRecord>,
    pub holdout: Option<Holdout>,
}

pub(super) fn holdout_json(h: &Holdout) -> Value {
    json!({
        "id": h.id,
        "name": h.name,
        "description": h.description,
        "filters": h.filters(),
        "created_at": h.created_at,
        "updated_at": h.updated_at,
        "created_by": null,
    })
}

impl Holdout {
    /// The API's shape.
    pub fn to_json(&self) -> Value {
        holdout_json(self)
    }
}

impl ExperimentView {
    /// The API's shape.
    pub fn to_json(&self) -> Value {
        let e = &self.experiment;
        let mut parameters = e.parameters_extra.clone();
        parameters.insert("feature_flag_variants".into(), json!(e.variants));
        json!({
            "id": e.id,
            "name": e.name,
            "description": e.description,
            "start_date": e.start_date,
            "end_date": e.end_date,
            "feature_flag_key": e.feature_flag_key,
            "feature_flag": self.flag.as_ref().map(FlagRecord::summary),
            "holdout": self.holdout.as_ref().map(holdout_json),
            "holdout_id": e.holdout_id,
            "parameters": parameters,
            "metrics": e.metrics,
            "metrics_secondary": e.metrics_secondary,
            "saved_metrics": [],
            "filters": {},
            "exposure_criteria": e.exposure_criteria,
            "stats_config": e.stats_config,
            "type": e.kind.as_deref().unwrap_or("product"),
            "status": e.status(),
            "archived": e.archived,
            "deleted": e.deleted,
            "conclusion": e.conclusion,
            "conclusion_comment": e.conclusion_comment,
            "created_at": e.created_at,
            "updated_at": e.updated_at,
            "created_by": e.created_by,
        })
    }
}

pub(super) const CONTROL: &str = "control";
