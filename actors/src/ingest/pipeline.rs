//! The ingest pipeline's front: admission control, the WAL writer thread (group commit), start-up
//! recovery and WAL replay, and the shard actors' wiring.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::{Addr, SyncArbiter};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::columns::PropertyColumns;
use super::error::IngestError;
use super::messages::{
    BatchDone, FlushNow, FlushTick, GetStats, ProcessBatch, RecordPart, ShardStats,
};
use super::read::{query_events, EventFilter, Tail};
use super::segment::{read_segment, SegmentError, StoredEvent};
use super::shard::{
    checkpoint_dir, checkpoint_path, drop_unread_properties, shard_of, write_checkpoint,
    IngestShard, ShardConfig, ShardShared,
};
use super::wal::Wal;
use super::CapturedEvent;
use crate::persons::PersonStore;

/// What an acknowledgement promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// The WAL record is fsynced before the client hears 200 (group commit).
    Fsync,
    /// The WAL record is handed to the OS only: survives a process crash, not a power cut.
    Buffered,
}

#[derive(Debug, Clone)]
pub struct IngestConfig {
    pub data_dir: PathBuf,
    pub durability: Durability,
    pub shards: usize,
    pub flush_max_rows: usize,
    pub flush_max_bytes: usize,
    pub flush_interval: Duration,
    pub max_buffered_events: usize,
    pub max_queued_requests: usize,
    pub wal_segment_bytes: u64,
    pub dedup_window: usize,
}

/// One WAL record: the accepted events of one request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WalBatch {
    pub project_id: u64,
    #[serde(default)]
    pub historical: bool,
    pub events: Vec<CapturedEvent>,
}

enum WalCommand {
    Append {
        payload: Vec<u8>,
        batch: WalBatch,
        done: Arc<BatchDone>,
    },
    Stop {
        reply: tokio::sync::oneshot::Sender<()>,
    },
}

/// Handle to the ingest pipeline; cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    inner: Arc<Inner>,
}

struct Inner {
    wal_tx: Sender<WalCommand>,
    closed: AtomicBool,
    stopping: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
    shards: Vec<Addr<IngestShard>>,
    tails: Vec<Arc<Tail>>,
    pending: Arc<AtomicUsize>,
    max_pending: usize,
    events_root: PathBuf,
    columns: Arc<PropertyColumns>,
    wal_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Ingest {
    /// Recovers state under `config.data_dir`, replays the WAL and starts the shard actors and
    /// the WAL writer. Returns once replayed events are processed, so everything acknowledged
    /// before a crash is visible again before the server answers. Must run inside an actix
    /// system; recovery blocks on disk I/O (it runs before serving).
    /// `columns` says which property columns each project's segments materialize.
    pub async fn start(
        config: IngestConfig,
        persons: Arc<PersonStore>,
        columns: Arc<PropertyColumns>,
    ) -> Result<Ingest, IngestError> {
        let shards_n = config.shards.max(1);
        let events_root = config.data_dir.join("events");
        std::fs::create_dir_all(&events_root)?;
        let (wal, replayed) = Wal::open(&config.data_dir.join("wal"), config.wal_segment_bytes)?;

        let on_disk = read_checkpoints(&events_root)?;
        recover_uncommitted_segments(&events_root, &on_disk)?;
        let low = on_disk.iter().map(|(_, seq)| *seq).min().unwrap_or(0);
        let skip = Arc::new(uuids_in_segments_after(&events_root, low)?);
        // Every current shard restarts from the lowest checkpoint; replayed events already in
        // segments are skipped by uuid, whatever shard held them before.
        for (shard, _) in &on_disk {
            if *shard >= shards_n {
                std::fs::remove_file(checkpoint_path(&events_root, *shard))?;
            }
        }
        for shard in 0..shards_n {
            write_checkpoint(&checkpoint_path(&events_root, shard), low)?;
        }

        let pending = Arc::new(AtomicUsize::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let checkpoints: Vec<Arc<AtomicU64>> = (0..shards_n)
            .map(|_| Arc::new(AtomicU64::new(low)))
            .collect();
        let tails: Vec<Arc<Tail>> = (0..shards_n).map(|_| Arc::new(Tail::default())).collect();
        let shards: Vec<Addr<IngestShard>> = (0..shards_n)
            .map(|shard| {
                let cfg = ShardConfig {
                    shard,
                    events_root: events_root.clone(),
                    flush_max_rows: config.flush_max_rows,
                    flush_max_bytes: config.flush_max_bytes,
                    flush_interval: config.flush_interval,
                    dedup_window: config.dedup_window,
                    columns: Arc::clone(&columns),
                };
                let shared = Arc::new(ShardShared {
                    tail: Arc::clone(&tails[shard]),
                    pending: Arc::clone(&pending),
                    checkpoint: Arc::clone(&checkpoints[shard]),
                    segments_written: AtomicU64::new(0),
                    flush_failures: AtomicU64::new(0),
                    stopping: Arc::clone(&stopping),
                });
                let persons = Arc::clone(&persons);
                SyncArbiter::start(1, move || {
                    IngestShard::new(cfg.clone(), Arc::clone(&persons), Arc::clone(&shared))
                })
            })
            .collect();

        let mut replayed_events = 0usize;
        let mut group = Vec::new();
        for record in replayed.into_iter().filter(|r| r.seq > low) {
            let batch: WalBatch = match serde_json::from_slice(&record.payload) {
                Ok(b) => b,
                Err(err) => {
                    tracing::error!(seq = record.seq, error = %err, "undecodable WAL record skipped");
                    continue;
                }
            };
            replayed_events += batch.events.len();
            pending.fetch_add(batch.events.len(), Ordering::SeqCst);
            group.push((record.seq, batch, None));
            if group.len() >= REPLAY_GROUP_RECORDS {
                route(std::mem::take(&mut group), &shards, Some(&skip));
            }
        }
        route(group, &shards, Some(&skip));
        // Mailboxes are FIFO: once every shard has answered, the replay is processed and
        // everything acknowledged before a crash is visible again.
        for shard in &shards {
            shard
                .send(GetStats)
                .await
                .map_err(|_| IngestError::ActorGone)?;
        }
        if replayed_events > 0 {
            tracing::info!(
                replayed_events,
                from_seq = low,
                "replayed the write-ahead log"
            );
        }

        let (wal_tx, wal_rx) = crossbeam_channel::bounded(config.max_queued_requests.max(1));
        let failed = Arc::new(AtomicBool::new(false));
        let wal_thread = {
            let shards = shards.clone();
            let failed = Arc::clone(&failed);
            let fsync = config.durability == Durability::Fsync;
            std::thread::Builder::new()
                .name("corvid-wal".into())
                .spawn(move || wal_loop(wal, wal_rx, shards, checkpoints, fsync, failed))?
        };

        let tick_every = (config.flush_interval / 4).max(Duration::from_millis(50));
        let tick_shards = shards.clone();
        actix::spawn(async move {
            let mut interval = actix::clock::interval(tick_every);
            loop {
                interval.tick().await;
                for shard in &tick_shards {
                    if !shard.connected() {
                        return;
                    }
                    shard.do_send(FlushTick);
                }
            }
        });

        Ok(Ingest {
            inner: Arc::new(Inner {
                wal_tx,
                closed: AtomicBool::new(false),
                stopping,
                failed,
                shards,
                tails,
                pending,
                max_pending: config.max_buffered_events,
                events_root,
                columns,
                wal_thread: Mutex::new(Some(wal_thread)),
            }),
        })
    }

    /// Makes a batch durable and visible; returns once both hold. Fails fast with
    /// [`IngestError::Overloaded`] when buffers are full.
    pub async fn submit(&self, mut batch: WalBatch) -> Result<(), IngestError> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(IngestError::ShuttingDown);
        }
        if inner.failed.load(Ordering::SeqCst) {
            return Err(IngestError::Wal(Arc::new(std::io::Error::other(
                "the write-ahead log failed earlier",
            ))));
        }
        let n = batch.events.len();
        let before = inner.pending.fetch_add(n, Ordering::SeqCst);
        if before + n > inner.max_pending && before > 0 {
            inner.pending.fetch_sub(n, Ordering::SeqCst);
            return Err(IngestError::Overloaded);
        }
        // Properties are serialized once: the WAL record embeds the text, the shard reuses it.
        for event in &mut batch.events {
            event.freeze_properties();
        }
        // Sized up front: growing a buffer of this size step by step costs copies and page
        // faults on every request.
        let estimate: usize = batch
            .events
            .iter()
            .map(|e| e.properties_json.as_ref().map_or(512, |p| p.len()) + 256)
            .sum();
        let mut payload = Vec::with_capacity(estimate);
        if serde_json::to_writer(&mut payload, &batch).is_err() {
            payload.clear();
        }
        for event in &mut batch.events {
            drop_unread_properties(event);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let done = Arc::new(BatchDone::new(inner.shards.len(), tx));
        let command = WalCommand::Append {
            payload,
            batch,
            done,
        };
        if let Err(err) = inner.wal_tx.try_send(command) {
            inner.pending.fetch_sub(n, Ordering::SeqCst);
            return Err(match err {
                TrySendError::Full(_) => IngestError::Overloaded,
                TrySendError::Disconnected(_) => IngestError::ShuttingDown,
            });
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                inner.pending.fetch_sub(n, Ordering::SeqCst);
                Err(err)
            }
            Err(_) => Err(IngestError::ShuttingDown),
        }
    }

    /// Flushes every shard's tail to segments.
    pub async fn flush(&self) -> Result<Vec<ShardStats>, IngestError> {
        let mut out = Vec::new();
        for shard in &self.inner.shards {
            out.push(
                shard
                    .send(FlushNow)
                    .await
                    .map_err(|_| IngestError::ActorGone)??,
            );
        }
        Ok(out)
    }

    pub async fn stats(&self) -> Result<Vec<ShardStats>, IngestError> {
        let mut out = Vec::new();
        for shard in &self.inner.shards {
            out.push(
                shard
                    .send(GetStats)
                    .await
                    .map_err(|_| IngestError::ActorGone)?,
            );
        }
        Ok(out)
    }

    /// Events accepted but not yet in a segment.
    pub fn pending_events(&self) -> usize {
        self.inner.pending.load(Ordering::SeqCst)
    }

    /// Whether the WAL failed (a critical failure: the process should shut down).
    pub fn has_failed(&self) -> bool {
        self.inner.failed.load(Ordering::SeqCst)
    }

    /// Clean stop: refuse new batches, drain and sync the WAL, flush every shard.
    pub async fn shutdown(&self) -> Result<(), IngestError> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // A flush that keeps failing now gives up; WAL replay covers what it could not write.
        self.inner.stopping.store(true, Ordering::SeqCst);
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self
            .inner
            .wal_tx
            .send(WalCommand::Stop { reply: tx })
            .is_ok()
        {
            let _ = rx.await;
        }
        let handle = self
            .inner
            .wal_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        self.flush().await?;
        Ok(())
    }

    /// Events of a project matching `filter`, newest first (blocking: call off the event loop).
    pub fn query_events(&self, filter: &EventFilter) -> Result<Vec<StoredEvent>, SegmentError> {
        query_events(&self.inner.events_root, &self.inner.tails, filter)
    }

    /// Root of the segment files, for the query engine.
    pub fn events_root(&self) -> &Path {
        &self.inner.events_root
    }

    /// Which property columns segments materialize, per project.
    pub fn columns(&self) -> &Arc<PropertyColumns> {
        &self.inner.columns
    }

    /// The shards' tails, for the query engine.
    pub fn tails(&self) -> &[Arc<Tail>] {
        &self.inner.tails
    }
}

/// WAL records replayed per shard message.
const REPLAY_GROUP_RECORDS: usize = 1024;

/// Hands each shard, in one message, the events of `records` that hash to it (moved, not
/// copied). Every shard gets a part of every record, so every shard's checkpoint advances with
/// the log.
fn route(
    records: Vec<(u64, WalBatch, Option<Arc<BatchDone>>)>,
    shards: &[Addr<IngestShard>],
    skip: Option<&Arc<HashSet<Uuid>>>,
) {
    if records.is_empty() {
        return;
    }
    let mut per_shard: Vec<Vec<RecordPart>> = (0..shards.len())
        .map(|_| Vec::with_capacity(records.len()))
        .collect();
    for (seq, batch, done) in records {
        let mut parts: Vec<Vec<CapturedEvent>> = (0..shards.len()).map(|_| Vec::new()).collect();
        for event in batch.events {
            parts[shard_of(batch.project_id, &event.distinct_id, shards.len())].push(event);
        }
        for (out, events) in per_shard.iter_mut().zip(parts) {
            out.push(RecordPart {
                seq,
                project_id: batch.project_id,
                historical: batch.historical,
                events,
                skip: skip.cloned(),
                done: done.clone(),
            });
        }
    }
    for (shard, parts) in shards.iter().zip(per_shard) {
        shard.do_send(ProcessBatch { parts });
    }
}

/// The WAL writer: drains whatever is queued, appends it, fsyncs once for the whole group,
/// hands the records to the shards, and deletes WAL files the shards no longer need.
fn wal_loop(
    mut wal: Wal,
    rx: Receiver<WalCommand>,
    shards: Vec<Addr<IngestShard>>,
    checkpoints: Vec<Arc<AtomicU64>>,
    fsync: bool,
    failed: Arc<AtomicBool>,
) {
    let mut truncated_through = 0u64;
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        while group.len() < 4096 {
            match rx.try_recv() {
                Ok(cmd) => group.push(cmd),
                Err(_) => break,
            }
        }
        let mut appended = Vec::with_capacity(group.len());
        let mut stop = None;
        let mut error: Option<Arc<std::io::Error>> = None;
        for cmd in group {
            match cmd {
                WalCommand::Append {
                    payload,
                    batch,
                    done,
                } => {
                    if failed.load(Ordering::SeqCst) || error.is_some() {
                        done.fail(IngestError::ShuttingDown);
                        continue;
                    }
                    match wal.append(&payload) {
                        Ok(seq) => appended.push((seq, batch, done)),
                        Err(e) => {
                            error = Some(Arc::new(e));
                            done.fail(IngestError::ShuttingDown);
                        }
                    }
                }
                WalCommand::Stop { reply } => stop = Some(reply),
            }
        }
        if error.is_none() && !appended.is_empty() {
            if let Err(e) = wal.sync(fsync) {
                error = Some(Arc::new(e));
            }
        }
        if let Some(e) = error {
            tracing::error!(error = %e, "write-ahead log failed; refusing further events");
            failed.store(true, Ordering::SeqCst);
            for (_, _, done) in appended {
                done.fail(IngestError::Wal(Arc::clone(&e)));
            }
        } else {
            let records = appended
                .into_iter()
                .map(|(seq, batch, done)| (seq, batch, Some(done)))
                .collect();
            route(records, &shards, None);
        }
        let covered = checkpoints
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .min()
            .unwrap_or(0);
        if covered > truncated_through {
            match wal.roll_if_covered(covered) {
                Ok(()) => {
                    wal.truncate_through(covered);
                    truncated_through = covered;
                }
                Err(e) => tracing::warn!(error = %e, "could not roll the WAL past covered records"),
            }
        }
        if let Some(reply) = stop {
            if let Err(e) = wal.sync(true) {
                tracing::error!(error = %e, "final WAL sync failed");
            }
            let _ = reply.send(());
            return;
        }
    }
}

/// `(shard, seq)` of every checkpoint file.
fn read_checkpoints(events_root: &Path) -> std::io::Result<Vec<(usize, u64)>> {
    let dir = checkpoint_dir(events_root);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(shard) = name.strip_prefix("shard-").and_then(|s| s.parse().ok()) else {
            continue;
        };
        let seq = std::fs::read_to_string(entry.path())?
            .trim()
            .parse()
            .unwrap_or(0);
        out.push((shard, seq));
    }
    Ok(out)
}

/// Parses `s<shard>-<first>-<last>.parquet[.tmp]`.
fn segment_name_parts(name: &str) -> Option<(usize, u64, u64)> {
    let name = name.strip_suffix(".tmp").unwrap_or(name);
    // Compacted versions (`….vN.parquet`) cover the same sequence range.
    let (stem, _) = super::columns::segment_version(name)?;
    let mut parts = stem.strip_prefix('s')?.split('-');
    let shard = parts.next()?.parse().ok()?;
    let first = parts.next()?.parse().ok()?;
    let last = parts.next()?.parse().ok()?;
    Some((shard, first, last))
}

fn all_segment_paths(events_root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let Ok(projects) = std::fs::read_dir(events_root) else {
        return Ok(out);
    };
    for project in projects
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("project="))
    {
        for day in std::fs::read_dir(project.path())?.filter_map(|e| e.ok()) {
            for file in std::fs::read_dir(day.path())?.filter_map(|e| e.ok()) {
                out.push(file.path());
            }
        }
    }
    Ok(out)
}

/// Finishes or undoes flushes a crash interrupted: a `.tmp` segment whose range ends at or
/// below its shard's checkpoint was committed (rename it); otherwise it was not (delete it).
fn recover_uncommitted_segments(
    events_root: &Path,
    checkpoints: &[(usize, u64)],
) -> std::io::Result<()> {
    for path in all_segment_paths(events_root)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(super::columns::COMPACTING_SUFFIX) {
            // A compaction the crash interrupted: its source segment is still in place.
            std::fs::remove_file(&path)?;
            continue;
        }
        if !name.ends_with(".tmp") {
            continue;
        }
        let committed = segment_name_parts(&name).is_some_and(|(shard, _, last)| {
            checkpoints
                .iter()
                .any(|(s, seq)| *s == shard && last <= *seq)
        });
        if committed {
            std::fs::rename(&path, path.with_extension(""))?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Uuids of committed segments that may overlap the WAL records still to be replayed.
fn uuids_in_segments_after(events_root: &Path, low: u64) -> Result<HashSet<Uuid>, IngestError> {
    let mut out = HashSet::new();
    for path in all_segment_paths(events_root)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".tmp") {
            continue;
        }
        if segment_name_parts(&name).is_some_and(|(_, _, last)| last > low) {
            out.extend(read_segment(&path)?.into_iter().map(|e| e.uuid));
        }
    }
    Ok(out)
}
