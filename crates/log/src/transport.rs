//! Peer transport over TCP. Each node dials every peer for its outgoing messages and accepts
//! connections for incoming ones, so a connection carries traffic one way only — except a
//! snapshot shipment, which a leader's sender thread opens for itself (see `shipment`).
//!
//! Outgoing messages go through a bounded queue per peer: the raft loop never blocks on a slow or
//! dead peer; when a queue is full the message is dropped and counted (raft retransmits). While a
//! peer is unreachable its queue is drained and discarded, and the raft loop is told so the
//! leader probes instead of streaming into the void.
//!
//! Every connection also carries a ping twice a second, which the peer's receiving task answers
//! with a pong on its own connection back. Their round trip — the network plus whatever queues
//! in both directions, but neither raft loop nor any fsync — is the link's measured RTT
//! (`Transport::rtts`), which UniCache's auto-tune reads.
//!
//! Peers come and go with the cluster's membership (`Transport::add_peer`, `remove_peer`); a
//! connection from a node that is not (yet) a peer is refused, and the node dials again.
//!
//! With peer TLS, connections are TLS and both ends' certificates must chain to the cluster's CA
//! (`peer_stream`); with a cluster secret, a connection carries nothing until both ends proved
//! they hold it (`peer_auth`). An inbound connection that fails either is closed and counted.
//!
//! Services other than raft (CURP's witnesses, for one) share the connections: [`PeerCalls`]
//! sends a request and awaits its response, which the peer sends back on its own connection; a
//! node's incoming requests go, by service number, to the log's own services or to the
//! application. Both directions are bounded, and a request nobody answers in time fails with
//! `CallError::Timeout`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use chorus_metrics::{labeled_counter, labeled_gauge, Counter, Gauge};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::frame::{self, FrameKind, FRAME_HEADER_BYTES};
use crate::peer_auth::{self, Accept, ClusterSecret, Dial, PeerCredentials};
use crate::peer_stream::PeerStream;
use crate::shipment::Receiver;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A connection that lasted this long worked: the next failure starts the backoff afresh.
const LASTING_CONNECTION: Duration = Duration::from_secs(1);
/// Coalesce queued messages into one write up to this many bytes.
const WRITE_BATCH_BYTES: usize = 1024 * 1024;
/// Inbound frames are read through a buffer this large, so a burst of frames costs one read.
const READ_BUFFER_BYTES: usize = 64 * 1024;
const PING_INTERVAL: Duration = Duration::from_millis(500);
/// Pongs waiting to go out per peer; more are dropped (the next ping will do).
const PONG_QUEUE: usize = 16;
/// Service requests and responses waiting to go out per peer; a request beyond it fails at once
/// (`CallError::Overloaded`), a response beyond it is dropped (its caller times out).
const SERVICE_QUEUE: usize = 4096;

fn probe_clock() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Something the raft loop must hear about from the transport or a snapshot shipment.
#[derive(Debug)]
pub enum PeerEvent {
    Unreachable(u64),
    SnapshotSent { to: u64, delivered: bool },
}

#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub node_id: u64,
    pub listen_addr: SocketAddr,
    /// Every other member at start (`Transport::add_peer` adds more).
    pub peers: Vec<(u64, SocketAddr)>,
    pub max_frame_bytes: usize,
    pub queue_messages: usize,
    /// Where snapshot files shipped by a leader land (see `shipment`).
    pub incoming_dir: std::path::PathBuf,
    /// What peers prove to each other before anything else crosses a connection.
    pub credentials: PeerCredentials,
}

struct PeerMetrics {
    rtt_us: Arc<Gauge>,
    messages_sent: Arc<Counter>,
    entries_sent: Arc<Counter>,
    bytes_sent: Arc<Counter>,
    messages_received: Arc<Counter>,
    entries_received: Arc<Counter>,
    bytes_received: Arc<Counter>,
}

impl PeerMetrics {
    fn new(peer: u64) -> Self {
        let p = peer.to_string();
        let label = Some(("peer", p.as_str()));
        PeerMetrics {
            rtt_us: labeled_gauge(
                "chorus_peer_rtt_microseconds",
                "Smoothed round trip of pings to a peer (network and queues, no raft or disk)",
                label,
            ),
            messages_sent: labeled_counter("chorus_peer_messages_sent_total", "Raft messages sent to a peer", label),
            entries_sent: labeled_counter(
                "chorus_peer_entries_sent_total",
                "Log entries sent to a peer in append messages",
                label,
            ),
            bytes_sent: labeled_counter("chorus_peer_bytes_sent_total", "Frame bytes sent to a peer", label),
            messages_received: labeled_counter(
                "chorus_peer_messages_received_total",
                "Raft messages received from a peer",
                label,
            ),
            entries_received: labeled_counter(
                "chorus_peer_entries_received_total",
                "Log entries received from a peer in append messages",
                label,
            ),
            bytes_received: labeled_counter(
                "chorus_peer_bytes_received_total",
                "Frame bytes received from a peer",
                label,
            ),
        }
    }
}

fn unauthenticated_peers() -> Arc<Counter> {
    chorus_metrics::counter(
        "chorus_peer_auth_failures_total",
        "Peer connections closed because the other end did not prove it holds the cluster secret \
         (or sent one where this node has none) or had no certificate of the cluster's CA",
    )
}

fn rejected_frames() -> Arc<Counter> {
    chorus_metrics::counter(
        "chorus_peer_connections_rejected_total",
        "Inbound peer connections closed for malformed, oversized or unexpected frames",
    )
}

/// What the sending and receiving tasks of one peer share.
struct Link {
    metrics: PeerMetrics,
    /// Stamps of the peer's pings to answer.
    pongs: mpsc::Sender<u64>,
    /// Smoothed round trip in µs (0 until measured).
    rtt_us: AtomicU64,
    /// When the peer last answered a ping (`probe_clock` µs; 0: never).
    last_pong_us: AtomicU64,
    /// Service frames (requests, responses) to send to the peer.
    service: mpsc::Sender<(FrameKind, Vec<u8>)>,
}

/// The peers' links, and what is shared by all.
struct Peers {
    links: RwLock<HashMap<u64, Arc<Link>>>,
    /// Calls awaiting their response, by request id.
    pending: Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>,
    /// Where requests from peers go.
    services: Services,
    requests_dropped: Arc<Counter>,
}

/// Where requests from peers go, by service: below [`FIRST_APPLICATION_SERVICE`] to the log
/// itself, the rest to the application. A request nobody takes is dropped (and counted).
pub struct Services {
    pub log: Option<mpsc::Sender<PeerRequest>>,
    pub application: Option<mpsc::Sender<PeerRequest>>,
}

/// Service numbers below this one are the log's own.
pub const FIRST_APPLICATION_SERVICE: u8 = 1;

/// A request from a peer to one of this node's services.
#[derive(Debug)]
pub struct PeerRequest {
    pub from: u64,
    pub service: u8,
    pub body: Vec<u8>,
    id: u64,
    reply_to: mpsc::Sender<(FrameKind, Vec<u8>)>,
}

impl Peers {
    fn link(&self, peer: u64) -> Option<Arc<Link>> {
        self.links.read().expect("not poisoned").get(&peer).cloned()
    }
}

impl PeerRequest {
    /// Sends the response; a full queue or a closed connection drops it (the caller times out).
    pub fn respond(self, body: &[u8]) {
        let _ = self
            .reply_to
            .try_send((FrameKind::Response, frame::encode_response(self.id, body)));
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("node {0} is not a peer")]
    UnknownPeer(u64),
    #[error("too many requests queued for node {0}")]
    Overloaded(u64),
    #[error("node {peer} did not answer within {waited_ms} ms")]
    Timeout { peer: u64, waited_ms: u64 },
}

/// Calls services on peers.
pub struct PeerCalls {
    peers: Arc<Peers>,
    next_id: AtomicU64,
}

/// Forgets a call's pending entry however the call ends (answered, timed out, or dropped).
struct PendingCall<'a> {
    peers: &'a Peers,
    id: u64,
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        self.peers.pending.lock().expect("not poisoned").remove(&self.id);
    }
}

impl PeerCalls {
    /// The link's measured round trip to `peer` (`None` until measured).
    pub fn rtt(&self, peer: u64) -> Option<Duration> {
        let rtt_us = self.peers.link(peer)?.rtt_us.load(Ordering::Relaxed);
        (rtt_us > 0).then(|| Duration::from_micros(rtt_us))
    }

    /// Whether `peer` answered a ping within `within` (pings go out every 500 ms): a caller
    /// may skip a peer that did not rather than wait for its call to time out.
    pub fn heard_within(&self, peer: u64, within: Duration) -> bool {
        let Some(last_us) = self
            .peers
            .link(peer)
            .map(|link| link.last_pong_us.load(Ordering::Relaxed))
        else {
            return false;
        };
        last_us > 0 && probe_clock().saturating_sub(last_us) <= within.as_micros() as u64
    }

    /// Sends `body` to `service` on `peer` and awaits the response body.
    pub async fn call(&self, peer: u64, service: u8, body: &[u8], timeout: Duration) -> Result<Vec<u8>, CallError> {
        let link = self.peers.link(peer).ok_or(CallError::UnknownPeer(peer))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.peers.pending.lock().expect("not poisoned").insert(id, tx);
        let _pending = PendingCall { peers: &self.peers, id };
        link.service
            .try_send((FrameKind::Request, frame::encode_request(id, service, body)))
            .map_err(|_| CallError::Overloaded(peer))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(response)) => Ok(response),
            _ => Err(CallError::Timeout {
                peer,
                waited_ms: timeout.as_millis() as u64,
            }),
        }
    }
}

/// The peer links of a node: their raft queues are the raft loop's, and it adds and removes
/// peers as the membership changes.
pub struct Transport {
    node_id: u64,
    credentials: PeerCredentials,
    queue_messages: usize,
    events: mpsc::UnboundedSender<PeerEvent>,
    peers: Arc<Peers>,
}

impl Transport {
    /// Starts the sender task of a new peer at `addr`; its raft messages go into the queue
    /// returned. A peer already linked is linked anew (its address may have changed).
    pub fn add_peer(&self, peer: u64, addr: SocketAddr) -> mpsc::Sender<Message> {
        assert_ne!(peer, self.node_id, "a node is not its own peer");
        let (pongs, pong_rx) = mpsc::channel(PONG_QUEUE);
        let (service, service_rx) = mpsc::channel(SERVICE_QUEUE);
        let (raft, raft_rx) = mpsc::channel(self.queue_messages);
        let link = Arc::new(Link {
            metrics: PeerMetrics::new(peer),
            pongs,
            rtt_us: AtomicU64::new(0),
            last_pong_us: AtomicU64::new(0),
            service,
        });
        self.peers
            .links
            .write()
            .expect("not poisoned")
            .insert(peer, link.clone());
        tokio::spawn(sender_loop(
            peer,
            addr,
            self.node_id,
            self.credentials.clone(),
            Queues {
                raft: raft_rx,
                pongs: pong_rx,
                service: service_rx,
            },
            self.events.clone(),
            link,
        ));
        raft
    }

    /// Forgets a peer: calls to it fail at once, its connections from now on are refused, and
    /// its sender task ends once the raft queue `add_peer` gave is dropped.
    pub fn remove_peer(&self, peer: u64) {
        self.peers.links.write().expect("not poisoned").remove(&peer);
    }

    /// The measured round trip to each peer that has one, in µs.
    pub fn rtts(&self) -> Vec<(u64, u64)> {
        let links = self.peers.links.read().expect("not poisoned");
        links
            .iter()
            .map(|(peer, link)| (*peer, link.rtt_us.load(Ordering::Relaxed)))
            .filter(|(_, rtt_us)| *rtt_us > 0)
            .collect()
    }
}

/// Binds the peer listener and links the configured peers. Returns their raft queues, the
/// transport (to link more), and the means to call peers' services; peers' requests to this
/// node's go to `services`.
pub async fn start(
    config: TransportConfig,
    inbound: mpsc::Sender<Message>,
    events: mpsc::UnboundedSender<PeerEvent>,
    services: Services,
) -> std::io::Result<(HashMap<u64, mpsc::Sender<Message>>, Transport, Arc<PeerCalls>)> {
    let listener = TcpListener::bind(config.listen_addr).await?;
    let shared = Arc::new(Peers {
        links: RwLock::new(HashMap::new()),
        pending: Mutex::new(HashMap::new()),
        services,
        requests_dropped: chorus_metrics::counter(
            "chorus_peer_requests_dropped_total",
            "Service requests from peers dropped because the service's queue was full",
        ),
    });
    let receiver = Arc::new(Receiver::new(
        config.node_id,
        config.incoming_dir.clone(),
        config.max_frame_bytes,
        inbound.clone(),
    ));
    tokio::spawn(accept_loop(listener, config.clone(), shared.clone(), inbound, receiver));
    let transport = Transport {
        node_id: config.node_id,
        credentials: config.credentials.clone(),
        queue_messages: config.queue_messages,
        events,
        peers: shared.clone(),
    };
    let queues = config
        .peers
        .iter()
        .map(|(peer, addr)| (*peer, transport.add_peer(*peer, *addr)))
        .collect();
    let calls = Arc::new(PeerCalls {
        peers: shared,
        next_id: AtomicU64::new(1),
    });
    Ok((queues, transport, calls))
}

struct Queues {
    raft: mpsc::Receiver<Message>,
    pongs: mpsc::Receiver<u64>,
    service: mpsc::Receiver<(FrameKind, Vec<u8>)>,
}

async fn accept_loop(
    listener: TcpListener,
    config: TransportConfig,
    peers: Arc<Peers>,
    inbound: mpsc::Sender<Message>,
    receiver: Arc<Receiver>,
) {
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "peer accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (config, peers, inbound, receiver) = (config.clone(), peers.clone(), inbound.clone(), receiver.clone());
        tokio::spawn(async move {
            let accepted = tokio::time::timeout(
                HELLO_TIMEOUT,
                PeerStream::accept(stream, config.credentials.tls.as_deref()),
            );
            let stream = match accepted.await {
                Ok(Ok(stream)) => stream,
                Ok(Err(reason)) => {
                    unauthenticated_peers().inc();
                    tracing::warn!(%remote, %reason, "closed inbound peer connection");
                    return;
                }
                Err(_) => {
                    unauthenticated_peers().inc();
                    tracing::warn!(%remote, "closed inbound peer connection: no TLS handshake within 5 s");
                    return;
                }
            };
            if let Err(reason) = receive_from(stream, &config, &peers, &inbound, receiver).await {
                rejected_frames().inc();
                tracing::warn!(%remote, %reason, "closed inbound peer connection");
            }
        });
    }
}

/// Reads one frame; errors describe what was wrong for the log line.
async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    max_frame_bytes: usize,
) -> Result<Option<(FrameKind, Vec<u8>)>, String> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    match stream.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(format!("read failed: {e}")),
    }
    let header = frame::decode_header(&header, max_frame_bytes).map_err(|e| format!("bad frame header: {e}"))?;
    // Grow the buffer as bytes arrive rather than trusting the length up front.
    let mut payload = Vec::with_capacity(header.payload_len.min(1 << 20));
    let read = (&mut *stream)
        .take(header.payload_len as u64)
        .read_to_end(&mut payload)
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    if read != header.payload_len {
        return Err("connection closed mid-frame".into());
    }
    frame::verify_payload(&header, &payload).map_err(|e| format!("bad frame: {e}"))?;
    Ok(Some((header.kind, payload)))
}

async fn receive_from(
    stream: PeerStream,
    config: &TransportConfig,
    peers: &Peers,
    inbound: &mpsc::Sender<Message>,
    receiver: Arc<Receiver>,
) -> Result<(), String> {
    let mut stream = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let hello = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut stream, 64))
        .await
        .map_err(|_| "no hello within 5 s".to_string())??;
    let (from, nonce) = match hello {
        Some((FrameKind::Hello, payload)) => frame::decode_hello(&payload).map_err(|e| format!("bad hello: {e}"))?,
        Some((kind, _)) => return Err(format!("expected hello, got {kind:?}")),
        None => return Ok(()),
    };
    let link = peers
        .link(from)
        .ok_or_else(|| format!("hello from node {from}, which is not a member (yet)"))?;
    let metrics = &link.metrics;
    if let Err(reason) = accept_handshake(&mut stream, config, from, nonce).await {
        unauthenticated_peers().inc();
        return Err(reason);
    }
    let mut first_after_hello = true;
    while let Some((kind, payload)) = read_frame(&mut stream, config.max_frame_bytes).await? {
        let opens_the_connection = std::mem::replace(&mut first_after_hello, false);
        match kind {
            FrameKind::Raft => {}
            FrameKind::ShipOffer if opens_the_connection => {
                receive_shipment(stream, from, payload, receiver).await;
                return Ok(());
            }
            FrameKind::ShipOffer | FrameKind::ShipResume | FrameKind::ShipChunk | FrameKind::ShipDone => {
                return Err(format!("{kind:?} frame outside a shipment"))
            }
            FrameKind::Ping => {
                let stamp = frame::decode_probe(&payload).map_err(|e| format!("bad ping: {e}"))?;
                // Answer on our own connection to the peer; a full queue skips this one.
                let _ = link.pongs.try_send(stamp);
                continue;
            }
            FrameKind::Pong => {
                let stamp = frame::decode_probe(&payload).map_err(|e| format!("bad pong: {e}"))?;
                let now_us = probe_clock();
                link.last_pong_us.store(now_us, Ordering::Relaxed);
                let sample_us = now_us.saturating_sub(stamp).max(1);
                let old = link.rtt_us.load(Ordering::Relaxed);
                let smoothed = if old == 0 { sample_us } else { (old * 4 + sample_us) / 5 };
                link.rtt_us.store(smoothed, Ordering::Relaxed);
                metrics.rtt_us.set(smoothed as i64);
                continue;
            }
            FrameKind::Request => {
                let (id, service, body) = frame::decode_request(&payload).map_err(|e| format!("bad request: {e}"))?;
                let request = PeerRequest {
                    from,
                    service,
                    body: body.to_vec(),
                    id,
                    reply_to: link.service.clone(),
                };
                let to = if service < FIRST_APPLICATION_SERVICE || service == crate::membership::SERVICE {
                    &peers.services.log
                } else {
                    &peers.services.application
                };
                match to {
                    Some(requests) if requests.try_send(request).is_ok() => {}
                    _ => peers.requests_dropped.inc(),
                }
                continue;
            }
            FrameKind::Response => {
                let (id, body) = frame::decode_response(&payload).map_err(|e| format!("bad response: {e}"))?;
                // A response whose caller gave up finds nobody waiting.
                if let Some(waiting) = peers.pending.lock().expect("not poisoned").remove(&id) {
                    let _ = waiting.send(body.to_vec());
                }
                continue;
            }
            FrameKind::Hello | FrameKind::Challenge | FrameKind::Proof => {
                return Err(format!("{kind:?} frame after the handshake"))
            }
        }
        let msg = Message::parse_from_bytes(&payload).map_err(|e| format!("bad raft message: {e}"))?;
        if msg.get_msg_type() == MessageType::MsgSnapshot {
            return Err("a snapshot outside a shipment of its files".into());
        }
        if msg.from != from || msg.to != config.node_id {
            return Err(format!(
                "message from {} to {} on the connection of node {from} to {}",
                msg.from, msg.to, config.node_id
            ));
        }
        metrics.bytes_received.add((payload.len() + FRAME_HEADER_BYTES) as u64);
        metrics.messages_received.inc();
        metrics.entries_received.add(msg.entries.len() as u64);
        if inbound.send(msg).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Hands a connection that opened with a shipment offer to a blocking receiver (file writes and
/// fsyncs stay off the runtime); a failed shipment is logged, and the next one resumes it.
async fn receive_shipment(stream: BufReader<PeerStream>, from: u64, offer: Vec<u8>, receiver: Arc<Receiver>) {
    let outcome = async {
        if !stream.buffer().is_empty() {
            return Err("bytes after a shipment offer, before its resume".to_string());
        }
        let blocking = stream.into_inner().into_blocking()?;
        tokio::task::spawn_blocking(move || receiver.receive(blocking, from, &offer))
            .await
            .map_err(|e| format!("receiver thread: {e}"))?
    }
    .await;
    match outcome {
        Ok(stats) => tracing::info!(
            from,
            bytes_received = stats.bytes_shipped,
            bytes_resumed = stats.bytes_resumed,
            "snapshot files received"
        ),
        Err(reason) => tracing::warn!(from, %reason, "snapshot shipment broken off; the next one resumes it"),
    }
}

/// The acceptor's half of the handshake (`peer_auth`), after the hello of node `from` carrying
/// `nonce`: nothing, without a secret on either side.
async fn accept_handshake(
    stream: &mut BufReader<PeerStream>,
    config: &TransportConfig,
    from: u64,
    nonce: Option<peer_auth::Nonce>,
) -> Result<(), String> {
    let Some((accept, challenge)) = Accept::start(config.credentials.secret.as_ref(), config.node_id, from, nonce)?
    else {
        return Ok(());
    };
    let mut frame_bytes = Vec::new();
    frame::encode_frame(FrameKind::Challenge, &challenge, &mut frame_bytes);
    write_flushed(stream.get_mut(), &frame_bytes).await?;
    let proof = tokio::time::timeout(HELLO_TIMEOUT, read_frame(stream, 64))
        .await
        .map_err(|_| "no proof of the cluster secret within 5 s".to_string())??;
    match proof {
        Some((FrameKind::Proof, payload)) => accept.check(&payload),
        Some((kind, _)) => Err(format!("expected a proof of the cluster secret, got {kind:?}")),
        None => Err(format!("node {from} left before proving it holds the cluster secret")),
    }
}

/// The dialer's half: the hello, and with a secret, checking the challenge of node `peer` and
/// answering it. Nothing else is sent to a peer that cannot show the secret.
async fn dial_handshake(
    stream: &mut PeerStream,
    node_id: u64,
    peer: u64,
    secret: Option<&ClusterSecret>,
) -> Result<(), String> {
    let Some(secret) = secret else {
        return write_flushed(stream, &frame::encode_hello(node_id, None)).await;
    };
    let (dial, hello) = Dial::start(secret, node_id, peer);
    let mut frame_bytes = Vec::new();
    frame::encode_frame(FrameKind::Hello, &hello, &mut frame_bytes);
    write_flushed(stream, &frame_bytes).await?;
    let challenge = tokio::time::timeout(HELLO_TIMEOUT, read_frame(stream, 64))
        .await
        .map_err(|_| format!("node {peer} sent no challenge within 5 s"))??;
    let proof = match challenge {
        Some((FrameKind::Challenge, payload)) => dial.answer(&payload)?,
        Some((kind, _)) => return Err(format!("expected a challenge, got {kind:?}")),
        None => {
            return Err(format!(
                "node {peer} closed the connection at the hello: does it have the same cluster secret? (its log says)"
            ))
        }
    };
    frame_bytes.clear();
    frame::encode_frame(FrameKind::Proof, &proof, &mut frame_bytes);
    write_flushed(stream, &frame_bytes).await
}

/// Writes `bytes` and flushes them (TLS holds records back until flushed).
async fn write_flushed(stream: &mut PeerStream, bytes: &[u8]) -> Result<(), String> {
    stream
        .write_all(bytes)
        .await
        .map_err(|e| format!("write failed: {e}"))?;
    stream.flush().await.map_err(|e| format!("write failed: {e}"))
}

async fn sender_loop(
    peer: u64,
    addr: SocketAddr,
    node_id: u64,
    credentials: PeerCredentials,
    mut queues: Queues,
    events: mpsc::UnboundedSender<PeerEvent>,
    link: Arc<Link>,
) {
    let metrics = &link.metrics;
    let mut backoff = BACKOFF_MIN;
    let mut reported_down = false;
    // Whether the last connection closed soon after its handshake, as a node that does not
    // take this one as a member (yet) closes it: not reachable, so the backoff goes on.
    let mut closed_young = false;
    loop {
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await;
        let outcome = match connected {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                let dialed =
                    tokio::time::timeout(HELLO_TIMEOUT, PeerStream::dial(tcp, addr, credentials.tls.as_deref()))
                        .await
                        .unwrap_or_else(|_| Err("no TLS handshake within 5 s".into()));
                let handshaken = match dialed {
                    Ok(mut stream) => dial_handshake(&mut stream, node_id, peer, credentials.secret.as_ref())
                        .await
                        .map(|()| stream),
                    Err(reason) => Err(reason),
                };
                match handshaken {
                    Ok(stream) => {
                        if reported_down && !closed_young {
                            tracing::info!(peer, %addr, "peer reachable again");
                            reported_down = false;
                        }
                        let connected_at = Instant::now();
                        let sent = send_to(stream, &mut queues, metrics).await;
                        closed_young = connected_at.elapsed() < LASTING_CONNECTION;
                        if !closed_young {
                            backoff = BACKOFF_MIN;
                            reported_down = false;
                        }
                        sent
                    }
                    Err(reason) => Err(reason),
                }
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("connect timed out".into()),
        };
        match outcome {
            Ok(()) => return,
            Err(reason) => {
                if !reported_down {
                    tracing::warn!(peer, %addr, %reason, "peer unreachable; retrying with backoff");
                    reported_down = true;
                }
                let _ = events.send(PeerEvent::Unreachable(peer));
            }
        }
        let deadline = tokio::time::Instant::now() + backoff;
        // Messages queued while the peer is down are stale by the time it returns; drop them.
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = queues.pongs.recv() => {}
                _ = queues.service.recv() => {}
                msg = queues.raft.recv() => if msg.is_none() {
                    return;
                },
            }
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Streams queued messages, and pings, to a connected peer. `Ok` means the queue closed
/// (shutdown).
async fn send_to(mut stream: PeerStream, queues: &mut Queues, metrics: &PeerMetrics) -> Result<(), String> {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            msg = queues.raft.recv() => match msg {
                Some(msg) => Some(msg),
                None => return Ok(()),
            },
            pong = queues.pongs.recv() => {
                if let Some(stamp) = pong {
                    frame::encode_frame(FrameKind::Pong, &stamp.to_le_bytes(), &mut buf);
                }
                None
            }
            _ = ping.tick() => {
                frame::encode_frame(FrameKind::Ping, &probe_clock().to_le_bytes(), &mut buf);
                None
            }
            frame = queues.service.recv() => {
                if let Some((kind, payload)) = frame {
                    frame::encode_frame(kind, &payload, &mut buf);
                    while buf.len() < WRITE_BATCH_BYTES {
                        let Ok((kind, payload)) = queues.service.try_recv() else {
                            break;
                        };
                        frame::encode_frame(kind, &payload, &mut buf);
                    }
                }
                None
            }
        };
        let mut next = first;
        while let Some(msg) = next.take() {
            metrics.messages_sent.inc();
            metrics.entries_sent.add(msg.entries.len() as u64);
            let payload = msg.write_to_bytes().expect("encoding a raft message cannot fail");
            frame::encode_frame(FrameKind::Raft, &payload, &mut buf);
            if buf.len() < WRITE_BATCH_BYTES {
                next = queues.raft.try_recv().ok();
            }
        }
        let written = write_flushed(&mut stream, &buf).await;
        metrics.bytes_sent.add(buf.len() as u64);
        buf.clear();
        written?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    }

    /// A transport for node `id` and its calls; its inbound raft messages go to the receiver
    /// returned.
    async fn node(
        id: u64,
        addrs: &[(u64, SocketAddr)],
        requests: Option<mpsc::Sender<PeerRequest>>,
        dir: &std::path::Path,
        credentials: PeerCredentials,
    ) -> (Arc<PeerCalls>, mpsc::Receiver<Message>) {
        let (raft_tx, raft_rx) = mpsc::channel(16);
        let (events_tx, _events_rx) = mpsc::unbounded_channel();
        let config = TransportConfig {
            node_id: id,
            listen_addr: addrs.iter().find(|(n, _)| *n == id).unwrap().1,
            peers: addrs.iter().filter(|(n, _)| *n != id).cloned().collect(),
            max_frame_bytes: 1 << 20,
            queue_messages: 16,
            incoming_dir: dir.to_path_buf(),
            credentials,
        };
        let services = Services {
            log: None,
            application: requests,
        };
        let (raft_queues, _, calls) = start(config, raft_tx, events_tx, services).await.unwrap();
        // The outgoing raft queues live as long as the test (a closed one is how a sender task
        // learns of shutdown).
        std::mem::forget(raft_queues);
        (calls, raft_rx)
    }

    /// Answers every request to a node with its service, body and sender.
    fn echo(mut requests: mpsc::Receiver<PeerRequest>) {
        tokio::spawn(async move {
            while let Some(request) = requests.recv().await {
                let mut body = vec![request.service];
                body.extend_from_slice(&request.body);
                body.extend_from_slice(&request.from.to_le_bytes());
                request.respond(&body);
            }
        });
    }

    #[tokio::test]
    async fn a_call_gets_its_peers_response_and_fails_clearly_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let addrs = [(1, free_addr()), (2, free_addr()), (3, free_addr())];
        let (requests_tx, requests) = mpsc::channel(16);
        let (one, _) = node(1, &addrs, None, dir.path(), PeerCredentials::default()).await;
        let _two = node(2, &addrs, Some(requests_tx), dir.path(), PeerCredentials::default()).await;
        echo(requests);
        let second = Duration::from_secs(1);
        // Requests queued while the connection is not up yet are dropped, like raft messages.
        let deadline = Instant::now() + Duration::from_secs(5);
        while one.call(2, 7, b"up?", Duration::from_millis(100)).await.is_err() {
            assert!(Instant::now() < deadline, "node 2 never answered");
        }
        let bodies: Vec<[u8; 1]> = (0..50u8).map(|i| [i]).collect();
        // All in flight at once: responses are matched to calls by id, not by order.
        let answered: Vec<_> = bodies.iter().map(|body| one.call(2, 7, body, second)).collect();
        for (i, call) in answered.into_iter().enumerate() {
            let mut expected = vec![7, i as u8];
            expected.extend_from_slice(&1u64.to_le_bytes());
            assert_eq!(call.await.unwrap(), expected, "call {i}");
        }
        assert_eq!(one.call(9, 7, b"x", second).await, Err(CallError::UnknownPeer(9)));
        let quick = Duration::from_millis(300);
        assert_eq!(
            one.call(3, 7, b"x", quick).await,
            Err(CallError::Timeout {
                peer: 3,
                waited_ms: 300
            }),
            "node 3 is not running"
        );
        assert!(
            one.peers.pending.lock().unwrap().is_empty(),
            "finished calls leave nothing behind"
        );
        let deadline = Instant::now() + Duration::from_secs(3);
        while !one.heard_within(2, second) {
            assert!(Instant::now() < deadline, "node 2 answers pings");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !one.heard_within(3, Duration::from_secs(60)),
            "node 3 never answered a ping"
        );
    }

    /// With peer TLS, calls and a snapshot shipment (the blocking sender, and the receiver the
    /// transport hands an accepted TLS connection to) cross between nodes of one CA; a node with
    /// another CA's certificate reaches nobody and nobody reaches it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_peer_tls_calls_and_shipments_cross_and_another_cas_node_gets_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = |ca: &chorus_tls::LocalCa| PeerCredentials {
            secret: None,
            tls: Some(chorus_tls::PeerTls::load(&ca.peer_cert, &ca.peer_key, &ca.ca_cert).unwrap()),
        };
        let ours = credentials(&chorus_tls::write_local_ca(&dir.path().join("ours")).unwrap());
        let theirs = credentials(&chorus_tls::write_local_ca(&dir.path().join("theirs")).unwrap());
        let addrs = [(1, free_addr()), (2, free_addr()), (3, free_addr())];
        let (requests_tx, requests) = mpsc::channel(16);
        let (one, _) = node(1, &addrs, None, &dir.path().join("in1"), ours.clone()).await;
        let (_two, mut two_raft) = node(2, &addrs, Some(requests_tx), &dir.path().join("in2"), ours.clone()).await;
        echo(requests);
        let (outsider_requests_tx, mut outsider_requests) = mpsc::channel(16);
        let (outsider, _) = node(
            3,
            &addrs,
            Some(outsider_requests_tx),
            &dir.path().join("in3"),
            theirs.clone(),
        )
        .await;

        let deadline = Instant::now() + Duration::from_secs(5);
        while one.call(2, 7, b"up?", Duration::from_millis(100)).await.is_err() {
            assert!(Instant::now() < deadline, "node 2 never answered over TLS");
        }
        let mut expected = vec![7, b'x'];
        expected.extend_from_slice(&1u64.to_le_bytes());
        assert_eq!(one.call(2, 7, b"x", Duration::from_secs(1)).await.unwrap(), expected);
        for _ in 0..5 {
            assert!(one.call(3, 7, b"x", Duration::from_millis(200)).await.is_err());
            assert!(outsider.call(2, 7, b"x", Duration::from_millis(200)).await.is_err());
        }
        assert!(outsider_requests.try_recv().is_err(), "no request reached the outsider");

        let file = dir.path().join("0.seg");
        let content: Vec<u8> = (0..3_000_000u32).map(|b| (b % 251) as u8).collect();
        std::fs::write(&file, &content).unwrap();
        let mut msg = Message::default();
        msg.set_msg_type(MessageType::MsgSnapshot);
        msg.from = 1;
        msg.to = 2;
        msg.mut_snapshot().mut_metadata().term = 2;
        msg.mut_snapshot().mut_metadata().index = 30;
        let limits = crate::shipment::ShipLimits {
            max_frame_bytes: 1 << 20,
            bytes_per_sec: 0,
        };
        let files = vec![("0.seg".to_string(), file)];
        let ship = |credentials: PeerCredentials| {
            let (msg, files) = (msg.clone(), files.clone());
            let to = addrs[1].1;
            tokio::task::spawn_blocking(move || {
                let cancel = std::sync::atomic::AtomicBool::new(false);
                crate::shipment::send_snapshot(1, &credentials, 2, to, limits, &msg, &files, &cancel)
            })
        };
        assert!(ship(theirs).await.unwrap().is_err(), "another CA's node ships nothing");
        let stats = ship(ours).await.unwrap().unwrap();
        assert_eq!(stats.bytes_shipped, content.len() as u64);
        let received = tokio::time::timeout(Duration::from_secs(5), two_raft.recv())
            .await
            .unwrap();
        assert_eq!(received.unwrap(), msg);
        let landed = crate::shipment::staging_dir(&dir.path().join("in2"), 2, 30).join("0.seg");
        assert_eq!(std::fs::read(landed).unwrap(), content);
    }
}
