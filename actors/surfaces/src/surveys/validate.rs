//! PostHog's survey validation rules and texts (as in PostHog): question
//! kinds and their fields, appearance, conditions and schedule. Questions without an `id` get
//! one, so answers (`$survey_response_{id}`) can name them.

use serde_json::{Map, Value};
use uuid::Uuid;

use crate::surface::RecordError;

/// The question kinds the SDKs render.
pub const QUESTION_TYPES: &[&str] = &["open", "link", "rating", "single_choice", "multiple_choice"];

const CONTENT_TYPES: &[&str] = &["text", "html"];

/// Validates a `questions` array and fills in missing question ids.
pub fn questions(value: Value) -> Result<Vec<Value>, RecordError> {
    let not_objects = || RecordError::invalid("Questions must be a list of objects", "questions");
    let Value::Array(list) = value else {
        return Err(not_objects());
    };
    list.into_iter()
        .map(|q| match q {
            Value::Object(q) => question(q).map(Value::Object),
            _ => Err(not_objects()),
        })
        .collect()
}

fn question(mut q: Map<String, Value>) -> Result<Map<String, Value>, RecordError> {
    let invalid = |detail: String| RecordError::invalid(detail, "questions");
    let text = q.get("question").and_then(Value::as_str).unwrap_or("");
    if text.trim().is_empty() {
        return Err(invalid("Question text is required".into()));
    }
    let kind = q.get("type").and_then(Value::as_str).unwrap_or("");
    if !QUESTION_TYPES.contains(&kind) {
        return Err(invalid(format!(
            "Question type must be one of: {}. Got `{kind}`.",
            QUESTION_TYPES.join(", ")
        )));
    }
    if let Some(ct) = q.get("descriptionContentType") {
        if !ct.as_str().is_some_and(|c| CONTENT_TYPES.contains(&c)) {
            return Err(invalid(
                "Question descriptionContentType must be one of ['text', 'html']".into(),
            ));
        }
    }
    match kind {
        "single_choice" | "multiple_choice" => {
            let choices = q
                .get("choices")
                .and_then(Value::as_array)
                .filter(|c| c.iter().all(Value::is_string))
                .ok_or_else(|| invalid("Question choices must be a list of strings".into()))?;
            if choices.is_empty() {
                return Err(invalid("Question choices cannot be empty".into()));
            }
        }
        "link" => {
            if let Some(link) = q.get("link").filter(|l| !l.is_null()) {
                let ok = link.as_str().is_some_and(|l| {
                    url::Url::parse(l).is_ok_and(|u| {
                        (u.scheme() == "https" && u.host_str().is_some()) || u.scheme() == "mailto"
                    })
                });
                if !ok {
                    return Err(invalid(
                        "Link must be a URL with one of these schemes: [https, mailto]".into(),
                    ));
                }
            }
        }
        "rating" => {
            let display = q.get("display").and_then(Value::as_str).unwrap_or("number");
            let scale = q.get("scale").and_then(Value::as_u64).unwrap_or(5);
            let scales: &[u64] = match display {
                "number" => &[2, 3, 5, 7, 10],
                "emoji" => &[2, 3, 5],
                _ => {
                    return Err(invalid(
                        "Rating display must be one of: number, emoji".into(),
                    ))
                }
            };
            if !scales.contains(&scale) {
                return Err(invalid(format!(
                    "Rating scale for {display} display must be one of {scales:?}"
                )));
            }
        }
        _ => {}
    }
    let has_id = q
        .get("id")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    if !has_id {
        q.insert("id".into(), Value::String(Uuid::new_v4().to_string()));
    }
    Ok(q)
}

/// Validates `appearance` (an object or null).
pub fn appearance(value: Value) -> Result<Option<Map<String, Value>>, RecordError> {
    let map = match value {
        Value::Null => return Ok(None),
        Value::Object(map) => map,
        _ => {
            return Err(RecordError::invalid(
                "Appearance must be an object",
                "appearance",
            ))
        }
    };
    if let Some(ct) = map.get("thankYouMessageDescriptionContentType") {
        if !ct.as_str().is_some_and(|c| CONTENT_TYPES.contains(&c)) {
            return Err(RecordError::invalid(
                "thankYouMessageDescriptionContentType must be one of ['text', 'html']",
                "appearance",
            ));
        }
    }
    if let Some(delay) = map.get("surveyPopupDelaySeconds").filter(|d| !d.is_null()) {
        if delay.as_u64().is_none_or(|d| d == 0) {
            return Err(RecordError::invalid(
                "Survey popup delay seconds must be a positive integer",
                "appearance",
            ));
        }
    }
    if let Some(white) = map.get("whiteLabel") {
        if !white.is_boolean() {
            return Err(RecordError::invalid(
                "whiteLabel must be a boolean",
                "appearance",
            ));
        }
    }
    Ok(Some(map))
}

/// Validates `conditions` (an object or null).
pub fn conditions(value: Value) -> Result<Option<Map<String, Value>>, RecordError> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => {
            if let Some(days) = map
                .get("seenSurveyWaitPeriodInDays")
                .filter(|d| !d.is_null())
            {
                if days.as_u64().is_none() {
                    return Err(RecordError::invalid(
                        "seenSurveyWaitPeriodInDays must be a non-negative integer",
                        "conditions",
                    ));
                }
            }
            Ok(Some(map))
        }
        _ => Err(RecordError::invalid(
            "Conditions must be an object",
            "conditions",
        )),
    }
}

/// Validates `schedule` (null, or one of the three values).
pub fn schedule(value: Value) -> Result<Option<String>, RecordError> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) if ["once", "recurring", "always"].contains(&s.as_str()) => Ok(Some(s)),
        _ => Err(RecordError::invalid(
            "Schedule must be one of: once, recurring, always",
            "schedule",
        )),
    }
}

/// A non-negative integer field, or null.
pub fn optional_count(value: Value, attr: &'static str) -> Result<Option<u64>, RecordError> {
    match value {
        Value::Null => Ok(None),
        other => other.as_u64().map(Some).ok_or_else(|| {
            RecordError::invalid(format!("{attr} must be a non-negative integer."), attr)
        }),
    }
}

/// An ISO 8601 date-time field, or null.
pub fn optional_date(
    value: Value,
    attr: &'static str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, RecordError> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => corvid_kernel::parse_timestamp(&s).map(Some).ok_or_else(|| {
            RecordError::invalid(format!("{attr} must be an ISO 8601 date-time."), attr)
        }),
        _ => Err(RecordError::invalid(
            format!("{attr} must be an ISO 8601 date-time."),
            attr,
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn detail(result: Result<Vec<Value>, RecordError>) -> String {
        match result {
            Err(RecordError::Invalid { detail, .. }) => detail,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn every_question_kind_is_checked_and_gets_an_id() {
        let ok = questions(json!([
            {"type": "open", "question": "Why?"},
            {"type": "link", "question": "Read", "link": "https://example.com/x"},
            {"type": "link", "question": "Mail", "link": "mailto:a@example.com"},
            {"type": "rating", "question": "Rate", "display": "emoji", "scale": 5},
            {"type": "single_choice", "question": "Pick", "choices": ["a", "b"]},
            {"type": "multiple_choice", "question": "Pick", "choices": ["a"], "id": "keep"},
        ]))
        .expect("valid");
        assert!(ok
            .iter()
            .all(|q| q["id"].as_str().is_some_and(|id| !id.is_empty())));
        assert_eq!(ok[5]["id"], "keep");

        assert!(
            detail(questions(json!([{"type": "essay", "question": "?"}])))
                .starts_with("Question type must be one of")
        );
        assert_eq!(
            detail(questions(json!([{"type": "open", "question": " "}]))),
            "Question text is required"
        );
        assert_eq!(
            detail(questions(
                json!([{"type": "single_choice", "question": "?", "choices": []}])
            )),
            "Question choices cannot be empty"
        );
        assert_eq!(
            detail(questions(
                json!([{"type": "multiple_choice", "question": "?", "choices": [1]}])
            )),
            "Question choices must be a list of strings"
        );
        assert_eq!(
            detail(questions(
                json!([{"type": "link", "question": "?", "link": "http://x.test"}])
            )),
            "Link must be a URL with one of these schemes: [https, mailto]"
        );
        assert!(detail(questions(
            json!([{"type": "rating", "question": "?", "scale": 4}])
        ))
        .starts_with("Rating scale"));
        assert_eq!(
            detail(questions(json!({"type": "open"}))),
            "Questions must be a list of objects"
        );
        assert_eq!(
            detail(questions(
                json!([{"type": "open", "question": "?", "descriptionContentType": "md"}])
            )),
            "Question descriptionContentType must be one of ['text', 'html']"
        );
    }

    #[test]
    fn appearance_conditions_and_schedule() {
        assert!(appearance(json!({"whiteLabel": true, "surveyPopupDelaySeconds": 3})).is_ok());
        assert!(appearance(json!("red")).is_err());
        assert!(appearance(json!({"surveyPopupDelaySeconds": -1})).is_err());
        assert!(appearance(json!({"whiteLabel": "yes"})).is_err());
        assert!(conditions(json!({"url": "/pricing"})).is_ok());
        assert!(conditions(json!([1])).is_err());
        assert_eq!(
            schedule(json!("once")).expect("ok").as_deref(),
            Some("once")
        );
        assert!(schedule(json!("weekly")).is_err());
    }
}
