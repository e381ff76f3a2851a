//! Shipping a snapshot's files to a follower behind the compacted log, off the raft loop.
//!
//! A snapshot's data names the files that hold the state (the key-value store's segments); a
//! follower needs those files too. The leader's raft loop hands the snapshot message and the
//! state machine's pinned files to a sender thread, which dials the follower on a connection of
//! its own — raft traffic never queues behind a shipment — and speaks:
//!
//! ```text
//! sender                                      receiver
//! hello, offer (term, index, files: name, size) ─▶
//!                                           ◀─ resume (bytes of each file it already holds)
//! chunk (file, offset, bytes) … ─▶                each checked (frame CRC) and written at its offset;
//!                                                 a finished file is fsynced
//! raft MsgSnapshot ─▶                             every file complete: directory fsynced, the
//!                                                 message goes to the raft loop
//!                                           ◀─ done
//! ```
//!
//! Files land in `incoming/<term>-<index>/`. A broken connection leaves what arrived, and the next
//! offer of the same snapshot resumes from it; an offer of another snapshot removes it. Start-up
//! removes the whole `incoming` directory, so bytes that may not have survived a crash are never
//! trusted. The raft loop installs from the directory once raft accepts the message; until then
//! the follower serves from its old state.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chorus_metrics::{counter, Counter};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::sync::mpsc;

use crate::error::DecodeError;
use crate::frame::{self, FrameKind, FRAME_HEADER_BYTES};
use crate::peer_auth::{ClusterSecret, Dial, PeerCredentials};
use crate::peer_stream::BlockingPeerStream;
use crate::storage::sync_dir;
use crate::transport::PeerEvent;
use crate::wire::{put_blob, put_u32, put_u64, Reader};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A read or write that makes no progress this long ends the shipment (the next one resumes).
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// File bytes per chunk frame (less when the peers' frame limit is smaller).
const CHUNK_BYTES: usize = 1 << 20;
/// File number and offset before a chunk's bytes.
const CHUNK_HEADER_BYTES: usize = 4 + 8;
const MAX_NAME_BYTES: usize = 255;

/// Files a follower needs besides a snapshot's data, kept from deletion while `pin` lives.
pub struct SnapshotFiles {
    /// Each file's name (no directory) and where to read it, in the order they are sent.
    pub files: Vec<(String, PathBuf)>,
    pub pin: Box<dyn std::any::Any + Send>,
}

/// Where the files of the snapshot at `(term, index)` are received.
pub fn staging_dir(incoming: &Path, term: u64, index: u64) -> PathBuf {
    incoming.join(format!("{term:020}-{index:020}"))
}

/// What a sender offers: the snapshot it ships and each file's name and size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub term: u64,
    pub index: u64,
    pub files: Vec<(String, u64)>,
}

pub fn encode_offer(offer: &Offer) -> Vec<u8> {
    let mut out = Vec::new();
    put_u64(&mut out, offer.term);
    put_u64(&mut out, offer.index);
    put_u32(&mut out, offer.files.len() as u32);
    for (name, size) in &offer.files {
        put_blob(&mut out, name.as_bytes());
        put_u64(&mut out, *size);
    }
    out
}

/// An offer whose file names are plain, distinct names inside one directory.
pub fn decode_offer(payload: &[u8]) -> Result<Offer, DecodeError> {
    let mut r = Reader::new(payload);
    let term = r.u64()?;
    let index = r.u64()?;
    let count = r.u32()? as usize;
    let mut files = Vec::with_capacity(count.min(r.remaining() / 12));
    let mut names = HashSet::new();
    for _ in 0..count {
        let name = std::str::from_utf8(r.blob()?).map_err(|_| DecodeError::Invalid("file name"))?;
        let plain = !name.is_empty()
            && name.len() <= MAX_NAME_BYTES
            && name != "."
            && name != ".."
            && !name.contains(['/', '\0']);
        if !plain || !names.insert(name) {
            return Err(DecodeError::Invalid("file name"));
        }
        files.push((name.to_string(), r.u64()?));
    }
    r.finish()?;
    Ok(Offer { term, index, files })
}

pub fn encode_resume(held: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + held.len() * 8);
    put_u32(&mut out, held.len() as u32);
    for bytes in held {
        put_u64(&mut out, *bytes);
    }
    out
}

/// Bytes the receiver holds of each offered file.
pub fn decode_resume(payload: &[u8]) -> Result<Vec<u64>, DecodeError> {
    let mut r = Reader::new(payload);
    let count = r.u32()? as usize;
    let mut held = Vec::with_capacity(count.min(r.remaining() / 8));
    for _ in 0..count {
        held.push(r.u64()?);
    }
    r.finish()?;
    Ok(held)
}

/// Starts a chunk's payload in `out`: which file, at which offset; its bytes follow.
fn put_chunk_header(out: &mut Vec<u8>, file: usize, offset: u64) {
    put_u32(out, u32::try_from(file).expect("fewer than 2^32 files"));
    put_u64(out, offset);
}

pub fn encode_chunk(file: usize, offset: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK_HEADER_BYTES + bytes.len());
    put_chunk_header(&mut out, file, offset);
    out.extend_from_slice(bytes);
    out
}

/// A chunk: which file, at which offset, and its bytes.
pub fn decode_chunk(payload: &[u8]) -> Result<(usize, u64, &[u8]), DecodeError> {
    let mut r = Reader::new(payload);
    let file = r.u32()? as usize;
    let offset = r.u64()?;
    Ok((file, offset, r.bytes(r.remaining())?))
}

struct ShipMetrics {
    bytes_sent: Arc<Counter>,
    bytes_received: Arc<Counter>,
    bytes_resumed: Arc<Counter>,
}

impl ShipMetrics {
    fn get() -> ShipMetrics {
        ShipMetrics {
            bytes_sent: counter(
                "chorus_snapshot_bytes_sent_total",
                "Snapshot file bytes shipped to followers behind the compacted log",
            ),
            bytes_received: counter(
                "chorus_snapshot_bytes_received_total",
                "Snapshot file bytes received from a leader",
            ),
            bytes_resumed: counter(
                "chorus_snapshot_bytes_resumed_total",
                "Snapshot file bytes a follower already held from a broken shipment, not sent again",
            ),
        }
    }
}

fn write_frame(stream: &mut impl Write, kind: FrameKind, payload: &[u8], buf: &mut Vec<u8>) -> Result<(), String> {
    buf.clear();
    frame::encode_frame(kind, payload, buf);
    // Flushed: TLS holds records back until then.
    stream
        .write_all(buf)
        .and_then(|_| stream.flush())
        .map_err(|e| format!("write failed: {e}"))
}

/// Reads one frame; the connection ending here is an error, since both sides know what comes next.
fn read_frame(stream: &mut impl Read, max_frame_bytes: usize) -> Result<(FrameKind, Vec<u8>), String> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream
        .read_exact(&mut header)
        .map_err(|e| format!("read failed: {e}"))?;
    let header = frame::decode_header(&header, max_frame_bytes).map_err(|e| format!("bad frame header: {e}"))?;
    let mut payload = Vec::with_capacity(header.payload_len.min(CHUNK_BYTES + CHUNK_HEADER_BYTES));
    let read = stream
        .take(header.payload_len as u64)
        .read_to_end(&mut payload)
        .map_err(|e| format!("read failed: {e}"))?;
    if read != header.payload_len {
        return Err("connection closed mid-frame".into());
    }
    frame::verify_payload(&header, &payload).map_err(|e| format!("bad frame: {e}"))?;
    Ok((header.kind, payload))
}

/// What one shipment moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShipStats {
    /// File bytes this shipment carried.
    pub bytes_shipped: u64,
    /// Bytes the receiver already held from an earlier, broken shipment of the same snapshot.
    pub bytes_resumed: u64,
}

/// How a shipment is sent.
#[derive(Debug, Clone, Copy)]
pub struct ShipLimits {
    pub max_frame_bytes: usize,
    /// Most file bytes sent per second (0: no cap).
    pub bytes_per_sec: u64,
}

/// Ships `msg` (a MsgSnapshot) and its files to the node at `addr`, returning once the receiver
/// has the files durably and has handed the message to its raft loop. Stops early, with an
/// error, once `cancel` is set.
#[allow(clippy::too_many_arguments)]
pub fn send_snapshot(
    node_id: u64,
    credentials: &PeerCredentials,
    to: u64,
    addr: SocketAddr,
    limits: ShipLimits,
    msg: &Message,
    files: &[(String, PathBuf)],
    cancel: &AtomicBool,
) -> Result<ShipStats, String> {
    let ShipLimits {
        max_frame_bytes,
        bytes_per_sec,
    } = limits;
    let mut offered = Vec::with_capacity(files.len());
    for (name, path) in files {
        let size = std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        offered.push((name.clone(), size));
    }
    let meta = msg.get_snapshot().get_metadata();
    let offer = Offer {
        term: meta.term,
        index: meta.index,
        files: offered,
    };
    let tcp = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|_| tcp.set_write_timeout(Some(IO_TIMEOUT)))
        .and_then(|_| tcp.set_nodelay(true))
        .map_err(|e| e.to_string())?;
    let mut stream = BlockingPeerStream::dial(tcp, addr, credentials.tls.as_deref())?;
    let mut buf = Vec::new();
    dial_handshake(&mut stream, node_id, credentials.secret.as_ref(), to, &mut buf)?;
    write_frame(&mut stream, FrameKind::ShipOffer, &encode_offer(&offer), &mut buf)?;
    let held = match read_frame(&mut stream, max_frame_bytes)? {
        (FrameKind::ShipResume, payload) => decode_resume(&payload).map_err(|e| format!("bad resume: {e}"))?,
        (kind, _) => return Err(format!("expected a resume, got {kind:?}")),
    };
    if held.len() != files.len() || held.iter().zip(&offer.files).any(|(h, (_, size))| h > size) {
        return Err("the resume does not match the offer".into());
    }
    let chunk_bytes = CHUNK_BYTES
        .min(max_frame_bytes.saturating_sub(CHUNK_HEADER_BYTES))
        .max(1);
    let mut stats = ShipStats {
        bytes_resumed: held.iter().sum(),
        ..ShipStats::default()
    };
    let mut payload = Vec::with_capacity(CHUNK_HEADER_BYTES + chunk_bytes);
    let started = std::time::Instant::now();
    for (number, ((_, path), (_, size))) in files.iter().zip(&offer.files).enumerate() {
        let mut offset = held[number];
        if offset == *size {
            continue;
        }
        let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        while offset < *size {
            if cancel.load(Ordering::Relaxed) {
                return Err("superseded by a newer shipment".into());
            }
            let len = chunk_bytes.min((*size - offset) as usize);
            // Read straight into the payload rather than `encode_chunk` a copy.
            payload.clear();
            put_chunk_header(&mut payload, number, offset);
            payload.resize(CHUNK_HEADER_BYTES + len, 0);
            file.read_exact_at(&mut payload[CHUNK_HEADER_BYTES..], offset)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            write_frame(&mut stream, FrameKind::ShipChunk, &payload, &mut buf)?;
            offset += len as u64;
            stats.bytes_shipped += len as u64;
            if bytes_per_sec > 0 {
                // Never ahead of the cap since the shipment began.
                let due = Duration::from_secs_f64(stats.bytes_shipped as f64 / bytes_per_sec as f64);
                if let Some(early) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(early);
                }
            }
        }
    }
    let raft = msg.write_to_bytes().expect("encoding a raft message cannot fail");
    write_frame(&mut stream, FrameKind::Raft, &raft, &mut buf)?;
    match read_frame(&mut stream, max_frame_bytes)? {
        (FrameKind::ShipDone, _) => Ok(stats),
        (kind, _) => Err(format!("expected done, got {kind:?}")),
    }
}

/// The dialer's half of the peer handshake (`peer_auth`; the transport's, blocking).
fn dial_handshake(
    stream: &mut BlockingPeerStream,
    node_id: u64,
    secret: Option<&ClusterSecret>,
    to: u64,
    buf: &mut Vec<u8>,
) -> Result<(), String> {
    let Some(secret) = secret else {
        return stream
            .write_all(&frame::encode_hello(node_id, None))
            .and_then(|_| stream.flush())
            .map_err(|e| format!("write failed: {e}"));
    };
    let (dial, hello) = Dial::start(secret, node_id, to);
    write_frame(stream, FrameKind::Hello, &hello, buf)?;
    let proof = match read_frame(stream, 64)? {
        (FrameKind::Challenge, payload) => dial.answer(&payload)?,
        (kind, _) => return Err(format!("expected a challenge, got {kind:?}")),
    };
    write_frame(stream, FrameKind::Proof, &proof, buf)
}

/// Starts one sender thread per shipment; a newer shipment to the same peer supersedes the older.
pub struct Shipper {
    node_id: u64,
    credentials: PeerCredentials,
    peers: HashMap<u64, SocketAddr>,
    limits: ShipLimits,
    events: mpsc::UnboundedSender<PeerEvent>,
    running: HashMap<u64, Arc<AtomicBool>>,
}

impl Shipper {
    pub fn new(
        node_id: u64,
        credentials: PeerCredentials,
        peers: HashMap<u64, SocketAddr>,
        max_frame_bytes: usize,
        bytes_per_sec: u64,
        events: mpsc::UnboundedSender<PeerEvent>,
    ) -> Shipper {
        Shipper {
            node_id,
            credentials,
            peers,
            limits: ShipLimits {
                max_frame_bytes,
                bytes_per_sec,
            },
            events,
            running: HashMap::new(),
        }
    }

    /// Where each peer listens, after a membership change.
    pub fn set_peers(&mut self, peers: HashMap<u64, SocketAddr>) {
        self.peers = peers;
    }

    /// Ships `msg` and `files` to `to` on a thread of its own; the outcome comes back as
    /// `PeerEvent::SnapshotSent`, except for a shipment superseded by a newer one (raft already
    /// moved on from it).
    pub fn ship(&mut self, to: u64, msg: Message, files: SnapshotFiles) {
        let Some(addr) = self.peers.get(&to).copied() else {
            // Reported as failed, or raft would wait on this shipment forever.
            tracing::warn!(to, "snapshot for an unknown peer dropped");
            let _ = self.events.send(PeerEvent::SnapshotSent { to, delivered: false });
            return;
        };
        let cancel = Arc::new(AtomicBool::new(false));
        if let Some(previous) = self.running.insert(to, cancel.clone()) {
            previous.store(true, Ordering::Relaxed);
        }
        let (node_id, limits, events) = (self.node_id, self.limits, self.events.clone());
        let credentials = self.credentials.clone();
        let spawned = std::thread::Builder::new()
            .name("snapshot-sender".into())
            .spawn(move || {
                let metrics = ShipMetrics::get();
                let index = msg.get_snapshot().get_metadata().index;
                let outcome = send_snapshot(node_id, &credentials, to, addr, limits, &msg, &files.files, &cancel);
                drop(files);
                match &outcome {
                    Ok(stats) => {
                        metrics.bytes_sent.add(stats.bytes_shipped);
                        tracing::info!(
                            to,
                            index,
                            bytes_shipped = stats.bytes_shipped,
                            bytes_resumed = stats.bytes_resumed,
                            "snapshot shipped"
                        );
                    }
                    Err(reason) => tracing::warn!(to, index, %reason, "snapshot shipment failed"),
                }
                if !cancel.load(Ordering::Relaxed) {
                    let _ = events.send(PeerEvent::SnapshotSent {
                        to,
                        delivered: outcome.is_ok(),
                    });
                }
            });
        if let Err(e) = spawned {
            tracing::error!(to, error = %e, "cannot start a snapshot sender");
            let _ = self.events.send(PeerEvent::SnapshotSent { to, delivered: false });
        }
    }
}

/// The receiving side's context, shared by the transport's connections.
pub struct Receiver {
    node_id: u64,
    /// Where shipments land (see `staging_dir`).
    incoming: PathBuf,
    max_frame_bytes: usize,
    inbound: mpsc::Sender<Message>,
    /// Held while a shipment is received: one at a time.
    busy: Mutex<()>,
    /// The last shipment handed to the raft loop, which installs from it (and removes it) once
    /// raft accepts it: a later offer leaves it alone.
    handed_over: Mutex<Option<PathBuf>>,
}

impl Receiver {
    pub fn new(node_id: u64, incoming: PathBuf, max_frame_bytes: usize, inbound: mpsc::Sender<Message>) -> Receiver {
        Receiver {
            node_id,
            incoming,
            max_frame_bytes,
            inbound,
            busy: Mutex::new(()),
            handed_over: Mutex::new(None),
        }
    }

    /// Receives the shipment `offer` opened on `stream` from node `from`, as the module comment
    /// describes. Blocking: run it off the async runtime.
    pub fn receive(&self, mut stream: BlockingPeerStream, from: u64, offer: &[u8]) -> Result<ShipStats, String> {
        let offer = decode_offer(offer).map_err(|e| format!("bad offer: {e}"))?;
        // A receiver that failed (even by panicking) leaves nothing half-done that the next
        // offer does not check, so a poisoned lock is simply taken.
        let _busy = match self.busy.try_lock() {
            Ok(busy) => busy,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err("another snapshot is being received".into()),
        };
        let socket = stream.socket();
        socket
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|_| socket.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        let dir = staging_dir(&self.incoming, offer.term, offer.index);
        let mut held = self
            .prepare(&dir, &offer)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let metrics = ShipMetrics::get();
        let mut stats = ShipStats {
            bytes_resumed: held.iter().sum(),
            ..ShipStats::default()
        };
        metrics.bytes_resumed.add(stats.bytes_resumed);
        let mut buf = Vec::new();
        write_frame(&mut stream, FrameKind::ShipResume, &encode_resume(&held), &mut buf)?;
        let mut open: HashMap<usize, File> = HashMap::new();
        loop {
            let (kind, payload) = read_frame(&mut stream, self.max_frame_bytes)?;
            match kind {
                FrameKind::ShipChunk => {
                    let (number, offset, bytes) = decode_chunk(&payload).map_err(|e| format!("bad chunk: {e}"))?;
                    let (name, size) = offer
                        .files
                        .get(number)
                        .ok_or_else(|| format!("chunk of file {number}, {} offered", offer.files.len()))?;
                    if offset != held[number] || offset + bytes.len() as u64 > *size {
                        return Err(format!(
                            "chunk of {name} at {offset}+{}: expected one at {} within {size}",
                            bytes.len(),
                            held[number]
                        ));
                    }
                    let path = dir.join(name);
                    let io = |e: std::io::Error| format!("{}: {e}", path.display());
                    let file = match open.entry(number) {
                        std::collections::hash_map::Entry::Occupied(file) => file.into_mut(),
                        // Resuming: the bytes already held stay.
                        std::collections::hash_map::Entry::Vacant(slot) => slot.insert(
                            OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(false)
                                .open(&path)
                                .map_err(io)?,
                        ),
                    };
                    file.write_all_at(bytes, offset).map_err(io)?;
                    held[number] += bytes.len() as u64;
                    stats.bytes_shipped += bytes.len() as u64;
                    metrics.bytes_received.add(bytes.len() as u64);
                    if held[number] == *size {
                        open.remove(&number).expect("opened above").sync_data().map_err(io)?;
                    }
                }
                FrameKind::Raft => {
                    if let Some(name) = offer
                        .files
                        .iter()
                        .zip(&held)
                        .find_map(|((n, s), h)| (h < s).then_some(n))
                    {
                        return Err(format!("the snapshot message came before all of {name}"));
                    }
                    let msg = Message::parse_from_bytes(&payload).map_err(|e| format!("bad raft message: {e}"))?;
                    let meta = msg.get_snapshot().get_metadata();
                    if msg.get_msg_type() != MessageType::MsgSnapshot
                        || msg.from != from
                        || msg.to != self.node_id
                        || (meta.term, meta.index) != (offer.term, offer.index)
                    {
                        return Err(format!(
                            "{:?} from {} to {} at ({}, {}) ends a shipment of the snapshot at ({}, {})",
                            msg.get_msg_type(),
                            msg.from,
                            msg.to,
                            meta.term,
                            meta.index,
                            offer.term,
                            offer.index
                        ));
                    }
                    sync_dir(&dir)
                        .and_then(|_| sync_dir(&self.incoming))
                        .map_err(|e| e.to_string())?;
                    *self.handed_over.lock().expect("not poisoned") = Some(dir.clone());
                    self.inbound
                        .blocking_send(msg)
                        .map_err(|_| "the raft loop has stopped".to_string())?;
                    write_frame(&mut stream, FrameKind::ShipDone, &[], &mut buf)?;
                    return Ok(stats);
                }
                other => return Err(format!("unexpected {other:?} frame in a shipment")),
            }
        }
    }

    /// Empties `incoming` of other snapshots' files (but the one last handed to the raft loop)
    /// and returns how many bytes of each offered file `dir` already holds (a file longer than
    /// offered starts over).
    fn prepare(&self, dir: &Path, offer: &Offer) -> std::io::Result<Vec<u64>> {
        std::fs::create_dir_all(&self.incoming)?;
        let handed_over = self.handed_over.lock().expect("not poisoned").clone();
        for entry in std::fs::read_dir(&self.incoming)? {
            let path = entry?.path();
            if path != dir && Some(&path) != handed_over.as_ref() {
                std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path))?;
            }
        }
        std::fs::create_dir_all(dir)?;
        let mut held = Vec::with_capacity(offer.files.len());
        for (name, size) in &offer.files {
            let path = dir.join(name);
            let bytes = match std::fs::metadata(&path) {
                Ok(meta) if meta.len() <= *size => meta.len(),
                Ok(_) => {
                    OpenOptions::new().write(true).open(&path)?.set_len(0)?;
                    0
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if *size == 0 {
                        File::create(&path)?;
                    }
                    0
                }
                Err(e) => return Err(e),
            };
            held.push(bytes);
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_resumes_and_chunks_round_trip_and_bad_names_are_refused() {
        let offer = Offer {
            term: 3,
            index: 99,
            files: vec![("a.seg".into(), 10), ("b.seg".into(), 0)],
        };
        assert_eq!(decode_offer(&encode_offer(&offer)).unwrap(), offer);
        for bad in ["", ".", "..", "../x", "a/b", "a\0"] {
            let offer = Offer {
                files: vec![(bad.into(), 1)],
                ..offer.clone()
            };
            assert!(decode_offer(&encode_offer(&offer)).is_err(), "{bad:?}");
        }
        let twice = Offer {
            files: vec![("a".into(), 1), ("a".into(), 2)],
            ..offer.clone()
        };
        assert!(decode_offer(&encode_offer(&twice)).is_err());
        let bytes = encode_offer(&offer);
        for len in 0..bytes.len() {
            assert!(decode_offer(&bytes[..len]).is_err());
        }
        assert_eq!(decode_resume(&encode_resume(&[4, 0])).unwrap(), vec![4, 0]);
        assert!(decode_resume(&encode_resume(&[4, 0])[..11]).is_err());
        let chunk = encode_chunk(2, 7, b"xyz");
        assert_eq!(decode_chunk(&chunk).unwrap(), (2, 7, &b"xyz"[..]));
        assert!(decode_chunk(&chunk[..5]).is_err());
    }

    /// A follower's side of one connection, as the transport runs it: hello, offer, receive.
    fn accept_one(listener: &std::net::TcpListener, receiver: &Receiver) -> Result<ShipStats, String> {
        let (mut stream, _) = listener.accept().unwrap();
        let (kind, hello) = read_frame(&mut stream, 64).unwrap();
        assert_eq!(kind, FrameKind::Hello);
        let (from, _) = frame::decode_hello(&hello).unwrap();
        let (kind, offer) = read_frame(&mut stream, 1 << 20)?;
        assert_eq!(kind, FrameKind::ShipOffer);
        receiver.receive(BlockingPeerStream::Plain(stream), from, &offer)
    }

    fn snapshot_message(term: u64, index: u64) -> Message {
        let mut msg = Message::default();
        msg.set_msg_type(MessageType::MsgSnapshot);
        msg.from = 1;
        msg.to = 2;
        msg.mut_snapshot().mut_metadata().term = term;
        msg.mut_snapshot().mut_metadata().index = index;
        msg
    }

    #[test]
    fn a_broken_shipment_resumes_where_it_stopped_and_lands_every_byte() {
        const MAX_FRAME_BYTES: usize = 64 * 1024;
        let source = tempfile::tempdir().unwrap();
        let sizes = [300_000usize, 0, 70_000, 5];
        let files: Vec<(String, PathBuf)> = sizes
            .iter()
            .enumerate()
            .map(|(i, size)| {
                let name = format!("{i}.seg");
                let path = source.path().join(&name);
                let bytes: Vec<u8> = (0..*size).map(|b| (b * 31 + i) as u8).collect();
                std::fs::write(&path, bytes).unwrap();
                (name, path)
            })
            .collect();
        let data_dir = tempfile::tempdir().unwrap();
        let incoming = data_dir.path().join("incoming");
        // Another snapshot's partial files, which the offer removes.
        std::fs::create_dir_all(staging_dir(&incoming, 1, 5)).unwrap();
        std::fs::write(staging_dir(&incoming, 1, 5).join("0.seg"), b"old").unwrap();
        let (inbound, mut raft_loop) = mpsc::channel(4);
        let receiver = Receiver::new(2, incoming.clone(), MAX_FRAME_BYTES, inbound);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let msg = snapshot_message(3, 40);

        // First attempt: the sender dies after 100,000 bytes of the first file.
        let partial = std::thread::scope(|scope| {
            let receiving = scope.spawn(|| accept_one(&listener, &receiver));
            let mut stream = TcpStream::connect(addr).unwrap();
            let mut buf = Vec::new();
            stream.write_all(&frame::encode_hello(1, None)).unwrap();
            let offer = Offer {
                term: 3,
                index: 40,
                files: files
                    .iter()
                    .zip(sizes)
                    .map(|((n, _), s)| (n.clone(), s as u64))
                    .collect(),
            };
            write_frame(&mut stream, FrameKind::ShipOffer, &encode_offer(&offer), &mut buf).unwrap();
            let (kind, resume) = read_frame(&mut stream, MAX_FRAME_BYTES).unwrap();
            assert_eq!(
                (kind, decode_resume(&resume).unwrap()),
                (FrameKind::ShipResume, vec![0; 4])
            );
            let content = std::fs::read(&files[0].1).unwrap();
            for offset in (0..100_000).step_by(50_000) {
                let payload = encode_chunk(0, offset as u64, &content[offset..offset + 50_000]);
                write_frame(&mut stream, FrameKind::ShipChunk, &payload, &mut buf).unwrap();
            }
            drop(stream);
            receiving.join().unwrap()
        });
        assert!(partial.is_err(), "a shipment cut short fails");
        assert!(!staging_dir(&incoming, 1, 5).exists(), "another snapshot's files go");
        assert!(
            raft_loop.try_recv().is_err(),
            "nothing reaches raft before every file has"
        );

        // Second attempt, by the real sender under a cap of 1 MB/s: only the rest travels, and
        // no faster than the cap.
        let limits = ShipLimits {
            max_frame_bytes: MAX_FRAME_BYTES,
            bytes_per_sec: 1_000_000,
        };
        let started = std::time::Instant::now();
        let (sent, received) = std::thread::scope(|scope| {
            let receiving = scope.spawn(|| accept_one(&listener, &receiver));
            let sent = send_snapshot(
                1,
                &PeerCredentials::default(),
                2,
                addr,
                limits,
                &msg,
                &files,
                &AtomicBool::new(false),
            );
            (sent, receiving.join().unwrap())
        });
        let total: u64 = sizes.iter().map(|s| *s as u64).sum();
        assert!(
            started.elapsed() >= Duration::from_secs_f64((total - 100_000) as f64 / 1e6),
            "{:?} for {} bytes at 1 MB/s",
            started.elapsed(),
            total - 100_000
        );
        let expected = ShipStats {
            bytes_shipped: total - 100_000,
            bytes_resumed: 100_000,
        };
        assert_eq!(sent.unwrap(), expected);
        assert_eq!(received.unwrap(), expected);
        assert_eq!(raft_loop.try_recv().unwrap(), msg);
        for (name, path) in &files {
            assert_eq!(
                std::fs::read(staging_dir(&incoming, 3, 40).join(name)).unwrap(),
                std::fs::read(path).unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn a_chunk_out_of_place_or_a_foreign_message_ends_the_shipment() {
        let data_dir = tempfile::tempdir().unwrap();
        let (inbound, mut raft_loop) = mpsc::channel(4);
        let receiver = Receiver::new(2, data_dir.path().join("incoming"), 1 << 20, inbound);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let offer = Offer {
            term: 3,
            index: 40,
            files: vec![("a".into(), 10)],
        };
        let chunk_at = |offset: u64, bytes: &[u8]| (FrameKind::ShipChunk, encode_chunk(0, offset, bytes));
        let wrong_snapshot = (FrameKind::Raft, snapshot_message(3, 41).write_to_bytes().unwrap());
        let cases = [
            vec![chunk_at(5, b"12345")],
            vec![chunk_at(0, b"12345678901")],
            vec![
                chunk_at(0, b"12345"),
                (FrameKind::Raft, snapshot_message(3, 40).write_to_bytes().unwrap()),
            ],
            vec![chunk_at(0, b"1234567890"), wrong_snapshot.clone()],
            vec![(FrameKind::Ping, 7u64.to_le_bytes().to_vec())],
        ];
        for frames in cases {
            let outcome = std::thread::scope(|scope| {
                let receiving = scope.spawn(|| accept_one(&listener, &receiver));
                let mut stream = TcpStream::connect(addr).unwrap();
                let mut buf = Vec::new();
                stream.write_all(&frame::encode_hello(1, None)).unwrap();
                write_frame(&mut stream, FrameKind::ShipOffer, &encode_offer(&offer), &mut buf).unwrap();
                read_frame(&mut stream, 1 << 20).unwrap();
                for (kind, payload) in &frames {
                    write_frame(&mut stream, *kind, payload, &mut buf).unwrap();
                }
                receiving.join().unwrap()
            });
            assert!(outcome.is_err(), "{frames:?}");
            assert!(raft_loop.try_recv().is_err(), "{frames:?}");
        }
    }
}
