//! Date ranges and interval buckets of insight queries, in the project's timezone.
//!
//! PostHog's rules: `date_from` defaults to 7 days before the start of today; relative dates
//! look like `-7d`, `-1mStart`, `dStart`, `-24h`; absolute dates are read in the project
//! timezone unless they carry an offset; for non-hourly intervals `date_to` is the end of its
//! day and `date_from` snaps to the start of its interval; weeks start on Sunday.

#![deny(
    clippy::arithmetic_side_effects,
    clippy::string_slice,
    clippy::indexing_slicing
)]

use chrono::{
    DateTime, Datelike, Days, LocalResult, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta,
    TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;
use serde::Deserialize;

use crate::QueryError;
use corvid_kernel::time::{add, sub};

/// Insight dates outside these years are refused: nobody has events there, and the SQL the
/// range becomes binds RFC 3339 text, which has four-digit years.
const YEARS: std::ops::RangeInclusive<i32> = 1..=9999;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Interval {
    Hour,
    #[default]
    Day,
    Week,
    Month,
}

impl Interval {
    /// The SQL `date_trunc` unit.
    pub fn unit(self) -> &'static str {
        match self {
            Interval::Hour => "hour",
            Interval::Day => "day",
            Interval::Week => "week",
            Interval::Month => "month",
        }
    }

    /// The start of the bucket holding `t` (a local wall-clock time).
    pub fn floor(self, t: NaiveDateTime) -> NaiveDateTime {
        let day = t.date();
        match self {
            Interval::Hour => day.and_hms_opt(t.time().hour(), 0, 0).unwrap_or(t),
            Interval::Day => day.and_time(NaiveTime::MIN),
            Interval::Week => {
                let back = Days::new(u64::from(day.weekday().num_days_from_sunday()));
                day.checked_sub_days(back)
                    .unwrap_or(day)
                    .and_time(NaiveTime::MIN)
            }
            Interval::Month => day.with_day(1).unwrap_or(day).and_time(NaiveTime::MIN),
        }
    }

    /// The start of the bucket after the one starting at `t`; `None` past chrono's range.
    pub fn next(self, t: NaiveDateTime) -> Option<NaiveDateTime> {
        match self {
            Interval::Hour => add(t, TimeDelta::hours(1)),
            Interval::Day => add(t, TimeDelta::days(1)),
            Interval::Week => add(t, TimeDelta::weeks(1)),
            Interval::Month => add_months(t, 1),
        }
    }
}

/// `t` moved by `months` calendar months, the day clamped to the month's last (31 Jan + 1
/// month = 29 Feb); `None` past chrono's range.
fn add_months(t: NaiveDateTime, months: i64) -> Option<NaiveDateTime> {
    let n = Months::new(u32::try_from(months.unsigned_abs()).ok()?);
    if months >= 0 {
        t.checked_add_months(n)
    } else {
        t.checked_sub_months(n)
    }
}

/// A resolved range: local wall-clock bounds (inclusive) and their UTC instants.
#[derive(Debug, Clone)]
pub struct ResolvedRange {
    pub from_local: NaiveDateTime,
    pub to_local: NaiveDateTime,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// At most this many buckets are drawn, whatever the range.
const MAX_BUCKETS: usize = 100_000;

impl ResolvedRange {
    /// Every bucket start from the (snapped) start to `to`, inclusive.
    pub fn buckets(&self, interval: Interval) -> Vec<NaiveDateTime> {
        let mut out = Vec::new();
        let mut t = Some(interval.floor(self.from_local));
        while let Some(start) = t.filter(|t| *t <= self.to_local && out.len() < MAX_BUCKETS) {
            out.push(start);
            t = interval.next(start);
        }
        out
    }
}

/// Local wall-clock time → UTC instant (DST gaps move forward, folds take the earlier).
pub fn to_utc(tz: Tz, t: NaiveDateTime) -> DateTime<Utc> {
    let mut local = t;
    // A gap is at most a day long (Samoa, 2011): a day of hours always gets out of it.
    for _ in 0..=24 {
        match tz.from_local_datetime(&local) {
            LocalResult::Single(d) => return d.with_timezone(&Utc),
            LocalResult::Ambiguous(a, _) => return a.with_timezone(&Utc),
            LocalResult::None => match add(local, TimeDelta::hours(1)) {
                Some(later) => local = later,
                None => break,
            },
        }
    }
    Utc.from_utc_datetime(&t)
}

fn end_of_day(d: NaiveDate) -> NaiveDateTime {
    d.and_hms_micro_opt(23, 59, 59, 999_999)
        .unwrap_or(d.and_time(NaiveTime::MIN))
}

/// One microsecond before `t` (the end of the bucket before `t`).
fn just_before(t: NaiveDateTime) -> Option<NaiveDateTime> {
    sub(t, TimeDelta::microseconds(1))
}

/// Parses one date expression into a local wall-clock time. `is_end` picks the end of the
/// named unit for `…End` forms.
fn parse_date(text: &str, tz: Tz, now_local: NaiveDateTime) -> Result<NaiveDateTime, QueryError> {
    let s = text.trim();
    let bad = || {
        QueryError::InvalidInsight(format!(
            "Invalid date '{text}': use a relative date such as -7d, -1mStart or an ISO date."
        ))
    };
    let out_of_range = || {
        QueryError::InvalidInsight(format!(
            "Date '{text}' is out of range: dates must fall in the years 1 to 9999."
        ))
    };
    let parsed = parse_absolute(s, tz);
    let t = match parsed {
        Some(t) => t,
        None => parse_relative(s, now_local, bad)?.ok_or_else(out_of_range)?,
    };
    if !YEARS.contains(&t.year()) {
        return Err(out_of_range());
    }
    Ok(t)
}

fn parse_absolute(s: &str, tz: Tz) -> Option<NaiveDateTime> {
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Some(d.and_time(NaiveTime::MIN));
    }
    for f in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Some(t);
        }
    }
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&tz).naive_local())
}

/// `-?N?unit(Start|End)?`: `Err` when it is not that form, `Ok(None)` when it is but lands
/// outside chrono's range.
fn parse_relative(
    s: &str,
    now_local: NaiveDateTime,
    bad: impl Fn() -> QueryError,
) -> Result<Option<NaiveDateTime>, QueryError> {
    let (body, snap) = if let Some(b) = s.strip_suffix("Start") {
        (b, Some(false))
    } else if let Some(b) = s.strip_suffix("End") {
        (b, Some(true))
    } else {
        (s, None)
    };
    let mut chars = body.chars();
    let unit = chars.next_back().ok_or_else(&bad)?;
    let amount_text = chars.as_str().trim_start_matches('-');
    let amount: i64 = if amount_text.is_empty() {
        0
    } else {
        amount_text.parse().map_err(|_| bad())?
    };
    let span = |make: fn(i64) -> Option<TimeDelta>, n: i64| make(n).and_then(|d| sub(now_local, d));
    let t = match unit {
        's' => span(TimeDelta::try_seconds, amount),
        'M' => span(TimeDelta::try_minutes, amount),
        'h' | 'H' => span(TimeDelta::try_hours, amount),
        'd' | 'D' => span(TimeDelta::try_days, amount),
        'w' | 'W' => span(TimeDelta::try_weeks, amount),
        'q' | 'Q' => amount
            .checked_mul(13)
            .and_then(|weeks| span(TimeDelta::try_weeks, weeks)),
        'm' => amount.checked_neg().and_then(|m| add_months(now_local, m)),
        'y' | 'Y' => amount
            .checked_mul(-12)
            .and_then(|m| add_months(now_local, m)),
        _ => return Err(bad()),
    };
    let Some(t) = t else { return Ok(None) };
    let Some(end) = snap else { return Ok(Some(t)) };
    let start = match unit {
        'h' | 'H' => Interval::Hour.floor(t),
        'd' | 'D' => Interval::Day.floor(t),
        'w' | 'W' => Interval::Week.floor(t),
        'm' => Interval::Month.floor(t),
        'y' | 'Y' => NaiveDate::from_ymd_opt(t.year(), 1, 1)
            .map(|d| d.and_time(NaiveTime::MIN))
            .unwrap_or(t),
        _ => t,
    };
    if !end {
        return Ok(Some(start));
    }
    let next = match unit {
        'h' | 'H' => Interval::Hour.next(start),
        'd' | 'D' => Interval::Day.next(start),
        'w' | 'W' => Interval::Week.next(start),
        'm' => Interval::Month.next(start),
        'y' | 'Y' => add_months(start, 12),
        _ => Some(start),
    };
    Ok(next.and_then(just_before))
}

fn is_relative_hours(text: &str) -> bool {
    let t = text.trim();
    t.starts_with('-') && (t.ends_with('h') || t.ends_with('H') || t.ends_with('M'))
}

/// Resolves `date_from`/`date_to` for `interval`. `earliest` supplies the first event's time
/// for `date_from = "all"`.
pub fn resolve(
    date_from: Option<&str>,
    date_to: Option<&str>,
    interval: Interval,
    tz: Tz,
    now: DateTime<Utc>,
    earliest: Option<DateTime<Utc>>,
) -> Result<ResolvedRange, QueryError> {
    let now_local = now.with_timezone(&tz).naive_local();
    let from_local = match date_from.map(str::trim) {
        None | Some("") => now_local
            .date()
            .checked_sub_days(Days::new(7))
            .unwrap_or(now_local.date())
            .and_time(NaiveTime::MIN),
        Some("all") => earliest
            .map(|e| e.with_timezone(&tz).naive_local())
            .unwrap_or(now_local),
        Some(text) => {
            let t = parse_date(text, tz, now_local)?;
            if interval == Interval::Hour && is_relative_hours(text) {
                t
            } else {
                interval.floor(t)
            }
        }
    };
    let to_local = match date_to.map(str::trim) {
        None | Some("") => match interval {
            Interval::Hour => now_local,
            _ => end_of_day(now_local.date()),
        },
        Some(text) => {
            let t = parse_date(text, tz, now_local)?;
            match interval {
                Interval::Hour => Interval::Hour
                    .next(Interval::Hour.floor(t))
                    .and_then(just_before)
                    .unwrap_or(t),
                _ => end_of_day(t.date()),
            }
        }
    };
    if to_local < from_local {
        return Err(QueryError::InvalidInsight(
            "date_to is before date_from.".into(),
        ));
    }
    Ok(ResolvedRange {
        from: to_utc(tz, from_local),
        to: to_utc(tz, to_local),
        from_local,
        to_local,
    })
}

/// An instant as the RFC 3339 text generated SQL binds (microseconds, `Z`).
pub fn utc_text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// PostHog's bucket label ("1-Jan-2024", "1-Jan-2024 13:00", "Jan 2024").
pub fn label(t: NaiveDateTime, interval: Interval) -> String {
    match interval {
        Interval::Hour => t.format("%-d-%b-%Y %H:%M").to_string(),
        Interval::Day | Interval::Week => t.format("%-d-%b-%Y").to_string(),
        Interval::Month => t.format("%b %Y").to_string(),
    }
}

/// The `days` entry of a bucket.
pub fn day(t: NaiveDateTime, interval: Interval) -> String {
    match interval {
        Interval::Hour => t.format("%Y-%m-%d %H:%M:%S").to_string(),
        _ => t.format("%Y-%m-%d").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 3, 14, 15, 30, 0)
            .single()
            .expect("test setup")
    }

    #[test]
    fn default_is_seven_days_before_today_to_end_of_today() {
        let r = resolve(None, None, Interval::Day, Tz::UTC, now(), None).expect("test setup");
        assert_eq!(r.from_local.to_string(), "2024-03-07 00:00:00");
        assert_eq!(r.to_local.to_string(), "2024-03-14 23:59:59.999999");
        assert_eq!(r.buckets(Interval::Day).len(), 8);
    }

    #[test]
    fn relative_forms() {
        let r = resolve(
            Some("-1mStart"),
            Some("-1mEnd"),
            Interval::Day,
            Tz::UTC,
            now(),
            None,
        )
        .expect("test setup");
        assert_eq!(r.from_local.to_string(), "2024-02-01 00:00:00");
        assert_eq!(r.to_local.to_string(), "2024-02-29 23:59:59.999999");
        let r =
            resolve(Some("-24h"), None, Interval::Hour, Tz::UTC, now(), None).expect("test setup");
        assert_eq!(r.from_local.to_string(), "2024-03-13 15:30:00");
        assert_eq!(r.buckets(Interval::Hour).len(), 25);
        let r =
            resolve(Some("dStart"), None, Interval::Day, Tz::UTC, now(), None).expect("test setup");
        assert_eq!(r.from_local.to_string(), "2024-03-14 00:00:00");
    }

    #[test]
    fn absolute_dates_are_local_to_the_project() {
        let tz: Tz = "America/New_York".parse().expect("test setup");
        let r = resolve(
            Some("2024-03-10"),
            Some("2024-03-10"),
            Interval::Day,
            tz,
            now(),
            None,
        )
        .expect("test setup");
        // DST starts that day in New York: midnight is still UTC-5.
        assert_eq!(r.from.to_rfc3339(), "2024-03-10T05:00:00+00:00");
        assert_eq!(r.to.to_rfc3339(), "2024-03-11T03:59:59.999999+00:00");
    }

    #[test]
    fn weeks_start_on_sunday_and_months_clamp() {
        let t = NaiveDate::from_ymd_opt(2024, 3, 14)
            .expect("test setup")
            .and_time(NaiveTime::MIN);
        assert_eq!(Interval::Week.floor(t).to_string(), "2024-03-10 00:00:00");
        assert_eq!(
            add_months(
                NaiveDate::from_ymd_opt(2024, 1, 31)
                    .expect("test setup")
                    .and_time(NaiveTime::MIN),
                1
            )
            .expect("in range")
            .date()
            .to_string(),
            "2024-02-29"
        );
        assert_eq!(label(t, Interval::Day), "14-Mar-2024");
        assert_eq!(label(t, Interval::Month), "Mar 2024");
    }

    #[test]
    fn hostile_dates_are_refused_not_panicked_on() {
        for text in [
            "-200000000d",
            "-9223372036854775807d",
            "-9223372036854775807m",
            "-9223372036854775807y",
            "-9223372036854775807q",
            "-999999999999s",
            "-300000yStart",
            "-300000yEnd",
            "é",
            "-1é",
            "0001-01-01",
            "+262142-12-31T23:59:59Z",
        ] {
            for interval in [
                Interval::Hour,
                Interval::Day,
                Interval::Week,
                Interval::Month,
            ] {
                let from = resolve(Some(text), None, interval, Tz::UTC, now(), None);
                let to = resolve(None, Some(text), interval, Tz::UTC, now(), None);
                assert!(from.is_err() || text == "0001-01-01", "{text} {from:?}");
                assert!(to.is_err(), "{text} {to:?}");
            }
        }
        let far = resolve(
            Some("0001-01-01"),
            None,
            Interval::Hour,
            Tz::UTC,
            now(),
            None,
        )
        .expect("year 1 is in range");
        assert_eq!(far.buckets(Interval::Hour).len(), MAX_BUCKETS);
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(resolve(
            Some("yesterdayish"),
            None,
            Interval::Day,
            Tz::UTC,
            now(),
            None
        )
        .is_err());
        assert!(resolve(
            Some("2024-03-10"),
            Some("2024-03-01"),
            Interval::Day,
            Tz::UTC,
            now(),
            None
        )
        .is_err());
    }
}
