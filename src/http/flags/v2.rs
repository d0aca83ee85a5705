//! The `v=2` flags response (PostHog's `FlagsResponse`), written straight into bytes.
//!
//! This is the hot path of `/flags`: with hundreds of flags, building a JSON tree or a sorted
//! map of typed records and serializing it cost as much as evaluating the flags. Here flags
//! are listed in the snapshot's precomputed key order, and each flag's entry is written by its
//! snapshot-built [`corvid_flags::V2Entry`] (copied whole for common outcomes).

use chrono::Utc;
use corvid_flags::FlagsOutcome;

/// The response body. `config`: what `config=true` adds (the members of a JSON object without
/// its braces, as remote config renders them).
pub fn write(outcome: &FlagsOutcome, config: Option<&str>) -> Vec<u8> {
    let snapshot = &outcome.snapshot;
    // Room for every returned flag's typical entry and the envelope: one allocation for
    // nearly every answer (growing a large body copies all of it).
    let entries: usize = outcome
        .returned()
        .filter_map(|(index, _)| snapshot.v2_entries.get(index))
        .map(|entry| entry.typical_len() + 1)
        .sum();
    let capacity = 192 + entries + config.map_or(0, str::len);
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(b"{\"flags\":{");
    let mut first = true;
    for &index in &snapshot.by_key {
        let Some(Some(e)) = outcome.results.get(index) else {
            continue;
        };
        let Some(entry) = snapshot.v2_entries.get(index) else {
            continue;
        };
        if !first {
            out.push(b',');
        }
        first = false;
        entry.write(e, &mut out);
    }
    out.extend_from_slice(b"},\"errorsWhileComputingFlags\":");
    out.extend_from_slice(if outcome.errors { b"true" } else { b"false" });
    out.extend_from_slice(b",\"requestId\":\"");
    let mut id = uuid::Uuid::encode_buffer();
    out.extend_from_slice(
        uuid::Uuid::new_v4()
            .hyphenated()
            .encode_lower(&mut id)
            .as_bytes(),
    );
    out.extend_from_slice(b"\",\"evaluatedAt\":");
    out.extend_from_slice(
        itoa::Buffer::new()
            .format(Utc::now().timestamp_millis())
            .as_bytes(),
    );
    if let Some(members) = config.filter(|m| !m.is_empty()) {
        out.push(b',');
        out.extend_from_slice(members.as_bytes());
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use corvid_flags::FlagDefinition;
    use corvid_flags::ProjectFlags;
    use corvid_flags::{Evaluation, Reason, ReasonCode};
    use serde_json::{json, Value};

    use super::*;

    fn flag(id: i64, key: &str) -> FlagDefinition {
        let mut f: FlagDefinition =
            serde_json::from_value(json!({"id": id, "key": key, "filters": {"groups": []}}))
                .expect("flag definition");
        f.version = id + 1;
        f
    }

    fn evaluation(enabled: bool, variant: Option<&str>, code: ReasonCode) -> Evaluation {
        Evaluation {
            enabled,
            variant: variant.map(str::to_string),
            reason: Reason {
                code,
                condition_index: enabled.then_some(1),
                detail: None,
            },
            payload: variant.map(|_| json!({"x": [1, "two"]})),
            failed: !enabled,
        }
    }

    #[test]
    fn writes_the_v2_shape_in_key_order_with_escaped_keys() {
        let flags = vec![flag(1, "zeta"), flag(2, "al\"pha\\"), flag(3, "hidden")];
        let snapshot = Arc::new(ProjectFlags::new(
            flags,
            Default::default(),
            Default::default(),
        ));
        let outcome = FlagsOutcome {
            snapshot,
            results: vec![
                Some(evaluation(
                    true,
                    Some("t\u{e9}st"),
                    ReasonCode::ConditionMatch,
                )),
                Some(evaluation(false, None, ReasonCode::NoConditionMatch)),
                None,
            ],
            errors: true,
        };
        let config = r#""config":{"enable_collect_everything":true},"supportedCompression":["gzip","gzip-js"]"#;
        let bytes = write(&outcome, Some(config));
        let text = std::str::from_utf8(&bytes).expect("utf-8");
        let body: Value = serde_json::from_slice(&bytes).expect("valid JSON");
        assert!(text.find("al\\\"pha").expect("first") < text.find("zeta").expect("second"));
        assert_eq!(
            body["flags"]["zeta"],
            json!({"key": "zeta", "enabled": true, "variant": "t\u{e9}st",
                   "reason": {"code": "condition_match", "condition_index": 1,
                              "description": "Matched condition set 2"},
                   "metadata": {"id": 1, "version": 2, "description": null,
                                "payload": {"x": [1, "two"]}}})
        );
        assert_eq!(
            body["flags"]["al\"pha\\"],
            json!({"key": "al\"pha\\", "enabled": false, "variant": null, "failed": true,
                   "reason": {"code": "no_condition_match", "condition_index": null,
                              "description": "No matching condition set"},
                   "metadata": {"id": 2, "version": 3, "description": null, "payload": null}})
        );
        assert_eq!(body["flags"].as_object().map(|m| m.len()), Some(2));
        assert_eq!(body["errorsWhileComputingFlags"], json!(true));
        assert!(body["requestId"]
            .as_str()
            .is_some_and(|id| uuid::Uuid::parse_str(id).is_ok()));
        assert!(body["evaluatedAt"].as_i64().is_some());
        assert_eq!(body["supportedCompression"], json!(["gzip", "gzip-js"]));
        assert_eq!(body["config"], json!({"enable_collect_everything": true}));
        let plain: Value = serde_json::from_slice(&write(&outcome, None)).expect("JSON");
        assert!(plain.get("config").is_none() && plain.get("toolbarParams").is_none());
    }
}
