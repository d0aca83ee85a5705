//! The flags a survey owns (as in PostHog): the internal targeting flag, which
//! stops showing the survey to people who dismissed or answered it, and the targeting flag
//! built from `targeting_flag_filters` (who may see it). Both are ordinary flags, so `/flags`
//! serves survey display conditions like any other flag.

use serde_json::Value;

use super::model::Survey;
use crate::surface::RecordError;
use corvid_flags::PropertyFilter;
use corvid_flags::{Condition, FlagDefinition, FlagFilters};

/// Every survey flag key starts with this.
pub use corvid_flags::SURVEY_FLAG_PREFIX as FLAG_PREFIX;

/// A new key: the prefix, ten random hex digits and `suffix` (`-custom` for internal flags).
pub fn new_key(suffix: &str) -> String {
    let simple = uuid::Uuid::new_v4().simple().to_string();
    let random = simple.get(..10).unwrap_or_default();
    format!("{FLAG_PREFIX}{random}{suffix}")
}

fn person_filter(key: String, operator: &str, value: Value) -> PropertyFilter {
    PropertyFilter {
        key,
        value,
        operator: Some(operator.into()),
        kind: Some("person".into()),
        negation: None,
        group_type_index: None,
        compiled: Default::default(),
    }
}

/// The internal targeting flag's filters for the survey as it is now: nobody who dismissed or
/// answered (this iteration), and with a wait period, nobody who saw any survey within it.
pub fn internal_filters(survey: &Survey) -> FlagFilters {
    let suffix = survey.property_suffix();
    let not_set = |key: String| person_filter(key, "is_not_set", Value::from("is_not_set"));
    let base = vec![
        not_set(format!("$survey_dismissed/{suffix}")),
        not_set(format!("$survey_responded/{suffix}")),
    ];
    let wait_days = survey
        .conditions
        .as_ref()
        .and_then(|c| c.get("seenSurveyWaitPeriodInDays"))
        .and_then(Value::as_u64)
        .filter(|d| *d > 0);
    let groups = match wait_days {
        None => vec![Condition::new(base, Some(100.0))],
        Some(days) => {
            let mut never_seen = base.clone();
            never_seen.push(not_set("$survey_last_seen_date".into()));
            let mut seen_long_ago = base;
            seen_long_ago.push(person_filter(
                "$survey_last_seen_date".into(),
                "is_date_before",
                Value::from(format!("-{days}d")),
            ));
            vec![
                Condition::new(never_seen, Some(100.0)),
                Condition::new(seen_long_ago, Some(100.0)),
            ]
        }
    };
    FlagFilters {
        groups,
        ..FlagFilters::default()
    }
}

/// A new internal targeting flag for `survey`.
pub fn internal_flag(survey: &Survey) -> FlagDefinition {
    FlagDefinition::new(
        new_key("-custom"),
        format!("Targeting flag for survey {}", survey.name),
        internal_filters(survey),
        survey.is_running(),
    )
}

/// Parses `targeting_flag_filters`, refusing targeting that reaches everyone (PostHog's rule:
/// such targeting is pointless, delete it instead).
pub fn targeting_filters(value: Value) -> Result<FlagFilters, RecordError> {
    let filters: FlagFilters = serde_json::from_value(value).map_err(|e| {
        RecordError::invalid(
            format!("targeting_flag_filters is not a valid flag filter: {e}"),
            "targeting_flag_filters",
        )
    })?;
    let everyone = filters
        .groups
        .iter()
        .any(|g| g.properties.is_empty() && g.rollout_percentage.is_none_or(|r| r >= 100.0));
    if everyone {
        return Err(RecordError::invalid(
            "Invalid operation: User targeting rolls out to everyone. If you want to roll out to everyone, delete this targeting",
            "targeting_flag_filters",
        ));
    }
    Ok(filters)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;

    use super::*;
    use crate::surveys::model::SurveyType;

    fn survey() -> Survey {
        Survey {
            id: uuid::Uuid::nil(),
            project_id: 1,
            name: "NPS".into(),
            description: String::new(),
            kind: SurveyType::Popover,
            schedule: None,
            linked_flag_id: None,
            linked_insight_id: None,
            targeting_flag_id: None,
            internal_targeting_flag_id: None,
            questions: vec![],
            conditions: None,
            appearance: None,
            start_date: Some(Utc::now()),
            end_date: None,
            archived: false,
            responses_limit: None,
            iteration_count: None,
            iteration_frequency_days: None,
            iteration_start_dates: vec![],
            current_iteration: None,
            current_iteration_start_date: None,
            enable_partial_responses: false,
            created_at: Utc::now(),
            created_by: None,
        }
    }

    #[test]
    fn internal_flag_excludes_dismissed_and_responded_per_iteration() {
        let mut s = survey();
        let flag = internal_flag(&s);
        assert!(flag.key.starts_with(FLAG_PREFIX) && flag.key.ends_with("-custom"));
        assert_eq!(flag.key.len(), FLAG_PREFIX.len() + 10 + "-custom".len());
        assert!(flag.active);
        let keys: Vec<&str> = flag.filters.groups[0]
            .properties
            .iter()
            .map(|p| p.key.as_str())
            .collect();
        let id = uuid::Uuid::nil();
        assert_eq!(
            keys,
            vec![
                format!("$survey_dismissed/{id}"),
                format!("$survey_responded/{id}")
            ]
        );
        s.iteration_count = Some(3);
        s.current_iteration = Some(2);
        let filters = internal_filters(&s);
        assert_eq!(
            filters.groups[0].properties[0].key,
            format!("$survey_dismissed/{id}/2")
        );
        s.conditions = Some(
            json!({"seenSurveyWaitPeriodInDays": 7})
                .as_object()
                .cloned()
                .expect("map"),
        );
        let filters = internal_filters(&s);
        assert_eq!(filters.groups.len(), 2);
        assert_eq!(filters.groups[1].properties[2].value, json!("-7d"));
    }

    #[test]
    fn targeting_that_reaches_everyone_is_refused() {
        assert!(targeting_filters(
            json!({"groups": [{"properties": [], "rollout_percentage": 100}]})
        )
        .is_err());
        assert!(targeting_filters(
            json!({"groups": [{"properties": [], "rollout_percentage": null}]})
        )
        .is_err());
        assert!(targeting_filters(
            json!({"groups": [{"properties": [], "rollout_percentage": 20}]})
        )
        .is_ok());
        assert!(targeting_filters(json!({"groups": [{"properties": [{"key": "plan", "value": ["pro"], "operator": "exact", "type": "person"}]}]})).is_ok());
        assert!(targeting_filters(json!({"groups": "x"})).is_err());
    }
}
