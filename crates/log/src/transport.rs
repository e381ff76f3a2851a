//! Peer transport over TCP. Each node dials every peer for its outgoing messages and accepts
//! connections for incoming ones, so a connection carries traffic one way only.
//!
//! Outgoing messages go through a bounded queue per peer: the raft loop never blocks on a slow or
//! dead peer; when a queue is full the message is dropped and counted (raft retransmits). While a
//! peer is unreachable its queue is drained and discarded, and the raft loop is told so the
//! leader probes instead of streaming into the void.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chorus_metrics::{labeled_counter, Counter};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::frame::{self, FrameKind, FRAME_HEADER_BYTES};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Coalesce queued messages into one write up to this many bytes.
const WRITE_BATCH_BYTES: usize = 1024 * 1024;

/// Something the raft loop must hear about from the transport.
#[derive(Debug)]
pub enum PeerEvent {
    Unreachable(u64),
    SnapshotSent { to: u64, delivered: bool },
}

#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub node_id: u64,
    pub listen_addr: SocketAddr,
    /// Every other voter.
    pub peers: Vec<(u64, SocketAddr)>,
    pub max_frame_bytes: usize,
    pub queue_messages: usize,
}

struct PeerMetrics {
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

fn rejected_frames() -> Arc<Counter> {
    chorus_metrics::counter(
        "chorus_peer_connections_rejected_total",
        "Inbound peer connections closed for malformed, oversized or unexpected frames",
    )
}

/// Binds the peer listener and starts one sender task per peer. Returns the per-peer queues.
pub async fn start(
    config: TransportConfig,
    inbound: mpsc::Sender<Message>,
    events: mpsc::UnboundedSender<PeerEvent>,
) -> std::io::Result<HashMap<u64, mpsc::Sender<Message>>> {
    let listener = TcpListener::bind(config.listen_addr).await?;
    let known: Arc<HashMap<u64, PeerMetrics>> = Arc::new(
        config
            .peers
            .iter()
            .map(|(id, _)| (*id, PeerMetrics::new(*id)))
            .collect(),
    );
    tokio::spawn(accept_loop(listener, config.clone(), known.clone(), inbound));
    let mut queues = HashMap::new();
    for (peer, addr) in &config.peers {
        let (tx, rx) = mpsc::channel(config.queue_messages);
        queues.insert(*peer, tx);
        tokio::spawn(sender_loop(
            *peer,
            *addr,
            config.node_id,
            rx,
            events.clone(),
            known.clone(),
        ));
    }
    Ok(queues)
}

async fn accept_loop(
    listener: TcpListener,
    config: TransportConfig,
    known: Arc<HashMap<u64, PeerMetrics>>,
    inbound: mpsc::Sender<Message>,
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
        let (config, known, inbound) = (config.clone(), known.clone(), inbound.clone());
        tokio::spawn(async move {
            if let Err(reason) = receive_from(stream, &config, &known, &inbound).await {
                rejected_frames().inc();
                tracing::warn!(%remote, %reason, "closed inbound peer connection");
            }
        });
    }
}

/// Reads one frame; errors describe what was wrong for the log line.
async fn read_frame(stream: &mut TcpStream, max_frame_bytes: usize) -> Result<Option<(FrameKind, Vec<u8>)>, String> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    match stream.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(format!("read failed: {e}")),
    }
    let header = frame::decode_header(&header, max_frame_bytes).map_err(|e| format!("bad frame header: {e}"))?;
    // Grow the buffer as bytes arrive rather than trusting the length up front.
    let mut payload = Vec::with_capacity(header.payload_len.min(1 << 20));
    let read = stream
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
    mut stream: TcpStream,
    config: &TransportConfig,
    known: &HashMap<u64, PeerMetrics>,
    inbound: &mpsc::Sender<Message>,
) -> Result<(), String> {
    let hello = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut stream, 64))
        .await
        .map_err(|_| "no hello within 5 s".to_string())??;
    let from = match hello {
        Some((FrameKind::Hello, payload)) => frame::decode_hello(&payload).map_err(|e| format!("bad hello: {e}"))?,
        Some((kind, _)) => return Err(format!("expected hello, got {kind:?}")),
        None => return Ok(()),
    };
    let metrics = known
        .get(&from)
        .ok_or_else(|| format!("hello from unknown node {from}"))?;
    while let Some((kind, payload)) = read_frame(&mut stream, config.max_frame_bytes).await? {
        if kind != FrameKind::Raft {
            return Err(format!("unexpected {kind:?} frame"));
        }
        let msg = Message::parse_from_bytes(&payload).map_err(|e| format!("bad raft message: {e}"))?;
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

async fn sender_loop(
    peer: u64,
    addr: SocketAddr,
    node_id: u64,
    mut queue: mpsc::Receiver<Message>,
    events: mpsc::UnboundedSender<PeerEvent>,
    known: Arc<HashMap<u64, PeerMetrics>>,
) {
    let metrics = known.get(&peer).expect("metrics for every peer");
    let mut backoff = BACKOFF_MIN;
    let mut reported_down = false;
    loop {
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await;
        let outcome = match connected {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                backoff = BACKOFF_MIN;
                if reported_down {
                    tracing::info!(peer, %addr, "peer reachable again");
                    reported_down = false;
                }
                send_to(stream, node_id, &mut queue, &events, metrics).await
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
                msg = queue.recv() => match msg {
                    None => return,
                    Some(msg) if msg.get_msg_type() == MessageType::MsgSnapshot => {
                        let _ = events.send(PeerEvent::SnapshotSent { to: peer, delivered: false });
                    }
                    Some(_) => {}
                },
            }
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Streams queued messages to a connected peer. `Ok` means the queue closed (shutdown).
async fn send_to(
    mut stream: TcpStream,
    node_id: u64,
    queue: &mut mpsc::Receiver<Message>,
    events: &mpsc::UnboundedSender<PeerEvent>,
    metrics: &PeerMetrics,
) -> Result<(), String> {
    stream
        .write_all(&frame::encode_hello(node_id))
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut snapshots = Vec::new();
    loop {
        let Some(first) = queue.recv().await else {
            return Ok(());
        };
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            if msg.get_msg_type() == MessageType::MsgSnapshot {
                snapshots.push(msg.to);
            }
            metrics.messages_sent.inc();
            metrics.entries_sent.add(msg.entries.len() as u64);
            let payload = msg.write_to_bytes().expect("encoding a raft message cannot fail");
            frame::encode_frame(FrameKind::Raft, &payload, &mut buf);
            if buf.len() < WRITE_BATCH_BYTES {
                next = queue.try_recv().ok();
            }
        }
        let written = stream.write_all(&buf).await;
        metrics.bytes_sent.add(buf.len() as u64);
        buf.clear();
        let delivered = written.is_ok();
        for to in snapshots.drain(..) {
            let _ = events.send(PeerEvent::SnapshotSent { to, delivered });
        }
        written.map_err(|e| e.to_string())?;
    }
}
