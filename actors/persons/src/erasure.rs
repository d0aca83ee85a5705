//! Erasure requests: a person deleted through PostHog's persons API, and with it (when asked)
//! every event of theirs captured before the request.
//!
//! A request is one [`Erasure`] record per person (PostHog's `AsyncDeletion` of type person).
//! Readers hide the events it covers at once through an [`ErasedSet`]; the events crate's
//! compactor then rewrites every segment that still holds them and, after a scan that finds
//! none left, sets `verified_at`: the request is complete.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One person's erasure request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Erasure {
    /// The record's own id.
    pub id: Uuid,
    pub project_id: u64,
    pub person_uuid: Uuid,
    /// The person's distinct ids when the request was made: events captured under them are
    /// the person's, whichever person id they were stored with (an anonymous id merged later).
    pub distinct_ids: Vec<String>,
    /// Events captured (received by the server) at or before this instant are erased.
    pub requested_at: DateTime<Utc>,
    /// Who asked (the user's email), for the activity list.
    pub requested_by: Option<String>,
    /// Whether the person profile was deleted (not `keep_person`).
    pub person_deleted: bool,
    /// Whether the person's events are erased (`delete_events`).
    pub events: bool,
    /// When a scan found none of the covered events left in any stored segment.
    pub verified_at: Option<DateTime<Utc>>,
    /// Events removed from segment files so far.
    #[serde(default)]
    pub events_removed: u64,
}

impl Erasure {
    /// PostHog's `deletion_status` word: `pending` until verified.
    pub fn status(&self) -> &'static str {
        if self.verified_at.is_some() {
            "completed"
        } else {
            "pending"
        }
    }

    /// Whether this request still has events to remove.
    pub fn pending(&self) -> bool {
        self.events && self.verified_at.is_none()
    }
}

/// How long a verified erasure keeps hiding events from segment reads (tails and flushes
/// always apply every erasure): long enough for every node to have seen the rewritten segments.
pub const HIDE_AFTER_VERIFIED: chrono::Duration = chrono::Duration::hours(1);

/// Which events a set of erasures covers: those of an erased person or distinct id captured at
/// or before its request. Lookups are two hash probes per row.
#[derive(Debug, Default, Clone)]
pub struct ErasedSet {
    persons: HashMap<Uuid, i64>,
    distinct_ids: HashMap<String, i64>,
    latest: Option<DateTime<Utc>>,
}

impl ErasedSet {
    /// The set of the event erasures among `erasures` that `keep` accepts.
    pub fn of<'a>(
        erasures: impl IntoIterator<Item = &'a Erasure>,
        keep: impl Fn(&Erasure) -> bool,
    ) -> ErasedSet {
        let mut set = ErasedSet::default();
        for erasure in erasures.into_iter().filter(|e| e.events && keep(e)) {
            let at = erasure.requested_at.timestamp_micros();
            let later = |old: &mut i64| *old = (*old).max(at);
            set.persons
                .entry(erasure.person_uuid)
                .and_modify(later)
                .or_insert(at);
            for did in &erasure.distinct_ids {
                set.distinct_ids
                    .entry(did.clone())
                    .and_modify(later)
                    .or_insert(at);
            }
            set.latest = set.latest.max(Some(erasure.requested_at));
        }
        set
    }

    pub fn is_empty(&self) -> bool {
        self.persons.is_empty() && self.distinct_ids.is_empty()
    }

    /// The newest request in the set: answers computed before it may show erased events.
    pub fn latest_request(&self) -> Option<DateTime<Utc>> {
        self.latest
    }

    /// Whether the event of `person_id` / `distinct_id` captured at `created_micros` (µs since
    /// the epoch) is erased.
    pub fn hides(&self, person_id: &Uuid, distinct_id: &str, created_micros: i64) -> bool {
        if self.is_empty() {
            return false;
        }
        self.persons
            .get(person_id)
            .is_some_and(|at| created_micros <= *at)
            || self
                .distinct_ids
                .get(distinct_id)
                .is_some_and(|at| created_micros <= *at)
    }

    /// [`ErasedSet::hides`] with the person id as text (as query batches carry it).
    pub fn hides_text(&self, person_id: &str, distinct_id: &str, created_micros: i64) -> bool {
        if self.is_empty() {
            return false;
        }
        let by_person = Uuid::try_parse(person_id)
            .ok()
            .and_then(|id| self.persons.get(&id))
            .is_some_and(|at| created_micros <= *at);
        by_person
            || self
                .distinct_ids
                .get(distinct_id)
                .is_some_and(|at| created_micros <= *at)
    }
}

/// A project's erasure records as readers need them, cached by the person store.
#[derive(Debug, Default)]
pub struct ProjectErasures {
    /// Every record, oldest request first.
    pub records: Vec<Erasure>,
    /// Every event erasure: what a flush drops and what tails hide.
    pub all: Arc<ErasedSet>,
    /// Pending erasures and those verified within [`HIDE_AFTER_VERIFIED`]: what segment reads
    /// hide.
    pub hidden: Arc<ErasedSet>,
}

impl ProjectErasures {
    pub fn new(mut records: Vec<Erasure>, now: DateTime<Utc>) -> ProjectErasures {
        records.sort_by_key(|e| (e.requested_at, e.id));
        let all = ErasedSet::of(&records, |_| true);
        let hidden = ErasedSet::of(&records, |e| {
            e.verified_at
                .is_none_or(|at| now.signed_duration_since(at) < HIDE_AFTER_VERIFIED)
        });
        ProjectErasures {
            records,
            all: Arc::new(all),
            hidden: Arc::new(hidden),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn erasure(person: Uuid, dids: &[&str], at: &str) -> Erasure {
        Erasure {
            id: Uuid::new_v4(),
            project_id: 1,
            person_uuid: person,
            distinct_ids: dids.iter().map(|d| d.to_string()).collect(),
            requested_at: at.parse().expect("time"),
            requested_by: None,
            person_deleted: true,
            events: true,
            verified_at: None,
            events_removed: 0,
        }
    }

    fn micros(at: &str) -> i64 {
        at.parse::<DateTime<Utc>>()
            .expect("time")
            .timestamp_micros()
    }

    #[test]
    fn hides_events_of_the_person_or_its_distinct_ids_captured_up_to_the_request() {
        let person = Uuid::new_v4();
        let other = Uuid::new_v4();
        let set = ErasedSet::of(
            &[erasure(person, &["anon", "user"], "2026-01-02T00:00:00Z")],
            |_| true,
        );
        let before = micros("2026-01-01T00:00:00Z");
        let after = micros("2026-01-03T00:00:00Z");
        assert!(set.hides(&person, "someone", before));
        assert!(set.hides(&other, "anon", before), "an id merged in later");
        assert!(set.hides_text(&person.to_string(), "x", before));
        assert!(
            !set.hides(&person, "user", after),
            "captured after the request"
        );
        assert!(!set.hides(&other, "stranger", before));
        assert!(
            set.hides(&person, "x", micros("2026-01-02T00:00:00Z")),
            "at the instant"
        );
    }

    #[test]
    fn events_kept_and_verified_long_ago_leave_segment_reads_alone() {
        let now: DateTime<Utc> = "2026-01-02T12:00:00Z".parse().expect("time");
        let mut done = erasure(Uuid::new_v4(), &["done"], "2026-01-01T00:00:00Z");
        done.verified_at = Some(now - chrono::Duration::hours(2));
        let mut person_only = erasure(Uuid::new_v4(), &["kept"], "2026-01-01T00:00:00Z");
        person_only.events = false;
        let sets = ProjectErasures::new(vec![done, person_only], now);
        let t = micros("2025-12-31T00:00:00Z");
        assert!(sets.all.hides(&Uuid::nil(), "done", t));
        assert!(!sets.hidden.hides(&Uuid::nil(), "done", t));
        assert!(
            !sets.all.hides(&Uuid::nil(), "kept", t),
            "events were not asked for"
        );
        assert_eq!(sets.records.len(), 2);
    }
}
