//! PostHog's person-deletion commands as typed requests: which person a path names, what a
//! `bulk_delete` body asks for, and the summary it is answered with. The error texts are
//! PostHog's, word for word (scripts match on them).

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::store::ErasureOptions;

/// At most this many ids or distinct ids per `bulk_delete` call.
pub const MAX_BULK_IDS: usize = 1000;

/// A person as a path names it: its UUID, or a numeric id (PostHog's primary key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersonRef {
    Uuid(Uuid),
    /// Corvid keeps no numeric person ids: such a person is never found.
    Numeric(u64),
}

impl PersonRef {
    /// Reads a path's person id; anything neither a UUID nor a number is refused with
    /// PostHog's hint that a distinct id was probably meant.
    pub fn parse(text: &str) -> Result<PersonRef, String> {
        if let Ok(id) = Uuid::try_parse(text) {
            return Ok(PersonRef::Uuid(id));
        }
        text.parse::<u64>().map(PersonRef::Numeric).map_err(|_| {
            format!(
                "The ID provided does not look like a personID. If you are using a distinctId, \
                 please use /persons?distinct_id={text} instead."
            )
        })
    }
}

/// Whom an erasure names.
#[derive(Debug, Clone, PartialEq)]
pub enum ErasureTargets {
    /// Person UUIDs (text that is not one names nobody).
    Ids(Vec<String>),
    DistinctIds(Vec<String>),
}

/// A `bulk_delete` request.
#[derive(Debug, Clone)]
pub struct BulkErasure {
    pub targets: ErasureTargets,
    pub options: ErasureOptions,
}

/// Python's truthiness of a JSON value, which PostHog's `bool(request.data.get(…))` applies.
fn truthy(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// A list of ids from `field` (numbers are read as their text); `None` when absent or empty.
fn id_list(body: &Value, field: &str) -> Result<Option<Vec<String>>, String> {
    let value = body.get(field);
    if !truthy(value) {
        return Ok(None);
    }
    let Some(Value::Array(items)) = value else {
        return Err(format!("{field} must be a list"));
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            _ => Err(format!("{field} must be a list of strings")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl BulkErasure {
    /// Decodes a `bulk_delete` body, checked in PostHog's order.
    pub fn from_json(body: &Value, requested_by: Option<String>) -> Result<BulkErasure, String> {
        let distinct_ids = id_list(body, "distinct_ids")?;
        let ids = id_list(body, "ids")?;
        let targets = match (distinct_ids, ids) {
            (Some(_), Some(_)) => {
                return Err("You must provide either distinct_ids or ids, not both".into())
            }
            (Some(d), None) if d.len() > MAX_BULK_IDS => {
                return Err(format!(
                    "You can only pass {MAX_BULK_IDS} distinct_ids in one call"
                ))
            }
            (None, Some(i)) if i.len() > MAX_BULK_IDS => {
                return Err(format!("You can only pass {MAX_BULK_IDS} ids in one call"))
            }
            (Some(d), None) => ErasureTargets::DistinctIds(d),
            (None, Some(i)) => ErasureTargets::Ids(i),
            (None, None) => return Err("You need to specify either distinct_ids or ids".into()),
        };
        Ok(BulkErasure {
            targets,
            options: ErasureOptions {
                delete_events: truthy(body.get("delete_events")),
                keep_person: truthy(body.get("keep_person")),
                requested_by,
            },
        })
    }
}

/// PostHog's `bulk_delete` answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ErasureSummary {
    pub persons_found: usize,
    pub persons_deleted: usize,
    pub events_queued_for_deletion: bool,
    /// Corvid stores no recordings: always false.
    pub recordings_queued_for_deletion: bool,
    pub deletion_errors: Vec<DeletionError>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeletionError {
    pub person_uuid: Uuid,
}

/// Which `deletion_status` rows to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    All,
    Pending,
    Completed,
}

impl StatusFilter {
    /// PostHog's choice field: `pending`, `completed` or `all` (the default).
    pub fn parse(text: Option<&str>) -> Result<StatusFilter, String> {
        match text {
            None | Some("all") => Ok(StatusFilter::All),
            Some("pending") => Ok(StatusFilter::Pending),
            Some("completed") => Ok(StatusFilter::Completed),
            Some(other) => Err(format!("\"{other}\" is not a valid choice.")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn error(body: Value) -> String {
        BulkErasure::from_json(&body, None).expect_err("refused")
    }

    #[test]
    fn bulk_requests_are_checked_in_posthogs_order_with_its_texts() {
        let many: Vec<String> = (0..1001).map(|i| format!("d{i}")).collect();
        assert_eq!(
            error(json!({"ids": ["a"], "distinct_ids": many})),
            "You must provide either distinct_ids or ids, not both"
        );
        assert_eq!(
            error(json!({"distinct_ids": many})),
            "You can only pass 1000 distinct_ids in one call"
        );
        assert_eq!(
            error(json!({"ids": many})),
            "You can only pass 1000 ids in one call"
        );
        assert_eq!(
            error(json!({"ids": [], "distinct_ids": []})),
            "You need to specify either distinct_ids or ids"
        );
        let ok = BulkErasure::from_json(
            &json!({"distinct_ids": ["a", 7], "delete_events": "yes", "keep_person": 0}),
            None,
        )
        .expect("valid");
        assert_eq!(
            ok.targets,
            ErasureTargets::DistinctIds(vec!["a".into(), "7".into()])
        );
        assert!(ok.options.delete_events && !ok.options.keep_person);
    }

    #[test]
    fn a_path_id_is_a_uuid_or_a_number() {
        let id = Uuid::new_v4();
        assert_eq!(PersonRef::parse(&id.to_string()), Ok(PersonRef::Uuid(id)));
        assert_eq!(PersonRef::parse("42"), Ok(PersonRef::Numeric(42)));
        assert_eq!(
            PersonRef::parse("user@example.com").expect_err("refused"),
            "The ID provided does not look like a personID. If you are using a distinctId, \
             please use /persons?distinct_id=user@example.com instead."
        );
    }
}
