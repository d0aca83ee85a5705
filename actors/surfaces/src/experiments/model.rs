//! Experiments and holdouts as stored, and the commands that change them
//! (PostHog's experiment API).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use corvid_flags::Variant;

/// Where an experiment is in its life, derived from its dates and the paused mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Draft,
    Running,
    Paused,
    Stopped,
}

impl Status {
    /// The status in a sentence ("an experiment that is …").
    pub fn describe(self) -> &'static str {
        match self {
            Status::Draft => "a draft",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "ended",
        }
    }

    /// Parses a list filter (`complete` is PostHog's other name for stopped); `None` for `all`.
    pub fn parse_filter(text: &str) -> Result<Option<Status>, String> {
        match text {
            "draft" => Ok(Some(Status::Draft)),
            "running" => Ok(Some(Status::Running)),
            "paused" => Ok(Some(Status::Paused)),
            "stopped" | "complete" => Ok(Some(Status::Stopped)),
            "all" => Ok(None),
            other => Err(format!(
                "\"{other}\" is not a valid status. Use draft, running, paused, stopped, complete or all."
            )),
        }
    }
}

/// A stored experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Experiment {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub feature_flag_key: String,
    pub feature_flag_id: i64,
    /// The variant split; the first is `control`.
    pub variants: Vec<Variant>,
    /// Other `parameters` fields PostHog clients send (minimum detectable effect, …), kept.
    #[serde(default)]
    pub parameters_extra: serde_json::Map<String, Value>,
    #[serde(default)]
    pub holdout_id: Option<u64>,
    #[serde(default)]
    pub metrics: Vec<Value>,
    #[serde(default)]
    pub metrics_secondary: Vec<Value>,
    #[serde(default)]
    pub exposure_criteria: Option<Value>,
    #[serde(default)]
    pub stats_config: Option<Value>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub start_date: Option<DateTime<Utc>>,
    #[serde(default)]
    pub end_date: Option<DateTime<Utc>>,
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub archived: bool,
    #[serde(default)]
    pub deleted: bool,
    #[serde(default)]
    pub conclusion: Option<String>,
    #[serde(default)]
    pub conclusion_comment: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default)]
    pub created_by: Option<Value>,
}

impl Experiment {
    pub fn status(&self) -> Status {
        match (self.start_date, self.end_date, self.paused) {
            (None, _, _) => Status::Draft,
            (Some(_), Some(_), _) => Status::Stopped,
            (Some(_), None, true) => Status::Paused,
            (Some(_), None, false) => Status::Running,
        }
    }

    /// How people seen in several variants count: `exclude` (default) or `first_seen`.
    pub fn first_seen_wins(&self) -> bool {
        self.exposure_criteria
            .as_ref()
            .and_then(|c| c.get("multiple_variant_handling"))
            .and_then(Value::as_str)
            == Some("first_seen")
    }
}

/// A create or update body; on create `name` and `feature_flag_key` are required.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentChanges {
    pub name: Option<String>,
    pub description: Option<String>,
    pub feature_flag_key: Option<String>,
    pub parameters: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub holdout_id: Option<Value>,
    pub metrics: Option<Vec<Value>>,
    pub metrics_secondary: Option<Vec<Value>>,
    pub saved_metrics_ids: Option<Value>,
    pub exposure_criteria: Option<Value>,
    pub stats_config: Option<Value>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub filters: Option<Value>,
    pub archived: Option<bool>,
    pub deleted: Option<bool>,
    pub conclusion: Option<String>,
    pub conclusion_comment: Option<String>,
    /// Accepted for PostHog compatibility; Corvid has no folders.
    #[serde(rename = "_create_in_folder")]
    pub create_in_folder: Option<Value>,
}

/// Distinguishes an explicit `null` from an absent field.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Ok(Some(Value::deserialize(d)?))
}

/// A lifecycle action (`POST …/experiments/{id}/<action>/`).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Launch,
    Pause,
    Resume,
    End {
        conclusion: Option<String>,
        comment: Option<String>,
    },
    ShipVariant {
        variant: String,
        release_to_everyone: bool,
        conclusion: Option<String>,
        comment: Option<String>,
    },
    Archive,
    Unarchive,
}

/// A holdout: a share of people kept out of every experiment that uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holdout {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The share of people held out, 0–100.
    pub exclusion_percentage: f64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Holdout {
    /// The variant held-out people get on every flag of the holdout's experiments.
    pub fn variant(&self) -> String {
        format!("holdout-{}", self.id)
    }

    /// PostHog's `filters` shape: one group whose rollout is the held-out share.
    pub fn filters(&self) -> Value {
        serde_json::json!([{
            "properties": [],
            "rollout_percentage": self.exclusion_percentage,
            "variant": self.variant(),
        }])
    }
}

/// A holdout create or update body.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldoutChanges {
    pub name: Option<String>,
    pub description: Option<String>,
    /// `[{properties: [], rollout_percentage: N, variant?}]`: N is the held-out share.
    pub filters: Option<Value>,
}
