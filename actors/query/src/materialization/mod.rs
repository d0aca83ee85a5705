//! Which endpoint queries can be materialized, and how: PostHog's rules for variables (each
//! only in `WHERE`, compared with `=`, `>=`, `>`, `<` or `<=`; several allowed, also range pairs
//! on one column), and the transform that keeps each variable's column as a grouping column so
//! that one stored result answers every value.

mod select;

use select::select_plan;

use std::collections::BTreeMap;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, LimitClause,
    Query, SetExpr, Statement, Value as SqlValue,
};
use serde_json::Value;

use crate::{BreakdownFilter, VARIABLE_MARKER};

/// Column-name prefix of a variable's column in a materialized SQL result.
pub const VARIABLE_COLUMN: &str = "__corvid_mv_";

/// How a materialized endpoint's stored result is computed and read.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Sql(SqlPlan),
    /// Trends and retention: the whole result (every breakdown value) is stored; a run picks
    /// the series or cohorts of the requested breakdown values.
    Insight {
        breakdowns: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct SqlPlan {
    /// The statement the materializer runs: variable comparisons removed, their columns
    /// selected (as `__corvid_mv_<n>`) and grouped by, no LIMIT.
    pub sql: String,
    /// One per variable, by code name.
    pub variables: BTreeMap<String, VariableFilter>,
    /// Present when matching rows must be merged again (range variables over aggregates).
    pub reaggregate: Option<Reaggregate>,
    /// No GROUP BY and every column an aggregate: a run always answers one row.
    pub scalar: Option<Vec<Aggregate>>,
    /// The query's own LIMIT and OFFSET, applied after filtering.
    pub limit: Option<usize>,
    pub offset: usize,
}

/// How a run's value for one variable filters the stored rows.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableFilter {
    /// Index among the variable columns (`__corvid_mv_<n>`).
    pub column: usize,
    /// `column <op> value` for each comparison the query made with this variable.
    pub ops: Vec<Op>,
    /// Stored values are day buckets: compare with the value's day.
    pub bucket_day: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Gt,
    GtEq,
    Lt,
    LtEq,
}

impl Op {
    fn from_binary(op: &BinaryOperator) -> Option<Op> {
        Some(match op {
            BinaryOperator::Eq => Op::Eq,
            BinaryOperator::Gt => Op::Gt,
            BinaryOperator::GtEq => Op::GtEq,
            BinaryOperator::Lt => Op::Lt,
            BinaryOperator::LtEq => Op::LtEq,
            _ => return None,
        })
    }

    /// `a op b` written as `b flipped a`.
    fn flipped(self) -> Op {
        match self {
            Op::Eq => Op::Eq,
            Op::Gt => Op::Lt,
            Op::GtEq => Op::LtEq,
            Op::Lt => Op::Gt,
            Op::LtEq => Op::GtEq,
        }
    }
}

/// How a result column is merged when several stored rows fold into one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// A dimension: grouped by.
    Group,
    /// count → sum of counts (0 when nothing matches).
    Count,
    Sum,
    Min,
    Max,
    /// Cannot be merged (avg, uniq, …): only valid when each group is one stored row.
    Other {
        zero_when_empty: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reaggregate {
    /// Per output column.
    pub columns: Vec<Aggregate>,
    /// `(output column, descending)` to sort by after merging.
    pub order: Vec<(usize, bool)>,
}

/// Why a query cannot be materialized (PostHog's texts).
pub type Refusal = String;

/// The plan for an endpoint version's query, or why there is none.
pub fn plan(query: &Value) -> Result<Plan, Refusal> {
    match query.get("kind").and_then(Value::as_str) {
        Some("HogQLQuery") => {
            let sql = query.get("query").and_then(Value::as_str).unwrap_or_default();
            sql_plan(sql)
        }
        Some("TrendsQuery" | "RetentionQuery") => {
            if query.pointer("/compareFilter/compare").and_then(Value::as_bool) == Some(true) {
                return Err("Compare mode is not supported for materialization".into());
            }
            Ok(Plan::Insight {
                breakdowns: insight_breakdowns(query)?,
            })
        }
        Some(kind) => Err(format!(
            "Query type '{kind}' cannot be materialized. Supported types: HogQLQuery, RetentionQuery, TrendsQuery"
        )),
        None => Err("Query is empty or invalid.".into()),
    }
}

/// The breakdown property names of an insight query (its run-time variables).
pub fn insight_breakdowns(query: &Value) -> Result<Vec<String>, Refusal> {
    let Some(filter) = query.get("breakdownFilter").filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let filter: BreakdownFilter =
        serde_json::from_value(filter.clone()).map_err(|_| "Query is empty or invalid.")?;
    let list = filter.list().map_err(|e| e.to_string())?;
    if list
        .iter()
        .any(|(_, kind)| kind.as_deref() == Some("cohort"))
    {
        return Err("Cohort breakdowns are not supported for materialization".into());
    }
    Ok(list.into_iter().map(|(p, _)| p).collect())
}

/// The variable whose marker `e` is, if it is one.
fn as_marker(e: &Expr) -> Option<String> {
    match e {
        Expr::Identifier(Ident { value, .. }) => {
            value.strip_prefix(VARIABLE_MARKER).map(str::to_string)
        }
        Expr::Nested(inner) => as_marker(inner),
        // `toDateTime({variables.x})` and the like: the value, converted.
        Expr::Function(f) => match &f.args {
            FunctionArguments::List(list) if list.args.len() == 1 => match &list.args[0] {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(inner)) => as_marker(inner),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

fn mentions_variable(text: &str) -> bool {
    text.contains(VARIABLE_MARKER)
}

fn sql_plan(sql: &str) -> Result<Plan, Refusal> {
    let names = crate::variable_names(sql).map_err(|_| "Failed to parse query.".to_string())?;
    let mut statement = crate::parse_with_variable_markers(sql)
        .map_err(|_| "Failed to parse query.".to_string())?;
    let Statement::Query(query) = &mut statement else {
        return Err("Failed to parse query.".into());
    };
    let (limit, offset) = take_limit(query)?;
    if names.is_empty() {
        return Ok(Plan::Sql(SqlPlan {
            sql: statement.to_string(),
            variables: BTreeMap::new(),
            reaggregate: None,
            scalar: None,
            limit,
            offset,
        }));
    }
    if let Some(with) = &query.with {
        if mentions_variable(&with.to_string()) {
            return Err("Variables used in CTEs are not yet supported for materialization".into());
        }
    }
    if let Some(order) = &query.order_by {
        if mentions_variable(&order.to_string()) {
            return Err("Variable not used in WHERE clause".into());
        }
    }
    let SetExpr::Select(select) = query.body.as_mut() else {
        return Err("Variables in UNION queries are not supported for materialization".into());
    };
    let order_text: Vec<(String, bool)> = query
        .order_by
        .iter()
        .flat_map(|o| match &o.kind {
            datafusion::sql::sqlparser::ast::OrderByKind::Expressions(list) => list
                .iter()
                .map(|e| (e.expr.to_string(), e.options.asc == Some(false)))
                .collect::<Vec<_>>(),
            datafusion::sql::sqlparser::ast::OrderByKind::All(_) => Vec::new(),
        })
        .collect();
    let mut plan = select_plan(select, &names, &order_text)?;
    plan.sql = statement.to_string();
    plan.limit = limit;
    plan.offset = offset;
    Ok(Plan::Sql(plan))
}

fn take_limit(query: &mut Query) -> Result<(Option<usize>, usize), Refusal> {
    let number = |e: &Expr| match e {
        Expr::Value(v) => match &v.value {
            SqlValue::Number(n, _) => n.parse::<usize>().ok(),
            _ => None,
        },
        _ => None,
    };
    let bad = || "LIMIT and OFFSET must be constant numbers for materialization".to_string();
    match query.limit_clause.take() {
        None => Ok((None, 0)),
        Some(LimitClause::LimitOffset { limit, offset, .. }) => {
            let limit = limit
                .as_ref()
                .map(|l| number(l).ok_or_else(bad))
                .transpose()?;
            let offset = offset
                .as_ref()
                .map(|o| number(&o.value).ok_or_else(bad))
                .transpose()?
                .unwrap_or(0);
            Ok((limit, offset))
        }
        Some(LimitClause::OffsetCommaLimit { offset, limit }) => Ok((
            Some(number(&limit).ok_or_else(bad)?),
            number(&offset).ok_or_else(bad)?,
        )),
    }
}
