//! Date ranges and interval buckets of insight queries, in the project's timezone.
//!
//! PostHog's rules: `date_from` defaults to 7 days before the start of today; relative dates
//! look like `-7d`, `-1mStart`, `dStart`, `-24h`; absolute dates are read in the project
//! timezone unless they carry an offset; for non-hourly intervals `date_to` is the end of its
//! day and `date_from` snaps to the start of its interval; weeks start on Sunday.

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc,
};
use chrono_tz::Tz;
use serde::Deserialize;

use crate::query::QueryError;

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
            Interval::Hour => t.date().and_hms_opt(t.time().hour(), 0, 0).unwrap_or(t),
            Interval::Day => day.and_time(NaiveTime::MIN),
            Interval::Week => {
                let back = day.weekday().num_days_from_sunday();
                (day - Duration::days(i64::from(back))).and_time(NaiveTime::MIN)
            }
            Interval::Month => day.with_day(1).unwrap_or(day).and_time(NaiveTime::MIN),
        }
    }

    pub fn next(self, t: NaiveDateTime) -> NaiveDateTime {
        match self {
            Interval::Hour => t + Duration::hours(1),
            Interval::Day => t + Duration::days(1),
            Interval::Week => t + Duration::weeks(1),
            Interval::Month => add_months(t, 1),
        }
    }
}

use chrono::Timelike;

fn add_months(t: NaiveDateTime, months: i32) -> NaiveDateTime {
    let total = t.year() * 12 + t.month0() as i32 + months;
    let (year, month0) = (total.div_euclid(12), total.rem_euclid(12) as u32);
    let day = t.day();
    // Clamp to the month's last day (31 Jan + 1 month = 29 Feb).
    let date = (0..4)
        .find_map(|back| NaiveDate::from_ymd_opt(year, month0 + 1, day - back))
        .unwrap_or(t.date());
    date.and_time(t.time())
}

/// A resolved range: local wall-clock bounds (inclusive) and their UTC instants.
#[derive(Debug, Clone)]
pub struct ResolvedRange {
    pub from_local: NaiveDateTime,
    pub to_local: NaiveDateTime,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl ResolvedRange {
    /// Every bucket start from the (snapped) start to `to`, inclusive.
    pub fn buckets(&self, interval: Interval) -> Vec<NaiveDateTime> {
        let mut out = Vec::new();
        let mut t = interval.floor(self.from_local);
        while t <= self.to_local && out.len() < 100_000 {
            out.push(t);
            t = interval.next(t);
        }
        out
    }
}

/// Local wall-clock time → UTC instant (DST gaps move forward, folds take the earlier).
pub fn to_utc(tz: Tz, t: NaiveDateTime) -> DateTime<Utc> {
    match tz.from_local_datetime(&t) {
        LocalResult::Single(d) => d.with_timezone(&Utc),
        LocalResult::Ambiguous(a, _) => a.with_timezone(&Utc),
        LocalResult::None => to_utc(tz, t + Duration::hours(1)),
    }
}

fn end_of_day(d: NaiveDate) -> NaiveDateTime {
    d.and_hms_micro_opt(23, 59, 59, 999_999)
        .unwrap_or(d.and_time(NaiveTime::MIN))
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
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(NaiveTime::MIN));
    }
    for f in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Ok(t);
        }
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&tz).naive_local());
    }
    // Relative: -?N?unit(Start|End)?
    let (body, snap) = if let Some(b) = s.strip_suffix("Start") {
        (b, Some(false))
    } else if let Some(b) = s.strip_suffix("End") {
        (b, Some(true))
    } else {
        (s, None)
    };
    let unit = body.chars().last().ok_or_else(bad)?;
    let amount_text = body[..body.len() - unit.len_utf8()].trim_start_matches('-');
    let amount: i64 = if amount_text.is_empty() {
        0
    } else {
        amount_text.parse().map_err(|_| bad())?
    };
    let ago = |n: i64| -> Result<NaiveDateTime, QueryError> {
        Ok(match unit {
            's' => now_local - Duration::seconds(n),
            'M' => now_local - Duration::minutes(n),
            'h' | 'H' => now_local - Duration::hours(n),
            'd' | 'D' => now_local - Duration::days(n),
            'w' | 'W' => now_local - Duration::weeks(n),
            'm' => add_months(now_local, -(n as i32)),
            'q' | 'Q' => now_local - Duration::weeks(13 * n),
            'y' | 'Y' => add_months(now_local, -(12 * n as i32)),
            _ => return Err(bad()),
        })
    };
    let t = ago(amount)?;
    Ok(match snap {
        None => t,
        Some(end) => {
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
            if end {
                let next = match unit {
                    'h' | 'H' => start + Duration::hours(1),
                    'd' | 'D' => start + Duration::days(1),
                    'w' | 'W' => start + Duration::weeks(1),
                    'm' => add_months(start, 1),
                    'y' | 'Y' => add_months(start, 12),
                    _ => start,
                };
                next - Duration::microseconds(1)
            } else {
                start
            }
        }
    })
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
        None | Some("") => (now_local.date() - Duration::days(7)).and_time(NaiveTime::MIN),
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
                Interval::Hour => {
                    Interval::Hour.floor(t) + Duration::hours(1) - Duration::microseconds(1)
                }
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
            .date()
            .to_string(),
            "2024-02-29"
        );
        assert_eq!(label(t, Interval::Day), "14-Mar-2024");
        assert_eq!(label(t, Interval::Month), "Mar 2024");
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
