//! The one shared application state handed to every handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix_web::web;
use corvid_actors::early_access::EarlyAccess;
use corvid_actors::endpoints::store::EndpointStore;
use corvid_actors::endpoints::Endpoints;
use corvid_actors::experiments::Experiments;
use corvid_actors::flags::geoip::GeoIp;
use corvid_actors::flags::store::FlagStore;
use corvid_actors::ingest::Ingest;
use corvid_actors::kernel::SledRecords;
use corvid_actors::meta::{MetaCache, MetaStore, StoreError};
use corvid_actors::oauth::secret_scanning::VerifyingKey;
use corvid_actors::oauth::OAuth;
use corvid_actors::persons::PersonStore;
use corvid_actors::query::{QueryEngine, Sources};
use corvid_actors::remote_config::RemoteConfig;
use corvid_actors::surveys::Surveys;
use tokio::sync::Notify;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::Metrics;

pub struct AppState {
    pub config: Arc<Config>,
    /// Base URL clients reach us on, without a trailing slash.
    pub public_url: Arc<str>,
    /// `<public_url>/.well-known/oauth-protected-resource`, for 401 answers.
    pub resource_metadata_url: Arc<str>,
    pub meta: Arc<MetaStore>,
    pub cache: Arc<MetaCache>,
    /// Persons, groups and usage counters (written by the ingest shards).
    pub persons: Arc<PersonStore>,
    /// The event ingest pipeline.
    pub ingest: Ingest,
    /// Flag and cohort definitions and their evaluation snapshots.
    pub flags: Arc<FlagStore>,
    /// GeoIP lookups for `/flags`, when a database is configured.
    pub geoip: Option<Arc<GeoIp>>,
    /// SQL and insight queries (DataFusion on its own runtime).
    pub query: Arc<QueryEngine>,
    /// Saved-query endpoints: runs, materializer and execution log.
    pub endpoints: Arc<Endpoints>,
    /// The OAuth authorization server: grants, sessions and resolved CIMD clients.
    pub oauth: Arc<OAuth>,
    /// The product surfaces `/flags` serves: remote config, early access, surveys, experiments.
    pub surfaces: Surfaces,
    /// Keys that sign secret-scanning reports.
    pub secret_scanning_keys: Arc<[VerifyingKey]>,
    pub lifecycle: Arc<Lifecycle>,
    pub metrics: Arc<Metrics>,
}

impl AppState {
    /// Runs a metadata-store operation on the blocking pool, never on an event-loop thread.
    pub async fn meta<T, F>(&self, op: F) -> Result<T, ApiError>
    where
        F: FnOnce(&MetaStore) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let store = Arc::clone(&self.meta);
        Ok(web::block(move || op(&store)).await??)
    }

    /// Runs a flag-store operation on the blocking pool.
    pub async fn flags_op<T, F>(&self, op: F) -> Result<T, ApiError>
    where
        F: FnOnce(&FlagStore) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let store = Arc::clone(&self.flags);
        Ok(web::block(move || op(&store)).await??)
    }

    /// Runs an endpoint-store operation (endpoints, versions, variables) on the blocking pool.
    pub async fn endpoint_store<T, E, F>(&self, op: F) -> Result<T, ApiError>
    where
        F: FnOnce(&EndpointStore) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Into<ApiError> + Send + 'static,
    {
        let store = Arc::clone(&self.endpoints.store);
        web::block(move || op(&store)).await?.map_err(Into::into)
    }

    /// Runs a person-store read on the blocking pool.
    pub async fn persons<T, F>(&self, op: F) -> Result<T, ApiError>
    where
        F: FnOnce(&PersonStore) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let store = Arc::clone(&self.persons);
        Ok(web::block(move || op(&store)).await??)
    }
}

impl AppState {
    /// Whether `resource` (RFC 8707) names something this server serves: the public URL or a
    /// region URL, or a path under one. Tokens are only ever issued for such resources.
    pub fn is_our_resource(&self, resource: &str) -> bool {
        let Ok(url) = url::Url::parse(resource) else {
            return false;
        };
        if url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
            return false;
        }
        let wanted = url.as_str().trim_end_matches('/');
        std::iter::once(self.public_url.as_ref())
            .chain(self.config.oauth.region_urls.iter().map(String::as_str))
            .filter_map(|base| url::Url::parse(base).ok())
            .any(|base| {
                let base = base.as_str().trim_end_matches('/');
                wanted == base
                    || wanted
                        .strip_prefix(base)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
    }
}

/// The facades of the product surfaces built on flags.
#[derive(Clone)]
pub struct Surfaces {
    pub remote_config: RemoteConfig,
    pub early_access: EarlyAccess,
    pub surveys: Surveys,
    pub experiments: Experiments,
}

impl Surfaces {
    /// The surfaces in the metadata store's database, over `flags` and `query`.
    pub fn open(
        meta: &MetaStore,
        flags: &Arc<FlagStore>,
        query: &Arc<QueryEngine>,
    ) -> Result<Surfaces, StoreError> {
        let db = meta.db();
        let surveys = Surveys::new(
            Arc::new(SledRecords::open(db, "surveys")?),
            Arc::clone(flags),
            Arc::clone(query),
        );
        Ok(Surfaces {
            remote_config: RemoteConfig::new(Arc::clone(flags), surveys.clone()),
            early_access: EarlyAccess::new(
                Arc::new(SledRecords::open(db, "early_access_features")?),
                Arc::clone(flags),
            ),
            experiments: Experiments::new(
                Arc::new(SledRecords::open(db, "experiments")?),
                Arc::new(SledRecords::open(db, "experiment_holdouts")?),
                Arc::clone(flags),
                Arc::clone(query),
            ),
            surveys,
        })
    }
}

/// The OAuth engine over `meta`'s database, and the secret-scanning keys.
pub fn oauth(config: &Config, meta: &MetaStore) -> anyhow::Result<(OAuth, Arc<[VerifyingKey]>)> {
    let oauth = OAuth::new(
        meta.db(),
        config.oauth_client_settings()?,
        config.oauth_lifetimes(),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let keys = config
        .oauth
        .secret_scanning_keys
        .iter()
        .map(|k| VerifyingKey::from_pem(&k.id, &k.pem))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok((oauth, keys.into()))
}

/// The query engine over what `ingest` and `persons` store.
pub fn query_engine(
    config: &Config,
    ingest: &Ingest,
    persons: &Arc<PersonStore>,
) -> std::io::Result<QueryEngine> {
    QueryEngine::new(
        config.query_settings(),
        Sources::new(
            Arc::clone(ingest.catalog()),
            ingest.tails().to_vec(),
            Arc::clone(persons),
            Arc::clone(ingest.columns()),
        ),
    )
}

/// The endpoints engine over `meta`'s database and `query`; starts its actors, so it must be
/// called inside an actix system.
pub fn endpoints(
    config: &Config,
    meta: &Arc<MetaStore>,
    query: &Arc<QueryEngine>,
) -> anyhow::Result<Endpoints> {
    let storage = config.result_storage()?;
    Ok(Endpoints::start(
        meta.db(),
        Arc::clone(meta),
        Arc::clone(query),
        storage,
        config.endpoint_settings(),
    )?)
}

/// Process lifecycle shared by the server, the actors and the health routes.
#[derive(Default)]
pub struct Lifecycle {
    shutting_down: AtomicBool,
    requested: Notify,
}

impl Lifecycle {
    /// Readiness: false from the moment shutdown begins.
    pub fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::SeqCst)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Asks the process to shut down cleanly (e.g. a critical actor died).
    pub fn request_shutdown(&self, reason: &str) {
        tracing::warn!(reason, "shutdown requested");
        self.requested.notify_one();
    }

    /// Completes when someone called [`Lifecycle::request_shutdown`].
    pub async fn shutdown_requested(&self) {
        self.requested.notified().await;
    }
}

#[cfg(test)]
impl AppState {
    /// A real state over a real store in `dir`, for in-crate handler tests.
    /// Must run inside an actix system (it starts the ingest actors).
    pub async fn for_test(dir: &std::path::Path) -> AppState {
        let config = Config::for_test(dir);
        let meta = MetaStore::open(&config.meta_dir()).expect("store opens");
        let persons = Arc::new(PersonStore::open(meta.db()).expect("persons open"));
        let columns = Arc::new(
            corvid_actors::ingest::columns::PropertyColumns::open(
                meta.db(),
                config.ingest.materialized_properties.clone(),
            )
            .expect("property columns open"),
        );
        let catalog = Arc::new(
            corvid_actors::ingest::catalog::DirCatalog::open(config.events_dir())
                .expect("events directory"),
        );
        let ingest = Ingest::start(
            config.ingest_config(),
            Arc::clone(&persons),
            columns,
            catalog,
        )
        .await
        .expect("ingest starts");
        let flags = Arc::new(FlagStore::open(meta.db()).expect("flags open"));
        let query = Arc::new(query_engine(&config, &ingest, &persons).expect("query engine"));
        let meta = Arc::new(meta);
        let endpoints = Arc::new(endpoints(&config, &meta, &query).expect("endpoints start"));
        let (oauth, secret_scanning_keys) = oauth(&config, &meta).expect("oauth opens");
        let surfaces = Surfaces::open(&meta, &flags, &query).expect("surfaces open");
        AppState {
            surfaces,
            oauth: Arc::new(oauth),
            secret_scanning_keys,
            endpoints,
            query,
            geoip: None,
            flags,
            persons,
            ingest,
            public_url: "http://127.0.0.1:0".into(),
            resource_metadata_url: "http://127.0.0.1:0/.well-known/oauth-protected-resource".into(),
            cache: Arc::new(MetaCache::new(config.auth.credential_cache_ttl)),
            config: Arc::new(config),
            meta,
            lifecycle: Arc::new(Lifecycle::default()),
            metrics: Arc::new(Metrics::new()),
        }
    }
}
