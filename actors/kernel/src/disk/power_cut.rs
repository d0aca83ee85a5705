//! A [`Disk`] that writes to the real file system and also models what a power cut would
//! leave of it: only file bytes that were synced, and only directory entries (files created,
//! renamed, removed; new directories) whose directory was synced. After every sync it records
//! the durable state ([`Snapshot`]); a test writes any of them out ([`Snapshot::write_to`]) and
//! checks that a server started on it lost nothing it acknowledged.
//!
//! The model is the strictest reading of POSIX: a fsynced file whose directory was never
//! synced is lost, a rename is lost until its directory is synced, and unsynced bytes are gone.
//! Only paths under `root` are modelled; `root` itself is taken as durable.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Disk, DiskFile, RealDisk};

type Inode = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    File(Inode),
    Dir(Inode),
}

/// What survives a power cut at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Operations done through the disk before this state (see [`PowerCutDisk::ops`]).
    pub after_ops: u64,
    entries: HashMap<Inode, BTreeMap<OsString, Node>>,
    contents: HashMap<Inode, Vec<u8>>,
}

impl Snapshot {
    /// Writes the surviving directories and files under `dir` (which stands for the root).
    pub fn write_to(&self, dir: &Path) -> io::Result<()> {
        self.write_dir(ROOT, dir)
    }

    fn write_dir(&self, inode: Inode, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, node) in self.entries.get(&inode).into_iter().flatten() {
            let path = dir.join(name);
            match node {
                Node::Dir(child) => self.write_dir(*child, &path)?,
                Node::File(file) => std::fs::write(
                    &path,
                    self.contents
                        .get(file)
                        .map(Vec::as_slice)
                        .unwrap_or_default(),
                )?,
            }
        }
        Ok(())
    }

    /// The surviving file paths, relative to the root (for messages).
    pub fn files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        self.collect(ROOT, PathBuf::new(), &mut out);
        out.sort();
        out
    }

    fn collect(&self, inode: Inode, at: PathBuf, out: &mut Vec<PathBuf>) {
        for (name, node) in self.entries.get(&inode).into_iter().flatten() {
            match node {
                Node::Dir(child) => self.collect(*child, at.join(name), out),
                Node::File(_) => out.push(at.join(name)),
            }
        }
    }
}

const ROOT: Inode = 0;

#[derive(Debug, Default)]
struct Model {
    next: Inode,
    ops: u64,
    /// What the running process sees.
    entries: HashMap<Inode, BTreeMap<OsString, Node>>,
    contents: HashMap<Inode, Vec<u8>>,
    /// What a power cut now would leave.
    durable: Snapshot,
    snapshots: Vec<Snapshot>,
}

impl Model {
    fn new() -> Model {
        let mut model = Model {
            next: ROOT + 1,
            ..Model::default()
        };
        model.entries.insert(ROOT, BTreeMap::new());
        model.durable.entries.insert(ROOT, BTreeMap::new());
        model
    }

    fn fresh(&mut self) -> Inode {
        let inode = self.next;
        self.next += 1;
        inode
    }

    /// The directory inode of a path's parent and the path's name in it.
    fn locate(&self, root: &Path, path: &Path) -> Option<(Inode, OsString)> {
        let relative = path.strip_prefix(root).ok()?;
        let mut components: Vec<OsString> = relative
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(name.to_os_string()),
                _ => None,
            })
            .collect();
        let name = components.pop()?;
        let mut dir = ROOT;
        for part in components {
            match self.entries.get(&dir)?.get(&part)? {
                Node::Dir(child) => dir = *child,
                Node::File(_) => return None,
            }
        }
        Some((dir, name))
    }

    fn lookup(&self, root: &Path, path: &Path) -> Option<Node> {
        if path == root {
            return Some(Node::Dir(ROOT));
        }
        let (dir, name) = self.locate(root, path)?;
        self.entries.get(&dir)?.get(&name).copied()
    }

    fn record(&mut self) {
        let mut snapshot = self.durable.clone();
        snapshot.after_ops = self.ops;
        self.snapshots.push(snapshot);
    }
}

/// The real disk, plus the model of what a power cut would keep (see the module docs).
#[derive(Debug, Clone)]
pub struct PowerCutDisk {
    root: PathBuf,
    model: Arc<Mutex<Model>>,
}

impl PowerCutDisk {
    /// A disk modelling everything under `root` (an existing directory, taken as durable).
    pub fn new(root: &Path) -> PowerCutDisk {
        PowerCutDisk {
            root: root.to_path_buf(),
            model: Arc::new(Mutex::new(Model::new())),
        }
    }

    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Operations done so far: an event acknowledged when this was `n` is durable in every
    /// snapshot taken after `n - 1` operations.
    pub fn ops(&self) -> u64 {
        self.model().ops
    }

    /// The durable state after every sync so far, oldest first.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        self.model().snapshots.clone()
    }

    fn open(&self, path: &Path, truncate: bool, create: bool) -> io::Result<Option<Inode>> {
        let mut m = self.model();
        m.ops += 1;
        let Some((dir, name)) = m.locate(&self.root, path) else {
            return Ok(None);
        };
        let existing = m.entries.get(&dir).and_then(|e| e.get(&name)).copied();
        let inode = match existing {
            Some(Node::File(inode)) => {
                if truncate {
                    m.contents.insert(inode, Vec::new());
                }
                inode
            }
            Some(Node::Dir(_)) => return Err(io::Error::other("is a directory")),
            None if create => {
                let inode = m.fresh();
                m.contents.insert(inode, Vec::new());
                m.entries
                    .entry(dir)
                    .or_default()
                    .insert(name, Node::File(inode));
                inode
            }
            None => return Err(io::ErrorKind::NotFound.into()),
        };
        Ok(Some(inode))
    }

    fn file(
        &self,
        real: Box<dyn DiskFile>,
        inode: Option<Inode>,
        position: Option<usize>,
    ) -> Box<dyn DiskFile> {
        Box::new(ModelFile {
            real,
            inode,
            position,
            model: Arc::clone(&self.model),
        })
    }
}

impl Disk for PowerCutDisk {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        let existed = dir.is_dir();
        RealDisk.create_dir(dir)?;
        let mut m = self.model();
        m.ops += 1;
        if m.lookup(&self.root, dir).is_some() {
            return Ok(());
        }
        if let Some((parent, name)) = m.locate(&self.root, dir) {
            let inode = m.fresh();
            m.entries.insert(inode, BTreeMap::new());
            m.durable.entries.insert(inode, BTreeMap::new());
            m.entries
                .entry(parent)
                .or_default()
                .insert(name.clone(), Node::Dir(inode));
            if existed {
                // Made before (or beside) the model: taken as durable, like the root.
                m.durable
                    .entries
                    .entry(parent)
                    .or_default()
                    .insert(name, Node::Dir(inode));
            }
        }
        Ok(())
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let real = RealDisk.create(path)?;
        let inode = self.open(path, true, true)?;
        Ok(self.file(real, inode, Some(0)))
    }

    fn append(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let real = RealDisk.append(path)?;
        let inode = self.open(path, false, true)?;
        Ok(self.file(real, inode, None))
    }

    fn open_existing(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let real = RealDisk.open_existing(path)?;
        let inode = self.open(path, false, false)?;
        Ok(self.file(real, inode, Some(0)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealDisk.rename(from, to)?;
        let mut m = self.model();
        m.ops += 1;
        let (Some((from_dir, from_name)), Some((to_dir, to_name))) =
            (m.locate(&self.root, from), m.locate(&self.root, to))
        else {
            return Ok(());
        };
        let moved = m
            .entries
            .get_mut(&from_dir)
            .and_then(|e| e.remove(&from_name));
        if let Some(node) = moved {
            m.entries.entry(to_dir).or_default().insert(to_name, node);
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealDisk.remove_file(path)?;
        let mut m = self.model();
        m.ops += 1;
        if let Some((dir, name)) = m.locate(&self.root, path) {
            if let Some(entries) = m.entries.get_mut(&dir) {
                entries.remove(&name);
            }
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        RealDisk.sync_dir(dir)?;
        let mut m = self.model();
        m.ops += 1;
        if let Some(Node::Dir(inode)) = m.lookup(&self.root, dir) {
            let now = m.entries.get(&inode).cloned().unwrap_or_default();
            m.durable.entries.insert(inode, now);
            m.record();
        }
        Ok(())
    }
}

/// A file written through a [`PowerCutDisk`]: its writes go to the real file and the model.
struct ModelFile {
    real: Box<dyn DiskFile>,
    inode: Option<Inode>,
    /// Where the next write lands; `None` for a file opened to append (always at its end).
    position: Option<usize>,
    model: Arc<Mutex<Model>>,
}

impl ModelFile {
    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sync(&mut self) {
        let Some(inode) = self.inode else { return };
        let mut m = self.model();
        m.ops += 1;
        let now = m.contents.get(&inode).cloned().unwrap_or_default();
        m.durable.contents.insert(inode, now);
        m.record();
    }
}

impl Write for ModelFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.real.write(buf)?;
        let written = buf.get(..n).unwrap_or_default();
        if let Some(inode) = self.inode {
            let position = self.position;
            let mut m = self.model();
            m.ops += 1;
            let contents = m.contents.entry(inode).or_default();
            match position {
                None => contents.extend_from_slice(written),
                Some(at) => {
                    let end = at + n;
                    if contents.len() < end {
                        contents.resize(end, 0);
                    }
                    if let Some(range) = contents.get_mut(at..end) {
                        range.copy_from_slice(written);
                    }
                }
            }
        }
        if let Some(at) = &mut self.position {
            *at += n;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.real.flush()
    }
}

impl DiskFile for ModelFile {
    fn sync_data(&mut self) -> io::Result<()> {
        self.real.sync_data()?;
        self.sync();
        Ok(())
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.real.sync_all()?;
        self.sync();
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.real.set_len(len)?;
        if let Some(inode) = self.inode {
            let mut m = self.model();
            m.ops += 1;
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            m.contents.entry(inode).or_default().resize(len, 0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{create_dirs, replace_file};
    use super::*;

    fn read_back(snapshot: &Snapshot) -> (tempfile::TempDir, Vec<PathBuf>) {
        let out = tempfile::tempdir().expect("tempdir");
        snapshot.write_to(out.path()).expect("write");
        let files = snapshot.files();
        (out, files)
    }

    #[test]
    fn only_what_was_synced_survives() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = PowerCutDisk::new(dir.path());
        let day = dir.path().join("events/day");
        // A directory made without syncing its parent is lost with everything in it.
        disk.create_dir(&dir.path().join("events")).expect("dir");
        disk.create_dir(&day).expect("dir");
        let mut f = disk.create(&day.join("seg.tmp")).expect("file");
        f.write_all(b"rows").expect("write");
        f.sync_all().expect("sync");
        let last = disk.snapshots().pop().expect("a snapshot per sync");
        assert!(last.files().is_empty(), "{:?}", last.files());

        // Synced directories all the way up: the file survives, with its synced bytes only.
        disk.sync_dir(dir.path()).expect("root");
        disk.sync_dir(&dir.path().join("events")).expect("events");
        disk.sync_dir(&day).expect("day");
        f.write_all(b" and more").expect("unsynced");
        let (out, files) = read_back(&disk.snapshots().pop().expect("snapshot"));
        assert_eq!(files, vec![PathBuf::from("events/day/seg.tmp")]);
        assert_eq!(
            std::fs::read(out.path().join("events/day/seg.tmp")).expect("read"),
            b"rows"
        );

        // A rename is lost until its directory is synced.
        disk.rename(&day.join("seg.tmp"), &day.join("seg"))
            .expect("rename");
        f.sync_all().expect("sync bytes");
        let (_, files) = read_back(&disk.snapshots().pop().expect("snapshot"));
        assert_eq!(files, vec![PathBuf::from("events/day/seg.tmp")]);
        disk.sync_dir(&day).expect("sync dir");
        let (out, files) = read_back(&disk.snapshots().pop().expect("snapshot"));
        assert_eq!(files, vec![PathBuf::from("events/day/seg")]);
        assert_eq!(
            std::fs::read(out.path().join("events/day/seg")).expect("read"),
            b"rows and more"
        );
    }

    #[test]
    fn the_durable_helpers_leave_nothing_to_chance() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = PowerCutDisk::new(dir.path());
        let file = dir.path().join("a/b/checkpoint");
        replace_file(&disk, &file, b"42").expect("replace");
        create_dirs(&disk, &dir.path().join("a/c")).expect("dirs");
        let (out, files) = read_back(&disk.snapshots().pop().expect("snapshot"));
        assert_eq!(files, vec![PathBuf::from("a/b/checkpoint")]);
        assert_eq!(
            std::fs::read(out.path().join("a/b/checkpoint")).expect("read"),
            b"42"
        );
        assert!(out.path().join("a/c").is_dir());
    }

    #[test]
    fn a_file_opened_to_overwrite_is_written_from_its_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = PowerCutDisk::new(dir.path());
        let path = dir.path().join("log");
        let mut f = disk.create(&path).expect("file");
        f.write_all(&[0; 8]).expect("zeros");
        f.sync_all().expect("sync");
        disk.sync_dir(dir.path()).expect("sync dir");
        drop(f);
        let mut f = disk.open_existing(&path).expect("open");
        f.write_all(b"abc").expect("write");
        f.write_all(b"de").expect("write");
        f.sync_data().expect("sync");
        let (out, _) = read_back(&disk.snapshots().pop().expect("snapshot"));
        assert_eq!(
            std::fs::read(out.path().join("log")).expect("read"),
            b"abcde\0\0\0",
            "written over the zeros, its length kept"
        );
        assert_eq!(std::fs::read(&path).expect("real file"), b"abcde\0\0\0");
        let mut f = disk.append(&path).expect("append");
        f.write_all(b"!").expect("write");
        f.sync_data().expect("sync");
        let (out, _) = read_back(&disk.snapshots().pop().expect("snapshot"));
        assert_eq!(
            std::fs::read(out.path().join("log")).expect("read"),
            b"abcde\0\0\0!"
        );
    }
}
