//! The write-ahead log: what makes an acknowledged event durable before it reaches a segment.
//!
//! Files `wal-<first seq>.log` hold records `[len u32][crc32 u32][seq u64][payload]` (little
//! endian; the CRC covers seq and payload), numbered one after another from the file's first
//! seq. Replay of a file ends at the first record that is torn, corrupt or out of sequence;
//! the tail of the newest file is truncated there. A length longer than what is left of the
//! file is a torn record too, found before anything is allocated for it. Zeros after the last
//! record are the unwritten rest of a prepared file, and records with a lower seq the rest of
//! a recycled one (see [`housekeeping`]): neither is a torn record.
//!
//! Files roll at `segment_bytes`; a file is retired (recycled as a spare or deleted) once every
//! ingest shard has flushed past its last record. An older file whose records stop before the next file's first seq has lost
//! records, and says so. Every write goes through a [`Disk`]; new files, renames and deletions
//! are made durable by syncing the directory.

mod housekeeping;

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use corvid_kernel::disk::{create_dirs, Disk, DiskFile};

use housekeeping::{Housekeeper, DELETING};

const HEADER: usize = 16;

/// How much of a file the log writes before it asks for the next one to be prepared.
const SPARE_AFTER_FRACTION: u64 = 8;

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
    /// Whether the current file is a prepared one (its syncs do not change its length).
    prepared: bool,
    next_seq: u64,
    housekeeper: Housekeeper,
}

/// The log files a backup copies, oldest first (a file being deleted is covered by the
/// checkpoints and left out). The newest may still be written while it is copied: replay
/// ends at the first torn record or at the zeros of a prepared file, so a copy holds every
/// record written before the copy began.
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
        let mut housekeeper = Housekeeper::start(&disk, dir);
        let mut replayed = Vec::new();
        let mut next_seq = 1;
        for (i, file) in files.iter().enumerate() {
            let read = read_records(&file.path, file.first_seq)?;
            let last_seq = read.records.last().map(|r| r.seq);
            next_seq = next_seq.max(file.first_seq);
            if let Some(last) = last_seq {
                next_seq = next_seq.max(last + 1);
            }
            match files.get(i + 1) {
                // A closed file holds every seq up to the next file's first.
                Some(next) => {
                    let through = last_seq.unwrap_or(file.first_seq.saturating_sub(1));
                    if through + 1 < next.first_seq {
                        tracing::error!(path = %file.path.display(), through, next_first = next.first_seq, "records missing from an older WAL file: it is corrupt after the last one replayed");
                    }
                }
                None => {
                    let file_len = fs::metadata(&file.path)?.len();
                    if read.valid_len < file_len {
                        if read.torn {
                            tracing::warn!(path = %file.path.display(), valid_len = read.valid_len, file_len, "truncating torn WAL tail");
                        }
                        let mut f = disk.open_existing(&file.path)?;
                        f.set_len(read.valid_len)?;
                        f.sync_all()?;
                    }
                }
            }
            replayed.extend(read.records);
        }
        // Always start a fresh file: appending after a truncated tail is safe too, but a new
        // file keeps "one writer session per file" simple to reason about.
        let current = SegmentFile {
            first_seq: next_seq,
            path: dir.join(format!("wal-{next_seq:020}.log")),
        };
        let (file, prepared) = next_file(disk.as_ref(), &mut housekeeper, &current.path)?;
        disk.sync_dir(dir)?;
        let closed = files
            .into_iter()
            .filter(|f| f.path != current.path)
            .collect();
        Ok((
            Wal {
                dir: dir.to_path_buf(),
                housekeeper,
                disk,
                segment_bytes,
                closed,
                current,
                file: io::BufWriter::with_capacity(1 << 20, file),
                current_len: 0,
                prepared,
                next_seq,
            },
            replayed,
        ))
    }

    /// Appends a record (buffered; call [`Wal::sync`] to make it durable). Returns its seq.
    pub fn append(&mut self, payload: &[u8]) -> io::Result<u64> {
        if self.current_len >= self.segment_bytes
            || (!self.prepared && self.current_len > 0 && self.housekeeper.spare_ready())
        {
            // (A file that grows is left as soon as a prepared one is ready: see
            // `housekeeping`.)
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
        if self.current_len >= self.segment_bytes / SPARE_AFTER_FRACTION {
            self.housekeeper.want_spare(self.segment_bytes);
        }
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
        let (file, prepared) = next_file(self.disk.as_ref(), &mut self.housekeeper, &path)?;
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
        self.prepared = prepared;
        Ok(())
    }

    /// Forgets closed files whose records all have seq ≤ `covered` (durably in segments) and
    /// has them retired in the background (kept as spares or deleted). Returns how many.
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
            self.housekeeper.retire(removed, self.segment_bytes);
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

/// Opens the log's next file at `path`: the prepared spare when one is ready (written over
/// from its start), else a new file that grows. Returns it and whether it was prepared.
fn next_file(
    disk: &dyn Disk,
    housekeeper: &mut Housekeeper,
    path: &Path,
) -> io::Result<(Box<dyn DiskFile>, bool)> {
    if housekeeper.take_spare(path)? {
        return Ok((disk.open_existing(path)?, true));
    }
    Ok((disk.append(path)?, false))
}

/// What one file holds.
struct FileRecords {
    records: Vec<Replayed>,
    /// Bytes the records span from the file's start.
    valid_len: u64,
    /// Whether the records end at something other than the end of the file, the zeros of a
    /// prepared file's unwritten rest or a recycled file's older records: a torn or corrupt
    /// record.
    torn: bool,
}

/// Reads the intact records of the file whose first seq is `first_seq`.
fn read_records(path: &Path, first_seq: u64) -> io::Result<FileRecords> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut offset = 0u64;
    let mut torn = false;
    loop {
        let mut header = [0u8; HEADER];
        let got = read_full(&mut reader, &mut header)?;
        if got == 0 {
            break;
        }
        if header.iter().all(|b| *b == 0) {
            break;
        }
        torn = true;
        if got < HEADER {
            break;
        }
        let field = |at: usize, width: usize| header.get(at..at + width).unwrap_or_default();
        let len = u32::from_le_bytes(field(0, 4).try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(field(4, 4).try_into().unwrap_or_default());
        let seq = u64::from_le_bytes(field(8, 8).try_into().unwrap_or_default());
        if seq != first_seq + records.len() as u64 {
            // Not this file's next record: what follows is from an earlier use of the file's
            // bytes (a recycled file; see `housekeeping`), not a torn write of this one.
            torn = false;
            break;
        }
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
        torn = false;
        offset += (HEADER + len) as u64;
        records.push(Replayed { seq, payload });
    }
    Ok(FileRecords {
        records,
        valid_len: offset,
        torn,
    })
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
    use super::housekeeping::{MAX_SPARES, SPARES};
    use super::*;

    /// Waits (up to 10 s) for the housekeeper to have a spare ready.
    fn wait_for_spare(wal: &Wal) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !wal.housekeeper.spare_ready() {
            assert!(std::time::Instant::now() < deadline, "no spare prepared");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Appends `bytes` to the log file that holds records (a crash mid-write) and returns it.
    fn append_to_log(dir: &Path, bytes: &[u8]) -> PathBuf {
        let file = fs::read_dir(dir)
            .expect("dir")
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
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
    fn covered_files_are_retired() {
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
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let spares = names
            .iter()
            .filter(|n| SPARES.contains(&n.as_str()))
            .count();
        // The three covered files, and the zeros asked for before any was covered.
        assert!(
            (3..=MAX_SPARES).contains(&spares),
            "the covered files kept as spares: {names:?}"
        );
        assert!(
            names
                .iter()
                .all(|n| n.ends_with(".log") || SPARES.contains(&n.as_str())),
            "{names:?}"
        );
        let (_, replayed) = Wal::open(dir.path(), 10).expect("reopen");
        let seqs: Vec<u64> = replayed.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![4, 5]);
    }

    #[test]
    fn a_recycled_file_is_written_over_and_its_old_records_never_replay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let segment = 256u64;
        let old_payload = [7u8; 300];
        let current = {
            let (mut wal, _) = Wal::open(dir.path(), segment).expect("open");
            // Two full files of old records, then a third file.
            for _ in 0..3 {
                wal.append(&old_payload).expect("append");
            }
            wal.sync(true).expect("sync");
            assert_eq!(wal.truncate_through(2), 2, "the two full files are covered");
            // Retired in order after any zeros asked for meanwhile: the last spare made, the
            // one a roll takes, is a recycled file.
            let retired = |seq: u64| !dir.path().join(format!("wal-{seq:020}.log")).exists();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !(retired(1) && retired(2)) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "covered files not retired"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            // The current file is full: the next record rolls to a recycled file.
            assert_eq!(wal.append(b"new-4").expect("append"), 4);
            assert!(wal.prepared, "rolled to a recycled file");
            wal.append(b"new-5").expect("append");
            wal.sync(true).expect("sync");
            let path = wal.current.path.clone();
            let bytes = fs::read(&path).expect("read");
            assert!(bytes.len() as u64 >= segment, "written over, not shortened");
            let new_len = 2 * HEADER + 10;
            assert!(
                bytes[new_len..].iter().any(|b| *b != 0),
                "the file still holds an earlier use's records past the new ones"
            );
            let read = read_records(&path, 4).expect("read");
            assert_eq!(read.records.len(), 2);
            assert_eq!(read.valid_len, new_len as u64);
            assert!(
                !read.torn,
                "older records after the new ones are no torn record"
            );
            path
        };
        let (mut wal, replayed) = Wal::open(dir.path(), segment).expect("reopen");
        let replayed: Vec<(u64, Vec<u8>)> =
            replayed.into_iter().map(|r| (r.seq, r.payload)).collect();
        assert_eq!(
            replayed,
            vec![
                (3, old_payload.to_vec()),
                (4, b"new-4".to_vec()),
                (5, b"new-5".to_vec())
            ]
        );
        assert_eq!(
            fs::metadata(&current).expect("current").len(),
            (2 * HEADER + 10) as u64,
            "the newest file is cut after its records on open"
        );
        assert_eq!(wal.append(b"six").expect("append"), 6, "seq continues");
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
        let read = read_records(&file, 1).expect("read");
        assert_eq!(read.records.len(), 1);
        assert_eq!(read.valid_len, (HEADER + 4) as u64);
        assert!(read.torn);
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

    #[test]
    fn the_log_rolls_to_a_prepared_file_and_writes_over_its_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let segment = 4096u64;
        {
            let (mut wal, _) = Wal::open(dir.path(), segment).expect("open");
            // An eighth of a file written asks for a spare; a growing file is left for it.
            wal.append(&[1; 600]).expect("append");
            wal.append(&[2; 10]).expect("append");
            wait_for_spare(&wal);
            assert!(dir.path().join(SPARES[0]).is_file());
            assert_eq!(wal.append(&[3; 10]).expect("append"), 3);
            assert!(wal.prepared, "rolled to the prepared file");
            assert!(!dir.path().join(SPARES[0]).exists(), "the spare was taken");
            wal.append(&[4; 10]).expect("append");
            wal.sync(true).expect("sync");
            let current = fs::metadata(&wal.current.path).expect("current");
            assert_eq!(current.len(), segment, "written over, its length kept");
            let read = read_records(&wal.current.path, 3).expect("read");
            assert_eq!(read.records.len(), 2);
            assert!(!read.torn, "zeros after the records are no torn record");
        }
        let (mut wal, replayed) = Wal::open(dir.path(), segment).expect("reopen");
        let seqs: Vec<u64> = replayed.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4]);
        assert_eq!(replayed[3].payload, vec![4; 10]);
        assert_eq!(wal.append(b"five").expect("append"), 5, "seq continues");
        wal.sync(true).expect("sync");
        drop(wal);
        let (_, replayed) = Wal::open(dir.path(), segment).expect("reopen again");
        assert_eq!(replayed.len(), 5);
    }

    #[test]
    fn a_record_out_of_sequence_ends_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = {
            let (mut wal, _) = Wal::open(dir.path(), 1 << 20).expect("open");
            wal.append(b"one").expect("append");
            wal.append(b"two").expect("append");
            wal.sync(true).expect("sync");
            wal.current.path.clone()
        };
        // A well-formed record whose seq does not follow (left over from an earlier use of
        // the file's bytes, say).
        let mut stale = Vec::new();
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&9u64.to_le_bytes());
        hasher.update(b"old");
        stale.extend_from_slice(&3u32.to_le_bytes());
        stale.extend_from_slice(&hasher.finalize().to_le_bytes());
        stale.extend_from_slice(&9u64.to_le_bytes());
        stale.extend_from_slice(b"old");
        fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open")
            .write_all(&stale)
            .expect("write");
        let read = read_records(&path, 1).expect("read");
        assert_eq!(read.records.len(), 2);
        assert!(
            !read.torn,
            "an older record ends the file, as in a recycled one"
        );
        let (_, replayed) = Wal::open(dir.path(), 1 << 20).expect("reopen");
        let payloads: Vec<&[u8]> = replayed.iter().map(|r| r.payload.as_slice()).collect();
        assert_eq!(payloads, vec![&b"one"[..], &b"two"[..]]);
    }
}
