//! Person writes taken off the writer's thread: [`WriteBehind`] accepts a write into memory
//! at once and a thread of its own commits the accepted writes to the records it wraps, many
//! to a batch.
//!
//! The embedded keyspaces stall a write for tens of milliseconds now and then (a full
//! memtable is freed, table files are unlinked, under a lock every write takes), and the
//! ingest shard wrote each person before acknowledging its event, so those stalls were the
//! capture p99. A write accepted here is durable the way the events that made it are: they
//! are in the WAL, and the WAL's checkpoint moves past them only after
//! [`PersonRecords::flush`], which waits for every accepted write to be committed and synced.
//! A crash before that replays them. Writes no WAL covers (the API's) wait for theirs with
//! [`PersonRecords::settle`].
//!
//! Until committed, an accepted write is what reads of its person and distinct ids return;
//! reads of everything else (a project's persons, a scan) and removals wait for the accepted
//! writes first. The queue is bounded: a writer waits for room when the records fall behind.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use uuid::Uuid;

use super::model::Person;
use super::records::{NewIds, OnPersonChange, PersonRecords, PersonWrite, Touched};
use corvid_kernel::StoreError;

/// Accepted writes not yet committed before a writer waits for room (about 500 bytes each).
const MAX_QUEUED: usize = 16_384;
/// Writes committed together.
const BATCH: usize = 1_024;
/// How long the committer lets writes gather before a commit.
const GATHER: Duration = Duration::from_millis(1);
/// How long a failed commit waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// The records `inner`, written behind (see the module's doc). Dropping it commits what was
/// accepted, then stops its thread.
pub struct WriteBehind {
    inner: Arc<dyn PersonRecords>,
    shared: Arc<Shared>,
    committer: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when writes are committed or fail, when stopping, and when a write is
    /// accepted while the committer is idle.
    changed: Condvar,
}

/// An accepted write's sequence number and the person it leaves (`None`: deleted).
type Accepted = (u64, Option<Arc<Person>>);

#[derive(Default)]
struct State {
    /// Accepted writes not yet committed, oldest first, with their sequence numbers.
    queue: VecDeque<(u64, PersonWrite)>,
    /// The newest accepted write of each person not yet committed: the person, or `None`
    /// when deleted.
    persons: HashMap<(u64, Uuid), Accepted>,
    /// The newest accepted mapping of each distinct id not yet committed.
    distinct_ids: HashMap<(u64, String), (u64, Uuid)>,
    /// Sequence number of the last write accepted.
    accepted: u64,
    /// Sequence number of the last write committed.
    committed: u64,
    /// Why the last commit failed, until one succeeds.
    failure: Option<String>,
    stopping: bool,
    /// Whether the committer waits for writes.
    idle: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|p| p.into_inner())
    }
}

fn failed(reason: &str) -> StoreError {
    StoreError::Unavailable(format!("person writes are failing: {reason}"))
}

impl WriteBehind {
    /// Wraps `inner` and starts the thread that commits to it.
    pub fn new(inner: Arc<dyn PersonRecords>) -> Result<WriteBehind, StoreError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let committer = {
            let (inner, shared) = (Arc::clone(&inner), Arc::clone(&shared));
            std::thread::Builder::new()
                .name("corvid-persons".into())
                .spawn(move || {
                    corvid_kernel::sched::join_batch();
                    commit_loop(inner.as_ref(), &shared)
                })
                .map_err(|e| StoreError::TaskFailed(format!("person writer: {e}")))?
        };
        Ok(WriteBehind {
            inner,
            shared,
            committer: Some(committer),
        })
    }

    /// Accepts `writes`, waiting for room while the queue is full.
    fn accept(&self, writes: &[PersonWrite]) -> Result<(), StoreError> {
        let mut state = self.shared.lock();
        while state.queue.len() >= MAX_QUEUED && state.failure.is_none() {
            state = self.shared.wait(state);
        }
        if let Some(reason) = &state.failure {
            return Err(failed(reason));
        }
        for write in writes {
            accept_one(&mut state, write.clone());
        }
        // Only an idle committer waits for writes (others wait for commits).
        let wake = state.idle;
        drop(state);
        if wake {
            self.shared.changed.notify_all();
        }
        Ok(())
    }
}

/// Queues `write` and makes it what reads of its person and distinct ids return.
fn accept_one(state: &mut State, write: PersonWrite) {
    state.accepted += 1;
    let seq = state.accepted;
    match &write {
        PersonWrite::Put {
            project, person, ..
        } => {
            state
                .persons
                .insert((*project, person.id), (seq, Some(Arc::clone(person))));
            for did in &person.distinct_ids {
                state
                    .distinct_ids
                    .insert((*project, did.clone()), (seq, person.id));
            }
        }
        PersonWrite::Delete { project, id } => {
            state.persons.insert((*project, *id), (seq, None));
        }
    }
    state.queue.push_back((seq, write));
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.changed.notify_all();
        if let Some(committer) = self.committer.take() {
            let _ = committer.join();
        }
    }
}

/// Commits the accepted writes a batch at a time until stopped with none left (or with
/// commits failing).
fn commit_loop(inner: &dyn PersonRecords, shared: &Shared) {
    /// Marks the writes failing when the thread ends by a panic, so nobody waits for them.
    struct Ended<'a>(&'a Shared);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.lock().failure = Some("the person writer stopped".into());
                self.0.changed.notify_all();
            }
        }
    }
    let _ended = Ended(shared);
    loop {
        {
            let mut state = shared.lock();
            while state.queue.is_empty() {
                if state.stopping {
                    return;
                }
                state.idle = true;
                state = shared.wait(state);
                state.idle = false;
            }
        }
        // The writes of the next moment join this commit: one wake-up and one journal write
        // for them all, instead of one per write.
        std::thread::sleep(GATHER);
        let batch: Vec<(u64, PersonWrite)> =
            shared.lock().queue.iter().take(BATCH).cloned().collect();
        let writes: Vec<PersonWrite> = batch.iter().map(|(_, w)| w.clone()).collect();
        let outcome = inner.write_persons(&writes);
        let mut state = shared.lock();
        match outcome {
            Ok(()) => {
                state.queue.drain(..batch.len());
                state.committed = batch.last().map_or(state.committed, |(seq, _)| *seq);
                state.failure = None;
                for (seq, write) in &batch {
                    forget_committed(&mut state, *seq, write);
                }
                drop(state);
                shared.changed.notify_all();
            }
            Err(err) => {
                tracing::error!(error = %err, queued = state.queue.len(), "person writes failed; retrying");
                state.failure = Some(err.to_string());
                shared.changed.notify_all();
                if state.stopping {
                    return;
                }
                let _ = shared
                    .changed
                    .wait_timeout(state, RETRY_AFTER)
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

/// Drops the in-memory copy `write` (number `seq`) left, unless a newer write replaced it.
fn forget_committed(state: &mut State, seq: u64, write: &PersonWrite) {
    match write {
        PersonWrite::Put {
            project, person, ..
        } => {
            let key = (*project, person.id);
            if state.persons.get(&key).is_some_and(|(s, _)| *s == seq) {
                state.persons.remove(&key);
            }
            for did in &person.distinct_ids {
                let key = (*project, did.clone());
                if state.distinct_ids.get(&key).is_some_and(|(s, _)| *s == seq) {
                    state.distinct_ids.remove(&key);
                }
            }
        }
        PersonWrite::Delete { project, id } => {
            let key = (*project, *id);
            if state.persons.get(&key).is_some_and(|(s, _)| *s == seq) {
                state.persons.remove(&key);
            }
        }
    }
}

impl PersonRecords for WriteBehind {
    fn exclusively(
        &self,
        project_id: u64,
        touched: &[Touched],
        work: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.inner.exclusively(project_id, touched, work)
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }

    fn watch(&self, on_change: OnPersonChange) {
        self.inner.watch(on_change)
    }

    fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError> {
        if let Some((_, person)) = self.shared.lock().persons.get(&(project_id, id)) {
            return Ok(person.as_deref().cloned());
        }
        self.inner.person(project_id, id)
    }

    fn person_id_by_distinct_id(
        &self,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        let key = (project_id, distinct_id.to_string());
        if let Some((_, id)) = self.shared.lock().distinct_ids.get(&key) {
            return Ok(Some(*id));
        }
        self.inner.person_id_by_distinct_id(project_id, distinct_id)
    }

    fn put_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        self.accept(&[PersonWrite::Put {
            project: project_id,
            person: Arc::new(person.clone()),
            new_ids: NewIds::Any,
        }])
    }

    fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError> {
        self.accept(&[PersonWrite::Delete {
            project: project_id,
            id,
        }])
    }

    fn write_persons(&self, writes: &[PersonWrite]) -> Result<(), StoreError> {
        self.accept(writes)
    }

    fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError> {
        self.settle()?;
        self.inner.persons(project_id)
    }

    fn scan_persons(
        &self,
        after: Option<(u64, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(u64, Person)>, StoreError> {
        self.settle()?;
        self.inner.scan_persons(after, limit)
    }

    fn remove_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
        self.settle()?;
        self.inner.remove_person(project_id, person)
    }

    crate::delegate_other_person_records!(inner);

    /// Waits until every write accepted so far is committed; an error while commits fail.
    fn settle(&self) -> Result<(), StoreError> {
        let mut state = self.shared.lock();
        let target = state.accepted;
        while state.committed < target {
            if let Some(reason) = &state.failure {
                return Err(failed(reason));
            }
            state = self.shared.wait(state);
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.settle()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::embedded_store::EmbeddedPersons;
    use crate::files::PersonFiles;
    use crate::records::contract::{self, person};

    #[test]
    fn passes_the_records_contract() {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let inner = EmbeddedPersons::open(&db, PersonFiles::temporary()).expect("open");
        contract::suite(&WriteBehind::new(Arc::new(inner)).expect("start"));
    }

    /// The embedded records, whose commits wait while `held` is set and fail while `failing`
    /// is.
    struct Gated {
        inner: EmbeddedPersons,
        held: AtomicBool,
        failing: AtomicBool,
    }

    impl Gated {
        fn wait_while_held(&self) {
            while self.held.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    impl PersonRecords for Gated {
        fn person(&self, project_id: u64, id: Uuid) -> Result<Option<Person>, StoreError> {
            self.inner.person(project_id, id)
        }
        fn person_id_by_distinct_id(
            &self,
            project_id: u64,
            distinct_id: &str,
        ) -> Result<Option<Uuid>, StoreError> {
            self.inner.person_id_by_distinct_id(project_id, distinct_id)
        }
        fn put_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
            self.inner.put_person(project_id, person)
        }
        fn write_persons(&self, writes: &[PersonWrite]) -> Result<(), StoreError> {
            self.wait_while_held();
            if self.failing.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("the disk is away".into()));
            }
            self.inner.write_persons(writes)
        }
        fn delete_person(&self, project_id: u64, id: Uuid) -> Result<(), StoreError> {
            self.inner.delete_person(project_id, id)
        }
        fn persons(&self, project_id: u64) -> Result<Vec<Person>, StoreError> {
            self.inner.persons(project_id)
        }
        fn scan_persons(
            &self,
            after: Option<(u64, Uuid)>,
            limit: usize,
        ) -> Result<Vec<(u64, Person)>, StoreError> {
            self.inner.scan_persons(after, limit)
        }
        fn remove_person(&self, project_id: u64, person: &Person) -> Result<(), StoreError> {
            self.inner.remove_person(project_id, person)
        }
        crate::delegate_other_person_records!(inner);
        fn flush(&self) -> Result<(), StoreError> {
            self.inner.flush()
        }
    }

    fn gated() -> Arc<Gated> {
        let db = sled::Config::new().temporary(true).open().expect("db");
        Arc::new(Gated {
            inner: EmbeddedPersons::open(&db, PersonFiles::temporary()).expect("open"),
            held: AtomicBool::new(true),
            failing: AtomicBool::new(false),
        })
    }

    /// Runs `f` on a thread of its own; whether it finished within `within`, and its result.
    fn finishes<T: Send + 'static>(
        within: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> (bool, std::thread::JoinHandle<T>) {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            let out = f();
            let _ = done_tx.send(());
            out
        });
        (done_rx.recv_timeout(within).is_ok(), handle)
    }

    #[test]
    fn an_accepted_write_is_read_back_before_it_is_committed_and_flush_waits_for_it() {
        let records = gated();
        let behind =
            Arc::new(WriteBehind::new(records.clone() as Arc<dyn PersonRecords>).expect("start"));
        let mut p = person(&["anon", "user"]);
        behind.put_person(1, &p).expect("accepted at once");
        p.version = 1;
        p.properties.insert("plan".into(), "team".into());
        behind.put_person(1, &p).expect("accepted at once");
        let merged_away = person(&["other"]);
        behind.put_person(1, &merged_away).expect("accepted");
        behind.delete_person(1, merged_away.id).expect("accepted");

        // Nothing is committed yet; reads answer from the accepted writes.
        assert_eq!(
            records
                .inner
                .person_id_by_distinct_id(1, "user")
                .expect("read"),
            None
        );
        assert_eq!(behind.person(1, p.id).expect("read"), Some(p.clone()));
        assert_eq!(
            behind.person_id_by_distinct_id(1, "anon").expect("read"),
            Some(p.id)
        );
        assert_eq!(
            behind.person(1, merged_away.id).expect("read"),
            None,
            "deleted"
        );

        let flushing = Arc::clone(&behind);
        let (flushed, flush) = finishes(Duration::from_millis(200), move || flushing.flush());
        assert!(!flushed, "a flush waits for the accepted writes");
        records.held.store(false, Ordering::SeqCst);
        flush.join().expect("flush thread").expect("flush");

        assert_eq!(
            records.inner.person(1, p.id).expect("read"),
            Some(p.clone()),
            "the newest"
        );
        assert_eq!(
            records
                .inner
                .person_id_by_distinct_id(1, "user")
                .expect("read"),
            Some(p.id)
        );
        assert_eq!(records.inner.person(1, merged_away.id).expect("read"), None);
        assert!(
            behind.shared.lock().persons.is_empty(),
            "memory is let go once committed"
        );
    }

    #[test]
    fn a_failing_commit_is_retried_and_reported_to_whoever_waits() {
        let records = gated();
        records.failing.store(true, Ordering::SeqCst);
        records.held.store(false, Ordering::SeqCst);
        let behind = WriteBehind::new(records.clone() as Arc<dyn PersonRecords>).expect("start");
        let p = person(&["someone"]);
        behind.put_person(1, &p).expect("accepted");
        assert!(behind.flush().is_err(), "the failure reaches the flush");
        assert!(
            behind.put_person(1, &person(&["next"])).is_err(),
            "no more accepted"
        );
        assert_eq!(
            behind.person(1, p.id).expect("read"),
            Some(p.clone()),
            "still read"
        );

        records.failing.store(false, Ordering::SeqCst);
        let mut flushed = behind.flush();
        for _ in 0..100 {
            if flushed.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            flushed = behind.flush();
        }
        flushed.expect("committed once the records work again");
        assert_eq!(records.inner.person(1, p.id).expect("read"), Some(p));
    }

    #[test]
    fn dropped_it_commits_what_it_accepted() {
        let records = gated();
        records.held.store(false, Ordering::SeqCst);
        let behind = WriteBehind::new(records.clone() as Arc<dyn PersonRecords>).expect("start");
        let ps: Vec<Person> = (0..3000).map(|i| person(&[&format!("d{i}")])).collect();
        for p in &ps {
            behind.put_person(7, p).expect("accepted");
        }
        drop(behind);
        for p in &ps {
            assert_eq!(
                records.inner.person(7, p.id).expect("read").map(|q| q.id),
                Some(p.id)
            );
        }
    }
}
