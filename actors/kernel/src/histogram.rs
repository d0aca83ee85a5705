//! A lock-free latency histogram with fixed buckets, for components that time their own work
//! (the WAL's fsync) and report it through the engine's stats; the service renders it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds in seconds, from 50 µs (a page-cache sync) to 2.5 s (a stalled disk).
const BOUNDS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5,
];

#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Per bucket (the last one is `+Inf`), not cumulative.
    buckets: [AtomicU64; BOUNDS.len() + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// A histogram as read at one moment, in Prometheus' shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, observations at or below it)`, cumulative, `+Inf` excluded.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl LatencyHistogram {
    pub fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0;
        let buckets = BOUNDS
            .iter()
            .zip(&self.buckets)
            .map(|(bound, n)| {
                running += n.load(Ordering::Relaxed);
                (*bound, running)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            count: self.count.load(Ordering::Relaxed),
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_cumulative_buckets() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_micros(30));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(5));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (0.00005, 1));
        assert_eq!(
            s.buckets.iter().find(|(b, _)| *b == 0.005).map(|x| x.1),
            Some(2)
        );
        assert_eq!(
            s.buckets.last().map(|x| x.1),
            Some(2),
            "5 s is only in +Inf"
        );
        assert!((s.sum_seconds - 5.00303).abs() < 1e-6);
    }
}
