//! The function table: ClickHouse functions HogQL users write, rewritten into DataFusion ones.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, DuplicateTreatment, Expr, Function, FunctionArg, FunctionArgExpr,
    FunctionArguments, Ident, ObjectName, ObjectNamePart, UnaryOperator, Value,
};
use datafusion::sql::sqlparser::parser::Parser;

use super::super::error::QueryError;
use super::super::functions::JsonKind;
use super::super::uniq::UNIQ;
use super::{call, dialect};

pub(super) fn plain_args(f: &Function) -> Option<Vec<Expr>> {
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

pub(super) fn string_arg(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn number_arg(e: &Expr) -> Option<f64> {
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
pub(super) fn template(sql: &str, args: &[Expr]) -> Result<Expr, QueryError> {
    let dialect = dialect();
    let mut expr = Parser::new(&dialect)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| QueryError::Internal(format!("template {sql}: {e}").into()))?;
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

pub(super) fn arity(name: &str, args: &[Expr], allowed: &[usize]) -> Result<(), QueryError> {
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
pub(super) fn date_unit(
    name: &str,
    unit: Option<String>,
) -> Result<(&'static str, Option<u64>), QueryError> {
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
        // ClickHouse's estimating `uniq*` family: an adaptive sample of 64-bit hashes (see `uniq`).
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
            let agg = lower.strip_suffix("if").unwrap_or_default();
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
            let unit = lower.strip_prefix("tostartof").unwrap_or_default();
            t(&format!("date_trunc('{unit}', __a0)"))
        }
        "tostartofmonth" | "tostartofquarter" | "tostartofyear" => {
            arity(&name, a, &[1])?;
            let unit = lower.strip_prefix("tostartof").unwrap_or_default();
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
                other => other.strip_prefix("to").unwrap_or(other),
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
                None => ("-", lower.strip_prefix("subtract").unwrap_or_default()),
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
