//! The pipeline with a person store that can be made to fail: an event whose person update
//! fails is not acknowledged, and its retry is processed and stored once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::Utc;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::*;
use crate::catalog::DirCatalog;
use corvid_kernel::StoreError;
use corvid_persons::{EmbeddedPersons, Person, PersonRecords};

/// Sled's records, whose person writes fail while `failing` is set.
struct Flaky {
    inner: EmbeddedPersons,
    failing: AtomicBool,
}

impl PersonRecords for Flaky {
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
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the disk is away".into()));
        }
        self.inner.put_person(project_id, person)
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
    corvid_persons::delegate_other_person_records!(inner);
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
}

fn identify(uuid: Uuid) -> WalBatch {
    let mut properties = Map::new();
    properties.insert("$set".into(), json!({"plan": "pro"}));
    WalBatch {
        project_id: 1,
        historical: false,
        events: vec![CapturedEvent {
            uuid,
            event: "$identify".into(),
            distinct_id: "ann".into(),
            properties,
            uuid_made_here: false,
            properties_json: None,
            timestamp: Utc::now(),
            created_at: Utc::now(),
        }],
    }
}

/// What a test pipeline starts from: its directory, records that can be made to fail, and
/// everything [`Ingest::start`] takes.
struct Parts {
    _dir: tempfile::TempDir,
    flaky: Arc<Flaky>,
    persons: Arc<PersonStore>,
    columns: Arc<PropertyColumns>,
    catalog: Arc<dyn SegmentCatalog>,
    files: Arc<SegmentFiles>,
    config: IngestConfig,
}

/// One shard that flushes only when asked, holding at most `max_buffered_events`.
fn parts(max_buffered_events: usize, admission_wait: std::time::Duration) -> Parts {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::Config::new()
        .path(dir.path().join("meta"))
        .open()
        .expect("sled");
    let flaky = Arc::new(Flaky {
        inner: EmbeddedPersons::open(&db, corvid_persons::PersonFiles::temporary())
            .expect("persons"),
        failing: AtomicBool::new(false),
    });
    let persons = Arc::new(PersonStore::new(
        Arc::clone(&flaky) as Arc<dyn PersonRecords>
    ));
    let columns = Arc::new(PropertyColumns::open(&db, Vec::new()).expect("columns"));
    let events_dir = dir.path().join("events");
    let catalog: Arc<dyn SegmentCatalog> =
        Arc::new(DirCatalog::open(events_dir.clone()).expect("catalog"));
    let files = Arc::new(SegmentFiles::local(&events_dir).expect("files"));
    let config = IngestConfig {
        data_dir: dir.path().to_path_buf(),
        durability: Durability::Fsync,
        shards: 1,
        flush_max_rows: 1_000_000,
        flush_max_bytes: 1 << 30,
        flush_interval: std::time::Duration::from_secs(3600),
        max_buffered_events,
        admission_wait,
        max_queued_requests: 100,
        wal_segment_bytes: 1 << 20,
        dedup_window: 1000,
        disk: corvid_kernel::real_disk(),
    };
    Parts {
        _dir: dir,
        flaky,
        persons,
        columns,
        catalog,
        files,
        config,
    }
}

/// Full buffers hold a request back until a flush makes room, up to `admission_wait`; with
/// none it is refused at once.
#[test]
fn a_request_waits_for_room_in_full_buffers() {
    for (wait, flushed, admitted) in [
        (std::time::Duration::ZERO, false, false),
        (std::time::Duration::from_millis(200), false, false),
        (std::time::Duration::from_secs(30), true, true),
    ] {
        let p = parts(1, wait);
        actix::System::new().block_on(async move {
            let ingest = Ingest::start(p.config, p.persons, p.columns, p.catalog, p.files)
                .await
                .expect("ingest starts");
            ingest.wait_for_room().await.expect("room at first");
            ingest
                .submit(identify(Uuid::now_v7()))
                .await
                .expect("stored");
            let waiting = ingest.wait_for_room();
            let flush = async {
                if flushed {
                    ingest.flush().await.expect("flush");
                }
            };
            let (waited, ()) = tokio::join!(waiting, flush);
            assert_eq!(waited.is_ok(), admitted, "{wait:?}");
            if !admitted {
                assert!(matches!(waited, Err(IngestError::Overloaded)), "{waited:?}");
            }
            ingest.shutdown().await.expect("shutdown");
        });
    }
}

#[test]
fn a_failed_person_update_is_not_acknowledged_and_its_retry_is_stored_once() {
    let Parts {
        _dir,
        flaky,
        persons,
        columns,
        catalog,
        files,
        mut config,
    } = parts(1000, std::time::Duration::ZERO);
    config.flush_max_rows = 1000;
    config.flush_max_bytes = 1 << 20;
    config.flush_interval = std::time::Duration::from_secs(60);
    flaky.failing.store(true, Ordering::SeqCst);
    actix::System::new().block_on(async move {
        let ingest = Ingest::start(config, Arc::clone(&persons), columns, catalog, files)
            .await
            .expect("ingest starts");
        let uuid = Uuid::now_v7();
        let refused = ingest.submit(identify(uuid)).await;
        assert!(matches!(refused, Err(IngestError::Store(_))), "{refused:?}");
        let stats = ingest.stats().await.expect("stats");
        assert_eq!(
            stats[0].events_stored, 0,
            "nothing stored without its person"
        );
        assert_eq!(stats[0].person_failures, 1);
        assert_eq!(
            ingest.pending_events(),
            0,
            "the refused event holds no buffer space"
        );

        // The SDK retries the same event once the store is back: it is processed, once.
        flaky.failing.store(false, Ordering::SeqCst);
        ingest
            .submit(identify(uuid))
            .await
            .expect("the retry is acknowledged");
        let stats = ingest.stats().await.expect("stats");
        assert_eq!(stats[0].events_stored, 1);
        assert_eq!(stats[0].duplicates_skipped, 0);

        // Sent again after it was stored, the client's uuid marks it a duplicate.
        ingest.submit(identify(uuid)).await.expect("acknowledged");
        let stats = ingest.stats().await.expect("stats");
        assert_eq!(
            (stats[0].events_stored, stats[0].duplicates_skipped),
            (1, 1)
        );
        let ann = persons
            .person_by_distinct_id(1, "ann")
            .expect("read")
            .expect("the person was created");
        assert_eq!(ann.properties.get("plan"), Some(&Value::from("pro")));
        ingest.flush().await.expect("flush");
        assert_eq!(
            ingest.pending_events(),
            0,
            "every accepted event was released once"
        );
        ingest.shutdown().await.expect("shutdown");
    });
}

/// The WAL record written by hand is the JSON `Serialize` writes, and replays to the same
/// events, whether an event's properties are frozen text or a map.
#[test]
fn the_wal_record_is_what_serialize_writes() {
    let mut batch = identify(Uuid::now_v7());
    batch.historical = true;
    let mut text = batch.events[0].clone();
    text.uuid = Uuid::now_v7();
    text.event = "quote \" and \u{e9}".into();
    text.distinct_id = "line\nbreak".into();
    text.properties
        .insert("n".into(), json!([1.5, {"a": null}, "\u{1F600}"]));
    text.freeze_properties();
    batch.events.push(text);
    let mut written = Vec::new();
    batch.write_wal_json(&mut written).expect("writes");
    assert_eq!(
        String::from_utf8(written.clone()).expect("utf-8"),
        serde_json::to_string(&batch).expect("serializes")
    );
    let back: WalBatch = serde_json::from_slice(&written).expect("replays");
    assert!(back.historical);
    assert_eq!(back.events.len(), 2);
    for (read, sent) in back.events.iter().zip(&batch.events) {
        assert_eq!(
            (&read.uuid, &read.event, &read.distinct_id, &read.properties),
            (&sent.uuid, &sent.event, &sent.distinct_id, &sent.properties)
        );
        assert_eq!(
            (read.timestamp, read.created_at),
            (sent.timestamp, sent.created_at)
        );
    }
}

/// One event of `distinct_id` with `properties`, `seconds` after a fixed instant.
fn event_at(name: &str, distinct_id: &str, properties: Value, seconds: i64) -> CapturedEvent {
    CapturedEvent {
        uuid: Uuid::now_v7(),
        event: name.into(),
        distinct_id: distinct_id.into(),
        properties: properties.as_object().cloned().unwrap_or_default(),
        uuid_made_here: false,
        properties_json: None,
        timestamp: chrono::DateTime::from_timestamp(1_700_000_000 + seconds, 0)
            .expect("test value"),
        created_at: Utc::now(),
    }
}

/// Each event is stored with its person's properties as they were when it was processed:
/// through the shard's reuse of the text it made for an unchanged person, past changes by
/// events, by a merge that only adds an id, and by a write from outside ingest.
#[test]
fn each_event_is_stored_with_its_persons_properties_of_that_moment() {
    let p = parts(1000, std::time::Duration::ZERO);
    let persons = Arc::clone(&p.persons);
    actix::System::new().block_on(async move {
        let ingest = Ingest::start(
            p.config,
            Arc::clone(&persons),
            p.columns,
            p.catalog,
            p.files,
        )
        .await
        .expect("ingest starts");
        let mut n = 0;
        let mut send = |name: &str, did: &str, properties: Value| {
            n += 1;
            WalBatch {
                project_id: 1,
                historical: false,
                events: vec![event_at(name, did, properties, n)],
            }
        };
        let steps = [
            send("$pageview", "ann", json!({"$set": {"plan": "pro"}})),
            send("$pageview", "ann", json!({})),
            send("$pageview", "ann", json!({})),
            send("$pageview", "ann", json!({"$set": {"plan": "pro"}})),
            send("$pageview", "ann", json!({"$set": {"plan": "team"}})),
            send("$pageview", "ann", json!({})),
        ];
        for batch in steps {
            ingest.submit(batch).await.expect("stored");
        }
        // Changed from outside ingest (the persons API, another node).
        let mut ann = persons
            .person_by_distinct_id(1, "ann")
            .expect("read")
            .expect("exists");
        ann.properties.insert("seats".into(), json!(5));
        ann.version += 1;
        persons.put_person(1, ann.clone()).expect("written");
        let steps = [
            send("$pageview", "ann", json!({})),
            send("$identify", "ann", json!({"$anon_distinct_id": "anon-1"})),
            send("$pageview", "anon-1", json!({})),
            send("$pageview", "ann", json!({"$unset": ["plan"]})),
            send("$pageview", "anon-1", json!({})),
        ];
        for batch in steps {
            ingest.submit(batch).await.expect("stored");
        }
        let filter = crate::EventFilter {
            project_id: 1,
            limit: 100,
            ..Default::default()
        };
        let mut stored = ingest.query_events(&filter).expect("read");
        stored.sort_by_key(|e| e.timestamp);
        let got: Vec<Value> = stored
            .iter()
            .map(|e| serde_json::from_str(&e.person_properties).expect("json"))
            .collect();
        let pro = json!({"plan": "pro"});
        let team = json!({"plan": "team"});
        let seats = json!({"plan": "team", "seats": 5});
        let unset = json!({"seats": 5});
        let want = [
            &pro, &pro, &pro, &pro, &team, &team, &seats, &seats, &seats, &unset, &unset,
        ];
        assert_eq!(got.iter().collect::<Vec<_>>(), want);
        assert!(
            stored.iter().all(|e| e.person_id == ann.id),
            "one person throughout"
        );
        ingest.shutdown().await.expect("shutdown");
    });
}
