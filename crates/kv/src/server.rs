//! RESP front end: accepts Redis clients, answers server commands locally, sends writes through
//! the log and reads through ReadIndex (or local state, when a connection opted into stale reads).
//!
//! Pipelined commands are dispatched together and answered in order. Consecutive writes (ordered
//! by the log) or consecutive reads go out together; where a pipeline switches between the two,
//! what is in flight completes first, so every connection sees its commands take effect in order.
//!
//! Every connection that writes is a RIFL client (`chorus_curp::rifl`): its writes carry its id and
//! a sequence number, so a write whose outcome a leader change left unknown is sent again under
//! the same number and executes at most once. The client sees `UNCERTAIN` only when retrying for
//! `write_retry_window` did not settle it. The node registers one incarnation through the log on
//! its first write and renews it every [`RENEW_EVERY`].
//!
//! A client that must survive the loss of its connection (its node died) owns its id instead:
//! `RIFL REGISTER` gives it an incarnation of its own, and `RIFL WRITE incarnation seq
//! first_unacked command...` sends a write under it, to any node, as often as it takes. Nodes
//! renew the incarnations their clients used in the last [`CLIENT_INCARNATION_IDLE`].
//!
//! The leader's front end deletes keys whose time to live ran out every [`SWEEP_EVERY`], through
//! the log (reads hide them from the moment they expire; this frees what they hold).
//!
//! With `requirepass` or an ACL file (`chorus_auth`) a connection runs nothing but AUTH, HELLO
//! and QUIT until it logs in, and a read-only user's writes are refused (NOPERM) before they
//! are queued or sent.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_auth::{LoginRefused, Logins, Rights, Users};
use chorus_curp::rifl::{ClientId, Envelope};
use chorus_log::drain::{self, Drain};
use chorus_log::{NodeError, NodeHandle, ReadConsistency, Role};
use chorus_metrics::{labeled_counter, labeled_histogram, Counter, Histogram};
use chorus_resp::{take_command, write_value_as, Limits, Protocol, Value};
use chorus_tls::ServerTls;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::command::table::{self, CommandSpec};
use crate::command::{
    command_name, encode_delete_expired, encode_enveloped, encode_register, encode_renew, exec_args, parse_i64,
    reenvelope, resolve_last_ids, short_name, Blocking, BlockingReply, Command, CommandError, GroupRead, Look, Read,
    StreamRead, MAX_COMMAND_NAME_BYTES,
};
use crate::command_stats::CommandStats;
use crate::curp::{Curp, FastOutcome};
use crate::glob::glob_match;
use crate::keyspace_events;
use crate::listeners::{Delivery, Hub, Subscription};
use crate::monitor::{Feed, Monitors};
use crate::slowlog::{self, SlowLog};
use crate::state::{KvState, EXPIRED, OUT_OF_ORDER};
use crate::tracking::{self, TrackingOptions, INVALIDATE_CHANNEL};

pub type KvNode = NodeHandle<KvState>;

#[derive(Debug, Clone)]
pub struct FrontEndOptions {
    /// Default for new connections; a connection can switch with READONLY / READWRITE.
    pub default_consistency: ReadConsistency,
    pub limits: Limits,
    /// Most commands taken from one pipeline before replies are written.
    pub max_pipeline_commands: usize,
    pub resp_addr: SocketAddr,
    /// How long a write whose outcome is unknown (leader change, timeout) is retried before its
    /// client is told `UNCERTAIN`.
    pub write_retry_window: Duration,
    /// Who may connect, with what rights.
    pub users: Arc<Users>,
    /// With a certificate: the port speaks TLS only.
    pub tls: Option<Arc<ServerTls>>,
}

/// A client that has not finished its TLS handshake in this long is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a node renews its RIFL incarnation; far inside the lease
/// (`chorus_curp::rifl::LEASE_ENTRIES`) at any entry rate this machine reaches.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);

/// A client-owned incarnation not used through this node for this long is no longer renewed by
/// it (and expires with its lease unless the client writes again).
pub const CLIENT_INCARNATION_IDLE: Duration = Duration::from_secs(60);

/// How often the leader looks for expired keys to delete (Redis's active expiry runs as often).
pub const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// A blocked BLPOP / BLMOVE / … looks again when a write to one of its keys applies on its node,
/// and at least this often (for what no write announces: a script's undeclared keys).
const BLOCKED_LOOK_AGAIN: Duration = Duration::from_millis(250);
/// Most keys one sweep entry deletes, and most entries one sweep proposes.
const SWEEP_BATCH_KEYS: usize = 256;
const SWEEP_MAX_BATCHES: usize = 16;

/// The commands `server_command` answers (besides the transaction commands).
const SERVER_COMMANDS: &[&str] = &[
    "ping",
    "echo",
    "quit",
    "reset",
    "select",
    "readonly",
    "readwrite",
    "info",
    "config",
    "command",
    "client",
    "curp",
    "rifl",
    "cluster",
    "hello",
    "subscribe",
    "unsubscribe",
    "psubscribe",
    "punsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "pubsub",
    "wait",
    "auth",
    "acl",
    "time",
    "memory",
    "monitor",
    "shutdown",
    "save",
    "bgsave",
    "bgrewriteaof",
    "slowlog",
    "latency",
    "module",
];

/// COMMAND and its subcommands, from the command table.
fn command_command(sub: &str, rest: &[Bytes]) -> Value {
    let named = |rest: &[Bytes]| -> Vec<Option<&'static CommandSpec>> {
        match rest.get(1..) {
            Some(names) if !names.is_empty() => {
                names.iter().map(|n| table::find(&String::from_utf8_lossy(n))).collect()
            }
            _ => table::COMMANDS.iter().map(Some).collect(),
        }
    };
    match sub {
        "" => Value::array(table::COMMANDS.iter().map(CommandSpec::info).collect()),
        "count" => Value::Integer(table::COMMANDS.len() as i64),
        "list" => Value::array(table::COMMANDS.iter().map(|spec| Value::bulk(spec.name)).collect()),
        "info" => Value::array(
            named(rest)
                .into_iter()
                .map(|spec| spec.map_or(Value::Array(None), CommandSpec::info))
                .collect(),
        ),
        "docs" => Value::map(
            named(rest)
                .into_iter()
                .flatten()
                .map(|spec| (Value::bulk(spec.name), spec.docs()))
                .collect(),
        ),
        "getkeys" if rest.len() < 3 => Value::error("ERR wrong number of arguments for 'command|getkeys' command"),
        "getkeys" => match table::keys_of(&rest[1..]) {
            Ok(keys) => Value::array(keys.into_iter().map(|key| Value::Bulk(Some(key))).collect()),
            Err(e) => Value::error(e),
        },
        "help" => crate::state::help_reply(&[
            "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "(no subcommand)",
            "    Return details about all commands Chorus answers.",
            "COUNT",
            "    Return how many commands Chorus answers.",
            "LIST",
            "    Return the names of the commands Chorus answers.",
            "INFO [<command-name> ...]",
            "    Return details about the given commands (or all of them).",
            "DOCS [<command-name> ...]",
            "    Return the group of each of the given commands (or all of them).",
            "GETKEYS <full-command>",
            "    Return the keys of a whole command.",
            "HELP",
            "    Print this help.",
        ]),
        _ => Value::error(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(&rest[0])
        )),
    }
}

/// Whether a server command's reply refuses it as Redis refuses a command before running it (an
/// unknown command or subcommand, or a wrong number of arguments): the slow log leaves those
/// out, as Redis's does.
fn refused_by_the_command_table(reply: &Value) -> bool {
    matches!(reply, Value::Error(e) if ["ERR unknown command", "ERR unknown subcommand", "ERR wrong number of arguments"]
        .iter()
        .any(|refusal| e.starts_with(refusal)))
}

/// Redis's reply to a command it does not know (`args` as the client sent them): the name, and
/// the arguments quoted while they fit in 128 bytes.
fn unknown_command(args: &[Bytes]) -> Value {
    const SHOWN_BYTES: usize = 128;
    let name = String::from_utf8_lossy(&args[0]);
    let name: String = name.chars().take(SHOWN_BYTES).collect();
    let mut shown = String::new();
    for arg in &args[1..] {
        if shown.len() >= SHOWN_BYTES {
            break;
        }
        let room = SHOWN_BYTES - shown.len();
        let arg = String::from_utf8_lossy(&arg[..arg.len().min(room)]).into_owned();
        shown.push_str(&format!("'{arg}' "));
    }
    Value::error(format!(
        "ERR unknown command '{name}', with args beginning with: {shown}"
    ))
}

/// What commands outside the command table are counted as.
const OTHER_COMMAND: &str = "other";

struct FrontEndMetrics {
    by_command: HashMap<&'static str, Arc<Counter>>,
    write_seconds: Arc<Histogram>,
    read_seconds: Arc<Histogram>,
    errors: Arc<Counter>,
    connections: Arc<Counter>,
    protocol_errors: Arc<Counter>,
    write_retries: Arc<Counter>,
    uncertain_writes: Arc<Counter>,
    refused_unauthenticated: Arc<Counter>,
    tls_handshake_failures: Arc<Counter>,
}

impl FrontEndMetrics {
    fn new() -> Self {
        let duration = |kind| {
            labeled_histogram(
                "chorus_command_duration_seconds",
                "Time from receipt to reply, by kind",
                Some(("kind", kind)),
            )
        };
        FrontEndMetrics {
            by_command: table::COMMANDS
                .iter()
                .map(|spec| spec.name)
                .chain([OTHER_COMMAND])
                .map(|c| {
                    let counter = labeled_counter(
                        "chorus_commands_total",
                        "RESP commands received, by command",
                        Some(("command", c)),
                    );
                    (c, counter)
                })
                .collect(),
            write_seconds: duration("write"),
            read_seconds: duration("read"),
            errors: chorus_metrics::counter("chorus_command_errors_total", "Commands answered with an error"),
            connections: chorus_metrics::counter("chorus_resp_connections_total", "RESP connections accepted"),
            protocol_errors: chorus_metrics::counter(
                "chorus_resp_protocol_errors_total",
                "RESP connections closed for malformed or oversized input",
            ),
            write_retries: chorus_metrics::counter(
                "chorus_rifl_write_retries_total",
                "Writes sent again under their RIFL sequence number after an unknown outcome",
            ),
            uncertain_writes: chorus_metrics::counter(
                "chorus_rifl_uncertain_writes_total",
                "Writes answered UNCERTAIN: retrying within the window did not settle them",
            ),
            tls_handshake_failures: chorus_metrics::counter(
                "chorus_resp_tls_handshake_failures_total",
                "RESP connections closed because their TLS handshake failed (a plaintext client, say)",
            ),
            refused_unauthenticated: chorus_metrics::counter(
                "chorus_resp_refused_unauthenticated_total",
                "Commands refused with NOAUTH: the connection had not logged in",
            ),
        }
    }

    /// Counts a command; its name as the table has it.
    fn count(&self, name: Option<&str>) -> &'static str {
        let name = self.name_of(name);
        self.by_command[name].inc();
        name
    }

    /// A command's name as the table has it (`OTHER_COMMAND` for one it does not).
    fn name_of(&self, name: Option<&str>) -> &'static str {
        match name.and_then(|name| self.by_command.get_key_value(name)) {
            Some((name, _)) => name,
            None => OTHER_COMMAND,
        }
    }
}

struct Shared {
    node: KvNode,
    /// This node's pub/sub subscribers and blocked connections, told by the state machine as
    /// it applies.
    listeners: Arc<Hub>,
    options: FrontEndOptions,
    /// With `--curp on`: writes try CURP's fast path first.
    curp: Option<Arc<Curp>>,
    metrics: FrontEndMetrics,
    next_client_id: AtomicU64,
    /// Every open client connection, by id, as CLIENT LIST shows them.
    clients: Mutex<BTreeMap<u64, Arc<ClientSeen>>>,
    started: Instant,
    /// This node's RIFL incarnation once registered; `None` again when it expired.
    incarnation: tokio::sync::Mutex<Option<u64>>,
    /// When the last registration failed, and how: connections that waited behind it get its
    /// answer rather than each waiting out a registration of their own.
    registration_failed: Mutex<Option<(Instant, Value)>>,
    connections: Mutex<RiflConnections>,
    /// Client-owned incarnations used through this node, and when last.
    client_incarnations: Mutex<HashMap<u64, Instant>>,
    logins: Logins,
    /// The node's shutdown: connections open, and whether it began.
    drain: Arc<Drain>,
    /// Connections in MONITOR mode, and the lines they are sent.
    monitors: Arc<Monitors>,
    slowlog: SlowLog,
    command_stats: CommandStats,
}

/// The RIFL client ids this node has handed to connections.
struct RiflConnections {
    next: u64,
    /// (incarnation, connection) of every connection that has not closed.
    open: BTreeSet<(u64, u64)>,
}

impl Shared {
    /// This node's incarnation, registered through the log if it has none.
    async fn incarnation(&self) -> Result<u64, Value> {
        let asked = Instant::now();
        let mut incarnation = self.incarnation.lock().await;
        if let Some(id) = *incarnation {
            return Ok(id);
        }
        if let Some((at, error)) = &*self.registration_failed.lock().expect("not poisoned") {
            if *at >= asked {
                return Err(error.clone());
            }
        }
        let registered = match self.node.write(encode_register()).await {
            Ok(Value::Integer(id)) => u64::try_from(id).map_err(|_| Value::error("ERR negative incarnation id")),
            Ok(Value::Error(e)) => Err(Value::Error(e)),
            Ok(other) => Err(Value::error(format!("ERR unexpected registration reply {other:?}"))),
            Err(e) => Err(node_error(e)),
        };
        match registered {
            Ok(id) => {
                tracing::info!(incarnation = id, "registered a RIFL incarnation");
                *incarnation = Some(id);
                Ok(id)
            }
            Err(error) => {
                *self.registration_failed.lock().expect("not poisoned") = Some((Instant::now(), error.clone()));
                Err(error)
            }
        }
    }

    async fn new_client(&self) -> Result<ClientId, Value> {
        let incarnation = self.incarnation().await?;
        let mut connections = self.connections.lock().expect("not poisoned");
        let connection = connections.next;
        connections.next += 1;
        connections.open.insert((incarnation, connection));
        Ok(ClientId {
            incarnation,
            connection,
        })
    }

    fn close_client(&self, client: ClientId) {
        let mut connections = self.connections.lock().expect("not poisoned");
        connections.open.remove(&(client.incarnation, client.connection));
    }

    /// The log refused `incarnation` as expired: the next write registers a new one.
    async fn expired(&self, incarnation: u64) {
        let mut current = self.incarnation.lock().await;
        if *current == Some(incarnation) {
            tracing::warn!(incarnation, "the RIFL incarnation expired; registering a new one");
            *current = None;
        }
    }

    /// Renews the incarnation through the log, forgetting connections that have closed.
    async fn renew(&self) {
        let Some(incarnation) = *self.incarnation.lock().await else {
            return;
        };
        let forgotten_below = {
            let connections = self.connections.lock().expect("not poisoned");
            connections
                .open
                .range((incarnation, 0)..=(incarnation, u64::MAX))
                .next()
                .map_or(connections.next, |(_, connection)| *connection)
        };
        match self.node.write(encode_renew(incarnation, forgotten_below)).await {
            Ok(Value::Error(e)) if e == EXPIRED => self.expired(incarnation).await,
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "RIFL renewal failed; the next one will retry"),
        }
    }

    fn note_client_incarnation(&self, incarnation: u64) {
        let mut used = self.client_incarnations.lock().expect("not poisoned");
        used.insert(incarnation, Instant::now());
    }

    /// Renews the client-owned incarnations used recently; their clients keep connection 1.
    async fn renew_client_incarnations(&self) {
        let recent: Vec<u64> = {
            let mut used = self.client_incarnations.lock().expect("not poisoned");
            used.retain(|_, last| last.elapsed() < CLIENT_INCARNATION_IDLE);
            used.keys().copied().collect()
        };
        for incarnation in recent {
            if let Ok(Value::Error(e)) = self.node.write(encode_renew(incarnation, 1)).await {
                if e == EXPIRED {
                    self.client_incarnations
                        .lock()
                        .expect("not poisoned")
                        .remove(&incarnation);
                }
            }
        }
    }

    /// On the leader: deletes keys whose time to live has run out, through the log.
    async fn sweep_expired_keys(&self) {
        for _ in 0..SWEEP_MAX_BATCHES {
            if self.node.status().role != Role::Leader {
                return;
            }
            let due = self.node.read(
                Read::ExpiredKeys {
                    limit: SWEEP_BATCH_KEYS,
                },
                ReadConsistency::Stale,
            );
            let keys: Vec<Bytes> = match due.await {
                Ok(Value::Array(Some(keys))) => keys
                    .into_iter()
                    .filter_map(|key| match key {
                        Value::Bulk(Some(key)) => Some(key),
                        _ => None,
                    })
                    .collect(),
                _ => return,
            };
            if keys.is_empty() {
                return;
            }
            if let Err(e) = self.node.write(encode_delete_expired(&keys)).await {
                tracing::debug!(error = %e, "deleting expired keys failed; the next sweep retries");
                return;
            }
            if keys.len() < SWEEP_BATCH_KEYS {
                return;
            }
        }
    }

    /// Registers an incarnation for a client that owns its id.
    async fn register_client(&self) -> Value {
        match self.node.write(encode_register()).await {
            Ok(Value::Integer(id)) => {
                self.note_client_incarnation(id as u64);
                Value::Integer(id)
            }
            Ok(other) => other,
            Err(e) => node_error(e),
        }
    }
}

/// `RIFL WRITE incarnation seq first_unacked command...`: the envelope and the command, or why
/// not; `None` when `args` is not a `RIFL WRITE`.
fn client_owned_write(args: &[Bytes]) -> Option<Result<(Envelope, Vec<Bytes>), Value>> {
    let is = |arg: Option<&Bytes>, word: &[u8]| arg.is_some_and(|a| a.eq_ignore_ascii_case(word));
    if !is(args.first(), b"rifl") || !is(args.get(1), b"write") {
        return None;
    }
    Some(owned_envelope(
        args,
        2,
        "RIFL WRITE incarnation seq first_unacked command...",
    ))
}

/// A decimal argument, or the usage as the error.
/// Node ids separated by commas (`1,2,3`), at most 255 of them, each once.
fn parse_ids(arg: &[u8]) -> Option<Vec<u64>> {
    let ids: Vec<u64> = std::str::from_utf8(arg)
        .ok()?
        .split(',')
        .map(|id| id.parse().ok())
        .collect::<Option<_>>()?;
    let unique: std::collections::HashSet<_> = ids.iter().collect();
    (ids.len() <= 255 && unique.len() == ids.len()).then_some(ids)
}

fn number_arg(args: &[Bytes], at: usize, usage: &str) -> Result<u64, Value> {
    args.get(at)
        .and_then(|a| std::str::from_utf8(a).ok()?.parse::<u64>().ok())
        .ok_or_else(|| Value::error(format!("ERR {usage}")))
}

/// `incarnation seq first_unacked command...` from `args[at..]`: a client-owned write's
/// envelope and command, or why not.
fn owned_envelope(args: &[Bytes], at: usize, usage: &str) -> Result<(Envelope, Vec<Bytes>), Value> {
    let envelope = Envelope {
        client: ClientId {
            incarnation: number_arg(args, at, usage)?,
            connection: 1,
        },
        seq: number_arg(args, at + 1, usage)?,
        first_unacked: number_arg(args, at + 2, usage)?,
    };
    if envelope.seq == 0 || envelope.first_unacked == 0 || envelope.first_unacked > envelope.seq {
        return Err(Value::error(
            "ERR RIFL sequence numbers start at 1 and a write cannot acknowledge itself",
        ));
    }
    if args.len() <= at + 3 {
        return Err(Value::error(format!("ERR {usage}")));
    }
    Ok((envelope, args[at + 3..].to_vec()))
}

/// Serves RESP clients on `listener` until `drain` begins (then each connection closes once it
/// has answered what it read).
pub async fn serve(
    listener: TcpListener,
    node: KvNode,
    options: FrontEndOptions,
    curp: Option<Arc<Curp>>,
    listeners: Arc<Hub>,
    drain: Arc<Drain>,
) {
    let logins = Logins::new(
        options.users.clone(),
        "chorus_resp_login_failures_total",
        "AUTH and HELLO AUTH attempts refused, by why",
    );
    let shared = Arc::new(Shared {
        node,
        listeners,
        options,
        curp,
        metrics: FrontEndMetrics::new(),
        next_client_id: AtomicU64::new(1),
        clients: Mutex::new(BTreeMap::new()),
        started: Instant::now(),
        incarnation: tokio::sync::Mutex::new(None),
        registration_failed: Mutex::new(None),
        connections: Mutex::new(RiflConnections {
            next: 1,
            open: BTreeSet::new(),
        }),
        client_incarnations: Mutex::new(HashMap::new()),
        logins,
        drain,
        monitors: Arc::default(),
        slowlog: SlowLog::new(slowlog::DEFAULT_SLOWER_THAN_US, slowlog::DEFAULT_MAX_LEN),
        command_stats: CommandStats::new(table::COMMANDS.iter().map(|spec| spec.name)),
    });
    let renewing = shared.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(RENEW_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            renewing.renew().await;
            renewing.renew_client_incarnations().await;
        }
    });
    let sweeping = shared.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            sweeping.sweep_expired_keys().await;
        }
    });
    let mut draining = shared.drain.signal();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // The listener closes with this: new clients are refused.
            _ = draining.wait_for(|draining| *draining) => return,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "RESP accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        shared.metrics.connections.inc();
        let shared = shared.clone();
        let open = shared.drain.connection();
        let local = stream.local_addr().unwrap_or(shared.options.resp_addr);
        tokio::spawn(async move {
            let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
            let user = shared
                .options
                .users
                .initial()
                .map(|user| (user.name.clone(), user.rights));
            let seen = Arc::new(ClientSeen::new(id, remote, local));
            let mut conn = Connection {
                id,
                seen,
                remote: remote.ip(),
                user,
                name: None,
                protocol: Protocol::Resp2,
                consistency: shared.options.default_consistency,
                rifl: None,
                transaction: None,
                watched: Vec::new(),
                channels: BTreeSet::new(),
                patterns: BTreeSet::new(),
                shard_channels: BTreeSet::new(),
                deliveries: None,
                settled: Vec::new(),
                timed: Vec::new(),
                monitoring: None,
                tracking: None,
                caching: None,
                shared,
            };
            conn.seen.describe(&conn);
            let listed = conn.seen.clone();
            conn.shared.clients.lock().expect("not poisoned").insert(id, listed);
            let ended = match &conn.shared.options.tls {
                None => conn.run(stream).await,
                Some(tls) => match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(stream)).await {
                    Ok(Ok(stream)) => conn.run(stream).await,
                    Ok(Err(e)) => {
                        conn.shared.metrics.tls_handshake_failures.inc();
                        Err(e)
                    }
                    Err(_) => Ok(()),
                },
            };
            if let Err(e) = ended {
                tracing::debug!(%remote, error = %e, "RESP connection ended");
            }
            conn.shared.clients.lock().expect("not poisoned").remove(&id);
            drop(open);
        });
    }
}

/// A reply in the making, kept in command order.
enum Slot {
    Ready(Value),
    Read {
        reply: chorus_log::node::Pending<Value>,
        started: Instant,
        /// As the command table names it.
        name: &'static str,
    },
    Write(WriteSlot),
}

/// An enveloped write until it settles.
struct WriteSlot {
    /// As logged; sent again unchanged on a retry.
    command: Bytes,
    /// As the command table names it.
    name: &'static str,
    /// Whose write it is; when that is no longer the connection's id, the write moves to the new
    /// one or gives up.
    client: ClientId,
    /// The client owns the id (`RIFL WRITE`): the write never moves, and the client, not the
    /// connection, decides what to do when it gives up.
    owned: bool,
    started: Instant,
    attempt: Result<chorus_log::node::Pending<Value>, NodeError>,
    /// CURP's fast-path attempt, in flight (then `attempt` is not started).
    fast: Option<tokio::task::JoinHandle<FastOutcome>>,
    /// Every write of this client before it had been answered when this one was sent: if its
    /// fast path completes, recovery could replay it with nothing missing before it.
    first_in_line: bool,
    /// Settled from the attempt that first put it in the log (a fast path or its leader's
    /// apply), so the writes after it may use their fast-path replies.
    settled_in_place: bool,
    /// An attempt may have executed (or may still): a retry is the only way to learn.
    uncertain: bool,
    /// Why the last attempt did not settle it.
    last_error: Option<Value>,
    /// Whether the last attempt's own outcome is unknown.
    last_in_doubt: bool,
}

/// A connection's RIFL client state.
struct RiflClient {
    id: ClientId,
    next_seq: u64,
    /// Every write below has been answered.
    first_unacked: u64,
}

struct Connection {
    id: u64,
    /// What CLIENT LIST shows of it, and how CLIENT KILL reaches it.
    seen: Arc<ClientSeen>,
    remote: IpAddr,
    /// Who it logged in as, and what they may run; None until it does.
    user: Option<(String, Rights)>,
    name: Option<Bytes>,
    /// RESP2 until the client says `HELLO 3`.
    protocol: Protocol,
    consistency: ReadConsistency,
    /// Set on the first write.
    rifl: Option<RiflClient>,
    /// Between MULTI and EXEC: the commands queued.
    transaction: Option<Queued>,
    /// WATCHed keys and their fingerprints when watched, for the next EXEC.
    watched: Vec<(Bytes, Bytes)>,
    /// Channels and patterns subscribed to, and where this node's hub sends their messages.
    channels: BTreeSet<Bytes>,
    patterns: BTreeSet<Bytes>,
    shard_channels: BTreeSet<Bytes>,
    deliveries: Option<(UnboundedSender<Delivery>, UnboundedReceiver<Delivery>)>,
    /// The replies `settle` puts in order, kept between batches so a batch allocates none.
    settled: Vec<Option<Value>>,
    /// The reads and writes of this batch and when each was read, for the slow log (while it
    /// logs anything): their time ends when the batch's replies are ready.
    timed: Vec<(Vec<Bytes>, Instant)>,
    /// After MONITOR: the lines of the commands this node's clients send.
    monitoring: Option<Feed>,
    /// Client-side caching: how the connection asked to be told of writes to what it read.
    tracking: Option<TrackingOptions>,
    /// CLIENT CACHING YES or NO, for the next command.
    caching: Option<bool>,
    shared: Arc<Shared>,
}

/// A MULTI's queued commands; `refused` once one of them was refused (EXEC then discards it).
#[derive(Default)]
struct Queued {
    commands: Vec<Vec<Bytes>>,
    refused: bool,
}

/// What the transaction commands make of a command.
enum TransactionStep {
    /// Answered (MULTI, DISCARD, a command queued or refused, EXEC refused).
    Reply(Value),
    /// WATCH these keys.
    Watch(Vec<Bytes>),
    /// Not a transaction's business: dispatch these arguments (EXEC's are the transaction).
    Dispatch(Vec<Bytes>),
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(rifl) = &self.rifl {
            self.shared.close_client(rifl.id);
        }
        if self.tracking.is_some() {
            self.shared.listeners.untrack(self.id);
        }
        let subscriptions = [
            (Subscription::Channel, &self.channels),
            (Subscription::Pattern, &self.patterns),
            (Subscription::ShardChannel, &self.shard_channels),
        ];
        for (kind, names) in subscriptions {
            for name in names {
                self.shared.listeners.unsubscribe(self.id, name, kind);
            }
        }
    }
}

/// A blocked connection's registration with its node's hub, undone when dropped (the command
/// returned, or the connection went away mid-wait).
struct Blocked {
    hub: Arc<Hub>,
    id: u64,
    keys: Vec<Bytes>,
}

impl Blocked {
    fn register(hub: Arc<Hub>, id: u64, keys: &[Bytes], wake: Arc<tokio::sync::Notify>) -> Blocked {
        hub.block(id, keys, wake);
        Blocked {
            hub,
            id,
            keys: keys.to_vec(),
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        self.hub.unblock(self.id, &self.keys);
    }
}

/// What an attempt of a write came to.
enum Attempt {
    Settled(Value),
    Retry,
    /// The client's incarnation expired: nothing executed; send it again under a new id.
    NewClient,
    /// It did not execute, and no earlier attempt may have: the client gets the error.
    GiveUp,
}

enum Flow {
    Continue,
    Close,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

fn node_error(e: NodeError) -> Value {
    let prefix = match e {
        NodeError::NoLeader { .. } | NodeError::ReadUnconfirmed { .. } | NodeError::Overloaded => "TRYAGAIN",
        NodeError::Timeout { .. } => "TIMEOUT",
        NodeError::LeaderChanged => "UNCERTAIN",
        NodeError::DiskFull { .. } => "NOSPACE",
        NodeError::ShuttingDown | NodeError::NotAVoter(_) | NodeError::MembershipRefused(_) | NodeError::Refused(_) => {
            "ERR"
        }
    };
    Value::error(format!("{prefix} {e}"))
}

impl Connection {
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(&mut self, mut stream: S) -> std::io::Result<()> {
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut output = Vec::with_capacity(16 * 1024);
        let mut slots = Vec::new();
        let limits = self.shared.options.limits;
        // One wait for the drain for the connection's life: made afresh for every read, it
        // would register with the drain's signal and leave it again once per request.
        let (drain, seen) = (drain::begun(self.shared.drain.signal()), self.seen.clone());
        // Killed, the connection closes as a drain closes it: at its next wait for its client.
        let drained = async move {
            tokio::select! {
                () = drain => {}
                () = seen.killed.notified() => {}
            }
        };
        tokio::pin!(drained);
        loop {
            if !self.read_or_deliver(&mut stream, &mut input, drained.as_mut()).await? {
                return Ok(());
            }
            if input.is_empty() {
                continue;
            }
            let mut flow = Flow::Continue;
            let mut pending: Option<Kind> = None;
            while slots.len() < self.shared.options.max_pipeline_commands {
                let args = match take_command(&mut input, &limits) {
                    Ok(Some(args)) => args,
                    Ok(None) => break,
                    Err(e) => {
                        self.shared.metrics.protocol_errors.inc();
                        slots.push(Slot::Ready(Value::error(format!("ERR {e}"))));
                        flow = Flow::Close;
                        break;
                    }
                };
                if args.is_empty() {
                    continue;
                }
                if let Some(refusal) = self.refused_by_rights(&args) {
                    let mut name_buf = [0u8; MAX_COMMAND_NAME_BYTES];
                    let name = self.shared.metrics.name_of(short_name(&args, &mut name_buf));
                    self.shared.command_stats.rejected(name);
                    self.flag_refused();
                    slots.push(Slot::Ready(refusal));
                    continue;
                }
                if let Some(refusal) = self.refused_while_subscribed(&args) {
                    slots.push(Slot::Ready(refusal));
                    continue;
                }
                if self.shared.monitors.watching() {
                    self.feed_monitors(&args);
                }
                let args = match self.transaction_step(args) {
                    TransactionStep::Dispatch(args) => args,
                    TransactionStep::Reply(value) => {
                        slots.push(Slot::Ready(value));
                        continue;
                    }
                    TransactionStep::Watch(keys) => {
                        // After what this connection sent before it, as every command is.
                        self.resolve(&mut slots, &mut output).await;
                        pending = None;
                        slots.push(Slot::Ready(self.watch(keys).await));
                        continue;
                    }
                };
                let (args, owned) = match client_owned_write(&args) {
                    None => (args, None),
                    Some(Ok((envelope, command))) => (command, Some(envelope)),
                    Some(Err(e)) => {
                        slots.push(Slot::Ready(e));
                        continue;
                    }
                };
                let parsed = match Command::parse(&args) {
                    Ok(Some(Command::Read(_) | Command::Blocking(_)) | None) if owned.is_some() => {
                        Err("ERR RIFL WRITE takes a write command".to_string())
                    }
                    parsed => parsed,
                };
                if let Ok(Some(Command::Blocking(blocking))) = parsed {
                    let mut name_buf = [0u8; MAX_COMMAND_NAME_BYTES];
                    let name = self.note_command(short_name(&args, &mut name_buf));
                    // What is in flight completes first; then this connection waits. Each of its
                    // attempts counts as the write it is (LMPOP, LMOVE, RPOPLPUSH).
                    self.resolve(&mut slots, &mut output).await;
                    pending = None;
                    let reply = self.block(blocking).await;
                    self.shared.command_stats.executed(name, None, reply.is_error());
                    slots.push(Slot::Ready(reply));
                    continue;
                }
                if matches!(parsed, Ok(None)) && args[0].eq_ignore_ascii_case(b"wait") {
                    let name = self.note_command(Some("wait"));
                    // About this connection's writes: they settle first.
                    self.resolve(&mut slots, &mut output).await;
                    pending = None;
                    let reply = self.wait(&args).await;
                    self.shared.command_stats.executed(name, None, reply.is_error());
                    slots.push(Slot::Ready(reply));
                    continue;
                }
                let kind = match &parsed {
                    Ok(Some(Command::Read(_))) => Some(Kind::Read),
                    Ok(Some(Command::Write(_))) => Some(Kind::Write),
                    _ => None,
                };
                if kind.is_some() && pending.is_some() && kind != pending {
                    // Writes are ordered by the log and reads by ReadIndex, but not one against
                    // the other: finish what is in flight before switching, so the connection
                    // sees its commands take effect in order.
                    self.resolve(&mut slots, &mut output).await;
                    pending = None;
                }
                let (slot, next) = self.dispatch(args, parsed, owned).await;
                if !matches!(slot, Slot::Ready(_)) {
                    pending = kind;
                }
                slots.push(slot);
                if let Flow::Close = next {
                    flow = Flow::Close;
                    break;
                }
            }
            self.resolve(&mut slots, &mut output).await;
            stream.write_all(&output).await?;
            output.clear();
            if let Flow::Close = flow {
                stream.shutdown().await?;
                return Ok(());
            }
        }
    }

    /// Reads more input into `input`; while subscribed, writes the messages that arrive
    /// meanwhile (then `input` may stay empty). `false` when the client closed the connection,
    /// or the node drains (`drained` completes; it is not polled again): every command read so
    /// far is answered by then, and a MULTI not yet EXECuted ran nothing.
    async fn read_or_deliver<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        input: &mut BytesMut,
        mut drained: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> std::io::Result<bool> {
        if self.deliveries.is_none() && self.monitoring.is_none() {
            return tokio::select! {
                biased;
                () = &mut drained => Ok(false),
                read = stream.read_buf(input) => Ok(read? > 0),
            };
        }
        let protocol = self.protocol;
        let invalidations_subscribed = self.channels.contains(INVALIDATE_CHANNEL);
        let (subscribed, monitoring) = (&mut self.deliveries, &mut self.monitoring);
        let delivery = async {
            match subscribed {
                Some((_, deliveries)) => deliveries.recv().await,
                None => std::future::pending().await,
            }
        };
        let line = async {
            match monitoring {
                Some(feed) => feed.lines.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = &mut drained => Ok(false),
            read = stream.read_buf(input) => Ok(read? > 0),
            Some(delivery) = delivery => {
                let mut output = Vec::new();
                let mut write = |delivery: Delivery| {
                    if let Some(frame) = delivery.frame(protocol, invalidations_subscribed) {
                        write_value_as(&frame, protocol, &mut output);
                    }
                };
                write(delivery);
                if let Some((_, deliveries)) = &mut self.deliveries {
                    while let Ok(delivery) = deliveries.try_recv() {
                        write(delivery);
                    }
                }
                if !output.is_empty() {
                    stream.write_all(&output).await?;
                }
                Ok(true)
            }
            line = line => {
                // A monitor that fell behind misses the lines it could not keep up with.
                let mut output = line.map(|l| l.to_vec()).unwrap_or_default();
                if let Some(feed) = &mut self.monitoring {
                    while let Ok(line) = feed.lines.try_recv() {
                        output.extend_from_slice(&line);
                    }
                }
                stream.write_all(&output).await?;
                Ok(true)
            }
        }
    }

    /// Shows monitors the command this connection's client sent, as Redis shows what it runs:
    /// a command queued in MULTI when its EXEC comes (and not if the transaction was refused),
    /// just before the EXEC; an unknown command never.
    fn feed_monitors(&self, args: &[Bytes]) {
        let name = command_name(args);
        if table::find(&name).is_none() {
            return;
        }
        let peer = self.seen.addr.to_string();
        if let Some(queued) = &self.transaction {
            match name.as_str() {
                "exec" if !queued.refused => {
                    for command in &queued.commands {
                        self.shared.monitors.feed(&peer, command);
                    }
                }
                "exec" | "discard" | "multi" | "watch" | "quit" | "reset" => {}
                _ => return,
            }
        }
        self.shared.monitors.feed(&peer, args);
    }

    /// The connection's channels, patterns or shard channels.
    fn subscribed_to(&mut self, kind: Subscription) -> &mut BTreeSet<Bytes> {
        match kind {
            Subscription::Channel => &mut self.channels,
            Subscription::Pattern => &mut self.patterns,
            Subscription::ShardChannel => &mut self.shard_channels,
        }
    }

    /// SUBSCRIBE, PSUBSCRIBE or SSUBSCRIBE (`kind`): one confirmation per name, with the
    /// connection's count of subscriptions after it.
    fn subscribe(&mut self, names: &[Bytes], kind: Subscription) -> Value {
        let (to, _) = self.deliveries.get_or_insert_with(tokio::sync::mpsc::unbounded_channel);
        let to = to.clone();
        let mut replies = Vec::with_capacity(names.len());
        for name in names {
            // A copy: a slice would keep the whole input buffer it came in alive.
            let name = Bytes::copy_from_slice(name);
            self.shared.listeners.subscribe(self.id, name.clone(), kind, to.clone());
            self.subscribed_to(kind).insert(name.clone());
            replies.push(self.subscription_reply(kind, false, Some(name)));
        }
        Value::Replies(replies)
    }

    /// UNSUBSCRIBE, PUNSUBSCRIBE or SUNSUBSCRIBE (`kind`) of `names`, or of every subscription
    /// of that kind when none are named.
    fn unsubscribe(&mut self, names: &[Bytes], kind: Subscription) -> Value {
        let names: Vec<Bytes> = if names.is_empty() {
            self.subscribed_to(kind).iter().cloned().collect()
        } else {
            names.iter().map(|n| Bytes::copy_from_slice(n)).collect()
        };
        if names.is_empty() {
            return self.subscription_reply(kind, true, None);
        }
        let mut replies = Vec::with_capacity(names.len());
        for name in names {
            self.shared.listeners.unsubscribe(self.id, &name, kind);
            self.subscribed_to(kind).remove(&name);
            replies.push(self.subscription_reply(kind, true, Some(name)));
        }
        if !self.subscribed() && self.tracking.is_none() {
            self.deliveries = None;
        }
        Value::Replies(replies)
    }

    /// RESET: the connection as it was when it connected — no transaction, watched keys or
    /// subscriptions, no name, RESP2, the node's default consistency, and its first user (none
    /// when logging in is required).
    fn reset(&mut self) {
        self.monitoring = None;
        self.untrack();
        self.transaction = None;
        self.watched.clear();
        for kind in [Subscription::Channel, Subscription::Pattern, Subscription::ShardChannel] {
            self.unsubscribe(&[], kind);
        }
        self.name = None;
        self.protocol = Protocol::Resp2;
        self.consistency = self.shared.options.default_consistency;
        self.user = self
            .shared
            .options
            .users
            .initial()
            .map(|user| (user.name.clone(), user.rights));
        self.seen.describe(self);
    }

    /// CLIENT TRACKING ON|OFF ...: see `tracking`.
    fn client_tracking(&mut self, args: &[Bytes]) -> Value {
        let exists = |id: u64| self.shared.clients.lock().expect("not poisoned").contains_key(&id);
        let options = match tracking::parse(args, self.tracking.as_ref(), exists) {
            Ok(Some(options)) => options,
            Ok(None) => {
                self.untrack();
                return Value::ok();
            }
            Err(e) => return Value::error(e),
        };
        let (to, _) = self.deliveries.get_or_insert_with(tokio::sync::mpsc::unbounded_channel);
        self.shared.listeners.track(self.id, to.clone(), &options);
        self.tracking = Some(options);
        Value::ok()
    }

    fn untrack(&mut self) {
        if self.tracking.take().is_some() {
            self.shared.listeners.untrack(self.id);
        }
        self.caching = None;
        if !self.subscribed() {
            self.deliveries = None;
        }
    }

    /// CLIENT CACHING YES|NO: whether the next read is tracked, under OPTIN or OPTOUT.
    fn client_caching(&mut self, answer: &[u8]) -> Value {
        let yes = match answer.to_ascii_lowercase().as_slice() {
            b"yes" => true,
            b"no" => false,
            _ => return Value::error("ERR syntax error"),
        };
        match &self.tracking {
            Some(options) if (options.optin && yes) || (options.optout && !yes) => {
                self.caching = Some(yes);
                Value::ok()
            }
            Some(_) if yes => Value::error("ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode."),
            Some(_) => Value::error("ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode."),
            None => Value::error(
                "ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled",
            ),
        }
    }

    /// Whether a read now (after CLIENT CACHING `caching`, if any) is tracked.
    fn tracks_this_read(&self, caching: Option<bool>) -> bool {
        match &self.tracking {
            Some(options) if !options.bcast => {
                (!options.optin || caching == Some(true)) && (!options.optout || caching != Some(false))
            }
            _ => false,
        }
    }

    /// CLIENT TRACKINGINFO.
    fn tracking_info(&self) -> Value {
        let (flags, redirect, prefixes) = match &self.tracking {
            None => (vec!["off"], -1, Vec::new()),
            Some(options) => {
                let mut flags = vec!["on"];
                for (set, flag) in [
                    (options.bcast, "bcast"),
                    (options.optin, "optin"),
                    (options.optout, "optout"),
                ] {
                    if set {
                        flags.push(flag);
                    }
                }
                match self.caching {
                    Some(true) => flags.push("caching-yes"),
                    Some(false) => flags.push("caching-no"),
                    None => {}
                }
                let redirect = options.redirect.map_or(0, |id| id as i64);
                (flags, redirect, options.prefixes.clone())
            }
        };
        Value::Map(vec![
            (
                Value::bulk("flags"),
                Value::Set(flags.into_iter().map(Value::bulk).collect()),
            ),
            (Value::bulk("redirect"), Value::Integer(redirect)),
            (
                Value::bulk("prefixes"),
                Value::array(prefixes.into_iter().map(Value::bulk).collect()),
            ),
        ])
    }

    fn subscribed(&self) -> bool {
        !(self.channels.is_empty() && self.patterns.is_empty() && self.shard_channels.is_empty())
    }

    /// A (un)subscription's confirmation, with the count Redis gives: of the connection's shard
    /// channels for a shard channel's, of its channels and patterns for the others.
    fn subscription_reply(&self, kind: Subscription, unsubscribed: bool, name: Option<Bytes>) -> Value {
        let confirmation = match (kind, unsubscribed) {
            (Subscription::Channel, false) => "subscribe",
            (Subscription::Channel, true) => "unsubscribe",
            (Subscription::Pattern, false) => "psubscribe",
            (Subscription::Pattern, true) => "punsubscribe",
            (Subscription::ShardChannel, false) => "ssubscribe",
            (Subscription::ShardChannel, true) => "sunsubscribe",
        };
        let count = match kind {
            Subscription::ShardChannel => self.shard_channels.len(),
            _ => self.channels.len() + self.patterns.len(),
        };
        Value::Push(vec![
            Value::bulk(confirmation),
            Value::Bulk(name),
            Value::Integer(count as i64),
        ])
    }

    /// In RESP2 a subscribed connection takes only subscription commands, PING and QUIT, as in
    /// Redis; the error for any other.
    fn refused_while_subscribed(&self, args: &[Bytes]) -> Option<Value> {
        if self.protocol == Protocol::Resp3 || !self.subscribed() {
            return None;
        }
        let name = command_name(args);
        const ALLOWED: [&str; 9] = [
            "subscribe",
            "unsubscribe",
            "psubscribe",
            "punsubscribe",
            "ssubscribe",
            "sunsubscribe",
            "ping",
            "quit",
            "reset",
        ];
        (!ALLOWED.contains(&name.as_str())).then(|| {
            Value::error(format!(
                "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
            ))
        })
    }

    /// MULTI, EXEC, DISCARD, WATCH and UNWATCH, and queueing between MULTI and EXEC, with the
    /// replies and errors Redis gives.
    fn transaction_step(&mut self, args: Vec<Bytes>) -> TransactionStep {
        let mut name_buf = [0u8; MAX_COMMAND_NAME_BYTES];
        let name = short_name(&args, &mut name_buf).unwrap_or_default();
        let arity_error = || Value::error(format!("ERR wrong number of arguments for '{name}' command"));
        let in_multi = self.transaction.is_some();
        match name {
            "multi" if args.len() != 1 => TransactionStep::Reply(arity_error()),
            "multi" if in_multi => TransactionStep::Reply(Value::error("ERR MULTI calls can not be nested")),
            "multi" => {
                self.transaction = Some(Queued::default());
                TransactionStep::Reply(Value::ok())
            }
            "discard" | "exec" if !in_multi => {
                TransactionStep::Reply(Value::error(format!("ERR {} without MULTI", name.to_ascii_uppercase())))
            }
            "discard" | "exec" if args.len() != 1 => {
                self.flag_refused();
                TransactionStep::Reply(arity_error())
            }
            "discard" => {
                self.transaction = None;
                self.watched.clear();
                TransactionStep::Reply(Value::ok())
            }
            "exec" => {
                let queued = self.transaction.take().expect("in MULTI");
                let watched = std::mem::take(&mut self.watched);
                if queued.refused {
                    return TransactionStep::Reply(Value::error(
                        "EXECABORT Transaction discarded because of previous errors.",
                    ));
                }
                TransactionStep::Dispatch(exec_args(&watched, &queued.commands))
            }
            "watch" if in_multi => TransactionStep::Reply(Value::error("ERR WATCH inside MULTI is not allowed")),
            "watch" if args.len() < 2 => TransactionStep::Reply(arity_error()),
            "watch" => TransactionStep::Watch(args[1..].to_vec()),
            "unwatch" if args.len() != 1 => TransactionStep::Reply(arity_error()),
            "unwatch" => {
                self.watched.clear();
                TransactionStep::Reply(Value::ok())
            }
            "quit" | "reset" => TransactionStep::Dispatch(args),
            _ if in_multi => TransactionStep::Reply(self.queue(args)),
            _ => TransactionStep::Dispatch(args),
        }
    }

    /// Queues a command between MULTI and EXEC, or refuses it (and with it the transaction).
    /// As in Redis, only an unknown command or a number of arguments its command table refuses
    /// is refused here; other errors (XADD's or HSET's odd field counts among them) are the
    /// command's reply when the transaction runs.
    fn queue(&mut self, args: Vec<Bytes>) -> Value {
        let name = command_name(&args);
        let table_allows = |given: usize| {
            table::find(&name).is_none_or(|spec| {
                let arity = spec.arity.unsigned_abs() as usize;
                if spec.arity < 0 {
                    given >= arity
                } else {
                    given == arity
                }
            })
        };
        let refusal = match Command::parse(&args) {
            // A subcommand's arity ('xgroup|create') is refused here too, as Redis 7 does.
            Err(e)
                if e.starts_with("ERR wrong number of arguments") && (!table_allows(args.len()) || e.contains('|')) =>
            {
                Some(Value::error(e))
            }
            Ok(Some(_)) | Err(_) => None,
            Ok(None) if SERVER_COMMANDS.contains(&name.as_str()) => Some(Value::error(format!(
                "ERR '{name}' cannot run inside MULTI on Chorus: only data commands can"
            ))),
            Ok(None) => Some(unknown_command(&args)),
        };
        match refusal {
            Some(error) => {
                self.flag_refused();
                error
            }
            None => {
                // Copies: slices would keep the whole input buffer they came in alive.
                let owned = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
                self.transaction.as_mut().expect("in MULTI").commands.push(owned);
                Value::Simple("QUEUED".into())
            }
        }
    }

    fn flag_refused(&mut self) {
        if let Some(queued) = &mut self.transaction {
            queued.refused = true;
        }
    }

    /// WAIT numreplicas timeout: how many nodes besides the leader hold every write this
    /// connection had acknowledged (and every other acknowledged before), waiting until
    /// `numreplicas` do or `timeout` ms pass (0: no limit).
    async fn wait(&self, args: &[Bytes]) -> Value {
        if args.len() != 3 {
            return Value::error("ERR wrong number of arguments for 'wait' command");
        }
        let Ok(replicas) = parse_i64(&args[1]) else {
            return Value::error("ERR value is not an integer or out of range");
        };
        let timeout_ms = match parse_i64(&args[2]).ok() {
            None => return Value::error("ERR timeout is not an integer or out of range"),
            Some(ms) if ms < 0 => return Value::error("ERR timeout is negative"),
            Some(ms) => ms as u64,
        };
        let timeout = (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms));
        let replicas = usize::try_from(replicas.max(0)).unwrap_or(usize::MAX);
        Value::Integer(self.shared.node.await_replicas(replicas, timeout).await as i64)
    }

    /// WATCH: each key's fingerprint now, read linearizably, for the next EXEC to compare.
    async fn watch(&mut self, keys: Vec<Bytes>) -> Value {
        let read = Read::Fingerprints(keys.clone());
        let fingerprints = match self.shared.node.submit_read(read, ReadConsistency::Linearizable).await {
            Ok(pending) => match pending.await {
                Ok(Ok(Value::Array(Some(fingerprints)))) => fingerprints,
                Ok(Ok(other)) => return Value::error(format!("ERR unexpected fingerprints {other:?}")),
                Ok(Err(e)) => return node_error(e),
                Err(_) => return node_error(NodeError::ShuttingDown),
            },
            Err(e) => return node_error(e),
        };
        for (key, fingerprint) in keys.into_iter().zip(fingerprints) {
            if let Value::Bulk(Some(fingerprint)) = fingerprint {
                self.watched.push((Bytes::copy_from_slice(&key), fingerprint));
            }
        }
        Value::ok()
    }

    /// Settles `slots` and writes their replies to `output`, in order.
    async fn resolve(&mut self, slots: &mut Vec<Slot>, output: &mut Vec<u8>) {
        let mut settled = std::mem::take(&mut self.settled);
        self.settle(slots, &mut settled).await;
        for value in settled.drain(..) {
            let value = value.expect("every slot settles");
            if let Value::Error(message) = &value {
                self.shared.metrics.errors.inc();
                self.shared.command_stats.error_replied(message);
            }
            write_value_as(&value, self.protocol, output);
        }
        self.settled = settled;
        if !self.timed.is_empty() {
            let ready = Instant::now();
            let sender = slowlog::Sender {
                addr: self.seen.addr,
                name: self.name.as_ref(),
            };
            for (args, read_at) in self.timed.drain(..) {
                self.shared.slowlog.note(&args, ready - read_at, &sender);
            }
        }
    }

    /// A blocking command: its attempt, each time this node sees one of its keys hold something
    /// (a local look, which costs the log nothing), until the attempt finds one through the log
    /// or the timeout passes.
    async fn block(&mut self, mut blocking: Blocking) -> Value {
        let deadline = blocking.timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
        if blocking.reply == BlockingReply::Streams {
            if let Err(e) = self.resolve_last_ids(&mut blocking).await {
                return e;
            }
        }
        let wake = Arc::new(tokio::sync::Notify::new());
        // Registered before the first look, so no write in between goes unnoticed.
        let _registration = Blocked::register(self.shared.listeners.clone(), self.id, &blocking.keys, wake.clone());
        let _unblockable = Unblockable::new(self.seen.clone(), wake.clone());
        let mut draining = self.shared.drain.signal();
        loop {
            match self.seen.unblocked.lock().expect("not poisoned").take() {
                Some(Unblock::TimedOut) => return blocking.reply.timed_out(),
                Some(Unblock::Error) => return Value::error("UNBLOCKED client unblocked via CLIENT UNBLOCK"),
                None => {}
            }
            if self.worth_attempting(&blocking).await {
                let parsed = Command::parse(&blocking.attempt);
                let (slot, _) = self.dispatch(blocking.attempt.clone(), parsed, None).await;
                let mut settled = Vec::with_capacity(1);
                self.settle(&mut vec![slot], &mut settled).await;
                let reply = settled.pop().flatten().expect("every slot settles");
                if let Some(reply) = blocking.reply.from_attempt(reply) {
                    return reply;
                }
            }
            let now = Instant::now();
            // A node that shuts down ends the wait as its timeout would (nothing taken): a
            // definite answer, and the drain need not wait for it.
            let killed = self.seen.was_killed.load(Ordering::Relaxed);
            if deadline.is_some_and(|d| now >= d) || self.shared.drain.is_draining() || killed {
                return blocking.reply.timed_out();
            }
            let look_again = deadline.map_or(BLOCKED_LOOK_AGAIN, |d| (d - now).min(BLOCKED_LOOK_AGAIN));
            tokio::select! {
                _ = tokio::time::timeout(look_again, wake.notified()) => {}
                _ = draining.wait_for(|draining| *draining) => {}
            }
        }
    }

    /// XREAD BLOCK's `$`s: each stream's last id as the command arrives, so every attempt reads
    /// what was added after it. An error (a key of another type) is the command's reply.
    async fn resolve_last_ids(&self, blocking: &mut Blocking) -> Result<(), Value> {
        let read = Read::Streams(StreamRead::LastIds(blocking.keys.clone()));
        let ids = match self.shared.node.read(read, self.consistency).await {
            Ok(Value::Array(Some(ids))) => ids,
            Ok(error @ Value::Error(_)) => return Err(error),
            Ok(other) => return Err(Value::error(format!("ERR unexpected reply to the last ids {other:?}"))),
            Err(e) => return Err(node_error(e)),
        };
        let ids: Vec<Bytes> = ids
            .into_iter()
            .map(|id| match id {
                Value::Bulk(Some(id)) => id,
                other => panic!("a last id is a bulk string, not {other:?}"),
            })
            .collect();
        resolve_last_ids(&mut blocking.attempt, &ids);
        Ok(())
    }

    /// Whether this node's state shows what the blocked command waits for (`Look`), or a
    /// value of another type or a missing group, which the attempt then reports as Redis does.
    async fn worth_attempting(&self, blocking: &Blocking) -> bool {
        let look = match &blocking.look {
            Look::AnyKeyExists => Read::Exists(blocking.keys.clone()),
            Look::Undelivered { group } => Read::Streams(StreamRead::Group(GroupRead::Undelivered {
                group: group.clone(),
                keys: blocking.keys.clone(),
            })),
        };
        let seen = self.shared.node.read(look, ReadConsistency::Stale).await;
        !matches!(seen, Ok(Value::Integer(0)))
    }

    /// Awaits every slot's reply into `values` (empty before), in the slots' order.
    async fn settle(&mut self, slots: &mut Vec<Slot>, values: &mut Vec<Option<Value>>) {
        assert!(values.is_empty(), "replies left from an earlier batch");
        let mut unsettled = Vec::new();
        // Every earlier write of this batch settled where it first joined the log.
        let mut in_place_so_far = true;
        for slot in slots.drain(..) {
            let value = match slot {
                Slot::Ready(v) => Some(v),
                Slot::Read { reply, started, name } => {
                    let value = match reply.await {
                        Ok(Ok(v)) => v,
                        Ok(Err(e)) => node_error(e),
                        Err(_) => node_error(NodeError::ShuttingDown),
                    };
                    let took = started.elapsed();
                    self.shared.metrics.read_seconds.observe(took);
                    self.shared.command_stats.executed(name, Some(took), value.is_error());
                    Some(value)
                }
                Slot::Write(mut write) => {
                    write.first_in_line &= in_place_so_far;
                    let outcome = self.attempt(&mut write).await;
                    // Settled, and not by a reply saying it did not execute (OUTOFORDER, EXPIRED).
                    in_place_so_far &= write.settled_in_place && matches!(outcome, Attempt::Settled(_));
                    match outcome {
                        Attempt::Settled(v) => Some(v),
                        Attempt::GiveUp => Some(self.give_up(&write)),
                        outcome => {
                            unsettled.push((values.len(), write, outcome));
                            None
                        }
                    }
                }
            };
            values.push(value);
        }
        if !unsettled.is_empty() {
            self.retry(unsettled, values).await;
        }
        if let Some(rifl) = &mut self.rifl {
            rifl.first_unacked = rifl.next_seq;
        }
    }

    /// Awaits one attempt of a write and says what it came to.
    async fn attempt(&self, write: &mut WriteSlot) -> Attempt {
        let result = match write.fast.take() {
            Some(fast) => match self.settle_fast(write, fast).await {
                Some(result) => result,
                None => self.await_attempt(write).await,
            },
            None => self.await_attempt(write).await,
        };
        let outcome = match result {
            Ok(Value::Error(e)) if e == OUT_OF_ORDER => {
                write.last_error = Some(Value::Error(e));
                write.last_in_doubt = false;
                Attempt::Retry
            }
            Ok(Value::Error(e)) if e == EXPIRED => Attempt::NewClient,
            Ok(value) => Attempt::Settled(value),
            Err(e) => {
                let in_doubt = matches!(
                    e,
                    NodeError::LeaderChanged | NodeError::Timeout { .. } | NodeError::ShuttingDown
                );
                write.uncertain |= in_doubt;
                write.last_in_doubt = in_doubt;
                write.last_error = Some(node_error(e));
                if write.uncertain {
                    Attempt::Retry
                } else {
                    Attempt::GiveUp
                }
            }
        };
        if let Attempt::Settled(value) = &outcome {
            let took = write.started.elapsed();
            self.shared.metrics.write_seconds.observe(took);
            self.shared
                .command_stats
                .executed(write.name, Some(took), value.is_error());
        }
        outcome
    }

    async fn await_attempt(&self, write: &mut WriteSlot) -> Result<Value, NodeError> {
        match std::mem::replace(&mut write.attempt, Err(NodeError::ShuttingDown)) {
            Ok(reply) => reply.await.unwrap_or(Err(NodeError::ShuttingDown)),
            Err(e) => Err(e),
        }
    }

    /// What a fast-path attempt came to: its reply, or `None` once the write has been sent again
    /// the ordinary way (same RIFL id, so it executes once). A speculative reply counts only if
    /// the write was first in line: otherwise recovery might replay it with an earlier write of
    /// its client missing, which RIFL would refuse; such a write, and one the leader has in its
    /// log but not enough witnesses hold, is answered when it applies on this node.
    async fn settle_fast(
        &self,
        write: &mut WriteSlot,
        fast: tokio::task::JoinHandle<FastOutcome>,
    ) -> Option<Result<Value, NodeError>> {
        let outcome = fast.await.unwrap_or(FastOutcome::Slow {
            reason: crate::curp::SlowReason::LeaderUnanswered,
            in_doubt: true,
            applied: None,
        });
        let curp = self.shared.curp.as_ref().expect("a fast path runs only with CURP on");
        match outcome {
            FastOutcome::Fast(value, applied) if write.first_in_line => {
                curp.settled_fast(applied);
                write.settled_in_place = true;
                return Some(Ok(value));
            }
            FastOutcome::Fast(_, applied) => {
                // The reply of its first application here, which follows its client's earlier
                // writes.
                write.uncertain = true;
                let result = curp.applied_here(applied).await.unwrap_or(Err(NodeError::ShuttingDown));
                write.settled_in_place = result.is_ok();
                return Some(result);
            }
            FastOutcome::Applied(value) => {
                write.settled_in_place = true;
                return Some(Ok(value));
            }
            FastOutcome::Slow {
                applied: Some(applied), ..
            } => {
                // The write is in the leader's log: the reply of its first application here.
                write.uncertain = true;
                let result = applied.await.unwrap_or(Err(NodeError::ShuttingDown));
                write.settled_in_place = result.is_ok();
                return Some(result);
            }
            FastOutcome::Slow { in_doubt, .. } => write.uncertain |= in_doubt,
        }
        if write.uncertain {
            // The attempt may have executed: this is a retry under the same id.
            self.shared.metrics.write_retries.inc();
        }
        write.attempt = self.shared.node.submit_write(write.command.clone()).await;
        None
    }

    /// The answer for a write that retrying did not settle. Its sequence number stays a gap
    /// that no later write of this client id could pass, so the connection takes a new one.
    fn give_up(&mut self, write: &WriteSlot) -> Value {
        let took = write.started.elapsed();
        self.shared.metrics.write_seconds.observe(took);
        self.shared.command_stats.executed(write.name, Some(took), true);
        if self.rifl.as_ref().map(|rifl| rifl.id) == Some(write.client) {
            self.abandon_client();
        }
        if write.uncertain {
            self.shared.metrics.uncertain_writes.inc();
            match &write.last_error {
                // TIMEOUT or UNCERTAIN, as the last attempt ended.
                Some(e) if write.last_in_doubt => e.clone(),
                _ => node_error(NodeError::LeaderChanged),
            }
        } else {
            write
                .last_error
                .clone()
                .unwrap_or_else(|| Value::error("TRYAGAIN the write did not execute"))
        }
    }

    /// Sends unsettled writes again, in their order, until each settles or its window closes.
    /// A write that gives up leaves a gap in its client's sequence that no later write could
    /// pass, so the connection takes a new client id (as it does when its incarnation expired);
    /// the writes after it move to the new id — except those that may have executed under the
    /// old one: they give up too.
    async fn retry(&mut self, mut unsettled: Vec<(usize, WriteSlot, Attempt)>, values: &mut [Option<Value>]) {
        let window = self.shared.options.write_retry_window;
        while !unsettled.is_empty() {
            let mut again = Vec::with_capacity(unsettled.len());
            for (at, mut write, outcome) in unsettled {
                let current = self.rifl.as_ref().map(|rifl| rifl.id);
                if matches!(outcome, Attempt::GiveUp) {
                    values[at] = Some(self.give_up(&write));
                    continue;
                }
                if write.owned {
                    if matches!(outcome, Attempt::NewClient) {
                        values[at] = Some(Value::error(EXPIRED));
                    } else if write.started.elapsed() >= window {
                        values[at] = Some(self.give_up(&write));
                    } else {
                        self.shared.metrics.write_retries.inc();
                        write.attempt = self.shared.node.submit_write(write.command.clone()).await;
                        again.push((at, write));
                    }
                    continue;
                }
                if matches!(outcome, Attempt::NewClient) && current == Some(write.client) {
                    self.shared.expired(write.client.incarnation).await;
                    self.abandon_client();
                }
                let moved = self.rifl.as_ref().map(|rifl| rifl.id) != Some(write.client);
                if write.started.elapsed() >= window || (moved && write.uncertain) {
                    values[at] = Some(self.give_up(&write));
                    continue;
                }
                if moved {
                    if let Err(e) = self.move_to_new_client(&mut write).await {
                        values[at] = Some(e);
                        continue;
                    }
                }
                self.shared.metrics.write_retries.inc();
                write.attempt = self.shared.node.submit_write(write.command.clone()).await;
                again.push((at, write));
            }
            let mut next = Vec::new();
            for (at, mut write) in again {
                match self.attempt(&mut write).await {
                    Attempt::Settled(v) => values[at] = Some(v),
                    outcome => next.push((at, write, outcome)),
                }
            }
            if !next.is_empty() {
                // Without a leader every attempt fails at once; let one be elected.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            unsettled = next;
        }
    }

    fn abandon_client(&mut self) {
        if let Some(old) = self.rifl.take() {
            self.shared.close_client(old.id);
        }
    }

    /// Re-envelopes `write` as the next write of the connection's client id, a new one if it
    /// has none (the old one is done).
    async fn move_to_new_client(&mut self, write: &mut WriteSlot) -> Result<(), Value> {
        let envelope = self.next_envelope().await?;
        write.command = reenvelope(&write.command, &envelope);
        write.client = envelope.client;
        Ok(())
    }

    /// The envelope of this connection's next write, making it a RIFL client if it is not.
    async fn next_envelope(&mut self) -> Result<Envelope, Value> {
        if self.rifl.is_none() {
            let id = self.shared.new_client().await?;
            self.rifl = Some(RiflClient {
                id,
                next_seq: 1,
                first_unacked: 1,
            });
        }
        let rifl = self.rifl.as_mut().expect("set above");
        let envelope = Envelope {
            client: rifl.id,
            seq: rifl.next_seq,
            first_unacked: rifl.first_unacked,
        };
        rifl.next_seq += 1;
        Ok(envelope)
    }

    /// Starts a command; `owned` is the envelope of a client-owned write (`RIFL WRITE`).
    async fn dispatch(
        &mut self,
        args: Vec<Bytes>,
        parsed: Result<Option<Command>, CommandError>,
        owned: Option<Envelope>,
    ) -> (Slot, Flow) {
        let mut name_buf = [0u8; MAX_COMMAND_NAME_BYTES];
        let name = self.note_command(short_name(&args, &mut name_buf));
        let started = Instant::now();
        // CLIENT CACHING is for the command after it.
        let caching = self.caching.take();
        match parsed {
            Err(e) => {
                self.shared.command_stats.rejected(name);
                (Slot::Ready(Value::error(e)), Flow::Continue)
            }
            Ok(Some(Command::Write(write))) => {
                let envelope = match owned {
                    Some(envelope) => {
                        self.shared.note_client_incarnation(envelope.client.incarnation);
                        envelope
                    }
                    None => match self.next_envelope().await {
                        Ok(envelope) => envelope,
                        Err(e) => return (Slot::Ready(e), Flow::Continue),
                    },
                };
                let command = encode_enveloped(&envelope, &args);
                let (attempt, fast) = match &self.shared.curp {
                    // A write answered before it applies here would reach a tracking client
                    // before the invalidation it causes.
                    Some(curp) if curp.fast_path_pays() && !write.touches_every_key() && self.tracking.is_none() => {
                        let curp = curp.clone();
                        let (command, keys) = (command.clone(), write.keys());
                        let fast =
                            tokio::spawn(async move { curp.write(command, envelope.client, envelope.seq, keys).await });
                        (Err(NodeError::ShuttingDown), Some(fast))
                    }
                    _ => (self.shared.node.submit_write(command.clone()).await, None),
                };
                let slot = Slot::Write(WriteSlot {
                    command,
                    name,
                    client: envelope.client,
                    owned: owned.is_some(),
                    started,
                    attempt,
                    fast,
                    // A connection's earlier writes are settled or in this batch (see `resolve`);
                    // a client that owns its id says so by acknowledging them.
                    first_in_line: owned.is_none() || envelope.first_unacked == envelope.seq,
                    settled_in_place: false,
                    uncertain: false,
                    last_error: None,
                    last_in_doubt: false,
                });
                if self.shared.slowlog.enabled() {
                    self.timed.push((args, started));
                }
                (slot, Flow::Continue)
            }
            Ok(Some(Command::Blocking(_))) => (
                Slot::Ready(Value::error("ERR blocking commands cannot be sent this way")),
                Flow::Continue,
            ),
            Ok(Some(Command::Read(read))) => {
                let read = if self.tracks_this_read(caching) {
                    Read::Tracked {
                        client: self.id,
                        keys: table::keys_of(&args).unwrap_or_default(),
                        read: Box::new(read),
                    }
                } else {
                    read
                };
                let slot = match self.shared.node.submit_read(read, self.consistency).await {
                    Ok(reply) => Slot::Read { reply, started, name },
                    Err(e) => Slot::Ready(node_error(e)),
                };
                if self.shared.slowlog.enabled() {
                    self.timed.push((args, started));
                }
                (slot, Flow::Continue)
            }
            Ok(None) => {
                let (value, flow) = self.server_command(&args).await;
                self.seen.describe(self);
                if refused_by_the_command_table(&value) {
                    self.shared.command_stats.rejected(name);
                } else {
                    let took = started.elapsed();
                    self.shared.command_stats.executed(name, Some(took), value.is_error());
                    let sender = slowlog::Sender {
                        addr: self.seen.addr,
                        name: self.name.as_ref(),
                    };
                    self.shared.slowlog.note(&args, took, &sender);
                }
                (Slot::Ready(value), flow)
            }
        }
    }

    /// Commands answered by this node without touching the log.
    async fn server_command(&mut self, args: &[Bytes]) -> (Value, Flow) {
        let name = command_name(args);
        let (name, rest) = (name.as_str(), &args[1..]);
        let arity = |ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(Value::error(format!(
                    "ERR wrong number of arguments for '{name}' command"
                )))
            }
        };
        let sub = rest
            .first()
            .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
            .unwrap_or_default();
        let value = match name {
            // Subscribed, RESP2 answers PING in the subscription's own form.
            "ping" if self.protocol == Protocol::Resp2 && self.subscribed() => {
                let message = rest.first().cloned().unwrap_or_default();
                Value::Push(vec![Value::bulk("pong"), Value::bulk(message)])
            }
            "ping" => match rest {
                [] => Value::Simple("PONG".into()),
                [msg] => Value::bulk(msg.clone()),
                _ => return (arity(false).unwrap_err(), Flow::Continue),
            },
            "echo" => match rest {
                [msg] => Value::bulk(msg.clone()),
                _ => return (arity(false).unwrap_err(), Flow::Continue),
            },
            "quit" => return (Value::ok(), Flow::Close),
            "reset" if rest.is_empty() => {
                self.reset();
                Value::Simple("RESET".into())
            }
            "reset" => return (arity(false).unwrap_err(), Flow::Continue),
            // This node's clock: a reply, never an input to a write (scripts cannot call it).
            "time" if rest.is_empty() => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                Value::array(vec![
                    Value::bulk(now.as_secs().to_string()),
                    Value::bulk(now.subsec_micros().to_string()),
                ])
            }
            "time" => return (arity(false).unwrap_err(), Flow::Continue),
            "memory" => self.memory_command(&sub, rest).await,
            "shutdown" => return self.shutdown(rest),
            // What Redis writes to dump.rdb or the AOF, Chorus has on disk as each write commits.
            "save" | "bgsave" | "bgrewriteaof" => Value::error(format!(
                "ERR {} has nothing to do on Chorus: every acknowledged write is on disk already \
                 (LASTSAVE says when the latest was made); for a copy of the data use `chorus backup --to FILE`",
                name.to_ascii_uppercase()
            )),
            "monitor" => match rest {
                [] => {
                    if self.monitoring.is_none() {
                        self.monitoring = Some(self.shared.monitors.watch());
                    }
                    Value::ok()
                }
                _ => return (arity(false).unwrap_err(), Flow::Continue),
            },
            "select" => match rest {
                [db] if db.as_ref() == b"0" => Value::ok(),
                [_] => Value::error("ERR DB index is out of range (Chorus has one database, 0)"),
                _ => return (arity(false).unwrap_err(), Flow::Continue),
            },
            "readonly" => {
                self.consistency = ReadConsistency::Stale;
                Value::ok()
            }
            "readwrite" => {
                self.consistency = ReadConsistency::Linearizable;
                Value::ok()
            }
            "info" => Value::bulk(self.info(&sub).await),
            "config" => match (sub.as_str(), rest.len()) {
                ("get", n) if n >= 2 => {
                    // The setting is replicated: read it as this session reads keys (a
                    // linearizable session sees a CONFIG SET acknowledged on any node).
                    match self
                        .shared
                        .node
                        .read(crate::command::Read::DbSize, self.consistency)
                        .await
                    {
                        Ok(_) => config_get(&rest[1..], self.shared.listeners.keyspace_flags(), &self.shared.slowlog),
                        Err(e) => node_error(e),
                    }
                }
                ("get", _) => Value::error("ERR wrong number of arguments for 'config|get' command"),
                ("set", n) if n < 3 || n % 2 == 0 => {
                    Value::error("ERR wrong number of arguments for 'config|set' command")
                }
                ("set", _) if rest[1..].chunks(2).all(|pair| slowlog_setting(&pair[0]).is_some()) => {
                    config_set_slowlog(&self.shared.slowlog, &rest[1..])
                }
                ("resetstat", 1) => {
                    self.shared.command_stats.reset();
                    Value::ok()
                }
                ("set", _) | ("rewrite", _) => Value::error(
                    "ERR CONFIG SET takes only notify-keyspace-events, slowlog-log-slower-than and slowlog-max-len; \
                     REWRITE is not supported: configure chorus with its TOML file or flags",
                ),
                _ => Value::error(format!("ERR unknown subcommand '{sub}' for 'config'")),
            },
            "command" => command_command(&sub, rest),
            "slowlog" => slowlog_command(&self.shared.slowlog, &sub, rest),
            "latency" => latency_command(&self.shared.command_stats, &sub, rest),
            "module" => module_command(&sub, rest),
            "client" => match (sub.as_str(), rest.len()) {
                ("setname", 2) => {
                    // A copy: a slice would keep the whole input buffer it came in alive.
                    self.name = Some(Bytes::copy_from_slice(&rest[1]));
                    Value::ok()
                }
                ("getname", 1) => Value::Bulk(self.name.clone()),
                ("id", 1) => Value::Integer(self.id as i64),
                ("setinfo", 3) => Value::ok(),
                ("info", 1) => {
                    self.seen.describe(self);
                    Value::bulk(format!(
                        "{} read_consistency={}\n",
                        self.seen.line(),
                        self.consistency_name()
                    ))
                }
                ("list", _) => self.client_list(&rest[1..]),
                ("kill", n) if n >= 2 => self.client_kill(&rest[1..]),
                ("kill", _) => Value::error("ERR wrong number of arguments for 'client|kill' command"),
                ("unblock", 2 | 3) => self.client_unblock(&rest[1..]),
                ("tracking", n) if n >= 2 => self.client_tracking(&rest[1..]),
                ("caching", 2) => self.client_caching(&rest[1]),
                ("getredir", 1) => Value::Integer(match &self.tracking {
                    None => -1,
                    Some(options) => options.redirect.map_or(0, |id| id as i64),
                }),
                ("trackinginfo", 1) => self.tracking_info(),
                // Chorus never evicts a client for the memory it uses.
                ("no-evict", 2) => match rest[1].to_ascii_lowercase().as_slice() {
                    b"on" | b"off" => Value::ok(),
                    _ => Value::error("ERR syntax error"),
                },
                _ => Value::error(format!("ERR unknown or malformed subcommand '{sub}' for 'client'")),
            },
            // Standalone Redis answers every CLUSTER subcommand with this error; cluster-aware
            // clients rely on it. FAILOVER keeps its Redis meaning: make this node the primary.
            "curp" => self.curp_command(&sub, rest).await,
            "rifl" => match (sub.as_str(), rest.len()) {
                ("register", 1) => self.shared.register_client().await,
                _ => Value::error("ERR RIFL takes REGISTER, or WRITE incarnation seq first_unacked command..."),
            },
            "cluster" => match (sub.as_str(), rest.len()) {
                ("failover", 1) => match self.shared.node.transfer_leader(self.shared.node.status().id).await {
                    Ok(()) => Value::ok(),
                    Err(e) => node_error(e),
                },
                _ => Value::error("ERR This instance has cluster support disabled"),
            },
            "hello" => self.hello(rest),
            "auth" => match rest {
                // As Redis: the default user needs no password, and AUTH with one is a mistake.
                [_] if self.shared.options.users.initial().is_some() => Value::error(
                    "ERR AUTH <password> called without any password configured for the default user. \
                     Are you sure your configuration is correct?",
                ),
                [password] => self.log_in(b"default", password),
                [user, password] => self.log_in(user, password),
                _ => return (arity(false).unwrap_err(), Flow::Continue),
            },
            "acl" => match (sub.as_str(), rest.len()) {
                ("whoami", 1) => match &self.user {
                    Some((name, _)) => Value::bulk(name.clone()),
                    None => Value::Bulk(None),
                },
                ("users", 1) => Value::array(self.shared.options.users.names().into_iter().map(Value::bulk).collect()),
                _ => Value::error(format!(
                    "ERR ACL takes WHOAMI or USERS here ('{sub}' is not supported: users come from the ACL file)"
                )),
            },
            "subscribe" | "psubscribe" | "ssubscribe" if rest.is_empty() => {
                return (arity(false).unwrap_err(), Flow::Continue)
            }
            "subscribe" => self.subscribe(rest, Subscription::Channel),
            "psubscribe" => self.subscribe(rest, Subscription::Pattern),
            "ssubscribe" => self.subscribe(rest, Subscription::ShardChannel),
            "unsubscribe" => self.unsubscribe(rest, Subscription::Channel),
            "punsubscribe" => self.unsubscribe(rest, Subscription::Pattern),
            "sunsubscribe" => self.unsubscribe(rest, Subscription::ShardChannel),
            "pubsub" => match (sub.as_str(), rest.len()) {
                ("channels" | "shardchannels", 1 | 2) => {
                    let kind = if sub == "channels" {
                        Subscription::Channel
                    } else {
                        Subscription::ShardChannel
                    };
                    Value::array(
                        self.shared
                            .listeners
                            .channels(kind, rest.get(1).map(|p| p.as_ref()))
                            .into_iter()
                            .map(Value::bulk)
                            .collect(),
                    )
                }
                ("numsub" | "shardnumsub", _) => {
                    let kind = if sub == "numsub" {
                        Subscription::Channel
                    } else {
                        Subscription::ShardChannel
                    };
                    Value::array(
                        rest[1..]
                            .iter()
                            .flat_map(|c| {
                                [
                                    Value::bulk(c.clone()),
                                    Value::Integer(self.shared.listeners.subscribers(kind, c) as i64),
                                ]
                            })
                            .collect(),
                    )
                }
                ("numpat", 1) => Value::Integer(self.shared.listeners.patterns() as i64),
                _ => Value::error(format!(
                    "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try PUBSUB HELP."
                )),
            },
            _ => unknown_command(args),
        };
        (value, Flow::Continue)
    }

    /// `CURP STATUS | PROPOSE | RECORD`: the two halves of the fast path for a client that
    /// talks to the leader and the witnesses itself (`chorus_client::CurpSession`). STATUS
    /// answers `[id, leader, term, [voter…]]` (no voters while a membership change is half
    /// done); PROPOSE names the voters whose witnesses the client asked to RECORD the write.
    async fn curp_command(&mut self, sub: &str, rest: &[Bytes]) -> Value {
        const USAGE: &str = "CURP takes STATUS, PROPOSE term witness,witness,... incarnation seq first_unacked \
                             command..., or RECORD term incarnation seq first_unacked command...";
        let Some(curp) = self.shared.curp.clone() else {
            return Value::error("ERR CURP is off on this node (--curp on)");
        };
        if sub == "status" && rest.len() == 1 {
            let status = self.shared.node.status();
            let voters = self.shared.node.settled_voters().unwrap_or_default();
            let voters = voters.into_iter().map(|id| Value::Integer(id as i64)).collect();
            return Value::array(vec![
                Value::Integer(status.id as i64),
                Value::Integer(status.leader_id as i64),
                Value::Integer(status.term as i64),
                Value::array(voters),
            ]);
        }
        if sub != "propose" && sub != "record" {
            return Value::error(format!("ERR {USAGE}"));
        }
        let witnesses = if sub == "propose" {
            match rest.get(2).and_then(|arg| parse_ids(arg)) {
                Some(witnesses) => Some(witnesses),
                None => return Value::error(format!("ERR {USAGE}")),
            }
        } else {
            None
        };
        let envelope_at = if witnesses.is_some() { 3 } else { 2 };
        let parsed = number_arg(rest, 1, USAGE).and_then(|term| Ok((term, owned_envelope(rest, envelope_at, USAGE)?)));
        let (term, (envelope, args)) = match parsed {
            Ok(parsed) => parsed,
            Err(e) => return e,
        };
        let write = match Command::parse(&args) {
            Ok(Some(Command::Write(write))) => write,
            Ok(_) => return Value::error("ERR CURP takes a write command"),
            Err(e) => return Value::error(e),
        };
        if write.touches_every_key() && sub == "record" {
            return Value::error("ERR a witness holds writes to named keys only; send this one the ordinary way");
        }
        self.shared.note_client_incarnation(envelope.client.incarnation);
        let command = encode_enveloped(&envelope, &args);
        if let Some(witnesses) = witnesses {
            curp.propose_for_client(command, term, witnesses).await
        } else {
            curp.record_for_client(&envelope, term, write.keys(), command).await
        }
    }

    /// AUTH: logs the connection in as `user` if `password` is theirs, unless its address
    /// failed too often lately (`LoginThrottle`), in which case the password is not checked.
    fn log_in(&mut self, user: &[u8], password: &[u8]) -> Value {
        match self.shared.logins.log_in(user, password, self.remote) {
            Ok(user) => {
                self.user = Some((user.name.clone(), user.rights));
                Value::ok()
            }
            Err(LoginRefused::Throttled { wait }) => Value::error(format!(
                "ERR too many failed logins from {}: try again in {} ms",
                self.remote,
                wait.as_millis().max(1)
            )),
            Err(LoginRefused::WrongPassword) => {
                tracing::info!(remote = %self.remote, user = %String::from_utf8_lossy(user), "RESP login refused");
                Value::error("WRONGPASS invalid username-password pair or user is disabled.")
            }
        }
    }

    /// Refuses what the connection's user may not run: anything but logging in before it
    /// logged in, writes for a read-only user (checked before a MULTI queues them).
    fn refused_by_rights(&mut self, args: &[Bytes]) -> Option<Value> {
        let rights = match &self.user {
            Some((_, Rights::ReadWrite)) => return None,
            Some((_, rights)) => *rights,
            None => Rights::None,
        };
        let mut name_buf = [0u8; MAX_COMMAND_NAME_BYTES];
        let name = short_name(args, &mut name_buf).unwrap_or("");
        if matches!(name, "auth" | "hello" | "quit" | "reset") {
            return None;
        }
        let Some((user, _)) = &self.user else {
            self.shared.metrics.refused_unauthenticated.inc();
            return Some(Value::error("NOAUTH Authentication required."));
        };
        let writes = match name {
            "ping" | "acl" => false,
            // A node's own writes (RIFL registration, CURP's halves), a leadership move, and
            // what only an administrator does: stopping the node, seeing every command.
            "rifl" | "curp" | "cluster" | "shutdown" | "monitor" => true,
            _ => match Command::parse(args) {
                Ok(Some(Command::Write(_))) => true,
                Ok(Some(Command::Blocking(blocking))) => blocking.reply != BlockingReply::Streams,
                _ => false,
            },
        };
        // A user with no rights may still see that the node answers.
        if (rights == Rights::None && name != "ping") || writes {
            let shown = if name.is_empty() {
                String::from_utf8_lossy(&args[0]).to_ascii_lowercase()
            } else {
                name.to_string()
            };
            return Some(Value::error(format!(
                "NOPERM User {user} has no permissions to run the '{shown}' command"
            )));
        }
        None
    }

    /// SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE] [ABORT]: the node drains and exits, as on SIGTERM
    /// (every acknowledged write is on disk already: there is nothing to save, nor to wait
    /// for before the drain). Like Redis, it answers nothing: the connection closes.
    fn shutdown(&mut self, rest: &[Bytes]) -> (Value, Flow) {
        let mut given = Vec::new();
        for arg in rest {
            let arg = arg.to_ascii_lowercase();
            match arg.as_slice() {
                b"nosave" | b"save" | b"now" | b"force" | b"abort" => given.push(arg),
                _ => return (Value::error("ERR syntax error"), Flow::Continue),
            }
        }
        let has = |option: &[u8]| given.iter().any(|g| g == option);
        let besides_abort = given.iter().any(|g| g != b"abort");
        if (has(b"abort") && besides_abort) || (has(b"save") && has(b"nosave")) {
            return (Value::error("ERR syntax error"), Flow::Continue);
        }
        if has(b"abort") {
            return (Value::error("ERR No shutdown in progress."), Flow::Continue);
        }
        tracing::info!(client = %self.seen.addr, "SHUTDOWN from a client");
        self.shared.drain.request_shutdown();
        (Value::Replies(Vec::new()), Flow::Close)
    }

    /// Counts a command, and shows it in CLIENT LIST as this connection's latest; its name as the
    /// command table has it.
    fn note_command(&self, name: Option<&str>) -> &'static str {
        let name = self.shared.metrics.count(name);
        self.seen.active(name);
        name
    }

    /// CLIENT LIST [TYPE normal|pubsub|master|replica] [ID id ...].
    fn client_list(&self, args: &[Bytes]) -> Value {
        let filter = match args {
            [] => None,
            [word, kind] if word.eq_ignore_ascii_case(b"type") => match kind.to_ascii_lowercase().as_slice() {
                b"normal" => Some(ClientFilter::Subscribed(false)),
                b"pubsub" => Some(ClientFilter::Subscribed(true)),
                // A Chorus node's replication is raft's, not a client's.
                b"master" | b"replica" | b"slave" => Some(ClientFilter::Ids(Vec::new())),
                _ => return Value::error(format!("ERR Unknown client type '{}'", String::from_utf8_lossy(kind))),
            },
            [word, ids @ ..] if word.eq_ignore_ascii_case(b"id") && !ids.is_empty() => {
                match ids.iter().map(|id| client_id_arg(id)).collect::<Result<Vec<_>, _>>() {
                    Ok(ids) => Some(ClientFilter::Ids(ids)),
                    Err(e) => return e,
                }
            }
            _ => return Value::error("ERR syntax error"),
        };
        let mut out = String::new();
        for seen in self.shared.clients.lock().expect("not poisoned").values() {
            if filter.as_ref().is_none_or(|f| f.matches(seen)) {
                out.push_str(&seen.line());
                out.push('\n');
            }
        }
        Value::bulk(out)
    }

    /// CLIENT KILL ip:port (OK, or no such client), or CLIENT KILL with filters (ID, ADDR,
    /// LADDR, USER, SKIPME): how many it killed. A killed connection closes once its current
    /// command has answered.
    fn client_kill(&self, args: &[Bytes]) -> Value {
        if let [addr] = args {
            let killed = self.kill_where(|seen| seen.addr.to_string().as_bytes() == addr.as_ref());
            return if killed > 0 {
                Value::ok()
            } else {
                Value::error("ERR No such client")
            };
        }
        if !args.len().is_multiple_of(2) {
            return Value::error("ERR syntax error");
        }
        let (mut filters, mut skip_me) = (Vec::new(), true);
        for pair in args.chunks_exact(2) {
            let (word, value) = (pair[0].to_ascii_lowercase(), &pair[1]);
            filters.push(match word.as_slice() {
                b"id" => match client_id_arg(value) {
                    Ok(id) => ClientFilter::Ids(vec![id]),
                    Err(e) => return e,
                },
                b"addr" => ClientFilter::Addr(value.clone()),
                b"laddr" => ClientFilter::LocalAddr(value.clone()),
                b"user" => ClientFilter::User(value.clone()),
                b"skipme" => {
                    skip_me = match value.to_ascii_lowercase().as_slice() {
                        b"yes" => true,
                        b"no" => false,
                        _ => return Value::error("ERR syntax error"),
                    };
                    continue;
                }
                _ => return Value::error("ERR syntax error"),
            });
        }
        let killed =
            self.kill_where(|seen| (!skip_me || seen.id != self.id) && filters.iter().all(|f| f.matches(seen)));
        Value::Integer(killed as i64)
    }

    /// Kills the connections `which` picks; how many.
    /// CLIENT UNBLOCK id [TIMEOUT|ERROR]: 1 if that connection was waiting in a blocking
    /// command and now is answered (as if its timeout ran out, or with an error), else 0.
    fn client_unblock(&self, args: &[Bytes]) -> Value {
        let how = match args.get(1).map(|a| a.to_ascii_lowercase()) {
            None => Unblock::TimedOut,
            Some(reason) if reason == b"timeout" => Unblock::TimedOut,
            Some(reason) if reason == b"error" => Unblock::Error,
            Some(_) => return Value::error("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
        };
        let Some(id) = std::str::from_utf8(&args[0]).ok().and_then(|id| id.parse::<i64>().ok()) else {
            return Value::error("ERR value is not an integer or out of range");
        };
        let target = u64::try_from(id)
            .ok()
            .and_then(|id| self.shared.clients.lock().expect("not poisoned").get(&id).cloned());
        let Some(target) = target else {
            return Value::Integer(0);
        };
        let Some(wake) = target.blocked_wake.lock().expect("not poisoned").clone() else {
            return Value::Integer(0);
        };
        *target.unblocked.lock().expect("not poisoned") = Some(how);
        wake.notify_one();
        Value::Integer(1)
    }

    fn kill_where(&self, which: impl Fn(&ClientSeen) -> bool) -> usize {
        let clients = self.shared.clients.lock().expect("not poisoned");
        let mut killed = 0;
        for seen in clients.values().filter(|seen| which(seen)) {
            seen.kill();
            killed += 1;
        }
        killed
    }

    fn consistency_name(&self) -> &'static str {
        match self.consistency {
            ReadConsistency::Linearizable => "linearizable",
            ReadConsistency::Stale => "stale",
        }
    }

    /// `HELLO [protover [AUTH username password] [SETNAME clientname]]`, as Redis 7 answers it:
    /// switches the connection's protocol and describes the server. Without authentication
    /// configured, the only user is `default`, and any password is its password (Redis's
    /// `nopass` default user).
    fn hello(&mut self, args: &[Bytes]) -> Value {
        let mut protocol = self.protocol;
        let mut name = None;
        if let Some(version) = args.first() {
            protocol = match version.as_ref() {
                b"2" => Protocol::Resp2,
                b"3" => Protocol::Resp3,
                _ if std::str::from_utf8(version).is_ok_and(|v| v.parse::<i64>().is_ok()) => {
                    return Value::error("NOPROTO unsupported protocol version")
                }
                _ => return Value::error("ERR Protocol version is not an integer or out of range"),
            };
            let mut options = &args[1..];
            while let Some(option) = options.first() {
                match (option.to_ascii_lowercase().as_slice(), options.len()) {
                    (b"auth", n) if n >= 3 => {
                        let logged_in = self.log_in(&options[1], &options[2]);
                        if logged_in.is_error() {
                            return logged_in;
                        }
                        options = &options[3..];
                    }
                    (b"setname", n) if n >= 2 => {
                        name = Some(Bytes::copy_from_slice(&options[1]));
                        options = &options[2..];
                    }
                    _ => {
                        return Value::error(format!(
                            "ERR Syntax error in HELLO option '{}'",
                            String::from_utf8_lossy(option)
                        ))
                    }
                }
            }
        }
        if self.user.is_none() {
            return Value::error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                 HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                 select the RESP protocol version at the same time",
            );
        }
        self.protocol = protocol;
        if name.is_some() {
            self.name = name;
        }
        let proto = match protocol {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        };
        // As INFO's replication section says it (role:slave), in HELLO's words.
        let role = if self.shared.node.status().role == chorus_log::Role::Leader {
            "master"
        } else {
            "replica"
        };
        Value::map(vec![
            (Value::bulk("server"), Value::bulk("chorus")),
            (Value::bulk("version"), Value::bulk(env!("CARGO_PKG_VERSION"))),
            (Value::bulk("proto"), Value::Integer(proto)),
            (Value::bulk("id"), Value::Integer(self.id as i64)),
            (Value::bulk("mode"), Value::bulk("standalone")),
            (Value::bulk("role"), Value::bulk(role)),
            (Value::bulk("modules"), Value::array(Vec::new())),
        ])
    }

    /// MEMORY USAGE key [SAMPLES n] (read as this session reads keys; SAMPLES changes nothing,
    /// as no value is sampled) and MEMORY HELP.
    async fn memory_command(&self, sub: &str, rest: &[Bytes]) -> Value {
        match sub {
            "usage" if rest.len() >= 2 => {
                let mut options = rest[2..].iter();
                while let Some(option) = options.next() {
                    match options.next() {
                        Some(samples) if option.eq_ignore_ascii_case(b"samples") => {
                            match crate::command::parse_i64(samples) {
                                Ok(n) if n >= 0 => {}
                                Ok(_) => return Value::error("ERR syntax error"),
                                Err(e) => return Value::error(e),
                            }
                        }
                        _ => return Value::error("ERR syntax error"),
                    }
                }
                let read = crate::command::Read::MemoryUsage(rest[1].clone());
                match self.shared.node.read(read, self.consistency).await {
                    Ok(value) => value,
                    Err(e) => node_error(e),
                }
            }
            "usage" => Value::error("ERR wrong number of arguments for 'memory|usage' command"),
            "help" => crate::state::help_reply(&[
                "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "USAGE <key> [SAMPLES <count>]",
                "    Return about how many bytes <key> takes in memory were its values all cached:",
                "    its records' keys and values, and what the index spends on each record.",
                "HELP",
                "    Print this help.",
            ]),
            _ => Value::error(format!("ERR unknown subcommand '{sub}'. Try MEMORY HELP.")),
        }
    }

    async fn info(&self, section: &str) -> String {
        let status = self.shared.node.status();
        let (keys, expires) = match self
            .shared
            .node
            .read(crate::command::Read::KeyspaceCounts, ReadConsistency::Stale)
            .await
        {
            Ok(Value::Array(Some(counts))) => match counts[..] {
                [Value::Integer(keys), Value::Integer(expires)] => (keys, expires),
                _ => (0, 0),
            },
            _ => (0, 0),
        };
        let all = section.is_empty() || section == "all" || section == "everything" || section == "default";
        let uptime = self.shared.started.elapsed().as_secs();
        let mut out = String::new();
        if all || section == "server" {
            out.push_str(&format!(
                "# Server\r\nredis_version:7.0.0\r\nchorus_version:{}\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:{}\r\nmultiplexing_api:epoll\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n\r\n",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::env::consts::ARCH,
                usize::BITS,
                std::process::id(),
                self.shared.options.resp_addr.port(),
                uptime / 86_400,
            ));
        }
        if all || section == "clients" {
            out.push_str(&format!(
                "# Clients\r\nconnected_clients:{}\r\nblocked_clients:{}\r\n\r\n",
                self.shared.drain.open_connections(),
                self.shared.listeners.blocked_clients()
            ));
        }
        let usage = ProcessUsage::now();
        if all || section == "memory" {
            out.push_str(&format!(
                "# Memory\r\nused_memory:{rss}\r\nused_memory_human:{}\r\nused_memory_rss:{rss}\r\nused_memory_peak:{peak}\r\nmaxmemory:0\r\n\r\n",
                human_bytes(usage.resident_bytes),
                rss = usage.resident_bytes,
                peak = usage.peak_resident_bytes,
            ));
        }
        if all || section == "stats" {
            let commands: u64 = self.shared.metrics.by_command.values().map(|calls| calls.get()).sum();
            let (_, _, error_replies) = self.shared.command_stats.totals();
            out.push_str(&format!(
                "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{commands}\r\ntotal_error_replies:{error_replies}\r\n\r\n",
                self.shared.metrics.connections.get()
            ));
        }
        if all || section == "replication" {
            let role = if status.role == chorus_log::Role::Leader {
                "master"
            } else {
                "slave"
            };
            out.push_str(&format!("# Replication\r\nrole:{role}\r\n\r\n"));
        }
        if all || section == "cpu" {
            out.push_str(&format!(
                "# CPU\r\nused_cpu_sys:{:.6}\r\nused_cpu_user:{:.6}\r\n\r\n",
                usage.system_cpu_secs, usage.user_cpu_secs
            ));
        }
        if all || section == "raft" {
            out.push_str(&format!(
                "# Raft\r\nraft_node_id:{}\r\nraft_role:{}\r\nraft_term:{}\r\nraft_leader_id:{}\r\nraft_commit_index:{}\r\nraft_applied_index:{}\r\nraft_first_index:{}\r\nraft_last_index:{}\r\nraft_snapshot_index:{}\r\nread_consistency:{}\r\n\r\n",
                status.id,
                status.role.as_str(),
                status.term,
                status.leader_id,
                status.commit_index,
                status.applied_index,
                status.first_index,
                status.last_index,
                status.snapshot_index,
                self.consistency_name()
            ));
        }
        if all || section == "modules" {
            out.push_str("# Modules\r\n\r\n");
        }
        if all || section == "errorstats" {
            out.push_str("# Errorstats\r\n");
            self.shared.command_stats.write_errorstats(&mut out);
            out.push_str("\r\n");
        }
        if all || section == "keyspace" {
            // Redis samples its average time to live; Chorus does not estimate it.
            out.push_str(&format!(
                "# Keyspace\r\ndb0:keys={keys},expires={expires},avg_ttl=0\r\n"
            ));
        }
        // As in Redis, only asked for by name or with everything.
        let by_name_or_everything = |name: &str| section == name || section == "all" || section == "everything";
        let stats = &self.shared.command_stats;
        for (name, title, write) in [
            (
                "commandstats",
                "Commandstats",
                CommandStats::write_commandstats as fn(&CommandStats, &mut String),
            ),
            ("latencystats", "Latencystats", CommandStats::write_latencystats),
        ] {
            if by_name_or_everything(name) {
                if !out.is_empty() && !out.ends_with("\r\n\r\n") {
                    out.push_str("\r\n");
                }
                out.push_str(&format!("# {title}\r\n"));
                write(stats, &mut out);
            }
        }
        out
    }
}

/// A client connection as CLIENT LIST shows it. The connection writes it: its latest command at
/// each one (two uncontended stores), the rest when a server command may have changed it.
struct ClientSeen {
    id: u64,
    addr: std::net::SocketAddr,
    local_addr: std::net::SocketAddr,
    connected_at: Instant,
    /// When its latest command came, in ms after `connected_at`, and its name.
    active_ms: AtomicU64,
    last_command: Mutex<&'static str>,
    /// Name, user, RESP version and subscriptions, as its server commands left them.
    described: Mutex<ClientDescription>,
    /// CLIENT KILL: the connection's waits for its client end on `killed`; a blocked command
    /// looks at `was_killed` when it looks again.
    killed: tokio::sync::Notify,
    was_killed: std::sync::atomic::AtomicBool,
    /// While it waits in a blocking command: what wakes it, for CLIENT UNBLOCK.
    blocked_wake: Mutex<Option<Arc<tokio::sync::Notify>>>,
    /// CLIENT UNBLOCK's word to its blocking command: end as if timed out, or with an error.
    unblocked: Mutex<Option<Unblock>>,
}

/// How CLIENT UNBLOCK ends a blocking command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unblock {
    TimedOut,
    Error,
}

#[derive(Default)]
struct ClientDescription {
    name: String,
    user: String,
    resp: u8,
    channels: usize,
    patterns: usize,
    shard_channels: usize,
}

impl ClientDescription {
    fn subscriptions(&self) -> usize {
        self.channels + self.patterns + self.shard_channels
    }
}

impl ClientSeen {
    fn new(id: u64, addr: std::net::SocketAddr, local_addr: std::net::SocketAddr) -> ClientSeen {
        ClientSeen {
            id,
            addr,
            local_addr,
            connected_at: Instant::now(),
            active_ms: AtomicU64::new(0),
            last_command: Mutex::new("NULL"),
            described: Mutex::new(ClientDescription {
                resp: 2,
                ..ClientDescription::default()
            }),
            killed: tokio::sync::Notify::new(),
            was_killed: std::sync::atomic::AtomicBool::new(false),
            blocked_wake: Mutex::new(None),
            unblocked: Mutex::new(None),
        }
    }

    fn kill(&self) {
        self.was_killed.store(true, Ordering::Relaxed);
        self.killed.notify_one();
    }

    fn active(&self, command: &'static str) {
        self.active_ms
            .store(self.connected_at.elapsed().as_millis() as u64, Ordering::Relaxed);
        *self.last_command.lock().expect("not poisoned") = command;
    }

    fn describe(&self, conn: &Connection) {
        let text = |bytes: &Option<Bytes>| bytes.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        *self.described.lock().expect("not poisoned") = ClientDescription {
            name: text(&conn.name).unwrap_or_default(),
            user: conn.user.as_ref().map(|(user, _)| user.clone()).unwrap_or_default(),
            resp: match conn.protocol {
                Protocol::Resp2 => 2,
                Protocol::Resp3 => 3,
            },
            channels: conn.channels.len(),
            patterns: conn.patterns.len(),
            shard_channels: conn.shard_channels.len(),
        };
    }

    /// Its line in CLIENT LIST, in Redis's `key=value` form (the fields Chorus has).
    fn line(&self) -> String {
        let described = self.described.lock().expect("not poisoned");
        let age_secs = self.connected_at.elapsed().as_secs();
        let idle_secs = (self.connected_at.elapsed().as_millis() as u64)
            .saturating_sub(self.active_ms.load(Ordering::Relaxed))
            / 1000;
        let flags = if described.subscriptions() > 0 { "P" } else { "N" };
        format!(
            "id={} addr={} laddr={} name={} age={age_secs} idle={idle_secs} flags={flags} db=0 sub={} psub={} ssub={} cmd={} user={} resp={}",
            self.id,
            self.addr,
            self.local_addr,
            described.name,
            described.channels,
            described.patterns,
            described.shard_channels,
            self.last_command.lock().expect("not poisoned"),
            described.user,
            described.resp,
        )
    }
}

/// A connection waiting in a blocking command, reachable by CLIENT UNBLOCK until this drops.
struct Unblockable(Arc<ClientSeen>);

impl Unblockable {
    fn new(seen: Arc<ClientSeen>, wake: Arc<tokio::sync::Notify>) -> Unblockable {
        *seen.blocked_wake.lock().expect("not poisoned") = Some(wake);
        Unblockable(seen)
    }
}

impl Drop for Unblockable {
    fn drop(&mut self) {
        *self.0.blocked_wake.lock().expect("not poisoned") = None;
        // An UNBLOCK that came as the command ended is not kept for the next one.
        *self.0.unblocked.lock().expect("not poisoned") = None;
    }
}

/// Which clients CLIENT LIST shows or CLIENT KILL kills.
enum ClientFilter {
    Ids(Vec<u64>),
    Subscribed(bool),
    Addr(Bytes),
    LocalAddr(Bytes),
    User(Bytes),
}

impl ClientFilter {
    fn matches(&self, seen: &ClientSeen) -> bool {
        match self {
            ClientFilter::Ids(ids) => ids.contains(&seen.id),
            ClientFilter::Subscribed(subscribed) => {
                let described = seen.described.lock().expect("not poisoned");
                (described.subscriptions() > 0) == *subscribed
            }
            ClientFilter::Addr(addr) => seen.addr.to_string().as_bytes() == addr.as_ref(),
            ClientFilter::LocalAddr(addr) => seen.local_addr.to_string().as_bytes() == addr.as_ref(),
            ClientFilter::User(user) => seen.described.lock().expect("not poisoned").user.as_bytes() == user.as_ref(),
        }
    }
}

/// A client id as CLIENT LIST ID and CLIENT KILL ID take one.
fn client_id_arg(arg: &[u8]) -> Result<u64, Value> {
    crate::command::parse_i64(arg)
        .ok()
        .and_then(|id| u64::try_from(id).ok())
        .filter(|id| *id > 0)
        .ok_or_else(|| Value::error("ERR client-id should be greater than 0"))
}

/// What this process uses, as INFO's memory and CPU sections report it (Redis's `used_memory`
/// is its allocator's count; Chorus reports its resident memory there, which is what it costs).
struct ProcessUsage {
    resident_bytes: u64,
    peak_resident_bytes: u64,
    system_cpu_secs: f64,
    user_cpu_secs: f64,
}

impl ProcessUsage {
    fn now() -> ProcessUsage {
        // SAFETY: getrusage fills the struct it is given; sysconf has no preconditions.
        let (usage, page_bytes) = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            (usage, libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64)
        };
        // statm: total and resident pages, then others.
        let resident_pages = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0);
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        ProcessUsage {
            resident_bytes: resident_pages * page_bytes,
            peak_resident_bytes: usage.ru_maxrss as u64 * 1024,
            system_cpu_secs: secs(usage.ru_stime),
            user_cpu_secs: secs(usage.ru_utime),
        }
    }
}

/// Bytes as Redis's `used_memory_human` shows them (`1.50M`).
fn human_bytes(bytes: u64) -> String {
    let units = [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    match units.iter().find(|(_, size)| bytes >= *size) {
        Some((unit, size)) => format!("{:.2}{unit}", bytes as f64 / *size as f64),
        None => format!("{bytes}B"),
    }
}

/// Answers CONFIG GET honestly for the parameters that describe Chorus; others match nothing.
fn config_get(patterns: &[Bytes], keyspace_flags: u16, slowlog: &SlowLog) -> Value {
    let keyspace_events = keyspace_events::render(keyspace_flags);
    let known = [
        ("appendonly", "yes".to_string()),
        ("appendfsync", "always".to_string()),
        ("databases", "1".to_string()),
        ("maxmemory", "0".to_string()),
        ("notify-keyspace-events", keyspace_events),
        ("save", String::new()),
        ("slowlog-log-slower-than", slowlog.slower_than_us().to_string()),
        ("slowlog-max-len", slowlog.max_len().to_string()),
    ];
    let mut pairs = Vec::new();
    for (key, value) in known {
        if patterns.iter().any(|p| glob_match(p, key.as_bytes(), true)) {
            pairs.push((Value::bulk(key), Value::bulk(value)));
        }
    }
    Value::map(pairs)
}

/// The slow log's settings, which CONFIG SET changes on this node only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlowlogSetting {
    SlowerThanUs,
    MaxLen,
}

fn slowlog_setting(name: &[u8]) -> Option<SlowlogSetting> {
    if name.eq_ignore_ascii_case(b"slowlog-log-slower-than") {
        Some(SlowlogSetting::SlowerThanUs)
    } else if name.eq_ignore_ascii_case(b"slowlog-max-len") {
        Some(SlowlogSetting::MaxLen)
    } else {
        None
    }
}

/// CONFIG SET of slow log settings (`pairs`: name, value, …): every value checked before any
/// is set, with Redis's errors.
fn config_set_slowlog(slowlog: &SlowLog, pairs: &[Bytes]) -> Value {
    let mut checked: Vec<(SlowlogSetting, i64)> = Vec::new();
    for pair in pairs.chunks(2) {
        let setting = slowlog_setting(&pair[0]).expect("only slow log settings come here");
        let failed = |why: &str| {
            Value::error(format!(
                "ERR CONFIG SET failed (possibly related to argument '{}') - {why}",
                String::from_utf8_lossy(&pair[0]).to_ascii_lowercase()
            ))
        };
        if checked.iter().any(|(seen, _)| *seen == setting) {
            return failed("duplicate parameter");
        }
        let Some(value) = std::str::from_utf8(&pair[1]).ok().and_then(|v| v.parse::<i64>().ok()) else {
            return failed("argument couldn't be parsed into an integer");
        };
        if setting == SlowlogSetting::MaxLen && value < 0 {
            return failed("argument must be between 0 and 9223372036854775807 inclusive");
        }
        checked.push((setting, value));
    }
    for (setting, value) in checked {
        match setting {
            SlowlogSetting::SlowerThanUs => slowlog.set_slower_than_us(value),
            SlowlogSetting::MaxLen => slowlog.set_max_len(value as u64),
        }
    }
    Value::ok()
}

/// SLOWLOG and its subcommands.
fn slowlog_command(slowlog: &SlowLog, sub: &str, rest: &[Bytes]) -> Value {
    match (sub, rest.len()) {
        (_, 0) => Value::error("ERR wrong number of arguments for 'slowlog' command"),
        ("get", 1) => slowlog.newest(Some(10)),
        ("get", 2) => match std::str::from_utf8(&rest[1]).ok().and_then(|n| n.parse::<i64>().ok()) {
            Some(-1) => slowlog.newest(None),
            Some(count) if count >= 0 => slowlog.newest(Some(count as usize)),
            _ => Value::error("ERR count should be greater than or equal to -1"),
        },
        ("len", 1) => Value::Integer(slowlog.len() as i64),
        ("reset", 1) => {
            slowlog.reset();
            Value::ok()
        }
        ("help", 1) => crate::state::help_reply(&[
            "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "GET [<count>]",
            "    Return the newest <count> entries (10 if not given, every one for -1), each:",
            "    id, unix time, microseconds from reading the command to its reply being ready,",
            "    the command's arguments, the client's address and the client's name.",
            "LEN",
            "    Return how many entries this node keeps.",
            "RESET",
            "    Drop every entry.",
            "HELP",
            "    Print this help.",
        ]),
        ("get" | "len" | "reset" | "help", _) => {
            Value::error(format!("ERR wrong number of arguments for 'slowlog|{sub}' command"))
        }
        _ => Value::error(format!(
            "ERR unknown subcommand '{}'. Try SLOWLOG HELP.",
            String::from_utf8_lossy(&rest[0])
        )),
    }
}

/// LATENCY: HISTOGRAM from the command statistics. Redis's latency monitor (LATEST, HISTORY,
/// GRAPH, DOCTOR) records events past a threshold, off by default; Chorus has none to record, so
/// those answer as an idle monitor does.
fn latency_command(stats: &CommandStats, sub: &str, rest: &[Bytes]) -> Value {
    match (sub, rest.len()) {
        (_, 0) => Value::error("ERR wrong number of arguments for 'latency' command"),
        ("histogram", _) => {
            let asked: Vec<String> = rest[1..]
                .iter()
                .map(|name| String::from_utf8_lossy(name).to_ascii_lowercase())
                .collect();
            stats.histograms(&asked)
        }
        ("latest", 1) | ("history", 2) => Value::array(Vec::new()),
        ("reset", _) => Value::Integer(0),
        ("graph", 2) => Value::error(format!(
            "ERR No samples available for event '{}'",
            String::from_utf8_lossy(&rest[1])
        )),
        ("doctor", 1) => Value::bulk(
            "Chorus records no latency events (Redis's latency monitor). Each command's latency, from \
             reading it to its reply being ready: LATENCY HISTOGRAM and INFO latencystats; the slowest \
             commands: SLOWLOG GET; the raft log's fsync, commit and apply times: the node's /metrics.",
        ),
        ("help", 1) => crate::state::help_reply(&[
            "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "HISTOGRAM [COMMAND ...]",
            "    Return a cumulative distribution of the latencies of the commands named (every",
            "    command this node timed if none is): calls under each power of two of microseconds.",
            "LATEST",
            "    Return the latest latency samples of every event (Chorus records none).",
            "HISTORY <event>",
            "    Return the time-latency samples of the <event> class (Chorus records none).",
            "GRAPH <event>",
            "    Return an ASCII latency graph of the <event> class.",
            "RESET [<event> ...]",
            "    Reset latency data of one or more <event> classes.",
            "DOCTOR",
            "    Return where to look for this node's latencies.",
            "HELP",
            "    Print this help.",
        ]),
        ("latest" | "history" | "graph" | "doctor" | "help", _) => {
            Value::error(format!("ERR wrong number of arguments for 'latency|{sub}' command"))
        }
        _ => Value::error(format!(
            "ERR unknown subcommand '{}'. Try LATENCY HELP.",
            String::from_utf8_lossy(&rest[0])
        )),
    }
}

/// MODULE: Chorus loads none, so LIST is empty (clients ask it to look for RedisJSON and the like).
fn module_command(sub: &str, rest: &[Bytes]) -> Value {
    match (sub, rest.len()) {
        (_, 0) => Value::error("ERR wrong number of arguments for 'module' command"),
        ("list", 1) => Value::array(Vec::new()),
        ("load" | "loadex" | "unload", n) if n >= 2 => {
            Value::error("ERR Chorus does not load Redis modules: its commands are built in")
        }
        ("help", 1) => crate::state::help_reply(&[
            "MODULE <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "LIST",
            "    Return the modules loaded: none, as Chorus loads no Redis modules.",
            "HELP",
            "    Print this help.",
        ]),
        ("list" | "load" | "loadex" | "unload" | "help", _) => {
            Value::error(format!("ERR wrong number of arguments for 'module|{sub}' command"))
        }
        _ => Value::error(format!(
            "ERR unknown subcommand '{}'. Try MODULE HELP.",
            String::from_utf8_lossy(&rest[0])
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command the table reports is one this node answers: a data command the parser
    /// knows (an arity error counts: it knows the name), or one the front end answers itself.
    #[test]
    fn the_command_table_names_only_commands_chorus_answers() {
        const TRANSACTION_COMMANDS: [&str; 5] = ["multi", "exec", "discard", "watch", "unwatch"];
        for spec in table::COMMANDS {
            let known = SERVER_COMMANDS.contains(&spec.name)
                || TRANSACTION_COMMANDS.contains(&spec.name)
                || !matches!(Command::parse(&[Bytes::from(spec.name)]), Ok(None));
            assert!(known, "COMMAND lists {} but no one answers it", spec.name);
        }
        assert_eq!(
            command_command("count", &[]),
            Value::Integer(table::COMMANDS.len() as i64)
        );
        let info = command_command(
            "info",
            &[Bytes::from("info"), Bytes::from("GET"), Bytes::from("nosuch")],
        );
        let Value::Array(Some(entries)) = info else {
            panic!("{info:?}")
        };
        assert_eq!(entries[1], Value::Array(None));
        let Value::Array(Some(get)) = &entries[0] else {
            panic!("{entries:?}")
        };
        assert_eq!(
            (&get[0], &get[1], &get[3]),
            (&Value::bulk("get"), &Value::Integer(2), &Value::Integer(1))
        );
    }

    #[test]
    fn config_get_matches_globs() {
        let slowlog = SlowLog::new(slowlog::DEFAULT_SLOWER_THAN_US, slowlog::DEFAULT_MAX_LEN);
        assert_eq!(
            config_get(&[Bytes::from("save")], 0, &slowlog),
            Value::map(vec![(Value::bulk("save"), Value::bulk(""))])
        );
        let Value::Map(all) = config_get(&[Bytes::from("*")], 0, &slowlog) else {
            panic!()
        };
        assert_eq!(all.len(), 8);
        assert_eq!(config_get(&[Bytes::from("nothing*")], 0, &slowlog), Value::map(vec![]));
        assert_eq!(config_get(&[Bytes::from("APPEND?")], 0, &slowlog), Value::map(vec![]));
        assert_eq!(
            config_get(
                &[Bytes::from("notify-*")],
                keyspace_events::parse(b"KEA").unwrap(),
                &slowlog
            ),
            Value::map(vec![(Value::bulk("notify-keyspace-events"), Value::bulk("AKE"))])
        );
        let Value::Map(append) = config_get(&[Bytes::from("APPEND*")], 0, &slowlog) else {
            panic!()
        };
        assert_eq!(append.len(), 2, "CONFIG GET patterns ignore case");
    }
}
