//! Persons read from disk for `/flags`, gathered per thread: the requests of one turn of an
//! HTTP worker's event loop that each need a person memory does not hold share one trip to
//! the blocking pool.
//!
//! A trip per request cost more than the read itself when the persons outgrew
//! `memory.persons_bytes`: with 10 M persons (a fifth of the requests reading one from disk),
//! waking a pool thread and waking the worker again took 14 % and 6 % of the server's CPU,
//! the keyspace reads about 8 %. The first request of a turn opens a batch and spawns its
//! dispatch; the dispatch runs once the requests already woken in that turn have run (each
//! joins the open batch), then reads the whole batch on one pool thread and wakes the
//! requests through one channel.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use super::model::Person;
use super::store::PersonStore;
use corvid_kernel::{blocking, StoreError};

/// Reads one batch holds at most; the next request opens another.
const MAX_BATCH: usize = 128;

/// One read's answer, shared by every waiter of its batch (the error as text: errors are
/// not `Clone`).
type Answer = Result<Option<Arc<Person>>, String>;

/// The batch a thread's requests join until its dispatch takes the keys.
struct Batch {
    /// `None` once the dispatch took them: the batch is closed.
    keys: Mutex<Option<Vec<(u64, String)>>>,
    answers: watch::Sender<Option<Arc<Vec<Answer>>>>,
}

thread_local! {
    /// This thread's open batch. Weak: the dispatch task owns the batch, so a dispatch that
    /// never runs (the runtime shutting down) drops the sender and its waiters are answered.
    static OPEN: RefCell<Weak<Batch>> = const { RefCell::new(Weak::new()) };
}

impl PersonStore {
    /// The person of `distinct_id` (`None`: it has none), from memory, else read from storage
    /// in a batch with the other requests of this thread's turn (and kept in memory as
    /// [`PersonStore::load_person`] keeps it). Async: call from the runtime, never blocking.
    pub async fn read_person(
        self: &Arc<Self>,
        project_id: u64,
        distinct_id: &str,
    ) -> Result<Option<Arc<Person>>, StoreError> {
        if let Some(cached) = self.cached_person(project_id, distinct_id) {
            return Ok(cached);
        }
        let (index, mut answers) = self.join_batch(project_id, distinct_id);
        let abandoned = || StoreError::TaskFailed("a batch of person reads was abandoned".into());
        let answers = answers
            .wait_for(Option::is_some)
            .await
            .map_err(|_| abandoned())?
            .clone()
            .ok_or_else(abandoned)?;
        match answers.get(index) {
            Some(Ok(person)) => Ok(person.clone()),
            Some(Err(error)) => Err(StoreError::TaskFailed(error.clone())),
            None => Err(abandoned()),
        }
    }

    /// Adds the read to this thread's open batch, or opens one (spawning its dispatch).
    /// Returns the read's place in the batch and a receiver of the batch's answers.
    fn join_batch(
        self: &Arc<Self>,
        project_id: u64,
        distinct_id: &str,
    ) -> (usize, watch::Receiver<Option<Arc<Vec<Answer>>>>) {
        OPEN.with(|open| {
            let mut open = open.borrow_mut();
            if let Some(batch) = open.upgrade() {
                let mut keys = batch.keys.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(keys) = keys.as_mut().filter(|k| k.len() < MAX_BATCH) {
                    keys.push((project_id, distinct_id.to_string()));
                    return (keys.len() - 1, batch.answers.subscribe());
                }
            }
            let (answers, receiver) = watch::channel(None);
            let batch = Arc::new(Batch {
                keys: Mutex::new(Some(vec![(project_id, distinct_id.to_string())])),
                answers,
            });
            *open = Arc::downgrade(&batch);
            tokio::spawn(dispatch(Arc::clone(self), batch));
            (0, receiver)
        })
    }
}

/// Closes the batch once the requests woken with its first have joined, reads it on one
/// blocking thread and answers every waiter.
async fn dispatch(store: Arc<PersonStore>, batch: Arc<Batch>) {
    tokio::task::yield_now().await;
    let keys = batch
        .keys
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    let count = keys.len();
    store.disk_reads.count_batch(count);
    let reader = Arc::clone(&store);
    let answers = blocking(move || {
        Ok::<_, StoreError>(
            keys.iter()
                .map(|(project, id)| reader.load_person(*project, id).map_err(|e| e.to_string()))
                .collect::<Vec<Answer>>(),
        )
    })
    .await
    .unwrap_or_else(|e| vec![Err(e.to_string()); count]);
    batch.answers.send_replace(Some(Arc::new(answers)));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::Utc;
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::{EmbeddedPersons, PersonFiles};

    fn person(n: usize) -> Person {
        let mut properties = serde_json::Map::new();
        properties.insert("n".into(), json!(n));
        Person {
            id: Uuid::new_v4(),
            created_at: Utc::now(),
            properties,
            distinct_ids: vec![format!("user-{n}")],
            is_identified: true,
            version: 0,
        }
    }

    /// A store that has not loaded its persons into memory, over keyspaces holding `count`
    /// of them: every read goes to disk once.
    fn store_on_disk(count: usize) -> Arc<PersonStore> {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let records: Arc<dyn crate::PersonRecords> =
            Arc::new(EmbeddedPersons::open(&db, PersonFiles::temporary()).expect("open"));
        let writer = PersonStore::new(Arc::clone(&records));
        for n in 0..count {
            writer.put_person(1, person(n)).expect("put");
        }
        Arc::new(PersonStore::new(records))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reads_of_one_turn_share_a_batch_and_each_gets_its_own_person() {
        let store = store_on_disk(20);
        let reads = (0..20)
            .map(|n| format!("user-{n}"))
            .chain(["nobody".to_string()])
            .map(|id| {
                let store = Arc::clone(&store);
                async move { (id.clone(), store.read_person(1, &id).await) }
            });
        let answers: BTreeMap<String, Option<Arc<Person>>> = futures_util::future::join_all(reads)
            .await
            .into_iter()
            .map(|(id, answer)| (id, answer.expect("read")))
            .collect();
        for n in 0..20 {
            let found = answers[&format!("user-{n}")].as_ref().expect("a person");
            assert_eq!(found.properties["n"], json!(n));
        }
        assert!(answers["nobody"].is_none());
        assert_eq!(store.disk_reads.get(), (21, 1));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_turn_past_the_batch_limit_opens_more_batches() {
        let store = store_on_disk(0);
        let reads = (0..MAX_BATCH + 1).map(|n| {
            let store = Arc::clone(&store);
            async move { store.read_person(1, &format!("user-{n}")).await }
        });
        for answer in futures_util::future::join_all(reads).await {
            assert!(answer.expect("read").is_none());
        }
        assert_eq!(store.disk_reads.get(), (MAX_BATCH as u64 + 1, 2));
    }
}
