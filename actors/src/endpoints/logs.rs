//! Execution logs: one entry per endpoint run (success INFO, failure ERROR), written off the
//! request path. Handlers append entries to a pending list that the [`ExecutionLog`] actor
//! takes every 20 ms and passes over a channel to the `corvid-exec-log` writer thread. The writer keeps
//! one open *block* per endpoint and appends to it (one sled write and sync per batch) until it
//! holds [`BLOCK_ENTRIES`] entries; then it starts a new one. Blocks make a search over a
//! million entries a scan of a few thousand sled values rather than a million.
//!
//! Key: project (8) ‖ endpoint id (16) ‖ newest timestamp µs in the block (8, sign bit
//! flipped) ‖ block id (8), big-endian, so an endpoint's blocks are contiguous and ordered by time. Value: oldest
//! timestamp µs (8), then entries `timestamp (8) ‖ instance id (16) ‖ level (1) ‖ length (4) ‖
//! message`, oldest first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, TimeZone, Utc};
use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;
use uuid::Uuid;

use crate::kernel::StoreError;

const TREE: &str = "endpoint_logs";
/// How often buffered entries are handed to the writer.
const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Pending entries past which a recorder asks the actor to flush at once.
const FLUSH_BACKLOG: usize = 65_536;
/// Entries per block before the writer starts a new one.
pub const BLOCK_ENTRIES: usize = 512;
/// An open block not appended to for this long is closed (its memory released).
const BLOCK_IDLE: Duration = Duration::from_secs(60);

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

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.micros().to_be_bytes());
        out.extend_from_slice(self.instance_id.as_bytes());
        out.push(self.level.byte());
        out.extend_from_slice(&(self.message.len() as u32).to_be_bytes());
        out.extend_from_slice(self.message.as_bytes());
    }
}

/// One encoded entry inside a block, borrowed.
struct RawEntry<'a> {
    micros: i64,
    instance: &'a [u8],
    level: u8,
    message: &'a [u8],
}

/// The entries of a block value, oldest first (stops at the first malformed byte).
fn block_entries(value: &[u8]) -> Vec<RawEntry<'_>> {
    let mut out = Vec::new();
    let mut at = 8;
    while at + 29 <= value.len() {
        let micros = i64::from_be_bytes(value[at..at + 8].try_into().unwrap_or([0; 8]));
        let instance = &value[at + 8..at + 24];
        let level = value[at + 24];
        let len = u32::from_be_bytes(value[at + 25..at + 29].try_into().unwrap_or([0; 4])) as usize;
        let Some(message) = value.get(at + 29..at + 29 + len) else {
            break;
        };
        out.push(RawEntry {
            micros,
            instance,
            level,
            message,
        });
        at += 29 + len;
    }
    out
}

fn prefix(project_id: u64, endpoint_id: Uuid) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&project_id.to_be_bytes());
    k[8..].copy_from_slice(endpoint_id.as_bytes());
    k
}

/// A timestamp as key bytes whose order is the numeric order (sign bit flipped).
fn time_key(micros: i64) -> [u8; 8] {
    ((micros as u64) ^ (1 << 63)).to_be_bytes()
}

fn time_of_key(bytes: &[u8]) -> i64 {
    let raw = u64::from_be_bytes(bytes.try_into().unwrap_or([0; 8]));
    (raw ^ (1 << 63)) as i64
}

fn block_key(prefix: &[u8; 24], newest: i64, block_id: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&time_key(newest));
    k.extend_from_slice(&block_id.to_be_bytes());
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
        let after = q.after.map(|t| t.timestamp_micros());
        let before = q.before.map(|t| t.timestamp_micros());
        // A block whose newest entry is not after `after` holds nothing wanted.
        let start = block_key(&p, after.map_or(i64::MIN, |a| a.saturating_add(1)), 0);
        let end = block_key(&p, i64::MAX, u64::MAX);
        let search = match &q.search {
            Some(text) => Some(
                regex::bytes::RegexBuilder::new(&regex::escape(text))
                    .case_insensitive(true)
                    .build()
                    .map_err(|e| StoreError::Invalid {
                        detail: format!("Invalid search: {e}"),
                        attr: Some("search"),
                    })?,
            ),
            None => None,
        };
        let limit = q.limit.max(1);
        let mut found: Vec<LogEntry> = Vec::new();
        for item in self.tree.range(start..end).rev() {
            let (key, value) = item?;
            let newest = time_of_key(&key[24..32]);
            // Blocks come newest-first by their newest entry; once `limit` matches are held
            // and this block is entirely older than all of them, nothing later can displace one.
            if found.len() >= limit && found.iter().all(|e| e.micros() > newest) {
                break;
            }
            let oldest = value
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map_or(i64::MIN, i64::from_be_bytes);
            if before.is_some_and(|b| oldest >= b) {
                continue;
            }
            for e in block_entries(&value).iter().rev() {
                if after.is_some_and(|a| e.micros <= a) || before.is_some_and(|b| e.micros >= b) {
                    continue;
                }
                if !q.levels.is_empty() && !q.levels.contains(&Level::from_byte(e.level)) {
                    continue;
                }
                if q.instance_id.is_some_and(|id| id.as_bytes() != e.instance) {
                    continue;
                }
                if search.as_ref().is_some_and(|r| !r.is_match(e.message)) {
                    continue;
                }
                found.push(LogEntry {
                    project_id,
                    endpoint_id,
                    instance_id: Uuid::from_slice(e.instance).unwrap_or_default(),
                    timestamp: Utc.timestamp_micros(e.micros).single().unwrap_or_default(),
                    level: Level::from_byte(e.level),
                    message: String::from_utf8_lossy(e.message).into_owned(),
                });
            }
        }
        found.sort_by_key(|e| std::cmp::Reverse(e.timestamp));
        found.truncate(limit);
        Ok(found)
    }
}

/// Entries recorded since the last flush. Handlers push here (a short uncontended lock) rather
/// than into the actor's mailbox: a mailbox send wakes the actor's thread once per run, which
/// on two cores costs the request path its tail latency.
type Pending = Arc<Mutex<Vec<LogEntry>>>;

/// Owns the batching: every [`FLUSH_EVERY`] it takes what handlers recorded and hands it to
/// the writer thread.
pub struct ExecutionLog {
    pending: Pending,
    to_writer: Sender<ToWriter>,
}

/// What the writer thread receives.
enum ToWriter {
    Batch(Vec<LogEntry>),
    /// Answer once everything sent before is written and synced.
    Sync(Sender<()>),
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
        let batch = std::mem::take(&mut *lock(&self.pending));
        if batch.is_empty() {
            return;
        }
        if self.to_writer.send(ToWriter::Batch(batch)).is_err() {
            tracing::warn!("execution log writer has stopped; entries dropped");
        }
    }
}

fn lock(pending: &Pending) -> std::sync::MutexGuard<'_, Vec<LogEntry>> {
    // A panic while holding the lock can only have left a Vec of whole entries.
    pending.lock().unwrap_or_else(|p| p.into_inner())
}

/// Flushes what is pending now (tests and shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Flush;

impl Handler<Flush> for ExecutionLog {
    type Result = ();

    fn handle(&mut self, _: Flush, _: &mut Context<Self>) {
        self.flush();
    }
}

/// The running log: where handlers record, the actor's address and the writer thread.
pub struct ExecutionLogHandle {
    pub addr: Addr<ExecutionLog>,
    pending: Pending,
    to_writer: Sender<ToWriter>,
    _writer: JoinHandle<()>,
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
        let pending: Pending = Arc::default();
        let addr = ExecutionLog {
            pending: Arc::clone(&pending),
            to_writer: tx.clone(),
        }
        .start();
        Ok(ExecutionLogHandle {
            addr,
            pending,
            to_writer: tx,
            _writer: writer,
        })
    }

    /// Records one entry; it is written within [`FLUSH_EVERY`] (plus the writer's sync).
    pub fn record(&self, entry: LogEntry) {
        let mut pending = lock(&self.pending);
        pending.push(entry);
        // Far behind (the actor is not running): hand over directly rather than grow.
        if pending.len() >= FLUSH_BACKLOG {
            drop(pending);
            self.addr.do_send(Flush);
        }
    }

    /// Writes everything recorded so far and waits (up to `timeout`) until it is synced:
    /// shutdown calls this so the last runs' entries survive a restart.
    pub fn sync(&self, timeout: Duration) -> bool {
        let batch = std::mem::take(&mut *lock(&self.pending));
        if !batch.is_empty() && self.to_writer.send(ToWriter::Batch(batch)).is_err() {
            return false;
        }
        let (ack, done) = crossbeam_channel::bounded(1);
        self.to_writer.send(ToWriter::Sync(ack)).is_ok() && done.recv_timeout(timeout).is_ok()
    }
}

/// The writer's open block of one endpoint.
struct OpenBlock {
    key: Vec<u8>,
    oldest: i64,
    entries: Vec<LogEntry>,
    touched: Instant,
}

/// Appends batches to per-endpoint blocks; the writer thread's state.
struct BlockWriter {
    tree: sled::Tree,
    open: HashMap<[u8; 24], OpenBlock>,
    next_block: u64,
}

impl BlockWriter {
    fn new(tree: sled::Tree) -> BlockWriter {
        // Block ids only need to be unique per (endpoint, newest timestamp); seeding with the
        // start time keeps them unique across restarts too.
        let next_block = Utc::now().timestamp_micros().max(0) as u64;
        BlockWriter {
            tree,
            open: HashMap::new(),
            next_block,
        }
    }

    /// Writes `entries` (any endpoints) in one sled batch.
    fn write(&mut self, entries: Vec<LogEntry>) -> Result<(), sled::Error> {
        let mut by_endpoint: HashMap<[u8; 24], Vec<LogEntry>> = HashMap::new();
        for e in entries {
            by_endpoint
                .entry(prefix(e.project_id, e.endpoint_id))
                .or_default()
                .push(e);
        }
        let mut batch = sled::Batch::default();
        for (p, mut new) in by_endpoint {
            let mut block = match self.open.remove(&p) {
                Some(b) if b.entries.len() < BLOCK_ENTRIES => {
                    batch.remove(b.key.clone());
                    b
                }
                _ => OpenBlock {
                    key: Vec::new(),
                    oldest: i64::MAX,
                    entries: Vec::new(),
                    touched: Instant::now(),
                },
            };
            block.entries.append(&mut new);
            block.entries.sort_by_key(LogEntry::micros);
            block.oldest = block.entries.first().map_or(0, LogEntry::micros);
            let newest = block.entries.last().map_or(0, LogEntry::micros);
            self.next_block += 1;
            block.key = block_key(&p, newest, self.next_block);
            let mut value = block.oldest.to_be_bytes().to_vec();
            for e in &block.entries {
                e.encode_into(&mut value);
            }
            batch.insert(block.key.clone(), value);
            block.touched = Instant::now();
            if block.entries.len() < BLOCK_ENTRIES {
                self.open.insert(p, block);
            }
        }
        self.tree.apply_batch(batch)?;
        self.tree.flush()?;
        self.open.retain(|_, b| b.touched.elapsed() < BLOCK_IDLE);
        Ok(())
    }
}

fn write_loop(tree: sled::Tree, rx: Receiver<ToWriter>, retention: Duration) {
    let mut writer = BlockWriter::new(tree.clone());
    let mut last_prune = Instant::now() - Duration::from_secs(3600);
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(first) => {
                let mut entries = Vec::new();
                let mut acks = Vec::new();
                for msg in std::iter::once(first).chain(rx.try_iter()) {
                    match msg {
                        ToWriter::Batch(mut batch) => entries.append(&mut batch),
                        ToWriter::Sync(ack) => acks.push(ack),
                    }
                }
                let count = entries.len();
                if count > 0 {
                    if let Err(e) = writer.write(entries) {
                        tracing::error!(error = %e, count, "could not write execution logs");
                    }
                }
                for ack in acks {
                    let _ = ack.send(());
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

/// Deletes blocks whose newest entry is older than `retention`.
pub fn prune(tree: &sled::Tree, retention: Duration) {
    let cutoff =
        Utc::now() - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::days(30));
    let cutoff = cutoff.timestamp_micros();
    let mut batch = sled::Batch::default();
    let mut removed = 0usize;
    for item in tree.iter().keys() {
        let Ok(k) = item else { continue };
        if k.len() == 40 {
            let newest = time_of_key(&k[24..32]);
            if newest < cutoff {
                batch.remove(k);
                removed += 1;
            }
        }
    }
    if removed > 0 {
        if let Err(e) = tree.apply_batch(batch) {
            tracing::warn!(error = %e, "could not prune execution logs");
        } else {
            tracing::info!(removed, "pruned execution-log blocks past retention");
        }
    }
}

/// Writes entries synchronously in the writer's format (tests, benches, imports): blocks of
/// [`BLOCK_ENTRIES`] as the writer makes them under steady load.
pub fn write_now(db: &sled::Db, entries: &[LogEntry]) -> Result<(), StoreError> {
    let mut writer = BlockWriter::new(db.open_tree(TREE)?);
    for chunk in entries.chunks(BLOCK_ENTRIES) {
        writer.write(chunk.to_vec())?;
    }
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
    fn the_writer_appends_to_an_open_block_until_it_is_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let ep = Uuid::new_v4();
        let tree = db.open_tree(TREE).expect("tree");
        let mut writer = BlockWriter::new(tree.clone());
        for i in 0..(BLOCK_ENTRIES as i64 + 3) {
            writer
                .write(vec![entry(ep, i, Level::Info, &format!("run {i}"))])
                .expect("write");
        }
        assert_eq!(tree.len(), 2, "one full block and one open block");
        let reader = LogReader::open(&db).expect("reader");
        let all = reader
            .search(
                1,
                ep,
                &LogQuery {
                    limit: 10_000,
                    ..LogQuery::default()
                },
            )
            .expect("search");
        assert_eq!(all.len(), BLOCK_ENTRIES + 3);
        assert_eq!(
            all[0].message,
            format!("run {}", BLOCK_ENTRIES + 2),
            "newest first"
        );
        let page = reader
            .search(
                1,
                ep,
                &LogQuery {
                    limit: 5,
                    ..LogQuery::default()
                },
            )
            .expect("search");
        assert_eq!(page.len(), 5);
        assert_eq!(page[4].message, format!("run {}", BLOCK_ENTRIES - 2));
    }

    #[test]
    fn pruning_drops_entries_past_retention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let ep = Uuid::new_v4();
        let mut fresh = entry(ep, 0, Level::Info, "fresh");
        fresh.timestamp = Utc::now();
        // Separate writes: pruning drops whole blocks whose newest entry is past retention.
        write_now(&db, &[entry(ep, 0, Level::Info, "old")]).expect("write");
        write_now(&db, &[fresh]).expect("write");
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
