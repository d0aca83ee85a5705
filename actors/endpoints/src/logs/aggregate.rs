//! Counting matched lines into an ops answer: per time bucket and per endpoint, the number of
//! lines, of errors, and exact duration percentiles. Aggregates of disjoint parts of a search
//! merge, so a store may count on several threads.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::ops::{fields, Bucket, EndpointSummary, OpsAnswer, OpsQuery, Percentiles, SCAN_CAP};
use super::{Level, LogEntry};

/// Buckets a range is cut into when no bucket size is given (about).
const TARGET_BUCKETS: i64 = 60;
/// Most buckets one answer has.
const MAX_SLOTS: usize = 10_000;
/// Bucket sizes picked from, in seconds.
const NICE_BUCKETS: &[i64] = &[
    1,
    5,
    10,
    30,
    60,
    300,
    600,
    1800,
    3600,
    6 * 3600,
    86_400,
    7 * 86_400,
];

/// The bucket size for a range: as asked, else a round size giving about 60 buckets.
pub(crate) fn bucket_for(q: &OpsQuery, after: DateTime<Utc>, before: DateTime<Utc>) -> i64 {
    if let Some(b) = q.bucket {
        return i64::try_from(b.as_secs()).unwrap_or(i64::MAX).max(1);
    }
    let span = (before - after).num_seconds().max(1);
    let wanted = (span / TARGET_BUCKETS).max(1);
    NICE_BUCKETS
        .iter()
        .copied()
        .find(|b| *b >= wanted)
        .unwrap_or(wanted)
}

/// Aggregates `matched` (newest first, already filtered) over the range: the answer of a
/// store that reads whole lines.
pub fn answer(
    q: &OpsQuery,
    range: (DateTime<Utc>, DateTime<Utc>),
    mut matched: Vec<LogEntry>,
) -> OpsAnswer {
    let truncated = matched.len() > SCAN_CAP;
    matched.truncate(SCAN_CAP);
    let plan = Plan::new(q, range);
    let mut aggregate = Aggregate::new(&plan);
    let mut by_endpoint: HashMap<Uuid, Vec<Line>> = HashMap::new();
    for e in &matched {
        let f = fields(e);
        by_endpoint.entry(e.endpoint_id).or_default().push(Line {
            micros: e.timestamp.timestamp_micros(),
            error: e.level == Level::Error || f.status >= 500,
            duration_ms: f.duration_ms.map(|d| u32::try_from(d).unwrap_or(u32::MAX)),
        });
    }
    for (endpoint, lines) in by_endpoint {
        aggregate.add(&plan, endpoint, &lines);
    }
    matched.truncate(plan.limit);
    aggregate.finish(&plan, matched, truncated)
}

/// Where a search's lines fall: its range and buckets.
#[derive(Debug, Clone)]
pub struct Plan {
    pub after: DateTime<Utc>,
    pub before: DateTime<Utc>,
    /// Exclusive bounds, µs.
    pub after_us: i64,
    pub before_us: i64,
    /// How many lines the answer lists.
    pub limit: usize,
    bucket_secs: i64,
    first_secs: i64,
    first_us: i64,
    bucket_us: i64,
    slots: usize,
}

impl Plan {
    pub fn new(q: &OpsQuery, (after, before): (DateTime<Utc>, DateTime<Utc>)) -> Plan {
        let bucket_secs = bucket_for(q, after, before);
        let first_secs = after.timestamp().div_euclid(bucket_secs) * bucket_secs;
        let slots =
            usize::try_from(before.timestamp().saturating_sub(first_secs) / bucket_secs + 1)
                .unwrap_or(1)
                .min(MAX_SLOTS);
        Plan {
            after,
            before,
            after_us: after.timestamp_micros(),
            before_us: before.timestamp_micros(),
            limit: q.base.limit.max(1),
            bucket_secs,
            first_secs,
            first_us: first_secs.saturating_mul(1_000_000),
            bucket_us: bucket_secs.saturating_mul(1_000_000),
            slots,
        }
    }

    /// Whether a line at `micros` is inside the range.
    #[inline]
    pub fn covers(&self, micros: i64) -> bool {
        micros > self.after_us && micros < self.before_us
    }

    /// The bucket a line at `micros` falls in (it may be outside the answer's buckets), and
    /// that bucket's bounds in µs: the lines after it in time order that stay within them
    /// need no division.
    #[inline]
    fn slot(&self, micros: i64) -> (i64, i64, i64) {
        let slot = micros
            .saturating_sub(self.first_us)
            .div_euclid(self.bucket_us);
        let start = self
            .first_us
            .saturating_add(slot.saturating_mul(self.bucket_us));
        (slot, start, start.saturating_add(self.bucket_us))
    }
}

/// Durations below this many ms are counted per value once a set is large.
const DENSE_MS: usize = 4096;
/// A set holds its durations as a list up to this many.
const LIST_MAX: usize = 4096;

/// The durations of a set of lines, kept exactly: a list while small, then a count per
/// millisecond below [`DENSE_MS`] and a list of the rest (memory stays within 4 bytes a line).
#[derive(Debug, Clone)]
enum Durations {
    List(Vec<u32>),
    Dense {
        counts: Box<[u32]>,
        over: Vec<u32>,
        n: usize,
    },
}

impl Default for Durations {
    fn default() -> Durations {
        Durations::List(Vec::new())
    }
}

impl Durations {
    /// Adds many durations, choosing the form once.
    fn extend(&mut self, ds: &[u32]) {
        match self {
            Durations::List(v) if v.len() + ds.len() <= LIST_MAX => v.extend_from_slice(ds),
            Durations::Dense { counts, over, n } => {
                for d in ds {
                    match counts.get_mut(*d as usize) {
                        Some(c) => *c += 1,
                        None => over.push(*d),
                    }
                }
                *n += ds.len();
            }
            Durations::List(_) => ds.iter().for_each(|d| self.push(*d)),
        }
    }

    #[inline]
    fn push(&mut self, d: u32) {
        match self {
            Durations::List(v) => {
                v.push(d);
                if v.len() > LIST_MAX {
                    let list = std::mem::take(v);
                    *self = Durations::Dense {
                        counts: vec![0u32; DENSE_MS].into_boxed_slice(),
                        over: Vec::new(),
                        n: 0,
                    };
                    for d in list {
                        self.push(d);
                    }
                }
            }
            Durations::Dense { counts, over, n } => {
                match counts.get_mut(d as usize) {
                    Some(c) => *c += 1,
                    None => over.push(d),
                }
                *n += 1;
            }
        }
    }

    fn merge(&mut self, other: Durations) {
        match other {
            Durations::List(v) => v.into_iter().for_each(|d| self.push(d)),
            Durations::Dense {
                counts: theirs,
                over,
                n,
            } => match self {
                Durations::Dense {
                    counts,
                    over: mine,
                    n: mine_n,
                } => {
                    for (c, t) in counts.iter_mut().zip(theirs.iter()) {
                        *c += t;
                    }
                    mine.extend(over);
                    *mine_n += n;
                }
                Durations::List(_) => {
                    let small = std::mem::replace(
                        self,
                        Durations::Dense {
                            counts: theirs,
                            over,
                            n,
                        },
                    );
                    self.merge(small);
                }
            },
        }
    }

    /// Nearest-rank p50, p95 and p99.
    fn percentiles(self) -> Percentiles {
        let n = match &self {
            Durations::List(v) => v.len(),
            Durations::Dense { n, .. } => *n,
        };
        if n == 0 {
            return Percentiles::default();
        }
        let rank = |p: f64| ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        let ranks = [rank(0.50), rank(0.95), rank(0.99)];
        let values: Vec<u64> = match self {
            Durations::List(mut v) => {
                v.sort_unstable();
                ranks.iter().map(|r| u64::from(v[*r])).collect()
            }
            Durations::Dense {
                counts, mut over, ..
            } => {
                over.sort_unstable();
                let below: usize = counts.iter().map(|c| *c as usize).sum();
                ranks
                    .iter()
                    .map(|r| {
                        if *r >= below {
                            return u64::from(over[*r - below]);
                        }
                        let mut seen = 0usize;
                        for (ms, c) in counts.iter().enumerate() {
                            seen += *c as usize;
                            if seen > *r {
                                return ms as u64;
                            }
                        }
                        0
                    })
                    .collect()
            }
        };
        Percentiles {
            p50: Some(values[0]),
            p95: Some(values[1]),
            p99: Some(values[2]),
        }
    }
}

/// Lines, errors and durations of one bucket or endpoint.
#[derive(Debug, Clone, Default)]
struct Tally {
    count: u64,
    errors: u64,
    durations: Durations,
}

impl Tally {
    fn add(&mut self, count: usize, errors: u64, durations: &[u32]) {
        self.count += count as u64;
        self.errors += errors;
        self.durations.extend(durations);
    }

    fn merge(&mut self, other: Tally) {
        self.count += other.count;
        self.errors += other.errors;
        self.durations.merge(other.durations);
    }
}

/// What is counted of a matched line.
#[derive(Debug, Clone, Copy)]
pub struct Line {
    pub micros: i64,
    /// ERROR, or a status of 500 or more.
    pub error: bool,
    pub duration_ms: Option<u32>,
}

/// The errors among `lines`, and their durations (in `scratch`).
fn durations_of<'s>(lines: &[Line], scratch: &'s mut Vec<u32>) -> (u64, &'s [u32]) {
    scratch.clear();
    let mut errors = 0;
    for l in lines {
        errors += u64::from(l.error);
        if let Some(d) = l.duration_ms {
            scratch.push(d);
        }
    }
    (errors, scratch)
}

/// The counts of a search so far.
#[derive(Debug, Clone)]
pub struct Aggregate {
    buckets: Vec<Tally>,
    endpoints: HashMap<Uuid, Tally>,
    total: u64,
    /// Durations being added (kept to reuse its memory).
    scratch: Vec<u32>,
}

impl Aggregate {
    pub fn new(plan: &Plan) -> Aggregate {
        Aggregate {
            buckets: vec![Tally::default(); plan.slots],
            endpoints: HashMap::new(),
            total: 0,
            scratch: Vec::new(),
        }
    }

    /// Counts matched lines of one endpoint. Lines in time order (either way) are counted
    /// fastest: a run of lines in one bucket is added at once.
    pub fn add(&mut self, plan: &Plan, endpoint: Uuid, lines: &[Line]) {
        if lines.is_empty() {
            return;
        }
        let (errors, scratch) = durations_of(lines, &mut self.scratch);
        self.endpoints
            .entry(endpoint)
            .or_default()
            .add(lines.len(), errors, scratch);
        let mut at = 0;
        while at < lines.len() {
            let (slot, start, end) = plan.slot(lines[at].micros);
            let run = lines[at..]
                .iter()
                .take_while(|l| l.micros >= start && l.micros < end)
                .count()
                .max(1);
            let tally = usize::try_from(slot)
                .ok()
                .and_then(|s| self.buckets.get_mut(s));
            if let Some(t) = tally {
                let (errors, scratch) = durations_of(&lines[at..at + run], &mut self.scratch);
                t.add(run, errors, scratch);
            }
            at += run;
        }
        self.total += lines.len() as u64;
    }

    /// Adds another part's counts.
    pub fn merge(&mut self, other: Aggregate) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            mine.merge(theirs);
        }
        for (endpoint, t) in other.endpoints {
            self.endpoints.entry(endpoint).or_default().merge(t);
        }
        self.total += other.total;
    }

    /// The answer, with `entries` (the newest matched lines, newest first) listed.
    pub fn finish(self, plan: &Plan, entries: Vec<LogEntry>, truncated: bool) -> OpsAnswer {
        let mut endpoints: Vec<EndpointSummary> = self
            .endpoints
            .into_iter()
            .map(|(endpoint_id, t)| EndpointSummary {
                endpoint_id,
                count: t.count,
                errors: t.errors,
                latency: t.durations.percentiles(),
            })
            .collect();
        endpoints.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.endpoint_id.cmp(&b.endpoint_id))
        });
        OpsAnswer {
            after: plan.after,
            before: plan.before,
            bucket: Duration::from_secs(u64::try_from(plan.bucket_secs).unwrap_or(1)),
            buckets: self
                .buckets
                .into_iter()
                .enumerate()
                .map(|(i, t)| Bucket {
                    start: DateTime::from_timestamp(
                        plan.first_secs
                            .saturating_add(plan.bucket_secs.saturating_mul(i as i64)),
                        0,
                    )
                    .unwrap_or(plan.after),
                    count: t.count,
                    errors: t.errors,
                    latency: t.durations.percentiles(),
                })
                .collect(),
            endpoints,
            entries,
            total: self.total,
            truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::super::Level;
    use super::*;

    /// A line `secs` after the contract's epoch.
    fn line(secs: i64, level: Level, message: &str, endpoint: Uuid) -> LogEntry {
        super::super::contract::entry(endpoint, secs, level, message)
    }

    fn query(pairs: &[(&str, &str)]) -> OpsQuery {
        super::super::contract::ops_query(pairs)
    }

    #[test]
    fn buckets_percentiles_and_endpoints_add_up() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut lines = Vec::new();
        for i in 0..100 {
            lines.push(line(
                i,
                Level::Info,
                &format!("status=200 duration_ms={}", i + 1),
                a,
            ));
        }
        lines.push(line(70, Level::Error, "status=504 duration_ms=5000", b));
        lines.reverse();
        let q = query(&[("bucket", "1m"), ("limit", "5")]);
        let start = Utc.timestamp_opt(1_700_000_000, 0).single().expect("time");
        let end = start + chrono::Duration::seconds(119);
        let got = answer(&q, (start, end), lines);
        assert_eq!(got.total, 101);
        assert_eq!(got.entries.len(), 5, "limited lines, whole counts");
        assert_eq!(got.bucket, Duration::from_secs(60));
        let counts: u64 = got.buckets.iter().map(|b| b.count).sum();
        assert_eq!(counts, 101);
        assert_eq!(got.buckets.iter().map(|b| b.errors).sum::<u64>(), 1);
        assert_eq!(got.endpoints[0].endpoint_id, a);
        assert_eq!(got.endpoints[0].latency.p50, Some(50));
        assert_eq!(got.endpoints[0].latency.p99, Some(99));
        assert_eq!(got.endpoints[1].errors, 1);
    }

    #[test]
    fn the_bucket_is_a_round_size_for_the_range() {
        let q = query(&[]);
        let end = Utc::now();
        assert_eq!(bucket_for(&q, end - chrono::Duration::hours(1), end), 60);
        assert_eq!(bucket_for(&q, end - chrono::Duration::days(1), end), 1800);
        assert_eq!(bucket_for(&q, end - chrono::Duration::seconds(30), end), 1);
        assert_eq!(
            super::super::ops::parse_bucket("1d"),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(
            super::super::ops::parse_bucket("99999999999d"),
            None,
            "past a year is refused"
        );
    }

    fn exact(mut v: Vec<u32>) -> Percentiles {
        v.sort_unstable();
        let n = v.len();
        let rank = |p: f64| {
            Some(u64::from(
                v[((p * n as f64).ceil() as usize).clamp(1, n) - 1],
            ))
        };
        Percentiles {
            p50: rank(0.5),
            p95: rank(0.95),
            p99: rank(0.99),
        }
    }

    #[test]
    fn percentiles_stay_exact_past_the_list_and_across_merges() {
        // Values on both sides of the dense range, enough to leave the list form.
        let values: Vec<u32> = (0..20_000u32).map(|i| (i * 7919) % 9000).collect();
        let mut one = Durations::default();
        values.iter().for_each(|d| one.push(*d));
        assert_eq!(one.percentiles(), exact(values.clone()));
        let (a, b) = values.split_at(100);
        let (mut small, mut big) = (Durations::default(), Durations::default());
        a.iter().for_each(|d| small.push(*d));
        b.iter().for_each(|d| big.push(*d));
        small.merge(big);
        assert_eq!(small.percentiles(), exact(values));
    }
}
