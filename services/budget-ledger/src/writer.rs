//! Group commit: mutating calls queue up for a writer task that applies a batch of them
//! in one database transaction (each in its own savepoint, so one refused call posts
//! nothing and leaves the others alone) and commits once. Every caller gets its answer
//! only after that commit is durable, so a batch of N postings costs one log sync instead
//! of N. One writer task per process.

use crate::{accounts, db::Backend, error::LedgerError, reservations};
use forkyard_proto::budget::v1::{
    Account, ChargeRequest, CommitRequest, CreateAccountRequest, RaiseBudgetRequest,
    ReleaseRequest, Reservation, ReserveRequest,
};
use sqlx::{AnyConnection, AnyPool, Executor};
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};

/// Most calls in one transaction.
const MAX_BATCH: usize = 512;
/// Attempts of one call that hits a PostgreSQL deadlock, serialization failure or a
/// concurrent insert of the same key (the retry then replays).
const ATTEMPTS: usize = 5;

#[derive(Debug)]
pub(crate) enum Op {
    /// `OpenAccount` (its own key namespace and fingerprint) or `CreateAccount`.
    Create {
        req: CreateAccountRequest,
        op: &'static str,
        fp: String,
    },
    Raise(RaiseBudgetRequest),
    Reserve(ReserveRequest),
    Charge(ChargeRequest),
    Commit(CommitRequest),
    Release(ReleaseRequest),
}

#[derive(Debug)]
pub(crate) enum Reply {
    Account(Account),
    Reservation(Reservation),
}

type Job = (Op, oneshot::Sender<Result<Reply, LedgerError>>);

#[derive(Clone, Debug)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    pub(crate) fn spawn(pool: AnyPool, backend: Backend) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(8 * MAX_BATCH);
        let rx = Arc::new(Mutex::new(rx));
        // One writer per process: batches never wait on each other's row locks (several
        // writers deadlocked on PostgreSQL when two batches touched the same accounts in
        // opposite orders). Several processes still serialise on the row locks; a batch
        // that loses a deadlock there fails whole and its callers retry.
        tokio::spawn(run(pool, backend, rx));
        Self { tx }
    }

    pub(crate) async fn submit(&self, op: Op) -> Result<Reply, LedgerError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.tx
            .send((op, reply_tx))
            .await
            .map_err(|_| LedgerError::Unavailable("the ledger writer has stopped".into()))?;
        reply_rx
            .await
            .map_err(|_| LedgerError::Unavailable("the ledger writer dropped the call".into()))?
    }
}

async fn run(pool: AnyPool, backend: Backend, rx: Arc<Mutex<mpsc::Receiver<Job>>>) {
    loop {
        let batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch
        };
        run_batch(&pool, backend, batch).await;
    }
}

async fn run_batch(pool: &AnyPool, backend: Backend, batch: Vec<Job>) {
    let mut results = Vec::with_capacity(batch.len());
    let outcome: Result<(), sqlx::Error> = async {
        let mut conn = pool.acquire().await?;
        conn.execute(backend.begin_write()).await?;
        for (op, reply) in batch {
            let result = apply_in_savepoint(&mut conn, backend, &op).await;
            results.push((reply, result));
        }
        match conn.execute("COMMIT").await {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = conn.execute("ROLLBACK").await;
                Err(e)
            }
        }
    }
    .await;
    match outcome {
        Ok(()) => {
            for (reply, result) in results {
                let _ = reply.send(result);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "ledger batch failed; nothing of it was posted");
            for (reply, _) in results {
                let _ = reply.send(Err(LedgerError::Unavailable(format!(
                    "database error, nothing posted: {e}"
                ))));
            }
        }
    }
}

async fn apply_in_savepoint(
    conn: &mut AnyConnection,
    backend: Backend,
    op: &Op,
) -> Result<Reply, LedgerError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        conn.execute("SAVEPOINT op").await?;
        let result = apply(conn, backend, op).await;
        match result {
            Ok(reply) => {
                conn.execute("RELEASE SAVEPOINT op").await?;
                return Ok(reply);
            }
            Err(e) => {
                conn.execute("ROLLBACK TO SAVEPOINT op").await?;
                conn.execute("RELEASE SAVEPOINT op").await?;
                if attempt < ATTEMPTS && is_transient(&e) {
                    continue;
                }
                return Err(e);
            }
        }
    }
}

/// PostgreSQL errors that a fresh attempt of the same call resolves.
fn is_transient(e: &LedgerError) -> bool {
    match e {
        LedgerError::Database(sqlx::Error::Database(db)) => matches!(
            db.code().as_deref(),
            Some("40001") | Some("40P01") | Some("23505")
        ),
        _ => false,
    }
}

async fn apply(conn: &mut AnyConnection, backend: Backend, op: &Op) -> Result<Reply, LedgerError> {
    Ok(match op {
        Op::Create { req, op, fp } => {
            Reply::Account(accounts::create(conn, backend, req, op, fp).await?)
        }
        Op::Raise(req) => Reply::Account(accounts::raise_budget(conn, backend, req).await?),
        Op::Reserve(req) => Reply::Reservation(reservations::reserve(conn, backend, req).await?),
        Op::Charge(req) => Reply::Reservation(reservations::charge(conn, backend, req).await?),
        Op::Commit(req) => Reply::Reservation(reservations::commit(conn, backend, req).await?),
        Op::Release(req) => Reply::Reservation(reservations::release(conn, backend, req).await?),
    })
}
