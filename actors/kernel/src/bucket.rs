//! S3-compatible buckets: the one place a bucket's settings become an object store, for every
//! domain that keeps files in one (segments, materialized results).

use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;

/// Where an S3-compatible bucket is and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct S3Settings {
    pub bucket: String,
    pub region: Option<String>,
    /// For S3-compatible services (MinIO, R2, Ceph…): their URL; requests are path-style.
    pub endpoint: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Key prefix inside the bucket.
    pub prefix: Option<String>,
    /// Allow a plain-http endpoint (a local test server).
    pub allow_http: bool,
}

/// The bucket `settings` name, under its prefix. Unset credentials and region come from the
/// usual `AWS_*` environment variables.
pub fn s3_store(settings: &S3Settings) -> Result<Arc<dyn ObjectStore>, String> {
    let store = s3_bucket(settings)?;
    Ok(match settings.prefix.as_deref().filter(|p| !p.is_empty()) {
        Some(prefix) => under(store, prefix),
        None => store,
    })
}

/// `sub` below the bucket's configured prefix, as a key prefix: for readers that must see
/// the bucket's own keys (queries: DataFusion reads object metadata that a prefixed view
/// does not translate back).
pub fn key_prefix(settings: &S3Settings, sub: &str) -> String {
    match settings.prefix.as_deref().map(|p| p.trim_matches('/')) {
        Some(prefix) if !prefix.is_empty() => format!("{prefix}/{sub}"),
        _ => sub.to_string(),
    }
}

/// The bucket `settings` name, from its root (see [`s3_store`]).
pub fn s3_bucket(settings: &S3Settings) -> Result<Arc<dyn ObjectStore>, String> {
    build(AmazonS3Builder::from_env(), settings)
}

/// `builder` with what `settings` name (each only when given), built.
fn build(
    mut builder: AmazonS3Builder,
    settings: &S3Settings,
) -> Result<Arc<dyn ObjectStore>, String> {
    builder = builder
        .with_bucket_name(&settings.bucket)
        .with_allow_http(settings.allow_http);
    if let Some(region) = &settings.region {
        builder = builder.with_region(region);
    }
    if let Some(endpoint) = &settings.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let (Some(id), Some(secret)) = (&settings.access_key_id, &settings.secret_access_key) {
        builder = builder
            .with_access_key_id(id)
            .with_secret_access_key(secret);
    }
    Ok(Arc::new(builder.build().map_err(|e| {
        format!("bucket {:?}: {e}", settings.bucket)
    })?))
}

/// A bucket a user named as a destination (an export's): only the settings given, never the
/// node's own `AWS_*` environment (its credentials are the operator's, not the user's), with
/// few retries (the caller retries whole attempts) and `virtual_hosted` addressing when asked.
pub fn s3_destination(
    settings: &S3Settings,
    virtual_hosted: bool,
) -> Result<Arc<dyn ObjectStore>, String> {
    let builder = AmazonS3Builder::new()
        .with_virtual_hosted_style_request(virtual_hosted)
        .with_retry(object_store::RetryConfig {
            max_retries: 2,
            retry_timeout: std::time::Duration::from_secs(30),
            ..Default::default()
        });
    build(builder, settings)
}

/// `store` seen from below `prefix` (each domain keeps its files under its own prefix).
pub fn under(store: Arc<dyn ObjectStore>, prefix: &str) -> Arc<dyn ObjectStore> {
    Arc::new(PrefixStore::new(store, ObjectPath::from(prefix)))
}

/// Files up to this size are uploaded in one request; larger ones in parts of this size.
const PART_SIZE: usize = 16 << 20;

/// What [`upload_file`] sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    pub bytes: u64,
    /// SHA-256 of the bytes sent, hex.
    pub sha256: String,
}

/// Uploads the file at `path` to `key` of `store` (in one request up to 16 MiB, in parts
/// above), hashing what it sends. A file that grows meanwhile is sent as far as it was read.
pub async fn upload_file(
    store: &dyn ObjectStore,
    path: &std::path::Path,
    key: &str,
) -> Result<Uploaded, String> {
    use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
    use sha2::{Digest, Sha256};
    use tokio::io::AsyncReadExt;
    let other = |e: &dyn std::fmt::Display| e.to_string();
    let location = ObjectPath::from(key);
    let mut file = tokio::fs::File::open(path).await.map_err(|e| other(&e))?;
    let mut hash = Sha256::new();
    let mut first = vec![0u8; PART_SIZE];
    let mut filled = 0;
    while filled < first.len() {
        let read = file
            .read(first.get_mut(filled..).unwrap_or_default())
            .await
            .map_err(|e| other(&e))?;
        if read == 0 {
            break;
        }
        filled += read;
    }
    first.truncate(filled);
    hash.update(&first);
    if filled < PART_SIZE {
        store
            .put(&location, PutPayload::from(first))
            .await
            .map_err(|e| other(&e))?;
        return Ok(Uploaded {
            bytes: filled as u64,
            sha256: hex::encode(hash.finalize()),
        });
    }
    let upload = store
        .put_multipart(&location)
        .await
        .map_err(|e| other(&e))?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
    writer.write(&first);
    let mut bytes = filled as u64;
    let mut buffer = vec![0u8; PART_SIZE];
    loop {
        let read = file.read(&mut buffer).await.map_err(|e| other(&e))?;
        if read == 0 {
            break;
        }
        let chunk = buffer.get(..read).unwrap_or_default();
        hash.update(chunk);
        bytes += read as u64;
        writer.wait_for_capacity(4).await.map_err(|e| other(&e))?;
        writer.write(chunk);
    }
    writer.finish().await.map_err(|e| other(&e))?;
    Ok(Uploaded {
        bytes,
        sha256: hex::encode(hash.finalize()),
    })
}
