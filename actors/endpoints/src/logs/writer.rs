//! The write path of execution logs. Handlers append entries to a pending list that the
//! [`ExecutionLog`] actor takes every 20 ms and passes over a channel to the `corvid-exec-log`
//! writer thread, which appends them to the [`ExecutionLogRecords`] in one write per batch and
//! prunes entries past retention once an hour.
//!
//! Bounded end to end: at most [`WRITER_QUEUE`] batches wait for the writer and at most
//! [`MAX_PENDING`] entries wait for the actor; past that, new entries are dropped and counted
//! (`dropped` in [`LogStats`]). A batch whose write fails or panics is dropped and counted, the
//! writer waits a little longer after each failure in a row, and goes on.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::Utc;
use crossbeam_channel::{Receiver, Sender};

use super::{ExecutionLogRecords, LogEntry};
use corvid_kernel::StoreError;

/// How often buffered entries are handed to the writer.
const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Pending entries past which a recorder asks the actor to flush at once.
const FLUSH_BACKLOG: usize = 65_536;
/// Pending entries past which new ones are dropped (the writer is far behind or stopped).
pub const MAX_PENDING: usize = 4 * FLUSH_BACKLOG;
/// Batches handed to the writer thread and not yet written.
pub const WRITER_QUEUE: usize = 256;
/// The writer's wait after a failed batch, doubled per failure in a row up to the max.
const FIRST_FAILURE_WAIT: Duration = Duration::from_millis(100);
const MAX_FAILURE_WAIT: Duration = Duration::from_secs(30);

/// Entries recorded since the last flush. Handlers push here (a short uncontended lock) rather
/// than into the actor's mailbox: a mailbox send wakes the actor's thread once per run, which
/// on two cores costs the request path its tail latency.
type Pending = Arc<Mutex<Vec<LogEntry>>>;

/// Owns the batching: every [`FLUSH_EVERY`] it takes what handlers recorded and hands it to
/// the writer thread.
pub struct ExecutionLog {
    pending: Pending,
    to_writer: Sender<ToWriter>,
    counters: Arc<WriterCounters>,
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
        match self.to_writer.try_send(ToWriter::Batch(batch)) {
            Ok(()) => {}
            // The writer is behind: the entries wait for the next flush (within MAX_PENDING).
            Err(crossbeam_channel::TrySendError::Full(ToWriter::Batch(mut batch))) => {
                let mut pending = lock(&self.pending);
                batch.append(&mut pending);
                *pending = batch;
            }
            Err(_) => tracing::warn!("execution log writer has stopped; entries dropped"),
        }
    }
}

fn lock(pending: &Pending) -> std::sync::MutexGuard<'_, Vec<LogEntry>> {
    // A panic while holding the lock can only have left a Vec of whole entries.
    pending.lock().unwrap_or_else(|p| p.into_inner())
}

fn stats(pending: &Pending, c: &WriterCounters) -> LogStats {
    LogStats {
        queued: lock(pending).len() + c.in_flight.load(Ordering::Relaxed),
        written: c.written.load(Ordering::Relaxed),
        write_failures: c.failures.load(Ordering::Relaxed),
        dropped: c.dropped.load(Ordering::Relaxed),
        writer_alive: !c.stopped.load(Ordering::SeqCst),
    }
}

/// Asks for [`LogStats`].
#[derive(Message)]
#[rtype(result = "LogStats")]
pub struct GetLogStats;

impl Handler<GetLogStats> for ExecutionLog {
    type Result = LogStats;

    fn handle(&mut self, _: GetLogStats, _: &mut Context<Self>) -> LogStats {
        stats(&self.pending, &self.counters)
    }
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

/// What the log's write path is doing (answer to [`GetLogStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, MessageResponse)]
pub struct LogStats {
    /// Entries recorded but not yet written.
    pub queued: usize,
    pub written: u64,
    pub write_failures: u64,
    /// Entries dropped because the write path was full, or their batch failed to write.
    pub dropped: u64,
    /// False once the writer thread has stopped (the process must not go on without it).
    pub writer_alive: bool,
}

/// Counters the writer thread keeps.
#[derive(Default)]
struct WriterCounters {
    in_flight: AtomicUsize,
    written: AtomicU64,
    failures: AtomicU64,
    dropped: AtomicU64,
    stopped: AtomicBool,
}

/// The running log: where handlers record, the actor's address and the writer thread.
pub struct ExecutionLogHandle {
    pub addr: Addr<ExecutionLog>,
    pending: Pending,
    to_writer: Sender<ToWriter>,
    counters: Arc<WriterCounters>,
    _writer: JoinHandle<()>,
}

impl ExecutionLogHandle {
    /// Starts the actor (in the current actix system) and the writer thread.
    pub fn start(
        store: Arc<dyn ExecutionLogRecords>,
        retention: Duration,
    ) -> Result<ExecutionLogHandle, StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(WRITER_QUEUE);
        let counters = Arc::new(WriterCounters::default());
        let writer_counters = Arc::clone(&counters);
        let writer = std::thread::Builder::new()
            .name("corvid-exec-log".into())
            .spawn(move || {
                write_loop(store.as_ref(), rx, retention, &writer_counters);
                writer_counters.stopped.store(true, Ordering::SeqCst);
            })
            .map_err(|e| StoreError::Sled(sled::Error::Io(e)))?;
        let pending: Pending = Arc::default();
        let addr = ExecutionLog {
            pending: Arc::clone(&pending),
            to_writer: tx.clone(),
            counters: Arc::clone(&counters),
        }
        .start();
        Ok(ExecutionLogHandle {
            addr,
            pending,
            to_writer: tx,
            counters,
            _writer: writer,
        })
    }

    /// Whether the actor and the writer thread are both running.
    pub fn alive(&self) -> bool {
        self.addr.connected() && !self.counters.stopped.load(Ordering::SeqCst)
    }

    /// Records one entry; it is written within [`FLUSH_EVERY`] (plus the writer's sync).
    pub fn record(&self, entry: LogEntry) {
        let mut pending = lock(&self.pending);
        if pending.len() >= MAX_PENDING {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
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
        if !batch.is_empty()
            && self
                .to_writer
                .send_timeout(ToWriter::Batch(batch), timeout)
                .is_err()
        {
            return false;
        }
        let (ack, done) = crossbeam_channel::bounded(1);
        self.to_writer
            .send_timeout(ToWriter::Sync(ack), timeout)
            .is_ok()
            && done.recv_timeout(timeout).is_ok()
    }
}

fn write_loop(
    store: &dyn ExecutionLogRecords,
    rx: Receiver<ToWriter>,
    retention: Duration,
    counters: &WriterCounters,
) {
    let mut last_prune = Instant::now()
        .checked_sub(Duration::from_secs(3600))
        .unwrap_or_else(Instant::now);
    let mut failures_in_a_row = 0u32;
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
                    counters.in_flight.store(count, Ordering::Relaxed);
                    match corvid_kernel::contain(|| store.append(entries)) {
                        Ok(()) => {
                            counters.written.fetch_add(count as u64, Ordering::Relaxed);
                            failures_in_a_row = 0;
                        }
                        Err(e) => {
                            counters.failures.fetch_add(1, Ordering::Relaxed);
                            counters.dropped.fetch_add(count as u64, Ordering::Relaxed);
                            failures_in_a_row = failures_in_a_row.saturating_add(1);
                            let wait = FIRST_FAILURE_WAIT
                                .saturating_mul(1 << failures_in_a_row.min(12))
                                .min(MAX_FAILURE_WAIT);
                            tracing::error!(error = %e, count, ?wait, "could not write execution logs; the batch is dropped");
                            std::thread::sleep(wait);
                        }
                    }
                    counters.in_flight.store(0, Ordering::Relaxed);
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
            let cutoff =
                corvid_kernel::time::sub(Utc::now(), corvid_kernel::time::from_std(retention))
                    .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
            match corvid_kernel::contain(|| store.prune(cutoff)) {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "pruned execution logs past retention"),
                Err(e) => tracing::warn!(error = %e, "could not prune execution logs"),
            }
        }
    }
}
