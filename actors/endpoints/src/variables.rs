//! Insight variables: the values SQL endpoints reference as `{variables.<code_name>}`. Their
//! rules (the code-name grammar, a default that fits the type, unique code names) live here.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::model::{code_name_from, InsightVariable, VariableType};
use super::{EndpointError, Endpoints};
use corvid_activity::Actor;

/// A create or partial update of a variable (absent fields keep their value).
#[derive(Debug, Clone, Default)]
pub struct VariableChanges {
    pub name: Option<String>,
    pub code_name: Option<String>,
    pub kind: Option<VariableType>,
    pub default_value: Option<Value>,
}

/// A code name is what SQL writes after `variables.`: a letter or `_`, then letters, digits, `_`.
fn check_code_name(code: &str) -> Result<(), EndpointError> {
    let mut chars = code.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(EndpointError::invalid(
            "code_name",
            format!("Invalid code_name '{code}': use letters, digits and underscores, starting with a letter."),
        ))
    }
}

fn check_default(kind: VariableType, value: &Value) -> Result<(), EndpointError> {
    let ok = match (kind, value) {
        (_, Value::Null) => true,
        (VariableType::String, Value::String(_)) => true,
        (VariableType::Number, Value::Number(_)) => true,
        (VariableType::Number, Value::String(s)) => s.trim().parse::<f64>().is_ok(),
        (VariableType::Boolean, Value::Bool(_)) => true,
        (VariableType::List, Value::Array(_)) => true,
        (VariableType::List, Value::String(_)) => true,
        (VariableType::Date, Value::String(s)) => {
            chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok()
                || chrono::DateTime::parse_from_rfc3339(s).is_ok()
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(EndpointError::invalid(
            "default_value",
            format!("default_value does not fit type {kind:?}."),
        ))
    }
}

/// A new variable from a create request: `name` and `type` are required, the code name
/// defaults to one derived from the name.
fn new_variable(
    project_id: u64,
    changes: VariableChanges,
    now: DateTime<Utc>,
) -> Result<InsightVariable, EndpointError> {
    let name = changes
        .name
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| EndpointError::invalid("name", "This field is required."))?;
    let kind = changes
        .kind
        .ok_or_else(|| EndpointError::invalid("type", "This field is required."))?;
    let code_name = changes.code_name.unwrap_or_else(|| code_name_from(&name));
    check_code_name(&code_name)?;
    let default_value = changes.default_value.unwrap_or(Value::Null);
    check_default(kind, &default_value)?;
    Ok(InsightVariable {
        id: Uuid::new_v4(),
        project_id,
        name,
        code_name,
        kind,
        default_value,
        created_at: now,
        updated_at: now,
    })
}

fn apply(
    v: &mut InsightVariable,
    changes: VariableChanges,
    now: DateTime<Utc>,
) -> Result<(), EndpointError> {
    if let Some(name) = changes.name {
        v.name = name;
    }
    if let Some(code) = changes.code_name {
        check_code_name(&code)?;
        v.code_name = code;
    }
    if let Some(kind) = changes.kind {
        v.kind = kind;
    }
    if let Some(d) = changes.default_value {
        v.default_value = d;
    }
    check_default(v.kind, &v.default_value)?;
    v.updated_at = now;
    Ok(())
}

fn missing(id: Uuid) -> EndpointError {
    EndpointError::MissingVariable { id: id.to_string() }
}

impl Endpoints {
    /// A project's variables, oldest first.
    pub async fn variables(&self, project_id: u64) -> Result<Vec<InsightVariable>, EndpointError> {
        self.stored(move |s| s.variables(project_id)).await
    }

    pub async fn variable(
        &self,
        project_id: u64,
        id: Uuid,
    ) -> Result<InsightVariable, EndpointError> {
        self.stored(move |s| s.variable(project_id, id))
            .await?
            .ok_or_else(|| missing(id))
    }

    pub async fn create_variable(
        &self,
        project_id: u64,
        actor: &Actor,
        changes: VariableChanges,
        now: DateTime<Utc>,
    ) -> Result<InsightVariable, EndpointError> {
        let variable = new_variable(project_id, changes, now)?;
        let saved = variable.clone();
        self.stored_as(actor, move |s| s.save_variable(&saved))
            .await?;
        Ok(variable)
    }

    pub async fn update_variable(
        &self,
        project_id: u64,
        actor: &Actor,
        id: Uuid,
        changes: VariableChanges,
        now: DateTime<Utc>,
    ) -> Result<InsightVariable, EndpointError> {
        let mut variable = self.variable(project_id, id).await?;
        apply(&mut variable, changes, now)?;
        let saved = variable.clone();
        self.stored_as(actor, move |s| s.save_variable(&saved))
            .await?;
        Ok(variable)
    }

    pub async fn delete_variable(
        &self,
        project_id: u64,
        actor: &Actor,
        id: Uuid,
    ) -> Result<(), EndpointError> {
        if self
            .stored_as(actor, move |s| s.delete_variable(project_id, id))
            .await?
        {
            Ok(())
        } else {
            Err(missing(id))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_are_sql_identifiers() {
        for ok in ["country", "_x", "plan_2"] {
            assert!(check_code_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "2x", "a-b", "a b", "é"] {
            assert!(check_code_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_must_fit_the_type() {
        use serde_json::json;
        assert!(check_default(VariableType::Number, &json!("4.5")).is_ok());
        assert!(check_default(VariableType::Number, &json!("four")).is_err());
        assert!(check_default(VariableType::Date, &json!("2026-01-31")).is_ok());
        assert!(check_default(VariableType::Date, &json!("Jan 31")).is_err());
        assert!(check_default(VariableType::Boolean, &json!(1)).is_err());
        assert!(check_default(VariableType::List, &json!(["a"])).is_ok());
        assert!(check_default(VariableType::String, &Value::Null).is_ok());
    }

    #[test]
    fn a_new_variable_needs_a_name_and_a_type_and_derives_its_code_name() {
        let now = Utc::now();
        let err = new_variable(1, VariableChanges::default(), now).expect_err("no name");
        assert!(matches!(err, EndpointError::Invalid { attr: Some(a), .. } if a == "name"));
        let v = new_variable(
            1,
            VariableChanges {
                name: Some("Customer ID".into()),
                kind: Some(VariableType::String),
                ..VariableChanges::default()
            },
            now,
        )
        .expect("valid");
        assert_eq!(v.code_name, "customer_id");
        let mut changed = v.clone();
        let err = apply(
            &mut changed,
            VariableChanges {
                kind: Some(VariableType::Number),
                default_value: Some(Value::Bool(true)),
                ..VariableChanges::default()
            },
            now,
        )
        .expect_err("type mismatch");
        assert!(
            matches!(err, EndpointError::Invalid { attr: Some(a), .. } if a == "default_value")
        );
    }
}
