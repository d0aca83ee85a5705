//! The embedded persons and distinct ids: two keyspaces of a log-structured store (fjall)
//! under `<data dir>/persons/`.
//!
//! They are kept apart from the sled metadata store because they are most of its bytes and
//! most of its writes (every `$set` rewrites a person), and sled 0.34 replays every log byte
//! written since it was last opened when it opens again, and rebuilds state in memory for
//! all of it: with 10 M persons, a restart after the seed spent 12.5 s in that replay and
//! held 887 MiB before reading a single person. Here an open reads a journal of at most
//! [`JOURNAL_BYTES`] and the table files' indexes; memory is a bounded block cache.
//!
//! Every write reaches the operating system before it returns (it survives the process
//! being killed); [`PersonFiles::flush`] syncs the journal to the disk, which the ingest
//! pipeline does before its WAL checkpoint moves past the events that wrote it.

use std::path::Path;

use std::sync::Arc;

use fjall::compaction::Leveled;
use fjall::config::{PartitioningPolicy, PinningPolicy};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};

use corvid_kernel::StoreError;

/// Journal bytes kept before the oldest is flushed to table files: what an open replays at
/// most (fjall's smallest setting).
const JOURNAL_BYTES: u64 = 64 << 20;

/// A keyspace's in-memory write buffer before it is written out as a table. It sets how much
/// compaction costs: every four flushed tables are merged into the level below, rewriting
/// it, so a larger buffer rewrites that level less often for the same writes. With a million
/// known persons doing `$set`, fjall's worker spent 9.6-10.5 µs per captured event at 8 MiB
/// and 5.3-5.9 µs at 16 MiB, and the rate rose by 5-8 %. The bound on the other side: a full
/// buffer is freed while fjall holds its version lock (fjall's default, 64 MiB, took about
/// 100 ms), which the person committer's writes and reads of persons not held in memory wait
/// for; at 16 MiB about a quarter of that, off the capture acknowledgement
/// ([`crate::WriteBehind`]). fjall stores it with each keyspace when it is created, so a
/// data dir keeps the size it was made with.
const MEMTABLE_BYTES: u64 = 16 << 20;

/// The size a compaction cuts its output tables at (fjall's default is 64 MiB). Each table is
/// synced when it is written, and a sync of 64 MiB kept the disk busy for 30-90 ms, which a
/// WAL sync issued meanwhile waited for (capture requests stalled with it); 8 MiB tables keep
/// each such wait to a few milliseconds, for more (smaller) tables in the levels.
const TABLE_BYTES: u64 = 8 << 20;

/// fjall's background threads (flushes and compactions). Its default is one per core up to
/// four, and with more than one, the first leaves compactions to the others: it takes a
/// compaction request off the queue and puts it back, over and over, while another worker is
/// busy compacting. With a million known persons doing `$set`, two workers took 20 µs of CPU
/// per captured event and one takes 10 µs for the same flushes and compactions. One worker
/// flushes and compacts in turn; person writes are behind the capture acknowledgement
/// ([`crate::WriteBehind`]), so a flush waiting for a compaction delays no request.
const WORKER_THREADS: usize = 1;

/// How both keyspaces are made (kept with them: a keyspace keeps the options it was created
/// with). Every table's whole block index and bloom filter stay in memory, unpartitioned: a
/// person read for `/flags` then costs one data block from the block cache or the page cache
/// per keyspace, never index or filter blocks read and checksummed again (at the defaults,
/// which pin only the upper levels', those were most of a read at 10 M persons). They take
/// about 5 bytes per person.
///
/// Compactions write tables of [`TABLE_BYTES`]. Memtables are [`MEMTABLE_BYTES`]: a full one is freed while fjall holds its version lock,
/// which every write and read of the keyspace waits for, so its size bounds that wait.
fn keyspace_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default()
        .max_memtable_size(MEMTABLE_BYTES)
        .compaction_strategy(Arc::new(
            Leveled::default().with_table_target_size(TABLE_BYTES),
        ))
        .index_block_pinning_policy(PinningPolicy::all(true))
        .filter_block_pinning_policy(PinningPolicy::all(true))
        .index_block_partitioning_policy(PartitioningPolicy::all(false))
        .filter_block_partitioning_policy(PartitioningPolicy::all(false))
}

/// Name of the persons keyspace (key project ‖ person uuid, value the encoded person), also
/// its tree's name in a snapshot's metadata export.
pub const PERSONS: &str = "persons";
/// Name of the distinct-id keyspace (key project ‖ distinct id, value the person's uuid).
pub const DISTINCT_IDS: &str = "person_distinct_ids";

/// The opened keyspaces (cheap to clone: handles to one database).
#[derive(Clone)]
pub struct PersonFiles {
    db: Database,
    pub(crate) persons: Keyspace,
    pub(crate) distinct_ids: Keyspace,
}

impl PersonFiles {
    /// Opens (creating) the keyspaces under `dir`, with a block cache of `cache_bytes`.
    /// Blocking.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<PersonFiles, StoreError> {
        let db = Database::builder(dir)
            .cache_size(cache_bytes)
            .max_journaling_size(JOURNAL_BYTES)
            .worker_threads(WORKER_THREADS)
            .open()?;
        let persons = db.keyspace(PERSONS, keyspace_options)?;
        let distinct_ids = db.keyspace(DISTINCT_IDS, keyspace_options)?;
        Ok(PersonFiles {
            db,
            persons,
            distinct_ids,
        })
    }

    /// Keyspaces in a new directory under the system's temporary one, removed when the last
    /// handle is dropped (tests).
    #[cfg(any(test, feature = "test-support"))]
    pub fn temporary() -> PersonFiles {
        let dir = std::env::temp_dir().join(format!("corvid-persons-{}", uuid::Uuid::new_v4()));
        let db = Database::builder(&dir)
            .cache_size(8 << 20)
            .worker_threads(WORKER_THREADS)
            .temporary(true)
            .open()
            .expect("temporary person keyspaces");
        let persons = db
            .keyspace(PERSONS, keyspace_options)
            .expect("temporary person keyspaces");
        let distinct_ids = db
            .keyspace(DISTINCT_IDS, keyspace_options)
            .expect("temporary person keyspaces");
        PersonFiles {
            db,
            persons,
            distinct_ids,
        }
    }

    /// A write batch over both keyspaces: applied at once, or not at all after a crash.
    pub(crate) fn batch(&self) -> fjall::OwnedWriteBatch {
        self.db.batch()
    }

    /// Syncs every write so far to the disk.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    /// Calls `each(keyspace name, key, value)` for every entry, keyspace by keyspace, as of
    /// one moment (a snapshot: writes meanwhile are not seen). For backups.
    pub fn export<E>(
        &self,
        mut each: impl FnMut(&str, &[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E>
    where
        E: From<StoreError>,
    {
        let snapshot = self.db.snapshot();
        for (name, keyspace) in [(PERSONS, &self.persons), (DISTINCT_IDS, &self.distinct_ids)] {
            for entry in snapshot.iter(keyspace) {
                let (key, value) = entry.into_inner().map_err(StoreError::from)?;
                each(name, &key, &value)?;
            }
        }
        Ok(())
    }

    /// Moves persons and distinct ids the metadata store `db` still holds (written by a build
    /// that kept them there, or imported from a snapshot) into these keyspaces, then drops
    /// them from `db`. Copied in batches and synced before anything is dropped, so a crash
    /// midway copies again on the next open. Returns the entries moved.
    pub fn take_over(&self, db: &sled::Db) -> Result<usize, StoreError> {
        /// Entries per write batch.
        const BATCH: usize = 10_000;
        let mut moved = 0;
        let names = db.tree_names();
        for (name, keyspace) in [(PERSONS, &self.persons), (DISTINCT_IDS, &self.distinct_ids)] {
            if !names.iter().any(|n| n.as_ref() == name.as_bytes()) {
                continue;
            }
            let tree = db.open_tree(name)?;
            let mut batch = self.batch();
            for entry in tree.iter() {
                let (key, value) = entry?;
                batch.insert(keyspace, key.as_ref(), value.as_ref());
                moved += 1;
                if batch.len() >= BATCH {
                    std::mem::replace(&mut batch, self.batch()).commit()?;
                }
            }
            batch.commit()?;
        }
        if moved > 0 {
            self.flush()?;
            tracing::info!(moved, "persons moved out of the metadata store");
        }
        let mut dropped = false;
        for name in [PERSONS, DISTINCT_IDS] {
            if names.iter().any(|n| n.as_ref() == name.as_bytes()) {
                dropped |= db.drop_tree(name)?;
            }
        }
        if dropped {
            db.flush()?;
        }
        Ok(moved)
    }
}
