//! Capture request decoding: bytes on the wire → validated raw events.
//!
//! One pure module, so it can be property-tested: no I/O, no clock. The bytes become JSON text
//! in [`corvid_kernel::wire`] (shared with `/flags`); here come PostHog's capture shapes: an array of
//! events, a batch object, a single event, or (on `/engage`) a person update that becomes
//! `$identify`.
//!
//! Validation is all-or-nothing: one bad event rejects the whole request.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::property_keys::{NORMALIZE_EDITING_EVENTS, PROPERTY_EDITING_EVENTS};
pub use super::raw_properties::RawProperties;
use super::raw_properties::{Checked, ScannedProperties};
use corvid_kernel::json::{
    is_json_space, is_plain_scalar, members_read_by, parse_value, value_len_checked,
};
use corvid_kernel::wire::{decode_text, WireError, WireInput};

/// Which family of route received the request; it changes decoding slightly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// `/batch`, `/i/v0/e`: the modern routes.
    Analytics,
    /// `/e`, `/capture`, `/track`: legacy routes. They decode exactly like `Analytics` (the
    /// base64-inside-gzip pass PostHog limits to them is applied everywhere); the variant names
    /// the route family.
    Legacy,
    /// `/engage`: legacy person updates; an object without `event` becomes `$identify`.
    Engage,
}

/// The query-string parameters capture understands.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaptureQuery {
    pub compression: Option<String>,
    pub data: Option<String>,
    /// `sent_at` or `_`: epoch milliseconds.
    pub sent_at_ms: Option<i64>,
    /// `beacon=1`: answer 204 with no body.
    pub beacon: bool,
}

impl CaptureQuery {
    /// Builds the query from already URL-decoded pairs; unknown keys are ignored.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> CaptureQuery {
        let mut q = CaptureQuery::default();
        for (k, v) in pairs {
            match k {
                "compression" => q.compression = Some(v.to_string()),
                "data" if !v.is_empty() => q.data = Some(v.to_string()),
                "sent_at" | "_" => q.sent_at_ms = v.trim().parse().ok(),
                "beacon" => q.beacon = v == "1" || v.eq_ignore_ascii_case("true"),
                _ => {}
            }
        }
        q
    }
}

/// Everything the decoder looks at.
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    pub route: RouteKind,
    pub body: &'a [u8],
    pub query: &'a CaptureQuery,
    pub content_type: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload after decompression (100 MiB by default).
    pub max_decompressed_bytes: usize,
    /// Largest single event, as JSON text (1 MiB by default).
    pub max_event_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_decompressed_bytes: 100 * 1024 * 1024,
            max_event_bytes: 1024 * 1024,
        }
    }
}

/// One event as the client sent it, after shape checks; not yet normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct RawEvent {
    /// Position in the request, for error messages.
    pub index: usize,
    pub event: String,
    pub distinct_id: String,
    pub uuid: Option<Uuid>,
    pub properties: RawProperties,
    pub timestamp: Option<String>,
    /// Milliseconds before the server's receive time.
    pub offset: Option<i64>,
    pub set: Option<Map<String, Value>>,
    pub set_once: Option<Map<String, Value>>,
}

/// A decoded request: one project token and its events.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedRequest {
    pub token: String,
    pub events: Vec<RawEvent>,
    pub historical_migration: bool,
    /// The client's send time: the batch's `sent_at`, else the query's `_`/`sent_at`.
    pub sent_at: Option<DateTime<Utc>>,
}

/// Why a capture request was rejected. Each variant says which HTTP class it belongs to via
/// [`DecodeError::class`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes could not be turned into text (the wire decoder shared with `/flags`).
    #[error(transparent)]
    Wire(#[from] WireError),
    /// One event is over the per-event limit.
    #[error(
        "maximum event size exceeded: event {index} is over the per-event limit of {limit} bytes"
    )]
    EventTooLarge { limit: usize, index: usize },
    #[error("failed to parse request: {0}")]
    InvalidJson(String),
    #[error(
        "failed to parse request: expected an event object, an array of events or a batch object"
    )]
    WrongShape,
    #[error("request holds no event")]
    NoEvents,
    #[error("event {index}: must be a JSON object")]
    EventNotObject { index: usize },
    #[error("event {index}: missing event name (`event`)")]
    MissingEventName { index: usize },
    #[error("event {index}: submitted with an empty event name")]
    EmptyEventName { index: usize },
    #[error("event {index}: submitted without a distinct_id")]
    MissingDistinctId { index: usize },
    #[error("event {index}: `uuid` is not a valid UUID")]
    InvalidUuid { index: usize },
    #[error("event {index}: `{field}` must be {expected}")]
    InvalidField {
        index: usize,
        field: &'static str,
        expected: &'static str,
    },
    #[error("batch field `{field}` must be {expected}")]
    InvalidBatchField {
        field: &'static str,
        expected: &'static str,
    },
    #[error("event submitted without an api_key (project token)")]
    NoToken,
    #[error("batch submitted with inconsistent api_key values")]
    MultipleTokens,
    #[error("API key is not valid: {reason}")]
    InvalidToken { reason: &'static str },
}

/// The HTTP class of a decode error; the service maps these to status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    BadRequest,
    Unauthorized,
    TooLarge,
}

impl DecodeError {
    pub fn class(&self) -> ErrorClass {
        match self {
            DecodeError::Wire(WireError::TooLarge { .. }) | DecodeError::EventTooLarge { .. } => {
                ErrorClass::TooLarge
            }
            DecodeError::NoToken
            | DecodeError::MultipleTokens
            | DecodeError::InvalidToken { .. } => ErrorClass::Unauthorized,
            DecodeError::Wire(_)
            | DecodeError::InvalidJson(_)
            | DecodeError::WrongShape
            | DecodeError::NoEvents
            | DecodeError::EventNotObject { .. }
            | DecodeError::MissingEventName { .. }
            | DecodeError::EmptyEventName { .. }
            | DecodeError::MissingDistinctId { .. }
            | DecodeError::InvalidUuid { .. }
            | DecodeError::InvalidField { .. }
            | DecodeError::InvalidBatchField { .. } => ErrorClass::BadRequest,
        }
    }

    /// The index of the offending event, when one is to blame.
    pub fn event_index(&self) -> Option<usize> {
        match self {
            DecodeError::EventNotObject { index }
            | DecodeError::MissingEventName { index }
            | DecodeError::EmptyEventName { index }
            | DecodeError::MissingDistinctId { index }
            | DecodeError::InvalidUuid { index }
            | DecodeError::InvalidField { index, .. }
            | DecodeError::EventTooLarge { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// Events that PostHog drops silently at capture.
const DROPPED_EVENTS: [&str; 1] = ["$performance_event"];
const MAX_TOKEN_LEN: usize = 64;
pub const MAX_DISTINCT_ID_CHARS: usize = 200;

/// Decodes a capture request into its token and events.
pub fn decode(payload: Payload<'_>, limits: Limits) -> Result<DecodedRequest, DecodeError> {
    let text = decode_text(
        WireInput {
            body: payload.body,
            query_data: payload.query.data.as_deref(),
            query_compression: payload.query.compression.as_deref(),
            content_type: payload.content_type,
            content_encoding: payload.content_encoding,
        },
        limits.max_decompressed_bytes,
    )?;
    parse_events(&text, payload.route, payload.query, limits)
}

#[derive(serde::Deserialize)]
struct BatchProbe<'a> {
    #[serde(borrow, default)]
    batch: Option<Vec<&'a RawValue>>,
    #[serde(default)]
    api_key: Option<Value>,
    #[serde(default)]
    token: Option<Value>,
    #[serde(default)]
    historical_migration: Option<Value>,
    #[serde(default)]
    sent_at: Option<Value>,
}

/// Step 7: the JSON shapes, token resolution and per-event validation.
///
/// A body of events (an array, or a batch object with its `batch` array) is first read in one
/// pass ([`parse_walked`]). Any body that pass does not take whole (bad JSON, an event that is
/// rejected, another shape) is read again by parsing it first and each event after, which
/// says exactly what is wrong, so both ways accept the same bodies and give the same events.
fn parse_events(
    text: &str,
    route: RouteKind,
    query: &CaptureQuery,
    limits: Limits,
) -> Result<DecodedRequest, DecodeError> {
    let trimmed = text.trim_start();
    match parse_walked(trimmed, route, query, limits) {
        Some(decoded) => Ok(decoded),
        None => parse_parsed(trimmed, route, query, limits),
    }
}

/// [`parse_events`] the long way: the body parsed first, then each event.
pub(crate) fn parse_parsed(
    trimmed: &str,
    route: RouteKind,
    query: &CaptureQuery,
    limits: Limits,
) -> Result<DecodedRequest, DecodeError> {
    let mut batch = BatchFields::default();
    let raw_events: Vec<&RawValue> = match trimmed.as_bytes().first() {
        Some(b'[') => serde_json::from_str(trimmed).map_err(json_error)?,
        Some(b'{') => {
            let probe: BatchProbe<'_> = serde_json::from_str(trimmed).map_err(json_error)?;
            match probe.batch {
                Some(events) => {
                    batch = BatchFields::read(
                        probe.api_key.or(probe.token),
                        probe.historical_migration,
                        probe.sent_at,
                    )?;
                    events
                }
                None => vec![serde_json::from_str::<&RawValue>(trimmed).map_err(json_error)?],
            }
        }
        _ => {
            return Err(if trimmed.is_empty() {
                DecodeError::Wire(WireError::EmptyPayload)
            } else {
                serde_json::from_str::<Value>(trimmed)
                    .map(|_| DecodeError::WrongShape)
                    .unwrap_or_else(json_error)
            })
        }
    };
    let parsed = raw_events.into_iter().enumerate().map(|(index, raw)| {
        let text = raw.get();
        if text.len() > limits.max_event_bytes {
            return Err(DecodeError::EventTooLarge {
                limit: limits.max_event_bytes,
                index,
            });
        }
        let (fields, _) = event_fields(text).ok_or(DecodeError::EventNotObject { index })?;
        parse_event(index, fields, route)
    });
    collect_events(parsed, batch, query)
}

/// An event read from its object, with the token it names (if any).
type ParsedEvent = (RawEvent, Option<String>);

/// A batch object's own fields, read.
#[derive(Default)]
struct BatchFields {
    token: Option<String>,
    historical_migration: bool,
    sent_at: Option<DateTime<Utc>>,
}

impl BatchFields {
    fn read(
        token: Option<Value>,
        historical_migration: Option<Value>,
        sent_at: Option<Value>,
    ) -> Result<BatchFields, DecodeError> {
        let token = match token {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(_) => {
                return Err(DecodeError::InvalidBatchField {
                    field: "api_key",
                    expected: "a string",
                })
            }
        };
        let historical_migration = match historical_migration {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(_) => {
                return Err(DecodeError::InvalidBatchField {
                    field: "historical_migration",
                    expected: "a boolean",
                })
            }
        };
        let sent_at = match sent_at {
            Some(Value::String(s)) => crate::time::parse_timestamp(&s),
            _ => None,
        };
        Ok(BatchFields {
            token,
            historical_migration,
            sent_at,
        })
    }
}

/// The request from its events in order (the first error wins) and its batch's fields:
/// the token, and the events kept.
fn collect_events(
    parsed: impl ExactSizeIterator<Item = Result<ParsedEvent, DecodeError>>,
    batch: BatchFields,
    query: &CaptureQuery,
) -> Result<DecodedRequest, DecodeError> {
    if parsed.len() == 0 {
        return Err(DecodeError::NoEvents);
    }
    let sent_at = batch
        .sent_at
        .or_else(|| query.sent_at_ms.and_then(sent_at_from_millis));
    let mut events = Vec::with_capacity(parsed.len());
    let mut event_tokens: Vec<String> = Vec::new();
    for item in parsed {
        let (event, token) = item?;
        if let Some(token) = token {
            if batch.token.is_none() && !event_tokens.contains(&token) {
                event_tokens.push(token);
            }
        }
        if !DROPPED_EVENTS.contains(&event.event.as_str()) {
            events.push(event);
        }
    }
    let token = match batch.token {
        Some(token) => token,
        None => match event_tokens.len() {
            0 => return Err(DecodeError::NoToken),
            1 => event_tokens.remove(0),
            _ => return Err(DecodeError::MultipleTokens),
        },
    };
    let token = validate_token(&token)?;
    Ok(DecodedRequest {
        token,
        events,
        historical_migration: batch.historical_migration,
        sent_at,
    })
}

/// Reads an array of events or a batch object in one pass, each event where the walk finds
/// it, without parsing the body first. Every value is still checked by a parse (the fields
/// read, the properties, any value that is not a plain scalar) and every key and bracket by
/// the walk, so nothing is taken that a parse would refuse. `None` for anything else (another
/// shape, a repeated batch field, an event that is rejected, text a parse may take but the
/// walk does not): [`parse_events`] then reads the body the long way.
pub(crate) fn parse_walked(
    trimmed: &str,
    route: RouteKind,
    query: &CaptureQuery,
    limits: Limits,
) -> Option<DecodedRequest> {
    let (events, batch, end) = match trimmed.as_bytes().first()? {
        b'[' => {
            let (events, end) = walk_events(trimmed, route, limits)?;
            (events, BatchFields::default(), end)
        }
        // A single event object is read the long way: its batch fields and its own fields
        // overlap, and a parse of the batch fields refuses some events a walk would take.
        b'{' if !trimmed.contains("\"batch\"") => return None,
        b'{' => {
            let mut events = None;
            let mut fields: [Option<Option<Value>>; 4] = Default::default();
            let end = members_read_by(trimmed, |key, rest| {
                let slot = ["api_key", "token", "historical_migration", "sent_at"]
                    .iter()
                    .position(|name| *name == key);
                if key == "batch" {
                    if events.is_some() {
                        return None;
                    }
                    let (walked, len) = walk_events(rest, route, limits)?;
                    events = Some(walked);
                    return Some(len);
                }
                let value = rest.get(..value_len_checked(rest)?)?;
                match slot {
                    // A parse into the batch's fields refuses a repeated one.
                    Some(i) if fields[i].is_some() => return None,
                    Some(i) => fields[i] = Some(serde_json::from_str(value).ok()?),
                    None if is_plain_scalar(value) => {}
                    None => {
                        serde_json::from_str::<Checked>(value).ok()?;
                    }
                }
                Some(value.len())
            })?;
            let [api_key, token, historical_migration, sent_at] = fields.map(Option::flatten);
            let batch = BatchFields::read(api_key.or(token), historical_migration, sent_at).ok()?;
            (events?, batch, end)
        }
        _ => return None,
    };
    if !trimmed
        .as_bytes()
        .get(end..)?
        .iter()
        .all(|b| is_json_space(*b))
    {
        return None;
    }
    collect_events(events.into_iter().map(Ok), batch, query).ok()
}

/// The events of the JSON array at the start of `text`, each read where the walk finds it,
/// and the array's length in bytes. `None` when an element is not an accepted event object
/// or the array is not well formed.
fn walk_events(text: &str, route: RouteKind, limits: Limits) -> Option<(Vec<ParsedEvent>, usize)> {
    let bytes = text.as_bytes();
    let space = |mut at: usize| {
        while bytes.get(at).copied().is_some_and(is_json_space) {
            at += 1;
        }
        at
    };
    if bytes.first() != Some(&b'[') {
        return None;
    }
    let mut events = Vec::new();
    let mut at = space(1);
    if bytes.get(at) == Some(&b']') {
        return Some((events, at + 1));
    }
    loop {
        let rest = text.get(at..)?;
        if !rest.starts_with('{') {
            return None;
        }
        let (fields, len) = event_fields(rest)?;
        if len > limits.max_event_bytes {
            return None;
        }
        events.push(parse_event(events.len(), fields, route).ok()?);
        at = space(at + len);
        match bytes.get(at)? {
            b',' => at = space(at + 1),
            b']' => return Some((events, at + 1)),
            _ => return None,
        }
    }
}

fn json_error(err: serde_json::Error) -> DecodeError {
    DecodeError::InvalidJson(err.to_string())
}

/// `_`/`sent_at` in the query are epoch milliseconds; values whose year is not after 2020 are
/// ignored (they were sent in seconds).
fn sent_at_from_millis(ms: i64) -> Option<DateTime<Utc>> {
    let t = Utc.timestamp_millis_opt(ms).single()?;
    (t.year() > 2020).then_some(t)
}

fn validate_token(token: &str) -> Result<String, DecodeError> {
    let token = token.trim();
    let reason = if token.is_empty() {
        "empty"
    } else if token.len() > MAX_TOKEN_LEN {
        "too_long"
    } else if !token.is_ascii() {
        "not_ascii"
    } else if token.starts_with("phx_") {
        "personal_api_key"
    } else if token.contains('\0') {
        "null_byte"
    } else {
        return Ok(token.to_string());
    };
    Err(DecodeError::InvalidToken { reason })
}

fn string_token(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// The fields of an event object [`parse_event`] reads, besides `properties`.
const EVENT_FIELDS: [&str; 11] = [
    "event",
    "distinct_id",
    "$distinct_id",
    "uuid",
    "timestamp",
    "offset",
    "$set",
    "$set_once",
    "token",
    "api_key",
    "$token",
];

/// An event object: its properties apart, the fields read parsed.
struct EventFields<'a> {
    fields: Fields,
    properties: Option<EventProperties<'a>>,
}

/// The values of [`EVENT_FIELDS`] in an event, by the field's place in that list: read
/// without a map (no key copied, no node allocated) as most events have six of them.
#[derive(Default)]
struct Fields([Option<Value>; EVENT_FIELDS.len()]);

impl Fields {
    fn slot(name: &str) -> Option<usize> {
        EVENT_FIELDS.iter().position(|field| *field == name)
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.0[Self::slot(name)?].as_ref()
    }

    fn remove(&mut self, name: &str) -> Option<Value> {
        self.0[Self::slot(name)?].take()
    }
}

/// An event's `properties` member: an object already read, or any other value's text.
enum EventProperties<'a> {
    Object(ScannedProperties<'a>),
    Other(&'a str),
}

/// Reads an event object's fields from its text. The whole body was parsed once already (into
/// each event's text), so a walk finds the members without checking the JSON again. A
/// repeated field counts once, the last, as in a parsed map. The fields read are parsed; the
/// properties object is read by its own parse where the walk finds it (so its text is gone
/// over once); the fields nobody reads are checked as a parse into values would check them,
/// and dropped. `None` when the event is not an object or a field does not parse.
fn event_fields(text: &str) -> Option<(EventFields<'_>, usize)> {
    let mut event = EventFields {
        fields: Fields::default(),
        properties: None,
    };
    let end = members_read_by(text, |key, rest| {
        if key == "properties" && rest.starts_with('{') {
            let scanned = ScannedProperties::read_prefix(rest).ok()?;
            let len = scanned.text().len();
            event.properties = Some(EventProperties::Object(scanned));
            return Some(len);
        }
        let value = rest.get(..value_len_checked(rest)?)?;
        if key == "properties" {
            event.properties = Some(EventProperties::Other(value));
        } else if let Some(slot) = Fields::slot(&key) {
            event.fields.0[slot] = Some(parse_value(value)?);
        } else if !is_plain_scalar(value) {
            serde_json::from_str::<Checked>(value).ok()?;
        }
        Some(value.len())
    })?;
    Some((event, end))
}

fn parse_event(
    index: usize,
    event: EventFields<'_>,
    route: RouteKind,
) -> Result<ParsedEvent, DecodeError> {
    let EventFields {
        fields: mut obj,
        properties,
    } = event;
    let properties = match properties {
        None | Some(EventProperties::Other("null")) => None,
        Some(EventProperties::Object(scanned)) => Some(scanned),
        Some(EventProperties::Other(_)) => {
            return Err(DecodeError::InvalidField {
                index,
                field: "properties",
                expected: "an object",
            })
        }
    };
    let event = match obj.remove("event") {
        Some(Value::String(name)) if name.is_empty() => {
            return Err(DecodeError::EmptyEventName { index })
        }
        Some(Value::String(name)) => name,
        None | Some(Value::Null) if route == RouteKind::Engage => "$identify".to_string(),
        None | Some(Value::Null) => return Err(DecodeError::MissingEventName { index }),
        Some(_) => {
            return Err(DecodeError::InvalidField {
                index,
                field: "event",
                expected: "a string",
            })
        }
    };
    // The text is kept unless capture edits these properties in place: an engage body's token
    // is removed below, and some events' properties are edited by normalization or person
    // processing.
    let keep_text = route != RouteKind::Engage
        && !PROPERTY_EDITING_EVENTS.contains(&event.as_str())
        && !NORMALIZE_EDITING_EVENTS.contains(&event.as_str());
    let mut properties = match properties {
        None => RawProperties::default(),
        Some(scanned) => scanned
            .into_raw(keep_text)
            .map_err(|_| DecodeError::EventNotObject { index })?,
    };
    let token = string_token(obj.get("token"))
        .or_else(|| string_token(obj.get("api_key")))
        .or_else(|| string_token(obj.get("$token")))
        .or_else(|| string_token(properties.get("token")));
    let distinct_id = [obj.remove("distinct_id"), obj.remove("$distinct_id")]
        .into_iter()
        .flatten()
        .find(|v| !v.is_null())
        .or_else(|| {
            properties
                .get("distinct_id")
                .filter(|v| !v.is_null())
                .cloned()
        })
        .and_then(stringify_distinct_id)
        .ok_or(DecodeError::MissingDistinctId { index })?;
    let uuid = match obj.remove("uuid") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => {
            Some(Uuid::parse_str(&s).map_err(|_| DecodeError::InvalidUuid { index })?)
        }
        Some(_) => return Err(DecodeError::InvalidUuid { index }),
    };
    let timestamp = match obj.remove("timestamp") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => {
            return Err(DecodeError::InvalidField {
                index,
                field: "timestamp",
                expected: "an ISO 8601 string",
            })
        }
    };
    let offset = match obj.remove("offset") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_i64(),
        Some(_) => {
            return Err(DecodeError::InvalidField {
                index,
                field: "offset",
                expected: "an integer (milliseconds)",
            })
        }
    };
    let mut object_field = |name: &'static str| match obj.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(_) => Err(DecodeError::InvalidField {
            index,
            field: name,
            expected: "an object",
        }),
    };
    let set = object_field("$set")?;
    let set_once = object_field("$set_once")?;
    if let (RouteKind::Engage, RawProperties::Parsed(map)) = (route, &mut properties) {
        // Mixpanel-style engage bodies carry the token only at the top level.
        map.remove("token");
    }
    Ok((
        RawEvent {
            index,
            event,
            distinct_id,
            uuid,
            properties,
            timestamp,
            offset,
            set,
            set_once,
        },
        token,
    ))
}

/// Strings are kept, other values become their JSON text; NUL becomes U+FFFD; empty is
/// missing; longer than 200 characters is truncated.
fn stringify_distinct_id(value: Value) -> Option<String> {
    let text = match value {
        Value::String(s) => s,
        other => other.to_string(),
    };
    let mut text = if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    };
    if text.trim().is_empty() {
        return None;
    }
    // Fewer bytes than the limit are fewer characters too: only longer text is counted.
    if text.len() > MAX_DISTINCT_ID_CHARS {
        if let Some((cut, _)) = text.char_indices().nth(MAX_DISTINCT_ID_CHARS) {
            text.truncate(cut);
        }
    }
    Some(text)
}
