//! The activity log: who changed what and when, with field diffs (PostHog's `ActivityLog`).
//!
//! Each domain builds an [`ActivityEntry`] for every change it makes ([`Recorded::entry`]
//! diffs the item's JSON before and after, leaving out bookkeeping fields and masking secrets)
//! and writes it in the same transaction as the change: [`stage`] inside a sled transaction
//! embedded, [`insert`] inside a PostgreSQL transaction in a cluster. [`ActivityLog`] is the
//! door for reading it (the API's listings) and for its upkeep (entries older than the TTL
//! are deleted).

mod acting;
mod diff;
mod entry;
mod logged;
mod pg;
mod records;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use acting::{acting_as, current_actor};
pub use diff::{changes_between, mask, Change, MASKED};
pub use entry::{ActivityEntry, Actor, Detail, Recorded};
pub use logged::LoggedRecords;
pub use pg::{insert, insert_all, PgActivity};
#[cfg(any(test, feature = "test-support"))]
pub use records::contract;
pub use records::{stage, ActivityPage, ActivityQuery, ActivityRecords, SledActivity, TREE};

use corvid_kernel::{blocking, StoreError};

/// The activity log's door. Cheap to clone.
#[derive(Clone)]
pub struct ActivityLog {
    records: Arc<dyn ActivityRecords>,
}

impl ActivityLog {
    pub fn new(records: Arc<dyn ActivityRecords>) -> ActivityLog {
        ActivityLog { records }
    }

    /// The project's entries matching `query`, newest first.
    pub async fn list(
        &self,
        project_id: u64,
        query: ActivityQuery,
    ) -> Result<ActivityPage, StoreError> {
        let records = Arc::clone(&self.records);
        blocking(move || records.query(project_id, &query)).await
    }

    pub async fn entry(
        &self,
        project_id: u64,
        id: Uuid,
    ) -> Result<Option<ActivityEntry>, StoreError> {
        let records = Arc::clone(&self.records);
        blocking(move || records.entry(project_id, id)).await
    }

    /// Records a change whose own store is not transactional with the log (its entry is
    /// written right after the change).
    pub async fn record(&self, entry: ActivityEntry) -> Result<(), StoreError> {
        let records = Arc::clone(&self.records);
        blocking(move || records.append(&entry)).await
    }

    /// Deletes entries older than `ttl` at `now` (blocking; the engine's upkeep job calls
    /// it). A `ttl` reaching before the calendar's start deletes nothing.
    pub fn expire(&self, now: DateTime<Utc>, ttl: std::time::Duration) -> Result<u64, StoreError> {
        match cutoff(now, ttl) {
            Some(cutoff) => self.records.expire(cutoff),
            None => Ok(0),
        }
    }

    /// The storage, for the domains that read entries in their own rules (a flag's revert).
    pub fn records(&self) -> Arc<dyn ActivityRecords> {
        Arc::clone(&self.records)
    }
}

/// `now - ttl`, or `None` when that is before any representable time (nothing is so old).
fn cutoff(now: DateTime<Utc>, ttl: std::time::Duration) -> Option<DateTime<Utc>> {
    now.checked_sub_signed(chrono::Duration::from_std(ttl).ok()?)
}

/// The PostgreSQL schema of this crate's table (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[corvid_kernel::Migration {
    version: 11,
    name: "activity log",
    sql: include_str!("../migrations/0011_activity_log.sql"),
}];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_past_the_calendar_keeps_everything_instead_of_overflowing() {
        let now = Utc::now();
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(cutoff(now, day), Some(now - chrono::Duration::days(1)));
        assert_eq!(cutoff(now, std::time::Duration::MAX), None);
        assert_eq!(cutoff(now, day * 365 * 1_000_000), None);
    }
}
