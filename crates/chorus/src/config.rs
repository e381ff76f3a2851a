//! Server configuration: one TOML file per node, every key also a command-line flag.
//!
//! Each key is declared once below; the macro derives the flag, the TOML field, the merge
//! (flag over file over default) and the resolved config.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};

macro_rules! server_options {
    ($( $(#[doc = $doc:literal])+ $name:ident : $ty:ty = $default:expr ; )*) => {
        /// Every server setting as optional, as read from a file or flags.
        #[derive(clap::Args, serde::Deserialize, Debug, Default, Clone)]
        #[serde(deny_unknown_fields)]
        pub struct ServerOptions {
            $( $(#[doc = $doc])+ #[arg(long)] pub $name: Option<$ty>, )*
        }

        /// Every server setting, resolved.
        #[derive(Debug, Clone)]
        pub struct ServerConfig {
            $( $(#[doc = $doc])+ pub $name: $ty, )*
        }

        impl ServerOptions {
            /// Settings from `self`, falling back to `base` for any it leaves unset.
            pub fn over(self, base: ServerOptions) -> ServerOptions {
                ServerOptions { $( $name: self.$name.or(base.$name), )* }
            }

            pub fn resolve(self) -> ServerConfig {
                ServerConfig { $( $name: self.$name.unwrap_or_else(|| $default), )* }
            }
        }
    };
}

server_options! {
    /// This node's id; must appear in `peers`.
    id: u64 = 1;
    /// Directory for the raft log, snapshots and (under `state/`) the key-value segments.
    data_dir: PathBuf = PathBuf::from("chorus-data");
    /// Address for Redis clients (RESP).
    resp_addr: SocketAddr = "127.0.0.1:6379".parse().expect("valid");
    /// Address for PostgreSQL clients of `chorus sql`.
    pg_addr: SocketAddr = "127.0.0.1:5433".parse().expect("valid");
    /// Address for the Prometheus metrics endpoint (GET /metrics).
    metrics_addr: SocketAddr = "127.0.0.1:9379".parse().expect("valid");
    /// Every voter as id=host:port (peer port), comma separated, this node included.
    peers: String = "1=127.0.0.1:7379".into();
    /// Join a running cluster: start with no configuration and wait to be added (`chorus cluster
    /// add-node`, or POST /members/learner on the leader's metrics port); `peers` then lists the
    /// members to reach and this node. Ignored once the node has data: the membership it
    /// recorded wins over `peers` from then on.
    join: bool = false;
    /// Raft tick length in milliseconds.
    tick_ms: u64 = 100;
    /// Election timeout in ticks (randomised between this and twice this).
    election_ticks: usize = 10;
    /// Leader heartbeat interval in ticks.
    heartbeat_ticks: usize = 2;
    /// Most client commands in one raft entry.
    max_batch_commands: usize = 4096;
    /// Most bytes of commands in one raft entry.
    max_batch_bytes: usize = 4 * 1024 * 1024;
    /// Group commit: while this many of the leader's entries are uncommitted, new writes wait
    /// and go out together in the next entry once one commits (a full batch never waits). 1
    /// halves the fsyncs and peer messages per write under load and costs a lone client nothing.
    group_commit_entries: u64 = 1;
    /// Longest a write waits for group commit before it is proposed anyway. On a wide-area link
    /// a commit takes a round trip, and writes then pipeline instead of waiting for it.
    group_commit_wait_us: u64 = 2000;
    /// When an entry commits, the leader waits up to this long, from when its replies are out, for
    /// the clients it has just answered to send their next writes, so they share the next entry
    /// rather than wait for the one after it (0: propose at once). 500 µs leaves room for clients
    /// that share two cores with the nodes to read a reply and send again; a write arriving
    /// sooner ends the wait at once.
    group_commit_linger_us: u64 = 500;
    /// How long a request waits for a leader before a retryable TRYAGAIN error.
    leader_wait_ms: u64 = 3000;
    /// How long a write may take to apply before a TIMEOUT (outcome unknown) error.
    request_timeout_ms: u64 = 5000;
    /// On SIGTERM (or an interrupt) the node takes no new clients and lets those it has finish
    /// what they began — a SQL transaction, a key-value command — for up to this long, then
    /// hands the leadership over if it leads, and exits; a second signal exits at once. `chorus cluster remove-node` makes the node a
    /// learner first, so what it finishes still learns its outcome from the log.
    shutdown_drain_ms: u64 = 5000;
    /// The leader serves linearizable reads locally while it holds a read lease, renewed by a
    /// round of heartbeats every half lease, instead of a round per batch of reads. Assumes the
    /// nodes' clocks run at rates within 5% of each other; the lease lasts
    /// (election_ticks - 1) x tick_ms x 0.95 from when its round began. See docs/reliability.md.
    read_lease: bool = false;
    /// CURP, `on` or `off`: writes complete in one round trip from any node when the leader can
    /// answer them before they commit and every witness (all 3 of 3, 4 of 5) holds them; a new
    /// leader recovers them from the witnesses. Every node of a cluster must agree. See
    /// docs/reliability.md, "CURP".
    curp: String = "off".into();
    /// With CURP on, a follower's clients' writes take the fast path only while the leader is at
    /// least this far away (measured round trip, µs): closer, the ordinary path is as fast and
    /// costs less (0: always, as the chaos harness runs it).
    curp_fast_path_min_rtt_us: u64 = 1000;
    /// How `chorus sql` replicates a transaction: "active" (the statements it ran, made
    /// deterministic; a statement that cannot be is refused), "passive" (its write-set, the rows
    /// it changed; schema changes travel as statements), "auto" (statements, or the write-set
    /// when a statement cannot be made deterministic) or "hybrid" (every node executes its own
    /// clients' transactions and sends their write-sets, certified by conflict class in log
    /// order; needs sql_conflict_classes and the SQLite engine). Nodes may differ among active,
    /// passive and auto (each replica applies both); hybrid is all nodes or none.
    sql_mode: String = "active".into();
    /// Conflict classes for `chorus sql`, as `table.column,…`: per table, the column whose value
    /// is a row's class (TPC-C: the warehouse). Transactions are labelled with the classes their
    /// statements touch (metric chorus_sql_transactions_labelled_total), which hybrid
    /// replication certifies by. Empty: no labels.
    sql_conflict_classes: String = String::new();
    /// Hybrid: a transaction whose first statement touches only classes another node owns is
    /// forwarded to that node and runs there (false: it runs where its client is, borrowing
    /// the classes through the log).
    sql_forward: bool = true;
    /// The database `chorus sql` replicates into: "sqlite" (embedded, under data_dir/sql) or
    /// "postgres" (the PostgreSQL server `sql_postgres` names, one per node; passive mode reads
    /// its logical decoding: wal_level = logical).
    sql_engine: String = "sqlite".into();
    /// With sql_engine "postgres": the node's own PostgreSQL server, as a connection string
    /// (`host=127.0.0.1 port=5433 user=postgres dbname=postgres`). `chorus cluster start --sql
    /// -- --sql-engine postgres` starts one per node and sets it.
    sql_postgres: String = String::new();
    /// With sql_engine "postgres": where pg_dump and pg_restore are (default: the newest
    /// PostgreSQL under /usr/lib/postgresql).
    sql_postgres_bin: String = String::new();
    /// Snapshot the state machine after this many applied entries.
    snapshot_interval_entries: u64 = 20_000;
    /// Snapshot the state machine after this many applied bytes of commands.
    snapshot_interval_bytes: u64 = 64 * 1024 * 1024;
    /// Bytes of memory the key-value store's object cache of values takes (each value charged
    /// with its key and ~200 bytes of bookkeeping); the rest are read from segment files when
    /// asked for.
    cache_bytes: usize = 256 * 1024 * 1024;
    /// Read values that miss the cache past the page cache (O_DIRECT) where the file system allows
    /// it: each miss is a device read, as when the data does not fit in memory.
    value_direct_io: bool = false;
    /// For experiments only: µs added to each GET's read of a value from a segment file, as if
    /// the device were slower (a network-attached volume takes about 500-2000 µs). 0: none.
    emulated_device_read_us: u64 = 0;
    /// "siloed" (each node caches what it writes and reads) or "ldc" (the nodes' caches as one:
    /// each key is cached only by its owner, and a miss of another node's key asks its cache
    /// before the device; see docs/ldc.md). Every node of a cluster must agree.
    cache_mode: String = "siloed".into();
    /// With cache_mode "ldc": "cost-benefit" (each node also caches the hottest objects it does
    /// not own, as many as its measured costs of local hits, remote hits and device reads say
    /// pay, and asks owners only while that is faster than its device) or "owners" (only owners
    /// cache, and every miss of another node's key asks its owner first).
    ldc_admission: String = "cost-benefit".into();
    /// How the key-value state is persisted: "reduced" (each batch of committed writes keeps only
    /// the last write of each key; a cleaner merges segments) or "full" (every committed write is
    /// kept and replayed at start-up, never cleaned: the standard log, a baseline for measuring).
    storage: String = "reduced".into();
    /// Directories, comma-separated, the key-value segments are spread over, each with its own
    /// writer thread — on separate devices the writes run in parallel (default: `data_dir/state`
    /// alone). The first also takes the cleaner's merges and installed segments. A directory may
    /// be added between runs, never taken away or reordered.
    data_dirs: String = String::new();
    /// Committed writes reduced into one segment (only the last write of each key is kept).
    reduction_batch_writes: u64 = 1_000;
    /// Key and value bytes of committed writes reduced into one segment.
    reduction_batch_bytes: u64 = 4 * 1024 * 1024;
    /// The cleaner merges the key-value segments once this share of their bytes is dead
    /// (overwritten or deleted records)...
    min_cleanable_dirty_ratio: f64 = 0.5;
    /// ...and at least this many bytes are: a small data set is not cleaned while its segments
    /// are still half live, each merge rewriting that half (Bitcask's dead-bytes trigger).
    min_cleanable_dead_bytes: u64 = 64 * 1024 * 1024;
    /// Once more than `consolidate_above_segments` key-value segments are smaller than half this,
    /// the cleaner merges runs of them into one of about this size, so start-up, catch-up and the
    /// directory deal with a bounded number of files rather than one per batch (0: never).
    /// Segments under a 256th of this are merged in runs whatever their number.
    consolidated_segment_bytes: u64 = 8 * 1024 * 1024;
    /// How many small segments are left to die (most do under overwrites) before the cleaner
    /// consolidates the oldest of them: once writes pause for a tick, or at twice this count
    /// while they do not.
    consolidate_above_segments: usize = 512;
    /// Most bytes a merge of dirty segments keeps (about the largest segment it writes): what a
    /// merge holds in memory is the index of that much.
    max_merged_segment_bytes: u64 = 64 * 1024 * 1024;
    /// Most bytes per second the cleaner reads while merging segments.
    cleaner_read_bytes_per_sec: u64 = 64 * 1024 * 1024;
    /// Entries kept behind a snapshot for followers that lag a little.
    log_keep_entries: u64 = 5_000;
    /// Size at which the raft log starts a new segment file.
    segment_size_bytes: u64 = 64 * 1024 * 1024;
    /// Append to the raft log with direct I/O and O_DSYNC (one system call per durable append,
    /// no page-cache copy) where the file system allows it; off, buffered writes and fdatasync.
    wal_direct_io: bool = true;
    /// Largest peer frame accepted: a raft message (its entries and, for a snapshot, the entry
    /// codec's state) or one chunk of a shipped snapshot file (at most 1 MiB).
    max_frame_bytes: usize = 512 * 1024 * 1024;
    /// Most bytes per second a leader ships to one follower behind the compacted log (0: no
    /// cap), so a catch-up over a shared link leaves room for the raft traffic beside it.
    snapshot_ship_bytes_per_sec: u64 = 0;
    /// Outgoing messages queued per peer before new ones are dropped.
    peer_queue_messages: usize = 4096;
    /// Largest RESP bulk string accepted from a client.
    max_request_bytes: usize = 64 * 1024 * 1024;
    /// The RESP `default` user's password (as Redis's requirepass): connections run nothing but
    /// AUTH, HELLO and QUIT until they log in. Empty: none (anyone connecting may run anything,
    /// unless the ACL file turns the default user off). Better set in the TOML file than as a
    /// flag, which other users of the machine can see.
    requirepass: String = String::new();
    /// A file of RESP users in Redis's ACL syntax, one per line: `user NAME on|off >PASSWORD
    /// (or #SHA256-HEX) +@all|+@read|+@all -@write ~*` (read-write or read-only over every key).
    /// Empty: none. See docs/security.md.
    acl_file: PathBuf = PathBuf::new();
    /// A file holding the secret every node of the cluster shares (at least 16 bytes; e.g.
    /// `head -c 32 /dev/urandom | base64 > secret`): peers prove they hold it before anything
    /// crosses a peer connection, so a process without it can neither join, send raft messages
    /// nor receive the replication stream. Empty: peers are not authenticated.
    cluster_secret_file: PathBuf = PathBuf::new();
    /// TLS on the client port (RESP, or PostgreSQL for `chorus sql`): the certificate chain (PEM).
    /// With it and tls_key_file the port speaks TLS only; both files are read again when they
    /// change (checked every 10 s). `chorus cluster start --tls` makes a throwaway CA for
    /// local clusters. See docs/security.md.
    tls_cert_file: PathBuf = PathBuf::new();
    /// The private key of tls_cert_file (PEM).
    tls_key_file: PathBuf = PathBuf::new();
    /// Mutual TLS on peer links: this node's certificate chain (PEM), presented both when it
    /// dials a peer and when a peer dials it, and valid for the address peers dial it at. With
    /// peer_tls_key_file and peer_tls_ca_file every peer connection is TLS and takes only a
    /// peer whose certificate chains to that CA; the files are read again when they change.
    /// `chorus cluster start --tls` makes them for local clusters. See docs/security.md.
    peer_tls_cert_file: PathBuf = PathBuf::new();
    /// The private key of peer_tls_cert_file (PEM).
    peer_tls_key_file: PathBuf = PathBuf::new();
    /// The CA certificate(s) (PEM) every peer's certificate must chain to.
    peer_tls_ca_file: PathBuf = PathBuf::new();
    /// Default read consistency for new connections: "linearizable" or "stale" (RESP clients
    /// switch with READONLY / READWRITE, SQL sessions with SET chorus.read_consistency).
    read_consistency: String = "linearizable".into();
    /// Send replicated entries as UniCache encodings (every node of a cluster must agree on this
    /// and on the unicache_* settings below).
    unicache: bool = false;
    /// UniCache eviction policy: lru, lfu or lecar.
    unicache_policy: String = "lecar".into();
    /// Most items in each node's UniCache.
    unicache_max_items: u32 = 16_384;
    /// Most bytes of items in each node's UniCache.
    unicache_max_bytes: usize = 4 * 1024 * 1024;
    /// Switch encoding per follower by measured savings and round trip (off: always encode).
    unicache_autotune: bool = true;
    /// Preprocessors for values under key prefixes, `PREFIX=KIND[:ARGS]` separated by `;`:
    /// `email:=csv:1,2:3` (CSV, columns 1 and 2 cacheable, column 3 split into words),
    /// `bus:=sql` (SQL templates and string literals), `blob:=opaque` (whole values).
    unicache_keyspaces: String = String::new();
    /// Log filter, e.g. "info" or "chorus=debug,raft=info".
    log: String = "info".into();
}

impl ServerConfig {
    /// `read_consistency`, read.
    pub fn read_consistency(&self) -> anyhow::Result<chorus_log::ReadConsistency> {
        match self.read_consistency.as_str() {
            "linearizable" => Ok(chorus_log::ReadConsistency::Linearizable),
            "stale" => Ok(chorus_log::ReadConsistency::Stale),
            other => bail!("read_consistency must be 'linearizable' or 'stale', not '{other}'"),
        }
    }
}

impl ServerOptions {
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<ServerOptions> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}

/// Parses "1=127.0.0.1:7001,2=127.0.0.1:7002".
pub fn parse_peers(peers: &str) -> anyhow::Result<Vec<(u64, SocketAddr)>> {
    let mut out = Vec::new();
    for part in peers.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .with_context(|| format!("peer '{part}' is not id=host:port"))?;
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("peer id '{id}' is not a number"))?;
        let addr: SocketAddr = addr
            .trim()
            .parse()
            .with_context(|| format!("peer address '{addr}' is not host:port"))?;
        if id == 0 {
            bail!("peer ids start at 1 (0 means 'no node' in raft)");
        }
        if out.iter().any(|(other, _)| *other == id) {
            bail!("peer id {id} is listed twice");
        }
        out.push((id, addr));
    }
    if out.is_empty() {
        bail!("no peers configured: set peers = \"1=host:port,2=host:port,...\" in the config file or pass --peers");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_override_defaults() {
        let file: ServerOptions = toml::from_str("id = 2\ntick_ms = 50\n").unwrap();
        let flags = ServerOptions {
            tick_ms: Some(20),
            ..Default::default()
        };
        let config = flags.over(file).resolve();
        assert_eq!(config.id, 2);
        assert_eq!(config.tick_ms, 20);
        assert_eq!(config.election_ticks, 10);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        assert!(toml::from_str::<ServerOptions>("tick = 5").is_err());
    }

    #[test]
    fn peers_parse_and_validate() {
        let peers = parse_peers("1=127.0.0.1:7001, 2=127.0.0.1:7002").unwrap();
        assert_eq!(peers.len(), 2);
        assert!(parse_peers("1=127.0.0.1:7001,1=127.0.0.1:7002").is_err());
        assert!(parse_peers("0=127.0.0.1:1").is_err());
        assert!(parse_peers("x").is_err());
    }
}
