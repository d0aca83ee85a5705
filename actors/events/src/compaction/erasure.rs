//! Carrying out erasure requests: the compactor rewrites every segment holding an event an
//! erasure covers as its next version without those events, deletes the superseded versions
//! once no query can still read them, and verifies.
//!
//! Readers hide covered events from the moment a request is recorded (the persons store's
//! erasure sets), and flushes never write them; this pass makes them physically gone. An
//! erasure is verified (`verified_at`, PostHog's `delete_verified_at`) by a pass that finds no
//! covered event in any current segment, no superseded version left of the project, and none in
//! this node's tails. A crash mid-rewrite leaves the old version current (the new one is
//! staged, not published), so the next pass does the work again.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{project_job, Compactor};
use crate::segment::{count_erased, read_segment, write_segment, StoredEvent};
use corvid_persons::{ErasedSet, Erasure};

/// Settings of the erasure pass.
#[derive(Debug, Clone)]
pub struct ErasureConfig {
    /// How often pending erasures are worked on.
    pub interval: Duration,
    /// A request waits this long before its segments are rewritten, so flushes that were
    /// under way when it came have committed (later flushes drop covered events themselves).
    pub settle: Duration,
    /// A segment version superseded by an erasure's rewrite is deleted once its successor is
    /// this old: longer than any query runs.
    pub grace: Duration,
    /// Erasure records are kept this long after their request (the deletions' activity).
    pub record_ttl: Duration,
}

/// What one erasure pass did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ErasureReport {
    /// Segments rewritten without covered events.
    pub rewritten: usize,
    /// Events removed from segment files.
    pub removed: u64,
    /// Superseded versions deleted.
    pub deleted: usize,
    /// Requests verified complete.
    pub verified: usize,
    /// Records past their time to live, deleted.
    pub expired: usize,
    /// Projects whose pass failed, with the error (retried on the next pass).
    pub failed: Vec<(u64, String)>,
}

/// The job under which one node at a time deletes expired erasure records.
const EXPIRE_JOB: &str = "erasure/expire";

fn other(err: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(err.to_string())
}

/// Which request an erased event is counted against: its person's, else its distinct id's.
struct Owners {
    persons: HashMap<Uuid, Uuid>,
    distinct_ids: HashMap<String, Uuid>,
}

impl Owners {
    fn of(erasures: &[Erasure]) -> Owners {
        let mut owners = Owners {
            persons: HashMap::new(),
            distinct_ids: HashMap::new(),
        };
        for e in erasures {
            owners.persons.insert(e.person_uuid, e.id);
            for did in &e.distinct_ids {
                owners.distinct_ids.insert(did.clone(), e.id);
            }
        }
        owners
    }

    fn of_event(&self, event: &StoredEvent) -> Option<Uuid> {
        self.persons
            .get(&event.person_id)
            .or_else(|| self.distinct_ids.get(&event.distinct_id))
            .copied()
    }
}

impl Compactor {
    /// One pass over every project with erasures due at `now` that this node can claim, then
    /// (on one node) the deletion of expired records.
    pub fn erase_once(&self, now: DateTime<Utc>) -> std::io::Result<ErasureReport> {
        let mut report = ErasureReport::default();
        let settle = chrono::Duration::from_std(self.config.erasure.settle).unwrap_or_default();
        let mut due: HashMap<u64, Vec<Erasure>> = HashMap::new();
        for erasure in self.persons.all_erasures().map_err(other)? {
            if erasure.pending()
                && erasure
                    .requested_at
                    .checked_add_signed(settle)
                    .is_some_and(|at| at <= now)
            {
                due.entry(erasure.project_id).or_default().push(erasure);
            }
        }
        for (project, erasures) in due {
            let outcome = corvid_kernel::contain(|| {
                self.claimed(&project_job(project), || {
                    self.erase_project(project, &erasures, now, &mut report)
                })
            });
            if let Err(error) = outcome {
                tracing::warn!(project, %error, "an erasure pass failed; it is retried");
                report.failed.push((project, error));
            }
        }
        let ttl = chrono::Duration::from_std(self.config.erasure.record_ttl)
            .unwrap_or(chrono::Duration::MAX);
        if let Some(before) = now.checked_sub_signed(ttl) {
            if let Some(expired) = self.claimed(EXPIRE_JOB, || {
                self.persons.expire_erasures(before).map_err(other)
            })? {
                report.expired = expired;
            }
        }
        Ok(report)
    }

    /// Rewrites `project`'s segments without the events `erasures` cover, deletes superseded
    /// versions past the erasure grace, and verifies the requests when nothing is left.
    fn erase_project(
        &self,
        project: u64,
        erasures: &[Erasure],
        now: DateTime<Utc>,
        report: &mut ErasureReport,
    ) -> std::io::Result<()> {
        let erased = ErasedSet::of(erasures, |_| true);
        let owners = Owners::of(erasures);
        let keys = self.columns.keys_for(project);
        let mut removed: HashMap<Uuid, u64> = HashMap::new();
        let mut rewritten = 0;
        for segment in self.catalog.segments(project, None, None)? {
            let bytes = self.files.read(&segment).map_err(other)?;
            if count_erased(bytes.clone(), &segment.key(), &erased).map_err(other)? == 0 {
                continue;
            }
            let rows = read_segment(bytes, &segment.key()).map_err(other)?;
            let (gone, mut kept): (Vec<&StoredEvent>, Vec<&StoredEvent>) =
                rows.iter().partition(|e| e.erased_by(&erased));
            let next = segment.next_version();
            let staged = self.catalog.version_staging_path(&next)?;
            write_segment(self.catalog.disk(), &staged, &mut kept, &keys).map_err(other)?;
            self.catalog.publish_version(&next)?;
            for event in &gone {
                if let Some(owner) = owners.of_event(event) {
                    *removed.entry(owner).or_default() += 1;
                }
            }
            rewritten += 1;
            report.removed += gone.len() as u64;
        }
        report.rewritten += rewritten;
        let (deleted, left) = self.delete_superseded(project, self.config.erasure.grace)?;
        report.deleted += deleted;
        let in_tails = self.tails.iter().any(|tail| {
            tail.read()
                .iter()
                .any(|e| e.project_id == project && e.erased_by(&erased))
        });
        let verified = rewritten == 0 && left == 0 && !in_tails;
        let changed: Vec<Erasure> = erasures
            .iter()
            .filter(|e| verified || removed.contains_key(&e.id))
            .map(|e| {
                let mut e = e.clone();
                e.events_removed += removed.get(&e.id).copied().unwrap_or(0);
                if verified {
                    e.verified_at = Some(now);
                }
                e
            })
            .collect();
        if !changed.is_empty() {
            self.persons
                .update_erasures(project, &changed)
                .map_err(other)?;
        }
        if verified {
            report.verified += erasures.len();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::tests::{erasure_config, fixture, one_segment, persons, Fixture};
    use super::*;
    use crate::compaction::CompactionConfig;
    use corvid_kernel::JobLease;

    #[test]
    fn covered_events_leave_the_segments_and_the_request_is_verified_after() {
        let Fixture {
            _dir,
            root,
            db,
            columns,
            catalog,
            files,
        } = fixture(vec![]);
        let (written, _) = one_segment(catalog.as_ref(), 7);
        let store = persons(&db);
        // u3 was captured before the request, u5 after it: only u3 goes.
        let requested_at: DateTime<Utc> = "2024-01-01T00:00:04Z".parse().expect("time");
        let erasure = Erasure {
            id: Uuid::new_v4(),
            project_id: 7,
            person_uuid: Uuid::new_v4(),
            distinct_ids: vec!["u3".into(), "u5".into()],
            requested_at,
            requested_by: None,
            person_deleted: true,
            events: true,
            verified_at: None,
            events_removed: 0,
        };
        store
            .update_erasures(7, std::slice::from_ref(&erasure))
            .expect("record");
        let compactor = Compactor::new(
            Arc::clone(&catalog),
            Arc::clone(&files),
            columns,
            CompactionConfig {
                auto_keys: 0,
                min_share: 0.5,
                sample_rows: 1_000,
                grace: Duration::from_secs(3600),
                erasure: erasure_config(),
            },
            JobLease::local(Duration::from_secs(60)),
            Arc::clone(&store),
            Vec::new(),
        );
        let now = Utc::now();
        let first = compactor.erase_once(now).expect("pass");
        assert_eq!((first.rewritten, first.removed, first.verified), (1, 1, 0));
        assert_eq!(first.deleted, 1, "the old version is gone (no grace here)");
        assert!(!root.join(written.key()).exists());
        let current = catalog.segments(7, None, None).expect("list");
        let rows = read_segment(files.read(&current[0]).expect("read"), "test").expect("rows");
        assert_eq!(rows.len(), 49);
        assert!(rows.iter().all(|e| e.distinct_id != "u3"));
        assert!(rows.iter().any(|e| e.distinct_id == "u5"));
        // The next pass finds nothing left: verified, with the count.
        let second = compactor.erase_once(now).expect("pass");
        assert_eq!((second.rewritten, second.verified), (0, 1), "{second:?}");
        let stored = store.all_erasures().expect("records");
        assert_eq!(stored[0].verified_at, Some(now));
        assert_eq!(stored[0].events_removed, 1);
        assert_eq!(
            compactor.erase_once(now).expect("pass"),
            ErasureReport::default(),
            "nothing pending"
        );
    }
}
