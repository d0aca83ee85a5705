//! How a survey is shown to the API and to the SDKs.

use serde_json::{json, Value};

use super::SurveyView;
use corvid_flags::FlagRecord;

impl SurveyView {
    pub(super) fn flag_key(flag: &Option<FlagRecord>) -> Value {
        flag.as_ref()
            .map(|f| Value::String(f.definition.key.clone()))
            .unwrap_or(Value::Null)
    }

    /// The admin API's shape.
    pub fn admin_json(&self) -> Value {
        let s = &self.survey;
        let summary = |f: &Option<FlagRecord>| f.as_ref().map(FlagRecord::summary);
        json!({
            "id": s.id,
            "name": s.name,
            "description": s.description,
            "type": s.kind,
            "schedule": s.schedule,
            "linked_flag": summary(&self.linked_flag),
            "linked_flag_id": s.linked_flag_id,
            "linked_insight_id": s.linked_insight_id,
            "targeting_flag": summary(&self.targeting_flag),
            "internal_targeting_flag": summary(&self.internal_targeting_flag),
            "questions": s.questions,
            "conditions": s.conditions,
            "appearance": s.appearance,
            "created_at": s.created_at,
            "created_by": s.created_by,
            "start_date": s.start_date,
            "end_date": s.end_date,
            "archived": s.archived,
            "responses_limit": s.responses_limit,
            "feature_flag_keys": [
                {"key": "linked_flag_key", "value": Self::flag_key(&self.linked_flag)},
                {"key": "targeting_flag_key", "value": Self::flag_key(&self.targeting_flag)},
                {"key": "internal_targeting_flag_key", "value": Self::flag_key(&self.internal_targeting_flag)},
                {"key": "internal_response_sampling_flag_key", "value": null},
            ],
            "iteration_count": s.iteration_count,
            "iteration_frequency_days": s.iteration_frequency_days,
            "iteration_start_dates": s.iteration_start_dates,
            "current_iteration": s.current_iteration,
            "current_iteration_start_date": s.current_iteration_start_date,
            "response_sampling_start_date": null,
            "response_sampling_interval_type": null,
            "response_sampling_interval": null,
            "response_sampling_limit": null,
            "response_sampling_daily_limits": null,
            "enable_partial_responses": s.enable_partial_responses,
        })
    }

    /// The public (`/api/surveys/?token=`) shape: what posthog-js reads.
    pub fn public_json(&self) -> Value {
        let s = &self.survey;
        json!({
            "id": s.id,
            "name": s.name,
            "type": s.kind,
            "linked_flag_key": Self::flag_key(&self.linked_flag),
            "targeting_flag_key": Self::flag_key(&self.targeting_flag),
            "internal_targeting_flag_key": Self::flag_key(&self.internal_targeting_flag),
            "questions": s.questions,
            "conditions": s.conditions,
            "appearance": s.appearance,
            "start_date": s.start_date,
            "end_date": s.end_date,
            "current_iteration": s.current_iteration,
            "current_iteration_start_date": s.current_iteration_start_date,
            "schedule": s.schedule,
            "enable_partial_responses": s.enable_partial_responses,
        })
    }
}
