//! Idempotency keys: each mutating call stores its key, the request's fingerprint and its
//! response in the transaction that posts its effect, so a replayed key returns exactly
//! what the first call returned and a key reused for other parameters is refused. Keys
//! are looked up in, and added to, the batch's [`WorkSet`] (loaded with the batch's keys,
//! so a key sent twice in one batch replays too).

use crate::{
    error::LedgerError,
    model,
    workset::{StoredKey, WorkSet},
};
use serde::{Serialize, de::DeserializeOwned};

/// The request as canonical JSON (fixed field order); callers blank the idempotency key
/// first and give maps a fixed order.
pub(crate) fn fingerprint<T: Serialize>(req: &T) -> Result<String, LedgerError> {
    serde_json::to_string(req)
        .map_err(|e| LedgerError::Corrupt(format!("cannot encode request: {e}")))
}

/// The stored response of an earlier call with this key, or `None` if the key is new.
pub(crate) fn replay<R: DeserializeOwned>(
    ws: &WorkSet,
    operation: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Option<R>, LedgerError> {
    let Some(stored) = ws.key(key) else {
        return Ok(None);
    };
    if stored.operation != operation || stored.fingerprint != fingerprint {
        return Err(LedgerError::KeyReused {
            key: key.to_owned(),
            operation: stored.operation.clone(),
        });
    }
    let resp = serde_json::from_str(&stored.response)
        .map_err(|e| LedgerError::Corrupt(format!("stored response for key {key:?}: {e}")))?;
    Ok(Some(resp))
}

/// Store the key with its response, in the batch's transaction.
pub(crate) fn remember<R: Serialize>(
    ws: &mut WorkSet,
    operation: &str,
    key: &str,
    fingerprint: &str,
    response: &R,
) -> Result<(), LedgerError> {
    let response = serde_json::to_string(response)
        .map_err(|e| LedgerError::Corrupt(format!("cannot encode response: {e}")))?;
    ws.put_key(
        key.to_owned(),
        StoredKey {
            operation: operation.to_owned(),
            fingerprint: fingerprint.to_owned(),
            response,
            created_unix_ms: model::now_ms(),
        },
    );
    Ok(())
}
