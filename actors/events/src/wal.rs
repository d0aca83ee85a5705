//! The write-ahead log: what makes an acknowledged event durable before it reaches a segment.
//!
//! Files `wal-<first seq>.log` hold records `[len u32][crc32 u32][seq u64][payload]` (little
//! endian; the CRC covers seq and payload). A torn or corrupt record ends replay of its file,
//! and the tail of the newest file is truncated there; a length longer than what is left of the
//! file is a torn record too, found before anything is allocated for it. Files roll at
//! `segment_bytes`; a file is deleted once every ingest shard has flushed past its last record.
//! Every write goes through a [`Disk`]; new files and deletions are made durable by syncing
//! the directory.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use corvid_kernel::disk::{create_dirs, Disk, DiskFile};

const HEADER: usize = 16;

struct SegmentFile {
    first_seq: u64,
    path: PathBuf,
}

/// A replayed record.
pub struct Replayed {
    pub seq: u64,
    pub payload: Vec<u8>,
}

pub struct Wal {
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    segment_bytes: u64,
    /// Closed files, oldest first, with the first seq each holds.
    closed: Vec<SegmentFile>,
    current: SegmentFile,
    file: io::BufWriter<Box<dyn DiskFile>>,
    current_len: u64,
    next_seq: u64,
    remover: Remover,
}

/// Deletes covered files on a thread of its own. Unlinking a 64 MiB log file (dropping its
/// cached pages and, on a `discard` mount, trimming its blocks) took 20–35 ms; on the WAL
/// thread every acknowledgement waiting for the next group commit waited for it too.
struct Remover {
    tx: Option<Sender<Vec<PathBuf>>>,
    thread: Option<JoinHandle<()>>,
}

impl Remover {
    fn start(disk: &Arc<dyn Disk>, dir: &Path) -> Remover {
        let (tx, rx) = crossbeam_channel::unbounded::<Vec<PathBuf>>();
        let dir = dir.to_path_buf();
        let disk = Arc::clone(disk);
        let spawned = std::thread::Builder::new()
            .name("corvid-wal-gc".into())
            .spawn(move || {
                for paths in rx {
                    remove_files(disk.as_ref(), &dir, &paths);
                }
            });
        match spawned {
            Ok(thread) => Remover {
                tx: Some(tx),
                thread: Some(thread),
            },
            Err(err) => {
                tracing::warn!(error = %err, "no WAL remover thread; covered files are deleted inline");
                Remover {
                    tx: None,
                    thread: None,
                }
            }
        }
    }

    fn remove(&self, disk: &dyn Disk, dir: &Path, paths: Vec<PathBuf>) {
        let unsent = match &self.tx {
            Some(tx) => tx.send(paths).err().map(|e| e.into_inner()),
            None => Some(paths),
        };
        if let Some(paths) = unsent {
            remove_files(disk, dir, &paths);
        }
    }
}

impl Drop for Remover {
    /// Finishes the deletions already handed over, so a closed log's directory is settled.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The log files a backup copies, oldest first (a file being deleted is covered by the
/// checkpoints and left out). The newest may still grow while it is copied: replay ends at
/// the first torn record, so a copy holds every record written before the copy began.
pub fn backup_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let first = name
            .strip_prefix("wal-")
            .and_then(|rest| rest.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(first) = first {
            files.push((first, PathBuf::from(name)));
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, name)| name).collect())
}

/// Extension a covered file gets while it is being deleted; [`Wal::open`] finishes the job.
const DELETING: &str = "deleting";

/// Bytes freed per step while a covered file is deleted.
const DELETE_STEP: u64 = 4 << 20;

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
    let mut len = fs::metadata(path)?.len();
    let mut file = disk.open_existing(path)?;
    while len > DELETE_STEP {
        len -= DELETE_STEP;
        file.set_len(len)?;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    drop(file);
    disk.remove_file(path)
}

impl Wal {
    /// Opens the log in `dir` on the real disk, returning every intact record for replay.
    #[cfg(test)]
    pub fn open(dir: &Path, segment_bytes: u64) -> io::Result<(Wal, Vec<Replayed>)> {
        Wal::open_on(corvid_kernel::disk::real(), dir, segment_bytes)
    }

    /// Opens the log in `dir`, writing through `disk`.
    pub fn open_on(
        disk: Arc<dyn Disk>,
        dir: &Path,
        segment_bytes: u64,
    ) -> io::Result<(Wal, Vec<Replayed>)> {
        create_dirs(disk.as_ref(), dir)?;
        let mut files: Vec<SegmentFile> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let seq = name
                    .strip_prefix("wal-")?
                    .strip_suffix(".log")?
                    .parse()
                    .ok()?;
                Some(SegmentFile {
                    first_seq: seq,
                    path: e.path(),
                })
            })
            .collect();
        files.sort_by_key(|f| f.first_seq);
        // Deletions a crash interrupted: these files were covered and already renamed away.
        for entry in fs::read_dir(dir)?.filter_map(|e| e.ok()) {
            if entry.path().extension().is_some_and(|e| e == DELETING) {
                if let Err(err) = disk.remove_file(&entry.path()) {
                    tracing::warn!(error = %err, path = %entry.path().display(), "could not delete a covered WAL file");
                }
            }
        }
        let mut replayed = Vec::new();
        let mut next_seq = 1;
        let count = files.len();
        for (i, file) in files.iter().enumerate() {
            let (records, valid_len) = read_records(&file.path)?;
            if let Some(last) = records.last() {
                next_seq = next_seq.max(last.seq + 1);
            }
            next_seq = next_seq.max(file.first_seq);
            let file_len = fs::metadata(&file.path)?.len();
            if valid_len < file_len {
                if i + 1 == count {
                    tracing::warn!(path = %file.path.display(), valid_len, file_len, "truncating torn WAL tail");
                    let mut f = disk.open_existing(&file.path)?;
                    f.set_len(valid_len)?;
                    f.sync_all()?;
                } else {
                    tracing::error!(path = %file.path.display(), valid_len, "corrupt record inside an older WAL file; later records of that file are skipped");
                }
            }
            replayed.extend(records);
        }
        // Always start a fresh file: appending after a truncated tail is safe too, but a new
        // file keeps "one writer session per file" simple to reason about.
        let current = SegmentFile {
            first_seq: next_seq,
            path: dir.join(format!("wal-{next_seq:020}.log")),
        };
        let file = disk.append(&current.path)?;
        disk.sync_dir(dir)?;
        let closed = files
            .into_iter()
            .filter(|f| f.path != current.path)
            .collect();
        Ok((
            Wal {
                dir: dir.to_path_buf(),
                remover: Remover::start(&disk, dir),
                disk,
                segment_bytes,
                closed,
                current,
                file: io::BufWriter::with_capacity(1 << 20, file),
                current_len: 0,
                next_seq,
            },
            replayed,
        ))
    }

    /// Appends a record (buffered; call [`Wal::sync`] to make it durable). Returns its seq.
    pub fn append(&mut self, payload: &[u8]) -> io::Result<u64> {
        if self.current_len >= self.segment_bytes {
            self.roll()?;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let len = u32::try_from(payload.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "WAL record too large"))?;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&seq.to_le_bytes());
        hasher.update(payload);
        self.file.write_all(&len.to_le_bytes())?;
        self.file.write_all(&hasher.finalize().to_le_bytes())?;
        self.file.write_all(&seq.to_le_bytes())?;
        self.file.write_all(payload)?;
        self.current_len += (HEADER + payload.len()) as u64;
        Ok(seq)
    }

    /// Writes buffered records to the OS; with `fsync`, also to stable storage.
    pub fn sync(&mut self, fsync: bool) -> io::Result<()> {
        self.file.flush()?;
        if fsync {
            self.file.get_mut().sync_data()?;
        }
        Ok(())
    }

    fn roll(&mut self) -> io::Result<()> {
        self.sync(true)?;
        let path = self.dir.join(format!("wal-{:020}.log", self.next_seq));
        let file = self.disk.append(&path)?;
        self.disk.sync_dir(&self.dir)?;
        let old = std::mem::replace(
            &mut self.current,
            SegmentFile {
                first_seq: self.next_seq,
                path,
            },
        );
        self.closed.push(old);
        self.file = io::BufWriter::with_capacity(1 << 20, file);
        self.current_len = 0;
        Ok(())
    }

    /// Forgets closed files whose records all have seq ≤ `covered` (durably in segments) and
    /// has them deleted in the background. Returns how many.
    pub fn truncate_through(&mut self, covered: u64) -> usize {
        let mut removed = Vec::new();
        while !self.closed.is_empty() {
            // A closed file's records end just before the next file's first seq.
            let next_first = self
                .closed
                .get(1)
                .map_or(self.current.first_seq, |f| f.first_seq);
            if next_first.saturating_sub(1) > covered {
                break;
            }
            removed.push(self.closed.remove(0).path);
        }
        let count = removed.len();
        if count > 0 {
            self.remover.remove(self.disk.as_ref(), &self.dir, removed);
        }
        count
    }

    /// Rolls to a new file when the current one holds only covered records, so it can go too.
    pub fn roll_if_covered(&mut self, covered: u64) -> io::Result<()> {
        if self.current_len > 0 && self.next_seq.saturating_sub(1) <= covered {
            self.roll()?;
        }
        Ok(())
    }

    #[cfg(test)]
    pub fn file_count(&self) -> usize {
        self.closed.len() + 1
    }
}

/// Reads intact records; returns them and the byte length they span.
fn read_records(path: &Path) -> io::Result<(Vec<Replayed>, u64)> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut offset = 0u64;
    loop {
        let mut header = [0u8; HEADER];
        match read_full(&mut reader, &mut header)? {
            0 => break,
            n if n < HEADER => break,
            _ => {}
        }
        let field = |at: usize, width: usize| header.get(at..at + width).unwrap_or_default();
        let len = u32::from_le_bytes(field(0, 4).try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(field(4, 4).try_into().unwrap_or_default());
        let seq = u64::from_le_bytes(field(8, 8).try_into().unwrap_or_default());
        // The length is the file's word, not ours: one longer than what is left of the file
        // is a torn record, ended here before anything is allocated for it.
        let left = file_len.saturating_sub(offset + HEADER as u64);
        if u64::from(len) > left {
            break;
        }
        let len = len as usize;
        let mut payload = vec![0u8; len];
        if read_full(&mut reader, &mut payload)? < len {
            break;
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&seq.to_le_bytes());
        hasher.update(&payload);
        if hasher.finalize() != crc {
            break;
        }
        offset += (HEADER + len) as u64;
        records.push(Replayed { seq, payload });
    }
    let _ = reader.seek(SeekFrom::Start(offset));
    Ok((records, offset))
}

fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut read = 0;
    while read < buf.len() {
        match reader.read(&mut buf[read..])? {
            0 => break,
            n => read += n,
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log file that holds records.
    /// Appends `bytes` to the log file that holds records (a crash mid-write) and returns it.
    fn append_to_log(dir: &Path, bytes: &[u8]) -> PathBuf {
        let file = fs::read_dir(dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false))
            .expect("non-empty wal file");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .expect("open");
        f.write_all(bytes).expect("write");
        file
    }

    #[test]
    fn records_survive_reopen_and_torn_tails_are_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut wal, replayed) = Wal::open(dir.path(), 1 << 20).expect("open");
            assert!(replayed.is_empty());
            assert_eq!(wal.append(b"one").expect("append"), 1);
            assert_eq!(wal.append(b"two").expect("append"), 2);
            wal.sync(true).expect("sync");
        }
        // Simulate a crash mid-write: garbage after the last record.
        append_to_log(dir.path(), &[9, 0, 0, 0, 1, 2]);

        let (mut wal, replayed) = Wal::open(dir.path(), 1 << 20).expect("reopen");
        let payloads: Vec<_> = replayed.iter().map(|r| r.payload.clone()).collect();
        assert_eq!(payloads, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(wal.append(b"three").expect("append"), 3, "seq continues");
        wal.sync(true).expect("sync");
        let (_, replayed) = Wal::open(dir.path(), 1 << 20).expect("reopen");
        assert_eq!(replayed.len(), 3);
    }

    #[test]
    fn covered_files_are_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut wal, _) = Wal::open(dir.path(), 10).expect("open");
        for i in 0..5u8 {
            wal.append(&[i; 20]).expect("append");
        }
        wal.sync(true).expect("sync");
        assert_eq!(wal.file_count(), 5);
        assert_eq!(wal.truncate_through(3), 3);
        assert_eq!(wal.file_count(), 2, "files holding seq 1..=3 are gone");
        drop(wal);
        let (_, replayed) = Wal::open(dir.path(), 10).expect("reopen");
        let seqs: Vec<u64> = replayed.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![4, 5]);
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".log")), "{names:?}");
    }

    #[test]
    fn a_length_past_the_end_of_the_file_is_a_torn_record_not_an_allocation() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut wal, _) = Wal::open(dir.path(), 1 << 20).expect("open");
            wal.append(b"kept").expect("append");
            wal.sync(true).expect("sync");
        }
        // A header claiming a 4 GiB payload, with a few bytes after it.
        let mut header = Vec::new();
        header.extend_from_slice(&u32::MAX.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&2u64.to_le_bytes());
        header.extend_from_slice(b"short");
        let file = append_to_log(dir.path(), &header);
        let (records, valid) = read_records(&file).expect("read");
        assert_eq!(records.len(), 1);
        assert_eq!(valid, (HEADER + 4) as u64);
        let (_, replayed) = Wal::open(dir.path(), 1 << 20).expect("reopen");
        assert_eq!(replayed.len(), 1, "the torn tail is cut");
    }

    #[test]
    fn a_deletion_cut_short_by_a_crash_is_finished_on_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut wal, _) = Wal::open(dir.path(), 1 << 20).expect("open");
            wal.append(b"kept").expect("append");
            wal.sync(true).expect("sync");
        }
        // A covered file renamed for deletion and half shrunk when the process died.
        let half_deleted = dir.path().join("wal-00000000000000000000.deleting");
        fs::write(&half_deleted, [7u8; 40]).expect("write");
        let (_, replayed) = Wal::open(dir.path(), 1 << 20).expect("reopen");
        assert_eq!(replayed.len(), 1, "only the intact log is replayed");
        assert!(
            !half_deleted.exists(),
            "the interrupted deletion is finished"
        );
    }
}
