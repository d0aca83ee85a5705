//! What an endpoint is: a named query with immutable versions, each with its own freshness and
//! materialization; and the project's insight variables its SQL may reference.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// Accepted `data_freshness_seconds` values and their sync labels (PostHog Gen-2).
pub const FRESHNESS_CHOICES: [(u64, &str); 7] = [
    (900, "15min"),
    (1800, "30min"),
    (3600, "1hour"),
    (21600, "6hour"),
    (43200, "12hour"),
    (86400, "24hour"),
    (604800, "7day"),
];

/// Freshness of a new endpoint (24 hours).
pub const DEFAULT_FRESHNESS_SECONDS: u64 = 86400;

/// The sync label (`"24hour"`) of a freshness value.
pub fn sync_frequency(seconds: u64) -> &'static str {
    FRESHNESS_CHOICES
        .iter()
        .find(|(s, _)| *s == seconds)
        .map(|(_, label)| *label)
        .unwrap_or("24hour")
}

/// The freshness value of a sync label.
pub fn freshness_of_sync_frequency(label: &str) -> Option<u64> {
    FRESHNESS_CHOICES
        .iter()
        .find(|(_, l)| *l == label)
        .map(|(s, _)| *s)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: Uuid,
    pub project_id: u64,
    pub name: String,
    pub is_active: bool,
    pub current_version: u32,
    #[serde(default)]
    pub derived_from_insight: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default)]
    pub created_by: Option<String>,
    #[serde(default)]
    pub last_executed_at: Option<DateTime<Utc>>,
    /// Oldest first; `versions[n - 1].version == n`.
    pub versions: Vec<EndpointVersion>,
}

impl Endpoint {
    /// The version a run without `version` uses: the newest.
    pub fn latest(&self) -> Option<&EndpointVersion> {
        self.versions.iter().max_by_key(|v| v.version)
    }

    pub fn version(&self, n: u32) -> Option<&EndpointVersion> {
        self.versions.iter().find(|v| v.version == n)
    }

    pub fn version_mut(&mut self, n: u32) -> Option<&mut EndpointVersion> {
        self.versions.iter_mut().find(|v| v.version == n)
    }

    /// `/api/environments/{project}/endpoints/{name}/run`.
    pub fn path(&self) -> String {
        format!(
            "/api/environments/{}/endpoints/{}/run",
            self.project_id, self.name
        )
    }
}

/// An immutable query snapshot. Only its activity, description, freshness and materialization
/// change after creation; a changed query makes a new version.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EndpointVersion {
    pub id: Uuid,
    pub version: u32,
    pub query: Value,
    #[serde(default)]
    pub description: String,
    pub data_freshness_seconds: u64,
    pub is_active: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default)]
    pub last_executed_at: Option<DateTime<Utc>>,
    /// Present while materialization is enabled for this version.
    #[serde(default)]
    pub materialization: Option<Materialization>,
}

impl EndpointVersion {
    pub fn kind(&self) -> &str {
        self.query
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn is_hogql(&self) -> bool {
        self.kind() == "HogQLQuery"
    }

    pub fn is_materialized(&self) -> bool {
        self.materialization.is_some()
    }
}

/// Where a materialization stands (PostHog's saved-query statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MaterializationStatus {
    /// Enabled; the first run has not finished yet.
    Running,
    Completed,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Materialization {
    pub status: MaterializationStatus,
    /// When the stored result was computed.
    #[serde(default)]
    pub last_run_at: Option<DateTime<Utc>>,
    /// Why the last run failed.
    #[serde(default)]
    pub error: Option<String>,
    /// Object-store key of the Arrow IPC result of the last successful run.
    #[serde(default)]
    pub object_key: Option<String>,
    /// When the materializer last started a run (to schedule the next one).
    #[serde(default)]
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// Runs that failed (or were cut short) in a row since the last success: the retry waits
    /// grow with it, and versions that keep failing are run after the others.
    #[serde(default)]
    pub failures: u32,
}

impl Materialization {
    pub fn pending() -> Materialization {
        Materialization {
            status: MaterializationStatus::Running,
            last_run_at: None,
            error: None,
            object_key: None,
            last_attempt_at: None,
            failures: 0,
        }
    }
}

/// Types an insight variable can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VariableType {
    String,
    Number,
    Boolean,
    List,
    Date,
}

/// A project's variable definition, referenced from SQL as `{variables.<code_name>}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InsightVariable {
    pub id: Uuid,
    pub project_id: u64,
    pub name: String,
    pub code_name: String,
    #[serde(rename = "type")]
    pub kind: VariableType,
    #[serde(default)]
    pub default_value: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// PostHog derives a code name from the display name: lower case, words joined by `_`.
pub fn code_name_from(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') && !out.is_empty() {
            out.push('_');
        }
    }
    out.trim_end_matches('_').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_follow_the_display_name() {
        assert_eq!(code_name_from("Customer ID"), "customer_id");
        assert_eq!(code_name_from("  Start date! "), "start_date");
    }

    #[test]
    fn freshness_labels_round_trip() {
        for (secs, label) in FRESHNESS_CHOICES {
            assert_eq!(sync_frequency(secs), label);
            assert_eq!(freshness_of_sync_frequency(label), Some(secs));
        }
    }
}
