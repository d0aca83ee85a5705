//! Validation of flag definitions before they are stored.

use super::model::{Condition, FlagDefinition};
use super::properties::PROPERTY_OPERATORS;
use corvid_kernel::StoreError;

/// Checks key format, variant shares, payloads, operators and group type indexes.
/// `group_types` is the number of group types the project has.
pub fn validate_flag(flag: &FlagDefinition, group_types: usize) -> Result<(), StoreError> {
    let key_ok = !flag.key.is_empty()
        && flag.key.len() <= 400
        && flag
            .key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !key_ok {
        return Err(StoreError::invalid(
            "Only letters, numbers, hyphens (-) & underscores (_) are allowed in a flag key.",
            "key",
        ));
    }
    let filters = &flag.filters;
    if let Some(mv) = &filters.multivariate {
        let total: f64 = mv.variants.iter().map(|v| v.rollout_percentage).sum();
        if (total - 100.0).abs() > 1e-9 {
            return Err(StoreError::invalid(
                format!("Invalid variant definitions: variant rollout percentages must sum to 100 (they sum to {total})."),
                "filters",
            ));
        }
        let mut keys: Vec<&str> = mv.variants.iter().map(|v| v.key.as_str()).collect();
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) || keys.iter().any(|k| k.is_empty()) {
            return Err(StoreError::invalid(
                "Variant keys must be non-empty and unique.",
                "filters",
            ));
        }
    }
    for (name, payload) in &filters.payloads {
        if let serde_json::Value::String(text) = payload {
            if serde_json::from_str::<serde_json::Value>(text).is_err() {
                return Err(StoreError::invalid(
                    format!("Payload for `{name}` must be valid JSON."),
                    "filters",
                ));
            }
        }
    }
    let check_index = |index: Option<u8>| match index {
        Some(i) if usize::from(i) >= group_types => Err(StoreError::invalid(
            format!("Group type index {i} does not exist in this project."),
            "filters",
        )),
        _ => Ok(()),
    };
    check_index(filters.aggregation_group_type_index)?;
    for condition in filters.groups.iter().chain(&filters.super_groups) {
        check_condition(condition, group_types)?;
        check_index(condition.aggregation_group_type_index.flatten())?;
        if let Some(p) = condition.rollout_percentage {
            if !(0.0..=100.0).contains(&p) {
                return Err(StoreError::invalid(
                    "rollout_percentage must be between 0 and 100.",
                    "filters",
                ));
            }
        }
    }
    if let Some(runtime) = &flag.evaluation_runtime {
        if !matches!(runtime.as_str(), "server" | "client" | "all") {
            return Err(StoreError::invalid(
                "evaluation_runtime must be `server`, `client` or `all`.",
                "evaluation_runtime",
            ));
        }
    }
    Ok(())
}

fn check_condition(condition: &Condition, group_types: usize) -> Result<(), StoreError> {
    for filter in &condition.properties {
        let operator = filter.operator.as_deref().unwrap_or("exact");
        let known = match filter.kind.as_deref() {
            Some("cohort") => matches!(operator, "in" | "not_in" | "exact"),
            Some("flag") => matches!(operator, "flag_evaluates_to" | "exact"),
            _ => PROPERTY_OPERATORS.contains(&operator),
        };
        if !known {
            return Err(StoreError::invalid(
                format!("Unknown operator `{operator}`."),
                "filters",
            ));
        }
        if filter.kind.as_deref() == Some("group") {
            match filter.group_type_index {
                Some(i) if i >= 0 && (i as usize) < group_types => {}
                _ => {
                    return Err(StoreError::invalid(
                        "A group property filter needs an existing group_type_index.",
                        "filters",
                    ))
                }
            }
        }
    }
    Ok(())
}

/// Checks a cohort's filters: known operators, and nested cohorts that exist (and are not the
/// cohort itself).
pub fn validate_cohort(
    cohort: &super::model::CohortDefinition,
    existing: &[super::store::CohortRecord],
) -> Result<(), StoreError> {
    use super::model::{CohortGroup, CohortNode};
    fn walk(
        group: &CohortGroup,
        id: i64,
        existing: &[super::store::CohortRecord],
    ) -> Result<(), StoreError> {
        if !matches!(
            group.kind.to_ascii_uppercase().as_str(),
            "AND" | "OR" | "PROPERTY"
        ) {
            return Err(StoreError::invalid(
                format!("Unknown group type `{}`.", group.kind),
                "filters",
            ));
        }
        for node in &group.values {
            match node {
                CohortNode::Group(inner) => walk(inner, id, existing)?,
                CohortNode::Filter(f) if f.kind.as_deref() == Some("cohort") => {
                    let target = f
                        .value
                        .as_i64()
                        .or_else(|| f.value.as_str().and_then(|s| s.parse().ok()));
                    let found = target.is_some_and(|t| {
                        t != id && existing.iter().any(|c| c.definition.id == t && !c.deleted)
                    });
                    if !found {
                        return Err(StoreError::invalid(
                            format!("Cohort {} does not exist.", f.value),
                            "filters",
                        ));
                    }
                }
                CohortNode::Filter(f) => {
                    let operator = f.operator.as_deref().unwrap_or("exact");
                    if !PROPERTY_OPERATORS.contains(&operator) {
                        return Err(StoreError::invalid(
                            format!("Unknown operator `{operator}`."),
                            "filters",
                        ));
                    }
                }
            }
        }
        Ok(())
    }
    match &cohort.filters {
        Some(filters) => walk(&filters.properties, cohort.id, existing),
        None => Ok(()),
    }
}
