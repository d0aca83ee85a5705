//! The engine as one unit: opens every domain's storage, starts its actors and background
//! threads, and hands the service one facade per domain. The service never sees storage.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::early_access::EarlyAccess;
use crate::endpoints::logs::SledExecutionLog;
use crate::endpoints::materialize::storage::ResultStorage;
use crate::endpoints::{EndpointSettings, EndpointStats, Endpoints, SledEndpoints};
use crate::experiments::Experiments;
use crate::flags::geoip::GeoIp;
use crate::flags::store::FlagStore;
use crate::flags::SledFlags;
use crate::flags::{Flags, FlagsSettings};
use crate::ingest::catalog::{DirCatalog, SegmentCatalog};
use crate::ingest::columns::{CompactionConfig, Compactor, PropertyColumns};
use crate::ingest::files::SegmentFiles;
use crate::ingest::{Ingest, IngestConfig, IngestError, ShardStats};
use crate::kernel::histogram::HistogramSnapshot;
use crate::kernel::JobLease;
use crate::kernel::{SledRecords, StoreError};
use crate::meta::{SledMetadata, Tenancy, TenancySettings};
use crate::oauth::{OAuth, OAuthSettings, SledGrants};
use crate::persons::{PersonStore, Persons, SledPersons};
use crate::query::{QueryEngine, QuerySettings, Sources};
use crate::remote_config::RemoteConfig;
use crate::surveys::Surveys;

pub use crate::kernel::pg::PgSettings;

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
    let pg = crate::kernel::pg::Pg::connect(settings)?;
    let applied = crate::kernel::pg::migrations::migrate(&pg)?;
    let version = crate::kernel::pg::migrations::current(&pg)?;
    Ok(Migrated { applied, version })
}

/// Everything the engine is configured with.
#[derive(Clone)]
pub struct EngineSettings {
    /// Root of the embedded state: `meta/` (sled), `wal/`, `events/`.
    pub data_dir: PathBuf,
    pub tenancy: TenancySettings,
    pub ingest: IngestConfig,
    /// Property keys every project's segments store as their own columns.
    pub materialized_properties: Vec<String>,
    pub compaction: CompactionConfig,
    pub compaction_interval: Duration,
    pub query: QuerySettings,
    pub endpoints: EndpointSettings,
    pub results: ResultStorage,
    pub oauth: OAuthSettings,
    pub flags: FlagsSettings,
    /// A MaxMind city database for `/flags` GeoIP.
    pub geoip: Option<PathBuf>,
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
    GeoIp(#[from] crate::flags::geoip::GeoIpError),
    #[error("cannot start the OAuth server: {0}")]
    OAuth(String),
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

/// The engine's facades and the handles that stop it.
pub struct Engine {
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
    compactor_stop: Arc<AtomicBool>,
}

/// Opens the embedded metadata store under `data_dir` as a tenancy facade.
async fn embedded_tenancy(settings: &EngineSettings) -> Result<(Tenancy, sled::Db), EngineError> {
    std::fs::create_dir_all(&settings.data_dir)?;
    let meta_dir = settings.data_dir.join("meta");
    let metadata = tokio::task::spawn_blocking(move || SledMetadata::open(&meta_dir))
        .await
        .map_err(|e| StoreError::TaskFailed(e.to_string()))?
        .map_err(EngineError::Metadata)?;
    let db = metadata.db().clone();
    Ok((Tenancy::new(Arc::new(metadata), settings.tenancy), db))
}

impl Engine {
    /// Only the tenancy facade, for commands that set up organizations, users and keys
    /// (`corvid bootstrap`) without starting the engine.
    pub async fn open_tenancy(settings: &EngineSettings) -> Result<Tenancy, EngineError> {
        Ok(embedded_tenancy(settings).await?.0)
    }

    /// Opens the embedded storage under `settings.data_dir` and starts everything. Must run
    /// inside an actix system (the ingest shards and the endpoints' actors are actix actors).
    pub async fn start_embedded(settings: EngineSettings) -> Result<Engine, EngineError> {
        let (tenancy, db) = embedded_tenancy(&settings).await?;

        let persons = Arc::new(PersonStore::new(Arc::new(SledPersons::open(&db)?)));
        let flags = Arc::new(FlagStore::new(Arc::new(SledFlags::open(&db)?)));
        let geoip = match &settings.geoip {
            Some(path) => Some(Arc::new(GeoIp::open(path)?)),
            None => None,
        };
        let columns = Arc::new(
            PropertyColumns::open(&db, settings.materialized_properties.clone())
                .map_err(StoreError::from)?,
        );
        let events_dir = settings.data_dir.join("events");
        let catalog: Arc<dyn SegmentCatalog> = Arc::new(DirCatalog::open(events_dir.clone())?);
        let files = Arc::new(SegmentFiles::local(&events_dir)?);
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
            Arc::new(SledEndpoints::open(&db)?),
            Arc::new(SledExecutionLog::open(&db)?),
            tenancy.clone(),
            Arc::clone(&query),
            settings.results.clone(),
            settings.endpoints.clone(),
            // One node: a lease outlives any run (the query deadline, plus writing the result).
            JobLease::local(settings.query.timeout + Duration::from_secs(300)),
        )?);
        let oauth = OAuth::new(
            Arc::new(SledGrants::open(&db)?),
            tenancy.clone(),
            settings.oauth.clone(),
        )
        .map_err(EngineError::OAuth)?;
        let surveys = Surveys::new(
            Arc::new(SledRecords::open(&db, "surveys")?),
            Arc::clone(&flags),
            Arc::clone(&query),
        );
        let remote_config = RemoteConfig::new(Arc::clone(&flags), surveys.clone());
        let early_access = EarlyAccess::new(
            Arc::new(SledRecords::open(&db, "early_access_features")?),
            Arc::clone(&flags),
        );
        let experiments = Experiments::new(
            Arc::new(SledRecords::open(&db, "experiments")?),
            Arc::new(SledRecords::open(&db, "experiment_holdouts")?),
            Arc::clone(&flags),
            Arc::clone(&query),
        );

        let compactor_stop = Arc::new(AtomicBool::new(false));
        Compactor::new(catalog, files, columns, settings.compaction.clone())
            .spawn(settings.compaction_interval, Arc::clone(&compactor_stop))?;
        let flags = Flags::new(
            flags,
            Arc::clone(&persons),
            tenancy.clone(),
            geoip,
            settings.flags,
        );
        Ok(Engine {
            tenancy,
            persons: Persons::new(persons),
            ingest,
            flags,
            query,
            endpoints,
            oauth,
            remote_config,
            early_access,
            surveys,
            experiments,
            compactor_stop,
        })
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

    /// Stops cleanly, after the HTTP server stopped answering: the last execution-log
    /// entries, every buffered event (flushed and fsynced), usage counts, then the stores.
    /// Each step runs even when an earlier one failed; the first failure is returned.
    pub async fn shutdown(&self) -> Result<(), EngineError> {
        self.compactor_stop.store(true, Ordering::SeqCst);
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
