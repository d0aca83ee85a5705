//! PostgreSQL, the metastore of cluster mode: a connection pool, the schema migrations, and
//! the bridge that lets the blocking storage traits run statements on it.
//!
//! The storage traits are synchronous (their callers already run on blocking threads), while
//! the client is async; [`Pg::run`] runs a statement's future on the pool's own runtime and
//! waits for it, like segment-file reads do.

pub mod migrations;
mod notify;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod tls;

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Json;
use tokio_postgres::{NoTls, Row};

use self::tls::Tls;
use super::runtime::OwnedRuntime;
use super::StoreError;

/// How to reach PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgSettings {
    /// `postgres://user:pass@host:port/db` (also key=value form).
    pub url: String,
    /// Connections kept open by this node.
    pub pool_size: usize,
    /// How long a statement waits for a free connection (or a new one) before failing with
    /// [`StoreError::Unavailable`].
    pub connect_timeout: Duration,
    /// Certificates (PEM) trusted besides Mozilla's roots when the URL says
    /// `sslmode=require`: a private CA's.
    pub ca_file: Option<std::path::PathBuf>,
}

/// The channel credential revocations are announced on: the payload is the SHA-256 hex of a
/// revoked key or token, or `*` when any may have been (a whole grant was revoked).
pub const CREDENTIALS_CHANNEL: &str = "corvid_credentials";

/// How often a node drops cached state regardless, should a notification be lost.
pub const RESYNC: std::time::Duration = std::time::Duration::from_secs(30);

/// A pool of connections to the metastore.
pub struct Pg {
    pool: Pool,
    io: OwnedRuntime,
    /// For connections outside the pool (a listener holds one for good).
    config: tokio_postgres::Config,
    tls: Tls,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pg")
            .field("status", &self.pool.status())
            .finish()
    }
}

impl Pg {
    /// A pool for `settings` (connections are opened on first use; see [`Pg::ping`]).
    pub fn connect(settings: &PgSettings) -> Result<Pg, StoreError> {
        let mut config: tokio_postgres::Config = settings
            .url
            .parse()
            .map_err(|e: tokio_postgres::Error| StoreError::invalid(e.to_string(), "url"))?;
        config.connect_timeout(settings.connect_timeout);
        config.application_name("corvid");
        let tls = Tls::for_config(&config, settings.ca_file.as_deref())?;
        let manager_config = || ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Tls::Plain => Manager::from_config(config.clone(), NoTls, manager_config()),
            Tls::Rustls(connector) => {
                Manager::from_config(config.clone(), connector.clone(), manager_config())
            }
        };
        let io = OwnedRuntime::new("corvid-pg", 1)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(settings.connect_timeout))
            .create_timeout(Some(settings.connect_timeout))
            .build()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(Pg {
            pool,
            io,
            config,
            tls,
        })
    }

    /// Runs `work` with a pooled connection and waits for it (blocking: call from a plain or
    /// blocking-pool thread, never from an async task).
    pub fn run<T, F, Fut>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnOnce(Object) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        let pool = self.pool.clone();
        self.io
            .wait(async move {
                let client = pool.get().await.map_err(pool_error)?;
                work(client).await
            })
            .map_err(|e| StoreError::TaskFailed(e.to_string()))?
    }

    /// Opens a transaction on one connection, for read-modify-write steps whose logic runs on
    /// the calling thread between statements (blocking, like [`Pg::run`]).
    pub fn begin(&self) -> Result<BlockingTx<'_>, StoreError> {
        let pool = self.pool.clone();
        let client = self
            .io
            .wait(async move {
                let client = pool.get().await.map_err(pool_error)?;
                client.batch_execute("BEGIN").await?;
                Ok::<Object, StoreError>(client)
            })
            .map_err(|e| StoreError::TaskFailed(e.to_string()))??;
        Ok(BlockingTx {
            pg: self,
            client: Some(client),
        })
    }

    /// Runs `work` (blocking, on the calling thread) while this node holds the session-level
    /// advisory lock `key`: of all nodes running work under one key, one at a time.
    pub fn exclusive<T>(
        &self,
        key: i64,
        work: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.exclusive_all(vec![key], work)
    }

    /// Runs `work` (blocking, on the calling thread) while this node holds every advisory lock
    /// of `keys` on one session. The keys are taken in ascending order, so callers locking
    /// overlapping sets never deadlock; all are released together when `work` returns.
    pub fn exclusive_all<T>(
        &self,
        mut keys: Vec<i64>,
        work: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        keys.sort_unstable();
        keys.dedup();
        let pool = self.pool.clone();
        let client = self
            .io
            .wait(async move {
                let client = pool.get().await.map_err(pool_error)?;
                for key in &keys {
                    if let Err(e) = client.execute("SELECT pg_advisory_lock($1)", &[key]).await {
                        // It may hold the keys before this one: never back to the pool.
                        drop(Object::take(client));
                        return Err(e.into());
                    }
                }
                Ok::<Object, StoreError>(client)
            })
            .map_err(|e| StoreError::TaskFailed(e.to_string()))??;
        let result = work();
        let unlocked = self.io.wait(async move {
            match client.execute("SELECT pg_advisory_unlock_all()", &[]).await {
                Ok(_) => {}
                // A connection that may still hold a lock never goes back to the pool.
                Err(_) => drop(Object::take(client)),
            }
        });
        if let Err(e) = unlocked {
            tracing::warn!(error = %e, "could not release advisory locks; their connection closes");
        }
        result
    }

    /// Whether a statement can run now (readiness).
    pub fn ping(&self) -> Result<(), StoreError> {
        self.run(|client| async move {
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
    }
}

/// A transaction held across blocking steps. Dropped without [`BlockingTx::commit`], its
/// connection is closed rather than returned to the pool, so the server rolls it back.
pub struct BlockingTx<'a> {
    pg: &'a Pg,
    client: Option<Object>,
}

impl BlockingTx<'_> {
    /// Runs one step on the transaction's connection: `work` gets the connection and hands it
    /// back with its result.
    pub fn step<T, F, Fut>(&mut self, work: F) -> Result<T, StoreError>
    where
        F: FnOnce(Object) -> Fut + Send + 'static,
        Fut: Future<Output = (Object, Result<T, StoreError>)> + Send + 'static,
        T: Send + 'static,
    {
        let Some(client) = self.client.take() else {
            return Err(StoreError::TaskFailed(
                "the transaction's connection was lost".into(),
            ));
        };
        let (client, result) = self
            .pg
            .io
            .wait(work(client))
            .map_err(|e| StoreError::TaskFailed(e.to_string()))?;
        self.client = Some(client);
        result
    }

    pub fn commit(mut self) -> Result<(), StoreError> {
        self.step(|client| async move {
            let done = client.batch_execute("COMMIT").await;
            (client, done.map_err(StoreError::from))
        })?;
        // Committed: the connection goes back to the pool.
        self.client.take();
        Ok(())
    }
}

impl Drop for BlockingTx<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // Still inside the transaction (not committed): never reuse this connection.
            drop(Object::take(client));
        }
    }
}

fn pool_error(err: PoolError) -> StoreError {
    match err {
        PoolError::Backend(e) => StoreError::Postgres(e),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// A project (or other sequence-made) id as PostgreSQL's `bigint`. Ids start at 1 and count
/// up; one past `i64::MAX` is not an id Corvid made, and maps to the largest key.
pub fn bigint(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

/// Whether a statement failed on a unique constraint (the record already exists).
pub fn is_unique_violation(err: &tokio_postgres::Error) -> bool {
    err.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// The next value (1, 2, …) of the named sequence in `id_sequences`, shared by every node.
pub async fn next_in_sequence(client: &Object, name: &str) -> Result<u64, StoreError> {
    let row = client
        .query_one(
            "INSERT INTO id_sequences (name, value) VALUES ($1, 1)
             ON CONFLICT (name) DO UPDATE SET value = id_sequences.value + 1
             RETURNING value",
            &[&name],
        )
        .await?;
    let value: i64 = row.try_get(0)?;
    u64::try_from(value).map_err(|_| StoreError::Sequence { name: name.into() })
}

/// A record as the `jsonb` value stored beside its key columns.
pub fn record_json<T: serde::Serialize>(
    what: &'static str,
    record: &T,
) -> Result<Json<serde_json::Value>, StoreError> {
    serde_json::to_value(record)
        .map(Json)
        .map_err(|source| StoreError::Encode { what, source })
}

/// The record in a row's `record` column; `Corrupt` (naming the table and key) when it does
/// not decode.
pub fn record_of<T: serde::de::DeserializeOwned>(
    row: &Row,
    table: &'static str,
    key: impl std::fmt::Display,
) -> Result<T, StoreError> {
    let Json(value): Json<serde_json::Value> = row.try_get("record")?;
    serde_json::from_value(value).map_err(|source| StoreError::Corrupt {
        tree: table,
        key: key.to_string(),
        source,
    })
}
