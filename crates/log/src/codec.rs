//! The entry-codec seam: a transformation applied to entry payloads in append messages on their
//! way to a follower, and inverted on arrival before the message reaches raft.
//!
//! It runs on the raft loop, so it sees entries in log order and knows the commit index; that is
//! what a cache derived from the committed log (UniCache) needs. Raft itself never sees encoded
//! bytes: `decode` must restore exactly the bytes `encode` was given.

use raft::eraftpb::Message;

#[derive(Debug, thiserror::Error)]
#[error("cannot decode entries from peer {from}: {reason}")]
pub struct CodecError {
    pub from: u64,
    pub reason: String,
}

pub trait EntryCodec: Send + 'static {
    /// Transforms the entries of an outgoing append message to peer `msg.to`.
    fn encode(&mut self, msg: &mut Message, commit_index: u64);

    /// Restores the entries of an incoming append message from peer `msg.from`. On error the
    /// message is dropped (raft retransmits) and the error is counted and logged.
    fn decode(&mut self, msg: &mut Message, commit_index: u64) -> Result<(), CodecError>;
}

/// Sends entries as they are.
#[derive(Debug, Default)]
pub struct IdentityCodec;

impl EntryCodec for IdentityCodec {
    fn encode(&mut self, _msg: &mut Message, _commit_index: u64) {}

    fn decode(&mut self, _msg: &mut Message, _commit_index: u64) -> Result<(), CodecError> {
        Ok(())
    }
}
