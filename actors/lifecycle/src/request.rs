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
    fn parse(text: &str) -> Option<Compression> {
        match text.to_ascii_lowercase().as_str() {
            "zstd" => Some(Compression::Zstd),
            "lz4" => Some(Compression::Lz4),
            "snappy" => Some(Compression::Snappy),
            "gzip" => Some(Compression::Gzip),
            "brotli" => Some(Compression::Brotli),
            _ => None,
        }
    }

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
        let format = match file.get("format").and_then(Value::as_str) {
            Some("Parquet") => FileFormat::Parquet,
            Some("JSONLines") | None => FileFormat::JSONLines,
            Some(other) => {
                return Err(format!(
                    "Unsupported file format {other:?}: use \"Parquet\" or \"JSONLines\"."
                ))
            }
        };
        let compression = match file.get("compression") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(
                Compression::parse(text)
                    .ok_or_else(|| format!("Unsupported compression {text:?}."))?,
            ),
            Some(_) => return Err("compression must be a string".into()),
        };
        let allowed: &[Compression] = match format {
            FileFormat::Parquet => &[
                Compression::Zstd,
                Compression::Lz4,
                Compression::Snappy,
                Compression::Gzip,
                Compression::Brotli,
            ],
            FileFormat::JSONLines => &[Compression::Gzip, Compression::Brotli],
        };
        if let Some(c) = compression {
            if !allowed.contains(&c) {
                return Err(format!(
                    "Compression {} is not supported for file format {}.",
                    serde_json::to_value(c)
                        .unwrap_or_default()
                        .as_str()
                        .unwrap_or(""),
                    serde_json::to_value(format)
                        .unwrap_or_default()
                        .as_str()
                        .unwrap_or("")
                ));
            }
        }
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
            compression: compression
                .or((format == FileFormat::Parquet).then_some(Compression::Zstd)),
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
        .contains("not supported"));
        assert!(err(body(
            json!({"format": "CSV"}),
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z"
        ))
        .contains("Unsupported file format"));
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
