//! CURP at the RESP front end (`--curp on`): the node a client talks to acts as CURP's client.
//!
//! - **When.** The fast path saves the round trip from a follower to its leader, and costs a
//!   witness write (an fsync) on every node and three messages more per write. So a follower
//!   takes it only when its leader is at least `fast_path_min_rtt` away; on a LAN, and on the
//!   leader itself (which waits for all witnesses instead of a majority), the ordinary path is
//!   as fast and cheaper ([`Curp::fast_path_pays`]).
//! - **The fast path** ([`Curp::write`]). A write goes to the leader (`PROPOSE`, or straight into
//!   the local raft loop when this node leads) and, at the same time, to every node's witness
//!   (`RECORD`). It is done when the leader's speculative reply and a superquorum of acceptances
//!   are in: one round trip. If the leader could not speculate, it answers once the write has
//!   applied; if the witnesses did not all accept, the front end waits for the write the leader
//!   put in its log to apply here ([`ApplyWatch`]): no more than the ordinary path costs. Only
//!   when that does not come in time is the write sent again the ordinary way, under the same
//!   RIFL id, which executes it once.
//! - **Recovery** ([`Curp::recover_as_leader`]). A new leader collects the witness pools of a
//!   majority for its term (so they refuse the old leader's records from then on), proposes every
//!   write found in enough of them, ahead of any client write, then `CurpRecovered`, whose apply
//!   makes every witness drop the older terms' records. Until that applies it speculates on
//!   nothing and serves no read (`chorus_log`'s `curp_leader`).
//! - **Membership.** The witnesses are the voters of the configuration in force. A write is
//!   recorded by the witnesses of the configuration this node has applied, and the leader
//!   speculates on it only if those are its voters and no change is under way; a change is
//!   proposed only after the leader's recovery, so it commits only with every write that
//!   completed under the old witnesses, and the new ones never need to know of those. A new
//!   leader collects the witnesses of the configuration its whole log makes (see
//!   `NodeHandle::curp_recovery_witnesses`).
//!
//! Peers' requests to this node's services arrive through [`serve_peer_requests`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_curp::durable_witness::{self, decode_verdict, DurableWitness};
use chorus_curp::rifl::{ClientId, Envelope};
use chorus_curp::witness::{file, recoverable, superquorum, Event, Record, Rejection};
use chorus_log::node::Pending;
use chorus_log::{NodeError, PeerRequest, Role};
use chorus_metrics::{counter, gauge, labeled_counter, Counter, Gauge};
use chorus_resp::{parse_value, write_value, Limits, Value};
use tokio::sync::{mpsc, oneshot};

use crate::command::encode_curp_recovered;
use crate::server::KvNode;

/// The leader's half of the fast path: body `[term u64][command]`; response `[kind u8]` then
/// the reply as RESP (see `ProposeReply`).
pub const SERVICE_PROPOSE: u8 = 3;

const SPECULATED: u8 = 1;
const APPLIED: u8 = 2;
/// The write's outcome at the leader is unknown (it timed out, or leadership moved).
const IN_DOUBT: u8 = 3;

/// After the leader's speculative reply, how long the witnesses' acceptances are waited for, at
/// least, and in multiples of the time the reply took: past it a node is likely down and the
/// write goes the ordinary way.
const WITNESS_WAIT_MIN: Duration = Duration::from_millis(20);
const WITNESS_WAIT_FACTOR: u32 = 4;

/// How a fast-path attempt ended.
#[derive(Debug)]
pub enum FastOutcome {
    /// The leader's speculative reply, and a superquorum of witnesses holds the write; and the
    /// reply of its first application here, for a front end that cannot use the speculative one
    /// (see [`Curp::settled_fast`]).
    Fast(Value, AppliedHere),
    /// The leader answered once the write had applied (it could not speculate).
    Applied(Value),
    /// Neither: the reply comes when the write applies here (`applied`, if the leader has it in
    /// its log), or the write must be sent again the ordinary way; `in_doubt` if it may have
    /// executed.
    Slow {
        reason: SlowReason,
        in_doubt: bool,
        applied: Option<Pending<Value>>,
    },
}

/// The reply a write's first application on this node gives, when it comes.
#[derive(Debug)]
pub struct AppliedHere {
    client: ClientId,
    seq: u64,
    token: u64,
    rx: oneshot::Receiver<Value>,
}

/// A watcher's token, and where its write's reply goes.
type Watcher = (u64, oneshot::Sender<Value>);

/// Front ends waiting for particular writes to apply on this node, by RIFL id: the state
/// machine hands each the reply its write's first application gave (`KvState::with_curp`).
/// One write may be watched more than once at a time (a client that owns its id sends it again
/// through this node): each watcher has its own token.
#[derive(Default)]
pub struct ApplyWatch {
    waiting: Mutex<HashMap<(ClientId, u64), Vec<Watcher>>>,
    count: AtomicUsize,
    next_token: AtomicU64,
}

impl ApplyWatch {
    fn register(&self, client: ClientId, seq: u64) -> AppliedHere {
        let (tx, rx) = oneshot::channel();
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let mut waiting = self.waiting.lock().expect("not poisoned");
        waiting.entry((client, seq)).or_default().push((token, tx));
        self.count.store(waiting.len(), Ordering::Relaxed);
        AppliedHere { client, seq, token, rx }
    }

    fn forget(&self, client: ClientId, seq: u64, token: u64) {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        if let Some(watchers) = waiting.get_mut(&(client, seq)) {
            watchers.retain(|(t, _)| *t != token);
            if watchers.is_empty() {
                waiting.remove(&(client, seq));
            }
        }
        self.count.store(waiting.len(), Ordering::Relaxed);
    }

    /// The write `(client, seq)` applied here with `reply` (called by the state machine).
    pub fn applied(&self, client: ClientId, seq: u64, reply: &Value) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut waiting = self.waiting.lock().expect("not poisoned");
        for (_, tx) in waiting.remove(&(client, seq)).unwrap_or_default() {
            let _ = tx.send(reply.clone());
        }
        self.count.store(waiting.len(), Ordering::Relaxed);
    }

    /// The watched write's pending reply: a timeout if it has not applied within `within`.
    fn pending(self: &Arc<Self>, applied: AppliedHere, within: Duration) -> Pending<Value> {
        let (tx, pending) = oneshot::channel();
        let watch = self.clone();
        tokio::spawn(async move {
            let reply = match tokio::time::timeout(within, applied.rx).await {
                Ok(Ok(value)) => Ok(value),
                _ => {
                    watch.forget(applied.client, applied.seq, applied.token);
                    Err(NodeError::Timeout {
                        waited_ms: within.as_millis() as u64,
                    })
                }
            };
            let _ = tx.send(reply);
        });
        pending
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowReason {
    NoLeader,
    /// A witness refused the record (it conflicts with one it holds, or its term is old).
    WitnessRejected,
    /// Not enough acceptances in time.
    WitnessTimeout,
    /// The leader's answer did not come, or it was an error.
    LeaderUnanswered,
    /// A membership change is under way: no write completes in one round trip until it is done.
    MembershipChanging,
}

impl SlowReason {
    fn label(self) -> &'static str {
        match self {
            SlowReason::NoLeader => "no_leader",
            SlowReason::WitnessRejected => "witness_rejected",
            SlowReason::WitnessTimeout => "witness_timeout",
            SlowReason::LeaderUnanswered => "leader_unanswered",
            SlowReason::MembershipChanging => "membership_changing",
        }
    }
}

struct CurpMetrics {
    fast: Arc<Counter>,
    applied: Arc<Counter>,
    slow: Vec<(SlowReason, Arc<Counter>)>,
    recoveries: Arc<Counter>,
    recovered_writes: Arc<Counter>,
    pool_records: Arc<Gauge>,
    pool_bytes: Arc<Gauge>,
}

impl CurpMetrics {
    fn new() -> CurpMetrics {
        let reasons = [
            SlowReason::NoLeader,
            SlowReason::WitnessRejected,
            SlowReason::WitnessTimeout,
            SlowReason::LeaderUnanswered,
            SlowReason::MembershipChanging,
        ];
        CurpMetrics {
            fast: counter(
                "chorus_curp_fast_path_writes_total",
                "Writes answered after one round trip: a speculative reply and a witness superquorum",
            ),
            applied: counter(
                "chorus_curp_leader_applied_writes_total",
                "Fast-path attempts the leader answered only once applied (it could not speculate)",
            ),
            slow: reasons
                .into_iter()
                .map(|r| {
                    let c = labeled_counter(
                        "chorus_curp_slow_path_writes_total",
                        "Fast-path attempts sent again the ordinary way, by reason",
                        Some(("reason", r.label())),
                    );
                    (r, c)
                })
                .collect(),
            recoveries: counter(
                "chorus_curp_recoveries_total",
                "Recoveries this node ran as a new leader",
            ),
            recovered_writes: counter(
                "chorus_curp_recovered_writes_total",
                "Writes this node, as a new leader, proposed again from the witnesses",
            ),
            pool_records: gauge("chorus_curp_witness_records", "Records this node's witness holds"),
            pool_bytes: gauge(
                "chorus_curp_witness_bytes",
                "Bytes of records this node's witness holds",
            ),
        }
    }

    fn count(&self, outcome: &FastOutcome) {
        match outcome {
            FastOutcome::Fast(..) => self.fast.inc(),
            FastOutcome::Applied(_) => self.applied.inc(),
            FastOutcome::Slow { reason, .. } => {
                if let Some((_, c)) = self.slow.iter().find(|(r, _)| r == reason) {
                    c.inc();
                }
            }
        }
    }
}

/// A node's CURP: its witness, and the means to reach the leader and the other witnesses.
pub struct Curp {
    node: KvNode,
    witness: Arc<DurableWitness>,
    watch: Arc<ApplyWatch>,
    request_timeout: Duration,
    fast_path_min_rtt: Duration,
    metrics: CurpMetrics,
}

impl Curp {
    pub fn new(
        node: KvNode,
        witness: Arc<DurableWitness>,
        watch: Arc<ApplyWatch>,
        request_timeout: Duration,
        fast_path_min_rtt: Duration,
    ) -> Curp {
        Curp {
            node,
            witness,
            watch,
            request_timeout,
            fast_path_min_rtt,
            metrics: CurpMetrics::new(),
        }
    }

    /// Whether a write arriving here now should try the fast path: this node follows a leader
    /// at least `fast_path_min_rtt` away.
    pub fn fast_path_pays(&self) -> bool {
        let status = self.node.status();
        if status.leader_id == 0 || status.leader_id == status.id {
            return false;
        }
        let rtt = self.node.peer_calls().rtt(status.leader_id).unwrap_or_default();
        rtt >= self.fast_path_min_rtt
    }

    /// One fast-path attempt of the enveloped write `command` of `(client, seq)`, touching
    /// `keys`.
    pub async fn write(self: &Arc<Self>, command: Bytes, client: ClientId, seq: u64, keys: Vec<Bytes>) -> FastOutcome {
        let watched = self.watch.register(client, seq);
        let token = watched.token;
        let outcome = self.attempt(command, client, seq, keys, watched).await;
        self.metrics.count(&outcome);
        if let FastOutcome::Slow { applied: None, .. } | FastOutcome::Applied(_) = outcome {
            self.watch.forget(client, seq, token);
        }
        outcome
    }

    /// A fast-path reply the front end used: it no longer waits for the write's apply.
    pub fn settled_fast(&self, applied: AppliedHere) {
        self.watch.forget(applied.client, applied.seq, applied.token);
    }

    /// The reply of the write's first application here, or a timeout after the request timeout.
    pub fn applied_here(&self, applied: AppliedHere) -> Pending<Value> {
        self.watch.pending(applied, self.request_timeout)
    }

    async fn attempt(
        self: &Arc<Self>,
        command: Bytes,
        client: ClientId,
        seq: u64,
        keys: Vec<Bytes>,
        applied_here: AppliedHere,
    ) -> FastOutcome {
        let status = self.node.status();
        if status.leader_id == 0 {
            return FastOutcome::Slow {
                reason: SlowReason::NoLeader,
                in_doubt: false,
                applied: None,
            };
        }
        // The witnesses are the voters of the configuration this node has applied.
        let Some(witnesses) = self.node.settled_voters() else {
            return FastOutcome::Slow {
                reason: SlowReason::MembershipChanging,
                in_doubt: false,
                applied: None,
            };
        };
        let started = Instant::now();
        let record = Record::new(client, seq, status.term, keys, command.clone());
        let mut verdicts = self.record_everywhere(record, &witnesses);
        let leader = self.propose(status.leader_id, status.term, &witnesses, command);
        tokio::pin!(leader);
        // A leader that dies does not answer; its successor is known an election timeout later,
        // well before the request timeout.
        let moved = self.node.leadership_moved(status.leader_id, status.term);
        tokio::pin!(moved);
        let needed = superquorum(failures_tolerated(witnesses.len()));
        let (mut accepted, mut refused) = (0, 0);
        let mut speculated: Option<Value> = None;
        let mut witness_deadline: Option<tokio::time::Instant> = None;
        let mut leader_done = false;
        let mut verdicts_open = true;
        loop {
            if let Some(reply) = &speculated {
                if accepted >= needed {
                    return FastOutcome::Fast(reply.clone(), applied_here);
                }
            }
            if witnesses.len() - refused < needed {
                if speculated.is_none() && !leader_done {
                    // The leader's answer will say whether it could speculate; wait for it.
                    return match (&mut leader).await {
                        ProposeReply::Applied(reply) => FastOutcome::Applied(reply),
                        ProposeReply::Speculated(_) => {
                            self.slow_once_applied(SlowReason::WitnessRejected, applied_here)
                        }
                        ProposeReply::InDoubt => FastOutcome::Slow {
                            reason: SlowReason::LeaderUnanswered,
                            in_doubt: true,
                            applied: None,
                        },
                    };
                }
                return self.slow_once_applied(SlowReason::WitnessRejected, applied_here);
            }
            let deadline = witness_deadline.unwrap_or_else(|| tokio::time::Instant::now() + self.request_timeout);
            tokio::select! {
                verdict = verdicts.recv(), if verdicts_open => match verdict {
                    Some(true) => accepted += 1,
                    Some(false) => refused += 1,
                    None => verdicts_open = false,
                },
                answer = &mut leader, if !leader_done => {
                    leader_done = true;
                    match answer {
                        ProposeReply::Speculated(reply) => {
                            speculated = Some(reply);
                            let wait = (started.elapsed() * WITNESS_WAIT_FACTOR).max(WITNESS_WAIT_MIN);
                            witness_deadline = Some(tokio::time::Instant::now() + wait);
                        }
                        ProposeReply::Applied(reply) => return FastOutcome::Applied(reply),
                        ProposeReply::InDoubt => {
                            return FastOutcome::Slow { reason: SlowReason::LeaderUnanswered, in_doubt: true, applied: None }
                        }
                    }
                }
                _ = &mut moved, if !leader_done => {
                    return FastOutcome::Slow { reason: SlowReason::LeaderUnanswered, in_doubt: true, applied: None };
                }
                _ = tokio::time::sleep_until(deadline) => {
                    if speculated.is_some() {
                        return self.slow_once_applied(SlowReason::WitnessTimeout, applied_here);
                    }
                    return FastOutcome::Slow { reason: SlowReason::LeaderUnanswered, in_doubt: true, applied: None };
                }
            }
        }
    }

    /// The leader has the write in its log but the fast path did not complete: the reply is that
    /// of its first application here.
    fn slow_once_applied(&self, reason: SlowReason, applied_here: AppliedHere) -> FastOutcome {
        FastOutcome::Slow {
            reason,
            in_doubt: true,
            applied: Some(self.applied_here(applied_here)),
        }
    }

    /// Sends `record` to every one of `witnesses`; each verdict (accepted or not) arrives on the
    /// receiver as it comes.
    fn record_everywhere(self: &Arc<Self>, record: Record, witnesses: &[u64]) -> mpsc::Receiver<bool> {
        let (tx, rx) = mpsc::channel(witnesses.len());
        let mut body = Vec::new();
        file::encode(&Event::Accepted(record.clone()), &mut body);
        let body = Bytes::from(body);
        let own_id = self.node.status().id;
        for &voter in witnesses {
            let (curp, tx, body, record) = (self.clone(), tx.clone(), body.clone(), record.clone());
            tokio::spawn(async move {
                let accepted = if voter == own_id {
                    curp.witness.accept(record).await.is_ok()
                } else {
                    match curp
                        .node
                        .peer_calls()
                        .call(voter, durable_witness::SERVICE_RECORD, &body, curp.request_timeout)
                        .await
                    {
                        Ok(response) => decode_verdict(&response) == Some(Ok(())),
                        Err(_) => false,
                    }
                };
                let _ = tx.send(accepted).await;
            });
        }
        rx
    }

    async fn propose(&self, leader: u64, term: u64, witnesses: &[u64], command: Bytes) -> ProposeReply {
        if leader == self.node.status().id {
            return propose_locally(&self.node, command, term, witnesses.to_vec()).await;
        }
        let body = encode_propose(term, witnesses, &command);
        match self
            .node
            .peer_calls()
            .call(leader, SERVICE_PROPOSE, &body, self.request_timeout)
            .await
        {
            Ok(response) => ProposeReply::decode(&response).unwrap_or(ProposeReply::InDoubt),
            Err(_) => ProposeReply::InDoubt,
        }
    }

    /// `CURP PROPOSE` from a client that asked `witnesses` to record the write:
    /// `[SPECULATED reply]` or `[APPLIED reply]`.
    pub async fn propose_for_client(&self, command: Bytes, term: u64, mut witnesses: Vec<u64>) -> Value {
        witnesses.sort_unstable();
        match propose_locally(&self.node, command, term, witnesses).await {
            ProposeReply::Speculated(reply) => Value::array(vec![Value::bulk("SPECULATED"), reply]),
            ProposeReply::Applied(reply) => Value::array(vec![Value::bulk("APPLIED"), reply]),
            ProposeReply::InDoubt => Value::error("TRYAGAIN the write's outcome at the leader is unknown"),
        }
    }

    /// `CURP RECORD` from a client: this node's witness accepts the write or says why not.
    pub async fn record_for_client(&self, envelope: &Envelope, term: u64, keys: Vec<Bytes>, command: Bytes) -> Value {
        let record = Record::new(envelope.client, envelope.seq, term, keys, command);
        match self.witness.accept(record).await {
            Ok(()) => Value::ok(),
            Err(Rejection::Conflict) => Value::error("CONFLICT a held record touches one of its keys"),
            Err(Rejection::StaleTerm { collected_for }) => {
                Value::error(format!("STALETERM a leader of term {collected_for} has recovered"))
            }
            Err(Rejection::Full) => Value::error("FULL the witness holds as much as it may"),
        }
    }

    /// Publishes the witness's size.
    pub fn publish(&self) {
        let (records, bytes) = self.witness.size();
        self.metrics.pool_records.set(records as i64);
        self.metrics.pool_bytes.set(bytes as i64);
    }

    /// Runs for the node's life: whenever it becomes leader of a term, recovers for that term.
    pub async fn recover_as_leader(self: Arc<Self>) {
        let mut done_term = 0;
        loop {
            let status = self.node.status();
            if status.role == Role::Leader && status.term > done_term {
                match self.recover(status.term).await {
                    Ok(()) => done_term = status.term,
                    Err(e) => {
                        tracing::warn!(term = status.term, error = %e, "CURP recovery did not finish; trying again");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                continue;
            }
            self.publish();
            self.node.status_changed(Duration::from_millis(500)).await;
        }
    }

    async fn recover(&self, term: u64) -> Result<(), String> {
        let witnesses = loop {
            match self.node.curp_recovery_witnesses(term).await {
                Ok(witnesses) => break witnesses,
                // Not yet applied an entry of its term: it will have shortly.
                Err(NodeError::Refused(_)) => self.node.status_changed(Duration::from_millis(20)).await,
                Err(e) => return Err(e.to_string()),
            }
        };
        let (pools, records) = match &witnesses {
            Some(witnesses) => self.collect(term, witnesses).await?,
            None => (Vec::new(), Vec::new()),
        };
        let count = records.len();
        let mut commands: Vec<Bytes> = records.into_iter().map(|r| r.command).collect();
        commands.push(encode_curp_recovered(term));
        self.node
            .submit_recovery(term, witnesses, commands)
            .await
            .map_err(|e| e.to_string())?;
        self.metrics.recoveries.inc();
        self.metrics.recovered_writes.add(count as u64);
        tracing::info!(term, pools = pools.len(), writes = count, "CURP recovery proposed");
        Ok(())
    }

    /// Collects the pools of a majority of `witnesses` (this node's among them) for `term`, and
    /// the writes found in enough of them.
    async fn collect(&self, term: u64, witnesses: &[u64]) -> Result<(Vec<Vec<Record>>, Vec<Record>), String> {
        let f = failures_tolerated(witnesses.len());
        let own_id = self.node.status().id;
        assert!(
            witnesses.contains(&own_id),
            "a leader is a voter: node {own_id} leads with voters {witnesses:?}"
        );
        let mut pools = vec![self.witness.collect(term).await];
        let (tx, mut rx) = mpsc::channel(witnesses.len());
        for &voter in witnesses.iter().filter(|v| **v != own_id) {
            let tx = tx.clone();
            let calls = self.node.peer_calls().clone();
            let timeout = self.request_timeout;
            tokio::spawn(async move {
                let pool = calls
                    .call(voter, durable_witness::SERVICE_COLLECT, &term.to_le_bytes(), timeout)
                    .await
                    .ok()
                    .and_then(|body| decode_pool(&body));
                let _ = tx.send(pool).await;
            });
        }
        drop(tx);
        while pools.len() <= f {
            match rx.recv().await {
                Some(Some(pool)) => pools.push(pool),
                Some(None) => {}
                None => {
                    return Err(format!(
                        "collected {} witness pools of the {} needed",
                        pools.len(),
                        f + 1
                    ))
                }
            }
            if self.node.status().term != term {
                return Err("no longer the leader of this term".into());
            }
        }
        let records = recoverable(&pools, f).map_err(|e| format!("the witness pools are inconsistent: {e}"))?;
        Ok((pools, records))
    }
}

/// Failures `voters` witnesses tolerate.
fn failures_tolerated(voters: usize) -> usize {
    voters.saturating_sub(1) / 2
}

/// Most witnesses a `PROPOSE` names.
const MAX_WITNESSES: usize = 255;

/// A `PROPOSE` body: `[term u64][witnesses u8][witness id u64]…[command]`.
pub fn encode_propose(term: u64, witnesses: &[u64], command: &[u8]) -> Vec<u8> {
    assert!(witnesses.len() <= MAX_WITNESSES, "{} witnesses", witnesses.len());
    let mut body = Vec::with_capacity(9 + 8 * witnesses.len() + command.len());
    body.extend_from_slice(&term.to_le_bytes());
    body.push(witnesses.len() as u8);
    for id in witnesses {
        body.extend_from_slice(&id.to_le_bytes());
    }
    body.extend_from_slice(command);
    body
}

/// The term, witnesses and command of a `PROPOSE` body; `None` if it is malformed.
pub fn decode_propose(body: &[u8]) -> Option<(u64, Vec<u64>, &[u8])> {
    let (term, rest) = body.split_first_chunk::<8>()?;
    let (&count, mut rest) = rest.split_first()?;
    let mut witnesses = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (id, after) = rest.split_first_chunk::<8>()?;
        witnesses.push(u64::from_le_bytes(*id));
        rest = after;
    }
    Some((u64::from_le_bytes(*term), witnesses, rest))
}

fn decode_pool(body: &[u8]) -> Option<Vec<Record>> {
    let events = file::decode_all(body).ok()?;
    let mut ids = HashSet::new();
    let mut records = Vec::with_capacity(events.len());
    for event in events {
        let Event::Accepted(record) = event else {
            return None;
        };
        if !ids.insert(record.id()) {
            return None;
        }
        records.push(record);
    }
    Some(records)
}

/// The leader's answer to a fast-path write.
#[derive(Debug, PartialEq)]
enum ProposeReply {
    Speculated(Value),
    Applied(Value),
    InDoubt,
}

impl ProposeReply {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            ProposeReply::Speculated(v) => {
                out.push(SPECULATED);
                write_value(v, &mut out);
            }
            ProposeReply::Applied(v) => {
                out.push(APPLIED);
                write_value(v, &mut out);
            }
            ProposeReply::InDoubt => out.push(IN_DOUBT),
        }
        out
    }

    fn decode(body: &[u8]) -> Option<ProposeReply> {
        let (&kind, rest) = body.split_first()?;
        let value = || match parse_value(rest, &Limits::default()) {
            Ok(Some((value, used))) if used == rest.len() => Some(value),
            _ => None,
        };
        match kind {
            SPECULATED => Some(ProposeReply::Speculated(value()?)),
            APPLIED => Some(ProposeReply::Applied(value()?)),
            IN_DOUBT if rest.is_empty() => Some(ProposeReply::InDoubt),
            _ => None,
        }
    }
}

/// Submits `command` to this node's raft loop asking for a speculative reply as leader of `term`
/// whose voters are `witnesses` (sorted): that reply if it comes, else the applied one.
async fn propose_locally(node: &KvNode, command: Bytes, term: u64, witnesses: Vec<u64>) -> ProposeReply {
    let (applied, speculated) = match node.submit_speculative_write(command, term, witnesses).await {
        Ok(pair) => pair,
        Err(_) => return ProposeReply::InDoubt,
    };
    let applied = async {
        match applied.await {
            Ok(Ok(value)) => ProposeReply::Applied(value),
            _ => ProposeReply::InDoubt,
        }
    };
    tokio::pin!(applied);
    tokio::select! {
        biased;
        spec = speculated => match spec {
            Ok(value) => ProposeReply::Speculated(value),
            // Not speculated: the applied reply is the answer.
            Err(_) => applied.await,
        },
        reply = &mut applied => reply,
    }
}

/// Answers peers' requests to this node's services (the witness's `RECORD` and `COLLECT`, the
/// leader's `PROPOSE`) until the channel closes.
pub async fn serve_peer_requests(curp: Arc<Curp>, mut requests: mpsc::Receiver<PeerRequest>) {
    while let Some(request) = requests.recv().await {
        let curp = curp.clone();
        tokio::spawn(async move {
            if request.service == SERVICE_PROPOSE {
                let Some((term, witnesses, command)) = decode_propose(&request.body) else {
                    tracing::warn!(from = request.from, "malformed PROPOSE; ignored");
                    return;
                };
                let reply = propose_locally(&curp.node, Bytes::copy_from_slice(command), term, witnesses).await;
                request.respond(&reply.encode());
            } else {
                durable_witness::serve_one(&curp.witness, request).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watched_write_gets_the_reply_of_its_first_application_and_unwatched_ones_cost_nothing() {
        let watch = Arc::new(ApplyWatch::default());
        let client = ClientId {
            incarnation: 1 << 16,
            connection: 3,
        };
        watch.applied(client, 1, &Value::Integer(1));
        let first = watch.pending(watch.register(client, 2), Duration::from_secs(5));
        let again = watch.register(client, 2);
        let (again_client, again_seq, again_token) = (again.client, again.seq, again.token);
        let second = watch.pending(watch.register(client, 2), Duration::from_secs(5));
        watch.forget(again_client, again_seq, again_token);
        watch.applied(client, 2, &Value::Integer(2));
        watch.applied(client, 2, &Value::Integer(99));
        assert_eq!(first.await.unwrap().unwrap(), Value::Integer(2));
        assert_eq!(
            second.await.unwrap().unwrap(),
            Value::Integer(2),
            "each watcher is told"
        );
        assert_eq!(watch.count.load(Ordering::Relaxed), 0);
        let pending = watch.pending(watch.register(client, 3), Duration::from_millis(20));
        assert!(matches!(pending.await.unwrap(), Err(NodeError::Timeout { .. })));
        assert_eq!(watch.count.load(Ordering::Relaxed), 0, "a timed-out watch is forgotten");
    }

    #[test]
    fn propose_bodies_round_trip_and_short_ones_are_refused() {
        let body = encode_propose(7, &[1, 2, 5], b"SET k v");
        assert_eq!(decode_propose(&body), Some((7, vec![1, 2, 5], &b"SET k v"[..])));
        assert_eq!(
            decode_propose(&encode_propose(1, &[], b"")),
            Some((1, vec![], &b""[..]))
        );
        for cut in 0..9 + 3 * 8 {
            assert_eq!(decode_propose(&body[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn propose_replies_round_trip_and_nonsense_is_refused() {
        for reply in [
            ProposeReply::Speculated(Value::Integer(3)),
            ProposeReply::Applied(Value::error("ERR no")),
            ProposeReply::InDoubt,
        ] {
            assert_eq!(ProposeReply::decode(&reply.encode()), Some(reply));
        }
        assert_eq!(ProposeReply::decode(&[]), None);
        assert_eq!(ProposeReply::decode(&[SPECULATED]), None);
        assert_eq!(ProposeReply::decode(&[IN_DOUBT, 1]), None);
        assert_eq!(ProposeReply::decode(&[9, b':', b'1', b'\r', b'\n']), None);
    }
}
