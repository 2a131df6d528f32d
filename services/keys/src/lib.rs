//! The gateway's API key store (also used by `forkyard keys`). API keys: `fyk_<id>_<secret>`, stored as the SHA-256 of the whole key, in a SQLite file
//! (one gateway, the local stack) or PostgreSQL (replicas share it: the ledger's
//! database in production). Every call's key is looked up in the store, not cached, so a
//! revocation on one replica holds on all of them from their next call.
//!
//! The secret is 256 random bits from the OS, so a fast hash is enough: nothing short of
//! guessing 2^256 values finds a key from its hash (slow password hashes exist for
//! low-entropy human passwords). The id is stored in the clear so a lookup is one
//! indexed read and `keys list` / `keys revoke` can name a key without its secret.

#![forbid(unsafe_code)]

use sha2::{Digest, Sha256};
use sqlx::{AnyPool, Executor, Row, any::AnyPoolOptions};
use std::{
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

fn now_ms() -> i64 {
    // Not forkyard-common's clock: this crate stays free of the services' dependencies
    // (the CLI uses it).
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

const PREFIX: &str = "fyk_";
const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;
/// Tenant names go into visibility queries and ledger account ids: a closed alphabet.
pub const MAX_TENANT_LEN: usize = 63;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    Invalid(String),
    #[error("key {0} not found")]
    NotFound(String),
    #[error("api key store: {0}")]
    Store(#[from] sqlx::Error),
    #[error("random source: {0}")]
    Random(String),
}

/// A stored key, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyInfo {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub created_unix_ms: i64,
    /// 0 while the key is valid.
    pub revoked_unix_ms: i64,
}

/// A key just created: the only time its secret exists outside the caller's hands.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub info: KeyInfo,
    pub key: String,
}

#[derive(Clone, Debug)]
pub struct KeyStore {
    pool: AnyPool,
}

/// `[a-z0-9][a-z0-9-]{0,62}`: safe in queries, account ids and run ids.
pub fn check_tenant(tenant: &str) -> Result<(), KeyError> {
    let ok = !tenant.is_empty()
        && tenant.len() <= MAX_TENANT_LEN
        && tenant
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !tenant.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(KeyError::Invalid(format!(
            "tenant: {tenant:?} must be 1-{MAX_TENANT_LEN} characters of [a-z0-9-], not starting with '-'"
        )))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

fn random_hex(n: usize) -> Result<String, KeyError> {
    let mut buf = vec![0u8; n];
    getrandom::getrandom(&mut buf).map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(hex(&buf))
}

/// Equal-time comparison of two digests, so a timing difference says nothing about
/// how much of a guessed key's hash matched.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The id of a key-shaped string, `None` for anything else.
fn key_id(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hexy = |s: &str, n: usize| s.len() == n * 2 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hexy(id, ID_BYTES) && hexy(secret, SECRET_BYTES)).then_some(id)
}

fn info(row: &sqlx::any::AnyRow) -> Result<KeyInfo, sqlx::Error> {
    Ok(KeyInfo {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant")?,
        name: row.try_get("name")?,
        created_unix_ms: row.try_get("created_unix_ms")?,
        revoked_unix_ms: row
            .try_get::<Option<i64>, _>("revoked_unix_ms")?
            .unwrap_or(0),
    })
}

/// Only the owner reads the keys' hashes and tenants (no secret, but no need to share):
/// the file is created 0600 before SQLite opens it, so the `-wal` and `-shm` files
/// SQLite makes beside it (with the database's mode) are too, and files an earlier
/// version left readable (it narrowed the database alone, after its WAL was made) are
/// narrowed.
fn own_only(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            match std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o600)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

impl KeyStore {
    /// Open (creating if missing) the key file at `path` (SQLite).
    pub async fn open(path: &Path) -> Result<Self, KeyError> {
        let config = |e: std::io::Error, at: &Path| {
            KeyError::Store(sqlx::Error::Configuration(
                format!("{}: {e}", at.display()).into(),
            ))
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| config(e, dir))?;
        }
        own_only(path).map_err(|e| config(e, path))?;
        let path = path
            .to_str()
            .ok_or_else(|| KeyError::Invalid(format!("{}: not a UTF-8 path", path.display())))?;
        Self::connect(&format!("sqlite://{path}?mode=rwc")).await
    }

    /// Open the store at `url`: `sqlite://<file>` or `postgres://…` (where replicas
    /// share it), creating its table if missing.
    pub async fn connect(url: &str) -> Result<Self, KeyError> {
        sqlx::any::install_default_drivers();
        let sqlite = url.starts_with("sqlite:");
        if !sqlite && !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(KeyError::Invalid(
                "the api key store's url: sqlite://<file> or postgres://…".into(),
            ));
        }
        let opts = AnyPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10));
        let opts = if sqlite {
            opts.after_connect(|conn, _meta| {
                Box::pin(async move {
                    conn.execute("PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL;")
                        .await?;
                    Ok(())
                })
            })
        } else {
            opts
        };
        let pool = opts.connect(url).await?;
        // BIGINT: PostgreSQL's INTEGER is 32 bits (SQLite's are all 64).
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS api_keys (
               id TEXT PRIMARY KEY,
               tenant TEXT NOT NULL,
               sha256 TEXT NOT NULL,
               name TEXT NOT NULL DEFAULT '',
               created_unix_ms BIGINT NOT NULL,
               revoked_unix_ms BIGINT
             )",
        )
        .execute(&pool)
        .await?;
        Ok(Self { pool })
    }

    pub async fn create(&self, tenant: &str, name: &str) -> Result<NewKey, KeyError> {
        check_tenant(tenant)?;
        if name.len() > 200 || name.chars().any(char::is_control) {
            return Err(KeyError::Invalid(
                "name: at most 200 characters, no control characters".into(),
            ));
        }
        let id = random_hex(ID_BYTES)?;
        let key = format!("{PREFIX}{id}_{}", random_hex(SECRET_BYTES)?);
        let created = now_ms();
        sqlx::query(
            "INSERT INTO api_keys (id, tenant, sha256, name, created_unix_ms) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&id)
        .bind(tenant)
        .bind(digest(&key))
        .bind(name)
        .bind(created)
        .execute(&self.pool)
        .await?;
        Ok(NewKey {
            info: KeyInfo {
                id,
                tenant: tenant.to_owned(),
                name: name.to_owned(),
                created_unix_ms: created,
                revoked_unix_ms: 0,
            },
            key,
        })
    }

    pub async fn list(&self) -> Result<Vec<KeyInfo>, KeyError> {
        let rows = sqlx::query(
            "SELECT id, tenant, name, created_unix_ms, revoked_unix_ms FROM api_keys
             ORDER BY created_unix_ms, id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(info).collect::<Result<_, _>>()?)
    }

    /// Revoke by id; revoking a revoked key is a no-op that returns it.
    pub async fn revoke(&self, id: &str) -> Result<KeyInfo, KeyError> {
        sqlx::query(
            "UPDATE api_keys SET revoked_unix_ms = $1 WHERE id = $2 AND revoked_unix_ms IS NULL",
        )
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query(
            "SELECT id, tenant, name, created_unix_ms, revoked_unix_ms FROM api_keys WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| KeyError::NotFound(id.to_owned()))?;
        Ok(info(&row)?)
    }

    /// The tenant of a valid (known, not revoked) key; `None` for anything else.
    pub async fn verify(&self, key: &str) -> Result<Option<String>, KeyError> {
        let Some(id) = key_id(key) else {
            return Ok(None);
        };
        let row = sqlx::query(
            "SELECT tenant, sha256 FROM api_keys WHERE id = $1 AND revoked_unix_ms IS NULL",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|r| {
            let stored: String = r.try_get("sha256").ok()?;
            same(&stored, &digest(key)).then(|| r.try_get("tenant").ok())?
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_verify_until_revoked_and_are_stored_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.db");
        let store = KeyStore::open(&path).await.unwrap();
        let k = store.create("team-a", "ci").await.unwrap();
        assert!(k.key.starts_with("fyk_"), "{}", k.key);
        assert_eq!(
            store.verify(&k.key).await.unwrap().as_deref(),
            Some("team-a")
        );
        // A wrong secret with the right id, and junk, verify to nothing.
        let mut wrong = k.key.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert_eq!(store.verify(&wrong).await.unwrap(), None);
        assert_eq!(store.verify("Bearer x").await.unwrap(), None);
        assert_eq!(store.verify("").await.unwrap(), None);
        // The secret is nowhere in the file.
        drop(store);
        let store = KeyStore::open(&path).await.unwrap();
        let secret = k.key.rsplit('_').next().unwrap();
        for f in std::fs::read_dir(dir.path()).unwrap() {
            let bytes = std::fs::read(f.unwrap().path()).unwrap();
            assert!(!String::from_utf8_lossy(&bytes).contains(secret));
        }
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, k.info.id);
        let revoked = store.revoke(&k.info.id).await.unwrap();
        assert!(revoked.revoked_unix_ms > 0);
        assert_eq!(store.verify(&k.key).await.unwrap(), None);
        assert!(matches!(
            store.revoke("nope").await,
            Err(KeyError::NotFound(_))
        ));
    }

    /// The database and the `-wal` and `-shm` files beside it (where new keys land
    /// first) are their owner's only, under the usual umask of 022 too.
    #[cfg(unix)]
    #[tokio::test]
    async fn the_key_file_and_its_wal_are_their_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(&dir.path().join("keys.db")).await.unwrap();
        store.create("team-a", "ci").await.unwrap();
        for name in ["keys.db", "keys.db-wal", "keys.db-shm"] {
            let meta = std::fs::metadata(dir.path().join(name)).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
        }
    }

    /// Two gateway replicas on one PostgreSQL store (`make test-ledger-postgres` runs
    /// this with a throwaway server; without FORKYARD_TEST_POSTGRES_URL it has nothing to
    /// connect to and returns): a key made on one verifies on the other, and its
    /// revocation on one is refused by the other at its next lookup.
    #[tokio::test]
    async fn replicas_sharing_postgresql_see_keys_and_revocations_at_once() {
        let Ok(url) = std::env::var("FORKYARD_TEST_POSTGRES_URL") else {
            return;
        };
        let a = KeyStore::connect(&url).await.unwrap();
        let b = KeyStore::connect(&url).await.unwrap();
        let k = a.create("team-pg", "replicated").await.unwrap();
        assert_eq!(b.verify(&k.key).await.unwrap().as_deref(), Some("team-pg"));
        assert!(b.list().await.unwrap().iter().any(|i| i.id == k.info.id));
        let revoked = a.revoke(&k.info.id).await.unwrap();
        assert!(revoked.revoked_unix_ms > 1_700_000_000_000, "{revoked:?}");
        assert_eq!(b.verify(&k.key).await.unwrap(), None);
        assert_eq!(b.revoke(&k.info.id).await.unwrap(), revoked);
    }

    #[tokio::test]
    async fn a_store_url_of_another_kind_is_refused() {
        let e = KeyStore::connect("mysql://x/y").await.unwrap_err();
        assert!(e.to_string().contains("sqlite://"), "{e}");
    }

    #[tokio::test]
    async fn tenant_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(&dir.path().join("k.db")).await.unwrap();
        for bad in ["", "A", "a'b", "-x", &"x".repeat(64), "a b", "a.b"] {
            let err = store.create(bad, "").await.unwrap_err();
            assert!(err.to_string().starts_with("tenant:"), "{bad:?}: {err}");
        }
    }
}
