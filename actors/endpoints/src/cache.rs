//! The results cache: a run's answer keyed by (endpoint, version, variables, page), served
//! while younger than the version's `data_freshness_seconds` and not older than its newest
//! materialized result.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::Answer;

pub struct ResultsCache {
    entries: DashMap<String, Arc<Answer>>,
    capacity: usize,
}

/// The cache key of a run (variables in sorted-key JSON, so order does not matter).
pub fn key(
    endpoint: Uuid,
    version: u32,
    variables: &Map<String, Value>,
    limit: Option<usize>,
    offset: Option<usize>,
) -> String {
    let sorted: std::collections::BTreeMap<&String, &Value> = variables.iter().collect();
    format!(
        "{endpoint}:{version}:{}:{limit:?}:{offset:?}",
        serde_json::to_string(&sorted).unwrap_or_default()
    )
}

impl ResultsCache {
    pub fn new(capacity: usize) -> ResultsCache {
        ResultsCache {
            entries: DashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The entry for `key` if computed after `not_before` and within `max_age_secs`.
    pub fn get(
        &self,
        key: &str,
        max_age_secs: u64,
        not_before: Option<DateTime<Utc>>,
    ) -> Option<Answer> {
        let hit = Arc::clone(self.entries.get(key)?.value());
        let computed_at = hit.response.last_refresh;
        let age = Utc::now().signed_duration_since(computed_at);
        let fresh = age < corvid_kernel::time::seconds(max_age_secs)
            && not_before.is_none_or(|t| computed_at >= t);
        fresh.then(|| Answer::clone(&hit))
    }

    /// Keeps `entry`, computed at its `last_refresh`.
    pub fn put(&self, key: String, entry: Answer) {
        if self.entries.len() >= self.capacity {
            // Drop the older half: cheap, and a full cache is rare (keys are per variables).
            let mut ages: Vec<DateTime<Utc>> = self
                .entries
                .iter()
                .map(|e| e.response.last_refresh)
                .collect();
            ages.sort_unstable();
            let cutoff = ages[ages.len() / 2];
            self.entries.retain(|_, e| e.response.last_refresh > cutoff);
        }
        self.entries.insert(key, Arc::new(entry));
    }

    /// Forgets every cached answer.
    pub fn clear(&self) {
        self.entries.clear();
    }

    /// Forgets everything cached for an endpoint (its query or settings changed).
    pub fn forget_endpoint(&self, endpoint: Uuid) {
        let prefix = format!("{endpoint}:");
        self.entries.retain(|k, _| !k.starts_with(&prefix));
    }
}
