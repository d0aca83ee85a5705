//! Stored events built in one line, for tests.

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::catalog::{SegmentName, SegmentRef};
use crate::StoredEvent;

/// `s` (RFC 3339) as a UTC time.
pub fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("fixture timestamp")
        .with_timezone(&Utc)
}

/// Event `name` of `distinct_id` at `ts` with `props`; its person id is derived from the
/// distinct id and its person properties hold an email made from it.
pub fn event(
    project_id: u64,
    name: &str,
    distinct_id: &str,
    ts: &str,
    props: Value,
) -> StoredEvent {
    StoredEvent {
        uuid: Uuid::now_v7(),
        event: name.into(),
        distinct_id: distinct_id.into(),
        person_id: Uuid::new_v5(&Uuid::NAMESPACE_OID, distinct_id.as_bytes()),
        properties: props.to_string(),
        person_properties: json!({"email": format!("{distinct_id}@example.com")})
            .to_string()
            .into(),
        timestamp: at(ts),
        created_at: at(ts),
        project_id,
        groups: [None, None, None, None, None],
        session_id: None,
        window_id: None,
    }
}

/// A shard's in-memory tail holding `events`, as if they were acknowledged but not yet flushed.
pub fn tail_of(events: Vec<StoredEvent>) -> std::sync::Arc<crate::Tail> {
    let tail = std::sync::Arc::new(crate::Tail::default());
    tail.write().active.extend(events);
    tail
}

/// Project 1's segment of `day` from shard 0's flush of WAL record `seq` alone.
pub fn segment_of(day: NaiveDate, seq: u64) -> SegmentRef {
    SegmentRef {
        project: 1,
        day,
        name: SegmentName {
            node: 0,
            shard: 0,
            first: seq,
            last: seq,
            version: 0,
        },
    }
}
