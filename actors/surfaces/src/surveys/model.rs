//! A survey as stored, and the commands that create and change one
//! (PostHog's survey API, `PostHog/posthog:posthog/api/survey.py`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

/// How a survey is shown: by the SDK as a popover or a feedback widget, or only through the
/// API (the site renders it itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SurveyType {
    Popover,
    Widget,
    Api,
}

impl SurveyType {
    pub fn parse(text: &str) -> Option<SurveyType> {
        match text {
            "popover" => Some(SurveyType::Popover),
            "widget" => Some(SurveyType::Widget),
            "api" => Some(SurveyType::Api),
            _ => None,
        }
    }
}

/// A stored survey.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Survey {
    pub id: Uuid,
    pub project_id: u64,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(rename = "type")]
    pub kind: SurveyType,
    /// `once`, `recurring` or `always`.
    #[serde(default)]
    pub schedule: Option<String>,
    /// A user flag the SDK checks before showing the survey.
    #[serde(default)]
    pub linked_flag_id: Option<i64>,
    #[serde(default)]
    pub linked_insight_id: Option<i64>,
    /// The flag built from `targeting_flag_filters` (who may see the survey).
    #[serde(default)]
    pub targeting_flag_id: Option<i64>,
    /// The flag that hides the survey from people who dismissed or answered it.
    #[serde(default)]
    pub internal_targeting_flag_id: Option<i64>,
    pub questions: Vec<Value>,
    #[serde(default)]
    pub conditions: Option<Map<String, Value>>,
    #[serde(default)]
    pub appearance: Option<Map<String, Value>>,
    #[serde(default)]
    pub start_date: Option<DateTime<Utc>>,
    #[serde(default)]
    pub end_date: Option<DateTime<Utc>>,
    #[serde(default)]
    pub archived: bool,
    /// Stop the survey after this many responses.
    #[serde(default)]
    pub responses_limit: Option<u64>,
    /// Repeat the survey this many times, every `iteration_frequency_days`.
    #[serde(default)]
    pub iteration_count: Option<u32>,
    #[serde(default)]
    pub iteration_frequency_days: Option<u32>,
    #[serde(default)]
    pub iteration_start_dates: Vec<DateTime<Utc>>,
    #[serde(default)]
    pub current_iteration: Option<u32>,
    #[serde(default)]
    pub current_iteration_start_date: Option<DateTime<Utc>>,
    #[serde(default)]
    pub enable_partial_responses: bool,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub created_by: Option<Value>,
}

impl Survey {
    /// Running: launched and not stopped or archived. The SDK shows only running surveys.
    pub fn is_running(&self) -> bool {
        self.start_date.is_some() && self.end_date.is_none() && !self.archived
    }

    /// Whether the survey repeats in iterations.
    pub fn iterates(&self) -> bool {
        self.iteration_count.is_some_and(|n| n > 0)
    }

    /// The suffix person properties of this survey carry: `{id}` or `{id}/{iteration}`.
    pub fn property_suffix(&self) -> String {
        match (self.iterates(), self.current_iteration) {
            (true, Some(i)) => format!("{}/{i}", self.id),
            _ => self.id.to_string(),
        }
    }
}

/// Fields of a create (`POST`) or update (`PATCH`) body. On create `name`, `type` and
/// `questions` are required; on update every field is optional. `Some(Value::Null)` clears.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurveyChanges {
    pub name: Option<String>,
    pub description: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub schedule: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub linked_flag_id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub linked_insight_id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub targeting_flag_filters: Option<Value>,
    pub remove_targeting_flag: Option<bool>,
    pub questions: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub conditions: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub appearance: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub start_date: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub end_date: Option<Value>,
    pub archived: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    pub responses_limit: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub iteration_count: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub iteration_frequency_days: Option<Value>,
    pub enable_partial_responses: Option<bool>,
    /// Accepted for PostHog compatibility; Corvid has no folders.
    #[serde(rename = "_create_in_folder")]
    pub create_in_folder: Option<Value>,
}

/// Distinguishes an explicit `null` (`Some(Value::Null)`) from an absent field (`None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Ok(Some(Value::deserialize(d)?))
}

/// Counts of one survey event type over a period (`…/stats/`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EventStats {
    pub total_count: u64,
    pub unique_persons: u64,
    pub first_seen: Option<DateTime<Utc>>,
    pub last_seen: Option<DateTime<Utc>>,
    pub unique_persons_only_seen: u64,
    pub total_count_only_seen: u64,
}

/// A survey's statistics, as `GET …/surveys/{id}/stats/` answers them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SurveyStats {
    pub shown: EventStats,
    pub dismissed: EventStats,
    pub sent: EventStats,
}

impl SurveyStats {
    /// Percentages (two decimals) of people or views that answered or dismissed.
    pub fn rates(&self) -> Map<String, Value> {
        let pct = |part: u64, whole: u64| {
            if whole == 0 {
                0.0
            } else {
                (part as f64 * 10000.0 / whole as f64).round() / 100.0
            }
        };
        let mut m = Map::new();
        m.insert(
            "response_rate".into(),
            pct(self.sent.total_count, self.shown.total_count).into(),
        );
        m.insert(
            "dismissal_rate".into(),
            pct(self.dismissed.total_count, self.shown.total_count).into(),
        );
        m.insert(
            "unique_users_response_rate".into(),
            pct(self.sent.unique_persons, self.shown.unique_persons).into(),
        );
        m.insert(
            "unique_users_dismissal_rate".into(),
            pct(self.dismissed.unique_persons, self.shown.unique_persons).into(),
        );
        m
    }
}
