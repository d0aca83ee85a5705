//! Raw events → [`CapturedEvent`]s: ids, names, timestamps, IP, `$set` merging, and the
//! historical-import rules. Pure: the clock and the client IP come in through [`Context`].

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use uuid::Uuid;

use corvid_kernel::json::write_string_literal;

use super::decode::RawEvent;
use super::property_keys::ENROLLMENT_EVENT;
use super::raw_properties::{with_added, RawProperties};
use super::time::wal_time::{self, WalTime};
use super::time::{parse_iso8601, resolve_timestamp};

/// Event names are truncated to this many characters.
pub const MAX_EVENT_NAME_CHARS: usize = 200;
/// Historical imports must be at least this old.
pub const HISTORICAL_MIN_AGE: Duration = Duration::hours(48);

/// An accepted event, as written to the write-ahead log.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CapturedEvent {
    pub uuid: Uuid,
    /// Whether this server made `uuid` (the client sent none). Such an event cannot be a
    /// client's retry of one already stored, so the shard's dedup window does not hold it.
    /// `false` after a WAL replay, which then checks every event as before.
    #[serde(skip)]
    pub uuid_made_here: bool,
    pub event: String,
    pub distinct_id: String,
    pub properties: Map<String, Value>,
    /// `properties` as JSON text, made once when the event is accepted
    /// ([`CapturedEvent::freeze_properties`]): the WAL record embeds it and the shard stores it
    /// unless person processing changes the properties. `None` after a WAL replay.
    #[serde(skip)]
    pub properties_json: Option<PropertiesJson>,
    #[serde(deserialize_with = "wal_time::deserialize")]
    pub timestamp: DateTime<Utc>,
    /// Server receive time.
    #[serde(deserialize_with = "wal_time::deserialize")]
    pub created_at: DateTime<Utc>,
}

/// Serialized properties (see [`CapturedEvent::properties_json`]): the text of a JSON object,
/// made only in this module (written from a map, or a client's object checked by
/// [`RawProperties`] with members appended).
#[derive(Debug, Clone, PartialEq)]
pub struct PropertiesJson(String);

impl PropertiesJson {
    pub fn into_string(self) -> String {
        self.0
    }

    /// Length of the JSON text in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl CapturedEvent {
    /// Serializes `properties` once (see [`CapturedEvent::properties_json`]).
    pub fn freeze_properties(&mut self) {
        self.properties_json = serde_json::to_string(&self.properties)
            .ok()
            .map(PropertiesJson);
    }

    /// Appends the WAL form of this event to `out`: what [`Serialize`] writes, with the frozen
    /// properties text copied as it is rather than read again.
    pub(crate) fn write_wal_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let mut uuid = Uuid::encode_buffer();
        out.extend_from_slice(b"{\"uuid\":");
        write_string_literal(out, self.uuid.hyphenated().encode_lower(&mut uuid));
        out.extend_from_slice(b",\"event\":");
        write_string_literal(out, &self.event);
        out.extend_from_slice(b",\"distinct_id\":");
        write_string_literal(out, &self.distinct_id);
        out.extend_from_slice(b",\"properties\":");
        match &self.properties_json {
            Some(text) => out.extend_from_slice(text.0.as_bytes()),
            None => serde_json::to_writer(&mut *out, &self.properties)?,
        }
        out.extend_from_slice(b",\"timestamp\":");
        serde_json::to_writer(&mut *out, &WalTime(&self.timestamp))?;
        out.extend_from_slice(b",\"created_at\":");
        serde_json::to_writer(&mut *out, &WalTime(&self.created_at))?;
        out.push(b'}');
        Ok(())
    }
}

/// The WAL form: `properties` is the frozen text when there is one (same JSON either way).
/// The ingest pipeline writes it with [`CapturedEvent::write_wal_json`].
impl Serialize for CapturedEvent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeStruct};
        let mut s = serializer.serialize_struct("CapturedEvent", 6)?;
        s.serialize_field("uuid", &self.uuid)?;
        s.serialize_field("event", &self.event)?;
        s.serialize_field("distinct_id", &self.distinct_id)?;
        match &self.properties_json {
            Some(text) => {
                let raw: &RawValue = serde_json::from_str(&text.0).map_err(S::Error::custom)?;
                s.serialize_field("properties", raw)?
            }
            None => s.serialize_field("properties", &self.properties)?,
        }
        s.serialize_field("timestamp", &WalTime(&self.timestamp))?;
        s.serialize_field("created_at", &WalTime(&self.created_at))?;
        s.end()
    }
}

/// What normalization needs from outside the event.
#[derive(Debug, Clone)]
pub struct Context {
    pub now: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    /// The client IP (peer or `X-Forwarded-For`).
    pub ip: Option<String>,
    /// False when the project anonymizes IPs: `$ip` is then removed.
    pub capture_ip: bool,
    pub historical_migration: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NormalizeError {
    #[error("event {index}: historical imports need an ISO 8601 `timestamp`")]
    HistoricalMissingTimestamp { index: usize },
    #[error("event {index}: historical import timestamps must be at least 48 hours before the import time; `{timestamp}` is not")]
    HistoricalTooRecent { index: usize, timestamp: String },
    #[error("event {index}: `properties` could not be read")]
    UnreadableProperties { index: usize },
}

impl NormalizeError {
    pub fn event_index(&self) -> usize {
        match self {
            NormalizeError::HistoricalMissingTimestamp { index }
            | NormalizeError::HistoricalTooRecent { index, .. }
            | NormalizeError::UnreadableProperties { index } => *index,
        }
    }
}

/// Normalizes every event of a request; one failure rejects them all.
pub fn normalize_all(
    events: Vec<RawEvent>,
    ctx: &Context,
) -> Result<Vec<CapturedEvent>, NormalizeError> {
    let sent_at = ctx.sent_at.map(|t| Value::String(t.to_rfc3339()));
    events
        .into_iter()
        .map(|e| normalize_with(e, ctx, sent_at.as_ref()))
        .collect()
}

#[cfg(test)]
pub fn normalize(raw: RawEvent, ctx: &Context) -> Result<CapturedEvent, NormalizeError> {
    let sent_at = ctx.sent_at.map(|t| Value::String(t.to_rfc3339()));
    normalize_with(raw, ctx, sent_at.as_ref())
}

/// `sent_at` is the request's send time already formatted, shared by all its events.
fn normalize_with(
    mut raw: RawEvent,
    ctx: &Context,
    sent_at: Option<&Value>,
) -> Result<CapturedEvent, NormalizeError> {
    if ctx.historical_migration {
        check_historical(&raw, ctx.now)?;
    }
    let index = raw.index;
    let unreadable = |_| NormalizeError::UnreadableProperties { index };
    let mut properties = match std::mem::take(&mut raw.properties) {
        RawProperties::Text { text, read } if edits_only_add(&read, &raw, ctx) => {
            return Ok(normalize_text(raw, text, read, ctx, sent_at));
        }
        other => other.into_map().map_err(unreadable)?,
    };
    merge_top_level("$set", raw.set.take(), &mut properties);
    merge_top_level("$set_once", raw.set_once.take(), &mut properties);
    if raw.event == ENROLLMENT_EVENT {
        set_enrollment(&mut properties);
    }

    if ctx.capture_ip {
        if let Some(ip) = ip_to_add(&properties, ctx) {
            properties.insert("$ip".into(), Value::String(ip));
        }
    } else {
        properties.remove("$ip");
    }
    if let Some(sent_at) = sent_at {
        properties
            .entry("$sent_at")
            .or_insert_with(|| sent_at.clone());
    }
    if let Some(Value::String(session)) = properties.get_mut("$session_id") {
        if Uuid::parse_str(session).is_ok() {
            *session = session.to_ascii_lowercase();
        }
    }
    Ok(accepted(raw, properties, None, ctx))
}

/// The accepted event: its ids, name and resolved timestamp, with its properties (every one,
/// or on the text path the read ones beside the text).
fn accepted(
    raw: RawEvent,
    properties: Map<String, Value>,
    properties_json: Option<PropertiesJson>,
    ctx: &Context,
) -> CapturedEvent {
    let ignore_sent_at = matches!(properties.get("$ignore_sent_at"), Some(Value::Bool(true)));
    let timestamp = resolve_timestamp(
        ctx.now,
        raw.timestamp.as_deref(),
        raw.offset,
        ctx.sent_at,
        ignore_sent_at,
    );
    CapturedEvent {
        uuid: raw.uuid.unwrap_or_else(Uuid::now_v7),
        uuid_made_here: raw.uuid.is_none(),
        event: truncated(raw.event, MAX_EVENT_NAME_CHARS),
        distinct_id: raw.distinct_id,
        properties,
        properties_json,
        timestamp,
        created_at: ctx.now,
    }
}

/// Whether every edit [`normalize_with`] would make to properties that hold `read` adds a key:
/// no top-level `$set`/`$set_once` merged into the properties' own, no `$ip` removed, no
/// session id lowercased.
fn edits_only_add(read: &Map<String, Value>, raw: &RawEvent, ctx: &Context) -> bool {
    let merges = (raw.set.is_some() && read.contains_key("$set"))
        || (raw.set_once.is_some() && read.contains_key("$set_once"));
    let drops_ip = !ctx.capture_ip && read.contains_key("$ip");
    let lowers_session = matches!(
        read.get("$session_id"),
        Some(Value::String(s)) if s.bytes().any(|b| b.is_ascii_uppercase()) && Uuid::parse_str(s).is_ok()
    );
    !(merges || drops_ip || lowers_session)
}

/// [`normalize_with`] on the text path: the same result, with the added keys written after
/// the client's text instead of into a parsed map.
fn normalize_text(
    mut raw: RawEvent,
    text: String,
    mut read: Map<String, Value>,
    ctx: &Context,
    sent_at: Option<&Value>,
) -> CapturedEvent {
    let mut added: Vec<(&str, Value)> = Vec::new();
    for (key, top) in [("$set", raw.set.take()), ("$set_once", raw.set_once.take())] {
        if let Some(top) = top {
            let top = Value::Object(top);
            read.insert(key.to_string(), top.clone());
            added.push((key, top));
        }
    }
    if ctx.capture_ip {
        added.extend(ip_to_add(&read, ctx).map(|ip| ("$ip", Value::String(ip))));
    }
    if let Some(sent_at) = sent_at.filter(|_| !read.contains_key("$sent_at")) {
        added.push(("$sent_at", sent_at.clone()));
    }
    let json = if added.is_empty() {
        text
    } else {
        with_added(text, &added)
    };
    accepted(raw, read, Some(PropertiesJson(json)), ctx)
}

/// An enrollment event sets `$feature_enrollment/<flag>` on the person, as its `$set` says,
/// or from `$feature_flag` and `$feature_enrollment` when a client sent no `$set`.
fn set_enrollment(properties: &mut Map<String, Value>) {
    let (Some(Value::String(flag)), Some(Value::Bool(enrolled))) = (
        properties.get("$feature_flag").cloned(),
        properties.get("$feature_enrollment").cloned(),
    ) else {
        return;
    };
    let mut set = Map::new();
    set.insert(format!("$feature_enrollment/{flag}"), Value::Bool(enrolled));
    match properties.get_mut("$set") {
        Some(Value::Object(existing)) => {
            for (k, v) in set {
                existing.entry(k).or_insert(v);
            }
        }
        _ => {
            properties.insert("$set".into(), Value::Object(set));
        }
    }
}

/// The `$ip` a project that captures IPs adds to properties without one: loopback for
/// PostHog's own internal events (`capture_internal`), else the client's address.
fn ip_to_add(properties: &Map<String, Value>, ctx: &Context) -> Option<String> {
    if properties.contains_key("$ip") {
        None
    } else if properties.contains_key("capture_internal") {
        Some("127.0.0.1".to_string())
    } else {
        ctx.ip.clone()
    }
}

/// `text` cut to its first `max` characters; as it is when no longer (in bytes, so without
/// counting characters).
fn truncated(text: String, max: usize) -> String {
    if text.len() <= max {
        text
    } else {
        text.chars().take(max).collect()
    }
}

/// Top-level `$set`/`$set_once` join `properties.$set`/`$set_once`; top-level keys win.
fn merge_top_level(
    key: &str,
    top: Option<Map<String, Value>>,
    properties: &mut Map<String, Value>,
) {
    let Some(top) = top else { return };
    match properties.get_mut(key) {
        Some(Value::Object(existing)) => existing.extend(top),
        _ => {
            properties.insert(key.to_string(), Value::Object(top));
        }
    }
}

fn check_historical(raw: &RawEvent, now: DateTime<Utc>) -> Result<(), NormalizeError> {
    let index = raw.index;
    let text = raw
        .timestamp
        .as_deref()
        .ok_or(NormalizeError::HistoricalMissingTimestamp { index })?;
    let at = parse_iso8601(text).ok_or(NormalizeError::HistoricalMissingTimestamp { index })?;
    if now - at < HISTORICAL_MIN_AGE {
        return Err(NormalizeError::HistoricalTooRecent {
            index,
            timestamp: text.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(index: usize) -> RawEvent {
        RawEvent {
            index,
            event: "$pageview".into(),
            distinct_id: "u1".into(),
            uuid: None,
            properties: RawProperties::default(),
            timestamp: None,
            offset: None,
            set: None,
            set_once: None,
        }
    }

    /// The parsed properties of an event built by [`raw`].
    fn props(r: &mut RawEvent) -> &mut Map<String, Value> {
        match &mut r.properties {
            RawProperties::Parsed(map) => map,
            RawProperties::Text { .. } => panic!("built parsed"),
        }
    }

    fn ctx() -> Context {
        Context {
            now: "2024-03-10T12:00:00Z".parse().expect("time"),
            sent_at: None,
            ip: Some("203.0.113.9".into()),
            capture_ip: true,
            historical_migration: false,
        }
    }

    #[test]
    fn fills_ids_ip_and_merges_top_level_set() {
        let mut r = raw(0);
        r.event = "x".repeat(300);
        r.set = Some(json!({"plan": "pro"}).as_object().cloned().expect("obj"));
        props(&mut r).insert("$set".into(), json!({"plan": "free", "name": "Ann"}));
        let e = normalize(r, &ctx()).expect("ok");
        assert_eq!(e.uuid.get_version_num(), 7);
        assert_eq!(e.event.chars().count(), 200);
        assert_eq!(e.properties["$ip"], "203.0.113.9");
        assert_eq!(e.properties["$set"], json!({"plan": "pro", "name": "Ann"}));
        assert_eq!(e.timestamp, ctx().now);
    }

    #[test]
    fn enrollment_events_set_the_enrollment_property() {
        let mut r = raw(0);
        r.event = "$feature_enrollment_update".into();
        *props(&mut r) = json!({"$feature_flag": "beta", "$feature_enrollment": false})
            .as_object()
            .cloned()
            .expect("obj");
        let e = normalize(r.clone(), &ctx()).expect("ok");
        assert_eq!(
            e.properties["$set"],
            json!({"$feature_enrollment/beta": false})
        );
        // What the client's own `$set` says wins.
        r.set = Some(
            json!({"$feature_enrollment/beta": true, "x": 1})
                .as_object()
                .cloned()
                .expect("obj"),
        );
        let e = normalize(r, &ctx()).expect("ok");
        assert_eq!(
            e.properties["$set"],
            json!({"$feature_enrollment/beta": true, "x": 1})
        );
        let mut other = raw(1);
        props(&mut other).insert("$feature_flag".into(), json!("beta"));
        props(&mut other).insert("$feature_enrollment".into(), json!(true));
        assert!(normalize(other, &ctx())
            .expect("ok")
            .properties
            .get("$set")
            .is_none());
    }

    #[test]
    fn frozen_properties_give_the_same_wal_record() {
        let mut r = raw(0);
        props(&mut r).insert("name".into(), json!("A \"quoted\" \u{e9} name"));
        props(&mut r).insert("n".into(), json!([1, {"b": null}]));
        let mut e = normalize(r, &ctx()).expect("ok");
        let plain = serde_json::to_string(&e).expect("json");
        e.freeze_properties();
        assert_eq!(serde_json::to_string(&e).expect("json"), plain);
        let back: CapturedEvent = serde_json::from_str(&plain).expect("replay");
        assert_eq!(back.properties, e.properties);
        assert_eq!(
            e.properties_json.clone().map(PropertiesJson::into_string),
            Some(serde_json::to_string(&e.properties).expect("json"))
        );
    }

    /// The text path stores what the parsed path stores, and person processing and the shard
    /// read the same values from either.
    #[test]
    fn text_and_parsed_properties_normalize_alike() {
        use crate::property_keys::{PROCESSING_READS, SHARD_READS};
        let texts = [
            "{}",
            r#"{"$browser":"Chrome","$session_id":"0193A8A0-47C1-7B8E-9C4E-6B2F6C1D2E3F"}"#,
            r#"{"$session_id":"0193a8a0-47c1-7b8e-9c4e-6b2f6c1d2e3f","$ip":"1.2.3.4","n":1.5}"#,
            r#"{"$set":{"a":1},"$set_once":{"b":2},"capture_internal":true,"$sent_at":"x","$ignore_sent_at":true}"#,
            r#"{ "nested": {"k": [1, "two", null]} , "x": "\u00e9", "$window_id": "w" }"#,
        ];
        let tops = [
            (None, None),
            (json!({"plan": "pro"}).as_object().cloned(), None),
            (None, json!({"first": true}).as_object().cloned()),
        ];
        let sent_at: DateTime<Utc> = "2024-03-10T11:59:59Z".parse().expect("time");
        let mut text_paths = 0;
        for text in texts {
            for (set, set_once) in &tops {
                for (capture_ip, sent_at) in [(true, Some(sent_at)), (false, None)] {
                    let mut c = ctx();
                    c.capture_ip = capture_ip;
                    c.sent_at = sent_at;
                    let mut r = raw(0);
                    r.uuid = Some(Uuid::nil());
                    r.timestamp = Some("2024-03-10T11:00:00Z".into());
                    r.set = set.clone();
                    r.set_once = set_once.clone();
                    r.properties = RawProperties::Parsed(serde_json::from_str(text).expect("map"));
                    let parsed = normalize(r.clone(), &c).expect("parsed");
                    r.properties = RawProperties::read(text, true).expect("text");
                    let kept = normalize(r, &c).expect("text");
                    let case = format!("{text} {set:?} {set_once:?} {capture_ip}");
                    let stored: Map<String, Value> = match &kept.properties_json {
                        Some(json) => {
                            text_paths += 1;
                            serde_json::from_str(&json.clone().into_string()).expect("json")
                        }
                        None => kept.properties.clone(),
                    };
                    assert_eq!(stored, parsed.properties, "{case}");
                    for key in PROCESSING_READS.iter().chain(&SHARD_READS) {
                        assert_eq!(
                            kept.properties.get(*key),
                            parsed.properties.get(*key),
                            "{case} {key}"
                        );
                    }
                    assert_eq!(
                        (kept.uuid, kept.event, kept.distinct_id, kept.timestamp),
                        (
                            parsed.uuid,
                            parsed.event,
                            parsed.distinct_id,
                            parsed.timestamp
                        ),
                        "{case}"
                    );
                }
            }
        }
        // Of the 30 cases, these parse: the upper-case session id (6), the dropped `$ip` (3),
        // the top-level `$set` or `$set_once` merged into the properties' own (4).
        assert_eq!(text_paths, 17);
    }

    #[test]
    fn anonymized_projects_drop_ip_and_clients_may_set_their_own() {
        let mut c = ctx();
        c.capture_ip = false;
        let mut r = raw(0);
        props(&mut r).insert("$ip".into(), json!("1.2.3.4"));
        assert!(!normalize(r, &c).expect("ok").properties.contains_key("$ip"));
        let mut r = raw(0);
        props(&mut r).insert("$ip".into(), json!("1.2.3.4"));
        assert_eq!(
            normalize(r, &ctx()).expect("ok").properties["$ip"],
            "1.2.3.4"
        );
    }

    #[test]
    fn historical_events_need_old_iso_timestamps() {
        let mut c = ctx();
        c.historical_migration = true;
        let mut r = raw(3);
        assert_eq!(
            normalize(r.clone(), &c),
            Err(NormalizeError::HistoricalMissingTimestamp { index: 3 })
        );
        r.timestamp = Some("2024-03-09T12:00:00Z".into());
        assert!(matches!(
            normalize(r.clone(), &c),
            Err(NormalizeError::HistoricalTooRecent { index: 3, .. })
        ));
        r.timestamp = Some("1709294400".into());
        assert!(matches!(
            normalize(r.clone(), &c),
            Err(NormalizeError::HistoricalMissingTimestamp { index: 3 })
        ));
        r.timestamp = Some("2024-03-08T11:59:00Z".into());
        let e = normalize(r, &c).expect("48 h old is fine");
        assert_eq!(
            e.timestamp,
            "2024-03-08T11:59:00Z".parse::<DateTime<Utc>>().expect("t")
        );
    }
}
