//! The WAL's file work that must not hold up a group commit, on a thread of its own: deleting
//! covered files, and preparing the file the log rolls to next.
//!
//! **Why a prepared file.** On ext4 (and most journaling file systems) an `fdatasync` of a file
//! that grew must commit the file system's journal to make the new length durable, and that
//! commit first writes out the data of every other file in the same transaction (segment
//! files, the person store's files). Under load a WAL sync then waited for other writers'
//! megabytes: single `fdatasync`s of 100 ms and more, seen as capture stalls. A file whose
//! blocks are already written (zeros, synced) and that the log overwrites from its start keeps
//! its length: its `fdatasync` writes the log's own blocks and nothing else.
//!
//! The spare is made only once the log has written an eighth of a file since its last roll, so
//! a quiet node (or a test) never writes a file of zeros it will not use.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use corvid_kernel::disk::{Disk, DiskFile};

/// Extension a covered file gets while it is being deleted; [`super::Wal::open_on`] finishes
/// the job.
pub(super) const DELETING: &str = "deleting";

/// The prepared file the log rolls to next: zeros, synced, `segment_bytes` long.
pub(super) const SPARE: &str = "wal.spare";

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
    Remove(Vec<PathBuf>),
    PrepareSpare { bytes: u64 },
}

/// The thread doing the WAL's chores, and whether a spare is ready for the next roll.
pub(super) struct Housekeeper {
    tx: Option<Sender<Chore>>,
    thread: Option<JoinHandle<()>>,
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Set once a spare is ready, cleared when a roll takes it.
    spare_ready: Arc<AtomicBool>,
    /// A spare was asked for and is not ready yet.
    spare_asked: bool,
    /// Set on drop: a preparation under way gives up.
    closing: Arc<AtomicBool>,
}

impl Housekeeper {
    /// Starts the thread for the log in `dir`. A spare left by the previous run is ready; a
    /// partial one is deleted.
    pub(super) fn start(disk: &Arc<dyn Disk>, dir: &Path) -> Housekeeper {
        let partial = dir.join(SPARE_PARTIAL);
        if partial.exists() {
            if let Err(err) = disk.remove_file(&partial) {
                tracing::warn!(error = %err, "could not delete a partial WAL spare");
            }
        }
        let spare_ready = Arc::new(AtomicBool::new(dir.join(SPARE).is_file()));
        let closing = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::unbounded::<Chore>();
        let spawned = {
            let dir = dir.to_path_buf();
            let disk = Arc::clone(disk);
            let ready = Arc::clone(&spare_ready);
            let closing = Arc::clone(&closing);
            std::thread::Builder::new()
                .name("corvid-wal-gc".into())
                .spawn(move || {
                    corvid_kernel::sched::join_batch();
                    for chore in rx {
                        match chore {
                            Chore::Remove(paths) => remove_files(disk.as_ref(), &dir, &paths),
                            Chore::PrepareSpare { bytes } => {
                                match prepare_spare(disk.as_ref(), &dir, bytes, &closing) {
                                    Ok(true) => ready.store(true, Ordering::Release),
                                    Ok(false) => {}
                                    Err(err) => {
                                        tracing::warn!(error = %err, "could not prepare the next WAL file; the log grows its files instead")
                                    }
                                }
                            }
                        }
                    }
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
            spare_ready,
            spare_asked: false,
            closing,
        }
    }

    /// Has `paths` deleted (inline when there is no thread).
    pub(super) fn remove(&self, paths: Vec<PathBuf>) {
        let unsent = match &self.tx {
            Some(tx) => tx
                .send(Chore::Remove(paths))
                .err()
                .map(|e| match e.into_inner() {
                    Chore::Remove(paths) => paths,
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
        if self.spare_asked || self.spare_ready.load(Ordering::Acquire) {
            return;
        }
        if let Some(tx) = &self.tx {
            self.spare_asked = tx.send(Chore::PrepareSpare { bytes }).is_ok();
        }
    }

    pub(super) fn spare_ready(&self) -> bool {
        self.spare_ready.load(Ordering::Acquire)
    }

    /// Renames the spare to `path`. `Ok(false)` when there is none; the caller creates a file.
    /// The rename is durable once the caller syncs the directory.
    pub(super) fn take_spare(&mut self, path: &Path) -> io::Result<bool> {
        if !self.spare_ready.swap(false, Ordering::AcqRel) {
            return Ok(false);
        }
        self.spare_asked = false;
        match self.disk.rename(&self.dir.join(SPARE), path) {
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

/// Writes `bytes` of zeros to the partial spare, a synced step at a time, then renames it to
/// the spare. `Ok(false)` when a spare exists already or the log is closing.
fn prepare_spare(
    disk: &dyn Disk,
    dir: &Path,
    bytes: u64,
    closing: &AtomicBool,
) -> io::Result<bool> {
    if dir.join(SPARE).exists() {
        return Ok(true);
    }
    let partial = dir.join(SPARE_PARTIAL);
    let mut file = disk.create(&partial)?;
    let zeros = vec![0u8; 1 << 20];
    let mut written = 0u64;
    while written < bytes {
        if closing.load(Ordering::Acquire) {
            drop(file);
            disk.remove_file(&partial)?;
            return Ok(false);
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
    disk.rename(&partial, &dir.join(SPARE))?;
    Ok(true)
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
