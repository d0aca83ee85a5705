//! One flag's entry in a `/flags?v=2` response, written straight into bytes.
//!
//! The JSON that depends only on a flag's definition (escaped key, id, version) is built once
//! per snapshot. So are whole entries for the outcomes nearly every evaluation ends in (no
//! condition matched, out of rollout, a condition matched with each variant and its payload):
//! with hundreds of flags, writing an entry in a dozen small copies cost as much as evaluating
//! the flag. Anything else (errors, holdouts, early access, group conditions) is written
//! piece by piece.

use serde_json::Value;

use super::evaluation::{Evaluation, Reason, ReasonCode};
use super::model::FlagDefinition;

/// Conditions whose outcomes are written ahead, per flag (later ones are written piece by
/// piece), and variants per condition: bounds a snapshot's size however large a flag is.
const CONDITIONS_AHEAD: usize = 4;
const VARIANTS_AHEAD: usize = 8;
/// A payload longer than this is written per request rather than copied into every outcome.
const PAYLOAD_AHEAD: usize = 256;

/// A flag's `v=2` entry parts and ready entries.
#[derive(Debug, Default)]
pub struct V2Entry {
    /// `"<key>":{"key":"<key>","enabled":` (key JSON-escaped).
    head: Box<str>,
    /// `,"metadata":{"id":<id>,"version":<version>,"description":null,"payload":`.
    metadata: Box<str>,
    /// Whole entries for common outcomes.
    ready: Vec<Ready>,
    /// What each of `ready` is found by, same order. Kept apart from the entries so that
    /// finding one reads a cache line or two: scanning the entries themselves touched one
    /// cold line per outcome passed over, most of the writer's own time at hundreds of flags.
    keys: Vec<ReadyKey>,
    /// Bytes an entry usually takes at most.
    typical_len: usize,
}

/// An entry written ahead, and the evaluation it stands for.
#[derive(Debug)]
struct Ready {
    enabled: bool,
    variant: Option<String>,
    code: ReasonCode,
    condition_index: usize,
    payload: Option<Value>,
    bytes: Box<[u8]>,
}

/// The outcome a ready entry stands for, in a few bytes: every field [`Ready::stands_for`]
/// compares but the payload, with the variant as a hash. Equal keys are checked in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadyKey {
    code: ReasonCode,
    condition_index: u8,
    enabled: bool,
    variant: u64,
}

impl ReadyKey {
    /// The key of `e`, if an entry could stand for it at all.
    fn of(e: &Evaluation) -> Option<ReadyKey> {
        if e.failed || e.reason.detail.is_some() {
            return None;
        }
        let condition_index = u8::try_from(e.reason.condition_index?).ok()?;
        Some(ReadyKey {
            code: e.reason.code,
            condition_index,
            enabled: e.enabled,
            variant: variant_hash(e.variant.as_deref()),
        })
    }
}

/// FNV-1a of the variant's name (0 for none): variant names are a few bytes.
fn variant_hash(variant: Option<&str>) -> u64 {
    variant.map_or(0, |v| {
        v.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}

impl Ready {
    fn stands_for(&self, e: &Evaluation) -> bool {
        !e.failed
            && e.reason.detail.is_none()
            && e.reason.code == self.code
            && e.reason.condition_index == Some(self.condition_index)
            && e.enabled == self.enabled
            && e.variant == self.variant
            && e.payload == self.payload
    }

    fn evaluation(&self) -> Evaluation {
        Evaluation {
            enabled: self.enabled,
            variant: self.variant.clone(),
            reason: Reason {
                code: self.code,
                condition_index: Some(self.condition_index),
                detail: None,
            },
            payload: self.payload.clone(),
            failed: false,
        }
    }
}

impl V2Entry {
    pub(crate) fn new(flag: &FlagDefinition) -> V2Entry {
        let key = serde_json::to_string(&flag.key).unwrap_or_else(|_| "\"\"".into());
        let mut entry = V2Entry {
            head: format!("{key}:{{\"key\":{key},\"enabled\":").into(),
            metadata: format!(
                ",\"metadata\":{{\"id\":{},\"version\":{},\"description\":null,\"payload\":",
                flag.id, flag.version
            )
            .into(),
            ready: Vec::new(),
            keys: Vec::new(),
            typical_len: 0,
        };
        entry.ready = common_outcomes(flag)
            .into_iter()
            .map(|(enabled, variant, code, condition_index, payload)| {
                let mut ready = Ready {
                    enabled,
                    variant,
                    code,
                    condition_index,
                    payload,
                    bytes: Box::default(),
                };
                let mut bytes = Vec::new();
                entry.write_parts(&ready.evaluation(), &mut bytes);
                ready.bytes = bytes.into();
                ready
            })
            .collect();
        entry.keys = entry
            .ready
            .iter()
            .filter_map(|r| ReadyKey::of(&r.evaluation()))
            .collect();
        debug_assert_eq!(entry.keys.len(), entry.ready.len());
        entry.typical_len = entry
            .ready
            .iter()
            .map(|r| r.bytes.len())
            .fold(entry.head.len() + entry.metadata.len() + 128, usize::max);
        entry
    }

    /// Appends the entry for `e` to `out`.
    pub fn write(&self, e: &Evaluation, out: &mut Vec<u8>) {
        match self.ready_for(e) {
            Some(ready) => out.extend_from_slice(&ready.bytes),
            None => self.write_parts(e, out),
        }
    }

    /// The first ready entry standing for `e`.
    fn ready_for(&self, e: &Evaluation) -> Option<&Ready> {
        let key = ReadyKey::of(e)?;
        self.keys
            .iter()
            .zip(&self.ready)
            .filter(|(k, _)| **k == key)
            .map(|(_, ready)| ready)
            .find(|ready| ready.stands_for(e))
    }

    /// Bytes an entry usually takes at most (sizes the response once).
    pub fn typical_len(&self) -> usize {
        self.typical_len
    }

    fn write_parts(&self, e: &Evaluation, out: &mut Vec<u8>) {
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice(if e.enabled {
            b"true,\"variant\":"
        } else {
            b"false,\"variant\":"
        });
        match &e.variant {
            Some(v) => json(out, v),
            None => out.extend_from_slice(b"null"),
        }
        if e.failed {
            out.extend_from_slice(b",\"failed\":true");
        }
        out.extend_from_slice(b",\"reason\":{\"code\":\"");
        out.extend_from_slice(e.reason.code.as_str().as_bytes());
        out.extend_from_slice(b"\",\"condition_index\":");
        match e.reason.condition_index {
            Some(i) => number(out, i),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"description\":\"");
        // Plain ASCII without quotes or backslashes (see `Reason::description_parts`).
        let (text, number_after) = e.reason.description_parts();
        out.extend_from_slice(text.as_bytes());
        if let Some(n) = number_after {
            number(out, n);
        }
        out.extend_from_slice(b"\"}");
        out.extend_from_slice(self.metadata.as_bytes());
        match &e.payload {
            Some(p) => json(out, p),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"}}");
    }
}

type Outcome = (bool, Option<String>, ReasonCode, usize, Option<Value>);

/// The outcomes of the flag's first conditions that evaluation produces for most subjects:
/// no match, out of rollout, and a match with each variant (its payload with it).
fn common_outcomes(flag: &FlagDefinition) -> Vec<Outcome> {
    let filters = &flag.filters;
    let fits = |key: &str| {
        filters
            .payloads
            .get(key)
            .is_none_or(|p| serde_json::to_string(p).is_ok_and(|text| text.len() <= PAYLOAD_AHEAD))
    };
    let mut outcomes = Vec::new();
    for index in 0..filters.groups.len().min(CONDITIONS_AHEAD) {
        outcomes.push((false, None, ReasonCode::NoConditionMatch, index, None));
        outcomes.push((false, None, ReasonCode::OutOfRolloutBound, index, None));
        let matched: Vec<Option<&str>> = match &filters.multivariate {
            Some(m) => m
                .variants
                .iter()
                .take(VARIANTS_AHEAD)
                .map(|v| Some(v.key.as_str()))
                .collect(),
            None => vec![None],
        };
        for variant in matched {
            let key = variant.unwrap_or("true");
            if fits(key) {
                outcomes.push((
                    true,
                    variant.map(str::to_string),
                    ReasonCode::ConditionMatch,
                    index,
                    filters.payloads.get(key).cloned(),
                ));
            }
        }
    }
    outcomes
}

fn json(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    // Writing into a Vec cannot fail, and these values (strings, JSON values) always serialize.
    let _ = serde_json::to_writer(out, value);
}

fn number(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::evaluation::evaluate_all;
    use crate::{MatchContext, Subject};

    fn flag(value: Value) -> FlagDefinition {
        serde_json::from_value(value).expect("flag parses")
    }

    fn pieces(entry: &V2Entry, e: &Evaluation) -> Vec<u8> {
        let mut out = Vec::new();
        entry.write_parts(e, &mut out);
        out
    }

    #[test]
    fn entries_written_ahead_are_the_entries_written_piece_by_piece() {
        let long = format!("{{\"text\": \"{}\"}}", "x".repeat(PAYLOAD_AHEAD));
        let flags = [
            flag(
                json!({"id": 1, "key": "plain", "filters": {"groups": [{"rollout_percentage": 50}],
                "payloads": {"true": "{\"a\": 1}"}}}),
            ),
            flag(json!({"id": 2, "key": "multi\"quoted", "filters": {
                "groups": [
                    {"properties": [{"key": "plan", "value": ["pro"], "operator": "exact", "type": "person"}]},
                    {"rollout_percentage": 40}],
                "multivariate": {"variants": [
                    {"key": "control", "rollout_percentage": 50},
                    {"key": "test", "rollout_percentage": 50}]},
                "payloads": {"control": "{\"layout\": \"list\"}", "test": long}}})),
            flag(
                json!({"id": 3, "key": "many", "filters": {"groups": (0..6).map(|i| json!({
                "properties": [{"key": "n", "value": i, "operator": "exact", "type": "person"}]}))
                .collect::<Vec<_>>()}}),
            ),
        ];
        let entries: Vec<V2Entry> = flags.iter().map(V2Entry::new).collect();
        for entry in &entries {
            for ready in &entry.ready {
                assert_eq!(&*ready.bytes, pieces(entry, &ready.evaluation()).as_slice());
            }
        }
        let refs: Vec<&FlagDefinition> = flags.iter().collect();
        let ctx = MatchContext::for_tests();
        let mut copied = 0;
        for i in 0..200 {
            let subject = Subject {
                distinct_id: format!("user-{i}").into(),
                person_properties:
                    json!({"plan": if i % 3 == 0 { "pro" } else { "free" }, "n": i % 8})
                        .as_object()
                        .cloned()
                        .expect("object")
                        .into(),
                ..Subject::default()
            };
            let (results, _) = evaluate_all(&refs, &subject, &Default::default(), ctx);
            for (entry, e) in entries.iter().zip(&results) {
                let mut out = Vec::new();
                entry.write(e, &mut out);
                assert_eq!(out, pieces(entry, e), "{e:?}");
                serde_json::from_slice::<Value>(&[b"{", out.as_slice(), b"}"].concat())
                    .expect("an entry is a JSON member");
                let first = entry.ready.iter().find(|r| r.stands_for(e));
                assert_eq!(
                    entry.ready_for(e).map(|r| &r.bytes),
                    first.map(|r| &r.bytes),
                    "found by its key as by a scan"
                );
                copied += usize::from(first.is_some());
            }
        }
        assert!(
            copied > 300,
            "most entries are copied whole ({copied} of 600)"
        );
    }
}
