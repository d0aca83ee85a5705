//! Which property keys capture reads and which events and keys let it edit properties in
//! place: one leaf that decoding, normalization, person processing and the shard all name, so
//! the text path ([`super::raw_properties`]) parses exactly what each of them reads.

/// Keys decoding reads from the properties (the token and distinct id fallbacks).
pub const DECODE_READS: [&str; 2] = ["token", "distinct_id"];

/// Keys normalization reads.
pub const NORMALIZE_READS: [&str; 7] = [
    "$set",
    "$set_once",
    "$ip",
    "capture_internal",
    "$sent_at",
    "$session_id",
    "$ignore_sent_at",
];

/// Keys person processing reads from an event whose properties it does not edit. The ingest
/// pipeline keeps only these (and the shard's own) once the properties are serialized, so the
/// rest is freed on the thread that allocated it. Keep in step with `persons`' reads.
pub const PROCESSING_READS: [&str; 5] =
    ["$set", "$set_once", "$unset", "$anon_distinct_id", "alias"];

/// Keys the shard reads itself (besides person processing's).
pub const SHARD_READS: [&str; 2] = ["$session_id", "$window_id"];

/// The event posthog-js sends when a person opts in or out of an early-access feature.
pub const ENROLLMENT_EVENT: &str = "$feature_enrollment_update";

/// Events whose properties normalization edits in place (the enrollment `$set`).
pub const NORMALIZE_EDITING_EVENTS: [&str; 1] = [ENROLLMENT_EVENT];

/// Events whose properties person processing may edit.
pub const PROPERTY_EDITING_EVENTS: [&str; 1] = ["$groupidentify"];

/// Keys whose presence lets person processing edit the properties.
pub const PROPERTY_EDITING_KEYS: [&str; 2] = ["$process_person_profile", "$groups"];
