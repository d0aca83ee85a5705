//! PostHog's file-download export request (`POST …/file_download_batch_exports`), decoded
//! and checked: the model, the file format and its compression, the data interval (at most a
//! week, end exclusive) and the event-name filters.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest data interval one export covers (PostHog's limit).
pub const MAX_INTERVAL: chrono::Duration = chrono::Duration::days(7);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileFormat {
    Parquet,
    JSONLines,
}

impl FileFormat {
    /// The name requests give it.
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Parquet => "Parquet",
            FileFormat::JSONLines => "JSONLines",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Parquet => "parquet",
            FileFormat::JSONLines => "jsonl",
        }
    }
}

/// A file's compression. Parquet compresses its pages (`zstd` unless asked otherwise); JSON
/// Lines files are compressed whole, or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Zstd,
    Lz4,
    Snappy,
    Gzip,
    Brotli,
}

impl Compression {
    /// The suffix a whole-file compression adds (`.gz`, `.br`).
    pub fn suffix(self) -> &'static str {
        match self {
            Compression::Gzip => ".gz",
            Compression::Brotli => ".br",
            Compression::Zstd => ".zst",
            Compression::Lz4 => ".lz4",
            Compression::Snappy => ".sz",
        }
    }
}

/// A decoded export request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportRequest {
    pub format: FileFormat,
    pub compression: Option<Compression>,
    /// A file is closed and the next part begun past this size (`None`: one file).
    pub max_size_mb: Option<u64>,
    pub data_interval_start: DateTime<Utc>,
    pub data_interval_end: DateTime<Utc>,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

fn names(body: &Value, field: &str) -> Result<Vec<String>, String> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{field} must be a list of event names"))
            })
            .collect(),
        Some(_) => Err(format!("{field} must be a list of event names")),
    }
}

/// The compressions a file format takes, in PostHog's order and spelling.
fn compressions(format: FileFormat) -> &'static [(&'static str, Compression)] {
    match format {
        FileFormat::Parquet => &[
            ("zstd", Compression::Zstd),
            ("lz4", Compression::Lz4),
            ("snappy", Compression::Snappy),
            ("gzip", Compression::Gzip),
            ("brotli", Compression::Brotli),
        ],
        FileFormat::JSONLines => &[("gzip", Compression::Gzip), ("brotli", Compression::Brotli)],
    }
}

/// A file format and compression as a request names them (JSON Lines by default, as
/// PostHog's; Parquet pages `zstd` unless asked otherwise), with PostHog's texts for a format
/// or a pair it does not take.
pub fn file_settings(
    format: Option<&str>,
    compression: Option<&str>,
) -> Result<(FileFormat, Option<Compression>), String> {
    let format = match format {
        Some("Parquet") => FileFormat::Parquet,
        Some("JSONLines") | None => FileFormat::JSONLines,
        Some(other) => {
            return Err(format!(
                "File format {other} is not supported. Supported file formats are ['Parquet', 'JSONLines']"
            ))
        }
    };
    let allowed = compressions(format);
    let compression = match compression.filter(|c| !c.is_empty()) {
        None => None,
        Some(name) => Some(
            allowed
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, c)| *c)
                .ok_or_else(|| {
                    let names: Vec<String> =
                        allowed.iter().map(|(n, _)| format!("'{n}'")).collect();
                    format!(
                        "Compression {name} is not supported for file format {}. Supported \
                         compressions are [{}]",
                        format.name(),
                        names.join(", ")
                    )
                })?,
        ),
    };
    Ok((
        format,
        compression.or((format == FileFormat::Parquet).then_some(Compression::Zstd)),
    ))
}

fn instant(body: &Value, field: &str) -> Result<DateTime<Utc>, String> {
    let text = body
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{field} is required"))?;
    corvid_kernel::parse_timestamp(text)
        .ok_or_else(|| format!("{field} must be an ISO 8601 date-time, not {text:?}"))
}

impl ExportRequest {
    /// Decodes a request body; the error names what is wrong.
    pub fn from_json(body: &Value) -> Result<ExportRequest, String> {
        match body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("events")
        {
            "events" => {}
            other => {
                return Err(format!(
                    "Model {other:?} cannot be exported: Corvid exports the events model."
                ))
            }
        }
        let file = body.get("file").cloned().unwrap_or(Value::Null);
        let text = |name: &str| -> Result<Option<String>, String> {
            match file.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => Err(format!("{name} must be a string")),
            }
        };
        let (format, compression) =
            file_settings(text("format")?.as_deref(), text("compression")?.as_deref())?;
        let max_size_mb = match file.get("max_size_mb") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|n| *n > 0)
                    .ok_or("max_size_mb must be a positive integer")?,
            ),
        };
        let start = instant(body, "data_interval_start")?;
        let end = instant(body, "data_interval_end")?;
        if end <= start {
            return Err("data_interval_end must be after data_interval_start.".into());
        }
        if end.signed_duration_since(start) > MAX_INTERVAL {
            return Err("The data interval cannot be longer than one week.".into());
        }
        Ok(ExportRequest {
            format,
            compression,
            max_size_mb,
            data_interval_start: start,
            data_interval_end: end,
            include: names(body, "include")?,
            exclude: names(body, "exclude")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(file: Value, start: &str, end: &str) -> Value {
        json!({"model": "events", "file": file, "data_interval_start": start, "data_interval_end": end})
    }

    #[test]
    fn formats_compressions_and_intervals_are_checked() {
        let ok = ExportRequest::from_json(&body(
            json!({"format": "Parquet"}),
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
        ))
        .expect("valid");
        assert_eq!(ok.compression, Some(Compression::Zstd));
        let err = |b: Value| ExportRequest::from_json(&b).expect_err("refused");
        assert!(err(body(
            json!({"format": "JSONLines", "compression": "zstd"}),
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z"
        ))
        .contains("Supported compressions are ['gzip', 'brotli']"));
        assert!(err(body(
            json!({"format": "CSV"}),
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z"
        ))
        .contains("File format CSV is not supported"));
        assert!(err(body(
            json!({"format": "Parquet"}),
            "2026-01-01T00:00:00Z",
            "2026-01-09T00:00:00Z"
        ))
        .contains("one week"));
        assert!(err(body(
            json!({"format": "Parquet"}),
            "2026-01-02T00:00:00Z",
            "2026-01-01T00:00:00Z"
        ))
        .contains("after"));
        assert!(err(json!({"model": "persons", "data_interval_start": "2026-01-01T00:00:00Z", "data_interval_end": "2026-01-02T00:00:00Z"}))
            .contains("events model"));
    }
}
