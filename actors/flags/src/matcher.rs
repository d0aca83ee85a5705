//! A property filter's operator and value, read once into the form its comparison uses.
//!
//! The filter side of a comparison is the same for every request: its operator, and its value
//! as text, a lowercased needle, a number, a version, a compiled pattern or a date. Reading
//! them on each evaluation (string dispatch on the operator, date and version parsing, list
//! copies) cost more than the comparisons themselves; a [`Matcher`] is built the first time a
//! filter is matched and kept beside it ([`Compiled`]), so each evaluation reads only the
//! person's side.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::values::{
    compiled_regex, contains_ignore_ascii_case, eq_lowercase, number, property_date, semver,
    to_text, truthiness, wildcard, AbsoluteDate, MatchContext, RelativeDate,
};

/// The [`Matcher`] of a filter, built on first use. Filters are read-only once in a flag
/// snapshot; one built by hand and then changed must be rebuilt, not edited in place.
#[derive(Clone, Default)]
pub struct Compiled(OnceLock<Matcher>);

impl Compiled {
    pub(crate) fn get_or_init(&self, operator: Option<&str>, value: &Value) -> &Matcher {
        self.0.get_or_init(|| Matcher::new(operator, value))
    }
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compiled")
    }
}

impl PartialEq for Compiled {
    /// Derived from the filter's other fields, so it never makes two filters differ.
    fn eq(&self, _: &Compiled) -> bool {
        true
    }
}

/// An operator with its value read; `negated` flips the answer of the positive form.
#[derive(Debug, Clone)]
pub(crate) struct Matcher {
    test: Test,
    negated: bool,
}

#[derive(Debug, Clone)]
enum Test {
    /// `exact` / `is_not` on booleans (or "true"/"false" texts): any listed truthiness.
    Truthiness(Vec<bool>),
    /// `exact` / `is_not` otherwise: case-insensitive equality with any listed text.
    Texts(Vec<String>),
    /// `icontains`, `icontains_multi`: any needle, ASCII case-insensitively.
    Contains(Vec<String>),
    StartsWith(String),
    EndsWith(String),
    /// An invalid pattern matches under neither operator.
    Regex(Option<Arc<regex::Regex>>),
    Compare(Ordering, Option<f64>),
    /// Inclusive bounds; `None` when they are not two numbers in order.
    Between(Option<(f64, f64)>),
    Semver(Ordering, Option<semver::Version>),
    /// `semver_tilde`, `semver_caret`, `semver_wildcard`.
    SemverRange(Option<semver::VersionReq>),
    Date(Ordering, Option<FilterDate>),
    IsSet,
    /// An operator Corvid does not evaluate: no match.
    Unknown,
}

#[derive(Debug, Clone, Copy)]
enum Ordering {
    Less,
    LessOrEqual,
    Equal,
    NotEqual,
    Greater,
    GreaterOrEqual,
}

impl Ordering {
    fn holds<T: PartialOrd>(self, a: &T, b: &T) -> bool {
        match self {
            Ordering::Less => a < b,
            Ordering::LessOrEqual => a <= b,
            Ordering::Equal => a == b,
            Ordering::NotEqual => a != b,
            Ordering::Greater => a > b,
            Ordering::GreaterOrEqual => a >= b,
        }
    }
}

/// The filter side of a date comparison: relative dates move with the request's time,
/// local ones are placed in the project's time zone at evaluation.
#[derive(Debug, Clone, Copy)]
enum FilterDate {
    Relative(RelativeDate),
    Absolute(AbsoluteDate),
}

impl FilterDate {
    fn read(text: &str) -> Option<FilterDate> {
        RelativeDate::read(text)
            .map(FilterDate::Relative)
            .or_else(|| AbsoluteDate::read(text).map(FilterDate::Absolute))
    }
}

fn list(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) => items,
        other => std::slice::from_ref(other),
    }
}

fn texts(value: &Value) -> Vec<String> {
    list(value)
        .iter()
        .map(|v| to_text(v).into_owned())
        .collect()
}

fn is_truthy_token(value: &Value) -> bool {
    match value {
        Value::Bool(_) => true,
        Value::String(s) => s.eq_ignore_ascii_case("true") || s.eq_ignore_ascii_case("false"),
        _ => false,
    }
}

impl Matcher {
    pub(crate) fn new(operator: Option<&str>, value: &Value) -> Matcher {
        let operator = operator.unwrap_or("exact");
        let negated = matches!(
            operator,
            "is_not"
                | "not_icontains"
                | "not_icontains_multi"
                | "not_starts_with"
                | "not_ends_with"
                | "not_regex"
                | "not_between"
        );
        let text = || to_text(value).into_owned();
        let lower = || to_text(value).to_ascii_lowercase();
        let version = || semver(&to_text(value));
        let date = || value.as_str().and_then(FilterDate::read);
        let test = match operator {
            "exact" | "is_not" => {
                // Booleans (or "true"/"false" texts, alone or all of a non-empty list) compare
                // by truthiness; everything else as case-insensitive text.
                let boolean = match value {
                    Value::Array(items) => !items.is_empty() && items.iter().all(is_truthy_token),
                    other => is_truthy_token(other),
                };
                if boolean {
                    Test::Truthiness(list(value).iter().map(truthiness).collect())
                } else {
                    Test::Texts(texts(value))
                }
            }
            "icontains" | "not_icontains" => Test::Contains(vec![text()]),
            "icontains_multi" | "not_icontains_multi" => Test::Contains(texts(value)),
            "starts_with" | "not_starts_with" => Test::StartsWith(lower()),
            "ends_with" | "not_ends_with" => Test::EndsWith(lower()),
            "regex" | "not_regex" => Test::Regex(compiled_regex(&to_text(value))),
            "gt" => Test::Compare(Ordering::Greater, number(value)),
            "gte" => Test::Compare(Ordering::GreaterOrEqual, number(value)),
            "lt" => Test::Compare(Ordering::Less, number(value)),
            "lte" => Test::Compare(Ordering::LessOrEqual, number(value)),
            "between" | "not_between" => {
                let bounds = list(value);
                let pair = match bounds {
                    // Bounds out of order are unusable; NaN bounds are kept, and contain nothing.
                    [lo, hi] => number(lo)
                        .zip(number(hi))
                        .filter(|(lo, hi)| lo.partial_cmp(hi) != Some(std::cmp::Ordering::Greater)),
                    _ => None,
                };
                Test::Between(pair)
            }
            "semver_eq" => Test::Semver(Ordering::Equal, version()),
            "semver_neq" => Test::Semver(Ordering::NotEqual, version()),
            "semver_gt" => Test::Semver(Ordering::Greater, version()),
            "semver_gte" => Test::Semver(Ordering::GreaterOrEqual, version()),
            "semver_lt" => Test::Semver(Ordering::Less, version()),
            "semver_lte" => Test::Semver(Ordering::LessOrEqual, version()),
            "semver_tilde" | "semver_caret" => {
                let sign = if operator == "semver_tilde" { '~' } else { '^' };
                Test::SemverRange(
                    version()
                        .and_then(|base| semver::VersionReq::parse(&format!("{sign}{base}")).ok()),
                )
            }
            "semver_wildcard" => Test::SemverRange(wildcard(&to_text(value))),
            "is_set" => Test::IsSet,
            "is_not_set" => {
                return Matcher {
                    test: Test::IsSet,
                    negated: true,
                }
            }
            "is_date_before" => Test::Date(Ordering::Less, date()),
            "is_date_after" => Test::Date(Ordering::Greater, date()),
            "is_date_exact" => Test::Date(Ordering::Equal, date()),
            _ => Test::Unknown,
        };
        Matcher { test, negated }
    }

    /// Whether a filter with no such property matches: only the negated operators.
    pub(crate) fn matches_missing(&self) -> bool {
        self.negated
    }

    /// Whether the property's value `actual` matches. A side that cannot be read (not a
    /// number, version or date; an invalid pattern) is no match under either form.
    pub(crate) fn matches(&self, actual: &Value, ctx: &MatchContext) -> bool {
        self.positive(actual, ctx)
            .is_some_and(|matched| matched != self.negated)
    }

    fn positive(&self, actual: &Value, ctx: &MatchContext) -> Option<bool> {
        Some(match &self.test {
            Test::Truthiness(wanted) => {
                let actual = truthiness(actual);
                wanted.contains(&actual)
            }
            Test::Texts(wanted) => {
                let actual = to_text(actual);
                wanted.iter().any(|w| eq_lowercase(w, &actual))
            }
            Test::Contains(needles) => {
                let hay = to_text(actual);
                needles.iter().any(|n| contains_ignore_ascii_case(&hay, n))
            }
            Test::StartsWith(prefix) => {
                let text = to_text(actual);
                let head = text.as_bytes().get(..prefix.len());
                head.is_some_and(|h| h.eq_ignore_ascii_case(prefix.as_bytes()))
            }
            Test::EndsWith(suffix) => {
                let text = to_text(actual);
                let bytes = text.as_bytes();
                let tail = bytes.len().checked_sub(suffix.len()).map(|at| &bytes[at..]);
                tail.is_some_and(|t| t.eq_ignore_ascii_case(suffix.as_bytes()))
            }
            Test::Regex(pattern) => pattern.as_ref()?.is_match(&to_text(actual)),
            Test::Compare(ordering, expected) => {
                ordering.holds(&number(actual)?, expected.as_ref()?)
            }
            Test::Between(bounds) => {
                let (lo, hi) = (*bounds)?;
                let a = number(actual)?;
                if a.is_nan() {
                    // NaN is outside every range, and inside none of their complements.
                    return Some(self.negated);
                }
                (lo..=hi).contains(&a)
            }
            Test::Semver(ordering, expected) => {
                let expected = expected.as_ref()?;
                ordering.holds(&semver(&to_text(actual))?, expected)
            }
            Test::SemverRange(requirement) => {
                let requirement = requirement.as_ref()?;
                requirement.matches(&semver(&to_text(actual))?)
            }
            Test::Date(ordering, expected) => {
                let expected = match (*expected)? {
                    FilterDate::Relative(relative) => relative.at(ctx)?,
                    FilterDate::Absolute(absolute) => absolute.at(ctx.timezone)?,
                };
                ordering.holds(&property_date(actual, ctx)?, &expected)
            }
            Test::IsSet => true,
            Test::Unknown => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::properties::{match_property, PropertyFilter, PROPERTY_OPERATORS};
    use super::*;

    fn at(now: &str, timezone: chrono_tz::Tz) -> MatchContext {
        MatchContext {
            now: now.parse().expect("now"),
            timezone,
        }
    }

    fn filter(operator: &str, value: Value) -> PropertyFilter {
        serde_json::from_value(json!({"key": "k", "operator": operator, "value": value}))
            .expect("filter")
    }

    #[test]
    fn every_listed_operator_is_evaluated() {
        for operator in PROPERTY_OPERATORS {
            let matcher = Matcher::new(Some(operator), &json!("1"));
            assert!(!matches!(matcher.test, Test::Unknown), "{operator}");
        }
        assert!(matches!(
            Matcher::new(Some("no_such_operator"), &json!("1")).test,
            Test::Unknown
        ));
    }

    #[test]
    fn a_filter_read_once_still_follows_each_request_time_and_zone() {
        let props = json!({"k": "2020-01-05T00:00:00Z"});
        let props = props.as_object().expect("object");
        let recent = filter("is_date_after", json!("-7d"));
        assert!(match_property(
            &recent,
            props,
            &at("2020-01-10T00:00:00Z", chrono_tz::UTC)
        ));
        assert!(!match_property(
            &recent,
            props,
            &at("2020-02-10T00:00:00Z", chrono_tz::UTC)
        ));
        // Midnight of 2020-01-05 in Tokyo is 15:00 UTC the day before.
        let local = filter("is_date_before", json!("2020-01-05"));
        let now = "2020-02-01T00:00:00Z";
        assert!(!match_property(&local, props, &at(now, chrono_tz::UTC)));
        assert!(!match_property(
            &local,
            props,
            &at(now, chrono_tz::Asia::Tokyo)
        ));
        let after = filter("is_date_after", json!("2020-01-05"));
        assert!(!match_property(&after, props, &at(now, chrono_tz::UTC)));
        assert!(match_property(
            &after,
            props,
            &at(now, chrono_tz::Asia::Tokyo)
        ));
    }

    #[test]
    fn an_unreadable_side_matches_under_neither_form() {
        let props = json!({"k": "NaN", "v": "not.a.version"});
        let props = props.as_object().expect("object");
        let ctx = at("2020-01-01T00:00:00Z", chrono_tz::UTC);
        for operator in ["between", "not_between"] {
            assert!(
                !match_property(&filter(operator, json!([1, 3])), props, &ctx),
                "{operator}"
            );
        }
        assert!(!match_property(&filter("regex", json!("(")), props, &ctx));
        assert!(!match_property(
            &filter("not_regex", json!("(")),
            props,
            &ctx
        ));
        let mut on_v = filter("semver_neq", json!("1.0.0"));
        on_v.key = "v".into();
        assert!(!match_property(&on_v, props, &ctx));
        // NaN bounds are kept: nothing lies between them, everything outside.
        let two = json!({"k": 2});
        let two = two.as_object().expect("object");
        assert!(!match_property(
            &filter("between", json!(["NaN", 3])),
            two,
            &ctx
        ));
        assert!(match_property(
            &filter("not_between", json!(["NaN", 3])),
            two,
            &ctx
        ));
        assert!(!match_property(
            &filter("between", json!([3, 1])),
            two,
            &ctx
        ));
        assert!(!match_property(
            &filter("not_between", json!([3, 1])),
            two,
            &ctx
        ));
    }

    #[test]
    fn prefixes_and_suffixes_ignore_ascii_case_only() {
        let props = json!({"k": "Ärger@Corp.COM"});
        let props = props.as_object().expect("object");
        let ctx = at("2020-01-01T00:00:00Z", chrono_tz::UTC);
        assert!(match_property(
            &filter("ends_with", json!("@corp.com")),
            props,
            &ctx
        ));
        assert!(match_property(
            &filter("starts_with", json!("Ärger")),
            props,
            &ctx
        ));
        assert!(!match_property(
            &filter("starts_with", json!("ärger")),
            props,
            &ctx
        ));
        assert!(match_property(
            &filter("not_starts_with", json!("ärger")),
            props,
            &ctx
        ));
        assert!(!match_property(
            &filter("ends_with", json!("x@Ärger@Corp.COM")),
            props,
            &ctx
        ));
    }
}
