//! `chorus bench ldc-costs`: the three prices a logically disaggregated cache (LDC, issue 14)
//! trades against each other, measured on this machine — a local cache hit, a remote hit (a value
//! fetched from a peer's memory over Chorus's own peer transport, on loopback) and a device read
//! (a random 4 KiB `O_DIRECT` read, what a miss costs once values are read past the page cache).
//! Whether serving a miss from a peer pays, and how much of the hot set is worth caching on every
//! replica, follows from their ratio: the paper's RDMA remote hit costs a few µs against tens of
//! µs for an SSD read; over TCP the remote hit is a round trip through two kernels.
//!
//! The peer transport here is the real one (`chorus_log::transport`), both ends in this process
//! on two threads of their own, as two nodes each run one; the CPU figures are this process's,
//! both ends together, per value fetched or read.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chorus_log::transport::{self, PeerCalls, Services, TransportConfig};
use serde::Serialize;

use crate::cpu::process_times;
use crate::report::{self, LatencySummary};
use crate::rng::Rng;

/// The peer service the bench's remote end answers (any number the log does not keep).
const SERVICE_FETCH: u8 = 200;
const BLOCK_BYTES: usize = 4096;

#[derive(clap::Args)]
pub struct LdcCostsArgs {
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 5.0)]
    pub duration_secs: f64,
    /// Size of the file the device reads come from; large against the disk's own caches.
    #[arg(long, default_value_t = 2048)]
    pub file_mib: u64,
    /// Where that file is written (default: the system's temporary directory). Put it on the
    /// device the nodes' data would live on.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keys the remote end holds in memory (24-byte keys, as the paper's).
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Values fetched per remote call, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub batches: Vec<usize>,
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
struct Measurement {
    what: String,
    /// Values read or fetched per operation.
    values_per_op: usize,
    ops: u64,
    ops_per_sec: f64,
    latency_ms: LatencySummary,
    /// This process's CPU (both ends, for remote fetches) per value.
    cpu_us_per_value: f64,
}

#[derive(Serialize)]
struct Report<'a> {
    git_revision: String,
    machine: report::Machine,
    file_mib: u64,
    keys: usize,
    value_bytes: usize,
    measurements: &'a [Measurement],
    /// Device read p50 over a single remote fetch's p50.
    device_over_remote_p50: Option<f64>,
}

pub fn run(args: LdcCostsArgs) -> anyhow::Result<()> {
    if args.batches.contains(&0) {
        bail!("a remote call fetches at least one value");
    }
    let duration = Duration::from_secs_f64(args.duration_secs);
    let mut measurements = vec![local_hits(&args, duration)];
    for &batch in &args.batches {
        measurements.push(remote_fetches(&args, batch, duration)?);
    }
    measurements.push(device_reads(&args, duration)?);

    println!("\n| what | values/op | ops/s | p50 µs | p99 µs | CPU µs/value |");
    println!("|---|---|---|---|---|---|");
    for m in &measurements {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.2} |",
            m.what,
            m.values_per_op,
            m.ops_per_sec,
            m.latency_ms.p50 * 1000.0,
            m.latency_ms.p99 * 1000.0,
            m.cpu_us_per_value
        );
    }
    let p50 = |what: &str, per_op: usize| {
        measurements
            .iter()
            .find(|m| m.what == what && m.values_per_op == per_op)
            .map(|m| m.latency_ms.p50)
    };
    let device_over_remote_p50 = match (p50("device read", 1), p50("remote hit", 1)) {
        (Some(device), Some(remote)) if remote > 0.0 => Some(device / remote),
        _ => None,
    };
    if let Some(ratio) = device_over_remote_p50 {
        println!("\na device read takes {ratio:.2}× a remote hit (p50)");
    }
    let json = report::output_path(&args.out, "ldc-costs", "json")?;
    report::write_json(
        &json,
        &Report {
            git_revision: report::git_revision(),
            machine: report::Machine::current(),
            file_mib: args.file_mib,
            keys: args.keys,
            value_bytes: args.value_bytes,
            measurements: &measurements,
            device_over_remote_p50,
        },
    )?;
    println!("results: {}", json.display());
    Ok(())
}

fn key(i: usize) -> Vec<u8> {
    format!("user{i:020}").into_bytes()
}

fn cpu_secs() -> f64 {
    process_times(std::process::id()).map_or(0.0, |t| t.total_secs())
}

/// Runs `op` (returning the values it handled) until `duration` passes, with a progress line a
/// second, and measures it.
fn measure(
    what: &str,
    values_per_op: usize,
    duration: Duration,
    mut op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Measurement> {
    let mut latency_us = crate::driver::histogram(3);
    let cpu_before = cpu_secs();
    let started = Instant::now();
    let mut next_report = Duration::from_secs(1);
    let mut ops = 0u64;
    while started.elapsed() < duration {
        let sent = Instant::now();
        op()?;
        latency_us.saturating_record(sent.elapsed().as_micros() as u64);
        ops += 1;
        if started.elapsed() >= next_report {
            println!(
                "  {what} ×{values_per_op}  {:.0}s  {ops} ops",
                next_report.as_secs_f64()
            );
            next_report += Duration::from_secs(1);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu_before;
    Ok(Measurement {
        what: what.to_string(),
        values_per_op,
        ops,
        ops_per_sec: ops as f64 / elapsed,
        latency_ms: LatencySummary::from_histogram(&latency_us),
        cpu_us_per_value: cpu * 1e6 / (ops as f64 * values_per_op as f64).max(1.0),
    })
}

/// Lookups in an in-memory map of the same keys: the floor both others are compared with.
fn local_hits(args: &LdcCostsArgs, duration: Duration) -> Measurement {
    let map = value_map(args);
    let keys: Vec<Vec<u8>> = (0..args.keys).map(key).collect();
    let mut rng = Rng::new(1);
    let mut found = 0usize;
    // Timed in runs of 1,000 lookups: one lookup is below the clock's resolution.
    const PER_OP: usize = 1_000;
    let mut m = measure("local hit", PER_OP, duration, || {
        for _ in 0..PER_OP {
            found += usize::from(map.contains_key(&keys[rng.below(args.keys as u64) as usize]));
        }
        Ok(())
    })
    .expect("lookups do not fail");
    assert_eq!(found as u64, m.ops * PER_OP as u64, "every key is in the map");
    m.latency_ms = LatencySummary {
        mean: m.latency_ms.mean / PER_OP as f64,
        p50: m.latency_ms.p50 / PER_OP as f64,
        p90: m.latency_ms.p90 / PER_OP as f64,
        p99: m.latency_ms.p99 / PER_OP as f64,
        p999: m.latency_ms.p999 / PER_OP as f64,
        max: m.latency_ms.max / PER_OP as f64,
        count: m.latency_ms.count,
    };
    m.values_per_op = 1;
    m.ops *= PER_OP as u64;
    m.ops_per_sec *= PER_OP as f64;
    m
}

fn value_map(args: &LdcCostsArgs) -> HashMap<Vec<u8>, (u64, Vec<u8>)> {
    (0..args.keys)
        .map(|i| (key(i), (i as u64 + 1, vec![b'v'; args.value_bytes])))
        .collect()
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Fetches of `batch` values from a peer's memory over the peer transport, one call at a time:
/// the request names the keys, the response carries each one's version (the log index of its
/// last write, which LDC compares with its own index's) and value.
fn remote_fetches(args: &LdcCostsArgs, batch: usize, duration: Duration) -> anyhow::Result<Measurement> {
    let addrs = [(1u64, free_addr()?), (2u64, free_addr()?)];
    let incoming = std::env::temp_dir().join(format!("chorus-ldc-costs-{}", std::process::id()));
    let config = |id: u64| TransportConfig {
        node_id: id,
        listen_addr: addrs.iter().find(|(n, _)| *n == id).expect("listed").1,
        peers: addrs.iter().filter(|(n, _)| *n != id).cloned().collect(),
        max_frame_bytes: 1 << 20,
        queue_messages: 1024,
        incoming_dir: incoming.clone(),
        credentials: Default::default(),
    };
    let map = Arc::new(value_map(args));
    // The remote end: its own thread and runtime, as a node's.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let remote_config = config(2);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let (requests_tx, mut requests) = tokio::sync::mpsc::channel(4096);
            let (raft_tx, _raft_rx) = tokio::sync::mpsc::channel(16);
            let (events_tx, _events_rx) = tokio::sync::mpsc::unbounded_channel();
            let services = Services {
                log: None,
                application: Some(requests_tx),
            };
            let started = transport::start(remote_config, raft_tx, events_tx, services).await;
            let _ = ready_tx.send(started.is_ok());
            let _keep = started;
            while let Some(request) = requests.recv().await {
                let answer = answer_fetch(&map, &request.body);
                request.respond(&answer);
            }
        });
    });
    if !ready_rx.recv().unwrap_or(false) {
        bail!("the remote end could not start its transport");
    }
    let (keys, local) = (args.keys, config(1));
    // The asking end on a thread of its own too: `chorus` itself runs in a runtime.
    let asking = std::thread::spawn(move || fetch_from_remote(keys, local, batch, duration));
    let m = asking
        .join()
        .map_err(|_| anyhow::anyhow!("the asking thread panicked"))??;
    let _ = std::fs::remove_dir_all(&incoming);
    Ok(m)
}

fn fetch_from_remote(
    keys: usize,
    config: TransportConfig,
    batch: usize,
    duration: Duration,
) -> anyhow::Result<Measurement> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (calls, _keep) = runtime.block_on(async {
        let (raft_tx, raft_rx) = tokio::sync::mpsc::channel(16);
        let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
        let services = Services {
            log: None,
            application: None,
        };
        let (queues, _, calls) = transport::start(config, raft_tx, events_tx, services).await?;
        anyhow::Ok((calls, (queues, raft_rx, events_rx)))
    })?;
    wait_until_connected(&runtime, &calls)?;
    let mut rng = Rng::new(batch as u64);
    let mut body = Vec::new();
    measure("remote hit", batch, duration, || {
        body.clear();
        for _ in 0..batch {
            let k = key(rng.below(keys as u64) as usize);
            body.push(k.len() as u8);
            body.extend_from_slice(&k);
        }
        let response = runtime
            .block_on(calls.call(2, SERVICE_FETCH, &body, Duration::from_secs(1)))
            .context("remote fetch")?;
        let values = count_values(&response).context("malformed fetch response")?;
        if values != batch {
            bail!("asked for {batch} values, got {values}");
        }
        Ok(())
    })
}

fn wait_until_connected(runtime: &tokio::runtime::Runtime, calls: &PeerCalls) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe = [key(0).len() as u8].into_iter().chain(key(0)).collect::<Vec<u8>>();
    while runtime
        .block_on(calls.call(2, SERVICE_FETCH, &probe, Duration::from_millis(100)))
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("the remote end did not answer within 10 s");
        }
    }
    Ok(())
}

/// The remote end's answer: for each key asked (a length byte and the key), a found byte, then
/// if found the version (8 bytes) and the value (a 4-byte length and the bytes).
fn answer_fetch(map: &HashMap<Vec<u8>, (u64, Vec<u8>)>, mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some((&len, rest)) = body.split_first() {
        let Some((key, rest)) = rest.split_at_checked(len as usize) else {
            break;
        };
        body = rest;
        match map.get(key) {
            Some((version, value)) => {
                out.push(1);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            None => out.push(0),
        }
    }
    out
}

fn count_values(mut response: &[u8]) -> Option<usize> {
    let mut values = 0;
    while let Some((&found, rest)) = response.split_first() {
        response = rest;
        if found == 1 {
            let (_version, rest) = response.split_at_checked(8)?;
            let (len, rest) = rest.split_at_checked(4)?;
            let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
            response = rest.get(len..)?;
            values += 1;
        }
    }
    Some(values)
}

/// Random block reads past the page cache, one at a time, from a file written for the purpose.
fn device_reads(args: &LdcCostsArgs, duration: Duration) -> anyhow::Result<Measurement> {
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("chorus-ldc-costs-{}.data", std::process::id()));
    let blocks = args.file_mib * 1024 * 1024 / BLOCK_BYTES as u64;
    if blocks == 0 {
        bail!("--file-mib must be at least 1");
    }
    println!("  writing {} MiB to {}", args.file_mib, path.display());
    {
        let mut file = File::create(&path).with_context(|| format!("create {}", path.display()))?;
        let chunk: Vec<u8> = (0..1 << 20)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        for _ in 0..args.file_mib {
            file.write_all(&chunk)?;
        }
        file.sync_all()?;
    }
    let result = read_blocks(&path, blocks, duration);
    let _ = std::fs::remove_file(&path);
    result
}

fn read_blocks(path: &std::path::Path, blocks: u64, duration: Duration) -> anyhow::Result<Measurement> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("open {} with O_DIRECT", path.display()))?;
    let mut buffer = AlignedBlock::new();
    let mut rng = Rng::new(7);
    measure("device read", 1, duration, || {
        let offset = rng.below(blocks) * BLOCK_BYTES as u64;
        let read = file.read_at(buffer.as_mut(), offset)?;
        if read != BLOCK_BYTES {
            bail!("short read of {read} bytes at {offset}");
        }
        Ok(())
    })
}

/// One block-aligned block, as `O_DIRECT` needs.
struct AlignedBlock {
    ptr: *mut u8,
}

impl AlignedBlock {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(BLOCK_BYTES, BLOCK_BYTES).expect("valid layout")
    }

    fn new() -> AlignedBlock {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        assert!(!ptr.is_null(), "out of memory");
        AlignedBlock { ptr }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds BLOCK_BYTES bytes, owned by this value for its life.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, BLOCK_BYTES) }
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr, Self::layout()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_answers_each_key_and_its_count_reads_back() {
        let args = LdcCostsArgs {
            duration_secs: 0.0,
            file_mib: 1,
            dir: None,
            keys: 10,
            value_bytes: 100,
            batches: vec![1],
            out: PathBuf::new(),
        };
        let map = value_map(&args);
        let mut body = Vec::new();
        for k in [key(3), b"missing".to_vec(), key(9)] {
            body.push(k.len() as u8);
            body.extend_from_slice(&k);
        }
        let response = answer_fetch(&map, &body);
        assert_eq!(count_values(&response), Some(2));
        assert_eq!(count_values(&response[..response.len() - 1]), None, "truncated");
    }
}
