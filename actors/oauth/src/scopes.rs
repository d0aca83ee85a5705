//! OAuth scopes are the personal-API-key scopes (`<object>:read|write`).
//!
//! Policy (PostHog's): `/authorize` clamps rather than rejects. Unknown scopes are dropped and
//! requested scopes are kept within the client's ceiling (its metadata document's
//! `com.posthog.scopes`); when nothing grantable is left, only [`MINIMAL`] is granted (PostHog
//! grants its identity scope, `openid`), never every scope. The consent screen lists exactly
//! what is granted. Corvid users hold every scope in their organization, so the user adds no
//! further limit.

use corvid_tenancy::SCOPE_OBJECTS as OBJECTS;
use corvid_tenancy::{Scope, ScopeSet};

/// Every scope a token can carry, for `scopes_supported`.
pub fn supported() -> Vec<String> {
    OBJECTS
        .iter()
        .flat_map(|o| [format!("{o}:read"), format!("{o}:write")])
        .collect()
}

/// What a client that asks for nothing grantable gets: who the user is, nothing more.
pub const MINIMAL: &[&str] = &["user:read"];

/// The scopes granted for a request: `requested` (space-separated) within `ceiling`.
pub fn grant(requested: Option<&str>, ceiling: Option<&[String]>) -> Vec<String> {
    let ceiling_set = ceiling.and_then(|c| {
        let valid: Vec<&String> = c.iter().filter(|s| Scope::parse(s).is_some()).collect();
        (!valid.is_empty()).then(|| ScopeSet::parse(&valid).unwrap_or(ScopeSet::All))
    });
    let within = |s: &Scope| ceiling_set.as_ref().is_none_or(|c| c.grants(s));
    let mut granted: Vec<String> = requested
        .unwrap_or("")
        .split_ascii_whitespace()
        .filter_map(Scope::parse)
        .filter(|s| within(s))
        .map(|s| s.to_string())
        .collect();
    if granted.is_empty() {
        granted = MINIMAL
            .iter()
            .filter_map(|s| Scope::parse(s))
            .filter(|s| within(s))
            .map(|s| s.to_string())
            .collect();
    }
    granted.sort();
    granted.dedup();
    granted
}

/// Narrows `previous` to `requested` on refresh; `None` when asking for anything new.
pub fn narrow(previous: &[String], requested: Option<&str>) -> Option<Vec<String>> {
    let Some(requested) = requested.filter(|r| !r.trim().is_empty()) else {
        return Some(previous.to_vec());
    };
    let held = ScopeSet::parse(previous).ok()?;
    let mut out = Vec::new();
    for s in requested.split_ascii_whitespace() {
        let scope = Scope::parse(s)?;
        if !held.grants(&scope) {
            return None;
        }
        out.push(scope.to_string());
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// A scope in plain words for the consent screen, e.g. "Read and write feature flags".
pub fn describe(scope: &str) -> String {
    let Some(parsed) = Scope::parse(scope) else {
        return scope.to_string();
    };
    let what = match parsed.object {
        "cohort" => "cohorts",
        "endpoint" => "endpoints (saved queries)",
        "event_definition" => "event definitions",
        "feature_flag" => "feature flags",
        "group" => "groups",
        "insight" => "insights",
        "insight_variable" => "insight variables",
        "logs" => "logs",
        "organization" => "organization settings",
        "person" => "persons and their properties",
        "personal_api_key" => "personal API keys",
        "project" => "projects",
        "query" => "events and queries",
        "user" => "your user profile",
        other => other,
    };
    match parsed.access {
        corvid_tenancy::Access::Read => format!("Read {what}"),
        corvid_tenancy::Access::Write => format!("Read and write {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_scopes_are_dropped_and_nothing_grantable_means_the_minimal_default() {
        assert_eq!(
            grant(Some("feature_flag:read openid bogus:write"), None),
            vec!["feature_flag:read"]
        );
        assert_eq!(grant(None, None), vec!["user:read"]);
        assert_eq!(grant(Some("openid bogus:read"), None), vec!["user:read"]);
        let ceiling = vec!["query:read".to_string(), "endpoint:write".to_string()];
        assert_eq!(
            grant(Some("feature_flag:write endpoint:read"), Some(&ceiling)),
            vec!["endpoint:read"]
        );
        assert!(
            grant(Some("nothing"), Some(&ceiling)).is_empty(),
            "the default stays within the client's own ceiling"
        );
        let with_user = vec!["user:read".to_string(), "query:read".to_string()];
        assert_eq!(grant(None, Some(&with_user)), vec!["user:read"]);
    }

    #[test]
    fn refresh_can_only_narrow() {
        let held = vec!["endpoint:write".to_string()];
        assert_eq!(
            narrow(&held, Some("endpoint:read")),
            Some(vec!["endpoint:read".into()])
        );
        assert_eq!(narrow(&held, None), Some(held.clone()));
        assert_eq!(narrow(&held, Some("query:read")), None);
    }
}
