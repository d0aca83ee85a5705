//! Backups under way, and what they hold in place.
//!
//! A backup of an embedded node lists files and copies them one by one. A file deleted
//! between its listing and its copy is skipped, so nothing a backup may still copy is deleted
//! while one runs: the WAL keeps its covered files, compaction and erasure keep superseded
//! segment versions, retention keeps expired days. They are deleted on the first pass after
//! the last backup ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// How many backups are running on this node; cloned into everything that deletes files a
/// backup copies.
#[derive(Debug, Clone, Default)]
pub struct Backups(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    running: AtomicUsize,
    /// Held shared by a deletion from its check to its end, and exclusively by a backup
    /// starting: a backup never lists a file a deletion that saw no backup is removing.
    gate: RwLock<()>,
}

impl Backups {
    /// Holds deletions until the returned pin is dropped. Waits for deletions under way.
    pub fn pin(&self) -> BackupPin {
        let _gate = self.0.gate.write().unwrap_or_else(|p| p.into_inner());
        self.0.running.fetch_add(1, Ordering::SeqCst);
        BackupPin(Arc::clone(&self.0))
    }

    /// Whether a backup is running (deletions wait).
    pub fn running(&self) -> bool {
        self.0.running.load(Ordering::SeqCst) > 0
    }

    /// Runs `delete` unless a backup is running (`None` then); a backup starting meanwhile
    /// waits for it to finish.
    pub fn deleting<T>(&self, delete: impl FnOnce() -> T) -> Option<T> {
        let _gate = self.0.gate.read().unwrap_or_else(|p| p.into_inner());
        (!self.running()).then(delete)
    }
}

/// One running backup (see [`Backups::pin`]).
#[derive(Debug)]
pub struct BackupPin(Arc<Shared>);

impl Drop for BackupPin {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletions_wait_until_the_last_backup_ends() {
        let backups = Backups::default();
        assert!(!backups.running());
        let first = backups.pin();
        let second = backups.clone().pin();
        drop(first);
        assert!(backups.running(), "one backup still runs");
        assert_eq!(backups.deleting(|| "deleted"), None);
        drop(second);
        assert!(!backups.running());
        assert_eq!(backups.deleting(|| "deleted"), Some("deleted"));
    }
}
