//! Keeping E2B's own timeout equal to the sandbox's TTL. E2B kills a sandbox when its
//! timeout runs out, counted from create (or resume, or the last set-timeout); ours is a
//! fixed expiry stored in the sandbox's metadata (`forkyard.expires_unix_ms`). After the
//! create (whose clone takes a while) and at every resume, E2B is told the time left.

use super::E2bBackend;
use crate::backend::SandboxBackend;
use crate::error::{ProvisionerError, Result};
use forkyard_proto::sandbox::v1::DestroySandboxRequest;
use reqwest::Method;
use serde_json::json;

/// Whole seconds from `now_ms` to `expires_ms`, rounded up; 0 when already past.
pub(super) fn secs_left(expires_ms: i64, now_ms: i64) -> u64 {
    let left = expires_ms.saturating_sub(now_ms);
    if left <= 0 {
        0
    } else {
        u64::try_from(left).unwrap_or(u64::MAX).div_ceil(1000)
    }
}

impl E2bBackend {
    /// `POST /sandboxes/{id}/timeout` with the seconds left until `expires_ms`.
    pub(super) async fn set_timeout(&self, sid: &str, expires_ms: i64) -> Result<()> {
        let left = secs_left(expires_ms, crate::limits::now_ms()).max(1);
        let path = format!("/sandboxes/{sid}/timeout");
        self.api(
            Method::POST,
            &path,
            &[],
            Some(json!({"timeout": left})),
            "set sandbox timeout",
            sid,
        )
        .await?;
        Ok(())
    }

    /// The timeout a resume must ask for: the time left of the TTL. A paused sandbox
    /// does not time out on E2B, so one resumed past its TTL is destroyed instead.
    pub(super) async fn resume_timeout(&self, id: &str) -> Result<u64> {
        let s = self.get(id).await?;
        if s.expires_unix_ms == 0 {
            return Ok(self.config.default_timeout.as_secs());
        }
        match secs_left(s.expires_unix_ms, crate::limits::now_ms()) {
            0 => {
                self.destroy(DestroySandboxRequest {
                    sandbox_id: id.to_owned(),
                    reason: "ttl passed while stopped".into(),
                })
                .await?;
                Err(ProvisionerError::FailedPrecondition(format!(
                    "sandbox {id} passed its ttl while stopped and was destroyed"
                )))
            }
            left => Ok(left),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::secs_left;

    #[test]
    fn seconds_left_round_up_and_stop_at_zero() {
        assert_eq!(secs_left(10_000, 0), 10);
        assert_eq!(secs_left(10_001, 0), 11);
        assert_eq!(secs_left(5, 10), 0);
        assert_eq!(
            secs_left(i64::MAX, i64::MIN),
            (i64::MAX as u64).div_ceil(1000)
        );
    }
}
