//! Property filters of insight queries (and HogQL `{filters}`) compiled to SQL, with every
//! key and value bound as a literal (see [`Generated::bind`]).

use serde::Deserialize;
use serde_json::Value;

use crate::hogql::Generated;
use crate::QueryError;

/// One PostHog property filter: `{key, value, operator, type}`.
#[derive(Debug, Clone, Deserialize)]
pub struct PropertyFilter {
    pub key: String,
    #[serde(default)]
    pub value: Value,
    pub operator: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
}

/// `properties` of a query: a flat list (AND) or a property group.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Properties {
    List(Vec<PropertyFilter>),
    Group(PropertyGroup),
}

/// A group must name its `values`: an untagged filter object (`{key, type, …}`) must never
/// be mistaken for an empty group.
#[derive(Debug, Clone, Deserialize)]
pub struct PropertyGroup {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub values: Vec<GroupItem>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum GroupItem {
    Group(PropertyGroup),
    Filter(PropertyFilter),
}

impl Default for Properties {
    fn default() -> Self {
        Properties::List(Vec::new())
    }
}

/// The JSON column a filter or breakdown of `kind` reads.
pub fn property_column(kind: Option<&str>) -> Result<&'static str, QueryError> {
    match kind.unwrap_or("event") {
        "event" => Ok("properties"),
        "person" => Ok("person_properties"),
        other => Err(QueryError::InvalidInsight(format!(
            "Property type '{other}' is not supported here (use event or person)."
        ))),
    }
}

/// `corvid_prop(<column>, <key>)` with the key bound.
pub fn property_expr(
    sql: &mut Generated,
    kind: Option<&str>,
    key: &str,
) -> Result<String, QueryError> {
    let column = property_column(kind)?;
    let key = sql.bind(key);
    Ok(format!("corvid_prop({column}, {key})"))
}

fn as_text(v: &Value) -> Value {
    match v {
        Value::String(_) => v.clone(),
        Value::Null => Value::Null,
        other => Value::String(other.to_string()),
    }
}

fn values(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items.iter().map(as_text).collect(),
        other => vec![as_text(other)],
    }
}

/// One filter as a SQL condition.
pub fn filter_sql(sql: &mut Generated, f: &PropertyFilter) -> Result<String, QueryError> {
    let column = property_column(f.kind.as_deref())?;
    let key = sql.bind(f.key.clone());
    let prop = format!("corvid_prop({column}, {key})");
    let num = format!("corvid_prop_num({column}, {key})");
    let op = f.operator.as_deref().unwrap_or("exact");
    let number = |sql: &mut Generated| -> Result<String, QueryError> {
        let n = match &f.value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        }
        .ok_or_else(|| {
            QueryError::InvalidInsight(format!(
                "Operator {op} on '{}' needs a number value.",
                f.key
            ))
        })?;
        Ok(sql.bind(n))
    };
    let in_list = |sql: &mut Generated| -> String {
        values(&f.value)
            .into_iter()
            .map(|v| sql.bind(v))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(match op {
        "exact" => format!("({prop} IN ({}))", in_list(sql)),
        "is_not" => format!("({prop} IS NULL OR {prop} NOT IN ({}))", in_list(sql)),
        "icontains" | "not_icontains" => {
            let pattern = format!(
                "%{}%",
                as_text(&f.value)
                    .as_str()
                    .unwrap_or_default()
                    .replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_")
            );
            let p = sql.bind(pattern);
            if op == "icontains" {
                format!("({prop} ILIKE {p})")
            } else {
                format!("({prop} IS NULL OR {prop} NOT ILIKE {p})")
            }
        }
        "regex" | "not_regex" => {
            let pattern = as_text(&f.value).as_str().unwrap_or_default().to_string();
            regex::Regex::new(&pattern).map_err(|e| {
                QueryError::InvalidInsight(format!("Invalid regex for '{}': {e}", f.key))
            })?;
            let p = sql.bind(pattern);
            if op == "regex" {
                format!("({prop} ~ {p})")
            } else {
                format!("({prop} IS NULL OR NOT ({prop} ~ {p}))")
            }
        }
        "gt" => format!("({num} > {})", number(sql)?),
        "gte" => format!("({num} >= {})", number(sql)?),
        "lt" => format!("({num} < {})", number(sql)?),
        "lte" => format!("({num} <= {})", number(sql)?),
        "is_set" => format!("({prop} IS NOT NULL)"),
        "is_not_set" => format!("({prop} IS NULL)"),
        other => {
            return Err(QueryError::InvalidInsight(format!(
                "Unsupported property operator '{other}'."
            )))
        }
    })
}

fn group_sql(sql: &mut Generated, g: &PropertyGroup) -> Result<String, QueryError> {
    let joiner = match g.kind.as_deref().unwrap_or("AND") {
        "OR" => " OR ",
        _ => " AND ",
    };
    let parts = g
        .values
        .iter()
        .map(|item| match item {
            GroupItem::Group(inner) => group_sql(sql, inner),
            GroupItem::Filter(f) => filter_sql(sql, f),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if parts.is_empty() {
        "TRUE".into()
    } else {
        format!("({})", parts.join(joiner))
    })
}

/// All of `properties` as one condition (`TRUE` when empty).
pub fn properties_sql(sql: &mut Generated, properties: &Properties) -> Result<String, QueryError> {
    match properties {
        Properties::List(list) if list.is_empty() => Ok("TRUE".into()),
        Properties::List(list) => Ok(format!(
            "({})",
            list.iter()
                .map(|f| filter_sql(sql, f))
                .collect::<Result<Vec<_>, _>>()?
                .join(" AND ")
        )),
        Properties::Group(g) => group_sql(sql, g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_inside_nested_groups_are_applied() {
        let props: Properties = serde_json::from_value(serde_json::json!({
            "type": "AND",
            "values": [{"type": "OR", "values": [
                {"key": "$browser", "type": "event", "operator": "exact", "value": "Chrome"},
                {"key": "$os", "type": "event", "operator": "is_set"}
            ]}]
        }))
        .expect("parses");
        let mut sql = Generated::default();
        let text = properties_sql(&mut sql, &props).expect("compiles");
        assert!(
            text.contains(" IN (") && text.contains(" OR ") && text.contains("IS NOT NULL"),
            "{text}"
        );
        assert_eq!(
            sql.values.len(),
            3,
            "two keys and one value bound: {:?}",
            sql.values
        );
    }
}
