//! LDC (`--cache-mode ldc`, issue 14; the plan is `docs/ldc.md`): the nodes' object caches
//! managed as one logical cache. Each key has one owner, a hash of the key over the voters; only
//! the owner caches the key's value (a written value that was not cached leaves memory once
//! durable on the others: quick demotion), and a node that misses a key it does not own asks the
//! owner's cache (`FETCH`, over the peer transport) before it reads its own device. The owner
//! answers from memory only, and only with the version (the log index of the key's last write)
//! the asker's index holds: a remote hit can never be stale. A wrong or absent answer, or a slow
//! peer, costs a round trip and the device read the asker would have made anyway; a peer that
//! times out is skipped for a back-off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_log::{PeerCalls, PeerRequest, ReadConsistency};
use chorus_metrics::Counter;
use chorus_resp::Value;

use crate::command::Read;
use crate::server::KvNode;

/// The peer service the owner answers fetches with (CURP's are 1 to 3).
pub const SERVICE_FETCH: u8 = 4;
/// How long an asker waits for the owner; beyond it the device read is faster anyway.
const FETCH_TIMEOUT: Duration = Duration::from_millis(20);
/// How long a peer that did not answer in time is skipped.
const BACK_OFF: Duration = Duration::from_millis(500);

pub struct Ldc {
    me: u64,
    /// Every voter, sorted: the same list, so the same owners, on every node.
    voters: Vec<u64>,
    /// Set once the node runs: how to reach peers, and a handle to its runtime for the blocking
    /// threads that fetch.
    peers: OnceLock<(Arc<PeerCalls>, tokio::runtime::Handle)>,
    skipped_until: Mutex<HashMap<u64, Instant>>,
    metrics: LdcMetrics,
}

struct LdcMetrics {
    remote_hits: Arc<Counter>,
    remote_absent: Arc<Counter>,
    remote_failed: Arc<Counter>,
    fetched_bytes: Arc<Counter>,
}

impl Ldc {
    pub fn new(me: u64, mut voters: Vec<u64>) -> Arc<Ldc> {
        voters.sort_unstable();
        assert!(voters.contains(&me), "a node is one of the voters");
        let counter = chorus_metrics::counter;
        Arc::new(Ldc {
            me,
            voters,
            peers: OnceLock::new(),
            skipped_until: Mutex::new(HashMap::new()),
            metrics: LdcMetrics {
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
            },
        })
    }

    /// The node the store key `key` belongs to.
    pub fn owner(&self, key: &[u8]) -> u64 {
        let hash = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
        self.voters[(hash % self.voters.len() as u64) as usize]
    }

    pub fn owns(&self, key: &[u8]) -> bool {
        self.owner(key) == self.me
    }

    /// Called once the node runs.
    pub fn connect(&self, peers: Arc<PeerCalls>, runtime: tokio::runtime::Handle) {
        let _ = self.peers.set((peers, runtime));
    }

    /// On a blocking thread: the owner's cached value of `key` at `version`, if it has it and
    /// answers in time.
    pub fn fetch(&self, owner: u64, key: &[u8], version: u64) -> Option<Bytes> {
        let (peers, runtime) = self.peers.get()?;
        let now = Instant::now();
        if self
            .skipped_until
            .lock()
            .expect("not poisoned")
            .get(&owner)
            .is_some_and(|until| now < *until)
        {
            self.metrics.remote_failed.inc();
            return None;
        }
        let body = encode_fetch(key, version);
        match runtime.block_on(peers.call(owner, SERVICE_FETCH, &body, FETCH_TIMEOUT)) {
            Ok(response) => match decode_fetched(&response) {
                Some(Some(value)) => {
                    self.metrics.remote_hits.inc();
                    self.metrics.fetched_bytes.add(value.len() as u64);
                    Some(value)
                }
                Some(None) => {
                    self.metrics.remote_absent.inc();
                    None
                }
                None => {
                    tracing::warn!(peer = owner, "malformed FETCH response");
                    self.metrics.remote_failed.inc();
                    None
                }
            },
            Err(_) => {
                self.metrics.remote_failed.inc();
                self.skipped_until
                    .lock()
                    .expect("not poisoned")
                    .insert(owner, now + BACK_OFF);
                None
            }
        }
    }
}

/// A FETCH request: the version (8 bytes) and the store key.
fn encode_fetch(key: &[u8], version: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + key.len());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(key);
    out
}

fn decode_fetch(body: &[u8]) -> Option<(u64, &[u8])> {
    let (version, key) = body.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*version), key))
}

/// A FETCH response: 1 and the value, or 0 for "not here at that version".
fn encode_fetched(value: Option<&[u8]>) -> Vec<u8> {
    match value {
        Some(value) => [&[1u8][..], value].concat(),
        None => vec![0],
    }
}

fn decode_fetched(response: &[u8]) -> Option<Option<Bytes>> {
    match response.split_first()? {
        (1, value) => Some(Some(Bytes::copy_from_slice(value))),
        (0, []) => Some(None),
        _ => None,
    }
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
        let Some((version, key)) = decode_fetch(&request.body) else {
            tracing::warn!(from = request.from, "malformed FETCH; ignored");
            continue;
        };
        let read = Read::Cached {
            key: Bytes::copy_from_slice(key),
            version,
        };
        let node = node.clone();
        tokio::spawn(async move {
            let value = match node.read(read, ReadConsistency::Stale).await {
                Ok(Value::Bulk(Some(value))) => Some(value),
                _ => None,
            };
            request.respond(&encode_fetched(value.as_deref()));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_names_the_same_owner_and_owners_share_the_keys() {
        let nodes: Vec<Arc<Ldc>> = [3, 1, 2].iter().map(|me| Ldc::new(*me, vec![2, 3, 1])).collect();
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
    fn fetches_and_answers_round_trip_and_nonsense_is_refused() {
        assert_eq!(decode_fetch(&encode_fetch(b"key", 42)), Some((42, &b"key"[..])));
        assert_eq!(decode_fetch(&[1, 2, 3]), None);
        assert_eq!(
            decode_fetched(&encode_fetched(Some(b"v"))),
            Some(Some(Bytes::from("v")))
        );
        assert_eq!(decode_fetched(&encode_fetched(None)), Some(None));
        assert_eq!(decode_fetched(&[]), None);
        assert_eq!(decode_fetched(&[0, 1]), None);
        assert_eq!(decode_fetched(&[7]), None);
    }
}
