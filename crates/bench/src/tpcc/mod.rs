//! `chorus bench tpcc`: TPC-C over the PostgreSQL wire protocol (tokio-postgres), the same
//! driver for Chorus SQL and for PostgreSQL alone or with streaming replication.
//!
//! What is TPC-C here and what is not: the nine tables with the specified cardinalities, the
//! five transactions with the standard mix (45% new-order, 43% payment, 4% each of
//! order-status, delivery and stock-level), NURand inputs, 1% of new orders rolled back, 15%
//! remote payments and 1% remote order lines; no think or keying time (each terminal sends its
//! next transaction at once), terminals not tied to one district, money in integer cents, and
//! each transaction's statements pipelined (see `terminal`). tpmC is committed new orders per
//! minute; the consistency conditions 1–4 are checked after every run.

mod random;
mod schema;
mod terminal;

pub use schema::{check_consistency, load};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio_postgres::Client;

use crate::cli::NetArgs;
use crate::cpu::{CpuMeter, ServerCpu};
use crate::peers::{PeerCluster, System};
use crate::plot::{self, BarGroup};
use crate::report::{self, LatencySummary, Machine};
use terminal::{Kind, Outcome, Terminal};

/// The systems one command can start and measure in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SqlSystem {
    /// A 3-node Chorus SQL cluster (`chorus cluster start --sql`), SQLite, active replication.
    ChorusSqlite,
    /// The same with passive replication (`-- --sql-mode passive`): replicas apply write-sets.
    ChorusSqlitePassive,
    /// The same with hybrid replication (`-- --sql-mode hybrid`, classes by warehouse): every
    /// node executes; each terminal works on the node its home warehouse maps to.
    ChorusSqliteHybrid,
    /// A 3-node Chorus SQL cluster on the PostgreSQL engine (`-- --sql-engine postgres`): each
    /// node replicates the statements into a PostgreSQL server of its own.
    ChorusPostgres,
    /// The same with passive replication: the leader's write-sets come from its server's
    /// logical decoding, and replicas apply them.
    ChorusPostgresPassive,
    PostgresAlone,
    /// Primary + 2 standbys, synchronous (a commit is flushed on 2 of 3).
    PostgresSync,
    PostgresAsync,
}

impl SqlSystem {
    fn name(self) -> &'static str {
        match self {
            SqlSystem::ChorusSqlite => "chorus-sqlite",
            SqlSystem::ChorusSqlitePassive => "chorus-sqlite-passive",
            SqlSystem::ChorusSqliteHybrid => "chorus-sqlite-hybrid",
            SqlSystem::ChorusPostgres => "chorus-postgres",
            SqlSystem::ChorusPostgresPassive => "chorus-postgres-passive",
            SqlSystem::PostgresAlone => "postgres-alone",
            SqlSystem::PostgresSync => "postgres-sync",
            SqlSystem::PostgresAsync => "postgres-async",
        }
    }
}

#[derive(clap::Args)]
pub struct TpccArgs {
    /// Benchmark a running system: a directory made by `chorus cluster start --sql` or
    /// `chorus bench peers start --system postgres|postgres-async|postgres-alone`.
    #[arg(long, value_name = "DIR", conflicts_with = "systems")]
    pub cluster: Option<PathBuf>,
    /// Start each of these systems in turn (fresh, under --dir), load, run, stop; one table and
    /// one plot of them all.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub systems: Vec<SqlSystem>,
    /// Where --systems keeps its clusters' data.
    #[arg(long, default_value = "target/tpcc")]
    pub dir: PathBuf,
    /// Warehouses; with --systems, a list (each count is a fresh load of every system).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub warehouses: Vec<u64>,
    /// Terminals (connections, each running transactions back to back) [default: 10 per
    /// warehouse, at most 16].
    #[arg(long)]
    pub terminals: Option<usize>,
    #[arg(long, default_value_t = 60.0)]
    pub duration_secs: f64,
    /// Connections loading warehouses in parallel.
    #[arg(long, default_value_t = 2)]
    pub loaders: usize,
    /// Skip the load (with --cluster: the tables are already there).
    #[arg(long)]
    pub no_load: bool,
    /// With --systems: keep each system's data directory after its run (by default it is
    /// removed once the system stops, unless the run failed: 16 warehouses take 5-16 GB per
    /// system).
    #[arg(long)]
    pub keep_data: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Which node each terminal connects to.
    #[arg(long, value_enum, default_value = "owner")]
    pub route: Route,
    /// Directory for JSON results and PNG plots.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// With --systems: the emulated network every system runs on (PostgreSQL's standbys
    /// stream over their links to the primary; the client reaches the leader or primary over
    /// its own).
    #[command(flatten)]
    pub net: NetArgs,
}

/// Which node a terminal works through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Route {
    /// The node that owns its home warehouse's class (hybrid replication's routing).
    Owner,
    /// As clients that connect anywhere: terminal t through the node (owner + 1 + t) mod n,
    /// spread evenly over the nodes, one in n on its home warehouse's owner (under hybrid the
    /// others borrow their warehouse from its owner for every transaction).
    Any,
}

#[derive(Debug, Clone, Serialize)]
pub struct KindResult {
    pub kind: &'static str,
    pub committed: u64,
    /// New orders rolled back by design (an unused item number).
    pub rolled_back: u64,
    /// Tries that failed with a serialization failure, deadlock or lock timeout, and were
    /// tried again.
    pub retried: u64,
    pub failed: u64,
    /// From the first try to the commit, in ms.
    pub latency_ms: LatencySummary,
}

#[derive(Debug, Clone, Serialize)]
pub struct TpccResult {
    pub system: String,
    pub warehouses: u64,
    pub terminals: usize,
    pub duration_secs: f64,
    /// Committed new orders per minute.
    pub tpmc: f64,
    /// Committed transactions of every kind per second.
    pub transactions_per_sec: f64,
    /// Retried and failed tries over all tries.
    pub abort_rate: f64,
    /// The same, of transactions within their home warehouse, and of those reaching another
    /// (a remote supplier or customer).
    pub abort_rate_home_only: f64,
    pub abort_rate_cross_warehouse: f64,
    pub kinds: Vec<KindResult>,
    pub server_cpu: Option<ServerCpu>,
    /// The servers' CPU per committed transaction (any kind), in µs.
    pub server_cpu_us_per_txn: Option<f64>,
    pub client_cpu_us_per_txn: f64,
    pub load_secs: Option<f64>,
    pub consistency: String,
    pub error_samples: Vec<String>,
}

/// What the terminals counted, per kind of transaction.
struct Tally {
    committed: [u64; 5],
    rolled_back: [u64; 5],
    retried: [u64; 5],
    failed: [u64; 5],
    /// Tries, and those that failed, of transactions within their home warehouse [0] and of
    /// those reaching another [1] (where hybrid replication's classes meet).
    tries_by_reach: [u64; 2],
    aborted_by_reach: [u64; 2],
    latency_us: Vec<Histogram<u64>>,
    error_samples: Vec<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            committed: [0; 5],
            rolled_back: [0; 5],
            retried: [0; 5],
            failed: [0; 5],
            tries_by_reach: [0; 2],
            aborted_by_reach: [0; 2],
            latency_us: (0..5)
                .map(|_| Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds"))
                .collect(),
            error_samples: Vec::new(),
        }
    }

    fn merge(&mut self, other: Tally) {
        for k in 0..5 {
            self.committed[k] += other.committed[k];
            self.rolled_back[k] += other.rolled_back[k];
            self.retried[k] += other.retried[k];
            self.failed[k] += other.failed[k];
            self.latency_us[k].add(&other.latency_us[k]).expect("same bounds");
        }
        for reach in 0..2 {
            self.tries_by_reach[reach] += other.tries_by_reach[reach];
            self.aborted_by_reach[reach] += other.aborted_by_reach[reach];
        }
        for sample in other.error_samples {
            if self.error_samples.len() < 10 {
                self.error_samples.push(sample);
            }
        }
    }
}

pub async fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
    let (client, connection) =
        tokio_postgres::connect(&chorus_cluster::postgres::conninfo(addr), tokio_postgres::NoTls)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Runs one terminal until `deadline`.
async fn drive(mut terminal: Terminal, deadline: Instant, seed: u64, new_orders: Arc<AtomicU64>) -> Tally {
    let mut tally = Tally::new();
    let mut mix = crate::rng::Rng::new(seed);
    while Instant::now() < deadline {
        let kind = Kind::draw(&mut mix);
        let k = Kind::ALL.iter().position(|&x| x == kind).expect("listed");
        let started = Instant::now();
        let (outcome, tries, crosses) = terminal.run(kind).await;
        tally.retried[k] += u64::from(tries - 1);
        let reach = usize::from(crosses);
        tally.tries_by_reach[reach] += u64::from(tries);
        tally.aborted_by_reach[reach] += u64::from(tries - 1);
        match outcome {
            Outcome::Committed => {
                tally.committed[k] += 1;
                let _ = tally.latency_us[k].record(started.elapsed().as_micros() as u64);
                if kind == Kind::NewOrder {
                    new_orders.fetch_add(1, Ordering::Relaxed);
                }
            }
            Outcome::RolledBackByDesign => tally.rolled_back[k] += 1,
            Outcome::Retry(e) | Outcome::Failed(e) => {
                tally.failed[k] += 1;
                tally.aborted_by_reach[reach] += 1;
                if tally.error_samples.len() < 3 {
                    tally.error_samples.push(format!("{}: {e}", kind.name()));
                }
                if terminal.is_closed() {
                    tally.error_samples.push("a terminal's connection closed".into());
                    break;
                }
            }
        }
    }
    tally
}

/// What `TpccResult::consistency` says when the conditions hold.
pub const CONSISTENT: &str = "conditions 1-4 hold";

/// Loads (unless `load` is false), runs `terminals` terminals for `duration_secs`, checks
/// consistency. Creates the tables, loads the items and checks through `addrs[0]`; the
/// loading of warehouse `w`, and a terminal whose home warehouse is `w`, go through the node
/// that owns class `w` (hybrid replication: `owner_index`) among `addrs`, in node id order (a
/// terminal may go elsewhere, see `Route::Any`).
pub async fn run_once(
    system: &str,
    addrs: &[SocketAddr],
    server_pids: &[u32],
    args: &TpccArgs,
    warehouses: u64,
    load: bool,
) -> anyhow::Result<TpccResult> {
    let terminals = args.terminals.unwrap_or((10 * warehouses as usize).min(16));
    if warehouses == 0 || terminals == 0 {
        bail!("--warehouses and --terminals must be positive");
    }
    let addr = *addrs.first().context("no address to reach the system at")?;
    let mut load_secs = None;
    if load {
        println!("{system}: loading {warehouses} warehouse(s)");
        let started = Instant::now();
        let mut loaders = Vec::new();
        for _ in 0..args.loaders.max(1) {
            let mut nodes = Vec::new();
            for &node in addrs {
                nodes.push(connect(node).await?);
            }
            loaders.push(nodes);
        }
        schema::load(&loaders, warehouses, args.seed).await?;
        load_secs = Some(started.elapsed().as_secs_f64());
    }
    let mut connected = Vec::new();
    for t in 0..terminals {
        let home = t as u64 % warehouses + 1;
        let seed = args.seed.wrapping_mul(1_000_003).wrapping_add(t as u64);
        let owner = chorus_sql::classes::owner_index(&home.to_string(), addrs.len());
        let node = match args.route {
            Route::Owner => addrs[owner],
            Route::Any => addrs[(owner + 1 + t) % addrs.len()],
        };
        let terminal = Terminal::new(connect(node).await?, warehouses, home, seed)
            .await
            .with_context(|| format!("{system}: cannot prepare the TPC-C statements"))?;
        connected.push((terminal, seed));
    }
    println!(
        "{system}: {terminals} terminals on {warehouses} warehouse(s) for {:.0} s",
        args.duration_secs
    );
    let meter = CpuMeter::start(server_pids);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.duration_secs);
    let new_orders = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|(terminal, seed)| tokio::spawn(drive(terminal, deadline, seed ^ 0x5eed, new_orders.clone())))
        .collect();
    let progress = {
        let new_orders = new_orders.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let now = new_orders.load(Ordering::Relaxed);
                println!(
                    "  {:>4.0} s: {:.0} tpmC over the last 10 s",
                    started.elapsed().as_secs_f64(),
                    (now - last) as f64 * 6.0
                );
                last = now;
            }
        })
    };
    let mut tally = Tally::new();
    for task in tasks {
        tally.merge(task.await.context("a terminal panicked")?);
    }
    progress.abort();
    let elapsed = started.elapsed().as_secs_f64();
    let committed: u64 = tally.committed.iter().sum();
    let (server_cpu, client_cpu_us_per_txn) = meter.finish(committed, elapsed);
    let consistency = match connect(addr).await {
        Ok(checker) => match schema::check_consistency(&checker).await {
            Ok(()) => CONSISTENT.to_string(),
            Err(e) => format!("{e:#}"),
        },
        Err(e) => format!("not checked: {e:#}"),
    };
    let tries = committed
        + tally.rolled_back.iter().sum::<u64>()
        + tally.retried.iter().sum::<u64>()
        + tally.failed.iter().sum::<u64>();
    let aborted = tally.retried.iter().sum::<u64>() + tally.failed.iter().sum::<u64>();
    let rate = |reach: usize| tally.aborted_by_reach[reach] as f64 / tally.tries_by_reach[reach].max(1) as f64;
    let kinds = Kind::ALL
        .iter()
        .enumerate()
        .map(|(k, kind)| KindResult {
            kind: kind.name(),
            committed: tally.committed[k],
            rolled_back: tally.rolled_back[k],
            retried: tally.retried[k],
            failed: tally.failed[k],
            latency_ms: LatencySummary::from_histogram(&tally.latency_us[k]),
        })
        .collect();
    Ok(TpccResult {
        system: system.to_string(),
        warehouses,
        terminals,
        duration_secs: elapsed,
        tpmc: tally.committed[0] as f64 * 60.0 / elapsed,
        transactions_per_sec: committed as f64 / elapsed,
        abort_rate: aborted as f64 / tries.max(1) as f64,
        abort_rate_home_only: rate(0),
        abort_rate_cross_warehouse: rate(1),
        kinds,
        server_cpu_us_per_txn: server_cpu.as_ref().map(|c| c.us_per_op),
        server_cpu,
        client_cpu_us_per_txn,
        load_secs,
        consistency,
        error_samples: tally.error_samples,
    })
}

impl TpccResult {
    fn print(&self) {
        println!(
            "{}, {} warehouse(s), {} terminals: {:.0} tpmC, {:.0} txn/s, aborts {:.2}% (home warehouse only {:.2}%, \
             reaching another {:.2}%), server CPU {} per txn; {}",
            self.system,
            self.warehouses,
            self.terminals,
            self.tpmc,
            self.transactions_per_sec,
            self.abort_rate * 100.0,
            self.abort_rate_home_only * 100.0,
            self.abort_rate_cross_warehouse * 100.0,
            self.server_cpu_us_per_txn
                .map(|us| format!("{us:.0} µs"))
                .unwrap_or_else(|| "unmeasured".into()),
            self.consistency
        );
        for k in &self.kinds {
            println!(
                "  {:<13} {:>8} committed {:>6} rolled back {:>6} retried {:>5} failed   p50 {:>7.2} ms  p99 {:>7.2} ms",
                k.kind, k.committed, k.rolled_back, k.retried, k.failed, k.latency_ms.p50, k.latency_ms.p99
            );
        }
        for sample in &self.error_samples {
            println!("  error: {sample}");
        }
    }
}

/// A system started for one run, and how to stop it.
struct StartedSystem {
    /// Where clients reach it (the leader or primary; with hybrid replication, every node).
    addrs: Vec<SocketAddr>,
    server_pids: Vec<u32>,
    dir: PathBuf,
    peers: Option<PeerCluster>,
}

impl StartedSystem {
    fn stop(&self) {
        match &self.peers {
            Some(peers) => peers.stop(&self.dir),
            None => {
                let _ = chorus_cluster::stop(&self.dir);
            }
        }
    }
}

/// Where clients write to a Chorus SQL cluster in `dir` (the leader; with hybrid replication,
/// every node in id order), and its server processes: the nodes, and their PostgreSQL servers
/// on that engine.
async fn chorus_sql_target(dir: &Path) -> anyhow::Result<(Vec<SocketAddr>, Vec<u32>)> {
    let file = chorus_cluster::load(dir)?;
    if !file.sql {
        bail!(
            "{} holds a key-value cluster; start a SQL one with `chorus cluster start --sql`",
            dir.display()
        );
    }
    let states = chorus_cluster::status(dir, &file).await;
    let leader = states.iter().find(|s| s.is_leader()).with_context(|| {
        format!(
            "the cluster in {} has no leader; see `chorus cluster status --dir {}`",
            dir.display(),
            dir.display()
        )
    })?;
    let engines = file
        .nodes
        .iter()
        .filter_map(|n| chorus_cluster::postgres::pid(&chorus_cluster::node_dir(dir, n.id)));
    let hybrid = file
        .server_args
        .windows(2)
        .any(|flag| flag[0] == "--sql-mode" && flag[1] == "hybrid");
    let addrs = if hybrid {
        let mut by_id: Vec<_> = states.iter().map(|s| (s.entry.id, s.entry.client_addr)).collect();
        by_id.sort_unstable();
        by_id.into_iter().map(|(_, addr)| addr).collect()
    } else {
        vec![leader.entry.client_addr]
    };
    Ok((addrs, states.iter().filter_map(|s| s.pid).chain(engines).collect()))
}

async fn start_system(system: SqlSystem, dir: &Path, net: &NetArgs) -> anyhow::Result<StartedSystem> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    let peer_system = match system {
        SqlSystem::ChorusSqlite
        | SqlSystem::ChorusSqlitePassive
        | SqlSystem::ChorusSqliteHybrid
        | SqlSystem::ChorusPostgres
        | SqlSystem::ChorusPostgresPassive => {
            let server_args: Vec<String> = match system {
                SqlSystem::ChorusSqlitePassive => vec!["--sql-mode".into(), "passive".into()],
                SqlSystem::ChorusSqliteHybrid => [
                    "--sql-mode",
                    "hybrid",
                    "--sql-conflict-classes",
                    schema::CONFLICT_CLASSES,
                ]
                .map(String::from)
                .to_vec(),
                SqlSystem::ChorusPostgres => vec!["--sql-engine".into(), "postgres".into()],
                SqlSystem::ChorusPostgresPassive => ["--sql-engine", "postgres", "--sql-mode", "passive"]
                    .map(String::from)
                    .to_vec(),
                _ => vec!["--sql-mode".into(), "active".into()],
            };
            // A start that fails stops what it started; a cluster whose leader cannot be found
            // is stopped here.
            chorus_cluster::start_sql(dir, 3, server_args, &net.options()).await?;
            let (addrs, server_pids) = chorus_sql_target(dir).await.inspect_err(|_| {
                let _ = chorus_cluster::stop(dir);
            })?;
            return Ok(StartedSystem {
                addrs,
                server_pids,
                dir: dir.to_path_buf(),
                peers: None,
            });
        }
        SqlSystem::PostgresAlone => System::PostgresAlone,
        SqlSystem::PostgresSync => System::Postgres,
        SqlSystem::PostgresAsync => System::PostgresAsync,
    };
    let profile = Some(net.profile()?).filter(|p| !p.is_passthrough());
    let peers = PeerCluster::start(peer_system, dir, profile.as_ref()).await?;
    Ok(StartedSystem {
        addrs: vec![peers.client_addr],
        server_pids: peers.pids.clone(),
        dir: dir.to_path_buf(),
        peers: Some(peers),
    })
}

#[derive(Serialize)]
struct Comparison<'a> {
    network: String,
    git_revision: String,
    machine: Machine,
    duration_secs: f64,
    runs: &'a [TpccResult],
}

pub async fn run(args: TpccArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.cluster {
        let (system, addrs, server_pids) = if dir.join("cluster.toml").exists() {
            let (addrs, pids) = chorus_sql_target(dir).await?;
            let file = chorus_cluster::load(dir)?;
            let system = if file.nodes.iter().any(|n| n.postgres_addr.is_some()) {
                SqlSystem::ChorusPostgres
            } else if addrs.len() > 1 {
                SqlSystem::ChorusSqliteHybrid
            } else {
                SqlSystem::ChorusSqlite
            };
            (system, addrs, pids)
        } else {
            let peers = PeerCluster::load(dir)?;
            let system = match peers.system {
                System::PostgresAlone => SqlSystem::PostgresAlone,
                System::Postgres => SqlSystem::PostgresSync,
                System::PostgresAsync => SqlSystem::PostgresAsync,
                other => bail!("{} holds {other:?}, not a SQL system", dir.display()),
            };
            (system, vec![peers.client_addr], peers.pids)
        };
        let system = system.name();
        let [warehouses] = args.warehouses[..] else {
            bail!("with --cluster, give one --warehouses count");
        };
        let result = run_once(system, &addrs, &server_pids, &args, warehouses, !args.no_load).await?;
        result.print();
        let json = report::output_path(&args.out, &format!("tpcc-{system}-w{warehouses}"), "json")?;
        report::write_json(&json, &result)?;
        println!("results: {}", json.display());
        return Ok(());
    }
    if args.systems.is_empty() {
        bail!("say what to benchmark: --cluster DIR, or --systems chorus-sqlite,chorus-sqlite-passive,chorus-sqlite-hybrid,chorus-postgres,chorus-postgres-passive,postgres-alone,postgres-sync,postgres-async");
    }
    let mut runs = Vec::new();
    for &warehouses in &args.warehouses {
        for &system in &args.systems {
            let dir = args.dir.join(format!("{}-w{warehouses}", system.name()));
            println!(
                "== {} with {warehouses} warehouse(s), in {}",
                system.name(),
                dir.display()
            );
            let started = start_system(system, &dir, &args.net).await?;
            let outcome = run_once(
                system.name(),
                &started.addrs,
                &started.server_pids,
                &args,
                warehouses,
                true,
            )
            .await;
            started.stop();
            // A run that failed keeps its data (the nodes' logs say why).
            let passed = outcome.as_ref().is_ok_and(|result| result.consistency == CONSISTENT);
            if !args.keep_data && passed {
                std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
            }
            let result = outcome.with_context(|| format!("{} with {warehouses} warehouse(s)", system.name()))?;
            result.print();
            // Each run is kept as it ends, so a failure later leaves the earlier ones.
            let json = report::output_path(&args.out, &format!("tpcc-{}-w{warehouses}", system.name()), "json")?;
            report::write_json(&json, &result)?;
            runs.push(result);
        }
    }
    let table = format!("network: {}\n\n{}", args.net.profile()?.summary(), table(&runs));
    println!("\n{table}");
    let json = report::output_path(&args.out, "tpcc-compare", "json")?;
    report::write_json(
        &json,
        &Comparison {
            network: args.net.profile()?.summary(),
            git_revision: report::git_revision(),
            machine: Machine::current(),
            duration_secs: args.duration_secs,
            runs: &runs,
        },
    )?;
    std::fs::write(json.with_extension("md"), &table)?;
    let systems: Vec<String> = args.systems.iter().map(|s| s.name().to_string()).collect();
    let groups: Vec<BarGroup> = args
        .warehouses
        .iter()
        .map(|&w| BarGroup {
            label: format!("{w} warehouse(s)"),
            values: systems
                .iter()
                .map(|s| {
                    runs.iter()
                        .find(|r| &r.system == s && r.warehouses == w)
                        .map(|r| r.tpmc)
                })
                .collect(),
        })
        .collect();
    let png = json.with_extension("png");
    plot::try_plot("the TPC-C comparison", &png, |p| {
        plot::plot_bars("TPC-C: committed new orders per minute", "tpmC", &systems, &groups, p)
    });
    println!("results: {} (and .md, .png)", json.display());
    let inconsistent: Vec<_> = runs.iter().filter(|r| r.consistency != CONSISTENT).collect();
    if !inconsistent.is_empty() {
        bail!("{} run(s) broke TPC-C's consistency conditions", inconsistent.len());
    }
    Ok(())
}

/// The comparison as a markdown table, each system's tpmC also as a ratio to PostgreSQL's.
fn table(runs: &[TpccResult]) -> String {
    let mut out = String::from(
        "| warehouses | terminals | system | tpmC | vs postgres-sync | vs postgres-async | txn/s | aborts | new-order p50 / p99 ms | server CPU µs/txn | consistency |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let ratio = |peer: &str| {
            runs.iter()
                .find(|p| p.system == peer && p.warehouses == r.warehouses && p.tpmc > 0.0)
                .map(|p| format!("{:.2}×", r.tpmc / p.tpmc))
                .unwrap_or_else(|| "–".into())
        };
        let new_order = &r.kinds[0].latency_ms;
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.0} | {:.2}% | {:.1} / {:.1} | {} | {} |\n",
            r.warehouses,
            r.terminals,
            r.system,
            r.tpmc,
            ratio("postgres-sync"),
            ratio("postgres-async"),
            r.transactions_per_sec,
            r.abort_rate * 100.0,
            new_order.p50,
            new_order.p99,
            r.server_cpu_us_per_txn
                .map(|us| format!("{us:.0}"))
                .unwrap_or_else(|| "–".into()),
            r.consistency
        ));
    }
    out
}
