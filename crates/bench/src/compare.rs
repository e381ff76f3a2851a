//! `chorus bench compare`: Chorus, etcd (over gRPC) and Redis (alone, and a primary with replicas,
//! plain and with WAIT) side by side. Each system is started in turn on the same network
//! profile, loaded, and run through the same scenarios (workload × record shape × clients); the
//! result is one table of throughput, p99 and the servers' CPU per operation with Chorus's
//! ratios, one JSON, and one PNG per figure.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use chorus_cluster::netem::Profile;
use serde::Serialize;

use crate::cli::{resp_target, run_target, save_run, CommonArgs, NetArgs, TargetSpec};
use crate::curp_target::CurpTarget;
use crate::etcd_target::EtcdTarget;
use crate::peers::{PeerCluster, System};
use crate::plot::{self, BarGroup};
use crate::report::{self, NetworkReport, RunResult};
use crate::resp_target::RespTarget;

const TARGETS: &[&str] = &[
    "chorus",
    "chorus-curp",
    "chorus-curp-client",
    "etcd",
    "redis",
    "redis-wait",
    "redis-alone",
];

/// Which Chorus nodes the clients talk to.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientsAt {
    Leader,
    /// The followers, in turn: every write is forwarded (or, with CURP, takes the fast path).
    Followers,
    /// Every node in turn.
    All,
}

#[derive(clap::Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub net: NetArgs,
    /// Targets: chorus, etcd, redis (primary + 2 replicas), redis-wait (the same with
    /// `WAIT 1 0` after each write), redis-alone (one server, no replica).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "chorus,etcd,redis,redis-wait,redis-alone"
    )]
    pub targets: Vec<String>,
    /// Scenarios as WORKLOAD or WORKLOAD:FIELDSxBYTES (a record shape other than
    /// --fields x --field-bytes), e.g. `A,B,AW:1x256`.
    #[arg(long, value_delimiter = ',', default_value = "A,B,AW:1x256")]
    pub scenarios: Vec<String>,
    /// Client counts; every scenario runs at each.
    #[arg(long, value_delimiter = ',', default_value = "1,50")]
    pub clients: Vec<usize>,
    /// Where the systems keep their data (default: a temporary directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Which Chorus nodes the clients talk to (peers' clients talk to their leader or primary).
    #[arg(long, value_enum, default_value = "leader")]
    pub chorus_clients_at: ClientsAt,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, PartialEq)]
struct Scenario {
    workload: String,
    fields: usize,
    field_bytes: usize,
}

impl Scenario {
    fn parse(text: &str, common: &CommonArgs) -> anyhow::Result<Scenario> {
        let (workload, shape) = match text.split_once(':') {
            Some((w, shape)) => (w, Some(shape)),
            None => (text, None),
        };
        let (fields, field_bytes) = match shape {
            Some(shape) => {
                let (f, b) = shape
                    .split_once('x')
                    .with_context(|| format!("scenario '{text}': the shape must be FIELDSxBYTES"))?;
                (
                    f.parse()
                        .with_context(|| format!("scenario '{text}': bad field count"))?,
                    b.parse()
                        .with_context(|| format!("scenario '{text}': bad field size"))?,
                )
            }
            None => (common.fields, common.field_bytes),
        };
        Ok(Scenario {
            workload: workload.to_ascii_uppercase(),
            fields,
            field_bytes,
        })
    }

    fn label(&self) -> String {
        format!("{} {}x{}B", self.workload, self.fields, self.field_bytes)
    }

    /// Records of each shape live under their own key prefix, so shapes never collide.
    fn key_prefix(&self) -> String {
        format!("user{}x{}-", self.fields, self.field_bytes)
    }
}

/// A bar chart of the comparison: file name suffix, title, unit, and the value it shows.
type Figure = (&'static str, &'static str, &'static str, fn(&Cell) -> Option<f64>);

/// One target's figures in one scenario.
#[derive(Debug, Clone, Serialize)]
struct Cell {
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// The servers' CPU (all processes, user + system) per operation, in µs.
    server_cpu_us_per_op: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    scenario: String,
    clients: usize,
    /// Target → its figures.
    results: BTreeMap<String, Cell>,
}

#[derive(Serialize)]
struct Comparison<'a> {
    profile: String,
    bandwidth_mbit: Option<f64>,
    git_revision: String,
    machine: report::Machine,
    rows: &'a [Row],
    runs: &'a [RunResult],
}

/// A system under test, started in its own directory.
enum Running {
    Chorus(PathBuf),
    Peer(PathBuf, PeerCluster),
}

impl Running {
    fn stop(&self) {
        match self {
            Running::Chorus(dir) => {
                let _ = chorus_cluster::stop(dir);
            }
            Running::Peer(dir, peers) => peers.stop(dir),
        }
    }
}

/// A system started for a comparison: how to stop it, its targets, the round trips measured on
/// its links, and its server processes.
struct Started {
    running: Running,
    specs: Vec<TargetSpec>,
    measured: BTreeMap<String, f64>,
    server_pids: Vec<u32>,
}

/// Starts the system behind `targets` (all of one system) and returns them resolved.
async fn start_system(
    system: &str,
    dir: &Path,
    net: &NetArgs,
    targets: &[String],
    clients_at: ClientsAt,
) -> anyhow::Result<Started> {
    if let Some(curp) = chorus_curp_setting(system) {
        let server_args = vec!["--curp".to_string(), curp.to_string()];
        let file = chorus_cluster::start(dir, 3, server_args, &net.options()).await?;
        let states = chorus_cluster::status(dir, &file).await;
        states.iter().find(|s| s.is_leader()).with_context(|| {
            format!(
                "the Chorus cluster has no leader; see the nodes' server.log files in {}",
                dir.display()
            )
        })?;
        let addrs: Vec<_> = states
            .iter()
            .filter(|s| match clients_at {
                ClientsAt::Leader => s.is_leader(),
                ClientsAt::Followers => !s.is_leader(),
                ClientsAt::All => true,
            })
            .map(|s| s.entry.client_addr)
            .collect();
        // The CURP-aware client talks to every node, the leader first (its reads go there).
        let mut leader_first: Vec<_> = states.iter().collect();
        leader_first.sort_by_key(|s| !s.is_leader());
        let every_node: Vec<_> = leader_first.iter().map(|s| s.entry.client_addr).collect();
        let specs = targets
            .iter()
            .map(|t| match t.as_str() {
                "chorus-curp-client" => TargetSpec::Curp(CurpTarget {
                    resp: RespTarget {
                        name: t.clone(),
                        addrs: every_node.clone(),
                        fields: 1,
                        wait_replicas: None,
                        tls_ca: None,
                    },
                }),
                _ => resp_target(t, addrs.clone(), 1, None),
            })
            .collect();
        let measured = file.net.map(|n| n.measured_rtt_ms).unwrap_or_default();
        return Ok(Started {
            running: Running::Chorus(dir.to_path_buf()),
            specs,
            measured,
            server_pids: states.iter().filter_map(|s| s.pid).collect(),
        });
    }
    let kind = match system {
        "etcd" => System::Etcd,
        "redis-alone" => System::RedisAlone,
        _ => System::Redis,
    };
    let profile = Some(net.profile()?).filter(|p| !p.is_passthrough());
    let peers = PeerCluster::start(kind, dir, profile.as_ref()).await?;
    let specs = targets
        .iter()
        .map(|t| match t.as_str() {
            "etcd" => TargetSpec::Etcd(EtcdTarget::new(vec![peers.client_addr], 1)),
            "redis-wait" => resp_target("redis+wait", vec![peers.client_addr], 1, Some(1)),
            "redis-alone" => resp_target("redis-alone", vec![peers.client_addr], 1, None),
            _ => resp_target("redis", vec![peers.client_addr], 1, None),
        })
        .collect();
    Ok(Started {
        measured: peers.measured_paths_ms.clone(),
        server_pids: peers.pids.clone(),
        specs,
        running: Running::Peer(dir.to_path_buf(), peers),
    })
}

/// How a target is named in results: the `--targets` name, except redis-wait is "redis+wait".
fn display_name(target: &str) -> String {
    if target == "redis-wait" {
        "redis+wait".into()
    } else {
        target.to_string()
    }
}

/// `--curp` for a Chorus system, `None` for a peer.
fn chorus_curp_setting(system: &str) -> Option<&'static str> {
    match system {
        "chorus" => Some("off"),
        "chorus-curp" | "chorus-curp-client" => Some("on"),
        _ => None,
    }
}

fn system_of(target: &str) -> &'static str {
    match target {
        "chorus" => "chorus",
        "chorus-curp" | "chorus-curp-client" => "chorus-curp",
        "etcd" => "etcd",
        "redis-alone" => "redis-alone",
        _ => "redis",
    }
}

fn markdown_table(rows: &[Row], targets: &[String]) -> String {
    let names: Vec<String> = targets.iter().map(|t| display_name(t)).collect();
    let peers: Vec<&String> = names.iter().filter(|n| *n != "chorus").collect();
    let mut out = String::from("| scenario | clients |");
    for n in &names {
        let _ = write!(out, " {n} ops/s | {n} p99 ms | {n} CPU µs/op |");
    }
    for p in &peers {
        let _ = write!(out, " chorus/{p} ops/s | chorus/{p} CPU/op |");
    }
    out.push_str("\n|---|---|");
    out.push_str(&"---|---|---|".repeat(names.len()));
    out.push_str(&"---|---|".repeat(peers.len()));
    out.push('\n');
    let cpu = |cell: &Cell| cell.server_cpu_us_per_op.map_or("–".to_string(), |c| format!("{c:.1}"));
    for row in rows {
        let _ = write!(out, "| {} | {} |", row.scenario, row.clients);
        for n in &names {
            match row.results.get(n) {
                Some(cell) if cell.errors > 0 => {
                    let _ = write!(
                        out,
                        " {:.0} ({} errors) | {:.2} | {} |",
                        cell.ops_per_sec,
                        cell.errors,
                        cell.p99_ms,
                        cpu(cell)
                    );
                }
                Some(cell) => {
                    let _ = write!(out, " {:.0} | {:.2} | {} |", cell.ops_per_sec, cell.p99_ms, cpu(cell));
                }
                None => out.push_str(" – | – | – |"),
            }
        }
        let chorus = row.results.get("chorus");
        for p in &peers {
            let ratio =
                |pick: fn(&Cell) -> Option<f64>| match (chorus.and_then(pick), row.results.get(*p).and_then(pick)) {
                    (Some(c), Some(peer)) if peer > 0.0 => format!("{:.2}x", c / peer),
                    _ => "–".to_string(),
                };
            let _ = write!(
                out,
                " {} | {} |",
                ratio(|c| Some(c.ops_per_sec)),
                ratio(|c| c.server_cpu_us_per_op)
            );
        }
        out.push('\n');
    }
    out
}

pub async fn run(args: CompareArgs) -> anyhow::Result<()> {
    for t in &args.targets {
        if !TARGETS.contains(&t.as_str()) {
            bail!("unknown target '{t}'; known: {}", TARGETS.join(", "));
        }
    }
    let scenarios: Vec<Scenario> = args
        .scenarios
        .iter()
        .map(|s| Scenario::parse(s, &args.common))
        .collect::<anyhow::Result<_>>()?;
    let profile = args.net.profile()?;
    println!("comparing {} on {}", args.targets.join(", "), profile.summary());
    let emulated = (!profile.is_passthrough()).then_some(&profile);
    let (work_dir, temporary) = match &args.dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("chorus-compare-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&work_dir).with_context(|| format!("cannot create {}", work_dir.display()))?;
    chorus_cluster::process::let_nobody_pass(&work_dir, "each peer system")?;
    let mut systems: Vec<&'static str> = Vec::new();
    for t in &args.targets {
        if !systems.contains(&system_of(t)) {
            systems.push(system_of(t));
        }
    }

    let mut runs: Vec<RunResult> = Vec::new();
    for system in systems {
        let targets: Vec<String> = args
            .targets
            .iter()
            .filter(|t| system_of(t) == system)
            .cloned()
            .collect();
        let dir = work_dir.join(system);
        println!("== {system}: starting in {}", dir.display());
        let started = start_system(system, &dir, &args.net, &targets, args.chorus_clients_at).await?;
        let outcome = run_system(&args, &scenarios, &started, emulated, &mut runs).await;
        started.running.stop();
        outcome?;
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&work_dir);
    }

    let mut rows: Vec<Row> = Vec::new();
    for run in &runs {
        let scenario = format!(
            "{} {}x{}B",
            run.config.workload.name, run.config.fields, run.config.field_bytes
        );
        let index = match rows
            .iter()
            .position(|r| r.scenario == scenario && r.clients == run.config.clients)
        {
            Some(i) => i,
            None => {
                rows.push(Row {
                    scenario,
                    clients: run.config.clients,
                    results: BTreeMap::new(),
                });
                rows.len() - 1
            }
        };
        let all = &run.latency_ms["all"];
        rows[index].results.insert(
            run.target.clone(),
            Cell {
                ops_per_sec: run.throughput_ops_per_sec,
                p50_ms: all.p50,
                p99_ms: all.p99,
                errors: run.errors,
                server_cpu_us_per_op: run.server_cpu.as_ref().map(|c| c.us_per_op),
            },
        );
    }
    let table = markdown_table(&rows, &args.targets);
    println!("\n{table}");

    let name = format!("compare-{}", profile.name);
    let json = report::output_path(&args.common.out, &name, "json")?;
    report::write_json(
        &json,
        &Comparison {
            profile: profile.name.clone(),
            bandwidth_mbit: profile.bandwidth_mbit,
            git_revision: report::git_revision(),
            machine: report::Machine::current(),
            rows: &rows,
            runs: &runs,
        },
    )?;
    std::fs::write(json.with_extension("md"), &table)?;
    let target_names: Vec<String> = args.targets.iter().map(|t| display_name(t)).collect();
    let groups = |pick: fn(&Cell) -> Option<f64>| -> Vec<BarGroup> {
        rows.iter()
            .map(|row| BarGroup {
                label: format!("{}, {} cl", row.scenario, row.clients),
                values: target_names.iter().map(|t| row.results.get(t).and_then(pick)).collect(),
            })
            .collect()
    };
    let stem = json
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("compare")
        .to_string();
    let figures: [Figure; 3] = [
        ("", "Throughput", "ops/s", |c| Some(c.ops_per_sec)),
        ("-p99", "p99 latency", "ms", |c| Some(c.p99_ms)),
        ("-cpu", "Server CPU per operation (all processes)", "µs", |c| {
            c.server_cpu_us_per_op
        }),
    ];
    for (suffix, what, unit, pick) in figures {
        let png = json.with_file_name(format!("{stem}{suffix}.png"));
        plot::try_plot(what, &png, |p| {
            plot::plot_bars(
                &format!("{what} on {} ({unit})", profile.name),
                unit,
                &target_names,
                &groups(pick),
                p,
            )
        });
    }
    println!(
        "comparison: {} (.md, .png, -p99.png, -cpu.png); each run's JSON is beside it",
        json.display()
    );
    Ok(())
}

async fn run_system(
    args: &CompareArgs,
    scenarios: &[Scenario],
    system: &Started,
    profile: Option<&Profile>,
    runs: &mut Vec<RunResult>,
) -> anyhow::Result<()> {
    let mut loaded: Vec<(usize, usize)> = Vec::new();
    for scenario in scenarios {
        for &clients in &args.clients {
            for spec in &system.specs {
                let mut config =
                    args.common
                        .config(&scenario.workload, clients, scenario.fields, scenario.field_bytes)?;
                config.key_prefix = scenario.key_prefix();
                let shape = (scenario.fields, scenario.field_bytes);
                let load = !loaded.contains(&shape);
                loaded.push(shape);
                println!("-- {} {} with {clients} clients", spec.name(), scenario.label());
                let target = spec.with_fields(scenario.fields);
                let (client_rtt_ms, mut result) = run_target(&target, &config, load, &system.server_pids).await?;
                result.network = profile.map(|p| NetworkReport {
                    profile: p.name.clone(),
                    bandwidth_mbit: p.bandwidth_mbit,
                    measured_paths_ms: system.measured.clone(),
                    client_rtt_ms,
                });
                result.print_summary();
                save_run(&result, &args.common.out)?;
                runs.push(result);
            }
        }
    }
    Ok(())
}
