//! Group commit: mutating calls queue up for a writer task that applies a batch of them
//! in one database transaction on its own connection and commits once. The batch's rows
//! are read in a few statements ([`crate::load`]), the calls are applied in memory one
//! after the other (a refused call is undone and posts nothing; see [`WorkSet`]), and
//! what they wrote goes out as a few multi-row statements ([`crate::flush`]). Every
//! caller gets its answer only after that commit is durable, so a batch of N postings
//! costs one log sync instead of N. One writer task per process.

use crate::{
    accounts,
    db::Backend,
    error::LedgerError,
    flush,
    load::{self, Wants},
    reservations,
    workset::WorkSet,
};
use forkyard_proto::budget::v1::{
    Account, ChargeRequest, CommitRequest, CreateAccountRequest, RaiseBudgetRequest,
    ReleaseRequest, Reservation, ReserveRequest,
};
use sqlx::{AnyConnection, AnyPool, Connection, Executor};
use tokio::sync::{mpsc, oneshot};

/// Most calls in one transaction.
const MAX_BATCH: usize = 512;
/// Transactions of one call that hits a PostgreSQL deadlock, serialization failure or a
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

impl Op {
    /// Adds the key, accounts and reservation this call reads.
    fn wants(&self, w: &mut Wants) {
        let (key, account, rsv) = match self {
            Op::Create { req, .. } => {
                if !req.parent_account_id.is_empty() {
                    w.accounts.insert(req.parent_account_id.clone());
                }
                (&req.idempotency_key, Some(&req.account_id), None)
            }
            Op::Raise(r) => (&r.idempotency_key, Some(&r.account_id), None),
            Op::Reserve(r) => (&r.idempotency_key, Some(&r.account_id), None),
            Op::Charge(r) => (&r.idempotency_key, None, Some(&r.reservation_id)),
            Op::Commit(r) => (&r.idempotency_key, None, Some(&r.reservation_id)),
            Op::Release(r) => (&r.idempotency_key, None, Some(&r.reservation_id)),
        };
        w.keys.insert(key.clone());
        w.accounts.extend(account.cloned());
        w.reservations.extend(rsv.cloned());
    }

    fn apply(&self, ws: &mut WorkSet) -> Result<Reply, LedgerError> {
        Ok(match self {
            Op::Create { req, op, fp } => Reply::Account(accounts::create(ws, req, op, fp)?),
            Op::Raise(req) => Reply::Account(accounts::raise_budget(ws, req)?),
            Op::Reserve(req) => Reply::Reservation(reservations::reserve(ws, req)?),
            Op::Charge(req) => Reply::Reservation(reservations::charge(ws, req)?),
            Op::Commit(req) => Reply::Reservation(reservations::commit(ws, req)?),
            Op::Release(req) => Reply::Reservation(reservations::release(ws, req)?),
        })
    }
}

#[derive(Debug)]
pub(crate) enum Reply {
    Account(Account),
    Reservation(Reservation),
}

type Answer = Result<Reply, LedgerError>;
type Job = (Op, oneshot::Sender<Answer>);

#[derive(Clone, Debug)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    pub(crate) fn spawn(pool: AnyPool, backend: Backend) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(8 * MAX_BATCH);
        // One writer per process: batches never wait on each other's row locks. Several
        // processes serialise on the database lock (SQLite) or on row locks taken in
        // account order (PostgreSQL); a batch that fails there is retried call by call.
        let session = Session {
            pool,
            backend,
            conn: None,
        };
        tokio::spawn(run(session, rx));
        Self { tx }
    }

    pub(crate) async fn submit(&self, op: Op) -> Answer {
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

/// The writer's own connection (taken out of the pool, so its prepared statements stay
/// cached from batch to batch), reopened after an error.
struct Session {
    pool: AnyPool,
    backend: Backend,
    conn: Option<AnyConnection>,
}

async fn run(mut session: Session, mut rx: mpsc::Receiver<Job>) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let (ops, replies): (Vec<Op>, Vec<_>) = jobs.into_iter().unzip();
        if session.pool.is_closed() {
            // The pool was closed (shutdown): stop writing.
            for reply in replies {
                let _ = reply.send(Err(LedgerError::Unavailable(
                    "the ledger database is closed".into(),
                )));
            }
            if let Some(conn) = session.conn.take() {
                let _ = conn.close().await;
            }
            return;
        }
        let answers = session.settle(&ops).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }
}

impl Session {
    /// The answers of `ops`, in one transaction; if that fails as a whole, call by call.
    async fn settle(&mut self, ops: &[Op]) -> Vec<Answer> {
        match self.transaction(ops).await {
            Ok(answers) => answers,
            Err(e) if ops.len() > 1 => {
                tracing::warn!(error = %e, calls = ops.len(),
                    "ledger batch failed; nothing of it was posted; retrying call by call");
                let mut answers = Vec::with_capacity(ops.len());
                for op in ops {
                    answers.push(self.settle_one(op).await);
                }
                answers
            }
            Err(e) => vec![self.retry_one(&ops[0], e).await],
        }
    }

    async fn settle_one(&mut self, op: &Op) -> Answer {
        match self.transaction(std::slice::from_ref(op)).await {
            Ok(mut answers) => answers.pop().unwrap_or_else(|| {
                Err(LedgerError::Corrupt("a transaction lost its answer".into()))
            }),
            Err(e) => self.retry_one(op, e).await,
        }
    }

    /// Retries one call whose transaction failed with `e` while that is transient.
    async fn retry_one(&mut self, op: &Op, mut e: LedgerError) -> Answer {
        for _ in 1..ATTEMPTS {
            if !is_transient(&e) {
                break;
            }
            match self.transaction(std::slice::from_ref(op)).await {
                Ok(mut answers) => {
                    return answers.pop().unwrap_or_else(|| {
                        Err(LedgerError::Corrupt("a transaction lost its answer".into()))
                    });
                }
                Err(again) => e = again,
            }
        }
        Err(e)
    }

    /// Applies `ops` in one write transaction and commits: the answer of each call, or
    /// the error that rolled back all of them.
    async fn transaction(&mut self, ops: &[Op]) -> Result<Vec<Answer>, LedgerError> {
        let backend = self.backend;
        let conn = match &mut self.conn {
            Some(conn) => conn,
            slot => {
                let mut conn = self.pool.acquire().await?.detach();
                if let Some(setup) = backend.writer_setup() {
                    conn.execute(setup).await?;
                }
                slot.insert(conn)
            }
        };
        if let Err(e) = conn.execute(backend.begin_write()).await {
            // A broken connection (the database restarted, the network dropped it): keep
            // it and every later write fails the same way; open another next time.
            self.conn = None;
            return Err(e.into());
        }
        let result = async {
            let mut wants = Wants::default();
            ops.iter().for_each(|op| op.wants(&mut wants));
            let mut ws = load::load(conn, backend, wants).await?;
            let answers: Vec<Answer> = ops
                .iter()
                .map(|op| {
                    ws.begin_call();
                    let answer = op.apply(&mut ws);
                    if answer.is_err() {
                        ws.undo_call();
                    }
                    answer
                })
                .collect();
            flush::flush(conn, backend, &ws).await?;
            conn.execute("COMMIT").await.map_err(|e| {
                LedgerError::Unavailable(format!("database error, nothing posted: {e}"))
            })?;
            Ok(answers)
        }
        .await;
        if result.is_err() && conn.execute("ROLLBACK").await.is_err() {
            // Unusable connection (or no transaction left): open another next time.
            self.conn = None;
        }
        result
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
