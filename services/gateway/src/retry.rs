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
