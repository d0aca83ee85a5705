//! The ingest shard actor: person processing, the in-memory tail, and Parquet flushes.
//!
//! Runs on its own thread (`SyncArbiter`), because everything it does blocks: sled reads and
//! writes for persons, Parquet encoding, fsyncs. It is the only writer of its tail.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Handler, SyncContext};
use chrono::NaiveDate;
use serde_json::Value;
use uuid::Uuid;

use super::messages::{FlushNow, FlushTick, GetStats, ProcessBatch};
use super::pipeline::IngestError;
use super::read::Tail;
use super::segment::{day_dir, write_segment, StoredEvent};
use super::wal::sync_dir;
use crate::persons::{process_event, Outcome, PersonStore, UsageKind};

/// Which shard owns a (project, distinct id): stable across builds and restarts.
pub fn shard_of(project_id: u64, distinct_id: &str, shards: usize) -> usize {
    let mut h = crc32fast::Hasher::new();
    h.update(&project_id.to_le_bytes());
    h.update(distinct_id.as_bytes());
    (h.finalize() as usize) % shards.max(1)
}

#[derive(Debug, Clone)]
pub struct ShardConfig {
    pub shard: usize,
    pub shards: usize,
    pub events_root: PathBuf,
    pub flush_max_rows: usize,
    pub flush_max_bytes: usize,
    pub flush_interval: Duration,
    pub dedup_window: usize,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, actix::MessageResponse)]
pub struct ShardStats {
    pub shard: usize,
    pub buffered_rows: usize,
    pub buffered_bytes: usize,
    pub processed_seq: u64,
    pub checkpoint: u64,
    pub segments_written: u64,
    pub events_stored: u64,
    pub events_dropped: u64,
    pub duplicates_skipped: u64,
    pub flush_failures: u64,
}

pub struct IngestShard {
    cfg: ShardConfig,
    persons: Arc<PersonStore>,
    tail: Arc<Tail>,
    pending: Arc<AtomicUsize>,
    checkpoint: Arc<AtomicU64>,
    first_seq_in_buffer: Option<u64>,
    oldest: Option<Instant>,
    recent: HashSet<Uuid>,
    recent_order: VecDeque<Uuid>,
    stats: ShardStats,
}

impl IngestShard {
    pub fn new(
        cfg: ShardConfig,
        persons: Arc<PersonStore>,
        tail: Arc<Tail>,
        pending: Arc<AtomicUsize>,
        checkpoint: Arc<AtomicU64>,
    ) -> IngestShard {
        let start = checkpoint.load(Ordering::SeqCst);
        IngestShard {
            stats: ShardStats {
                shard: cfg.shard,
                processed_seq: start,
                checkpoint: start,
                ..ShardStats::default()
            },
            cfg,
            persons,
            tail,
            pending,
            checkpoint,
            first_seq_in_buffer: None,
            oldest: None,
            recent: HashSet::new(),
            recent_order: VecDeque::new(),
        }
    }

    fn remember(&mut self, uuid: Uuid) -> bool {
        if !self.recent.insert(uuid) {
            return false;
        }
        self.recent_order.push_back(uuid);
        if self.recent_order.len() > self.cfg.dedup_window {
            if let Some(old) = self.recent_order.pop_front() {
                self.recent.remove(&old);
            }
        }
        true
    }

    fn process(&mut self, msg: &ProcessBatch) {
        let batch = &msg.batch;
        let mut rows = Vec::new();
        let mut released = 0usize;
        for event in &batch.events {
            if shard_of(batch.project_id, &event.distinct_id, self.cfg.shards) != self.cfg.shard {
                continue;
            }
            let known = msg.skip.as_ref().is_some_and(|s| s.contains(&event.uuid));
            if known || !self.remember(event.uuid) {
                self.stats.duplicates_skipped += 1;
                released += 1;
                continue;
            }
            let mut event = event.clone();
            let outcome = process_event(&self.persons, batch.project_id, &mut event)
                .unwrap_or_else(|err| {
                    tracing::error!(error = %err, project_id = batch.project_id, "person processing failed; storing the event without a person update");
                    Outcome::Keep {
                        person_id: crate::persons::process::person_uuid(batch.project_id, &event.distinct_id),
                        person_properties: Default::default(),
                        groups: Default::default(),
                    }
                });
            let Outcome::Keep {
                person_id,
                person_properties,
                groups,
            } = outcome
            else {
                self.stats.events_dropped += 1;
                released += 1;
                continue;
            };
            let text = |key: &str| match event.properties.get(key) {
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            };
            rows.push(StoredEvent {
                uuid: event.uuid,
                session_id: text("$session_id"),
                window_id: text("$window_id"),
                properties: Value::Object(std::mem::take(&mut event.properties)).to_string(),
                person_properties: Value::Object(person_properties).to_string(),
                event: event.event,
                distinct_id: event.distinct_id,
                person_id,
                timestamp: event.timestamp,
                created_at: event.created_at,
                project_id: batch.project_id,
                groups,
            });
        }
        if released > 0 {
            self.pending.fetch_sub(released, Ordering::SeqCst);
        }
        self.stats.processed_seq = self.stats.processed_seq.max(msg.seq);
        if rows.is_empty() {
            return;
        }
        let kind = if batch.historical {
            UsageKind::HistoricalEvents
        } else {
            UsageKind::BillableEvents
        };
        if let Err(err) = self.persons.add_usage(
            batch.project_id,
            rows[0].created_at,
            kind,
            rows.len() as u64,
        ) {
            tracing::warn!(error = %err, "could not count usage");
        }
        self.stats.events_stored += rows.len() as u64;
        self.stats.buffered_bytes += rows.iter().map(StoredEvent::approx_bytes).sum::<usize>();
        self.first_seq_in_buffer.get_or_insert(msg.seq);
        self.oldest.get_or_insert_with(Instant::now);
        self.tail.write().extend(rows);
    }

    fn should_flush(&self) -> bool {
        let rows = self.tail.read().len();
        rows >= self.cfg.flush_max_rows || self.stats.buffered_bytes >= self.cfg.flush_max_bytes
    }

    fn checkpoint_path(&self) -> PathBuf {
        checkpoint_path(&self.cfg.events_root, self.cfg.shard)
    }

    /// Writes every buffered row to segments and advances the checkpoint, atomically: segment
    /// files are written as `.tmp`, the checkpoint is made durable, then the files are renamed
    /// (recovery finishes or undoes an interrupted flush by comparing names with checkpoints).
    fn flush(&mut self) -> Result<(), IngestError> {
        let last = self.stats.processed_seq;
        let rows: Vec<StoredEvent> = self.tail.read().clone();
        if rows.is_empty() {
            if last > self.checkpoint.load(Ordering::SeqCst) {
                self.persons.flush()?;
                write_checkpoint(&self.checkpoint_path(), last)?;
                self.checkpoint.store(last, Ordering::SeqCst);
                self.stats.checkpoint = last;
            }
            return Ok(());
        }
        let first = self.first_seq_in_buffer.unwrap_or(last);
        let mut partitions: BTreeMap<(u64, NaiveDate), Vec<StoredEvent>> = BTreeMap::new();
        for row in rows {
            partitions
                .entry((row.project_id, row.day()))
                .or_default()
                .push(row);
        }
        let mut written: Vec<(PathBuf, PathBuf)> = Vec::new();
        let result = (|| -> Result<(), IngestError> {
            for ((project, day), mut events) in partitions {
                let dir = day_dir(&self.cfg.events_root, project, day);
                let name = format!("s{}-{first:020}-{last:020}.parquet", self.cfg.shard);
                let final_path = dir.join(&name);
                let tmp = dir.join(format!("{name}.tmp"));
                written.push((tmp.clone(), final_path));
                write_segment(&tmp, &mut events)?;
            }
            // Person effects of these events must be durable before the WAL may forget them.
            self.persons.flush()?;
            write_checkpoint(&self.checkpoint_path(), last)?;
            Ok(())
        })();
        if let Err(err) = result {
            for (tmp, _) in &written {
                let _ = fs::remove_file(tmp);
            }
            self.stats.flush_failures += 1;
            return Err(err);
        }
        let count = {
            let mut tail = self.tail.write();
            for (tmp, final_path) in &written {
                fs::rename(tmp, final_path)?;
            }
            let n = tail.len();
            tail.clear();
            n
        };
        for dir in written.iter().filter_map(|(_, f)| f.parent()) {
            let _ = sync_dir(dir);
        }
        self.pending.fetch_sub(count, Ordering::SeqCst);
        self.checkpoint.store(last, Ordering::SeqCst);
        self.stats.checkpoint = last;
        self.stats.segments_written += written.len() as u64;
        self.stats.buffered_bytes = 0;
        self.first_seq_in_buffer = None;
        self.oldest = None;
        Ok(())
    }

    fn stats(&self) -> ShardStats {
        ShardStats {
            buffered_rows: self.tail.read().len(),
            ..self.stats.clone()
        }
    }
}

impl Actor for IngestShard {
    type Context = SyncContext<Self>;
}

impl Handler<ProcessBatch> for IngestShard {
    type Result = ();

    fn handle(&mut self, msg: ProcessBatch, _: &mut Self::Context) {
        self.process(&msg);
        if let Some(done) = &msg.done {
            done.shard_finished();
        }
        if self.should_flush() {
            if let Err(err) = self.flush() {
                tracing::error!(error = %err, shard = self.cfg.shard, "segment flush failed; will retry");
            }
        }
    }
}

impl Handler<FlushTick> for IngestShard {
    type Result = ();

    fn handle(&mut self, _: FlushTick, _: &mut Self::Context) {
        let due = self
            .oldest
            .is_none_or(|t| t.elapsed() >= self.cfg.flush_interval);
        if due {
            if let Err(err) = self.flush() {
                tracing::error!(error = %err, shard = self.cfg.shard, "segment flush failed; will retry");
            }
        }
    }
}

impl Handler<FlushNow> for IngestShard {
    type Result = Result<ShardStats, IngestError>;

    fn handle(&mut self, _: FlushNow, _: &mut Self::Context) -> Self::Result {
        self.flush()?;
        Ok(self.stats())
    }
}

impl Handler<GetStats> for IngestShard {
    type Result = ShardStats;

    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> ShardStats {
        self.stats()
    }
}

pub fn checkpoint_dir(events_root: &Path) -> PathBuf {
    events_root.join("_checkpoints")
}

pub fn checkpoint_path(events_root: &Path, shard: usize) -> PathBuf {
    checkpoint_dir(events_root).join(format!("shard-{shard}"))
}

/// Durably replaces a checkpoint file (temp file, fsync, rename, fsync dir).
pub fn write_checkpoint(path: &Path, seq: u64) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, seq.to_string().as_bytes())?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    sync_dir(dir)
}
