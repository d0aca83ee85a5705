//! The ingest shard actor: person processing and the in-memory tail, plus the shard's flusher
//! thread that turns frozen tail batches into Parquet segments.
//!
//! The actor runs on its own thread (`SyncArbiter`) because person processing blocks on sled.
//! Flushing runs on a second thread so that acknowledgements (which wait for the actor to have
//! processed a batch) never wait behind Parquet encoding.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Handler, SyncContext};
use chrono::NaiveDate;
use crossbeam_channel::{Receiver, Sender};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::catalog::{Flush, SegmentCatalog, SegmentName, SegmentRef};
use super::columns::PropertyColumns;
use super::dedup::RecentUuids;
use super::error::IngestError;
use super::messages::{FlushNow, FlushTick, GetStats, ProcessBatch, RecordPart, ShardStats};
use super::persons::{may_change_properties, person_uuid, process_event, KnownPerson, Outcome};
use super::property_keys::{PROCESSING_READS, SHARD_READS};
use super::read::{FrozenRows, Tail};
use super::segment::{write_segment, StoredEvent};
use super::CapturedEvent;
use corvid_kernel::start_over::drop_in_background;
use corvid_kernel::StoreError;
use corvid_persons::{PersonStore, UsageKind};

/// Person-property texts a shard remembers at most; past it the memo starts over.
const PERSON_TEXT_MEMO_ENTRIES: usize = 100_000;

/// Once an event's properties are serialized ([`CapturedEvent::freeze_properties`]), drops the
/// keys neither person processing nor the shard reads, unless processing may change the
/// properties (then the shard re-serializes them all). Runs on the accepting thread: the
/// dropped values are freed where they were allocated, which is cheaper than freeing them
/// on the shard's thread.
pub(crate) fn drop_unread_properties(event: &mut CapturedEvent) {
    if event.properties_json.is_none() || may_change_properties(event) {
        return;
    }
    // Moving the few kept keys out is cheaper than removing the many others one by one.
    let mut all = std::mem::take(&mut event.properties);
    for key in PROCESSING_READS.iter().chain(SHARD_READS.iter()) {
        if let Some(value) = all.remove(*key) {
            event.properties.insert((*key).to_string(), value);
        }
    }
}

/// Which shard owns a (project, distinct id): stable across builds and restarts.
pub fn shard_of(project_id: u64, distinct_id: &str, shards: usize) -> usize {
    let mut h = crc32fast::Hasher::new();
    h.update(&project_id.to_le_bytes());
    h.update(distinct_id.as_bytes());
    (h.finalize() as usize) % shards.max(1)
}

#[derive(Clone)]
pub struct ShardConfig {
    pub shard: usize,
    pub catalog: Arc<dyn SegmentCatalog>,
    pub flush_max_rows: usize,
    pub flush_max_bytes: usize,
    pub flush_interval: Duration,
    pub dedup_window: usize,
    pub columns: Arc<PropertyColumns>,
}

/// State shared between a shard and its flusher.
pub struct ShardShared {
    pub tail: Arc<Tail>,
    pub pending: Arc<AtomicUsize>,
    pub checkpoint: Arc<AtomicU64>,
    pub segments_written: AtomicU64,
    pub flush_failures: AtomicU64,
    /// Set on shutdown: a failing flush gives up instead of retrying forever.
    pub stopping: Arc<AtomicBool>,
}

/// One flush: commit `rows` (if any) and advance the checkpoint to `last`.
struct FlushJob {
    rows: Option<Arc<FrozenRows>>,
    first: u64,
    last: u64,
    reply: Option<Sender<Result<(), IngestError>>>,
}

pub struct IngestShard {
    cfg: ShardConfig,
    persons: Arc<PersonStore>,
    shared: Arc<ShardShared>,
    flusher: Sender<FlushJob>,
    processed_seq: u64,
    /// Highest seq already handed to the flusher.
    flushed_through: u64,
    first_seq_in_buffer: Option<u64>,
    buffered_bytes: usize,
    oldest: Option<Instant>,
    next_frozen_id: u64,
    recent: RecentUuids,
    /// The JSON text of each person's properties, with the person it was made from.
    person_texts: ahash::HashMap<Uuid, (KnownPerson, Arc<str>)>,
    stats: ShardStats,
}

impl IngestShard {
    pub fn new(
        cfg: ShardConfig,
        persons: Arc<PersonStore>,
        shared: Arc<ShardShared>,
    ) -> IngestShard {
        let start = shared.checkpoint.load(Ordering::SeqCst);
        let (tx, rx) = crossbeam_channel::unbounded();
        let flusher = Flusher {
            shard: cfg.shard,
            catalog: Arc::clone(&cfg.catalog),
            columns: Arc::clone(&cfg.columns),
            persons: Arc::clone(&persons),
            shared: Arc::clone(&shared),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("corvid-flush-{}", cfg.shard))
            .spawn(move || {
                corvid_kernel::sched::join_batch();
                flusher.run(rx)
            });
        if let Err(err) = spawned {
            tracing::error!(error = %err, "cannot start a flusher thread; segments will not be written");
        }
        IngestShard {
            recent: RecentUuids::new(cfg.dedup_window),
            stats: ShardStats {
                shard: cfg.shard,
                ..ShardStats::default()
            },
            cfg,
            persons,
            shared,
            flusher: tx,
            processed_seq: start,
            flushed_through: start,
            first_seq_in_buffer: None,
            buffered_bytes: 0,
            oldest: None,
            next_frozen_id: 0,
            person_texts: Default::default(),
        }
    }

    /// `person`'s properties as JSON text, reused while the person is unchanged. A person
    /// read from memory is a new copy for every event, so it is recognised by its encoded
    /// properties ([`KnownPerson::same_properties`]): comparing them costs less than decoding
    /// and writing them.
    fn person_text(&mut self, project_id: u64, person: Option<KnownPerson>) -> Arc<str> {
        let Some(person) = person else {
            return Arc::from("{}");
        };
        let id = person.id();
        if let Some((seen, text)) = self.person_texts.get(&id) {
            if seen.same_properties(&person) {
                return Arc::clone(text);
            }
        }
        let properties = match person.properties(&self.persons) {
            Some(properties) => properties,
            None => self.stored_properties(project_id, id),
        };
        let text: Arc<str> = serde_json::to_string(&properties)
            .unwrap_or_default()
            .into();
        if self.person_texts.len() >= PERSON_TEXT_MEMO_ENTRIES {
            drop_in_background(std::mem::take(&mut self.person_texts));
        }
        self.person_texts.insert(id, (person, Arc::clone(&text)));
        text
    }

    /// The properties of a person whose record in memory did not decode (never written so),
    /// read from storage.
    fn stored_properties(&self, project_id: u64, id: Uuid) -> Map<String, Value> {
        match self.persons.person(project_id, id) {
            Ok(person) => person.map(|p| p.properties).unwrap_or_default(),
            Err(err) => {
                tracing::error!(error = %err, project_id, person_id = %id, "cannot read a person's properties; the event is stored without them");
                Map::new()
            }
        }
    }

    /// Processes one record's events for this shard. An event of a live request whose person
    /// processing keeps failing is not stored (and forgotten by the dedup window, so its retry
    /// is processed): the error is returned, and the request is answered 503 instead of
    /// acknowledged. A replayed record was acknowledged before the restart and has no client
    /// to retry: its event is stored without the person update, with an error logged and
    /// counted (`person_failures`).
    fn process(&mut self, msg: RecordPart) -> Option<StoreError> {
        let project_id = msg.project_id;
        let live = msg.done.is_some();
        let mut rows = Vec::with_capacity(msg.events.len());
        let mut released = 0usize;
        let mut failure = None;
        for mut event in msg.events {
            let known = msg.skip.as_ref().is_some_and(|s| s.contains(&event.uuid));
            if known || (!event.uuid_made_here && !self.recent.insert(event.uuid)) {
                self.stats.duplicates_skipped += 1;
                released += 1;
                continue;
            }
            // The text made at acceptance still holds unless processing may edit properties.
            let frozen = event
                .properties_json
                .take()
                .filter(|_| !may_change_properties(&event));
            let outcome = match process_with_retries(&self.persons, project_id, &mut event) {
                Ok(outcome) => outcome,
                Err(err) if live => {
                    tracing::error!(error = %err, project_id, uuid = %event.uuid, "person processing failed; the event is not stored and its request is answered 503");
                    self.recent.forget(&event.uuid);
                    self.stats.person_failures += 1;
                    released += 1;
                    failure.get_or_insert(err);
                    continue;
                }
                Err(err) => {
                    tracing::error!(error = %err, project_id, uuid = %event.uuid, "person processing of a replayed event failed; storing it without the person update");
                    self.stats.person_failures += 1;
                    Outcome::Keep {
                        person_id: person_uuid(project_id, &event.distinct_id),
                        person: None,
                        groups: Default::default(),
                    }
                }
            };
            let Outcome::Keep {
                person_id,
                person,
                groups,
            } = outcome
            else {
                self.stats.events_dropped += 1;
                released += 1;
                continue;
            };
            let properties = match frozen {
                Some(text) => text.into_string(),
                None => serde_json::to_string(&event.properties).unwrap_or_default(),
            };
            // The properties are written out above, so their values can be moved out.
            let mut text = |key: &str| match event.properties.remove(key) {
                Some(Value::String(s)) => Some(s),
                _ => None,
            };
            rows.push(StoredEvent {
                uuid: event.uuid,
                session_id: text("$session_id"),
                window_id: text("$window_id"),
                properties,
                person_properties: self.person_text(project_id, person),
                event: event.event,
                distinct_id: event.distinct_id,
                person_id,
                timestamp: event.timestamp,
                created_at: event.created_at,
                project_id,
                groups,
            });
        }
        if released > 0 {
            self.shared.pending.fetch_sub(released, Ordering::SeqCst);
        }
        self.processed_seq = self.processed_seq.max(msg.seq);
        if rows.is_empty() {
            return failure;
        }
        let kind = if msg.historical {
            UsageKind::HistoricalEvents
        } else {
            UsageKind::BillableEvents
        };
        self.persons
            .count_usage(project_id, rows[0].created_at, kind, rows.len() as u64);
        self.stats.events_stored += rows.len() as u64;
        self.buffered_bytes += rows.iter().map(StoredEvent::approx_bytes).sum::<usize>();
        self.first_seq_in_buffer.get_or_insert(msg.seq);
        self.oldest.get_or_insert_with(Instant::now);
        self.shared.tail.write().active.extend(rows);
        failure
    }

    fn active_rows(&self) -> usize {
        self.shared.tail.read().active.len()
    }

    /// Moves the active rows into a frozen batch (no copy) and hands it to the flusher, which
    /// also advances the checkpoint to the last processed seq.
    fn freeze(&mut self, reply: Option<Sender<Result<(), IngestError>>>) {
        let last = self.processed_seq;
        let rows = {
            let mut tail = self.shared.tail.write();
            if tail.active.is_empty() {
                None
            } else {
                self.next_frozen_id += 1;
                let frozen = Arc::new(FrozenRows {
                    id: self.next_frozen_id,
                    rows: std::mem::take(&mut tail.active),
                });
                tail.frozen.push(Arc::clone(&frozen));
                Some(frozen)
            }
        };
        if rows.is_none() && last <= self.flushed_through && reply.is_none() {
            return;
        }
        let job = FlushJob {
            first: self.first_seq_in_buffer.unwrap_or(last),
            last,
            rows,
            reply,
        };
        self.flushed_through = last;
        self.first_seq_in_buffer = None;
        self.oldest = None;
        self.buffered_bytes = 0;
        if let Err(err) = self.flusher.send(job) {
            tracing::error!(shard = self.cfg.shard, "flusher is gone; cannot flush");
            if let Some(reply) = err.into_inner().reply {
                let _ = reply.send(Err(IngestError::ActorGone));
            }
        }
    }

    fn stats(&self) -> ShardStats {
        ShardStats {
            buffered_rows: self.shared.tail.read().len(),
            buffered_bytes: self.buffered_bytes,
            processed_seq: self.processed_seq,
            checkpoint: self.shared.checkpoint.load(Ordering::SeqCst),
            segments_written: self.shared.segments_written.load(Ordering::SeqCst),
            flush_failures: self.shared.flush_failures.load(Ordering::SeqCst),
            ..self.stats.clone()
        }
    }
}

impl Actor for IngestShard {
    type Context = SyncContext<Self>;
}

/// Waits before each retry of a failed person update (a transient storage error, a lock
/// timeout): three tries in all.
const PERSON_RETRY_WAITS: [Duration; 2] = [Duration::from_millis(10), Duration::from_millis(100)];

fn process_with_retries(
    persons: &PersonStore,
    project_id: u64,
    event: &mut CapturedEvent,
) -> Result<Outcome, StoreError> {
    let mut waits = PERSON_RETRY_WAITS.iter();
    loop {
        match process_event(persons, project_id, event) {
            Ok(outcome) => return Ok(outcome),
            Err(err) => match waits.next() {
                Some(wait) => {
                    tracing::warn!(error = %err, project_id, "person processing failed; retrying");
                    std::thread::sleep(*wait);
                }
                None => return Err(err),
            },
        }
    }
}

impl Handler<ProcessBatch> for IngestShard {
    type Result = ();

    fn handle(&mut self, msg: ProcessBatch, _: &mut Self::Context) {
        for part in msg.parts {
            let done = part.done.clone();
            let failed = self.process(part);
            if let Some(done) = done {
                match failed {
                    // Not acknowledged: the client retries, and the retry is processed anew.
                    Some(err) => done.fail(err.into()),
                    None => done.shard_finished(),
                }
            }
        }
        if self.active_rows() >= self.cfg.flush_max_rows
            || self.buffered_bytes >= self.cfg.flush_max_bytes
        {
            self.freeze(None);
        }
    }
}

impl Handler<FlushTick> for IngestShard {
    type Result = ();

    fn handle(&mut self, _: FlushTick, _: &mut Self::Context) {
        let due = match self.oldest {
            Some(t) => t.elapsed() >= self.cfg.flush_interval,
            None => self.processed_seq > self.flushed_through,
        };
        if due {
            self.freeze(None);
        }
    }
}

impl Handler<FlushNow> for IngestShard {
    type Result = Result<ShardStats, IngestError>;

    fn handle(&mut self, _: FlushNow, _: &mut Self::Context) -> Self::Result {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.freeze(Some(tx));
        rx.recv().map_err(|_| IngestError::ActorGone)??;
        Ok(self.stats())
    }
}

impl Handler<GetStats> for IngestShard {
    type Result = ShardStats;

    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> ShardStats {
        self.stats()
    }
}

/// Writes frozen batches to segments, in order, and advances the shard's checkpoint.
struct Flusher {
    shard: usize,
    catalog: Arc<dyn SegmentCatalog>,
    columns: Arc<PropertyColumns>,
    persons: Arc<PersonStore>,
    shared: Arc<ShardShared>,
}

impl Flusher {
    fn run(self, jobs: Receiver<FlushJob>) {
        for job in jobs {
            let result = loop {
                match self.commit(&job) {
                    Ok(()) => break Ok(()),
                    Err(err) => {
                        self.shared.flush_failures.fetch_add(1, Ordering::SeqCst);
                        tracing::error!(error = %err, shard = self.shard, "segment flush failed");
                        // Later jobs must not overtake this one (their checkpoint would cover
                        // rows that are not in segments), so retry until it works or we stop.
                        if self.shared.stopping.load(Ordering::SeqCst) {
                            break Err(err);
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            };
            let failed = result.is_err();
            if let Some(reply) = job.reply {
                let _ = reply.send(result);
            }
            if failed {
                // Stopping with an uncommitted batch: leave the rest to WAL replay.
                return;
            }
        }
    }

    /// Segment files staged, then persons durable, then the flush recorded (the catalog's
    /// commit point), then published under the tail's write lock while the rows leave the
    /// tail, so a reader sees each row exactly once; recovery finishes or drops a flush a
    /// crash interrupted.
    fn commit(&self, job: &FlushJob) -> Result<(), IngestError> {
        let current = self.shared.checkpoint.load(Ordering::SeqCst);
        if job.rows.is_none() && job.last <= current {
            return Ok(());
        }
        let mut flush = Flush {
            shard: self.shard,
            checkpoint: job.last,
            segments: Vec::new(),
        };
        let result = (|| -> Result<(), IngestError> {
            if let Some(frozen) = &job.rows {
                let mut partitions: BTreeMap<(u64, NaiveDate), Vec<&StoredEvent>> = BTreeMap::new();
                for row in frozen.rows.iter() {
                    partitions
                        .entry((row.project_id, row.day()))
                        .or_default()
                        .push(row);
                }
                // Partitions are in project order: each project's erasures are read once
                // per flush (a storage read in a cluster).
                let mut erasures: Option<(u64, Arc<corvid_persons::ProjectErasures>)> = None;
                for ((project, day), mut events) in partitions {
                    // Events an erasure covers never reach a segment (they may be here
                    // because the request came while they were buffered, or the WAL replayed
                    // them).
                    let erased = match &erasures {
                        Some((p, e)) if *p == project => Arc::clone(e),
                        _ => {
                            let e = self.persons.erasures(project)?;
                            erasures = Some((project, Arc::clone(&e)));
                            e
                        }
                    };
                    if !erased.all.is_empty() {
                        events.retain(|e| !e.erased_by(&erased.all));
                        if events.is_empty() {
                            continue;
                        }
                    }
                    let segment = SegmentRef {
                        project,
                        day,
                        name: SegmentName {
                            node: self.catalog.node(),
                            shard: self.shard,
                            first: job.first,
                            last: job.last,
                            version: 0,
                        },
                    };
                    let staged = self.catalog.staging_path(&segment)?;
                    flush.segments.push(segment);
                    write_segment(
                        self.catalog.disk(),
                        &staged,
                        &mut events,
                        &self.columns.keys_for(project),
                    )?;
                }
            }
            // Person effects and usage counts of these events must be durable before the WAL
            // may forget them.
            self.persons.flush_pending_usage()?;
            self.persons.flush()?;
            self.catalog.record_flush(&flush)?;
            Ok(())
        })();
        if let Err(err) = result {
            self.catalog.abandon_flush(&flush);
            return Err(err);
        }
        let count = {
            let mut tail = self.shared.tail.write();
            self.catalog.publish_flush(&flush)?;
            match &job.rows {
                Some(frozen) => {
                    tail.frozen.retain(|f| f.id != frozen.id);
                    frozen.rows.len()
                }
                None => 0,
            }
        };
        self.shared.pending.fetch_sub(count, Ordering::SeqCst);
        self.shared.checkpoint.store(job.last, Ordering::SeqCst);
        self.shared
            .segments_written
            .fetch_add(flush.segments.len() as u64, Ordering::SeqCst);
        Ok(())
    }
}
