//! Evaluation of flags for one subject, with the rules of PostHog's flag service
//! (`PostHog/posthog:rust/feature-flags/src/flags/flag_matching.rs`): early access, holdouts, conditions in stored order, per-condition aggregation,
//! rollout and variant hashing, payloads, reasons, cohorts and flag dependencies.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::hash::{holdout_hash, rollout_hash, variant_hash};
use super::model::{CohortDefinition, FlagDefinition};
use super::properties::MatchContext;

/// A flag's value as dependants see it: `false`, `true` or a variant key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagValue {
    Off,
    On,
    Variant(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reason {
    pub code: &'static str,
    pub condition_index: Option<usize>,
    /// A description other than the code's standard one.
    pub detail: Option<&'static str>,
}

impl Reason {
    /// The human-readable text PostHog sends for this reason (built only when serializing).
    pub fn description(&self) -> String {
        self.to_string()
    }

    /// The description as fixed text plus, for a condition match, the 1-based condition number
    /// that follows it. Every text is plain ASCII without quotes, backslashes or control
    /// characters, so response writers may copy it into JSON strings without escaping.
    pub fn description_parts(&self) -> (&'static str, Option<usize>) {
        if let Some(detail) = self.detail {
            return (detail, None);
        }
        let text = match self.code {
            "condition_match" => {
                return (
                    "Matched condition set ",
                    Some(self.condition_index.unwrap_or(0) + 1),
                )
            }
            "out_of_rollout_bound" => "Out of rollout bound",
            "no_condition_match" => "No matching condition set",
            "no_group_type" => "No group type",
            "super_condition_value" => "Super condition value",
            "holdout_condition_value" => "Holdout condition value",
            "flag_disabled" => "Feature flag is disabled",
            _ => "Flag cannot be evaluated due to missing dependency",
        };
        (text, None)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.description_parts() {
            (text, Some(n)) => write!(f, "{text}{n}"),
            (text, None) => f.write_str(text),
        }
    }
}

/// The result of evaluating one flag.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub enabled: bool,
    pub variant: Option<String>,
    pub reason: Reason,
    pub payload: Option<Value>,
    /// The flag could not be computed (its dependencies are missing or cyclic).
    pub failed: bool,
}

impl Evaluation {
    pub fn value(&self) -> FlagValue {
        match (&self.variant, self.enabled) {
            (_, false) => FlagValue::Off,
            (Some(v), true) => FlagValue::Variant(v.clone()),
            (None, true) => FlagValue::On,
        }
    }
}

/// A group the subject belongs to, by group type index.
#[derive(Debug, Clone, Default)]
pub struct GroupData {
    pub key: String,
    pub properties: Map<String, Value>,
}

/// Who flags are evaluated for.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub distinct_id: String,
    /// `$anon_distinct_id`: the hash key of experience-continuity flags.
    pub anon_distinct_id: Option<String>,
    pub device_id: Option<String>,
    /// Stored person properties overlaid with the request's (request wins).
    pub person_properties: Map<String, Value>,
    pub groups: [Option<GroupData>; 5],
    /// Static cohorts the person is a member of.
    pub static_cohorts: HashSet<i64>,
}

/// Reason priorities: the best non-match reason is reported (ties go to the later condition).
fn priority(code: &str) -> i8 {
    match code {
        "super_condition_value" => 6,
        "holdout_condition_value" => 5,
        "condition_match" => 4,
        "out_of_rollout_bound" => 3,
        "no_condition_match" => 2,
        "no_group_type" => 1,
        "flag_disabled" => 0,
        _ => -1,
    }
}

fn reason(code: &'static str, condition_index: Option<usize>) -> Reason {
    Reason {
        code,
        condition_index,
        detail: None,
    }
}

/// Everything evaluation reads besides the flag and the subject.
pub struct Environment<'a> {
    pub cohorts: &'a HashMap<i64, CohortDefinition>,
    /// Values of already evaluated flags, by flag id (dependencies).
    pub flag_values: &'a HashMap<i64, FlagValue>,
    pub ctx: MatchContext,
    /// Cohort memberships already decided for this subject (cohorts are shared by flags).
    pub cohort_memo: &'a std::cell::RefCell<HashMap<i64, bool>>,
}

/// Evaluates one flag.
pub fn evaluate_flag(
    flag: &FlagDefinition,
    subject: &Subject,
    env: &Environment<'_>,
) -> Evaluation {
    if !flag.active || flag.deleted {
        return not_enabled(reason("flag_disabled", None));
    }
    let filters = &flag.filters;
    let payload_for = |key: &str| filters.payloads.get(key).cloned();

    // 1. Early access.
    if filters.feature_enrollment == Some(true) {
        let enrollment_key = format!("$feature_enrollment/{}", flag.key);
        if let Some(value) = subject.person_properties.get(&enrollment_key) {
            let enabled = matches!(value, Value::Bool(true)) || value.as_str() == Some("true");
            return Evaluation {
                enabled,
                variant: None,
                reason: reason("super_condition_value", Some(0)),
                payload: enabled.then(|| payload_for("true")).flatten(),
                failed: false,
            };
        }
    } else if let Some(gate) = filters.super_groups.first() {
        let relevant = gate
            .properties
            .iter()
            .any(|f| subject.person_properties.contains_key(&f.key));
        if relevant {
            let identifier = person_identifier(flag, subject).unwrap_or_default();
            let enabled = condition_properties_match(gate, None, subject, env)
                && in_rollout(&flag.key, identifier, gate.rollout_percentage);
            return Evaluation {
                enabled,
                variant: None,
                reason: reason("super_condition_value", Some(0)),
                payload: enabled.then(|| payload_for("true")).flatten(),
                failed: false,
            };
        }
    }

    // 2. Holdout.
    if let Some(holdout) = &filters.holdout {
        let identifier = match filters.aggregation_group_type_index {
            Some(i) => subject.groups[usize::from(i.min(4))]
                .as_ref()
                .map(|g| g.key.as_str()),
            None => person_identifier(flag, subject),
        };
        if let Some(identifier) = identifier {
            let percentage = holdout.exclusion_percentage.clamp(0.0, 100.0);
            let excluded = percentage >= 100.0 || holdout_hash(identifier) <= percentage / 100.0;
            if excluded {
                let variant = format!("holdout-{}", holdout.id);
                return Evaluation {
                    enabled: true,
                    payload: payload_for(&variant),
                    variant: Some(variant),
                    reason: reason("holdout_condition_value", None),
                    failed: false,
                };
            }
        }
    }

    // 3. Conditions in stored order; the first match wins.
    let mut best = reason("no_group_type", None);
    let mut skipped_group_condition = false;
    for (index, condition) in filters.groups.iter().enumerate() {
        let aggregation = condition
            .aggregation_group_type_index
            .unwrap_or(filters.aggregation_group_type_index);
        let identifier = match aggregation {
            Some(group_index) => match subject
                .groups
                .get(usize::from(group_index))
                .and_then(Option::as_ref)
            {
                Some(group) if !group.key.is_empty() => group.key.as_str(),
                _ => {
                    skipped_group_condition = true;
                    best = better(best, reason("no_group_type", Some(index)));
                    continue;
                }
            },
            None => match person_identifier(flag, subject) {
                Some(id) => id,
                None => {
                    best = better(best, reason("out_of_rollout_bound", Some(index)));
                    continue;
                }
            },
        };
        if !condition_properties_match(condition, aggregation, subject, env) {
            best = better(best, reason("no_condition_match", Some(index)));
            continue;
        }
        if !in_rollout(&flag.key, identifier, condition.rollout_percentage) {
            best = better(best, reason("out_of_rollout_bound", Some(index)));
            continue;
        }
        let variant = condition
            .variant
            .clone()
            .filter(|v| {
                filters
                    .multivariate
                    .as_ref()
                    .is_some_and(|m| m.variants.iter().any(|x| &x.key == v))
            })
            .or_else(|| pick_variant(flag, identifier));
        let payload = payload_for(variant.as_deref().unwrap_or("true"));
        return Evaluation {
            enabled: true,
            variant,
            reason: reason("condition_match", Some(index)),
            payload,
            failed: false,
        };
    }
    if best.code == "no_condition_match" && skipped_group_condition {
        best.detail = Some("No matching condition set (group conditions were not evaluated because no group type was provided)");
    }
    not_enabled(best)
}

fn not_enabled(reason: Reason) -> Evaluation {
    Evaluation {
        enabled: false,
        variant: None,
        reason,
        payload: None,
        failed: false,
    }
}

fn better(current: Reason, candidate: Reason) -> Reason {
    if priority(candidate.code) >= priority(current.code) {
        candidate
    } else {
        current
    }
}

/// The person-level hash identifier: device id when the flag buckets by device (none → the
/// condition is skipped), else `$anon_distinct_id` for continuity flags, else the distinct id.
fn person_identifier<'a>(flag: &FlagDefinition, subject: &'a Subject) -> Option<&'a str> {
    if flag.bucketing_identifier.as_deref() == Some("device_id") {
        return subject.device_id.as_deref().filter(|d| !d.is_empty());
    }
    if flag.ensure_experience_continuity {
        if let Some(anon) = subject
            .anon_distinct_id
            .as_deref()
            .filter(|a| !a.is_empty())
        {
            return Some(anon);
        }
    }
    Some(&subject.distinct_id)
}

fn in_rollout(key: &str, identifier: &str, percentage: Option<f64>) -> bool {
    let percentage = percentage.unwrap_or(100.0);
    percentage >= 100.0 || rollout_hash(key, identifier) <= percentage / 100.0
}

/// The first variant whose cumulative share exceeds the variant hash (strict `<`).
fn pick_variant(flag: &FlagDefinition, identifier: &str) -> Option<String> {
    let variants = &flag.filters.multivariate.as_ref()?.variants;
    let hash = variant_hash(&flag.key, identifier);
    let mut cumulative = 0.0;
    for variant in variants {
        cumulative += variant.rollout_percentage / 100.0;
        if hash < cumulative {
            return Some(variant.key.clone());
        }
    }
    None
}

mod conditions;
mod plan;

pub use conditions::*;
pub use plan::*;
