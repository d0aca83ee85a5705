//! Runs prepared statements with DataFusion on a runtime of its own.
//!
//! Query work is CPU-heavy and would stall request handling if it ran on the HTTP event loops,
//! so the engine owns a dedicated multi-threaded tokio runtime ("corvid-query" threads). Each
//! query gets a fresh session holding only its project's tables, a memory pool of its own drawn
//! from the node's ([`super::memory`]; no spilling: exceeding either is the query's error) and a
//! deadline. At most `max_concurrent` queries run at once: a request past that gets
//! [`QueryError::Busy`] (503), background work waits its turn ([`QueryEngine::waiting`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::GreedyMemoryPool;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DfStatement;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::QueryError;
use super::functions;
use super::hogql::{use_materialized, Prepared, RowLimits};
use super::results;
use super::run_count;
use super::tables;
use super::uniq;
use corvid_events::PropertyColumns;
use corvid_events::{tail_snapshot, Tail};
use corvid_events::{SegmentCatalog, SegmentRef};
use corvid_events::{SegmentFiles, SEGMENTS_URL};
use corvid_kernel::runtime::OwnedRuntime;
use corvid_kernel::start_over::StartOverMap;
use corvid_persons::PersonStore;

/// Segment files whose column lists are remembered at most.
const FILE_COLUMNS_KEPT: usize = 100_000;

/// Limits and sizing (from `[query]` in the config).
#[derive(Debug, Clone)]
pub struct QuerySettings {
    pub timeout: Duration,
    pub memory_limit_bytes: usize,
    /// Memory all running queries may hold together.
    pub node_memory_bytes: usize,
    /// Queries running at once.
    pub max_concurrent: usize,
    /// Queries one credential runs at once.
    pub max_concurrent_per_credential: usize,
    pub default_rows: usize,
    pub max_rows: usize,
    /// Worker threads of the query runtime (and DataFusion's target partitions).
    pub threads: usize,
    /// Bytes of Parquet footers and page indexes the runtime keeps between queries (shared
    /// by all of them; least recently used out first).
    pub metadata_cache_bytes: usize,
    /// DataFusion session options (`datafusion.execution.batch_size` = "16384", …) set on
    /// every query's session; checked when the engine is built.
    pub datafusion_options: Vec<(String, String)>,
}

impl QuerySettings {
    /// The session options every query runs with.
    fn session_config(&self) -> Result<SessionConfig, QueryError> {
        let mut config = SessionConfig::new()
            .with_target_partitions(self.threads.max(1))
            .with_information_schema(false);
        for (key, value) in &self.datafusion_options {
            config.options_mut().set(key, value).map_err(|e| {
                QueryError::Invalid(format!("query.datafusion option {key} = {value:?}: {e}"))
            })?;
        }
        Ok(config)
    }

    pub fn row_limits(&self) -> RowLimits {
        RowLimits {
            default_rows: self.default_rows,
            max_rows: self.max_rows,
            page: None,
        }
    }
}

/// Where a project's data lives.
pub struct Sources {
    /// Which segments exist.
    pub catalog: Arc<dyn SegmentCatalog>,
    /// Their bytes (registered in the query runtime, so DataFusion reads them there too).
    pub files: Arc<SegmentFiles>,
    pub tails: Vec<Arc<Tail>>,
    pub persons: Arc<PersonStore>,
    /// Property keys ingest writes as their own segment columns, per project.
    pub columns: Arc<PropertyColumns>,
    /// Which materialized columns each segment file has (files never change once written);
    /// bounded: it starts over past [`FILE_COLUMNS_KEPT`] files (compaction keeps making new
    /// versions).
    pub file_columns: StartOverMap<SegmentRef, Arc<BTreeSet<String>>>,
    /// Object stores and caches every query shares (no disk spilling).
    runtime: Arc<RuntimeEnv>,
}

impl Sources {
    pub fn new(
        catalog: Arc<dyn SegmentCatalog>,
        files: Arc<SegmentFiles>,
        tails: Vec<Arc<Tail>>,
        persons: Arc<PersonStore>,
        columns: Arc<PropertyColumns>,
    ) -> Sources {
        let runtime = RuntimeEnvBuilder::new()
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()
            .unwrap_or_else(|_| Arc::new(RuntimeEnv::default()));
        // A constant URL: it parses, and every query test reads segments through it.
        match ObjectStoreUrl::parse(SEGMENTS_URL) {
            Ok(url) => {
                runtime.register_object_store(url.as_ref(), files.store());
            }
            Err(e) => tracing::error!(error = %e, "segment store URL does not parse"),
        }
        Sources {
            catalog,
            files,
            tails,
            persons,
            columns,
            file_columns: StartOverMap::new(FILE_COLUMNS_KEPT),
            runtime,
        }
    }

    /// The newest erasure request or retention drop of `project` (blocking).
    fn last_removal(
        &self,
        project: u64,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, QueryError> {
        let internal = |e: corvid_kernel::StoreError| QueryError::Internal(Box::new(e));
        let erased = self
            .persons
            .erasures(project)
            .map_err(internal)?
            .all
            .latest_request();
        let dropped = self
            .catalog
            .drops(project)
            .map_err(|e| QueryError::Internal(Box::new(e)))?
            .iter()
            .map(|d| d.dropped_at)
            .max();
        Ok(erased.max(dropped))
    }

    /// `project`'s materialized keys present in every one of `segments`.
    async fn materialized_in(&self, project: u64, segments: &[SegmentRef]) -> Vec<String> {
        let mut keys: Vec<String> = self.columns.keys_for(project);
        for segment in segments {
            if keys.is_empty() {
                break;
            }
            let cached = self.file_columns.get(segment);
            let columns = match cached {
                Some(c) => c,
                None => {
                    let Ok(c) = self.files.column_names(segment).await else {
                        return Vec::new();
                    };
                    let c = Arc::new(c);
                    self.file_columns.insert(segment.clone(), Arc::clone(&c));
                    c
                }
            };
            keys.retain(|k| columns.contains(&corvid_events::materialized_column(k)));
        }
        keys
    }
}

/// A finished query.
#[derive(Debug, Clone)]
pub struct QueryOutput {
    pub columns: Vec<String>,
    /// `[name, ClickHouse type]` per column.
    pub types: Vec<(String, String)>,
    pub rows: Vec<Vec<Value>>,
    pub has_more: bool,
    /// The statement as run, after HogQL rewriting.
    pub sql: String,
    pub elapsed: Duration,
}

pub struct QueryEngine {
    runtime: OwnedRuntime,
    sources: Arc<Sources>,
    settings: QuerySettings,
    /// One per query allowed to run at once.
    slots: Arc<Semaphore>,
    /// The node's memory, which every query's pool draws from.
    node_memory: Arc<GreedyMemoryPool>,
    /// Queries each credential runs now.
    gate: super::gate::QueryGate,
}

tokio::task_local! {
    /// Set for background work, whose queries wait for a slot instead of failing.
    static WAITS_FOR_A_SLOT: bool;
}

impl QueryEngine {
    /// Fails when a `datafusion_options` entry is not a DataFusion option or not a valid value.
    pub fn new(settings: QuerySettings, sources: Sources) -> std::io::Result<QueryEngine> {
        settings
            .session_config()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let runtime = OwnedRuntime::new("corvid-query", settings.threads)?;
        // A query reads every file's footer and page index; a cache smaller than the files a
        // query spans evicts each one just before it is needed again.
        sources
            .runtime
            .cache_manager
            .get_file_metadata_cache()
            .update_cache_limit(settings.metadata_cache_bytes);
        Ok(QueryEngine {
            runtime,
            sources: Arc::new(sources),
            slots: Arc::new(Semaphore::new(settings.max_concurrent.max(1))),
            node_memory: Arc::new(GreedyMemoryPool::new(settings.node_memory_bytes)),
            gate: super::gate::QueryGate::new(settings.max_concurrent_per_credential),
            settings,
        })
    }

    /// A place for a query of `credential` (its limit key), held while the ticket lives;
    /// [`QueryError::CredentialBusy`] when it runs its maximum already.
    pub fn admit(&self, credential: &str) -> Result<super::QueryTicket, QueryError> {
        self.gate.enter(credential)
    }

    /// Credentials with queries running now.
    pub fn credentials_running(&self) -> usize {
        self.gate.credentials_running()
    }

    /// Runs `work` with its queries waiting for a free slot rather than failing with
    /// [`QueryError::Busy`]: for background jobs (materializations, survey upkeep).
    pub async fn waiting<F: std::future::Future>(work: F) -> F::Output {
        WAITS_FOR_A_SLOT.scope(true, work).await
    }

    /// What a query running on the runtime needs: the sources, the settings, the node's memory.
    pub(crate) fn parts(&self) -> (Arc<Sources>, QuerySettings, Arc<GreedyMemoryPool>) {
        (
            Arc::clone(&self.sources),
            self.settings.clone(),
            Arc::clone(&self.node_memory),
        )
    }

    /// The query runtime's handle.
    pub(crate) fn runtime_handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    pub(crate) async fn slot(&self) -> Result<OwnedSemaphorePermit, QueryError> {
        if WAITS_FOR_A_SLOT.try_with(|w| *w).unwrap_or(false) {
            return Arc::clone(&self.slots)
                .acquire_owned()
                .await
                .map_err(|e| QueryError::Internal(Box::new(e)));
        }
        Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| QueryError::Busy)
    }

    /// Bytes all running queries hold now.
    pub fn memory_in_use(&self) -> usize {
        use datafusion::execution::memory_pool::MemoryPool;
        self.node_memory.reserved()
    }

    /// When data of `project` was last removed: the newest erasure's request or retention
    /// drop. An answer computed before it (a cached or materialized result) may still hold
    /// what was removed.
    pub async fn last_removal(
        &self,
        project: u64,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, QueryError> {
        let sources = Arc::clone(&self.sources);
        tokio::task::spawn_blocking(move || sources.last_removal(project))
            .await
            .map_err(|e| QueryError::Internal(Box::new(e)))?
    }

    /// [`QueryEngine::last_removal`] from a blocking thread.
    pub fn last_removal_blocking(
        &self,
        project: u64,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, QueryError> {
        self.sources.last_removal(project)
    }

    pub fn settings(&self) -> &QuerySettings {
        &self.settings
    }

    /// Runs `prepared` against `project_id`'s data, on the query runtime.
    pub async fn run(
        &self,
        project_id: u64,
        prepared: Prepared,
    ) -> Result<QueryOutput, QueryError> {
        let returned_rows = prepared.returned_rows;
        let started = Instant::now();
        let done = self.run_arrow(project_id, prepared).await?;
        let total: usize = done.batches.iter().map(|b| b.num_rows()).sum();
        let rows = results::rows(&done.batches, returned_rows);
        let columns: Vec<String> = done
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let types = results::types(&done.schema);
        Ok(QueryOutput {
            columns,
            types,
            rows,
            has_more: total > returned_rows,
            sql: done.sql,
            elapsed: started.elapsed(),
        })
    }

    /// Runs `prepared` and returns its Arrow result as computed (the materializer stores it).
    pub async fn run_arrow(
        &self,
        project_id: u64,
        prepared: Prepared,
    ) -> Result<ArrowOutput, QueryError> {
        let slot = self.slot().await?;
        let sources = Arc::clone(&self.sources);
        let settings = self.settings.clone();
        let node_memory = Arc::clone(&self.node_memory);
        let handle = self.runtime.handle().spawn(async move {
            let _slot = slot;
            let deadline = settings.timeout;
            let run = execute(project_id, prepared, &sources, &settings, node_memory);
            match tokio::time::timeout(deadline, run).await {
                Ok(result) => result,
                Err(_) => Err(QueryError::Timeout(deadline)),
            }
        });
        handle
            .await
            .map_err(|e| QueryError::Internal(Box::new(e)))?
    }
}

/// A query's result as Arrow batches.
#[derive(Debug, Clone)]
pub struct ArrowOutput {
    pub schema: arrow::datatypes::SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// The statement as run.
    pub sql: String,
}

async fn execute(
    project_id: u64,
    prepared: Prepared,
    sources: &Sources,
    settings: &QuerySettings,
    node_memory: Arc<GreedyMemoryPool>,
) -> Result<ArrowOutput, QueryError> {
    let (ctx, events) = session(project_id, &prepared, sources, settings, node_memory).await?;
    let df_err = |e| QueryError::from_datafusion(e, settings.memory_limit_bytes);
    let internal = |e: datafusion::error::DataFusionError| QueryError::Internal(Box::new(e));
    // Over `events` alone, `properties.<key>` reads the key's column when every segment has
    // it; the table then shows exactly the columns used (so `SELECT *` never lists them).
    // Should the rewritten statement not plan (e.g. a CTE that only passes `properties` on),
    // the statement runs as written: same results, read from JSON.
    let mut statement = prepared.statement;
    let only_events = prepared.tables.iter().all(|t| t == "events");
    let mut plan = None;
    if let Some(events) = &events {
        let mut fast = statement.clone();
        let used = if only_events {
            use_materialized(&mut fast, &events.available)
        } else {
            BTreeSet::new()
        };
        if !used.is_empty() {
            ctx.register_table("events", events.table(&used).map_err(internal)?)
                .map_err(internal)?;
            if let Ok(p) = ctx
                .state()
                .statement_to_plan(DfStatement::Statement(Box::new(fast.clone())))
                .await
            {
                plan = Some(p);
                statement = fast;
            }
        }
        if plan.is_none() {
            // The materialized-column table did not plan (or was not made): read JSON instead.
            ctx.deregister_table("events").map_err(internal)?;
            ctx.register_table("events", events.table(&BTreeSet::new()).map_err(internal)?)
                .map_err(internal)?;
        }
    }
    let sql = statement.to_string();
    let plan = match plan {
        Some(p) => p,
        None => ctx
            .state()
            .statement_to_plan(DfStatement::Statement(Box::new(statement)))
            .await
            .map_err(df_err)?,
    };
    let frame = ctx.execute_logical_plan(plan).await.map_err(df_err)?;
    let schema = Arc::new(frame.schema().as_arrow().clone());
    let batches: Vec<RecordBatch> = frame.collect().await.map_err(df_err)?;
    Ok(ArrowOutput {
        schema,
        batches,
        sql,
    })
}

/// The `events` snapshot of a query, registered once the statement says which materialized
/// columns it reads.
pub(crate) struct EventsSnapshot {
    files: Vec<(chrono::NaiveDate, String)>,
    tail: Vec<corvid_events::StoredEvent>,
    /// Erasures the files' rows are filtered by (the tail is already without them).
    erased: Arc<corvid_persons::ErasedSet>,
    /// Materialized keys every file has.
    available: BTreeSet<String>,
}

impl EventsSnapshot {
    pub(crate) fn table(
        &self,
        keys: &BTreeSet<String>,
    ) -> datafusion::error::Result<Arc<tables::EventsTable>> {
        let keys: Vec<String> = keys.iter().cloned().collect();
        Ok(Arc::new(tables::EventsTable::new(
            self.files.clone(),
            &self.tail,
            &keys,
            Some(Arc::clone(&self.erased)),
        )?))
    }
}

/// A fresh session with only `project_id`'s tables (only those the statement names); `events`
/// is returned as a snapshot for the caller to register.
pub(crate) async fn session(
    project_id: u64,
    prepared: &Prepared,
    sources: &Sources,
    settings: &QuerySettings,
    node_memory: Arc<GreedyMemoryPool>,
) -> Result<(SessionContext, Option<EventsSnapshot>), QueryError> {
    let internal = |e: datafusion::error::DataFusionError| QueryError::Internal(Box::new(e));
    // Caches (Parquet footers, file statistics) are shared by every query; the memory pool is
    // the query's own, drawn from the node's.
    let runtime = Arc::new(RuntimeEnv {
        memory_pool: Arc::new(super::memory::QueryPool::new(
            settings.memory_limit_bytes,
            node_memory,
        )),
        disk_manager: Arc::clone(&sources.runtime.disk_manager),
        cache_manager: Arc::clone(&sources.runtime.cache_manager),
        object_store_registry: Arc::clone(&sources.runtime.object_store_registry),
    });
    let config = settings.session_config()?;
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_default_features()
        .with_physical_optimizer_rule(Arc::new(run_count::RunCountRule))
        .build();
    let ctx = SessionContext::new_with_state(state);
    for udf in functions::all() {
        ctx.register_udf(udf);
    }
    ctx.register_udaf(uniq::udaf());
    let wants = |name: &str| prepared.tables.contains(name);
    let mut events = None;
    if wants("events") {
        let erasures = sources
            .persons
            .erasures(project_id)
            .map_err(|e| QueryError::Internal(Box::new(e)))?;
        let snap = tail_snapshot(
            sources.catalog.as_ref(),
            &sources.tails,
            project_id,
            None,
            None,
            |e| e.project_id == project_id && !e.erased_by(&erasures.all),
        )
        .map_err(|e| QueryError::Internal(Box::new(e)))?;
        events = Some(EventsSnapshot {
            available: sources
                .materialized_in(project_id, &snap.segments)
                .await
                .into_iter()
                .collect(),
            files: snap
                .segments
                .iter()
                .map(|s| (s.day, sources.files.url(s)))
                .collect(),
            tail: snap.tail,
            erased: Arc::clone(&erasures.hidden),
        });
    }
    if wants("persons") || wants("person_distinct_ids") {
        let persons = sources
            .persons
            .persons(project_id)
            .map_err(|e| QueryError::Internal(Box::new(e)))?;
        ctx.register_table(
            "persons",
            tables::persons_table(&persons).map_err(internal)?,
        )
        .map_err(internal)?;
        ctx.register_table(
            "person_distinct_ids",
            tables::person_distinct_ids_table(&persons).map_err(internal)?,
        )
        .map_err(internal)?;
    }
    if wants("groups") {
        let groups = sources
            .persons
            .groups(project_id, None)
            .map_err(|e| QueryError::Internal(Box::new(e)))?;
        ctx.register_table("groups", tables::groups_table(&groups).map_err(internal)?)
            .map_err(internal)?;
    }
    Ok((ctx, events))
}
