//! The run request (`EndpointRunRequest`) and its validation, in PostHog's order and with its
//! error texts: query-string and body integers, pagination, version, activity, overrides,
//! refresh mode, then variables.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

use super::error::EndpointError;
use super::model::{Endpoint, EndpointVersion};
use corvid_query::insight_breakdowns;

/// `refresh`: where a run may take its answer from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refresh {
    /// A fresh cached answer, else materialized, else a direct run.
    Cache,
    /// Skip the cache; materialized, else direct.
    Force,
    /// Skip cache and materialization (materialized endpoints only).
    Direct,
}

/// A request to run an endpoint (PostHog's `EndpointRunRequest`), decoded and checked.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub variables: Map<String, Value>,
    pub refresh: Refresh,
    pub version: Option<u32>,
    pub limit: Option<usize>,
    pub offset: Option<usize>,
    pub debug: bool,
    pub client_query_id: Option<String>,
    pub filters_override: Option<Value>,
    query_override: bool,
}

const FIELDS: [&str; 9] = [
    "variables",
    "refresh",
    "version",
    "limit",
    "offset",
    "debug",
    "client_query_id",
    "filters_override",
    "query_override",
];

/// An integer parameter from the body (wins) or the query string, at least `min`.
fn int_param(
    name: &str,
    body: Option<&Value>,
    query: &HashMap<String, String>,
    min: u64,
) -> Result<Option<u64>, EndpointError> {
    let bad =
        |shown: String| EndpointError::plain(400, format!("Invalid {name} parameter: {shown}"));
    match body {
        Some(Value::Null) | None => {}
        Some(v) => {
            let n = match v {
                Value::Number(n) => n.as_u64(),
                Value::String(s) => s.trim().parse::<u64>().ok(),
                _ => None,
            };
            return match n {
                Some(n) if n >= min => Ok(Some(n)),
                _ => Err(bad(match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })),
            };
        }
    }
    match query.get(name) {
        None => Ok(None),
        Some(s) => match s.trim().parse::<u64>() {
            Ok(n) if n >= min => Ok(Some(n)),
            _ => Err(bad(s.clone())),
        },
    }
}

impl RunRequest {
    /// The run request from the body (an object, or nothing) and the query-string parameters,
    /// checked in PostHog's order with its error texts.
    pub fn from_parts(
        body: Option<Value>,
        query: &HashMap<String, String>,
    ) -> Result<RunRequest, EndpointError> {
        parse(body, query)
    }
}

/// Parses the body (an object, or nothing) and the query-string parameters.
fn parse(
    body: Option<Value>,
    query: &HashMap<String, String>,
) -> Result<RunRequest, EndpointError> {
    let body = match body {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(EndpointError::Invalid {
                attr: None,
                detail: "The request body must be a JSON object.".into(),
            })
        }
    };
    if let Some(extra) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(EndpointError::invalid(
            extra,
            "Extra inputs are not permitted",
        ));
    }
    let version = int_param("version", body.get("version"), query, 1)?;
    let limit = int_param("limit", body.get("limit"), query, 1)?;
    let offset = int_param("offset", body.get("offset"), query, 0)?;
    if offset.is_some() && limit.is_none() {
        return Err(EndpointError::plain(400, "offset requires limit to be set"));
    }
    let refresh = match body.get("refresh") {
        None | Some(Value::Null) => Refresh::Cache,
        Some(Value::String(s)) if s == "cache" => Refresh::Cache,
        Some(Value::String(s)) if s == "force" => Refresh::Force,
        Some(Value::String(s)) if s == "direct" => Refresh::Direct,
        Some(_) => {
            return Err(EndpointError::invalid(
                "refresh",
                "Input should be 'cache', 'force' or 'direct'",
            ))
        }
    };
    let variables = match body.get("variables") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(EndpointError::invalid(
                "variables",
                "Input should be a valid dictionary",
            ))
        }
    };
    let debug = match body.get("debug") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(EndpointError::invalid(
                "debug",
                "Input should be a valid boolean",
            ))
        }
    };
    Ok(RunRequest {
        variables,
        refresh,
        version: version.map(|v| v.min(u64::from(u32::MAX)) as u32),
        limit: limit.map(|l| l as usize),
        offset: offset.map(|o| o as usize),
        debug,
        client_query_id: body
            .get("client_query_id")
            .and_then(Value::as_str)
            .map(str::to_string),
        filters_override: body
            .get("filters_override")
            .filter(|v| !v.is_null())
            .cloned(),
        query_override: body.get("query_override").is_some_and(|v| !v.is_null()),
    })
}

/// The version to run, checked against the request (PostHog's steps 3–10).
pub fn check<'a>(
    endpoint: &'a Endpoint,
    req: &RunRequest,
) -> Result<&'a EndpointVersion, EndpointError> {
    let version = match req.version {
        Some(n) => endpoint.version(n).ok_or_else(|| {
            let mut extra = Map::new();
            extra.insert(
                "current_version".into(),
                Value::from(endpoint.current_version),
            );
            EndpointError::Plain {
                status: 404,
                detail: format!("Version {n} not found for endpoint '{}'", endpoint.name),
                extra,
            }
        })?,
        None => endpoint
            .latest()
            .ok_or_else(|| EndpointError::plain(404, "No version found for this endpoint"))?,
    };
    if !version.is_active {
        return Err(EndpointError::Invalid {
            attr: None,
            detail: format!(
                "Version {} is inactive and cannot be executed.",
                version.version
            ),
        });
    }
    if req.query_override {
        return Err(EndpointError::invalid(
            "query_override",
            "Not allowed. Use variables instead.",
        ));
    }
    let hogql = version.is_hogql();
    if hogql && req.filters_override.is_some() {
        return Err(EndpointError::invalid(
            "filters_override",
            "Not allowed for HogQL endpoints. Use variables instead.",
        ));
    }
    if !hogql {
        if req.offset.is_some() {
            return Err(EndpointError::invalid(
                "offset",
                "offset is only supported for HogQL endpoints",
            ));
        }
        if req.limit.is_some() && !version.is_materialized() {
            return Err(EndpointError::invalid(
                "limit",
                format!(
                    "Limit/offset parameters are only supported for HogQLQuery, not {}",
                    version.kind()
                ),
            ));
        }
    }
    if req.refresh == Refresh::Direct && !version.is_materialized() {
        return Err(EndpointError::invalid(
            "refresh",
            "'direct' refresh mode is only valid for materialized endpoints. Use 'cache' or 'force' instead, or enable materialization on this endpoint.",
        ));
    }
    let allowed = allowed_variables(version);
    let mut unknown: Vec<&str> = req
        .variables
        .keys()
        .filter(|k| !allowed.contains(k.as_str()))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(EndpointError::invalid(
            "variables",
            format!("Unknown variable(s): {}", unknown.join(", ")),
        ));
    }
    let mut missing: Vec<String> = required_variables(version)
        .into_iter()
        .filter(|name| !req.variables.contains_key(name))
        .collect();
    if !missing.is_empty() {
        missing.sort_unstable();
        let quoted: Vec<String> = missing.iter().map(|m| format!("'{m}'")).collect();
        return Err(EndpointError::invalid(
            "variables",
            format!("Required variable(s) {} not provided", quoted.join(", ")),
        ));
    }
    Ok(version)
}

/// The `{variables.x}` code names stored with a SQL query, with whether each has a value.
pub fn sql_variables(version: &EndpointVersion) -> Vec<(String, Option<Value>)> {
    let Some(vars) = version.query.get("variables").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Option<Value>)> = vars
        .values()
        .filter_map(|v| {
            let code = v.get("code_name")?.as_str()?.to_string();
            let is_null = v.get("isNull").and_then(Value::as_bool) == Some(true);
            let value = v.get("value").filter(|x| !x.is_null()).cloned();
            Some((code, if is_null { Some(Value::Null) } else { value }))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Keys a run's `variables` may have.
pub fn allowed_variables(version: &EndpointVersion) -> BTreeSet<String> {
    if version.is_hogql() {
        return sql_variables(version).into_iter().map(|(c, _)| c).collect();
    }
    let mut out: BTreeSet<String> = insight_breakdowns(&version.query)
        .unwrap_or_default()
        .into_iter()
        .collect();
    if !version.is_materialized() {
        out.insert("date_from".into());
        out.insert("date_to".into());
    }
    out
}

/// Variables a run must give: on a materialized endpoint every one (else one stored result
/// would answer for all tenants); otherwise SQL variables without a stored value.
pub fn required_variables(version: &EndpointVersion) -> Vec<String> {
    if version.is_hogql() {
        return sql_variables(version)
            .into_iter()
            .filter(|(_, value)| version.is_materialized() || value.is_none())
            .map(|(c, _)| c)
            .collect();
    }
    if version.is_materialized() {
        return insight_breakdowns(&version.query).unwrap_or_default();
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(body: Value, q: &[(&str, &str)]) -> Result<RunRequest, EndpointError> {
        let q: HashMap<String, String> = q
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(Some(body), &q)
    }

    fn text(e: EndpointError) -> String {
        e.to_string()
    }

    #[test]
    fn integers_and_pagination_are_checked_first() {
        assert_eq!(
            text(p(json!({}), &[("version", "x")]).expect_err("bad")),
            "Invalid version parameter: x"
        );
        assert_eq!(
            text(p(json!({"limit": 0}), &[]).expect_err("bad")),
            "Invalid limit parameter: 0"
        );
        assert_eq!(
            text(p(json!({"offset": -1, "limit": 1}), &[]).expect_err("bad")),
            "Invalid offset parameter: -1"
        );
        assert_eq!(
            text(p(json!({"offset": 2}), &[]).expect_err("bad")),
            "offset requires limit to be set"
        );
        let r = p(json!({"version": 2}), &[("version", "1"), ("limit", "5")]).expect("valid");
        assert_eq!(
            (r.version, r.limit),
            (Some(2), Some(5)),
            "the body wins; query params fill in"
        );
    }

    #[test]
    fn unknown_fields_and_bad_refresh_are_rejected() {
        let e = p(json!({"colour": 1}), &[]).expect_err("unknown");
        assert!(matches!(e, EndpointError::Invalid { attr: Some(ref a), .. } if a == "colour"));
        let e = p(json!({"refresh": "blocking"}), &[]).expect_err("refresh");
        assert!(matches!(e, EndpointError::Invalid { attr: Some(ref a), .. } if a == "refresh"));
    }
}
