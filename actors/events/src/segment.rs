//! The stored event row, its Arrow schema, and Parquet segment files.
//!
//! Where segments live, how they are named and when they become visible is the catalog's
//! business (`catalog.rs`); this module writes and reads one file.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    Array, ArrayRef, Int64Array, RecordBatch, StringArray, StringBuilder, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::bloom_filter::Sbbf;
use parquet::file::metadata::{ParquetMetaData, RowGroupMetaData};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::ChunkReader;
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;
use uuid::Uuid;

use corvid_kernel::disk::{create_dirs, Disk, DiskFile};
use corvid_kernel::json::{property_text, WantedKeys};
use corvid_kernel::prefetch;
use corvid_persons::ErasedSet;

/// One event as stored: the capture schema documented in `docs/ARCHITECTURE.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub uuid: Uuid,
    pub event: String,
    pub distinct_id: String,
    pub person_id: Uuid,
    /// JSON text.
    pub properties: String,
    /// JSON text: the person's properties when the event was ingested. Shared: the events of
    /// one person in a batch hold the same text.
    pub person_properties: Arc<str>,
    pub timestamp: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub project_id: u64,
    /// `$group_0` … `$group_4`: group keys by group type index.
    pub groups: [Option<String>; 5],
    pub session_id: Option<String>,
    pub window_id: Option<String>,
}

impl StoredEvent {
    /// Approximate in-memory size, for flush-by-bytes.
    pub fn approx_bytes(&self) -> usize {
        self.event.len()
            + self.distinct_id.len()
            + self.properties.len()
            + self.person_properties.len()
            + 160
    }

    /// Whether `erased` covers this event.
    pub fn erased_by(&self, erased: &ErasedSet) -> bool {
        erased.hides(
            &self.person_id,
            &self.distinct_id,
            self.created_at.timestamp_micros(),
        )
    }

    pub fn day(&self) -> NaiveDate {
        self.timestamp.date_naive()
    }
}

pub const GROUP_COLUMNS: [&str; 5] = ["$group_0", "$group_1", "$group_2", "$group_3", "$group_4"];

/// The Arrow schema of the `events` table.
pub fn schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            let mut fields = vec![
                Field::new("uuid", DataType::Utf8, false),
                Field::new("event", DataType::Utf8, false),
                Field::new("distinct_id", DataType::Utf8, false),
                Field::new("person_id", DataType::Utf8, false),
                Field::new("properties", DataType::Utf8, false),
                Field::new("person_properties", DataType::Utf8, false),
                Field::new("timestamp", ts.clone(), false),
                Field::new("created_at", ts, false),
                Field::new("project_id", DataType::Int64, false),
            ];
            fields.extend(
                GROUP_COLUMNS
                    .iter()
                    .map(|c| Field::new(*c, DataType::Utf8, true)),
            );
            fields.push(Field::new("$session_id", DataType::Utf8, true));
            fields.push(Field::new("$window_id", DataType::Utf8, true));
            Arc::new(Schema::new(fields))
        })
        .clone()
}

fn micros(t: &DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// The column holding property `key` (materialized at write time).
pub fn materialized_column(key: &str) -> String {
    format!("properties.{key}")
}

/// The schema of a segment that also materializes `keys`: the `events` columns, then one
/// nullable string column per key holding exactly what HogQL's `properties.<key>` reads.
pub fn schema_with(keys: &[String]) -> SchemaRef {
    if keys.is_empty() {
        return schema();
    }
    let mut fields: Vec<Field> = schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.extend(
        keys.iter()
            .map(|k| Field::new(materialized_column(k), DataType::Utf8, true)),
    );
    Arc::new(Schema::new(fields))
}

/// Rows → one record batch with materialized property columns for `keys`.
///
/// One pass over the rows fills every column. A segment's rows are sorted, so here they are
/// visited in an order unrelated to where they sit in memory: a pass per column read each
/// row's fields (and its uuid, its properties text) from memory again for every column, where
/// one pass reads them once and finds the materialized values in text just copied.
pub fn to_record_batch_with(
    events: &[&StoredEvent],
    keys: &[String],
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let mut columns = RowColumns::sized_for(events, keys.len());
    // The rows' properties are text capture checked (or a segment held), so the walk for the
    // materialized columns need not check it again.
    let wanted: Vec<&str> = keys.iter().map(String::as_str).collect();
    let wanted = WantedKeys::new(&wanted);
    let mut found = vec![None; keys.len()];
    for (i, e) in events.iter().enumerate() {
        if let Some(ahead) = events.get(i + 2 * PREFETCH_ROWS) {
            prefetch::value(*ahead);
        }
        if let Some(ahead) = events.get(i + PREFETCH_ROWS) {
            prefetch_texts(ahead);
        }
        columns.push(e);
        if !keys.is_empty() {
            wanted.values_of_checked(&e.properties, &mut found);
            for (b, raw) in columns.materialized.iter_mut().zip(&found) {
                b.append_option(raw.and_then(property_text));
            }
        }
    }
    RecordBatch::try_new(schema_with(keys), columns.finish())
}

/// How many rows ahead of the one being copied the batch building asks for the memory of:
/// rows are visited sorted by event and time, not in the order the HTTP workers allocated
/// them, so each row's first cache lines would otherwise be a wait of their own. The row
/// itself is asked for twice this far ahead, its texts (which its fields point to) this far.
const PREFETCH_ROWS: usize = 8;

/// Bytes of a row's properties text asked for ahead: most events' text fits; the hardware
/// follows the rest of a longer one once it is being read.
const PREFETCH_PROPERTIES_BYTES: usize = 512;

/// Starts loading the texts a row's fields point to, for [`RowColumns::push`] and the walk for
/// the materialized columns.
fn prefetch_texts(e: &StoredEvent) {
    prefetch::bytes(e.properties.as_bytes(), PREFETCH_PROPERTIES_BYTES);
    prefetch::line(e.event.as_ptr());
    prefetch::line(e.distinct_id.as_ptr());
    prefetch::line(e.person_properties.as_ptr());
    for text in [&e.session_id, &e.window_id].into_iter().flatten() {
        prefetch::line(text.as_ptr());
    }
}

/// The builders of a record batch's columns, in schema order.
///
/// String columns are allocated at their exact size: growing one by doubling reallocated and
/// copied the properties column several times per batch, and each new buffer was fresh memory
/// to fault in. The sizes are summed in one pass over lengths held in the rows, not their text.
struct RowColumns {
    uuid: StringBuilder,
    event: StringBuilder,
    distinct_id: StringBuilder,
    person_id: StringBuilder,
    properties: StringBuilder,
    person_properties: StringBuilder,
    timestamp: Vec<i64>,
    created_at: Vec<i64>,
    project_id: Vec<i64>,
    groups: [StringBuilder; 5],
    session_id: StringBuilder,
    window_id: StringBuilder,
    materialized: Vec<StringBuilder>,
}

/// Bytes of a hyphenated UUID.
const UUID_TEXT: usize = 36;

impl RowColumns {
    fn sized_for(events: &[&StoredEvent], materialized: usize) -> RowColumns {
        let rows = events.len();
        // Bytes of each text column but the uuids, summed in one pass over the rows: event,
        // distinct id, properties, person properties, the five groups, session, window.
        let mut bytes = [0usize; 11];
        for (i, e) in events.iter().enumerate() {
            if let Some(ahead) = events.get(i + PREFETCH_ROWS) {
                prefetch::value(*ahead);
            }
            let optional = |value: &Option<String>| value.as_ref().map_or(0, String::len);
            bytes[0] += e.event.len();
            bytes[1] += e.distinct_id.len();
            bytes[2] += e.properties.len();
            bytes[3] += e.person_properties.len();
            for (sum, group) in bytes[4..9].iter_mut().zip(&e.groups) {
                *sum += optional(group);
            }
            bytes[9] += optional(&e.session_id);
            bytes[10] += optional(&e.window_id);
        }
        let text = |bytes: usize| StringBuilder::with_capacity(rows, bytes);
        RowColumns {
            uuid: text(rows * UUID_TEXT),
            event: text(bytes[0]),
            distinct_id: text(bytes[1]),
            person_id: text(rows * UUID_TEXT),
            properties: text(bytes[2]),
            person_properties: text(bytes[3]),
            timestamp: Vec::with_capacity(rows),
            created_at: Vec::with_capacity(rows),
            project_id: Vec::with_capacity(rows),
            groups: std::array::from_fn(|i| text(bytes[4 + i])),
            session_id: text(bytes[9]),
            window_id: text(bytes[10]),
            materialized: (0..materialized).map(|_| text(rows * 8)).collect(),
        }
    }

    fn push(&mut self, e: &StoredEvent) {
        let mut text = [0u8; UUID_TEXT];
        self.uuid
            .append_value(e.uuid.as_hyphenated().encode_lower(&mut text));
        self.event.append_value(&e.event);
        self.distinct_id.append_value(&e.distinct_id);
        self.person_id
            .append_value(e.person_id.as_hyphenated().encode_lower(&mut text));
        self.properties.append_value(&e.properties);
        self.person_properties.append_value(&*e.person_properties);
        self.timestamp.push(micros(&e.timestamp));
        self.created_at.push(micros(&e.created_at));
        self.project_id.push(e.project_id as i64);
        for (column, value) in self.groups.iter_mut().zip(&e.groups) {
            column.append_option(value.as_deref());
        }
        self.session_id.append_option(e.session_id.as_deref());
        self.window_id.append_option(e.window_id.as_deref());
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        let time = |values: Vec<i64>| -> ArrayRef {
            Arc::new(TimestampMicrosecondArray::from(values).with_timezone("UTC"))
        };
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.uuid.finish()),
            Arc::new(self.event.finish()),
            Arc::new(self.distinct_id.finish()),
            Arc::new(self.person_id.finish()),
            Arc::new(self.properties.finish()),
            Arc::new(self.person_properties.finish()),
            time(self.timestamp),
            time(self.created_at),
            Arc::new(Int64Array::from(self.project_id)),
        ];
        columns.extend(
            self.groups
                .iter_mut()
                .chain([&mut self.session_id, &mut self.window_id])
                .chain(self.materialized.iter_mut())
                .map(|b| Arc::new(b.finish()) as ArrayRef),
        );
        columns
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment I/O failed")]
    Io(#[from] std::io::Error),
    #[error("segment store failed")]
    Store(#[from] object_store::Error),
    #[error("parquet encoding failed")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow conversion failed")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("segment {0} has an unexpected column layout")]
    Layout(String),
}

/// Rows per data page: small enough that the page index of a sorted `event` column lets a
/// reader skip the pages (of every column) holding other events.
const PAGE_ROWS: usize = 8 * 1024;

/// Writes rows to `path` as Parquet (zstd, except for the columns named below) through
/// `disk`, and syncs it (its directory is the caller's: a staged file becomes durable when its
/// flush is recorded).
///
/// Rows are sorted by `(event, timestamp)`, as PostHog's ClickHouse table orders each day:
/// most queries name an event, and with each event's rows together the `event` column's page
/// statistics let the reader skip every page of the other events (and the column is a few
/// runs). Timestamps, increasing within each event, are delta-encoded: a few bits per row
/// instead of eight bytes for zstd to decompress.
pub fn write_segment(
    disk: &dyn Disk,
    path: &Path,
    events: &mut [&StoredEvent],
    materialized: &[String],
) -> Result<(), SegmentError> {
    sort_for_segment(events);
    if let Some(parent) = path.parent() {
        create_dirs(disk, parent)?;
    }
    let file = disk.create(path)?;
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .set_max_row_group_row_count(Some(128 * 1024))
        .set_data_page_row_count_limit(PAGE_ROWS);
    // Every event's uuid differs: a dictionary would only be built to be given up.
    props = props.set_column_dictionary_enabled(ColumnPath::from("uuid"), false);
    for name in ["timestamp", "created_at"] {
        let column = ColumnPath::from(name);
        props = props
            .set_column_dictionary_enabled(column.clone(), false)
            .set_column_encoding(column, Encoding::DELTA_BINARY_PACKED);
    }
    // Columns compression cannot shrink, or that nearly every query reads, are stored as they
    // are: a compressed page costs a decompression context however small it is, and the
    // `event` column is a few runs, the timestamps are delta-encoded already, and person ids
    // (what every "unique users" query hashes) are near-random strings zstd only halves
    // (decompressing them was the largest part of such a query).
    for name in ["event", "timestamp", "created_at", "person_id"] {
        props = props.set_column_compression(ColumnPath::from(name), Compression::UNCOMPRESSED);
    }
    // JSON texts are read through functions, never compared as a whole, so their minimum and
    // maximum prune nothing; keeping them compared every row's text twice.
    for name in ["properties", "person_properties"] {
        props =
            props.set_column_statistics_enabled(ColumnPath::from(name), EnabledStatistics::None);
    }
    // A bloom filter of each row group's distinct ids lets a read for one user (the events
    // API's `distinct_id`) skip row groups without decoding the column.
    let distinct_id = ColumnPath::from("distinct_id");
    let props = props
        .set_column_bloom_filter_enabled(distinct_id.clone(), true)
        .set_column_bloom_filter_fpp(distinct_id.clone(), DISTINCT_ID_BLOOM_FPP)
        .set_column_bloom_filter_max_ndv(distinct_id, DISTINCT_ID_BLOOM_NDV)
        .build();
    let paced = PacedFile { file, unsynced: 0 };
    let mut writer = ArrowWriter::try_new(paced, schema_with(materialized), Some(props))?;
    // Record batches of one data page each: their builders stay small enough for the
    // allocator to reuse from batch to batch, where 64 Ki rows of properties (30 MB) were
    // fresh memory to fault in every time.
    for chunk in events.chunks(PAGE_ROWS) {
        writer.write(&to_record_batch_with(chunk, materialized)?)?;
    }
    let mut paced = writer.into_inner()?;
    paced.file.flush()?;
    paced.file.sync_all()?;
    Ok(())
}

/// Sorts rows by `(event, timestamp)` (to the microsecond, as stored), ties in their order.
/// The sort compares small keys (the rank of a row's event name among the batch's names, and
/// its time) instead of following each row to its name's text at every comparison.
fn sort_for_segment(events: &mut [&StoredEvent]) {
    let mut ranks: ahash::HashMap<&str, u32> = ahash::HashMap::default();
    for e in events.iter() {
        ranks.entry(e.event.as_str()).or_default();
    }
    let mut names: Vec<&str> = ranks.keys().copied().collect();
    names.sort_unstable();
    // Ranks fit in 32 bits: a segment holds far fewer than 4 Gi rows, so fewer names.
    for (rank, name) in (0u32..).zip(&names) {
        ranks.insert(name, rank);
    }
    let mut keys: Vec<(u32, i64, usize)> = events
        .iter()
        .enumerate()
        .map(|(i, e)| (ranks[e.event.as_str()], micros(&e.timestamp), i))
        .collect();
    keys.sort_unstable();
    let rows: Vec<&StoredEvent> = keys.iter().map(|k| events[k.2]).collect();
    events.copy_from_slice(&rows);
}

/// Distinct ids a row group's bloom filter is sized for, and its false-positive rate at that
/// many: 64 KiB per row group of 128 Ki rows (0.5 bytes a row). A row group with more distinct
/// ids answers "maybe" more often (about 13 % at three times as many, 31 % when all 128 Ki rows
/// differ), which costs reads, never rows.
const DISTINCT_ID_BLOOM_NDV: u64 = 32 * 1024;
const DISTINCT_ID_BLOOM_FPP: f64 = 0.01;

/// Bytes a segment writer hands the disk between syncs.
const SYNC_STEP: usize = 4 << 20;

/// A file written to stable storage every [`SYNC_STEP`] bytes instead of all at the end. On a
/// virtual disk a cache flush carries every byte written since the previous one, so a WAL
/// fsync issued just after a whole segment reached the device waited for all of it (10–20 ms
/// for one segment); in steps, it waits for at most one step.
struct PacedFile {
    file: Box<dyn DiskFile>,
    unsynced: usize,
}

impl Write for PacedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.unsynced += n;
        if self.unsynced >= SYNC_STEP {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Reads every row of a segment (its bytes, or an open file); `source` names it in errors.
pub fn read_segment(
    file: impl ChunkReader + 'static,
    source: &str,
) -> Result<Vec<StoredEvent>, SegmentError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)?.build()?;
    let mut out = Vec::new();
    for batch in reader {
        out.extend(from_record_batch(&batch?, source)?);
    }
    Ok(out)
}

/// Row conditions pushed into the Parquet reader.
#[derive(Debug, Clone, Default)]
pub struct SegmentFilter {
    pub event: Option<String>,
    pub distinct_id: Option<String>,
    /// Exclusive bounds on `timestamp`.
    pub after: Option<DateTime<Utc>>,
    pub before: Option<DateTime<Utc>>,
}

/// The span of `timestamp` a segment or one of its row groups holds (microseconds, both
/// inclusive), from its Parquet statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBounds {
    pub min: i64,
    pub max: i64,
}

impl TimeBounds {
    /// A row group's span, when its `timestamp` statistics give one.
    fn of_row_group(group: &RowGroupMetaData, ts_index: usize) -> Option<TimeBounds> {
        match group.column(ts_index).statistics() {
            Some(Statistics::Int64(s)) => Some(TimeBounds {
                min: *s.min_opt()?,
                max: *s.max_opt()?,
            }),
            _ => None,
        }
    }

    /// A whole segment's span: none unless every row group has one.
    fn of_segment(metadata: &ParquetMetaData, ts_index: usize) -> Option<TimeBounds> {
        metadata
            .row_groups()
            .iter()
            .map(|g| TimeBounds::of_row_group(g, ts_index))
            .reduce(|a, b| {
                let (a, b) = (a?, b?);
                Some(TimeBounds {
                    min: a.min.min(b.min),
                    max: a.max.max(b.max),
                })
            })
            .flatten()
    }

    /// Whether rows in this span can lie within `filter`'s exclusive time bounds.
    pub fn may_match(&self, filter: &SegmentFilter) -> bool {
        filter.after.is_none_or(|a| self.max > a.timestamp_micros())
            && filter
                .before
                .is_none_or(|b| self.min < b.timestamp_micros())
    }
}

/// What [`read_segment_filtered`] found: the matching rows, and the segment's span of
/// `timestamp` (so later reads can skip the segment without opening it).
pub struct FilteredRead {
    pub rows: Vec<StoredEvent>,
    pub bounds: Option<TimeBounds>,
}

/// Reads the rows of a segment that can match `filter`: row groups whose `timestamp`
/// statistics lie outside the bounds are skipped, and `event`/`distinct_id` equality is
/// evaluated on those columns alone before any other column is decoded.
pub fn read_segment_filtered(
    file: impl ChunkReader + Clone + 'static,
    source: &str,
    filter: &SegmentFilter,
) -> Result<FilteredRead, SegmentError> {
    use parquet::arrow::arrow_reader::{ArrowPredicateFn, RowFilter};
    use parquet::arrow::ProjectionMask;

    let builder = ParquetRecordBatchReaderBuilder::try_new(file.clone())?;
    let metadata = builder.metadata().clone();
    let ts_index = schema().index_of("timestamp")?;
    let did_index = schema().index_of("distinct_id")?;
    let bounds = TimeBounds::of_segment(&metadata, ts_index);
    let mut row_groups = Vec::new();
    for i in 0..metadata.num_row_groups() {
        let group = metadata.row_group(i);
        if !TimeBounds::of_row_group(group, ts_index).is_none_or(|b| b.may_match(filter)) {
            continue;
        }
        if let Some(wanted) = &filter.distinct_id {
            // Segments written before bloom filters have none: read as before.
            let bloom = Sbbf::read_from_column_chunk(group.column(did_index), &file)?;
            if bloom.is_some_and(|b| !b.check(wanted.as_str())) {
                continue;
            }
        }
        row_groups.push(i);
    }
    if row_groups.is_empty() {
        return Ok(FilteredRead {
            rows: Vec::new(),
            bounds,
        });
    }
    let mut predicates: Vec<Box<dyn parquet::arrow::arrow_reader::ArrowPredicate>> = Vec::new();
    let descr = metadata.file_metadata().schema_descr_ptr();
    for (name, wanted) in [
        ("event", &filter.event),
        ("distinct_id", &filter.distinct_id),
    ] {
        let Some(wanted) = wanted.clone() else {
            continue;
        };
        let index = schema().index_of(name)?;
        let mask = ProjectionMask::roots(&descr, [index]);
        predicates.push(Box::new(ArrowPredicateFn::new(
            mask,
            move |batch: RecordBatch| {
                let column = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| {
                        arrow::error::ArrowError::SchemaError(format!(
                            "{name} is not a string column"
                        ))
                    })?;
                Ok(column
                    .iter()
                    .map(|v| Some(v == Some(wanted.as_str())))
                    .collect())
            },
        )));
    }
    let mut builder = builder.with_row_groups(row_groups);
    if !predicates.is_empty() {
        builder = builder.with_row_filter(RowFilter::new(predicates));
    }
    let mut rows = Vec::new();
    for batch in builder.build()? {
        rows.extend(from_record_batch(&batch?, source)?);
    }
    Ok(FilteredRead { rows, bounds })
}

fn column<'a, T: 'static>(
    batch: &'a RecordBatch,
    name: &str,
    source: &str,
) -> Result<&'a T, SegmentError> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| SegmentError::Layout(format!("{source} (column {name})")))
}

/// Record batch → rows (the inverse of [`to_record_batch_with`]).
pub fn from_record_batch(
    batch: &RecordBatch,
    source: &str,
) -> Result<Vec<StoredEvent>, SegmentError> {
    let s = |name| column::<StringArray>(batch, name, source);
    let (uuid, event, distinct_id, person_id) =
        (s("uuid")?, s("event")?, s("distinct_id")?, s("person_id")?);
    let (properties, person_properties) = (s("properties")?, s("person_properties")?);
    let timestamp = column::<TimestampMicrosecondArray>(batch, "timestamp", source)?;
    let created_at = column::<TimestampMicrosecondArray>(batch, "created_at", source)?;
    let project_id = column::<Int64Array>(batch, "project_id", source)?;
    let groups: Vec<&StringArray> = GROUP_COLUMNS
        .iter()
        .map(|c| s(c))
        .collect::<Result<_, _>>()?;
    let (session, window) = (s("$session_id")?, s("$window_id")?);
    let opt = |a: &StringArray, i: usize| (!a.is_null(i)).then(|| a.value(i).to_string());
    let at = |a: &TimestampMicrosecondArray, i: usize| {
        Utc.timestamp_micros(a.value(i))
            .single()
            .unwrap_or_default()
    };
    Ok((0..batch.num_rows())
        .map(|i| StoredEvent {
            uuid: Uuid::parse_str(uuid.value(i)).unwrap_or_default(),
            event: event.value(i).to_string(),
            distinct_id: distinct_id.value(i).to_string(),
            person_id: Uuid::parse_str(person_id.value(i)).unwrap_or_default(),
            properties: properties.value(i).to_string(),
            person_properties: person_properties.value(i).into(),
            timestamp: at(timestamp, i),
            created_at: at(created_at, i),
            project_id: project_id.value(i) as u64,
            groups: std::array::from_fn(|g| opt(groups[g], i)),
            session_id: opt(session, i),
            window_id: opt(window, i),
        })
        .collect())
}

/// How many rows of a segment `erased` covers, reading only the three columns that decide it
/// (person id, distinct id, capture time).
pub fn count_erased(
    file: impl ChunkReader + 'static,
    source: &str,
    erased: &ErasedSet,
) -> Result<usize, SegmentError> {
    use parquet::arrow::ProjectionMask;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
    let descr = builder.metadata().file_metadata().schema_descr_ptr();
    let roots = ["person_id", "distinct_id", "created_at"]
        .iter()
        .map(|name| builder.schema().index_of(name))
        .collect::<Result<Vec<_>, _>>()?;
    let reader = builder
        .with_projection(ProjectionMask::roots(&descr, roots))
        .build()?;
    let mut count = 0;
    for batch in reader {
        let batch = batch?;
        let person = column::<StringArray>(&batch, "person_id", source)?;
        let distinct_id = column::<StringArray>(&batch, "distinct_id", source)?;
        let created = column::<TimestampMicrosecondArray>(&batch, "created_at", source)?;
        count += (0..batch.num_rows())
            .filter(|&i| erased.hides_text(person.value(i), distinct_id.value(i), created.value(i)))
            .count();
    }
    Ok(count)
}

/// The event uuids a segment holds, reading that column alone (the WAL replay's duplicate
/// check needs nothing else, and decoding whole rows made it hold every column of every
/// segment it checks).
pub fn read_uuids(
    file: impl ChunkReader + 'static,
    source: &str,
) -> Result<Vec<Uuid>, SegmentError> {
    use parquet::arrow::ProjectionMask;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
    let descr = builder.metadata().file_metadata().schema_descr_ptr();
    let root = builder.schema().index_of("uuid")?;
    let reader = builder
        .with_projection(ProjectionMask::roots(&descr, [root]))
        .build()?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        let uuids = column::<StringArray>(&batch, "uuid", source)?;
        out.extend(
            uuids
                .iter()
                .map(|u| u.and_then(|u| Uuid::parse_str(u).ok()).unwrap_or_default()),
        );
    }
    Ok(out)
}

/// Column names of a segment (its bytes, or an open file), from its footer.
pub fn column_names(
    file: impl ChunkReader + 'static,
) -> Result<std::collections::BTreeSet<String>, SegmentError> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
    Ok(builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::event;
    use serde_json::json;

    #[test]
    fn a_record_batch_holds_every_field_of_every_row_and_the_materialized_values() {
        let rows: Vec<StoredEvent> = (0..40)
            .map(|i| {
                let mut row = event(
                    1 + i % 3,
                    ["$pageview", "signup"][i as usize % 2],
                    &format!("user-{i}"),
                    "2026-01-02T00:00:03Z",
                    json!({ "plan": if i % 4 == 0 { json!(null) } else { json!(format!("p{i}")) },
                            "n": i, "escaped": "a\"b" }),
                );
                row.groups[(i % 5) as usize] = Some(format!("org-{i}"));
                row.session_id = (i % 2 == 0).then(|| format!("s-{i}"));
                row.window_id = (i % 3 == 0).then(|| format!("w-{i}"));
                row
            })
            .collect();
        let refs: Vec<&StoredEvent> = rows.iter().collect();
        let keys = [
            "plan".to_string(),
            "n".into(),
            "escaped".into(),
            "absent".into(),
        ];
        let batch = to_record_batch_with(&refs, &keys).expect("batch");
        assert_eq!(from_record_batch(&batch, "test").expect("rows"), rows);
        let text = |key: &str| {
            let column = batch
                .column_by_name(&materialized_column(key))
                .expect("materialized column");
            let column = column.as_any().downcast_ref::<StringArray>().expect("text");
            column
                .iter()
                .map(|v| v.map(str::to_string))
                .collect::<Vec<_>>()
        };
        let plans: Vec<Option<String>> = (0..40)
            .map(|i| (i % 4 != 0).then(|| format!("p{i}")))
            .collect();
        assert_eq!(text("plan"), plans);
        assert_eq!(text("n")[7].as_deref(), Some("7"));
        assert_eq!(text("escaped")[0].as_deref(), Some("a\"b"));
        assert!(text("absent").iter().all(Option::is_none));
    }

    #[test]
    fn segment_order_is_by_event_then_time_with_ties_kept_in_order() {
        let names = ["b", "$pageview", "a", "zz", "$identify"];
        let times = [
            "2026-01-02T00:00:03Z",
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:01Z",
        ];
        let rows: Vec<StoredEvent> = (0..60)
            .map(|i| {
                event(
                    1,
                    names[(i * 7) % names.len()],
                    &format!("user-{i}"),
                    times[(i * 5) % times.len()],
                    json!({ "i": i }),
                )
            })
            .collect();
        let mut sorted: Vec<&StoredEvent> = rows.iter().collect();
        sort_for_segment(&mut sorted);
        let mut expected: Vec<&StoredEvent> = rows.iter().collect();
        expected.sort_by(|a, b| a.event.cmp(&b.event).then(a.timestamp.cmp(&b.timestamp)));
        let ids = |v: &[&StoredEvent]| v.iter().map(|e| e.uuid).collect::<Vec<_>>();
        assert_eq!(ids(&sorted), ids(&expected));
        let mut empty: Vec<&StoredEvent> = Vec::new();
        sort_for_segment(&mut empty);
    }
}
