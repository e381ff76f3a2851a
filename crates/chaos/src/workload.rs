//! Clients that read, write and increment a few keys through any node and record every
//! operation with its invocation and completion times. Some clients own a RIFL id and send a
//! write whose outcome is unknown again to another node: a write that executed and is sent again
//! must not execute twice, and an increment that did would show in its result.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_client::{Client, ClientError, RiflSession, Value};

use crate::curp_tally::CurpWatch;
use crate::history::{Op, OpKind, Outcome};

/// Longer than a node's own limits (leader wait 3 s, request timeout 5 s), so most requests end
/// with the node's verdict rather than ours.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(6);
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// How often a resending client sends one write before it records the outcome unknown.
const MAX_SENDS: usize = 5;

/// State shared by the clients of a run.
pub struct Recorder {
    start: Instant,
    pub ops: Mutex<Vec<Op>>,
    pub stop: AtomicBool,
    pub completed: AtomicU64,
    pub unknown: AtomicU64,
    /// How often CURP's paths ran, from the nodes' metrics.
    pub curp: CurpWatch,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            start: Instant::now(),
            ops: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            curp: CurpWatch::default(),
        })
    }

    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Records an operation begun at `invocation`, now ended (or given up on) at `node`.
    fn complete(&self, invocation: Invocation<'_>, node: u64, outcome: Outcome, result: Option<i64>) {
        let complete_us = self.now_us();
        self.record(Op {
            client: invocation.client,
            kind: invocation.kind,
            key: invocation.key.to_string(),
            value: invocation.value,
            invoke_us: invocation.invoke_us,
            complete_us: (outcome != Outcome::Unknown).then_some(complete_us),
            outcome,
            result,
            node,
        });
    }

    fn record(&self, op: Op) {
        match op.outcome {
            Outcome::Unknown => self.unknown.fetch_add(1, Ordering::Relaxed),
            _ => self.completed.fetch_add(1, Ordering::Relaxed),
        };
        self.ops.lock().expect("history lock").push(op);
    }
}

/// An operation as it was invoked.
struct Invocation<'a> {
    client: u64,
    kind: OpKind,
    key: &'a str,
    value: Option<i64>,
    invoke_us: u64,
}

impl<'a> Invocation<'a> {
    fn starting_now(recorder: &Recorder, client: u64, kind: OpKind, key: &'a str, value: Option<i64>) -> Self {
        Invocation {
            client,
            kind,
            key,
            value,
            invoke_us: recorder.now_us(),
        }
    }
}

/// A tiny PRNG so a client's choices follow from the run's seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The outcome of a reply: its result, or why it has none.
fn classify(kind: OpKind, reply: Result<Value, ClientError>) -> (Outcome, Option<i64>, bool) {
    let reply = match reply {
        Ok(reply) => reply,
        // Sent, but no answer: it may have happened. The connection is no longer usable.
        Err(_) => return (Outcome::Unknown, None, true),
    };
    match (kind, reply) {
        // Only TRYAGAIN promises the request was not applied.
        (_, Value::Error(e)) if e.starts_with("TRYAGAIN") => (Outcome::Fail, None, false),
        (_, Value::Error(_)) => (Outcome::Unknown, None, false),
        (OpKind::Read, Value::Bulk(None)) => (Outcome::Ok, None, false),
        (OpKind::Read, Value::Bulk(Some(b))) => match std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok()) {
            Some(v) => (Outcome::Ok, Some(v), false),
            None => (Outcome::Unknown, None, false),
        },
        (OpKind::Write, Value::Simple(s)) if s == "OK" => (Outcome::Ok, None, false),
        (OpKind::Incr, Value::Integer(n)) => (Outcome::Ok, Some(n), false),
        _ => (Outcome::Unknown, None, false),
    }
}

/// Sends one operation and records it.
pub async fn execute(
    recorder: &Recorder,
    client: &mut Client,
    id: u64,
    node: u64,
    kind: OpKind,
    key: &str,
    value: Option<i64>,
) -> bool {
    let invocation = Invocation::starting_now(recorder, id, kind, key, value);
    let reply = match kind {
        OpKind::Read => client.command(&["GET", key]).await,
        OpKind::Write => {
            let v = value.expect("writes carry a value").to_string();
            client.command(&["SET", key, &v]).await
        }
        OpKind::Incr => client.command(&["INCR", key]).await,
    };
    let (outcome, result, broken) = classify(kind, reply);
    recorder.complete(invocation, node, outcome, result);
    broken
}

/// What a client sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mix {
    /// 40% reads, 40% writes, 20% increments.
    Mixed,
    /// Reads only, one per `READER_PAUSE`: a client that never waits out a write keeps reading
    /// from a node cut off from the others, which is where a stale read would show.
    ReadsOnly,
}

/// Between a reader's reads: enough reads to land in a window of a few hundred milliseconds,
/// few enough that the histories stay small for the checker, whose search grows with them.
const READER_PAUSE: Duration = Duration::from_millis(5);

/// A connection to a random node, or `None` (after a pause) if it could not be made.
async fn connect_to_any(nodes: &[(u64, SocketAddr)], rng: &mut Rng) -> Option<(u64, Client)> {
    let (node, addr) = nodes[rng.below(nodes.len() as u64) as usize];
    match Client::connect(addr).await {
        Ok(mut client) => {
            client.set_timeout(REQUEST_TIMEOUT);
            Some((node, client))
        }
        Err(_) => {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            None
        }
    }
}

/// What a resending client needs besides the recorder.
pub struct Resending<'a> {
    pub nodes: &'a [(u64, SocketAddr)],
    pub rng: &'a mut Rng,
    /// Dropped after a write whose outcome stayed unknown: the next would wait for it forever.
    pub session: &'a mut Option<RiflSession>,
}

/// Sends a write under the client's own RIFL id — to other nodes too, while its outcome is
/// unknown — and records it once: from its first sending to the answer that settled it.
pub async fn execute_resending(
    recorder: &Recorder,
    connection: &mut Option<(u64, Client)>,
    with: Resending<'_>,
    id: u64,
    kind: OpKind,
    key: &str,
    value: Option<i64>,
) {
    if with.session.is_none() {
        let Some((_, client)) = connection.as_mut() else {
            return;
        };
        match RiflSession::register(client).await {
            Ok(session) => *with.session = Some(session),
            Err(_) => {
                *connection = None;
                return;
            }
        }
    }
    let session = with.session.as_mut().expect("registered above");
    let v = value.map(|v| v.to_string());
    let write = match (kind, &v) {
        (OpKind::Write, Some(v)) => session.wrap(&["SET", key, v]),
        _ => session.wrap(&["INCR", key]),
    };
    let invocation = Invocation::starting_now(recorder, id, kind, key, value);
    let mut node = connection.as_ref().map_or(0, |(node, _)| *node);
    let mut settled = None;
    for _ in 0..MAX_SENDS {
        if recorder.stop.load(Ordering::Relaxed) {
            break;
        }
        if connection.is_none() {
            *connection = connect_to_any(with.nodes, with.rng).await;
        }
        let Some((at, client)) = connection.as_mut() else {
            continue;
        };
        node = *at;
        match client.command(&write.command).await {
            Ok(Value::Error(e)) if e.starts_with("TRYAGAIN") => {
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
            // In doubt, or the connection is gone: another node may settle it.
            Ok(Value::Error(e)) if e.starts_with("UNCERTAIN") || e.starts_with("TIMEOUT") => *connection = None,
            Err(_) => *connection = None,
            Ok(reply) => {
                settled = Some(classify(kind, Ok(reply)));
                break;
            }
        }
    }
    let (outcome, result) = match settled {
        Some((outcome, result, _)) => (outcome, result),
        None => (Outcome::Unknown, None),
    };
    if outcome == Outcome::Unknown {
        *with.session = None;
    } else {
        session.answered(&write);
    }
    recorder.complete(invocation, node, outcome, result);
}

/// One client: connects to a random node, issues operations until stopped, reconnects (to a
/// random node) whenever its connection breaks. A resending client owns a RIFL id for its
/// writes ([`execute_resending`]).
pub async fn client_loop(
    recorder: Arc<Recorder>,
    id: u64,
    mix: Mix,
    resends: bool,
    nodes: crate::faults::NodeList,
    keys: usize,
    seed: u64,
) {
    let mut rng = Rng::new(seed ^ id.rotate_left(17));
    let mut sequence = 0i64;
    let mut connection = None;
    let mut session = None;
    while !recorder.stop.load(Ordering::Relaxed) {
        // The members as they are now: a node that left is stopped, a new one is listed.
        let nodes = nodes.read().expect("node list").clone();
        if connection.is_none() {
            connection = connect_to_any(&nodes, &mut rng).await;
            continue;
        }
        let key = format!("k{}", rng.below(keys as u64));
        let (kind, value) = match rng.below(10) {
            _ if mix == Mix::ReadsOnly => (OpKind::Read, None),
            0..=3 => (OpKind::Read, None),
            4..=7 => {
                sequence += 1;
                (OpKind::Write, Some(id as i64 * 1_000_000_000 + sequence))
            }
            _ => (OpKind::Incr, None),
        };
        if resends && kind != OpKind::Read {
            let with = Resending {
                nodes: &nodes,
                rng: &mut rng,
                session: &mut session,
            };
            execute_resending(&recorder, &mut connection, with, id, kind, &key, value).await;
            continue;
        }
        let (node, client) = connection.as_mut().expect("connected above");
        if execute(&recorder, client, id, *node, kind, &key, value).await {
            connection = None;
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        }
        if mix == Mix::ReadsOnly {
            tokio::time::sleep(READER_PAUSE).await;
        }
    }
}
