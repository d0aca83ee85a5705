//! Execution logs: one entry per endpoint run (success INFO, failure ERROR), written off the
//! request path. Handlers hand entries to the [`ExecutionLog`] actor, which batches them and
//! passes each batch over a channel to a writer thread that applies it to sled in one write
//! (and syncs), then prunes entries older than the retention. Reads scan one endpoint's keys
//! newest first.
//!
//! Key: project (8) ‖ endpoint id (16) ‖ timestamp µs (8) ‖ instance id (16), big-endian, so an
//! endpoint's entries are contiguous and time-ordered. Value: level byte ‖ message.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, TimeZone, Utc};
use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;
use uuid::Uuid;

use crate::meta::StoreError;

const TREE: &str = "endpoint_logs";
/// How often buffered entries are handed to the writer.
const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Entries buffered before a flush regardless of time.
const FLUSH_AT: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    Info,
    Error,
}

impl Level {
    fn byte(self) -> u8 {
        match self {
            Level::Info => b'I',
            Level::Error => b'E',
        }
    }

    fn from_byte(b: u8) -> Level {
        if b == b'E' {
            Level::Error
        } else {
            Level::Info
        }
    }

    pub fn parse(s: &str) -> Option<Level> {
        match s.trim().to_ascii_uppercase().as_str() {
            "INFO" => Some(Level::Info),
            "ERROR" => Some(Level::Error),
            _ => None,
        }
    }
}

/// One execution's log line.
#[derive(Debug, Clone, Serialize, Message)]
#[rtype(result = "()")]
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
    fn key(&self) -> [u8; 48] {
        let mut k = [0u8; 48];
        k[..24].copy_from_slice(&prefix(self.project_id, self.endpoint_id));
        k[24..32].copy_from_slice(&self.timestamp.timestamp_micros().to_be_bytes());
        k[32..].copy_from_slice(self.instance_id.as_bytes());
        k
    }

    fn value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + self.message.len());
        v.push(self.level.byte());
        v.extend_from_slice(self.message.as_bytes());
        v
    }

    fn decode(key: &[u8], value: &[u8]) -> Option<LogEntry> {
        if key.len() != 48 || value.is_empty() {
            return None;
        }
        let project_id = u64::from_be_bytes(key[..8].try_into().ok()?);
        let endpoint_id = Uuid::from_slice(&key[8..24]).ok()?;
        let micros = i64::from_be_bytes(key[24..32].try_into().ok()?);
        Some(LogEntry {
            project_id,
            endpoint_id,
            timestamp: Utc.timestamp_micros(micros).single()?,
            instance_id: Uuid::from_slice(&key[32..]).ok()?,
            level: Level::from_byte(value[0]),
            message: String::from_utf8_lossy(&value[1..]).into_owned(),
        })
    }
}

fn prefix(project_id: u64, endpoint_id: Uuid) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&project_id.to_be_bytes());
    k[8..].copy_from_slice(endpoint_id.as_bytes());
    k
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

/// Read side of the log (any thread; blocking).
#[derive(Clone)]
pub struct LogReader {
    tree: sled::Tree,
}

impl LogReader {
    pub fn open(db: &sled::Db) -> Result<LogReader, StoreError> {
        Ok(LogReader {
            tree: db.open_tree(TREE)?,
        })
    }

    /// Entries of one endpoint, newest first.
    pub fn search(
        &self,
        project_id: u64,
        endpoint_id: Uuid,
        q: &LogQuery,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let p = prefix(project_id, endpoint_id);
        let bound = |t: DateTime<Utc>, extra: u8| {
            let mut k = p.to_vec();
            k.extend_from_slice(&t.timestamp_micros().to_be_bytes());
            k.push(extra);
            k
        };
        // after: strictly later than `after` (skip all instances at that microsecond).
        let start = match q.after {
            Some(t) => {
                let mut k = p.to_vec();
                k.extend_from_slice(&(t.timestamp_micros() + 1).to_be_bytes());
                k
            }
            None => p.to_vec(),
        };
        let end = match q.before {
            Some(t) => bound(t, 0)[..32].to_vec(),
            None => {
                let mut k = p.to_vec();
                k.extend_from_slice(&[0xff; 25]);
                k
            }
        };
        let needle = q.search.as_ref().map(|s| s.to_lowercase().into_bytes());
        let mut out = Vec::new();
        for item in self.tree.range(start..end).rev() {
            let (k, v) = item?;
            if v.is_empty() {
                continue;
            }
            if !q.levels.is_empty() && !q.levels.contains(&Level::from_byte(v[0])) {
                continue;
            }
            if let Some(id) = q.instance_id {
                if k.len() != 48 || &k[32..] != id.as_bytes() {
                    continue;
                }
            }
            if let Some(n) = &needle {
                if !contains_ignore_case(&v[1..], n) {
                    continue;
                }
            }
            if let Some(entry) = LogEntry::decode(&k, &v) {
                out.push(entry);
                if out.len() >= q.limit {
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// Whether `hay` contains `needle` (already lower case), ignoring ASCII case.
fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    if needle.is_empty() {
        return true;
    }
    if needle.len() > hay.len() {
        return false;
    }
    let first = needle[0];
    hay.windows(needle.len()).any(|w| {
        w[0].to_ascii_lowercase() == first
            && w.iter()
                .zip(needle)
                .all(|(a, b)| a.to_ascii_lowercase() == *b)
    })
}

/// The actor handlers send entries to. Batches go to the writer thread.
pub struct ExecutionLog {
    buffer: Vec<LogEntry>,
    to_writer: Sender<Vec<LogEntry>>,
}

impl Actor for ExecutionLog {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(FLUSH_EVERY, |this, _| this.flush());
    }

    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        self.flush();
        Running::Stop
    }
}

impl ExecutionLog {
    fn flush(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.buffer);
        if self.to_writer.send(batch).is_err() {
            tracing::warn!("execution log writer has stopped; entries dropped");
        }
    }
}

impl Handler<LogEntry> for ExecutionLog {
    type Result = ();

    fn handle(&mut self, entry: LogEntry, _: &mut Context<Self>) {
        self.buffer.push(entry);
        if self.buffer.len() >= FLUSH_AT {
            self.flush();
        }
    }
}

/// Flushes what the actor holds (tests and shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Flush;

impl Handler<Flush> for ExecutionLog {
    type Result = ();

    fn handle(&mut self, _: Flush, _: &mut Context<Self>) {
        self.flush();
    }
}

/// The running log: the actor's address and the writer thread.
pub struct ExecutionLogHandle {
    pub addr: Addr<ExecutionLog>,
    writer: Option<JoinHandle<()>>,
}

impl ExecutionLogHandle {
    /// Starts the actor (in the current actix system) and the writer thread.
    pub fn start(db: &sled::Db, retention: Duration) -> Result<ExecutionLogHandle, StoreError> {
        let tree = db.open_tree(TREE)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let writer = std::thread::Builder::new()
            .name("corvid-exec-log".into())
            .spawn(move || write_loop(tree, rx, retention))
            .map_err(|e| StoreError::Sled(sled::Error::Io(e)))?;
        let addr = ExecutionLog {
            buffer: Vec::new(),
            to_writer: tx,
        }
        .start();
        Ok(ExecutionLogHandle {
            addr,
            writer: Some(writer),
        })
    }

    pub fn record(&self, entry: LogEntry) {
        self.addr.do_send(entry);
    }

    /// Waits for the writer to drain once the actor has stopped (its sender dropped).
    pub fn join(&mut self) {
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn write_loop(tree: sled::Tree, rx: Receiver<Vec<LogEntry>>, retention: Duration) {
    let mut last_prune = Instant::now() - Duration::from_secs(3600);
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(first) => {
                let mut batch = sled::Batch::default();
                let mut count = 0;
                for entry in std::iter::once(first).chain(rx.try_iter()).flatten() {
                    batch.insert(entry.key().to_vec(), entry.value());
                    count += 1;
                }
                if let Err(e) = tree
                    .apply_batch(batch)
                    .and_then(|_| tree.flush().map(|_| ()))
                {
                    tracing::error!(error = %e, count, "could not write execution logs");
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
        if last_prune.elapsed() >= Duration::from_secs(3600) {
            last_prune = Instant::now();
            prune(&tree, retention);
        }
    }
    let _ = tree.flush();
}

/// Deletes entries older than `retention`.
pub fn prune(tree: &sled::Tree, retention: Duration) {
    let cutoff =
        Utc::now() - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::days(30));
    let cutoff = cutoff.timestamp_micros();
    let mut batch = sled::Batch::default();
    let mut removed = 0usize;
    for item in tree.iter().keys() {
        let Ok(k) = item else { continue };
        if k.len() == 48 {
            let ts = i64::from_be_bytes(k[24..32].try_into().unwrap_or([0; 8]));
            if ts < cutoff {
                batch.remove(k);
                removed += 1;
            }
        }
    }
    if removed > 0 {
        if let Err(e) = tree.apply_batch(batch) {
            tracing::warn!(error = %e, "could not prune execution logs");
        } else {
            tracing::info!(removed, "pruned execution logs past retention");
        }
    }
}

/// Test and bench access to the writer's format: writes entries synchronously.
pub fn write_now(db: &sled::Db, entries: &[LogEntry]) -> Result<(), StoreError> {
    let tree = db.open_tree(TREE)?;
    let mut batch = sled::Batch::default();
    for e in entries {
        batch.insert(e.key().to_vec(), e.value());
    }
    tree.apply_batch(batch)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(endpoint: Uuid, secs: i64, level: Level, message: &str) -> LogEntry {
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

    #[test]
    fn search_filters_by_level_text_time_and_instance_newest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
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
        write_now(&db, &entries).expect("write");
        let reader = LogReader::open(&db).expect("reader");
        let q = |f: fn(&mut LogQuery)| {
            let mut q = LogQuery {
                limit: 50,
                ..LogQuery::default()
            };
            f(&mut q);
            reader.search(1, ep, &q).expect("search")
        };
        let all = q(|_| {});
        assert_eq!(all.len(), 3, "another endpoint's entries are not listed");
        assert!(all[0].timestamp > all[1].timestamp && all[1].timestamp > all[2].timestamp);
        assert_eq!(q(|q| q.levels = vec![Level::Error]).len(), 1);
        assert_eq!(q(|q| q.search = Some("PATH=MATERIALIZED".into())).len(), 1);
        assert_eq!(q(|q| q.limit = 1)[0].message, entries[2].message);
        let t2 = entries[1].timestamp;
        let after = reader
            .search(
                1,
                ep,
                &LogQuery {
                    limit: 50,
                    after: Some(t2),
                    ..LogQuery::default()
                },
            )
            .expect("search");
        assert_eq!(after.len(), 1, "after is exclusive");
        let before = reader
            .search(
                1,
                ep,
                &LogQuery {
                    limit: 50,
                    before: Some(t2),
                    ..LogQuery::default()
                },
            )
            .expect("search");
        assert_eq!(before.len(), 1, "before is exclusive");
        let one = reader
            .search(
                1,
                ep,
                &LogQuery {
                    limit: 50,
                    instance_id: Some(entries[1].instance_id),
                    ..LogQuery::default()
                },
            )
            .expect("search");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].level, Level::Error);
    }

    #[test]
    fn pruning_drops_entries_past_retention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let ep = Uuid::new_v4();
        let mut fresh = entry(ep, 0, Level::Info, "fresh");
        fresh.timestamp = Utc::now();
        write_now(&db, &[entry(ep, 0, Level::Info, "old"), fresh]).expect("write");
        let tree = db.open_tree(TREE).expect("tree");
        prune(&tree, Duration::from_secs(86400));
        let reader = LogReader::open(&db).expect("reader");
        let left = reader
            .search(
                1,
                ep,
                &LogQuery {
                    limit: 10,
                    ..LogQuery::default()
                },
            )
            .expect("search");
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].message, "fresh");
    }
}
