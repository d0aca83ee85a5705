//! A query engine over real segments and a real tail in a temporary directory, for tests.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::{
    prepare_user_sql, Bindings, QueryAnswer, QueryEngine, QueryError, QueryKind, QueryOutput,
    QuerySettings, Sources,
};
use corvid_events::{
    write_committed, DirCatalog, PropertyColumns, SegmentCatalog, SegmentFiles, SegmentName,
    SegmentRef, StoredEvent,
};
use corvid_persons::{Person, PersonStore};

pub struct Fixture {
    pub engine: Arc<QueryEngine>,
    pub columns: Arc<PropertyColumns>,
    pub catalog: Arc<dyn SegmentCatalog>,
    pub files: Arc<SegmentFiles>,
    pub persons: Arc<PersonStore>,
    _dir: tempfile::TempDir,
}

/// Keys the fixtures' segments materialize: `$browser` reads a column, everything else JSON.
pub fn materialized() -> Vec<String> {
    vec!["$browser".to_string()]
}

pub fn settings() -> QuerySettings {
    QuerySettings {
        timeout: Duration::from_secs(30),
        memory_limit_bytes: 512 << 20,
        node_memory_bytes: 1 << 30,
        max_concurrent: 8,
        max_concurrent_per_credential: 8,
        default_rows: 10_000,
        max_rows: 50_000,
        threads: 2,
        metadata_cache_bytes: 64 << 20,
        datafusion_options: Vec::new(),
    }
}

impl Fixture {
    /// `segments` go to Parquet files (one per day), `tail` stays in memory.
    pub fn new(segments: Vec<StoredEvent>, tail: Vec<StoredEvent>) -> Fixture {
        Fixture::with_settings(segments, tail, settings())
    }

    pub fn with_settings(
        segments: Vec<StoredEvent>,
        tail: Vec<StoredEvent>,
        settings: QuerySettings,
    ) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let catalog: Arc<dyn SegmentCatalog> =
            Arc::new(DirCatalog::open(dir.path().join("events")).expect("catalog"));
        // Read from the store's root below a key prefix, as a cluster's bucket is (the
        // embedded events directory is covered by the server's tests).
        let root = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).expect("fs");
        let files = Arc::new(SegmentFiles::under(Arc::new(root), "events").expect("files"));
        let mut by_file: std::collections::BTreeMap<_, Vec<&StoredEvent>> = Default::default();
        for e in &segments {
            by_file.entry((e.project_id, e.day())).or_default().push(e);
        }
        for ((project, day), mut rows) in by_file {
            let segment = SegmentRef {
                project,
                day,
                name: SegmentName {
                    node: 0,
                    shard: 0,
                    first: 1,
                    last: 1,
                    version: 0,
                },
            };
            write_committed(catalog.as_ref(), &segment, &mut rows, &materialized())
                .expect("segment");
        }
        let t = corvid_events::testing::tail_of(tail);
        let db = sled::Config::new()
            .path(dir.path().join("meta"))
            .open()
            .expect("sled");
        let persons = Arc::new(
            PersonStore::open(&db, corvid_persons::PersonFiles::temporary()).expect("persons"),
        );
        persons
            .put_person(
                1,
                Person {
                    id: Uuid::new_v5(&Uuid::NAMESPACE_OID, b"alice"),
                    created_at: Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap(),
                    properties: json!({"email": "alice@example.com", "plan": "pro"})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                    is_identified: true,
                    version: 0,
                    distinct_ids: vec!["alice".into(), "alice-anon".into()],
                },
            )
            .expect("person");
        let columns = Arc::new(PropertyColumns::open(&db, materialized()).expect("columns"));
        let engine = Arc::new(
            QueryEngine::new(
                settings,
                Sources::new(
                    Arc::clone(&catalog),
                    Arc::clone(&files),
                    vec![t],
                    Arc::clone(&persons),
                    Arc::clone(&columns),
                ),
            )
            .expect("engine"),
        );
        Fixture {
            engine,
            columns,
            catalog,
            files,
            persons,
            _dir: dir,
        }
    }

    /// Adds one more committed segment of project 1 (`shard` tells it apart), materializing
    /// `keys`.
    pub fn add_segment(&self, shard: usize, events: Vec<StoredEvent>, keys: &[String]) {
        let mut rows: Vec<&StoredEvent> = events.iter().collect();
        let segment = SegmentRef {
            project: 1,
            day: events[0].day(),
            name: SegmentName {
                node: 0,
                shard,
                first: 1,
                last: 1,
                version: 0,
            },
        };
        write_committed(self.catalog.as_ref(), &segment, &mut rows, keys).expect("segment");
    }

    pub fn run_with(&self, sql: &str, bindings: &Bindings<'_>) -> Result<QueryOutput, QueryError> {
        let prepared = prepare_user_sql(sql, bindings, self.engine.settings().row_limits())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(self.engine.run(1, prepared))
    }

    pub fn run(&self, sql: &str) -> Result<QueryOutput, QueryError> {
        self.run_with(sql, &Bindings::default())
    }

    pub fn rows(&self, sql: &str) -> Vec<Vec<Value>> {
        match self.run(sql) {
            Ok(out) => out.rows,
            Err(e) => panic!("{sql}: {e}"),
        }
    }

    pub fn one(&self, sql: &str) -> Value {
        let rows = self.rows(sql);
        assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
        rows[0][0].clone()
    }
}

impl Fixture {
    /// Runs a query object (`{"kind": …}`) for project 1 in timezone `tz`.
    pub fn query(&self, tz: &str, query: Value) -> Result<QueryAnswer, QueryError> {
        let kind: QueryKind =
            serde_json::from_value(query).map_err(|e| QueryError::InvalidInsight(e.to_string()))?;
        let tz: chrono_tz::Tz = tz.parse().expect("timezone");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(self.engine.insight(1, tz, kind, &Default::default()))
    }
}
