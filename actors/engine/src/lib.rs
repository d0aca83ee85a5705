//! The engine as one unit: picks the implementation behind every storage trait (embedded or a
//! cluster's), opens every domain's storage, starts its actors and every background job
//! ([`jobs`]), and hands the service one facade per domain. The service never sees storage.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead (tests may slice what they built themselves).
#![cfg_attr(not(test), warn(clippy::string_slice))]

pub mod jobs;
pub mod snapshot;

pub use snapshot::{
    aws_environment, restore as restore_snapshot, take_offline as snapshot_offline, SnapshotError,
    SnapshotReport,
};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use corvid_activity::{ActivityLog, ActivityRecords, LoggedRecords, PgActivity, SledActivity};
use corvid_endpoints::{
    EndpointRecords, EndpointSettings, EndpointStats, Endpoints, ExecutionLogRecords, PgEndpoints,
    PgExecutionLog, ResultStorage, SledEndpoints, SledExecutionLog,
};
use corvid_events::CachedSegments;
use corvid_events::PropertyColumns;
use corvid_events::SegmentFiles;
use corvid_events::{CompactionConfig, Compactor, RetentionPolicy};
use corvid_events::{DirCatalog, PgCatalog, SegmentCatalog};
use corvid_events::{Ingest, IngestConfig, IngestError, ShardStats};
use corvid_flags::{FlagRecords, FlagStore, GeoIp, OwnedFlags, PgFlags, SledFlags};
use corvid_flags::{Flags, FlagsSettings};
use corvid_kernel::bucket::{key_prefix, s3_bucket, s3_store, S3Settings};
use corvid_kernel::histogram::HistogramSnapshot;
use corvid_kernel::pg::Pg;
use corvid_kernel::{DefinitionRecords, JobLease, PgClaims, PgRecords, SledRecords, StoreError};
use corvid_lifecycle::{BatchExports, BatchRecords, BatchSettings, Exports};
use corvid_oauth::{GrantRecords, OAuth, OAuthSettings, PgGrants, SledGrants};
use corvid_persons::{
    EmbeddedPersons, PersonFiles, PersonRecords, PersonStore, Persons, PgPersons, WriteBehind,
};
use corvid_query::{QueryEngine, QuerySettings, Sources};
use corvid_surfaces::early_access::EarlyAccess;
use corvid_surfaces::experiments::Experiments;
use corvid_surfaces::remote_config::RemoteConfig;
use corvid_surfaces::surveys::Surveys;
use corvid_tenancy::{PgMetadata, SledMetadata, Tenancy, TenancySettings};
use corvid_webhooks::{
    Claims as WebhookClaims, WebhookSettings, WebhookStores, Webhooks, STORE_NAMES,
};

pub use corvid_kernel::pg::PgSettings;
pub use jobs::{JobReport, JobScope};

/// Every crate's PostgreSQL schema, each beside the crate that owns its tables.
pub const MIGRATIONS: &[&[corvid_kernel::Migration]] = &[
    corvid_kernel::MIGRATIONS,
    corvid_activity::MIGRATIONS,
    corvid_tenancy::MIGRATIONS,
    corvid_oauth::MIGRATIONS,
    corvid_persons::MIGRATIONS,
    corvid_flags::MIGRATIONS,
    corvid_endpoints::MIGRATIONS,
    corvid_events::MIGRATIONS,
    corvid_surfaces::MIGRATIONS,
];
use jobs::{Job, Jobs};

/// What [`migrate_metastore`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Migrated {
    /// Versions applied now, oldest first (empty when the schema was current).
    pub applied: Vec<i32>,
    /// The schema version the metastore is at.
    pub version: i32,
}

/// Brings the cluster metastore's schema (PostgreSQL) up to this build's version; refuses a
/// newer one. Safe to run from many nodes at once. Blocking.
pub fn migrate_metastore(settings: &PgSettings) -> Result<Migrated, EngineError> {
    let pg = corvid_kernel::pg::Pg::connect(settings)?;
    let applied = corvid_kernel::pg::migrations::migrate(&pg, MIGRATIONS)?;
    let version = corvid_kernel::pg::migrations::current(&pg)?;
    Ok(Migrated { applied, version })
}

/// Where the engine keeps its state.
#[derive(Debug, Clone, Default)]
pub enum Storage {
    /// sled and local files under the data directory: one node, no services (the default).
    #[default]
    Embedded,
    /// Shared with other nodes: PostgreSQL for records and catalogs, a bucket for segment
    /// files and materialized results. The WAL stays in the node's data directory, and so
    /// do the promoted property columns (a cache of what the compactor found frequent).
    Cluster(Box<ClusterSettings>),
}

/// One cluster node's view of the shared services.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Unique per node: names its claims and numbers its segments.
    pub node_id: String,
    pub postgres: PgSettings,
    pub bucket: S3Settings,
    /// Segment bytes read from the bucket kept in memory for the next reads, at most.
    pub segment_cache_bytes: usize,
}

/// Bytes of the embedded person keyspaces' block cache when the settings name none.
pub const DEFAULT_PERSON_CACHE_BYTES: u64 = 64 << 20;

/// What the engine keeps in memory beside what requests bring.
#[derive(Debug, Clone, Copy)]
pub struct MemorySettings {
    /// Bytes of persons kept in memory ([`PersonStore::with_budget`]).
    pub persons_bytes: usize,
    /// Bytes of sled's page cache, for the embedded store and a node's own database.
    pub storage_cache_bytes: u64,
    /// Bytes of the embedded person keyspaces' block cache ([`PersonFiles`]).
    pub person_cache_bytes: u64,
}

impl Default for MemorySettings {
    fn default() -> MemorySettings {
        MemorySettings {
            persons_bytes: corvid_persons::DEFAULT_PERSON_BUDGET,
            storage_cache_bytes: corvid_tenancy::DEFAULT_CACHE_BYTES,
            person_cache_bytes: DEFAULT_PERSON_CACHE_BYTES,
        }
    }
}

/// Everything the engine is configured with.
#[derive(Clone)]
pub struct EngineSettings {
    pub storage: Storage,
    /// Root of the embedded state: `meta/` (sled), `wal/`, `events/`.
    pub data_dir: PathBuf,
    pub tenancy: TenancySettings,
    pub ingest: IngestConfig,
    /// Property keys every project's segments store as their own columns.
    pub materialized_properties: Vec<String>,
    pub compaction: CompactionConfig,
    pub compaction_interval: Duration,
    /// How many days a project keeps when it sets no retention of its own (`None`: all).
    pub default_event_retention_days: Option<u32>,
    /// How often retention drops days past it.
    pub retention_interval: Duration,
    /// How long one file export may run.
    pub export_timeout: Duration,
    pub batch_exports: BatchSettings,
    pub query: QuerySettings,
    pub endpoints: EndpointSettings,
    pub results: ResultStorage,
    pub oauth: OAuthSettings,
    pub flags: FlagsSettings,
    pub memory: MemorySettings,
    /// A MaxMind city database for `/flags` GeoIP.
    pub geoip: Option<PathBuf>,
    pub webhooks: WebhookSettings,
    pub jobs: JobSettings,
}

/// How often the engine's periodic jobs run ([`crate::jobs`]).
#[derive(Debug, Clone)]
pub struct JobSettings {
    /// Usage counts held in memory written to storage (on every node: the counts are its own).
    pub usage_flush: Duration,
    /// Expired OAuth codes, tokens and sessions deleted (on one node of a cluster).
    pub oauth_prune: Duration,
    /// Surveys stopped at their response limits and moved to their next iteration (on one
    /// node of a cluster).
    pub survey_upkeep: Duration,
    /// Finished file exports older than `export_run_ttl` deleted (on every node: their files
    /// are the node's own).
    pub export_expiry: Duration,
    pub export_run_ttl: Duration,
    /// Scheduled exports make and start their runs (on one node of a cluster).
    pub batch_export_tick: Duration,
    /// Activity-log entries older than `activity_ttl` deleted (on one node of a cluster).
    pub activity_expiry: Duration,
    pub activity_ttl: Duration,
    /// Webhook deliveries made from new activity entries and sent (on one node of a
    /// cluster; each webhook's sends under a claim of its own).
    pub webhook_dispatch: Duration,
}

impl EngineError {
    /// Whether starting again later may succeed: the cluster's metastore could not be
    /// reached (a schema newer than this build is not such a case).
    pub fn is_unreachable_metastore(&self) -> bool {
        matches!(self, EngineError::Metastore(e) if !matches!(e, StoreError::SchemaTooNew { .. }))
    }
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot open the metadata store (is another Corvid using this data dir?)")]
    Metadata(#[source] StoreError),
    #[error("cannot open a store")]
    Store(#[from] StoreError),
    #[error("cannot open the events directory or start a thread")]
    Io(#[from] std::io::Error),
    #[error("cannot start the ingest pipeline")]
    Ingest(#[from] IngestError),
    #[error("cannot open the GeoIP database")]
    GeoIp(#[from] corvid_flags::GeoIpError),
    #[error("cannot start the OAuth server: {0}")]
    OAuth(String),
    #[error("cannot open the bucket: {0}")]
    Bucket(String),
    #[error("cannot use the cluster metastore (PostgreSQL)")]
    Metastore(#[source] StoreError),
}

/// Every component's statistics at one moment, for `/metrics`.
#[derive(Debug, Clone)]
pub struct EngineStats {
    /// Events accepted but not yet in a segment (the ingest queue).
    pub pending_events: usize,
    pub wal_fsync: HistogramSnapshot,
    /// The newest WAL sequence number; a shard's lag is this minus its `processed_seq`.
    pub wal_last_seq: u64,
    pub shards: Vec<ShardStats>,
    /// `(project, flag snapshot version)`.
    pub flag_snapshots: Vec<(u64, u64)>,
    pub endpoints: EndpointStats,
}

/// What keeps a node from serving (`/_readiness`): named, never with the backend's own error
/// text (which can carry host names and credentials); the details go to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unready {
    #[error("PostgreSQL (the metastore) does not answer")]
    Postgres,
    #[error("the bucket does not answer")]
    Bucket,
}

impl Unready {
    /// The component's short name, for the readiness answer.
    pub fn component(self) -> &'static str {
        match self {
            Unready::Postgres => "postgres",
            Unready::Bucket => "bucket",
        }
    }
}

/// The engine's facades and the handles that stop it.
pub struct Engine {
    pub activity: ActivityLog,
    pub webhooks: Webhooks,
    pub tenancy: Tenancy,
    pub persons: Persons,
    pub ingest: Ingest,
    pub flags: Flags,
    pub query: Arc<QueryEngine>,
    pub endpoints: Arc<Endpoints>,
    pub oauth: OAuth,
    pub remote_config: RemoteConfig,
    pub early_access: EarlyAccess,
    pub surveys: Surveys,
    pub experiments: Experiments,
    pub exports: Exports,
    pub batch_exports: BatchExports,
    compactor_stop: Arc<AtomicBool>,
    jobs: Jobs,
    /// The embedded metadata store, person keyspaces and data dir, for snapshots (`None` in
    /// a cluster).
    embedded: Option<(sled::Db, PersonFiles, PathBuf)>,
    /// What a cluster node checks before it reports ready.
    readiness: Option<Readiness>,
    /// This node's heartbeat claim (`node/<node id>`): the live nodes are its holders.
    nodes: JobLease,
}

/// How often a node renews its heartbeat claim.
const NODE_HEARTBEAT: Duration = Duration::from_secs(5);
/// A node not heard from for this long is no longer listed.
const NODE_LEASE: Duration = Duration::from_secs(15);
/// The claims naming live nodes.
const NODE_CLAIMS: &str = "node/";

/// A node of the cluster heard from within [`NODE_LEASE`] (the one node when embedded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSeen {
    /// `cluster.node_id` (`local` when embedded).
    pub node_id: String,
    /// When it last renewed its heartbeat.
    pub seen_at: chrono::DateTime<chrono::Utc>,
    /// Whether it is the node answering.
    pub this_node: bool,
}

/// The shared services a cluster node needs to serve.
struct Readiness {
    pg: Arc<Pg>,
    bucket: Arc<dyn ObjectStore>,
}

/// A key looked up to see that the bucket answers (it need not exist).
const READINESS_PROBE: &str = "_corvid/readiness";
/// How long the bucket may take to answer the readiness probe.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// The embedded person keyspaces' directory under the data dir.
pub const PERSONS_DIR: &str = "persons";

/// Opens the embedded metadata store under `data_dir` as a tenancy facade.
async fn embedded_tenancy(settings: &EngineSettings) -> Result<(Tenancy, sled::Db), EngineError> {
    std::fs::create_dir_all(&settings.data_dir)?;
    let meta_dir = settings.data_dir.join("meta");
    let cache = settings.memory.storage_cache_bytes;
    let metadata = blocking(move || {
        SledMetadata::open_with_cache(&meta_dir, cache).map_err(EngineError::Metadata)
    })
    .await?;
    let db = metadata.db().clone();
    Ok((Tenancy::new(Arc::new(metadata), settings.tenancy), db))
}

/// Reads the stored persons into memory on a thread of its own: the server answers meanwhile
/// (reading persons not yet in memory from disk), so a restart with millions of persons serves
/// at once.
fn load_persons_in_background(persons: &Arc<PersonStore>) {
    let persons = Arc::clone(persons);
    let spawned = std::thread::Builder::new()
        .name("corvid-persons-load".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            match persons.load_resident() {
                Ok(read) => {
                    let memory = persons.memory();
                    tracing::info!(
                        read,
                        held = memory.held,
                        on_disk = memory.on_disk,
                        bytes = memory.bytes,
                        complete = memory.complete,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "persons loaded into memory"
                    );
                }
                Err(err) => tracing::warn!(%err, "persons could not be loaded into memory; they are read from disk"),
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(%err, "persons are read from disk: no thread to load them");
    }
}

/// Runs blocking start-up work (opening stores, connecting) off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::TaskFailed(e.to_string()))?
}

/// Connects to the cluster's metastore and migrates it (every node may: migrations take a
/// lock, and a schema newer than this build is refused).
async fn cluster_metastore(cluster: &ClusterSettings) -> Result<Arc<Pg>, EngineError> {
    let settings = cluster.postgres.clone();
    blocking(move || {
        let pg = Pg::connect(&settings).map_err(EngineError::Metastore)?;
        corvid_kernel::pg::migrations::migrate(&pg, MIGRATIONS).map_err(EngineError::Metastore)?;
        Ok(Arc::new(pg))
    })
    .await
}

/// Where every domain's records are kept: the embedded sled database, or the cluster's
/// PostgreSQL. The one place that picks an implementation per storage trait.
enum Backing {
    /// The metadata store, and the persons and distinct ids in their own keyspaces.
    Embedded(sled::Db, PersonFiles),
    Cluster(Arc<Pg>),
}

impl Backing {
    /// The records `name`, every write of them logged under `scope` as the user the writer
    /// runs under, in the same commit (the product surfaces' records).
    fn logged_records<T>(
        &self,
        name: &'static str,
        scope: &'static str,
    ) -> Result<Arc<dyn DefinitionRecords<T>>, StoreError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        Ok(match self {
            Backing::Embedded(db, _) => Arc::new(LoggedRecords::embedded(db, name, scope)?),
            Backing::Cluster(pg) => Arc::new(LoggedRecords::cluster(
                PgRecords::new(Arc::clone(pg), name),
                scope,
            )),
        })
    }

    fn records<T>(&self, name: &'static str) -> Result<Arc<dyn DefinitionRecords<T>>, StoreError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        Ok(match self {
            Backing::Embedded(db, _) => Arc::new(SledRecords::open(db, name)?),
            Backing::Cluster(pg) => Arc::new(PgRecords::new(Arc::clone(pg), name)),
        })
    }

    fn persons(&self) -> Result<Arc<dyn PersonRecords>, StoreError> {
        Ok(match self {
            // Off the ingest shard's acknowledgement: the WAL covers what is accepted.
            Backing::Embedded(db, files) => Arc::new(WriteBehind::new(Arc::new(
                EmbeddedPersons::open(db, files.clone())?,
            ))?),
            Backing::Cluster(pg) => Arc::new(PgPersons::new(Arc::clone(pg))),
        })
    }

    fn activity(&self) -> Result<Arc<dyn ActivityRecords>, StoreError> {
        Ok(match self {
            Backing::Embedded(db, _) => Arc::new(SledActivity::open(db)?),
            Backing::Cluster(pg) => Arc::new(PgActivity::new(Arc::clone(pg))),
        })
    }

    fn flags(&self) -> Result<Arc<dyn FlagRecords>, StoreError> {
        Ok(match self {
            Backing::Embedded(db, _) => Arc::new(SledFlags::open(db)?),
            Backing::Cluster(pg) => Arc::new(PgFlags::new(Arc::clone(pg))),
        })
    }

    fn endpoints(&self) -> Result<Arc<dyn EndpointRecords>, StoreError> {
        Ok(match self {
            Backing::Embedded(db, _) => Arc::new(SledEndpoints::open(db)?),
            Backing::Cluster(pg) => Arc::new(PgEndpoints::new(Arc::clone(pg))),
        })
    }

    fn execution_log(&self) -> Result<Arc<dyn ExecutionLogRecords>, StoreError> {
        Ok(match self {
            Backing::Embedded(db, _) => Arc::new(SledExecutionLog::open(db)?),
            Backing::Cluster(pg) => Arc::new(PgExecutionLog::new(Arc::clone(pg))),
        })
    }

    fn grants(&self) -> Result<Arc<dyn GrantRecords>, StoreError> {
        Ok(match self {
            Backing::Embedded(db, _) => Arc::new(SledGrants::open(db)?),
            Backing::Cluster(pg) => Arc::new(PgGrants::new(Arc::clone(pg))),
        })
    }

    /// Leases on background jobs, held for `lease`: within this process, or across the
    /// cluster in the name of `node_id`.
    fn lease(&self, node_id: &str, lease: Duration) -> JobLease {
        match self {
            Backing::Embedded(..) => JobLease::local(lease),
            Backing::Cluster(pg) => JobLease {
                claims: Arc::new(PgClaims::new(Arc::clone(pg))),
                holder: node_id.to_string(),
                lease,
            },
        }
    }
}

/// Segments: the local events directory, or the cluster's catalog and bucket. The property
/// columns stay in a node-local sled tree (see [`Storage::Cluster`]).
async fn segment_storage(
    settings: &EngineSettings,
    backing: &Backing,
) -> Result<(Arc<dyn SegmentCatalog>, Arc<SegmentFiles>), EngineError> {
    match (backing, &settings.storage) {
        (Backing::Cluster(pg), Storage::Cluster(cluster)) => {
            let bucket = s3_bucket(&cluster.bucket).map_err(EngineError::Bucket)?;
            let cached = CachedSegments::new(bucket, cluster.segment_cache_bytes);
            let files = Arc::new(SegmentFiles::under(
                Arc::new(cached),
                &key_prefix(&cluster.bucket, EVENTS_PREFIX),
            )?);
            let (pg, node_id) = (Arc::clone(pg), cluster.node_id.clone());
            let staging = settings.data_dir.join("staging");
            let catalog_files = Arc::clone(&files);
            let catalog = blocking(move || {
                Ok(PgCatalog::open(
                    pg,
                    catalog_files,
                    &node_id,
                    staging,
                    ORPHAN_AGE,
                )?)
            })
            .await?;
            Ok((Arc::new(catalog), files))
        }
        _ => {
            let events_dir = settings.data_dir.join("events");
            let disk = Arc::clone(&settings.ingest.disk);
            let catalog: Arc<dyn SegmentCatalog> =
                Arc::new(DirCatalog::open_on(events_dir.clone(), disk)?);
            Ok((catalog, Arc::new(SegmentFiles::local(&events_dir)?)))
        }
    }
}

/// Key prefix of segment files in a cluster's bucket (materialized results sit beside, under
/// [`RESULTS_PREFIX`]).
pub const EVENTS_PREFIX: &str = "events";
/// Key prefix of materialized endpoint results in a cluster's bucket.
pub const RESULTS_PREFIX: &str = "materialized";
/// A stored segment file no row names is deleted once this old: no upload takes this long
/// to reach its commit.
const ORPHAN_AGE: Duration = Duration::from_secs(15 * 60);

impl Engine {
    /// Only the tenancy facade, for commands that set up organizations, users and keys
    /// (`corvid bootstrap`) without starting the engine: over the embedded store, or the
    /// cluster's metastore.
    pub async fn open_tenancy(settings: &EngineSettings) -> Result<Tenancy, EngineError> {
        match &settings.storage {
            Storage::Embedded => Ok(embedded_tenancy(settings).await?.0),
            Storage::Cluster(cluster) => {
                let pg = cluster_metastore(cluster).await?;
                Ok(Tenancy::new(
                    Arc::new(PgMetadata::new(pg)),
                    settings.tenancy,
                ))
            }
        }
    }

    /// Opens the embedded storage under `settings.data_dir` and starts everything. Must run
    /// inside an actix system (the ingest shards and the endpoints' actors are actix actors).
    pub async fn start_embedded(settings: EngineSettings) -> Result<Engine, EngineError> {
        Engine::start(EngineSettings {
            storage: Storage::Embedded,
            ..settings
        })
        .await
    }

    /// Starts a node over the storage `settings.storage` names: embedded, or a cluster's
    /// PostgreSQL and bucket (the WAL and staging files stay under `settings.data_dir`, which
    /// must be a persistent volume). Must run inside an actix system.
    pub async fn start(settings: EngineSettings) -> Result<Engine, EngineError> {
        let Opened {
            tenancy,
            backing,
            node_db,
            readiness,
            node_id,
        } = open_storage(&settings).await?;
        let embedded = match &backing {
            Backing::Embedded(db, files) => {
                Some((db.clone(), files.clone(), settings.data_dir.clone()))
            }
            Backing::Cluster(_) => None,
        };

        let activity = ActivityLog::new(backing.activity()?);
        let persons = Arc::new(PersonStore::with_budget(
            backing.persons()?,
            settings.memory.persons_bytes,
        ));
        let flags = Arc::new(FlagStore::new(backing.flags()?));
        let geoip = match &settings.geoip {
            Some(path) => Some(Arc::new(GeoIp::open(path)?)),
            None => None,
        };
        let columns = Arc::new(
            PropertyColumns::open(&node_db, settings.materialized_properties.clone())
                .map_err(StoreError::from)?,
        );
        let (catalog, files) = segment_storage(&settings, &backing).await?;
        let ingest = Ingest::start(
            settings.ingest.clone(),
            Arc::clone(&persons),
            Arc::clone(&columns),
            Arc::clone(&catalog),
            Arc::clone(&files),
        )
        .await?;
        let query = Arc::new(QueryEngine::new(
            settings.query.clone(),
            Sources::new(
                Arc::clone(&catalog),
                Arc::clone(&files),
                ingest.tails().to_vec(),
                Arc::clone(&persons),
                Arc::clone(&columns),
            ),
        )?);
        let endpoints = Arc::new(Endpoints::start(
            backing.endpoints()?,
            backing.execution_log()?,
            tenancy.clone(),
            Arc::clone(&query),
            settings.results.clone(),
            settings.endpoints.clone(),
            // A lease outlives any run (the query deadline, plus writing the result).
            backing.lease(&node_id, settings.query.timeout + Duration::from_secs(300)),
        )?);
        let oauth = OAuth::new(backing.grants()?, tenancy.clone(), settings.oauth.clone())
            .map_err(EngineError::OAuth)?;
        let Surfaces {
            remote_config,
            early_access,
            surveys,
            experiments,
        } = product_surfaces(&backing, (&flags, &persons), &query)?;

        let export_bucket = match &settings.storage {
            Storage::Cluster(cluster) => Some(corvid_kernel::bucket::under(
                s3_store(&cluster.bucket).map_err(EngineError::Bucket)?,
                "exports",
            )),
            Storage::Embedded => None,
        };
        let exports = Exports::open(
            backing.records("export_runs")?,
            Arc::clone(&query),
            settings.data_dir.join("exports"),
            export_bucket,
            settings.export_timeout,
        )?;
        let batch_exports = BatchExports::new(
            BatchRecords {
                exports: backing.records("batch_exports")?,
                runs: backing.records("batch_export_runs")?,
                backfills: backing.records("batch_export_backfills")?,
                cursors: backing.records("batch_export_cursors")?,
            },
            Arc::clone(&query),
            backing.lease(&node_id, Duration::ZERO),
            settings.data_dir.join("exports").join("scheduled"),
            settings.batch_exports.clone(),
        );
        let compactor_stop = Arc::new(AtomicBool::new(false));
        Compactor::new(
            catalog,
            files,
            columns,
            settings.compaction.clone(),
            // Longer than a pass over one project can take.
            backing.lease(
                &node_id,
                settings.compaction_interval + Duration::from_secs(3600),
            ),
            Arc::clone(&persons),
            ingest.tails().to_vec(),
        )
        .holding_deletions_for(ingest.backups().clone())
        .with_retention(
            retention_policy(tenancy.clone(), settings.default_event_retention_days),
            settings.retention_interval,
        )
        .spawn(settings.compaction_interval, Arc::clone(&compactor_stop))?;
        let flags = Flags::new(
            flags,
            Arc::clone(&persons),
            tenancy.clone(),
            geoip,
            settings.flags,
            activity.records(),
        );
        let person_store = Arc::clone(&persons);
        let persons = Persons::new(persons);
        let webhooks = Webhooks::new(
            WebhookStores {
                hooks: backing.records(STORE_NAMES[0])?,
                deliveries: backing.records(STORE_NAMES[1])?,
                queue: backing.records(STORE_NAMES[2])?,
                cursors: backing.records(STORE_NAMES[3])?,
            },
            activity.records(),
            WebhookClaims {
                claims: backing.lease(&node_id, Duration::ZERO).claims,
                holder: node_id.clone(),
            },
            settings.webhooks.clone(),
        );
        let jobs = Jobs::default();
        start_jobs(
            &jobs,
            &settings.jobs,
            &backing.lease(&node_id, Duration::ZERO),
            (&persons, &oauth, &surveys, &exports),
            (&batch_exports, &activity, &webhooks),
        );
        let nodes = backing.lease(&node_id, NODE_LEASE);
        start_heartbeat(&jobs, &nodes);
        // After the write-ahead log is replayed (in `Ingest::start`), so the two do not
        // share the cores while the node is not yet serving.
        load_persons_in_background(&person_store);
        Ok(Engine {
            activity,
            webhooks,
            tenancy,
            persons,
            ingest,
            flags,
            query,
            endpoints,
            oauth,
            remote_config,
            early_access,
            surveys,
            experiments,
            exports,
            batch_exports,
            compactor_stop,
            embedded,
            jobs,
            readiness,
            nodes,
        })
    }

    /// The nodes heard from within the last [`NODE_LEASE`], by id.
    pub async fn nodes(&self) -> Result<Vec<NodeSeen>, StoreError> {
        let lease = self.nodes.clone();
        let lease_length = chrono::Duration::from_std(lease.lease).unwrap_or_default();
        corvid_kernel::blocking(move || {
            Ok(lease
                .claims
                .live(NODE_CLAIMS, chrono::Utc::now())?
                .into_iter()
                .map(|c| NodeSeen {
                    this_node: c.holder == lease.holder,
                    node_id: c.holder,
                    seen_at: c.until - lease_length,
                })
                .collect())
        })
        .await
    }

    /// What each periodic job did on this node, for `/metrics`.
    pub fn job_reports(&self) -> Vec<JobReport> {
        self.jobs.reports()
    }

    /// Whether this node can reach the services it shares with others (a cluster's
    /// PostgreSQL and bucket); `Err` names the one it cannot. Always ready when embedded.
    pub async fn ready(&self) -> Result<(), Unready> {
        let Some(readiness) = &self.readiness else {
            return Ok(());
        };
        let pg = Arc::clone(&readiness.pg);
        let pinged = tokio::task::spawn_blocking(move || pg.ping()).await;
        match pinged {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "readiness: PostgreSQL does not answer");
                return Err(Unready::Postgres);
            }
            Err(err) => {
                tracing::warn!(error = %err, "readiness: the PostgreSQL check failed");
                return Err(Unready::Postgres);
            }
        }
        let bucket = Arc::clone(&readiness.bucket);
        let probe = ObjectPath::from(READINESS_PROBE);
        match tokio::time::timeout(READINESS_TIMEOUT, bucket.head(&probe)).await {
            Err(_) => {
                tracing::warn!("readiness: the bucket does not answer");
                Err(Unready::Bucket)
            }
            Ok(Ok(_)) | Ok(Err(object_store::Error::NotFound { .. })) => Ok(()),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "readiness: the bucket fails");
                Err(Unready::Bucket)
            }
        }
    }

    /// Every component's statistics.
    pub async fn stats(&self) -> Result<EngineStats, IngestError> {
        let wal = self.ingest.wal_stats();
        Ok(EngineStats {
            pending_events: self.ingest.pending_events(),
            wal_fsync: wal.fsync.snapshot(),
            wal_last_seq: wal.last_seq.load(Ordering::Relaxed),
            shards: self.ingest.stats().await?,
            flag_snapshots: self.flags.snapshot_versions(),
            endpoints: self.endpoints.stats().await,
        })
    }

    /// Why the engine can no longer keep its promises, if it cannot: the WAL failed, or an
    /// actor that acknowledged work depends on stopped. The service shuts down on it.
    pub fn failed_component(&self) -> Option<&'static str> {
        if self.ingest.has_failed() {
            return Some("the write-ahead log failed");
        }
        self.endpoints.failed_component()
    }

    /// Takes a snapshot of this embedded node into `to` (a directory or `s3://bucket/prefix`)
    /// while it serves; see [`snapshot`].
    /// `aws` are the asker's `AWS_*` settings for an `s3://` target.
    pub async fn snapshot(
        &self,
        to: &str,
        aws: &[(String, String)],
    ) -> Result<snapshot::SnapshotReport, snapshot::SnapshotError> {
        let Some((db, files, data_dir)) = &self.embedded else {
            return Err(snapshot::SnapshotError::Location(
                "a cluster node is backed up with its PostgreSQL metastore and bucket \
                 (docs/DEPLOY.md), not with corvid snapshot"
                    .into(),
            ));
        };
        let pin = self.ingest.backups().pin();
        let last_seq = self.ingest.wal_stats().last_seq.load(Ordering::SeqCst);
        let store = snapshot::location(to, aws)?;
        tracing::info!(to, "snapshot started");
        let report = snapshot::take(
            (db.clone(), Some(files.clone())),
            data_dir,
            Some(pin),
            last_seq,
            store,
            to,
        )
        .await;
        match &report {
            Ok(r) => tracing::info!(to, files = r.files, bytes = r.bytes, "snapshot taken"),
            Err(e) => tracing::warn!(to, error = %e, "snapshot failed"),
        }
        report
    }

    /// Stops cleanly, after the HTTP server stopped answering: the last execution-log
    /// entries, every buffered event (flushed and fsynced), usage counts, then the stores.
    /// Each step runs even when an earlier one failed; the first failure is returned.
    pub async fn shutdown(&self) -> Result<(), EngineError> {
        self.compactor_stop.store(true, Ordering::SeqCst);
        // A job's run under way finishes first: a webhook sent but not yet recorded as
        // delivered would be sent again after the restart.
        let attempt = self.webhooks.stop();
        if !self.jobs.stop_and_wait(attempt + JOBS_STOP_MARGIN).await {
            tracing::warn!("a background job was still running at shutdown and was cut off");
        }
        let endpoints = Arc::clone(&self.endpoints);
        let logs_synced = tokio::task::spawn_blocking(move || endpoints.sync_logs())
            .await
            .unwrap_or(false);
        if !logs_synced {
            tracing::warn!("the last execution-log entries could not be written");
        }
        let ingest = self.ingest.shutdown().await;
        if let Err(err) = &ingest {
            tracing::error!(error = %err, "ingest did not flush cleanly; the WAL will be replayed on start");
        }
        let usage = self.persons.flush_usage().await;
        if let Err(err) = &usage {
            tracing::error!(error = %err, "could not write the last usage counts");
        }
        let stores = self.tenancy.flush().await;
        ingest?;
        usage?;
        Ok(stores?)
    }
}

/// How much longer than a webhook attempt's deadline shutdown waits for the jobs' runs under
/// way (their stores' writes after the attempt).
const JOBS_STOP_MARGIN: Duration = Duration::from_secs(5);

/// What a node's storage opened to: the tenancy facade, the backing of every other store, the
/// node's own sled database and, in a cluster, what readiness checks.
struct Opened {
    tenancy: Tenancy,
    backing: Backing,
    node_db: sled::Db,
    readiness: Option<Readiness>,
    node_id: String,
}

/// Opens the storage `settings.storage` names: embedded sled, or a cluster's PostgreSQL and
/// bucket beside a node-local sled database under `settings.data_dir`.
async fn open_storage(settings: &EngineSettings) -> Result<Opened, EngineError> {
    let (tenancy, backing, node_db, readiness) = match &settings.storage {
        Storage::Embedded => {
            let (tenancy, db) = embedded_tenancy(settings).await?;
            let dir = settings.data_dir.join(PERSONS_DIR);
            let cache = settings.memory.person_cache_bytes;
            let meta = db.clone();
            // Moving persons out of an older layout's sled can take a while: off the loop.
            let files = blocking(move || {
                let files = PersonFiles::open(&dir, cache)?;
                files.take_over(&meta)?;
                Ok(files)
            })
            .await?;
            (tenancy, Backing::Embedded(db.clone(), files), db, None)
        }
        Storage::Cluster(cluster) => {
            std::fs::create_dir_all(&settings.data_dir)?;
            let pg = cluster_metastore(cluster).await?;
            let tenancy =
                Tenancy::new(Arc::new(PgMetadata::new(Arc::clone(&pg))), settings.tenancy);
            let node_dir = settings.data_dir.join("node");
            let cache = settings.memory.storage_cache_bytes;
            let db = blocking(move || {
                Ok(sled::Config::new()
                    .path(node_dir)
                    .cache_capacity(cache)
                    .open()
                    .map_err(StoreError::from)?)
            })
            .await?;
            let bucket = s3_store(&cluster.bucket).map_err(EngineError::Bucket)?;
            let readiness = Readiness {
                pg: Arc::clone(&pg),
                bucket,
            };
            (tenancy, Backing::Cluster(pg), db, Some(readiness))
        }
    };
    let node_id = match &settings.storage {
        Storage::Embedded => "local".to_string(),
        Storage::Cluster(cluster) => cluster.node_id.clone(),
    };
    Ok(Opened {
        tenancy,
        backing,
        node_db,
        readiness,
        node_id,
    })
}

/// The product-surface facades, which write the flags they own through the flags door for
/// owners.
struct Surfaces {
    remote_config: RemoteConfig,
    early_access: EarlyAccess,
    surveys: Surveys,
    experiments: Experiments,
}

fn product_surfaces(
    backing: &Backing,
    (flags, persons): (&Arc<FlagStore>, &Arc<PersonStore>),
    query: &Arc<QueryEngine>,
) -> Result<Surfaces, EngineError> {
    // The product surfaces write the flags they own through the flags door for owners.
    let owned = Arc::new(OwnedFlags::new(Arc::clone(flags), Arc::clone(persons)));
    let surveys = Surveys::new(
        backing.logged_records("surveys", "Survey")?,
        Arc::clone(&owned),
        Arc::clone(query),
    );
    let remote_config = RemoteConfig::new(Arc::clone(&owned), surveys.clone());
    let early_access = EarlyAccess::new(
        backing.logged_records("early_access_features", "EarlyAccessFeature")?,
        Arc::clone(&owned),
    );
    let experiments = Experiments::new(
        backing.logged_records("experiments", "Experiment")?,
        backing.logged_records("experiment_holdouts", "ExperimentHoldout")?,
        owned,
        Arc::clone(query),
    );
    Ok(Surfaces {
        remote_config,
        early_access,
        surveys,
        experiments,
    })
}

/// Each project's retention: its own setting, else the instance's default. Read from the
/// records at every pass (another node may have changed it).
fn retention_policy(tenancy: Tenancy, default: Option<u32>) -> RetentionPolicy {
    Arc::new(move |project| {
        let stored = tenancy
            .project_blocking(project)
            .map_err(|e| e.to_string())?;
        Ok(stored.and_then(|p| p.event_retention_days).or(default))
    })
}

/// Starts the node's heartbeat: every [`NODE_HEARTBEAT`] it renews its claim on
/// `node/<node id>`, which lapses [`NODE_LEASE`] after the node stops.
fn start_heartbeat(jobs: &Jobs, nodes: &JobLease) {
    let nodes = nodes.clone();
    let local = JobLease {
        lease: Duration::ZERO,
        ..nodes.clone()
    };
    jobs.spawn(
        Job {
            name: "node_heartbeat",
            period: NODE_HEARTBEAT,
            scope: JobScope::EveryNode,
            run: Arc::new(move || {
                let nodes = nodes.clone();
                Box::pin(async move {
                    corvid_kernel::blocking(move || {
                        let job = format!("{NODE_CLAIMS}{}", nodes.holder);
                        nodes
                            .claims
                            .claim(&job, &nodes.holder, chrono::Utc::now(), nodes.lease)
                            .map(|_| ())
                    })
                    .await
                    .map_err(|e: StoreError| e.to_string())
                })
            }),
        },
        &local,
    );
}

/// Starts the periodic jobs (the compactor and the materializer run loops of their own).
fn start_jobs(
    jobs: &Jobs,
    settings: &JobSettings,
    lease: &JobLease,
    (persons, oauth, surveys, exports): (&Persons, &OAuth, &Surveys, &Exports),
    (batch_exports, activity, webhooks): (&BatchExports, &ActivityLog, &Webhooks),
) {
    let hooks = webhooks.clone();
    jobs.spawn(
        Job {
            name: "webhook_dispatch",
            period: settings.webhook_dispatch,
            scope: JobScope::OneNode,
            run: Arc::new(move || {
                let hooks = hooks.clone();
                Box::pin(async move { hooks.tick().await.map(|_| ()).map_err(|e| e.to_string()) })
            }),
        },
        lease,
    );
    let (activity, ttl) = (activity.clone(), settings.activity_ttl);
    jobs.spawn(
        Job {
            name: "activity_expiry",
            period: settings.activity_expiry,
            scope: JobScope::OneNode,
            run: Arc::new(move || {
                let activity = activity.clone();
                Box::pin(async move {
                    let expired =
                        corvid_kernel::blocking(move || activity.expire(chrono::Utc::now(), ttl))
                            .await
                            .map_err(|e: StoreError| e.to_string())?;
                    if expired > 0 {
                        tracing::info!(expired, "deleted expired activity-log entries");
                    }
                    Ok(())
                })
            }),
        },
        lease,
    );
    let batch = batch_exports.clone();
    jobs.spawn(
        Job {
            name: "batch_exports",
            period: settings.batch_export_tick,
            scope: JobScope::OneNode,
            run: Arc::new(move || {
                let batch = batch.clone();
                Box::pin(async move {
                    batch
                        .tick(chrono::Utc::now())
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            }),
        },
        lease,
    );
    let (exports, ttl) = (exports.clone(), settings.export_run_ttl);
    jobs.spawn(
        Job {
            name: "export_expiry",
            period: settings.export_expiry,
            scope: JobScope::EveryNode,
            run: Arc::new(move || {
                let exports = exports.clone();
                Box::pin(async move {
                    let expired = exports
                        .expire(chrono::Utc::now(), ttl)
                        .await
                        .map_err(|e| e.to_string())?;
                    if expired > 0 {
                        tracing::info!(expired, "deleted expired file exports");
                    }
                    Ok(())
                })
            }),
        },
        lease,
    );
    let persons = persons.clone();
    jobs.spawn(
        Job {
            name: "usage_flush",
            period: settings.usage_flush,
            scope: JobScope::EveryNode,
            run: Arc::new(move || {
                let persons = persons.clone();
                Box::pin(async move { persons.flush_usage().await.map_err(|e| e.to_string()) })
            }),
        },
        lease,
    );
    let oauth = oauth.clone();
    jobs.spawn(
        Job {
            name: "oauth_prune",
            period: settings.oauth_prune,
            scope: JobScope::OneNode,
            run: Arc::new(move || {
                let oauth = oauth.clone();
                Box::pin(async move {
                    let removed = oauth
                        .prune(chrono::Utc::now())
                        .await
                        .map_err(|e| e.to_string())?;
                    if removed > 0 {
                        tracing::info!(removed, "pruned expired OAuth records");
                    }
                    Ok(())
                })
            }),
        },
        lease,
    );
    let surveys = surveys.clone();
    jobs.spawn(
        Job {
            name: "survey_upkeep",
            period: settings.survey_upkeep,
            scope: JobScope::OneNode,
            run: Arc::new(move || {
                let surveys = surveys.clone();
                Box::pin(async move {
                    surveys
                        .maintain(chrono::Utc::now())
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            }),
        },
        lease,
    );
}
