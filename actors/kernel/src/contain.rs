//! Keeping one failing item of a background job from stopping the job: panics become errors
//! ([`contain`]), and items that keep failing wait longer and longer ([`Backoff`]).

use std::any::Any;
use std::collections::HashMap;
use std::hash::Hash;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// What a panic said, for the log and the item's recorded error.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        return (*text).to_string();
    }
    if let Some(text) = payload.downcast_ref::<String>() {
        return text.clone();
    }
    "a panic without a message".to_string()
}

/// Runs one item of background work; its error, or a panic, comes back as text. The work's
/// state is whatever it left behind: callers only use this where an item's failure leaves
/// shared state consistent (each item is written in one store call, or not at all).
pub fn contain<T, E: std::fmt::Display>(work: impl FnOnce() -> Result<T, E>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(err.to_string()),
        Err(panic) => Err(format!("panicked: {}", panic_message(&*panic))),
    }
}

/// Per-item retry waits of a background job: after an item's `n`-th failure in a row it is
/// skipped for `base × 2^(n-1)`, at most `max`; a success forgets it. Holds one entry per
/// failing item (items are the job's own: projects, endpoints), never per request.
#[derive(Debug)]
pub struct Backoff<K> {
    base: Duration,
    max: Duration,
    failing: HashMap<K, (u32, Instant)>,
}

impl<K: Hash + Eq> Backoff<K> {
    pub fn new(base: Duration, max: Duration) -> Backoff<K> {
        Backoff {
            base,
            max,
            failing: HashMap::new(),
        }
    }

    /// Whether `item` may be tried at `now`.
    pub fn ready(&self, item: &K, now: Instant) -> bool {
        self.failing.get(item).is_none_or(|(_, at)| *at <= now)
    }

    /// Records a failure; returns how long `item` now waits.
    pub fn failed(&mut self, item: K, now: Instant) -> Duration {
        let entry = self.failing.entry(item).or_insert((0, now));
        entry.0 = entry.0.saturating_add(1);
        let doublings = entry.0.saturating_sub(1).min(16);
        let wait = self.base.saturating_mul(1 << doublings).min(self.max);
        entry.1 = now.checked_add(wait).unwrap_or(now);
        wait
    }

    pub fn succeeded(&mut self, item: &K) {
        self.failing.remove(item);
    }

    /// Failures in a row of `item`.
    pub fn failures(&self, item: &K) -> u32 {
        self.failing.get(item).map_or(0, |(n, _)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_and_errors_come_back_as_text() {
        assert_eq!(contain(|| Ok::<_, String>(3)), Ok(3));
        assert_eq!(contain(|| Err::<(), _>("no")), Err("no".to_string()));
        let caught = contain(|| -> Result<(), String> { panic!("boom {}", 7) });
        assert_eq!(caught, Err("panicked: boom 7".to_string()));
    }

    #[test]
    fn waits_double_up_to_the_cap_and_reset_on_success() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let now = Instant::now();
        assert!(b.ready(&"p", now));
        assert_eq!(b.failed("p", now), Duration::from_secs(1));
        assert_eq!(b.failed("p", now), Duration::from_secs(2));
        assert_eq!(b.failed("p", now), Duration::from_secs(4));
        assert_eq!(b.failed("p", now), Duration::from_secs(5));
        assert!(!b.ready(&"p", now));
        assert!(b.ready(&"q", now), "other items go on");
        assert!(b.ready(&"p", now + Duration::from_secs(5)));
        b.succeeded(&"p");
        assert_eq!(b.failures(&"p"), 0);
    }
}
