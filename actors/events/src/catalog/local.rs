//! The embedded segment catalog: the local events directory is the catalog.
//!
//! Layout under the root (`<data_dir>/events`): committed segments at their key
//! (`project=<id>/day=<date>/<name>.parquet`); a flush's staged files beside them as
//! `….parquet.tmp`; a compaction's staged version as `….parquet.compacting`; each shard's
//! checkpoint in `_checkpoints/shard-<n>` (a decimal sequence number). A staged flush file is
//! committed once its shard's checkpoint covers its range: recording a flush is writing the
//! checkpoint durably, publishing it is renaming its files, and recovery renames whatever a
//! crash left staged but recorded.
//!
//! Durable to power loss: new `project=`/`day=` directories are created with their parents
//! synced, staged files are synced by their writer, and recording a flush syncs the
//! directories holding its staged files before the checkpoint that names them is written.
//! Every write goes through the catalog's [`Disk`].

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use chrono::NaiveDate;

use super::{current_within, DayDrop, Flush, SegmentCatalog, SegmentName, SegmentRef};
use corvid_kernel::disk::{create_dirs, replace_file, Disk};

const STAGED: &str = ".tmp";
const COMPACTING: &str = ".compacting";

/// The files of an events directory a backup copies, relative to it, in the order to copy
/// them: the shards' checkpoints first (a segment copied later is at least as new as what
/// they cover), then every segment and staged flush file (recovery publishes the staged
/// files a checkpoint names) and the retention records. A compaction's half-written staged
/// version is left out: the versions it replaces are still there.
pub fn backup_files(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let path = entry.path();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if kind.is_file() && !path.to_string_lossy().ends_with(COMPACTING) {
                if let Ok(relative) = path.strip_prefix(root) {
                    out.push(relative.to_path_buf());
                }
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(root, root, &mut files)?;
    files.sort_by_key(|p| (!p.starts_with("_checkpoints"), p.clone()));
    Ok(files)
}

/// The events directory as a catalog.
pub struct DirCatalog {
    root: PathBuf,
    disk: Arc<dyn Disk>,
    /// Retention drops read or written so far, per project (this process is the only writer).
    drops: std::sync::Mutex<std::collections::HashMap<u64, Vec<DayDrop>>>,
}

impl DirCatalog {
    /// The catalog under `root`, created when missing, on the real disk.
    pub fn open(root: PathBuf) -> std::io::Result<DirCatalog> {
        DirCatalog::open_on(root, corvid_kernel::disk::real())
    }

    /// The catalog under `root`, writing through `disk`.
    pub fn open_on(root: PathBuf, disk: Arc<dyn Disk>) -> std::io::Result<DirCatalog> {
        create_dirs(disk.as_ref(), &root)?;
        Ok(DirCatalog {
            root,
            disk,
            drops: Default::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, segment: &SegmentRef) -> PathBuf {
        self.root.join(segment.key())
    }

    fn with_suffix(path: PathBuf, suffix: &str) -> PathBuf {
        let mut text = path.into_os_string();
        text.push(suffix);
        PathBuf::from(text)
    }

    fn checkpoint_dir(&self) -> PathBuf {
        self.root.join("_checkpoints")
    }

    /// A project's retention drops as stored.
    fn read_drops(&self, project: u64) -> std::io::Result<Vec<DayDrop>> {
        let text = match fs::read_to_string(self.drops_path(project)) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
            .collect()
    }

    /// Retention drops of a project: one JSON line each.
    fn drops_path(&self, project: u64) -> PathBuf {
        self.root
            .join("_retention")
            .join(format!("project-{project}.jsonl"))
    }

    fn checkpoint_path(&self, shard: usize) -> PathBuf {
        self.checkpoint_dir().join(format!("shard-{shard}"))
    }

    /// Every file under a project directory, with the day it belongs to.
    fn files_of(&self, project: u64) -> std::io::Result<Vec<(NaiveDate, PathBuf)>> {
        let dir = self.root.join(format!("project={project}"));
        let Ok(days) = fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for day in days.filter_map(Result::ok) {
            let name = day.file_name().to_string_lossy().into_owned();
            let Some(date) = name
                .strip_prefix("day=")
                .and_then(|d| NaiveDate::parse_from_str(d, "%Y-%m-%d").ok())
            else {
                continue;
            };
            for file in fs::read_dir(day.path())?.filter_map(Result::ok) {
                out.push((date, file.path()));
            }
        }
        Ok(out)
    }

    fn all_projects(&self) -> std::io::Result<Vec<u64>> {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Ok(Vec::new());
        };
        Ok(entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .strip_prefix("project=")
                    .and_then(|p| p.parse().ok())
            })
            .collect())
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl SegmentCatalog for DirCatalog {
    fn segments(
        &self,
        project: u64,
        from: Option<NaiveDate>,
        to: Option<NaiveDate>,
    ) -> std::io::Result<Vec<SegmentRef>> {
        Ok(current_within(self.versions(project)?, from, to))
    }

    fn versions(&self, project: u64) -> std::io::Result<Vec<SegmentRef>> {
        let mut out: Vec<SegmentRef> = self
            .files_of(project)?
            .into_iter()
            .filter_map(|(day, path)| {
                let name = SegmentName::parse(&file_name(&path))?;
                Some(SegmentRef { project, day, name })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    fn projects(&self) -> std::io::Result<Vec<u64>> {
        let mut out = Vec::new();
        for project in self.all_projects()? {
            if !self.versions(project)?.is_empty() {
                out.push(project);
            }
        }
        Ok(out)
    }

    fn checkpoints(&self) -> std::io::Result<Vec<(usize, u64)>> {
        let Ok(entries) = fs::read_dir(self.checkpoint_dir()) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(shard) = name.strip_prefix("shard-").and_then(|s| s.parse().ok()) else {
                continue;
            };
            let text = fs::read_to_string(entry.path())?;
            let seq = text.trim().parse().map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("checkpoint {name} holds {text:?}, not a sequence number"),
                )
            })?;
            out.push((shard, seq));
        }
        out.sort();
        Ok(out)
    }

    fn set_checkpoint(&self, shard: usize, seq: u64) -> std::io::Result<()> {
        replace_file(
            self.disk.as_ref(),
            &self.checkpoint_path(shard),
            seq.to_string().as_bytes(),
        )
    }

    fn remove_checkpoint(&self, shard: usize) -> std::io::Result<()> {
        match self.disk.remove_file(&self.checkpoint_path(shard)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn staging_path(&self, segment: &SegmentRef) -> std::io::Result<PathBuf> {
        let path = self.path(segment);
        if let Some(dir) = path.parent() {
            create_dirs(self.disk.as_ref(), dir)?;
        }
        Ok(Self::with_suffix(path, STAGED))
    }

    fn disk(&self) -> &dyn Disk {
        self.disk.as_ref()
    }

    fn record_flush(&self, flush: &Flush) -> std::io::Result<()> {
        // The staged files were synced by their writer; their directory entries are made
        // durable here, before the checkpoint (the commit record) names them. Without this a
        // power cut after the checkpoint could lose files the WAL no longer holds.
        let dirs: BTreeSet<PathBuf> = flush
            .segments
            .iter()
            .filter_map(|s| self.path(s).parent().map(Path::to_path_buf))
            .collect();
        for dir in dirs {
            self.disk.sync_dir(&dir)?;
        }
        self.set_checkpoint(flush.shard, flush.checkpoint)
    }

    fn publish_flush(&self, flush: &Flush) -> std::io::Result<()> {
        // No directory sync needed: a rename lost in a crash leaves a staged file that the
        // recorded checkpoint covers, and recovery renames it again.
        for segment in &flush.segments {
            let path = self.path(segment);
            self.disk
                .rename(&Self::with_suffix(path.clone(), STAGED), &path)?;
        }
        Ok(())
    }

    fn abandon_flush(&self, flush: &Flush) {
        for segment in &flush.segments {
            let _ = self
                .disk
                .remove_file(&Self::with_suffix(self.path(segment), STAGED));
        }
    }

    fn recover(&self) -> std::io::Result<()> {
        let checkpoints = self.checkpoints()?;
        for project in self.all_projects()? {
            for (_, path) in self.files_of(project)? {
                let name = file_name(&path);
                if name.ends_with(COMPACTING) {
                    // A compaction the crash interrupted: its source segment is still in place.
                    self.disk.remove_file(&path)?;
                    continue;
                }
                let Some(committed_name) = name.strip_suffix(STAGED) else {
                    continue;
                };
                let recorded = SegmentName::parse(committed_name).is_some_and(|n| {
                    checkpoints
                        .iter()
                        .any(|(shard, seq)| *shard == n.shard && n.last <= *seq)
                });
                if recorded {
                    self.disk
                        .rename(&path, &path.with_file_name(committed_name))?;
                } else {
                    self.disk.remove_file(&path)?;
                }
            }
        }
        Ok(())
    }

    fn version_staging_path(&self, segment: &SegmentRef) -> std::io::Result<PathBuf> {
        let path = self.path(segment);
        if let Some(dir) = path.parent() {
            create_dirs(self.disk.as_ref(), dir)?;
        }
        Ok(Self::with_suffix(path, COMPACTING))
    }

    fn publish_version(&self, segment: &SegmentRef) -> std::io::Result<()> {
        let path = self.path(segment);
        self.disk
            .rename(&Self::with_suffix(path.clone(), COMPACTING), &path)?;
        match path.parent() {
            Some(dir) => self.disk.sync_dir(dir),
            None => Ok(()),
        }
    }

    fn published_at(&self, segment: &SegmentRef) -> std::io::Result<Option<SystemTime>> {
        match fs::metadata(self.path(segment)) {
            Ok(meta) => Ok(meta.modified().ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn record_drop(&self, drop: &DayDrop) -> std::io::Result<()> {
        let mut known = self.drops.lock().unwrap_or_else(|p| p.into_inner());
        let mut drops = match known.get(&drop.project) {
            Some(drops) => drops.clone(),
            None => self.read_drops(drop.project)?,
        };
        drops.push(drop.clone());
        let mut text = String::new();
        for d in &drops {
            text.push_str(&serde_json::to_string(d).map_err(std::io::Error::other)?);
            text.push('\n');
        }
        let path = self.drops_path(drop.project);
        if let Some(dir) = path.parent() {
            create_dirs(self.disk.as_ref(), dir)?;
        }
        replace_file(self.disk.as_ref(), &path, text.as_bytes())?;
        known.insert(drop.project, drops);
        Ok(())
    }

    fn drops(&self, project: u64) -> std::io::Result<Vec<DayDrop>> {
        let mut known = self.drops.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(drops) = known.get(&project) {
            return Ok(drops.clone());
        }
        let drops = self.read_drops(project)?;
        known.insert(project, drops.clone());
        Ok(drops)
    }

    fn remove(&self, segment: &SegmentRef) -> std::io::Result<()> {
        match self.disk.remove_file(&self.path(segment)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_catalog_passes_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("events");
        let catalog = DirCatalog::open(root.clone()).expect("open");
        let files = crate::files::SegmentFiles::local(&root).expect("files");
        let reopen = || -> Box<dyn SegmentCatalog> {
            Box::new(DirCatalog::open(root.clone()).expect("reopen"))
        };
        super::super::contract::suite(&catalog, &files, &reopen);
    }
}
