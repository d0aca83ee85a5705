//! Placeholders: `{variables.x}` and `{filters}` become literal tokens, so values never pass through SQL text.

use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use super::super::error::QueryError;
use super::{tokenize, Json, MARKER_PREFIX};
use crate::{Bindings, VARIABLE_MARKER};

pub(super) fn word(token: &Token) -> Option<&str> {
    match token {
        Token::Word(w) => Some(w.value.as_str()),
        _ => None,
    }
}

pub(super) fn plain(token: Token) -> TokenWithSpan {
    TokenWithSpan::wrap(token)
}

/// `{variables.x}` → the value's tokens; `{filters}` → `( … )`; `.$prop` → `."$prop"`.
pub(super) fn substitute_placeholders(
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
pub(super) fn fill_markers(
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
                .ok_or_else(|| QueryError::Internal(format!("unbound value #{n}").into()))?;
            out.extend(value_tokens("filter", value)?.into_iter().map(plain));
        } else if !matches!(t.token, Token::Whitespace(_)) {
            out.push(t);
        }
    }
    Ok(out)
}

/// A JSON value as literal tokens: strings, numbers, booleans, NULL, and lists as `(a, b)`.
pub(super) fn value_tokens(name: &str, value: &Json) -> Result<Vec<Token>, QueryError> {
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
