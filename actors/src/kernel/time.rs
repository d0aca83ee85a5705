//! Timestamps as clients write them.

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone, Utc};

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
    let bytes = text.as_bytes();
    if bytes.len() > 3 {
        let tail = &text[text.len() - 3..];
        if (tail.starts_with('+') || tail.starts_with('-'))
            && tail[1..].bytes().all(|b| b.is_ascii_digit())
        {
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
    if let Ok(n) = text.parse::<f64>() {
        // Heuristic shared with PostHog: values over 10^11 are milliseconds.
        let ms = if n.abs() > 1e11 { n } else { n * 1000.0 };
        return Utc.timestamp_millis_opt(ms as i64).single();
    }
    None
}

/// Whether `text` is an ISO 8601 date-time (what historical imports require).
pub fn parse_iso8601(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    let looks_iso = text.len() >= 10
        && text.as_bytes()[4] == b'-'
        && text.as_bytes()[7] == b'-'
        && text[..4].bytes().all(|b| b.is_ascii_digit());
    if looks_iso {
        parse_timestamp(text)
    } else {
        None
    }
}
