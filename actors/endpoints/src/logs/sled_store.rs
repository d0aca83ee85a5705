//! The embedded execution log (sled). Entries are kept in *blocks*: one open block per
//! endpoint is appended to (one sled write and sync per batch) until it holds
//! [`BLOCK_ENTRIES`] entries; then a new one starts. Blocks make a search over a million
//! entries a scan of a few thousand sled values rather than a million.
//!
//! Key: project (8) ‖ endpoint id (16) ‖ newest timestamp µs in the block (8, sign bit
//! flipped) ‖ block id (8), big-endian, so an endpoint's blocks are contiguous and ordered by
//! time. Value: oldest timestamp µs (8), then entries `timestamp (8) ‖ instance id (16) ‖
//! level (1) ‖ length (4) ‖ message`, oldest first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use super::{ExecutionLogRecords, Level, LogEntry, LogQuery};
use corvid_kernel::StoreError;

const TREE: &str = "endpoint_logs";
/// Entries per block before the writer starts a new one.
pub const BLOCK_ENTRIES: usize = 512;
/// An open block not appended to for this long is closed (its memory released).
const BLOCK_IDLE: Duration = Duration::from_secs(60);

fn level_byte(level: Level) -> u8 {
    match level {
        Level::Info => b'I',
        Level::Error => b'E',
    }
}

fn level_of_byte(b: u8) -> Level {
    if b == b'E' {
        Level::Error
    } else {
        Level::Info
    }
}

fn encode_into(e: &LogEntry, out: &mut Vec<u8>) {
    out.extend_from_slice(&e.micros().to_be_bytes());
    out.extend_from_slice(e.instance_id.as_bytes());
    out.push(level_byte(e.level));
    out.extend_from_slice(&(e.message.len() as u32).to_be_bytes());
    out.extend_from_slice(e.message.as_bytes());
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

/// The embedded execution log: a sled tree of blocks, and the writer's open blocks.
pub struct SledExecutionLog {
    tree: sled::Tree,
    writer: Mutex<BlockWriter>,
}

impl SledExecutionLog {
    pub fn open(db: &sled::Db) -> Result<SledExecutionLog, StoreError> {
        let tree = db.open_tree(TREE)?;
        Ok(SledExecutionLog {
            writer: Mutex::new(BlockWriter::new(tree.clone())),
            tree,
        })
    }
}

impl ExecutionLogRecords for SledExecutionLog {
    /// One sled batch and one flush for the whole append, whatever its size: the writer
    /// thread hands over everything recorded in the last 20 ms at once.
    fn append(&self, entries: Vec<LogEntry>) -> Result<(), StoreError> {
        // A panic mid-write leaves at worst an open block that is rewritten whole next time.
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        writer.write(entries)?;
        Ok(())
    }

    /// Drops blocks whose newest entry is older than `cutoff`, and the old entries of blocks
    /// that straddle it (the writer's open blocks included, so they are not written back).
    fn prune(&self, cutoff: DateTime<Utc>) -> Result<usize, StoreError> {
        let cutoff = cutoff.timestamp_micros();
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut batch = sled::Batch::default();
        let mut removed = 0usize;
        for item in self.tree.iter() {
            let (k, value) = item?;
            if k.len() != 40 {
                continue;
            }
            if time_of_key(&k[24..32]) < cutoff {
                batch.remove(k);
                removed += 1;
                continue;
            }
            let entries = block_entries(&value);
            let kept: Vec<&RawEntry<'_>> = entries.iter().filter(|e| e.micros >= cutoff).collect();
            if kept.len() < entries.len() {
                let mut rewritten = kept.first().map_or(0, |e| e.micros).to_be_bytes().to_vec();
                for e in &kept {
                    rewritten.extend_from_slice(&e.micros.to_be_bytes());
                    rewritten.extend_from_slice(e.instance);
                    rewritten.push(e.level);
                    rewritten.extend_from_slice(&(e.message.len() as u32).to_be_bytes());
                    rewritten.extend_from_slice(e.message);
                }
                batch.insert(k, rewritten);
                removed += 1;
            }
        }
        writer.open.retain(|_, block| {
            block.entries.retain(|e| e.micros() >= cutoff);
            block.oldest = block.entries.first().map_or(0, LogEntry::micros);
            !block.entries.is_empty()
        });
        if removed > 0 {
            self.tree.apply_batch(batch)?;
            self.tree.flush()?;
        }
        Ok(removed)
    }

    /// Entries of one endpoint (or all of the project's), newest first.
    fn search(
        &self,
        project_id: u64,
        endpoint_id: Option<Uuid>,
        q: &LogQuery,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let after = q.after.map(|t| t.timestamp_micros());
        let before = q.before.map(|t| t.timestamp_micros());
        let (start, end) = match endpoint_id {
            Some(endpoint) => {
                let p = prefix(project_id, endpoint);
                // A block whose newest entry is not after `after` holds nothing wanted.
                let start = block_key(&p, after.map_or(i64::MIN, |a| a.saturating_add(1)), 0);
                (start, block_key(&p, i64::MAX, u64::MAX))
            }
            None => (
                project_id.to_be_bytes().to_vec(),
                project_id.saturating_add(1).to_be_bytes().to_vec(),
            ),
        };
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
            if key.len() != 40 {
                continue;
            }
            let newest = time_of_key(&key[24..32]);
            if after.is_some_and(|a| newest <= a) {
                continue;
            }
            // One endpoint's blocks come newest-first by their newest entry; once `limit`
            // matches are held and this block is entirely older than all of them, nothing
            // later can displace one. (Across endpoints the order restarts per endpoint.)
            if endpoint_id.is_some()
                && found.len() >= limit
                && found.iter().all(|e| e.micros() > newest)
            {
                break;
            }
            let endpoint_id = Uuid::from_slice(&key[8..24]).unwrap_or_default();
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
                if !q.levels.is_empty() && !q.levels.contains(&level_of_byte(e.level)) {
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
                    level: level_of_byte(e.level),
                    message: String::from_utf8_lossy(e.message).into_owned(),
                });
            }
        }
        found.sort_by_key(|e| std::cmp::Reverse(e.timestamp));
        found.truncate(limit);
        Ok(found)
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
                encode_into(e, &mut value);
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

#[cfg(test)]
mod tests {
    use super::super::contract;
    use super::*;

    #[test]
    fn sled_execution_log_passes_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let n = std::sync::atomic::AtomicUsize::new(0);
        contract::suite(&|| {
            // A fresh tree per check: a store over a new sled tree is an empty store.
            let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let tree = db.open_tree(format!("{TREE}_{i}")).expect("tree");
            Box::new(SledExecutionLog {
                writer: Mutex::new(BlockWriter::new(tree.clone())),
                tree,
            })
        });
    }

    #[test]
    fn the_writer_appends_to_an_open_block_until_it_is_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let log = SledExecutionLog::open(&db).expect("open");
        let ep = Uuid::new_v4();
        for i in 0..(BLOCK_ENTRIES as i64 + 3) {
            log.append(vec![contract::entry(
                ep,
                i,
                Level::Info,
                &format!("run {i}"),
            )])
            .expect("append");
        }
        assert_eq!(log.tree.len(), 2, "one full block and one open block");
    }
}
