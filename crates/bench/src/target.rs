//! What a benchmark drives: a `Target` opens one `Session` per client, and a session executes
//! YCSB operations in the target's own protocol. Adding a system is one file implementing these
//! two traits and one line in `cli::open_target`.

use std::future::Future;

use bytes::Bytes;

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpError {
    /// The server answered with an error; the connection is still usable.
    Rejected(String),
    /// The connection failed or timed out; the session must be reopened.
    Connection(String),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Rejected(e) => write!(f, "rejected: {e}"),
            OpError::Connection(e) => write!(f, "connection: {e}"),
        }
    }
}

/// A record as the load phase writes it: its key and its field values.
pub type Record = (String, Vec<Bytes>);

pub trait Target: Send + Sync + 'static {
    type Session: Session;

    /// Short name for tables and file names, e.g. "chorus", "redis+wait", "etcd".
    fn name(&self) -> String;

    /// Opens the session of client number `client`.
    fn connect(&self, client: usize) -> impl Future<Output = anyhow::Result<Self::Session>> + Send;
}

/// One client's connection. Records have `fields` fields named field0, field1, ...; how they
/// are laid out is the target's business (Redis hashes, etcd keys per field, ...).
pub trait Session: Send + 'static {
    fn insert(&mut self, key: &str, fields: &[Bytes]) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Inserts many records in as few round trips as the protocol allows (the load phase).
    fn load(&mut self, records: &[Record]) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Reads every field of a record; `Ok(false)` when the record does not exist.
    fn read(&mut self, key: &str) -> impl Future<Output = Result<bool, OpError>> + Send;

    /// Writes one field of a record.
    fn update(&mut self, key: &str, field: usize, value: &Bytes) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Reads the records with the given consecutive keys; returns how many were found.
    fn scan(&mut self, keys: &[String]) -> impl Future<Output = Result<usize, OpError>> + Send;

    /// Measures one round trip to the server without touching data, in ms (network check).
    fn ping(&mut self) -> impl Future<Output = Result<f64, OpError>> + Send;
}

pub fn field_name(field: usize) -> String {
    format!("field{field}")
}
