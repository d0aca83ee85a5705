//! HogQL compatibility: PostHog-style SQL in, one DataFusion-ready `SELECT` statement out.
//!
//! 1. Tokenize with sqlparser's ClickHouse dialect.
//! 2. Replace `{variables.x}` and `{filters}` with *tokens* (string, number, boolean literals):
//!    values never pass through SQL text, so they cannot change the query's shape.
//! 3. Parse; accept exactly one query (`SELECT`, CTEs, joins, subqueries, `UNION`).
//! 4. Rewrite PostHog property access (`properties.$browser`, `person.properties.email`) into
//!    JSON functions, and ClickHouse functions into DataFusion ones (see [`rewrite_function`]).
//! 5. Cap the row limit.

use std::collections::{BTreeSet, HashMap};
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{visit_expressions_mut, Statement};
use datafusion::sql::sqlparser::dialect::ClickHouseDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};
use serde_json::Value as Json;

use super::error::QueryError;

/// How deep expressions may nest before the parser refuses (stack safety).
const RECURSION_LIMIT: usize = 200;

/// The marker our generated SQL uses for the n-th bound value.
const MARKER_PREFIX: &str = "__corvid_v";

/// What the caller supplies besides the SQL text.
#[derive(Debug, Default)]
pub struct Bindings<'a> {
    /// `{variables.<code_name>}` values by code name.
    pub variables: HashMap<String, Json>,
    /// What `{filters}` becomes: generated SQL with its bound values; `None` means `TRUE`.
    pub filters: Option<&'a Generated>,
    /// Leave each `{variables.x}` as the identifier `__corvid_var_x` instead of a value, so the
    /// materializer can find where variables are used.
    pub variable_markers: bool,
}

/// Prefix of the identifiers [`Bindings::variable_markers`] puts where variables were.
pub const VARIABLE_MARKER: &str = "__corvid_var_";

/// SQL we generate ourselves, with every user-supplied value kept apart and bound as a literal
/// token where the SQL names [`Generated::bind`]'s marker.
#[derive(Debug, Default, Clone)]
pub struct Generated {
    pub sql: String,
    pub values: Vec<Json>,
}

impl Generated {
    /// Registers `value` and returns the marker to write in `sql` in its place.
    pub fn bind(&mut self, value: impl Into<Json>) -> String {
        self.values.push(value.into());
        format!("{MARKER_PREFIX}{}", self.values.len() - 1)
    }
}

/// Row limits for queries (from config).
#[derive(Debug, Clone, Copy)]
pub struct RowLimits {
    /// Rows returned when the query has no `LIMIT`.
    pub default_rows: usize,
    /// No query returns more than this.
    pub max_rows: usize,
    /// A page of the result (endpoint runs' `limit`/`offset`); the query's own constant
    /// `LIMIT` stays the absolute ceiling.
    pub page: Option<Page>,
}

/// `limit` rows after skipping `offset` rows of the query's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: usize,
    pub offset: usize,
}

/// A statement ready for planning.
#[derive(Debug)]
pub struct Prepared {
    pub statement: Statement,
    /// Rows to return at most; the statement fetches one more to learn `hasMore`.
    pub returned_rows: usize,
    /// Names of the tables the statement reads (lower case), for registering only those.
    pub tables: BTreeSet<String>,
}

pub(crate) fn dialect() -> ClickHouseDialect {
    ClickHouseDialect {}
}

/// Parses user HogQL with its bindings.
pub fn prepare_user_sql(
    sql: &str,
    bindings: &Bindings<'_>,
    limits: RowLimits,
) -> Result<Prepared, QueryError> {
    let tokens = tokenize(sql)?;
    let tokens = substitute_placeholders(tokens, bindings)?;
    prepare_tokens(tokens, limits)
}

/// Parses user SQL as written, with [`VARIABLE_MARKER`] identifiers for its variables and no
/// rewriting: the materializer's view of the query. Printing the (transformed) statement gives
/// SQL that [`prepare_user_sql`] accepts again.
pub fn parse_with_variable_markers(sql: &str) -> Result<Statement, QueryError> {
    let bindings = Bindings {
        variable_markers: true,
        ..Bindings::default()
    };
    let tokens = substitute_placeholders(tokenize(sql)?, &bindings)?;
    let mut statements = Parser::new(&dialect())
        .with_recursion_limit(RECURSION_LIMIT)
        .with_tokens_with_locations(tokens)
        .parse_statements()
        .map_err(|e| syntax_error(e, (1, 1)))?;
    match (statements.len(), statements.first()) {
        (1, Some(Statement::Query(_))) => Ok(statements.remove(0)),
        _ => Err(QueryError::Invalid(
            "Expected exactly one SELECT query.".into(),
        )),
    }
}

/// The `{variables.<code_name>}` names `sql` uses, sorted.
pub fn variable_names(sql: &str) -> Result<BTreeSet<String>, QueryError> {
    let tokens: Vec<Token> = tokenize(sql)?
        .into_iter()
        .map(|t| t.token)
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    let mut names = BTreeSet::new();
    for w in tokens.windows(5) {
        if w[0] == Token::LBrace
            && word(&w[1]) == Some("variables")
            && w[2] == Token::Period
            && w[4] == Token::RBrace
        {
            if let Some(name) = word(&w[3]) {
                names.insert(name.to_string());
            }
        }
    }
    Ok(names)
}

/// Parses SQL we generated (insight queries), binding its values.
pub fn prepare_generated(sql: &Generated, limits: RowLimits) -> Result<Prepared, QueryError> {
    let tokens = fill_markers(tokenize(&sql.sql)?, &sql.values)?;
    prepare_tokens(tokens, limits)
}

fn prepare_tokens(tokens: Vec<TokenWithSpan>, limits: RowLimits) -> Result<Prepared, QueryError> {
    let dialect = dialect();
    // Where an error "at the end of input" points.
    let end = tokens
        .iter()
        .rev()
        .find(|t| t.span.end.line > 0)
        .map(|t| (t.span.end.line, t.span.end.column))
        .unwrap_or((1, 1));
    let mut statements = Parser::new(&dialect)
        .with_recursion_limit(RECURSION_LIMIT)
        .with_tokens_with_locations(tokens)
        .parse_statements()
        .map_err(|e| syntax_error(e, end))?;
    if statements.len() != 1 {
        return Err(QueryError::Invalid(format!(
            "Expected exactly one SELECT query, got {} statements.",
            statements.len()
        )));
    }
    let mut statement = statements.remove(0);
    let Statement::Query(query) = &mut statement else {
        return Err(QueryError::Invalid(
            "Only SELECT queries are allowed; DDL, DML, COPY and other statements are rejected."
                .into(),
        ));
    };
    reject_clauses(query)?;
    let returned_rows = apply_limit(query, limits)?;
    let tables = referenced_tables(&statement)?;
    if let ControlFlow::Break(e) = visit_expressions_mut(&mut statement, rewrite) {
        return Err(e);
    }
    Ok(Prepared {
        statement,
        returned_rows,
        tables,
    })
}

fn tokenize(sql: &str) -> Result<Vec<TokenWithSpan>, QueryError> {
    let dialect = dialect();
    Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| QueryError::Syntax {
            message: e.message.clone(),
            line: e.location.line,
            column: e.location.column,
        })
}

/// A parser error as a 400 carrying the position sqlparser reports ("… at Line: 1, Column: 8").
fn syntax_error(e: ParserError, end: (u64, u64)) -> QueryError {
    let text = match e {
        ParserError::TokenizerError(s) | ParserError::ParserError(s) => s,
        ParserError::RecursionLimitExceeded => {
            return QueryError::Invalid("The query nests too deeply.".into())
        }
    };
    let (message, line, column) = match text.rsplit_once(" at Line: ") {
        Some((msg, pos)) => {
            let mut parts = pos.split(", Column: ");
            let line = parts
                .next()
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or(0);
            let column = parts
                .next()
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or(0);
            (msg.to_string(), line, column)
        }
        None => (text, end.0, end.1),
    };
    QueryError::Syntax {
        message,
        line,
        column,
    }
}

mod binding;
mod function_table;
mod policy;
mod properties;

use binding::*;
use function_table::*;
use policy::*;
pub(crate) use properties::use_materialized;
use properties::*;
