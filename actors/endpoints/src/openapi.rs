//! The per-endpoint OpenAPI 3.0.3 document (PostHog's `openapi.py` shape): one POST path, a
//! request schema with the endpoint's variables typed, and the personal-API-key scheme.

use serde_json::{json, Map, Value};

use super::model::{Endpoint, EndpointVersion, InsightVariable, VariableType};
use super::request::sql_variables;
use corvid_query::insight_breakdowns;

/// The document for `version` of `endpoint`, served from `base_url`.
pub fn document(
    endpoint: &Endpoint,
    version: &EndpointVersion,
    variables: &[InsightVariable],
    base_url: &str,
) -> Value {
    let name = &endpoint.name;
    let described = (!version.description.is_empty()).then(|| version.description.clone());
    let path = format!("/api/projects/{}/endpoints/{name}/run", endpoint.project_id);
    let vars = variables_schema(version, variables);
    let required_vars = vars
        .as_ref()
        .and_then(|v| v.get("required"))
        .and_then(Value::as_array)
        .is_some_and(|r| !r.is_empty());

    let mut request = json!({
        "type": "object",
        "properties": {
            "client_query_id": {"type": "string", "description": "Client provided query ID. Can be used to retrieve the status or cancel the query."},
            "filters_override": {"$ref": "#/components/schemas/DashboardFilter"},
            "refresh": {
                "type": "string",
                "enum": ["cache", "force", "direct"],
                "default": "cache",
                "description": "cache: serve a fresh cached result when there is one; force: recompute; direct: bypass materialization (materialized endpoints only)."
            },
            "version": {"type": "integer", "description": format!("Endpoint version to run (1-{}). Defaults to the latest.", endpoint.current_version)},
            "limit": {"type": "integer", "minimum": 1, "description": "Rows per page (SQL endpoints)."},
            "debug": {"type": "boolean", "default": false, "description": "Include debugging data such as the executed query."}
        },
        "additionalProperties": false
    });
    let mut schemas = Map::new();
    if let Some(vars) = vars {
        request["properties"]["variables"] = json!({"$ref": "#/components/schemas/Variables"});
        if required_vars {
            request["required"] = json!(["variables"]);
        }
        schemas.insert("Variables".into(), vars);
    }
    schemas.insert("EndpointRunRequest".into(), request);
    schemas.insert("DashboardFilter".into(), json!({
        "type": "object",
        "properties": {
            "date_from": {"type": "string", "nullable": true, "example": "-7d", "description": "Start date: relative (-7d, -30d, mStart) or absolute (2024-01-01)."},
            "date_to": {"type": "string", "nullable": true, "example": "2024-12-31", "description": "End date: relative (now, dStart) or absolute."},
            "properties": {"type": "array", "items": {"$ref": "#/components/schemas/PropertyFilter"}}
        }
    }));
    schemas.insert("PropertyFilter".into(), json!({
        "type": "object",
        "required": ["key"],
        "properties": {
            "key": {"type": "string"},
            "value": {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "array", "items": {"type": "string"}}]},
            "operator": {"type": "string", "enum": ["exact", "is_not", "icontains", "not_icontains", "regex", "not_regex", "gt", "lt", "gte", "lte", "is_set", "is_not_set", "is_date_exact", "is_date_before", "is_date_after", "in", "not_in"]},
            "type": {"type": "string", "enum": ["event", "person", "session", "cohort", "group", "hogql"]}
        }
    }));

    json!({
        "openapi": "3.0.3",
        "info": {
            "title": name,
            "description": described.clone().unwrap_or_else(|| format!("PostHog Endpoint: {name}")),
            "version": version.version.to_string(),
        },
        "servers": [{"url": base_url}],
        "paths": {
            path: {
                "post": {
                    "operationId": format!("run_{}", name.replace('-', "_")),
                    "summary": format!("Execute {name}"),
                    "description": described.unwrap_or_else(|| format!("Execute the {name} endpoint")),
                    "security": [{"PersonalAPIKey": []}],
                    "requestBody": {
                        "required": required_vars,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EndpointRunRequest"}}}
                    },
                    "responses": {
                        "200": {
                            "description": "Query results",
                            "content": {"application/json": {"schema": {
                                "type": "object",
                                "required": ["results"],
                                "properties": {
                                    "results": {"type": "array", "items": {}},
                                    "columns": {"type": "array", "items": {"type": "string"}},
                                    "hasMore": {"type": "boolean"}
                                }
                            }}}
                        },
                        "400": {"description": "Invalid request"},
                        "401": {"description": "Authentication required"},
                        "404": {"description": "Endpoint not found"}
                    }
                }
            }
        },
        "components": {
            "securitySchemes": {
                "PersonalAPIKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Personal API key (or OAuth access token) sent as a bearer token. Get one at /settings/user-api-keys"
                }
            },
            "schemas": schemas,
        }
    })
}

fn variables_schema(version: &EndpointVersion, project: &[InsightVariable]) -> Option<Value> {
    let mut properties = Map::new();
    let mut required = Vec::new();
    if version.is_hogql() {
        for (code, value) in sql_variables(version) {
            let kind = project.iter().find(|v| v.code_name == code).map(|v| v.kind);
            let mut schema = match kind {
                Some(VariableType::Number) => json!({"type": "number"}),
                Some(VariableType::Boolean) => json!({"type": "boolean"}),
                Some(VariableType::List) => json!({"type": "array", "items": {"type": "string"}}),
                Some(VariableType::Date) => json!({"type": "string", "format": "date"}),
                _ => json!({"type": "string"}),
            };
            schema["description"] = json!(format!("Variable: {code}"));
            match value.filter(|v| !v.is_null()) {
                Some(example) if !version.is_materialized() => schema["example"] = example,
                Some(example) => {
                    schema["example"] = example;
                    required.push(code.clone());
                }
                None => required.push(code.clone()),
            }
            properties.insert(code, schema);
        }
    } else {
        for property in insight_breakdowns(&version.query).unwrap_or_default() {
            properties.insert(
                property.clone(),
                json!({"type": "string", "example": "Chrome", "description": format!("Filter to one value of the breakdown property {property}")}),
            );
            if version.is_materialized() {
                required.push(property);
            }
        }
        if !version.is_materialized() {
            properties.insert("date_from".into(), json!({"type": "string", "description": "Start date (YYYY-MM-DD)", "example": "2024-01-01"}));
            properties.insert("date_to".into(), json!({"type": "string", "description": "End date (YYYY-MM-DD)", "example": "2024-12-31"}));
        }
    }
    if properties.is_empty() {
        return None;
    }
    let mut schema = json!({
        "type": "object",
        "description": "Values for the endpoint's variables.",
        "properties": properties,
        "additionalProperties": false,
    });
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    Some(schema)
}
