//! The PostgreSQL wire protocol front end (simple and extended query), one session per
//! connection.
//!
//! A session's transaction runs in one of two places. Writes, and every explicit transaction
//! on the leader, run on the writer, which holds the engine's one write lock for them.
//! Reads that need no lock (autocommit SELECTs anywhere, explicit transactions on replicas or
//! declared READ ONLY) run on a reader connection of their own after a linearizable barrier,
//! and answer only once the log has every transaction they could have seen.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chorus_auth::Rights;
use chorus_log::drain::Drain;
use chorus_log::node::Pending;
use chorus_log::{NodeError, NodeHandle, ReadConsistency, Role};
use futures::{stream, SinkExt};
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::CopyResponse;
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::{ClientInfo, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::PgWireBackendMessage;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::classes::Label;
use crate::copy::{parse_copy, CopyIn, Row, RowReader};
use crate::engine::{self, Column, Outcome};
use crate::error::SqlError;
use crate::machine::{Barrier, SqlState};
use crate::readers::{Reader, Readers};
use crate::text::{analyse, chorus_setting, parameter_count, split_statements, Analysis, ChorusSetting, StatementKind};
use crate::txn::{Command, Value};
use crate::writer::{Applied, Certifying, Committed, Proposal, WriterHandle};

mod forward;
mod login;

pub use forward::{serve_forwarded, ForwardReply, ForwardRequest, Start};
use forward::{Forwarder, Unanswered};
use login::Login;
pub use login::{logins, Logins};

/// What every session of a node shares.
pub struct Shared {
    node: NodeHandle<SqlState>,
    writer: WriterHandle,
    readers: Arc<Readers>,
    next_session: AtomicU64,
    commit_timeout: Duration,
    /// Sessions start with stale reads (`--read-consistency stale`) or linearizable ones.
    stale_reads_by_default: bool,
    /// Hybrid with forwarding: sends a transaction to its classes' owner.
    forwarder: Option<Arc<Forwarder>>,
    /// Hybrid: the transactions other nodes forwarded here, open.
    remotes: Arc<forward::Remotes>,
    access: Access,
    /// The node's shutdown: client connections and forwarded statements open, and whether it
    /// began.
    drain: Arc<Drain>,
}

/// What a drain left open when its time ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOpen {
    pub connections: usize,
    pub forwarded: usize,
}

/// How clients reach the node.
pub struct Access {
    /// With users configured: clients log in (`login`).
    pub logins: Option<Arc<Logins>>,
    /// With a certificate: clients connect over TLS only.
    pub tls: Option<Arc<chorus_tls::ServerTls>>,
}

/// Forwarding a hybrid transaction to its classes' owner (`chorus sql --sql-forward`).
pub struct Forwarding {
    pub calls: Arc<chorus_log::PeerCalls>,
}

/// The session setting choosing between linearizable and stale reads, as the key-value side's
/// `--read-consistency` and READONLY / READWRITE do.
const READ_CONSISTENCY: &str = "chorus.read_consistency";

impl Shared {
    /// `commit_timeout`: how long a COMMIT waits for the log before its outcome is unknown;
    /// `read_consistency`: the sessions' reads until they `SET chorus.read_consistency`.
    pub fn new(
        node: NodeHandle<SqlState>,
        writer: WriterHandle,
        readers: Arc<Readers>,
        commit_timeout: Duration,
        read_consistency: ReadConsistency,
        forwarding: Option<Forwarding>,
        access: Access,
    ) -> Arc<Self> {
        tokio::spawn(tell_writer_when_leading(node.clone(), writer.clone()));
        // A forwarded statement may wait for the write lock, for classes it borrows (as long
        // again) and, a COMMIT, for the log.
        let forward_timeout = writer.lock_wait() * 2 + commit_timeout + Duration::from_secs(1);
        let forwarder = forwarding.map(|f| Arc::new(Forwarder::new(f.calls, forward_timeout)));
        Arc::new(Shared {
            forwarder,
            remotes: Arc::default(),
            access,
            drain: Drain::new(),
            node,
            writer,
            readers,
            next_session: AtomicU64::new(1),
            commit_timeout,
            stale_reads_by_default: read_consistency == ReadConsistency::Stale,
        })
    }

    /// The database made durable and marked closed (`WriterHandle::close`).
    pub fn close_database(&self) -> Result<(), SqlError> {
        self.writer.close()
    }

    /// Shuts the front end down, as PostgreSQL's smart shutdown does but bounded by `within`: no
    /// new clients or forwarded transactions; a session with no transaction open is told so
    /// (57P01) and closed, the others once their transaction ends — so a COMMIT under way gets
    /// its outcome rather than a broken connection. What was still open when `within` ran out.
    pub async fn drain(&self, within: Duration) -> Result<(), LeftOpen> {
        let left_open = || LeftOpen {
            connections: self.drain.open_connections(),
            forwarded: self.remotes.open_count(),
        };
        let nothing = LeftOpen {
            connections: 0,
            forwarded: 0,
        };
        let drained = self.drain.run(within, || left_open() == nothing).await;
        // The last answers to forwarded statements leave through the peer links' own tasks.
        tokio::time::sleep(PEER_REPLIES_FLUSH).await;
        match drained {
            true => Ok(()),
            false => Err(left_open()),
        }
    }

    fn is_closing(&self) -> bool {
        self.drain.is_draining()
    }

    /// Waits until this node has applied everything committed when the read began (ReadIndex),
    /// in the database too (hybrid transactions may wait there for the write lock).
    async fn read_barrier(&self) -> Result<(), SqlError> {
        self.node
            .read(Barrier, ReadConsistency::Linearizable)
            .await
            .map(drop)
            .map_err(|e| SqlError::unavailable(&format!("cannot serve a linearizable read now: {e}")))?;
        tokio::time::timeout(self.commit_timeout, self.writer.progress.certified())
            .await
            .map_err(|_| SqlError::unavailable("the database did not catch up with the log in time; retry the read"))
    }

    /// Waits until the log has applied the first `executed` transactions this node executed
    /// ahead: a read that may have seen them answers only then.
    async fn confirmed(&self, executed: u64) -> Result<(), SqlError> {
        tokio::time::timeout(self.commit_timeout, self.writer.progress.confirmed(executed))
            .await
            .map_err(|_| SqlError::unavailable("the log has not confirmed what this read saw in time; retry it"))
    }

    /// Runs a read on a reader connection (off the node's thread), as its engine reads it.
    async fn run_on_reader(
        &self,
        mut reader: Reader,
        analysis: &Analysis,
        params: Vec<Value>,
    ) -> (Reader, Result<Outcome, SqlError>) {
        let sql = analysis.numbered(self.readers.database().dialect());
        let (conn, outcome) = reader.conn.run(sql, params).await;
        reader.conn = conn;
        (reader, outcome)
    }

    /// Ends a COMMIT the writer took. A transaction that changed nothing may still have read
    /// others' transactions committed ahead: it too waits until the log has them.
    async fn finish(&self, committed: Committed) -> Result<(), SqlError> {
        match committed {
            Committed::Ahead(proposed) => self.replicate(proposed).await,
            Committed::Certifying(certifying) => self.certify(certifying).await,
            Committed::Nothing { rolled_back: true } => Ok(()),
            Committed::Nothing { rolled_back: false } => self.confirmed(self.writer.progress.executed()).await,
        }
    }

    /// Waits until a hybrid transaction is certified and, if it passed, in this node's database.
    async fn certify(&self, certifying: Certifying) -> Result<(), SqlError> {
        let Certifying { proposed, outcome } = certifying;
        let certified = async {
            applied_in_log(proposed).await?;
            outcome
                .await
                .map_err(|_| SqlError::outcome_unknown("the node stopped before it certified the transaction"))
        };
        self.commit_ends(
            certified,
            "could not serialize access: a transaction the log ordered after this one's snapshot \
             touched a conflict class it touched (or one of its rows); retry it",
        )
        .await
    }

    /// Waits until the log has applied a transaction committed ahead.
    async fn replicate(
        &self,
        proposed: oneshot::Receiver<Result<Pending<Applied>, NodeError>>,
    ) -> Result<(), SqlError> {
        self.commit_ends(
            applied_in_log(proposed),
            "the transaction ran on a leader that lost its place in the log; retry it",
        )
        .await
    }

    /// What a COMMIT answers once `applied` says what became of its transaction (`void`: why it
    /// changed nothing), or the commit timeout passed.
    async fn commit_ends(
        &self,
        applied: impl std::future::Future<Output = Result<Applied, SqlError>>,
        void: &str,
    ) -> Result<(), SqlError> {
        match tokio::time::timeout(self.commit_timeout, applied).await {
            Err(_) => Err(SqlError::outcome_unknown(
                "the log did not commit the transaction in time",
            )),
            Ok(Err(e)) => Err(e),
            Ok(Ok(Applied::Committed)) => Ok(()),
            Ok(Ok(Applied::Void)) => Err(SqlError::serialization(void)),
        }
    }
}

/// Waits until the log has applied a proposed transaction; what applying it did.
async fn applied_in_log(proposed: oneshot::Receiver<Result<Pending<Applied>, NodeError>>) -> Result<Applied, SqlError> {
    let pending = proposed
        .await
        .map_err(|_| SqlError::outcome_unknown("the node stopped proposing"))?
        .map_err(|e| SqlError::outcome_unknown(&format!("the transaction was not proposed: {e}")))?;
    pending
        .await
        .map_err(|_| SqlError::outcome_unknown("the node stopped before the transaction applied"))?
        .map_err(|e| SqlError::outcome_unknown(&format!("the log did not confirm the transaction: {e}")))
}

/// Proposes transactions in the order the writer committed them.
pub async fn propose_in_order(
    node: NodeHandle<SqlState>,
    writer: WriterHandle,
    mut queue: mpsc::UnboundedReceiver<Proposal>,
) {
    while let Some((command, reply)) = queue.recv().await {
        let proposed = node.submit_write(command.encode().into()).await;
        if let (Err(_), Command::Txn(txn)) = (&proposed, &command) {
            writer.proposal_lost(txn.id);
        }
        let _ = reply.send(proposed);
    }
}

/// Tells the writer when this node leads with everything earlier leaders committed applied
/// (only then may it execute ahead of the log) and when it stops — also when it leads again in
/// a later term, which it may have lost in between, with its uncommitted entries.
async fn tell_writer_when_leading(node: NodeHandle<SqlState>, writer: WriterHandle) {
    let mut leading_term = None;
    loop {
        let status = node.status();
        if leading_term.is_some_and(|term| status.role != Role::Leader || status.term != term) {
            leading_term = None;
            writer.leading(false);
        }
        if leading_term.is_none()
            && status.role == Role::Leader
            && status.commit_index == status.last_index
            && status.applied_index >= status.commit_index
        {
            leading_term = Some(status.term);
            writer.leading(true);
        }
        node.status_changed(Duration::from_millis(100)).await;
    }
}

/// How long a drained node still runs for its peer links to send what it answered last.
const PEER_REPLIES_FLUSH: Duration = Duration::from_millis(100);

/// Serves PostgreSQL clients on `listener` until the node drains (then the listener closes and
/// new clients are refused).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut closing = shared.drain.signal();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = closing.wait_for(|closing| *closing) => return,
        };
        let (socket, _) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a SQL client failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let session = Arc::new(Session::new(shared.clone(), true));
        let login = Arc::new(Login::new(session.clone(), shared.access.logins.clone()));
        let open = shared.drain.connection();
        tokio::spawn(async move {
            let tls = session.shared.access.tls.clone();
            let closing = crate::wire::Closing {
                signal: session.shared.drain.signal(),
                idle: Box::new({
                    let session = session.clone();
                    move || session.is_idle()
                }),
            };
            if let Err(e) = crate::wire::converse(socket, Handlers(session, login), tls.as_deref(), closing).await {
                tracing::debug!(error = %e, "SQL client connection ended");
            }
            drop(open);
        });
    }
}

struct Handlers(Arc<Session>, Arc<Login>);

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.0.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.0.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        self.1.clone()
    }

    fn error_handler(&self) -> Arc<impl pgwire::api::ErrorHandler> {
        self.1.clone()
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.0.clone()
    }
}

enum TxnState {
    Idle,
    Open(Open),
}

/// An explicit transaction in progress.
struct Open {
    read_only: bool,
    /// Where it runs, once its first statement chose.
    place: Option<Place>,
    failed: bool,
}

enum Place {
    Writer,
    /// On its classes' owner, `owner`, which knows it as `txn`; `next_seq` numbers the next
    /// statement sent there.
    Forwarded {
        owner: u64,
        txn: u64,
        next_seq: u32,
    },
    /// A reader connection inside BEGIN, and how many transactions had been executed ahead by
    /// the end of its first read (which took its snapshot): every one it can see.
    Reader(Option<Reader>, Option<u64>),
}

/// One client connection.
struct Session {
    id: u64,
    shared: Arc<Shared>,
    state: tokio::sync::Mutex<TxnState>,
    parser: Arc<Parser>,
    /// Reads skip the ReadIndex barrier: served from this node's state, which may be behind
    /// (never ahead of the log: they still wait for work executed ahead to commit).
    stale_reads: AtomicBool,
    /// A `COPY ... FROM STDIN` taking rows.
    copying: std::sync::Mutex<Option<Copying>>,
    /// Its transactions may be forwarded to their classes' owner (not when it runs forwarded
    /// ones: the owner runs them whoever owns what by then).
    forwards: bool,
    /// What its user may run, once logged in (unset: nothing).
    rights: std::sync::OnceLock<Rights>,
}

/// A COPY in progress: its rows go into the session's transaction as they arrive.
struct Copying {
    target: CopyIn,
    reader: RowReader,
    rows: u64,
    /// The COPY is a transaction of its own (not inside BEGIN … COMMIT).
    autocommit: bool,
    /// The first error: the rest of the data is ignored, and the COPY fails when it ends.
    failed: Option<SqlError>,
}

/// Rows of COPY data per INSERT, times the row's width.
const COPY_VALUES_PER_INSERT: usize = 1000;

impl Drop for Session {
    fn drop(&mut self) {
        match self.state.get_mut() {
            TxnState::Open(Open {
                place: Some(Place::Writer),
                ..
            }) => self.shared.writer.rollback(self.id),
            TxnState::Open(Open {
                place: Some(Place::Forwarded { owner, txn, .. }),
                ..
            }) => {
                if let Some(forwarder) = &self.shared.forwarder {
                    forwarder.abandon(*owner, *txn);
                }
            }
            _ => {}
        }
    }
}

impl NoopStartupHandler for Session {}

/// A command tag as PostgreSQL words it (`INSERT 0 1`, `UPDATE 2`, `CREATE TABLE`).
#[derive(Debug, Clone, PartialEq)]
pub struct CommandTag {
    pub command: String,
    pub oid: Option<u32>,
    pub rows: Option<u64>,
}

impl CommandTag {
    fn new(command: &str) -> CommandTag {
        CommandTag {
            command: command.to_owned(),
            oid: None,
            rows: None,
        }
    }

    fn to_tag(&self) -> Tag {
        let tag = Tag::new(&self.command);
        let tag = match self.oid {
            Some(oid) => tag.with_oid(oid),
            None => tag,
        };
        match self.rows {
            Some(rows) => tag.with_rows(rows as usize),
            None => tag,
        }
    }
}

/// What a statement answers, before it is encoded for the client.
enum Answer {
    Rows(Outcome, &'static str),
    Done(CommandTag),
    Began,
    Ended(&'static str),
    /// COPY FROM STDIN of this many named columns (0: all) is taking data.
    CopyIn(usize),
}

impl Session {
    fn new(shared: Arc<Shared>, forwards: bool) -> Session {
        let session = Session {
            id: shared.next_session.fetch_add(1, Ordering::Relaxed),
            parser: Arc::new(Parser { shared: shared.clone() }),
            stale_reads: AtomicBool::new(shared.stale_reads_by_default),
            shared,
            state: tokio::sync::Mutex::new(TxnState::Idle),
            copying: std::sync::Mutex::new(None),
            forwards,
            rights: std::sync::OnceLock::new(),
        };
        // Without users anyone may do anything; a forwarded transaction's session runs for a
        // peer, whose own session checked its client's rights.
        if session.shared.access.logins.is_none() || !forwards {
            session.logged_in(Rights::ReadWrite);
        }
        session
    }

    /// No transaction open and no COPY under way: the session may be closed between statements.
    fn is_idle(&self) -> bool {
        let no_copy = self.copying.lock().expect("the COPY lock is never poisoned").is_none();
        no_copy
            && self
                .state
                .try_lock()
                .is_ok_and(|state| matches!(*state, TxnState::Idle))
    }

    fn logged_in(&self, rights: Rights) {
        let set = self.rights.set(rights);
        assert!(set.is_ok(), "a session logs in once");
    }

    /// Refuses what its user may not run: a read-only user runs reads, alone or in transactions
    /// (which then run on a reader), and session settings.
    fn permits(&self, kind: StatementKind) -> Result<(), SqlError> {
        match self.rights.get().copied().unwrap_or(Rights::None) {
            Rights::ReadWrite => Ok(()),
            Rights::Read if kind != StatementKind::Write => Ok(()),
            Rights::Read => Err(SqlError::new(
                "42501",
                "permission denied: this user may only read (+@read in the ACL file)",
            )),
            Rights::None => Err(SqlError::new(
                "42501",
                "permission denied: this user may run nothing (-@all in the ACL file)",
            )),
        }
    }

    async fn run(&self, sql: &str, params: Vec<Value>) -> Result<Answer, SqlError> {
        let analysis = analyse(sql)?;
        let kind = analysis.kind;
        self.permits(kind)?;
        let names_setting = kind == StatementKind::Setting
            || (kind == StatementKind::Read && sql.get(..4).is_some_and(|w| w.eq_ignore_ascii_case("SHOW")));
        if let Some(setting) = names_setting.then(|| chorus_setting(sql)).flatten() {
            return self.chorus_setting(sql, setting);
        }
        let mut state = self.state.lock().await;
        if &*analysis.verb == "COPY" {
            let copy = parse_copy(sql)?.ok_or_else(|| SqlError::syntax("not a COPY statement"))?;
            return self.start_copy(copy, &mut state).await;
        }
        match (kind, &mut *state) {
            (StatementKind::Setting, _) => Ok(Answer::Done(CommandTag::new(&leading_words(sql, 1)))),
            (StatementKind::Begin { .. }, TxnState::Open(_)) => Ok(Answer::Began),
            (StatementKind::Begin { read_only }, TxnState::Idle) => {
                *state = TxnState::Open(Open {
                    // A read-only user's transaction runs on a reader: it cannot write there.
                    read_only: read_only || self.rights.get() == Some(&Rights::Read),
                    place: None,
                    failed: false,
                });
                Ok(Answer::Began)
            }
            (StatementKind::Commit, TxnState::Idle) => Ok(Answer::Ended("COMMIT")),
            (StatementKind::Rollback, TxnState::Idle) => Ok(Answer::Ended("ROLLBACK")),
            (StatementKind::Commit, TxnState::Open(_)) => {
                let TxnState::Open(open) = std::mem::replace(&mut *state, TxnState::Idle) else {
                    unreachable!("matched Open")
                };
                self.commit(open).await
            }
            (StatementKind::Rollback, TxnState::Open(_)) => {
                let TxnState::Open(open) = std::mem::replace(&mut *state, TxnState::Idle) else {
                    unreachable!("matched Open")
                };
                match open.place {
                    Some(Place::Writer) => self.shared.writer.rollback(self.id),
                    Some(Place::Forwarded { owner, txn, next_seq }) => {
                        // Awaited: the owner's write lock is free before the client goes on.
                        let _ = self
                            .forward(owner, txn, next_seq, Start::Continue, sql, Vec::new())
                            .await;
                    }
                    _ => {}
                }
                Ok(Answer::Ended("ROLLBACK"))
            }
            (_, TxnState::Open(open)) => {
                if open.failed {
                    return Err(SqlError::in_failed_transaction());
                }
                let result = self.run_in_transaction(open, &analysis, sql, params).await;
                if result.is_err() {
                    open.failed = true;
                }
                result
            }
            (StatementKind::Read, TxnState::Idle) => {
                self.read_barrier().await?;
                let reader = self.shared.readers.take()?;
                let (reader, outcome) = self.shared.run_on_reader(reader, &analysis, params).await;
                // Counted after the read, which may have seen anything executed until it ended.
                let executed = self.shared.writer.progress.executed();
                self.shared.readers.give_back(reader);
                let outcome = outcome?;
                self.shared.confirmed(executed).await?;
                Ok(Answer::Rows(outcome, "SELECT"))
            }
            (_, TxnState::Idle) => {
                let label = self.shared.writer.label(sql, kind, &params);
                match self.forward_first(&label, Start::Autocommit, sql, &params).await {
                    Some((_, _, Ok(answer))) => return answer,
                    Some((owner, _, Err(Unanswered::TimedOut))) => {
                        return Err(SqlError::outcome_unknown(&format!(
                            "node {owner}, the owner of the statement's classes, did not answer in time"
                        )))
                    }
                    // Not forwarded, or never sent: it runs here.
                    None | Some((_, _, Err(Unanswered::NotSent))) => {}
                }
                self.take_writer(label).await?;
                let reached = self.shared.writer.reach(self.id, sql, kind, &params).await;
                let outcome = match reached.and_then(|()| self.shared.writer.execute(self.id, sql, &analysis, params)) {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        self.shared.writer.rollback(self.id);
                        return Err(e);
                    }
                };
                self.shared.finish(self.shared.writer.commit(self.id)?).await?;
                Ok(statement_answer(sql, &analysis.verb, outcome))
            }
        }
    }

    async fn run_in_transaction(
        &self,
        open: &mut Open,
        analysis: &Analysis,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<Answer, SqlError> {
        if open.place.is_none() {
            let writes_here = self.shared.writer.every_node_writes() || self.shared.node.status().role == Role::Leader;
            open.place = Some(if writes_here && !open.read_only {
                let label = self.shared.writer.label(sql, analysis.kind, &params);
                match self.forward_first(&label, Start::Begin, sql, &params).await {
                    Some((owner, txn, Ok(answer))) => {
                        open.place = Some(Place::Forwarded {
                            owner,
                            txn,
                            next_seq: 1,
                        });
                        return answer;
                    }
                    // It may have begun there: roll it back, and run it here.
                    Some((owner, txn, Err(Unanswered::TimedOut))) => self.forwarder().abandon(owner, txn),
                    None | Some((_, _, Err(Unanswered::NotSent))) => {}
                }
                self.take_writer(label).await?;
                Place::Writer
            } else {
                self.read_barrier().await?;
                let mut reader = self.shared.readers.take()?;
                reader.conn.begin()?;
                Place::Reader(Some(reader), None)
            });
        }
        match open.place.as_mut().expect("chosen above") {
            Place::Forwarded { owner, txn, next_seq } => {
                let (owner, txn, seq) = (*owner, *txn, *next_seq);
                *next_seq += 1;
                self.forward(owner, txn, seq, Start::Continue, sql, params)
                    .await
                    .unwrap_or_else(|_| {
                        self.forwarder().abandon(owner, txn);
                        Err(SqlError::serialization(&format!(
                            "node {owner}, where the transaction ran (the owner of its classes), did not \
                             answer in time; it is rolled back there, retry it"
                        )))
                    })
            }
            Place::Writer => {
                self.shared.writer.reach(self.id, sql, analysis.kind, &params).await?;
                Ok(statement_answer(
                    sql,
                    &analysis.verb,
                    self.shared.writer.execute(self.id, sql, analysis, params)?,
                ))
            }
            Place::Reader(conn, executed) => {
                if analysis.kind != StatementKind::Read {
                    return Err(if open.read_only {
                        SqlError::new("25006", "cannot write in a read-only transaction")
                    } else {
                        SqlError::read_only(self.shared.node.status().leader_id)
                    });
                }
                let taken = conn.take().expect("a reader transaction keeps its connection");
                let (back, outcome) = self.shared.run_on_reader(taken, analysis, params).await;
                *conn = Some(back);
                let executed = *executed.get_or_insert_with(|| self.shared.writer.progress.executed());
                let outcome = outcome?;
                self.shared.confirmed(executed).await?;
                Ok(Answer::Rows(outcome, "SELECT"))
            }
        }
    }

    async fn commit(&self, open: Open) -> Result<Answer, SqlError> {
        match open.place {
            None => Ok(Answer::Ended(if open.failed { "ROLLBACK" } else { "COMMIT" })),
            Some(Place::Forwarded { owner, txn, next_seq }) => {
                match self
                    .forward(owner, txn, next_seq, Start::Continue, "COMMIT", Vec::new())
                    .await
                {
                    Ok(answer) => answer,
                    Err(Unanswered::NotSent) => {
                        self.forwarder().abandon(owner, txn);
                        Err(SqlError::serialization(&format!(
                            "the COMMIT could not be sent to node {owner}, where the transaction ran; \
                             it is rolled back there, retry it"
                        )))
                    }
                    Err(Unanswered::TimedOut) => Err(SqlError::outcome_unknown(&format!(
                        "node {owner}, where the transaction ran (the owner of its classes), did not \
                         answer the COMMIT in time"
                    ))),
                }
            }
            Some(Place::Reader(reader, _)) => {
                if let Some(mut reader) = reader {
                    reader.conn.end();
                    self.shared.readers.give_back(reader);
                }
                Ok(Answer::Ended(if open.failed { "ROLLBACK" } else { "COMMIT" }))
            }
            Some(Place::Writer) => {
                let committed = self.shared.writer.commit(self.id)?;
                let rolled_back = matches!(committed, Committed::Nothing { rolled_back: true });
                self.shared.finish(committed).await?;
                Ok(Answer::Ended(if rolled_back { "ROLLBACK" } else { "COMMIT" }))
            }
        }
    }

    /// Takes the write lock for a COPY's rows (its own transaction, or the open one's).
    async fn start_copy(&self, copy: CopyIn, state: &mut TxnState) -> Result<Answer, SqlError> {
        let autocommit = match state {
            TxnState::Idle => {
                self.take_writer(Label::global()).await?;
                true
            }
            TxnState::Open(open) => {
                if open.failed {
                    return Err(SqlError::in_failed_transaction());
                }
                match open.place {
                    Some(Place::Writer) => {}
                    Some(Place::Forwarded { owner, .. }) => {
                        return Err(SqlError::unsupported(format!(
                            "COPY inside a transaction that runs on node {owner}, the owner of its \
                             classes: run the COPY in a transaction of its own, or begin with it"
                        )))
                    }
                    None if !open.read_only => {
                        self.take_writer(Label::global()).await?;
                        open.place = Some(Place::Writer);
                    }
                    _ => {
                        return Err(SqlError::new(
                            "25006",
                            "cannot COPY into a table in a read-only transaction",
                        ))
                    }
                }
                false
            }
        };
        let columns = copy.columns.len();
        *self.copying.lock().expect("the COPY lock is never poisoned") = Some(Copying {
            reader: RowReader::new(copy.format.clone()),
            target: copy,
            rows: 0,
            autocommit,
            failed: None,
        });
        Ok(Answer::CopyIn(columns))
    }

    /// Runs `rows` of a COPY as INSERTs in the session's transaction.
    fn insert_rows(&self, copying: &mut Copying, rows: Vec<Row>) -> Result<(), SqlError> {
        let Some(width) = rows.first().map(Vec::len) else {
            return Ok(());
        };
        let expected = copying.target.columns.len();
        if let Some(bad) = rows
            .iter()
            .find(|row| row.len() != width || (expected > 0 && row.len() != expected))
        {
            return Err(SqlError::new(
                "22P04",
                format!(
                    "a COPY row has {} fields where {} were expected",
                    bad.len(),
                    if expected > 0 { expected } else { width }
                ),
            ));
        }
        let columns = if expected > 0 {
            format!(" ({})", copying.target.columns.join(", "))
        } else {
            String::new()
        };
        for chunk in rows.chunks((COPY_VALUES_PER_INSERT / width.max(1)).max(1)) {
            let tuples: Vec<String> = (0..chunk.len())
                .map(|r| {
                    let slots: Vec<String> = (1..=width).map(|c| format!("?{}", r * width + c)).collect();
                    format!("({})", slots.join(", "))
                })
                .collect();
            let sql = format!(
                "INSERT INTO {}{columns} VALUES {}",
                copying.target.table,
                tuples.join(", ")
            );
            let params = chunk
                .iter()
                .flatten()
                .map(|field| field.clone().map_or(Value::Null, Value::Text))
                .collect();
            let analysis = analyse(&sql)?;
            self.shared.writer.execute(self.id, &sql, &analysis, params)?;
            copying.rows += chunk.len() as u64;
        }
        Ok(())
    }

    /// Ends a COPY: commits it if it is its own transaction; a failed one fails the open
    /// transaction, as in PostgreSQL.
    async fn end_copy(&self, failure: Option<SqlError>) -> Result<u64, SqlError> {
        let copying = self.copying.lock().expect("the COPY lock is never poisoned").take();
        let Some(mut copying) = copying else {
            return Err(SqlError::new("08P01", "COPY data without a COPY in progress"));
        };
        let ended = match failure.or(copying.failed.take()) {
            Some(e) => Err(e),
            None => {
                let rows = copying.reader.finish();
                rows.and_then(|rows| self.insert_rows(&mut copying, rows))
            }
        };
        if let Err(e) = ended {
            if copying.autocommit {
                self.shared.writer.rollback(self.id);
            } else if let TxnState::Open(open) = &mut *self.state.lock().await {
                open.failed = true;
            }
            return Err(e);
        }
        if copying.autocommit {
            self.shared.finish(self.shared.writer.commit(self.id)?).await?;
        }
        Ok(copying.rows)
    }

    async fn read_barrier(&self) -> Result<(), SqlError> {
        if self.stale_reads.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.shared.read_barrier().await
    }

    fn chorus_setting(&self, sql: &str, setting: ChorusSetting) -> Result<Answer, SqlError> {
        match setting {
            ChorusSetting::Set { name, value } if name == READ_CONSISTENCY => {
                let stale = match value.as_deref() {
                    None => self.shared.stale_reads_by_default,
                    Some("linearizable") => false,
                    Some("stale") => true,
                    Some(other) => {
                        return Err(SqlError::new(
                            "22023",
                            format!("{READ_CONSISTENCY} is 'linearizable' or 'stale', not '{other}'"),
                        ))
                    }
                };
                self.stale_reads.store(stale, Ordering::Relaxed);
                Ok(Answer::Done(CommandTag::new(&leading_words(sql, 1))))
            }
            ChorusSetting::Show { name } if name == READ_CONSISTENCY => {
                let stale = self.stale_reads.load(Ordering::Relaxed);
                let outcome = Outcome {
                    columns: vec![Column {
                        name,
                        declared: Some("TEXT".into()),
                        function: None,
                    }],
                    rows: vec![vec![Value::Text(if stale { "stale" } else { "linearizable" }.into())]],
                    changes: 0,
                    read_only: true,
                };
                Ok(Answer::Rows(outcome, "SHOW"))
            }
            ChorusSetting::Set { name, .. } | ChorusSetting::Show { name } => Err(SqlError::new(
                "42704",
                format!("unrecognized configuration parameter \"{name}\" ({READ_CONSISTENCY} is Chorus's one)"),
            )),
        }
    }

    /// The node a transaction whose first statement touches `label` runs on instead of this
    /// one: the owner of its classes, if that is another node that seems up.
    fn forward_target(&self, label: &Label) -> Option<u64> {
        let forwarder = self.shared.forwarder.as_ref().filter(|_| self.forwards)?;
        forwarder.reachable(self.shared.writer.owner_elsewhere(label)?)
    }

    fn forwarder(&self) -> &Arc<Forwarder> {
        self.shared.forwarder.as_ref().expect("forwarding needs the forwarder")
    }

    /// Sends a transaction's first statement to the owner of `label`'s classes if it is to be
    /// forwarded: the owner, its number for the transaction there, and what became of it.
    async fn forward_first(
        &self,
        label: &Label,
        start: Start,
        sql: &str,
        params: &[Value],
    ) -> Option<(u64, u64, Result<Result<Answer, SqlError>, Unanswered>)> {
        let owner = self.forward_target(label)?;
        let txn = self.forwarder().next_txn();
        let sent = match self.forward(owner, txn, 0, start, sql, params.to_vec()).await {
            // The owner is shutting down and began nothing: the transaction runs here.
            Ok(Err(e)) if e.code == SqlError::ADMIN_SHUTDOWN => {
                self.forwarder().keep_off(owner);
                Err(Unanswered::NotSent)
            }
            sent => sent,
        };
        if sent.is_ok() {
            self.forwarder().count_forward();
        }
        Some((owner, txn, sent))
    }

    /// Runs statement `seq` of forwarded transaction `txn` on `owner`.
    async fn forward(
        &self,
        owner: u64,
        txn: u64,
        seq: u32,
        start: Start,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<Result<Answer, SqlError>, Unanswered> {
        let request = ForwardRequest::Statement {
            txn,
            seq,
            start,
            sql: sql.to_owned(),
            params,
        };
        Ok(self.forwarder().call(owner, request).await?.into())
    }

    /// Takes the write lock for a transaction whose first statement touches `first`.
    async fn take_writer(&self, first: Label) -> Result<(), SqlError> {
        let writer = &self.shared.writer;
        if writer.every_node_writes() {
            return writer.begin(self.id, first).await;
        }
        let deadline = std::time::Instant::now() + writer.lock_wait();
        loop {
            let status = self.shared.node.status();
            if status.role != Role::Leader {
                return Err(SqlError::read_only(status.leader_id));
            }
            if writer.is_leading() || std::time::Instant::now() >= deadline {
                return writer.begin(self.id, first).await;
            }
            // Elected a moment ago: it writes once it has applied what earlier leaders
            // committed, which a client had rather wait out than be refused for.
            self.shared.node.status_changed(Duration::from_millis(10)).await;
        }
    }
}

/// The first `n` words of a statement, upper-cased: its command tag.
fn leading_words(sql: &str, n: usize) -> String {
    sql.split_whitespace()
        .take(n)
        .map(str::to_ascii_uppercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The answer to a statement that ran: its rows, or the command tag PostgreSQL gives.
fn statement_answer(sql: &str, verb: &str, outcome: Outcome) -> Answer {
    if !outcome.columns.is_empty() {
        return Answer::Rows(
            outcome,
            match verb {
                "INSERT" => "INSERT 0",
                "UPDATE" => "UPDATE",
                "DELETE" => "DELETE",
                _ => "SELECT",
            },
        );
    }
    let rows = outcome.changes;
    let counted = |command: &str, oid| CommandTag {
        command: command.to_owned(),
        oid,
        rows: Some(rows),
    };
    Answer::Done(match verb {
        "INSERT" | "REPLACE" => counted("INSERT", Some(0)),
        "UPDATE" | "DELETE" => counted(verb, None),
        "CREATE" | "DROP" | "ALTER" => CommandTag::new(&leading_words(sql, 2)),
        _ => CommandTag::new(verb),
    })
}

/// The PostgreSQL type a column answers with: from the type its table declares (SQLite's
/// affinity rules), else from the function computing it (`count(*)` is a bigint); other
/// expressions answer as text.
fn column_type(declared: Option<&str>, function: Option<&str>) -> Type {
    let Some(declared) = declared.map(str::to_ascii_uppercase) else {
        return match function {
            Some("count" | "length" | "instr" | "unicode" | "random" | "changes" | "last_insert_rowid") => Type::INT8,
            Some("avg" | "total" | "julianday") => Type::FLOAT8,
            _ => Type::TEXT,
        };
    };
    if declared.contains("INT") {
        Type::INT8
    } else if declared.contains("CHAR") || declared.contains("CLOB") || declared.contains("TEXT") {
        Type::TEXT
    } else if declared.contains("BOOL") {
        Type::BOOL
    } else if declared.contains("BLOB") || declared == "BYTEA" {
        Type::BYTEA
    } else if ["REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL"]
        .iter()
        .any(|t| declared.contains(t))
    {
        Type::FLOAT8
    } else {
        Type::TEXT
    }
}

fn fields(columns: &[engine::Column], format: &Format) -> Vec<FieldInfo> {
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            FieldInfo::new(
                c.name.clone(),
                None,
                None,
                column_type(c.declared.as_deref(), c.function.as_deref()),
                format.format_for(i),
            )
        })
        .collect()
}

fn as_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::Integer(i) => Some(i.to_string()),
        Value::Real(f) => Some(f.to_string()),
        Value::Text(t) => Some(t.clone()),
        Value::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
    }
}

fn mismatch(value: &Value, ty: &Type) -> PgWireError {
    user_error(SqlError::new(
        "22P02",
        format!("a stored value {value:?} is not a valid {}", ty.name()),
    ))
}

/// Encodes one value as the column's type (SQLite lets any column hold any value).
fn encode_value(encoder: &mut DataRowEncoder, field: &FieldInfo, value: &Value) -> PgWireResult<()> {
    let ty = field.datatype();
    match (ty, value) {
        (_, Value::Null) => encoder.encode_field(&None::<String>),
        (&Type::INT8, Value::Integer(i)) => encoder.encode_field(i),
        (&Type::INT8, Value::Real(f)) if f.fract() == 0.0 => encoder.encode_field(&(*f as i64)),
        (&Type::INT8, Value::Text(t)) => {
            encoder.encode_field(&t.trim().parse::<i64>().map_err(|_| mismatch(value, ty))?)
        }
        (&Type::FLOAT8, Value::Real(f)) => encoder.encode_field(f),
        (&Type::FLOAT8, Value::Integer(i)) => encoder.encode_field(&(*i as f64)),
        (&Type::FLOAT8, Value::Text(t)) => {
            encoder.encode_field(&t.trim().parse::<f64>().map_err(|_| mismatch(value, ty))?)
        }
        (&Type::BOOL, Value::Integer(i)) => encoder.encode_field(&(*i != 0)),
        (&Type::BYTEA, Value::Blob(b)) => encoder.encode_field(b),
        (&Type::BYTEA, Value::Text(t)) => encoder.encode_field(&t.as_bytes()),
        (&Type::TEXT, _) => encoder.encode_field(&as_text(value)),
        _ => Err(mismatch(value, ty)),
    }
}

fn query_response(outcome: Outcome, tag: &str, format: &Format) -> PgWireResult<QueryResponse> {
    let schema = Arc::new(fields(&outcome.columns, format));
    let mut rows = Vec::with_capacity(outcome.rows.len());
    let mut encoder = DataRowEncoder::new(schema.clone());
    for row in &outcome.rows {
        for (field, value) in schema.iter().zip(row) {
            encode_value(&mut encoder, field, value)?;
        }
        rows.push(Ok(encoder.take_row()));
    }
    let mut response = QueryResponse::new(schema, stream::iter(rows));
    response.set_command_tag(tag);
    Ok(response)
}

fn user_error(e: SqlError) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("ERROR".into(), e.code.into(), e.message)))
}

fn error_response(e: SqlError) -> Response {
    Response::Error(Box::new(ErrorInfo::new("ERROR".into(), e.code.into(), e.message)))
}

fn response(answer: Answer, format: &Format) -> PgWireResult<Response> {
    Ok(match answer {
        Answer::Rows(outcome, tag) => Response::Query(query_response(outcome, tag, format)?),
        Answer::Done(tag) => Response::Execution(tag.to_tag()),
        Answer::Began => Response::TransactionStart(Tag::new("BEGIN")),
        Answer::Ended(tag) => Response::TransactionEnd(Tag::new(tag)),
        Answer::CopyIn(columns) => Response::CopyIn(CopyResponse::new(0, columns, stream::empty())),
    })
}

#[async_trait]
impl SimpleQueryHandler for Session {
    async fn do_query<C>(&self, _client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let statements = match split_statements(query) {
            Ok(statements) => statements,
            Err(e) => return Ok(vec![error_response(e)]),
        };
        // The client sends COPY data once the query string's answers stop at the COPY.
        if statements.len() > 1 && statements.iter().any(|s| analyse(s).is_ok_and(|a| &*a.verb == "COPY")) {
            return Ok(vec![error_response(SqlError::unsupported(
                "COPY FROM STDIN must be the only statement of its query string".into(),
            ))]);
        }
        let mut responses = Vec::with_capacity(statements.len());
        for statement in statements {
            match self.run(&statement, Vec::new()).await {
                Ok(answer) => responses.push(response(answer, &Format::UnifiedText)?),
                Err(e) => {
                    // PostgreSQL stops a query string at its first error.
                    responses.push(error_response(e));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

#[async_trait]
impl CopyHandler for Session {
    async fn on_copy_data<C>(&self, _client: &mut C, data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + futures::Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as futures::Sink<PgWireBackendMessage>>::Error>,
    {
        let mut copying = self.copying.lock().expect("the COPY lock is never poisoned");
        if let Some(copying) = copying.as_mut().filter(|c| c.failed.is_none()) {
            if let Err(e) = copying
                .reader
                .feed(&data.data)
                .and_then(|rows| self.insert_rows(copying, rows))
            {
                copying.failed = Some(e);
            }
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + futures::Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as futures::Sink<PgWireBackendMessage>>::Error>,
    {
        let rows = self.end_copy(None).await.map_err(user_error)?;
        client
            .send(PgWireBackendMessage::CommandComplete(
                Tag::new("COPY").with_rows(rows as usize).into(),
            ))
            .await?;
        Ok(())
    }

    async fn on_copy_fail<C>(&self, _client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + futures::Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as futures::Sink<PgWireBackendMessage>>::Error>,
    {
        let why = SqlError::new("57014", format!("COPY from stdin failed: {}", fail.message));
        match self.end_copy(Some(why)).await {
            Err(e) => user_error(e),
            Ok(_) => unreachable!("a COPY given a failure fails"),
        }
    }
}

/// A statement as the extended protocol keeps it.
#[derive(Debug, Clone)]
pub struct Parsed {
    sql: String,
    parameters: usize,
}

/// Parses for the extended protocol; describes results from a reader connection's plan.
struct Parser {
    shared: Arc<Shared>,
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = Parsed;

    async fn parse_sql<C>(&self, _client: &C, sql: &str, _types: &[Option<Type>]) -> PgWireResult<Option<Parsed>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut statements = split_statements(sql).map_err(user_error)?;
        if statements.len() > 1 {
            return Err(user_error(SqlError::syntax(
                "cannot insert multiple commands into a prepared statement",
            )));
        }
        let Some(sql) = statements.pop() else {
            return Ok(None);
        };
        let parameters = parameter_count(&sql).map_err(user_error)?;
        Ok(Some(Parsed { sql, parameters }))
    }

    fn get_parameter_types(&self, statement: &Parsed) -> PgWireResult<Vec<Type>> {
        Ok(vec![Type::TEXT; statement.parameters])
    }

    fn get_result_schema(&self, statement: &Parsed, format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        let format = format.cloned().unwrap_or(Format::UnifiedBinary);
        let Ok(mut reader) = self.shared.readers.take() else {
            return Ok(Vec::new());
        };
        // A statement the reader cannot plan (its table is created in the same transaction,
        // say) describes as returning nothing; executing it tells the truth.
        let dialect = self.shared.readers.database().dialect();
        let columns = analyse(&statement.sql)
            .ok()
            .and_then(|analysis| reader.conn.describe(&analysis.numbered(dialect)))
            .unwrap_or_default();
        self.shared.readers.give_back(reader);
        Ok(fields(&columns, &format))
    }
}

/// The bound parameters of a portal as values: text-format ones as the engine would read them,
/// binary ones by their declared type.
fn bound_values(portal: &Portal<Parsed>) -> PgWireResult<Vec<Value>> {
    (0..portal.parameter_len())
        .map(|i| {
            let ty = portal
                .statement
                .parameter_types
                .get(i)
                .cloned()
                .flatten()
                .unwrap_or(Type::TEXT);
            let Some(raw) = &portal.parameters[i] else {
                return Ok(Value::Null);
            };
            if portal.parameter_format.format_for(i) == FieldFormat::Text {
                let text = std::str::from_utf8(raw)
                    .map_err(|_| user_error(SqlError::new("22021", "a parameter is not valid UTF-8")))?;
                return Ok(match ty {
                    Type::INT2 | Type::INT4 | Type::INT8 => text
                        .parse()
                        .map(Value::Integer)
                        .unwrap_or_else(|_| Value::Text(text.to_owned())),
                    Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC => text
                        .parse()
                        .map(Value::Real)
                        .unwrap_or_else(|_| Value::Text(text.to_owned())),
                    Type::BYTEA => Value::Blob(raw.to_vec()),
                    _ => Value::Text(text.to_owned()),
                });
            }
            Ok(match ty {
                Type::INT2 => Value::Integer(portal.parameter::<i16>(i, &ty)?.unwrap_or_default().into()),
                Type::INT4 => Value::Integer(portal.parameter::<i32>(i, &ty)?.unwrap_or_default().into()),
                Type::INT8 => Value::Integer(portal.parameter::<i64>(i, &ty)?.unwrap_or_default()),
                Type::FLOAT4 => Value::Real(portal.parameter::<f32>(i, &ty)?.unwrap_or_default().into()),
                Type::FLOAT8 => Value::Real(portal.parameter::<f64>(i, &ty)?.unwrap_or_default()),
                Type::BOOL => Value::Integer(portal.parameter::<bool>(i, &ty)?.unwrap_or_default().into()),
                Type::BYTEA => Value::Blob(raw.to_vec()),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    Value::Text(String::from_utf8_lossy(raw).into_owned())
                }
                other => {
                    return Err(user_error(SqlError::unsupported(format!(
                        "binary parameters of type {} are not supported; send them as text",
                        other.name()
                    ))))
                }
            })
        })
        .collect()
}

#[async_trait]
impl ExtendedQueryHandler for Session {
    type Statement = Parsed;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    async fn do_query<C>(&self, _client: &mut C, portal: &Portal<Parsed>, _max_rows: usize) -> PgWireResult<Response>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let params = bound_values(portal)?;
        match self.run(&portal.statement.statement.sql, params).await {
            Ok(answer) => response(answer, &portal.result_column_format),
            Err(e) => Ok(error_response(e)),
        }
    }
}

impl Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("id", &self.id).finish()
    }
}
