//! The WAL's file work that must not hold up a group commit, on a thread of its own: retiring
//! covered files, and preparing the files the log rolls to next.
//!
//! **Why a prepared file.** On ext4 (and most journaling file systems) an `fdatasync` of a file
//! that grew must commit the file system's journal to make the new length durable, and that
//! commit first writes out the data of every other file in the same transaction (segment
//! files, the person store's files). Under load a WAL sync then waited for other writers'
//! megabytes: single `fdatasync`s of 100 ms and more, seen as capture stalls. A file whose
//! blocks are already written (zeros, synced) and that the log overwrites from its start keeps
//! its length: its `fdatasync` writes the log's own blocks and nothing else.
//!
//! **Where a spare comes from.** A covered file of full length is renamed to a spare instead of
//! being deleted (recycled, as PostgreSQL and RocksDB recycle theirs): its blocks are written
//! already, and the log writes over its old records from the start. Replay cannot mistake them
//! for new ones: every old record's seq is lower than the first seq of the file's new name, so
//! the first one after the new records ends the file (see `read_records`), as the zeros of a
//! prepared file do. Writing a file of zeros (a copy of every byte into the page cache, then
//! its sync) cost about as much CPU as the WAL writer itself under `/batch/` load. Up to
//! [`MAX_SPARES`] are kept, so a roll nearly always finds one while covered files come in
//! bursts (one flush covers several files). Only when none is ready once the log has written
//! an eighth of a file since its last roll is one written as zeros, so a quiet node (or a test)
//! never writes a file it will not use. A recycled spare unused for [`RECYCLED_SPARE_MAX_AGE`]
//! is deleted: the covered records it holds do not stay on disk while the log is quiet.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use corvid_kernel::disk::{Disk, DiskFile};

/// Extension a covered file gets while it is being deleted; [`super::Wal::open_on`] finishes
/// the job.
pub(super) const DELETING: &str = "deleting";

/// The names of the prepared files the log rolls to next (zeros, or a recycled covered file;
/// at least `segment_bytes` long, synced). The first is the name a single spare always had.
/// Each keeps a name of its own while it is deleted (`wal.deleting`, `wal-1.deleting`, …).
pub(super) const SPARES: [&str; MAX_SPARES] =
    ["wal.spare", "wal-1.spare", "wal-2.spare", "wal-3.spare"];

/// How many spares are kept ready at most: covered files beyond them are deleted. Under load a
/// flush covers several files at once and then none for a while; with fewer spares than that
/// the log still ran out of them between flushes and wrote zeros.
pub(super) const MAX_SPARES: usize = 4;

/// How long a recycled spare is kept unused before it is deleted, with the covered records it
/// holds: as long as a superseded segment version is kept by default
/// (`ingest.compaction_grace`).
pub(super) const RECYCLED_SPARE_MAX_AGE: Duration = Duration::from_secs(300);

/// A spare being written; left behind by a crash, it is deleted on open.
pub(super) const SPARE_PARTIAL: &str = "wal.spare.partial";

/// Bytes freed per step while a covered file is deleted.
const DELETE_STEP: u64 = 4 << 20;

/// Zeros written per step while a spare is prepared, each step synced before the next.
const ZERO_STEP: u64 = 4 << 20;

/// Pause between steps of a deletion or a preparation: the WAL's syncs get the disk between
/// them.
const STEP_PAUSE: Duration = Duration::from_millis(2);

enum Chore {
    /// Covered files: the first ones of at least `recycle_from` bytes become spares while
    /// there is room, the others are deleted.
    Retire {
        paths: Vec<PathBuf>,
        recycle_from: u64,
    },
    PrepareSpare {
        bytes: u64,
    },
}

/// A spare ready for a roll.
struct Spare {
    name: &'static str,
    /// When a covered file became this spare (`None`: zeros, which hold nothing).
    recycled_at: Option<Instant>,
}

/// The spares ready for a roll. Whoever takes a spare out of the list owns its file: the
/// writer renames it to its next log file, the housekeeper deletes a stale one.
#[derive(Default)]
struct Ready(Mutex<Vec<Spare>>);

impl Ready {
    fn lock(&self) -> MutexGuard<'_, Vec<Spare>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// The thread doing the WAL's chores, and the spares ready for the next roll.
pub(super) struct Housekeeper {
    tx: Option<Sender<Chore>>,
    thread: Option<JoinHandle<()>>,
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    ready: Arc<Ready>,
    /// A spare was asked for and none is ready yet.
    spare_asked: bool,
    /// Set on drop: a preparation under way gives up.
    closing: Arc<AtomicBool>,
}

impl Housekeeper {
    /// Starts the thread for the log in `dir`. Spares left by the previous run are ready
    /// (counted as recycled: they may hold covered records); a partial one is deleted.
    pub(super) fn start(disk: &Arc<dyn Disk>, dir: &Path) -> Housekeeper {
        Housekeeper::start_with(disk, dir, RECYCLED_SPARE_MAX_AGE)
    }

    /// [`Housekeeper::start`] with recycled spares deleted after `max_age` unused.
    pub(super) fn start_with(disk: &Arc<dyn Disk>, dir: &Path, max_age: Duration) -> Housekeeper {
        let partial = dir.join(SPARE_PARTIAL);
        if partial.exists() {
            if let Err(err) = disk.remove_file(&partial) {
                tracing::warn!(error = %err, "could not delete a partial WAL spare");
            }
        }
        let now = Instant::now();
        let ready = Arc::new(Ready(Mutex::new(
            SPARES
                .iter()
                .filter(|name| dir.join(name).is_file())
                .map(|&name| Spare {
                    name,
                    recycled_at: Some(now),
                })
                .collect(),
        )));
        let closing = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::unbounded::<Chore>();
        let spawned = {
            let chores = Chores {
                disk: Arc::clone(disk),
                dir: dir.to_path_buf(),
                ready: Arc::clone(&ready),
                closing: Arc::clone(&closing),
                max_age,
            };
            std::thread::Builder::new()
                .name("corvid-wal-gc".into())
                .spawn(move || {
                    corvid_kernel::sched::join_batch();
                    chores.run(rx);
                })
        };
        let (tx, thread) = match spawned {
            Ok(thread) => (Some(tx), Some(thread)),
            Err(err) => {
                tracing::warn!(error = %err, "no WAL housekeeping thread; covered files are deleted inline and no file is prepared");
                (None, None)
            }
        };
        Housekeeper {
            tx,
            thread,
            disk: Arc::clone(disk),
            dir: dir.to_path_buf(),
            ready,
            spare_asked: false,
            closing,
        }
    }

    /// Has the covered files `paths` retired: recycled as spares (those of at least
    /// `recycle_from` bytes, while there is room) or deleted; deleted inline when there is no
    /// thread.
    pub(super) fn retire(&self, paths: Vec<PathBuf>, recycle_from: u64) {
        let unsent = match &self.tx {
            Some(tx) => tx
                .send(Chore::Retire {
                    paths,
                    recycle_from,
                })
                .err()
                .map(|e| match e.into_inner() {
                    Chore::Retire { paths, .. } => paths,
                    Chore::PrepareSpare { .. } => Vec::new(),
                }),
            None => Some(paths),
        };
        if let Some(paths) = unsent {
            remove_files(self.disk.as_ref(), &self.dir, &paths);
        }
    }

    /// Asks for a spare of `bytes` unless one is ready or asked for already.
    pub(super) fn want_spare(&mut self, bytes: u64) {
        if self.spare_asked || self.spare_ready() {
            return;
        }
        if let Some(tx) = &self.tx {
            self.spare_asked = tx.send(Chore::PrepareSpare { bytes }).is_ok();
        }
    }

    pub(super) fn spare_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Renames a spare to `path`. `Ok(false)` when there is none; the caller creates a file.
    /// The rename is durable once the caller syncs the directory.
    pub(super) fn take_spare(&mut self, path: &Path) -> io::Result<bool> {
        // The rename is made under the lock, so the housekeeper never sees a spare's name free
        // (out of the list) while its file is still there.
        let mut ready = self.ready.lock();
        let Some(spare) = ready.pop() else {
            return Ok(false);
        };
        self.spare_asked = false;
        match self.disk.rename(&self.dir.join(spare.name), path) {
            Ok(()) => Ok(true),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(err),
        }
    }
}

impl Drop for Housekeeper {
    /// Finishes the deletions already handed over, so a closed log's directory is settled; a
    /// preparation under way stops early.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The housekeeping thread's side.
struct Chores {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    ready: Arc<Ready>,
    closing: Arc<AtomicBool>,
    max_age: Duration,
}

impl Chores {
    fn run(self, rx: Receiver<Chore>) {
        loop {
            match rx.recv_timeout(self.max_age / 4) {
                Ok(Chore::Retire {
                    paths,
                    recycle_from,
                }) => self.retire(paths, recycle_from),
                Ok(Chore::PrepareSpare { bytes }) => {
                    if let Err(err) = self.prepare_spare(bytes) {
                        tracing::warn!(error = %err, "could not prepare the next WAL file; the log grows its files instead");
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            self.drop_stale_spares();
        }
    }

    /// A spare name neither ready nor on disk.
    fn free_name(&self, ready: &[Spare]) -> Option<&'static str> {
        SPARES
            .iter()
            .copied()
            .find(|name| ready.iter().all(|s| s.name != *name) && !self.dir.join(name).exists())
    }

    fn retire(&self, paths: Vec<PathBuf>, recycle_from: u64) {
        let mut deleted = Vec::with_capacity(paths.len());
        for path in paths {
            if !self.recycle(&path, recycle_from) {
                deleted.push(path);
            }
        }
        remove_files(self.disk.as_ref(), &self.dir, &deleted);
    }

    /// Renames the covered file `path` to a free spare name (durably) when it is long enough
    /// and there is room. Whether it did.
    fn recycle(&self, path: &Path, recycle_from: u64) -> bool {
        if std::fs::metadata(path).map_or(true, |m| m.len() < recycle_from) {
            return false;
        }
        let Some(name) = self.free_name(&self.ready.lock()) else {
            return false;
        };
        let spare = self.dir.join(name);
        let renamed = self
            .disk
            .rename(path, &spare)
            .and_then(|()| self.disk.sync_dir(&self.dir));
        match renamed {
            Ok(()) => {
                self.ready.lock().push(Spare {
                    name,
                    recycled_at: Some(Instant::now()),
                });
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, path = %path.display(), "could not keep a covered WAL file as the next one");
                // Renamed but not known durable: the name is taken; it is deleted instead.
                if spare.exists() {
                    remove_files(self.disk.as_ref(), &self.dir, &[spare]);
                }
                !path.exists()
            }
        }
    }

    /// Writes `bytes` of zeros to the partial spare, a synced step at a time, then renames it
    /// to a free spare name, unless a spare is ready by then or the log is closing.
    fn prepare_spare(&self, bytes: u64) -> io::Result<()> {
        if !self.ready.is_empty() {
            return Ok(());
        }
        let partial = self.dir.join(SPARE_PARTIAL);
        let mut file = self.disk.create(&partial)?;
        let zeros = vec![0u8; 1 << 20];
        let mut written = 0u64;
        while written < bytes {
            if self.closing.load(Ordering::Acquire) {
                drop(file);
                return self.disk.remove_file(&partial);
            }
            let step_end = (written + ZERO_STEP).min(bytes);
            while written < step_end {
                let n = usize::try_from(step_end - written)
                    .unwrap_or(zeros.len())
                    .min(zeros.len());
                file.write_all(zeros.get(..n).unwrap_or_default())?;
                written += n as u64;
            }
            file.sync_data()?;
            if written < bytes {
                std::thread::sleep(STEP_PAUSE);
            }
        }
        file.sync_all()?;
        drop(file);
        let Some(name) = self.free_name(&self.ready.lock()) else {
            return self.disk.remove_file(&partial);
        };
        self.disk.rename(&partial, &self.dir.join(name))?;
        self.disk.sync_dir(&self.dir)?;
        self.ready.lock().push(Spare {
            name,
            recycled_at: None,
        });
        Ok(())
    }

    /// Deletes recycled spares unused for `max_age`.
    fn drop_stale_spares(&self) {
        let stale: Vec<PathBuf> = {
            let mut ready = self.ready.lock();
            let (old, kept): (Vec<Spare>, Vec<Spare>) = ready
                .drain(..)
                .partition(|s| s.recycled_at.is_some_and(|at| at.elapsed() >= self.max_age));
            *ready = kept;
            old.iter().map(|s| self.dir.join(s.name)).collect()
        };
        if !stale.is_empty() {
            remove_files(self.disk.as_ref(), &self.dir, &stale);
        }
    }
}

/// Deletes covered log files; a file that stays behind is only replayed and skipped again.
/// Each is first renamed (durably), so a crash part way never leaves a shortened log file
/// under a name replay reads.
fn remove_files(disk: &dyn Disk, dir: &Path, paths: &[PathBuf]) {
    let mut doomed = Vec::with_capacity(paths.len());
    for path in paths {
        let to = path.with_extension(DELETING);
        match disk.rename(path, &to) {
            Ok(()) => doomed.push(to),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::warn!(error = %err, path = %path.display(), "could not delete a covered WAL file")
            }
        }
    }
    if let Err(err) = disk.sync_dir(dir) {
        tracing::warn!(error = %err, "could not sync the WAL directory after deletions");
        return;
    }
    for path in doomed {
        if let Err(err) = shrink_and_remove(disk, &path) {
            tracing::warn!(error = %err, path = %path.display(), "could not delete a covered WAL file");
        }
    }
}

/// Frees a file's blocks a step at a time, then unlinks it. Unlinking a 64 MiB file in one
/// call kept the disk busy for 20–35 ms (a `discard` mount trims every freed block at once),
/// and a WAL fsync issued meanwhile waited as long; between steps it gets the disk.
fn shrink_and_remove(disk: &dyn Disk, path: &Path) -> io::Result<()> {
    let mut len = std::fs::metadata(path)?.len();
    let mut file: Box<dyn DiskFile> = disk.open_existing(path)?;
    while len > DELETE_STEP {
        len -= DELETE_STEP;
        file.set_len(len)?;
        std::thread::sleep(STEP_PAUSE);
    }
    drop(file);
    disk.remove_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn housekeeper(dir: &Path, max_age: Duration) -> Housekeeper {
        Housekeeper::start_with(&corvid_kernel::disk::real(), dir, max_age)
    }

    fn covered_file(dir: &Path, seq: u64, len: usize) -> PathBuf {
        let path = dir.join(format!("wal-{seq:020}.log"));
        std::fs::write(&path, vec![seq as u8; len]).expect("write");
        path
    }

    fn spares_on_disk(dir: &Path) -> Vec<&'static str> {
        SPARES
            .iter()
            .copied()
            .filter(|n| dir.join(n).is_file())
            .collect()
    }

    #[test]
    fn full_covered_files_become_spares_up_to_the_limit_and_short_ones_are_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let keeper = housekeeper(dir.path(), RECYCLED_SPARE_MAX_AGE);
        // A short file first, then one full file more than there is room for.
        let mut paths = vec![covered_file(dir.path(), 1, 64)];
        paths.extend(
            (2..)
                .take(MAX_SPARES + 1)
                .map(|seq| covered_file(dir.path(), seq, 100)),
        );
        keeper.retire(paths.clone(), 100);
        drop(keeper);
        assert!(
            paths.iter().all(|p| !p.exists()),
            "every covered file is retired"
        );
        assert_eq!(spares_on_disk(dir.path()), SPARES.to_vec());
        // The spares are the first full files, as they were.
        for (seq, name) in (2u8..).zip(SPARES) {
            assert_eq!(
                std::fs::read(dir.path().join(name)).expect("spare"),
                vec![seq; 100]
            );
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), MAX_SPARES, "the rest are deleted: {left:?}");
    }

    #[test]
    fn spares_being_deleted_keep_names_of_their_own() {
        let deleting: std::collections::HashSet<PathBuf> = SPARES
            .iter()
            .map(|name| Path::new(name).with_extension(DELETING))
            .collect();
        assert_eq!(deleting.len(), SPARES.len(), "{deleting:?}");
    }

    #[test]
    fn a_recycled_spare_unused_for_its_age_is_deleted_and_a_taken_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut keeper = housekeeper(dir.path(), Duration::from_millis(200));
        keeper.retire(vec![covered_file(dir.path(), 1, 100)], 100);
        keeper.retire(vec![covered_file(dir.path(), 2, 100)], 100);
        let deadline = Instant::now() + Duration::from_secs(10);
        while spares_on_disk(dir.path()).len() < 2 {
            assert!(Instant::now() < deadline, "no spares");
            std::thread::sleep(Duration::from_millis(5));
        }
        let next = dir.path().join("wal-00000000000000000009.log");
        assert!(keeper.take_spare(&next).expect("take"), "a spare is ready");
        while !spares_on_disk(dir.path()).is_empty() {
            assert!(Instant::now() < deadline, "the unused spare stays");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!keeper.spare_ready());
        assert!(next.is_file(), "the spare taken is the log's now");
        drop(keeper);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn zeros_are_written_only_when_no_spare_is_ready() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut keeper = housekeeper(dir.path(), RECYCLED_SPARE_MAX_AGE);
        keeper.retire(vec![covered_file(dir.path(), 1, 100)], 100);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !keeper.spare_ready() {
            assert!(Instant::now() < deadline, "no spare");
            std::thread::sleep(Duration::from_millis(5));
        }
        keeper.want_spare(100);
        assert!(
            !keeper.spare_asked,
            "a spare is ready: nothing is asked for"
        );
        assert!(keeper
            .take_spare(&dir.path().join("wal-00000000000000000002.log"))
            .expect("take"));
        keeper.want_spare(100);
        assert!(keeper.spare_asked);
        while !keeper.spare_ready() {
            assert!(Instant::now() < deadline, "no zeros");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(keeper);
        // The zeros asked for once none was ready.
        assert_eq!(
            std::fs::read(dir.path().join(SPARES[0])).expect("spare"),
            vec![0u8; 100]
        );
    }
}
