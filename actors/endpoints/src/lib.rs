//! Endpoints: saved queries published as versioned HTTP APIs.
//!
//! - `model` and `store`: endpoints with immutable versions, and insight variables, behind
//!   [`EndpointRecords`] ([`SledEndpoints`] embedded, [`PgEndpoints`] in a cluster).
//! - `validate` and `changes`: save-time rules and update semantics (PostHog Gen-2);
//!   `manage`: the facade's list, create, update and delete; `views`: their JSON shape.
//! - [`request`]: the run request and its validation order.
//! - [`Endpoints::run`]: cache → materialized result → direct query, with one execution-log
//!   entry per run ([`logs`]) and per-credential rate limits ([`throttle`]).
//! - [`materialize`]: eligibility, the materializer actor and Arrow IPC results.
//! - [`openapi`]: the per-endpoint OpenAPI document.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

mod cache;
mod changes;
mod error;
mod logged;
mod logs;
mod manage;
mod materialize;
mod model;
mod openapi;
mod pg_store;
mod request;
mod run;
mod sled_store;
mod store;
mod throttle;
mod validate;
mod variables;
mod views;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono_tz::Tz;

use uuid::Uuid;

use chrono::{DateTime, Utc};

pub use changes::EndpointRequest;
pub use error::EndpointError;
pub use logs::ops::{
    fields as log_fields, Bucket, EndpointSummary, Fields, OpsAnswer, OpsQuery, Percentiles,
    StatusFilter,
};
use logs::ExecutionLogHandle;
pub use logs::{
    ExecutionLogRecords, Level, LogEntry, LogQuery, LogStats, PgExecutionLog, SledExecutionLog,
};
pub use manage::{parse_version, pick_version, UpdateOutcome};
pub use materialize::storage::{ResultStorage, S3Settings};
pub use materialize::MaterializerStats;
use materialize::{Kick, Materializer, Results};
pub use model::{Endpoint, EndpointVersion, InsightVariable, VariableType};
pub use pg_store::PgEndpoints;
pub use request::{Refresh, RunRequest};
pub use run::RunAnswer;
pub use sled_store::SledEndpoints;
pub use store::EndpointRecords;
use store::EndpointStore;
pub use throttle::Rates;
use throttle::Throttle;
pub use variables::VariableChanges;
pub use views::{endpoint_json, materialization_json, version_json};

use corvid_query::QueryEngine;
use corvid_tenancy::{StoreError, Tenancy};

/// Settings of the endpoints engine (from the service's `[endpoints]` config).
#[derive(Debug, Clone)]
pub struct EndpointSettings {
    /// Cached run answers kept at most.
    pub cache_entries: usize,
    /// How often the materializer checks for due work.
    pub materialize_interval: Duration,
    /// How long after a failed materialization it is retried.
    pub materialize_retry: Duration,
    /// Rows a materialized SQL result may hold.
    pub materialize_max_rows: usize,
    /// How long execution logs are kept.
    pub log_retention: Duration,
    pub inline_rates: Rates,
    pub materialized_rates: Rates,
}

/// The endpoint actors' statistics.
#[derive(Debug, Clone, Copy, Default)]
pub struct EndpointStats {
    pub materializer: Option<MaterializerStats>,
    pub log: Option<LogStats>,
}

/// Who is running an endpoint, in which project.
#[derive(Debug, Clone)]
pub struct Caller {
    pub project_id: u64,
    pub timezone: Tz,
    /// Rate-limit bucket: one per credential.
    pub credential: String,
}

pub struct Endpoints {
    pub store: Arc<EndpointStore>,
    engine: Arc<QueryEngine>,
    results: Arc<Results>,
    cache: Arc<cache::ResultsCache>,
    throttle: Throttle,
    log: ExecutionLogHandle,
    log_store: Arc<dyn ExecutionLogRecords>,
    materializer: Addr<Materializer>,
}

/// What a run produced before the per-run fields are added; what the results cache keeps.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    response: corvid_query::QueryResponse,
    rows: usize,
    /// How it was computed: `inline`, `materialized` or `materialized_fallback`.
    path: &'static str,
    /// When the materialized result it was read from was computed (`None`: run directly).
    materialized_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Endpoints {
    /// Opens the stores and starts the execution-log and materializer actors in the current
    /// actix system.
    pub fn start(
        records: Arc<dyn store::EndpointRecords>,
        log_store: Arc<dyn ExecutionLogRecords>,
        tenancy: Tenancy,
        engine: Arc<QueryEngine>,
        storage: materialize::storage::ResultStorage,
        settings: EndpointSettings,
        lease: corvid_kernel::JobLease,
    ) -> Result<Endpoints, StoreError> {
        let store = Arc::new(EndpointStore::new(records));
        let cache = Arc::new(cache::ResultsCache::new(settings.cache_entries));
        {
            // Weak: the records' listener must not keep the store that owns them alive.
            let (copies, answers) = (Arc::downgrade(&store), Arc::downgrade(&cache));
            store.records().watch(Arc::new(move |change| {
                if let Some(copies) = copies.upgrade() {
                    copies.forget_remote(change.as_ref());
                }
                if let Some(answers) = answers.upgrade() {
                    match &change {
                        Some(c) => answers.forget_endpoint(c.id),
                        None => answers.clear(),
                    }
                }
            }));
        }
        let results = Arc::new(Results::new(storage, settings.materialize_max_rows));
        let materializer = Materializer::new(
            Arc::clone(&store),
            tenancy,
            Arc::clone(&engine),
            Arc::clone(&results),
            settings.materialize_interval,
            settings.materialize_retry,
            lease,
        )
        .start();
        Ok(Endpoints {
            store,
            engine,
            results,
            cache,
            throttle: Throttle::new(settings.inline_rates, settings.materialized_rates),
            log: ExecutionLogHandle::start(Arc::clone(&log_store), settings.log_retention)?,
            log_store,
            materializer,
        })
    }

    /// What the materializer and the execution log are doing; `None` for an actor that is not
    /// running.
    pub async fn stats(&self) -> EndpointStats {
        EndpointStats {
            materializer: self
                .materializer
                .send(materialize::GetMaterializerStats)
                .await
                .ok(),
            log: self.log.addr.send(logs::GetLogStats).await.ok(),
        }
    }

    /// The first of the endpoint actors that stopped, if any: the process must not run on
    /// without it (runs would go unlogged, materialized results stale).
    pub fn failed_component(&self) -> Option<&'static str> {
        if !self.materializer.connected() {
            Some("the materializer stopped")
        } else if !self.log.alive() {
            Some("the execution-log writer stopped")
        } else {
            None
        }
    }

    /// Asks the materializer to look for due work now.
    pub fn kick_materializer(&self) {
        self.materializer.do_send(Kick);
    }

    /// Drops cached answers of an endpoint (after an edit).
    pub fn forget(&self, endpoint: Uuid) {
        self.cache.forget_endpoint(endpoint);
    }

    /// Writes the execution log's pending entries and waits until they are synced (blocking;
    /// call at shutdown from a blocking thread).
    pub fn sync_logs(&self) -> bool {
        self.log.sync(Duration::from_secs(5))
    }

    /// The endpoint (active or not), from memory when possible.
    pub async fn load(
        &self,
        project_id: u64,
        name: &str,
    ) -> Result<Option<Arc<Endpoint>>, EndpointError> {
        if let Some(hit) = self.store.cached(project_id, name) {
            return Ok(Some(hit));
        }
        let store = Arc::clone(&self.store);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || store.load(project_id, &name))
            .await
            .map_err(|e| EndpointError::Store(StoreError::TaskFailed(e.to_string())))?
            .map_err(EndpointError::from)
    }

    /// Searches an endpoint's execution log.
    pub async fn logs(
        &self,
        project_id: u64,
        endpoint_id: Uuid,
        query: LogQuery,
    ) -> Result<Vec<LogEntry>, EndpointError> {
        let store = Arc::clone(&self.log_store);
        tokio::task::spawn_blocking(move || store.search(project_id, Some(endpoint_id), &query))
            .await
            .map_err(|e| EndpointError::Store(StoreError::TaskFailed(e.to_string())))?
            .map_err(EndpointError::from)
    }

    /// Ops log search over the project's execution logs (see [`logs::ops`]).
    pub async fn search_logs(
        &self,
        project_id: u64,
        query: OpsQuery,
    ) -> Result<OpsAnswer, EndpointError> {
        let store = Arc::clone(&self.log_store);
        tokio::task::spawn_blocking(move || {
            let range = query.range(Utc::now());
            Ok(store.ops_search(project_id, &query, range)?)
        })
        .await
        .map_err(|e| EndpointError::Store(StoreError::TaskFailed(e.to_string())))?
    }

    /// The lines matching `query` written after `after`, oldest first (at most the query's
    /// limit): what a live tail sends next.
    pub async fn tail_logs(
        &self,
        project_id: u64,
        query: OpsQuery,
        after: DateTime<Utc>,
    ) -> Result<Vec<LogEntry>, EndpointError> {
        let store = Arc::clone(&self.log_store);
        tokio::task::spawn_blocking(move || {
            let mut scan = query.base.clone();
            scan.after = Some(after);
            scan.before = None;
            let mut found: Vec<LogEntry> = store
                .search(project_id, query.endpoint, &scan)?
                .into_iter()
                .filter(|e| query.keeps(e))
                .collect();
            found.reverse();
            Ok(found)
        })
        .await
        .map_err(|e| EndpointError::Store(StoreError::TaskFailed(e.to_string())))?
    }
}

/// The PostgreSQL schema of this crate's tables (`migrations/`), applied by the engine with every
/// other crate's.
pub const MIGRATIONS: &[corvid_kernel::Migration] = &[corvid_kernel::Migration {
    version: 5,
    name: "endpoints",
    sql: include_str!("../migrations/0005_endpoints.sql"),
}];
