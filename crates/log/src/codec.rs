//! The entry-codec seam: a transformation applied to entry payloads in append messages on their
//! way to a follower, and inverted on arrival before the message reaches raft.
//!
//! It runs on the raft loop, so it sees entries in log order, the applied stream and the log
//! itself; that is what a cache derived from the committed log (UniCache) needs. Raft never sees
//! encoded bytes: `decode` must restore exactly the bytes `encode` was given.

use std::any::Any;
use std::sync::Arc;

use bytes::Bytes;
use raft::eraftpb::{Entry, Message};
use raft::{GetEntriesContext, RaftLog};

use crate::batch::Origin;
use crate::storage::DiskStorage;

/// First byte of an entry the codec proposed for itself (client batches start with their
/// version, 1). Such entries are committed like any other, so every replica sees them at the
/// same index, and are applied to the codec only, never to the state machine.
pub const CODEC_ENTRY: u8 = 0xED;

/// Whatever a codec computes per command ahead of time (opaque to the raft loop).
pub type Prepared = Box<dyn Any + Send>;
/// Computes `Prepared` for a command; runs in the task that submits the write.
pub type Preparer = Arc<dyn Fn(&Bytes) -> Prepared + Send + Sync>;

/// Why an incoming append could not be decoded. The message is dropped; `reply`, when present,
/// goes back to the sender (a rejection that makes the leader resend, carrying feedback).
#[derive(Debug, thiserror::Error)]
#[error("cannot decode entries from peer {from}: {reason}")]
pub struct CodecError {
    pub from: u64,
    pub reason: String,
    pub reply: Option<Box<Message>>,
}

/// Read access to a node's raft log (stable and not yet persisted entries alike).
pub trait LogView {
    fn term(&self, index: u64) -> Option<u64>;
    fn last_index(&self) -> u64;
    /// Entries [low, high), or `None` if some of them are compacted away or not there.
    fn entries(&self, low: u64, high: u64) -> Option<Vec<Entry>>;
}

/// The raft loop's log.
pub struct RaftLogView<'a>(pub &'a RaftLog<DiskStorage>);

impl LogView for RaftLogView<'_> {
    fn term(&self, index: u64) -> Option<u64> {
        self.0.term(index).ok()
    }

    fn last_index(&self) -> u64 {
        self.0.last_index()
    }

    fn entries(&self, low: u64, high: u64) -> Option<Vec<Entry>> {
        if low >= high {
            return Some(Vec::new());
        }
        if high > self.last_index() + 1 {
            return None;
        }
        self.0.slice(low, high, None, GetEntriesContext::empty(false)).ok()
    }
}

pub trait EntryCodec: Send + 'static {
    /// Work on a command that can happen before it reaches the raft loop, in parallel across
    /// clients; the result comes back through `proposed`.
    fn preparer(&self) -> Option<Preparer> {
        None
    }

    /// This node proposed command `request_id` (in a batch from `origin`), prepared earlier.
    fn proposed(&mut self, _origin: Origin, _request_id: u64, _prepared: Prepared) {}

    /// Leader side: may rewrite the payloads of an outgoing append to peer `msg.to`; `commit` is
    /// the leader's commit index.
    fn encode(&mut self, msg: &mut Message, log: &dyn LogView, commit: u64);

    /// Follower side: restores the payloads of an incoming append from peer `msg.from`.
    fn decode(&mut self, msg: &mut Message, log: &dyn LogView) -> Result<(), CodecError>;

    /// Leader side: an append response arrived (feedback from the follower's codec rides in its
    /// `context`).
    fn observe_response(&mut self, _msg: &Message) {}

    /// A committed entry was applied; called for every entry, in index order.
    fn applied(&mut self, _entry: &Entry) {}

    /// The transport's measured round trip to `peer` (network and queues only), each tick.
    fn observe_link_rtt(&mut self, _peer: u64, _rtt_ms: f64) {}

    /// On the leader: an entry (starting with `CODEC_ENTRY`) the codec wants in the log.
    fn take_proposal(&mut self) -> Option<Bytes> {
        None
    }

    /// State to keep with a snapshot of the applied state (empty when there is none).
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Restores state saved by `snapshot` with the snapshot at `snapshot_index` (on start, or
    /// when a leader's snapshot is installed); `data` is empty if the snapshot has none.
    fn restore(&mut self, _data: &[u8], _snapshot_index: u64) -> Result<(), String> {
        Ok(())
    }
}

/// Sends entries as they are.
#[derive(Debug, Default)]
pub struct IdentityCodec;

impl EntryCodec for IdentityCodec {
    fn encode(&mut self, _msg: &mut Message, _log: &dyn LogView, _commit: u64) {}

    fn decode(&mut self, _msg: &mut Message, _log: &dyn LogView) -> Result<(), CodecError> {
        Ok(())
    }
}
