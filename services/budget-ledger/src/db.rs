//! Connecting to the ledger database (SQLite or PostgreSQL through `sqlx::Any`), applying
//! the migrations, and the few statements that differ between the two.

use crate::error::LedgerError;
use sqlx::{AnyPool, Executor, any::AnyPoolOptions, migrate::Migrator};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// The schema, embedded from `services/budget-ledger/migrations/` (portable SQL).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a SQLite writer waits for another process's lock before failing with "busy".
const BUSY_TIMEOUT_MS: u64 = 15_000;

/// Which database the pool talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn from_url(url: &str) -> Result<Self, LedgerError> {
        if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Self::Postgres)
        } else {
            Err(LedgerError::invalid(
                "database_url",
                format!("{url:?}: only sqlite: and postgres: URLs are supported"),
            ))
        }
    }

    /// Starts a write transaction. SQLite takes the database write lock up front, so a
    /// batch never fails half way with "busy"; PostgreSQL locks rows as it goes.
    pub(crate) fn begin_write(self) -> &'static str {
        match self {
            Self::Sqlite => "BEGIN IMMEDIATE",
            Self::Postgres => "BEGIN",
        }
    }

    /// Whether a write transaction locks the rows it reads (PostgreSQL) rather than the
    /// whole database up front (SQLite).
    pub(crate) fn locks_rows(self) -> bool {
        self == Self::Postgres
    }

    /// Appends bind parameter `n` (1-based): `$n` on PostgreSQL, an anonymous `?` on
    /// SQLite, which binds those in order (it looks named ones up by a linear scan, so a
    /// statement with many `$n` costs quadratic time to bind).
    pub(crate) fn push_param(self, sql: &mut String, n: usize) {
        match self {
            Self::Sqlite => sql.push('?'),
            Self::Postgres => {
                sql.push('$');
                sql.push_str(&n.to_string());
            }
        }
    }

    /// Settings of the writer's own connection: on SQLite, a page cache big enough for the
    /// pages a batch of random accounts touches (the default 2 MiB makes every batch re-read
    /// its index pages), and checkpoints every 64 MiB of log rather than every 4 MiB (a
    /// checkpoint copies each page once however often it changed since the last one).
    /// Durability is unchanged: every commit still syncs the log (`synchronous = FULL`).
    pub(crate) fn writer_setup(self) -> Option<&'static str> {
        match self {
            Self::Sqlite => Some("PRAGMA cache_size = -65536; PRAGMA wal_autocheckpoint = 16384"),
            Self::Postgres => None,
        }
    }

    /// Suffix of a `SELECT` on `accounts` that locks the rows until the transaction ends
    /// (SQLite already holds the whole database).
    pub(crate) fn lock_rows(self) -> &'static str {
        match self {
            Self::Sqlite => "",
            Self::Postgres => " FOR UPDATE",
        }
    }
}

/// A migrated pool for `url` (`sqlite://…` or `postgres://…`).
pub async fn connect(url: &str) -> Result<(AnyPool, Backend), LedgerError> {
    sqlx::any::install_default_drivers();
    let backend = Backend::from_url(url)?;
    // Every fork's spending: its owner's only, the -wal and -shm files with it.
    if let Some(file) = sqlite_file(url) {
        forkyard_common::private_files::private_sqlite_file(&file).map_err(|e| {
            sqlx::Error::Io(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", file.display()),
            ))
        })?;
    }
    let url = match backend {
        Backend::Sqlite if !url.contains("mode=") => {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}mode=rwc")
        }
        _ => url.to_owned(),
    };
    let opts = AnyPoolOptions::new()
        .acquire_timeout(Duration::from_secs(30))
        .max_connections(match backend {
            Backend::Sqlite => 8,
            Backend::Postgres => 16,
        });
    let opts = if backend == Backend::Sqlite {
        // Durable commits: WAL with a sync of the log on every commit.
        opts.after_connect(|conn, _meta| {
            Box::pin(async move {
                conn.execute(
                    format!(
                        "PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}; PRAGMA journal_mode = WAL; \
                         PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;"
                    )
                    .as_str(),
                )
                .await?;
                Ok(())
            })
        })
    } else {
        opts
    };
    let pool = opts.connect(&url).await?;
    MIGRATOR.run(&pool).await?;
    Ok((pool, backend))
}

/// The file a `sqlite:` URL names (none for an in-memory database).
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next()?;
    (!path.is_empty() && !path.starts_with(":memory:")).then(|| PathBuf::from(path))
}

/// The `sqlite://` URL of a file.
pub fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}
