//! The replicated log: a raft node (TiKV's `raft` crate) with durable storage, a TCP peer
//! transport and an entry-codec seam. It knows nothing about what the commands mean.

pub mod backup;
pub mod batch;
pub mod codec;
mod compactor;
mod curp_leader;
pub mod drain;
pub mod error;
pub mod frame;
pub mod membership;
pub mod node;
pub mod peer_auth;
pub mod peer_stream;
mod raft_log;
pub mod replica_wait;
pub mod shipment;
pub mod storage;
pub mod transport;
pub mod unicache_codec;
mod wal_writer;
mod wire;

pub use codec::{CodecError, EntryCodec, IdentityCodec, LogView, RaftLogView, CODEC_ENTRY};
pub use error::{DecodeError, NodeError, StorageError};
pub use node::{
    start, BackupSource, FinishRead, NodeConfig, NodeHandle, NodeStatus, ReadConsistency, Role, SlowRead, StartError,
    StateMachine,
};
pub use shipment::SnapshotFiles;
pub use transport::{CallError, PeerCalls, PeerRequest};
pub use unicache_codec::{UniCacheCodec, UniCacheSettings};
