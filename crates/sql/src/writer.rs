//! The one thread that writes the database: it runs the leader's client transactions, one at
//! a time as the engine allows, and applies the log's transactions in log order.
//!
//! A leader executes a client's transaction and commits it locally at once (no fsync: the log
//! is the durability), then proposes it and goes on with the next one while the log commits it
//! — the write lock is never held across a log round trip. The client hears COMMIT only once
//! the transaction is applied from the log. Each transaction names the one it was executed
//! after; a replica applies it only if that is the last one it applied, and voids it
//! otherwise (see `Txn::after`), so a transaction never lands on a state its client did not see.
//! A leader whose executed-ahead transactions did not reach the log that way has a database
//! the log does not describe: it reports itself diverged and its node rebuilds from the log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chorus_log::node::Pending;
use chorus_log::NodeError;
use tokio::sync::{mpsc as async_mpsc, oneshot, watch};

use crate::engine::{AppliedMark, Engine, Outcome};
use crate::error::SqlError;
use crate::text::{classify, fix_writes, FixedClock, StatementKind};
use crate::txn::{Statement, Txn, TxnId, Value};

/// What applying a transaction from the log did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Committed,
    /// It was executed on a state the log did not reach: it changed nothing anywhere.
    Void,
}

/// How a client's COMMIT ended on the writer.
#[derive(Debug)]
pub enum Committed {
    /// Nothing to replicate (no statement changed anything, or the transaction had failed and
    /// was rolled back).
    Nothing { rolled_back: bool },
    /// Committed locally and queued for the log (in commit order); resolves once proposed.
    Ahead(oneshot::Receiver<Result<Pending<Applied>, NodeError>>),
}

pub(crate) enum Job {
    Begin {
        session: u64,
        reply: oneshot::Sender<Result<(), SqlError>>,
    },
    Execute {
        session: u64,
        sql: String,
        params: Vec<Value>,
        reply: oneshot::Sender<Result<Outcome, SqlError>>,
    },
    Commit {
        session: u64,
        reply: oneshot::Sender<Result<Committed, SqlError>>,
    },
    /// Also sent when a session ends inside a transaction.
    Rollback { session: u64 },
    Apply {
        index: u64,
        txn: Txn,
        reply: mpsc::Sender<Applied>,
    },
    /// Whether this node leads and has applied what earlier leaders committed.
    Leading(bool),
}

/// How far the writer's local commits and the log's applies are, for reads that must not
/// answer with a transaction the log does not have yet.
#[derive(Debug)]
pub struct Progress {
    /// Transactions committed locally ahead of the log, counted since start.
    executed: AtomicU64,
    /// Of those, how many the log has applied.
    confirmed: watch::Sender<u64>,
}

impl Progress {
    pub fn executed(&self) -> u64 {
        self.executed.load(Ordering::Acquire)
    }

    /// Waits until the log has applied every transaction counted in `executed`.
    pub async fn confirmed(&self, executed: u64) {
        let mut rx = self.confirmed.subscribe();
        // The sender lives as long as `self`.
        let _ = rx.wait_for(|&confirmed| confirmed >= executed).await;
    }
}

/// Sends jobs to the writer thread.
#[derive(Clone)]
pub struct WriterHandle {
    jobs: mpsc::Sender<Job>,
    pub progress: Arc<Progress>,
}

impl WriterHandle {
    pub(crate) fn send(&self, job: Job) {
        // The writer thread outlives every handle but at process exit.
        let _ = self.jobs.send(job);
    }

    pub(crate) async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Job) -> Result<T, SqlError> {
        let (reply, answer) = oneshot::channel();
        self.send(make(reply));
        answer
            .await
            .map_err(|_| SqlError::unavailable("the database writer stopped"))
    }

    /// Applies a transaction from the log; blocks until done (the raft loop applies in order).
    pub fn apply(&self, index: u64, txn: Txn) -> Applied {
        let (reply, answer) = mpsc::channel();
        self.send(Job::Apply { index, txn, reply });
        answer.recv().expect("the database writer answers every apply")
    }
}

/// A transaction committed ahead, for the proposer, and where to say it was proposed.
pub type Proposal = (Txn, oneshot::Sender<Result<Pending<Applied>, NodeError>>);

/// Settings of the writer.
pub struct WriterOptions {
    /// How long a transaction waits for another session's to end before giving up.
    pub lock_wait: Duration,
    /// Called once, from the writer thread, when the database no longer matches the log.
    pub on_diverged: Box<dyn FnOnce() + Send>,
}

/// A session waiting for the write lock: its id, where to say it has it, and until when.
type Waiting = (u64, oneshot::Sender<Result<(), SqlError>>, Instant);

struct Active {
    session: u64,
    clock: FixedClock,
    seed: u64,
    statements: Vec<Statement>,
    failed: bool,
}

struct Writer<E: Engine> {
    engine: E,
    incarnation: u64,
    next_seq: u64,
    leading: bool,
    active: Option<Active>,
    waiting: VecDeque<Waiting>,
    /// The last transaction committed locally: the next one is executed after it.
    executed: TxnId,
    applied: AppliedMark,
    /// The last command handed to `apply`: (log index, position in its entry).
    last_apply: Option<(u64, u32)>,
    /// Executed locally, not yet applied from the log, in order.
    ahead: VecDeque<TxnId>,
    /// Log positions of this node's own transactions, applied but not yet recorded in the
    /// database (it is recorded between client transactions).
    unrecorded: Option<AppliedMark>,
    confirmed_unrecorded: Vec<TxnId>,
    progress: Arc<Progress>,
    /// Transactions go to the proposer from here, so the log gets them in commit order.
    proposals: async_mpsc::UnboundedSender<Proposal>,
    options: WriterOptions,
    on_diverged: Option<Box<dyn FnOnce() + Send>>,
}

/// Starts the writer thread over `engine`.
pub fn start<E: Engine + 'static>(
    mut engine: E,
    mut options: WriterOptions,
    proposals: async_mpsc::UnboundedSender<Proposal>,
) -> Result<WriterHandle, SqlError> {
    let applied = engine.applied()?;
    let (jobs, rx) = mpsc::channel();
    let progress = Arc::new(Progress {
        executed: AtomicU64::new(0),
        confirmed: watch::Sender::new(0),
    });
    let on_diverged = std::mem::replace(&mut options.on_diverged, Box::new(|| {}));
    let writer = Writer {
        engine,
        incarnation: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        next_seq: 1,
        leading: false,
        active: None,
        waiting: VecDeque::new(),
        executed: applied.last_txn,
        applied,
        last_apply: None,
        ahead: VecDeque::new(),
        unrecorded: None,
        confirmed_unrecorded: Vec::new(),
        progress: progress.clone(),
        proposals,
        options,
        on_diverged: Some(on_diverged),
    };
    std::thread::Builder::new()
        .name("sql-writer".into())
        .spawn(move || writer.run(rx))
        .map_err(|e| SqlError::unavailable(&format!("cannot start the database writer: {e}")))?;
    Ok(WriterHandle { jobs, progress })
}

/// The seed of the statement at `ordinal` among a transaction's replicated statements.
fn statement_seed(seed: u64, ordinal: usize) -> u64 {
    seed ^ (ordinal as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl<E: Engine> Writer<E> {
    fn run(mut self, jobs: mpsc::Receiver<Job>) {
        loop {
            let job = match self.waiting.front() {
                Some((_, _, deadline)) => match jobs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(job) => job,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.expire_waiting();
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
                None => match jobs.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                },
            };
            self.on_job(job);
            if self.active.is_none() {
                self.record_applied();
                self.start_waiting();
            }
        }
    }

    fn on_job(&mut self, job: Job) {
        match job {
            Job::Begin { session, reply } => {
                if !self.leading {
                    let _ = reply.send(Err(SqlError::read_only(0)));
                } else {
                    self.waiting
                        .push_back((session, reply, Instant::now() + self.options.lock_wait));
                }
            }
            Job::Execute {
                session,
                sql,
                params,
                reply,
            } => {
                let _ = reply.send(self.execute(session, &sql, params));
            }
            Job::Commit { session, reply } => {
                let _ = reply.send(self.commit(session));
            }
            Job::Rollback { session } => {
                if self.active.as_ref().is_some_and(|a| a.session == session) {
                    self.engine.rollback();
                    self.active = None;
                } else {
                    self.waiting.retain(|(s, _, _)| *s != session);
                }
            }
            Job::Apply { index, txn, reply } => {
                let applied = self.apply(index, txn);
                let _ = reply.send(applied);
            }
            Job::Leading(leading) => {
                if self.leading && !leading {
                    self.step_down();
                }
                self.leading = leading;
            }
        }
    }

    fn expire_waiting(&mut self) {
        let now = Instant::now();
        while self.waiting.front().is_some_and(|(_, _, deadline)| *deadline <= now) {
            let (_, reply, _) = self.waiting.pop_front().expect("checked");
            let _ = reply.send(Err(SqlError::lock_timeout(self.options.lock_wait.as_millis() as u64)));
        }
    }

    /// Gives the write lock to the next waiting session.
    fn start_waiting(&mut self) {
        while let Some((session, reply, _)) = self.waiting.pop_front() {
            if reply.is_closed() {
                continue;
            }
            let started = self.engine.begin();
            if started.is_ok() {
                self.active = Some(Active {
                    session,
                    clock: FixedClock {
                        unix_ms: SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map(|d| d.as_millis() as i64)
                            .unwrap_or(0),
                    },
                    seed: self.incarnation.rotate_left(17) ^ self.next_seq.wrapping_mul(0x2545_f491_4f6c_dd1d),
                    statements: Vec::new(),
                    failed: false,
                });
            }
            if reply.send(started).is_err() {
                // The session left before it got the lock.
                self.engine.rollback();
                self.active = None;
                continue;
            }
            return;
        }
    }

    fn execute(&mut self, session: u64, sql: &str, params: Vec<Value>) -> Result<Outcome, SqlError> {
        let active = match &mut self.active {
            Some(active) if active.session == session => active,
            _ => {
                return Err(SqlError::serialization(
                    "the transaction lost the write lock (leadership moved)",
                ))
            }
        };
        if active.failed {
            return Err(SqlError::in_failed_transaction());
        }
        let fixed = fix_writes(sql, active.clock).and_then(|fixed| {
            let kind = classify(&fixed)?;
            Ok((fixed, kind))
        });
        let result = fixed.and_then(|(fixed, kind)| {
            self.engine.seed(statement_seed(active.seed, active.statements.len()));
            let outcome = self.engine.execute(&fixed, &params)?;
            if !outcome.read_only || kind == StatementKind::Savepoint {
                active.statements.push(Statement { sql: fixed, params });
            }
            Ok(outcome)
        });
        if result.is_err() {
            active.failed = true;
        }
        result
    }

    fn commit(&mut self, session: u64) -> Result<Committed, SqlError> {
        let active = match self.active.take() {
            Some(active) if active.session == session => active,
            other => {
                self.active = other;
                return Err(SqlError::serialization(
                    "the transaction lost the write lock (leadership moved)",
                ));
            }
        };
        if active.failed || active.statements.is_empty() {
            self.engine.rollback();
            return Ok(Committed::Nothing {
                rolled_back: active.failed,
            });
        }
        let id = TxnId {
            incarnation: self.incarnation,
            seq: self.next_seq,
        };
        if let Err(e) = self.engine.mark_ahead(id).and_then(|()| self.engine.commit()) {
            self.engine.rollback();
            return Err(e);
        }
        self.next_seq += 1;
        let txn = Txn {
            id,
            after: self.executed,
            seed: active.seed,
            statements: active.statements,
        };
        self.executed = id;
        self.ahead.push_back(id);
        self.progress.executed.fetch_add(1, Ordering::AcqRel);
        let (proposed, pending) = oneshot::channel();
        if self.proposals.send((txn, proposed)).is_err() {
            // The runtime is going away; the transaction never reaches the log.
            self.diverged("its proposer stopped");
        }
        Ok(Committed::Ahead(pending))
    }

    fn apply(&mut self, index: u64, txn: Txn) -> Applied {
        // An entry carries a batch of commands, applied in order under its one index.
        let command = match self.last_apply {
            Some((last, command)) if last == index => command + 1,
            _ => 0,
        };
        assert!(
            self.last_apply.is_none_or(|(last, _)| last <= index),
            "log indices never go backward: {index} after {:?}",
            self.last_apply
        );
        self.last_apply = Some((index, command));
        if self.applied.covers(index, command) {
            // Replayed after a restart: the database already holds it.
            return Applied::Committed;
        }
        if txn.after != self.applied.last_txn {
            if self.ahead.contains(&txn.id) {
                self.diverged("one of its transactions was voided by the log");
            }
            return Applied::Void;
        }
        let mark = AppliedMark {
            log_index: index,
            command,
            last_txn: txn.id,
        };
        if self.ahead.front() == Some(&txn.id) {
            self.ahead.pop_front();
            self.applied = mark;
            self.unrecorded = Some(mark);
            self.confirmed_unrecorded.push(txn.id);
            self.progress.confirmed.send_modify(|confirmed| *confirmed += 1);
            if self.active.is_none() {
                self.record_applied();
            }
            return Applied::Committed;
        }
        if !self.ahead.is_empty() {
            self.diverged("another leader's transaction reached the log before its own");
            return Applied::Committed;
        }
        if let Some(active) = self.active.take() {
            // Another leader's transaction: this node's session cannot commit any more.
            tracing::info!(
                session = active.session,
                "a client transaction ends: another leader's reached the log"
            );
            self.engine.rollback();
        }
        self.record_applied();
        if let Err(e) = self.replay(&txn, mark) {
            panic!(
                "transaction {:?} at log index {index} failed on this replica but committed on its leader \
                 ({e}): the replicas have diverged",
                txn.id
            );
        }
        self.applied = mark;
        Applied::Committed
    }

    /// Executes a transaction from the log, with its bookkeeping, as one engine transaction.
    fn replay(&mut self, txn: &Txn, mark: AppliedMark) -> Result<(), SqlError> {
        self.engine.begin()?;
        for (ordinal, statement) in txn.statements.iter().enumerate() {
            self.engine.seed(statement_seed(txn.seed, ordinal));
            if let Err(e) = self.engine.execute(&statement.sql, &statement.params) {
                self.engine.rollback();
                return Err(e);
            }
        }
        self.engine.mark_applied(mark)?;
        self.engine.commit()
    }

    /// Records the log position of this node's own applied transactions, and that they are no
    /// longer ahead, between client transactions (the engine has one open transaction at a time).
    fn record_applied(&mut self) {
        let Some(mark) = self.unrecorded.take() else {
            return;
        };
        let cleared = std::mem::take(&mut self.confirmed_unrecorded);
        let recorded = self.engine.begin().and_then(|()| {
            for id in cleared {
                self.engine.clear_ahead(id)?;
            }
            self.engine.mark_applied(mark)?;
            self.engine.commit()
        });
        if let Err(e) = recorded {
            self.engine.rollback();
            panic!("cannot record the applied log position in the database: {e}");
        }
    }

    fn step_down(&mut self) {
        for (_, reply, _) in self.waiting.drain(..) {
            let _ = reply.send(Err(SqlError::read_only(0)));
        }
        if self.active.take().is_some() {
            self.engine.rollback();
        }
        if !self.ahead.is_empty() {
            self.diverged("it stopped leading with transactions the log may not have");
        }
    }

    fn diverged(&mut self, why: &str) {
        if let Some(on_diverged) = self.on_diverged.take() {
            tracing::warn!(
                why,
                ahead = self.ahead.len(),
                "the database no longer matches the log; rebuilding it"
            );
            on_diverged();
        }
    }
}
