//! Log search for ops, the way Grafana and Loki taught it: a project's execution logs (every
//! endpoint, or one) over a time range, filtered by level, text, status and duration, with
//! the volume per time bucket, duration percentiles per bucket and per endpoint, and the
//! newest matching lines.
//!
//! Status and duration are read from each line's logfmt fields (`status=504 duration_ms=812`),
//! which every run writes; a line without a status counts as 200 when INFO and 500 when ERROR.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Level, LogEntry, LogQuery};
use crate::EndpointError;

/// Most entries one search reads; past it the answer says it is truncated.
pub const SCAN_CAP: usize = 1_000_000;
/// The time range when none is given: the last hour.
const DEFAULT_RANGE: chrono::Duration = chrono::Duration::hours(1);
/// The largest bucket accepted: a year.
const MAX_BUCKET_SECS: u64 = 366 * 86_400;

/// Which statuses a search keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    Exactly(u16),
    AtLeast(u16),
    /// `5xx`: 500–599.
    Class(u16),
}

impl StatusFilter {
    /// `504`, `>=500` or `5xx`.
    pub fn parse(text: &str) -> Option<StatusFilter> {
        let t = text.trim();
        if let Some(n) = t.strip_prefix(">=") {
            return n.trim().parse().ok().map(StatusFilter::AtLeast);
        }
        if let Some(class) = t.strip_suffix("xx").or_else(|| t.strip_suffix("XX")) {
            return class
                .parse::<u16>()
                .ok()
                .filter(|c| (1..=5).contains(c))
                .map(StatusFilter::Class);
        }
        t.parse().ok().map(StatusFilter::Exactly)
    }

    pub(crate) fn keeps(self, status: u16) -> bool {
        match self {
            StatusFilter::Exactly(s) => status == s,
            StatusFilter::AtLeast(s) => status >= s,
            StatusFilter::Class(c) => status / 100 == c,
        }
    }
}

/// What an ops search asks for.
#[derive(Debug, Clone)]
pub struct OpsQuery {
    /// Level, text, instance and the time range (defaulting to the last hour); `limit` is how
    /// many lines the answer lists.
    pub base: LogQuery,
    pub endpoint: Option<Uuid>,
    pub status: Option<StatusFilter>,
    pub min_duration_ms: Option<u64>,
    pub max_duration_ms: Option<u64>,
    /// The histogram's bucket; picked from the range when `None`.
    pub bucket: Option<Duration>,
}

impl OpsQuery {
    /// The query a search URL asks for: the log routes' parameters (`level`, `search`,
    /// `limit`, `after`, `before`, `instance_id`) and `status`, `min_duration_ms`,
    /// `max_duration_ms`, `bucket` (`1m`, `30s`…). The endpoint is named by the caller.
    pub fn from_params(pairs: &[(String, String)]) -> Result<OpsQuery, EndpointError> {
        let mut q = OpsQuery {
            base: LogQuery::from_params(pairs)?,
            endpoint: None,
            status: None,
            min_duration_ms: None,
            max_duration_ms: None,
            bucket: None,
        };
        let number = |name: &str, v: &str| {
            v.parse::<u64>().map_err(|_| {
                EndpointError::invalid(name, format!("{name} must be a whole number of ms."))
            })
        };
        for (k, v) in pairs {
            match k.as_str() {
                "status" => {
                    q.status = Some(StatusFilter::parse(v).ok_or_else(|| {
                        EndpointError::invalid("status", "status is like 504, >=500 or 5xx.")
                    })?)
                }
                "min_duration_ms" => q.min_duration_ms = Some(number(k, v)?),
                "max_duration_ms" => q.max_duration_ms = Some(number(k, v)?),
                "bucket" => {
                    let d = parse_bucket(v).ok_or_else(|| {
                        EndpointError::invalid("bucket", "bucket is a duration such as 1m.")
                    })?;
                    q.bucket = Some(d);
                }
                _ => {}
            }
        }
        Ok(q)
    }

    /// The range searched: as asked, else the hour before `now`.
    pub fn range(&self, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let before = self.base.before.unwrap_or(now);
        let after = self
            .base
            .after
            .or_else(|| before.checked_sub_signed(DEFAULT_RANGE))
            .unwrap_or(before);
        (after, before)
    }

    /// Whether a line read from the store passes the filters the store does not apply.
    pub fn keeps(&self, e: &LogEntry) -> bool {
        let f = fields(e);
        self.keeps_fields(f.status, f.duration_ms)
    }

    /// Whether a line of this status and duration passes the status and duration filters.
    #[inline]
    pub(crate) fn keeps_fields(&self, status: u16, duration_ms: Option<u64>) -> bool {
        self.status.is_none_or(|s| s.keeps(status))
            && self
                .min_duration_ms
                .is_none_or(|min| duration_ms.is_some_and(|d| d >= min))
            && self
                .max_duration_ms
                .is_none_or(|max| duration_ms.is_some_and(|d| d <= max))
    }
}

/// `30s`, `5m`, `1h` or `1d` (at least a second).
pub(crate) fn parse_bucket(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().ok().filter(|n| *n > 0 && *n <= MAX_BUCKET_SECS)?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    (secs <= MAX_BUCKET_SECS).then(|| Duration::from_secs(secs))
}

/// A line's status and duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    pub status: u16,
    pub duration_ms: Option<u64>,
}

/// The logfmt fields search reads from a line.
pub fn fields(e: &LogEntry) -> Fields {
    fields_of(e.message.as_bytes(), e.level)
}

/// The logfmt fields of a message: `status=` and `duration_ms=`, the last of each winning; a
/// line without a status counts as 200 when INFO and 500 when ERROR.
pub fn fields_of(message: &[u8], level: Level) -> Fields {
    let mut status = None;
    let mut duration_ms = None;
    for token in message.split(|b| b.is_ascii_whitespace()) {
        if let Some(v) = token.strip_prefix(b"status=") {
            status = number(v).and_then(|n| u16::try_from(n).ok());
        } else if let Some(v) = token.strip_prefix(b"duration_ms=") {
            duration_ms = number(v);
        }
    }
    Fields {
        status: status.unwrap_or(match level {
            Level::Info => 200,
            Level::Error => 500,
        }),
        duration_ms,
    }
}

/// ASCII digits as a number (none on anything else or overflow).
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        d.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

/// Duration percentiles of a set of lines (nearest rank); `None` without durations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Percentiles {
    pub p50: Option<u64>,
    pub p95: Option<u64>,
    pub p99: Option<u64>,
}

/// One bucket of the histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    pub start: DateTime<Utc>,
    pub count: u64,
    pub errors: u64,
    pub latency: Percentiles,
}

/// One endpoint's share of the matches.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointSummary {
    pub endpoint_id: Uuid,
    pub count: u64,
    pub errors: u64,
    pub latency: Percentiles,
}

/// What an ops search answers.
#[derive(Debug, Clone)]
pub struct OpsAnswer {
    pub after: DateTime<Utc>,
    pub before: DateTime<Utc>,
    pub bucket: Duration,
    /// Every bucket of the range, oldest first, empty ones included.
    pub buckets: Vec<Bucket>,
    pub endpoints: Vec<EndpointSummary>,
    /// The newest matching lines, at most the query's limit.
    pub entries: Vec<LogEntry>,
    /// Lines matching.
    pub total: u64,
    /// More than [`SCAN_CAP`] lines matched: the counts cover the newest of them.
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line `secs` after the contract's epoch.
    fn line(secs: i64, level: Level, message: &str, endpoint: Uuid) -> LogEntry {
        super::super::contract::entry(endpoint, secs, level, message)
    }

    fn query(pairs: &[(&str, &str)]) -> OpsQuery {
        super::super::contract::ops_query(pairs)
    }

    #[test]
    fn fields_come_from_logfmt_with_defaults_by_level() {
        let ep = Uuid::nil();
        let ok = line(
            0,
            Level::Info,
            "Endpoint executed · path=inline status=200 duration_ms=12",
            ep,
        );
        assert_eq!(
            fields(&ok),
            Fields {
                status: 200,
                duration_ms: Some(12)
            }
        );
        let old = line(
            0,
            Level::Error,
            "Endpoint execution failed · error=Timeout",
            ep,
        );
        assert_eq!(
            fields(&old),
            Fields {
                status: 500,
                duration_ms: None
            }
        );
        assert_eq!(
            StatusFilter::parse(">=500"),
            Some(StatusFilter::AtLeast(500))
        );
        assert_eq!(StatusFilter::parse("4xx"), Some(StatusFilter::Class(4)));
        assert_eq!(StatusFilter::parse("504"), Some(StatusFilter::Exactly(504)));
        assert_eq!(StatusFilter::parse("9xx"), None);
        let q = query(&[("status", "5xx"), ("min_duration_ms", "10")]);
        assert!(!q.keeps(&ok));
        let slow_fail = line(0, Level::Error, "failed · status=504 duration_ms=900", ep);
        assert!(q.keeps(&slow_fail));
    }
}
