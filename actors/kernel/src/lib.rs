//! The storage kernel, at the bottom of the engine's layers: the one value encoding of stored
//! records ([`codec`]), the storage error ([`StoreError`]), id sequences, secrets, timestamp
//! parsing, buckets ([`bucket`]), the record-store trait of definition records ([`records`]),
//! owned runtimes ([`runtime`]), hints that load memory a loop reads next ([`prefetch`]),
//! which threads run as batch work ([`sched`]), bounded caches that start over when full
//! ([`start_over`]), checked time arithmetic ([`time`]), containing a background job's
//! failing item ([`contain`]), the helper that keeps blocking storage work off async threads,
//! and the public routes' body decoding within limits ([`wire`]) and the JSON scanner that
//! reads stored properties without parsing whole documents ([`json`]). It depends on no
//! domain.

// `&s[a..b]` panics when an offset falls inside a character: production code slices text with
// `get`, `strip_prefix` and friends instead.
#![cfg_attr(not(test), warn(clippy::string_slice))]

pub mod bucket;
pub mod claims;
mod claims_pg;
pub mod codec;
pub mod contain;
pub mod disk;
mod error;
pub mod histogram;
pub mod json;
pub mod net;
pub mod pg;
pub mod pool;
pub mod prefetch;
pub mod prehashed;
pub mod records;
mod records_pg;
pub mod runtime;
pub mod sched;
pub mod secrets;
pub mod sequence;
pub mod start_over;
pub mod time;
pub mod wire;

pub use claims::{Claim, JobClaims, JobLease, LocalClaims};
pub use claims_pg::PgClaims;
pub use contain::{contain, panic_message, Backoff};
#[cfg(any(test, feature = "test-support"))]
pub use disk::power_cut::PowerCutDisk;
pub use disk::{real as real_disk, Disk, RealDisk};
pub use error::StoreError;
pub use pg::migrations::{Migration, MIGRATIONS};
pub use records::{DefinitionRecords, SledRecords};
pub use records_pg::PgRecords;
pub use time::parse_timestamp;

/// Runs blocking storage work off the async runtime's threads.
pub async fn blocking<T, E, F>(work: F) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<StoreError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(join) => Err(StoreError::TaskFailed(join.to_string()).into()),
    }
}
