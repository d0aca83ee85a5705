//! The one serialization format for sled values (JSON: self-describing, so records can grow
//! fields with `#[serde(default)]` without a migration) and the key encodings.

use serde::{de::DeserializeOwned, Serialize};

use super::StoreError;

/// Big-endian so that sled's byte order is numeric order.
pub fn u64_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// A record's stored bytes. Failing is a bug (our records always serialize), reported as an
/// error rather than stored as an empty value.
pub fn encode<V: Serialize>(value: &V) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Encode {
        what: std::any::type_name::<V>(),
        source,
    })
}

pub fn decode<V: DeserializeOwned>(
    tree: &'static str,
    key: &[u8],
    bytes: &[u8],
) -> Result<V, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        tree,
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

/// Every record of `tree` whose key starts with `prefix`, decoded.
pub fn scan_prefix<V: DeserializeOwned>(
    tree: &sled::Tree,
    name: &'static str,
    prefix: impl AsRef<[u8]>,
) -> Result<Vec<V>, StoreError> {
    tree.scan_prefix(prefix)
        .map(|item| {
            let (k, v) = item?;
            decode(name, &k, &v)
        })
        .collect()
}

/// The record under `key`, decoded.
pub fn get<V: DeserializeOwned>(
    tree: &sled::Tree,
    name: &'static str,
    key: &[u8],
) -> Result<Option<V>, StoreError> {
    tree.get(key)?
        .map(|bytes| decode(name, key, &bytes))
        .transpose()
}
