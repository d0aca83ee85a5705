//! The WAL writer thread: group commit (append, one sync, hand records to the shards) and WAL truncation behind the shards' checkpoints.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use crossbeam_channel::Receiver;
use uuid::Uuid;

use super::super::catalog::SegmentCatalog;
use super::super::error::IngestError;
use super::super::files::SegmentFiles;
use super::super::messages::{BatchDone, FlushTick, ProcessBatch, RecordPart};
use super::super::segment::read_uuids;
use super::super::shard::{shard_of, IngestShard};
use super::super::wal::{Replayed, Wal};
use super::super::CapturedEvent;
use super::{WalCommand, WalStats};
use crate::WalBatch;

/// WAL records replayed per shard message.
pub(super) const REPLAY_GROUP_RECORDS: usize = 1024;

/// Hands each shard, in one message, the events of `records` that hash to it (moved, not
/// copied). Every shard gets a part of every record, so every shard's checkpoint advances with
/// the log.
pub(super) fn route(
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

/// Hands the WAL records after checkpoint `low` to their shards in groups, skipping events
/// already in segments (`skip`); returns how many events were replayed.
pub(super) fn route_replay(
    records: Vec<Replayed>,
    low: u64,
    shards: &[Addr<IngestShard>],
    skip: &Arc<HashSet<Uuid>>,
    pending: &AtomicUsize,
) -> usize {
    let mut replayed_events = 0usize;
    let mut group = Vec::new();
    for record in records.into_iter().filter(|r| r.seq > low) {
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
            route(std::mem::take(&mut group), shards, Some(skip));
        }
    }
    route(group, shards, Some(skip));
    replayed_events
}

/// Sends every shard a [`FlushTick`] every `every`, until the shards stop.
pub(super) fn tick_shards(shards: Vec<Addr<IngestShard>>, every: Duration) {
    actix::spawn(async move {
        let mut interval = actix::clock::interval(every);
        loop {
            interval.tick().await;
            for shard in &shards {
                if !shard.connected() {
                    return;
                }
                shard.do_send(FlushTick);
            }
        }
    });
}

/// The WAL writer: drains whatever is queued, appends it, fsyncs once for the whole group,
/// hands the records to the shards, and deletes WAL files the shards no longer need.
pub(super) fn wal_loop(
    mut wal: Wal,
    rx: Receiver<WalCommand>,
    shards: Vec<Addr<IngestShard>>,
    checkpoints: Vec<Arc<AtomicU64>>,
    fsync: bool,
    failed: Arc<AtomicBool>,
    stats: &WalStats,
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
                        Ok(seq) => {
                            stats.last_seq.store(seq, Ordering::Relaxed);
                            appended.push((seq, batch, done))
                        }
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
            let started = std::time::Instant::now();
            let synced = wal.sync(fsync);
            stats.fsync.observe(started.elapsed());
            if let Err(e) = synced {
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
            let truncated = stats.backups.deleting(|| {
                wal.roll_if_covered(covered).map(|()| {
                    wal.truncate_through(covered);
                })
            });
            match truncated {
                Some(Ok(())) => truncated_through = covered,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "could not roll the WAL past covered records")
                }
                None => {}
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

/// Uuids of this node's committed segments that may overlap the WAL records still to be
/// replayed (other nodes' segments hold other WALs' records).
pub(super) fn uuids_in_segments_after(
    catalog: &dyn SegmentCatalog,
    files: &SegmentFiles,
    low: u64,
) -> Result<HashSet<Uuid>, IngestError> {
    let mut out = HashSet::new();
    for project in catalog.projects()? {
        for segment in catalog.segments(project, None, None)? {
            if segment.name.node == catalog.node() && segment.name.last > low {
                let bytes = files.read(&segment)?;
                out.extend(read_uuids(bytes, &segment.key())?);
            }
        }
    }
    Ok(out)
}
