//! The embedded execution log (sled). Entries are kept in *blocks* ([`super::block`]): one
//! open block per endpoint is appended to (one sled write and sync per batch) until it holds
//! [`BLOCK_ENTRIES`] entries; then a new one starts. Blocks make a search over a million
//! entries a scan of a few thousand sled values rather than a million, and their columns let
//! an ops search count lines without reading messages, on every core.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::aggregate::{Aggregate, Line, Plan};
use super::block::{
    block_key, encode_block, encode_raw_block, level_of_byte, message_bounds, prefix, range_key,
    to_entry, Block, RawEntry, NO_DURATION,
};
use super::ops::{OpsAnswer, OpsQuery};
use super::{ExecutionLogRecords, Level, LogEntry, LogQuery};
use corvid_kernel::StoreError;

const TREE: &str = "endpoint_logs";
/// Entries per block before the writer starts a new one.
pub const BLOCK_ENTRIES: usize = 512;
/// An open block not appended to for this long is closed (its memory released).
const BLOCK_IDLE: Duration = Duration::from_secs(60);
/// Most threads one ops search counts on.
const MAX_WORKERS: usize = 4;
/// Fewest blocks worth a thread of their own.
const BLOCKS_PER_WORKER: usize = 64;

/// The key range of a project's blocks (one endpoint's with `Some`), from the blocks whose
/// newest entry is after `after_us`.
fn key_range(
    project_id: u64,
    endpoint_id: Option<Uuid>,
    after_us: Option<i64>,
) -> (Vec<u8>, Vec<u8>) {
    match endpoint_id {
        Some(endpoint) => {
            let p = prefix(project_id, endpoint);
            // A block whose newest entry is not after `after` holds nothing wanted.
            let start = range_key(&p, after_us.map_or(i64::MIN, |a| a.saturating_add(1)), 0);
            let mut end = p.to_vec();
            end.extend_from_slice(&[0xFF; 17]);
            (start, end)
        }
        None => (
            project_id.to_be_bytes().to_vec(),
            project_id.saturating_add(1).to_be_bytes().to_vec(),
        ),
    }
}

/// A case-insensitive matcher of a search text.
fn text_matcher(text: Option<&str>) -> Result<Option<regex::bytes::Regex>, StoreError> {
    text.map(|t| {
        regex::bytes::RegexBuilder::new(&regex::escape(t))
            .case_insensitive(true)
            .build()
            .map_err(|e| StoreError::Invalid {
                detail: format!("Invalid search: {e}"),
                attr: Some("search"),
            })
    })
    .transpose()
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
            let Some(block) = Block::parse(&k, &value) else {
                continue;
            };
            if block.newest < cutoff {
                batch.remove(k);
                removed += 1;
                continue;
            }
            let entries = block.entries();
            let kept: Vec<&RawEntry<'_>> = entries.iter().filter(|e| e.micros >= cutoff).collect();
            if kept.len() < entries.len() {
                // Rewritten under a key with columns (a block written without them gains them).
                let p = prefix(block.project_id, block.endpoint_id);
                let block_id = u64::from_be_bytes(k[32..40].try_into().unwrap_or([0; 8]));
                batch.remove(k.clone());
                batch.insert(
                    block_key(&p, block.newest, block_id),
                    encode_raw_block(&kept),
                );
                removed += 1;
            }
        }
        writer.open.retain(|_, block| {
            block.entries.retain(|e| e.micros() >= cutoff);
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
        let (start, end) = key_range(project_id, endpoint_id, after);
        let search = text_matcher(q.search.as_deref())?;
        let limit = q.limit.max(1);
        let mut found: Vec<LogEntry> = Vec::new();
        for item in self.tree.range(start..end).rev() {
            let (key, value) = item?;
            let Some(block) = Block::parse(&key, &value) else {
                continue;
            };
            if after.is_some_and(|a| block.newest <= a) {
                continue;
            }
            // One endpoint's blocks come newest-first by their newest entry; once `limit`
            // matches are held and this block is entirely older than all of them, nothing
            // later can displace one. (Across endpoints the order restarts per endpoint.)
            if endpoint_id.is_some()
                && found.len() >= limit
                && found.iter().all(|e| e.micros() > block.newest)
            {
                break;
            }
            if before.is_some_and(|b| block.oldest >= b) {
                continue;
            }
            if search
                .as_ref()
                .is_some_and(|r| !r.is_match(block.message_region()))
            {
                continue;
            }
            for e in block.entries().iter().rev() {
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
                found.push(to_entry(project_id, block.endpoint_id, e));
            }
        }
        found.sort_by_key(|e| std::cmp::Reverse(e.timestamp));
        found.truncate(limit);
        Ok(found)
    }

    /// Counts from the blocks' columns, reading messages only to match a search text or an
    /// instance (and a block's only when the text is in it), on up to [`MAX_WORKERS`]
    /// threads over disjoint runs of blocks.
    fn ops_search(
        &self,
        project_id: u64,
        q: &OpsQuery,
        range: (DateTime<Utc>, DateTime<Utc>),
    ) -> Result<OpsAnswer, StoreError> {
        let plan = Plan::new(q, range);
        let (start, end) = key_range(project_id, q.endpoint, Some(plan.after_us));
        let mut blocks: Vec<(sled::IVec, sled::IVec)> = Vec::new();
        for item in self.tree.range(start..end).rev() {
            let (key, value) = item?;
            if Block::newest_of_key(&key).is_some_and(|newest| newest > plan.after_us) {
                blocks.push((key, value));
            }
        }
        let scan = OpsScan {
            plan: &plan,
            q,
            text: text_matcher(q.base.search.as_deref())?,
        };
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_WORKERS)
            .min(blocks.len() / BLOCKS_PER_WORKER)
            .max(1);
        let per_worker = blocks.len().div_ceil(workers).max(1);
        let parts: Vec<Part> = if workers == 1 {
            vec![scan.blocks(&blocks, 0)]
        } else {
            std::thread::scope(|s| {
                let scan = &scan;
                let handles: Vec<_> = blocks
                    .chunks(per_worker)
                    .enumerate()
                    .map(|(i, run)| s.spawn(move || scan.blocks(run, i * per_worker)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().map_err(|_| {
                            StoreError::TaskFailed("a log search thread panicked".into())
                        })
                    })
                    .collect::<Result<Vec<Part>, StoreError>>()
            })?
        };
        let mut aggregate = Aggregate::new(&plan);
        let mut newest: Vec<(i64, usize, usize)> = Vec::new();
        for part in parts {
            aggregate.merge(part.aggregate);
            newest.extend(part.newest);
        }
        newest.sort_unstable_by(|a, b| b.cmp(a));
        newest.truncate(plan.limit);
        let mut decoded: HashMap<usize, Vec<RawEntry<'_>>> = HashMap::new();
        let mut entries = Vec::with_capacity(newest.len());
        for (_, block_at, entry_at) in newest {
            let (key, value) = &blocks[block_at];
            let Some(block) = Block::parse(key, value) else {
                continue;
            };
            let raw = decoded.entry(block_at).or_insert_with(|| block.entries());
            if let Some(e) = raw.get(entry_at) {
                entries.push(to_entry(project_id, block.endpoint_id, e));
            }
        }
        Ok(aggregate.finish(&plan, entries, false))
    }
}

/// The entries (indices, oldest first) with a match of `text` in their message, from one
/// pass over the block's entry region (rather than a search per message) starting at the
/// region's first match `from`, walking the entries' headers alongside without parsing them.
/// A match that spans bytes outside one message is not counted, and the search goes on from
/// the byte after its start.
fn text_hits(text: &regex::bytes::Regex, region: &[u8], from: usize) -> Vec<usize> {
    let mut hits = Vec::new();
    let (mut index, mut header) = (0usize, 0usize);
    let mut at = from;
    while at <= region.len() {
        let Some(m) = text.find_at(region, at) else {
            break;
        };
        // The entry whose message ends after the match's start.
        let (start, end) = loop {
            let Some((start, end)) = message_bounds(region, header) else {
                return hits;
            };
            if end > m.start() {
                break (start, end);
            }
            (index, header) = (index + 1, end);
        };
        if m.start() >= start && m.end() <= end {
            hits.push(index);
            (index, header, at) = (index + 1, end, end);
        } else {
            at = m.start() + 1;
        }
    }
    hits
}

/// One thread's share of an ops search.
struct Part {
    aggregate: Aggregate,
    /// The newest matched lines seen: (µs, block index, entry index in the block).
    newest: Vec<(i64, usize, usize)>,
}

/// An ops search over blocks read from the tree.
struct OpsScan<'a> {
    plan: &'a Plan,
    q: &'a OpsQuery,
    text: Option<regex::bytes::Regex>,
}

impl OpsScan<'_> {
    /// Counts the matched lines of `blocks` (the search's blocks from index `first`), newest
    /// block first, and keeps the newest `limit` of them.
    fn blocks(&self, blocks: &[(sled::IVec, sled::IVec)], first: usize) -> Part {
        let (plan, q) = (self.plan, self.q);
        let want = |level: Level| q.base.levels.is_empty() || q.base.levels.contains(&level);
        let (want_info, want_error) = (want(Level::Info), want(Level::Error));
        let mut aggregate = Aggregate::new(plan);
        let mut newest: BinaryHeap<Reverse<(i64, usize, usize)>> =
            BinaryHeap::with_capacity(plan.limit + 1);
        let mut lines: Vec<Line> = Vec::with_capacity(BLOCK_ENTRIES);
        for (i, (key, value)) in blocks.iter().enumerate() {
            let Some(block) = Block::parse(key, value) else {
                continue;
            };
            if block.oldest >= plan.before_us {
                continue;
            }
            // The entries with the text, found before any entry is parsed: most blocks of a
            // rare text have none, and the others a few.
            let hits = match &self.text {
                Some(r) => {
                    let region = block.message_region();
                    let Some(first) = r.find(region) else {
                        continue;
                    };
                    let hits = text_hits(r, region, first.start());
                    if hits.is_empty() {
                        continue;
                    }
                    Some(hits)
                }
                None => None,
            };
            let entries = q.base.instance_id.is_some().then(|| block.entries());
            let columns = block.columns();
            let (mut all, mut found);
            let picked: &mut dyn Iterator<Item = usize> = match &hits {
                Some(hits) => {
                    found = hits.iter().rev().copied();
                    &mut found
                }
                None => {
                    all = (0..columns.count()).rev();
                    &mut all
                }
            };
            lines.clear();
            for j in picked {
                let Some(c) = columns.get(j) else {
                    continue;
                };
                if !plan.covers(c.micros) {
                    continue;
                }
                let error = c.level == b'E';
                if !(if error { want_error } else { want_info }) {
                    continue;
                }
                let duration_ms = (c.duration_ms != NO_DURATION).then_some(c.duration_ms);
                if !q.keeps_fields(c.status, duration_ms.map(u64::from)) {
                    continue;
                }
                if let (Some(id), Some(entries)) = (q.base.instance_id, &entries) {
                    if entries.get(j).is_none_or(|e| id.as_bytes() != e.instance) {
                        continue;
                    }
                }
                lines.push(Line {
                    micros: c.micros,
                    error: error || c.status >= 500,
                    duration_ms,
                });
                let seen = (c.micros, first + i, j);
                if newest.len() < plan.limit {
                    newest.push(Reverse(seen));
                } else if newest.peek().is_some_and(|Reverse(oldest)| seen > *oldest) {
                    newest.pop();
                    newest.push(Reverse(seen));
                }
            }
            aggregate.add(plan, block.endpoint_id, &lines);
        }
        Part {
            aggregate,
            newest: newest.into_iter().map(|Reverse(n)| n).collect(),
        }
    }
}

/// The writer's open block of one endpoint.
struct OpenBlock {
    key: Vec<u8>,
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
                    entries: Vec::new(),
                    touched: Instant::now(),
                },
            };
            block.entries.append(&mut new);
            block.entries.sort_by_key(LogEntry::micros);
            let newest = block.entries.last().map_or(0, LogEntry::micros);
            self.next_block += 1;
            block.key = block_key(&p, newest, self.next_block);
            batch.insert(block.key.clone(), encode_block(&block.entries));
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

    /// Which messages hold the text: several matches in one message count once, any case
    /// matches, a text split over two messages is in neither, and empty messages are
    /// stepped over.
    #[test]
    fn text_hits_are_the_messages_holding_the_text() {
        let endpoint = Uuid::new_v4();
        let messages = ["xx ab ab", "", "a", "b ab", "nothing", "AB at the end: ab"];
        let entries: Vec<LogEntry> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| contract::entry(endpoint, i as i64, Level::Info, m))
            .collect();
        let value = encode_block(&entries);
        let key = block_key(&prefix(1, endpoint), 10, 1);
        let block = Block::parse(&key, &value).expect("block");
        let region = block.message_region();
        let text = text_matcher(Some("ab")).expect("regex").expect("text");
        let first = text.find(region).expect("a match").start();
        assert_eq!(text_hits(&text, region, first), vec![0, 3, 5]);
    }

    #[test]
    fn ops_search_over_many_blocks_counts_on_several_threads_as_on_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let log = SledExecutionLog::open(&db).expect("open");
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        // Enough blocks of each endpoint for more than one thread.
        let lines = contract::varied(BLOCK_ENTRIES as i64 * 300, a, b);
        for chunk in lines.chunks(BLOCK_ENTRIES) {
            log.append(chunk.to_vec()).expect("append");
        }
        assert!(log.tree.len() >= 2 * BLOCKS_PER_WORKER);
        contract::ops_search_matches_search(&log, a);
    }

    #[test]
    fn blocks_written_without_columns_are_read_and_gain_them_when_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        let log = SledExecutionLog::open(&db).expect("open");
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let lines = contract::varied(300, a, b);
        // The earlier format: a 40-byte key, and oldest µs then the entries.
        let mut by_endpoint: HashMap<Uuid, Vec<&LogEntry>> = HashMap::new();
        for e in &lines {
            by_endpoint.entry(e.endpoint_id).or_default().push(e);
        }
        for (endpoint, entries) in by_endpoint {
            let newest = entries.last().expect("entries").micros();
            let key = range_key(&prefix(1, endpoint), newest, 7);
            let mut value = entries[0].micros().to_be_bytes().to_vec();
            for e in entries {
                value.extend_from_slice(&e.micros().to_be_bytes());
                value.extend_from_slice(e.instance_id.as_bytes());
                value.push(super::super::block::level_byte(e.level));
                value.extend_from_slice(&(e.message.len() as u32).to_be_bytes());
                value.extend_from_slice(e.message.as_bytes());
            }
            log.tree.insert(key, value).expect("insert");
        }
        contract::ops_search_matches_search(&log, a);
        let everything = LogQuery {
            limit: 10_000,
            ..LogQuery::default()
        };
        assert_eq!(log.search(1, None, &everything).expect("search").len(), 300);
        let cutoff = lines[150].timestamp;
        log.prune(cutoff).expect("prune");
        let left = log.search(1, None, &everything).expect("search");
        assert!(left.iter().all(|e| e.timestamp >= cutoff));
        assert_eq!(
            left.len(),
            lines.iter().filter(|e| e.timestamp >= cutoff).count()
        );
        assert!(
            log.tree.iter().keys().all(|k| k.expect("key").len() == 41),
            "rewritten blocks carry columns"
        );
        contract::ops_search_matches_search(&log, a);
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
