//! Materialized results as Arrow IPC files in an object store (a local directory by default),
//! through the `object_store` crate so a bucket can replace the directory without code changes.

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::EndpointError;
pub use corvid_kernel::bucket::S3Settings;
use corvid_kernel::bucket::{s3_store, under};

#[derive(Clone)]
pub struct ResultStorage {
    store: Arc<dyn ObjectStore>,
}

fn storage_error(e: impl std::error::Error + Send + Sync + 'static) -> EndpointError {
    EndpointError::Storage(Box::new(e))
}

impl ResultStorage {
    /// A store rooted at the local directory `root` (created if missing).
    pub fn local(root: &Path) -> std::io::Result<ResultStorage> {
        std::fs::create_dir_all(root)?;
        let store = LocalFileSystem::new_with_prefix(root).map_err(std::io::Error::other)?;
        Ok(ResultStorage {
            store: Arc::new(store),
        })
    }

    /// An S3-compatible bucket. Unset credentials and region come from the usual `AWS_*`
    /// environment variables.
    pub fn s3(settings: &S3Settings) -> Result<ResultStorage, String> {
        Ok(ResultStorage {
            store: s3_store(settings).map_err(|e| format!("S3 result storage: {e}"))?,
        })
    }

    /// The part of an S3-compatible bucket under `sub` (a cluster's bucket holds segments
    /// beside the results).
    pub fn s3_under(settings: &S3Settings, sub: &str) -> Result<ResultStorage, String> {
        Ok(ResultStorage {
            store: under(
                s3_store(settings).map_err(|e| format!("S3 result storage: {e}"))?,
                sub,
            ),
        })
    }

    /// Any other object store.
    pub fn new(store: Arc<dyn ObjectStore>) -> ResultStorage {
        ResultStorage { store }
    }

    /// Writes `batches` as one Arrow IPC file at `key`.
    pub async fn write(
        &self,
        key: &str,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<(), EndpointError> {
        let mut bytes = Vec::new();
        {
            let mut writer = FileWriter::try_new(&mut bytes, schema).map_err(storage_error)?;
            for batch in batches {
                writer.write(batch).map_err(storage_error)?;
            }
            writer.finish().map_err(storage_error)?;
        }
        self.store
            .put(&ObjectPath::from(key), PutPayload::from(bytes))
            .await
            .map_err(storage_error)?;
        Ok(())
    }

    /// Reads the Arrow IPC file at `key`.
    pub async fn read(&self, key: &str) -> Result<(SchemaRef, Vec<RecordBatch>), EndpointError> {
        let bytes = self
            .store
            .get(&ObjectPath::from(key))
            .await
            .map_err(storage_error)?
            .bytes()
            .await
            .map_err(storage_error)?;
        let reader = FileReader::try_new(Cursor::new(bytes), None).map_err(storage_error)?;
        let schema = reader.schema();
        let batches = reader
            .collect::<Result<Vec<_>, _>>()
            .map_err(storage_error)?;
        Ok((schema, batches))
    }

    /// Removes `key`; a missing object is not an error.
    pub async fn delete(&self, key: &str) {
        if let Err(e) = self.store.delete(&ObjectPath::from(key)).await {
            if !matches!(e, object_store::Error::NotFound { .. }) {
                tracing::warn!(key, error = %e, "could not delete a superseded materialized result");
            }
        }
    }
}
