//! What a project, user or key may be: names, time zones, emails, scopes and project settings.

use crate::{NewPersonalApiKey, Project, ProjectSettings, ProjectUpdate, ScopeSet};
use corvid_kernel::StoreError;
pub(super) fn validate_project_name(name: &str) -> Result<(), StoreError> {
    let len = name.trim().chars().count();
    if len == 0 || len > 200 {
        return Err(StoreError::invalid(
            "name must be between 1 and 200 characters",
            "name",
        ));
    }
    Ok(())
}

pub(super) fn validate_timezone(tz: &str) -> Result<(), StoreError> {
    tz.parse::<chrono_tz::Tz>()
        .map(|_| ())
        .map_err(|_| StoreError::invalid(format!("unknown time zone `{tz}`"), "timezone"))
}

pub(super) fn normalize_email(email: &str) -> Result<String, StoreError> {
    let email = email.trim().to_ascii_lowercase();
    match email.split_once('@') {
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() => Ok(email),
        _ => Err(StoreError::invalid(
            "email must look like name@host",
            "email",
        )),
    }
}

/// Applies a project update, checking each changed field.
/// The longest retention a project may set (a hundred years).
pub const MAX_RETENTION_DAYS: u32 = 36_500;

pub(super) fn apply_update(project: &mut Project, update: ProjectUpdate) -> Result<(), StoreError> {
    if let Some(name) = update.name {
        validate_project_name(&name)?;
        project.name = name;
    }
    if let Some(timezone) = update.timezone {
        validate_timezone(&timezone)?;
        project.timezone = timezone;
    }
    if update.session_recording_opt_in == Some(true) {
        return Err(StoreError::invalid(
            "Session recordings are not stored by Corvid, so they cannot be turned on.",
            "session_recording_opt_in",
        ));
    }
    if let Some(v) = update.anonymize_ips {
        project.anonymize_ips = v;
    }
    if let Some(days) = update.event_retention_days {
        if days.is_some_and(|d| !(1..=MAX_RETENTION_DAYS).contains(&d)) {
            return Err(StoreError::invalid(
                format!(
                    "event_retention_days must be between 1 and {MAX_RETENTION_DAYS}, or null to keep every event."
                ),
                "event_retention_days",
            ));
        }
        project.event_retention_days = days;
    }
    let s: &mut ProjectSettings = &mut project.settings;
    let switches = [
        (update.autocapture_opt_out, &mut s.autocapture_opt_out),
        (
            update.autocapture_exceptions_opt_in,
            &mut s.autocapture_exceptions_opt_in,
        ),
        (
            update.capture_performance_opt_in,
            &mut s.capture_performance_opt_in,
        ),
        (
            update.autocapture_web_vitals_opt_in,
            &mut s.autocapture_web_vitals_opt_in,
        ),
        (update.heatmaps_opt_in, &mut s.heatmaps_opt_in),
        (update.capture_dead_clicks, &mut s.capture_dead_clicks),
        (update.surveys_opt_in, &mut s.surveys_opt_in),
        (
            update.session_recording_opt_in,
            &mut s.session_recording_opt_in,
        ),
        (
            update.default_identified_only,
            &mut s.default_identified_only,
        ),
    ];
    for (new, field) in switches {
        if let Some(value) = new {
            *field = value;
        }
    }
    Ok(())
}

/// Checks a new key's label and scopes.
pub(super) fn validate_key(new: &NewPersonalApiKey) -> Result<String, StoreError> {
    let label = new.label.trim().to_string();
    if label.is_empty() || label.chars().count() > 40 {
        return Err(StoreError::invalid(
            "label must be between 1 and 40 characters",
            "label",
        ));
    }
    if new.scopes.is_empty() {
        return Err(StoreError::invalid(
            "at least one scope is required",
            "scopes",
        ));
    }
    ScopeSet::parse(&new.scopes)
        .map_err(|bad| StoreError::invalid(format!("invalid scope `{bad}`"), "scopes"))?;
    Ok(label)
}
