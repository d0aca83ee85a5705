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

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, visit_relations, BinaryOperator, DuplicateTreatment, Expr, Function,
    FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident, LimitClause,
    ObjectName, ObjectNamePart, Query, SetExpr, Statement, UnaryOperator, Value, Visit, Visitor,
};
use datafusion::sql::sqlparser::dialect::ClickHouseDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};
use serde_json::Value as Json;

use super::error::QueryError;
use super::functions::JsonKind;
use super::uniq::UNIQ;

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

fn dialect() -> ClickHouseDialect {
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

fn word(token: &Token) -> Option<&str> {
    match token {
        Token::Word(w) => Some(w.value.as_str()),
        _ => None,
    }
}

fn plain(token: Token) -> TokenWithSpan {
    TokenWithSpan::wrap(token)
}

/// `{variables.x}` → the value's tokens; `{filters}` → `( … )`; `.$prop` → `."$prop"`.
fn substitute_placeholders(
    tokens: Vec<TokenWithSpan>,
    bindings: &Bindings<'_>,
) -> Result<Vec<TokenWithSpan>, QueryError> {
    let significant: Vec<TokenWithSpan> = tokens
        .into_iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    let mut out = Vec::with_capacity(significant.len());
    let mut i = 0;
    while i < significant.len() {
        let t = &significant[i];
        let next = |k: usize| significant.get(i + k).map(|t| &t.token);
        match &t.token {
            Token::LBrace => {
                if next(1).and_then(word) == Some("variables")
                    && next(2) == Some(&Token::Period)
                    && next(4) == Some(&Token::RBrace)
                {
                    let Some(name) = next(3).and_then(word) else {
                        return Err(QueryError::Invalid(
                            "Malformed {variables.…} placeholder.".into(),
                        ));
                    };
                    if bindings.variable_markers {
                        out.push(plain(Token::make_word(
                            &format!("{VARIABLE_MARKER}{name}"),
                            None,
                        )));
                        i += 5;
                        continue;
                    }
                    let value = bindings
                        .variables
                        .get(name)
                        .ok_or_else(|| QueryError::MissingVariable(name.to_string()))?;
                    out.extend(value_tokens(name, value)?.into_iter().map(plain));
                    i += 5;
                    continue;
                }
                if next(1).and_then(word) == Some("filters") && next(2) == Some(&Token::RBrace) {
                    out.push(plain(Token::LParen));
                    match bindings.filters {
                        Some(f) if !f.sql.trim().is_empty() => {
                            out.extend(fill_markers(tokenize(&f.sql)?, &f.values)?)
                        }
                        _ => out.push(plain(Token::make_keyword("TRUE"))),
                    }
                    out.push(plain(Token::RParen));
                    i += 3;
                    continue;
                }
                return Err(QueryError::Invalid(
                    "Unknown placeholder: only {variables.<name>} and {filters} are supported."
                        .into(),
                ));
            }
            Token::Placeholder(p)
                if out.last().map(|t: &TokenWithSpan| &t.token) == Some(&Token::Period) =>
            {
                out.push(TokenWithSpan::new(Token::make_word(p, Some('"')), t.span));
            }
            Token::Placeholder(p) => {
                return Err(QueryError::Syntax {
                    message: format!(
                        "Unexpected {p}: `$` names are only valid after `properties.`"
                    ),
                    line: t.span.start.line,
                    column: t.span.start.column,
                })
            }
            _ => out.push(t.clone()),
        }
        i += 1;
    }
    Ok(out)
}

/// Replaces each `__corvid_vN` word of generated SQL with the tokens of `values[N]`.
fn fill_markers(
    tokens: Vec<TokenWithSpan>,
    values: &[Json],
) -> Result<Vec<TokenWithSpan>, QueryError> {
    let mut out = Vec::with_capacity(tokens.len());
    for t in tokens {
        if let Some(n) = word(&t.token)
            .and_then(|w| w.strip_prefix(MARKER_PREFIX))
            .and_then(|n| n.parse::<usize>().ok())
        {
            let value = values
                .get(n)
                .ok_or_else(|| QueryError::Internal(format!("unbound value #{n}")))?;
            out.extend(value_tokens("filter", value)?.into_iter().map(plain));
        } else if !matches!(t.token, Token::Whitespace(_)) {
            out.push(t);
        }
    }
    Ok(out)
}

/// A JSON value as literal tokens: strings, numbers, booleans, NULL, and lists as `(a, b)`.
fn value_tokens(name: &str, value: &Json) -> Result<Vec<Token>, QueryError> {
    Ok(match value {
        Json::Null => vec![Token::make_keyword("NULL")],
        Json::Bool(b) => vec![Token::make_keyword(if *b { "TRUE" } else { "FALSE" })],
        Json::String(s) => vec![Token::SingleQuotedString(s.clone())],
        Json::Number(n) => {
            let text = n.to_string();
            match text.strip_prefix('-') {
                Some(abs) => vec![
                    Token::LParen,
                    Token::Minus,
                    Token::Number(abs.to_string(), false),
                    Token::RParen,
                ],
                None => vec![Token::Number(text, false)],
            }
        }
        Json::Array(items) => {
            let mut out = vec![Token::LParen];
            if items.is_empty() {
                out.push(Token::make_keyword("NULL"));
            }
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(Token::Comma);
                }
                if item.is_array() || item.is_object() {
                    return Err(QueryError::Invalid(format!(
                        "Variable {name} must be a value or a list of values."
                    )));
                }
                out.extend(value_tokens(name, item)?);
            }
            out.push(Token::RParen);
            out
        }
        Json::Object(_) => {
            return Err(QueryError::Invalid(format!(
                "Variable {name} must be a value or a list of values."
            )))
        }
    })
}

fn reject_clauses(query: &Query) -> Result<(), QueryError> {
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

fn number(n: usize) -> Expr {
    Expr::Value(Value::Number(n.to_string(), false).with_empty_span())
}

fn literal_usize(e: &Expr) -> Option<usize> {
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
fn apply_limit(query: &mut Query, limits: RowLimits) -> Result<usize, QueryError> {
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
fn referenced_tables(statement: &Statement) -> Result<BTreeSet<String>, QueryError> {
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
const TABLES: [&str; 4] = ["events", "persons", "person_distinct_ids", "groups"];

#[derive(Default)]
struct CteNames(BTreeSet<String>);

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

fn ident_value(i: &Ident) -> &str {
    &i.value
}

fn compound(mut parts: Vec<Ident>) -> Expr {
    if parts.len() == 1 {
        Expr::Identifier(parts.remove(0))
    } else {
        Expr::CompoundIdentifier(parts)
    }
}

fn string_literal(s: &str) -> Expr {
    Expr::Value(Value::SingleQuotedString(s.to_string()).with_empty_span())
}

fn call(name: &str, args: Vec<Expr>) -> Expr {
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
fn property_access(parts: &[Ident]) -> Option<Expr> {
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

fn person_id_access(parts: &[Ident]) -> Option<Expr> {
    let n = parts.len();
    if n >= 2 && ident_value(&parts[n - 2]) == "person" && ident_value(&parts[n - 1]) == "id" {
        let mut col = parts[..n - 2].to_vec();
        col.push(Ident::new("person_id"));
        return Some(compound(col));
    }
    None
}

fn is_property_call(e: &Expr) -> bool {
    matches!(e, Expr::Function(f) if f.name.to_string() == JsonKind::Property.function_name())
}

fn is_number_literal(e: &Expr) -> bool {
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

fn to_number_call(e: &mut Expr) {
    if let Expr::Function(f) = e {
        f.name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new(
            JsonKind::PropertyNumber.function_name(),
        ))]);
    }
}

/// The post-order rewrite of one expression (children are already rewritten).
fn rewrite(expr: &mut Expr) -> ControlFlow<QueryError> {
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

fn materialized_access(f: &Function, keys: &BTreeSet<String>) -> Option<(Expr, String)> {
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
        crate::ingest::segment::materialized_column(&key),
    ));
    Some((compound(parts), key))
}

/// `properties['$browser']`, `person.properties['a']['b']`, `person_properties['a']`.
fn subscript_access(
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

fn plain_args(f: &Function) -> Option<Vec<Expr>> {
    match &f.args {
        FunctionArguments::None => Some(Vec::new()),
        FunctionArguments::List(list) => list
            .args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e.clone()),
                _ => None,
            })
            .collect(),
        FunctionArguments::Subquery(_) => None,
    }
}

fn string_arg(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

fn number_arg(e: &Expr) -> Option<f64> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => number_arg(expr).map(|n| -n),
        _ => None,
    }
}

/// Parses one of our fixed templates and puts `args[i]` where it says `__aI`.
fn template(sql: &str, args: &[Expr]) -> Result<Expr, QueryError> {
    let dialect = dialect();
    let mut expr = Parser::new(&dialect)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| QueryError::Internal(format!("template {sql}: {e}")))?;
    let flow = visit_expressions_mut(&mut expr, |e| {
        if let Expr::Identifier(i) = e {
            if let Some(n) = i
                .value
                .strip_prefix("__a")
                .and_then(|n| n.parse::<usize>().ok())
            {
                if let Some(arg) = args.get(n) {
                    *e = arg.clone();
                }
            }
        }
        ControlFlow::<()>::Continue(())
    });
    debug_assert!(flow.is_continue());
    Ok(expr)
}

fn arity(name: &str, args: &[Expr], allowed: &[usize]) -> Result<(), QueryError> {
    if allowed.contains(&args.len()) {
        Ok(())
    } else {
        Err(QueryError::Invalid(format!(
            "Function {name} takes {} argument(s), got {}.",
            allowed
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" or "),
            args.len()
        )))
    }
}

/// Date units `dateDiff`, `dateAdd` and friends accept, with their length in seconds where fixed.
fn date_unit(name: &str, unit: Option<String>) -> Result<(&'static str, Option<u64>), QueryError> {
    let unit = unit.ok_or_else(|| {
        QueryError::Invalid(format!("The unit of {name} must be a constant string."))
    })?;
    Ok(match unit.to_lowercase().trim_end_matches('s') {
        "second" => ("second", Some(1)),
        "minute" => ("minute", Some(60)),
        "hour" => ("hour", Some(3_600)),
        "day" => ("day", Some(86_400)),
        "week" => ("week", Some(604_800)),
        "month" => ("month", None),
        "quarter" => ("quarter", None),
        "year" => ("year", None),
        other => {
            return Err(QueryError::Invalid(format!(
                "Unknown date unit '{other}' in {name}."
            )))
        }
    })
}

/// Maps ClickHouse/HogQL functions onto DataFusion. `Ok(None)` keeps the call as written (so
/// DataFusion's own functions work, and an unknown name fails at planning with its name).
pub fn rewrite_function(f: &mut Function) -> Result<Option<Expr>, QueryError> {
    let name = f.name.to_string();
    let lower = name.to_lowercase();
    // `quantile(0.9)(x)`: ClickHouse's parametric form.
    if let FunctionArguments::List(params) = &f.parameters {
        let level = params.args.first().and_then(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => number_arg(e),
            _ => None,
        });
        let args = plain_args(f).unwrap_or_default();
        return match (lower.as_str(), level, args.as_slice()) {
            ("quantile" | "quantileexact", Some(q), [_]) if (0.0..=1.0).contains(&q) => {
                template(&format!("percentile_cont(__a0, {q})"), &args).map(Some)
            }
            _ => Err(QueryError::UnsupportedFunction(format!("{name}(…)(…)"))),
        };
    }
    let Some(args) = plain_args(f) else {
        // `count(*)`, `count(DISTINCT x)` and other forms DataFusion understands as written.
        if lower == "uniq" || lower == "uniqexact" {
            if let FunctionArguments::List(list) = &mut f.args {
                list.duplicate_treatment = Some(DuplicateTreatment::Distinct);
            }
            f.name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new("count"))]);
        }
        return Ok(None);
    };
    let a = args.as_slice();
    let t = |sql: &str| template(sql, a).map(Some);
    match lower.as_str() {
        "count" if a.is_empty() => t("count(*)"),
        "countif" => {
            arity(&name, a, &[1, 2])?;
            if a.len() == 1 {
                t("count(CASE WHEN __a0 THEN 1 END)")
            } else {
                t("count(CASE WHEN __a1 THEN __a0 END)")
            }
        }
        // ClickHouse's estimating `uniq*` family: distinct 64-bit hashes (see `uniq`).
        "uniq" | "uniqcombined" | "uniqcombined64" | "uniqhll12" | "uniqtheta" => {
            arity(&name, a, &[1])?;
            t(&format!("{UNIQ}(__a0)"))
        }
        "uniqif" => {
            arity(&name, a, &[2])?;
            t(&format!("{UNIQ}(CASE WHEN __a1 THEN __a0 END)"))
        }
        "uniqexact" => {
            arity(&name, a, &[1])?;
            t("count(DISTINCT __a0)")
        }
        "uniqexactif" => {
            arity(&name, a, &[2])?;
            t("count(DISTINCT CASE WHEN __a1 THEN __a0 END)")
        }
        "sumif" | "avgif" | "minif" | "maxif" => {
            arity(&name, a, &[2])?;
            let agg = &lower[..lower.len() - 2];
            t(&format!("{agg}(CASE WHEN __a1 THEN __a0 END)"))
        }
        "quantile" | "quantileexact" => Err(QueryError::Invalid(format!(
            "{name} needs a level: {name}(0.9)(x)."
        ))),
        "todate" => {
            arity(&name, a, &[1])?;
            t("CAST(__a0 AS DATE)")
        }
        "todatetime" | "todatetime64" | "parsedatetimebesteffort" => {
            arity(&name, a, &[1, 2])?;
            t("arrow_cast(__a0, 'Timestamp(µs, \"UTC\")')")
        }
        "tostartofminute" | "tostartofhour" | "tostartofday" => {
            arity(&name, a, &[1])?;
            let unit = &lower["tostartof".len()..];
            t(&format!("date_trunc('{unit}', __a0)"))
        }
        "tostartofmonth" | "tostartofquarter" | "tostartofyear" => {
            arity(&name, a, &[1])?;
            let unit = &lower["tostartof".len()..];
            t(&format!("CAST(date_trunc('{unit}', __a0) AS DATE)"))
        }
        "tostartofweek" | "tomonday" => {
            arity(&name, a, &[1, 2])?;
            // ClickHouse mode 0 (the default) starts weeks on Sunday; odd modes on Monday.
            let monday = lower == "tomonday"
                || a.get(1)
                    .and_then(number_arg)
                    .is_some_and(|m| m as i64 % 2 == 1);
            if monday {
                t("CAST(date_trunc('week', __a0) AS DATE)")
            } else {
                t("CAST(date_trunc('week', __a0 + INTERVAL 1 DAY) - INTERVAL 1 DAY AS DATE)")
            }
        }
        "toyyyymm" => {
            arity(&name, a, &[1])?;
            t("CAST(date_part('year', __a0) * 100 + date_part('month', __a0) AS BIGINT)")
        }
        "toyyyymmdd" => {
            arity(&name, a, &[1])?;
            t("CAST(date_part('year', __a0) * 10000 + date_part('month', __a0) * 100 + date_part('day', __a0) AS BIGINT)")
        }
        "toyear" | "tomonth" | "tohour" | "tominute" | "tosecond" | "todayofmonth" => {
            arity(&name, a, &[1])?;
            let part = match lower.as_str() {
                "todayofmonth" => "day",
                other => &other[2..],
            };
            t(&format!("CAST(date_part('{part}', __a0) AS BIGINT)"))
        }
        "todayofweek" => {
            arity(&name, a, &[1])?;
            // ClickHouse: Monday = 1 … Sunday = 7.
            t("CAST((date_part('dow', __a0) + 6) % 7 + 1 AS BIGINT)")
        }
        "datediff" | "date_diff" | "timestampdiff" => {
            arity(&name, a, &[3])?;
            let (unit, seconds) = date_unit(&name, string_arg(&a[0]))?;
            match (unit, seconds) {
                ("second", _) => t("CAST(date_part('epoch', __a2) - date_part('epoch', __a1) AS BIGINT)"),
                (_, Some(s)) => t(&format!(
                    "CAST((date_part('epoch', date_trunc('{unit}', CAST(__a2 AS TIMESTAMP))) - date_part('epoch', date_trunc('{unit}', CAST(__a1 AS TIMESTAMP)))) / {s} AS BIGINT)"
                )),
                ("month", None) => t("CAST((date_part('year', __a2) * 12 + date_part('month', __a2)) - (date_part('year', __a1) * 12 + date_part('month', __a1)) AS BIGINT)"),
                ("quarter", None) => t("CAST((date_part('year', __a2) * 4 + date_part('quarter', __a2)) - (date_part('year', __a1) * 4 + date_part('quarter', __a1)) AS BIGINT)"),
                _ => t("CAST(date_part('year', __a2) - date_part('year', __a1) AS BIGINT)"),
            }
        }
        "dateadd" | "date_add" | "datesub" | "date_sub" | "timestamp_add" | "timestamp_sub" => {
            arity(&name, a, &[2, 3])?;
            let sign = if lower.contains("sub") { "-" } else { "+" };
            if a.len() == 2 {
                return t(&format!("__a0 {sign} __a1"));
            }
            let (unit, _) = date_unit(&name, string_arg(&a[0]))?;
            let amount = number_arg(&a[1]).ok_or_else(|| {
                QueryError::Invalid(format!("The amount of {name} must be a constant number."))
            })?;
            t(&format!(
                "__a2 {sign} INTERVAL {amount} {}",
                unit.to_uppercase()
            ))
        }
        "addseconds" | "addminutes" | "addhours" | "adddays" | "addweeks" | "addmonths"
        | "addyears" | "subtractseconds" | "subtractminutes" | "subtracthours" | "subtractdays"
        | "subtractweeks" | "subtractmonths" | "subtractyears" => {
            arity(&name, a, &[2])?;
            let (sign, unit) = match lower.strip_prefix("add") {
                Some(u) => ("+", u),
                None => ("-", &lower["subtract".len()..]),
            };
            let (unit, _) = date_unit(&name, Some(unit.to_string()))?;
            let amount = number_arg(&a[1]).ok_or_else(|| {
                QueryError::Invalid(format!("The amount of {name} must be a constant number."))
            })?;
            t(&format!(
                "__a0 {sign} INTERVAL {amount} {}",
                unit.to_uppercase()
            ))
        }
        "today" => {
            arity(&name, a, &[0])?;
            t("current_date()")
        }
        "yesterday" => {
            arity(&name, a, &[0])?;
            t("current_date() - INTERVAL 1 DAY")
        }
        "if" => {
            arity(&name, a, &[3])?;
            t("CASE WHEN __a0 THEN __a1 ELSE __a2 END")
        }
        "multiif" => {
            if a.len() < 3 || a.len() % 2 == 0 {
                return Err(QueryError::Invalid(
                    "multiIf takes condition/value pairs and a final default value.".into(),
                ));
            }
            let mut sql = String::from("CASE");
            for pair in 0..a.len() / 2 {
                sql.push_str(&format!(" WHEN __a{} THEN __a{}", pair * 2, pair * 2 + 1));
            }
            sql.push_str(&format!(" ELSE __a{} END", a.len() - 1));
            t(&sql)
        }
        "ifnull" => {
            arity(&name, a, &[2])?;
            t("coalesce(__a0, __a1)")
        }
        "isnull" => {
            arity(&name, a, &[1])?;
            t("__a0 IS NULL")
        }
        "isnotnull" => {
            arity(&name, a, &[1])?;
            t("__a0 IS NOT NULL")
        }
        "like" | "ilike" | "notlike" | "notilike" => {
            arity(&name, a, &[2])?;
            let op = match lower.as_str() {
                "like" => "LIKE",
                "ilike" => "ILIKE",
                "notlike" => "NOT LIKE",
                _ => "NOT ILIKE",
            };
            t(&format!("__a0 {op} __a1"))
        }
        "tostring" => {
            arity(&name, a, &[1])?;
            t("CAST(__a0 AS VARCHAR)")
        }
        "toint" | "toint64" | "toint32" | "touint64" | "touint32" => {
            arity(&name, a, &[1])?;
            t("CAST(__a0 AS BIGINT)")
        }
        "tointornull" | "toint64ornull" => {
            arity(&name, a, &[1])?;
            t("TRY_CAST(__a0 AS BIGINT)")
        }
        "tofloat" | "tofloat64" | "tofloatornull" | "tofloat64ornull" => {
            arity(&name, a, &[1])?;
            t("TRY_CAST(__a0 AS DOUBLE)")
        }
        "empty" => {
            arity(&name, a, &[1])?;
            t("(coalesce(__a0, '') = '')")
        }
        "notempty" => {
            arity(&name, a, &[1])?;
            t("(coalesce(__a0, '') <> '')")
        }
        "jsonextractstring" | "jsonextractint" | "jsonextractfloat" | "jsonextractbool"
        | "jsonextractraw" | "jsonhas" => {
            if a.len() < 2 {
                return Err(QueryError::Invalid(format!(
                    "Function {name} takes a JSON value and at least one key."
                )));
            }
            let kind = match lower.as_str() {
                "jsonextractstring" => JsonKind::ExtractString,
                "jsonextractint" => JsonKind::ExtractInt,
                "jsonextractfloat" => JsonKind::ExtractFloat,
                "jsonextractbool" => JsonKind::ExtractBool,
                "jsonextractraw" => JsonKind::ExtractRaw,
                _ => JsonKind::Has,
            };
            Ok(Some(call(kind.function_name(), args.clone())))
        }
        "arrayjoin" => Err(QueryError::UnsupportedFunction(
            "arrayJoin (use a JOIN or UNNEST over a subquery instead)".into(),
        )),
        _ => Ok(None),
    }
}
