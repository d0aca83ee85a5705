//! Reading property values as the server compares them: text, numbers, versions, relative
//! and absolute dates, case-insensitive text, and the shared cache of compiled patterns. Both
//! sides of a filter's comparison are read here; which operator compares them is
//! [`super::matcher`]'s.

use chrono::{DateTime, Duration, Months, NaiveDate, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde_json::Value;

/// What relative dates and naive dates are anchored to.
#[derive(Debug, Clone, Copy)]
pub struct MatchContext {
    pub now: DateTime<Utc>,
    pub timezone: Tz,
}

/// Compiled regexes are bounded so a hostile pattern cannot exhaust memory; the `regex` crate
/// matches in linear time, so there is no catastrophic backtracking either.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiled patterns, shared by all evaluations; bounded (cleared when full) so user-supplied
/// patterns cannot grow it without limit. Invalid patterns are cached as `None`.
pub(crate) fn compiled_regex(pattern: &str) -> Option<std::sync::Arc<regex::Regex>> {
    use std::sync::{Arc, OnceLock};
    static CACHE: OnceLock<dashmap::DashMap<String, Option<Arc<regex::Regex>>>> = OnceLock::new();
    const MAX_PATTERNS: usize = 10_000;
    let cache = CACHE.get_or_init(dashmap::DashMap::new);
    if let Some(hit) = cache.get(pattern) {
        return hit.clone();
    }
    let compiled = regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .ok()
        .map(Arc::new);
    if cache.len() >= MAX_PATTERNS {
        cache.clear();
    }
    cache.insert(pattern.to_string(), compiled.clone());
    compiled
}

/// The text form the server compares: strings as they are, other values as JSON text.
pub fn to_text(value: &Value) -> std::borrow::Cow<'_, str> {
    match value {
        Value::String(s) => std::borrow::Cow::Borrowed(s),
        other => std::borrow::Cow::Owned(other.to_string()),
    }
}

/// Unicode-lowercase equality without allocating.
pub(crate) fn eq_lowercase(a: &str, b: &str) -> bool {
    if a.is_ascii() && b.is_ascii() {
        return a.eq_ignore_ascii_case(b);
    }
    a.chars()
        .flat_map(char::to_lowercase)
        .eq(b.chars().flat_map(char::to_lowercase))
}

/// `hay.to_ascii_lowercase().contains(&needle.to_ascii_lowercase())` without allocating
/// (the server lowercases ASCII only).
pub(crate) fn contains_ignore_ascii_case(hay: &str, needle: &str) -> bool {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

pub(crate) fn truthiness(value: &Value) -> bool {
    match value {
        Value::Bool(b) => *b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

pub(crate) fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Canonical semver: leading `v` stripped, missing minor/patch padded with 0, leading zeros of
/// numeric parts removed; pre-release and build suffixes kept.
pub fn semver(text: &str) -> Option<semver::Version> {
    let text = text.trim();
    let text = text.strip_prefix(['v', 'V']).unwrap_or(text);
    let (core, suffix) = match text.find(['-', '+']) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    if suffix.is_empty() {
        return plain_version(core);
    }
    let mut parts: Vec<String> = core
        .split('.')
        .map(|p| {
            let trimmed = p.trim_start_matches('0');
            if trimmed.is_empty() {
                "0".to_string()
            } else {
                trimmed.to_string()
            }
        })
        .collect();
    if parts.is_empty()
        || parts.len() > 3
        || parts.iter().any(|p| !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    while parts.len() < 3 {
        parts.push("0".into());
    }
    semver::Version::parse(&format!("{}{suffix}", parts.join("."))).ok()
}

/// [`semver`] of a version without pre-release or build suffix, read without allocating (a
/// semver filter reads both sides on every evaluation): up to three dot-separated runs of
/// digits, an empty run read as 0, each within `u64`.
fn plain_version(core: &str) -> Option<semver::Version> {
    let mut numbers = [0u64; 3];
    for (i, part) in core.split('.').enumerate() {
        // A fourth part is not a version.
        let number = numbers.get_mut(i)?;
        if !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = part.trim_start_matches('0');
        *number = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
    }
    let [major, minor, patch] = numbers;
    Some(semver::Version::new(major, minor, patch))
}

/// `1.*`, `1.2.*`, `1.*.*`, `*` → a version requirement; `1.*.3` is invalid.
pub(crate) fn wildcard(pattern: &str) -> Option<semver::VersionReq> {
    let parts: Vec<&str> = pattern.trim().split('.').collect();
    let first_star = parts
        .iter()
        .position(|p| *p == "*" || *p == "x" || *p == "X");
    if let Some(i) = first_star {
        if parts[i..].iter().any(|p| !matches!(*p, "*" | "x" | "X")) {
            return None;
        }
        let fixed = &parts[..i];
        if fixed.is_empty() {
            return semver::VersionReq::parse("*").ok();
        }
        return semver::VersionReq::parse(&format!("={}", fixed.join("."))).ok();
    }
    semver::VersionReq::parse(&format!("={}", pattern.trim())).ok()
}

/// Relative dates (`-3d`, `1m`, …): always "ago"; months and years are calendar-based with the
/// day clamped to the month's end.
#[cfg(test)]
fn relative_date(text: &str, ctx: &MatchContext) -> Option<DateTime<Utc>> {
    RelativeDate::read(text)?.at(ctx)
}

/// A relative date as written: a count and its unit (`h`, `d`, `w`, `m` or `y`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RelativeDate {
    count: u32,
    unit: char,
}

impl RelativeDate {
    pub(crate) fn read(text: &str) -> Option<RelativeDate> {
        let text = text.trim();
        let body = text.strip_prefix('-').unwrap_or(text);
        let mut chars = body.chars();
        let unit = chars.next_back()?;
        let digits = chars.as_str();
        if digits.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || !matches!(unit, 'h' | 'd' | 'w' | 'm' | 'y')
        {
            return None;
        }
        let count: u32 = digits.parse().ok()?;
        (count < 10_000).then_some(RelativeDate { count, unit })
    }

    /// The instant this long before `ctx.now`.
    pub(crate) fn at(self, ctx: &MatchContext) -> Option<DateTime<Utc>> {
        let n = self.count;
        let ago = |span: Option<Duration>| span.and_then(|d| ctx.now.checked_sub_signed(d));
        let months = match self.unit {
            'h' => return ago(Duration::try_hours(i64::from(n))),
            'd' => return ago(Duration::try_days(i64::from(n))),
            'w' => return ago(Duration::try_weeks(i64::from(n))),
            'm' => n,
            _ => n.checked_mul(12)?,
        };
        let local = ctx.now.with_timezone(&ctx.timezone);
        let shifted = local.checked_sub_months(Months::new(months))?;
        Some(shifted.with_timezone(&Utc))
    }
}

fn local_to_utc(naive: NaiveDateTime, tz: Tz) -> Option<DateTime<Utc>> {
    // A DST gap has no such local time (no match); an overlap takes the earlier instant.
    tz.from_local_datetime(&naive)
        .earliest()
        .map(|t| t.with_timezone(&Utc))
}

fn absolute_date(text: &str, ctx: &MatchContext) -> Option<DateTime<Utc>> {
    AbsoluteDate::read(text)?.at(ctx.timezone)
}

/// An absolute date as written: an instant (with an offset, or read as UTC by the capture
/// parser), or a local date-time read in the project's time zone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum AbsoluteDate {
    Instant(DateTime<Utc>),
    Local(NaiveDateTime),
}

impl AbsoluteDate {
    pub(crate) fn read(text: &str) -> Option<AbsoluteDate> {
        let text = text.trim();
        if let Some(t) = utc_timestamp(text) {
            return Some(AbsoluteDate::Instant(t));
        }
        if let Ok(t) = DateTime::parse_from_rfc3339(text) {
            return Some(AbsoluteDate::Instant(t.with_timezone(&Utc)));
        }
        // `NaiveDate`'s own parser reads exactly `%Y-%m-%d`, without compiling a format string.
        if let Ok(d) = text.parse::<NaiveDate>() {
            return Some(AbsoluteDate::Local(d.and_hms_opt(0, 0, 0)?));
        }
        for items in NAIVE_DATE_TIMES.iter() {
            let mut parsed = chrono::format::Parsed::new();
            if chrono::format::parse(&mut parsed, text, items.iter()).is_ok() {
                if let Ok(t) = parsed.to_naive_datetime_with_offset(0) {
                    return Some(AbsoluteDate::Local(t));
                }
            }
        }
        corvid_kernel::parse_timestamp(text).map(AbsoluteDate::Instant)
    }

    pub(crate) fn at(self, timezone: Tz) -> Option<DateTime<Utc>> {
        match self {
            AbsoluteDate::Instant(t) => Some(t),
            AbsoluteDate::Local(naive) if timezone == chrono_tz::UTC => Some(naive.and_utc()),
            AbsoluteDate::Local(naive) => local_to_utc(naive, timezone),
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, the form SDKs and Corvid itself write person dates in,
/// read without the general parser (a date filter reads the person's date on every request).
/// Anything else is left to [`AbsoluteDate::read`]'s other readers.
fn utc_timestamp(text: &str) -> Option<DateTime<Utc>> {
    let b = text.as_bytes();
    let (head, rest) = (b.get(..19)?, b.get(19..)?);
    let fraction = rest.strip_suffix(b"Z")?;
    if head[4] != b'-'
        || head[7] != b'-'
        || head[10] != b'T'
        || head[13] != b':'
        || head[16] != b':'
    {
        return None;
    }
    let digits = |from: usize, to: usize| decimal(head.get(from..to)?);
    let nanos = match fraction {
        [] => 0,
        [b'.', digits @ ..] if (1..=9).contains(&digits.len()) => {
            decimal(digits)? * 10u32.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    let date = NaiveDate::from_ymd_opt(digits(0, 4)? as i32, digits(5, 7)?, digits(8, 10)?)?;
    let time = chrono::NaiveTime::from_hms_nano_opt(
        digits(11, 13)?,
        digits(14, 16)?,
        digits(17, 19)?,
        nanos,
    )?;
    Some(date.and_time(time).and_utc())
}

/// ASCII digits as a number; `None` for anything else. Callers pass at most nine digits, so
/// the value fits.
fn decimal(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
    })
}

/// The local date-time layouts a filter or property date may have, compiled once (dates are
/// read on every evaluation of a date filter).
static NAIVE_DATE_TIMES: std::sync::LazyLock<Vec<Vec<chrono::format::Item<'static>>>> =
    std::sync::LazyLock::new(|| {
        [
            "%Y-%m-%d %H:%M:%S%.f",
            "%Y-%m-%dT%H:%M:%S%.f",
            "%Y-%m-%d %H:%M",
            "%Y-%m-%dT%H:%M",
        ]
        .into_iter()
        .filter_map(|format| chrono::format::StrftimeItems::new(format).parse().ok())
        .collect()
    });

/// Four digits then `-`: never a number, so no number is parsed from it.
fn looks_like_a_date(text: &str) -> bool {
    let b = text.trim().as_bytes();
    b.len() > 4 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
}

/// The property side: numbers (and numeric strings) are epoch seconds.
pub(crate) fn property_date(value: &Value, ctx: &MatchContext) -> Option<DateTime<Utc>> {
    let seconds = match value {
        Value::Number(n) => n.as_f64(),
        // A date (`YYYY-…`) is not a number: skip the attempt.
        Value::String(s) if looks_like_a_date(s) => None,
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => return None,
    };
    if let Some(s) = seconds {
        return Utc.timestamp_micros((s * 1_000_000.0) as i64).single();
    }
    absolute_date(value.as_str()?, ctx)
}

#[cfg(test)]
impl MatchContext {
    /// The instant (2020-01-01 12:01:20.134 UTC) and zone (UTC) property tests compare against.
    pub(crate) fn for_tests() -> MatchContext {
        MatchContext {
            now: "2020-01-01T12:01:20.134Z".parse().expect("now"),
            timezone: chrono_tz::UTC,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> MatchContext {
        MatchContext::for_tests()
    }

    #[test]
    fn semver_vectors() {
        assert_eq!(semver("v1.2.3"), semver::Version::parse("1.2.3").ok());
        assert_eq!(semver("3.10"), semver::Version::parse("3.10.0").ok());
        assert_eq!(semver("3.08"), semver::Version::parse("3.8.0").ok());
        assert_eq!(semver("3"), semver::Version::parse("3.0.0").ok());
        assert_eq!(semver("1..2"), semver::Version::parse("1.0.2").ok());
        assert_eq!(semver(" v007.0.10 "), semver::Version::parse("7.0.10").ok());
        assert_eq!(semver("1.2.3.4"), None);
        assert_eq!(semver("1.2.x"), None);
        assert_eq!(semver("99999999999999999999.0.0"), None, "past u64");
        assert_eq!(
            semver("1.2.3-beta.1"),
            semver::Version::parse("1.2.3-beta.1").ok()
        );
        assert_eq!(
            semver("1.2+build"),
            semver::Version::parse("1.2.0+build").ok()
        );
    }

    #[test]
    fn the_utc_reader_agrees_with_the_general_one() {
        for text in [
            "2026-07-01T00:00:00Z",
            "2026-07-01T23:59:59.5Z",
            "2026-07-01T23:59:59.123456789Z",
            "2024-02-29T12:00:00Z",
            "2023-02-29T12:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-07-01T24:00:00Z",
            "2026-07-01T23:59:60Z",
            "2026-07-01T00:00:00.Z",
            "2026-07-01T00:00:00.1234567891Z",
            "2026-07-01t00:00:00z",
            "2026-07-01 00:00:00Z",
            "2026-07-01T00:00:00+02:00",
            "+2026-07-01T00:00:00Z",
            "2026-07-0aT00:00:00Z",
        ] {
            let general = DateTime::parse_from_rfc3339(text)
                .ok()
                .map(|t| t.with_timezone(&Utc));
            if let Some(fast) = utc_timestamp(text) {
                assert_eq!(Some(fast), general, "{text}");
            }
            if general.is_some() {
                let read = AbsoluteDate::read(text).and_then(|d| d.at(chrono_tz::UTC));
                assert_eq!(read, general, "{text}");
            }
        }
        assert!(utc_timestamp("2026-07-01T00:00:00Z").is_some());
    }

    #[test]
    fn relative_date_vectors() {
        let c = ctx();
        let at = |s: &str| s.parse::<DateTime<Utc>>().expect("time");
        assert_eq!(
            relative_date("1h", &c),
            Some(at("2020-01-01T11:01:20.134Z"))
        );
        assert_eq!(relative_date("24h", &c), relative_date("1d", &c));
        assert_eq!(
            relative_date("1d", &c),
            Some(at("2019-12-31T12:01:20.134Z"))
        );
        assert_eq!(relative_date("7d", &c), relative_date("1w", &c));
        assert_eq!(
            relative_date("1w", &c),
            Some(at("2019-12-25T12:01:20.134Z"))
        );
        assert_eq!(
            relative_date("30d", &c),
            Some(at("2019-12-02T12:01:20.134Z"))
        );
        assert_eq!(
            relative_date("1m", &c),
            Some(at("2019-12-01T12:01:20.134Z"))
        );
        assert_eq!(
            relative_date("8m", &c),
            Some(at("2019-05-01T12:01:20.134Z"))
        );
        assert_eq!(relative_date("1y", &c), relative_date("12m", &c));
        assert_eq!(
            relative_date("1y", &c),
            Some(at("2019-01-01T12:01:20.134Z"))
        );
        let april = MatchContext {
            now: at("2020-04-03T00:00:00Z"),
            ..c
        };
        assert_eq!(
            relative_date("2m", &april),
            Some(at("2020-02-03T00:00:00Z"))
        );
        assert_eq!(
            relative_date("4m", &april),
            Some(at("2019-12-03T00:00:00Z"))
        );
        for ok in ["-3d", "3d", "000h", "1000h"] {
            assert!(relative_date(ok, &c).is_some(), "{ok}");
        }
        for bad in ["1", "1x", "1.2y", "1s", "bazinga", "100000d", "1000000h"] {
            assert!(relative_date(bad, &c).is_none(), "{bad}");
        }
    }

    proptest::proptest! {
        // The allocation-free search agrees with lowercasing both sides (ASCII only, as the
        // server does), for any text including non-ASCII and empty needles.
        #[test]
        fn ascii_case_insensitive_contains_agrees_with_lowercasing(
            hay in "[a-cA-C\u{e9}\u{c9} ]{0,12}",
            needle in "[a-cA-C\u{e9}\u{c9} ]{0,4}",
        ) {
            proptest::prop_assert_eq!(
                contains_ignore_ascii_case(&hay, &needle),
                hay.to_ascii_lowercase().contains(&needle.to_ascii_lowercase())
            );
        }
    }
}
