//! Retries of the gateway's own calls to the mesh (inside its activities), by the fork
//! steps' one table (`crate::lifecycle::tries`), which the child workflow's local
//! activities take as their Temporal retry policies.

use crate::lifecycle::tries::Tries;
use std::future::Future;
use tonic::Status;

/// `call` until it answers, it fails for good, its attempts are used or its time is up
/// (as `tries` says), waiting between tries as `tries` says, each wait jittered up to
/// twice its step.
pub(crate) async fn retried<T, F, Fut>(
    tries: Tries,
    final_error: impl Fn(&Status) -> bool,
    mut call: F,
) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let until = tries.within.map(|w| tokio::time::Instant::now() + w);
    // Jittered: a batch of forks whose provisioner restarted must not retry in step.
    let mut waits = forkyard_common::backoff::doubling(tries.first, tries.longest);
    let mut wait = waits.next().unwrap_or(tries.first);
    let mut attempt = 1;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(s) if final_error(&s) => return Err(s),
            Err(s) if tries.attempts > 0 && attempt >= tries.attempts => return Err(s),
            Err(s) if until.is_some_and(|u| tokio::time::Instant::now() + wait > u) => {
                return Err(s);
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = waits.next().unwrap_or(wait);
                attempt += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        sync::atomic::{AtomicU32, Ordering},
        time::Duration,
    };

    /// Milliseconds stand for the cleanup's seconds: the count of tries is what is checked.
    async fn tries_until(final_error: impl Fn(&Status) -> bool, status: Status) -> u32 {
        let count = AtomicU32::new(0);
        let tries = Tries {
            first: Duration::from_millis(2),
            longest: Some(Duration::from_millis(30)),
            within: Some(Duration::from_millis(300)),
            ..crate::lifecycle::tries::DESTROY
        };
        let out: Result<(), Status> = retried(tries, final_error, || {
            count.fetch_add(1, Ordering::Relaxed);
            let status = status.clone();
            async move { Err(status) }
        })
        .await;
        assert!(out.is_err());
        count.load(Ordering::Relaxed)
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
