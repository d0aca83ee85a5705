//! How a SELECT becomes a re-aggregation plan: its outputs, the variable filters in its WHERE and the aggregate of each column.

use std::collections::BTreeMap;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArguments, GroupByExpr, Ident, Select, SelectItem, SetExpr,
    Statement,
};

use super::SqlPlan;
use super::{
    as_marker, mentions_variable, Aggregate, Op, Reaggregate, Refusal, VariableFilter,
    VARIABLE_COLUMN,
};

/// A variable comparison found in WHERE: `column op variable`.
pub(super) struct Comparison {
    variable: String,
    column: Expr,
    op: Op,
}

pub(super) fn select_plan(
    select: &mut Select,
    names: &std::collections::BTreeSet<String>,
    order: &[(String, bool)],
) -> Result<SqlPlan, Refusal> {
    if let Some(having) = &select.having {
        if mentions_variable(&having.to_string()) {
            return Err(
                "Variable used in HAVING clause are not supported for materialization.".into(),
            );
        }
    }
    let outside_where = select
        .projection
        .iter()
        .any(|p| mentions_variable(&p.to_string()))
        || select
            .from
            .iter()
            .any(|f| mentions_variable(&f.to_string()))
        || mentions_variable(&select.group_by.to_string());
    if outside_where {
        return Err("Variable not used in WHERE clause".into());
    }
    let mut comparisons = Vec::new();
    let mut kept = Vec::new();
    if let Some(selection) = select.selection.take() {
        for conjunct in conjuncts(selection) {
            if !mentions_variable(&conjunct.to_string()) {
                kept.push(conjunct);
                continue;
            }
            comparisons.push(comparison(&conjunct)?);
        }
    }
    select.selection = kept.into_iter().reduce(|a, b| Expr::BinaryOp {
        left: Box::new(a),
        op: BinaryOperator::And,
        right: Box::new(b),
    });
    for name in names {
        if !comparisons.iter().any(|c| &c.variable == name) {
            return Err("Variable not used in WHERE clause".into());
        }
    }

    let aggregates: Vec<Aggregate> = select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                aggregate_of(e)
            }
            _ => Aggregate::Group,
        })
        .collect();
    let has_group_by = !matches!(&select.group_by, GroupByExpr::Expressions(v, _) if v.is_empty());
    let aggregated = has_group_by || aggregates.iter().any(|a| *a != Aggregate::Group);
    let has_range = comparisons.iter().any(|c| c.op != Op::Eq);
    if has_range && select.distinct.is_some() {
        return Err(
            "SELECT DISTINCT with range variables is not supported for materialization".into(),
        );
    }

    // One stored column per distinct compared column.
    let mut columns: Vec<String> = Vec::new();
    let mut variables: BTreeMap<String, VariableFilter> = BTreeMap::new();
    for c in &comparisons {
        let text = c.column.to_string();
        let bucket_day = aggregated && c.op != Op::Eq && !text.starts_with("properties.");
        let stored = if bucket_day {
            format!("toStartOfDay({text})")
        } else {
            text.clone()
        };
        let index = match columns.iter().position(|s| *s == stored) {
            Some(i) => i,
            None => {
                columns.push(stored.clone());
                columns.len() - 1
            }
        };
        let entry = variables
            .entry(c.variable.clone())
            .or_insert(VariableFilter {
                column: index,
                ops: Vec::new(),
                bucket_day,
            });
        if entry.column != index {
            return Err(
                "Variable compared against multiple columns is not supported for materialization"
                    .into(),
            );
        }
        entry.ops.push(c.op);
    }
    for (i, stored) in columns.iter().enumerate() {
        let expr = parse_expr(stored)?;
        select.projection.push(SelectItem::ExprWithAlias {
            expr: expr.clone(),
            alias: Ident::new(format!("{VARIABLE_COLUMN}{i}")),
        });
        if aggregated {
            match &mut select.group_by {
                GroupByExpr::Expressions(list, _) => list.push(expr),
                GroupByExpr::All(_) => {}
            }
        }
    }

    let scalar = (!has_group_by
        && !aggregates.is_empty()
        && aggregates.iter().all(|a| *a != Aggregate::Group))
    .then(|| aggregates.clone());
    let reaggregate = if has_range && aggregated {
        if let Some(bad) = select
            .projection
            .iter()
            .zip(&aggregates)
            .find_map(|(item, a)| match a {
                Aggregate::Other { .. } => Some(function_name(item)),
                _ => None,
            })
        {
            return Err(format!(
                "Aggregate function '{bad}' cannot be re-aggregated for range variable materialization"
            ));
        }
        let order = order
            .iter()
            .map(|(text, desc)| {
                output_index(&select.projection, text, aggregates.len())
                    .map(|i| (i, *desc))
                    .ok_or_else(|| format!("ORDER BY {text} must name a selected column for range variable materialization"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(Reaggregate {
            columns: aggregates,
            order,
        })
    } else {
        None
    };
    Ok(SqlPlan {
        sql: String::new(),
        variables,
        reaggregate,
        scalar,
        limit: None,
        offset: 0,
    })
}

pub(super) fn parse_expr(text: &str) -> Result<Expr, Refusal> {
    let statement = crate::parse_with_variable_markers(&format!("SELECT {text}"))
        .map_err(|_| "Failed to parse query.".to_string())?;
    let Statement::Query(q) = statement else {
        return Err("Failed to parse query.".into());
    };
    match *q.body {
        SetExpr::Select(s) => match s.projection.into_iter().next() {
            Some(SelectItem::UnnamedExpr(e)) => Ok(e),
            _ => Err("Failed to parse query.".into()),
        },
        _ => Err("Failed to parse query.".into()),
    }
}

/// Which output column an ORDER BY term names: an alias, the same expression, or a position.
pub(super) fn output_index(projection: &[SelectItem], text: &str, outputs: usize) -> Option<usize> {
    if let Ok(n) = text.parse::<usize>() {
        return (1..=outputs).contains(&n).then(|| n - 1);
    }
    projection.iter().take(outputs).position(|item| match item {
        SelectItem::ExprWithAlias { expr, alias } => {
            alias.value == text || alias.to_string() == text || expr.to_string() == text
        }
        SelectItem::UnnamedExpr(e) => e.to_string() == text,
        _ => false,
    })
}

pub(super) fn function_name(item: &SelectItem) -> String {
    match item {
        SelectItem::UnnamedExpr(Expr::Function(f))
        | SelectItem::ExprWithAlias {
            expr: Expr::Function(f),
            ..
        } => f.name.to_string(),
        other => other.to_string(),
    }
}

pub(super) fn conjuncts(e: Expr) -> Vec<Expr> {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            let mut out = conjuncts(*left);
            out.extend(conjuncts(*right));
            out
        }
        Expr::Nested(inner)
            if matches!(
                inner.as_ref(),
                Expr::BinaryOp {
                    op: BinaryOperator::And,
                    ..
                }
            ) =>
        {
            conjuncts(*inner)
        }
        other => vec![other],
    }
}

pub(super) fn comparison(e: &Expr) -> Result<Comparison, Refusal> {
    let unsupported = |op: &str| format!("Unsupported operator {op}, supported: =, >=, >, <, <=");
    match e {
        Expr::Nested(inner) => comparison(inner),
        Expr::BinaryOp { left, op, right } => {
            if matches!(op, BinaryOperator::Or) {
                return Err(
                    "Variables in OR conditions are not supported for materialization".into(),
                );
            }
            let Some(op) = Op::from_binary(op) else {
                if e.to_string().to_uppercase().contains(" OR ") {
                    return Err(
                        "Variables in OR conditions are not supported for materialization".into(),
                    );
                }
                return Err(unsupported(&op.to_string()));
            };
            let (left_var, right_var) = (as_marker(left), as_marker(right));
            let (variable, column, op) = match (left_var, right_var) {
                (Some(v), None) => (v, right.as_ref(), op.flipped()),
                (None, Some(v)) => (v, left.as_ref(), op),
                (Some(_), Some(_)) => {
                    return Err("Variable compared against an expression containing another variable is not supported for materialization".into())
                }
                (None, None) => return Err("Variable not used in WHERE clause".into()),
            };
            if mentions_variable(&column.to_string()) {
                return Err("Variable compared against an expression containing another variable is not supported for materialization".into());
            }
            Ok(Comparison {
                variable,
                column: column.clone(),
                op,
            })
        }
        Expr::Like { negated, .. } => Err(unsupported(if *negated { "NOT LIKE" } else { "LIKE" })),
        Expr::ILike { negated, .. } => {
            Err(unsupported(if *negated { "NOT ILIKE" } else { "ILIKE" }))
        }
        Expr::InList { negated, .. } | Expr::InSubquery { negated, .. } => {
            Err(unsupported(if *negated { "NOT IN" } else { "IN" }))
        }
        Expr::Between { .. } => Err(unsupported("BETWEEN")),
        Expr::UnaryOp { .. } => Err(unsupported(&e.to_string())),
        _ => Err("Variable not used in WHERE clause".into()),
    }
}

/// How a select item merges when rows fold together.
pub(super) fn aggregate_of(e: &Expr) -> Aggregate {
    match e {
        Expr::Nested(inner) => aggregate_of(inner),
        Expr::Function(f) => {
            let name = f.name.to_string().to_lowercase();
            let distinct =
                matches!(&f.args, FunctionArguments::List(l) if l.duplicate_treatment.is_some());
            match name.as_str() {
                "count" | "countif" if !distinct => Aggregate::Count,
                "sum" | "sumif" => Aggregate::Sum,
                "min" | "minif" => Aggregate::Min,
                "max" | "maxif" => Aggregate::Max,
                "count" | "uniq" | "uniqexact" | "uniqif" | "countdistinct" => Aggregate::Other {
                    zero_when_empty: true,
                },
                _ if is_aggregate_name(&name) => Aggregate::Other {
                    zero_when_empty: false,
                },
                _ => {
                    if contains_aggregate(e) {
                        Aggregate::Other {
                            zero_when_empty: false,
                        }
                    } else {
                        Aggregate::Group
                    }
                }
            }
        }
        other if contains_aggregate(other) => Aggregate::Other {
            zero_when_empty: false,
        },
        _ => Aggregate::Group,
    }
}

pub(super) fn is_aggregate_name(name: &str) -> bool {
    const NAMES: [&str; 16] = [
        "avg",
        "avgif",
        "quantile",
        "median",
        "any",
        "anylast",
        "argmax",
        "argmin",
        "grouparray",
        "stddev",
        "variance",
        "array_agg",
        "string_agg",
        "quantiles",
        "first_value",
        "last_value",
    ];
    NAMES.contains(&name)
        || ["count", "sum", "min", "max", "uniq"]
            .iter()
            .any(|p| name.starts_with(p))
}

pub(super) fn contains_aggregate(e: &Expr) -> bool {
    let text = e.to_string().to_lowercase();
    [
        "count(", "sum(", "min(", "max(", "avg(", "uniq", "quantile", "median(",
    ]
    .iter()
    .any(|f| text.contains(f))
}

#[cfg(test)]
mod tests {
    use super::super::{plan, Plan};
    use super::*;
    use crate::VARIABLE_MARKER;
    use serde_json::json;

    fn sql(q: &str) -> Result<SqlPlan, Refusal> {
        match plan(&json!({"kind": "HogQLQuery", "query": q}))? {
            Plan::Sql(p) => Ok(p),
            other => panic!("expected a SQL plan, got {other:?}"),
        }
    }

    #[test]
    fn equality_variable_becomes_a_grouping_column() {
        let p = sql(
            "SELECT count() AS c FROM events WHERE event = {variables.ev} AND distinct_id != 'x'",
        )
        .expect("eligible");
        assert!(p.sql.contains("event AS __corvid_mv_0"), "{}", p.sql);
        assert!(p.sql.contains("GROUP BY event"), "{}", p.sql);
        assert!(
            p.sql.contains("distinct_id <> 'x'") || p.sql.contains("distinct_id != 'x'"),
            "{}",
            p.sql
        );
        assert!(!p.sql.contains(VARIABLE_MARKER));
        assert_eq!(p.variables["ev"].ops, vec![Op::Eq]);
        assert_eq!(p.scalar, Some(vec![Aggregate::Count]));
        assert!(p.reaggregate.is_none());
    }

    #[test]
    fn range_pairs_share_a_day_bucketed_column_and_reaggregate() {
        let p = sql("SELECT event, count() AS c FROM events WHERE timestamp >= {variables.from} AND timestamp < {variables.to} GROUP BY event ORDER BY c DESC LIMIT 5").expect("eligible");
        assert!(
            p.sql.contains("toStartOfDay(timestamp) AS __corvid_mv_0"),
            "{}",
            p.sql
        );
        assert!(!p.sql.contains("LIMIT"), "{}", p.sql);
        assert_eq!(p.variables["from"].column, 0);
        assert_eq!(p.variables["to"].column, 0);
        assert_eq!(p.variables["from"].ops, vec![Op::GtEq]);
        assert_eq!(p.limit, Some(5));
        let r = p.reaggregate.expect("range over aggregates merges rows");
        assert_eq!(r.columns, vec![Aggregate::Group, Aggregate::Count]);
        assert_eq!(r.order, vec![(1, true)]);
    }

    #[test]
    fn variable_on_the_left_flips_the_operator() {
        let p =
            sql("SELECT uuid FROM events WHERE {variables.since} < timestamp").expect("eligible");
        assert_eq!(p.variables["since"].ops, vec![Op::Gt]);
        assert!(
            !p.variables["since"].bucket_day,
            "plain rows are filtered exactly"
        );
    }

    #[test]
    fn refusals_name_the_reason() {
        let cases = [
            ("SELECT count() FROM events WHERE event LIKE {variables.ev}", "Unsupported operator LIKE, supported: =, >=, >, <, <="),
            ("SELECT count() FROM events WHERE event = {variables.ev} OR event = 'x'", "Variables in OR conditions are not supported for materialization"),
            ("SELECT {variables.ev} FROM events", "Variable not used in WHERE clause"),
            ("SELECT event FROM events GROUP BY event HAVING count() > {variables.n}", "Variable used in HAVING clause are not supported for materialization."),
            ("SELECT avg(toFloat(properties.x)) FROM events WHERE timestamp >= {variables.from}", "Aggregate function 'avg' cannot be re-aggregated for range variable materialization"),
            ("SELECT count() FROM events WHERE event = {variables.a} AND distinct_id = {variables.a}", "Variable compared against multiple columns is not supported for materialization"),
            ("SELECT count() FROM events WHERE event IN ({variables.a})", "Unsupported operator IN, supported: =, >=, >, <, <="),
        ];
        for (q, reason) in cases {
            assert_eq!(sql(q).expect_err(q), reason, "{q}");
        }
    }

    #[test]
    fn insights_materialize_with_their_breakdowns() {
        let q = json!({"kind": "TrendsQuery", "series": [], "breakdownFilter": {"breakdowns": [{"property": "$browser"}, {"property": "$os"}]}});
        assert_eq!(
            plan(&q),
            Ok(Plan::Insight {
                breakdowns: vec!["$browser".into(), "$os".into()]
            })
        );
        let q = json!({"kind": "FunnelsQuery"});
        assert!(plan(&q)
            .expect_err("unsupported")
            .starts_with("Query type 'FunnelsQuery' cannot be materialized"));
    }
}
