//! A webhook: where a project's changes are sent, which of them, and the secret that signs
//! them; plus the rules a user's input must meet.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use url::{Host, Url};
use uuid::Uuid;

use corvid_kernel::net::{is_internal_name, is_special_use};

use super::WebhookError;

/// The activity log's scopes a webhook can ask for (`<scope>.<activity>`).
pub const SCOPES: &[&str] = &[
    "Cohort",
    "EarlyAccessFeature",
    "Endpoint",
    "EndpointVersion",
    "Experiment",
    "ExperimentHoldout",
    "FeatureFlag",
    "InsightVariable",
    "OAuthApplication",
    "OrganizationInvite",
    "OrganizationMembership",
    "Person",
    "PersonalAPIKey",
    "Survey",
    "Team",
    "User",
    "Webhook",
];

/// Longest URL accepted.
const MAX_URL: usize = 2048;
/// Most event types one webhook names.
const MAX_EVENTS: usize = 50;
/// Longest secret accepted.
const MAX_SECRET: usize = 256;

/// A stored webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    pub id: Uuid,
    pub project_id: u64,
    pub url: String,
    /// Event types such as `FeatureFlag.updated`, `Endpoint.*` or `*`.
    pub events: Vec<String>,
    pub secret: String,
    pub enabled: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Failed attempts since the last success; the webhook turns itself off at the limit.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Why Corvid turned the webhook off, until a user turns it back on.
    #[serde(default)]
    pub disabled_reason: Option<String>,
    /// After a failed attempt no delivery of this webhook is tried before this time (the
    /// failed one's retry), so a receiver that is down is not hammered with the others.
    #[serde(default)]
    pub paused_until: Option<DateTime<Utc>>,
    #[serde(default)]
    pub last_success_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub last_failure_at: Option<DateTime<Utc>>,
}

impl Webhook {
    /// Whether `event_type` (`<scope>.<activity>`) is one this webhook asks for.
    pub fn wants(&self, event_type: &str) -> bool {
        self.events.iter().any(|p| pattern_matches(p, event_type))
    }

    /// The webhook as the API shows it: the secret only as its last characters (it is shown
    /// whole once, when the webhook is made or its secret set).
    pub fn api_json(&self) -> serde_json::Value {
        let tail: String = {
            let chars: Vec<char> = self.secret.chars().collect();
            chars[chars.len().saturating_sub(4)..].iter().collect()
        };
        serde_json::json!({
            "id": self.id,
            "url": self.url,
            "events": self.events,
            "enabled": self.enabled,
            "secret": null,
            "secret_hint": format!("…{tail}"),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "consecutive_failures": self.consecutive_failures,
            "disabled_reason": self.disabled_reason,
            "last_success_at": self.last_success_at,
            "last_failure_at": self.last_failure_at,
        })
    }
}

/// `*`, `Scope.*`, `*.activity` or `Scope.activity`.
fn pattern_matches(pattern: &str, event_type: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let (Some((ps, pa)), Some((es, ea))) = (pattern.split_once('.'), event_type.split_once('.'))
    else {
        return false;
    };
    (ps == "*" || ps == es) && (pa == "*" || pa == ea)
}

/// A webhook's fields as a user sends them (every one optional: an update names only what
/// changes).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WebhookInput {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub secret: Option<String>,
    pub enabled: Option<bool>,
}

impl WebhookInput {
    /// Applies the input to `hook`, checking each field it names.
    pub(crate) fn apply(
        self,
        hook: &mut Webhook,
        allow_loopback: bool,
    ) -> Result<(), WebhookError> {
        if let Some(url) = self.url {
            hook.url = checked_url(&url, allow_loopback)?;
        }
        if let Some(events) = self.events {
            hook.events = checked_events(events)?;
        }
        if let Some(secret) = self.secret {
            if secret.is_empty() || secret.chars().count() > MAX_SECRET {
                return Err(invalid(
                    "secret",
                    format!("The secret must be 1 to {MAX_SECRET} characters."),
                ));
            }
            hook.secret = secret;
        }
        if let Some(enabled) = self.enabled {
            if enabled && !hook.enabled {
                hook.consecutive_failures = 0;
                hook.disabled_reason = None;
                hook.paused_until = None;
            }
            hook.enabled = enabled;
        }
        Ok(())
    }
}

fn invalid(attr: &'static str, detail: String) -> WebhookError {
    WebhookError::Invalid { attr, detail }
}

/// An `http` or `https` URL to a public host (loopback too when allowed), no credentials.
/// Where a name points is checked again at each delivery, on the address connected to.
fn checked_url(raw: &str, allow_loopback: bool) -> Result<String, WebhookError> {
    let bad = |why: &str| invalid("url", format!("Enter a valid URL: {why}."));
    if raw.len() > MAX_URL {
        return Err(bad(&format!("at most {MAX_URL} characters")));
    }
    let url = Url::parse(raw.trim()).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("only http and https URLs receive webhooks"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "credentials in the URL are not allowed (the secret signs each delivery)",
        ));
    }
    let public = match url.host() {
        None => return Err(bad("the URL has no host")),
        Some(Host::Ipv4(ip)) => !is_special_use(ip.into()) || (allow_loopback && ip.is_loopback()),
        Some(Host::Ipv6(ip)) => !is_special_use(ip.into()) || (allow_loopback && ip.is_loopback()),
        Some(Host::Domain(name)) => {
            let loopback_name = name.eq_ignore_ascii_case("localhost");
            !is_internal_name(name) || (allow_loopback && loopback_name)
        }
    };
    if !public {
        return Err(bad(
            "private, loopback and internal addresses do not receive webhooks",
        ));
    }
    Ok(url.to_string())
}

/// One to [`MAX_EVENTS`] event types, each `*` or `<scope or *>.<activity or *>` with a known
/// scope; duplicates dropped.
fn checked_events(events: Vec<String>) -> Result<Vec<String>, WebhookError> {
    if events.is_empty() || events.len() > MAX_EVENTS {
        return Err(invalid(
            "events",
            format!("Name 1 to {MAX_EVENTS} event types, such as \"FeatureFlag.updated\"."),
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(events.len());
    for event in events {
        let ok = event == "*"
            || event.split_once('.').is_some_and(|(scope, activity)| {
                (scope == "*" || SCOPES.contains(&scope))
                    && (activity == "*"
                        || (!activity.is_empty()
                            && activity.len() <= 40
                            && activity
                                .bytes()
                                .all(|b| b.is_ascii_lowercase() || b == b'_')))
            });
        if !ok {
            return Err(invalid(
                "events",
                format!(
                    "\"{}\" is not an event type: use \"<Scope>.<activity>\" (either part may \
                     be \"*\"), the scope one of {}.",
                    event.chars().take(80).collect::<String>(),
                    SCOPES.join(", ")
                ),
            ));
        }
        if !out.contains(&event) {
            out.push(event);
        }
    }
    Ok(out)
}

/// A new webhook's secret when the user gives none: 32 random bytes, hex.
pub(crate) fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("whsec_{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(events: &[&str]) -> Webhook {
        Webhook {
            id: Uuid::nil(),
            project_id: 1,
            url: "https://example.com/hook".into(),
            events: events.iter().map(|s| s.to_string()).collect(),
            secret: "s".into(),
            enabled: true,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            consecutive_failures: 0,
            disabled_reason: None,
            paused_until: None,
            last_success_at: None,
            last_failure_at: None,
        }
    }

    #[test]
    fn patterns_match_by_scope_and_activity() {
        let h = hook(&["FeatureFlag.updated", "Endpoint.*", "*.deleted"]);
        assert!(h.wants("FeatureFlag.updated"));
        assert!(!h.wants("FeatureFlag.created"));
        assert!(h.wants("Endpoint.created"));
        assert!(h.wants("Person.deleted"));
        assert!(!h.wants("Cohort.updated"));
        assert!(hook(&["*"]).wants("Team.updated"));
    }

    #[test]
    fn urls_must_be_public_http_without_credentials() {
        assert!(checked_url("https://hooks.example.com/x", false).is_ok());
        for bad in [
            "ftp://example.com/",
            "https://user:pw@example.com/",
            "http://127.0.0.1:8080/",
            "http://10.0.0.2/",
            "http://[::1]/",
            "http://localhost/",
            "http://metadata.internal/",
            "not a url",
        ] {
            assert!(checked_url(bad, false).is_err(), "{bad} should be refused");
        }
        assert!(checked_url("http://127.0.0.1:8080/", true).is_ok());
        assert!(checked_url("http://localhost:8080/", true).is_ok());
        assert!(checked_url("http://10.0.0.2/", true).is_err());
    }

    #[test]
    fn events_are_checked_and_deduplicated() {
        let ok = checked_events(vec![
            "FeatureFlag.updated".into(),
            "Endpoint.*".into(),
            "FeatureFlag.updated".into(),
        ])
        .expect("valid");
        assert_eq!(ok, vec!["FeatureFlag.updated", "Endpoint.*"]);
        for bad in [
            "Featureflag.updated",
            "FeatureFlag",
            "FeatureFlag.Updated",
            "",
        ] {
            assert!(checked_events(vec![bad.into()]).is_err(), "{bad}");
        }
        assert!(checked_events(vec![]).is_err());
    }
}
