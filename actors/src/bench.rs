//! The engine internals the in-process benchmarks (`benches/`) measure directly: the capture
//! decoder, the flag engine, segment writing and the query engine over a segment catalog. The
//! service never uses this module; it goes through the facades.

pub use crate::flags::engine::{evaluate_all, Subject};
pub use crate::flags::model::CohortDefinition;
pub use crate::flags::properties::MatchContext;
pub use crate::ingest::catalog::{
    write_committed, DirCatalog, SegmentCatalog, SegmentName, SegmentRef,
};
pub use crate::ingest::columns::PropertyColumns;
pub use crate::ingest::files::SegmentFiles;
pub use crate::ingest::segment::write_segment;
pub use crate::kernel::disk::RealDisk;
pub use crate::query::hogql::{prepare_user_sql, Bindings};
pub use crate::query::insights::run as run_insight;
