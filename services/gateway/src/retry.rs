//! Retries of the gateway's own calls to the mesh (inside its activities), with the
//! child workflow's retry tables.

use std::{future::Future, time::Duration};
use tonic::Status;

/// `call` until it answers, it fails for good, or `attempts` are used, waiting
/// `initial` and then twice as long between tries.
pub(crate) async fn retried<T, F, Fut>(
    attempts: u32,
    initial: Duration,
    final_error: impl Fn(&Status) -> bool,
    mut call: F,
) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let mut wait = initial;
    let mut attempt = 1;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(s) if attempt >= attempts || final_error(&s) => return Err(s),
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
                attempt += 1;
            }
        }
    }
}

/// `call` until it answers, it fails for good, or `deadline` has passed since the first
/// try, waiting `initial`, then twice as long each time up to `longest`, between tries.
/// For cleanup that must outlast an outage of its service (a destroy after a cancel).
pub(crate) async fn retried_within<T, F, Fut>(
    deadline: Duration,
    initial: Duration,
    longest: Duration,
    final_error: impl Fn(&Status) -> bool,
    mut call: F,
) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let until = tokio::time::Instant::now() + deadline;
    let mut wait = initial;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(s) if final_error(&s) || tokio::time::Instant::now() + wait > until => {
                return Err(s);
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(longest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Milliseconds stand for the cleanup's seconds: the count of tries is what is checked.
    async fn tries_until(final_error: impl Fn(&Status) -> bool, status: Status) -> u32 {
        let tries = AtomicU32::new(0);
        let out: Result<(), Status> = retried_within(
            Duration::from_millis(300),
            Duration::from_millis(2),
            Duration::from_millis(30),
            final_error,
            || {
                tries.fetch_add(1, Ordering::Relaxed);
                let status = status.clone();
                async move { Err(status) }
            },
        )
        .await;
        assert!(out.is_err());
        tries.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn a_cleanup_is_tried_until_its_deadline_not_three_times() {
        // 2, 4, 8, 16, then every 30 (ms here): about a dozen tries within 300.
        let unavailable = Status::unavailable("tcp connect error");
        let n = tries_until(|_| false, unavailable).await;
        assert!(n >= 8, "{n} tries");
        // An answer that cannot change ends it at once.
        let bad = Status::invalid_argument("bad id");
        assert_eq!(
            tries_until(|s| s.code() == tonic::Code::InvalidArgument, bad).await,
            1
        );
    }
}
