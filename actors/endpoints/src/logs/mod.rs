//! Execution logs: one entry per endpoint run (success INFO, failure ERROR), written off the
//! request path ([`writer`]) into an [`ExecutionLogRecords`] ([`SledExecutionLog`] in the
//! embedded default; every implementation passes [`contract::suite`]) and searched by endpoint,
//! level, text, time and instance.

mod aggregate;
mod block;
pub mod ops;
mod pg_store;
mod sled_store;
mod writer;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::materialize::table::parse_time_text;
use super::EndpointError;
use corvid_kernel::StoreError;

pub use pg_store::PgExecutionLog;
pub use sled_store::SledExecutionLog;
pub use writer::LogStats;
pub(crate) use writer::{ExecutionLogHandle, GetLogStats};

/// Where execution logs live. Appends are durable when they return.
pub trait ExecutionLogRecords: Send + Sync {
    /// Appends entries of any endpoints.
    fn append(&self, entries: Vec<LogEntry>) -> Result<(), StoreError>;
    /// Entries of one endpoint (every endpoint of the project with `None`) that match
    /// `query`, newest first, at most `query.limit`.
    fn search(
        &self,
        project_id: u64,
        endpoint_id: Option<Uuid>,
        query: &LogQuery,
    ) -> Result<Vec<LogEntry>, StoreError>;
    /// The ops answer over `range`: counts, percentiles and the newest lines matching
    /// `q`. By default every matching line is read whole (at most [`ops::SCAN_CAP`]); a
    /// store may count from a cheaper form of its lines.
    fn ops_search(
        &self,
        project_id: u64,
        q: &ops::OpsQuery,
        range: (DateTime<Utc>, DateTime<Utc>),
    ) -> Result<ops::OpsAnswer, StoreError> {
        let mut scan = q.base.clone();
        (scan.after, scan.before) = (Some(range.0), Some(range.1));
        scan.limit = ops::SCAN_CAP + 1;
        let matched = self
            .search(project_id, q.endpoint, &scan)?
            .into_iter()
            .filter(|e| q.keeps(e))
            .collect();
        Ok(aggregate::answer(q, range, matched))
    }
    /// Deletes every entry older than `cutoff`. How many storage units were removed or
    /// rewritten.
    fn prune(&self, cutoff: DateTime<Utc>) -> Result<usize, StoreError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    Info,
    Error,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s.trim().to_ascii_uppercase().as_str() {
            "INFO" => Some(Level::Info),
            "ERROR" => Some(Level::Error),
            _ => None,
        }
    }
}

/// One execution's log line.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    pub project_id: u64,
    #[serde(rename = "log_source_id")]
    pub endpoint_id: Uuid,
    pub instance_id: Uuid,
    pub timestamp: DateTime<Utc>,
    pub level: Level,
    pub message: String,
}

impl LogEntry {
    fn micros(&self) -> i64 {
        self.timestamp.timestamp_micros()
    }
}

/// What `GET …/logs/` asks for.
#[derive(Debug, Clone, Default)]
pub struct LogQuery {
    pub levels: Vec<Level>,
    /// Case-insensitive substring of the message.
    pub search: Option<String>,
    pub limit: usize,
    /// Exclusive bounds.
    pub after: Option<DateTime<Utc>>,
    pub before: Option<DateTime<Utc>>,
    pub instance_id: Option<Uuid>,
}

impl LogQuery {
    /// The query a `GET …/logs/` URL asks for: `level` (comma-separated INFO/ERROR),
    /// `search`, `limit` (1–500, default 50), `after`/`before` (exclusive) and `instance_id`.
    pub fn from_params(pairs: &[(String, String)]) -> Result<LogQuery, EndpointError> {
        let mut q = LogQuery {
            limit: 50,
            ..LogQuery::default()
        };
        let time = |name: &str, v: &str| {
            parse_time_text(v).map(|t| t.and_utc()).ok_or_else(|| {
                EndpointError::invalid(name, format!("Invalid datetime for {name}: {v}"))
            })
        };
        for (k, v) in pairs {
            match k.as_str() {
                "level" => {
                    for part in v.split(',').filter(|p| !p.trim().is_empty()) {
                        let level = Level::parse(part).ok_or_else(|| {
                            EndpointError::invalid(
                                "level",
                                format!("Unknown level '{part}': use INFO or ERROR."),
                            )
                        })?;
                        q.levels.push(level);
                    }
                }
                "search" => q.search = Some(v.clone()).filter(|s| !s.is_empty()),
                "limit" => {
                    q.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=500).contains(n))
                        .ok_or_else(|| {
                            EndpointError::invalid("limit", "limit must be between 1 and 500.")
                        })?
                }
                "after" => q.after = Some(time("after", v)?),
                "before" => q.before = Some(time("before", v)?),
                "instance_id" => {
                    q.instance_id = Some(Uuid::parse_str(v).map_err(|_| {
                        EndpointError::invalid("instance_id", "instance_id must be a UUID.")
                    })?)
                }
                _ => {}
            }
        }
        Ok(q)
    }
}

/// The behaviour every [`ExecutionLogRecords`] must show, written against the trait.
#[cfg(test)]
pub(crate) mod contract {
    use chrono::TimeZone;

    use super::*;

    pub fn entry(endpoint: Uuid, secs: i64, level: Level, message: &str) -> LogEntry {
        LogEntry {
            project_id: 1,
            endpoint_id: endpoint,
            instance_id: Uuid::new_v4(),
            timestamp: Utc
                .timestamp_opt(1_700_000_000 + secs, 0)
                .single()
                .expect("time"),
            level,
            message: message.into(),
        }
    }

    /// The ops search a URL's parameters ask for.
    pub fn ops_query(pairs: &[(&str, &str)]) -> ops::OpsQuery {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ops::OpsQuery::from_params(&pairs).expect("valid")
    }

    fn query(f: impl FnOnce(&mut LogQuery)) -> LogQuery {
        let mut q = LogQuery {
            limit: 50,
            ..LogQuery::default()
        };
        f(&mut q);
        q
    }

    /// Runs every check; `open` gives an empty store each time.
    pub fn suite(open: &dyn Fn() -> Box<dyn ExecutionLogRecords>) {
        search_filters_by_level_text_time_and_instance_newest_first(open().as_ref());
        many_entries_page_newest_first(open().as_ref());
        pruning_drops_entries_past_the_cutoff(open().as_ref());
        ops_search_counts_what_search_reads(open().as_ref());
    }

    /// Lines of two endpoints with every level, statuses and durations, `n` of them.
    pub fn varied(n: i64, a: Uuid, b: Uuid) -> Vec<LogEntry> {
        (0..n)
            .map(|i| {
                let (level, text) = match i % 7 {
                    0 => (
                        Level::Error,
                        format!(
                            "failed · error=Timeout status=504 duration_ms={}",
                            900 + i % 5000
                        ),
                    ),
                    1 => (Level::Error, "failed · error=Parse".to_string()),
                    2 => (
                        Level::Info,
                        format!(
                            "Endpoint executed · path=inline status=200 duration_ms={}",
                            i % 97
                        ),
                    ),
                    _ => (
                        Level::Info,
                        format!(
                            "Endpoint executed · path=materialized cache=hit duration_ms={}",
                            i % 13
                        ),
                    ),
                };
                let mut e = entry(if i % 3 == 0 { b } else { a }, i / 4, level, &text);
                // Distinct times, so "the newest lines" is one list.
                e.timestamp += chrono::Duration::microseconds(i);
                e
            })
            .collect()
    }

    /// The parts of two answers a caller sees.
    pub fn same_answer(got: &ops::OpsAnswer, want: &ops::OpsAnswer) {
        assert_eq!(got.total, want.total);
        assert_eq!(got.buckets, want.buckets);
        assert_eq!(got.endpoints, want.endpoints);
        let lines = |a: &ops::OpsAnswer| -> Vec<(DateTime<Utc>, String)> {
            a.entries
                .iter()
                .map(|e| (e.timestamp, e.message.clone()))
                .collect()
        };
        assert_eq!(lines(got), lines(want));
    }

    /// What `ops_search` answers is what its definition over `search` answers.
    pub fn ops_search_matches_search(store: &dyn ExecutionLogRecords, endpoint: Uuid) {
        let range = (
            Utc.timestamp_opt(1_700_000_000, 0).single().expect("time"),
            Utc.timestamp_opt(1_700_000_000 + 100_000, 0)
                .single()
                .expect("time"),
        );
        let params: &[&[(&str, &str)]] = &[
            &[],
            &[("level", "ERROR")],
            &[("status", "5xx")],
            &[("min_duration_ms", "10"), ("max_duration_ms", "950")],
            &[("search", "PATH=INLINE"), ("limit", "3")],
            &[("search", "error=timeout"), ("bucket", "1m")],
            &[("endpoint", "")],
        ];
        for pairs in params {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let mut q = ops::OpsQuery::from_params(&pairs).expect("query");
            if pairs.iter().any(|(k, _)| k == "endpoint") {
                q.endpoint = Some(endpoint);
            }
            let mut scan = q.base.clone();
            (scan.after, scan.before) = (Some(range.0), Some(range.1));
            scan.limit = ops::SCAN_CAP + 1;
            let read: Vec<LogEntry> = store
                .search(1, q.endpoint, &scan)
                .expect("search")
                .into_iter()
                .filter(|e| q.keeps(e))
                .collect();
            let want = aggregate::answer(&q, range, read);
            let got = store.ops_search(1, &q, range).expect("ops search");
            same_answer(&got, &want);
        }
    }

    fn ops_search_counts_what_search_reads(store: &dyn ExecutionLogRecords) {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let lines = varied(700, a, b);
        for chunk in lines.chunks(100) {
            store.append(chunk.to_vec()).expect("append");
        }
        ops_search_matches_search(store, a);
    }

    fn search_filters_by_level_text_time_and_instance_newest_first(
        store: &dyn ExecutionLogRecords,
    ) {
        let ep = Uuid::new_v4();
        let other = Uuid::new_v4();
        let entries = vec![
            entry(
                ep,
                1,
                Level::Info,
                "Endpoint executed · path=inline cache=miss",
            ),
            entry(
                ep,
                2,
                Level::Error,
                "Endpoint execution failed · path=inline error=Timeout",
            ),
            entry(
                ep,
                3,
                Level::Info,
                "Endpoint executed · path=materialized cache=miss",
            ),
            entry(
                other,
                4,
                Level::Info,
                "Endpoint executed · path=inline cache=hit",
            ),
        ];
        store.append(entries.clone()).expect("append");
        let search = |q: LogQuery| store.search(1, Some(ep), &q).expect("search");
        let all = search(query(|_| {}));
        assert_eq!(all.len(), 3, "another endpoint's entries are not listed");
        assert!(all[0].timestamp > all[1].timestamp && all[1].timestamp > all[2].timestamp);
        assert_eq!(search(query(|q| q.levels = vec![Level::Error])).len(), 1);
        assert_eq!(
            search(query(|q| q.search = Some("PATH=MATERIALIZED".into()))).len(),
            1
        );
        assert_eq!(
            search(query(|q| q.limit = 1))[0].message,
            entries[2].message
        );
        let t2 = entries[1].timestamp;
        assert_eq!(
            search(query(|q| q.after = Some(t2))).len(),
            1,
            "after is exclusive"
        );
        assert_eq!(
            search(query(|q| q.before = Some(t2))).len(),
            1,
            "before is exclusive"
        );
        let everywhere = store.search(1, None, &query(|_| {})).expect("search");
        assert_eq!(everywhere.len(), 4, "every endpoint of the project");
        assert_eq!(
            everywhere[0].endpoint_id, other,
            "newest first across endpoints"
        );
        assert_eq!(
            store
                .search(1, None, &query(|q| q.levels = vec![Level::Error]))
                .expect("search")[0]
                .endpoint_id,
            ep
        );
        let one = search(query(|q| q.instance_id = Some(entries[1].instance_id)));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].level, Level::Error);
        assert!(
            store
                .search(2, Some(ep), &query(|_| {}))
                .expect("search")
                .is_empty(),
            "other project"
        );
    }

    fn many_entries_page_newest_first(store: &dyn ExecutionLogRecords) {
        let ep = Uuid::new_v4();
        for i in 0..1100i64 {
            store
                .append(vec![entry(ep, i, Level::Info, &format!("run {i}"))])
                .expect("append");
        }
        let all = store
            .search(1, Some(ep), &query(|q| q.limit = 10_000))
            .expect("search");
        assert_eq!(all.len(), 1100);
        assert_eq!(all[0].message, "run 1099", "newest first");
        let page = store
            .search(1, Some(ep), &query(|q| q.limit = 5))
            .expect("search");
        let messages: Vec<&str> = page.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            messages,
            vec!["run 1099", "run 1098", "run 1097", "run 1096", "run 1095"]
        );
    }

    fn pruning_drops_entries_past_the_cutoff(store: &dyn ExecutionLogRecords) {
        let ep = Uuid::new_v4();
        let mut fresh = entry(ep, 0, Level::Info, "fresh");
        fresh.timestamp = Utc::now();
        store
            .append(vec![entry(ep, 0, Level::Info, "old")])
            .expect("append");
        store.append(vec![fresh]).expect("append");
        store
            .prune(Utc::now() - chrono::Duration::days(1))
            .expect("prune");
        let left = store.search(1, Some(ep), &query(|_| {})).expect("search");
        let messages: Vec<&str> = left.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages, vec!["fresh"]);
    }
}
