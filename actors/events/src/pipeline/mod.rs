//! The ingest pipeline's front: admission control, the WAL writer thread (group commit), start-up
//! recovery and WAL replay, and the shard actors' wiring.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::{Addr, SyncArbiter};
use crossbeam_channel::{Sender, TrySendError};
use serde::{Deserialize, Serialize};

use super::backups::Backups;
use super::catalog::SegmentCatalog;
use super::columns::PropertyColumns;
use super::error::IngestError;
use super::files::SegmentFiles;
use super::messages::{BatchDone, FlushNow, GetStats, ShardStats};
use super::read::{query_events, EventFilter, Tail};
use super::segment::StoredEvent;
use super::shard::{drop_unread_properties, IngestShard, ShardConfig, ShardShared};
use super::wal::Wal;
use super::CapturedEvent;
use corvid_kernel::histogram::LatencyHistogram;
use corvid_persons::PersonStore;

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
    /// How long a capture request waits for room in full buffers before it is refused
    /// ([`Ingest::wait_for_room`]); zero refuses at once.
    pub admission_wait: Duration,
    pub max_queued_requests: usize,
    pub wal_segment_bytes: u64,
    pub dedup_window: usize,
    /// What the WAL and the embedded segment catalog write through (the real disk, or a test's
    /// model of a power cut).
    pub disk: std::sync::Arc<dyn corvid_kernel::disk::Disk>,
}

/// One WAL record: the accepted events of one request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WalBatch {
    pub project_id: u64,
    #[serde(default)]
    pub historical: bool,
    pub events: Vec<CapturedEvent>,
}

impl WalBatch {
    /// Appends this batch's WAL record to `out`: the JSON its `Serialize` writes, with each
    /// event's frozen properties text copied as it is ([`CapturedEvent::write_wal_json`]).
    fn write_wal_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"project_id\":");
        serde_json::to_writer(&mut *out, &self.project_id)?;
        out.extend_from_slice(b",\"historical\":");
        serde_json::to_writer(&mut *out, &self.historical)?;
        out.extend_from_slice(b",\"events\":[");
        for (i, event) in self.events.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            event.write_wal_json(out)?;
        }
        out.extend_from_slice(b"]}");
        Ok(())
    }
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

/// What the WAL writer measures, for `/metrics`.
#[derive(Debug, Default)]
pub struct WalStats {
    /// Time of each group sync (fsync, or the write-out when durability is not fsync).
    pub fsync: LatencyHistogram,
    /// Sequence number of the newest appended record (shard lag is measured against it).
    pub last_seq: AtomicU64,
    /// Backups under way: no covered WAL file is deleted while one copies them.
    pub backups: Backups,
}

struct Inner {
    wal_stats: Arc<WalStats>,
    wal_tx: Sender<WalCommand>,
    closed: AtomicBool,
    stopping: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
    shards: Vec<Addr<IngestShard>>,
    tails: Vec<Arc<Tail>>,
    pending: Arc<AtomicUsize>,
    max_pending: usize,
    admission_wait: Duration,
    /// Requests waiting for room now, at most `max_waiting`.
    waiting: AtomicUsize,
    max_waiting: usize,
    catalog: Arc<dyn SegmentCatalog>,
    files: Arc<SegmentFiles>,
    columns: Arc<PropertyColumns>,
    /// Person records, and the erasures readers hide events by.
    persons: Arc<PersonStore>,
    wal_thread: Mutex<Option<JoinHandle<()>>>,
}

/// How often a request waiting for room looks again: a flush frees room by the hundred
/// thousand events, so a few milliseconds late costs nothing.
const ROOM_POLL: Duration = Duration::from_millis(5);

/// One of the places for requests waiting for room, given back when dropped.
struct WaitSlot<'a>(&'a AtomicUsize);

impl<'a> WaitSlot<'a> {
    fn take(waiting: &'a AtomicUsize, max: usize) -> Result<WaitSlot<'a>, IngestError> {
        if waiting.fetch_add(1, Ordering::SeqCst) >= max {
            waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(IngestError::Overloaded);
        }
        Ok(WaitSlot(waiting))
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ingest {
    /// Recovers state under `config.data_dir`, replays the WAL and starts the shard actors and
    /// the WAL writer. Returns once replayed events are processed, so everything acknowledged
    /// before a crash is visible again before the server answers. Must run inside an actix
    /// system; recovery blocks on disk I/O (it runs before serving).
    /// `columns` says which property columns each project's segments materialize; `catalog`
    /// lists the segments that `files` holds.
    pub async fn start(
        config: IngestConfig,
        persons: Arc<PersonStore>,
        columns: Arc<PropertyColumns>,
        catalog: Arc<dyn SegmentCatalog>,
        files: Arc<SegmentFiles>,
    ) -> Result<Ingest, IngestError> {
        let shards_n = config.shards.max(1);
        let (wal, replayed) = Wal::open_on(
            Arc::clone(&config.disk),
            &config.data_dir.join("wal"),
            config.wal_segment_bytes,
        )?;

        catalog.recover()?;
        let on_disk = catalog.checkpoints()?;
        let low = on_disk.iter().map(|(_, seq)| *seq).min().unwrap_or(0);
        let skip = Arc::new(uuids_in_segments_after(catalog.as_ref(), &files, low)?);
        // Every current shard restarts from the lowest checkpoint; replayed events already in
        // segments are skipped by uuid, whatever shard held them before.
        for (shard, _) in &on_disk {
            if *shard >= shards_n {
                catalog.remove_checkpoint(*shard)?;
            }
        }
        for shard in 0..shards_n {
            catalog.set_checkpoint(shard, low)?;
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
                    catalog: Arc::clone(&catalog),
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

        let replayed_events = route_replay(replayed, low, &shards, &skip, &pending);
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
        let wal_stats = Arc::new(WalStats::default());
        let wal_thread = {
            let shards = shards.clone();
            let failed = Arc::clone(&failed);
            let stats = Arc::clone(&wal_stats);
            let fsync = config.durability == Durability::Fsync;
            std::thread::Builder::new()
                .name("corvid-wal".into())
                .spawn(move || wal_loop(wal, wal_rx, shards, checkpoints, fsync, failed, &stats))?
        };

        tick_shards(
            shards.clone(),
            (config.flush_interval / 4).max(Duration::from_millis(50)),
        );

        Ok(Ingest {
            inner: Arc::new(Inner {
                wal_stats,
                wal_tx,
                closed: AtomicBool::new(false),
                stopping,
                failed,
                shards,
                tails,
                pending,
                max_pending: config.max_buffered_events,
                admission_wait: config.admission_wait,
                waiting: AtomicUsize::new(0),
                max_waiting: config.max_queued_requests,
                catalog,
                files,
                columns,
                persons,
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
        // Events normalized on the text path come with theirs and hold only the read keys.
        for event in &mut batch.events {
            if event.properties_json.is_none() {
                event.freeze_properties();
                drop_unread_properties(event);
            }
        }
        // Sized up front: growing a buffer of this size step by step costs copies and page
        // faults on every request.
        let estimate: usize = batch
            .events
            .iter()
            .map(|e| e.properties_json.as_ref().map_or(512, |p| p.len()) + 256)
            .sum();
        let mut payload = Vec::with_capacity(estimate);
        if let Err(err) = batch.write_wal_json(&mut payload) {
            inner.pending.fetch_sub(n, Ordering::SeqCst);
            tracing::error!(error = %err, "a batch could not be encoded for the WAL; refused");
            return Err(IngestError::Encode(Arc::new(err)));
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
            // A store error comes from the shards, which released their own events (stored
            // ones when flushed, refused ones at once); any other failure came before them.
            Ok(Err(err @ IngestError::Store(_))) => Err(err),
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

    /// Each project's segment files and bytes in storage now.
    pub async fn storage_by_project(&self) -> std::io::Result<Vec<super::ProjectBytes>> {
        let files = Arc::clone(&self.inner.files);
        tokio::task::spawn_blocking(move || files.bytes_by_project())
            .await
            .map_err(std::io::Error::other)?
    }

    /// Events accepted but not yet in a segment.
    pub fn pending_events(&self) -> usize {
        self.inner.pending.load(Ordering::SeqCst)
    }

    /// Returns once the buffers have room, as [`Ingest::submit`] needs; waits for it up to
    /// `ingest.admission_wait` while they are full, then fails with
    /// [`IngestError::Overloaded`]. Capture waits here before decoding a request: refusing
    /// at once, each refused request was decoded for nothing and sent again at once, so under
    /// more load than the flushers write, the CPU they needed went to requests refused.
    /// Waiting instead holds each client to the rate the server writes. At most
    /// `ingest.max_queued_requests` requests wait at a time; past it a request is refused at
    /// once, so waiting requests (each holding its body) stay bounded.
    pub async fn wait_for_room(&self) -> Result<(), IngestError> {
        let inner = &self.inner;
        let has_room = || inner.pending.load(Ordering::SeqCst) < inner.max_pending;
        if has_room() {
            return Ok(());
        }
        if inner.admission_wait.is_zero() {
            return Err(IngestError::Overloaded);
        }
        let _slot = WaitSlot::take(&inner.waiting, inner.max_waiting)?;
        let deadline = tokio::time::Instant::now() + inner.admission_wait;
        loop {
            tokio::time::sleep(ROOM_POLL).await;
            if has_room() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(IngestError::Overloaded);
            }
        }
    }

    /// This node's running backups: while one runs, covered WAL files are kept (a backup
    /// copies the checkpoints, then the segments, then the WAL, and the records between the
    /// copied checkpoints and the end of the log must still be there when it does). The
    /// compactor is given the same handle.
    pub fn backups(&self) -> &Backups {
        &self.inner.wal_stats.backups
    }

    /// What the WAL writer measured.
    pub fn wal_stats(&self) -> &WalStats {
        &self.inner.wal_stats
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
    /// Events an erasure covers are left out.
    pub fn query_events(&self, filter: &EventFilter) -> Result<Vec<StoredEvent>, IngestError> {
        let erased = self.inner.persons.erasures(filter.project_id)?;
        Ok(query_events(
            self.inner.catalog.as_ref(),
            &self.inner.files,
            &self.inner.tails,
            filter,
            &erased.all,
        )?)
    }

    /// The days retention dropped from `project`, oldest first (blocking).
    pub fn retention_drops(&self, project: u64) -> Result<Vec<crate::DayDrop>, IngestError> {
        Ok(self.inner.catalog.drops(project)?)
    }

    /// The segment catalog the shards commit to.
    pub fn catalog(&self) -> &Arc<dyn SegmentCatalog> {
        &self.inner.catalog
    }

    /// Which property columns segments materialize, per project.
    pub fn columns(&self) -> &Arc<PropertyColumns> {
        &self.inner.columns
    }

    /// Where segment bytes are read from.
    pub fn files(&self) -> &Arc<SegmentFiles> {
        &self.inner.files
    }

    /// The shards' tails, for the query engine.
    pub fn tails(&self) -> &[Arc<Tail>] {
        &self.inner.tails
    }
}

mod wal_writer;

use wal_writer::{route_replay, tick_shards, uuids_in_segments_after, wal_loop};

#[cfg(test)]
mod tests;
