//! `chorus bench`: options, target resolution and the run/compare/peers subcommands.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use chorus_cluster::netem::Profile;
use chorus_cluster::NetOptions;

use crate::compare;
use crate::curp_target::CurpTarget;
use crate::driver::{self, RunConfig};
use crate::etcd_target::EtcdTarget;
use crate::generator::Distribution;
use crate::peers::{PeerCluster, System};
use crate::plot;
use crate::report::{self, NetworkReport, RunResult};
use crate::resp_target::RespTarget;
use crate::target::Target;
use crate::workload::Workload;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Run one workload against one target; writes JSON and a PNG under --out.
    Run(RunArgs),
    /// Start Chorus, etcd and Redis in turn on one network profile, run the same scenarios
    /// against each, and write a comparison (table of ratios, JSON, PNG).
    Compare(compare::CompareArgs),
    /// UniCache off vs on: 100% writes of several value sizes and shares of recurring values,
    /// a fresh cluster per run, on one network profile.
    Unicache(crate::unicache_bench::UniCacheArgs),
    /// Log reduction vs the standard log, in process: the paper's workloads and batch sizes,
    /// commands and bytes persisted, throughput, disk after the cleaner, recovery and catch-up.
    Reduction(crate::reduction_bench::ReductionArgs),
    /// What LDC trades: a local cache hit, a remote hit over the peer transport and a device
    /// read past the page cache, measured on this machine.
    LdcCosts(crate::ldc_costs::LdcCostsArgs),
    /// Siloed caches against LDC in one run: 3 and 5 nodes, YCSB B, C and A over Zipf, uniform
    /// and hotspot keys, values read from the device, each cache a share of the data set.
    Ldc(crate::ldc_bench::LdcBenchArgs),
    /// UniCache compression of generated realistic streams (email CSV, news CSV, bus SQL).
    UnicacheStreams(crate::unicache_bench::StreamArgs),
    /// TPC-C over the PostgreSQL protocol: against a running Chorus SQL cluster or PostgreSQL
    /// peer (--cluster), or starting Chorus SQL and PostgreSQL (alone, sync and async streaming
    /// replication) in turn (--systems): one table, JSON and PNG.
    Tpcc(crate::tpcc::TpccArgs),
    /// Start or stop a peer system (etcd, Redis with replicas, PostgreSQL with standbys) for
    /// side-by-side runs.
    Peers {
        #[command(subcommand)]
        command: PeersCommand,
    },
}

#[derive(clap::Subcommand)]
pub enum PeersCommand {
    /// Start a 3-member etcd cluster, a Redis primary with 2 replicas, or PostgreSQL (alone, or
    /// a primary with 2 synchronous or asynchronous standbys) in DIR.
    Start {
        #[arg(long, value_enum)]
        system: System,
        #[arg(long)]
        dir: PathBuf,
        /// Members, the primary included: PostgreSQL with standbys only (to set beside a
        /// Chorus cluster of that size; synchronous commits wait for a majority).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[command(flatten)]
        net: NetArgs,
    },
    /// Stop the peer system started in DIR.
    Stop {
        #[arg(long)]
        dir: PathBuf,
    },
}

/// Which emulated network to run on.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NetArgs {
    /// Network profile from crates/cluster/net-profiles.toml: lan (the default), wan3 or geo3.
    /// Latency comes from toxiproxy (installed with `go install` on first use) and every link
    /// is measured before anything runs over it.
    #[arg(long, value_name = "PROFILE")]
    pub net: Option<String>,
    /// Caps every link between nodes at this many Mbit/s in each direction.
    #[arg(long, value_name = "MBIT")]
    pub net_bandwidth_mbit: Option<f64>,
}

impl NetArgs {
    pub fn options(&self) -> NetOptions {
        NetOptions {
            profile: Some(self.net.clone().unwrap_or_else(|| "lan".into())),
            bandwidth_mbit: self.net_bandwidth_mbit,
        }
    }

    pub fn profile(&self) -> anyhow::Result<Profile> {
        Profile::load(self.net.as_deref().unwrap_or("lan"), self.net_bandwidth_mbit)
    }
}

/// Options every run shares: record shape, run length, load model, output.
#[derive(clap::Args, Clone, Debug)]
pub struct CommonArgs {
    /// Records loaded before the run (and the key space the workload draws from).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Fields per record (YCSB's fieldcount). With 1, records are plain strings/keys.
    #[arg(long, default_value_t = 10)]
    pub fields: usize,
    /// Bytes per field value (YCSB's fieldlength).
    #[arg(long, default_value_t = 100)]
    pub field_bytes: usize,
    /// Run length in seconds [default: 30, or no limit with --operations].
    #[arg(long)]
    pub duration_secs: Option<f64>,
    /// Stop after this many operations.
    #[arg(long)]
    pub operations: Option<u64>,
    /// Open loop: total operations per second, sent on a fixed schedule; latency counts from
    /// each operation's intended send time. Without it, a closed loop (each client waits for
    /// its reply, then sends the next).
    #[arg(long, value_name = "OPS_PER_SEC")]
    pub rate: Option<f64>,
    /// Replace the workload's key distribution: uniform, zipfian, latest or hotspot.
    #[arg(long)]
    pub distribution: Option<String>,
    /// Skew of the zipfian and latest distributions.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_theta: f64,
    /// Hotspot: the fraction of the keys that is hot.
    #[arg(long, default_value_t = 0.2)]
    pub hotspot_data_fraction: f64,
    /// Hotspot: the fraction of operations that go to the hot keys.
    #[arg(long, default_value_t = 0.8)]
    pub hotspot_op_fraction: f64,
    /// Share of written values (0 to 1) drawn from a small set of recurring values instead of
    /// random bytes; what a cache on the replication stream (UniCache) can encode.
    #[arg(long, value_name = "FRACTION")]
    pub value_repeat: Option<f64>,
    /// How many distinct recurring values --value-repeat draws from.
    #[arg(long, default_value_t = 64)]
    pub value_repeat_pool: usize,
    /// Seed of every random choice (operation mix, keys, values).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for JSON results and PNG plots.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

impl CommonArgs {
    /// The run configuration of workload `name` with `clients` clients.
    pub fn config(&self, name: &str, clients: usize, fields: usize, field_bytes: usize) -> anyhow::Result<RunConfig> {
        let mut workload = Workload::named(name)?;
        if let Some(kind) = &self.distribution {
            let theta = self.zipf_theta;
            workload = workload.with_distribution(match kind.as_str() {
                "uniform" => Distribution::Uniform,
                "zipfian" => Distribution::Zipfian { theta },
                "latest" => Distribution::Latest { theta },
                "hotspot" => Distribution::Hotspot {
                    data_fraction: self.hotspot_data_fraction,
                    op_fraction: self.hotspot_op_fraction,
                },
                other => bail!("unknown distribution '{other}'; use uniform, zipfian, latest or hotspot"),
            });
        } else if let Distribution::Zipfian { theta } | Distribution::Latest { theta } = &mut workload.distribution {
            *theta = self.zipf_theta;
        }
        if !(self.zipf_theta > 0.0 && self.zipf_theta < 1.0) {
            bail!("--zipf-theta must be between 0 and 1 (exclusive)");
        }
        if self.value_repeat.is_some_and(|f| !(0.0..=1.0).contains(&f)) {
            bail!("--value-repeat is a fraction between 0 and 1");
        }
        if self.records == 0 || fields == 0 || field_bytes == 0 || clients == 0 {
            bail!("--records, --fields, --field-bytes and --clients must be positive");
        }
        Ok(RunConfig {
            workload,
            records: self.records,
            fields,
            field_bytes,
            key_prefix: "user".into(),
            operations: self.operations,
            duration_secs: self
                .duration_secs
                .unwrap_or(if self.operations.is_some() { 24.0 * 3600.0 } else { 30.0 }),
            clients,
            rate_ops_per_sec: self.rate,
            value_repeat_fraction: self.value_repeat,
            value_repeat_pool: self.value_repeat_pool,
            seed: self.seed,
        })
    }
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// YCSB workload: A (50% read, 50% update), B (95/5), C (read only), D (read latest, 5%
    /// insert), E (short scans, 5% insert), F (read-modify-write), AW (100% update, uniform),
    /// AWL (100% update, latest).
    #[arg(long, default_value = "A")]
    pub workload: String,
    /// Concurrent clients, one connection each.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// A directory made by `chorus cluster start` or `chorus bench peers start`: the target and
    /// its address come from there (the leader's or primary's client address).
    #[arg(long, value_name = "DIR")]
    pub cluster: Option<PathBuf>,
    /// Kind of target at --addr: chorus, redis or etcd.
    #[arg(long)]
    pub target: Option<String>,
    /// Target address(es), comma separated; clients are spread over them.
    #[arg(long, value_delimiter = ',')]
    pub addr: Vec<SocketAddr>,
    /// With a Chorus --cluster: spread clients over every node instead of the leader only.
    #[arg(long)]
    pub spread: bool,
    /// Redis: follow every write with `WAIT N 0` (acknowledged once N replicas have it).
    #[arg(long, value_name = "N")]
    pub redis_wait: Option<u32>,
    /// With --addr: the server processes whose CPU to measure (found by themselves with
    /// --cluster).
    #[arg(long, value_delimiter = ',', value_name = "PID")]
    pub server_pid: Vec<u32>,
    /// Skip the load phase (the records are already there).
    #[arg(long)]
    pub no_load: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// A target, resolved: what to connect to and how.
#[derive(Debug, Clone)]
pub enum TargetSpec {
    Resp(RespTarget),
    Etcd(EtcdTarget),
    Curp(CurpTarget),
}

impl TargetSpec {
    pub fn name(&self) -> String {
        match self {
            TargetSpec::Resp(t) => t.name(),
            TargetSpec::Etcd(t) => t.name(),
            TargetSpec::Curp(t) => t.name(),
        }
    }

    /// The same target for records of another shape.
    pub fn with_fields(&self, fields: usize) -> TargetSpec {
        match self {
            TargetSpec::Resp(t) => TargetSpec::Resp(RespTarget { fields, ..t.clone() }),
            TargetSpec::Etcd(t) => TargetSpec::Etcd(t.with_fields(fields)),
            TargetSpec::Curp(t) => TargetSpec::Curp(CurpTarget {
                resp: RespTarget {
                    fields,
                    ..t.resp.clone()
                },
            }),
        }
    }
}

pub fn resp_target(name: &str, addrs: Vec<SocketAddr>, fields: usize, wait_replicas: Option<u32>) -> TargetSpec {
    TargetSpec::Resp(RespTarget {
        name: name.to_string(),
        addrs,
        fields,
        wait_replicas,
        tls_ca: None,
    })
}

/// What a target directory describes, the network it runs on, and its server processes.
pub struct Resolved {
    pub target: TargetSpec,
    pub network: Option<(String, Option<f64>, std::collections::BTreeMap<String, f64>)>,
    pub server_pids: Vec<u32>,
}

async fn resolve_target(args: &RunArgs) -> anyhow::Result<Resolved> {
    let fields = args.common.fields;
    if let Some(dir) = &args.cluster {
        if dir.join("cluster.toml").exists() {
            let file = chorus_cluster::load(dir)?;
            let states = chorus_cluster::status(dir, &file).await;
            let addrs = if args.spread {
                file.nodes.iter().map(|n| n.client_addr).collect()
            } else {
                let leader = states
                    .iter()
                    .find(|s| s.is_leader())
                    .with_context(|| {
                        format!(
                            "the cluster in {} has no leader; wait for an election, or see `chorus cluster status --dir {}`",
                            dir.display(),
                            dir.display()
                        )
                    })?;
                vec![leader.entry.client_addr]
            };
            let network = file.net.map(|n| (n.profile, n.bandwidth_mbit, n.measured_rtt_ms));
            // A cluster made with `cluster start --tls` speaks TLS; its CA is beside it.
            let tls_ca = file
                .server_args
                .iter()
                .any(|arg| arg == "--tls-cert-file")
                .then(|| dir.join("tls").join("ca.pem"));
            return Ok(Resolved {
                target: TargetSpec::Resp(RespTarget {
                    name: if tls_ca.is_some() { "chorus-tls" } else { "chorus" }.into(),
                    addrs,
                    fields,
                    wait_replicas: None,
                    tls_ca,
                }),
                network,
                server_pids: states.iter().filter_map(|s| s.pid).collect(),
            });
        }
        let peers = PeerCluster::load(dir)?;
        let network = peers
            .profile
            .clone()
            .map(|p| (p, peers.bandwidth_mbit, peers.measured_paths_ms.clone()));
        let target = match peers.system {
            System::Etcd => TargetSpec::Etcd(EtcdTarget::new(vec![peers.client_addr], fields)),
            System::Redis | System::RedisAlone => {
                let name = if args.redis_wait.is_some() {
                    "redis+wait"
                } else {
                    "redis"
                };
                resp_target(name, vec![peers.client_addr], fields, args.redis_wait)
            }
            System::Postgres | System::PostgresAsync | System::PostgresAlone => bail!(
                "{} holds PostgreSQL, a SQL system: benchmark it with `chorus bench tpcc --cluster {}`",
                dir.display(),
                dir.display()
            ),
        };
        return Ok(Resolved {
            target,
            network,
            server_pids: peers.pids,
        });
    }
    if args.addr.is_empty() {
        bail!("say what to benchmark: --cluster DIR, or --target KIND --addr HOST:PORT");
    }
    let target = match args.target.as_deref() {
        Some("chorus") => resp_target("chorus", args.addr.clone(), fields, None),
        Some("redis") => {
            let name = if args.redis_wait.is_some() {
                "redis+wait"
            } else {
                "redis"
            };
            resp_target(name, args.addr.clone(), fields, args.redis_wait)
        }
        Some("etcd") => TargetSpec::Etcd(EtcdTarget::new(args.addr.clone(), fields)),
        Some(other) => bail!("unknown target '{other}'; use chorus, redis or etcd"),
        None => bail!("--addr needs --target chorus|redis|etcd"),
    };
    Ok(Resolved {
        target,
        network: None,
        server_pids: args.server_pid.clone(),
    })
}

async fn execute<T: Target + Clone>(
    target: T,
    config: &RunConfig,
    load: bool,
    server_pids: &[u32],
) -> anyhow::Result<(f64, RunResult)> {
    let rtt = driver::measure_client_rtt(&target).await?;
    println!("{}: client round trip {rtt:.2} ms", target.name());
    if load {
        let took = driver::load(&target, config).await?;
        println!("loaded {} records in {:.1} s", config.records, took.as_secs_f64());
    }
    let result = driver::run(target, config, server_pids).await?;
    Ok((rtt, result))
}

/// Loads (optionally) and runs one target, measuring the CPU of `server_pids`; one match arm
/// per kind of target.
pub async fn run_target(
    target: &TargetSpec,
    config: &RunConfig,
    load: bool,
    server_pids: &[u32],
) -> anyhow::Result<(f64, RunResult)> {
    match target {
        TargetSpec::Resp(t) => execute(t.clone(), config, load, server_pids).await,
        TargetSpec::Etcd(t) => execute(t.clone(), config, load, server_pids).await,
        TargetSpec::Curp(t) => execute(t.clone(), config, load, server_pids).await,
    }
}

/// Writes a run's JSON and PNG; returns the JSON path.
pub fn save_run(result: &RunResult, out: &Path) -> anyhow::Result<PathBuf> {
    let json = report::output_path(out, &result.name, "json")?;
    report::write_json(&json, result)?;
    let png = json.with_extension("png");
    plot::try_plot("the run timeline", &png, |p| plot::plot_run(result, p));
    Ok(json)
}

async fn bench_run(args: RunArgs) -> anyhow::Result<()> {
    let resolved = resolve_target(&args).await?;
    let config = args.common.config(
        &args.workload,
        args.clients,
        args.common.fields,
        args.common.field_bytes,
    )?;
    let (client_rtt_ms, mut result) =
        run_target(&resolved.target, &config, !args.no_load, &resolved.server_pids).await?;
    if let Some((profile, bandwidth_mbit, measured_paths_ms)) = resolved.network {
        result.network = Some(NetworkReport {
            profile,
            bandwidth_mbit,
            measured_paths_ms,
            client_rtt_ms,
        });
    }
    result.print_summary();
    let json = save_run(&result, &args.common.out)?;
    println!("results: {} (and .png)", json.display());
    if result.operations == 0 {
        bail!("no operation succeeded; the error samples above say why");
    }
    Ok(())
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Run(args) => bench_run(args).await,
        BenchCommand::Compare(args) => compare::run(args).await,
        BenchCommand::Tpcc(args) => crate::tpcc::run(args).await,
        BenchCommand::Ldc(args) => crate::ldc_bench::run(args).await,
        BenchCommand::Unicache(args) => crate::unicache_bench::run(args).await,
        BenchCommand::UnicacheStreams(args) => crate::unicache_bench::run_streams(args),
        BenchCommand::Reduction(args) => crate::reduction_bench::run(args),
        BenchCommand::LdcCosts(args) => crate::ldc_costs::run(args),
        BenchCommand::Peers { command } => match command {
            PeersCommand::Start {
                system,
                dir,
                nodes,
                net,
            } => {
                let profile = Some(net.profile()?).filter(|p| !p.is_passthrough());
                let peers = PeerCluster::start_members(system, &dir, profile.as_ref(), nodes).await?;
                println!(
                    "{:?} running in {}: clients connect to {} (pids {:?})",
                    peers.system,
                    dir.display(),
                    peers.client_addr,
                    peers.pids
                );
                Ok(())
            }
            PeersCommand::Stop { dir } => {
                PeerCluster::load(&dir)?.stop(&dir);
                println!("stopped the peer system in {}", dir.display());
                Ok(())
            }
        },
    }
}
