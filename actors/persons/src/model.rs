//! What is stored about persons, groups and usage.

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

/// At most this many group types per project (PostHog's `MAX_GROUP_TYPES_PER_TEAM`).
pub const MAX_GROUP_TYPES: u8 = 5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Person {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub properties: Map<String, Value>,
    pub is_identified: bool,
    pub version: u64,
    pub distinct_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub group_type_index: u8,
    pub group_type: String,
    pub group_key: String,
    pub properties: Map<String, Value>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageKind {
    BillableEvents,
    HistoricalEvents,
    FlagRequests,
}

impl UsageKind {
    /// The kind's one-byte code in storage keys.
    pub(crate) fn tag(self) -> u8 {
        match self {
            UsageKind::BillableEvents => 0,
            UsageKind::HistoricalEvents => 1,
            UsageKind::FlagRequests => 2,
        }
    }

    /// The kind of a stored one-byte code (unknown codes count as flag requests, as stored).
    pub(crate) fn of_tag(tag: u8) -> UsageKind {
        match tag {
            0 => UsageKind::BillableEvents,
            1 => UsageKind::HistoricalEvents,
            _ => UsageKind::FlagRequests,
        }
    }
}

/// A calendar month (UTC), the period usage is counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UsageMonth {
    year: i32,
    month: u32,
}

impl UsageMonth {
    pub fn of(at: DateTime<Utc>) -> UsageMonth {
        UsageMonth {
            year: at.year(),
            month: at.month(),
        }
    }

    /// Midnight of the month's first day: an instant inside it.
    pub fn first_instant(self) -> DateTime<Utc> {
        NaiveDate::from_ymd_opt(self.year, self.month, 1)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default()
    }
}

impl std::fmt::Display for UsageMonth {
    /// `YYYY-MM`, as [`UsageRow::month`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

/// One month of a project's usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageRow {
    /// `YYYY-MM` (UTC).
    pub month: String,
    pub billable_events: u64,
    pub historical_events: u64,
    pub flag_requests: u64,
}

impl UsageRow {
    /// The counter of `kind`.
    pub fn count_mut(&mut self, kind: UsageKind) -> &mut u64 {
        match kind {
            UsageKind::BillableEvents => &mut self.billable_events,
            UsageKind::HistoricalEvents => &mut self.historical_events,
            UsageKind::FlagRequests => &mut self.flag_requests,
        }
    }
}

/// Monthly rows from stored `(month, kind tag, count)` counters sorted by month.
pub(crate) fn usage_rows(counters: impl IntoIterator<Item = (String, u8, u64)>) -> Vec<UsageRow> {
    let mut rows: Vec<UsageRow> = Vec::new();
    for (month, tag, count) in counters {
        if rows.last().is_none_or(|r| r.month != month) {
            rows.push(UsageRow {
                month,
                ..UsageRow::default()
            });
        }
        if let Some(row) = rows.last_mut() {
            *row.count_mut(UsageKind::of_tag(tag)) = count;
        }
    }
    rows
}
