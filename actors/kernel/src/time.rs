//! Timestamps as clients write them, and time arithmetic that cannot panic.
//!
//! Every value here may come from a request or a stored record, so nothing slices a string at
//! a byte offset that might fall inside a character and nothing adds a duration without
//! checking chrono's range: the lints below keep it that way.
#![deny(
    clippy::arithmetic_side_effects,
    clippy::string_slice,
    clippy::indexing_slicing
)]

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeDelta, TimeZone, Utc};

/// Parses the timestamp formats clients send: RFC 3339 (also `+HH` zones), naive ISO (UTC),
/// `YYYY-MM-DD HH:MM:SS`, date-only, RFC 2822, and numeric epoch seconds or milliseconds.
pub fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    // `+HH` zone suffix → `+HH:00`.
    let tail = text
        .len()
        .checked_sub(3)
        .filter(|at| *at > 0)
        .and_then(|at| text.get(at..));
    if let Some(tail) = tail {
        let hours = tail.strip_prefix('+').or_else(|| tail.strip_prefix('-'));
        if hours.is_some_and(|h| h.bytes().all(|b| b.is_ascii_digit())) {
            if let Ok(t) = DateTime::parse_from_rfc3339(&format!("{text}:00")) {
                return Some(t.with_timezone(&Utc));
            }
        }
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y/%m/%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Some(Utc.from_utc_datetime(&t));
        }
    }
    if let Ok(t) = DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f %z") {
        return Some(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d", "%Y/%m/%d"] {
        if let Ok(d) = NaiveDate::parse_from_str(text, format) {
            return d.and_hms_opt(0, 0, 0).map(|t| Utc.from_utc_datetime(&t));
        }
    }
    if let Ok(t) = DateTime::parse_from_rfc2822(text) {
        return Some(t.with_timezone(&Utc));
    }
    if let Some(n) = text.parse::<f64>().ok().filter(|n| n.is_finite()) {
        // Heuristic shared with PostHog: values over 10^11 are milliseconds. Float-to-integer
        // casts saturate, and an instant out of chrono's range is no timestamp.
        let ms = if n.abs() > 1e11 { n } else { n * 1000.0 };
        return Utc.timestamp_millis_opt(ms as i64).single();
    }
    None
}

/// Whether `text` is an ISO 8601 date-time (what historical imports require).
pub fn parse_iso8601(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    let bytes = text.as_bytes();
    let looks_iso = bytes.get(4) == Some(&b'-')
        && bytes.get(7) == Some(&b'-')
        && bytes.len() >= 10
        && bytes.iter().take(4).all(u8::is_ascii_digit);
    if looks_iso {
        parse_timestamp(text)
    } else {
        None
    }
}

/// `n` milliseconds, or `None` past what a duration can hold.
pub fn millis(n: i64) -> Option<TimeDelta> {
    TimeDelta::try_milliseconds(n)
}

/// `t + d`, or `None` outside chrono's range of instants.
pub fn add<T: Checked>(t: T, d: TimeDelta) -> Option<T> {
    t.checked_add(d)
}

/// `t - d`, or `None` outside chrono's range of instants.
pub fn sub<T: Checked>(t: T, d: TimeDelta) -> Option<T> {
    t.checked_sub(d)
}

/// The instants [`add`] and [`sub`] work on.
pub trait Checked: Sized {
    fn checked_add(self, d: TimeDelta) -> Option<Self>;
    fn checked_sub(self, d: TimeDelta) -> Option<Self>;
}

impl Checked for DateTime<Utc> {
    fn checked_add(self, d: TimeDelta) -> Option<Self> {
        self.checked_add_signed(d)
    }
    fn checked_sub(self, d: TimeDelta) -> Option<Self> {
        self.checked_sub_signed(d)
    }
}

impl Checked for NaiveDateTime {
    fn checked_add(self, d: TimeDelta) -> Option<Self> {
        self.checked_add_signed(d)
    }
    fn checked_sub(self, d: TimeDelta) -> Option<Self> {
        self.checked_sub_signed(d)
    }
}

impl Checked for NaiveDate {
    fn checked_add(self, d: TimeDelta) -> Option<Self> {
        self.checked_add_signed(d)
    }
    fn checked_sub(self, d: TimeDelta) -> Option<Self> {
        self.checked_sub_signed(d)
    }
}

/// A `std` duration as a chrono one, saturating at chrono's largest (settings are never that
/// long, but a typo in a config file must not panic).
pub fn from_std(d: std::time::Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// `secs` seconds (a stored or requested count), saturating at chrono's largest duration.
pub fn seconds(secs: u64) -> TimeDelta {
    i64::try_from(secs)
        .ok()
        .and_then(TimeDelta::try_seconds)
        .unwrap_or(TimeDelta::MAX)
}

/// `t + d` clamped to chrono's latest instant: for deadlines and freshness times, where "never"
/// is the right answer to an addition that overflows.
pub fn add_or_max(t: DateTime<Utc>, d: TimeDelta) -> DateTime<Utc> {
    t.checked_add_signed(d).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_ending_in_a_multibyte_character_is_no_timestamp() {
        for text in ["1é23", "é", "2024-03-01T12:00:00+é", "ab€", "+€", "€+01"] {
            assert_eq!(parse_timestamp(text), None, "{text}");
            assert_eq!(parse_iso8601(text), None, "{text}");
        }
        assert_eq!(parse_iso8601("2024é03-01"), None);
    }

    #[test]
    fn extreme_numbers_are_no_timestamp() {
        for text in ["1e300", "-1e300", "9223372036854775807", "NaN", "inf"] {
            assert_eq!(parse_timestamp(text), None, "{text}");
        }
    }

    #[test]
    fn checked_arithmetic_stops_at_the_range() {
        let latest = DateTime::<Utc>::MAX_UTC;
        assert_eq!(add(latest, TimeDelta::seconds(1)), None);
        assert_eq!(sub(DateTime::<Utc>::MIN_UTC, TimeDelta::seconds(1)), None);
        assert_eq!(millis(i64::MIN), None);
        assert_eq!(seconds(u64::MAX), TimeDelta::MAX);
        assert_eq!(add_or_max(latest, TimeDelta::days(1)), latest);
    }
}
