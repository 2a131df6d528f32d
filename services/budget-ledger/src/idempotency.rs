//! Idempotency keys: each mutating call stores its key, the request's fingerprint and its
//! response in the transaction that posts its effect, so a replayed key returns exactly
//! what the first call returned and a key reused for other parameters is refused.

use crate::{error::LedgerError, model};
use serde::{Serialize, de::DeserializeOwned};
use sqlx::{AnyConnection, Row};

/// The request as canonical JSON (fixed field order); callers blank the idempotency key
/// first and give maps a fixed order.
pub(crate) fn fingerprint<T: Serialize>(req: &T) -> Result<String, LedgerError> {
    serde_json::to_string(req)
        .map_err(|e| LedgerError::Corrupt(format!("cannot encode request: {e}")))
}

/// The stored response of an earlier call with this key, or `None` if the key is new.
pub(crate) async fn replay<R: DeserializeOwned>(
    conn: &mut AnyConnection,
    operation: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Option<R>, LedgerError> {
    let Some(row) = sqlx::query(
        "SELECT operation, fingerprint, response FROM idempotency_keys WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let stored_op: String = row.try_get("operation")?;
    let stored_fp: String = row.try_get("fingerprint")?;
    if stored_op != operation || stored_fp != fingerprint {
        return Err(LedgerError::KeyReused {
            key: key.to_owned(),
            operation: stored_op,
        });
    }
    let response: String = row.try_get("response")?;
    let resp = serde_json::from_str(&response)
        .map_err(|e| LedgerError::Corrupt(format!("stored response for key {key:?}: {e}")))?;
    Ok(Some(resp))
}

/// Store the key with its response, in the caller's transaction.
pub(crate) async fn remember<R: Serialize>(
    conn: &mut AnyConnection,
    operation: &str,
    key: &str,
    fingerprint: &str,
    response: &R,
) -> Result<(), LedgerError> {
    let response = serde_json::to_string(response)
        .map_err(|e| LedgerError::Corrupt(format!("cannot encode response: {e}")))?;
    sqlx::query(
        "INSERT INTO idempotency_keys (idempotency_key, operation, fingerprint, response, created_unix_ms) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(key)
    .bind(operation)
    .bind(fingerprint)
    .bind(response)
    .bind(model::now_ms())
    .execute(&mut *conn)
    .await?;
    Ok(())
}
