//! Statement policy: which clauses and tables a query may use, and the row limit it gets.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use datafusion::logical_expr::sqlparser::ast::Visit;
use datafusion::sql::sqlparser::ast::{
    visit_relations, Expr, LimitClause, ObjectName, Query, SetExpr, Statement, Value, Visitor,
};

use super::super::error::QueryError;
use crate::RowLimits;

pub(super) fn reject_clauses(query: &Query) -> Result<(), QueryError> {
    if query.settings.is_some() {
        return Err(QueryError::Invalid("SETTINGS is not supported.".into()));
    }
    if query.format_clause.is_some() {
        return Err(QueryError::Invalid("FORMAT is not supported.".into()));
    }
    if let Some(LimitClause::LimitOffset { limit_by, .. }) = &query.limit_clause {
        if !limit_by.is_empty() {
            return Err(QueryError::Invalid("LIMIT … BY is not supported.".into()));
        }
    }
    if matches!(
        query.body.as_ref(),
        SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_)
    ) {
        return Err(QueryError::Invalid(
            "Only SELECT queries are allowed.".into(),
        ));
    }
    Ok(())
}

pub(super) fn number(n: usize) -> Expr {
    Expr::Value(Value::Number(n.to_string(), false).with_empty_span())
}

pub(super) fn literal_usize(e: &Expr) -> Option<usize> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

/// Applies the default and maximum row counts; returns how many rows to hand back. The
/// statement asks for one row more so the caller can tell whether more exist.
pub(super) fn apply_limit(query: &mut Query, limits: RowLimits) -> Result<usize, QueryError> {
    let (limit, offset) = match query.limit_clause.take() {
        None => (None, None),
        Some(LimitClause::LimitOffset { limit, offset, .. }) => (limit, offset),
        Some(LimitClause::OffsetCommaLimit { offset, limit }) => (
            Some(limit),
            Some(datafusion::sql::sqlparser::ast::Offset {
                value: offset,
                rows: datafusion::sql::sqlparser::ast::OffsetRows::None,
            }),
        ),
    };
    let returned = match &limit {
        None => limits.default_rows,
        Some(e) => match literal_usize(e) {
            Some(n) => n.min(limits.max_rows),
            None => {
                return Err(QueryError::Invalid(
                    "LIMIT must be a constant number.".into(),
                ))
            }
        },
    };
    let Some(page) = limits.page else {
        query.limit_clause = Some(LimitClause::LimitOffset {
            limit: Some(number(returned.saturating_add(1))),
            offset,
            limit_by: Vec::new(),
        });
        return Ok(returned);
    };
    if matches!(query.body.as_ref(), SetExpr::SetOperation { .. }) {
        return Err(QueryError::Invalid(
            "Pagination is not supported for UNION queries. Wrap the UNION in a subquery: SELECT * FROM (... UNION ALL ...) LIMIT n".into(),
        ));
    }
    // The query's own LIMIT (or the cap) is the ceiling: a page never reaches past it.
    let ceiling = if limit.is_some() {
        returned
    } else {
        limits.max_rows
    };
    let base_offset = match &offset {
        None => 0,
        Some(o) => literal_usize(&o.value)
            .ok_or_else(|| QueryError::Invalid("OFFSET must be a constant number.".into()))?,
    };
    let remaining = ceiling.saturating_sub(page.offset);
    let page_rows = page.limit.min(remaining);
    // One probe row tells whether more rows follow, unless the page ends at the ceiling.
    let fetch = if page_rows < remaining {
        page_rows + 1
    } else {
        page_rows
    };
    query.limit_clause = Some(LimitClause::LimitOffset {
        limit: Some(number(fetch)),
        offset: Some(datafusion::sql::sqlparser::ast::Offset {
            value: number(base_offset.saturating_add(page.offset)),
            rows: datafusion::sql::sqlparser::ast::OffsetRows::None,
        }),
        limit_by: Vec::new(),
    });
    Ok(page_rows)
}

/// Table names the statement reads, minus its own CTE names. Anything that looks like a path
/// or URL is refused outright.
pub(super) fn referenced_tables(statement: &Statement) -> Result<BTreeSet<String>, QueryError> {
    let mut names = BTreeSet::new();
    let flow = visit_relations(statement, |name: &ObjectName| {
        let last = name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| i.value.to_lowercase())
            .unwrap_or_default();
        if last.contains(['/', '\\', ':']) || last.contains("..") {
            return ControlFlow::Break(QueryError::Invalid(format!(
                "Unknown table {name}: only events, persons, person_distinct_ids and groups can be queried."
            )));
        }
        names.insert(last);
        ControlFlow::Continue(())
    });
    if let ControlFlow::Break(e) = flow {
        return Err(e);
    }
    // A CTE is not a table (unless it shadows one, which then must still be registered).
    let mut ctes = CteNames::default();
    let _ = statement.visit(&mut ctes);
    names.retain(|n| !ctes.0.contains(n) || TABLES.contains(&n.as_str()));
    Ok(names)
}

/// The tables a session can hold.
pub(super) const TABLES: [&str; 4] = ["events", "persons", "person_distinct_ids", "groups"];

#[derive(Default)]
pub(super) struct CteNames(BTreeSet<String>);

impl Visitor for CteNames {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if let Some(with) = &query.with {
            for cte in &with.cte_tables {
                self.0.insert(cte.alias.name.value.to_lowercase());
            }
        }
        ControlFlow::Continue(())
    }
}
