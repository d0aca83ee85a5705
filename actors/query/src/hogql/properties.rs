//! PostHog property access (`properties.$browser`, `person.properties.email`) rewritten into JSON functions or materialized columns.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, BinaryOperator, Expr, Function, FunctionArg, FunctionArgExpr,
    FunctionArgumentList, FunctionArguments, Ident, ObjectName, ObjectNamePart, Statement,
    UnaryOperator, Value,
};

use super::super::error::QueryError;
use super::super::functions::JsonKind;
use super::{plain_args, rewrite_function, string_arg};

pub(super) fn ident_value(i: &Ident) -> &str {
    &i.value
}

pub(super) fn compound(mut parts: Vec<Ident>) -> Expr {
    if parts.len() == 1 {
        Expr::Identifier(parts.remove(0))
    } else {
        Expr::CompoundIdentifier(parts)
    }
}

pub(super) fn string_literal(s: &str) -> Expr {
    Expr::Value(Value::SingleQuotedString(s.to_string()).with_empty_span())
}

pub(super) fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(Function {
        name: ObjectName(vec![ObjectNamePart::Identifier(Ident::new(name))]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| FunctionArg::Unnamed(FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: Vec::new(),
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: Vec::new(),
    })
}

/// `properties.a.b`, `person.properties.a`, `e.person.properties.a` → JSON access; `person.properties`
/// → the `person_properties` column; `person.id` → `person_id`.
pub(super) fn property_access(parts: &[Ident]) -> Option<Expr> {
    let pos = parts.iter().position(|p| ident_value(p) == "properties")?;
    let on_person = pos > 0 && ident_value(&parts[pos - 1]) == "person";
    let (qualifier, column) = if on_person {
        (&parts[..pos - 1], "person_properties")
    } else {
        (&parts[..pos], "properties")
    };
    let mut col: Vec<Ident> = qualifier.to_vec();
    col.push(Ident::new(column));
    let keys = &parts[pos + 1..];
    if keys.is_empty() {
        return on_person.then(|| compound(col));
    }
    let mut args = vec![compound(col)];
    args.extend(keys.iter().map(|k| string_literal(ident_value(k))));
    Some(call(JsonKind::Property.function_name(), args))
}

pub(super) fn person_id_access(parts: &[Ident]) -> Option<Expr> {
    let n = parts.len();
    if n >= 2 && ident_value(&parts[n - 2]) == "person" && ident_value(&parts[n - 1]) == "id" {
        let mut col = parts[..n - 2].to_vec();
        col.push(Ident::new("person_id"));
        return Some(compound(col));
    }
    None
}

pub(super) fn is_property_call(e: &Expr) -> bool {
    matches!(e, Expr::Function(f) if f.name.to_string() == JsonKind::Property.function_name())
}

pub(super) fn is_number_literal(e: &Expr) -> bool {
    match e {
        Expr::Value(v) => matches!(v.value, Value::Number(..)),
        Expr::UnaryOp {
            op: UnaryOperator::Minus | UnaryOperator::Plus,
            expr,
        } => is_number_literal(expr),
        Expr::Nested(inner) => is_number_literal(inner),
        _ => false,
    }
}

pub(super) fn to_number_call(e: &mut Expr) {
    if let Expr::Function(f) = e {
        f.name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new(
            JsonKind::PropertyNumber.function_name(),
        ))]);
    }
}

/// The post-order rewrite of one expression (children are already rewritten).
pub(super) fn rewrite(expr: &mut Expr) -> ControlFlow<QueryError> {
    let replacement = match expr {
        Expr::CompoundIdentifier(parts) => {
            property_access(parts).or_else(|| person_id_access(parts))
        }
        Expr::CompoundFieldAccess { root, access_chain } => subscript_access(root, access_chain),
        Expr::Function(f) => match rewrite_function(f) {
            Ok(r) => r,
            Err(e) => return ControlFlow::Break(e),
        },
        Expr::BinaryOp {
            left,
            op:
                BinaryOperator::Gt
                | BinaryOperator::GtEq
                | BinaryOperator::Lt
                | BinaryOperator::LtEq
                | BinaryOperator::Eq
                | BinaryOperator::NotEq,
            right,
        } => {
            // A property compared with a number compares numerically.
            if is_property_call(left) && is_number_literal(right) {
                to_number_call(left);
            } else if is_property_call(right) && is_number_literal(left) {
                to_number_call(right);
            }
            None
        }
        Expr::Between {
            expr: inner,
            low,
            high,
            ..
        } if is_property_call(inner) && is_number_literal(low) && is_number_literal(high) => {
            to_number_call(inner);
            None
        }
        _ => None,
    };
    if let Some(r) = replacement {
        *expr = r;
    }
    ControlFlow::Continue(())
}

/// Reads `properties.<key>` from the segment column materializing it, for each key in `keys`.
/// Only for statements over `events` alone, where every `properties` is the event's. Returns
/// the keys it now reads from columns.
pub fn use_materialized(statement: &mut Statement, keys: &BTreeSet<String>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let _ = visit_expressions_mut(statement, |e| {
        if let Expr::Function(f) = e {
            if f.name.to_string() == JsonKind::Property.function_name() {
                if let Some((column, key)) = materialized_access(f, keys) {
                    *e = column;
                    used.insert(key);
                }
            }
        }
        ControlFlow::<()>::Continue(())
    });
    used
}

pub(super) fn materialized_access(f: &Function, keys: &BTreeSet<String>) -> Option<(Expr, String)> {
    let args = plain_args(f)?;
    let [column, key] = args.as_slice() else {
        return None;
    };
    let key = string_arg(key).filter(|k| keys.contains(k))?;
    let mut parts = match column {
        Expr::Identifier(i) => vec![i.clone()],
        Expr::CompoundIdentifier(p) => p.clone(),
        _ => return None,
    };
    if parts.last().map(ident_value) != Some("properties") {
        return None;
    }
    parts.pop();
    parts.push(Ident::with_quote(
        '"',
        corvid_events::materialized_column(&key),
    ));
    Some((compound(parts), key))
}

/// `properties['$browser']`, `person.properties['a']['b']`, `person_properties['a']`.
pub(super) fn subscript_access(
    root: &Expr,
    chain: &[datafusion::sql::sqlparser::ast::AccessExpr],
) -> Option<Expr> {
    use datafusion::sql::sqlparser::ast::{AccessExpr, Subscript};
    let is_json_column = match root {
        Expr::Identifier(i) => matches!(ident_value(i), "properties" | "person_properties"),
        Expr::CompoundIdentifier(p) => p
            .last()
            .is_some_and(|i| matches!(ident_value(i), "properties" | "person_properties")),
        _ => false,
    };
    if !is_json_column {
        return None;
    }
    let mut args = vec![root.clone()];
    for access in chain {
        match access {
            AccessExpr::Subscript(Subscript::Index { index }) => args.push(index.clone()),
            AccessExpr::Dot(Expr::Identifier(i)) => args.push(string_literal(ident_value(i))),
            _ => return None,
        }
    }
    Some(call(JsonKind::Property.function_name(), args))
}
