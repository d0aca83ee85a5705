//! Rate limits of the routes that do expensive work for whoever asks: sign-in (argon2id),
//! OAuth authorization (client metadata fetches) and tokens, queries, and key minting.
//!
//! Each limit is a GCRA allowance (`governor`) per client address or per credential, kept in
//! a bounded cache (`quick_cache`): the least recently seen keys are forgotten first, so a
//! flood of new addresses costs a fixed amount of memory (`rate_limits.tracked` keys per
//! limit). Past a limit the request gets 429 with `Retry-After`.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::config::RateLimitsConfig;
use crate::error::ApiError;

/// One limit: a per-minute allowance for each key.
pub struct Limiter {
    quota: Quota,
    clock: DefaultClock,
    keys: quick_cache::sync::Cache<String, Arc<DefaultDirectRateLimiter>>,
}

impl Limiter {
    pub fn new(per_minute: NonZeroU32, tracked: usize) -> Limiter {
        Limiter {
            quota: Quota::per_minute(per_minute),
            clock: DefaultClock::default(),
            keys: quick_cache::sync::Cache::new(tracked.max(1)),
        }
    }

    /// Takes one request from `key`'s allowance; past it, 429 with the wait in `Retry-After`.
    pub fn check(&self, key: &str) -> Result<(), ApiError> {
        let limiter = match self.keys.get(key) {
            Some(limiter) => limiter,
            None => {
                let limiter = Arc::new(RateLimiter::direct_with_clock(
                    self.quota,
                    self.clock.clone(),
                ));
                self.keys.insert(key.to_string(), Arc::clone(&limiter));
                limiter
            }
        };
        limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            ApiError::RateLimited {
                retry_after_secs: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
            }
        })
    }

    /// Keys remembered now (at most `tracked`).
    pub fn tracked(&self) -> usize {
        self.keys.len()
    }
}

/// Every rate limit of the service (`[rate_limits]`).
pub struct RateLimits {
    pub login_per_ip: Limiter,
    pub login_per_account: Limiter,
    pub authorize_per_ip: Limiter,
    pub token_per_ip: Limiter,
    pub query_per_key: Limiter,
    pub key_minting_per_key: Limiter,
}

impl RateLimits {
    pub fn new(c: &RateLimitsConfig) -> RateLimits {
        let tracked = c.tracked.get();
        RateLimits {
            login_per_ip: Limiter::new(c.login_per_ip, tracked),
            login_per_account: Limiter::new(c.login_per_account, tracked),
            authorize_per_ip: Limiter::new(c.authorize_per_ip, tracked),
            token_per_ip: Limiter::new(c.token_per_ip, tracked),
            query_per_key: Limiter::new(c.query_per_key, tracked),
            key_minting_per_key: Limiter::new(c.key_minting_per_key, tracked),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_past_its_allowance_waits_and_others_do_not() {
        let limiter = Limiter::new(NonZeroU32::new(3).expect("nonzero"), 100);
        for _ in 0..3 {
            assert!(limiter.check("1.2.3.4").is_ok());
        }
        match limiter.check("1.2.3.4") {
            Err(ApiError::RateLimited { retry_after_secs }) => {
                assert!((1..=20).contains(&retry_after_secs), "{retry_after_secs}")
            }
            other => panic!("expected a 429, got {other:?}"),
        }
        assert!(limiter.check("5.6.7.8").is_ok());
    }

    #[test]
    fn a_flood_of_new_keys_stays_within_what_is_tracked() {
        let limiter = Limiter::new(NonZeroU32::new(10).expect("nonzero"), 1000);
        for i in 0..20_000u32 {
            let _ = limiter.check(&format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255));
        }
        assert!(limiter.tracked() <= 1100, "{}", limiter.tracked());
    }
}
