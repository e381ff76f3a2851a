//! Forwarding (hybrid replication): a transaction whose first statement touches only classes
//! another node owns runs on that owner, statement by statement over the peer links, so a
//! client may connect to any node and still not race the owner's transactions on its classes
//! (a transaction that stayed would borrow the classes through the log, two log round trips).
//!
//! The forwarding node keeps the client's session and sends each statement of the transaction,
//! numbered, to the owner; the owner runs them in a session of its own as if its client had
//! sent them, COMMIT included, and answers each. Nothing about replication changes: the owner
//! executes, proposes the write-set and certifies as for its own clients. A forwarded
//! transaction its forwarder abandons (the client left, a call timed out) or stops continuing
//! for `FORWARDED_IDLE` is rolled back on the owner. An owner that answers no ping is not
//! forwarded to: the transaction runs where it is, borrowing, which also tells the log the
//! owner is down once it waited in vain.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chorus_log::{CallError, PeerCalls, PeerRequest};
use tokio::sync::mpsc;

use super::{Answer, CommandTag, Session, Shared};
use crate::engine::{Column, Outcome};
use crate::error::SqlError;
use crate::text::{analyse, StatementKind};
use crate::txn::{put_bytes, put_len, put_value, DecodeError, Reader, Value};

/// The peer service forwarded statements go to.
pub const SERVICE_FORWARD: u8 = 1;
/// The first byte of every forwarded message: a node meeting another version refuses it.
const FORMAT_VERSION: u8 = 1;
/// A forwarded transaction its forwarder has not continued for this long is rolled back on
/// its owner: the forwarder may be gone.
const FORWARDED_IDLE: Duration = Duration::from_secs(10);
/// An owner that answered no ping for this long is not forwarded to (pings go every 500 ms).
const OWNER_HEARD_WITHIN: Duration = Duration::from_secs(2);
/// An owner whose call timed out is not forwarded to for this long.
const OWNER_SILENT_FOR: Duration = Duration::from_secs(5);

/// Where a forwarded statement stands in its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A transaction of its own (no BEGIN).
    Autocommit,
    /// The first statement after BEGIN.
    Begin,
    /// A later one (COMMIT and ROLLBACK included).
    Continue,
}

/// What a forwarding node asks of an owner.
#[derive(Debug, Clone, PartialEq)]
pub enum ForwardRequest {
    /// Run statement `seq` (from 0) of forwarded transaction `txn` (numbered by its forwarder).
    Statement {
        txn: u64,
        seq: u32,
        start: Start,
        sql: String,
        params: Vec<Value>,
    },
    /// Roll forwarded transaction `txn` back, if it is still open.
    Abandon { txn: u64 },
}

/// What an owner answers a forwarded statement, as the client will see it.
#[derive(Debug, Clone, PartialEq)]
pub enum ForwardReply {
    Rows(Outcome, &'static str),
    Done(CommandTag),
    Began,
    Ended(&'static str),
    Failed(SqlError),
}

/// The tags rows end with (`statement_answer`), so that a decoded one is one of them.
const ROW_TAGS: [&str; 5] = ["SELECT", "INSERT 0", "UPDATE", "DELETE", "SHOW"];
const END_TAGS: [&str; 2] = ["COMMIT", "ROLLBACK"];

impl ForwardRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_VERSION];
        match self {
            ForwardRequest::Statement {
                txn,
                seq,
                start,
                sql,
                params,
            } => {
                out.push(0);
                out.extend_from_slice(&txn.to_le_bytes());
                out.extend_from_slice(&seq.to_le_bytes());
                out.push(match start {
                    Start::Autocommit => 0,
                    Start::Begin => 1,
                    Start::Continue => 2,
                });
                put_bytes(&mut out, sql.as_bytes());
                put_len(&mut out, params.len());
                for value in params {
                    put_value(&mut out, value);
                }
            }
            ForwardRequest::Abandon { txn } => {
                out.push(1);
                out.extend_from_slice(&txn.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ForwardRequest, DecodeError> {
        let mut r = versioned(bytes)?;
        let request = match r.take(1)?[0] {
            0 => {
                let txn = r.u64()?;
                let seq = r.u32()?;
                let start = match r.take(1)?[0] {
                    0 => Start::Autocommit,
                    1 => Start::Begin,
                    2 => Start::Continue,
                    _ => return Err(DecodeError::Malformed("a forwarded statement's start")),
                };
                let sql = r.text()?;
                // Each value takes at least a byte.
                let params = r.list(1, Reader::value)?;
                ForwardRequest::Statement {
                    txn,
                    seq,
                    start,
                    sql,
                    params,
                }
            }
            1 => ForwardRequest::Abandon { txn: r.u64()? },
            _ => return Err(DecodeError::Malformed("a forwarded request's kind")),
        };
        r.finished()?;
        Ok(request)
    }
}

impl ForwardReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_VERSION];
        match self {
            ForwardReply::Rows(outcome, tag) => {
                out.push(0);
                put_bytes(&mut out, tag.as_bytes());
                put_outcome(&mut out, outcome);
            }
            ForwardReply::Done(tag) => {
                out.push(1);
                put_bytes(&mut out, tag.command.as_bytes());
                put_option(&mut out, tag.oid.map(u64::from));
                put_option(&mut out, tag.rows);
            }
            ForwardReply::Began => out.push(2),
            ForwardReply::Ended(tag) => {
                out.push(3);
                put_bytes(&mut out, tag.as_bytes());
            }
            ForwardReply::Failed(e) => {
                out.push(4);
                put_bytes(&mut out, e.code.as_bytes());
                put_bytes(&mut out, e.message.as_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ForwardReply, DecodeError> {
        let mut r = versioned(bytes)?;
        let reply = match r.take(1)?[0] {
            0 => {
                let tag = known(&r.text()?, &ROW_TAGS, "a rows tag")?;
                ForwardReply::Rows(read_outcome(&mut r)?, tag)
            }
            1 => ForwardReply::Done(CommandTag {
                command: r.text()?,
                oid: read_option(&mut r)?
                    .map(|oid| u32::try_from(oid).map_err(|_| DecodeError::Malformed("an oid over 32 bits")))
                    .transpose()?,
                rows: read_option(&mut r)?,
            }),
            2 => ForwardReply::Began,
            3 => ForwardReply::Ended(known(&r.text()?, &END_TAGS, "an end tag")?),
            4 => ForwardReply::Failed(SqlError::new(sqlstate(&r.text()?)?, r.text()?)),
            _ => return Err(DecodeError::Malformed("a forwarded reply's kind")),
        };
        r.finished()?;
        Ok(reply)
    }
}

impl From<Result<Answer, SqlError>> for ForwardReply {
    fn from(answer: Result<Answer, SqlError>) -> ForwardReply {
        match answer {
            Ok(Answer::Rows(outcome, tag)) => ForwardReply::Rows(outcome, tag),
            Ok(Answer::Done(tag)) => ForwardReply::Done(tag),
            Ok(Answer::Began) => ForwardReply::Began,
            Ok(Answer::Ended(tag)) => ForwardReply::Ended(tag),
            Ok(Answer::CopyIn(_)) => ForwardReply::Failed(SqlError::unsupported(
                "COPY is not forwarded: run it on the node it reached".into(),
            )),
            Err(e) => ForwardReply::Failed(e),
        }
    }
}

impl From<ForwardReply> for Result<Answer, SqlError> {
    fn from(reply: ForwardReply) -> Result<Answer, SqlError> {
        match reply {
            ForwardReply::Rows(outcome, tag) => Ok(Answer::Rows(outcome, tag)),
            ForwardReply::Done(tag) => Ok(Answer::Done(tag)),
            ForwardReply::Began => Ok(Answer::Began),
            ForwardReply::Ended(tag) => Ok(Answer::Ended(tag)),
            ForwardReply::Failed(e) => Err(e),
        }
    }
}

fn versioned(bytes: &[u8]) -> Result<Reader<'_>, DecodeError> {
    let mut r = Reader::new(bytes);
    match r.take(1)?[0] {
        FORMAT_VERSION => Ok(r),
        _ => Err(DecodeError::Malformed(
            "a forwarded message of another version (nodes of different releases)",
        )),
    }
}

fn known(text: &str, tags: &[&'static str], what: &'static str) -> Result<&'static str, DecodeError> {
    tags.iter()
        .find(|tag| **tag == text)
        .copied()
        .ok_or(DecodeError::Malformed(what))
}

/// A SQLSTATE from a peer, as the `&'static str` errors carry: each distinct code is allocated
/// once (PostgreSQL defines a few hundred).
fn sqlstate(code: &str) -> Result<&'static str, DecodeError> {
    if code.len() != 5 || !code.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()) {
        return Err(DecodeError::Malformed("a SQLSTATE that is not 5 digits or capitals"));
    }
    static CODES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut codes = CODES.get_or_init(Default::default).lock().expect("never poisoned");
    if let Some(known) = codes.get(code) {
        return Ok(known);
    }
    let interned: &'static str = Box::leak(code.to_owned().into_boxed_str());
    codes.insert(interned);
    Ok(interned)
}

fn put_option(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
}

fn read_option(r: &mut Reader<'_>) -> Result<Option<u64>, DecodeError> {
    Ok(if r.flag("an option flag that is neither 0 nor 1")? {
        Some(r.u64()?)
    } else {
        None
    })
}

fn put_text_option(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        None => out.push(0),
        Some(text) => {
            out.push(1);
            put_bytes(out, text.as_bytes());
        }
    }
}

fn read_text_option(r: &mut Reader<'_>) -> Result<Option<String>, DecodeError> {
    Ok(if r.flag("an option flag that is neither 0 nor 1")? {
        Some(r.text()?)
    } else {
        None
    })
}

fn put_outcome(out: &mut Vec<u8>, outcome: &Outcome) {
    put_len(out, outcome.columns.len());
    for column in &outcome.columns {
        put_bytes(out, column.name.as_bytes());
        put_text_option(out, column.declared.as_deref());
        put_text_option(out, column.function.as_deref());
    }
    put_len(out, outcome.rows.len());
    for row in &outcome.rows {
        put_len(out, row.len());
        for value in row {
            put_value(out, value);
        }
    }
    out.extend_from_slice(&outcome.changes.to_le_bytes());
    out.push(u8::from(outcome.read_only));
}

fn read_outcome(r: &mut Reader<'_>) -> Result<Outcome, DecodeError> {
    // A column takes at least 6 bytes (its name's length, two option flags), a row its width's
    // 4, a value one.
    let columns = r.list(6, |r| {
        Ok(Column {
            name: r.text()?,
            declared: read_text_option(r)?,
            function: read_text_option(r)?,
        })
    })?;
    let rows = r.list(4, |r| r.list(1, Reader::value))?;
    Ok(Outcome {
        columns,
        rows,
        changes: r.u64()?,
        read_only: r.flag("a read-only flag that is neither 0 nor 1")?,
    })
}

/// The forwarding side: whom to forward to, and the calls.
pub(super) struct Forwarder {
    calls: Arc<PeerCalls>,
    /// How long a forwarded statement may take on its owner (a COMMIT waits for the log).
    timeout: Duration,
    next_txn: AtomicU64,
    /// Owners whose call timed out, until when they are not forwarded to.
    silent_until: Mutex<HashMap<u64, Instant>>,
    forwarded: Arc<chorus_metrics::Counter>,
    unreached: Arc<chorus_metrics::Counter>,
}

/// Why a forwarded statement has no answer.
pub(super) enum Unanswered {
    /// It never left: nothing ran.
    NotSent,
    /// It may have run.
    TimedOut,
}

impl Forwarder {
    pub(super) fn new(calls: Arc<PeerCalls>, timeout: Duration) -> Forwarder {
        Forwarder {
            calls,
            timeout,
            next_txn: AtomicU64::new(1),
            silent_until: Mutex::new(HashMap::new()),
            forwarded: chorus_metrics::counter(
                "chorus_sql_transactions_forwarded_total",
                "Hybrid transactions this node's clients began that ran on their classes' owner",
            ),
            unreached: chorus_metrics::counter(
                "chorus_sql_forwards_unanswered_total",
                "Statements forwarded to a class owner that did not answer in time (a transaction's \
                 first then runs here; a later one fails)",
            ),
        }
    }

    /// `owner`, to forward a transaction of its classes to, unless it seems down.
    pub(super) fn reachable(&self, owner: u64) -> Option<u64> {
        let silent = self
            .silent_until
            .lock()
            .expect("never poisoned")
            .get(&owner)
            .is_some_and(|until| Instant::now() < *until);
        (!silent && self.calls.heard_within(owner, OWNER_HEARD_WITHIN)).then_some(owner)
    }

    /// Forwards nothing to `owner` for a while: it timed out, or is shutting down.
    pub(super) fn keep_off(&self, owner: u64) {
        self.silent_until
            .lock()
            .expect("never poisoned")
            .insert(owner, Instant::now() + OWNER_SILENT_FOR);
    }

    /// A fresh number for a transaction forwarded to some owner.
    pub(super) fn next_txn(&self) -> u64 {
        self.next_txn.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn count_forward(&self) {
        self.forwarded.inc();
    }

    /// Sends a statement to `owner` and awaits what it answered — until the timeout, or until
    /// the owner stops answering pings (a statement may wait long there, a dead owner should
    /// not hold its client that long).
    pub(super) async fn call(&self, owner: u64, request: ForwardRequest) -> Result<ForwardReply, Unanswered> {
        let body = request.encode();
        let call = self.calls.call(owner, SERVICE_FORWARD, &body, self.timeout);
        let silent = async {
            loop {
                tokio::time::sleep(OWNER_HEARD_WITHIN / 4).await;
                if !self.calls.heard_within(owner, OWNER_HEARD_WITHIN) {
                    return CallError::Timeout {
                        peer: owner,
                        waited_ms: OWNER_HEARD_WITHIN.as_millis() as u64,
                    };
                }
            }
        };
        let answered = tokio::select! {
            answered = call => answered,
            gone = silent => Err(gone),
        };
        let body = match answered {
            Ok(body) => body,
            Err(e) => {
                self.unreached.inc();
                tracing::warn!(owner, error = %e, "a forwarded statement was not answered");
                return Err(match e {
                    CallError::Timeout { .. } => {
                        self.keep_off(owner);
                        Unanswered::TimedOut
                    }
                    CallError::UnknownPeer(_) | CallError::Overloaded(_) => Unanswered::NotSent,
                });
            }
        };
        Ok(ForwardReply::decode(&body).unwrap_or_else(|e| {
            ForwardReply::Failed(SqlError::new(
                "08P01",
                format!("node {owner} answered a forwarded statement with a malformed reply: {e}"),
            ))
        }))
    }

    /// Rolls a forwarded transaction back on its owner, not waiting for the answer: its
    /// client is gone or failed it (the owner also rolls it back once idle).
    pub(super) fn abandon(self: &Arc<Self>, owner: u64, txn: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let forwarder = self.clone();
        runtime.spawn(async move {
            let body = ForwardRequest::Abandon { txn }.encode();
            let _ = forwarder
                .calls
                .call(owner, SERVICE_FORWARD, &body, forwarder.timeout)
                .await;
        });
    }
}

/// Transactions other nodes forwarded here, by forwarding node and its number for them.
#[derive(Default)]
pub(super) struct Remotes {
    open: Mutex<HashMap<(u64, u64), Arc<Remote>>>,
}

/// A forwarded transaction: a session of its own on this node.
struct Remote {
    session: Session,
    /// The next statement's number; held while one runs.
    next_seq: tokio::sync::Mutex<u32>,
    last_used: Mutex<Instant>,
}

impl Remotes {
    pub(super) fn open_count(&self) -> usize {
        self.open.lock().expect("never poisoned").len()
    }

    fn get(&self, key: (u64, u64)) -> Option<Arc<Remote>> {
        self.open.lock().expect("never poisoned").get(&key).cloned()
    }

    /// Ends `remote`'s transaction (its session rolls back what it left open once the last
    /// statement running in it ends), unless a later one took its key.
    fn remove(&self, key: (u64, u64), remote: &Arc<Remote>) {
        let mut open = self.open.lock().expect("never poisoned");
        if open.get(&key).is_some_and(|current| Arc::ptr_eq(current, remote)) {
            open.remove(&key);
        }
    }

    async fn handle(&self, shared: &Arc<Shared>, from: u64, request: ForwardRequest) -> ForwardReply {
        let (txn, seq, start, sql, params) = match request {
            ForwardRequest::Abandon { txn } => {
                let removed = self.open.lock().expect("never poisoned").remove(&(from, txn));
                drop(removed);
                return ForwardReply::Ended("ROLLBACK");
            }
            ForwardRequest::Statement {
                txn,
                seq,
                start,
                sql,
                params,
            } => (txn, seq, start, sql, params),
        };
        let key = (from, txn);
        if start != Start::Continue && shared.is_closing() {
            // The forwarder runs it where it is instead.
            return ForwardReply::Failed(SqlError::shutting_down(&format!(
                "node {} is shutting down and takes no new forwarded transaction",
                shared.node.status().id
            )));
        }
        let remote = match start {
            Start::Autocommit => return Session::new(shared.clone(), false).run(&sql, params).await.into(),
            Start::Begin => {
                let remote = Arc::new(Remote {
                    session: Session::new(shared.clone(), false),
                    next_seq: tokio::sync::Mutex::new(0),
                    last_used: Mutex::new(Instant::now()),
                });
                if let Err(e) = remote.session.run("BEGIN", Vec::new()).await {
                    return ForwardReply::Failed(e);
                }
                // A transaction of an earlier incarnation of the forwarder under this number
                // is over: replacing it rolls it back.
                let replaced = self.open.lock().expect("never poisoned").insert(key, remote.clone());
                drop(replaced);
                remote
            }
            Start::Continue => match self.get(key) {
                Some(remote) => remote,
                None => {
                    return ForwardReply::Failed(SqlError::serialization(
                        "the transaction forwarded to its classes' owner ended there (idle too long, \
                         or the owner restarted); retry it",
                    ))
                }
            },
        };
        let mut next_seq = remote.next_seq.lock().await;
        if *next_seq != seq {
            self.remove(key, &remote);
            return ForwardReply::Failed(SqlError::new(
                "08P01",
                format!("forwarded statement {seq} arrived where {} was next", *next_seq),
            ));
        }
        *next_seq += 1;
        let ends = analyse(&sql).is_ok_and(|a| matches!(a.kind, StatementKind::Commit | StatementKind::Rollback));
        let answer = remote.session.run(&sql, params).await;
        *remote.last_used.lock().expect("never poisoned") = Instant::now();
        if ends {
            self.remove(key, &remote);
        }
        answer.into()
    }

    /// Rolls back forwarded transactions whose forwarder stopped continuing them.
    fn expire_idle(&self) {
        let expired: Vec<Arc<Remote>> = {
            let mut open = self.open.lock().expect("never poisoned");
            let idle: Vec<(u64, u64)> = open
                .iter()
                .filter(|(_, remote)| {
                    remote.last_used.lock().expect("never poisoned").elapsed() >= FORWARDED_IDLE
                        && remote.next_seq.try_lock().is_ok()
                })
                .map(|(key, _)| *key)
                .collect();
            idle.iter().filter_map(|key| open.remove(key)).collect()
        };
        if !expired.is_empty() {
            tracing::info!(
                transactions = expired.len(),
                "rolled back forwarded transactions idle for {} s",
                FORWARDED_IDLE.as_secs()
            );
        }
    }
}

/// Serves statements other nodes forward here, each as it arrives (a statement may wait for
/// the write lock or the log; others must not wait behind it).
pub async fn serve_forwarded(shared: Arc<Shared>, mut requests: mpsc::Receiver<PeerRequest>) {
    let remotes = shared.remotes.clone();
    let sweeping = Arc::downgrade(&remotes);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let Some(remotes) = sweeping.upgrade() else { return };
            remotes.expire_idle();
        }
    });
    while let Some(request) = requests.recv().await {
        if request.service != SERVICE_FORWARD {
            let refusal = ForwardReply::Failed(SqlError::new(
                "08P01",
                format!("a SQL node offers no peer service {}", request.service),
            ));
            request.respond(&refusal.encode());
            continue;
        }
        let (shared, remotes) = (shared.clone(), remotes.clone());
        // A drain waits for it as for a client's statement: the client waits at the forwarder.
        let serving = shared.drain.connection();
        tokio::spawn(async move {
            let reply = match ForwardRequest::decode(&request.body) {
                Ok(forwarded) => remotes.handle(&shared, request.from, forwarded).await,
                Err(e) => ForwardReply::Failed(SqlError::new("08P01", format!("a malformed forwarded statement: {e}"))),
            };
            request.respond(&reply.encode());
            drop(serving);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests() -> Vec<ForwardRequest> {
        vec![
            ForwardRequest::Statement {
                txn: 7,
                seq: 2,
                start: Start::Continue,
                sql: "UPDATE stock SET s_quantity = ?1 WHERE s_w_id = ?2".into(),
                params: vec![
                    Value::Integer(-3),
                    Value::Real(0.5),
                    Value::Text("é".into()),
                    Value::Blob(vec![0, 255]),
                    Value::Null,
                ],
            },
            ForwardRequest::Statement {
                txn: u64::MAX,
                seq: 0,
                start: Start::Autocommit,
                sql: String::new(),
                params: Vec::new(),
            },
            ForwardRequest::Abandon { txn: 1 },
        ]
    }

    fn replies() -> Vec<ForwardReply> {
        vec![
            ForwardReply::Rows(
                Outcome {
                    columns: vec![
                        Column {
                            name: "c_discount".into(),
                            declared: Some("DECIMAL(4,4)".into()),
                            function: None,
                        },
                        Column {
                            name: "count(*)".into(),
                            declared: None,
                            function: Some("count".into()),
                        },
                    ],
                    rows: vec![
                        vec![Value::Real(0.25), Value::Integer(3)],
                        vec![Value::Null, Value::Integer(0)],
                    ],
                    changes: 0,
                    read_only: true,
                },
                "SELECT",
            ),
            ForwardReply::Done(CommandTag {
                command: "INSERT".into(),
                oid: Some(0),
                rows: Some(10),
            }),
            ForwardReply::Done(CommandTag {
                command: "CREATE TABLE".into(),
                oid: None,
                rows: None,
            }),
            ForwardReply::Began,
            ForwardReply::Ended("ROLLBACK"),
            ForwardReply::Failed(SqlError::serialization("retry it")),
        ]
    }

    #[test]
    fn forwarded_messages_decode_as_they_were_encoded() {
        for request in requests() {
            assert_eq!(ForwardRequest::decode(&request.encode()).unwrap(), request);
        }
        for reply in replies() {
            assert_eq!(ForwardReply::decode(&reply.encode()).unwrap(), reply);
        }
    }

    #[test]
    fn malformed_forwarded_messages_are_errors() {
        for request in requests() {
            let bytes = request.encode();
            for cut in 0..bytes.len() {
                assert!(ForwardRequest::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(ForwardRequest::decode(&longer).is_err(), "trailing byte");
            let mut other_version = bytes;
            other_version[0] = FORMAT_VERSION + 1;
            assert!(ForwardRequest::decode(&other_version).is_err(), "another version");
        }
        for reply in replies() {
            let bytes = reply.encode();
            for cut in 0..bytes.len() {
                assert!(ForwardReply::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let unknown_tag = {
            let mut out = vec![FORMAT_VERSION, 3];
            put_bytes(&mut out, b"DROP EVERYTHING");
            out
        };
        assert!(ForwardReply::decode(&unknown_tag).is_err(), "an end tag we never send");
        let bad_code = ForwardReply::Failed(SqlError::new("4000", "short")).encode();
        assert!(ForwardReply::decode(&bad_code).is_err(), "a 4-character SQLSTATE");
    }
}
