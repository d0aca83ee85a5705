//! PostHog's query-answer body (`HogQLQueryResponse` and the insight responses), rendered in
//! one place: `POST /query/` answers it as is, an endpoint run adds its own fields beside it.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use serde_json::Value;

use crate::QueryAnswer;

/// One `timings` entry: a step (`k`) and the seconds it took (`t`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timing {
    pub k: String,
    pub t: f64,
}

/// The answer to a query as PostHog's clients read it. Optional fields are left out rather
/// than sent as `null`, as PostHog does for `columns`, `types`, `limit` and `offset`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryResponse {
    /// Row arrays for SQL; series or cohort objects for insights.
    pub results: Vec<Value>,
    /// Column names (SQL only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
    /// `[name, type]` pairs (SQL only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<(String, String)>>,
    /// Whether rows past this page exist.
    #[serde(rename = "hasMore")]
    pub has_more: bool,
    /// The page asked for, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// The statement as run; `None` leaves it out (endpoint runs without `debug`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hogql: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Vec<Timing>>,
    /// Whether the answer came from a cache rather than this request's run.
    pub is_cached: bool,
    /// When the answer was computed.
    pub last_refresh: DateTime<Utc>,
    /// The project timezone the query ran in.
    pub timezone: String,
    /// Always `null` on success (PostHog keeps the key).
    pub error: Option<String>,
}

impl QueryResponse {
    /// An answer of `results` computed now, with nothing else set.
    pub fn of(results: Vec<Value>, timezone: Tz) -> QueryResponse {
        QueryResponse {
            results,
            columns: None,
            types: None,
            has_more: false,
            limit: None,
            offset: None,
            hogql: None,
            timings: None,
            is_cached: false,
            last_refresh: Utc::now(),
            timezone: timezone.name().to_string(),
            error: None,
        }
    }
}

impl QueryAnswer {
    /// This answer as PostHog's response body, computed now in `timezone`.
    pub fn into_response(self, timezone: Tz) -> QueryResponse {
        QueryResponse {
            columns: self.columns,
            types: self.types,
            has_more: self.has_more,
            hogql: Some(self.hogql),
            timings: Some(vec![Timing {
                k: "./execute".into(),
                t: self.elapsed_secs,
            }]),
            ..QueryResponse::of(self.results, timezone)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_sql_answer_renders_posthogs_keys_and_leaves_out_what_it_lacks() {
        let answer = QueryAnswer {
            results: vec![json!([1, "a"])],
            columns: Some(vec!["n".into(), "s".into()]),
            types: Some(vec![
                ("n".into(), "UInt64".into()),
                ("s".into(), "String".into()),
            ]),
            has_more: true,
            hogql: "SELECT 1".into(),
            elapsed_secs: 0.5,
        };
        let body =
            serde_json::to_value(answer.into_response(Tz::Europe__Paris)).expect("serializes");
        assert_eq!(body["results"], json!([[1, "a"]]));
        assert_eq!(body["columns"], json!(["n", "s"]));
        assert_eq!(body["types"], json!([["n", "UInt64"], ["s", "String"]]));
        assert_eq!(body["hasMore"], json!(true));
        assert_eq!(body["hogql"], json!("SELECT 1"));
        assert_eq!(body["timings"], json!([{"k": "./execute", "t": 0.5}]));
        assert_eq!(body["is_cached"], json!(false));
        assert_eq!(body["timezone"], json!("Europe/Paris"));
        assert!(body["last_refresh"].is_string());
        let object = body.as_object().expect("an object");
        assert!(object.contains_key("error") && body["error"].is_null());
        assert!(!object.contains_key("limit") && !object.contains_key("offset"));
    }

    #[test]
    fn an_insight_answer_has_no_columns_or_types() {
        let answer = QueryAnswer {
            results: vec![json!({"label": "x"})],
            columns: None,
            types: None,
            has_more: false,
            hogql: String::new(),
            elapsed_secs: 0.0,
        };
        let body = serde_json::to_value(answer.into_response(Tz::UTC)).expect("serializes");
        let object = body.as_object().expect("an object");
        assert!(!object.contains_key("columns") && !object.contains_key("types"));
        assert_eq!(body["timezone"], json!("UTC"));
    }
}
