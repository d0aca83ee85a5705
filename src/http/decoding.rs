//! Decoding public payloads within their limits without stalling the event loop.
//!
//! A body first decodes on the actix worker with a small output budget ([`INLINE_BUDGET`]):
//! nearly every SDK request fits and pays nothing more. A payload that grows past it is
//! decoded again, with its route's full limit, on the blocking pool — at most
//! `limits.max_concurrent_decodes` at once on this node; past that the request gets 503 with
//! `Retry-After`, so a burst of large or hostile payloads cannot hold more memory than
//! `max_concurrent_decodes × limit`. The decoders stop at the first byte past whichever limit
//! they are given (`corvid_kernel::wire`).

use std::sync::Arc;

use actix_web::web;
use tokio::sync::Semaphore;

use crate::error::ApiError;

/// Decoded bytes a payload may reach on the event loop before it moves to the blocking pool.
pub const INLINE_BUDGET: usize = 256 * 1024;

/// The node's bound on concurrent off-loop decodes.
#[derive(Clone)]
pub struct DecodePermits(Arc<Semaphore>);

impl DecodePermits {
    pub fn new(max_concurrent: usize) -> DecodePermits {
        DecodePermits(Arc::new(Semaphore::new(max_concurrent.max(1))))
    }

    /// Decodes free right now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// Runs `decode(limit)` inline with the budget; if its output passes the budget (`grew`
/// says so of an error), runs `decode(full_limit)` on the blocking pool under a permit.
pub async fn within_limits<T, E>(
    permits: &DecodePermits,
    full_limit: usize,
    decode: impl Fn(usize) -> Result<T, E> + Send + 'static,
    grew: impl Fn(&E) -> bool,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    let budget = INLINE_BUDGET.min(full_limit);
    match decode(budget) {
        Err(err) if budget < full_limit && grew(&err) => {}
        inline => return inline.map_err(Into::into),
    }
    let permit = Arc::clone(&permits.0)
        .try_acquire_owned()
        .map_err(|_| ApiError::Unavailable {
            detail: "Too many large payloads are being decoded right now; retry shortly.",
            retry_after_secs: 1,
        })?;
    web::block(move || {
        let _permit = permit;
        decode(full_limit)
    })
    .await?
    .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Grew;

    impl From<Grew> for ApiError {
        fn from(_: Grew) -> ApiError {
            ApiError::PayloadTooLarge { limit: 0 }
        }
    }

    /// A decoder whose output is `size` bytes: past its limit it "grows".
    fn decoder(size: usize) -> impl Fn(usize) -> Result<usize, Grew> + Send + 'static {
        move |limit| if size > limit { Err(Grew) } else { Ok(size) }
    }

    #[actix_web::test]
    async fn small_payloads_stay_inline_and_large_ones_wait_for_a_permit() {
        let permits = DecodePermits::new(1);
        let grew = |_: &Grew| true;
        assert_eq!(
            within_limits(&permits, 1 << 30, decoder(10), grew)
                .await
                .ok(),
            Some(10)
        );
        assert_eq!(
            within_limits(&permits, 1 << 30, decoder(INLINE_BUDGET + 1), grew)
                .await
                .ok(),
            Some(INLINE_BUDGET + 1),
            "decoded off the event loop"
        );
        // Every permit taken: a large payload is turned away with a retry hint.
        let held = Arc::clone(&permits.0)
            .try_acquire_owned()
            .expect("the only permit");
        match within_limits(&permits, 1 << 30, decoder(INLINE_BUDGET + 1), grew).await {
            Err(ApiError::Unavailable {
                retry_after_secs, ..
            }) => assert_eq!(retry_after_secs, 1),
            other => panic!("expected 503, got {:?}", other.map(|_| ())),
        }
        // A small one still decodes, and past the route's limit is the decoder's error.
        assert!(within_limits(&permits, 1 << 30, decoder(5), grew)
            .await
            .is_ok());
        assert!(matches!(
            within_limits(&permits, 100, decoder(200), grew).await,
            Err(ApiError::PayloadTooLarge { .. })
        ));
        drop(held);
    }
}
