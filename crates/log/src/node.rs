//! The replicated log node: one task owns `RawNode` and runs the Ready loop; everything else
//! talks to it through bounded channels.
//!
//! The loop is a task on the caller's runtime. `chorus server` runs a node on one thread (a
//! current-thread runtime, as Redis does), and that is the point: handing work between the front
//! end, the loop and the transport costs no cross-thread wake-up (no futex, no eventfd, no
//! context switch). The one other thread on the write path is the raft log's writer
//! (`wal_writer`): a Ready's append is handed to it, and the loop goes on — a leader answers the
//! last batch, reads the next and proposes it while its own append is on the device — and learns
//! of the write's completion as an event (one wake-up per write, not per command). What raft
//! must not do before the append is durable waits for it: a follower's acknowledgement and a
//! vote go out then, and raft counts the node's own copy of an entry only then (`Persisting`).
//!
//! Writes are batched: every command that arrived since the last iteration is proposed as one
//! raft entry. Followers propose too; raft forwards the entry to the leader, and the proposing
//! node answers its client when it applies the entry itself. Linearizable reads are batched the
//! same way behind one ReadIndex request and served once the node has applied up to that index.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use chorus_metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use raft::eraftpb::{ConfChange, ConfChangeV2, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, ReadState, SnapshotStatus, StateRole};
use tokio::sync::{mpsc, oneshot, watch};

use crate::backup::{self, BackupHeader};
use crate::batch::{self, Origin, BATCH_HEADER_BYTES, COMMAND_OVERHEAD_BYTES};
use crate::codec::{EntryCodec, Prepared, Preparer, RaftLogView, CODEC_ENTRY};
use crate::curp_leader::CurpLeader;
use crate::error::{NodeError, StorageError};
use crate::membership::{self, Addresses, ChangeAnswer, MemberChange, Members};
use crate::replica_wait;
use crate::shipment::{self, Shipper, SnapshotFiles};
use crate::storage::{write_snapshot_file, DiskStorage, StorageOptions};
use crate::transport::{self, PeerCalls, PeerEvent, PeerRequest, Transport, TransportConfig};
use crate::wire::{put_blob, Reader};

/// A deterministic state machine fed by the committed log.
pub trait StateMachine: Send + 'static {
    /// A read executed against local state (after ReadIndex when linearizable).
    type Query: Send + 'static;
    type Output: Send + 'static;

    /// Applies one committed command. Must depend only on the state and the command (and the
    /// entry's time, which `entry_time` gave).
    fn apply(&mut self, index: u64, command: &[u8]) -> Self::Output;
    /// Called before the commands of an entry are applied with the time the leader fixed for
    /// them (milliseconds since the Unix epoch; 0 in entries from before leaders fixed one). The
    /// only clock a deterministic state machine may read while applying.
    fn entry_time(&mut self, _leader_time_ms: u64) {}
    /// Every command of the entry at `index` has been applied; called for every entry, commands
    /// or not, in log order.
    fn entry_applied(&mut self, index: u64);
    /// Every entry of one round of applies (those that became committed together, often
    /// several, up to `APPLY_ROUND_MAX_BYTES` of them) has been applied: a state that commits
    /// its own storage may do it once here rather than per entry.
    fn round_applied(&mut self) {}
    fn query(&mut self, query: &Self::Query) -> Self::Output;
    /// A read that may take a slow step (a device read) off the raft loop: `Err` with that step,
    /// which the node runs off the loop (a blocking thread, or a task for a step that only
    /// waits) while the loop goes on, then finishes the read on the loop with what the step
    /// returns. By default every read is answered at once.
    fn query_or_defer(&mut self, query: &Self::Query) -> Result<Self::Output, SlowRead<Self>>
    where
        Self: Sized,
    {
        Ok(self.query(query))
    }
    /// Whether the state can be captured now. One that says no is asked again after later
    /// applies, and should make itself ready soon (a state with work not yet in the log waits
    /// for the log to catch up).
    fn snapshot_ready(&mut self) -> bool {
        true
    }
    /// What writing one snapshot costs, in bytes. A node takes its next snapshot only once at
    /// least this many bytes of commands were applied since the last, so that a state copied
    /// whole (a database file) is written at most once per log's worth of commands, however
    /// large it grows. By default a snapshot costs nothing worth waiting for.
    fn snapshot_cost_bytes(&mut self) -> u64 {
        0
    }
    /// Captures the state at the last applied entry and returns what, run on another thread,
    /// waits until that state is durable and returns the snapshot data describing it. The raft
    /// log up to that entry is compacted once the data is written.
    fn snapshot_later(&mut self) -> Box<dyn FnOnce() -> Vec<u8> + Send>;
    /// The files a follower behind the compacted log needs besides the snapshot data, pinned so
    /// they outlive their shipment.
    fn snapshot_files(&mut self, snapshot: &[u8]) -> Result<SnapshotFiles, String>;
    /// Replaces the state with the one the leader's snapshot data describes, its files received
    /// into `files_dir`. An error means they are corrupt.
    fn install_snapshot(&mut self, snapshot: &[u8], files_dir: &Path) -> Result<(), String>;
    /// This local snapshot data is now durable in the raft storage: what only older snapshots
    /// needed may go.
    fn snapshot_persisted(&mut self, snapshot: &[u8]);
    /// Whether the state's own storage is out of space: the node takes no more writes until
    /// it is not (what was applied meanwhile waits in memory and in the raft log).
    fn out_of_space(&self) -> bool {
        false
    }
    /// The voters of the configuration in force (the incoming ones while a change is half
    /// done), sorted: told once when the node starts, then whenever a membership change applies
    /// or a snapshot replaces the configuration, in log order.
    fn voters_changed(&mut self, _voters: &[u64]) {}
    /// Called once per raft tick: background work of the state's own that must not wait for
    /// the next entry to be applied, which on an idle node may never come.
    fn tick(&mut self) {}
    /// CURP, on a leader that speculates: the reply `command`, about to join the log at `index`,
    /// will give when it applies, if that is known now. Called just before `proposed` for it.
    fn speculate(&mut self, _index: u64, _command: &[u8]) -> Option<Self::Output> {
        None
    }
    /// CURP, on a leader that speculates: `command` joined the log at `index`. Called once per
    /// command in log order — this node's, forwarded ones, and the uncommitted tail a new leader
    /// inherits — until the node stops being leader.
    fn proposed(&mut self, _index: u64, _command: &[u8]) {}
    /// CURP: the node became leader or stopped being one; forget what `proposed` told.
    fn forget_proposed(&mut self) {}
    /// Whether that background work is under way. An idle node gives back memory once more
    /// when it ends: the work frees what it used after the first release.
    fn background_work(&self) -> bool {
        false
    }
}

/// The slow step of a read (`StateMachine::query_or_defer`), run off the raft loop; it returns
/// what finishes the read on the loop.
pub enum SlowRead<SM: StateMachine> {
    /// Work that blocks its thread (a device read): run on a blocking thread.
    Blocking(Box<dyn FnOnce() -> FinishRead<SM> + Send>),
    /// Waiting for others (a peer's answer): run as a task, which holds no thread meanwhile.
    Waiting(std::pin::Pin<Box<dyn std::future::Future<Output = FinishRead<SM>> + Send>>),
}
/// Finishes a deferred read against the state, on the raft loop.
pub type FinishRead<SM> = Box<dyn FnOnce(&mut SM) -> <SM as StateMachine>::Output + Send>;

/// Slow read steps running off the loop at once; more wait their turn (a slow step may block on
/// the network, so none ever runs on the loop).
const MAX_SLOW_READS_IN_FLIGHT: usize = 64;

/// At most this many bytes of committed entries are applied in one round of the raft loop
/// (always at least one entry; fewer where applies are slow, see `APPLY_ROUND_TARGET`); the
/// rest wait for the next round. A node with a long backlog — restarted, or a follower whose
/// applies run behind — applies it in rounds between which it answers heartbeats, votes and
/// reads: a state whose applies are slow (a SQL engine applying write-sets) would otherwise
/// stall the loop for seconds and cost the cluster its leader.
const APPLY_ROUND_MAX_BYTES: u64 = 256 * 1024;

/// What a round of applies should take at most, well inside a heartbeat interval: where applies
/// are slow the round's byte bound shrinks to what fits (`next_apply_round_bytes`).
const APPLY_ROUND_TARGET: Duration = Duration::from_millis(50);

/// The byte bound never shrinks below this: a round still applies a useful amount.
const APPLY_ROUND_MIN_BYTES: u64 = 4 * 1024;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: u64,
    /// Every voter at the cluster's first start, this node included (with `join`: the members
    /// to reach, and this node). Once the membership changes, what the log recorded wins.
    pub peers: Vec<(u64, SocketAddr)>,
    /// Start with no configuration and wait for the leader to add this node (as a learner,
    /// then a voter): how a node joins a running cluster. Ignored once the node has data.
    pub join: bool,
    pub data_dir: PathBuf,
    pub tick_ms: u64,
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    pub max_batch_commands: usize,
    pub max_batch_bytes: usize,
    /// The leader holds new writes while this many of its entries are uncommitted (group
    /// commit), unless a full batch is waiting or the oldest has waited `group_commit_wait_us`.
    pub group_commit_entries: u64,
    pub group_commit_wait_us: u64,
    /// After one of its entries commits, the leader holds new writes up to this long until as
    /// many are queued as it just answered: those clients' next writes join the next entry.
    pub group_commit_linger_us: u64,
    /// How long a request waits for a leader before failing with a retryable error.
    pub leader_wait_ms: u64,
    /// How long a proposed write may take to apply before its outcome is reported unknown.
    pub request_timeout_ms: u64,
    /// The leader serves linearizable reads from its own state while it holds a read lease,
    /// without a round of heartbeats per batch of reads (see `ReadLease`).
    pub read_lease: bool,
    /// CURP: as leader, recover first (`NodeHandle::submit_recovery`), then tell the state
    /// machine what joins the log (`StateMachine::proposed`) and answer writes that ask for it
    /// speculatively (`NodeHandle::submit_speculative_write`); reads wait for speculated writes
    /// (see `curp_leader`).
    pub curp: bool,
    pub snapshot_interval_entries: u64,
    pub snapshot_interval_bytes: u64,
    /// Entries kept behind a snapshot so slightly lagging followers need no snapshot.
    pub log_keep_entries: u64,
    pub segment_size_bytes: u64,
    /// Append to the raft log with direct I/O where the file system allows it.
    pub wal_direct_io: bool,
    pub max_frame_bytes: usize,
    /// Most bytes per second shipped to one lagging follower (0: no cap).
    pub snapshot_ship_bytes_per_sec: u64,
    pub peer_queue_messages: usize,
    /// What peers prove to each other before anything crosses a connection: the cluster
    /// secret (`peer_auth`), a certificate of the cluster's CA (`peer_stream`), both or neither.
    pub credentials: crate::peer_auth::PeerCredentials,
}

impl NodeConfig {
    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peers.iter().find(|(id, _)| *id == self.id).map(|(_, a)| *a)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::PreCandidate => "precandidate",
            Role::Candidate => "candidate",
            Role::Leader => "leader",
        }
    }
}

impl From<StateRole> for Role {
    fn from(r: StateRole) -> Self {
        match r {
            StateRole::Follower => Role::Follower,
            StateRole::PreCandidate => Role::PreCandidate,
            StateRole::Candidate => Role::Candidate,
            StateRole::Leader => Role::Leader,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: u64,
    pub role: Role,
    pub term: u64,
    /// 0 when no leader is known.
    pub leader_id: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub first_index: u64,
    pub last_index: u64,
    pub snapshot_index: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadConsistency {
    /// ReadIndex through the leader, then served once applied locally.
    Linearizable,
    /// Served from local state right away; may miss recent writes.
    Stale,
}

type Reply<O> = oneshot::Sender<Result<O, NodeError>>;
pub type Pending<O> = oneshot::Receiver<Result<O, NodeError>>;

/// Where a speculative reply goes, if the leader of `term` gives one: only while `witnesses`,
/// the voters whose witnesses were asked to record the write, are its voters, and no
/// membership change is under way.
struct Speculative<O> {
    term: u64,
    witnesses: Vec<u64>,
    reply: oneshot::Sender<O>,
}

enum Request<SM: StateMachine> {
    Write {
        command: Bytes,
        prepared: Option<Prepared>,
        reply: Reply<SM::Output>,
        speculative: Option<Speculative<SM::Output>>,
    },
    Recover {
        term: u64,
        witnesses: Option<Vec<u64>>,
        commands: Vec<Bytes>,
        reply: Reply<()>,
    },
    CurpWitnesses {
        term: u64,
        reply: Reply<Option<Vec<u64>>>,
    },
    Read {
        query: SM::Query,
        consistency: ReadConsistency,
        reply: Reply<SM::Output>,
    },
    TransferLeader {
        to: u64,
        reply: Reply<()>,
    },
    /// A leader about to stop: hand leadership to the voter furthest along; to whom.
    StepDown {
        reply: Reply<Option<u64>>,
    },
    /// A snapshot of the state at a linearizable point (at least the index a ReadIndex confirms
    /// once this node asks), with its files, pinned.
    Backup {
        reply: Reply<BackupSource>,
    },
    /// On the leader: propose `change`; answered once it applied (and, when it went through a
    /// joint configuration, once that was left).
    ChangeMembers {
        change: MemberChange,
        reply: Reply<Members>,
    },
    /// Answered by a leader once `replicas` nodes besides it hold `target` (0: its last index
    /// when it may set one), or at `deadline`.
    AwaitReplicas {
        target: u64,
        replicas: usize,
        deadline: Option<Instant>,
        reply: Reply<replica_wait::Answer>,
    },
}

/// Cheap to clone; how the rest of the process reaches the raft loop.
pub struct NodeHandle<SM: StateMachine> {
    requests: mpsc::Sender<Request<SM>>,
    status: watch::Receiver<NodeStatus>,
    /// The entry codec's per-command preparation, run by the submitting task so the raft loop
    /// does not have to.
    preparer: Option<Preparer>,
    leader_wait: Duration,
    peer_calls: Arc<PeerCalls>,
    members: watch::Receiver<Members>,
    /// How long the leader may take to make a membership change (its request timeout).
    member_change_timeout: Duration,
}

impl<SM: StateMachine> Clone for NodeHandle<SM> {
    fn clone(&self) -> Self {
        NodeHandle {
            requests: self.requests.clone(),
            status: self.status.clone(),
            members: self.members.clone(),
            member_change_timeout: self.member_change_timeout,
            preparer: self.preparer.clone(),
            leader_wait: self.leader_wait,
            peer_calls: self.peer_calls.clone(),
        }
    }
}

impl<SM: StateMachine> NodeHandle<SM> {
    /// Queues a write; the receiver resolves when this node has applied it.
    pub async fn submit_write(&self, command: Bytes) -> Result<Pending<SM::Output>, NodeError> {
        self.queue_write(command, None).await
    }

    /// Queues a write like `submit_write`; if this node is the recovered leader of `term` (with
    /// `curp` on) when it proposes the write, its voters are `witnesses` (sorted: the nodes whose
    /// witnesses were asked to record it) with no membership change under way, and the state
    /// machine knows the write's reply then, the second receiver gets that reply at once, before
    /// the write commits. It is dropped unanswered otherwise.
    pub async fn submit_speculative_write(
        &self,
        command: Bytes,
        term: u64,
        witnesses: Vec<u64>,
    ) -> Result<(Pending<SM::Output>, oneshot::Receiver<SM::Output>), NodeError> {
        let (reply, speculated) = oneshot::channel();
        let speculative = Speculative { term, witnesses, reply };
        let applied = self.queue_write(command, Some(speculative)).await?;
        Ok((applied, speculated))
    }

    /// As the new leader of `term` (with `curp` on), the voters whose witnesses its recovery
    /// must collect: those of the configuration its whole log before its term makes, which it
    /// has applied by then (so it first waits, failing with `Refused` until an entry of its term
    /// has applied). `None` in a joint configuration: a fast-path write completes only under a
    /// configuration no change is under way in, and every one before the change committed with
    /// it, so there is nothing to collect.
    pub async fn curp_recovery_witnesses(&self, term: u64) -> Result<Option<Vec<u64>>, NodeError> {
        ask(&self.requests, |reply| Request::CurpWitnesses { term, reply }).await
    }

    /// As the new leader of `term` (with `curp` on), proposes what it recovered from the
    /// `witnesses` (`curp_recovery_witnesses`), ahead of every client write; once these entries
    /// apply it may speculate and serve reads. Fails if this node is not that leader (any more),
    /// has already recovered, or its configuration is no longer the one collected.
    pub async fn submit_recovery(
        &self,
        term: u64,
        witnesses: Option<Vec<u64>>,
        commands: Vec<Bytes>,
    ) -> Result<(), NodeError> {
        ask(&self.requests, |reply| Request::Recover {
            term,
            witnesses,
            commands,
            reply,
        })
        .await
    }

    async fn queue_write(
        &self,
        command: Bytes,
        speculative: Option<Speculative<SM::Output>>,
    ) -> Result<Pending<SM::Output>, NodeError> {
        let prepared = self.preparer.as_ref().map(|prepare| prepare(&command));
        submit(&self.requests, |reply| Request::Write {
            command,
            prepared,
            reply,
            speculative,
        })
        .await
    }

    pub async fn submit_read(
        &self,
        query: SM::Query,
        consistency: ReadConsistency,
    ) -> Result<Pending<SM::Output>, NodeError> {
        submit(&self.requests, |reply| Request::Read {
            query,
            consistency,
            reply,
        })
        .await
    }

    pub async fn write(&self, command: Bytes) -> Result<SM::Output, NodeError> {
        self.submit_write(command)
            .await?
            .await
            .unwrap_or(Err(NodeError::ShuttingDown))
    }

    pub async fn read(&self, query: SM::Query, consistency: ReadConsistency) -> Result<SM::Output, NodeError> {
        self.submit_read(query, consistency)
            .await?
            .await
            .unwrap_or(Err(NodeError::ShuttingDown))
    }

    /// Asks the leader to hand leadership to voter `to` (any node may ask; a follower forwards
    /// the request). Returns once the request is under way; watch `status()` for the outcome.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), NodeError> {
        // Like a write, wait (bounded) for a leader to ask.
        let mut status = self.status.clone();
        let known = tokio::time::timeout(self.leader_wait, status.wait_for(|s| s.leader_id != 0))
            .await
            .is_ok_and(|seen| seen.is_ok());
        if !known {
            return Err(NodeError::NoLeader {
                waited_ms: self.leader_wait.as_millis() as u64,
            });
        }
        ask(&self.requests, |reply| Request::TransferLeader { to, reply }).await
    }

    /// Before this node stops: if it leads, it hands leadership to the voter furthest along and
    /// waits up to `within` until it no longer leads, so the others go on without waiting out
    /// an election timeout. Whether it handed over.
    pub async fn step_down(&self, within: Duration) -> bool {
        let asked = ask(&self.requests, |reply| Request::StepDown { reply }).await;
        if !matches!(asked, Ok(Some(_))) {
            return false;
        }
        let mut status = self.status.clone();
        tokio::time::timeout(within, status.wait_for(|s| s.role != Role::Leader))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }

    pub fn status(&self) -> NodeStatus {
        self.status.borrow().clone()
    }

    /// The configuration this node has applied, and its members' addresses.
    pub fn members(&self) -> Members {
        self.members.borrow().clone()
    }

    /// A backup of the state at a linearizable point: it holds every write acknowledged before
    /// this call. Any node may take one (its ReadIndex goes through the leader).
    pub async fn backup(&self) -> Result<BackupSource, NodeError> {
        ask(&self.requests, |reply| Request::Backup { reply }).await
    }

    async fn forward_member_change(&self, leader: u64, change: &MemberChange) -> Result<Members, NodeError> {
        // The leader answers within its request timeout; a little more covers the round trip.
        let timeout = self.member_change_timeout + Duration::from_secs(1);
        let body = self
            .peer_calls
            .call(leader, membership::SERVICE, &membership::encode_change(change), timeout)
            .await
            .map_err(|e| NodeError::Refused(format!("cannot hand the change to the leader (node {leader}): {e}")))?;
        match membership::decode_answer(&body) {
            Ok(ChangeAnswer::Done(members)) => Ok(members),
            Ok(ChangeAnswer::Refused(reason)) => Err(NodeError::MembershipRefused(reason)),
            Ok(ChangeAnswer::Failed(reason)) => {
                Err(NodeError::Refused(format!("the leader (node {leader}): {reason}")))
            }
            Err(e) => Err(NodeError::Refused(format!(
                "the leader (node {leader}) answered the change malformed: {e}"
            ))),
        }
    }

    /// The voters of the configuration this node has applied, sorted; none while a change is
    /// half done (joint). Without copying the members' addresses.
    pub fn settled_voters(&self) -> Option<Vec<u64>> {
        let members = self.members.borrow();
        (!members.joint()).then(|| sorted_voters(&members))
    }

    /// Follows the configuration as this node applies changes to it.
    pub fn members_watch(&self) -> watch::Receiver<Members> {
        self.members.clone()
    }

    /// Makes the membership change, through the log (raft's joint consensus when it changes
    /// more than one voter): on the leader, or handed to it by another node. Returns the
    /// configuration once the leader applied it.
    pub async fn change_members(&self, change: MemberChange) -> Result<Members, NodeError> {
        let status = self.status();
        if status.role != Role::Leader && status.leader_id != 0 {
            return self.forward_member_change(status.leader_id, &change).await;
        }
        ask(&self.requests, |reply| Request::ChangeMembers { change, reply }).await
    }

    /// Waits until the status changes, or `within` passes.
    pub async fn status_changed(&self, within: Duration) {
        let mut status = self.status.clone();
        status.mark_unchanged();
        let _ = tokio::time::timeout(within, status.changed()).await;
    }

    /// Resolves once this node no longer sees `leader` leading `term` (a new election, or the
    /// node shutting down).
    pub async fn leadership_moved(&self, leader: u64, term: u64) {
        let mut status = self.status.clone();
        let _ = status.wait_for(|s| s.leader_id != leader || s.term != term).await;
    }

    /// Calls services other than raft on peers.
    pub fn peer_calls(&self) -> &Arc<PeerCalls> {
        &self.peer_calls
    }

    /// How many nodes besides the leader hold, durably, every write acknowledged to anyone before
    /// this call (Redis's WAIT): waits until `replicas` do or `timeout` passes (`None`: no limit),
    /// and says how many did then. A follower asks the leader; across a leader change it asks the
    /// new one afresh.
    pub async fn await_replicas(&self, replicas: usize, timeout: Option<Duration>) -> usize {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut last: Option<(u64, replica_wait::Answer)> = None;
        loop {
            let now = Instant::now();
            let round = deadline.map_or(REPLICA_WAIT_ROUND, |d| {
                d.saturating_duration_since(now).min(REPLICA_WAIT_ROUND)
            });
            let status = self.status();
            let target = match last {
                Some((leader, answer)) if leader == status.leader_id && answer.term == status.term => answer.target,
                _ => 0,
            };
            let answer = if status.role == Role::Leader {
                self.ask_locally(target, replicas, now + round).await
            } else if status.leader_id != 0 {
                self.ask_leader(status.leader_id, target, replicas, round).await
            } else {
                Err(NodeError::NoLeader { waited_ms: 0 })
            };
            match answer {
                Ok(answer) => {
                    if answer.replicas >= replicas {
                        return answer.replicas;
                    }
                    last = Some((status.leader_id, answer));
                }
                Err(_) => {
                    let pause = deadline.map_or(REPLICA_WAIT_RETRY, |d| {
                        d.saturating_duration_since(Instant::now()).min(REPLICA_WAIT_RETRY)
                    });
                    self.status_changed(pause).await;
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return last.map_or(0, |(_, answer)| answer.replicas);
            }
        }
    }

    async fn ask_locally(
        &self,
        target: u64,
        replicas: usize,
        deadline: Instant,
    ) -> Result<replica_wait::Answer, NodeError> {
        ask(&self.requests, |reply| Request::AwaitReplicas {
            target,
            replicas,
            deadline: Some(deadline),
            reply,
        })
        .await
    }

    async fn ask_leader(
        &self,
        leader: u64,
        target: u64,
        replicas: usize,
        round: Duration,
    ) -> Result<replica_wait::Answer, NodeError> {
        let question = replica_wait::Question {
            target,
            replicas: u32::try_from(replicas).unwrap_or(u32::MAX),
            timeout_ms: round.as_millis() as u64,
        };
        let response = self
            .peer_calls
            .call(
                leader,
                replica_wait::SERVICE,
                &question.encode(),
                round + REPLICA_WAIT_SLACK,
            )
            .await
            .map_err(|_| NodeError::Timeout {
                waited_ms: round.as_millis() as u64,
            })?;
        match replica_wait::decode_response(&response) {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err(NodeError::LeaderChanged),
            Err(e) => {
                tracing::warn!(from = leader, error = %e, "malformed replica wait response");
                Err(NodeError::LeaderChanged)
            }
        }
    }
}

/// The longest one question of `await_replicas` waits at the leader before it is asked again.
const REPLICA_WAIT_ROUND: Duration = Duration::from_secs(5);
/// How long past its round a question to the leader may take to come back.
const REPLICA_WAIT_SLACK: Duration = Duration::from_secs(1);
/// Pause after a failed question (no leader, or it changed) before asking again.
const REPLICA_WAIT_RETRY: Duration = Duration::from_millis(100);

/// Answers followers' replica-wait questions (this node's log service) through its raft loop.
async fn serve_log_requests<SM: StateMachine>(
    mut questions: mpsc::Receiver<PeerRequest>,
    requests: mpsc::Sender<Request<SM>>,
) {
    while let Some(request) = questions.recv().await {
        if request.service == membership::SERVICE {
            tokio::spawn(serve_forwarded_change(request, requests.clone()));
            continue;
        }
        let question = match replica_wait::Question::decode(&request.body) {
            Ok(question) => question,
            Err(e) => {
                tracing::warn!(from = request.from, error = %e, "malformed replica wait question; ignored");
                continue;
            }
        };
        let requests = requests.clone();
        tokio::spawn(async move {
            let timeout = Duration::from_millis(question.timeout_ms).min(REPLICA_WAIT_ROUND);
            let answer = ask(&requests, |reply| Request::AwaitReplicas {
                target: question.target,
                replicas: question.replicas as usize,
                deadline: Some(Instant::now() + timeout),
                reply,
            })
            .await
            .ok();
            request.respond(&replica_wait::encode_response(answer));
        });
    }
}

/// Hands the raft loop the request `make` builds around its reply channel; the reply's receiver.
async fn submit<SM: StateMachine, T>(
    requests: &mpsc::Sender<Request<SM>>,
    make: impl FnOnce(Reply<T>) -> Request<SM>,
) -> Result<Pending<T>, NodeError> {
    let (reply, rx) = oneshot::channel();
    requests.send(make(reply)).await.map_err(|_| NodeError::ShuttingDown)?;
    Ok(rx)
}

/// `submit`, then the reply.
async fn ask<SM: StateMachine, T>(
    requests: &mpsc::Sender<Request<SM>>,
    make: impl FnOnce(Reply<T>) -> Request<SM>,
) -> Result<T, NodeError> {
    submit(requests, make)
        .await?
        .await
        .unwrap_or(Err(NodeError::ShuttingDown))
}

/// A membership change another node forwarded: made here if this node leads (refused
/// otherwise, as a change asked of it directly would be), answered once applied.
async fn serve_forwarded_change<SM: StateMachine>(request: PeerRequest, requests: mpsc::Sender<Request<SM>>) {
    let change = match membership::decode_change(&request.body) {
        Ok(change) => change,
        Err(e) => {
            tracing::warn!(from = request.from, error = %e, "malformed forwarded membership change; ignored");
            return;
        }
    };
    let answer = ask(&requests, |reply| Request::ChangeMembers { change, reply }).await;
    request.respond(&membership::encode_answer(&match answer {
        Ok(members) => ChangeAnswer::Done(members),
        Err(NodeError::MembershipRefused(reason)) => ChangeAnswer::Refused(reason),
        Err(e) => ChangeAnswer::Failed(e.to_string()),
    }));
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("raft configuration rejected: {0}")]
    Raft(#[from] raft::Error),
    #[error("cannot listen for peers on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("node {0} is not in the peer list")]
    NotAPeer(u64),
    #[error("snapshot in the data directory cannot be restored: {0}")]
    Restore(String),
}

struct LogMetrics {
    term: Arc<Gauge>,
    role: Arc<Gauge>,
    leader_id: Arc<Gauge>,
    commit_index: Arc<Gauge>,
    applied_index: Arc<Gauge>,
    first_index: Arc<Gauge>,
    last_index: Arc<Gauge>,
    commands_proposed: Arc<Counter>,
    entries_proposed: Arc<Counter>,
    proposals_dropped: Arc<Counter>,
    disk_full_refusals: Arc<Counter>,
    leader_changes: Arc<Counter>,
    fsync_seconds: Arc<Histogram>,
    ready_seconds: Arc<Histogram>,
    apply_round_max_bytes: Arc<Gauge>,
    snapshots_created: Arc<Counter>,
    snapshots_installed: Arc<Counter>,
    messages_dropped: Arc<Counter>,
    codec_errors: Arc<Counter>,
    batch_decode_errors: Arc<Counter>,
    read_index_requests: Arc<Counter>,
    lease_reads: Arc<Counter>,
    requests_failed: Arc<Counter>,
    /// Per other member: entries of the leader's log it does not hold yet (0 where this node
    /// does not lead: only a leader knows).
    peer_lag: HashMap<u64, Arc<Gauge>>,
    voters: Arc<Gauge>,
    learners: Arc<Gauge>,
    conf_index: Arc<Gauge>,
}

fn peer_lag_gauge(peer: u64) -> Arc<Gauge> {
    let peer_label = peer.to_string();
    chorus_metrics::labeled_gauge(
        "chorus_raft_peer_lag_entries",
        "On the leader: entries of its log a peer does not hold yet (0 elsewhere)",
        Some(("peer", peer_label.as_str())),
    )
}

impl LogMetrics {
    fn new(peers: impl Iterator<Item = u64>) -> Self {
        LogMetrics {
            peer_lag: peers.map(|peer| (peer, peer_lag_gauge(peer))).collect(),
            voters: gauge(
                "chorus_raft_voters",
                "Voters in the configuration this node applied (both sides of a joint one)",
            ),
            learners: gauge(
                "chorus_raft_learners",
                "Learners (members receiving the log without a vote) in the configuration this node applied",
            ),
            conf_index: gauge(
                "chorus_raft_conf_index",
                "Log index of the membership change that made the configuration in force (0: the initial one)",
            ),
            term: gauge("chorus_raft_term", "Current raft term"),
            role: gauge(
                "chorus_raft_role",
                "Raft role: 0 follower, 1 precandidate, 2 candidate, 3 leader",
            ),
            leader_id: gauge("chorus_raft_leader_id", "Id of the known leader, 0 if none"),
            commit_index: gauge("chorus_raft_commit_index", "Raft commit index"),
            applied_index: gauge("chorus_raft_applied_index", "Index applied to the state machine"),
            first_index: gauge("chorus_raft_first_index", "First index held in the raft log"),
            last_index: gauge("chorus_raft_last_index", "Last index held in the raft log"),
            commands_proposed: counter(
                "chorus_raft_commands_proposed_total",
                "Client commands proposed by this node",
            ),
            entries_proposed: counter(
                "chorus_raft_entries_proposed_total",
                "Raft entries (command batches) proposed by this node",
            ),
            proposals_dropped: counter(
                "chorus_raft_proposals_dropped_total",
                "Proposals raft refused (no leader, transfer, too much uncommitted)",
            ),
            disk_full_refusals: counter(
                "chorus_raft_disk_full_refusals_total",
                "Writes refused and appends from the leader dropped because the raft log's disk is full",
            ),
            leader_changes: counter(
                "chorus_raft_leader_changes_total",
                "Times this node saw the leader change",
            ),
            fsync_seconds: histogram("chorus_raft_fsync_seconds", "Time to write and fsync a Ready"),
            ready_seconds: histogram("chorus_raft_ready_seconds", "Time to handle one Ready end to end"),
            apply_round_max_bytes: {
                let bound = gauge(
                    "chorus_raft_apply_round_max_bytes",
                    "Bytes of committed entries one round of applies may take (smaller where applies are slow)",
                );
                bound.set(APPLY_ROUND_MAX_BYTES as i64);
                bound
            },
            snapshots_created: counter(
                "chorus_raft_snapshots_created_total",
                "Snapshots this node wrote of its state machine",
            ),
            snapshots_installed: counter(
                "chorus_raft_snapshots_installed_total",
                "Snapshots received from a leader and installed",
            ),
            messages_dropped: counter(
                "chorus_peer_messages_dropped_total",
                "Outgoing raft messages dropped because a peer queue was full",
            ),
            codec_errors: counter(
                "chorus_entry_codec_errors_total",
                "Incoming append messages the entry codec could not decode",
            ),
            batch_decode_errors: counter(
                "chorus_apply_batch_decode_errors_total",
                "Committed entries whose batch did not decode (skipped on every replica)",
            ),
            read_index_requests: counter(
                "chorus_raft_read_index_requests_total",
                "ReadIndex requests issued (one per batch of reads, or to renew a read lease)",
            ),
            lease_reads: counter(
                "chorus_raft_lease_reads_total",
                "Linearizable reads the leader served under its read lease, without a ReadIndex",
            ),
            requests_failed: counter(
                "chorus_requests_failed_total",
                "Requests failed by timeout, missing leader or overload",
            ),
        }
    }
}

/// What a backup is written from (`backup::write_backup`): the header, each file's path, and
/// what keeps the files from being deleted meanwhile.
pub struct BackupSource {
    pub header: BackupHeader,
    pub paths: Vec<PathBuf>,
    pub pin: Box<dyn std::any::Any + Send>,
}

/// How long a backup may wait for its ReadIndex, apply and a snapshot.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(60);

struct BackupWait {
    reply: Reply<BackupSource>,
    arrived: Instant,
}

struct MemberWait {
    index: u64,
    term: u64,
    reply: Reply<Members>,
    deadline: Instant,
}

struct Waiter<O> {
    reply: Reply<O>,
    arrived: Instant,
    /// Raft term when the write was handed to raft (0 before that).
    proposed_term: u64,
}

struct QueuedWrite<O> {
    id: u64,
    command: Bytes,
    prepared: Option<Prepared>,
    waiter: Waiter<O>,
    speculative: Option<Speculative<O>>,
}

struct ReadWaiter<SM: StateMachine> {
    query: SM::Query,
    reply: Reply<SM::Output>,
    arrived: Instant,
}

/// Shortest time between two ReadIndex requests while one is in flight: about a loopback or LAN
/// round trip, so reads batch there, and negligible beside a WAN round trip.
const READ_INDEX_SPACING: Duration = Duration::from_micros(500);

/// Most followers' ReadIndex requests a new leader holds until it has committed an entry of its
/// term; past it they are dropped, and their followers ask again after an election timeout.
const MAX_READ_INDEXES_AWAITING_TERM_COMMIT: usize = 1024;

struct IssuedReads<SM: StateMachine> {
    issued_at: Instant,
    /// Term the ReadIndex was issued in: a confirmation extends the read lease only within it.
    term: u64,
    /// The reads wait at least for this index: the last write answered speculatively when they
    /// were issued (CURP).
    speculated_through: u64,
    reads: Vec<ReadWaiter<SM>>,
}

/// Share by which two nodes' clocks may differ in rate over an election timeout: the leader's
/// read lease ends this much earlier than the followers' promise it rests on.
const READ_LEASE_CLOCK_DRIFT: f64 = 0.05;

/// A leader's lease on reads: until `until`, no other node can have become leader.
///
/// Why: with check-quorum, a follower ignores vote requests for `election_ticks` of its ticks
/// after it last heard from the leader (raft's in-lease check), and its ticks never run faster
/// than its clock; the first tick after a heartbeat may come at once, so it keeps that promise
/// for at least `election_ticks - 1` tick lengths. A ReadIndex confirmed by a quorum had each of
/// those followers hear from the leader after it was issued, and every new leader needs one of
/// their votes (or their own candidacy, which their timers hold back as long). So until the
/// issue time plus that span, less the clock drift, this leader is the only one, and its
/// committed index covers every acknowledged write. Leadership transfers bypass the followers'
/// promise: a leader that has begun one serves no lease reads for the rest of its term. Raft
/// keeps the promise in memory only, so a node that restarts keeps it by ignoring vote requests
/// for an election timeout (`breaks_a_lease_promise`); every node must run with the lease on.
struct ReadLease {
    term: u64,
    until: Instant,
}

/// Snapshot written by a background thread, ready to be adopted by the loop.
type SnapshotJob = oneshot::Receiver<Result<Snapshot, StorageError>>;

struct RaftLoop<SM: StateMachine> {
    config: NodeConfig,
    raw: RawNode<DiskStorage>,
    sm: SM,
    origin: Origin,
    /// The last time this node stamped on a batch as leader: stamps never go backwards, even
    /// when the wall clock does.
    last_stamp_ms: u64,
    codec: Box<dyn EntryCodec>,
    /// The raft queue of each linked peer, and the address it was linked at.
    peers: HashMap<u64, (mpsc::Sender<Message>, SocketAddr)>,
    transport: Transport,
    shipper: Shipper,
    /// Where shipped snapshot files land (`TransportConfig::incoming_dir`).
    incoming_dir: PathBuf,
    status: watch::Sender<NodeStatus>,
    members: watch::Sender<Members>,
    /// Membership changes proposed here, by the index of their entry.
    member_waits: Vec<MemberWait>,
    /// On the leader, a learner holding nothing yet needs a snapshot that names it, and a log
    /// that does not start at index 1 (`snapshot_for_new_members`).
    snapshot_for_learner: bool,
    /// Backups waiting for a ReadIndex to be issued, for its answer (by the ReadIndex's sequence
    /// number), and for apply and a snapshot to reach its index.
    backups_unissued: Vec<BackupWait>,
    backups_issued: HashMap<u64, Vec<BackupWait>>,
    backups_ready: Vec<(u64, BackupWait)>,
    /// A backup needs a snapshot newer than the latest.
    snapshot_for_backup: bool,
    metrics: LogMetrics,
    next_request_id: u64,
    /// Writes waiting for a leader (or for group commit), in arrival order.
    unproposed: VecDeque<QueuedWrite<SM::Output>>,
    /// Command bytes in `unproposed`.
    unproposed_bytes: usize,
    /// Raft refused the last proposal (e.g. during a leadership transfer); retried at the next
    /// tick rather than at once.
    proposal_refused: bool,
    /// When a full disk was last logged (see `warn_disk_full`).
    disk_full_warned_at: Option<Instant>,
    /// When a full disk last made this leader hand leadership over.
    hand_off_tried_at: Option<Instant>,
    /// Writes handed to raft, by request id.
    proposed: HashMap<u64, Waiter<SM::Output>>,
    reads_unissued: Vec<ReadWaiter<SM>>,
    /// Reads whose ReadIndex is out, by its sequence number.
    reads_issued: HashMap<u64, IssuedReads<SM>>,
    /// Followers' ReadIndex requests that reached this leader before it committed an entry of
    /// its term: raft drops those silently, and their reads would wait an election timeout.
    read_indexes_awaiting_term_commit: Vec<Message>,
    /// Reads whose ReadIndex came back, waiting for apply to reach it.
    reads_ready: Vec<(u64, ReadWaiter<SM>)>,
    next_read_index_seq: u64,
    read_lease: Option<ReadLease>,
    /// When this node started: with read leases it gives no vote for an election timeout after.
    started_at: Instant,
    /// A term in which this leader began a leadership transfer, and so holds no read lease.
    read_lease_refused_term: u64,
    applied_index: u64,
    /// Term of the last applied entry. Log terms never decrease, so once an entry of a later
    /// term is applied, a write proposed in an earlier term that has not been applied yet can
    /// only still commit if raft appended it late; its outcome is reported as unknown.
    applied_term: u64,
    applied_bytes_since_snapshot: u64,
    /// Bytes of committed entries the next round of applies may take (`next_apply_round_bytes`).
    apply_round_max_bytes: u64,
    snapshot_job: Option<SnapshotJob>,
    curp: CurpLeader,
    last_leader: u64,
    /// Writes of this node answered since the leader last proposed.
    answered_writes: usize,
    /// The leader's wait for answered clients to come back (`group_commit_linger_us`).
    refill: Option<Refill>,
    /// Readies whose writes the log's writer thread has not finished, oldest first.
    persisting: VecDeque<Persisting>,
    /// Client requests since the last tick, and the applied index then: a tick that saw neither
    /// move is idle (see `release_memory_when_idle`).
    requests_since_tick: u64,
    applied_at_tick: u64,
    /// How long the node has been idle, in ticks' time.
    idle_since: Duration,
    /// Whether memory was given back in this idle stretch.
    idle_release: IdleRelease,
    /// Questions of how many nodes hold the log, waiting for followers to catch up.
    replica_waits: replica_wait::Waits,
    /// The term `replica_waits` were asked in.
    replica_waits_term: u64,
    /// Where deferred reads' slow steps report back, how many are running, and those waiting
    /// for one of them to finish.
    finished_reads: mpsc::UnboundedSender<(FinishRead<SM>, Reply<SM::Output>)>,
    slow_reads_in_flight: usize,
    slow_reads_waiting: VecDeque<(SlowRead<SM>, Reply<SM::Output>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdleRelease {
    NotYet,
    /// While the state machine still had background work: once more when it ends.
    WhileStateWorked,
    Done,
}

/// How long a node is idle before it gives back what a burst grew (`release_memory_when_idle`).
const IDLE_BEFORE_RELEASE: Duration = Duration::from_secs(1);

/// A Ready handed to the storage's writer thread: raft learns it is persisted, and its messages
/// that promise persistence (a follower's acknowledgement, a vote) go out, once the write of
/// sequence number `seq` (and so every earlier one) is durable.
struct Persisting {
    seq: u64,
    number: u64,
    messages: Vec<Message>,
}

struct Refill {
    /// Set when the loop first runs again after the replies were queued: the connection tasks
    /// write the replies while it yields (tens of them take hundreds of µs), and the clients
    /// can come back only once theirs is out.
    until: Option<Instant>,
    /// Queued writes at which the wait ends early.
    target: usize,
}

/// Opens storage, binds the peer port and spawns the raft loop on the current runtime.
/// `open_state` builds the state machine from the local snapshot's data (`None` without one).
/// Starts a node. Requests from peers to services other than raft go to `peer_requests`.
pub async fn start<SM: StateMachine>(
    config: NodeConfig,
    open_state: impl FnOnce(Option<&[u8]>) -> Result<SM, String>,
    codec: Box<dyn EntryCodec>,
    peer_requests: Option<mpsc::Sender<PeerRequest>>,
) -> Result<NodeHandle<SM>, StartError> {
    let listen_addr = config.peer_addr().ok_or(StartError::NotAPeer(config.id))?;
    let voters: Vec<u64> = if config.join {
        Vec::new()
    } else {
        config.peers.iter().map(|(id, _)| *id).collect()
    };
    let (mut storage, report) = DiskStorage::open(
        &config.data_dir,
        &voters,
        StorageOptions {
            segment_size_bytes: config.segment_size_bytes,
            preallocate: true,
            direct_io: config.wal_direct_io,
        },
    )?;
    tracing::info!(
        dir = %config.data_dir.display(), fresh = report.fresh, segments = report.segments,
        records = report.records, torn_tail_bytes = report.torn_tail_bytes,
        snapshot_index = report.snapshot_index, first = storage.first_entry_index(),
        last = storage.last_entry_index(), "raft log recovered"
    );
    let mut codec = codec;
    let mut open_state = Some(open_state);
    let mut open_state = |snapshot: Option<&[u8]>| open_state.take().expect("the state opens once")(snapshot);
    let restore_dir = config.data_dir.join(backup::RESTORE_DIR);
    let restored = if storage.latest_snapshot().get_metadata().index == 0
        && storage.last_entry_index() == 0
        && restore_dir.join(backup::HEADER_FILE).exists()
    {
        Some(restore(
            &config,
            &restore_dir,
            &mut storage,
            &mut codec,
            &mut open_state,
        )?)
    } else {
        if restore_dir.exists() {
            // A restore that recorded its snapshot and stopped before deleting the backup.
            finish_restore(&restore_dir, storage.latest_snapshot().get_metadata().index)?;
        }
        None
    };
    let snapshot = storage.latest_snapshot().clone();
    let applied = snapshot.get_metadata().index;
    let (sm, snapshot_addresses) = if let Some(sm) = restored {
        (sm, None)
    } else if applied > 0 {
        let (sm_state, codec_state, addresses) = split_snapshot(&snapshot.data).map_err(StartError::Restore)?;
        codec.restore(codec_state, applied).map_err(StartError::Restore)?;
        (open_state(Some(sm_state)).map_err(StartError::Restore)?, addresses)
    } else {
        (open_state(None).map_err(StartError::Restore)?, None)
    };
    // Where the members are: as last recorded — by the snapshot when it is the newer record
    // (a crash after installing it) — or, before any record, as configured.
    let mut members = storage.members().clone();
    match snapshot_addresses {
        Some(addresses) if applied >= members.conf_index && applied > 0 => members.addresses = addresses,
        _ if members.addresses.is_empty() => members.addresses = config.peers.iter().copied().collect(),
        _ => {}
    }
    if members != *storage.members() {
        storage.set_members(members.clone());
    }

    let raft_config = raft::Config {
        id: config.id,
        election_tick: config.election_ticks,
        heartbeat_tick: config.heartbeat_ticks,
        applied,
        max_size_per_msg: 1024 * 1024,
        max_inflight_msgs: 256,
        max_committed_size_per_ready: APPLY_ROUND_MAX_BYTES,
        check_quorum: true,
        pre_vote: true,
        max_uncommitted_size: 256 * 1024 * 1024,
        ..Default::default()
    };
    raft_config.validate()?;
    let logger = slog::Logger::root(crate::raft_log::TracingDrain, slog::o!("raft_id" => config.id));
    let raw = RawNode::new(&raft_config, storage, &logger)?;

    let (peer_tx, peer_rx) = mpsc::channel(config.peer_queue_messages);
    let (event_tx, event_rx) = mpsc::unbounded_channel();
    // Partial shipments from before a restart are not trusted: their bytes may not have survived.
    let incoming_dir = config.data_dir.join("incoming");
    if incoming_dir.exists() {
        std::fs::remove_dir_all(&incoming_dir).map_err(|source| StorageError::Io {
            path: incoming_dir.clone(),
            source,
        })?;
    }
    let linked: Vec<(u64, SocketAddr)> = members
        .addresses
        .iter()
        .filter(|(id, _)| **id != config.id)
        .map(|(id, addr)| (*id, *addr))
        .collect();
    let shipper = Shipper::new(
        config.id,
        config.credentials.clone(),
        linked.iter().copied().collect(),
        config.max_frame_bytes,
        config.snapshot_ship_bytes_per_sec,
        event_tx.clone(),
    );
    let transport_config = TransportConfig {
        node_id: config.id,
        listen_addr,
        peers: linked.clone(),
        max_frame_bytes: config.max_frame_bytes,
        queue_messages: config.peer_queue_messages,
        incoming_dir: incoming_dir.clone(),
        credentials: config.credentials.clone(),
    };
    let (replica_questions_tx, replica_questions) = mpsc::channel(REPLICA_QUESTION_QUEUE);
    let services = transport::Services {
        log: Some(replica_questions_tx),
        application: peer_requests,
    };
    let (queues, transport, peer_calls) = transport::start(transport_config, peer_tx, event_tx, services)
        .await
        .map_err(|source| StartError::Bind {
            addr: listen_addr,
            source,
        })?;

    let (request_tx, request_rx) = mpsc::channel(16 * 1024);
    let (finished_reads_tx, finished_reads) = mpsc::unbounded_channel();
    let (status_tx, status_rx) = watch::channel(NodeStatus::default());
    let incarnation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let preparer = codec.preparer();
    let leader_wait_ms = config.leader_wait_ms;
    let member_change_timeout = Duration::from_millis(config.request_timeout_ms);
    let metrics = LogMetrics::new(linked.iter().map(|(id, _)| *id));
    let peers = linked
        .iter()
        .map(|(id, addr)| (*id, (queues[id].clone(), *addr)))
        .collect();
    let (members_tx, members_rx) = watch::channel(members);
    let mut raft_loop = RaftLoop {
        origin: Origin {
            node_id: config.id,
            incarnation,
        },
        last_stamp_ms: 0,
        config,
        raw,
        sm,
        codec,
        peers,
        transport,
        shipper,
        incoming_dir,
        status: status_tx,
        members: members_tx,
        member_waits: Vec::new(),
        snapshot_for_learner: false,
        backups_unissued: Vec::new(),
        backups_issued: HashMap::new(),
        backups_ready: Vec::new(),
        snapshot_for_backup: false,
        metrics,
        next_request_id: 1,
        unproposed: VecDeque::new(),
        unproposed_bytes: 0,
        proposal_refused: false,
        disk_full_warned_at: None,
        hand_off_tried_at: None,
        proposed: HashMap::new(),
        reads_unissued: Vec::new(),
        reads_issued: HashMap::new(),
        read_indexes_awaiting_term_commit: Vec::new(),
        reads_ready: Vec::new(),
        // A restarted node must not reuse the sequence numbers of its earlier incarnation, whose
        // requests a leader may still hold (see `read_index_ctx`).
        next_read_index_seq: incarnation,
        read_lease: None,
        started_at: Instant::now(),
        read_lease_refused_term: 0,
        applied_index: applied,
        applied_term: 0,
        applied_bytes_since_snapshot: 0,
        apply_round_max_bytes: APPLY_ROUND_MAX_BYTES,
        snapshot_job: None,
        curp: CurpLeader::default(),
        last_leader: 0,
        answered_writes: 0,
        refill: None,
        persisting: VecDeque::new(),
        requests_since_tick: 0,
        applied_at_tick: 0,
        idle_since: Duration::ZERO,
        idle_release: IdleRelease::NotYet,
        replica_waits: replica_wait::Waits::default(),
        replica_waits_term: 0,
        finished_reads: finished_reads_tx,
        slow_reads_in_flight: 0,
        slow_reads_waiting: VecDeque::new(),
    };
    raft_loop.publish_status();
    tokio::spawn(serve_log_requests(replica_questions, request_tx.clone()));
    tokio::spawn(raft_loop.run(request_rx, peer_rx, event_rx, finished_reads));
    Ok(NodeHandle {
        requests: request_tx,
        status: status_rx,
        preparer,
        leader_wait: Duration::from_millis(leader_wait_ms),
        peer_calls,
        members: members_rx,
        member_change_timeout,
    })
}

/// Installs the backup unpacked in `restore_dir` (`chorus restore`) into a node with an empty
/// log, as a leader's snapshot, under this cluster's configuration: the nodes of `config.peers`
/// as voters, at their addresses. Every node of the new cluster does the same from the same
/// backup, so all start from one state at one index.
fn restore<SM: StateMachine>(
    config: &NodeConfig,
    restore_dir: &Path,
    storage: &mut DiskStorage,
    codec: &mut Box<dyn EntryCodec>,
    open_state: impl FnOnce(Option<&[u8]>) -> Result<SM, String>,
) -> Result<SM, StartError> {
    let header_path = restore_dir.join(backup::HEADER_FILE);
    let bytes = std::fs::read(&header_path).map_err(|source| StorageError::Io {
        path: header_path.clone(),
        source,
    })?;
    let header =
        backup::decode_header(&bytes).map_err(|e| StartError::Restore(format!("{}: {e}", header_path.display())))?;
    let (sm_state, codec_state, _) = split_snapshot(&header.data).map_err(StartError::Restore)?;
    // The state takes its files by moving them: it is given links, so that the backup stays
    // whole until the snapshot is recorded, and a restore cut short runs again.
    let installing = restore_dir.join(backup::INSTALLING_DIR);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StorageError::Io { path, source }
    };
    if installing.exists() {
        std::fs::remove_dir_all(&installing).map_err(io(&installing))?;
    }
    std::fs::create_dir(&installing).map_err(io(&installing))?;
    for (name, _) in &header.files {
        std::fs::hard_link(restore_dir.join(name), installing.join(name)).map_err(io(&restore_dir.join(name)))?;
    }
    let mut sm = open_state(None).map_err(StartError::Restore)?;
    sm.install_snapshot(sm_state, &installing)
        .map_err(StartError::Restore)?;
    codec.restore(codec_state, header.index).map_err(StartError::Restore)?;
    let addresses: Addresses = config.peers.iter().copied().collect();
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().index = header.index;
    snapshot.mut_metadata().term = header.term;
    snapshot.mut_metadata().mut_conf_state().voters = addresses.keys().copied().collect();
    snapshot.data = Bytes::from(join_snapshot(sm_state, codec_state, &addresses));
    storage.apply_snapshot(snapshot, addresses)?;
    sm.snapshot_persisted(sm_state);
    finish_restore(restore_dir, header.index)?;
    tracing::info!(
        index = header.index,
        term = header.term,
        voters = ?config.peers.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        "restored from a backup"
    );
    Ok(sm)
}

/// Deletes the backup in `restore_dir` once the log's snapshot is the one restored from it
/// (at `snapshot_index`); refuses to start on a backup left beside other data.
fn finish_restore(restore_dir: &Path, snapshot_index: u64) -> Result<(), StartError> {
    let header_path = restore_dir.join(backup::HEADER_FILE);
    let header = std::fs::read(&header_path)
        .ok()
        .and_then(|bytes| backup::decode_header(&bytes).ok());
    if header.is_none_or(|header| header.index != snapshot_index) {
        return Err(StartError::Restore(format!(
            "{} holds a backup, but this node already has data of its own: restore into a new \
             directory (`chorus restore --dir`), or delete {} to keep the data",
            restore_dir.display(),
            restore_dir.display()
        )));
    }
    std::fs::remove_dir_all(restore_dir).map_err(|source| StorageError::Io {
        path: restore_dir.to_path_buf(),
        source,
    })?;
    Ok(())
}

const SNAPSHOT_DATA_MAGIC: &[u8; 4] = b"CHSD";

/// The data of a raft snapshot: the state machine's state and the entry codec's, each
/// length-prefixed behind a magic, then the members' addresses.
fn join_snapshot(sm_state: &[u8], codec_state: &[u8], addresses: &Addresses) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + sm_state.len() + codec_state.len() + addresses.len() * 32);
    out.extend_from_slice(SNAPSHOT_DATA_MAGIC);
    put_blob(&mut out, sm_state);
    put_blob(&mut out, codec_state);
    membership::encode_addresses(addresses, &mut out);
    out
}

/// A snapshot's parts; the addresses are missing from snapshots of builds before membership
/// changes.
type SnapshotParts<'a> = (&'a [u8], &'a [u8], Option<Addresses>);

fn split_snapshot(data: &[u8]) -> Result<SnapshotParts<'_>, String> {
    fn parse(data: &[u8]) -> Result<SnapshotParts<'_>, crate::DecodeError> {
        let mut r = Reader::new(data);
        if r.bytes(SNAPSHOT_DATA_MAGIC.len())? != SNAPSHOT_DATA_MAGIC {
            return Err(crate::DecodeError::BadMagic);
        }
        let sm_state = r.blob()?;
        let codec_state = r.blob()?;
        let addresses = if r.remaining() > 0 {
            Some(membership::decode_addresses(&mut r)?)
        } else {
            None
        };
        r.finish()?;
        Ok((sm_state, codec_state, addresses))
    }
    parse(data).map_err(|e| format!("snapshot data: {e}"))
}

/// A learner is promoted only once it holds the leader's log but for this many entries, so the
/// new configuration does not wait on it to commit.
const PROMOTE_MAX_LAG_ENTRIES: u64 = 1000;

/// Followers' replica-wait questions queued for this node; more are dropped (they time out).
const REPLICA_QUESTION_QUEUE: usize = 1024;

/// Upper bound on messages taken from one channel per iteration, so no source starves the others.
const DRAIN_LIMIT: usize = 4096;

/// More than an entry's index, term and framing take in the raft log beside its data.
const ENTRY_OVERHEAD_BYTES: usize = 64;

impl<SM: StateMachine> RaftLoop<SM> {
    async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request<SM>>,
        mut peer_messages: mpsc::Receiver<Message>,
        mut events: mpsc::UnboundedReceiver<PeerEvent>,
        mut finished_reads: mpsc::UnboundedReceiver<(FinishRead<SM>, Reply<SM::Output>)>,
    ) {
        let tick = Duration::from_millis(self.config.tick_ms);
        let mut next_tick = tokio::time::Instant::now() + tick;
        let writes_done = self.raw.store().write_notify();
        self.tell_voters();
        loop {
            let wake_at = match self.group_commit_deadline() {
                Some(deadline) => next_tick.min(deadline.into()),
                None if self.proposable_now() => {
                    // Writes held for group commit may go now that an entry committed. Let the
                    // replies to that entry go out and the requests they prompt come in first:
                    // they join this batch.
                    tokio::task::yield_now().await;
                    tokio::time::Instant::now()
                }
                None => next_tick,
            };
            let wake_at = match self.read_index_deadline() {
                Some(deadline) => wake_at.min(deadline.into()),
                None => wake_at,
            };
            let wake_at = match self.replica_waits.deadline() {
                Some(deadline) => wake_at.min(deadline.into()),
                None => wake_at,
            };
            let wake_at = if self.apply_backlogged() {
                // The next round of applies goes on at once, after what arrived meanwhile.
                tokio::task::yield_now().await;
                tokio::time::Instant::now()
            } else {
                wake_at
            };
            tokio::select! {
                biased;
                Some(msg) = peer_messages.recv() => self.on_peer_message(msg),
                Some(event) = events.recv() => self.on_peer_event(event),
                Some((finish, reply)) = finished_reads.recv() => self.finish_read(finish, reply),
                request = requests.recv() => match request {
                    Some(request) => self.on_request(request),
                    None => {
                        tracing::info!("request channel closed; raft loop stopping");
                        return;
                    }
                },
                done = async { self.snapshot_job.as_mut().expect("guarded").await }, if self.snapshot_job.is_some() => {
                    self.snapshot_job = None;
                    self.on_snapshot_written(done.unwrap_or_else(|_| panic!("snapshot writer thread vanished")));
                }
                _ = writes_done.notified() => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            if let Some(refill) = &mut self.refill {
                refill
                    .until
                    .get_or_insert_with(|| Instant::now() + Duration::from_micros(self.config.group_commit_linger_us));
            }
            self.release_persisted();
            for _ in 0..DRAIN_LIMIT {
                match peer_messages.try_recv() {
                    Ok(msg) => self.on_peer_message(msg),
                    Err(_) => break,
                }
            }
            while let Ok(event) = events.try_recv() {
                self.on_peer_event(event);
            }
            while let Ok((finish, reply)) = finished_reads.try_recv() {
                self.finish_read(finish, reply);
            }
            for _ in 0..DRAIN_LIMIT {
                match requests.try_recv() {
                    Ok(request) => self.on_request(request),
                    Err(_) => break,
                }
            }
            let now = tokio::time::Instant::now();
            if now >= next_tick {
                self.proposal_refused = false;
                self.raw.tick();
                self.sm.tick();
                self.renew_read_lease();
                self.release_memory_when_idle();
                next_tick = now + tick;
                self.expire_requests();
                for (peer, rtt_us) in self.transport.rtts() {
                    self.codec.observe_link_rtt(peer, rtt_us as f64 / 1000.0);
                }
                self.leave_joint_configuration();
                self.expire_member_waits();
                self.snapshot_for_new_members();
            }
            self.propose_pending();
            self.propose_codec_entries();
            self.release_read_indexes_awaiting_term_commit();
            self.issue_reads();
            if let Err(e) = self.on_ready() {
                // Raft state on disk can no longer be trusted to match memory: stop loudly.
                panic!("raft storage failed: {e}");
            }
            self.release_curp_holds();
            self.answer_replica_waits();
            self.update_refill();
            self.note_leadership_transfer();
            self.serve_backups();
            self.maybe_snapshot();
            self.publish_status();
        }
    }

    fn leader_known(&self) -> bool {
        self.raw.raft.leader_id != raft::INVALID_ID
    }

    /// Whether queued writes would be proposed by the next iteration.
    fn proposable_now(&self) -> bool {
        let recovering = self.config.curp
            && self.raw.raft.state == StateRole::Leader
            && !self.curp.recovery_proposed(self.raw.raft.term);
        !self.unproposed.is_empty() && self.leader_known() && !self.proposal_refused && !recovering
    }

    /// Once a node has been idle for `IDLE_BEFORE_RELEASE` after a burst, gives back what the
    /// burst grew: the log's write buffers, and the free memory glibc holds below its heap's top
    /// (it returns that only when trimmed; the buffers clients and peers used under load end up
    /// there). If the state machine still had background work then, it does so once more when
    /// that ends. Under load, or a trickle of requests, it does nothing, so a working node never
    /// pays for memory it will use again at once.
    fn release_memory_when_idle(&mut self) {
        let idle = self.requests_since_tick == 0 && self.applied_at_tick == self.applied_index;
        self.requests_since_tick = 0;
        self.applied_at_tick = self.applied_index;
        if !idle {
            self.idle_since = Duration::ZERO;
            self.idle_release = IdleRelease::NotYet;
            return;
        }
        self.idle_since += Duration::from_millis(self.config.tick_ms);
        if self.idle_since < IDLE_BEFORE_RELEASE {
            return;
        }
        let state_works = self.sm.background_work();
        match self.idle_release {
            IdleRelease::Done => return,
            IdleRelease::WhileStateWorked if state_works => return,
            IdleRelease::NotYet | IdleRelease::WhileStateWorked => {}
        }
        self.idle_release = if state_works {
            IdleRelease::WhileStateWorked
        } else {
            IdleRelease::Done
        };
        self.raw.mut_store().release_idle_buffers();
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only returns free memory to the system.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    fn on_request(&mut self, request: Request<SM>) {
        self.requests_since_tick += 1;
        let arrived = Instant::now();
        match request {
            Request::Write {
                command,
                prepared,
                reply,
                speculative,
            } => {
                let id = self.next_request_id;
                self.next_request_id += 1;
                self.unproposed_bytes += command.len();
                self.unproposed.push_back(QueuedWrite {
                    id,
                    command,
                    prepared,
                    waiter: Waiter {
                        reply,
                        arrived,
                        proposed_term: 0,
                    },
                    speculative,
                });
            }
            Request::Read {
                query,
                consistency: ReadConsistency::Stale,
                reply,
            } => {
                self.answer_read(&query, reply);
            }
            Request::Read {
                query,
                consistency: ReadConsistency::Linearizable,
                reply,
            } => {
                let read = ReadWaiter { query, reply, arrived };
                match self.lease_read_index() {
                    Some(index) => {
                        self.metrics.lease_reads.inc();
                        self.reads_ready.push((index, read));
                        self.serve_ready_reads();
                    }
                    None => self.reads_unissued.push(read),
                }
            }
            Request::Recover {
                term,
                witnesses,
                commands,
                reply,
            } => {
                let _ = reply.send(self.propose_recovery(term, witnesses, commands));
            }
            Request::CurpWitnesses { term, reply } => {
                let _ = reply.send(self.curp_recovery_witnesses(term));
            }
            Request::TransferLeader { to, reply } => {
                let _ = reply.send(self.transfer_leader(to));
            }
            Request::StepDown { reply } => {
                let leads = self.raw.raft.state == StateRole::Leader;
                // A leader elected a moment ago has heard from no voter yet; a hand-over to one
                // that does not answer costs only the bounded wait of `step_down`.
                let to = leads
                    .then(|| self.furthest_voter().or_else(|| self.furthest_voter_where(|_| true)))
                    .flatten();
                if let Some(to) = to {
                    tracing::info!(to, "shutting down: handing the leadership over first");
                    self.raw.transfer_leader(to);
                }
                let _ = reply.send(Ok(to));
            }
            Request::Backup { reply } => self.backups_unissued.push(BackupWait { reply, arrived }),
            Request::ChangeMembers { change, reply } => match self.propose_member_change(&change) {
                Ok(index) => self.member_waits.push(MemberWait {
                    index,
                    term: self.raw.raft.term,
                    reply,
                    deadline: arrived + Duration::from_millis(self.config.request_timeout_ms),
                }),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Request::AwaitReplicas {
                target,
                replicas,
                deadline,
                reply,
            } => {
                if self.raw.raft.state != StateRole::Leader {
                    let _ = reply.send(Err(NodeError::LeaderChanged));
                    return;
                }
                if self.replica_waits.is_empty() {
                    self.replica_waits_term = self.raw.raft.term;
                }
                self.replica_waits.push(replica_wait::Waiting {
                    target,
                    replicas,
                    deadline,
                    reply,
                });
                self.answer_replica_waits();
            }
        }
    }

    /// Answers the replica waits that are satisfied or out of time; fails them all once this node
    /// no longer leads the term they were asked in.
    fn answer_replica_waits(&mut self) {
        if self.replica_waits.is_empty() {
            return;
        }
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader || raft.term != self.replica_waits_term {
            self.replica_waits.fail_all();
            return;
        }
        // A new CURP leader sets targets once what it recovered is in its log.
        let target_now =
            (!self.config.curp || self.curp.recovery_proposed(raft.term)).then(|| raft.raft_log.last_index());
        let me = self.config.id;
        let progress = raft.prs();
        self.replica_waits
            .answer(raft.term, target_now, Instant::now(), |target| {
                progress
                    .iter()
                    .filter(|(id, p)| **id != me && p.matched >= target)
                    .count()
            });
    }

    /// See `NodeHandle::curp_recovery_witnesses`.
    fn curp_recovery_witnesses(&mut self, term: u64) -> Result<Option<Vec<u64>>, NodeError> {
        if self.curp_leading_term() != Some(term) || self.curp.recovery_proposed(term) {
            return Err(NodeError::LeaderChanged);
        }
        if self.raw.raft.raft_log.term(self.applied_index).ok() != Some(term) {
            return Err(NodeError::Refused(format!(
                "the leader of term {term} has not applied an entry of its term yet"
            )));
        }
        let members = self.raw.store().members();
        Ok((!members.joint()).then(|| sorted_voters(members)))
    }

    /// The voters whose witnesses a fast-path write must have been recorded by for this leader
    /// to speculate on it now: none while a membership change is under way.
    fn speculation_witnesses(&self) -> Option<Vec<u64>> {
        let members = self.raw.store().members();
        (!members.joint() && !self.raw.raft.has_pending_conf()).then(|| sorted_voters(members))
    }

    /// Proposes a new leader's recovered writes, ahead of every client write it holds.
    fn propose_recovery(
        &mut self,
        term: u64,
        witnesses: Option<Vec<u64>>,
        commands: Vec<Bytes>,
    ) -> Result<(), NodeError> {
        if self.curp_recovery_witnesses(term)? != witnesses {
            return Err(NodeError::Refused(
                "the configuration changed while the witnesses were collected".into(),
            ));
        }
        let mut rest = commands.as_slice();
        while !rest.is_empty() {
            let mut bytes = BATCH_HEADER_BYTES;
            let take = rest
                .iter()
                .take_while(|c| {
                    bytes += c.len() + COMMAND_OVERHEAD_BYTES;
                    bytes <= self.config.max_batch_bytes
                })
                .count()
                .max(1);
            let (batch, after) = rest.split_at(take);
            // Fresh request ids that no waiter holds: nobody here waits for these replies.
            let first_id = self.next_request_id;
            self.next_request_id += take as u64;
            let data = batch::encode_commands(
                self.origin,
                self.stamp_ms(),
                batch.iter().enumerate().map(|(n, c)| (first_id + n as u64, c.as_ref())),
            );
            if let Err(e) = self.raw.propose(Vec::new(), data) {
                tracing::warn!(error = %e, "recovery proposal not accepted");
                return Err(NodeError::LeaderChanged);
            }
            self.metrics.entries_proposed.inc();
            rest = after;
        }
        let index = self.raw.raft.raft_log.last_index();
        self.curp.note_recovery(term, index);
        tracing::info!(term, index, writes = commands.len(), "CURP recovery proposed");
        for msg in self.curp.take_held_proposals() {
            self.step_peer_message(msg);
        }
        Ok(())
    }

    /// `Some(term)` while this node leads `term` with CURP on. When that changes, what the last
    /// term's leadership noted and held is forgotten.
    fn curp_leading_term(&mut self) -> Option<u64> {
        let leading = (self.config.curp && self.raw.raft.state == StateRole::Leader).then_some(self.raw.raft.term);
        let noted = (self.curp.noted_in_term != 0).then_some(self.curp.noted_in_term);
        if noted.is_some() && noted != leading {
            self.sm.forget_proposed();
        }
        if self.curp.leading_term() != leading {
            self.curp.step_down();
            self.curp.set_leading_term(leading);
        }
        leading
    }

    /// Whether this node, as CURP leader, has finished its recovery: it may speculate and serve
    /// reads. Always true without CURP.
    fn curp_recovered(&mut self) -> bool {
        match self.curp_leading_term() {
            Some(term) => self.curp.recovered(term, self.applied_index),
            None => !self.config.curp || self.raw.raft.state != StateRole::Leader,
        }
    }

    /// Whether a follower's ReadIndex request must wait here, at the CURP leader: it has not
    /// recovered yet, or a write it answered speculatively has not committed.
    fn curp_holds_read_index(&mut self) -> bool {
        self.curp_leading_term().is_some()
            && (!self.curp_recovered() || self.curp.speculated_through > self.raw.raft.raft_log.committed)
    }

    /// Lets go of what a CURP leader held once it may: followers' ReadIndex requests whose
    /// speculated writes have committed.
    fn release_curp_holds(&mut self) {
        if !self.curp.holds_read_indexes() && self.curp_leading_term().is_none() {
            return;
        }
        if !self.curp_recovered() {
            return;
        }
        for msg in self.curp.release_read_indexes(self.raw.raft.raft_log.committed) {
            self.step_peer_message(msg);
        }
    }

    fn transfer_leader(&mut self, to: u64) -> Result<(), NodeError> {
        if !self.raw.store().conf_state().voters.contains(&to) {
            return Err(NodeError::NotAVoter(to));
        }
        if !self.leader_known() {
            return Err(NodeError::NoLeader { waited_ms: 0 });
        }
        if self.raw.raft.leader_id != to {
            tracing::info!(from = self.raw.raft.leader_id, to, "leadership transfer requested");
            self.raw.transfer_leader(to);
        }
        Ok(())
    }

    fn on_peer_message(&mut self, mut msg: Message) {
        if self.breaks_a_lease_promise(&msg) {
            return;
        }
        match msg.get_msg_type() {
            MessageType::MsgAppend if msg.index == 0 && self.raw.store().members().ids().is_empty() => {
                // A joining node knows the configuration only from a snapshot (the initial one
                // is in no entry): it takes no log from its start. Later appends it refuses as
                // usual, and the leader, whose log no longer starts at 1, sends the snapshot.
                tracing::debug!(
                    from = msg.from,
                    "no configuration yet: waiting for a snapshot, not entries"
                );
                return;
            }
            MessageType::MsgAppend if !msg.entries.is_empty() => {
                let decoded = self.codec.decode(&mut msg, &RaftLogView(&self.raw.raft.raft_log));
                if let Err(e) = decoded {
                    self.metrics.codec_errors.inc();
                    tracing::debug!(error = %e, "dropping undecodable append");
                    if let Some(reply) = e.reply {
                        self.send_unencoded(*reply);
                    }
                    return;
                }
                // Not acknowledged, the append is sent again once the leader hears this node lags.
                if !self.has_room_for_entries(&msg.entries, "dropping the leader's appends") {
                    return;
                }
            }
            MessageType::MsgPropose if self.raw.raft.state == StateRole::Leader => {
                // A follower's clients' writes: refused like this node's own when it is full.
                // The follower cannot be told, so its clients see their writes time out.
                let room = self.has_room_for_entries(&msg.entries, "dropping writes forwarded by a follower");
                if !room {
                    self.hand_off_leadership();
                    return;
                }
                let stamp_ms = self.stamp_ms();
                for entry in msg.entries.iter_mut() {
                    if let Some(stamped) = batch::restamp(&entry.data, stamp_ms) {
                        entry.data = stamped.into();
                    }
                }
                if let Some(term) = self.curp_leading_term() {
                    if !self.curp.recovery_proposed(term) {
                        if !self.curp.hold_proposal(msg) {
                            tracing::debug!("dropping a forwarded write while recovering: too many held");
                        }
                        return;
                    }
                }
            }
            MessageType::MsgReadIndex if self.curp_holds_read_index() => {
                self.curp.hold_read_index(msg);
                return;
            }
            MessageType::MsgReadIndex if self.awaits_commit_in_term() => {
                if self.read_indexes_awaiting_term_commit.len() < MAX_READ_INDEXES_AWAITING_TERM_COMMIT {
                    self.read_indexes_awaiting_term_commit.push(msg);
                }
                return;
            }
            MessageType::MsgAppendResponse => {
                self.codec.observe_response(&msg);
                // When this response commits an entry, raft tells the followers with an empty
                // append of its own. If writes are queued, the append that carries them follows
                // at once and carries the new commit index too: skip the empty one (a message
                // each way and a round of work on every follower per batch).
                let next_append_follows = !self.unproposed.is_empty() && !self.proposal_refused;
                self.raw.skip_bcast_commit(next_append_follows);
            }
            _ => {}
        }
        self.step_peer_message(msg);
    }

    /// The time to fix for a batch taken into the log now: the wall clock in milliseconds since
    /// the Unix epoch, never less than the last stamp.
    fn stamp_ms(&mut self) -> u64 {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_stamp_ms = self.last_stamp_ms.max(now_ms);
        self.last_stamp_ms
    }

    fn step_peer_message(&mut self, msg: Message) {
        if let Err(e) = self.raw.step(msg) {
            tracing::debug!(error = %e, "raft rejected a peer message");
        }
    }

    fn on_peer_event(&mut self, event: PeerEvent) {
        match event {
            PeerEvent::Unreachable(peer) => self.raw.report_unreachable(peer),
            PeerEvent::SnapshotSent { to, delivered } => {
                let status = if delivered {
                    SnapshotStatus::Finish
                } else {
                    SnapshotStatus::Failure
                };
                self.raw.report_snapshot(to, status);
            }
        }
    }

    fn propose_codec_entries(&mut self) {
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        while let Some(data) = self.codec.take_proposal() {
            debug_assert_eq!(data.first(), Some(&CODEC_ENTRY));
            if let Err(e) = self.raw.propose(Vec::new(), data.to_vec()) {
                tracing::debug!(error = %e, "codec entry not accepted");
                return;
            }
        }
    }

    /// Until when the leader keeps queued writes for the next batch (`None`: propose now). It
    /// holds them while its window of uncommitted entries is full, no full batch is waiting and
    /// the oldest has not waited `group_commit_wait_us`. Each held write then shares one entry,
    /// one fsync per replica and one message per follower with the others that arrive meanwhile.
    fn group_commit_deadline(&self) -> Option<Instant> {
        let oldest = self.unproposed.front()?;
        let now = Instant::now();
        let deadline = oldest.waiter.arrived + Duration::from_micros(self.config.group_commit_wait_us);
        let may_hold = self.raw.raft.state == StateRole::Leader
            && self.unproposed.len() < self.config.max_batch_commands
            && self.unproposed_bytes < self.config.max_batch_bytes
            && now < deadline;
        if !may_hold {
            return None;
        }
        if self.window_full() {
            return Some(deadline);
        }
        if self.config.group_commit_linger_us > 0 && self.applied_index < self.raw.raft.raft_log.committed {
            // An entry just committed: answer its writes first, then linger for those clients.
            return Some(now);
        }
        let refill = self.refill.as_ref()?;
        let until = refill.until.unwrap_or(deadline);
        (now < until && self.unproposed.len() < refill.target).then_some(until.min(deadline))
    }

    /// Whether the leader has `group_commit_entries` of its entries uncommitted.
    fn window_full(&self) -> bool {
        let log = &self.raw.raft.raft_log;
        log.last_index() - log.committed >= self.config.group_commit_entries
    }

    /// Starts the linger after the leader's window of uncommitted entries opens with writes just
    /// answered; ends it once the window is full again.
    fn update_refill(&mut self) {
        if self.raw.raft.state != StateRole::Leader || self.window_full() {
            self.refill = None;
            self.answered_writes = 0;
            return;
        }
        if self.refill.is_none() && self.answered_writes > 0 && self.config.group_commit_linger_us > 0 {
            self.refill = Some(Refill {
                until: None,
                target: self.unproposed.len() + self.answered_writes,
            });
            self.answered_writes = 0;
        }
    }

    /// Proposes queued writes in batches bounded by count and bytes.
    fn propose_pending(&mut self) {
        if let Some(term) = self.curp_leading_term() {
            if !self.curp.recovery_proposed(term) {
                return;
            }
        }
        while !self.unproposed.is_empty() && self.leader_known() && self.group_commit_deadline().is_none() {
            let mut bytes = BATCH_HEADER_BYTES;
            let mut take = 0;
            for write in &self.unproposed {
                let size = write.command.len() + COMMAND_OVERHEAD_BYTES;
                if take > 0 && (take >= self.config.max_batch_commands || bytes + size > self.config.max_batch_bytes) {
                    break;
                }
                bytes += size;
                take += 1;
            }
            // A leader's proposals are what fills its log; a follower's go to the leader.
            if self.raw.raft.state == StateRole::Leader && !self.has_room_for(bytes as u64) {
                self.refuse_unproposed_writes();
                return;
            }
            // A follower's stamp is replaced by the leader's when the batch reaches it.
            let stamp_ms = self.stamp_ms();
            let commands = self.unproposed.iter().take(take).map(|w| (w.id, w.command.as_ref()));
            let data = batch::encode_commands(self.origin, stamp_ms, commands);
            let speculating = self.speculating();
            let witnesses = if speculating {
                self.speculation_witnesses()
            } else {
                None
            };
            if speculating {
                // What joined the log before this entry is noted before it is.
                self.note_log_tail(self.raw.raft.raft_log.last_index());
            }
            match self.raw.propose(Vec::new(), data) {
                Ok(()) => {
                    self.metrics.entries_proposed.inc();
                    self.metrics.commands_proposed.add(take as u64);
                    let term = self.raw.raft.term;
                    let index = self.raw.raft.raft_log.last_index();
                    for mut write in self.unproposed.drain(..take) {
                        if speculating {
                            let asked = write
                                .speculative
                                .take()
                                .filter(|s| s.term == term && witnesses.as_ref().is_some_and(|w| *w == s.witnesses));
                            if let Some(asked) = asked {
                                if let Some(reply) = self.sm.speculate(index, &write.command) {
                                    if asked.reply.send(reply).is_ok() {
                                        self.curp.speculated_through = index;
                                    }
                                }
                            }
                            self.sm.proposed(index, &write.command);
                        }
                        self.unproposed_bytes -= write.command.len();
                        if let Some(prepared) = write.prepared {
                            self.codec.proposed(self.origin, write.id, prepared);
                        }
                        write.waiter.proposed_term = term;
                        self.proposed.insert(write.id, write.waiter);
                    }
                    if speculating {
                        self.curp.noted_through = index;
                    }
                }
                Err(e) => {
                    self.metrics.proposals_dropped.inc();
                    self.proposal_refused = true;
                    tracing::debug!(error = %e, "proposal not accepted; will retry at the next tick");
                    return;
                }
            }
        }
    }

    /// Whether this node, as recovered CURP leader, tells the state machine what joins its log
    /// and speculates. Notes from a term this node no longer leads are forgotten first (see
    /// `curp_leading_term`): entries of that term past the commit may have been overwritten, and
    /// a client's write the notes count on may never execute.
    fn speculating(&mut self) -> bool {
        let Some(term) = self.curp_leading_term() else {
            return false;
        };
        if !self.curp.recovered(term, self.applied_index) {
            return false;
        }
        self.curp.noted_in_term = term;
        true
    }

    /// Tells the state machine of every command that joined the log up to `upto` and has been
    /// neither noted nor applied: followers' forwarded writes, and the tail a new leader
    /// inherits.
    fn note_log_tail(&mut self, upto: u64) {
        let from = self.curp.noted_through.max(self.applied_index) + 1;
        if from > upto {
            return;
        }
        let entries = self
            .raw
            .raft
            .raft_log
            .slice(from, upto + 1, None, raft::GetEntriesContext::empty(false))
            .expect("the leader's log holds its unapplied entries");
        for entry in entries {
            if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                continue;
            }
            // Not a batch (the entry codec's own entries): nothing a client wrote.
            if let Ok(batch) = batch::decode(&entry.data) {
                for (_, command) in batch.commands {
                    self.sm.proposed(entry.index, &command);
                }
            }
        }
        self.curp.noted_through = upto;
    }

    /// Whether this node can take `bytes` more of the log: the raft log has room for them without
    /// its disk allocating space (see `DiskStorage::has_room_for`), and the state machine's
    /// storage is not out of space.
    fn has_room_for(&mut self, bytes: u64) -> bool {
        if self.sm.out_of_space() {
            return false;
        }
        match self.raw.mut_store().has_room_for(bytes) {
            Ok(room) => room,
            Err(e) => panic!("raft storage failed: {e}"),
        }
    }

    /// `has_room_for` the entries of a peer's message; when not, counts the refusal and logs
    /// `what` is being dropped.
    fn has_room_for_entries(&mut self, entries: &[Entry], what: &str) -> bool {
        let bytes = entries
            .iter()
            .map(|e| (e.data.len() + ENTRY_OVERHEAD_BYTES) as u64)
            .sum();
        if self.has_room_for(bytes) {
            return true;
        }
        self.metrics.disk_full_refusals.inc();
        self.warn_disk_full(&format!("{what}: the disk is full"));
        false
    }

    /// Answers every queued write with `DiskFull`: none of them was proposed.
    fn refuse_unproposed_writes(&mut self) {
        let refused = self.unproposed.len();
        for write in self.unproposed.drain(..) {
            let _ = write.waiter.reply.send(Err(NodeError::DiskFull {
                node_id: self.config.id,
            }));
        }
        self.unproposed_bytes = 0;
        self.metrics.disk_full_refusals.add(refused as u64);
        self.metrics.requests_failed.add(refused as u64);
        self.warn_disk_full("refusing writes: the disk is full");
        self.hand_off_leadership();
    }

    /// A leader that cannot write hands leadership to the follower furthest along, so the
    /// cluster takes writes again while this node's disk is full; at most once an election
    /// timeout, as raft abandons a transfer that does not finish within one.
    fn hand_off_leadership(&mut self) {
        let now = Instant::now();
        let election_timeout = self.election_timeout();
        if self.raw.raft.state != StateRole::Leader
            || self
                .hand_off_tried_at
                .is_some_and(|at| now.duration_since(at) < election_timeout)
        {
            return;
        }
        if let Some(to) = self.furthest_voter() {
            self.hand_off_tried_at = Some(now);
            tracing::warn!(
                node = self.config.id,
                to,
                "handing leadership over: this node's disk is full"
            );
            self.raw.transfer_leader(to);
        }
    }

    /// On the leader: the other voter furthest along in the log, of those heard from lately
    /// (a transfer to one that does not answer only stalls writes until raft gives it up).
    fn furthest_voter(&self) -> Option<u64> {
        self.furthest_voter_where(|progress| progress.recent_active)
    }

    fn furthest_voter_where(&self, eligible: impl Fn(&raft::Progress) -> bool) -> Option<u64> {
        let me = self.config.id;
        let voters = &self.raw.store().conf_state().voters;
        self.raw
            .raft
            .prs()
            .iter()
            .filter(|(id, progress)| **id != me && voters.contains(id) && eligible(progress))
            .max_by_key(|(_, progress)| progress.matched)
            .map(|(id, _)| *id)
    }

    /// Logs a disk-full condition at most once a second.
    fn warn_disk_full(&mut self, what: &str) {
        let now = Instant::now();
        if self
            .disk_full_warned_at
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            self.disk_full_warned_at = Some(now);
            tracing::warn!(
                node = self.config.id,
                "{what}; free space on the device holding {} and writes resume by themselves",
                self.raw.store().dir().display()
            );
        }
    }

    /// When the newest ReadIndex in flight was issued.
    fn newest_read_issued(&self) -> Option<Instant> {
        self.reads_issued.values().map(|issued| issued.issued_at).max()
    }

    /// When waiting reads may be issued (`None`: none wait, or they may go now).
    fn read_index_deadline(&self) -> Option<Instant> {
        if self.reads_unissued.is_empty() || !self.leader_known() {
            return None;
        }
        let at = self.newest_read_issued()? + READ_INDEX_SPACING;
        (Instant::now() < at).then_some(at)
    }

    /// Issues one ReadIndex for every read that arrived since the last one was issued, at most
    /// one per `READ_INDEX_SPACING` while others are in flight: on a fast network reads
    /// arriving meanwhile share the next one (one heartbeat round per batch of reads, not per
    /// loop iteration), and on a slow one a read never waits for a round trip before its own.
    fn issue_reads(&mut self) {
        // Raft would drop them: they go once the term's first entry commits, within a round trip.
        if self.awaits_commit_in_term() {
            return;
        }
        if !self.backups_unissued.is_empty() && self.leader_known() && self.curp_recovered() {
            let seq = self.request_read_index();
            self.backups_issued
                .insert(seq, std::mem::take(&mut self.backups_unissued));
        }
        if self.reads_unissued.is_empty() || !self.leader_known() || self.read_index_deadline().is_some() {
            return;
        }
        if !self.curp_recovered() {
            return;
        }
        let reads = std::mem::take(&mut self.reads_unissued);
        self.issue_read_index(reads);
    }

    /// Whether this node leads but has not committed an entry of its term yet: raft answers no
    /// ReadIndex until it has (it drops the request silently).
    fn awaits_commit_in_term(&self) -> bool {
        self.raw.raft.state == StateRole::Leader && !self.raw.raft.commit_to_current_term()
    }

    /// Hands raft the followers' ReadIndex requests held for the term's first commit once it is
    /// in; drops them if this node no longer leads (the followers ask the next leader).
    fn release_read_indexes_awaiting_term_commit(&mut self) {
        if self.read_indexes_awaiting_term_commit.is_empty() || self.awaits_commit_in_term() {
            return;
        }
        let held = std::mem::take(&mut self.read_indexes_awaiting_term_commit);
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        for msg in held {
            self.step_peer_message(msg);
        }
    }

    fn issue_read_index(&mut self, reads: Vec<ReadWaiter<SM>>) {
        let seq = self.request_read_index();
        self.reads_issued.insert(
            seq,
            IssuedReads {
                issued_at: Instant::now(),
                term: self.raw.raft.term,
                speculated_through: self.curp.speculated_through,
                reads,
            },
        );
        self.metrics.read_index_requests.inc();
    }

    /// Asks raft for a ReadIndex under this node's next sequence number, which it returns: the
    /// confirmation (`on_read_states`) names it.
    fn request_read_index(&mut self) -> u64 {
        let seq = self.next_read_index_seq;
        self.next_read_index_seq += 1;
        self.raw.read_index(self.read_index_ctx(seq));
        seq
    }

    /// How long a confirmed ReadIndex keeps this leader's read lease (see `ReadLease`).
    fn read_lease_span(&self) -> Duration {
        let promised_ticks = self.config.election_ticks.saturating_sub(1) as u64;
        Duration::from_millis(self.config.tick_ms * promised_ticks).mul_f64(1.0 - READ_LEASE_CLOCK_DRIFT)
    }

    /// The index a linearizable read may be served at without a ReadIndex round: the leader's
    /// commit index, while it holds a read lease and has committed an entry of its term.
    fn lease_read_index(&mut self) -> Option<u64> {
        if !self.config.read_lease || self.raw.raft.state != StateRole::Leader || !self.curp_recovered() {
            return None;
        }
        // A transfer asked for earlier in this loop iteration counts at once.
        self.note_leadership_transfer();
        let raft = &self.raw.raft;
        let lease = self.read_lease.as_ref()?;
        let held = lease.term == raft.term
            && self.read_lease_refused_term != raft.term
            && Instant::now() < lease.until
            && raft.commit_to_current_term();
        held.then_some(raft.raft_log.committed.max(self.curp.speculated_through))
    }

    /// Whether `msg` asks for a vote this node may have promised, before it restarted, not to
    /// give: raft keeps a follower's promise (see `ReadLease`) in memory only, so with read
    /// leases a node ignores vote requests for one election timeout after it starts, as it would
    /// have had it kept hearing from the leader. Transfers are not held back (no lease survives
    /// one).
    fn breaks_a_lease_promise(&self, msg: &Message) -> bool {
        self.config.read_lease
            && matches!(
                msg.get_msg_type(),
                MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
            )
            && msg.context != raft::CAMPAIGN_TRANSFER
            && self.started_at.elapsed() < self.election_timeout()
    }

    /// The shortest election timeout: `election_ticks` ticks.
    fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.config.tick_ms * self.config.election_ticks as u64)
    }

    /// A leadership transfer lets the transferee skip the followers' promise the read lease rests
    /// on, so once one has begun (here, or asked for by a follower) the lease is gone for the
    /// term, even if the transfer is abandoned: its message may still be on its way.
    fn note_leadership_transfer(&mut self) {
        if self.raw.raft.lead_transferee.is_some() {
            self.read_lease_refused_term = self.raw.raft.term;
            self.read_lease = None;
        }
    }

    /// Keeps a leader's read lease from running out while it is idle: a ReadIndex with no reads
    /// once less than half of it is left.
    fn renew_read_lease(&mut self) {
        if !self.config.read_lease
            || self.raw.raft.state != StateRole::Leader
            || !self.reads_issued.is_empty()
            || self.awaits_commit_in_term()
        {
            return;
        }
        let half = self.read_lease_span() / 2;
        let term = self.raw.raft.term;
        let renew = match &self.read_lease {
            Some(lease) if lease.term == term => lease.until.saturating_duration_since(Instant::now()) < half,
            _ => true,
        };
        if renew && self.read_lease_refused_term != term {
            self.issue_read_index(Vec::new());
        }
    }

    /// The context of this node's ReadIndex request number `seq`: the node's id and `seq`. A
    /// leader keeps pending requests by context alone and ignores a second one with the same, so
    /// two nodes' requests (or two incarnations' of one node) must never share one — the later
    /// would be lost, its reads waiting an election timeout to be asked again.
    fn read_index_ctx(&self, seq: u64) -> Vec<u8> {
        let mut ctx = Vec::with_capacity(16);
        ctx.extend_from_slice(&self.config.id.to_le_bytes());
        ctx.extend_from_slice(&seq.to_le_bytes());
        ctx
    }

    /// The sequence number of one of this node's ReadIndex requests, from its context.
    fn read_index_seq(&self, ctx: &[u8]) -> Option<u64> {
        let (id, seq) = ctx.split_first_chunk::<8>()?;
        let seq = <[u8; 8]>::try_from(seq).ok()?;
        (u64::from_le_bytes(*id) == self.config.id).then_some(u64::from_le_bytes(seq))
    }

    fn on_read_states(&mut self, states: Vec<ReadState>) {
        for state in states {
            let Some(seq) = self.read_index_seq(&state.request_ctx) else {
                continue;
            };
            if let Some(backups) = self.backups_issued.remove(&seq) {
                self.backups_ready.extend(backups.into_iter().map(|b| (state.index, b)));
                continue;
            }
            if let Some(issued) = self.reads_issued.remove(&seq) {
                let raft = &self.raw.raft;
                if self.config.read_lease && raft.state == StateRole::Leader && issued.term == raft.term {
                    let until = issued.issued_at + self.read_lease_span();
                    match &mut self.read_lease {
                        Some(lease) if lease.term == issued.term => lease.until = lease.until.max(until),
                        lease => {
                            *lease = Some(ReadLease {
                                term: issued.term,
                                until,
                            })
                        }
                    }
                }
                let index = state.index.max(issued.speculated_through);
                self.reads_ready.extend(issued.reads.into_iter().map(|r| (index, r)));
            }
        }
        self.serve_ready_reads();
    }

    fn serve_ready_reads(&mut self) {
        if self.reads_ready.is_empty() {
            return;
        }
        let applied = self.applied_index;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reads_ready)
            .into_iter()
            .partition(|(index, _)| *index <= applied);
        self.reads_ready = waiting;
        for (_, read) in ready {
            self.answer_read(&read.query, read.reply);
        }
    }

    /// Answers a read now, or, if it has a slow step, once that step has run off the loop.
    fn answer_read(&mut self, query: &SM::Query, reply: Reply<SM::Output>) {
        match self.sm.query_or_defer(query) {
            Ok(output) => {
                let _ = reply.send(Ok(output));
            }
            Err(slow) if self.slow_reads_in_flight < MAX_SLOW_READS_IN_FLIGHT => self.start_slow_read(slow, reply),
            Err(slow) => self.slow_reads_waiting.push_back((slow, reply)),
        }
    }

    fn start_slow_read(&mut self, slow: SlowRead<SM>, reply: Reply<SM::Output>) {
        self.slow_reads_in_flight += 1;
        let finished = self.finished_reads.clone();
        match slow {
            SlowRead::Blocking(step) => {
                tokio::task::spawn_blocking(move || {
                    let _ = finished.send((step(), reply));
                });
            }
            SlowRead::Waiting(step) => {
                tokio::spawn(async move {
                    let _ = finished.send((step.await, reply));
                });
            }
        }
    }

    /// A deferred read's slow step has run: finish it against the state and answer; a waiting
    /// one takes its place.
    fn finish_read(&mut self, finish: FinishRead<SM>, reply: Reply<SM::Output>) {
        self.slow_reads_in_flight -= 1;
        let _ = reply.send(Ok(finish(&mut self.sm)));
        if let Some((slow, reply)) = self.slow_reads_waiting.pop_front() {
            self.start_slow_read(slow, reply);
        }
    }

    /// Fails requests that waited too long, and re-issues ReadIndex requests that got no answer
    /// (raft drops them silently when leadership moves).
    fn expire_requests(&mut self) {
        let now = Instant::now();
        let leader_wait = Duration::from_millis(self.config.leader_wait_ms);
        let request_timeout = Duration::from_millis(self.config.request_timeout_ms);
        let no_leader = || NodeError::NoLeader {
            waited_ms: leader_wait.as_millis() as u64,
        };
        let timeout = || NodeError::Timeout {
            waited_ms: request_timeout.as_millis() as u64,
        };
        let failed = &self.metrics.requests_failed;

        while let Some(write) = self.unproposed.front() {
            if now.duration_since(write.waiter.arrived) < leader_wait {
                break;
            }
            let write = self.unproposed.pop_front().expect("front exists");
            self.unproposed_bytes -= write.command.len();
            failed.inc();
            let _ = write.waiter.reply.send(Err(no_leader()));
        }
        let applied_term = self.applied_term;
        let expired: Vec<(u64, NodeError)> = self
            .proposed
            .iter()
            .filter_map(|(id, w)| {
                if now.duration_since(w.arrived) >= request_timeout || w.reply.is_closed() {
                    Some((*id, timeout()))
                } else if w.proposed_term < applied_term {
                    Some((*id, NodeError::LeaderChanged))
                } else {
                    None
                }
            })
            .collect();
        for (id, error) in expired {
            let w = self.proposed.remove(&id).expect("listed");
            failed.inc();
            let _ = w.reply.send(Err(error));
        }
        let (keep, old): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reads_unissued)
            .into_iter()
            .partition(|r| now.duration_since(r.arrived) < leader_wait);
        self.reads_unissued = keep;
        for r in old {
            failed.inc();
            let _ = r.reply.send(Err(no_leader()));
        }
        let retry_after = self.election_timeout();
        let stale_ctxs: Vec<u64> = self
            .reads_issued
            .iter()
            .filter(|(_, issued)| now.duration_since(issued.issued_at) >= retry_after)
            .map(|(ctx, _)| *ctx)
            .collect();
        for ctx in stale_ctxs {
            let issued = self.reads_issued.remove(&ctx).expect("listed");
            for r in issued.reads {
                if now.duration_since(r.arrived) >= leader_wait {
                    failed.inc();
                    let _ = r.reply.send(Err(NodeError::ReadUnconfirmed {
                        waited_ms: leader_wait.as_millis() as u64,
                    }));
                } else {
                    self.reads_unissued.push(r);
                }
            }
        }
        let (keep, old): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reads_ready)
            .into_iter()
            .partition(|(_, r)| now.duration_since(r.arrived) < request_timeout);
        self.reads_ready = keep;
        for (_, r) in old {
            failed.inc();
            let _ = r.reply.send(Err(timeout()));
        }
    }

    fn send(&mut self, messages: Vec<Message>) {
        for mut msg in messages {
            if msg.get_msg_type() == MessageType::MsgAppend && !msg.entries.is_empty() {
                let log = RaftLogView(&self.raw.raft.raft_log);
                self.codec.encode(&mut msg, &log, self.raw.raft.raft_log.committed);
            }
            self.send_unencoded(msg);
        }
    }

    /// Queues a message for its peer as it is; a full queue drops it (raft retransmits). A
    /// snapshot goes to the shipper with the files it names instead.
    fn send_unencoded(&mut self, msg: Message) {
        let to = msg.to;
        if msg.get_msg_type() == MessageType::MsgSnapshot {
            let files =
                split_snapshot(&msg.get_snapshot().data).and_then(|(sm_state, _, _)| self.sm.snapshot_files(sm_state));
            match files {
                Ok(files) => self.shipper.ship(to, msg, files),
                Err(e) => {
                    tracing::error!(to, error = %e, "cannot ship the snapshot to a lagging follower");
                    self.raw.report_snapshot(to, SnapshotStatus::Failure);
                }
            }
            return;
        }
        let Some((queue, _)) = self.peers.get(&to) else {
            tracing::warn!(to, "message for an unknown peer dropped");
            return;
        };
        if queue.try_send(msg).is_err() {
            self.metrics.messages_dropped.inc();
        }
    }

    fn on_ready(&mut self) -> Result<(), StorageError> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let started = Instant::now();
        let mut ready = self.raw.ready();
        // A leader's messages go out before its own append is durable (raft counts its own vote
        // only once it is): the followers' writes overlap the leader's.
        self.send(ready.take_messages());
        let installs_snapshot = !ready.snapshot().is_empty();
        if installs_snapshot {
            let snapshot = ready.snapshot().clone();
            let (term, index) = (snapshot.get_metadata().term, snapshot.get_metadata().index);
            let files_dir = shipment::staging_dir(&self.incoming_dir, term, index);
            let installed = split_snapshot(&snapshot.data).and_then(|(sm_state, codec_state, addresses)| {
                self.sm.install_snapshot(sm_state, &files_dir)?;
                self.codec.restore(codec_state, index)?;
                Ok(addresses)
            });
            let addresses = match installed {
                Ok(addresses) => addresses,
                Err(e) => panic!("snapshot at index {index} from the leader is corrupt: {e}"),
            };
            // A leader of an older build sends no addresses: keep those known, for the members.
            let addresses = addresses.unwrap_or_else(|| {
                membership::addresses_after(
                    &self.raw.store().members().addresses,
                    &Addresses::new(),
                    snapshot.get_metadata().get_conf_state(),
                )
            });
            if let Err(e) = std::fs::remove_dir_all(&files_dir) {
                tracing::warn!(dir = %files_dir.display(), error = %e, "cannot remove an installed shipment");
            }
            let data = snapshot.data.clone();
            self.raw.mut_store().apply_snapshot(snapshot, addresses)?;
            self.members_changed();
            self.snapshot_persisted(&data);
            self.applied_index = index;
            self.applied_bytes_since_snapshot = 0;
            self.metrics.snapshots_installed.inc();
            tracing::info!(index, "installed snapshot from leader");
        }
        self.apply(ready.take_committed_entries());
        if !ready.entries().is_empty() {
            self.raw.mut_store().append(ready.entries())?;
        }
        if let Some(hs) = ready.hs() {
            self.raw.mut_store().set_hard_state(hs);
        }
        // The write goes to the storage's writer thread; the loop goes on meanwhile. Not with a
        // snapshot: raft takes it as applied once the Ready is advanced.
        let seq = if installs_snapshot {
            self.raw.mut_store().persist(true)?;
            self.raw.store().submitted_seq()
        } else if ready.must_sync() || self.raw.store().has_pending() {
            self.raw.mut_store().start_persist(ready.must_sync())?
        } else {
            self.raw.store().submitted_seq()
        };
        self.persisting.push_back(Persisting {
            seq,
            number: ready.number(),
            messages: ready.take_persisted_messages(),
        });
        self.on_read_states(ready.take_read_states());
        self.raw.advance_append_async(ready);
        self.release_persisted();
        self.raw.advance_apply();
        self.serve_ready_reads();
        self.metrics.ready_seconds.observe(started.elapsed());
        Ok(())
    }

    /// Tells raft which Readies are durable and sends the messages that waited for that.
    fn release_persisted(&mut self) {
        let durable = match self.raw.mut_store().durable_seq() {
            Ok(seq) => seq,
            // Raft state on disk can no longer be trusted to match memory: stop loudly.
            Err(e) => panic!("raft storage failed: {e}"),
        };
        for took in self.raw.mut_store().take_write_times() {
            self.metrics.fsync_seconds.observe(took);
        }
        while self.persisting.front().is_some_and(|p| p.seq <= durable) {
            let persisted = self.persisting.pop_front().expect("checked");
            self.raw.on_persist_ready(persisted.number);
            self.send(persisted.messages);
        }
    }

    /// Whether committed entries wait for a later round of applies (past the round's byte bound).
    fn apply_backlogged(&self) -> bool {
        self.raw.raft.raft_log.has_next_entries_since(self.applied_index)
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        let started = Instant::now();
        let mut round_bytes = 0u64;
        for entry in entries {
            round_bytes += (entry.data.len() + entry.context.len()) as u64;
            assert!(
                entry.index == self.applied_index + 1,
                "applied index must advance by one: applied {}, next entry {}",
                self.applied_index,
                entry.index
            );
            self.applied_index = entry.index;
            self.applied_term = entry.term;
            self.codec.applied(&entry);
            match entry.get_entry_type() {
                EntryType::EntryNormal if !entry.data.is_empty() && entry.data[0] != CODEC_ENTRY => {
                    self.applied_bytes_since_snapshot += entry.data.len() as u64;
                    self.apply_batch(entry.index, &entry.data);
                }
                EntryType::EntryNormal => {}
                // Leaving a joint configuration is an empty change: it applies all the same.
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => self.apply_conf_change(&entry),
            }
            self.sm.entry_applied(entry.index);
        }
        self.sm.round_applied();
        let bound = next_apply_round_bytes(self.apply_round_max_bytes, round_bytes, started.elapsed());
        if bound != self.apply_round_max_bytes {
            self.apply_round_max_bytes = bound;
            self.raw.raft.set_max_committed_size_per_ready(bound);
            self.metrics.apply_round_max_bytes.set(bound as i64);
        }
    }

    /// Applies a membership change entry: raft's configuration, the members' addresses (from
    /// the entry's context), the links to them.
    fn apply_conf_change(&mut self, entry: &Entry) {
        if entry.index <= self.raw.store().members().conf_index {
            // Already in the recorded configuration raft started from (a restart replays it).
            return;
        }
        let cc = if entry.get_entry_type() == EntryType::EntryConfChange {
            let mut v1 = ConfChange::default();
            protobuf::Message::merge_from_bytes(&mut v1, &entry.data).map(|_| raft_proto::ConfChangeI::into_v2(v1))
        } else {
            let mut v2 = ConfChangeV2::default();
            protobuf::Message::merge_from_bytes(&mut v2, &entry.data).map(|_| v2)
        };
        // Every replica holds the same bytes, so refusing a malformed change keeps them alike.
        let (cc, added) = match (cc, membership::decode_context(&entry.context)) {
            (Ok(cc), Ok(added)) => (cc, added),
            (Err(e), _) => {
                return tracing::error!(index = entry.index, error = %e, "undecodable membership change skipped")
            }
            (_, Err(e)) => {
                return tracing::error!(index = entry.index, error = %e, "membership change with undecodable addresses skipped")
            }
        };
        let cs = match self.raw.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(e) => return tracing::error!(index = entry.index, error = %e, "membership change rejected by raft"),
        };
        let addresses = membership::addresses_after(&self.raw.store().members().addresses, &added, &cs);
        tracing::info!(index = entry.index, voters = ?cs.voters, outgoing = ?cs.voters_outgoing, learners = ?cs.learners, "membership changed");
        self.raw.mut_store().set_members(Members {
            conf_index: entry.index,
            conf_state: cs,
            addresses,
        });
        self.members_changed();
    }

    /// Links the members this node is not linked to, unlinks those that left, and tells whoever
    /// watches the membership.
    fn members_changed(&mut self) {
        let members = self.raw.store().members().clone();
        let wanted: HashMap<u64, SocketAddr> = members
            .addresses
            .iter()
            .filter(|(id, _)| **id != self.config.id)
            .map(|(id, addr)| (*id, *addr))
            .collect();
        // A node still joining has no configuration yet: it keeps the links it was given.
        if !members.ids().is_empty() {
            let gone: Vec<u64> = self
                .peers
                .keys()
                .filter(|id| !wanted.contains_key(id))
                .copied()
                .collect();
            for peer in gone {
                self.peers.remove(&peer);
                self.transport.remove_peer(peer);
                if let Some(lag) = self.metrics.peer_lag.remove(&peer) {
                    lag.set(0);
                }
                tracing::info!(peer, "unlinked a node that left the cluster");
            }
        }
        for (peer, addr) in &wanted {
            if self.peers.get(peer).is_some_and(|(_, linked)| linked == addr) {
                continue;
            }
            let queue = self.transport.add_peer(*peer, *addr);
            self.peers.insert(*peer, (queue, *addr));
            self.metrics
                .peer_lag
                .entry(*peer)
                .or_insert_with(|| peer_lag_gauge(*peer));
            tracing::info!(peer, %addr, "linked a member");
        }
        let mut shipper_peers: HashMap<u64, SocketAddr> =
            self.peers.iter().map(|(id, (_, addr))| (*id, *addr)).collect();
        shipper_peers.retain(|id, _| *id != self.config.id);
        self.shipper.set_peers(shipper_peers);
        let cs = &members.conf_state;
        self.metrics
            .voters
            .set((cs.voters.len() + cs.voters_outgoing.iter().filter(|v| !cs.voters.contains(v)).count()) as i64);
        self.metrics
            .learners
            .set((cs.learners.len() + cs.learners_next.len()) as i64);
        self.metrics.conf_index.set(members.conf_index as i64);
        self.members.send_replace(members);
        self.answer_member_waits();
        self.tell_voters();
    }

    /// Tells the state machine the voters in force; a node still joining has no configuration
    /// yet and tells nothing.
    fn tell_voters(&mut self) {
        let mut voters = self.raw.store().members().conf_state.voters.clone();
        if voters.is_empty() {
            return;
        }
        voters.sort_unstable();
        self.sm.voters_changed(&voters);
    }

    /// On the leader: proposes `change`; returns the index its entry will have.
    fn propose_member_change(&mut self, change: &MemberChange) -> Result<u64, NodeError> {
        let refuse = |reason: String| Err(NodeError::MembershipRefused(reason));
        if self.raw.raft.state != StateRole::Leader {
            return refuse(match self.raw.raft.leader_id {
                raft::INVALID_ID => "no leader is known; retry in a moment".to_string(),
                leader => format!("node {} is not the leader; ask node {leader}", self.config.id),
            });
        }
        let members = self.raw.store().members().clone();
        if members.joint() || self.raw.raft.has_pending_conf() {
            return refuse("another membership change is under way; retry once it is done".into());
        }
        // A change must follow the recovered writes in the log: it commits only with them, so
        // no write that completed under the old witnesses is left for the new ones to find.
        if let Some(term) = self.curp_leading_term() {
            if !self.curp.recovered(term, self.applied_index) {
                return refuse("the new leader is still recovering CURP's witnesses; retry in a moment".into());
            }
        }
        let cs = &members.conf_state;
        match change {
            MemberChange::AddLearner { id, .. } => {
                if members.ids().contains(id) {
                    return refuse(format!("node {id} is already a member"));
                }
            }
            MemberChange::Promote(ids) => {
                for id in ids {
                    if !cs.learners.contains(id) {
                        return refuse(format!("node {id} is not a learner; add it first"));
                    }
                    let matched = self.raw.raft.prs().get(*id).map_or(0, |p| p.matched);
                    let lag = self.raw.raft.raft_log.last_index().saturating_sub(matched);
                    if lag > PROMOTE_MAX_LAG_ENTRIES {
                        return refuse(format!(
                            "node {id} is {lag} entries behind the leader; promote it once it caught up"
                        ));
                    }
                }
            }
            // Removing or demoting voters: never the leader itself, never every voter.
            MemberChange::Remove(ids) | MemberChange::Demote(ids) => {
                if ids.contains(&self.config.id) {
                    return refuse(format!(
                        "node {} leads; hand the leadership to another voter first (POST /failover on its metrics port)",
                        self.config.id
                    ));
                }
                let (known, what) = match change {
                    MemberChange::Remove(_) => (members.ids(), "member"),
                    _ => (cs.voters.clone(), "voter"),
                };
                if let Some(id) = ids.iter().find(|id| !known.contains(id)) {
                    return refuse(format!("node {id} is not a {what}"));
                }
                if cs.voters.iter().all(|v| ids.contains(v)) {
                    return refuse("that would leave no voter".into());
                }
            }
        }
        let (cc, added) = change.to_raft();
        let before = self.raw.raft.raft_log.last_index();
        if let Err(e) = self.raw.propose_conf_change(membership::encode_context(&added), cc) {
            return refuse(format!("raft refused the change ({e}); retry"));
        }
        let index = self.raw.raft.raft_log.last_index();
        assert_eq!(index, before + 1, "a membership change is one entry");
        tracing::info!(?change, index, "membership change proposed");
        Ok(index)
    }

    /// Answers the membership changes that applied (and left any joint configuration).
    fn answer_member_waits(&mut self) {
        let members = self.raw.store().members();
        if members.joint() {
            return;
        }
        let applied = members.conf_index;
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.member_waits)
            .into_iter()
            .partition(|w| w.index <= applied);
        self.member_waits = waiting;
        for wait in done {
            let _ = wait.reply.send(Ok(members.clone()));
        }
    }

    fn expire_member_waits(&mut self) {
        let now = Instant::now();
        let term = self.raw.raft.term;
        let timeout_ms = self.config.request_timeout_ms;
        self.member_waits.retain_mut(|wait| {
            let outcome = if wait.term != term {
                NodeError::LeaderChanged
            } else if now >= wait.deadline {
                NodeError::Timeout { waited_ms: timeout_ms }
            } else {
                return true;
            };
            let (reply, _) = oneshot::channel();
            let _ = std::mem::replace(&mut wait.reply, reply).send(Err(outcome));
            false
        });
    }

    /// Answers the backups whose ReadIndex this node has applied, from the latest snapshot if it
    /// covers that index, else asks for a new one (fails those that waited too long).
    fn serve_backups(&mut self) {
        if self.backups_ready.is_empty() && self.backups_unissued.is_empty() && self.backups_issued.is_empty() {
            return;
        }
        let now = Instant::now();
        let expired = |wait: &BackupWait| now.duration_since(wait.arrived) >= BACKUP_TIMEOUT;
        let timeout = || NodeError::Timeout {
            waited_ms: BACKUP_TIMEOUT.as_millis() as u64,
        };
        for wait in self.backups_unissued.extract_if(.., |w| expired(w)) {
            let _ = wait.reply.send(Err(timeout()));
        }
        for waits in self.backups_issued.values_mut() {
            for wait in waits.extract_if(.., |w| expired(w)) {
                let _ = wait.reply.send(Err(timeout()));
            }
        }
        self.backups_issued.retain(|_, waits| !waits.is_empty());
        let snapshot_index = self.raw.store().latest_snapshot().get_metadata().index;
        let applied = self.applied_index;
        self.snapshot_for_backup = false;
        for (index, wait) in std::mem::take(&mut self.backups_ready) {
            if expired(&wait) {
                let _ = wait.reply.send(Err(timeout()));
            } else if index <= snapshot_index {
                let _ = wait.reply.send(self.backup_source());
            } else {
                self.snapshot_for_backup |= index <= applied;
                self.backups_ready.push((index, wait));
            }
        }
    }

    /// The latest snapshot as a backup.
    fn backup_source(&mut self) -> Result<BackupSource, NodeError> {
        let snapshot = self.raw.store().latest_snapshot().clone();
        let failed = |e: String| NodeError::Refused(format!("the backup cannot be taken: {e}"));
        let (sm_state, _, _) = split_snapshot(&snapshot.data).map_err(failed)?;
        let files = self.sm.snapshot_files(sm_state).map_err(failed)?;
        let mut sizes = Vec::with_capacity(files.files.len());
        for (name, path) in &files.files {
            let size = std::fs::metadata(path)
                .map_err(|e| failed(format!("{}: {e}", path.display())))?
                .len();
            sizes.push((name.clone(), size));
        }
        let meta = snapshot.get_metadata();
        Ok(BackupSource {
            header: BackupHeader {
                index: meta.index,
                term: meta.term,
                conf_state: meta.get_conf_state().clone(),
                data: snapshot.data.to_vec(),
                files: sizes,
            },
            paths: files.files.into_iter().map(|(_, path)| path).collect(),
            pin: files.pin,
        })
    }

    /// On the leader: whether a learner holding nothing yet needs a snapshot that names it. A
    /// new node starts from a snapshot (the initial configuration is in no entry), and raft
    /// installs only one whose configuration includes the node.
    fn snapshot_for_new_members(&mut self) {
        let prs = self.raw.raft.prs();
        let snapshotted = membership::member_ids(self.raw.store().latest_snapshot().get_metadata().get_conf_state());
        self.snapshot_for_learner = self.raw.raft.state == StateRole::Leader
            && prs
                .conf()
                .learners()
                .iter()
                .any(|id| prs.get(*id).is_some_and(|p| p.matched == 0) && snapshotted.binary_search(id).is_err());
    }

    /// A leader that inherited a joint configuration leaves it (raft leaves it by itself only
    /// on the leader that entered it).
    fn leave_joint_configuration(&mut self) {
        if self.raw.raft.state != StateRole::Leader
            || !self.raw.store().members().joint()
            || self.raw.raft.has_pending_conf()
        {
            return;
        }
        match self.raw.propose_conf_change(Vec::new(), ConfChangeV2::default()) {
            Ok(()) => tracing::info!("leaving the joint configuration a former leader entered"),
            Err(e) => tracing::warn!(error = %e, "cannot propose leaving the joint configuration yet"),
        }
    }

    fn apply_batch(&mut self, index: u64, data: &Bytes) {
        let batch = match batch::decode(data) {
            Ok(batch) => batch,
            Err(e) => {
                // Every replica holds the same bytes, so skipping keeps replicas identical.
                self.metrics.batch_decode_errors.inc();
                tracing::error!(index, error = %e, "committed entry is not a valid batch; skipped");
                return;
            }
        };
        let mine = batch.origin == self.origin;
        self.sm.entry_time(batch.leader_time_ms);
        for (request_id, command) in batch.commands {
            let output = self.sm.apply(index, &command);
            if mine {
                if let Some(waiter) = self.proposed.remove(&request_id) {
                    let _ = waiter.reply.send(Ok(output));
                    self.answered_writes += 1;
                }
            }
        }
    }

    fn maybe_snapshot(&mut self) {
        if self.snapshot_job.is_some() {
            return;
        }
        let store = self.raw.store();
        let snapshot_index = store.latest_snapshot().get_metadata().index;
        let forced =
            (self.snapshot_for_learner && snapshot_index < store.members().conf_index) || self.snapshot_for_backup;
        if self.snapshot_for_learner && !forced && store.first_entry_index() <= 1 && snapshot_index > 0 {
            // Dropping the first entry is enough: a new node then needs the snapshot.
            if let Err(e) = self.raw.mut_store().compact(2) {
                panic!("raft log compaction failed: {e}");
            }
            tracing::info!(snapshot_index, "log compacted so a new node starts from the snapshot");
        }
        let entries_since = self.applied_index.saturating_sub(snapshot_index);
        if entries_since == 0
            || (!forced
                && entries_since < self.config.snapshot_interval_entries
                && self.applied_bytes_since_snapshot < self.config.snapshot_interval_bytes)
        {
            return;
        }
        if (!forced && self.applied_bytes_since_snapshot < self.sm.snapshot_cost_bytes()) || !self.sm.snapshot_ready() {
            return;
        }
        let store = self.raw.store();
        let index = self.applied_index;
        let term = raft::Storage::term(store, index).expect("applied entries are in the log");
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = term;
        snapshot.mut_metadata().set_conf_state(store.conf_state().clone());
        // The state is captured here, at a consistent point; serialising it and the slow disk
        // write happen on the writer thread.
        let serialise_state = self.sm.snapshot_later();
        let codec_state = self.codec.snapshot();
        let addresses = store.members().addresses.clone();
        self.applied_bytes_since_snapshot = 0;
        let dir = store.dir().to_path_buf();
        let (done, job) = oneshot::channel();
        std::thread::Builder::new()
            .name("snapshot-writer".into())
            .spawn(move || {
                snapshot.data = Bytes::from(join_snapshot(&serialise_state(), &codec_state, &addresses));
                let result = write_snapshot_file(&dir, &snapshot).map(|_| snapshot);
                let _ = done.send(result);
            })
            .expect("spawn snapshot writer");
        self.snapshot_job = Some(job);
    }

    fn on_snapshot_written(&mut self, result: Result<Snapshot, StorageError>) {
        let snapshot = match result {
            Ok(snapshot) => snapshot,
            Err(e) => {
                tracing::error!(error = %e, "writing a snapshot failed; will retry later");
                return;
            }
        };
        let started = Instant::now();
        let index = snapshot.get_metadata().index;
        let store = self.raw.mut_store();
        if index <= store.latest_snapshot().get_metadata().index {
            // A snapshot from the leader overtook this one.
            let _ = std::fs::remove_file(store.dir().join(format!("snapshot-{index:020}.snap")));
            return;
        }
        let data = snapshot.data.clone();
        store.adopt_local_snapshot(snapshot);
        let compact_to = (index + 1).saturating_sub(self.config.log_keep_entries);
        if let Err(e) = store.compact(compact_to) {
            panic!("raft log compaction failed: {e}");
        }
        let first_index = store.first_entry_index();
        self.snapshot_persisted(&data);
        self.metrics.snapshots_created.inc();
        // What the raft loop spent here is what every commit of the cluster waited meanwhile.
        let loop_us = started.elapsed().as_micros() as u64;
        tracing::info!(index, first_index, loop_us, "snapshot written; log compacted");
    }

    fn snapshot_persisted(&mut self, data: &[u8]) {
        let (sm_state, _, _) = split_snapshot(data).expect("a snapshot this node wrote splits");
        self.sm.snapshot_persisted(sm_state);
    }

    fn publish_status(&mut self) {
        let raft = &self.raw.raft;
        let store = self.raw.store();
        let status = NodeStatus {
            id: self.config.id,
            role: raft.state.into(),
            term: raft.term,
            leader_id: raft.leader_id,
            commit_index: raft.raft_log.committed,
            applied_index: self.applied_index,
            first_index: store.first_entry_index(),
            last_index: store.last_entry_index(),
            snapshot_index: store.latest_snapshot().get_metadata().index,
        };
        if status.leader_id != self.last_leader {
            if status.leader_id != raft::INVALID_ID {
                self.metrics.leader_changes.inc();
                tracing::info!(leader = status.leader_id, term = status.term, "leader changed");
            }
            self.last_leader = status.leader_id;
            // A ReadIndex in flight when leadership moves may never be answered: ask again.
            for (_, issued) in self.reads_issued.drain() {
                self.reads_unissued.extend(issued.reads);
            }
            for (_, backups) in self.backups_issued.drain() {
                self.backups_unissued.extend(backups);
            }
        }
        let m = &self.metrics;
        m.term.set(status.term as i64);
        m.role.set(match status.role {
            Role::Follower => 0,
            Role::PreCandidate => 1,
            Role::Candidate => 2,
            Role::Leader => 3,
        });
        m.leader_id.set(status.leader_id as i64);
        m.commit_index.set(status.commit_index as i64);
        m.applied_index.set(status.applied_index as i64);
        m.first_index.set(status.first_index as i64);
        m.last_index.set(status.last_index as i64);
        let leading = status.role == Role::Leader;
        for (peer, lag) in &m.peer_lag {
            let matched = leading
                .then(|| raft.prs().get(*peer).map(|progress| progress.matched))
                .flatten();
            lag.set(matched.map_or(0, |matched| status.last_index.saturating_sub(matched)) as i64);
        }
        self.status.send_if_modified(|current| {
            if *current == status {
                false
            } else {
                *current = status;
                true
            }
        });
    }
}

/// A configuration's voters, sorted.
fn sorted_voters(members: &Members) -> Vec<u64> {
    let mut voters = members.conf_state.voters.clone();
    voters.sort_unstable();
    voters
}

/// The byte bound of the next round of applies, from the last round's bytes and time: a round
/// over `APPLY_ROUND_TARGET` shrinks it to the bytes that would have fit at that round's pace,
/// a round under half the target doubles it; between `APPLY_ROUND_MIN_BYTES` and
/// `APPLY_ROUND_MAX_BYTES`. The bound matters only to a backlog, so applies that are fast again
/// get it back within a few rounds.
fn next_apply_round_bytes(bound_bytes: u64, round_bytes: u64, round_time: Duration) -> u64 {
    let next = if round_time > APPLY_ROUND_TARGET {
        let fits = round_bytes as f64 * APPLY_ROUND_TARGET.as_secs_f64() / round_time.as_secs_f64();
        (fits as u64).min(bound_bytes)
    } else if round_time < APPLY_ROUND_TARGET / 2 {
        bound_bytes.saturating_mul(2)
    } else {
        bound_bytes
    };
    next.clamp(APPLY_ROUND_MIN_BYTES, APPLY_ROUND_MAX_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_rounds_shrink_the_apply_bound_to_what_fits_the_target_and_fast_ones_grow_it_back() {
        let target = APPLY_ROUND_TARGET;
        // 256 KiB in 500 ms (TPC-C write-sets on PostgreSQL): a tenth of it fits in 50 ms.
        let slow = next_apply_round_bytes(APPLY_ROUND_MAX_BYTES, APPLY_ROUND_MAX_BYTES, target * 10);
        assert_eq!(slow, APPLY_ROUND_MAX_BYTES / 10);
        // A slow round never raises the bound, even when one large entry went over it.
        assert_eq!(next_apply_round_bytes(slow, 2 * slow, target * 3 / 2), slow);
        // Never below the floor, even for one huge, slow entry.
        assert_eq!(
            next_apply_round_bytes(slow, 100, Duration::from_secs(5)),
            APPLY_ROUND_MIN_BYTES
        );
        // Rounds between half the target and the target keep it.
        assert_eq!(next_apply_round_bytes(slow, slow, target * 3 / 4), slow);
        // Fast rounds double it, up to the ceiling.
        let mut bound = APPLY_ROUND_MIN_BYTES;
        let mut rounds = 0;
        while bound < APPLY_ROUND_MAX_BYTES {
            let grown = next_apply_round_bytes(bound, bound, Duration::from_millis(1));
            assert_eq!(grown, (bound * 2).min(APPLY_ROUND_MAX_BYTES));
            bound = grown;
            rounds += 1;
        }
        assert_eq!(rounds, 6, "4 KiB back to 256 KiB");
        assert_eq!(
            next_apply_round_bytes(APPLY_ROUND_MAX_BYTES, 10, Duration::ZERO),
            APPLY_ROUND_MAX_BYTES
        );
    }
}
