//! When a scheduled export runs and where its objects go: intervals aligned to the clock
//! (an hour's run covers `[10:00, 11:00)`), the key prefix with PostHog's variables, and
//! object keys that depend only on the export and the interval, so a retried interval
//! overwrites its objects instead of adding to them.

use std::fmt;

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};
use serde::{Deserialize, Serialize};

/// How often an export runs. PostHog's `hour`, `day` and `week`, and `every N minutes` for
/// N of 1, 5, 10, 15, 20 or 30 (PostHog's high-frequency `every 5 minutes` among them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Interval {
    Minutes(u32),
    Hour,
    Day,
    Week,
}

const MINUTES: [u32; 6] = [1, 5, 10, 15, 20, 30];

impl Interval {
    pub fn parse(text: &str) -> Option<Interval> {
        match text {
            "hour" => Some(Interval::Hour),
            "day" => Some(Interval::Day),
            "week" => Some(Interval::Week),
            "every 1 minute" => Some(Interval::Minutes(1)),
            other => {
                let n: u32 = other
                    .strip_prefix("every ")?
                    .strip_suffix(" minutes")?
                    .parse()
                    .ok()?;
                MINUTES.contains(&n).then_some(Interval::Minutes(n))
            }
        }
    }

    pub fn length(self) -> chrono::Duration {
        match self {
            Interval::Minutes(n) => chrono::Duration::minutes(i64::from(n)),
            Interval::Hour => chrono::Duration::hours(1),
            Interval::Day => chrono::Duration::days(1),
            Interval::Week => chrono::Duration::weeks(1),
        }
    }

    /// The start of the interval `t` falls in (weeks start on Monday, in UTC).
    pub fn floor(self, t: DateTime<Utc>) -> DateTime<Utc> {
        let day = t
            .date_naive()
            .and_hms_opt(0, 0, 0)
            .map(|d| d.and_utc())
            .unwrap_or(t);
        match self {
            Interval::Minutes(n) => {
                let minute = t.minute() - t.minute() % n;
                day + chrono::Duration::hours(i64::from(t.hour()))
                    + chrono::Duration::minutes(i64::from(minute))
            }
            Interval::Hour => day + chrono::Duration::hours(i64::from(t.hour())),
            Interval::Day => day,
            Interval::Week => {
                day - chrono::Duration::days(i64::from(t.weekday().num_days_from_monday()))
            }
        }
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Interval::Minutes(1) => f.write_str("every 1 minute"),
            Interval::Minutes(n) => write!(f, "every {n} minutes"),
            Interval::Hour => f.write_str("hour"),
            Interval::Day => f.write_str("day"),
            Interval::Week => f.write_str("week"),
        }
    }
}

impl TryFrom<String> for Interval {
    type Error = String;
    fn try_from(text: String) -> Result<Interval, String> {
        Interval::parse(&text).ok_or_else(|| format!("unknown interval {text:?}"))
    }
}

impl From<Interval> for String {
    fn from(interval: Interval) -> String {
        interval.to_string()
    }
}

/// The variables a prefix may use.
const VARIABLES: [&str; 10] = [
    "year",
    "month",
    "day",
    "hour",
    "minute",
    "second",
    "data_interval_start",
    "data_interval_end",
    "table",
    "table_name",
];

/// Each `{name}` in `prefix`, or an error for an unclosed brace.
fn placeholders(prefix: &str) -> Result<Vec<&str>, String> {
    let mut names = Vec::new();
    let mut rest = prefix;
    while let Some(open) = rest.find('{') {
        let after = rest.get(open + 1..).unwrap_or_default();
        let close = after
            .find('}')
            .ok_or_else(|| format!("The prefix {prefix:?} has a '{{' that is not closed."))?;
        names.push(after.get(..close).unwrap_or_default());
        rest = after.get(close + 1..).unwrap_or_default();
    }
    Ok(names)
}

/// Whether `prefix` only uses known variables.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    for name in placeholders(prefix)? {
        if !VARIABLES.contains(&name) {
            return Err(format!(
                "The prefix uses an unknown variable {{{name}}}; it may use {}.",
                VARIABLES
                    .iter()
                    .map(|v| format!("{{{v}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(())
}

fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `prefix` with its variables filled from the interval (the date parts from its end, as
/// PostHog fills them).
pub fn fill_prefix(prefix: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> String {
    let mut out = prefix.to_string();
    for (name, value) in [
        ("year", format!("{:04}", end.year())),
        ("month", format!("{:02}", end.month())),
        ("day", format!("{:02}", end.day())),
        ("hour", format!("{:02}", end.hour())),
        ("minute", format!("{:02}", end.minute())),
        ("second", format!("{:02}", end.second())),
        ("data_interval_start", stamp(start)),
        ("data_interval_end", stamp(end)),
        ("table", "events".to_string()),
        ("table_name", "events".to_string()),
    ] {
        out = out.replace(&format!("{{{name}}}"), &value);
    }
    out
}

/// The key of `name` (a file of the interval) below the filled prefix.
pub fn object_key(filled_prefix: &str, name: &str) -> String {
    let prefix = filled_prefix.trim_matches('/');
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// The stem every object of the interval's starts with: `{start}-{end}`.
pub fn interval_stem(start: DateTime<Utc>, end: DateTime<Utc>) -> String {
    format!("{}-{}", stamp(start), stamp(end))
}

/// The manifest's name, written last: the interval is complete once it exists.
pub fn manifest_name(start: DateTime<Utc>, end: DateTime<Utc>) -> String {
    format!("{}_manifest.json", interval_stem(start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("time")
    }

    #[test]
    fn intervals_align_to_the_clock() {
        let t = at("2026-11-26T13:47:12Z"); // a Thursday
        assert_eq!(Interval::Minutes(5).floor(t), at("2026-11-26T13:45:00Z"));
        assert_eq!(Interval::Minutes(1).floor(t), at("2026-11-26T13:47:00Z"));
        assert_eq!(Interval::Hour.floor(t), at("2026-11-26T13:00:00Z"));
        assert_eq!(Interval::Day.floor(t), at("2026-11-26T00:00:00Z"));
        assert_eq!(Interval::Week.floor(t), at("2026-11-23T00:00:00Z"));
        assert_eq!(
            Interval::parse("every 5 minutes"),
            Some(Interval::Minutes(5))
        );
        assert_eq!(Interval::parse("every 7 minutes"), None);
        assert_eq!(Interval::parse("minute"), None);
        assert_eq!(Interval::Minutes(5).to_string(), "every 5 minutes");
    }

    #[test]
    fn prefixes_fill_posthogs_variables() {
        let (start, end) = (at("2026-11-26T13:00:00Z"), at("2026-11-26T14:00:00Z"));
        assert_eq!(
            fill_prefix("ph/{table}/{year}-{month}-{day}/{hour}", start, end),
            "ph/events/2026-11-26/14"
        );
        assert!(check_prefix("x/{year}/{data_interval_end}").is_ok());
        assert!(check_prefix("x/{nope}")
            .expect_err("unknown")
            .contains("{nope}"));
        assert!(check_prefix("x/{year").is_err());
        assert_eq!(object_key("p/", "a.jsonl"), "p/a.jsonl");
        assert_eq!(object_key("", "a.jsonl"), "a.jsonl");
        assert_eq!(
            manifest_name(start, end),
            "2026-11-26T13:00:00Z-2026-11-26T14:00:00Z_manifest.json"
        );
    }
}
