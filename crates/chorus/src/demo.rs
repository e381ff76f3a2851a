//! `chorus demo`: a local 3-node cluster under a mixed workload, with the leader SIGKILLed and
//! restarted midway, ending with a check that every acknowledged write is readable on every node.
//!
//! Each client owns its keys, so the expected final value of a key is well defined: the value of
//! its last acknowledged write, or of a later write whose outcome the client could not learn
//! (timeout or lost connection) and which may or may not have been applied.
//!
//! Writes are exactly-once (RIFL): each client owns a RIFL id, so a write whose connection died
//! with the killed leader is sent again to another node and executes at most once; its outcome
//! stays unknown only if no node settles it within `WRITE_SETTLE_GRACE` after the run.

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chorus_client::{Client, ClientError, RiflSession, RiflWrite, Value};
use hdrhistogram::Histogram;

use chorus_cluster as cluster;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Workload length in seconds.
    #[arg(long, default_value_t = 20)]
    duration_secs: u64,
    /// Concurrent clients, spread over all nodes.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Keys per client.
    #[arg(long, default_value_t = 200)]
    keys_per_client: usize,
    /// Directory for the cluster (default: a fresh temporary directory, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Leave the cluster running afterwards.
    #[arg(long)]
    keep: bool,
}

/// What one client knows about its own keys.
#[derive(Default)]
struct Ledger {
    /// Last acknowledged value per key.
    acked: HashMap<String, String>,
    /// Values written whose outcome is unknown, per key.
    uncertain: HashMap<String, HashSet<String>>,
    incr_acked: i64,
    incr_uncertain: i64,
}

#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    retryable_errors: AtomicU64,
    unknown_outcomes: AtomicU64,
    /// Of those, the ones a node answered TIMEOUT or UNCERTAIN (the rest were lost with their
    /// connection, mostly to the killed node).
    unknown_replies: AtomicU64,
    reconnects: AtomicU64,
}

struct Workload {
    addrs: Vec<SocketAddr>,
    counters: Counters,
    latency_us: Mutex<Histogram<u64>>,
    stop_at: Instant,
    keys_per_client: usize,
}

/// A cheap deterministic PRNG (xorshift) so each client's mix is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

enum Outcome {
    Ok(Value),
    Retry,
    /// The connection was lost with the command in flight.
    Unknown,
    /// The node answered TIMEOUT or UNCERTAIN.
    InDoubt,
}

/// Connects to the client's current node if it has no connection; `false` (after moving on to
/// the next node and a pause) if that failed.
async fn ensure_connected(client: &mut Option<Client>, w: &Workload, node: &mut usize) -> bool {
    if client.is_some() {
        return true;
    }
    match Client::connect(w.addrs[*node % w.addrs.len()]).await {
        Ok(c) => {
            *client = Some(c);
            true
        }
        Err(_) => {
            *node += 1;
            w.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
            false
        }
    }
}

async fn call<A: AsRef<[u8]>>(client: &mut Option<Client>, w: &Workload, node: &mut usize, args: &[A]) -> Outcome {
    if !ensure_connected(client, w, node).await {
        return Outcome::Retry;
    }
    let c = client.as_mut().expect("connected above");
    match c.command(args).await {
        Ok(Value::Error(e)) if e.starts_with("TRYAGAIN") => {
            w.counters.retryable_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Outcome::Retry
        }
        Ok(Value::Error(e)) if e.starts_with("TIMEOUT") || e.starts_with("UNCERTAIN") => Outcome::InDoubt,
        Ok(v) => Outcome::Ok(v),
        Err(ClientError::Timeout(_)) | Err(_) => {
            // The connection (or its node) is gone: whatever was in flight has an unknown outcome.
            *client = None;
            *node += 1;
            w.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            Outcome::Unknown
        }
    }
}

/// How long after the run a write in flight may take to settle before its outcome counts as
/// unknown.
const WRITE_SETTLE_GRACE: Duration = Duration::from_secs(10);

/// Sends a write under the client's RIFL id until some node settles it: again after a lost
/// connection, an election or a write left in doubt, since the id makes a repeat harmless.
/// `None` if none did within the grace after the run.
async fn write_once(
    client: &mut Option<Client>,
    session: &mut Option<RiflSession>,
    w: &Workload,
    node: &mut usize,
    args: &[&str],
) -> Option<Value> {
    let give_up_at = w.stop_at + WRITE_SETTLE_GRACE;
    let mut write: Option<RiflWrite> = None;
    let mut last = Outcome::Unknown;
    while Instant::now() < give_up_at {
        if !ensure_connected(client, w, node).await {
            continue;
        }
        if session.is_none() {
            match RiflSession::register(client.as_mut().expect("connected")).await {
                Ok(registered) => *session = Some(registered),
                Err(_) => {
                    *client = None;
                    *node += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        }
        let session = session.as_mut().expect("registered above");
        let wrapped = write.get_or_insert_with(|| session.wrap(args)).clone();
        let command: Vec<&[u8]> = wrapped.command.iter().map(Vec::as_slice).collect();
        match call(client, w, node, &command).await {
            Outcome::Ok(Value::Error(e)) if e.starts_with("OUTOFORDER") || e.starts_with("EXPIRED") => {
                // An earlier write of this id was never settled, or the id expired: neither can
                // happen to a client that waits for each answer within the lease.
                return Some(Value::Error(e));
            }
            Outcome::Ok(value) => {
                session.answered(&wrapped);
                return Some(value);
            }
            Outcome::Retry => {}
            outcome => last = outcome,
        }
    }
    if let Outcome::InDoubt = last {
        w.counters.unknown_replies.fetch_add(1, Ordering::Relaxed);
    }
    None
}

async fn run_client(id: usize, w: Arc<Workload>) -> anyhow::Result<Ledger> {
    let mut ledger = Ledger::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut node = id;
    let mut client = None;
    let mut session = None;
    let counter_key = format!("demo:{id}:counter");
    let mut seq = 0u64;
    while Instant::now() < w.stop_at {
        let key = format!("demo:{id}:{}", rng.next() % w.keys_per_client as u64);
        let roll = rng.next() % 100;
        let started = Instant::now();
        let done = if roll < 50 {
            seq += 1;
            let value = format!("{id}-{seq}-{}", rng.next() % 1_000_000);
            match write_once(&mut client, &mut session, &w, &mut node, &["SET", &key, &value]).await {
                Some(Value::Simple(ok)) if ok == "OK" => {
                    ledger.acked.insert(key.clone(), value);
                    ledger.uncertain.remove(&key);
                    true
                }
                Some(other) => bail!("SET {key} answered {other:?}"),
                None => {
                    w.counters.unknown_outcomes.fetch_add(1, Ordering::Relaxed);
                    ledger.uncertain.entry(key).or_default().insert(value);
                    false
                }
            }
        } else if roll < 80 {
            match call(&mut client, &w, &mut node, &["GET", &key]).await {
                Outcome::Ok(Value::Bulk(got)) => {
                    let got = got.map(|b| String::from_utf8_lossy(&b).into_owned());
                    check_value(&ledger, &key, got.as_deref())
                        .with_context(|| format!("client {id} read its own key {key}"))?;
                    true
                }
                Outcome::Ok(other) => bail!("GET {key} answered {other:?}"),
                _ => false,
            }
        } else {
            match write_once(&mut client, &mut session, &w, &mut node, &["INCR", &counter_key]).await {
                Some(Value::Integer(_)) => {
                    ledger.incr_acked += 1;
                    true
                }
                Some(other) => bail!("INCR {counter_key} answered {other:?}"),
                None => {
                    w.counters.unknown_outcomes.fetch_add(1, Ordering::Relaxed);
                    ledger.incr_uncertain += 1;
                    false
                }
            }
        };
        if done {
            w.counters.ops.fetch_add(1, Ordering::Relaxed);
            let us = started.elapsed().as_micros() as u64;
            w.latency_us
                .lock()
                .expect("histogram lock")
                .saturating_record(us.max(1));
        }
    }
    Ok(ledger)
}

/// A key's value must be its last acknowledged write or a later write of unknown outcome.
fn check_value(ledger: &Ledger, key: &str, got: Option<&str>) -> anyhow::Result<()> {
    let acked = ledger.acked.get(key).map(String::as_str);
    let uncertain = ledger.uncertain.get(key);
    let fine = got == acked || got.is_some_and(|g| uncertain.is_some_and(|u| u.contains(g)));
    if !fine {
        bail!("expected {acked:?} (or one of {uncertain:?}), found {got:?}");
    }
    Ok(())
}

async fn leader_of(dir: &std::path::Path, file: &cluster::ClusterFile) -> Option<(u64, u64)> {
    cluster::status(dir, file)
        .await
        .into_iter()
        .find(cluster::NodeState::is_leader)
        .map(|s| (s.entry.id, s.term))
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let (dir, remove_dir) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("chorus-demo-{}", std::process::id())),
            true,
        ),
    };
    if dir.join("cluster.toml").exists() {
        bail!("{} already holds a cluster; give the demo a fresh --dir", dir.display());
    }
    println!("Starting a 3-node Chorus cluster in {} ...", dir.display());
    let file = cluster::start(&dir, 3, Vec::new(), &cluster::NetOptions::default()).await?;
    cluster::print_status(&file, &cluster::status(&dir, &file).await);
    let result = drive(&args, &dir, &file).await;
    if args.keep {
        println!("cluster left running: chorus cluster status --dir {}", dir.display());
    } else {
        cluster::stop(&dir)?;
        if remove_dir && result.is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    result
}

async fn drive(args: &DemoArgs, dir: &std::path::Path, file: &cluster::ClusterFile) -> anyhow::Result<()> {
    let duration = Duration::from_secs(args.duration_secs.max(6));
    let started = Instant::now();
    let workload = Arc::new(Workload {
        addrs: file.nodes.iter().map(|n| n.resp_addr).collect(),
        counters: Counters::default(),
        latency_us: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")),
        stop_at: started + duration,
        keys_per_client: args.keys_per_client.max(1),
    });
    println!(
        "Driving {} clients for {} s (50% SET, 30% GET, 20% INCR); the leader is SIGKILLed at 40% and restarted 3 s later.",
        args.clients,
        duration.as_secs()
    );
    let clients: Vec<_> = (0..args.clients)
        .map(|id| tokio::spawn(run_client(id, workload.clone())))
        .collect();

    let kill_at = started + duration.mul_f64(0.4);
    let mut killed: Option<(u64, Instant)> = None;
    let mut restarted = false;
    let mut leaders_seen = Vec::new();
    let mut last_ops = 0;
    let mut last_tick = Instant::now();
    let mut events = Vec::new();
    let tty = std::io::stdout().is_terminal();
    while Instant::now() < workload.stop_at {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let leader = leader_of(dir, file).await;
        if let Some(l) = leader {
            if leaders_seen.last() != Some(&l) {
                leaders_seen.push(l);
            }
        }
        if killed.is_none() && Instant::now() >= kill_at {
            if let Some((id, _)) = leader {
                cluster::kill_node(dir, id)?;
                events.push(format!(
                    "{:.1}s: SIGKILL leader node {id}",
                    started.elapsed().as_secs_f64()
                ));
                killed = Some((id, Instant::now()));
            }
        }
        if let Some((id, at)) = killed {
            if !restarted && at.elapsed() >= Duration::from_secs(3) {
                cluster::start(dir, 3, Vec::new(), &cluster::NetOptions::default()).await?;
                events.push(format!("{:.1}s: node {id} restarted", started.elapsed().as_secs_f64()));
                restarted = true;
            }
        }
        let ops = workload.counters.ops.load(Ordering::Relaxed);
        let rate = (ops - last_ops) as f64 / last_tick.elapsed().as_secs_f64();
        last_ops = ops;
        last_tick = Instant::now();
        let leader_text = leader.map_or("none".into(), |(id, term)| format!("node {id} (term {term})"));
        // Redraw one line on a terminal; print a line per second into logs and pipes.
        let (start, end) = if tty { ("\r", "") } else { ("", "\n") };
        print!(
            "{start}  {:>5.1}s  ops {:>8}  {:>7.0} ops/s  retries {:>5}  unknown {:>3}  leader {:<18}{end}",
            started.elapsed().as_secs_f64(),
            ops,
            rate,
            workload.counters.retryable_errors.load(Ordering::Relaxed),
            workload.counters.unknown_outcomes.load(Ordering::Relaxed),
            leader_text
        );
        let _ = std::io::stdout().flush();
    }
    if tty {
        println!();
    }
    let mut ledgers = Vec::new();
    for c in clients {
        ledgers.push(c.await.context("client task panicked")??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    if !restarted {
        if let Some((id, _)) = killed {
            cluster::start(dir, 3, Vec::new(), &cluster::NetOptions::default()).await?;
            events.push(format!("node {id} restarted after the workload"));
        }
    }
    // Wait until the restarted node has caught up before checking it.
    cluster::wait_ready(dir, file, Duration::from_secs(30)).await?;

    let ops = workload.counters.ops.load(Ordering::Relaxed);
    let h = workload.latency_us.lock().expect("histogram lock").clone();
    println!("\nSummary");
    for e in &events {
        println!("  {e}");
    }
    println!(
        "  operations      {ops} in {elapsed:.1} s = {:.0} ops/s",
        ops as f64 / elapsed
    );
    println!(
        "  latency         p50 {:.2} ms   p99 {:.2} ms   max {:.2} ms",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
    println!(
        "  leader changes  {} (leaders seen: {})",
        leaders_seen.len().saturating_sub(1),
        leaders_seen
            .iter()
            .map(|(id, term)| format!("node {id}@term {term}"))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    let unknown = workload.counters.unknown_outcomes.load(Ordering::Relaxed);
    let answered_unknown = workload.counters.unknown_replies.load(Ordering::Relaxed);
    println!(
        "  retried         {} (TRYAGAIN during the election)   outcome unknown {unknown}: {answered_unknown} answered UNCERTAIN or TIMEOUT, {} lost with their connection",
        workload.counters.retryable_errors.load(Ordering::Relaxed),
        unknown - answered_unknown
    );
    verify(file, &ledgers).await
}

/// Reads every client's keys from every node (linearizable reads) and checks them.
async fn verify(file: &cluster::ClusterFile, ledgers: &[Ledger]) -> anyhow::Result<()> {
    let acked_writes: usize = ledgers.iter().map(|l| l.acked.len()).sum();
    let mut failures = Vec::new();
    for node in &file.nodes {
        let mut client = Client::connect(node.resp_addr).await?;
        let mut checked = 0usize;
        for (id, ledger) in ledgers.iter().enumerate() {
            let keys: Vec<&String> = ledger
                .acked
                .keys()
                .chain(ledger.uncertain.keys())
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            for chunk in keys.chunks(500) {
                let mut cmd: Vec<&str> = vec!["MGET"];
                cmd.extend(chunk.iter().map(|k| k.as_str()));
                let Value::Array(Some(values)) = client.command(&cmd).await? else {
                    bail!("MGET on node {} failed", node.id);
                };
                for (key, value) in chunk.iter().zip(values) {
                    let got = match value {
                        Value::Bulk(b) => b.map(|b| String::from_utf8_lossy(&b).into_owned()),
                        _ => None,
                    };
                    if let Err(e) = check_value(ledger, key, got.as_deref()) {
                        failures.push(format!("node {}: key {key}: {e}", node.id));
                    }
                    checked += 1;
                }
            }
            let counter = match client.command(&["GET", &format!("demo:{id}:counter")]).await? {
                Value::Bulk(Some(b)) => String::from_utf8_lossy(&b).parse::<i64>().unwrap_or(-1),
                _ => 0,
            };
            if counter < ledger.incr_acked || counter > ledger.incr_acked + ledger.incr_uncertain {
                failures.push(format!(
                    "node {}: counter of client {id} is {counter}, expected {} acknowledged increments (+ up to {} unknown)",
                    node.id, ledger.incr_acked, ledger.incr_uncertain
                ));
            }
        }
        println!(
            "  node {}: {checked} keys and {} counters checked",
            node.id,
            ledgers.len()
        );
    }
    if failures.is_empty() {
        println!("  CHECK PASSED: all {acked_writes} acknowledged keys and every acknowledged increment are readable on all 3 nodes");
        Ok(())
    } else {
        for f in failures.iter().take(20) {
            println!("  LOST: {f}");
        }
        bail!("{} acknowledged writes are missing or wrong", failures.len())
    }
}
