//! Per-credential rate limits for endpoint runs: a burst limit per minute and a sustained limit
//! per hour, each with a higher allowance for runs served from materialized results.

use std::time::{Duration, Instant};

use dashmap::DashMap;

/// Runs allowed per window.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    pub per_minute: u64,
    pub per_hour: u64,
}

#[derive(Debug)]
struct Window {
    minute_start: Instant,
    minute_count: u64,
    hour_start: Instant,
    hour_count: u64,
}

pub struct Throttle {
    inline: Rates,
    materialized: Rates,
    windows: DashMap<(String, bool), Window>,
}

impl Throttle {
    pub fn new(inline: Rates, materialized: Rates) -> Throttle {
        Throttle {
            inline,
            materialized,
            windows: DashMap::new(),
        }
    }

    /// Counts one run for `caller`; `Err(retry_after)` when over a limit.
    pub fn check(&self, caller: &str, materialized: bool) -> Result<(), Duration> {
        let rates = if materialized {
            self.materialized
        } else {
            self.inline
        };
        let now = Instant::now();
        let mut w = self
            .windows
            .entry((caller.to_string(), materialized))
            .or_insert(Window {
                minute_start: now,
                minute_count: 0,
                hour_start: now,
                hour_count: 0,
            });
        if now.duration_since(w.minute_start) >= Duration::from_secs(60) {
            w.minute_start = now;
            w.minute_count = 0;
        }
        if now.duration_since(w.hour_start) >= Duration::from_secs(3600) {
            w.hour_start = now;
            w.hour_count = 0;
        }
        if w.minute_count >= rates.per_minute {
            return Err(Duration::from_secs(60).saturating_sub(now.duration_since(w.minute_start)));
        }
        if w.hour_count >= rates.per_hour {
            return Err(Duration::from_secs(3600).saturating_sub(now.duration_since(w.hour_start)));
        }
        w.minute_count += 1;
        w.hour_count += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_caller_has_its_own_budget_and_materialized_runs_more() {
        let t = Throttle::new(
            Rates {
                per_minute: 2,
                per_hour: 100,
            },
            Rates {
                per_minute: 3,
                per_hour: 100,
            },
        );
        assert!(t.check("a", false).is_ok());
        assert!(t.check("a", false).is_ok());
        assert!(t.check("a", false).is_err());
        assert!(t.check("b", false).is_ok(), "another key is not affected");
        for _ in 0..3 {
            assert!(t.check("a", true).is_ok());
        }
        assert!(t.check("a", true).is_err());
    }
}
