//! Timestamp parsing and clock-skew correction, as PostHog's capture/ingestion does it
//! (`PostHog/posthog:rust/common/types/src/timestamp.rs`).
//!
//! Every input here is the client's: arithmetic is checked (see [`corvid_kernel::time`]).
#![deny(
    clippy::arithmetic_side_effects,
    clippy::string_slice,
    clippy::indexing_slicing
)]

use chrono::{DateTime, Datelike, Duration, Utc};
use corvid_kernel::time::{add, millis, sub};
pub use corvid_kernel::time::{parse_iso8601, parse_timestamp};

/// Events more than this far in the future are clamped to the receive time.
pub const MAX_FUTURE: Duration = Duration::hours(23);

/// The stored timestamp of an event.
///
/// `now + (timestamp − sent_at)` when both are known (client clock skew), the timestamp alone
/// otherwise, `now − offset` when an offset is given; clamped to `now` when more than 23 h in
/// the future, and to the epoch when outside years 0..=9999 (an arithmetic result past
/// chrono's range included).
pub fn resolve_timestamp(
    now: DateTime<Utc>,
    timestamp: Option<&str>,
    offset_ms: Option<i64>,
    sent_at: Option<DateTime<Utc>>,
    ignore_sent_at: bool,
) -> DateTime<Utc> {
    let sent_at = if ignore_sent_at { None } else { sent_at };
    let mut result = Some(now);
    if let Some(ts) = timestamp.and_then(parse_timestamp) {
        result = match sent_at {
            // Two instants are always less than a duration's range apart.
            Some(sent) => add(now, ts.signed_duration_since(sent)),
            None => Some(ts),
        };
    }
    if let Some(offset) = offset_ms {
        result = millis(offset).and_then(|ago| sub(now, ago));
    }
    let Some(mut result) = result else {
        return DateTime::<Utc>::UNIX_EPOCH;
    };
    if result.signed_duration_since(now) > MAX_FUTURE {
        result = now;
    }
    if !(0..=9999).contains(&result.year()) {
        result = DateTime::<Utc>::UNIX_EPOCH;
    }
    result
}

/// Timestamps in write-ahead-log records: integer nanoseconds since the epoch, exact and much
/// cheaper to write than RFC 3339 text (two per event on the capture path). Times outside the
/// nanosecond range (before 1677 or after 2262) are written as text, and text is still read,
/// so records of earlier versions replay unchanged.
pub mod wal_time {
    use std::fmt;

    use chrono::{DateTime, Utc};
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serialize, Serializer};

    /// Serializes one timestamp (see the module docs).
    pub struct WalTime<'a>(pub &'a DateTime<Utc>);

    impl Serialize for WalTime<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            match self.0.timestamp_nanos_opt() {
                Some(nanos) => serializer.serialize_i64(nanos),
                None => self.0.serialize(serializer),
            }
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        d.deserialize_any(TimeVisitor)
    }

    struct TimeVisitor;

    impl Visitor<'_> for TimeVisitor {
        type Value = DateTime<Utc>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("epoch nanoseconds or an RFC 3339 timestamp")
        }

        fn visit_i64<E: de::Error>(self, nanos: i64) -> Result<Self::Value, E> {
            Ok(DateTime::from_timestamp_nanos(nanos))
        }

        fn visit_u64<E: de::Error>(self, nanos: u64) -> Result<Self::Value, E> {
            i64::try_from(nanos)
                .map(DateTime::from_timestamp_nanos)
                .map_err(|_| E::custom("timestamp out of range"))
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            text.parse().map_err(E::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_times_round_trip_exactly_and_old_text_records_still_read() {
        #[derive(serde::Deserialize)]
        struct Rec {
            #[serde(deserialize_with = "wal_time::deserialize")]
            t: DateTime<Utc>,
        }
        let times = [
            "2026-11-22T18:00:00.123456789Z",
            "1970-01-01T00:00:00Z",
            "1960-05-01T00:00:00.5Z",
            "1500-01-01T00:00:00Z",
            "2400-01-01T00:00:00Z",
        ];
        for text in times {
            let t: DateTime<Utc> = text.parse().expect("time");
            let json = serde_json::json!({"t": wal_time::WalTime(&t)}).to_string();
            let back: Rec = serde_json::from_str(&json).expect("reads");
            assert_eq!(back.t, t, "{text} via {json}");
            let old: Rec = serde_json::from_value(serde_json::json!({"t": t})).expect("text");
            assert_eq!(old.t, t, "{text} as text");
        }
        let now: DateTime<Utc> = "2026-11-22T18:00:00Z".parse().expect("time");
        let json = serde_json::json!({"t": wal_time::WalTime(&now)}).to_string();
        let nanos = now.timestamp_nanos_opt().expect("in range");
        assert_eq!(json, format!("{{\"t\":{nanos}}}"), "written as an integer");
    }

    fn at(s: &str) -> DateTime<Utc> {
        parse_timestamp(s).expect("parses")
    }

    #[test]
    fn parses_the_formats_clients_send() {
        let expected = at("2024-03-01T12:00:00Z");
        for text in [
            "2024-03-01T12:00:00Z",
            "2024-03-01T12:00:00.000+00:00",
            "2024-03-01T13:00:00+01",
            "2024-03-01T12:00:00",
            "2024-03-01 12:00:00",
            "Fri, 01 Mar 2024 12:00:00 +0000",
            "1709294400",
            "1709294400000",
        ] {
            assert_eq!(parse_timestamp(text), Some(expected), "{text}");
        }
        assert_eq!(at("2024-03-01"), at("2024-03-01T00:00:00Z"));
        assert_eq!(parse_timestamp("yesterday"), None);
        assert_eq!(parse_iso8601("1709294400"), None, "epoch is not ISO 8601");
        assert!(parse_iso8601("2024-03-01T12:00:00Z").is_some());
    }

    #[test]
    fn skew_correction_offset_and_future_clamp() {
        let now = at("2024-03-01T12:00:00Z");
        // Client clock 1 h ahead: event 10 s before sending → 10 s before now.
        let t = resolve_timestamp(
            now,
            Some("2024-03-01T12:59:50Z"),
            None,
            Some(at("2024-03-01T13:00:00Z")),
            false,
        );
        assert_eq!(t, at("2024-03-01T11:59:50Z"));
        // $ignore_sent_at keeps the client's timestamp.
        let t = resolve_timestamp(
            now,
            Some("2024-03-01T12:59:50Z"),
            None,
            Some(at("2024-03-01T13:00:00Z")),
            true,
        );
        assert_eq!(t, at("2024-03-01T12:59:50Z"));
        // offset wins over timestamp.
        let t = resolve_timestamp(now, Some("2020-01-01T00:00:00Z"), Some(5000), None, false);
        assert_eq!(t, at("2024-03-01T11:59:55Z"));
        // More than 23 h in the future is clamped; 22 h is kept.
        assert_eq!(
            resolve_timestamp(now, Some("2024-03-02T12:00:00Z"), None, None, false),
            now
        );
        assert_eq!(
            resolve_timestamp(now, Some("2024-03-02T10:00:00Z"), None, None, false),
            at("2024-03-02T10:00:00Z")
        );
        // Unparseable → now.
        assert_eq!(
            resolve_timestamp(now, Some("garbage"), None, None, false),
            now
        );
    }

    #[test]
    fn hostile_inputs_resolve_without_panicking() {
        let now = at("2024-03-01T12:00:00Z");
        let epoch = DateTime::<Utc>::UNIX_EPOCH;
        for offset in [i64::MAX, i64::MIN, i64::MIN + 1, -i64::MAX / 2] {
            let t = resolve_timestamp(now, None, Some(offset), None, false);
            assert!(t == epoch || t == now, "offset {offset}: {t}");
        }
        // The timestamp at one end of chrono's range, sent_at at the other: the skew alone
        // is past the range of instants.
        for (ts, sent) in [
            ("9999-12-31T23:59:59Z", DateTime::<Utc>::MIN_UTC),
            ("0001-01-01T00:00:00Z", DateTime::<Utc>::MAX_UTC),
        ] {
            let t = resolve_timestamp(now, Some(ts), None, Some(sent), false);
            assert!(t == epoch || t == now, "{ts} sent at {sent}: {t}");
        }
        assert_eq!(resolve_timestamp(now, Some("1é23"), None, None, false), now);
    }
}
