//! The SQL replication middleware: PostgreSQL clients on the front, a database engine behind
//! one trait (SQLite embedded), and the raft log in between — the database is replicated
//! without touching its code (SQLware's thesis).
//!
//! Active replication: the leader executes each client transaction (the writer, one at
//! a time as the engine allows), makes it deterministic before anything runs (clock reads
//! fixed, random values seeded), commits it locally ahead of the log and proposes the statements
//! it ran; every replica re-executes them in log order. COMMIT returns once the log applied
//! the transaction (fsynced on a majority). See `writer` for how a leader executing ahead of
//! the log stays exact.
//!
//! Passive replication: the leader records each transaction's write-set (SQLite's session
//! extension; PostgreSQL's logical decoding) and replicas apply it instead of executing the
//! statements; `auto` sends a transaction that way only when one of its statements cannot be
//! made deterministic.
//!
//! Hybrid replication: every node executes its own clients' transactions and sends their
//! write-sets; every node certifies them by conflict class in log order (`certify`).

mod capture;
pub mod certify;
pub mod checkpoint;
pub mod classes;
pub mod copy;
pub mod database;
pub mod engine;
pub mod error;
mod front;
pub mod machine;
pub mod page_cache;
mod pg_blocking;
mod pg_decoding;
pub mod pg_write_set;
pub mod postgres;
mod readers;
mod table_columns;
pub mod text;
pub mod txn;
mod wire;
mod write_set;
pub mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chorus_log::{EntryCodec, NodeConfig, NodeHandle, ReadConsistency};

use tokio::net::TcpListener;

pub use database::Database;
pub use error::SqlError;
pub use front::{serve, ForwardReply, ForwardRequest, LeftOpen, Shared, Start as ForwardStart};
pub use machine::SqlState;
pub use writer::ReplicationMode;

/// Settings of a SQL node besides its raft node's.
pub struct SqlOptions {
    /// How long a COMMIT waits for the log before its outcome is reported unknown.
    pub commit_timeout: Duration,
    /// How long a transaction waits for another session's to release the write lock.
    pub lock_wait: Duration,
    /// Called when the database no longer matches the log (a leader that executed ahead lost
    /// its place): the node must restart, and rebuilds the database from the log when it does.
    pub on_diverged: Box<dyn FnOnce() + Send>,
    /// How transactions travel through the log: statements, write-sets, or either.
    pub mode: ReplicationMode,
    /// Sessions' reads until they say otherwise (`SET chorus.read_consistency`).
    pub read_consistency: ReadConsistency,
    /// Per table, the column whose value is a row's conflict class (empty: none).
    pub conflict_classes: classes::ClassRules,
    /// Hybrid: a transaction whose first statement touches only classes another node owns
    /// runs on that node (`front::forward`) instead of borrowing them through the log.
    pub forward: bool,
    /// Who may log in, with what rights (anyone, with every right, unless users are configured).
    pub users: Arc<chorus_auth::Users>,
    /// With a certificate: the PostgreSQL port takes TLS connections only.
    pub tls: Option<Arc<chorus_tls::ServerTls>>,
}

/// A running SQL node: its raft node, and the front end its shutdown drains.
pub struct SqlNode {
    pub node: NodeHandle<SqlState>,
    front: Arc<Shared>,
}

impl SqlNode {
    /// Lets clients finish their open transactions, taking no new ones, for up to `within`
    /// (`Shared::drain`); what was still open then.
    pub async fn drain(&self, within: Duration) -> Result<(), LeftOpen> {
        self.front.drain(within).await
    }

    /// The last thing a stopping node does: the database made durable and marked closed, so
    /// the next start need not rebuild it (`WriterHandle::close`). Nothing may run on the
    /// node's thread after it.
    pub fn close_database(&self) -> Result<(), SqlError> {
        self.front.close_database()
    }
}

/// Opens `database` (rebuilt from the last checkpoint and the log if it holds transactions the
/// log may not have; checkpoints live in `sql_dir`), starts the writer and the raft node, and
/// serves PostgreSQL clients on `listener`.
pub async fn start(
    node_config: NodeConfig,
    database: Database,
    sql_dir: &Path,
    listener: TcpListener,
    codec: Box<dyn EntryCodec>,
    options: SqlOptions,
) -> Result<SqlNode, StartError> {
    if options.mode == ReplicationMode::Hybrid {
        if options.conflict_classes.is_empty() {
            return Err(StartError::Database(SqlError::new(
                "22023",
                "hybrid replication certifies by conflict class: give --sql-conflict-classes table.column,…",
            )));
        }
        if matches!(database, Database::Postgres(_)) {
            return Err(StartError::Database(SqlError::new(
                "0A000",
                "hybrid replication runs on the SQLite engine only (for now): use --sql-engine sqlite",
            )));
        }
    }
    if let Database::Postgres(server) = &database {
        postgres::wait_until_ready(server).await.map_err(StartError::Database)?;
    }
    if let (Database::Postgres(server), false) = (&database, options.mode == ReplicationMode::Active) {
        postgres::require_logical_decoding(server).map_err(StartError::Database)?;
    }
    std::fs::create_dir_all(sql_dir)
        .map_err(|e| StartError::Database(engine::io_error(&format!("cannot create {}", sql_dir.display()), e)))?;
    let engine = database.open_engine().map_err(StartError::Database)?;
    let (proposals, proposal_queue) = tokio::sync::mpsc::unbounded_channel();
    // The writer starts before the node whose transport says which peers answer pings.
    let peer_calls: Arc<std::sync::OnceLock<Arc<chorus_log::PeerCalls>>> = Arc::default();
    let writer = writer::start(
        engine,
        writer::WriterOptions {
            lock_wait: options.lock_wait,
            on_diverged: options.on_diverged,
            mode: options.mode,
            labeller: (!options.conflict_classes.is_empty()).then(|| classes::Labeller::new(options.conflict_classes)),
            ownership: (options.mode == ReplicationMode::Hybrid).then(|| ownership(&node_config, peer_calls.clone())),
            voters: start_voters(&node_config),
        },
        proposals,
    )
    .map_err(StartError::Database)?;
    let readers = Arc::new(readers::Readers::new(database));
    let (state_writer, state_readers, state_dir) = (writer.clone(), readers.clone(), sql_dir.to_path_buf());
    let forwards = options.mode == ReplicationMode::Hybrid && options.forward;
    let (peer_requests, forwarded) = tokio::sync::mpsc::channel(FORWARDED_QUEUE);
    let node = chorus_log::start(
        node_config,
        move |snapshot| SqlState::open(state_writer, state_readers, state_dir, snapshot),
        codec,
        // Every hybrid node serves forwarded transactions, whether it forwards its own or not.
        (options.mode == ReplicationMode::Hybrid).then_some(peer_requests),
    )
    .await
    .map_err(StartError::Node)?;
    assert!(peer_calls.set(node.peer_calls().clone()).is_ok(), "set once, here");
    tokio::spawn(front::propose_in_order(node.clone(), writer.clone(), proposal_queue));
    if options.mode == ReplicationMode::Hybrid {
        tokio::spawn(writer::tick_hand_overs(writer.clone()));
    }
    let shared = Shared::new(
        node.clone(),
        writer.clone(),
        readers,
        options.commit_timeout,
        options.read_consistency,
        forwards.then(|| front::Forwarding {
            calls: node.peer_calls().clone(),
        }),
        front::Access {
            logins: front::logins(options.users.clone()),
            tls: options.tls.clone(),
        },
    );
    if options.mode == ReplicationMode::Hybrid {
        tokio::spawn(front::serve_forwarded(Arc::clone(&shared), forwarded));
    }
    tokio::spawn(serve(listener, Arc::clone(&shared)));
    Ok(SqlNode { node, front: shared })
}

/// Forwarded statements from peers waiting to be taken (each then runs in a task of its own).
const FORWARDED_QUEUE: usize = 1024;

/// The nodes a node is started with (itself among them), sorted: the voters hybrid replication
/// places classes over until the raft loop tells the configuration in force.
fn start_voters(node_config: &NodeConfig) -> Vec<u64> {
    let mut ids: Vec<u64> = node_config.peers.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids
}

/// Hybrid replication's class owners. A transaction waits for a class it borrows about as long
/// as a few log round trips on a slow link; an owner lends one for longer than a transaction on
/// it takes; a node that answered a ping (they go every 500 ms) within the last second is alive.
fn ownership(
    node_config: &NodeConfig,
    peer_calls: Arc<std::sync::OnceLock<Arc<chorus_log::PeerCalls>>>,
) -> writer::Ownership {
    const ANSWERED_PING_WITHIN: Duration = Duration::from_millis(1000);
    writer::Ownership {
        me: node_config.id,
        borrow_wait: Duration::from_millis(500),
        silent_for: Duration::from_secs(5),
        lend_for: Duration::from_secs(2),
        answering: writer::Answering::new(move |node| {
            peer_calls
                .get()
                .is_some_and(|calls| calls.heard_within(node, ANSWERED_PING_WITHIN))
        }),
    }
}

/// Why a SQL node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the database: {0}")]
    Database(SqlError),
    #[error("the raft node: {0}")]
    Node(chorus_log::StartError),
}
