//! Evaluation of flags for one subject, with the rules of PostHog's flag service
//! (`PostHog/posthog:rust/feature-flags/src/flags/flag_matching.rs`): early access, holdouts, conditions in stored order, per-condition aggregation,
//! rollout and variant hashing, payloads, reasons, cohorts and flag dependencies.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashMap;

use serde_json::{Map, Value};

use super::hash::{holdout_hash, rollout_hash, variant_hash};
use super::model::{CohortIds, Cohorts, FlagDefinition, RequestIdHasher};
use super::properties::{MatchContext, Properties};

/// A flag's value as dependants see it: `false`, `true` or a variant key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagValue {
    Off,
    On,
    Variant(String),
}

/// Why a flag has its value: PostHog's reason codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonCode {
    SuperConditionValue,
    HoldoutConditionValue,
    ConditionMatch,
    OutOfRolloutBound,
    NoConditionMatch,
    NoGroupType,
    FlagDisabled,
    MissingDependency,
    Timeout,
}

impl ReasonCode {
    /// The code as PostHog spells it in responses.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::SuperConditionValue => "super_condition_value",
            ReasonCode::HoldoutConditionValue => "holdout_condition_value",
            ReasonCode::ConditionMatch => "condition_match",
            ReasonCode::OutOfRolloutBound => "out_of_rollout_bound",
            ReasonCode::NoConditionMatch => "no_condition_match",
            ReasonCode::NoGroupType => "no_group_type",
            ReasonCode::FlagDisabled => "flag_disabled",
            ReasonCode::MissingDependency => "missing_dependency",
            ReasonCode::Timeout => "timeout",
        }
    }

    /// Reason priorities: the best non-match reason is reported (ties go to the later
    /// condition).
    fn priority(self) -> i8 {
        match self {
            ReasonCode::SuperConditionValue => 6,
            ReasonCode::HoldoutConditionValue => 5,
            ReasonCode::ConditionMatch => 4,
            ReasonCode::OutOfRolloutBound => 3,
            ReasonCode::NoConditionMatch => 2,
            ReasonCode::NoGroupType => 1,
            ReasonCode::FlagDisabled => 0,
            ReasonCode::MissingDependency | ReasonCode::Timeout => -1,
        }
    }
}

impl PartialEq<&str> for ReasonCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reason {
    pub code: ReasonCode,
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
            ReasonCode::ConditionMatch => {
                return (
                    "Matched condition set ",
                    Some(self.condition_index.unwrap_or(0) + 1),
                )
            }
            ReasonCode::OutOfRolloutBound => "Out of rollout bound",
            ReasonCode::NoConditionMatch => "No matching condition set",
            ReasonCode::NoGroupType => "No group type",
            ReasonCode::SuperConditionValue => "Super condition value",
            ReasonCode::HoldoutConditionValue => "Holdout condition value",
            ReasonCode::FlagDisabled => "Feature flag is disabled",
            ReasonCode::MissingDependency | ReasonCode::Timeout => {
                "Flag cannot be evaluated due to missing dependency"
            }
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
pub struct GroupData<'a> {
    pub key: String,
    pub properties: GroupProperties<'a>,
}

/// A group's properties as its filters read them: `$group_key` (the group's key), then what
/// the request's `group_properties` give for it, then the stored group's. Read in place: a
/// request's evaluation copies no group's property map.
#[derive(Debug, Clone, Default)]
pub struct GroupProperties<'a> {
    key: Option<Value>,
    over: Option<&'a Map<String, Value>>,
    under: Option<&'a Map<String, Value>>,
}

impl<'a> GroupProperties<'a> {
    /// The group `key`'s properties: `request`'s over `stored`'s.
    pub fn layered(
        key: &str,
        request: Option<&'a Map<String, Value>>,
        stored: Option<&'a Map<String, Value>>,
    ) -> GroupProperties<'a> {
        GroupProperties {
            key: Some(Value::String(key.to_string())),
            over: request,
            under: stored,
        }
    }

    /// The value a filter on `name` reads.
    pub fn get(&self, name: &str) -> Option<&Value> {
        if name == "$group_key" {
            if let Some(key) = &self.key {
                return Some(key);
            }
        }
        self.over
            .and_then(|m| m.get(name))
            .or_else(|| self.under.and_then(|m| m.get(name)))
    }
}

impl Properties for GroupProperties<'_> {
    fn property(&self, key: &str) -> Option<&Value> {
        self.get(key)
    }
}

/// Who flags are evaluated for.
#[derive(Debug, Clone, Default)]
pub struct Subject<'a> {
    /// Borrowed from the request where there is one: evaluation only reads it.
    pub distinct_id: Cow<'a, str>,
    /// `$anon_distinct_id`: the hash key of experience-continuity flags.
    pub anon_distinct_id: Option<String>,
    pub device_id: Option<String>,
    /// Stored person properties overlaid with the request's (request wins).
    pub person_properties: PersonProperties<'a>,
    pub groups: [Option<GroupData<'a>>; 5],
    /// Static cohorts the person is a member of.
    pub static_cohorts: CohortIds,
}

/// A subject's person properties: the request's over the stored person's, then the distinct
/// id as `distinct_id` when neither has one. Read in place: a request's evaluation copies no
/// property map (a stored person's can be large, and every request reads one).
#[derive(Debug, Clone, Default)]
pub struct PersonProperties<'a> {
    over: Cow<'a, Map<String, Value>>,
    under: Option<&'a Map<String, Value>>,
    distinct_id: Option<&'a str>,
    /// `distinct_id` as a JSON value, made only when a filter reads it: few flag sets filter
    /// on the distinct id, and every request would otherwise copy it.
    distinct_id_value: OnceCell<Value>,
}

impl<'a> PersonProperties<'a> {
    /// `request`'s properties over `stored`'s, with `distinct_id` below both.
    pub fn layered(
        request: &'a Map<String, Value>,
        stored: Option<&'a Map<String, Value>>,
        distinct_id: &'a str,
    ) -> PersonProperties<'a> {
        PersonProperties {
            over: Cow::Borrowed(request),
            under: stored,
            distinct_id: Some(distinct_id),
            distinct_id_value: OnceCell::new(),
        }
    }

    /// The value a filter on `key` reads.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.over
            .get(key)
            .or_else(|| self.under.and_then(|m| m.get(key)))
            .or_else(|| self.distinct_id_property(key))
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The distinct id, for a filter on `distinct_id` that neither layer answers.
    fn distinct_id_property(&self, key: &str) -> Option<&Value> {
        let id = self.distinct_id.filter(|_| key == "distinct_id")?;
        Some(
            self.distinct_id_value
                .get_or_init(|| Value::String(id.to_string())),
        )
    }
}

impl From<Map<String, Value>> for PersonProperties<'_> {
    /// Exactly these properties.
    fn from(map: Map<String, Value>) -> Self {
        PersonProperties {
            over: Cow::Owned(map),
            under: None,
            distinct_id: None,
            distinct_id_value: OnceCell::new(),
        }
    }
}

impl Properties for PersonProperties<'_> {
    fn property(&self, key: &str) -> Option<&Value> {
        self.get(key)
    }
}

fn reason(code: ReasonCode, condition_index: Option<usize>) -> Reason {
    Reason {
        code,
        condition_index,
        detail: None,
    }
}

/// Values of already evaluated flags, by flag id (keys are small integers: a fast hash).
pub type FlagValues = HashMap<i64, FlagValue, RequestIdHasher>;

/// Cohort memberships already decided for one subject, by cohort id.
pub type CohortMemo = std::cell::RefCell<HashMap<i64, bool, RequestIdHasher>>;

/// Everything evaluation reads besides the flag and the subject.
pub struct Environment<'a> {
    pub cohorts: &'a Cohorts,
    /// Values of already evaluated flags, by flag id (dependencies).
    pub flag_values: &'a FlagValues,
    pub ctx: MatchContext,
    /// Cohort memberships already decided for this subject (cohorts are shared by flags).
    pub cohort_memo: &'a CohortMemo,
    /// Outcomes of person filters this flag shares with others of its set.
    pub filters: FilterMemo<'a>,
}

/// Evaluates one flag (the tests' form of [`evaluate_flag_into`]).
#[cfg(test)]
pub fn evaluate_flag(
    flag: &FlagDefinition,
    subject: &Subject,
    env: &Environment<'_>,
) -> Evaluation {
    let mut out = not_enabled(reason(ReasonCode::FlagDisabled, None));
    evaluate_flag_into(flag, subject, env, &mut out);
    out
}

/// [`evaluate_flag`], written into `out` (a request's result slot) in place. Returned by
/// value, an evaluation was built on the stack and copied into its slot right after its
/// flags were stored one byte at a time: the copy's wide reads waited for those stores (a
/// store-forwarding stall on every flag, a large share of evaluation's own time at hundreds
/// of flags).
pub fn evaluate_flag_into(
    flag: &FlagDefinition,
    subject: &Subject,
    env: &Environment<'_>,
    out: &mut Evaluation,
) {
    if !flag.active || flag.deleted {
        *out = not_enabled(reason(ReasonCode::FlagDisabled, None));
        return;
    }
    let filters = &flag.filters;
    let payload_for = |key: &str| filters.payloads.get(key).cloned();

    // 1. Early access.
    if filters.feature_enrollment == Some(true) {
        let enrollment_key = format!("$feature_enrollment/{}", flag.key);
        if let Some(value) = subject.person_properties.get(&enrollment_key) {
            let enabled = matches!(value, Value::Bool(true)) || value.as_str() == Some("true");
            *out = Evaluation {
                enabled,
                variant: None,
                reason: reason(ReasonCode::SuperConditionValue, Some(0)),
                payload: enabled.then(|| payload_for("true")).flatten(),
                failed: false,
            };
            return;
        }
    } else if let Some(gate) = filters.super_groups.first() {
        let relevant = gate
            .properties
            .iter()
            .any(|f| subject.person_properties.contains_key(&f.key));
        if relevant {
            let identifier = person_identifier(flag, subject).unwrap_or_default();
            let enabled = condition_properties_match(gate, None, subject, env, &[])
                && in_rollout(&flag.key, identifier, gate.rollout_percentage);
            *out = Evaluation {
                enabled,
                variant: None,
                reason: reason(ReasonCode::SuperConditionValue, Some(0)),
                payload: enabled.then(|| payload_for("true")).flatten(),
                failed: false,
            };
            return;
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
                *out = Evaluation {
                    enabled: true,
                    payload: payload_for(&variant),
                    variant: Some(variant),
                    reason: reason(ReasonCode::HoldoutConditionValue, None),
                    failed: false,
                };
                return;
            }
        }
    }

    // 3. Conditions in stored order; the first match wins.
    // The best non-match so far, as two plain values updated in place (see `Best`).
    let mut best = Best::default();
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
                    best.note(ReasonCode::NoGroupType, index);
                    continue;
                }
            },
            None => match person_identifier(flag, subject) {
                Some(id) => id,
                None => {
                    best.note(ReasonCode::OutOfRolloutBound, index);
                    continue;
                }
            },
        };
        let slots = env.filters.condition(index);
        if !condition_properties_match(condition, aggregation, subject, env, slots) {
            best.note(ReasonCode::NoConditionMatch, index);
            continue;
        }
        if !in_rollout(&flag.key, identifier, condition.rollout_percentage) {
            best.note(ReasonCode::OutOfRolloutBound, index);
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
        *out = Evaluation {
            enabled: true,
            variant,
            reason: reason(ReasonCode::ConditionMatch, Some(index)),
            payload,
            failed: false,
        };
        return;
    }
    let Best {
        code,
        condition_index,
    } = best;
    *out = not_enabled(Reason {
        code,
        condition_index,
        detail: (code == ReasonCode::NoConditionMatch && skipped_group_condition)
            .then_some("No matching condition set (group conditions were not evaluated because no group type was provided)"),
    });
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

/// The reason a flag that matched no condition reports: the highest-priority miss, the later
/// condition among equals. Updated field by field, so it stays in registers: chosen as a whole
/// between two values in memory, it was copied right after one of them was written a byte at
/// a time, a store-forwarding stall on every condition that missed.
#[derive(Debug, Clone, Copy)]
struct Best {
    code: ReasonCode,
    condition_index: Option<usize>,
}

impl Default for Best {
    fn default() -> Best {
        Best {
            code: ReasonCode::NoGroupType,
            condition_index: None,
        }
    }
}

impl Best {
    #[inline(always)]
    fn note(&mut self, code: ReasonCode, index: usize) {
        if code.priority() >= self.code.priority() {
            self.code = code;
            self.condition_index = Some(index);
        }
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
mod memo;
mod plan;

pub use conditions::*;
pub use memo::FilterMemo;
pub use plan::*;
