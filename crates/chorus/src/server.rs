//! `chorus server`: wires storage, raft, transport, the RESP front end and metrics together.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use chorus_curp::durable_witness::DurableWitness;
use chorus_kv::curp::{serve_peer_requests, ApplyWatch, Curp};
use chorus_kv::ldc::Ldc;
use chorus_kv::listeners::Hub;
use chorus_kv::unicache::{parse_keyspaces, KvPreprocessor};
use chorus_kv::{FrontEndOptions, KvState};
use chorus_log::drain::Drain;
use chorus_log::peer_auth::{ClusterSecret, PeerCredentials};
use chorus_log::{EntryCodec, IdentityCodec, NodeConfig, NodeHandle, StateMachine, UniCacheCodec, UniCacheSettings};
use chorus_resp::Limits;
use chorus_storage::{CachePolicy, StoreOptions};
use chorus_unicache::CacheConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::admin_gate::AdminGate;
use crate::config::{parse_peers, ServerConfig};

/// Most bytes of records a node's CURP witness holds; past it, fast-path writes take the
/// ordinary path until records drain (each leaves as its write applies).
const WITNESS_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Peers' requests to CURP's services (witness, leader) queued before this node takes them.
const PEER_REQUEST_QUEUE: usize = 4096;

/// Blocks of 1 MiB and more (the cleaner's segment reads and merge output, a large batch's
/// segment) get a mapping of their own, returned to the system when freed. Left to itself glibc
/// raises this threshold to the largest such block freed and then serves later ones from its
/// heaps, which keep the space: 15-20 MiB per node in the resident-memory procedure of
/// `docs/benchmarks.md`.
fn return_large_blocks_when_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's tuning; it is called before the node's
    // threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Whether `--curp` is on.
fn curp_on(config: &ServerConfig) -> anyhow::Result<bool> {
    match config.curp.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => bail!("curp must be 'on' or 'off', not '{other}'"),
    }
}

/// The raft node's settings from the server's.
pub(crate) fn node_config(
    config: &ServerConfig,
    peers: Vec<(u64, std::net::SocketAddr)>,
) -> anyhow::Result<NodeConfig> {
    Ok(NodeConfig {
        id: config.id,
        peers,
        join: config.join,
        data_dir: config.data_dir.clone(),
        tick_ms: config.tick_ms,
        election_ticks: config.election_ticks,
        heartbeat_ticks: config.heartbeat_ticks,
        max_batch_commands: config.max_batch_commands,
        max_batch_bytes: config.max_batch_bytes,
        group_commit_entries: config.group_commit_entries,
        group_commit_wait_us: config.group_commit_wait_us,
        group_commit_linger_us: config.group_commit_linger_us,
        leader_wait_ms: config.leader_wait_ms,
        request_timeout_ms: config.request_timeout_ms,
        read_lease: config.read_lease,
        // `run` has refused a value other than on or off.
        curp: curp_on(config).unwrap_or(false),
        snapshot_interval_entries: config.snapshot_interval_entries,
        snapshot_interval_bytes: config.snapshot_interval_bytes,
        log_keep_entries: config.log_keep_entries,
        segment_size_bytes: config.segment_size_bytes,
        wal_direct_io: config.wal_direct_io,
        max_frame_bytes: config.max_frame_bytes,
        snapshot_ship_bytes_per_sec: config.snapshot_ship_bytes_per_sec,
        peer_queue_messages: config.peer_queue_messages,
        credentials: PeerCredentials {
            secret: cluster_secret(config)?,
            tls: peer_tls(config)?,
        },
    })
}

/// Mutual TLS on peer links, if `peer_tls_cert_file`, `peer_tls_key_file` and
/// `peer_tls_ca_file` are set (all three or none), watched for changes.
fn peer_tls(config: &ServerConfig) -> anyhow::Result<Option<Arc<chorus_tls::PeerTls>>> {
    let files = [
        &config.peer_tls_cert_file,
        &config.peer_tls_key_file,
        &config.peer_tls_ca_file,
    ];
    match files.iter().filter(|file| !file.as_os_str().is_empty()).count() {
        0 => Ok(None),
        3 => {
            let tls = chorus_tls::PeerTls::load(files[0], files[1], files[2]).map_err(anyhow::Error::msg)?;
            tokio::spawn(tls.clone().watch(chorus_tls::RELOAD_EVERY));
            Ok(Some(tls))
        }
        _ => bail!("peer TLS needs all of peer_tls_cert_file, peer_tls_key_file and peer_tls_ca_file"),
    }
}

/// The secret peers prove to each other, from `cluster_secret_file` (none if unset).
fn cluster_secret(config: &ServerConfig) -> anyhow::Result<Option<ClusterSecret>> {
    let path = &config.cluster_secret_file;
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the cluster secret file {}", path.display()))?;
    ClusterSecret::new(&text)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Where and how the key-value state is stored, from the server's settings.
fn store_options(config: &ServerConfig) -> anyhow::Result<StoreOptions> {
    let mut state_dirs: Vec<PathBuf> = config
        .data_dirs
        .split(',')
        .map(str::trim)
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .collect();
    if state_dirs.is_empty() {
        state_dirs.push(config.data_dir.join("state"));
    }
    Ok(StoreOptions {
        mode: config.storage.parse().map_err(anyhow::Error::msg)?,
        cache_bytes: config.cache_bytes,
        value_direct_io: config.value_direct_io,
        emulated_device_read_us: config.emulated_device_read_us,
        batch_writes: config.reduction_batch_writes,
        batch_bytes: config.reduction_batch_bytes,
        min_cleanable_dirty_ratio: config.min_cleanable_dirty_ratio,
        min_cleanable_dead_bytes: config.min_cleanable_dead_bytes,
        cleaner_read_bytes_per_sec: config.cleaner_read_bytes_per_sec,
        consolidated_segment_bytes: config.consolidated_segment_bytes,
        consolidate_above_segments: config.consolidate_above_segments,
        max_merged_segment_bytes: config.max_merged_segment_bytes,
        more_dirs: state_dirs.split_off(1),
        ..StoreOptions::new(state_dirs.remove(0))
    })
}

/// TLS for the client port, if `tls_cert_file` and `tls_key_file` are set (both or neither),
/// watched for changes.
pub(crate) fn client_tls(config: &ServerConfig) -> anyhow::Result<Option<Arc<chorus_tls::ServerTls>>> {
    let (cert, key) = (&config.tls_cert_file, &config.tls_key_file);
    match (cert.as_os_str().is_empty(), key.as_os_str().is_empty()) {
        (true, true) => Ok(None),
        (false, false) => {
            let tls = chorus_tls::ServerTls::load(cert, key).map_err(anyhow::Error::msg)?;
            tokio::spawn(tls.clone().watch(chorus_tls::RELOAD_EVERY));
            Ok(Some(tls))
        }
        _ => bail!("TLS needs both tls_cert_file and tls_key_file"),
    }
}

/// The users `requirepass` and the ACL file give (RESP and SQL clients alike).
pub(crate) fn users(config: &ServerConfig) -> anyhow::Result<chorus_auth::Users> {
    let acl_text = if config.acl_file.as_os_str().is_empty() {
        String::new()
    } else {
        std::fs::read_to_string(&config.acl_file)
            .with_context(|| format!("cannot read the ACL file {}", config.acl_file.display()))?
    };
    let users = chorus_auth::Users::from_config(&config.requirepass, &acl_text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.acl_file.display()))?;
    if users.open_to_anyone() && !acl_text.is_empty() {
        tracing::warn!(
            "the ACL file leaves the default user on with no password and every right: anyone \
             connecting may write (add `user default off`, or set requirepass)"
        );
    }
    Ok(users)
}

pub async fn run(config: ServerConfig) -> anyhow::Result<()> {
    return_large_blocks_when_freed();
    let peers = parse_peers(&config.peers)?;
    if !peers.iter().any(|(id, _)| *id == config.id) {
        bail!("node id {} is not in peers '{}'", config.id, config.peers);
    }
    let default_consistency = config.read_consistency()?;
    let users = Arc::new(users(&config)?);
    // Bind client-facing ports before starting raft so a port clash fails fast and clearly.
    let resp_listener = TcpListener::bind(config.resp_addr)
        .await
        .with_context(|| format!("cannot listen for RESP clients on {}", config.resp_addr))?;
    let metrics_listener = TcpListener::bind(config.metrics_addr)
        .await
        .with_context(|| format!("cannot serve metrics on {}", config.metrics_addr))?;

    let curp = curp_on(&config)?;
    let voters: Vec<u64> = peers.iter().map(|(id, _)| *id).collect();
    let node_config = node_config(&config, peers)?;
    let codec: Box<dyn EntryCodec> = if config.unicache {
        let settings = UniCacheSettings {
            cache: CacheConfig {
                policy: config.unicache_policy.parse().map_err(anyhow::Error::msg)?,
                max_items: config.unicache_max_items,
                max_bytes: config.unicache_max_bytes,
            },
            autotune: config.unicache_autotune,
        };
        if settings.cache.max_items == 0 || settings.cache.max_bytes == 0 {
            bail!("unicache_max_items and unicache_max_bytes must be positive");
        }
        let keyspaces = parse_keyspaces(&config.unicache_keyspaces).map_err(anyhow::Error::msg)?;
        Box::new(UniCacheCodec::new(settings, Arc::new(KvPreprocessor::new(keyspaces))))
    } else {
        Box::new(IdentityCodec)
    };
    let ldc = match config.cache_mode.as_str() {
        "siloed" => None,
        "ldc" => Some(Ldc::new(
            config.id,
            voters.clone(),
            match config.ldc_admission.as_str() {
                "cost-benefit" => true,
                "owners" => false,
                other => bail!("ldc_admission must be 'cost-benefit' or 'owners', not '{other}'"),
            },
        )),
        other => bail!("cache_mode must be 'siloed' or 'ldc', not '{other}'"),
    };
    let mut store_options = store_options(&config)?;
    if let Some(ldc) = &ldc {
        let ldc = ldc.clone();
        store_options.caches = CachePolicy::only(move |key| ldc.caches(key));
    }
    let witness = if curp {
        let dir = config.data_dir.join("witness");
        Some(Arc::new(
            DurableWitness::open(&dir, WITNESS_MAX_BYTES).context("cannot open the CURP witness")?,
        ))
    } else {
        None
    };
    let (peer_requests, requests) = tokio::sync::mpsc::channel(PEER_REQUEST_QUEUE);
    let applies = Arc::new(ApplyWatch::default());
    let state_curp = witness.clone().map(|witness| (witness, applies.clone()));
    let listeners = Arc::new(Hub::default());
    let state_listeners = listeners.clone();
    let state_ldc = ldc.clone();
    let node = chorus_log::start(
        node_config,
        |snapshot| {
            let mut state = KvState::open(store_options, snapshot)?.with_listeners(state_listeners);
            if let Some(ldc) = state_ldc {
                state = state.with_ldc(ldc);
            }
            Ok(match state_curp {
                Some((witness, applies)) => state.with_curp(witness, applies),
                None => state,
            })
        },
        codec,
        (witness.is_some() || ldc.is_some()).then_some(peer_requests),
    )
    .await
    .context("cannot start the raft node")?;
    // With LDC its FETCHes are answered here and the rest go on to CURP's services.
    let requests = match &ldc {
        Some(ldc) => {
            ldc.connect(node.peer_calls().clone(), tokio::runtime::Handle::current());
            let (to_curp, curp_requests) = tokio::sync::mpsc::channel(PEER_REQUEST_QUEUE);
            let to_curp = witness.is_some().then_some(to_curp);
            tokio::spawn(chorus_kv::ldc::serve_peer_requests(node.clone(), requests, to_curp));
            curp_requests
        }
        None => requests,
    };
    let curp = witness.map(|witness| {
        let timeout = Duration::from_millis(config.request_timeout_ms);
        let min_rtt = Duration::from_micros(config.curp_fast_path_min_rtt_us);
        let curp = Arc::new(Curp::new(node.clone(), witness, applies, timeout, min_rtt));
        tokio::spawn(serve_peer_requests(curp.clone(), requests));
        tokio::spawn(curp.clone().recover_as_leader());
        curp
    });
    if let Some(ldc) = &ldc {
        let (ldc, mut members) = (ldc.clone(), node.members_watch());
        tokio::spawn(async move {
            loop {
                let voters = members.borrow_and_update().conf_state.voters.clone();
                ldc.set_voters(voters);
                if members.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    tokio::spawn(serve_metrics(
        metrics_listener,
        node.clone(),
        AdminGate::new(users.clone()),
    ));
    let options = FrontEndOptions {
        default_consistency,
        limits: Limits {
            max_bulk_bytes: config.max_request_bytes,
            ..Limits::default()
        },
        max_pipeline_commands: 1024,
        resp_addr: config.resp_addr,
        write_retry_window: Duration::from_millis(config.request_timeout_ms),
        users,
        tls: client_tls(&config)?,
    };
    tracing::info!(
        id = config.id, resp = %config.resp_addr, metrics = %config.metrics_addr,
        data_dir = %config.data_dir.display(), "chorus node serving"
    );
    let drain = Drain::new();
    tokio::spawn(chorus_kv::serve(
        resp_listener,
        node.clone(),
        options,
        curp,
        listeners,
        drain.clone(),
    ));
    let asked = drain.clone();
    until_shut_down(asked.shutdown_requested(), || async move {
        let within = Duration::from_millis(config.shutdown_drain_ms);
        if drain.run(within, || drain.open_connections() == 0).await {
            tracing::info!("every client's commands answered");
        } else {
            tracing::warn!(
                connections = drain.open_connections(),
                "connections still busy when the drain's time ran out; they are cut"
            );
        }
        step_down(&node).await;
    })
    .await
    // Every acknowledged write is already fsynced; there is nothing to flush.
}

/// How long a leader that shuts down waits for its hand-over: one to a voter that answers takes
/// a round trip or two, and one that does not finish by then is not worth holding the exit for
/// (the others elect a leader after an election timeout, as if this node had crashed).
const STEP_DOWN_WITHIN: Duration = Duration::from_millis(500);

/// A leader that shuts down hands leadership over first (`NodeHandle::step_down`).
pub async fn step_down<S: StateMachine>(node: &NodeHandle<S>) {
    if node.step_down(STEP_DOWN_WITHIN).await {
        tracing::info!(leader = node.status().leader_id, "handed the leadership over");
    }
}

/// Serves until SIGTERM, an interrupt or `asked` (a client's SHUTDOWN), then runs `drain`
/// (bounded by --shutdown-drain-ms); a second signal meanwhile ends it at once.
pub async fn until_shut_down<F: std::future::Future<Output = ()>>(
    asked: impl std::future::Future<Output = ()>,
    drain: impl FnOnce() -> F,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM received; letting clients finish"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received; letting clients finish"),
        () = asked => tracing::info!("a client sent SHUTDOWN; letting clients finish"),
    }
    tokio::select! {
        () = drain() => {}
        _ = terminate.recv() => tracing::info!("second SIGTERM; exiting at once"),
        _ = tokio::signal::ctrl_c() => tracing::info!("second interrupt; exiting at once"),
    }
    Ok(())
}

/// Answers GET /backup: a backup of the state at a linearizable point (`chorus_log::backup`),
/// streamed from disk as it is read; the node's error, if it cannot take one.
async fn send_backup<S: StateMachine>(mut stream: tokio::net::TcpStream, node: &NodeHandle<S>) {
    let source = match node.backup().await {
        Ok(source) => source,
        Err(e) => {
            let body = format!("{e}\n");
            let response = format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            return;
        }
    };
    let length = chorus_log::backup::backup_bytes(&source.header);
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\nX-Chorus-Backup-Index: {}\r\nConnection: close\r\n\r\n",
        source.header.index
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    // The files are read and written with blocking calls, off the runtime's threads.
    let Ok(stream) = stream.into_std() else {
        return;
    };
    let written = tokio::task::spawn_blocking(move || {
        stream.set_nonblocking(false)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, stream);
        chorus_log::backup::write_backup(&source.header, &source.paths, &mut out)?;
        drop(source.pin);
        std::io::Write::flush(&mut out)
    })
    .await;
    match written {
        Ok(Ok(())) => tracing::info!("backup sent"),
        Ok(Err(e)) => tracing::warn!(error = %e, "backup broken off"),
        Err(e) => tracing::warn!(error = %e, "backup writer failed"),
    }
}

/// A minimal HTTP/1.1 responder: GET / the status page (`status_page`), GET /metrics in
/// Prometheus text format; POST /failover makes this node the leader (what `chorus cluster` uses
/// to place the leader and hand it over in a rolling restart); GET /backup streams a backup
/// (`chorus backup`); GET /members and POST
/// /members/... change the membership (`members_admin`); 404 otherwise. The port is an operator's:
/// bind it where only operators reach it.
pub(crate) async fn serve_metrics<S: StateMachine>(
    listener: TcpListener,
    node: NodeHandle<S>,
    gate: Option<AdminGate>,
) {
    let gate = gate.map(Arc::new);
    let rates = Arc::new(crate::status_page::Rates::default());
    let sampled = (rates.clone(), node.clone());
    tokio::spawn(async move {
        let (rates, node) = sampled;
        loop {
            rates.sample(node.status().applied_index, &chorus_metrics::render());
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    loop {
        let Ok((mut stream, remote)) = listener.accept().await else {
            continue;
        };
        let node = node.clone();
        let rates = rates.clone();
        let gate = gate.clone();
        tokio::spawn(async move {
            let mut request = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            let read_head = async {
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
                    let n = stream.read(&mut chunk).await?;
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&chunk[..n]);
                }
                Ok::<_, std::io::Error>(())
            };
            if tokio::time::timeout(Duration::from_secs(5), read_head).await.is_err() {
                return;
            }
            let refusal = gate.as_ref().and_then(|gate| gate.check(&request, remote.ip()).err());
            if refusal.is_none() && request.starts_with(b"GET /backup ") {
                send_backup(stream, &node).await;
                return;
            }
            let mut content_type = "text/plain; version=0.0.4";
            let (status, body) = if let Some(refusal) = refusal {
                (refusal.status, refusal.body)
            } else if request.starts_with(b"GET /metrics ") {
                ("200 OK", chorus_metrics::render())
            } else if request.starts_with(b"GET / ") {
                content_type = "text/html; charset=utf-8";
                let metrics = chorus_metrics::render();
                let status = node.status();
                rates.sample(status.applied_index, &metrics);
                ("200 OK", crate::status_page::render(&status, &metrics, &rates))
            } else if request.starts_with(b"POST /failover ") {
                match node.transfer_leader(node.status().id).await {
                    Ok(()) => ("200 OK", "this node leads\n".to_string()),
                    Err(e) => ("503 Service Unavailable", format!("{e}\n")),
                }
            } else if let Some(answer) = crate::members_admin::answer(&request, &node).await {
                answer
            } else {
                (
                    "404 Not Found",
                    "try GET / (the status page), GET /metrics, POST /failover or GET /members\n".to_string(),
                )
            };
            let challenge = if status.starts_with("401") {
                "WWW-Authenticate: Basic realm=\"chorus\"\r\n"
            } else {
                ""
            };
            let response = format!(
                "HTTP/1.1 {status}\r\n{challenge}Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use chorus_kv::command::{encode_curp_recovered, encode_enveloped, encode_register};
    use chorus_log::{IdentityCodec, Role};
    use chorus_resp::Value;

    use super::*;
    use crate::config::ServerOptions;

    /// A one-node cluster with CURP on: the new leader holds every write until it has proposed
    /// its recovery; then writes submitted together are answered as they join the log, each with
    /// the reply it then gives when it applies; a write on a key an unapplied write touches waits
    /// for its turn (or, once that one applied, is answered too).
    #[tokio::test(flavor = "current_thread")]
    async fn a_speculating_leader_answers_writes_with_the_replies_they_give_when_applied() {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = ServerOptions {
            peers: Some(format!("1=127.0.0.1:{port}")),
            data_dir: Some(dir.path().to_path_buf()),
            ..ServerOptions::default()
        }
        .resolve();
        let mut node_config = node_config(&config, parse_peers(&config.peers).unwrap()).unwrap();
        node_config.curp = true;
        let store_options = store_options(&config).unwrap();
        let node = chorus_log::start(
            node_config,
            |snapshot| KvState::open(store_options, snapshot),
            Box::new(IdentityCodec),
            None,
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while node.status().role != Role::Leader {
            assert!(Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let term = node.status().term;
        let mut register = node.submit_write(encode_register()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(register.try_recv().is_err(), "a write went ahead of the recovery");
        // The witnesses to collect: the voters, once an entry of this term has applied.
        let witnesses = loop {
            match node.curp_recovery_witnesses(term).await {
                Ok(witnesses) => break witnesses,
                Err(chorus_log::NodeError::Refused(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(witnesses, Some(vec![1]));
        assert!(
            node.submit_recovery(term, Some(vec![1, 2]), Vec::new()).await.is_err(),
            "a recovery from other witnesses than the voters is refused"
        );
        node.submit_recovery(term, witnesses.clone(), vec![encode_curp_recovered(term)])
            .await
            .unwrap();
        assert!(
            node.submit_recovery(term, witnesses, Vec::new()).await.is_err(),
            "one recovery per term"
        );
        let Ok(Ok(Value::Integer(incarnation))) = register.await else {
            panic!("registration failed")
        };
        let write = |seq: u64, key: &str| {
            let envelope = chorus_curp::rifl::Envelope {
                client: chorus_curp::rifl::ClientId {
                    incarnation: incarnation as u64,
                    connection: 1,
                },
                seq,
                first_unacked: 1,
            };
            encode_enveloped(
                &envelope,
                &[Bytes::from("INCR"), Bytes::copy_from_slice(key.as_bytes())],
            )
        };
        let mut submitted = Vec::new();
        for (seq, key) in [(1, "a"), (2, "a"), (3, "b"), (4, "c")] {
            let pair = node.submit_speculative_write(write(seq, key), term, vec![1]).await;
            submitted.push(pair.unwrap());
        }
        let mut speculated = 0;
        for (n, (applied, speculative)) in submitted.into_iter().enumerate() {
            let speculative = speculative.await.ok();
            let applied = applied.await.unwrap().unwrap();
            if let Some(reply) = speculative {
                assert_eq!(reply, applied, "write {n}");
                speculated += 1;
            }
        }
        assert!(
            speculated >= 3,
            "only {speculated} of 4 writes were answered speculatively"
        );
        // Recorded by witnesses that are not the voters: answered once applied, never before.
        let (applied, speculative) = node
            .submit_speculative_write(write(5, "d"), term, vec![1, 2])
            .await
            .unwrap();
        assert!(speculative.await.is_err(), "speculated on other witnesses' record");
        assert_eq!(applied.await.unwrap().unwrap(), Value::Integer(1));
    }
}
