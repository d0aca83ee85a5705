//! The file operations whose durability the event store depends on (the WAL, staged segment
//! files, checkpoints), behind one trait, so that a test can model what a power cut keeps
//! ([`power_cut`]) while everything else runs on the real file system ([`RealDisk`]).
//!
//! Durability rules the callers follow (and the model enforces): a file's bytes survive a power
//! cut only once the file is synced; a new, renamed or removed directory entry only once its
//! directory is synced ([`Disk::sync_dir`]); a new directory only once its parent is. Reads go
//! straight to `std::fs`: they see what was written, synced or not.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

#[cfg(any(test, feature = "test-support"))]
pub mod power_cut;

/// A file open for writing through a [`Disk`].
pub trait DiskFile: Write + Send {
    /// Makes the file's bytes durable (not its directory entry).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Makes the file's bytes and metadata durable (not its directory entry).
    fn sync_all(&mut self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (durable once synced).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

/// Where durable files are written. Paths are absolute or relative to the process.
pub trait Disk: Send + Sync + fmt::Debug {
    /// Creates `dir` (its parent must exist). Durable once the parent is synced.
    fn create_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates or truncates `path` for writing.
    fn create(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// Opens `path` for appending, creating it when missing.
    fn append(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// Opens an existing `path` for writing without truncating it (to cut or sync it).
    fn open_existing(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Makes `dir`'s entries (created, renamed, removed) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

/// The real file system, shared.
pub fn real() -> Arc<dyn Disk> {
    Arc::new(RealDisk)
}

struct RealFile(File);

impl Write for RealFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl DiskFile for RealFile {
    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn sync_all(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Disk for RealDisk {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        match fs::create_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
            other => other,
        }
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(RealFile(File::create(path)?)))
    }

    fn append(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn open_existing(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(RealFile(
            OpenOptions::new().write(true).open(path)?,
        )))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Creates `dir` and any missing ancestors durably: each new directory's parent is synced
/// after it is created, so the whole chain survives a power cut.
pub fn create_dirs(disk: &dyn Disk, dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor.filter(|p| !p.as_os_str().is_empty() && !p.is_dir()) {
        missing.push(path);
        cursor = path.parent();
    }
    for path in missing.into_iter().rev() {
        disk.create_dir(path)?;
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        disk.sync_dir(parent.unwrap_or(Path::new(".")))?;
    }
    Ok(())
}

/// Durably replaces a small file: a temporary file written and synced, renamed over `path`,
/// and the directory synced.
pub fn replace_file(disk: &dyn Disk, path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    create_dirs(disk, dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut file = disk.create(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    disk.rename(&tmp, path)?;
    disk.sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_and_files_are_created_on_the_real_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let deep = dir.path().join("a/b/c");
        create_dirs(&RealDisk, &deep).expect("dirs");
        assert!(deep.is_dir());
        create_dirs(&RealDisk, &deep).expect("again");
        replace_file(&RealDisk, &deep.join("f"), b"one").expect("write");
        replace_file(&RealDisk, &deep.join("f"), b"two").expect("replace");
        assert_eq!(fs::read(deep.join("f")).expect("read"), b"two");
    }
}
