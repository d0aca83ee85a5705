//! A scheduled batch export as PostHog's `/batch_exports/` routes define it: the events model,
//! an S3-compatible destination with its config fields, an interval, the window in which runs
//! are triggered. Decoded and checked here with PostHog's texts; rendered without the secret
//! keys, which no read returns.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::schedule::{check_prefix, Interval};
use crate::request::{file_settings, Compression, FileFormat};

/// Destination types an export may name: PostHog's legacy `S3` and its newer `AwsS3` and
/// `S3Compatible` (which must give an `endpoint_url`).
const DESTINATION_TYPES: [&str; 3] = ["S3", "AwsS3", "S3Compatible"];

/// Config fields never returned by a read.
const SECRET_FIELDS: [&str; 2] = ["aws_access_key_id", "aws_secret_access_key"];

/// Where an export's files go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct S3Destination {
    /// `S3`, `AwsS3` or `S3Compatible`, as given.
    pub kind: String,
    pub bucket_name: String,
    pub region: String,
    /// A key prefix, with PostHog's variables (`{year}`, `{month}`, `{day}`, `{hour}`,
    /// `{minute}`, `{second}`, `{data_interval_start}`, `{data_interval_end}`, `{table}`).
    pub prefix: String,
    pub endpoint_url: Option<String>,
    pub use_virtual_style_addressing: bool,
    pub aws_access_key_id: String,
    pub aws_secret_access_key: String,
    pub file_format: FileFormat,
    pub compression: Option<Compression>,
    pub max_file_size_mb: Option<u64>,
    pub include_events: Vec<String>,
    pub exclude_events: Vec<String>,
}

/// One scheduled export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchExport {
    pub id: Uuid,
    pub team_id: u64,
    pub name: String,
    pub destination: S3Destination,
    pub interval: Interval,
    pub paused: bool,
    pub created_at: DateTime<Utc>,
    pub last_updated_at: DateTime<Utc>,
    pub last_paused_at: Option<DateTime<Utc>>,
    /// Runs are triggered for intervals from here (unset: from the interval of creation).
    pub start_at: Option<DateTime<Utc>>,
    /// … up to here (unset: for as long as the export lives).
    pub end_at: Option<DateTime<Utc>>,
    /// Deleted exports are kept (PostHog soft-deletes) but never run again nor listed.
    pub deleted: bool,
}

/// Why a body does not make an export: PostHog's text, and the field it concerns.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub detail: String,
    pub attr: Option<&'static str>,
}

fn invalid(detail: impl Into<String>, attr: Option<&'static str>) -> Invalid {
    Invalid {
        detail: detail.into(),
        attr,
    }
}

/// Whether an export may write to `endpoint_url`: a URL of a public host (loopback, private
/// and other special-use addresses are refused, as are names only private networks have)
/// unless `allow_private` (development and tests).
pub fn check_endpoint(endpoint_url: &str, allow_private: bool) -> Result<url::Url, Invalid> {
    let refused = || {
        invalid(
            format!("Invalid endpoint_url: '{endpoint_url}'"),
            Some("destination"),
        )
    };
    let url = url::Url::parse(endpoint_url).map_err(|_| refused())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refused());
    }
    let public = match url.host() {
        None => false,
        Some(url::Host::Ipv4(ip)) => !corvid_kernel::net::is_special_use(ip.into()),
        Some(url::Host::Ipv6(ip)) => !corvid_kernel::net::is_special_use(ip.into()),
        Some(url::Host::Domain(name)) => !corvid_kernel::net::is_internal_name(name),
    };
    if public || (allow_private && url.host().is_some()) {
        Ok(url)
    } else {
        Err(refused())
    }
}

fn text_field(config: &Map<String, Value>, name: &str) -> Result<Option<String>, Invalid> {
    match config.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(invalid(
            format!("{name} must be a string"),
            Some("destination"),
        )),
    }
}

fn event_names(config: &Map<String, Value>, name: &str) -> Result<Vec<String>, Invalid> {
    match config.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    invalid(
                        format!("{name} must be a list of event names"),
                        Some("destination"),
                    )
                })
            })
            .collect(),
        Some(_) => Err(invalid(
            format!("{name} must be a list of event names"),
            Some("destination"),
        )),
    }
}

fn instant(
    body: &Map<String, Value>,
    name: &'static str,
) -> Result<Option<DateTime<Utc>>, Invalid> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => corvid_kernel::parse_timestamp(text)
            .map(Some)
            .ok_or_else(|| invalid(format!("{name} must be an ISO 8601 date-time"), Some(name))),
        Some(_) => Err(invalid(
            format!("{name} must be an ISO 8601 date-time"),
            Some(name),
        )),
    }
}

impl S3Destination {
    /// The destination a body's `destination` object describes.
    fn decode(destination: &Value, allow_private: bool) -> Result<S3Destination, Invalid> {
        let kind = destination
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("This field is required.", Some("destination")))?;
        if !DESTINATION_TYPES.contains(&kind) {
            return Err(invalid(
                format!(
                    "Destination type {kind:?} is not supported: Corvid exports to S3-compatible \
                     buckets (\"S3\", \"AwsS3\", \"S3Compatible\")."
                ),
                Some("destination"),
            ));
        }
        let empty = Map::new();
        let config = destination
            .get("config")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let mut required = vec![
            "bucket_name",
            "region",
            "aws_access_key_id",
            "aws_secret_access_key",
        ];
        if kind == "S3Compatible" {
            required.push("endpoint_url");
        }
        if let Some(missing) = required.iter().find(|f| !config.contains_key(**f)) {
            return Err(invalid(
                format!(
                    "Invalid inputs for destination {kind}: missing required field: '{missing}'"
                ),
                Some("destination"),
            ));
        }
        let empty_inputs: Vec<String> = required
            .iter()
            .filter(|f| {
                config
                    .get(**f)
                    .is_some_and(|v| v.is_null() || v.as_str().is_some_and(str::is_empty))
            })
            .map(|f| format!("'{f}'"))
            .collect();
        if !empty_inputs.is_empty() {
            return Err(invalid(
                format!(
                    "The following inputs are empty: [{}]",
                    empty_inputs.join(", ")
                ),
                Some("destination"),
            ));
        }
        let endpoint_url = text_field(config, "endpoint_url")?.filter(|u| !u.is_empty());
        if let Some(url) = &endpoint_url {
            check_endpoint(url, allow_private)?;
        }
        let (file_format, compression) = file_settings(
            text_field(config, "file_format")?.as_deref(),
            text_field(config, "compression")?.as_deref(),
        )
        .map_err(|detail| invalid(detail, Some("destination")))?;
        let max_file_size_mb = match config.get("max_file_size_mb") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                invalid(
                    "max_file_size_mb must be a positive integer",
                    Some("destination"),
                )
            })?),
        };
        let prefix = text_field(config, "prefix")?.unwrap_or_default();
        check_prefix(&prefix).map_err(|detail| invalid(detail, Some("destination")))?;
        let text = |name: &str| -> Result<String, Invalid> {
            Ok(text_field(config, name)?.unwrap_or_default())
        };
        Ok(S3Destination {
            kind: kind.to_string(),
            bucket_name: text("bucket_name")?,
            region: text("region")?,
            prefix,
            endpoint_url,
            use_virtual_style_addressing: config
                .get("use_virtual_style_addressing")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            aws_access_key_id: text("aws_access_key_id")?,
            aws_secret_access_key: text("aws_secret_access_key")?,
            file_format,
            compression,
            max_file_size_mb,
            include_events: event_names(config, "include_events")?,
            exclude_events: event_names(config, "exclude_events")?,
        })
    }

    /// The config as a body gives it; `with_secrets` adds the keys (for merging a PATCH).
    fn config_json(&self, with_secrets: bool) -> Value {
        let mut config = json!({
            "bucket_name": self.bucket_name,
            "region": self.region,
            "prefix": self.prefix,
            "endpoint_url": self.endpoint_url,
            "use_virtual_style_addressing": self.use_virtual_style_addressing,
            "file_format": self.file_format,
            "compression": self.compression,
            "max_file_size_mb": self.max_file_size_mb,
            "include_events": self.include_events,
            "exclude_events": self.exclude_events,
        });
        if with_secrets {
            config["aws_access_key_id"] = json!(self.aws_access_key_id);
            config["aws_secret_access_key"] = json!(self.aws_secret_access_key);
        }
        config
    }
}

impl BatchExport {
    /// A new export of `team` from a create body.
    pub fn create(
        team: u64,
        body: &Value,
        allow_private: bool,
        now: DateTime<Utc>,
    ) -> Result<BatchExport, Invalid> {
        let mut export = BatchExport {
            id: Uuid::now_v7(),
            team_id: team,
            name: String::new(),
            destination: S3Destination {
                kind: String::new(),
                bucket_name: String::new(),
                region: String::new(),
                prefix: String::new(),
                endpoint_url: None,
                use_virtual_style_addressing: false,
                aws_access_key_id: String::new(),
                aws_secret_access_key: String::new(),
                file_format: FileFormat::JSONLines,
                compression: None,
                max_file_size_mb: None,
                include_events: Vec::new(),
                exclude_events: Vec::new(),
            },
            interval: Interval::Hour,
            paused: false,
            created_at: now,
            last_updated_at: now,
            last_paused_at: None,
            start_at: None,
            end_at: None,
            deleted: false,
        };
        let body = body
            .as_object()
            .ok_or_else(|| invalid("The body must be a JSON object.", None))?;
        for field in ["name", "destination", "interval"] {
            if !body.contains_key(field) {
                let attr = match field {
                    "name" => "name",
                    "destination" => "destination",
                    _ => "interval",
                };
                return Err(invalid("This field is required.", Some(attr)));
            }
        }
        export.apply(body, allow_private)?;
        if body.get("paused").and_then(Value::as_bool) == Some(true) {
            export.paused = true;
            export.last_paused_at = Some(now);
        }
        Ok(export)
    }

    /// `body`'s fields over this export (a PATCH): a `destination.config` given is merged
    /// key by key over the stored one, so keys a read never returned need not be sent again.
    pub fn update(
        &mut self,
        body: &Value,
        allow_private: bool,
        now: DateTime<Utc>,
    ) -> Result<(), Invalid> {
        let body = body
            .as_object()
            .ok_or_else(|| invalid("The body must be a JSON object.", None))?;
        let mut merged = body.clone();
        if let Some(destination) = body.get("destination") {
            let mut config = self.destination.config_json(true);
            if let (Some(stored), Some(given)) = (
                config.as_object_mut(),
                destination.get("config").and_then(Value::as_object),
            ) {
                for (k, v) in given {
                    stored.insert(k.clone(), v.clone());
                }
            }
            let kind = destination
                .get("type")
                .cloned()
                .unwrap_or_else(|| json!(self.destination.kind));
            merged.insert(
                "destination".into(),
                json!({"type": kind, "config": config}),
            );
        }
        let mut next = self.clone();
        next.apply(&merged, allow_private)?;
        next.last_updated_at = now;
        *self = next;
        Ok(())
    }

    fn apply(&mut self, body: &Map<String, Value>, allow_private: bool) -> Result<(), Invalid> {
        if let Some(name) = body.get("name") {
            let name = name
                .as_str()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| invalid("This field may not be blank.", Some("name")))?;
            if name.chars().count() > 400 {
                return Err(invalid(
                    "Ensure this field has no more than 400 characters.",
                    Some("name"),
                ));
            }
            self.name = name.to_string();
        }
        match body.get("model").and_then(Value::as_str) {
            None | Some("events") => {}
            Some(other) => {
                return Err(invalid(
                    format!("Model {other:?} cannot be exported: Corvid exports the events model."),
                    Some("model"),
                ))
            }
        }
        if let Some(interval) = body.get("interval") {
            let text = interval.as_str().unwrap_or_default();
            self.interval = Interval::parse(text).ok_or_else(|| {
                invalid(
                    format!(
                        "\"{}\" is not a valid choice.",
                        interval.as_str().unwrap_or("")
                    ),
                    Some("interval"),
                )
            })?;
        }
        if let Some(destination) = body.get("destination") {
            self.destination = S3Destination::decode(destination, allow_private)?;
        }
        if body.contains_key("start_at") {
            self.start_at = instant(body, "start_at")?;
        }
        if body.contains_key("end_at") {
            self.end_at = instant(body, "end_at")?;
        }
        if let (Some(start), Some(end)) = (self.start_at, self.end_at) {
            if end <= start {
                return Err(invalid("end_at must be after start_at.", Some("end_at")));
            }
        }
        if body
            .get("hogql_query")
            .is_some_and(|q| !q.is_null() && q != "")
        {
            return Err(invalid(
                "Corvid exports PostHog's default columns of the events model; hogql_query is \
                 not supported.",
                Some("hogql_query"),
            ));
        }
        Ok(())
    }

    /// PostHog's BatchExport JSON, without the secret keys and without `latest_runs` (the
    /// caller adds them).
    pub fn to_json(&self) -> Value {
        let mut config = self.destination.config_json(false);
        if let Some(config) = config.as_object_mut() {
            for secret in SECRET_FIELDS {
                config.remove(secret);
            }
        }
        json!({
            "id": self.id,
            "team_id": self.team_id,
            "name": self.name,
            "model": "events",
            "destination": {"type": self.destination.kind, "config": config, "integration": null},
            "interval": self.interval.to_string(),
            "paused": self.paused,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "last_paused_at": self.last_paused_at,
            "start_at": self.start_at,
            "end_at": self.end_at,
            "hogql_query": null,
            "schema": null,
            "filters": null,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(config: Value) -> Value {
        json!({"name": "s3", "interval": "hour", "destination": {"type": "S3", "config": config}})
    }

    fn good() -> Value {
        json!({"bucket_name": "b", "region": "us-east-1", "prefix": "events/{year}",
               "aws_access_key_id": "id", "aws_secret_access_key": "secret"})
    }

    fn refused(b: Value) -> String {
        BatchExport::create(1, &b, false, Utc::now())
            .expect_err("refused")
            .detail
    }

    #[test]
    fn posthogs_texts_for_bad_destinations() {
        let mut config = good();
        config["file_format"] = json!("JSONLines");
        config["compression"] = json!("zstd");
        assert_eq!(
            refused(body(config)),
            "Compression zstd is not supported for file format JSONLines. Supported compressions are ['gzip', 'brotli']"
        );
        let mut config = good();
        config["file_format"] = json!("unknown");
        assert_eq!(
            refused(body(config)),
            "File format unknown is not supported. Supported file formats are ['Parquet', 'JSONLines']"
        );
        let mut config = good();
        config["aws_access_key_id"] = json!("");
        config["aws_secret_access_key"] = json!("");
        assert_eq!(
            refused(body(config)),
            "The following inputs are empty: ['aws_access_key_id', 'aws_secret_access_key']"
        );
        let mut config = good();
        config.as_object_mut().map(|c| c.remove("bucket_name"));
        assert!(refused(body(config)).contains("missing required field: 'bucket_name'"));
        for url in [
            "http://127.0.0.1:9000",
            "http://10.0.0.1/",
            "http://localhost",
            "http://[::1]/",
        ] {
            let mut config = good();
            config["endpoint_url"] = json!(url);
            assert_eq!(
                refused(body(config)),
                format!("Invalid endpoint_url: '{url}'")
            );
        }
        let mut bad_interval = body(good());
        bad_interval["interval"] = json!("minute");
        assert_eq!(refused(bad_interval), "\"minute\" is not a valid choice.");
    }

    #[test]
    fn reads_never_return_the_keys_and_a_patch_keeps_them() {
        let mut export = BatchExport::create(1, &body(good()), false, Utc::now()).expect("valid");
        let shown = export.to_json();
        assert!(shown["destination"]["config"]
            .get("aws_secret_access_key")
            .is_none());
        assert!(!shown.to_string().contains("secret"));
        export
            .update(
                &json!({"destination": {"config": {"prefix": "other"}}}),
                false,
                Utc::now(),
            )
            .expect("patched");
        assert_eq!(export.destination.prefix, "other");
        assert_eq!(export.destination.aws_secret_access_key, "secret");
        assert_eq!(export.destination.bucket_name, "b");
    }
}
