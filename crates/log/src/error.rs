use std::path::{Path, PathBuf};

/// Malformed bytes from disk or the network.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated: wanted {wanted} bytes, {available} available")]
    Truncated { wanted: usize, available: usize },
    #[error("{0} unexpected trailing bytes")]
    TrailingBytes(usize),
    #[error("bad magic or unsupported version")]
    BadMagic,
    /// Recognised, but written by a build that speaks another version of the format: refused
    /// rather than misread (a node of another Chorus version, mid-upgrade).
    #[error("{what} version {found}; this build reads version {supported} only: run one Chorus version on every node (upgrade the older ones)")]
    UnsupportedVersion {
        what: &'static str,
        found: u64,
        supported: u64,
    },
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("invalid {0}")]
    Invalid(&'static str),
    #[error("length {size} exceeds the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
}

/// Errors opening or writing the raft log storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "corrupt {path} at byte {offset}: {reason}. This is not a torn write at the end of the log; \
         move the data directory aside and let the node catch up from its peers"
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: DecodeError,
    },
    #[error("inconsistent log: {0}")]
    Inconsistent(String),
    #[error("no space left on the device holding {path}; nothing was appended")]
    NoSpace { path: PathBuf },
}

/// Wraps an I/O error with the path it concerns; the path is copied only if there is an error.
pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Why a request to the replicated log did not complete. Every variant says whether retrying
/// is safe, because clients must know if a write may have happened.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NodeError {
    #[error("no leader elected within {waited_ms} ms; the request was not applied, retry")]
    NoLeader { waited_ms: u64 },
    /// A linearizable read the leader did not confirm (ReadIndex) in time: it is overloaded or
    /// its leadership is moving.
    #[error("the leader did not confirm a read within {waited_ms} ms (overloaded, or leadership moving); nothing was read, retry")]
    ReadUnconfirmed { waited_ms: u64 },
    #[error("not committed within {waited_ms} ms; the write may or may not have been applied")]
    Timeout { waited_ms: u64 },
    #[error("leadership changed before the write committed; it may or may not have been applied")]
    LeaderChanged,
    #[error("node is overloaded; the request was not applied, retry")]
    Overloaded,
    #[error("node is shutting down; the request may not have been applied")]
    ShuttingDown,
    #[error("node {0} is not a voter of this cluster")]
    NotAVoter(u64),
    #[error(
        "the disk on node {node_id} is full; the write was not applied. Free space on it (writes \
         resume by themselves) or make another node the leader"
    )]
    DiskFull { node_id: u64 },
    /// A request this node cannot serve as asked; the text says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// A membership change this node will not make as asked; the text says why and what to do.
    #[error("membership change refused: {0}")]
    MembershipRefused(String),
}
