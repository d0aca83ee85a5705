//! Domain records of the metadata store. Field names follow PostHog's API where one exists, so
//! the service can serialize them with little reshaping.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Organization {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// Monthly `/flags` request quota across the organization's projects; `None` = unlimited.
    #[serde(default)]
    pub feature_flag_request_quota: Option<u64>,
}

/// A project ("team" in PostHog's internals): the unit of data isolation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Project {
    pub id: u64,
    pub uuid: Uuid,
    pub organization_id: Uuid,
    pub name: String,
    /// The public project token (`phc_…`) SDKs send with events and flag requests.
    pub api_token: String,
    /// IANA time zone used to bucket dates in insights.
    pub timezone: String,
    /// When true, capture does not record the client IP (`$ip`).
    #[serde(default)]
    pub anonymize_ips: bool,
    pub created_at: DateTime<Utc>,
    /// Events whose day is more than this many days before today (UTC) are dropped; `None`:
    /// the instance's default (`lifecycle.event_retention_days`; unset keeps everything).
    #[serde(default)]
    pub event_retention_days: Option<u32>,
    /// What browser SDKs are told to do (remote config). Stored and shown flat, with PostHog's
    /// field names.
    #[serde(flatten)]
    pub settings: ProjectSettings,
}

/// A project's SDK settings, served to browsers as remote config (PostHog's team fields).
/// Records written before a field existed read its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProjectSettings {
    /// Autocapture of clicks and page interactions is off.
    pub autocapture_opt_out: bool,
    /// Uncaught exceptions are captured as `$exception` events.
    pub autocapture_exceptions_opt_in: bool,
    /// Network timing is captured with page views.
    pub capture_performance_opt_in: bool,
    /// Web vitals are captured.
    pub autocapture_web_vitals_opt_in: bool,
    /// Heatmap data is captured.
    pub heatmaps_opt_in: bool,
    /// Dead clicks are captured.
    pub capture_dead_clicks: bool,
    /// Surveys are shown (when the project has running surveys).
    pub surveys_opt_in: bool,
    /// Session recordings are requested. Corvid does not store recordings, so this stays
    /// false (remote config always answers `sessionRecording: false`).
    pub session_recording_opt_in: bool,
    /// Browsers create person profiles only for identified users (`person_profiles:
    /// identified_only`) unless the site says otherwise.
    pub default_identified_only: bool,
}

impl Default for ProjectSettings {
    fn default() -> Self {
        ProjectSettings {
            autocapture_opt_out: false,
            autocapture_exceptions_opt_in: false,
            capture_performance_opt_in: false,
            autocapture_web_vitals_opt_in: false,
            heatmaps_opt_in: false,
            capture_dead_clicks: false,
            surveys_opt_in: true,
            session_recording_opt_in: false,
            default_identified_only: true,
        }
    }
}

/// A partial update of a project (`PATCH /api/projects/{id}/`): every field optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectUpdate {
    pub name: Option<String>,
    pub timezone: Option<String>,
    pub anonymize_ips: Option<bool>,
    pub autocapture_opt_out: Option<bool>,
    pub autocapture_exceptions_opt_in: Option<bool>,
    pub capture_performance_opt_in: Option<bool>,
    pub autocapture_web_vitals_opt_in: Option<bool>,
    pub heatmaps_opt_in: Option<bool>,
    pub capture_dead_clicks: Option<bool>,
    pub surveys_opt_in: Option<bool>,
    pub session_recording_opt_in: Option<bool>,
    pub default_identified_only: Option<bool>,
    /// `Some(None)`: `null` was sent (back to the instance's default).
    #[serde(default, deserialize_with = "present")]
    pub event_retention_days: Option<Option<u32>>,
}

/// A field that may be sent as `null`: `Some(None)` then, `None` when absent.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u32>>, D::Error> {
    Option::<u32>::deserialize(d).map(Some)
}

/// What a caller supplies to create a project.
#[derive(Debug, Clone)]
pub struct NewProject {
    pub organization_id: Uuid,
    pub name: String,
    pub timezone: String,
    pub anonymize_ips: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct User {
    pub id: u64,
    pub uuid: Uuid,
    pub email: String,
    pub first_name: String,
    /// argon2id PHC string; never leaves the store layer in an API response.
    pub password_hash: String,
    pub organization_id: Uuid,
    /// Instance administrators may use admin-only APIs (e.g. verifying OAuth clients).
    pub is_staff: bool,
    pub created_at: DateTime<Utc>,
    /// The user's level in their organization. Users stored before levels existed were
    /// all administrators of everything: they read as owners.
    #[serde(default = "Level::owner")]
    pub level: Level,
    /// A deactivated user cannot sign in, and their keys, tokens and sessions are refused.
    #[serde(default = "active")]
    pub is_active: bool,
    #[serde(default)]
    pub deactivated_at: Option<DateTime<Utc>>,
}

fn active() -> bool {
    true
}

/// A member's level in their organization, with PostHog's numbers: members use the projects;
/// admins also manage members and invites; owners also make owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "u8", try_from = "u8")]
pub enum Level {
    Member,
    Admin,
    Owner,
}

impl Level {
    pub fn owner() -> Level {
        Level::Owner
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Member => "member",
            Level::Admin => "admin",
            Level::Owner => "owner",
        }
    }
}

impl From<Level> for u8 {
    fn from(level: Level) -> u8 {
        match level {
            Level::Member => 1,
            Level::Admin => 8,
            Level::Owner => 15,
        }
    }
}

impl TryFrom<u8> for Level {
    type Error = String;
    fn try_from(n: u8) -> Result<Level, String> {
        match n {
            1 => Ok(Level::Member),
            8 => Ok(Level::Admin),
            15 => Ok(Level::Owner),
            other => Err(format!(
                "{other} is not a level (1 member, 8 admin, 15 owner)"
            )),
        }
    }
}

/// An invitation to join an organization: whoever opens its link before it expires sets a
/// password and becomes a user with the invite's email and level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invite {
    /// Random (v4): the link's secret.
    pub id: Uuid,
    pub organization_id: Uuid,
    pub target_email: String,
    pub first_name: String,
    pub level: Level,
    pub message: Option<String>,
    /// The inviting user's id.
    pub created_by: u64,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// A personal API key. The secret itself is never stored: only its SHA-256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersonalApiKey {
    pub id: String,
    pub user_id: u64,
    pub label: String,
    pub secure_value_sha256: String,
    /// `phx_...abcd`, for recognising a key in a list.
    pub mask_value: String,
    /// Scope strings as given (`*` or `<object>:read|write`), validated on creation.
    pub scopes: Vec<String>,
    /// When set, the key may only touch these projects.
    #[serde(default)]
    pub scoped_teams: Option<Vec<u64>>,
    /// When set, the key may only touch projects of these organizations.
    #[serde(default)]
    pub scoped_organizations: Option<Vec<Uuid>>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// What a caller supplies to create a personal API key.
#[derive(Debug, Clone)]
pub struct NewPersonalApiKey {
    pub user_id: u64,
    pub label: String,
    pub scopes: Vec<String>,
    pub scoped_teams: Option<Vec<u64>>,
    pub scoped_organizations: Option<Vec<Uuid>>,
}
