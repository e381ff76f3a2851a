//! `chorus chaos run` and `chorus chaos campaign`: a local cluster, recording clients, the fault
//! schedule, then healing, a full restart, final reads from every node, and the check.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chorus_client::Client;
use chorus_cluster::NetOptions;
use serde::Serialize;

use crate::bank;
use crate::checker::{self, Verdict};
use crate::curp_tally::CurpTally;
use crate::disks::PowerCutDisks;
use crate::faults::{self, Applied, FaultKind, Planned, Target};
use crate::history::{self, OpKind, Outcome};
use crate::idioms;
use crate::workload::{self, Mix, Recorder};

/// What the clients of a run do, and so what is checked.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Reads, writes and increments of a few keys; the history must be linearizable.
    Registers,
    /// Locks (SET NX PX, released by a compare-and-delete script) and queues (RPUSH, BLPOP):
    /// no lock held twice, no queue item lost or delivered twice (see `idioms`).
    Idioms,
    /// Transfers between accounts on a SQL cluster (`chorus sql`): every read sees the same
    /// total, and the ledger, the balances and the acknowledged transfers agree on every node
    /// (see `bank`).
    Bank,
}

#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Length of the faulty part of the run.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Seed of the fault schedule and the clients' choices; a run is replayed by its seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Which faults to draw from (default: all that apply: crash-postgres-random on the
    /// PostgreSQL engine only).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<FaultKind>,
    /// Concurrent clients, each on a random node.
    #[arg(long, default_value_t = 6)]
    pub clients: usize,
    /// Further clients that only read, each on a random node.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Of `clients`, how many own a RIFL id and send a write whose outcome is unknown again to
    /// another node (so a write that executed is sent again, and must not execute twice).
    #[arg(long, default_value_t = 3)]
    pub resending: usize,
    /// Keys the clients share (fewer keys, more contention).
    #[arg(long, default_value_t = 4)]
    pub keys: usize,
    /// Where runs keep their history, schedule and result.
    #[arg(long, default_value = "chaos-results")]
    pub out: PathBuf,
    /// Extra `chorus server` flags for every node, e.g. "--read-consistency stale" to check that
    /// the checker catches a broken build. With the bank workload, "--sql-mode hybrid" certifies
    /// by the bank's branches unless --sql-conflict-classes says otherwise.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub server_flags: String,
    /// Give up checking after this many seconds (the run then counts as failed).
    #[arg(long, default_value_t = 120)]
    pub check_secs: u64,
    /// Network profile between the nodes; it must put proxies on every link so that links can
    /// be cut. `lan-slow-proxied` (20 ms between nodes) widens the windows between a reply and
    /// a commit that CURP's fast path opens.
    #[arg(long, default_value = "lan-proxied")]
    pub net: String,
    /// What the clients do: `registers` (checked for linearizability) or `idioms` (locks and
    /// queues; `clients` take the roles of lock holder, producer and consumer in turn).
    #[arg(long, value_enum, default_value = "registers")]
    pub workload: Workload,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub seed: u64,
    pub workload: Workload,
    pub nodes: usize,
    pub duration_secs: u64,
    pub operations: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
    pub faults: Vec<Applied>,
    /// Files and directory entries that power cuts (faults and the final one) rolled back to
    /// their synced state: zero would mean the cuts never caught a node with unsynced writes.
    pub rolled_back_by_cuts: usize,
    /// How often CURP's paths ran (all zero with CURP off).
    pub curp: CurpTally,
    pub verdict: String,
    pub passed: bool,
    pub dir: PathBuf,
    /// Stopped by an interrupt (Ctrl-C or SIGTERM): a campaign ends there.
    pub interrupted: bool,
}

impl RunSummary {
    pub fn passed(&self) -> bool {
        self.passed
    }
}

fn stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{secs}")
}

/// Final reads of every key from every node, after healing and a full restart, recorded like
/// any other operation: the checker then also proves no acknowledged write was lost.
async fn final_reads(recorder: &Recorder, file: &chorus_cluster::ClusterFile, keys: usize) -> anyhow::Result<()> {
    for node in &file.nodes {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut client = loop {
            match Client::connect(node.resp_addr).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => return Err(e).context("final reads: node unreachable"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        for k in 0..keys {
            let key = format!("k{k}");
            loop {
                let before = recorder.ops.lock().expect("history lock").len();
                workload::execute(
                    recorder,
                    &mut client,
                    10_000 + node.id,
                    node.id,
                    OpKind::Read,
                    &key,
                    None,
                )
                .await;
                let succeeded = {
                    let ops = recorder.ops.lock().expect("history lock");
                    ops.len() > before && ops[before].outcome == Outcome::Ok
                };
                if succeeded {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("final read of {key} on node {} did not succeed", node.id);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    Ok(())
}

/// One run; leaves its directory (history, schedule, result) and returns the summary. A run
/// that cannot finish (a node that will not come back, a key no node will serve) is a failed
/// run, not an error: it may be the very bug the run is looking for, so its history so far and
/// the cluster's data are kept like those of a violation.
pub async fn run(args: &RunArgs) -> anyhow::Result<RunSummary> {
    let mut server_args: Vec<String> = args.server_flags.split_whitespace().map(str::to_string).collect();
    let hybrid = server_args
        .windows(2)
        .any(|flag| flag[0] == "--sql-mode" && flag[1] == "hybrid");
    if args.workload == Workload::Bank && hybrid && !server_args.iter().any(|a| a == "--sql-conflict-classes") {
        // Hybrid mode certifies by class: the bank's are its branches.
        server_args.extend(["--sql-conflict-classes".to_string(), bank::BRANCH_CLASSES.to_string()]);
    }
    let on_postgres = args.workload == Workload::Bank && chorus_cluster::postgres::engine_chosen(&server_args);
    let kinds = if args.faults.is_empty() {
        FaultKind::defaults(on_postgres)
    } else {
        args.faults.clone()
    };
    if !on_postgres && kinds.iter().any(|k| k.needs_postgres()) {
        bail!("crash-postgres-random needs the bank workload on the PostgreSQL engine (--server-flags \"--sql-engine postgres\")");
    }
    let dir = args.out.join(format!("{}-n{}-seed{}", stamp(), args.nodes, args.seed));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cluster_dir = dir.join("cluster");
    let net = NetOptions {
        profile: Some(args.net.clone()),
        bandwidth_mbit: None,
    };
    let proxied = net.resolve()?.is_some_and(|profile| profile.proxied);
    if kinds.iter().any(|k| k.cuts_links()) && !proxied {
        bail!(
            "partition faults need a network profile with proxies on every link (proxied = true), not '{}'",
            args.net
        );
    }
    if kinds.contains(&FaultKind::ReplaceRandom) {
        if proxied {
            bail!(
                "replace-random changes members, whose peers reach them at the one address the log records: \
                 run it with --net lan and without partition faults"
            );
        }
        if args.workload == Workload::Idioms || kinds.iter().any(|k| k.cuts_power()) {
            bail!(
                "replace-random runs with the registers or bank workload and without power cuts (new nodes have no \
                 power-cut disk)"
            );
        }
    }
    let plan = faults::schedule(args.seed, &kinds, Duration::from_secs(args.duration_secs));
    std::fs::write(dir.join("schedule.json"), serde_json::to_string_pretty(&plan)?)?;

    let disks = if kinds.iter().any(|k| k.cuts_power()) {
        let ids: Vec<u64> = (1..=args.nodes as u64).collect();
        Some(Mutex::new(PowerCutDisks::mount(&cluster_dir, &ids)?))
    } else {
        None
    };

    let recorder = Recorder::new();
    let idiom_log = Arc::new(idioms::Log::default());
    let bank_log = Arc::new(bank::Log::default());
    let mut applied = Vec::new();
    let mut interrupted = false;
    let started = if args.workload == Workload::Bank {
        chorus_cluster::start_sql(&cluster_dir, args.nodes, server_args, &net).await
    } else {
        chorus_cluster::start(&cluster_dir, args.nodes, server_args, &net).await
    };
    let driven = match started {
        Ok(file) => {
            let target = Target {
                dir: &cluster_dir,
                net: &net,
                disks: disks.as_ref(),
                nodes: Arc::new(std::sync::RwLock::new(
                    file.nodes.iter().map(|n| (n.id, n.resp_addr)).collect(),
                )),
            };
            // Interrupted (Ctrl-C, or SIGTERM as `timeout` sends), the run still stops its nodes,
            // unmounts its disks and keeps its records.
            let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            let driven = tokio::select! {
                driven = drive(args, &target, &plan, &recorder, &idiom_log, &bank_log, &mut applied) => driven,
                _ = tokio::signal::ctrl_c() => {
                    interrupted = true;
                    Err(anyhow::anyhow!("interrupted"))
                }
                _ = terminate.recv() => {
                    interrupted = true;
                    Err(anyhow::anyhow!("terminated"))
                }
            };
            let _ = chorus_cluster::stop(&cluster_dir);
            driven
        }
        Err(e) => {
            let _ = chorus_cluster::stop(&cluster_dir);
            Err(e.context("the cluster did not start"))
        }
    };

    let ops = std::mem::take(&mut *recorder.ops.lock().expect("history lock"));
    history::write_history(&dir.join("history.jsonl"), &ops)?;
    let events = std::mem::take(&mut *idiom_log.events.lock().expect("idioms log"));
    history::write_history(&dir.join("idioms.jsonl"), &events)?;
    let final_rolled_back = driven.as_ref().map_or(0, |(rolled_back, _)| *rolled_back);
    let verdict = match driven.map(|(_, violations)| violations) {
        Ok(violations) if args.workload == Workload::Bank => {
            let (committed, refused, unknown, reads) = bank_log.counts();
            eprintln!("  checked {committed} committed, {refused} refused, {unknown} unknown transfers, {reads} reads");
            if violations.is_empty() {
                BANK_HELD.to_string()
            } else {
                std::fs::write(dir.join("violations.txt"), violations.join("\n") + "\n")?;
                format!(
                    "VIOLATED {} times (all in violations.txt), first: {}",
                    violations.len(),
                    violations[0]
                )
            }
        }
        Ok(_) if args.workload == Workload::Idioms => {
            eprintln!("  checking {} lock and queue events", events.len());
            let violations = idioms::check(&events);
            if violations.is_empty() {
                IDIOMS_HELD.to_string()
            } else {
                std::fs::write(dir.join("violations.txt"), violations.join("\n") + "\n")?;
                let first: Vec<&str> = violations.iter().take(3).map(String::as_str).collect();
                format!(
                    "VIOLATED {} times (all in violations.txt), first: {}",
                    violations.len(),
                    first.join("; ")
                )
            }
        }
        Ok(_) => {
            eprintln!("  checking {} operations", ops.len());
            match checker::check(&ops, Duration::from_secs(args.check_secs)) {
                Verdict::Linearizable => LINEARIZABLE.to_string(),
                Verdict::Violation { key, ops: involved } => {
                    history::write_history(&dir.join("violation.jsonl"), &involved)?;
                    format!("NOT linearizable: key {key} (its operations are in violation.jsonl)")
                }
                Verdict::GaveUp { key } => format!("checker gave up on key {key} after {} s", args.check_secs),
            }
        }
        Err(e) => format!("run failed: {e:#}"),
    };
    let count = |o: Outcome| ops.iter().filter(|op| op.outcome == o).count();
    let passed = verdict == LINEARIZABLE || verdict == IDIOMS_HELD || verdict == BANK_HELD;
    let (bank_committed, bank_refused, bank_unknown, bank_reads) = bank_log.counts();
    let known_events = events.iter().filter(|e| e.outcome_known()).count();
    let summary = RunSummary {
        seed: args.seed,
        workload: args.workload,
        nodes: args.nodes,
        duration_secs: args.duration_secs,
        operations: ops.len() + events.len() + bank_committed + bank_refused + bank_unknown + bank_reads as usize,
        // The idiom clients count what they record: known outcomes and unknown ones.
        ok: count(Outcome::Ok) + known_events + bank_committed + bank_reads as usize,
        failed: count(Outcome::Fail) + bank_refused,
        unknown: count(Outcome::Unknown) + (events.len() - known_events) + bank_unknown,
        rolled_back_by_cuts: applied.iter().map(|a| a.rolled_back_by_cut).sum::<usize>() + final_rolled_back,
        faults: applied,
        curp: recorder.curp.total(),
        verdict,
        passed,
        dir: dir.clone(),
        interrupted,
    };
    std::fs::write(dir.join("result.json"), serde_json::to_string_pretty(&summary)?)?;
    if let Some(disks) = disks {
        let disks = disks.into_inner().expect("disks lock");
        if !summary.passed() {
            disks.save()?;
        }
    }
    if summary.passed() {
        // The data of a passing run is not needed; its history, schedule and result stay.
        let _ = std::fs::remove_dir_all(&cluster_dir);
    }
    Ok(summary)
}

const LINEARIZABLE: &str = "linearizable";
const IDIOMS_HELD: &str = "no lock held twice, no queue item lost or delivered twice";
const BANK_HELD: &str =
    "every total read was the bank's; ledger, balances and acknowledged transfers agree on every node";

/// Clients record operations while the planned faults come and go; then everything heals, every
/// node restarts and every key is read from every node (or, for the idioms, every queue).
async fn drive(
    args: &RunArgs,
    target: &Target<'_>,
    plan: &[Planned],
    recorder: &Arc<Recorder>,
    idiom_log: &Arc<idioms::Log>,
    bank_log: &Arc<bank::Log>,
    applied: &mut Vec<Applied>,
) -> anyhow::Result<(usize, Vec<String>)> {
    let file = target.file()?;
    // Straight to the nodes: a client proxy would accept connections for a node that is down,
    // and every request sent that way would end with an unknown outcome.
    let nodes: Vec<_> = target.nodes.read().expect("node list").clone();
    // Both sets abort their tasks when dropped, so a run cut short leaves nothing running.
    let mut clients = tokio::task::JoinSet::new();
    if args.workload == Workload::Idioms {
        let addrs: Vec<_> = nodes.iter().map(|(_, addr)| *addr).collect();
        for id in 0..args.clients as u64 {
            let (recorder, log) = (recorder.clone(), idiom_log.clone());
            clients.spawn(idioms::client_loop(recorder, log, id, addrs.clone(), args.seed));
        }
    }
    if args.workload == Workload::Bank {
        bank::setup(&nodes).await?;
        for id in 0..(args.clients + args.readers) as u64 {
            let (recorder, log) = (recorder.clone(), bank_log.clone());
            let reader = id >= args.clients as u64;
            let members = target.nodes.clone();
            clients.spawn(bank::client_loop(recorder, log, id, reader, members, args.seed));
        }
    }
    let register_clients = match args.workload {
        Workload::Registers => args.clients + args.readers,
        Workload::Idioms | Workload::Bank => 0,
    };
    for id in 0..register_clients as u64 {
        let mix = if id < args.clients as u64 {
            Mix::Mixed
        } else {
            Mix::ReadsOnly
        };
        clients.spawn(workload::client_loop(
            recorder.clone(),
            id,
            mix,
            id < args.resending.min(args.clients) as u64,
            target.nodes.clone(),
            args.keys,
            args.seed,
        ));
    }
    let metrics_addrs: Vec<_> = file.nodes.iter().map(|n| (n.id, n.metrics_addr)).collect();
    let mut progress = tokio::task::JoinSet::new();
    {
        let (recorder, metrics_addrs) = (recorder.clone(), metrics_addrs.clone());
        progress.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                recorder.curp.sample(&metrics_addrs).await;
                let tally = recorder.curp.total();
                let curp_line = if tally.any() {
                    format!(
                        "  curp fast {} slow {} recoveries {} recovered {}",
                        tally.fast_path_writes, tally.slow_path_writes, tally.recoveries, tally.recovered_writes
                    )
                } else {
                    String::new()
                };
                eprintln!(
                    "  {:>4.0}s  completed {:>6}  unknown {:>4}{curp_line}",
                    recorder.elapsed().as_secs_f64(),
                    recorder.completed.load(Ordering::Relaxed),
                    recorder.unknown.load(Ordering::Relaxed)
                );
            }
        });
    }
    for planned in plan {
        tokio::time::sleep(Duration::from_millis(planned.quiet_ms)).await;
        let mut fault = target.apply(planned, recorder.elapsed().as_millis() as u64).await?;
        let cut = if fault.kind.cuts_power() {
            format!(" ({} files and entries rolled back)", fault.rolled_back_by_cut)
        } else {
            String::new()
        };
        eprintln!(
            "  {:>4.0}s  fault {:?} on {:?} for {} ms{cut}",
            recorder.elapsed().as_secs_f64(),
            fault.kind,
            fault.nodes,
            planned.duration_ms
        );
        tokio::time::sleep(Duration::from_millis(planned.duration_ms)).await;
        target.heal(&fault).await?;
        fault.healed_at_ms = Some(recorder.elapsed().as_millis() as u64);
        applied.push(fault);
    }
    recorder.stop.store(true, Ordering::Relaxed);
    while clients.join_next().await.is_some() {}
    progress.abort_all();
    let power = if target.disks.is_some() {
        ", cutting its power"
    } else {
        ""
    };
    eprintln!("  healing, restarting every node{power}, reading every key from every node");
    recorder.curp.sample(&metrics_addrs).await;
    let rolled_back = target.full_restart().await?;
    let mut violations = Vec::new();
    match args.workload {
        Workload::Registers => final_reads(recorder, &target.file()?, args.keys).await?,
        Workload::Idioms => {
            let addrs: Vec<_> = nodes.iter().map(|(_, addr)| *addr).collect();
            idioms::drain(idiom_log, &addrs).await?;
        }
        Workload::Bank => {
            let members = target.nodes.read().expect("node list").clone();
            violations = bank::check(bank_log, &members).await?;
        }
    }
    recorder.curp.sample(&metrics_addrs).await;
    Ok((rolled_back, violations))
}

pub fn print_summary(s: &RunSummary) {
    let cuts = if s.faults.iter().any(|f| f.kind.cuts_power()) {
        format!(" (power cuts rolled back {} files and entries)", s.rolled_back_by_cuts)
    } else {
        String::new()
    };
    let curp = if s.curp.any() {
        format!(
            " (CURP: {} fast-path writes, {} slow, {} recoveries replaying {})",
            s.curp.fast_path_writes, s.curp.slow_path_writes, s.curp.recoveries, s.curp.recovered_writes
        )
    } else {
        String::new()
    };
    println!(
        "seed {} nodes {}: {} operations ({} ok, {} failed, {} unknown), {} faults{cuts}{curp}: {}  [{}]",
        s.seed,
        s.nodes,
        s.operations,
        s.ok,
        s.failed,
        s.unknown,
        s.faults.len(),
        s.verdict,
        s.dir.display()
    );
}

#[derive(clap::Args, Clone, Debug)]
pub struct CampaignArgs {
    /// Number of runs; node counts alternate between 3 and 5, seeds count up from --seed.
    #[arg(long, default_value_t = 60)]
    pub runs: usize,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Serialize)]
struct Campaign<'a> {
    runs: &'a [RunSummary],
    passed: usize,
    operations: usize,
    faults: usize,
}

/// Many runs; a summary at the end; fails if any run failed.
pub async fn campaign(args: &CampaignArgs) -> anyhow::Result<()> {
    let mut summaries = Vec::new();
    for i in 0..args.runs {
        let mut run_args = args.run.clone();
        run_args.seed = args.run.seed + i as u64;
        run_args.nodes = if i % 2 == 0 { 3 } else { 5 };
        eprintln!(
            "== run {}/{}: {} nodes, seed {}",
            i + 1,
            args.runs,
            run_args.nodes,
            run_args.seed
        );
        let summary = run(&run_args).await?;
        print_summary(&summary);
        let interrupted = summary.interrupted;
        summaries.push(summary);
        if interrupted {
            break;
        }
    }
    let passed = summaries.iter().filter(|s| s.passed()).count();
    let campaign = Campaign {
        runs: &summaries,
        passed,
        operations: summaries.iter().map(|s| s.operations).sum(),
        faults: summaries.iter().map(|s| s.faults.len()).sum(),
    };
    let path = args.run.out.join(format!("campaign-{}.json", stamp()));
    std::fs::write(&path, serde_json::to_string_pretty(&campaign)?)?;
    let held = match args.run.workload {
        Workload::Registers => "linearizable with no acknowledged write lost",
        Workload::Idioms => "with no lock held twice and no queue item lost or delivered twice",
        Workload::Bank => "with every total the bank's and ledger, balances and acknowledged transfers agreeing",
    };
    println!(
        "{passed} of {} runs {held}; {} operations, {} faults; {}",
        summaries.len(),
        campaign.operations,
        campaign.faults,
        path.display()
    );
    if passed != summaries.len() {
        bail!("{} run(s) failed", summaries.len() - passed);
    }
    Ok(())
}

#[derive(clap::Subcommand)]
pub enum ChaosCommand {
    /// One run: clients record a history while faults are injected; then heal, restart every
    /// node, read every key everywhere, and check linearizability. Exits non-zero on a violation
    /// and leaves history.jsonl, schedule.json and result.json (replay with the same --seed).
    Run(RunArgs),
    /// Many runs (alternating 3 and 5 nodes, consecutive seeds) and a summary.
    Campaign(CampaignArgs),
    /// Checks a recorded history again.
    Check {
        /// A history.jsonl written by a run.
        history: PathBuf,
        #[arg(long, default_value_t = 120)]
        check_secs: u64,
    },
}

pub async fn main(command: ChaosCommand) -> anyhow::Result<()> {
    match command {
        ChaosCommand::Run(args) => {
            let summary = run(&args).await?;
            print_summary(&summary);
            if !summary.passed() {
                bail!("{}", summary.verdict);
            }
            Ok(())
        }
        ChaosCommand::Campaign(args) => campaign(&args).await,
        ChaosCommand::Check { history, check_secs } => {
            let ops = history::read_history(&history)?;
            match checker::check(&ops, Duration::from_secs(check_secs)) {
                Verdict::Linearizable => {
                    println!("{} operations: linearizable", ops.len());
                    Ok(())
                }
                Verdict::Violation { key, .. } => bail!("not linearizable: key {key}"),
                Verdict::GaveUp { key } => bail!("gave up on key {key}"),
            }
        }
    }
}
