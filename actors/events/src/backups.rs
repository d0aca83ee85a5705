//! Backups under way, and what they hold in place.
//!
//! A backup of an embedded node lists files and copies them one by one. A file deleted
//! between its listing and its copy is skipped, so nothing a backup may still copy is deleted
//! while one runs: the WAL keeps its covered files, compaction and erasure keep superseded
//! segment versions, retention keeps expired days. They are deleted on the first pass after
//! the last backup ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How many backups are running on this node; cloned into everything that deletes files a
/// backup copies.
#[derive(Debug, Clone, Default)]
pub struct Backups(Arc<AtomicUsize>);

impl Backups {
    /// Holds deletions until the returned pin is dropped.
    pub fn pin(&self) -> BackupPin {
        self.0.fetch_add(1, Ordering::SeqCst);
        BackupPin(Arc::clone(&self.0))
    }

    /// Whether a backup is running (deletions wait).
    pub fn running(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// One running backup (see [`Backups::pin`]).
#[derive(Debug)]
pub struct BackupPin(Arc<AtomicUsize>);

impl Drop for BackupPin {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
        drop(second);
        assert!(!backups.running());
    }
}
