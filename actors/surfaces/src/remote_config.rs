//! Remote config (as in PostHog): what the browser SDK fetches at start-up
//! from `/array/{token}/config` (JSON) or `/array/{token}/config.js` (a script that fills
//! `window._POSTHOG_REMOTE_CONFIG`), built from the project's SDK settings, whether it has
//! active flags and whether it has running surveys. `/flags?config=true` reports the same
//! values.
//!
//! [`RemoteConfig`] is the one door; [`build`] is the pure rule, unit-tested.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::surface::RecordError;
use crate::surveys::Surveys;
use corvid_flags::OwnedFlags;
use corvid_kernel::blocking;
use corvid_tenancy::Project;

/// The capture path the SDK is told to send events to (served by Corvid's capture).
pub const ANALYTICS_ENDPOINT: &str = "/i/v0/e/";
/// Longest token the remote-config routes accept.
const MAX_TOKEN_LEN: usize = 200;

/// What the remote config of one project is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The project has at least one active flag.
    pub has_flags: bool,
    /// The project has at least one running survey.
    pub surveys_running: bool,
}

/// A project's remote config.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigDoc {
    token: String,
    config: Map<String, Value>,
}

impl ConfigDoc {
    /// The JSON body of `/array/{token}/config`.
    pub fn json(&self) -> Value {
        Value::Object(self.config.clone())
    }

    /// The body of `/array/{token}/config.js`: fills `window._POSTHOG_REMOTE_CONFIG[token]`.
    pub fn script(&self) -> String {
        let mut config = self.config.clone();
        config.remove("siteApps");
        // The token is checked to be `[A-Za-z0-9_-]`, and `<\/` keeps any `</script>` inert.
        let config = Value::Object(config).to_string().replace("</", "<\\/");
        format!(
            "(function() {{\n  window._POSTHOG_REMOTE_CONFIG = window._POSTHOG_REMOTE_CONFIG || {{}};\n  \
             window._POSTHOG_REMOTE_CONFIG['{token}'] = {{\n    config: {config},\n    siteApps: []\n  }};\n}})();\n",
            token = self.token
        )
    }

    /// What `/flags?config=true` adds to a flags response: the same settings plus the legacy
    /// `/decide` fields, as the members of a JSON object without its braces.
    pub fn flags_members(&self) -> String {
        let mut config = self.config.clone();
        config.remove("token");
        let collect_everything = !config
            .get("autocapture_opt_out")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        config.insert(
            "config".into(),
            json!({"enable_collect_everything": collect_everything}),
        );
        config.insert("toolbarParams".into(), json!({}));
        config.insert("isAuthenticated".into(), json!(false));
        // Flags answers also name lz64, as PostHog's `/decide` did: older SDKs that cannot
        // gzip pick it, and capture decodes it.
        config.insert(
            "supportedCompression".into(),
            json!(["gzip", "gzip-js", "lz64"]),
        );
        let text = Value::Object(config).to_string();
        text.strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .unwrap_or_default()
            .to_string()
    }
}

/// The config for `project` given the facts about it (PostHog's `RemoteConfig.build_config`,
/// with what Corvid serves: no session recordings, no site apps).
pub fn build(project: &Project, facts: Facts) -> ConfigDoc {
    let s = &project.settings;
    let capture_performance = if s.capture_performance_opt_in || s.autocapture_web_vitals_opt_in {
        json!({
            "network_timing": s.capture_performance_opt_in,
            "web_vitals": s.autocapture_web_vitals_opt_in,
            "web_vitals_allowed_metrics": null,
        })
    } else {
        json!(false)
    };
    let config = json!({
        "token": project.api_token,
        "supportedCompression": ["gzip", "gzip-js"],
        "hasFeatureFlags": facts.has_flags,
        "captureDeadClicks": s.capture_dead_clicks,
        "capturePerformance": capture_performance,
        "autocapture_opt_out": s.autocapture_opt_out,
        "autocaptureExceptions": s.autocapture_exceptions_opt_in,
        "analytics": {"endpoint": ANALYTICS_ENDPOINT},
        "elementsChainAsString": true,
        "errorTracking": {
            "autocaptureExceptions": s.autocapture_exceptions_opt_in,
            "suppressionRules": [],
        },
        "sessionRecording": false,
        "heatmaps": s.heatmaps_opt_in,
        "surveys": s.surveys_opt_in && facts.surveys_running,
        "productTours": false,
        "defaultIdentifiedOnly": s.default_identified_only,
        "siteApps": [],
    });
    ConfigDoc {
        token: project.api_token.clone(),
        config: config.as_object().cloned().unwrap_or_default(),
    }
}

/// Checks the shape of a token in a remote-config path (PostHog: at most 200 characters of
/// `[A-Za-z0-9_-]`), before any lookup.
pub fn check_token(token: &str) -> Result<(), RecordError> {
    let ok = !token.is_empty()
        && token.len() <= MAX_TOKEN_LEN
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(RecordError::invalid("Invalid token", "token"))
    }
}

/// The remote-config facade. Cheap to clone.
#[derive(Clone)]
pub struct RemoteConfig {
    flags: Arc<OwnedFlags>,
    surveys: Surveys,
}

impl RemoteConfig {
    pub fn new(flags: Arc<OwnedFlags>, surveys: Surveys) -> RemoteConfig {
        RemoteConfig { flags, surveys }
    }

    /// The project's remote config as of now.
    pub async fn config(&self, project: &Project) -> Result<ConfigDoc, RecordError> {
        let has_flags = match self.flags.cached_has_flags(project.id) {
            Some(has) => has,
            None => {
                let (flags, id) = (Arc::clone(&self.flags), project.id);
                blocking(move || Ok::<_, RecordError>(flags.has_flags(id)?)).await?
            }
        };
        let surveys_running = self.surveys.any_running(project.id).await?;
        Ok(build(
            project,
            Facts {
                has_flags,
                surveys_running,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use corvid_tenancy::ProjectSettings;

    fn project(settings: ProjectSettings) -> Project {
        Project {
            id: 7,
            uuid: uuid::Uuid::nil(),
            organization_id: uuid::Uuid::nil(),
            name: "web".into(),
            api_token: "phc_Abc-_1".into(),
            timezone: "UTC".into(),
            anonymize_ips: false,
            created_at: Utc::now(),
            event_retention_days: None,
            settings,
        }
    }

    #[test]
    fn defaults_and_switched_settings() {
        let facts = Facts {
            has_flags: true,
            surveys_running: true,
        };
        let doc = build(&project(ProjectSettings::default()), facts).json();
        assert_eq!(doc["token"], "phc_Abc-_1");
        assert_eq!(doc["supportedCompression"], json!(["gzip", "gzip-js"]));
        assert_eq!(doc["hasFeatureFlags"], json!(true));
        assert_eq!(doc["analytics"], json!({"endpoint": "/i/v0/e/"}));
        assert_eq!(doc["autocapture_opt_out"], json!(false));
        assert_eq!(doc["autocaptureExceptions"], json!(false));
        assert_eq!(doc["capturePerformance"], json!(false));
        assert_eq!(doc["heatmaps"], json!(false));
        assert_eq!(doc["sessionRecording"], json!(false));
        assert_eq!(doc["surveys"], json!(true));
        assert_eq!(doc["defaultIdentifiedOnly"], json!(true));
        assert_eq!(doc["elementsChainAsString"], json!(true));

        let switched = ProjectSettings {
            autocapture_opt_out: true,
            autocapture_exceptions_opt_in: true,
            capture_performance_opt_in: true,
            heatmaps_opt_in: true,
            surveys_opt_in: false,
            default_identified_only: false,
            ..ProjectSettings::default()
        };
        let doc = build(
            &project(switched),
            Facts {
                has_flags: false,
                surveys_running: true,
            },
        )
        .json();
        assert_eq!(doc["autocapture_opt_out"], json!(true));
        assert_eq!(doc["autocaptureExceptions"], json!(true));
        assert_eq!(doc["capturePerformance"]["network_timing"], json!(true));
        assert_eq!(doc["heatmaps"], json!(true));
        assert_eq!(doc["surveys"], json!(false), "opted out");
        assert_eq!(doc["hasFeatureFlags"], json!(false));
        assert_eq!(doc["defaultIdentifiedOnly"], json!(false));
    }

    #[test]
    fn the_script_and_flags_members_carry_the_same_values() {
        let doc = build(
            &project(ProjectSettings::default()),
            Facts {
                has_flags: true,
                surveys_running: false,
            },
        );
        let script = doc.script();
        assert!(script.contains("window._POSTHOG_REMOTE_CONFIG['phc_Abc-_1'] = {"));
        let start = script.find("config: ").expect("config") + "config: ".len();
        let end = script.find(",\n    siteApps").expect("siteApps");
        let config: Value = serde_json::from_str(&script[start..end]).expect("config JSON");
        assert_eq!(config["hasFeatureFlags"], json!(true));
        assert!(config.get("siteApps").is_none());

        let members: Map<String, Value> =
            serde_json::from_str(&format!("{{{}}}", doc.flags_members())).expect("members");
        assert_eq!(
            members["supportedCompression"],
            json!(["gzip", "gzip-js", "lz64"])
        );
        for same in [
            "hasFeatureFlags",
            "autocapture_opt_out",
            "heatmaps",
            "analytics",
        ] {
            assert_eq!(members[same], doc.json()[same], "{same}");
        }
        assert_eq!(
            members["config"],
            json!({"enable_collect_everything": true})
        );
        assert_eq!(members["isAuthenticated"], json!(false));
        assert_eq!(members["surveys"], json!(false));
        assert!(members.get("token").is_none());
    }

    #[test]
    fn tokens_are_checked_before_any_lookup() {
        assert!(check_token("phc_abc-DEF_123").is_ok());
        for bad in ["", "phc_<script>", "a b", &"x".repeat(201)] {
            assert!(check_token(bad).is_err(), "{bad}");
        }
    }
}
