//! The ingest pipeline's one error enum.

use std::sync::Arc;

use super::segment::SegmentError;
use corvid_kernel::StoreError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum IngestError {
    #[error("ingest buffers are full; retry shortly")]
    Overloaded,
    #[error("ingest is shutting down")]
    ShuttingDown,
    #[error("write-ahead log failure")]
    Wal(#[source] Arc<std::io::Error>),
    #[error("segment write failure")]
    Segment(#[source] Arc<SegmentError>),
    #[error("person store failure")]
    Store(#[source] Arc<StoreError>),
    #[error("an ingest actor is not running")]
    ActorGone,
    /// A batch could not be written as a WAL record (a bug); it is refused, never stored empty.
    #[error("the batch could not be encoded for the write-ahead log")]
    Encode(#[source] Arc<serde_json::Error>),
}

impl From<std::io::Error> for IngestError {
    fn from(e: std::io::Error) -> Self {
        IngestError::Wal(Arc::new(e))
    }
}
impl From<SegmentError> for IngestError {
    fn from(e: SegmentError) -> Self {
        IngestError::Segment(Arc::new(e))
    }
}
impl From<StoreError> for IngestError {
    fn from(e: StoreError) -> Self {
        IngestError::Store(Arc::new(e))
    }
}
