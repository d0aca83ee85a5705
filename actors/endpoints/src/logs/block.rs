//! The byte format of the embedded execution log's blocks.
//!
//! Key: project (8) ‖ endpoint id (16) ‖ newest timestamp µs in the block (8, sign bit
//! flipped) ‖ block id (8) ‖ format (1), big-endian, so an endpoint's blocks are contiguous
//! and ordered by time.
//!
//! Value: oldest timestamp µs (8, BE) ‖ entry count (4, BE) ‖ one [`Column`] per entry
//! ([`COLUMN_BYTES`] each) ‖ the entries `timestamp (8) ‖ instance id (16) ‖ level (1) ‖
//! length (4) ‖ message`, oldest first. The columns repeat what aggregations read (time,
//! level, status, duration) in fixed-width records, so a histogram over millions of lines
//! reads a few bytes per line and never parses a message.
//!
//! Blocks written before the columns existed have a 40-byte key (no format byte) and a value
//! without count and columns; their columns are derived from the messages when read.

use uuid::Uuid;

use super::ops::fields_of;
use super::{Level, LogEntry};

/// The format byte ending a key whose value carries columns.
const FORMAT_COLUMNS: u8 = 2;
/// Bytes of one encoded column record.
pub const COLUMN_BYTES: usize = 15;
/// A duration the line does not state.
pub const NO_DURATION: u32 = u32::MAX;

pub fn level_byte(level: Level) -> u8 {
    match level {
        Level::Info => b'I',
        Level::Error => b'E',
    }
}

pub fn level_of_byte(b: u8) -> Level {
    if b == b'E' {
        Level::Error
    } else {
        Level::Info
    }
}

/// What aggregations read of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub micros: i64,
    pub level: u8,
    pub status: u16,
    /// Milliseconds, or [`NO_DURATION`].
    pub duration_ms: u32,
}

impl Column {
    fn of(e: &LogEntry) -> Column {
        let f = fields_of(e.message.as_bytes(), e.level);
        Column {
            micros: e.micros(),
            level: level_byte(e.level),
            status: f.status,
            duration_ms: duration_cell(f.duration_ms),
        }
    }

    fn read(b: &[u8]) -> Column {
        let mut micros = [0u8; 8];
        micros.copy_from_slice(&b[..8]);
        Column {
            micros: i64::from_le_bytes(micros),
            level: b[8],
            status: u16::from_le_bytes([b[9], b[10]]),
            duration_ms: u32::from_le_bytes([b[11], b[12], b[13], b[14]]),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.micros.to_le_bytes());
        out.push(self.level);
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.duration_ms.to_le_bytes());
    }
}

/// A duration as its column cell (saturating below [`NO_DURATION`]).
pub fn duration_cell(ms: Option<u64>) -> u32 {
    ms.map_or(NO_DURATION, |d| {
        u32::try_from(d)
            .unwrap_or(NO_DURATION - 1)
            .min(NO_DURATION - 1)
    })
}

/// Bytes of an encoded entry before its message: timestamp, instance id, level, length.
const ENTRY_HEADER: usize = 29;

/// One encoded entry inside a block, borrowed.
pub struct RawEntry<'a> {
    pub micros: i64,
    pub instance: &'a [u8],
    pub level: u8,
    pub message: &'a [u8],
}

fn encode_entry(micros: i64, instance: &[u8], level: u8, message: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&micros.to_be_bytes());
    out.extend_from_slice(instance);
    out.push(level);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
}

/// The entries of an encoded entry region, oldest first (stops at the first malformed byte).
pub fn entries_of(region: &[u8]) -> Vec<RawEntry<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((start, end)) = message_bounds(region, at) {
        let micros = i64::from_be_bytes(region[at..at + 8].try_into().unwrap_or([0; 8]));
        out.push(RawEntry {
            micros,
            instance: &region[at + 8..at + 24],
            level: region[at + 24],
            message: &region[start..end],
        });
        at = end;
    }
    out
}

/// Project and endpoint: the first 24 bytes of every key of the endpoint.
pub fn prefix(project_id: u64, endpoint_id: Uuid) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&project_id.to_be_bytes());
    k[8..].copy_from_slice(endpoint_id.as_bytes());
    k
}

/// A timestamp as key bytes whose order is the numeric order (sign bit flipped).
fn time_key(micros: i64) -> [u8; 8] {
    ((micros as u64) ^ (1 << 63)).to_be_bytes()
}

fn time_of_key(bytes: &[u8]) -> i64 {
    let raw = u64::from_be_bytes(bytes.try_into().unwrap_or([0; 8]));
    (raw ^ (1 << 63)) as i64
}

/// The key of a block with columns.
pub fn block_key(prefix: &[u8; 24], newest: i64, block_id: u64) -> Vec<u8> {
    let mut k = range_key(prefix, newest, block_id);
    k.push(FORMAT_COLUMNS);
    k
}

/// A key bound for range scans over an endpoint's blocks (no format byte: it sorts before
/// every key it prefixes).
pub fn range_key(prefix: &[u8; 24], newest: i64, block_id: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&time_key(newest));
    k.extend_from_slice(&block_id.to_be_bytes());
    k
}

/// The value of a block holding `entries` (oldest first).
pub fn encode_block(entries: &[LogEntry]) -> Vec<u8> {
    let size: usize = entries
        .iter()
        .map(|e| COLUMN_BYTES + ENTRY_HEADER + e.message.len())
        .sum();
    let mut value = Vec::with_capacity(12 + size);
    let oldest = entries.first().map_or(0, LogEntry::micros);
    value.extend_from_slice(&oldest.to_be_bytes());
    value.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        Column::of(e).write(&mut value);
    }
    for e in entries {
        encode_entry(
            e.micros(),
            e.instance_id.as_bytes(),
            level_byte(e.level),
            e.message.as_bytes(),
            &mut value,
        );
    }
    value
}

/// The value of a block holding the raw `entries` (oldest first), as pruning rewrites it.
pub fn encode_raw_block(entries: &[&RawEntry<'_>]) -> Vec<u8> {
    let mut value = Vec::new();
    let oldest = entries.first().map_or(0, |e| e.micros);
    value.extend_from_slice(&oldest.to_be_bytes());
    value.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        let level = level_of_byte(e.level);
        let f = fields_of(e.message, level);
        Column {
            micros: e.micros,
            level: e.level,
            status: f.status,
            duration_ms: duration_cell(f.duration_ms),
        }
        .write(&mut value);
    }
    for e in entries {
        encode_entry(e.micros, e.instance, e.level, e.message, &mut value);
    }
    value
}

/// A stored block, read in place.
pub struct Block<'a> {
    pub project_id: u64,
    pub endpoint_id: Uuid,
    /// The newest and oldest entries' timestamps (µs).
    pub newest: i64,
    pub oldest: i64,
    columns: Option<&'a [u8]>,
    entries: &'a [u8],
}

impl<'a> Block<'a> {
    /// The block under `key`, or `None` for a key that is not a block's.
    pub fn parse(key: &[u8], value: &'a [u8]) -> Option<Block<'a>> {
        let (columns, entries) = match key.len() {
            40 => (None, value.get(8..)?),
            41 if key[40] == FORMAT_COLUMNS => {
                let n = u32::from_be_bytes(value.get(8..12)?.try_into().ok()?) as usize;
                let end = 12 + n.checked_mul(COLUMN_BYTES)?;
                (Some(value.get(12..end)?), value.get(end..)?)
            }
            _ => return None,
        };
        let oldest = value
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(i64::MIN, i64::from_be_bytes);
        Some(Block {
            project_id: u64::from_be_bytes(key[..8].try_into().ok()?),
            endpoint_id: Uuid::from_slice(&key[8..24]).ok()?,
            newest: time_of_key(&key[24..32]),
            oldest,
            columns,
            entries,
        })
    }

    /// The newest timestamp of a block key, without reading its value.
    pub fn newest_of_key(key: &[u8]) -> Option<i64> {
        matches!(key.len(), 40 | 41).then(|| time_of_key(&key[24..32]))
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> Vec<RawEntry<'a>> {
        entries_of(self.entries)
    }

    /// The bytes every message of the block is in (with the entries' other fields between
    /// them): a text with no match here has none in any message.
    pub fn message_region(&self) -> &'a [u8] {
        self.entries
    }

    /// The columns, oldest first: read in place, or derived from the messages for a block
    /// written without them.
    pub fn columns(&self) -> Columns<'a> {
        match self.columns {
            Some(bytes) => Columns::Stored(bytes),
            None => Columns::Derived(
                self.entries()
                    .iter()
                    .map(|e| {
                        let f = fields_of(e.message, level_of_byte(e.level));
                        Column {
                            micros: e.micros,
                            level: e.level,
                            status: f.status,
                            duration_ms: duration_cell(f.duration_ms),
                        }
                    })
                    .collect(),
            ),
        }
    }
}

/// A block's columns: the stored records, read one at a time where they lie (no copy of the
/// block's columns per search), or those derived for a block written without them.
pub enum Columns<'a> {
    Stored(&'a [u8]),
    Derived(Vec<Column>),
}

impl Columns<'_> {
    /// How many entries the block has columns for.
    pub fn count(&self) -> usize {
        match self {
            Columns::Stored(bytes) => bytes.len() / COLUMN_BYTES,
            Columns::Derived(columns) => columns.len(),
        }
    }

    /// The column of entry `j` (oldest first).
    pub fn get(&self, j: usize) -> Option<Column> {
        match self {
            Columns::Stored(bytes) => bytes
                .get(j * COLUMN_BYTES..(j + 1) * COLUMN_BYTES)
                .map(Column::read),
            Columns::Derived(columns) => columns.get(j).copied(),
        }
    }
}

/// Where the message of the entry whose header starts at `at` of an entry region lies:
/// `(start, end)` byte offsets, the end being the next entry's header. `None` past the last.
pub fn message_bounds(region: &[u8], at: usize) -> Option<(usize, usize)> {
    let len = region.get(at + 25..at + ENTRY_HEADER)?;
    let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
    let (start, end) = (at + ENTRY_HEADER, at + ENTRY_HEADER + len);
    (end <= region.len()).then_some((start, end))
}

/// A raw entry as the API shows it.
pub fn to_entry(project_id: u64, endpoint_id: Uuid, e: &RawEntry<'_>) -> LogEntry {
    use chrono::TimeZone;
    LogEntry {
        project_id,
        endpoint_id,
        instance_id: Uuid::from_slice(e.instance).unwrap_or_default(),
        timestamp: chrono::Utc
            .timestamp_micros(e.micros)
            .single()
            .unwrap_or_default(),
        level: level_of_byte(e.level),
        message: String::from_utf8_lossy(e.message).into_owned(),
    }
}
