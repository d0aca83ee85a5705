//! Whether a condition matches: property filters, cohorts (with cycle protection), flag dependencies and groups.

use serde_json::Value;

use super::super::model::{CohortGroup, CohortNode, Condition};
use super::super::properties::{match_property, PropertyFilter};
use super::memo::NO_SLOT;
use super::{Environment, FlagValue};
use crate::Subject;

/// Plain filters first (in order), then cohort filters; all must match. `slots` are the
/// condition's filters' places in the request's shared outcomes (empty: none shared).
///
/// A filter with a slot is a person filter (group, cohort and flag filters have none), so its
/// outcome is read without reading the filter itself: with hundreds of flags most outcomes
/// are already known, and each filter (its type text above all) read was a cache miss.
pub(super) fn condition_properties_match(
    condition: &Condition,
    aggregation: Option<u8>,
    subject: &Subject,
    env: &Environment<'_>,
    slots: &[u32],
) -> bool {
    let is_cohort = |f: &PropertyFilter| f.kind.as_deref() == Some("cohort");
    let mut has_cohort = false;
    for (position, filter) in condition.properties.iter().enumerate() {
        if let Some(&slot) = slots.get(position).filter(|&&slot| slot != NO_SLOT) {
            let person = || match_property(filter, &subject.person_properties, &env.ctx);
            if !env.filters.outcome(slot, person) {
                return false;
            }
            continue;
        }
        if is_cohort(filter) {
            has_cohort = true;
            continue;
        }
        let matched = match filter.kind.as_deref() {
            Some("group") => {
                let index = filter
                    .group_type_index
                    .and_then(|i| u8::try_from(i).ok())
                    .or(aggregation);
                match index
                    .and_then(|i| subject.groups.get(usize::from(i)))
                    .and_then(Option::as_ref)
                {
                    Some(group) => match_property(filter, &group.properties, &env.ctx),
                    None => false,
                }
            }
            Some("flag") => dependency_matches(filter, env),
            _ => match_property(filter, &subject.person_properties, &env.ctx),
        };
        if !matched {
            return false;
        }
    }
    if !has_cohort {
        return true;
    }
    condition
        .properties
        .iter()
        .filter(|f| is_cohort(f))
        .all(|f| {
            let member = cohort_id(&f.value)
                .map(|id| in_cohort(id, subject, env, &mut Vec::new()))
                .unwrap_or(false);
            match f.operator.as_deref().unwrap_or("in") {
                "in" | "exact" => member,
                "not_in" => !member,
                _ => false,
            }
        })
}

pub(super) fn cohort_id(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// `flag_evaluates_to`: `true` matches any enabled value, `false` only a disabled flag, a
/// string exactly that variant.
pub(super) fn dependency_matches(filter: &PropertyFilter, env: &Environment<'_>) -> bool {
    let operator = filter.operator.as_deref().unwrap_or("flag_evaluates_to");
    if operator != "flag_evaluates_to" && operator != "exact" {
        return false;
    }
    let Ok(id) = filter.key.parse::<i64>() else {
        return false;
    };
    let Some(actual) = env.flag_values.get(&id) else {
        return false;
    };
    match (&filter.value, actual) {
        (Value::Bool(true), value) => *value != FlagValue::Off,
        (Value::Bool(false), value) => *value == FlagValue::Off,
        (Value::String(wanted), FlagValue::Variant(v)) => wanted == v,
        _ => false,
    }
}

/// Cohort membership of the subject; `stack` guards against cycles (a cycle is a non-member).
pub fn in_cohort(id: i64, subject: &Subject, env: &Environment<'_>, stack: &mut Vec<i64>) -> bool {
    if stack.contains(&id) {
        return false;
    }
    if let Some(known) = env.cohort_memo.borrow().get(&id) {
        return *known;
    }
    let member = cohort_membership(id, subject, env, stack);
    env.cohort_memo.borrow_mut().insert(id, member);
    member
}

pub(super) fn cohort_membership(
    id: i64,
    subject: &Subject,
    env: &Environment<'_>,
    stack: &mut Vec<i64>,
) -> bool {
    let Some(cohort) = env.cohorts.get(&id) else {
        return false;
    };
    if cohort.is_static {
        return subject.static_cohorts.contains(&id);
    }
    let Some(filters) = &cohort.filters else {
        return false;
    };
    stack.push(id);
    let result = group_matches(&filters.properties, subject, env, stack);
    stack.pop();
    result
}

pub(super) fn group_matches(
    group: &CohortGroup,
    subject: &Subject,
    env: &Environment<'_>,
    stack: &mut Vec<i64>,
) -> bool {
    if group.values.is_empty() {
        return false;
    }
    let mut results = group.values.iter().map(|node| match node {
        CohortNode::Group(inner) => group_matches(inner, subject, env, stack),
        CohortNode::Filter(filter) => {
            let matched = if filter.kind.as_deref() == Some("cohort") {
                cohort_id(&filter.value).is_some_and(|id| in_cohort(id, subject, env, stack))
            } else {
                match_property(filter, &subject.person_properties, &env.ctx)
            };
            matched != filter.negation.unwrap_or(false)
        }
    });
    if group.kind.eq_ignore_ascii_case("OR") {
        results.any(|r| r)
    } else {
        results.all(|r| r)
    }
}
