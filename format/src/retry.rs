//! Retrying storage calls: transient failures (5xx, 429/SlowDown, timeouts,
//! connection resets) are retried with exponential backoff and full jitter,
//! bounded in count and in time; permanent ones (not found, 403, bad
//! credentials, invalid requests) fail at once.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::permute::hash_words;

/// How storage calls are retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// No retry starts after this much time since the first attempt.
    pub timeout: Duration,
    /// Backoff before the first retry (doubled each time).
    pub initial_backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
}

/// Environment variable overriding the default number of retries.
pub const MAX_RETRIES_ENV: &str = "SHARDFEED_MAX_RETRIES";

impl Default for RetryPolicy {
    /// 8 retries (or `$SHARDFEED_MAX_RETRIES`) within 30 s, backing off
    /// exponentially from 50 ms to 2 s with jitter.
    fn default() -> Self {
        let max_retries = std::env::var(MAX_RETRIES_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(8);
        RetryPolicy {
            max_retries,
            timeout: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// Whether `error` may go away by itself.
pub fn is_transient(error: &object_store::Error) -> bool {
    use object_store::Error::*;
    !matches!(
        error,
        NotFound { .. }
            | PermissionDenied { .. }
            | Unauthenticated { .. }
            | InvalidPath { .. }
            | NotSupported { .. }
            | NotImplemented { .. }
            | Precondition { .. }
            | AlreadyExists { .. }
            | NotModified { .. }
            | UnknownConfigurationKey { .. }
    )
}

impl RetryPolicy {
    /// The backoff before retry `attempt` (1-based): exponential, with full jitter
    /// (uniform in its upper half) so that many clients do not retry in step.
    pub fn backoff(&self, attempt: u32, salt: u64) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << attempt.min(20).saturating_sub(1));
        let cap = exp.min(self.max_backoff);
        let unit = (hash_words(&[salt, attempt as u64]) >> 11) as f64 / (1u64 << 53) as f64;
        cap.mul_f64(0.5 + 0.5 * unit)
    }

    /// Run `op` until it succeeds, fails permanently, or the policy runs out;
    /// `on_retry` is called before each retry.
    pub async fn run<T, F, Fut>(&self, op: F, mut on_retry: impl FnMut()) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        self.run_while(op, is_transient, true, |_| on_retry()).await
    }

    /// [`RetryPolicy::run`] for any operation: `op` is run again while
    /// `again` says its error may go away, up to the retry count, and, when
    /// `timed`, only within the policy's time (an operation that may take
    /// long by itself, a whole upload, passes `false`).
    pub async fn run_while<T, E, F, Fut>(
        &self,
        mut op: F,
        again: impl Fn(&E) -> bool,
        timed: bool,
        mut on_retry: impl FnMut(&E),
    ) -> Result<T, E>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        let salt = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut attempt = 0;
        loop {
            match op().await {
                Ok(value) => return Ok(value),
                Err(e)
                    if again(&e)
                        && attempt < self.max_retries
                        && (!timed || started.elapsed() < self.timeout) =>
                {
                    attempt += 1;
                    // The store's message may quote the request's URL (a SAS
                    // token, a presigned signature): redacted.
                    tracing::info!(
                        attempt,
                        error = %crate::redact::text(&e.to_string()),
                        "retrying a storage request after a transient error"
                    );
                    on_retry(&e);
                    tokio::time::sleep(self.backoff(attempt, salt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_jittered_and_capped() {
        let p = RetryPolicy::default();
        let b1 = p.backoff(1, 7);
        assert!(
            b1 >= Duration::from_millis(25) && b1 <= Duration::from_millis(50),
            "{b1:?}"
        );
        let b3 = p.backoff(3, 7);
        assert!(
            b3 >= Duration::from_millis(100) && b3 <= Duration::from_millis(200),
            "{b3:?}"
        );
        assert!(p.backoff(30, 7) <= p.max_backoff);
        assert_ne!(p.backoff(2, 1), p.backoff(2, 2));
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let denied = object_store::Error::PermissionDenied {
            path: "x".into(),
            source: "403".into(),
        };
        assert!(!is_transient(&denied));
        let generic = object_store::Error::Generic {
            store: "S3",
            source: "503 SlowDown".into(),
        };
        assert!(is_transient(&generic));
    }
}
