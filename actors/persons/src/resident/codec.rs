//! The compact in-memory form of a person: about half the size of its JSON, and a third of
//! a decoded [`Person`]. Property keys repeat across every person of a project, so each is
//! stored once in [`Names`] and records hold its number.
//!
//! Layout: project (varint) ‖ uuid (16) ‖ created_at (i64 LE nanoseconds) ‖ version
//! (varint) ‖ identified (u8) ‖ distinct ids (varint count, each varint length ‖ bytes) ‖
//! properties (varint count, each key ‖ value). A key is its number + 1 as a varint, or 0 ‖
//! varint length ‖ bytes when [`Names`] is full. A value is a tag byte and its payload. A
//! string that is a UTC timestamp in one of the two forms apps send most (`…T10:00:00Z`,
//! `…T10:00:00.123Z`) is kept as its seconds or milliseconds (5–6 bytes instead of 21–25),
//! and only when writing that number back gives the very same string.

use std::collections::HashMap;
use std::sync::RwLock;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Number, Value};
use uuid::Uuid;

use crate::model::Person;

/// Property names kept at most; later names are written into each record.
const MAX_NAMES: usize = 65_536;

/// Longer names are written into each record rather than numbered, so the table stays
/// within `MAX_NAMES * MAX_NAME_BYTES` however long the keys events send.
const MAX_NAME_BYTES: usize = 128;

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const UNSIGNED: u8 = 3;
const NEGATIVE: u8 = 4;
const FLOAT: u8 = 5;
const STRING: u8 = 6;
const JSON: u8 = 7;
/// A string `YYYY-MM-DDTHH:MM:SSZ`: zigzag varint of its Unix seconds.
const SECONDS_Z: u8 = 8;
/// A string `YYYY-MM-DDTHH:MM:SS.mmmZ`: zigzag varint of its Unix milliseconds.
const MILLIS_Z: u8 = 9;

/// The property names records refer to by number.
#[derive(Default)]
pub struct Names(RwLock<NameTable>);

#[derive(Default)]
struct NameTable {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Names {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, NameTable> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Numbers every key of `properties` that has none yet, while there is room.
    fn learn(&self, properties: &Map<String, Value>) {
        let missing = {
            let table = self.read();
            table.names.len() < MAX_NAMES
                && properties
                    .keys()
                    .any(|k| k.len() <= MAX_NAME_BYTES && !table.ids.contains_key(k))
        };
        if !missing {
            return;
        }
        let mut table = self.0.write().unwrap_or_else(|p| p.into_inner());
        for key in properties.keys() {
            if table.names.len() >= MAX_NAMES {
                break;
            }
            if key.len() <= MAX_NAME_BYTES && !table.ids.contains_key(key) {
                let id = table.names.len() as u32;
                table.names.push(key.clone());
                table.ids.insert(key.clone(), id);
            }
        }
    }
}

/// `person`'s record, or `None` when it cannot be kept (a creation time outside the years
/// 1677–2262).
pub fn encode(project_id: u64, person: &Person, names: &Names) -> Option<Vec<u8>> {
    let created = person.created_at.timestamp_nanos_opt()?;
    names.learn(&person.properties);
    let table = names.read();
    let mut out = Vec::with_capacity(64);
    varint(&mut out, project_id);
    out.extend_from_slice(person.id.as_bytes());
    out.extend_from_slice(&created.to_le_bytes());
    varint(&mut out, person.version);
    out.push(u8::from(person.is_identified));
    varint(&mut out, person.distinct_ids.len() as u64);
    for id in &person.distinct_ids {
        bytes(&mut out, id.as_bytes());
    }
    varint(&mut out, person.properties.len() as u64);
    for (key, value) in &person.properties {
        match table.ids.get(key) {
            Some(id) => varint(&mut out, u64::from(*id) + 1),
            None => {
                out.push(0);
                bytes(&mut out, key.as_bytes());
            }
        }
        value_of(&mut out, value);
    }
    Some(out)
}

fn value_of(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.push(NULL),
        Value::Bool(false) => out.push(FALSE),
        Value::Bool(true) => out.push(TRUE),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.push(UNSIGNED);
                varint(out, u);
            } else if let Some(i) = n.as_i64() {
                out.push(NEGATIVE);
                varint(out, !(i as u64));
            } else {
                out.push(FLOAT);
                out.extend_from_slice(&n.as_f64().unwrap_or_default().to_le_bytes());
            }
        }
        Value::String(s) => match timestamp_of(s) {
            Some((tag, n)) => {
                out.push(tag);
                varint(out, zigzag(n));
            }
            None => {
                out.push(STRING);
                bytes(out, s.as_bytes());
            }
        },
        other => {
            out.push(JSON);
            bytes(out, other.to_string().as_bytes());
        }
    }
}

/// `s` as a timestamp tag and its number, when it is one and writes back the same.
fn timestamp_of(s: &str) -> Option<(u8, i64)> {
    let b = s.as_bytes();
    let (tag, format) = match b.len() {
        20 => (SECONDS_Z, SecondsFormat::Secs),
        24 => (MILLIS_Z, SecondsFormat::Millis),
        _ => return None,
    };
    if b[4] != b'-' || b[10] != b'T' || b[b.len() - 1] != b'Z' {
        return None;
    }
    let at = DateTime::parse_from_rfc3339(s).ok()?;
    let n = match format {
        SecondsFormat::Secs => at.timestamp(),
        _ => at.timestamp_millis(),
    };
    // Written back from the number alone (a leap second or an offset would not be).
    (timestamp_text(tag, n)? == s).then_some((tag, n))
}

/// The text of a timestamp tag's number, as chrono writes it (`to_rfc3339_opts` with `Z`).
/// Written digit by digit for the years 0–9999, the only ones a record holds as a number
/// (their text has four-digit years): every `/flags` request of a known user decodes its
/// person, and chrono's formatting machinery was a third of that decoding.
fn timestamp_text(tag: u8, n: i64) -> Option<String> {
    let (seconds, millis) = match tag {
        SECONDS_Z => (n, None),
        _ => (n.div_euclid(1000), Some(n.rem_euclid(1000))),
    };
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    if !(0..=9999).contains(&year) {
        return chrono_timestamp_text(tag, n);
    }
    let of_day = seconds.rem_euclid(86_400);
    let mut text = [0u8; 24];
    let mut at = 0;
    let mut put = |value: i64, digits: u32, after: u8| {
        for place in (0..digits).rev() {
            text[at] = b'0' + (value / 10_i64.pow(place) % 10) as u8;
            at += 1;
        }
        text[at] = after;
        at += 1;
    };
    put(year, 4, b'-');
    put(month, 2, b'-');
    put(day, 2, b'T');
    put(of_day / 3600, 2, b':');
    put(of_day / 60 % 60, 2, b':');
    match millis {
        None => put(of_day % 60, 2, b'Z'),
        Some(millis) => {
            put(of_day % 60, 2, b'.');
            put(millis, 3, b'Z');
        }
    }
    String::from_utf8(text.get(..at)?.to_vec()).ok()
}

/// The proleptic Gregorian (year, month, day) of a count of days since 1970-01-01
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// [`timestamp_text`] through chrono, for the years it does not write itself.
fn chrono_timestamp_text(tag: u8, n: i64) -> Option<String> {
    let (at, format) = match tag {
        SECONDS_Z => (DateTime::<Utc>::from_timestamp(n, 0)?, SecondsFormat::Secs),
        _ => (
            DateTime::<Utc>::from_timestamp_millis(n)?,
            SecondsFormat::Millis,
        ),
    };
    Some(at.to_rfc3339_opts(format, true))
}

fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

fn unzigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

/// Appends `record` to `arena` as the resident store keeps it: its length, then its bytes.
pub fn frame(arena: &mut Vec<u8>, record: &[u8]) {
    bytes(arena, record);
}

/// The bytes [`frame`] appends for a record of `len` bytes.
pub fn framed_len(len: usize) -> usize {
    let mut prefix = 1;
    while len >> (7 * prefix) != 0 {
        prefix += 1;
    }
    prefix + len
}

/// The record framed at the start of `arena`, and how many bytes the frame spans.
pub fn unframe(arena: &[u8]) -> Option<(&[u8], usize)> {
    let mut r = Reader(arena);
    let record = r.slice()?;
    Some((record, arena.len() - r.0.len()))
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A person as memory holds it, not yet decoded: its id, and its properties in the record's
/// form. Ingest reads a known person for every event, and most events change nothing: their
/// person is then recognised by its encoded properties, without decoding them into a map.
/// Decoding needs the names of the memory it was read from ([`super::ResidentPersons`]).
#[derive(Clone, PartialEq, Eq)]
pub struct CompactPerson {
    record: Box<[u8]>,
    id: Uuid,
    /// Where the properties start in `record`.
    properties_at: usize,
}

impl CompactPerson {
    /// `record`'s person; `None` when its head (all before the properties) does not read.
    pub(super) fn of(record: &[u8]) -> Option<CompactPerson> {
        let mut r = Reader(record);
        r.varint()?;
        let id = Uuid::from_slice(r.take(16)?).ok()?;
        r.take(8)?;
        r.varint()?;
        r.take(1)?;
        for _ in 0..r.varint()? {
            r.slice()?;
        }
        Some(CompactPerson {
            properties_at: record.len() - r.0.len(),
            record: record.into(),
            id,
        })
    }

    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The properties as encoded. Two persons of one memory with equal encodings have equal
    /// properties: a name keeps its number for good, and a value decodes one way. (Equal
    /// properties in another order encode differently.)
    pub fn encoded_properties(&self) -> &[u8] {
        &self.record[self.properties_at..]
    }

    /// The person, with the names of the memory it was read from.
    pub(super) fn decode(&self, names: &Names) -> Option<Person> {
        decode(&self.record, names).map(|(_, person)| person)
    }
}

impl std::fmt::Debug for CompactPerson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactPerson")
            .field("id", &self.id)
            .field("record_bytes", &self.record.len())
            .finish()
    }
}

/// The project a record belongs to.
pub fn project_of(record: &[u8]) -> Option<u64> {
    Reader(record).varint()
}

/// A record's project and person; `None` when the record is damaged (never written so).
pub fn decode(record: &[u8], names: &Names) -> Option<(u64, Person)> {
    decode_reading(record, names, &|_| true)
}

/// [`decode`] with only the properties whose key `wanted` accepts; the others are skipped
/// over, neither copied nor checked (a reader that looks at a few keys of persons that hold
/// dozens decodes a few).
pub fn decode_reading(
    record: &[u8],
    names: &Names,
    wanted: &dyn Fn(&str) -> bool,
) -> Option<(u64, Person)> {
    let mut r = Reader(record);
    let project = r.varint()?;
    let id = Uuid::from_slice(r.take(16)?).ok()?;
    let created_at =
        DateTime::<Utc>::from_timestamp_nanos(i64::from_le_bytes(r.take(8)?.try_into().ok()?));
    let version = r.varint()?;
    let is_identified = r.take(1)?[0] != 0;
    let n = r.varint()? as usize;
    let mut distinct_ids = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        distinct_ids.push(r.string()?);
    }
    let table = names.read();
    let count = r.varint()?;
    // Collected, then built in one pass: the keys come in order (written from a sorted map),
    // and inserting them one by one searched the map for each.
    let mut pairs = Vec::with_capacity(usize::try_from(count).ok()?.min(256));
    for _ in 0..count {
        let key: &str = match r.varint()? {
            0 => std::str::from_utf8(r.slice()?).ok()?,
            id => table.names.get(usize::try_from(id - 1).ok()?)?,
        };
        if wanted(key) {
            pairs.push((key.to_string(), r.value()?));
        } else {
            r.skip_value()?;
        }
    }
    let properties = Map::from_iter(pairs);
    Some((
        project,
        Person {
            id,
            created_at,
            properties,
            is_identified,
            version,
            distinct_ids,
        },
    ))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            n |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(n);
            }
        }
        None
    }

    fn slice(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        self.take(len)
    }

    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.slice()?.to_vec()).ok()
    }

    /// Passes over a value [`Reader::value`] would read.
    fn skip_value(&mut self) -> Option<()> {
        match self.take(1)?[0] {
            NULL | FALSE | TRUE => {}
            UNSIGNED | NEGATIVE | SECONDS_Z | MILLIS_Z => {
                self.varint()?;
            }
            FLOAT => {
                self.take(8)?;
            }
            STRING | JSON => {
                self.slice()?;
            }
            _ => return None,
        }
        Some(())
    }

    fn value(&mut self) -> Option<Value> {
        Some(match self.take(1)?[0] {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            UNSIGNED => Value::Number(Number::from(self.varint()?)),
            NEGATIVE => Value::Number(Number::from(!self.varint()? as i64)),
            FLOAT => Value::Number(Number::from_f64(f64::from_le_bytes(
                self.take(8)?.try_into().ok()?,
            ))?),
            STRING => Value::String(self.string()?),
            tag @ (SECONDS_Z | MILLIS_Z) => {
                Value::String(timestamp_text(tag, unzigzag(self.varint()?))?)
            }
            JSON => serde_json::from_slice(self.slice()?).ok()?,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_is_about_half_its_json() {
        let names = Names::default();
        let person = Person {
            id: Uuid::new_v4(),
            created_at: Utc::now(),
            properties: json!({"email": "u2654435761@gmail.com", "plan": "pro", "age": 42,
                "country": "DE", "app_version": "2.3.4", "signed_up_at": "2025-06-01T10:00:00Z"})
            .as_object()
            .cloned()
            .expect("test value"),
            is_identified: true,
            version: 3,
            distinct_ids: vec!["known-123456".into()],
        };
        let json = serde_json::to_vec(&person).expect("test value").len();
        let record = encode(9, &person, &names).expect("test value");
        assert!(record.len() * 2 <= json + 16, "{} vs {json}", record.len());
        assert_eq!(decode(&record, &names), Some((9, person)));
        assert_eq!(project_of(&record), Some(9));
    }

    /// An identified person with one distinct id and `properties`.
    fn person_of(properties: Map<String, Value>) -> Person {
        Person {
            id: Uuid::nil(),
            created_at: Utc::now(),
            properties,
            is_identified: true,
            version: 1,
            distinct_ids: vec!["d".into()],
        }
    }

    /// A person whose properties `t0`, `t1`, … are `texts`.
    fn person_with_texts(texts: &[&str]) -> Person {
        let mut properties = Map::new();
        for (k, t) in texts.iter().enumerate() {
            properties.insert(format!("t{k}"), json!(t));
        }
        person_of(properties)
    }

    fn holds_text(record: &[u8], text: &str) -> bool {
        record.windows(text.len()).any(|w| w == text.as_bytes())
    }

    #[test]
    fn a_reader_of_some_keys_gets_those_and_skips_every_kind_of_value() {
        let names = Names::default();
        let mut properties = json!({"null": null, "no": false, "yes": true, "n": 7, "neg": -3,
            "f": 1.5, "s": "text", "obj": {"a": [1]}, "at": "2025-06-01T10:00:00Z",
            "ms": "2025-06-01T10:00:00.123Z", "plan": "pro"})
        .as_object()
        .cloned()
        .expect("test value");
        // Past the table's name length: written into the record, skipped or read the same.
        properties.insert("k".repeat(MAX_NAME_BYTES + 1), json!("long"));
        let person = person_of(properties.clone());
        let record = encode(3, &person, &names).expect("test value");
        let (project, all) = decode_reading(&record, &names, &|_| true).expect("decoded");
        assert_eq!((project, &all), (3, &person));
        for wanted in [
            vec!["plan"],
            vec!["at", "obj"],
            vec![],
            properties.keys().map(String::as_str).collect(),
        ] {
            let (_, some) =
                decode_reading(&record, &names, &|k| wanted.contains(&k)).expect("decoded");
            let expected: Map<String, Value> = properties
                .iter()
                .filter(|(k, _)| wanted.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(some.properties, expected, "{wanted:?}");
            assert_eq!(some.distinct_ids, person.distinct_ids);
        }
        assert_eq!(
            decode_reading(&record[..record.len() - 1], &names, &|_| false),
            None
        );
    }

    #[test]
    fn timestamps_are_written_as_chrono_writes_them() {
        // Every day boundary of the years 0–9999 would be slow to walk; a stride that is
        // prime to the day and the month lands on every time of day and every date shape
        // (leap days, month and year ends) many times over.
        let first = -62_167_219_200; // 0000-01-01T00:00:00Z
        let last = 253_402_300_799; // 9999-12-31T23:59:59Z
        let mut n = first;
        while n <= last {
            assert_eq!(
                timestamp_text(SECONDS_Z, n),
                chrono_timestamp_text(SECONDS_Z, n),
                "{n}"
            );
            let millis = n * 1000 + n.rem_euclid(997);
            assert_eq!(
                timestamp_text(MILLIS_Z, millis),
                chrono_timestamp_text(MILLIS_Z, millis),
                "{millis}"
            );
            n += 7_919_993;
        }
        for n in [
            first,
            first - 1,
            last,
            last + 1,
            0,
            -1,
            951_782_400,
            951_868_799,
        ] {
            assert_eq!(
                timestamp_text(SECONDS_Z, n),
                chrono_timestamp_text(SECONDS_Z, n),
                "{n}"
            );
        }
        assert_eq!(
            timestamp_text(MILLIS_Z, -1).as_deref(),
            Some("1969-12-31T23:59:59.999Z")
        );
        assert_eq!(timestamp_text(SECONDS_Z, i64::MAX), None);
    }

    #[test]
    fn utc_timestamps_are_kept_as_numbers_and_look_alikes_as_text() {
        let names = Names::default();
        let bare = encode(1, &person_with_texts(&[]), &names)
            .expect("test value")
            .len();
        for (text, as_number) in [
            ("2025-06-01T10:00:00Z", true),
            ("2025-06-01T10:00:00.123Z", true),
            ("1969-12-31T23:59:59.999Z", true),
            ("0001-01-01T00:00:00Z", true),
            ("2025-06-01T10:00:00+00:00", false),
            ("2025-06-01t10:00:00Z", false),
            ("2025-06-01T10:00:00.1Z", false),
            ("2025-06-01T10:00:00.1234Z", false),
            ("2016-12-31T23:59:60Z", false),
            ("2025-13-01T10:00:00Z", false),
            ("2025-06-01 10:00:00Z", false),
            ("20250601T10:00:00.000Z", false),
            ("é025-06-01T10:00:00Z", false),
        ] {
            let person = person_with_texts(&[text]);
            let record = encode(1, &person, &names).expect("test value");
            assert_eq!(holds_text(&record, text), !as_number, "{text}");
            if as_number {
                assert!(record.len() - bare <= 10, "{text}: {} bytes", record.len());
            }
            assert_eq!(
                decode(&record, &names).map(|(_, p)| p),
                Some(person),
                "{text}"
            );
        }
    }

    #[test]
    fn a_framed_record_is_found_again_with_its_span() {
        let mut arena = vec![7u8];
        let long = vec![1u8; 300];
        frame(&mut arena, b"abc");
        frame(&mut arena, &long);
        assert_eq!(arena.len(), 1 + framed_len(3) + framed_len(300));
        assert_eq!((framed_len(127), framed_len(128)), (128, 130));
        assert_eq!(unframe(&arena[1..]), Some((&b"abc"[..], 4)));
        assert_eq!(unframe(&arena[5..]), Some((&long[..], 302)));
        assert_eq!(unframe(&arena[5..300]), None, "cut short");
    }

    #[test]
    fn past_the_name_table_keys_are_written_in_the_record() {
        let names = Names::default();
        {
            let mut table = names.0.write().expect("test value");
            for k in 0..MAX_NAMES {
                table.names.push(format!("k{k}"));
                table.ids.insert(format!("k{k}"), k as u32);
            }
        }
        let person = Person {
            id: Uuid::nil(),
            created_at: Utc::now(),
            properties: json!({"k1": 1, "fresh": "x"})
                .as_object()
                .cloned()
                .expect("test value"),
            is_identified: false,
            version: 0,
            distinct_ids: vec![],
        };
        let record = encode(1, &person, &names).expect("test value");
        assert_eq!(decode(&record, &names).map(|(_, p)| p), Some(person));
        assert_eq!(decode(&record[..record.len() - 1], &names), None);
    }

    #[test]
    fn long_names_are_written_in_the_record_and_not_kept() {
        let names = Names::default();
        let long = "k".repeat(MAX_NAME_BYTES + 1);
        let mut properties = Map::new();
        properties.insert(long.clone(), json!("v"));
        properties.insert("short".into(), json!(2));
        let person = person_of(properties);
        let record = encode(3, &person, &names).expect("test value");
        assert_eq!(decode(&record, &names).map(|(_, p)| p), Some(person));
        let table = names.read();
        assert_eq!(table.names, vec!["short".to_string()]);
        assert!(!table.ids.contains_key(&long));
    }
}
