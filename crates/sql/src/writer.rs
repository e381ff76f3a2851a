//! The database's one writer: it runs the leader's client transactions, one at a time as the
//! engine allows, and applies the log's transactions in log order. It runs on the node's thread
//! (as the raft loop and the sessions do: a node is one thread, see `chorus_log::node`), so
//! handing a statement to it costs no cross-thread wake-up; a long statement holds the node's
//! thread as a long key-value command does.
//!
//! A leader executes a client's transaction and commits it locally at once (no fsync: the log
//! is the durability), then proposes it and goes on with the next one while the log commits it
//! — the write lock is never held across a log round trip. The client hears COMMIT only once
//! the transaction is applied from the log. Each transaction names the one it was executed
//! after; a replica applies it only if that is the last one it applied, and voids it
//! otherwise (see `Txn::after`), so a transaction never lands on a state its client did not see.
//! A leader whose executed-ahead transactions did not reach the log that way has a database
//! the log does not describe: it reports itself diverged and its node rebuilds from the log.
//!
//! Hybrid replication (issue 16) is different: every node executes its own clients'
//! transactions, on its state at some log position, records the write-set and rolls the
//! transaction back; the log orders the write-sets, and every node — the executing one too —
//! certifies each in log order (`certify`) and applies those that pass. A client's transaction
//! holds the write lock while it runs, so what the log orders meanwhile waits (`deferred`) and
//! is applied when the lock is free. A transaction starts on the node's state with the
//! write-sets of the node's own transactions still in the log applied first (its chain), so a
//! node need not wait for the log between two transactions on one class. Where applying them
//! there would be wrong (triggers, foreign-key actions), a node does not start a transaction on
//! a class while one of its own on that class is still in the log instead. Each class has an
//! owning node, and a transaction reaching another node's class borrows it (`owners`).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chorus_log::node::Pending;
use chorus_log::NodeError;
use tokio::sync::{mpsc as async_mpsc, oneshot, watch};

use crate::certify::{Certifier, Position, Remembered, Void, CHAIN_SPAN};
use crate::classes::{Label, Labeller};
use crate::engine::{AppliedMark, Engine, Outcome, Recorded};
use crate::error::SqlError;
use crate::text::{Analysis, FixedClock, StatementKind};
use crate::txn::{Body, Certify, ClassMessage, Command, NodeRef, Statement, Ticket, Txn, TxnId, Value};
use owners::{holds, Asked, Borrowed, Suspended};
pub use owners::{Answering, Ownership};

/// How a leader's transactions travel through the log to the other replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicationMode {
    /// As the statements it ran, made deterministic; what cannot be made so is refused.
    Active,
    /// As its write-set (the rows it changed). A transaction that changes the schema travels
    /// as statements: write-sets hold rows only.
    Passive,
    /// As statements, unless one cannot be made deterministic: then as its write-set.
    Auto,
    /// Every node executes its clients' transactions and sends their write-sets, certified by
    /// conflict class in log order (needs `--sql-conflict-classes`).
    Hybrid,
}

impl std::str::FromStr for ReplicationMode {
    type Err = String;

    fn from_str(mode: &str) -> Result<Self, String> {
        match mode {
            "active" => Ok(ReplicationMode::Active),
            "passive" => Ok(ReplicationMode::Passive),
            "auto" => Ok(ReplicationMode::Auto),
            "hybrid" => Ok(ReplicationMode::Hybrid),
            other => Err(format!(
                "unknown SQL replication mode '{other}': say active, passive, auto or hybrid"
            )),
        }
    }
}

/// What applying a transaction from the log did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Applied (a hybrid transaction: in the log; its outcome comes from the writer).
    Committed,
    /// It was executed on a state the log did not reach, or (hybrid) failed certification: it
    /// changed nothing anywhere.
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
    /// Hybrid: rolled back here and queued for the log, to be certified.
    Certifying(Certifying),
}

/// A hybrid transaction on its way through the log.
#[derive(Debug)]
pub struct Certifying {
    /// Resolves once proposed.
    pub proposed: oneshot::Receiver<Result<Pending<Applied>, NodeError>>,
    /// Its outcome, once certified and (if it passed) applied here.
    pub outcome: oneshot::Receiver<Applied>,
}

/// How far the writer's local commits and the log's applies are, for reads that must not
/// answer with a transaction the log does not have yet.
#[derive(Debug)]
pub struct Progress {
    /// Transactions committed locally ahead of the log, counted since start.
    executed: AtomicU64,
    /// Of those, how many the log has applied.
    confirmed: watch::Sender<u64>,
    /// Hybrid: transactions the log handed to the writer, counted since start.
    ordered: AtomicU64,
    /// Of those, how many were certified and applied (or voided) in the database.
    certified: watch::Sender<u64>,
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

    /// Waits until the database holds every hybrid transaction the log had handed to the
    /// writer when called: one that waited for the write lock may not be applied yet.
    pub async fn certified(&self) {
        let ordered = self.ordered.load(Ordering::Acquire);
        let mut rx = self.certified.subscribe();
        // The sender lives as long as `self`.
        let _ = rx.wait_for(|&certified| certified >= ordered).await;
    }
}

/// The writer, shared by the node's sessions and its state machine (all on one thread; the
/// lock is never contended for long).
#[derive(Clone)]
pub struct WriterHandle {
    writer: Arc<Mutex<Writer>>,
    pub progress: Arc<Progress>,
    lock_wait: Duration,
    /// Hybrid with owners: how long a transaction waits for classes it asked for.
    borrow_wait: Option<Duration>,
}

impl WriterHandle {
    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().expect("the writer does not panic while locked")
    }

    /// Whether this node leads with everything earlier leaders committed applied.
    pub fn leading(&self, leading: bool) {
        let mut writer = self.writer();
        if writer.mode == ReplicationMode::Hybrid {
            // Every node executes: leadership changes nothing here.
            return;
        }
        if writer.leading && !leading {
            writer.step_down();
        }
        writer.leading = leading;
        writer.after_release();
    }

    /// Transaction `id` could not be proposed: executed ahead, the database holds what the
    /// log never will; a hybrid one was rolled back, and the log will never order it, so no
    /// later transaction runs on it (its session hears it was not proposed).
    pub fn proposal_lost(&self, id: TxnId) {
        let mut writer = self.writer();
        if writer.mode == ReplicationMode::Hybrid {
            writer.own_in_flight.retain(|own| own.id != id);
            writer.outcomes.remove(&id);
            writer.after_release();
        } else {
            writer.diverged("a transaction executed ahead could not be proposed");
        }
    }

    /// Whether every node takes writes (hybrid replication), not only the leader.
    pub fn every_node_writes(&self) -> bool {
        self.writer().mode == ReplicationMode::Hybrid
    }

    /// The conflict classes a statement touches (none without rules).
    pub fn label(&self, sql: &str, kind: StatementKind, params: &[Value]) -> Label {
        let mut guard = self.writer();
        let writer = &mut *guard;
        writer.labeller.as_mut().map_or_else(Label::default, |labeller| {
            labeller.label(sql, kind, params, &mut writer.engine)
        })
    }

    /// Hybrid with owners: the node (its id) owning every class `label` names, if that is
    /// another node — where a transaction starting with it is best run. None for a global
    /// label, one naming no class, or classes of several owners.
    pub fn owner_elsewhere(&self, label: &Label) -> Option<u64> {
        let writer = self.writer();
        let ownership = writer.ownership.as_ref()?;
        if label.global {
            return None;
        }
        let mut owners = label.classes.iter().map(|class| writer.owner_of(class));
        let owner = owners.next()?;
        (owner != ownership.me && owners.all(|other| other == owner)).then_some(owner)
    }

    /// Whether this node leads with everything earlier leaders committed applied.
    pub fn is_leading(&self) -> bool {
        self.writer().leading
    }

    /// How long a session waits for the write lock.
    pub fn lock_wait(&self) -> Duration {
        self.lock_wait
    }

    /// Waits for the write lock for `session`, whose first statement touches `first` (hybrid:
    /// it waits too while a transaction of this node's on those classes is in the log), as
    /// long as the options allow.
    pub async fn begin(&self, session: u64, first: Label) -> Result<(), SqlError> {
        let granted = {
            let mut writer = self.writer();
            if !writer.leading && writer.mode != ReplicationMode::Hybrid {
                return Err(SqlError::not_leading_yet());
            }
            let (reply, granted) = oneshot::channel();
            writer.waiting.push_back((session, first, reply));
            writer.after_release();
            granted
        };
        match tokio::time::timeout(self.lock_wait, granted).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(SqlError::unavailable("the database writer stopped")),
            // Dropping `granted` tells the writer to skip this session.
            Err(_) => {
                self.writer()
                    .log_lock_queue("a session gave up waiting for the write lock");
                Err(SqlError::lock_timeout(self.lock_wait.as_millis() as u64))
            }
        }
    }

    /// Runs `sql` (whose text says `analysis`) in `session`'s transaction.
    pub fn execute(
        &self,
        session: u64,
        sql: &str,
        analysis: &Analysis,
        params: Vec<Value>,
    ) -> Result<Outcome, SqlError> {
        self.writer().execute(session, sql, analysis, params)
    }

    pub fn commit(&self, session: u64) -> Result<Committed, SqlError> {
        let mut writer = self.writer();
        let committed = writer.commit(session);
        writer.after_release();
        committed
    }

    /// Ends `session`'s transaction without a trace (also when the session ends inside one).
    pub fn rollback(&self, session: u64) {
        let mut writer = self.writer();
        if let Some(active) = writer.active.take_if(|a| a.session == session) {
            writer.metrics.lock_held.observe(active.granted_at.elapsed());
            writer.rolled_back(&active);
        }
        if let Some(suspended) = writer.suspended.remove(&session) {
            writer.resuming.retain(|&s| s != session);
            writer.release(suspended.active.ticket);
        }
        writer.after_release();
    }

    /// Hybrid with owners: before `session` runs statement `sql`, makes sure its transaction
    /// holds the classes the statement touches. One another node owns is asked for through
    /// the log; one this node lent out is waited for. Meanwhile the transaction is rolled back
    /// (the write lock is free for others), then re-executed on the state the log reached —
    /// and fails (40001) if what it had read changed. After `borrow_wait` it fails too beside
    /// a live owner, or goes on without the class beside one that seems down (certification
    /// decides then).
    pub async fn reach(&self, session: u64, sql: &str, kind: StatementKind, params: &[Value]) -> Result<(), SqlError> {
        let Some(borrow_wait) = self.borrow_wait else {
            return Ok(());
        };
        let label = self.label(sql, kind, params);
        let Some(mut resumed) = self.writer().reach(session, label)? else {
            return Ok(());
        };
        let stopped = |_| Err(SqlError::unavailable("the database writer stopped"));
        if let Ok(told) = tokio::time::timeout(borrow_wait, &mut resumed).await {
            return told.unwrap_or_else(stopped);
        }
        self.writer().go_on_without(session);
        match tokio::time::timeout(self.lock_wait, resumed).await {
            Ok(told) => told.unwrap_or_else(stopped),
            Err(_) => {
                self.writer()
                    .log_lock_queue("a suspended session gave up waiting to run again");
                self.rollback(session);
                Err(SqlError::lock_timeout(self.lock_wait.as_millis() as u64))
            }
        }
    }

    /// Where the database stands in the log.
    pub fn applied(&self) -> AppliedMark {
        self.writer().applied
    }

    /// Whether the database is exactly the log's state (no work ahead of it), so a checkpoint
    /// may be taken. If not, no session gets the write lock until the work ahead is applied.
    /// Where sequences advance outside transactions, no client transaction may be open either
    /// (its draws are not the log's state), and where they stand is recorded for the
    /// checkpoint; sessions then wait until it is pinned (`checkpoint_pinned`).
    pub fn checkpoint_ready(&self) -> bool {
        let mut writer = self.writer();
        // A checkpoint copies what is committed: everything applied must be.
        writer.close_group();
        let quiescent = writer.engine.sequences_outside_transactions();
        // Hybrid: the checkpoint's position is the log's last applied one, so nothing the log
        // ordered may wait for the write lock.
        let held_back =
            !writer.deferred.is_empty() || writer.mode == ReplicationMode::Hybrid && writer.active.is_some();
        writer.wants_checkpoint = !writer.ahead.is_empty() || held_back || (quiescent && writer.active.is_some());
        if writer.wants_checkpoint {
            return false;
        }
        if quiescent {
            if let Err(e) = writer.engine.record_sequences() {
                tracing::warn!(error = %e, "cannot record the sequences for a checkpoint; it waits");
                return false;
            }
            writer.wants_checkpoint = true;
        }
        true
    }

    /// The checkpoint's state is pinned: sessions may have the write lock again.
    pub fn checkpoint_pinned(&self) {
        let mut writer = self.writer();
        writer.wants_checkpoint = false;
        writer.after_release();
    }

    /// Whether the database must be rebuilt before it serves: it holds work the log may not
    /// have, or stands before the raft snapshot's position (`snapshot`).
    pub fn needs_rebuild(&self, snapshot: Option<AppliedMark>) -> Result<bool, SqlError> {
        let mut writer = self.writer();
        if writer.engine.may_be_torn() {
            return Ok(true);
        }
        let applied = writer.engine.applied()?;
        Ok(writer.engine.holds_ahead()? || snapshot.is_some_and(|mark| !applied.covers(mark.log_index, mark.command)))
    }

    /// The node is stopping and nothing will write after this: the engine commits what it
    /// applied and makes it durable (`Engine::close`). An error leaves the database to be
    /// rebuilt at the next start.
    pub fn close(&self) -> Result<(), SqlError> {
        let mut writer = self.writer();
        if writer.active.is_some() {
            return Err(SqlError::new("55000", "a session's transaction is still open"));
        }
        writer.close_group();
        writer.engine.close()
    }

    /// Replaces the database with `checkpoint` (or an empty one) standing at `mark`.
    pub fn restore(&self, checkpoint: Option<&std::path::Path>, mark: AppliedMark) -> Result<(), SqlError> {
        let mut writer = self.writer();
        if writer.active.take().is_some() {
            writer.engine.rollback();
        }
        if !writer.ahead.is_empty() {
            writer.diverged("a checkpoint replaces a database with work ahead of the log");
        }
        // The database is replaced: an open group of replayed transactions goes with it.
        writer.group = None;
        writer.engine.restore(checkpoint, mark)?;
        writer.applied = mark;
        writer.executed = mark.last_txn;
        writer.last_apply = None;
        writer.ahead.clear();
        writer.unrecorded = None;
        writer.confirmed_unrecorded.clear();
        // What the log ordered before the checkpoint is in it, and what it certified. This
        // node's transactions in the log may be in it or not: their sessions hear their outcome
        // is unknown, and the node goes on as a new incarnation, whose transactions are
        // certified against them as against any other node's.
        writer.deferred.clear();
        writer.group_certified.clear();
        writer.group_outcomes.clear();
        writer.certifier = Certifier::from_rows(writer.engine.certified()?);
        writer.outcomes.clear();
        writer.own_in_flight.clear();
        // What was lent and asked for stands on the old state: owners take back what they lent
        // in time, and suspended transactions fail.
        writer.lent.clear();
        writer.to_lend.clear();
        writer.lent_all = None;
        writer.to_lend_all.clear();
        writer.asked.clear();
        writer.resuming.clear();
        // Whether the log took this node for down is in the part the checkpoint replaced: it
        // says it is back (a no-op if it was not taken for down), and takes the others for up
        // until the log says otherwise again.
        writer.owners_down.clear();
        writer.metrics.owners_down.set(0);
        writer.back_proposed = None;
        if let Some(ownership) = writer.ownership.clone() {
            writer.propose_class(ClassMessage::OwnerBack {
                node: NodeRef::Id(ownership.me),
            });
        }
        for (_, mut suspended) in writer.suspended.drain() {
            if let Some(told) = suspended.resumed.take() {
                let _ = told.send(Err(SqlError::serialization(
                    "the database was replaced by a checkpoint while the transaction waited; retry",
                )));
            }
        }
        writer.incarnation = new_incarnation();
        writer.next_seq = 1;
        // Reads wait for nothing the checkpoint already holds.
        let ordered = writer.progress.ordered.load(Ordering::Acquire);
        writer
            .progress
            .certified
            .send_modify(|certified| *certified = (*certified).max(ordered));
        Ok(())
    }

    /// Applies a command from the log (the raft loop applies in order).
    pub fn apply(&self, index: u64, logged: impl Into<Command>) -> Applied {
        let mut writer = self.writer();
        let applied = writer.apply(index, logged.into());
        writer.after_release();
        applied
    }

    /// Hybrid: a membership change applied (or the node started): the classes are placed over
    /// `voters` (ids, sorted) from here on.
    pub fn voters_changed(&self, voters: &[u64]) {
        let mut writer = self.writer();
        writer.voters_changed(voters.to_vec());
        writer.after_release();
    }

    /// Every transaction of the entries applied since the last call is applied: the engine
    /// commits them.
    pub fn entries_applied(&self) {
        let mut writer = self.writer();
        writer.close_group();
        writer.after_release();
    }
}

/// Hybrid with owners: what the class hand-over decides by time — a loan overdue is taken
/// back, a wait long enough gives way, a node taken for down says it is back — is decided when
/// something happens, and also every `HAND_OVER_TICK`, or a cluster where every node waits
/// for the others would wait until a client gave up.
pub async fn tick_hand_overs(writer: WriterHandle) {
    let mut tick = tokio::time::interval(owners::HAND_OVER_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        writer.writer().after_release();
    }
}

/// A transaction committed ahead (or a class hand-over), for the proposer, and where to say it
/// was proposed.
pub type Proposal = (Command, oneshot::Sender<Result<Pending<Applied>, NodeError>>);

/// Settings of the writer.
pub struct WriterOptions {
    /// How long a transaction waits for another session's to end before giving up.
    pub lock_wait: Duration,
    /// Called once, on the node's thread, when the database no longer matches the log.
    pub on_diverged: Box<dyn FnOnce() + Send>,
    pub mode: ReplicationMode,
    /// Labels transactions with the conflict classes they touch, where rules are given.
    pub labeller: Option<Labeller>,
    /// Hybrid: which classes this node owns. None: every node runs any class optimistically.
    pub ownership: Option<Ownership>,
    /// Hybrid: the voters the node starts with (ids, sorted), over which the classes are placed
    /// until the raft loop tells the configuration in force (`WriterHandle::voters_changed`).
    pub voters: Vec<u64>,
}

struct WriterMetrics {
    /// From a session's grant of the write lock to its COMMIT or ROLLBACK: with the
    /// transactions' rate, how much of the time the one lock is held.
    lock_held: Arc<chorus_metrics::Histogram>,
    /// Client transactions proposed, by what replicas do with them.
    as_statements: Arc<chorus_metrics::Counter>,
    as_write_sets: Arc<chorus_metrics::Counter>,
    /// Transactions reaching COMMIT, by the conflict classes they touch: how well the rules
    /// cover the workload.
    labelled: [Arc<chorus_metrics::Counter>; 4],
    /// Classes this node's transactions asked other nodes for, by how the wait ended (see
    /// `Borrowed`), and classes this node lent.
    borrowed: [Arc<chorus_metrics::Counter>; 4],
    lent: Arc<chorus_metrics::Counter>,
    /// Loans this node took back unreleased after `lend_for`.
    lent_overdue: Arc<chorus_metrics::Counter>,
    /// Nodes the log takes for down, whose classes the others own meanwhile.
    owners_down: Arc<chorus_metrics::Gauge>,
    /// Voters the classes are placed over.
    owner_voters: Arc<chorus_metrics::Gauge>,
    /// Hybrid transactions this node certified (every node certifies every one), by outcome.
    certified_committed: Arc<chorus_metrics::Counter>,
    /// Void ones, by why: [`Void::Chain`], [`Void::Conflict`], and a write-set that did not fit.
    certified_void_chain: Arc<chorus_metrics::Counter>,
    certified_void_conflict: Arc<chorus_metrics::Counter>,
    certified_void_misfit: Arc<chorus_metrics::Counter>,
}

impl WriterMetrics {
    fn new() -> WriterMetrics {
        let proposed = |body| {
            chorus_metrics::labeled_counter(
                "chorus_sql_transactions_proposed_total",
                "Client transactions this node proposed, by what replicas do with them (re-execute \
                 the statements, or apply the write-set)",
                Some(("body", body)),
            )
        };
        let certified = |outcome| {
            chorus_metrics::labeled_counter(
                "chorus_sql_transactions_certified_total",
                "Hybrid transactions this node certified in log order (every node certifies every \
                 one), by outcome: committed, or void because another node committed on a class it \
                 touched after its snapshot (void_conflict), a transaction it was chained on was \
                 void or ordered after it (void_chain), or its write-set did not fit the rows \
                 (void_misfit)",
                Some(("outcome", outcome)),
            )
        };
        WriterMetrics {
            lock_held: chorus_metrics::histogram(
                "chorus_sql_write_lock_held_seconds",
                "How long a client transaction held the SQL write lock, from its grant to its COMMIT or ROLLBACK",
            ),
            as_statements: proposed("statements"),
            as_write_sets: proposed("write_set"),
            labelled: Label::KINDS.map(|kind| {
                chorus_metrics::labeled_counter(
                    "chorus_sql_transactions_labelled_total",
                    "Transactions reaching COMMIT on this node's writer, by the conflict classes \
                     their statements touch (--sql-conflict-classes): none, one, several or global",
                    Some(("classes", kind)),
                )
            }),
            certified_committed: certified("committed"),
            certified_void_chain: certified("void_chain"),
            certified_void_conflict: certified("void_conflict"),
            certified_void_misfit: certified("void_misfit"),
            borrowed: Borrowed::ALL.map(|outcome| {
                chorus_metrics::labeled_counter(
                    "chorus_sql_class_waits_total",
                    "Hybrid transactions that waited for classes (another node's, or this node's \
                     lent out), by how the wait ended: resumed, timed_out (40001, or on without \
                     the classes where their owner seems down), gave_way (an older transaction \
                     needed a class it held: 40001), or failed (what it had read changed \
                     meanwhile: 40001)",
                    Some(("outcome", outcome.name())),
                )
            }),
            lent: chorus_metrics::counter(
                "chorus_sql_classes_lent_total",
                "Classes this node owns that it lent to another node's transaction",
            ),
            lent_overdue: chorus_metrics::counter(
                "chorus_sql_classes_taken_back_total",
                "Classes this node lent and took back before the borrower released them (after \
                 lend_for): the borrower's transaction then races this node's on the class",
            ),
            owners_down: chorus_metrics::gauge(
                "chorus_sql_class_owners_down",
                "Nodes the log takes for down (a transaction waited for their class in vain): the \
                 others own their classes until they say they are back",
            ),
            owner_voters: chorus_metrics::gauge(
                "chorus_sql_class_owner_voters",
                "Hybrid: the voters conflict classes are placed over (one owner each), as the \
                 log's last membership change left them",
            ),
        }
    }
}

/// A session waiting for the write lock: its id, its first statement's classes, and where to
/// say it has it.
type Waiting = (u64, Label, oneshot::Sender<Result<(), SqlError>>);

struct Active {
    session: u64,
    granted_at: std::time::Instant,
    clock: FixedClock,
    seed: u64,
    statements: Vec<Statement>,
    failed: bool,
    /// A statement that may write ran (even if it failed): a rollback may leave sequences
    /// advanced.
    wrote: bool,
    /// A statement ran that cannot be made deterministic: only the write-set replicates.
    nondeterministic: bool,
    /// A statement changed the schema: only the statements replicate.
    changes_schema: bool,
    /// The conflict classes its statements touch (with rules to tell them).
    label: Label,
    /// Hybrid: the last log command applied to the state it runs on.
    snapshot: Position,
    /// Hybrid: it runs on its snapshot with write-sets of this node's transactions still in
    /// the log applied (`own_in_flight`), not on its snapshot alone: those of every one that
    /// touched a class it touched (and of every one that touched theirs), applied before it
    /// first touched the class.
    chained: bool,
    /// Which of them are applied, by sequence number.
    chain_applied: Vec<u64>,
    /// Hybrid with owners: its request for classes (see `Ownership`), and the classes lent to
    /// it.
    ticket: Option<Ticket>,
    borrowed: BTreeSet<String>,
    /// It waited for classes in vain once: it asks for none again.
    went_on_without: bool,
}

/// One of this node's hybrid transactions in the log, not yet applied here.
struct OwnInFlight {
    id: TxnId,
    /// Its write-set; None for statements (a schema change).
    write_set: Option<Vec<u8>>,
    label: Label,
}

struct Writer {
    engine: Box<dyn Engine>,
    labeller: Option<Labeller>,
    mode: ReplicationMode,
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
    /// A checkpoint waits for the work ahead to be applied: no new transaction starts.
    wants_checkpoint: bool,
    /// Transactions replayed from the log go into one engine transaction per round of entries
    /// the raft loop applies together, committed once they are applied (`entries_applied`), so
    /// pages that several of them write (TPC-C's warehouse and district rows) reach the engine's
    /// own log once per round.
    group: Option<Group>,
    progress: Arc<Progress>,
    metrics: WriterMetrics,
    /// Transactions go to the proposer from here, so the log gets them in commit order.
    proposals: async_mpsc::UnboundedSender<Proposal>,
    /// The engine's sequences may stand differently here than on the replicas (see
    /// `sync_sequences`).
    sequences_unsynced: bool,
    on_diverged: Option<Box<dyn FnOnce() + Send>>,
    /// Hybrid: transactions the log ordered while a client's held the write lock, in order,
    /// with their log index and place in the entry.
    deferred: VecDeque<(u64, u32, Txn)>,
    certifier: Certifier,
    /// What certification remembers of the transactions certified since the last group
    /// committed, recorded with the next.
    group_certified: Vec<Remembered>,
    /// The open group's hybrid transactions' outcomes, told once it commits.
    group_outcomes: Vec<(TxnId, Applied)>,
    /// This node's hybrid transactions in the log whose outcome is not known yet: who waits
    /// for it.
    outcomes: HashMap<TxnId, oneshot::Sender<Applied>>,
    /// This node's hybrid transactions in the log, in the order proposed, until applied or
    /// void here (also those whose sessions gave up on them).
    own_in_flight: VecDeque<OwnInFlight>,
    /// One of those no longer fits the rows: no transaction starts until they are all out of
    /// the log (they are void).
    chain_broken: bool,
    ownership: Option<Ownership>,
    /// Tickets this node issued.
    tickets: u64,
    /// This node's classes lent out: to which ticket, since when.
    lent: HashMap<String, (Ticket, Instant)>,
    /// Requests for this node's classes not lent yet, in log order: the ticket, the class,
    /// where the request stands in the log (its age: the older of two wins), and since when it
    /// waits here.
    to_lend: VecDeque<(Ticket, String, Position, Instant)>,
    /// This node's classes all lent to a global transaction: its ticket, since when.
    lent_all: Option<(Ticket, Instant)>,
    /// Requests for all classes (global transactions', every node's) not lent yet, in log
    /// order, as `to_lend`.
    to_lend_all: VecDeque<(Ticket, Position, Instant)>,
    /// Each live ticket's request as the log ordered it.
    asked: HashMap<Ticket, Asked>,
    /// Client transactions waiting for classes, by session.
    suspended: HashMap<u64, Suspended>,
    /// Suspended ones that may go on, in order: they take the write lock before new ones.
    resuming: VecDeque<u64>,
    /// Per owner (node id), until when it is not asked for classes (it let a transaction wait
    /// in vain and lent nothing to anyone meanwhile: it may be down), and when it last lent one.
    silent_until: HashMap<u64, Instant>,
    last_lent: HashMap<u64, Instant>,
    /// The voters classes are placed over (ids, sorted), as the log's membership changes leave
    /// them.
    voters: Vec<u64>,
    /// Voters the log took for down: their classes are owned by the others
    /// (`classes::owner_among`) until they say they are back.
    owners_down: BTreeSet<u64>,
    /// This node's word that it is back, if the log took it for down: when it was proposed (it
    /// is proposed again if it was lost).
    back_proposed: Option<Instant>,
    /// When a session giving up on the write lock last logged what it waited behind (once a
    /// second at most: an overload times out many sessions at once).
    queue_logged_at: Option<Instant>,
}

/// The writer over `engine`.
pub fn start(
    mut engine: Box<dyn Engine>,
    options: WriterOptions,
    proposals: async_mpsc::UnboundedSender<Proposal>,
) -> Result<WriterHandle, SqlError> {
    let applied = engine.applied()?;
    let certifier = Certifier::from_rows(engine.certified()?);
    let progress = Arc::new(Progress {
        executed: AtomicU64::new(0),
        confirmed: watch::Sender::new(0),
        ordered: AtomicU64::new(0),
        certified: watch::Sender::new(0),
    });
    let borrow_wait = options.ownership.as_ref().map(|o| o.borrow_wait);
    let metrics = WriterMetrics::new();
    if options.ownership.is_some() {
        assert!(!options.voters.is_empty(), "hybrid ownership needs the voters");
        metrics.owner_voters.set(options.voters.len() as i64);
    }
    let writer = Writer {
        engine,
        mode: options.mode,
        incarnation: new_incarnation(),
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
        wants_checkpoint: false,
        group: None,
        progress: progress.clone(),
        metrics,
        proposals,
        sequences_unsynced: true,
        on_diverged: Some(options.on_diverged),
        labeller: options.labeller,
        deferred: VecDeque::new(),
        certifier,
        group_certified: Vec::new(),
        group_outcomes: Vec::new(),
        outcomes: HashMap::new(),
        own_in_flight: VecDeque::new(),
        chain_broken: false,
        silent_until: HashMap::new(),
        last_lent: HashMap::new(),
        voters: options.voters,
        owners_down: BTreeSet::new(),
        back_proposed: None,
        queue_logged_at: None,
        ownership: options.ownership,
        tickets: 0,
        lent: HashMap::new(),
        to_lend: VecDeque::new(),
        lent_all: None,
        to_lend_all: VecDeque::new(),
        asked: HashMap::new(),
        suspended: HashMap::new(),
        resuming: VecDeque::new(),
    };
    Ok(WriterHandle {
        writer: Arc::new(Mutex::new(writer)),
        progress,
        lock_wait: options.lock_wait,
        borrow_wait,
    })
}

/// A name for this process's transactions (or, after a checkpoint replaced the database, the
/// next ones'): its start time in ns.
fn new_incarnation() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

/// Transactions replayed from the log, not yet committed.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// The position of the last one.
    mark: AppliedMark,
    /// Write-sets (their own engine transaction) rather than statements.
    write_sets: bool,
}

/// The seed of the statement at `ordinal` among a transaction's replicated statements.
fn statement_seed(seed: u64, ordinal: usize) -> u64 {
    seed ^ (ordinal as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Writer {
    /// Once no transaction is open: records what was applied and gives the write lock to the
    /// next waiting session.
    fn after_release(&mut self) {
        self.claim_back();
        self.try_lend();
        self.recheck_local_waits();
        if self.active.is_none() && self.group.is_none() {
            self.apply_deferred();
            self.record_applied();
            self.start_waiting();
        }
    }

    /// Logs `what` happened with what sessions waiting for the write lock wait behind, for an
    /// operator reading the log; once a second at most.
    fn log_lock_queue(&mut self, what: &str) {
        if self
            .queue_logged_at
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.queue_logged_at = Some(Instant::now());
        tracing::info!(behind = %self.lock_queue(), "{what}");
    }

    /// What sessions waiting for the write lock wait behind.
    fn lock_queue(&self) -> String {
        let mut said = format!("{} waiting", self.waiting.len());
        if let Some(active) = &self.active {
            said += &format!(
                "; session {} holds it since {} ms (classes {:?}, global {})",
                active.session,
                active.granted_at.elapsed().as_millis(),
                active.label.classes,
                active.label.global
            );
        }
        if self.wants_checkpoint {
            said += "; a checkpoint waits";
        }
        if !self.own_in_flight.is_empty() {
            said += &format!(
                "; {} of this node's in the log (chain broken: {})",
                self.own_in_flight.len(),
                self.chain_broken
            );
        }
        for (session, suspended) in &self.suspended {
            said += &format!(
                "; session {session} suspended (ticket {:?}, resuming: {}), awaiting {:?} (held locally {:?}, all of nodes {:?})",
                suspended.active.ticket.map(|t| t.number),
                self.resuming.contains(session),
                suspended.awaiting,
                suspended.held_locally,
                suspended.awaiting_all
            );
        }
        if !self.lent.is_empty() || !self.to_lend.is_empty() {
            said += &format!(
                "; lent {:?}, asked for {}",
                self.lent.keys().collect::<Vec<_>>(),
                self.to_lend.len()
            );
        }
        if self.lent_all.is_some() || !self.to_lend_all.is_empty() {
            said += &format!(
                "; every class lent: {:?}, asked for by {}",
                self.lent_all.map(|(t, since)| (t.number, since.elapsed().as_millis())),
                self.to_lend_all.len()
            );
        }
        said
    }

    /// Applies what the log ordered while a client's transaction held the write lock.
    fn apply_deferred(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        while let Some((index, command, txn)) = self.deferred.pop_front() {
            self.apply_now(index, command, txn);
        }
        self.close_group();
    }

    /// Whether a transaction touching `label` must wait for this node's own hybrid ones in the
    /// log: a schema change or a global one is not chained, nor anything after it; and where
    /// write-sets cannot be applied under a client's transaction, one on the same classes
    /// would run on a state without them, and be voided. With owners, too, one on a class this
    /// node lent, was asked for, or a suspended transaction holds (see `blocked_by_owners`).
    fn blocked(&mut self, label: &Label) -> bool {
        self.blocked_by_own_in_flight(label) || self.blocked_by_owners(label)
    }

    fn blocked_by_own_in_flight(&mut self, label: &Label) -> bool {
        if self.chain_broken && self.own_in_flight.is_empty() {
            self.chain_broken = false;
        }
        // A chain reaches back CHAIN_SPAN transactions at most: the next may need them all.
        if self.chain_broken
            || self.own_in_flight.len() as u64 >= CHAIN_SPAN - 1
            || self
                .own_in_flight
                .iter()
                .any(|own| own.label.global || own.write_set.is_none())
            || (label.global && !self.own_in_flight.is_empty())
        {
            return true;
        }
        !self.own_in_flight.is_empty()
            && !self.engine.applies_in_transaction()
            && self
                .own_in_flight
                .iter()
                .any(|own| own.label.classes.iter().any(|class| label.classes.contains(class)))
    }

    /// Hybrid: applies, in the open transaction, the write-sets of this node's transactions
    /// still in the log (not applied yet: `applied`) that touched a class of `label`, and of
    /// those that touched theirs, in order; adds them to `applied`. For a global label, all.
    /// An error is one that no longer fits the rows (it will be void).
    fn apply_chain(&mut self, label: &Label, applied: &mut Vec<u64>) -> Result<(), SqlError> {
        let mut classes = label.classes.clone();
        let mut picked = vec![false; self.own_in_flight.len()];
        loop {
            let mut grew = false;
            for (own, picked) in self.own_in_flight.iter().zip(picked.iter_mut()) {
                if !*picked
                    && !applied.contains(&own.id.seq)
                    && (label.global || own.label.classes.iter().any(|class| classes.contains(class)))
                {
                    *picked = true;
                    classes.extend(own.label.classes.iter().cloned());
                    grew = true;
                }
            }
            if !grew {
                break;
            }
        }
        for (own, picked) in self.own_in_flight.iter().zip(picked) {
            if picked {
                let write_set = own.write_set.as_ref().expect("a chain holds write-sets only");
                self.engine.apply_in_transaction(write_set)?;
                applied.push(own.id.seq);
            }
        }
        Ok(())
    }

    /// Hybrid: which of this node's transactions in the log a transaction to be numbered
    /// `seq`, touching `label`, with `applied` under it, depends on (see `Certify::chain`).
    fn chain_of(&self, seq: u64, label: &Label, applied: &[u64]) -> u64 {
        self.own_in_flight
            .iter()
            .filter(|own| {
                label.global || own.label.global || own.label.classes.iter().any(|class| label.classes.contains(class))
            })
            .fold(0, |chain, own| {
                assert!(
                    applied.contains(&own.id.seq),
                    "a transaction ran on every write-set of its classes still in the log"
                );
                let back = seq - 1 - own.id.seq;
                assert!(
                    back < CHAIN_SPAN,
                    "a chain reaches back at most CHAIN_SPAN transactions"
                );
                chain | (1 << back)
            })
    }

    /// The next waiting session that may start (hybrid: whose first statement's classes are
    /// not in flight; others keep their place), dropping those that left.
    fn next_waiting(&mut self) -> Option<Waiting> {
        self.waiting.retain(|(_, _, reply)| !reply.is_closed());
        let labels: Vec<Label> = self.waiting.iter().map(|(_, label, _)| label.clone()).collect();
        let next = labels.iter().position(|label| !self.blocked(label))?;
        self.waiting.remove(next)
    }

    /// Gives the write lock to the next waiting session.
    fn start_waiting(&mut self) {
        let hybrid = self.mode == ReplicationMode::Hybrid;
        if self.wants_checkpoint && (hybrid || !self.ahead.is_empty() || self.engine.sequences_outside_transactions()) {
            return;
        }
        if self.resume_next() {
            return;
        }
        while let Some((session, first, reply)) = self.next_waiting() {
            let mut started = self.sync_sequences().and_then(|()| self.engine.begin());
            // Where write-sets cannot be applied under a client's transaction, it runs on its
            // snapshot alone (and `blocked` kept it off classes in the log).
            let chained = hybrid && (self.own_in_flight.is_empty() || self.engine.applies_in_transaction());
            let mut chain_applied = Vec::new();
            if started.is_ok() && chained {
                match self.apply_chain(&first, &mut chain_applied) {
                    Ok(()) => {}
                    Err(e) => {
                        // It waits until this node's transactions are out of the log.
                        tracing::debug!(error = %e, "a transaction of this node's in the log no longer fits the rows");
                        self.engine.rollback();
                        self.chain_broken = true;
                        self.waiting.push_front((session, first, reply));
                        continue;
                    }
                }
            }
            if started.is_ok() && self.mode != ReplicationMode::Active {
                started = self.engine.record_writes();
                if started.is_err() {
                    self.engine.rollback();
                }
            }
            if started.is_ok() {
                self.active = Some(Active {
                    session,
                    granted_at: std::time::Instant::now(),
                    clock: FixedClock {
                        unix_ms: SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map(|d| d.as_millis() as i64)
                            .unwrap_or(0),
                    },
                    seed: self.incarnation.rotate_left(17) ^ self.next_seq.wrapping_mul(0x2545_f491_4f6c_dd1d),
                    statements: Vec::new(),
                    failed: false,
                    wrote: false,
                    nondeterministic: false,
                    changes_schema: false,
                    label: Label::default(),
                    snapshot: (self.applied.log_index, self.applied.command),
                    chained,
                    chain_applied,
                    ticket: None,
                    borrowed: BTreeSet::new(),
                    went_on_without: false,
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

    fn execute(
        &mut self,
        session: u64,
        sql: &str,
        analysis: &Analysis,
        params: Vec<Value>,
    ) -> Result<Outcome, SqlError> {
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
        if let Some(labeller) = &mut self.labeller {
            let touched = labeller.label(sql, analysis.kind, &params, &mut self.engine);
            // A class a suspended transaction of this node's holds is its alone until it is
            // done (`reach` waits for it; a statement that did not ask fails here).
            if touched
                .classes
                .iter()
                .any(|class| !holds(active, class) && self.suspended.values().any(|s| holds(&s.active, class)))
            {
                active.failed = true;
                return Err(SqlError::serialization(
                    "another transaction of this node's holds a class this statement reaches; retry",
                ));
            }
            let new = touched.global && !active.label.global
                || touched
                    .classes
                    .iter()
                    .any(|class| !active.label.classes.contains(class));
            active.label.join(touched.clone());
            if active.chained && new {
                // A class it had not touched: this node's transactions on it in the log come
                // first. None of them touched a class it had (those are applied already).
                let mut applied = std::mem::take(&mut active.chain_applied);
                let chained = self.apply_chain(&touched, &mut applied);
                let active = self.active.as_mut().expect("checked above");
                active.chain_applied = applied;
                if let Err(e) = chained {
                    self.chain_broken = true;
                    active.failed = true;
                    return Err(SqlError::serialization(&format!(
                        "an earlier transaction of this node's on a class this one touches no longer fits the rows ({e}); retry"
                    )));
                }
            }
        }
        let active = self.active.as_mut().expect("checked above");
        let mode = self.mode;
        let dialect = self.engine.dialect();
        // The rewrite only replaces clock reads and parameter names: the analysis stays.
        let result = analysis
            .fix_writes(sql, active.clock, dialect)
            .or_else(|refused| {
                if mode == ReplicationMode::Active || !refused.is_nondeterministic() || active.changes_schema {
                    return Err(refused);
                }
                // Replicas apply its write-set: the statement runs as the client wrote it.
                active.nondeterministic = true;
                Ok(analysis.numbered(dialect))
            })
            .and_then(|fixed| {
                if mode != ReplicationMode::Active && analysis.changes_schema() {
                    if active.nondeterministic {
                        return Err(SqlError::nondeterministic(
                            "a transaction that changes the schema travels as statements, and an \
                             earlier statement of it cannot be made deterministic; change the \
                             schema in a transaction of its own"
                                .into(),
                        ));
                    }
                    active.changes_schema = true;
                }
                Ok(fixed)
            })
            .and_then(|fixed| {
                active.wrote |= analysis.kind == StatementKind::Write;
                self.engine.seed(statement_seed(active.seed, active.statements.len()));
                let outcome = self.engine.execute(&fixed, &params)?;
                // A query may write too (`SELECT nextval(…)`): the engine says.
                active.wrote |= !outcome.read_only;
                if !outcome.read_only || analysis.kind == StatementKind::Savepoint {
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
        self.metrics.lock_held.observe(active.granted_at.elapsed());
        if self.labeller.is_some() {
            self.metrics.labelled[active.label.kind_index()].inc();
        }
        let write_set = match self.mode {
            ReplicationMode::Passive if !active.changes_schema => true,
            ReplicationMode::Auto => active.nondeterministic,
            _ => false,
        };
        // A failed one may have met a chain it could not apply in full: it commits nothing.
        let chain = (active.chained && !active.failed)
            .then(|| self.chain_of(self.next_seq, &active.label, &active.chain_applied));
        if active.failed || (active.statements.is_empty() && chain.unwrap_or(0) == 0) {
            self.rolled_back(&active);
            return Ok(Committed::Nothing {
                rolled_back: active.failed,
            });
        }
        if self.mode == ReplicationMode::Hybrid {
            let ticket = active.ticket;
            let committed = self.commit_hybrid(active, chain);
            // After its write-set: an owner lends the class again once it applied that.
            self.release(ticket);
            return committed;
        }
        let id = self.next_id();
        let body = if !write_set {
            if let Err(e) = self.engine.mark_ahead(id).and_then(|()| self.engine.commit()) {
                self.rolled_back(&active);
                return Err(e);
            }
            Body::Statements(active.statements)
        } else {
            match self.engine.commit_recorded(id) {
                Err(e) => {
                    self.rolled_back(&active);
                    return Err(e);
                }
                Ok(Recorded::Nothing) => return Ok(Committed::Nothing { rolled_back: false }),
                Ok(Recorded::WriteSet(write_set)) => Body::WriteSet(write_set),
                Ok(Recorded::Unrecordable(why)) if active.nondeterministic => {
                    // Committed here, and replicas could reach its state neither way: the node
                    // rebuilds its database from the log, without it.
                    self.diverged(&why);
                    return Err(SqlError::unsupported(format!(
                        "the transaction cannot be replicated: {why}; and a statement of it cannot \
                         be made deterministic, so it cannot travel as statements either"
                    )));
                }
                Ok(Recorded::Unrecordable(why)) => {
                    tracing::info!(why, "a transaction travels as statements: no write-set for it");
                    Body::Statements(active.statements)
                }
            }
        };
        match body {
            Body::Statements(_) => self.metrics.as_statements.inc(),
            Body::WriteSet(_) => {
                self.metrics.as_write_sets.inc();
                // Replicas apply the values it drew without drawing them.
                self.sequences_unsynced |= active.wrote;
            }
        }
        Ok(Committed::Ahead(self.propose_ahead(id, active.seed, body)))
    }

    /// Hybrid: rolls `active` back here and proposes its write-set (its statements, if it
    /// changed the schema) to be certified.
    fn commit_hybrid(&mut self, active: Active, chain: Option<u64>) -> Result<Committed, SqlError> {
        let body = if active.changes_schema {
            self.engine.rollback();
            Body::Statements(active.statements)
        } else {
            let write_set = self.engine.take_write_set()?;
            // One that changed nothing but read what its chain wrote is certified too: its
            // client may hear success only if its chain committed.
            if write_set.is_empty() && chain.unwrap_or(0) == 0 {
                return Ok(Committed::Nothing { rolled_back: false });
            }
            Body::WriteSet(write_set)
        };
        match body {
            Body::Statements(_) => self.metrics.as_statements.inc(),
            Body::WriteSet(_) => self.metrics.as_write_sets.inc(),
        }
        let id = self.next_id();
        self.next_seq += 1;
        // A schema change may touch any class.
        let label = if active.changes_schema {
            Label::global()
        } else {
            active.label
        };
        let txn = Txn {
            id,
            after: TxnId::default(),
            seed: active.seed,
            body,
            certify: Some(Certify {
                snapshot: active.snapshot,
                classes: label.classes.iter().cloned().collect(),
                global: label.global,
                chain,
            }),
        };
        self.own_in_flight.push_back(OwnInFlight {
            id,
            write_set: match &txn.body {
                Body::WriteSet(write_set) => Some(write_set.clone()),
                Body::Statements(_) => None,
            },
            label,
        });
        let (told, outcome) = oneshot::channel();
        self.outcomes.insert(id, told);
        let (proposed_tx, proposed) = oneshot::channel();
        // If the runtime is going away the session hears the proposal was dropped.
        let _ = self.proposals.send((Command::Txn(txn), proposed_tx));
        Ok(Committed::Certifying(Certifying { proposed, outcome }))
    }

    fn next_id(&self) -> TxnId {
        TxnId {
            incarnation: self.incarnation,
            seq: self.next_seq,
        }
    }

    /// Proposes transaction `id`, committed here ahead of the log, after the last one.
    fn propose_ahead(
        &mut self,
        id: TxnId,
        seed: u64,
        body: Body,
    ) -> oneshot::Receiver<Result<Pending<Applied>, NodeError>> {
        assert_eq!(
            id,
            self.next_id(),
            "transactions are proposed in the order they were named"
        );
        self.next_seq += 1;
        let txn = Txn {
            id,
            after: self.executed,
            seed,
            body,
            certify: None,
        };
        self.executed = id;
        self.ahead.push_back(id);
        self.progress.executed.fetch_add(1, Ordering::AcqRel);
        let (proposed, pending) = oneshot::channel();
        if self.proposals.send((Command::Txn(txn), proposed)).is_err() {
            // The runtime is going away; the transaction never reaches the log.
            self.diverged("its proposer stopped");
        }
        pending
    }

    /// Rolls back a client's transaction. One that wrote may have drawn from sequences, which
    /// do not roll back: the replicas' would then be behind.
    fn rolled_back(&mut self, active: &Active) {
        self.engine.rollback();
        self.sequences_unsynced |= active.wrote;
        self.release(active.ticket);
    }

    /// Before this node's next client transaction: where sequences may stand differently here
    /// than on the replicas (a transaction that drew from them rolled back here, or another
    /// leader's were applied, or the node started), a transaction setting each to where it
    /// stands here goes ahead in the log. Sequences advance outside transactions, and a replica
    /// re-executing `nextval` must draw what the leader drew. Write-sets carry the values drawn
    /// (passive mode catches sequences up when a node starts leading, `Engine::record_writes`).
    fn sync_sequences(&mut self) -> Result<(), SqlError> {
        if matches!(self.mode, ReplicationMode::Passive | ReplicationMode::Hybrid) || !self.sequences_unsynced {
            return Ok(());
        }
        let settings = self.engine.sequence_settings()?;
        self.sequences_unsynced = false;
        if settings.is_empty() {
            return Ok(());
        }
        let id = self.next_id();
        // The settings change nothing here: the transaction holds only its ahead mark.
        if let Err(e) = self
            .engine
            .begin()
            .and_then(|()| self.engine.mark_ahead(id))
            .and_then(|()| self.engine.commit())
        {
            self.engine.rollback();
            self.sequences_unsynced = true;
            return Err(e);
        }
        drop(self.propose_ahead(id, 0, Body::Statements(settings)));
        Ok(())
    }

    fn apply(&mut self, index: u64, logged: Command) -> Applied {
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
        let txn = match logged {
            Command::Txn(txn) => txn,
            Command::Class(message) => {
                self.hand_over((index, command), message);
                return Applied::Committed;
            }
        };
        if txn.certify.is_some() {
            self.progress.ordered.fetch_add(1, Ordering::AcqRel);
        }
        if self.mode == ReplicationMode::Hybrid && (self.active.is_some() || !self.deferred.is_empty()) {
            // A client's transaction holds the write lock: applied once it ends.
            self.deferred.push_back((index, command, txn));
            return Applied::Committed;
        }
        self.apply_now(index, command, txn)
    }

    /// Applies the transaction the log ordered at (`index`, `command`), after every earlier one.
    fn apply_now(&mut self, index: u64, command: u32, txn: Txn) -> Applied {
        if txn.certify.is_some() {
            return self.certify(index, command, txn);
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
        // This node's sequences follow another leader's now; when it leads, they may not match.
        self.sequences_unsynced = true;
        if let Err(e) = self.replay(&txn, mark) {
            if e.is_connection_failure() {
                // Not the transaction's doing: the restart replays it from the database's mark.
                panic!(
                    "cannot apply transaction {:?} at log index {index}: {e}; the node stops, and recovers when restarted",
                    txn.id
                );
            }
            panic!(
                "transaction {:?} at log index {index} failed on this replica but committed on its leader \
                 ({e}): the replicas have diverged",
                txn.id
            );
        }
        self.applied = mark;
        // Nothing is ahead here: a transaction this node runs next runs after this one.
        self.executed = txn.id;
        Applied::Committed
    }

    /// Certifies a hybrid transaction and, if it passes, applies it; its outcome is told once
    /// the database holds it (`tell_outcomes`). A write-set that passes but does not fit the
    /// rows (two classes' inserts drew one rowid, a unique value across classes) is void too:
    /// every node holds the same rows at this point, so every node finds the same.
    fn certify(&mut self, index: u64, command: u32, txn: Txn) -> Applied {
        let certify = txn.certify.as_ref().expect("a hybrid transaction");
        let at = (index, command);
        if !self.ahead.is_empty() {
            self.diverged("another node's transaction reached the log before its own");
        }
        if let Some(active) = self.active.take() {
            // Only where every node does not execute: another node's transaction came first.
            self.engine.rollback();
            self.sequences_unsynced |= active.wrote;
        }
        let mut outcome = Applied::Void;
        let mut mark = AppliedMark {
            log_index: index,
            command,
            last_txn: self.applied.last_txn,
        };
        if txn.id.incarnation == self.incarnation {
            // Its own transactions proposed before it and not ordered by now never will be
            // (the log voids one ordered after it): their sessions hear so.
            while let Some(own) = self.own_in_flight.front().filter(|own| own.id.seq < txn.id.seq) {
                let lost = own.id;
                self.own_in_flight.pop_front();
                self.group_outcomes.push((lost, Applied::Void));
            }
        }
        let verdict = self.certifier.admits(txn.id, certify, at);
        if verdict.is_ok() {
            let applied = match &txn.body {
                Body::WriteSet(write_set) => self
                    .open_group(mark, true)
                    .and_then(|()| self.engine.apply_certified_write_set(write_set)),
                Body::Statements(_) => self.replay(&txn, mark).map(Ok),
            };
            match applied {
                Ok(Ok(())) => {
                    outcome = Applied::Committed;
                    mark.last_txn = txn.id;
                    let remembered = self.certifier.commit(txn.id, certify, at);
                    self.group_certified.extend(remembered);
                }
                Ok(Err(conflict)) => {
                    tracing::debug!(id = ?txn.id, error = %conflict, "a certified write-set does not fit the rows: void");
                }
                Err(e) => panic!(
                    "cannot apply hybrid transaction {:?} at log index {index} ({e}); the node stops, \
                     and recovers when restarted",
                    txn.id
                ),
            }
        }
        if outcome == Applied::Void {
            let remembered = self.certifier.void(txn.id);
            self.group_certified.extend(remembered);
        }
        let counted = match verdict {
            _ if outcome == Applied::Committed => &self.metrics.certified_committed,
            Err(Void::Chain) => &self.metrics.certified_void_chain,
            Err(Void::Conflict) => &self.metrics.certified_void_conflict,
            Ok(()) => &self.metrics.certified_void_misfit,
        };
        counted.inc();
        if txn.id.incarnation == self.incarnation {
            self.own_in_flight.retain(|own| own.id != txn.id);
        }
        // A void one moves the position too: a restart certifies it again, alike.
        self.applied = mark;
        if let Some(group) = &mut self.group {
            group.mark = mark;
        }
        self.group_outcomes.push((txn.id, outcome));
        if self.group.is_none() {
            self.tell_outcomes();
        }
        Applied::Committed
    }

    /// Tells the sessions of the hybrid transactions certified since the last time their
    /// outcome: the database holds what they did.
    fn tell_outcomes(&mut self) {
        let told = self.group_outcomes.len() as u64;
        for (id, outcome) in std::mem::take(&mut self.group_outcomes) {
            if let Some(session) = self.outcomes.remove(&id) {
                let _ = session.send(outcome);
            }
        }
        if told > 0 {
            self.progress.certified.send_modify(|certified| *certified += told);
        }
    }

    /// Opens the round's group for a transaction of this kind (statements and write-sets go to
    /// different connections: a change of kind closes the group).
    fn open_group(&mut self, mark: AppliedMark, write_sets: bool) -> Result<(), SqlError> {
        if self.group.is_some_and(|group| group.write_sets != write_sets) {
            self.close_group();
        }
        if self.group.is_none() && !write_sets {
            self.engine.begin()?;
        }
        // Set before anything runs: the group is open, whatever the transaction does.
        self.group = Some(Group { mark, write_sets });
        Ok(())
    }

    /// Executes (or applies) a transaction from the log in the round's group.
    fn replay(&mut self, txn: &Txn, mark: AppliedMark) -> Result<(), SqlError> {
        self.open_group(mark, matches!(txn.body, Body::WriteSet(_)))?;
        match &txn.body {
            Body::Statements(statements) => {
                let seeded: Vec<(u64, &Statement)> = statements
                    .iter()
                    .enumerate()
                    .map(|(ordinal, statement)| (statement_seed(txn.seed, ordinal), statement))
                    .collect();
                self.engine.execute_unread(&seeded)
            }
            Body::WriteSet(write_set) => self.engine.apply_write_set(write_set),
        }
    }

    /// Commits the transactions replayed since the group opened, with the position of the last.
    fn close_group(&mut self) {
        let Some(group) = self.group.take() else {
            return;
        };
        let certified = std::mem::take(&mut self.group_certified);
        if !certified.is_empty() {
            if let Err(e) = self.engine.record_certified(&certified) {
                panic!("cannot record what certification remembers up to {:?}: {e}", group.mark);
            }
        }
        let committed = if group.write_sets {
            self.engine.end_write_sets(Some(group.mark))
        } else {
            self.engine.mark_applied(group.mark).and_then(|()| self.engine.commit())
        };
        if let Err(e) = committed {
            panic!(
                "cannot commit the transactions applied from the log up to {:?}: {e}",
                group.mark
            );
        }
        self.tell_outcomes();
    }

    /// Records the log position of this node's own applied transactions, and that they are no
    /// longer ahead, between client transactions (the engine has one open transaction at a time).
    fn record_applied(&mut self) {
        let Some(mark) = self.unrecorded.take() else {
            return;
        };
        self.close_group();
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
        for (_, _, reply) in self.waiting.drain(..) {
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

#[cfg(test)]
mod hybrid_tests;
mod owners;

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::engine::Sqlite;

    /// A writer over its own database, as a node's (`hybrid_tests` uses it too).
    pub(super) struct Node {
        pub(super) writer: WriterHandle,
        pub(super) proposals: async_mpsc::UnboundedReceiver<Proposal>,
        pub(super) diverged: Arc<AtomicBool>,
        pub(super) _dir: tempfile::TempDir,
    }

    fn node() -> Node {
        node_in(ReplicationMode::Active)
    }

    fn node_in(mode: ReplicationMode) -> Node {
        node_over(tempfile::tempdir().unwrap(), mode, None, Duration::from_secs(1), None)
    }

    /// The writer over `dir`'s database (as a restart opens it).
    pub(super) fn node_over(
        dir: tempfile::TempDir,
        mode: ReplicationMode,
        labeller: Option<Labeller>,
        lock_wait: Duration,
        ownership: Option<Ownership>,
    ) -> Node {
        let diverged = Arc::new(AtomicBool::new(false));
        let flag = diverged.clone();
        let (proposals_tx, proposals) = async_mpsc::unbounded_channel();
        let writer = start(
            Box::new(Sqlite::open(dir.path()).unwrap()),
            WriterOptions {
                lock_wait,
                labeller,
                on_diverged: Box::new(move || flag.store(true, Ordering::SeqCst)),
                mode,
                ownership,
                voters: vec![0, 1, 2],
            },
            proposals_tx,
        )
        .unwrap();
        Node {
            writer,
            proposals,
            diverged,
            _dir: dir,
        }
    }

    /// Runs `statements` as one client transaction on a leading node; returns what it proposed.
    async fn transact(node: &mut Node, session: u64, statements: &[&str]) -> Txn {
        node.writer.begin(session, Label::default()).await.unwrap();
        for sql in statements {
            let analysis = crate::text::analyse(sql).unwrap();
            node.writer.execute(session, sql, &analysis, Vec::new()).unwrap();
        }
        assert!(matches!(node.writer.commit(session).unwrap(), Committed::Ahead(_)));
        next_txn(&mut node.proposals)
    }

    /// The next transaction a node proposed (class hand-overs skipped).
    pub(super) fn next_txn(proposals: &mut async_mpsc::UnboundedReceiver<Proposal>) -> Txn {
        loop {
            if let Command::Txn(txn) = proposals.try_recv().expect("a proposal in commit order").0 {
                return txn;
            }
        }
    }

    /// Applies `txn` as the log does: then its entry is over.
    fn apply_entry(node: &Node, index: u64, txn: Txn) -> Applied {
        let applied = node.writer.apply(index, txn);
        node.writer.entries_applied();
        applied
    }

    fn count(node: &Node) -> i64 {
        let mut writer = node.writer.writer();
        match writer.engine.execute("SELECT count(*) FROM t", &[]).unwrap().rows[0][0] {
            Value::Integer(n) => n,
            ref other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_transaction_applies_only_after_the_one_it_ran_after() {
        let mut leader = node();
        let replica = node();
        leader.writer.leading(true);
        let create = transact(&mut leader, 1, &["CREATE TABLE t (n INTEGER)"]).await;
        let first = transact(&mut leader, 1, &["INSERT INTO t VALUES (random())"]).await;
        let second = transact(&mut leader, 2, &["INSERT INTO t SELECT n + 1 FROM t"]).await;
        assert_eq!(second.after, first.id);

        // In log order every node applies them; the leader only confirms its own.
        for (index, txn) in [(1, &create), (2, &first), (2, &second)] {
            assert_eq!(apply_entry(&leader, index, txn.clone()), Applied::Committed);
            assert_eq!(apply_entry(&replica, index, txn.clone()), Applied::Committed);
        }
        assert_eq!(leader.writer.progress.executed(), 3);
        assert_eq!(*leader.writer.progress.confirmed.borrow(), 3);
        assert_eq!((count(&leader), count(&replica)), (2, 2));

        // A transaction run on a state the log did not reach is void on every node.
        let stale = Txn {
            id: TxnId {
                incarnation: 99,
                seq: 1,
            },
            after: first.id,
            ..second.clone()
        };
        assert_eq!(apply_entry(&replica, 3, stale.clone()), Applied::Void);
        assert_eq!(apply_entry(&leader, 3, stale), Applied::Void);
        assert_eq!((count(&leader), count(&replica)), (2, 2));
        assert!(!leader.diverged.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn an_entrys_transactions_commit_together_once_the_entry_is_applied() {
        let mut leader = node();
        let replica = node();
        leader.writer.leading(true);
        let create = transact(&mut leader, 1, &["CREATE TABLE t (n INTEGER)"]).await;
        let first = transact(&mut leader, 1, &["INSERT INTO t VALUES (1)"]).await;
        let second = transact(&mut leader, 2, &["INSERT INTO t VALUES (2)"]).await;
        apply_entry(&replica, 1, create);
        let reader = crate::engine::open_reader(replica._dir.path()).unwrap();
        let committed = |reader: &rusqlite::Connection| {
            reader
                .query_row(
                    "SELECT count(*), (SELECT log_index FROM _chorus_applied) FROM t",
                    [],
                    |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
                )
                .unwrap()
        };
        assert_eq!(replica.writer.apply(2, first), Applied::Committed);
        assert_eq!(replica.writer.apply(2, second.clone()), Applied::Committed);
        assert_eq!(
            committed(&reader),
            (0, 1),
            "nothing of an entry commits before all of it applied"
        );
        replica.writer.entries_applied();
        assert_eq!(committed(&reader), (2, 2));
        assert_eq!(
            replica.writer.applied(),
            AppliedMark {
                log_index: 2,
                command: 1,
                last_txn: second.id
            }
        );
    }

    #[tokio::test]
    async fn a_leader_whose_work_ahead_missed_the_log_reports_itself_diverged() {
        let mut leader = node();
        let mut rival = node();
        leader.writer.leading(true);
        rival.writer.leading(true);
        let create = transact(&mut rival, 1, &["CREATE TABLE t (n INTEGER)"]).await;
        leader.writer.leading(false);
        assert_eq!(apply_entry(&leader, 1, create.clone()), Applied::Committed);
        leader.writer.leading(true);
        transact(&mut leader, 1, &["INSERT INTO t VALUES (1)"]).await;
        // Another leader's transaction reaches the log first.
        let theirs = transact(&mut rival, 1, &["INSERT INTO t VALUES (2)"]).await;
        assert_eq!(apply_entry(&leader, 2, theirs), Applied::Committed);
        assert!(leader.diverged.load(Ordering::SeqCst));
        // Stepping down with work ahead diverges too.
        let mut other = node();
        other.writer.leading(true);
        transact(&mut other, 1, &["CREATE TABLE t (n INTEGER)"]).await;
        other.writer.leading(false);
        assert!(other.diverged.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_replica_that_becomes_leader_runs_its_transactions_after_what_it_applied() {
        let mut first = node();
        let mut second = node();
        first.writer.leading(true);
        let create = transact(&mut first, 1, &["CREATE TABLE t (n INTEGER)"]).await;
        let insert = transact(&mut first, 1, &["INSERT INTO t VALUES (1)"]).await;
        for (index, txn) in [(1, &create), (2, &insert)] {
            assert_eq!(apply_entry(&first, index, txn.clone()), Applied::Committed);
            assert_eq!(apply_entry(&second, index, txn.clone()), Applied::Committed);
        }
        first.writer.leading(false);
        second.writer.leading(true);
        let next = transact(&mut second, 7, &["INSERT INTO t VALUES (2)"]).await;
        assert_eq!(next.after, insert.id);
        assert_eq!(apply_entry(&second, 3, next.clone()), Applied::Committed);
        assert_eq!(apply_entry(&first, 3, next), Applied::Committed);
        assert_eq!((count(&first), count(&second)), (2, 2));
        assert!(!first.diverged.load(Ordering::SeqCst) && !second.diverged.load(Ordering::SeqCst));
    }

    /// Every table's rows, in rowid order (`sqlite_sequence` included).
    fn dump(node: &Node) -> Vec<(String, Vec<Vec<Value>>)> {
        let mut writer = node.writer.writer();
        let tables = writer
            .engine
            .execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '_chorus%' ORDER BY name",
                &[],
            )
            .unwrap()
            .rows;
        tables
            .into_iter()
            .map(|row| {
                let Value::Text(name) = &row[0] else { panic!("{row:?}") };
                let rows = writer
                    .engine
                    .execute(&format!("SELECT * FROM \"{name}\" ORDER BY rowid"), &[])
                    .unwrap()
                    .rows;
                (name.clone(), rows)
            })
            .collect()
    }

    /// Applies `txns` to `replica` in order, one log entry each.
    fn apply_all(replica: &Node, txns: &[Txn]) {
        for (index, txn) in txns.iter().enumerate() {
            assert_eq!(apply_entry(replica, index as u64 + 1, txn.clone()), Applied::Committed);
        }
    }

    #[tokio::test]
    async fn a_passive_replica_applies_write_sets_to_the_leaders_rows() {
        let mut leader = node_in(ReplicationMode::Passive);
        let replica = node_in(ReplicationMode::Active);
        leader.writer.leading(true);
        let schema = transact(
            &mut leader,
            1,
            &[
                "CREATE TABLE parent (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT)",
                "CREATE TABLE child (parent INTEGER REFERENCES parent ON DELETE CASCADE, n INTEGER)",
                "CREATE TABLE audit (what TEXT)",
                "CREATE TRIGGER log_child AFTER INSERT ON child BEGIN INSERT INTO audit VALUES ('child ' || new.n); END",
            ],
        )
        .await;
        assert!(
            matches!(schema.body, Body::Statements(_)),
            "a schema change travels as statements"
        );
        let rows = transact(
            &mut leader,
            1,
            &[
                "INSERT INTO parent (at) VALUES (datetime('now', 'localtime'))",
                "INSERT INTO parent DEFAULT VALUES",
                "INSERT INTO child VALUES (1, random()), (2, 7)",
                "SAVEPOINT s",
                "INSERT INTO child VALUES (2, 8)",
                "UPDATE child SET n = 0",
                "ROLLBACK TO s",
                "RELEASE s",
            ],
        )
        .await;
        let Body::WriteSet(write_set) = &rows.body else {
            panic!("{:?}", rows.body)
        };
        assert!(!write_set.is_empty());
        let cascade = transact(
            &mut leader,
            2,
            &["DELETE FROM parent WHERE id = 1", "UPDATE child SET n = n + 1"],
        )
        .await;
        assert!(matches!(cascade.body, Body::WriteSet(_)));
        apply_all(&replica, &[schema, rows, cascade]);
        let replicated = dump(&replica);
        assert_eq!(replicated, dump(&leader));
        let children = &replicated.iter().find(|(name, _)| name == "child").unwrap().1;
        assert_eq!(
            children,
            &vec![vec![Value::Integer(2), Value::Integer(8)]],
            "rolled back to the savepoint, cascaded"
        );
        let audit = &replicated.iter().find(|(name, _)| name == "audit").unwrap().1;
        assert_eq!(
            audit.len(),
            2,
            "the trigger's rows arrive once, not again on the replica"
        );
    }

    #[tokio::test]
    async fn auto_mode_sends_only_what_cannot_be_made_deterministic_as_a_write_set() {
        let mut leader = node_in(ReplicationMode::Auto);
        let replica = node();
        leader.writer.leading(true);
        let create = transact(&mut leader, 1, &["CREATE TABLE t (n INTEGER, at TEXT)"]).await;
        let fixed = transact(&mut leader, 1, &["INSERT INTO t VALUES (random(), CURRENT_TIMESTAMP)"]).await;
        let unfixable = transact(
            &mut leader,
            1,
            &["INSERT INTO t VALUES (1, datetime('now', 'localtime'))"],
        )
        .await;
        assert!(matches!(fixed.body, Body::Statements(_)));
        assert!(matches!(unfixable.body, Body::WriteSet(_)));
        apply_all(&replica, &[create.clone(), fixed.clone(), unfixable.clone()]);
        assert_eq!(dump(&replica), dump(&leader));
        // In one entry: statements, then a write-set (another connection), then statements.
        let one_entry = node();
        let again = transact(&mut leader, 1, &["UPDATE t SET n = n + 1"]).await;
        for txn in [create, fixed, unfixable, again] {
            assert_eq!(one_entry.writer.apply(1, txn), Applied::Committed);
        }
        one_entry.writer.entries_applied();
        assert_eq!(dump(&one_entry), dump(&leader));
        assert_eq!(one_entry.writer.applied().command, 3);

        // Active mode refuses the statement; auto refuses it beside a schema change.
        let mut active = node();
        active.writer.leading(true);
        transact(&mut active, 1, &["CREATE TABLE t (at TEXT)"]).await;
        for (node, statements) in [
            (
                &mut active,
                &["INSERT INTO t VALUES (datetime('now', 'localtime'))"][..],
            ),
            (
                &mut leader,
                &[
                    "INSERT INTO t VALUES (2, datetime('now', 'localtime'))",
                    "CREATE TABLE u (a)",
                ][..],
            ),
        ] {
            node.writer.begin(9, Label::default()).await.unwrap();
            let refused = statements.iter().try_for_each(|sql| {
                let analysis = crate::text::analyse(sql).unwrap();
                node.writer.execute(9, sql, &analysis, Vec::new()).map(drop)
            });
            assert!(refused.unwrap_err().is_nondeterministic(), "{statements:?}");
            node.writer.rollback(9);
        }
    }

    #[tokio::test]
    async fn a_session_waits_for_the_write_lock_and_gives_up_after_lock_wait() {
        let leader = node();
        leader.writer.leading(true);
        leader.writer.begin(1, Label::default()).await.unwrap();
        let started = std::time::Instant::now();
        let error = leader.writer.begin(2, Label::default()).await.unwrap_err();
        assert_eq!(error.code, "55P03");
        assert!(started.elapsed() >= Duration::from_secs(1));
        leader.writer.rollback(1);
        leader.writer.begin(2, Label::default()).await.unwrap();
    }
}
