//! LDC (`--cache-mode ldc`, issue 14; the plan is `docs/ldc.md`): the nodes' object caches
//! managed as one logical cache. Each key has one owner, chosen by rendezvous hashing of the key over
//! the voters (as the membership changes, so do the owners of the keys a joining or leaving voter
//! gains or held: placement only, as versions keep answers right); only
//! the owner caches the key's value, besides the hot set the cost-benefit admission
//! (`admission.rs`) has every node cache (a written value that neither leaves memory once durable
//! on the others: quick demotion), and a node that misses a key it does not own asks the owner's
//! cache (`FETCH`, over the peer transport) before it reads its own device — while, as measured,
//! that is faster than the device. The owner
//! answers from memory only, and only with the version (the log index of the key's last write)
//! the asker's index holds: a remote hit can never be stale. A wrong or absent answer, or a slow
//! peer, costs a round trip and the device read the asker would have made anyway; a peer that
//! times out is skipped for a back-off. A remote hit of one value costs about what a device read
//! does over TCP, so the fetches waiting for one owner go as one call: while `MAX_CALLS_OUT`
//! calls are out, the next ones gather (up to `MAX_BATCH_KEYS`) and go together when one returns.

mod admission;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_log::{PeerCalls, PeerRequest, ReadConsistency};
use chorus_metrics::{Counter, Gauge};
use chorus_resp::Value;
use chorus_unicache::cache::splitmix;

pub use self::admission::ReadKind;
use self::admission::{Admission, CacheShape};
use crate::command::Read;
use crate::fnv::fnv1a_64;
use crate::server::KvNode;

/// The peer service the owner answers fetches with (CURP's are 1 to 3).
pub const SERVICE_FETCH: u8 = 4;
/// How long an asker waits for the owner; beyond it the device read is faster anyway.
const FETCH_TIMEOUT: Duration = Duration::from_millis(20);
/// How long a peer that did not answer in time is skipped.
const BACK_OFF: Duration = Duration::from_millis(500);
/// Most keys one FETCH asks for.
const MAX_BATCH_KEYS: usize = 64;
/// Most FETCH calls out to one owner at once; the fetches that come meanwhile gather into the
/// next call.
const MAX_CALLS_OUT: usize = 4;
/// How often the cost-benefit admission decides again.
const DECIDE_EVERY: Duration = Duration::from_secs(1);

/// A miss this node will ask its owner for (`Ldc::plan_fetch`).
pub struct Fetch {
    queue: Arc<Queue>,
    /// Its popularity class, when the cost-benefit admission runs.
    class: Option<admission::FetchClass>,
}

/// A fetch waiting to go to its owner, and where its answer goes.
struct Waiting {
    key: Bytes,
    version: u64,
    answer: tokio::sync::oneshot::Sender<Option<Bytes>>,
}

/// The fetches waiting for one owner; its sender task takes them a batch at a time.
#[derive(Default)]
struct Queue {
    waiting: Mutex<Vec<Waiting>>,
    ready: tokio::sync::Notify,
}

/// Who owns which keys: every voter, sorted (the same list, so the same owners, on every node
/// that applied the same configuration), and the fetches waiting for each other one.
struct Owners {
    voters: Vec<u64>,
    queues: HashMap<u64, Arc<Queue>>,
}

pub struct Ldc {
    me: u64,
    owners: RwLock<Arc<Owners>>,
    /// Set once the node runs: how to reach peers, and a handle to its runtime, where the
    /// senders of fetches run.
    peers: OnceLock<(Arc<PeerCalls>, tokio::runtime::Handle)>,
    skipped_until: Mutex<HashMap<u64, Instant>>,
    /// Which keys this node caches besides its own: the cost-benefit admission's hot set (none
    /// without it).
    admission: Mutex<Option<Admission>>,
    decided_at: Mutex<Instant>,
    metrics: LdcMetrics,
}

struct LdcMetrics {
    fetch_calls: Arc<Counter>,
    remote_hits: Arc<Counter>,
    remote_absent: Arc<Counter>,
    remote_failed: Arc<Counter>,
    fetched_bytes: Arc<Counter>,
    device_reads: Arc<Counter>,
    not_fetched: Arc<Counter>,
    replicated_objects: Arc<Gauge>,
    /// The admission's inputs: what each kind of read takes here, in ns.
    read_ns: [Arc<Gauge>; 3],
}

impl Ldc {
    /// `cost_benefit`: whether the cost-benefit admission runs (else only owners cache, and
    /// every miss of another node's key asks its owner).
    pub fn new(me: u64, mut voters: Vec<u64>, cost_benefit: bool) -> Arc<Ldc> {
        voters.sort_unstable();
        assert!(voters.contains(&me), "a node is one of the voters");
        let counter = chorus_metrics::counter;
        let queues = voters
            .iter()
            .filter(|id| **id != me)
            .map(|id| (*id, Arc::default()))
            .collect();
        Arc::new(Ldc {
            me,
            owners: RwLock::new(Arc::new(Owners { voters, queues })),
            peers: OnceLock::new(),
            skipped_until: Mutex::new(HashMap::new()),
            admission: Mutex::new(cost_benefit.then(Admission::default)),
            decided_at: Mutex::new(Instant::now()),
            metrics: LdcMetrics {
                fetch_calls: counter(
                    "chorus_ldc_fetch_calls_total",
                    "FETCH calls sent to owners (each carries the fetches that gathered meanwhile)",
                ),
                remote_hits: counter(
                    "chorus_ldc_remote_hits_total",
                    "Values of keys this node does not own served from the owner's cache",
                ),
                remote_absent: counter(
                    "chorus_ldc_remote_misses_total",
                    "Fetches the owner answered without the value at the asked version (not cached, or another version)",
                ),
                remote_failed: counter(
                    "chorus_ldc_remote_failures_total",
                    "Fetches that got no answer in time, or skipped a peer backing off",
                ),
                fetched_bytes: counter(
                    "chorus_ldc_fetched_bytes_total",
                    "Value bytes fetched from owners' caches",
                ),
                device_reads: counter(
                    "chorus_ldc_device_reads_total",
                    "Values read from this node's device (missed here, and not fetched from an owner)",
                ),
                read_ns: ["local_hit", "remote_hit", "device"].map(|kind| {
                    chorus_metrics::labeled_gauge(
                        "chorus_ldc_read_ns",
                        "Mean time of a read of a value, by where it came from (the cost-benefit admission's inputs)",
                        Some(("kind", kind)),
                    )
                }),
                not_fetched: counter(
                    "chorus_ldc_not_fetched_total",
                    "Misses of another node's key read from the device at once: the owner's cache, as measured, was no faster",
                ),
                replicated_objects: chorus_metrics::gauge(
                    "chorus_ldc_replicated_objects",
                    "Hottest objects the cost-benefit admission keeps in every node's cache (the rest, once, in their owner's)",
                ),
            },
        })
    }

    fn owners(&self) -> Arc<Owners> {
        self.owners.read().expect("not poisoned").clone()
    }

    /// The node the store key `key` belongs to.
    pub fn owner(&self, key: &[u8]) -> u64 {
        let owners = self.owners.read().expect("not poisoned");
        owner_among(fnv1a_64(key), &owners.voters)
    }

    /// The voters changed: keys are owned over the new ones from now on. Values cached by a
    /// node that no longer owns them leave as the cache evicts them.
    pub fn set_voters(self: &Arc<Self>, mut voters: Vec<u64>) {
        voters.sort_unstable();
        if voters.is_empty() || voters == self.owners().voters {
            return;
        }
        let (new, gone) = {
            let mut owners = self.owners.write().expect("not poisoned");
            let mut queues = owners.queues.clone();
            let gone: Vec<Arc<Queue>> = queues
                .extract_if(|id, _| !voters.contains(id))
                .map(|(_, queue)| queue)
                .collect();
            let new: Vec<u64> = voters
                .iter()
                .filter(|id| **id != self.me && !queues.contains_key(id))
                .copied()
                .collect();
            for id in &new {
                queues.insert(*id, Arc::default());
            }
            *owners = Arc::new(Owners { voters, queues });
            (new, gone)
        };
        // Their senders see they are gone and stop.
        for queue in gone {
            queue.ready.notify_one();
        }
        if let Some((_, runtime)) = self.peers.get() {
            for owner in new {
                runtime.spawn(self.clone().send_fetches(owner));
            }
        }
    }

    pub fn owns(&self, key: &[u8]) -> bool {
        self.owner(key) == self.me
    }

    /// Whether this node caches the store key `key`: its own keys, and the hot set every node
    /// replicates.
    pub fn caches(&self, key: &[u8]) -> bool {
        self.owns(key) || self.with_admission(|a| a.replicated(fnv1a_64(key))) == Some(true)
    }

    /// `f` on the cost-benefit admission, if it runs.
    fn with_admission<R>(&self, f: impl FnOnce(&mut Admission) -> R) -> Option<R> {
        self.admission.lock().expect("not poisoned").as_mut().map(f)
    }

    /// Counts a read of the store key `key` in the popularity the admission decides from.
    pub fn record_read(&self, key: &[u8]) {
        self.with_admission(|a| a.record_read(fnv1a_64(key)));
    }

    /// How long a read of a value took, by where the value came from.
    pub fn observe(&self, kind: ReadKind, took: Duration) {
        if kind == ReadKind::Device {
            self.metrics.device_reads.inc();
        }
        self.with_admission(|a| a.observe(kind, took));
    }

    /// Decides again which hot objects every node caches, at most every `DECIDE_EVERY`;
    /// `shape` is asked only then.
    pub fn reconsider(&self, shape: impl FnOnce() -> Option<(f64, f64)>) {
        if self.with_admission(|_| ()).is_none() {
            return;
        }
        let mut decided_at = self.decided_at.lock().expect("not poisoned");
        if decided_at.elapsed() < DECIDE_EVERY {
            return;
        }
        *decided_at = Instant::now();
        let Some((capacity_objects, keys)) = shape() else {
            return;
        };
        let shape = CacheShape {
            nodes: self.owners().voters.len(),
            capacity_objects,
            keys,
        };
        let replicated = self.with_admission(|admission| {
            for (gauge, us) in self.metrics.read_ns.iter().zip(admission.measured_us()) {
                if let Some(us) = us {
                    gauge.set((us * 1e3) as i64);
                }
            }
            admission.reconsider(shape)
        });
        if let Some(Some(replicated)) = replicated {
            self.metrics.replicated_objects.set(replicated as i64);
        }
    }

    /// Called once the node runs: starts a sender of batched fetches per peer.
    pub fn connect(self: &Arc<Self>, peers: Arc<PeerCalls>, runtime: tokio::runtime::Handle) {
        if self.peers.set((peers, runtime.clone())).is_err() {
            return;
        }
        for owner in self.owners().queues.keys() {
            runtime.spawn(self.clone().send_fetches(*owner));
        }
    }

    /// Whether a miss of `key` is worth asking its owner for (another node, which this one can
    /// reach, not backing off, and, as measured, faster than the device); decided on the raft
    /// loop, so that a miss read from the device at once costs no extra hop.
    pub fn plan_fetch(&self, key: &[u8]) -> Option<Fetch> {
        self.peers.get()?;
        let owners = self.owners();
        let owner = owner_among(fnv1a_64(key), &owners.voters);
        // No queue for this node itself: its own keys are read from its device.
        let queue = owners.queues.get(&owner)?.clone();
        if self.backing_off(owner) {
            self.metrics.remote_failed.inc();
            return None;
        }
        let class = match self.with_admission(|a| a.worth_fetching(fnv1a_64(key))) {
            Some((false, _)) => {
                self.metrics.not_fetched.inc();
                return None;
            }
            Some((true, class)) => Some(class),
            None => None,
        };
        Some(Fetch { queue, class })
    }

    /// The owner's cached value of `key` at `version`, if it has it and answers in time.
    pub async fn fetch(&self, fetch: Fetch, key: Bytes, version: u64) -> Option<Bytes> {
        let asked_at = Instant::now();
        let (answer, answered) = tokio::sync::oneshot::channel();
        fetch
            .queue
            .waiting
            .lock()
            .expect("not poisoned")
            .push(Waiting { key, version, answer });
        fetch.queue.ready.notify_one();
        // A batch may wait for a call out before it: up to two timeouts.
        let value = match tokio::time::timeout(2 * FETCH_TIMEOUT, answered).await {
            Ok(Ok(value)) => value,
            _ => None,
        };
        self.with_admission(|admission| {
            if let Some(class) = fetch.class {
                admission.fetched(class, value.is_some());
            }
            if value.is_some() {
                admission.observe(ReadKind::RemoteHit, asked_at.elapsed());
            }
        });
        value
    }

    fn backing_off(&self, owner: u64) -> bool {
        self.skipped_until
            .lock()
            .expect("not poisoned")
            .get(&owner)
            .is_some_and(|until| Instant::now() < *until)
    }

    /// Sends the fetches waiting for `owner`, a batch per call, up to `MAX_CALLS_OUT` calls at
    /// once: a fetch waits for a free call, not for the round trip of the one before it.
    async fn send_fetches(self: Arc<Self>, owner: u64) {
        let Some(queue) = self.owners().queues.get(&owner).cloned() else {
            return;
        };
        let (peers, _) = self.peers.get().expect("connected").clone();
        let calls_out = Arc::new(tokio::sync::Semaphore::new(MAX_CALLS_OUT));
        loop {
            queue.ready.notified().await;
            if !self.owners().queues.get(&owner).is_some_and(|q| Arc::ptr_eq(q, &queue)) {
                // No longer a voter: the fetches still waiting go to the device.
                for waiting in queue.waiting.lock().expect("not poisoned").drain(..) {
                    let _ = waiting.answer.send(None);
                }
                return;
            }
            loop {
                let call = calls_out.clone().acquire_owned().await.expect("never closed");
                let batch: Vec<Waiting> = {
                    let mut waiting = queue.waiting.lock().expect("not poisoned");
                    let take = waiting.len().min(MAX_BATCH_KEYS);
                    waiting.drain(..take).collect()
                };
                if batch.is_empty() {
                    break;
                }
                let (ldc, peers) = (self.clone(), peers.clone());
                tokio::spawn(async move {
                    ldc.call_owner(&peers, owner, batch).await;
                    drop(call);
                });
            }
        }
    }

    /// One FETCH call: `batch` asked of `owner`, each fetch answered with its value or `None`.
    async fn call_owner(&self, peers: &PeerCalls, owner: u64, batch: Vec<Waiting>) {
        let body = encode_fetch(batch.iter().map(|w| (&w.key[..], w.version)));
        self.metrics.fetch_calls.inc();
        let answers = match peers.call(owner, SERVICE_FETCH, &body, FETCH_TIMEOUT).await {
            Ok(response) => decode_fetched(&response).filter(|values| values.len() == batch.len()),
            Err(_) => {
                self.skipped_until
                    .lock()
                    .expect("not poisoned")
                    .insert(owner, Instant::now() + BACK_OFF);
                None
            }
        };
        let Some(values) = answers else {
            self.metrics.remote_failed.add(batch.len() as u64);
            for waiting in batch {
                let _ = waiting.answer.send(None);
            }
            return;
        };
        for (waiting, value) in batch.into_iter().zip(values) {
            match &value {
                Some(value) => {
                    self.metrics.remote_hits.inc();
                    self.metrics.fetched_bytes.add(value.len() as u64);
                }
                None => self.metrics.remote_absent.inc(),
            }
            let _ = waiting.answer.send(value);
        }
    }
}

/// The owner of the key hashed to `key_hash` among `voters`, by rendezvous (highest random
/// weight) hashing: each voter draws a weight from the key and its id, the highest owns the key.
/// A voter joining takes about 1/N of the keys from the others and one leaving hands on only its
/// own, where `hash mod N` would move most keys, and with them most of what the caches hold.
fn owner_among(key_hash: u64, voters: &[u64]) -> u64 {
    voters
        .iter()
        .copied()
        .max_by_key(|id| (splitmix(key_hash ^ splitmix(*id)), *id))
        .expect("a cluster has a voter")
}

/// A FETCH request: per key, its version (8 bytes), its length (2 bytes) and the store key.
pub fn encode_fetch<'a>(keys: impl Iterator<Item = (&'a [u8], u64)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, version) in keys {
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(key);
    }
    out
}

pub fn decode_fetch(mut body: &[u8]) -> Option<Vec<(Bytes, u64)>> {
    let mut keys = Vec::new();
    while !body.is_empty() {
        let (version, rest) = body.split_first_chunk::<8>()?;
        let (len, rest) = rest.split_first_chunk::<2>()?;
        let (key, rest) = rest.split_at_checked(u16::from_le_bytes(*len) as usize)?;
        keys.push((Bytes::copy_from_slice(key), u64::from_le_bytes(*version)));
        body = rest;
    }
    (!keys.is_empty() && keys.len() <= MAX_BATCH_KEYS).then_some(keys)
}

/// A FETCH response: per key asked, 1, the value's length (4 bytes) and the value, or 0 for
/// "not here at that version".
pub fn encode_fetched(values: &[Option<Bytes>]) -> Vec<u8> {
    let mut out = Vec::new();
    for value in values {
        match value {
            Some(value) => {
                out.push(1);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            None => out.push(0),
        }
    }
    out
}

pub fn decode_fetched(mut response: &[u8]) -> Option<Vec<Option<Bytes>>> {
    let mut values = Vec::new();
    while let Some((found, rest)) = response.split_first() {
        response = match found {
            0 => {
                values.push(None);
                rest
            }
            1 => {
                let (len, rest) = rest.split_first_chunk::<4>()?;
                let (value, rest) = rest.split_at_checked(u32::from_le_bytes(*len) as usize)?;
                values.push(Some(Bytes::copy_from_slice(value)));
                rest
            }
            _ => return None,
        };
    }
    Some(values)
}

/// Answers peers' FETCHes from this node's cache (a read on the raft loop that never touches
/// the disk), and hands every other request to `others` (CURP's services), until the channel
/// closes.
pub async fn serve_peer_requests(
    node: KvNode,
    mut requests: tokio::sync::mpsc::Receiver<PeerRequest>,
    others: Option<tokio::sync::mpsc::Sender<PeerRequest>>,
) {
    while let Some(request) = requests.recv().await {
        if request.service != SERVICE_FETCH {
            if let Some(others) = &others {
                let _ = others.try_send(request);
            }
            continue;
        }
        let Some(keys) = decode_fetch(&request.body) else {
            tracing::warn!(from = request.from, "malformed FETCH; ignored");
            continue;
        };
        let asked = keys.len();
        let node = node.clone();
        tokio::spawn(async move {
            let values = match node.read(Read::Cached(keys), ReadConsistency::Stale).await {
                Ok(Value::Array(Some(values))) => values
                    .into_iter()
                    .map(|value| match value {
                        Value::Bulk(value) => value,
                        _ => None,
                    })
                    .collect(),
                _ => vec![None; asked],
            };
            request.respond(&encode_fetched(&values));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_names_the_same_owner_and_owners_share_the_keys() {
        let nodes: Vec<Arc<Ldc>> = [3, 1, 2].iter().map(|me| Ldc::new(*me, vec![2, 3, 1], true)).collect();
        let mut owned = [0usize; 3];
        for i in 0..3_000 {
            let key = format!("suser{i}");
            let owner = nodes[0].owner(key.as_bytes());
            assert!(nodes.iter().all(|n| n.owner(key.as_bytes()) == owner));
            assert_eq!(nodes.iter().filter(|n| n.owns(key.as_bytes())).count(), 1);
            owned[owner as usize - 1] += 1;
        }
        assert!(owned.iter().all(|n| (800..1_200).contains(n)), "{owned:?}");
    }

    #[test]
    fn owners_follow_the_voters_as_membership_changes() {
        let node = Ldc::new(1, vec![1, 2, 3], false);
        let owner_of = |i: usize| node.owner(format!("k{i}").as_bytes());
        node.set_voters(vec![4, 2, 1, 3, 5]);
        let grown: Vec<u64> = (0..1_000).map(owner_of).collect();
        assert!(grown.contains(&4) && grown.contains(&5), "new voters own keys");
        assert_eq!(node.owners().queues.len(), 4, "a fetch queue per other voter");
        node.set_voters(vec![1, 5]);
        assert!((0..1_000).map(owner_of).all(|owner| owner == 1 || owner == 5));
        assert_eq!(node.owners().queues.keys().copied().collect::<Vec<_>>(), vec![5]);
        node.set_voters(Vec::new());
        assert_eq!(
            node.owners().voters,
            vec![1, 5],
            "a configuration without voters is not taken"
        );
    }

    #[test]
    fn a_voter_joining_or_leaving_moves_only_its_share_of_the_keys() {
        let keys: Vec<String> = (0..20_000).map(|i| format!("suser{i}")).collect();
        let owners = |voters: &[u64]| -> Vec<u64> {
            keys.iter()
                .map(|k| owner_among(fnv1a_64(k.as_bytes()), voters))
                .collect()
        };
        let three = owners(&[1, 2, 3]);
        let four = owners(&[1, 2, 3, 4]);
        let moved: Vec<usize> = (0..keys.len()).filter(|i| three[*i] != four[*i]).collect();
        assert!(moved.iter().all(|i| four[*i] == 4), "keys move only to the new voter");
        let share = moved.len() as f64 / keys.len() as f64;
        assert!(
            (0.22..0.28).contains(&share),
            "a quarter of the keys move to a fourth voter: {share}"
        );
        let without_two = owners(&[1, 3, 4]);
        for i in 0..keys.len() {
            if four[i] != 2 {
                assert_eq!(without_two[i], four[i], "only the leaving voter's keys move");
            } else {
                assert_ne!(without_two[i], 2);
            }
        }
        let mut owned = [0usize; 4];
        for owner in without_two {
            owned[owner as usize - 1] += 1;
        }
        assert!(
            owned[0] > 6_000 && owned[2] > 6_000 && owned[3] > 6_000,
            "the survivors share the leaver's keys: {owned:?}"
        );
    }

    #[test]
    fn fetches_and_answers_round_trip_and_nonsense_is_refused() {
        let keys = [(&b"key"[..], 42), (&b""[..], 7)];
        let body = encode_fetch(keys.into_iter());
        assert_eq!(
            decode_fetch(&body),
            Some(vec![(Bytes::from("key"), 42), (Bytes::new(), 7)])
        );
        assert_eq!(decode_fetch(&body[..body.len() - 1]), None, "truncated");
        assert_eq!(decode_fetch(&[]), None, "asks for nothing");
        let values = vec![Some(Bytes::from("v")), None, Some(Bytes::new())];
        assert_eq!(decode_fetched(&encode_fetched(&values)), Some(values));
        assert_eq!(
            decode_fetched(&[1, 9, 0, 0, 0]),
            None,
            "a value shorter than its length"
        );
        assert_eq!(decode_fetched(&[7]), None);
    }
}
