//! Writing an export's batches to files: Parquet (compressed pages) or JSON Lines (one object
//! per event, the file compressed whole), in parts of at most `max_size_mb` when asked.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit, TimestampMicrosecondType};
use chrono::{DateTime, SecondsFormat, Utc};
use parquet::arrow::ArrowWriter;
use parquet::basic::{BrotliLevel, Compression as Pages, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde_json::{Map, Value};

use super::request::{Compression, ExportRequest, FileFormat};

/// One open part.
enum Part {
    Parquet(Box<ArrowWriter<File>>),
    Lines(Box<dyn Write + Send>),
}

/// The files of one export run, written in order.
pub struct PartWriter {
    dir: PathBuf,
    stem: String,
    request: ExportRequest,
    limit: Option<u64>,
    open: Option<(Part, PathBuf)>,
    written: u64,
    /// Names of the finished files, in order.
    pub files: Vec<String>,
}

fn other(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// `batch` with every string column as plain UTF-8 (readers everywhere take it).
fn plain_strings(batch: &RecordBatch) -> Result<RecordBatch, String> {
    let fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8View | DataType::LargeUtf8 => {
                f.as_ref().clone().with_data_type(DataType::Utf8)
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    let columns = batch
        .columns()
        .iter()
        .zip(&fields)
        .map(|(c, f)| cast(c, f.data_type()))
        .collect::<Result<Vec<ArrayRef>, _>>()
        .map_err(other)?;
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(other)
}

/// One JSON object per row: strings as strings, times as RFC 3339 (µs, UTC).
fn json_rows(batch: &RecordBatch) -> Result<Vec<Value>, String> {
    let schema = batch.schema();
    let mut rows = vec![Map::new(); batch.num_rows()];
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        for (i, row) in rows.iter_mut().enumerate() {
            let value = if column.is_null(i) {
                Value::Null
            } else {
                match field.data_type() {
                    DataType::Utf8 => Value::String(column.as_string::<i32>().value(i).into()),
                    DataType::Timestamp(TimeUnit::Microsecond, _) => {
                        let micros = column.as_primitive::<TimestampMicrosecondType>().value(i);
                        DateTime::<Utc>::from_timestamp_micros(micros)
                            .map(|t| Value::String(t.to_rfc3339_opts(SecondsFormat::Micros, true)))
                            .unwrap_or(Value::Null)
                    }
                    other => return Err(format!("unexpected export column type {other}")),
                }
            };
            row.insert(field.name().clone(), value);
        }
    }
    Ok(rows.into_iter().map(Value::Object).collect())
}

impl PartWriter {
    /// Files go to `dir`, named `{start}-{end}[-{n}].{parquet|jsonl}[.gz|.br]` as PostHog names
    /// its export objects.
    pub fn new(dir: &Path, request: &ExportRequest) -> PartWriter {
        let time = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Secs, true);
        PartWriter {
            dir: dir.to_path_buf(),
            stem: format!(
                "{}-{}",
                time(request.data_interval_start),
                time(request.data_interval_end)
            ),
            request: request.clone(),
            limit: request.max_size_mb.map(|mb| mb.saturating_mul(1 << 20)),
            open: None,
            written: 0,
            files: Vec::new(),
        }
    }

    fn file_name(&self, part: usize) -> String {
        let split = if self.limit.is_some() {
            format!("-{part}")
        } else {
            String::new()
        };
        let suffix = match (self.request.format, self.request.compression) {
            (FileFormat::JSONLines, Some(c)) => c.suffix(),
            _ => "",
        };
        format!(
            "{}{split}.{}{suffix}",
            self.stem,
            self.request.format.extension()
        )
    }

    fn start_part(&mut self, schema: &Schema) -> Result<(), String> {
        let name = self.file_name(self.files.len());
        let path = self.dir.join(&name);
        let file = File::create(&path).map_err(other)?;
        let part = match self.request.format {
            FileFormat::Parquet => {
                let pages = match self.request.compression {
                    Some(Compression::Lz4) => Pages::LZ4_RAW,
                    Some(Compression::Snappy) => Pages::SNAPPY,
                    Some(Compression::Gzip) => Pages::GZIP(GzipLevel::default()),
                    Some(Compression::Brotli) => Pages::BROTLI(BrotliLevel::default()),
                    Some(Compression::Zstd) | None => Pages::ZSTD(ZstdLevel::default()),
                };
                let props = WriterProperties::builder().set_compression(pages).build();
                Part::Parquet(Box::new(
                    ArrowWriter::try_new(file, Arc::new(schema.clone()), Some(props))
                        .map_err(other)?,
                ))
            }
            FileFormat::JSONLines => {
                let out = BufWriter::new(file);
                Part::Lines(match self.request.compression {
                    Some(Compression::Gzip) => Box::new(flate2::write::GzEncoder::new(
                        out,
                        flate2::Compression::default(),
                    )),
                    Some(Compression::Brotli) => {
                        Box::new(brotli::CompressorWriter::new(out, 1 << 16, 5, 22))
                    }
                    _ => Box::new(out),
                })
            }
        };
        self.open = Some((part, path));
        self.written = 0;
        Ok(())
    }

    /// Appends a batch, closing the part once it passes the size limit.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), String> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = plain_strings(batch)?;
        if self.open.is_none() {
            self.start_part(&batch.schema())?;
        }
        let Some((part, _)) = self.open.as_mut() else {
            return Err("no open export file".into());
        };
        match part {
            Part::Parquet(writer) => {
                writer.write(&batch).map_err(other)?;
                self.written = writer.bytes_written() as u64 + writer.in_progress_size() as u64;
            }
            Part::Lines(out) => {
                for row in json_rows(&batch)? {
                    let line = serde_json::to_vec(&row).map_err(other)?;
                    out.write_all(&line).map_err(other)?;
                    out.write_all(b"\n").map_err(other)?;
                    self.written += line.len() as u64 + 1;
                }
            }
        }
        if self.limit.is_some_and(|limit| self.written >= limit) {
            self.finish_part()?;
        }
        Ok(())
    }

    fn finish_part(&mut self) -> Result<(), String> {
        let Some((part, path)) = self.open.take() else {
            return Ok(());
        };
        match part {
            Part::Parquet(writer) => {
                writer.close().map_err(other)?;
            }
            Part::Lines(mut out) => {
                out.flush().map_err(other)?;
                drop(out);
            }
        }
        File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(other)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.files.push(name);
        Ok(())
    }

    /// Closes the last part; an export with no events still gets one (empty) file.
    pub fn finish(mut self, schema_if_empty: Option<&Schema>) -> Result<Vec<String>, String> {
        if self.open.is_none() && self.files.is_empty() {
            if let Some(schema) = schema_if_empty {
                self.start_part(schema)?;
            }
        }
        self.finish_part()?;
        Ok(self.files)
    }
}
