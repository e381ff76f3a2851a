//! `chorus bench compare`: Chorus, etcd and Redis (plain and with WAIT) side by side. Each system
//! is started in turn on the same network profile, loaded, and run through the same scenarios
//! (workload × record shape × clients); the result is one table of ratios, one JSON, one PNG.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use chorus_cluster::netem::Profile;
use serde::Serialize;

use crate::cli::{resp_target, run_target, save_run, CommonArgs, NetArgs, TargetSpec};
use crate::etcd_target::EtcdTarget;
use crate::peers::{PeerCluster, System};
use crate::plot::{self, BarGroup};
use crate::report::{self, NetworkReport, RunResult};

const TARGETS: &[&str] = &["chorus", "etcd", "redis", "redis-wait"];

#[derive(clap::Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub net: NetArgs,
    /// Targets: chorus, etcd, redis (primary + 2 replicas), redis-wait (the same with
    /// `WAIT 1 0` after each write).
    #[arg(long, value_delimiter = ',', default_value = "chorus,etcd,redis,redis-wait")]
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

#[derive(Debug, Clone, Serialize)]
struct Row {
    scenario: String,
    clients: usize,
    /// Target → (ops/s, p50 ms, p99 ms, errors).
    results: BTreeMap<String, (f64, f64, f64, u64)>,
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

/// Starts the system behind `targets` (all of one system) and returns them resolved.
async fn start_system(
    system: &str,
    dir: &Path,
    net: &NetArgs,
    targets: &[String],
) -> anyhow::Result<(Running, Vec<TargetSpec>, BTreeMap<String, f64>)> {
    if system == "chorus" {
        let file = chorus_cluster::start(dir, 3, Vec::new(), &net.options()).await?;
        let states = chorus_cluster::status(dir, &file).await;
        let leader = states
            .iter()
            .find(|s| s.is_leader())
            .context("the Chorus cluster has no leader")?;
        let target = resp_target("chorus", vec![leader.entry.client_addr], 1, None);
        let measured = file.net.map(|n| n.measured_rtt_ms).unwrap_or_default();
        return Ok((Running::Chorus(dir.to_path_buf()), vec![target], measured));
    }
    let kind = if system == "etcd" { System::Etcd } else { System::Redis };
    let profile = Some(net.profile()?).filter(|p| !p.is_passthrough());
    let peers = PeerCluster::start(kind, dir, profile.as_ref()).await?;
    let specs = targets
        .iter()
        .map(|t| match t.as_str() {
            "etcd" => TargetSpec::Etcd(EtcdTarget {
                addrs: vec![peers.client_addr],
                fields: 1,
            }),
            "redis-wait" => resp_target("redis+wait", vec![peers.client_addr], 1, Some(1)),
            _ => resp_target("redis", vec![peers.client_addr], 1, None),
        })
        .collect();
    let measured = peers.measured_paths_ms.clone();
    Ok((Running::Peer(dir.to_path_buf(), peers), specs, measured))
}

/// How a target is named in results: the `--targets` name, except redis-wait is "redis+wait".
fn display_name(target: &str) -> String {
    if target == "redis-wait" {
        "redis+wait".into()
    } else {
        target.to_string()
    }
}

fn system_of(target: &str) -> &'static str {
    match target {
        "chorus" => "chorus",
        "etcd" => "etcd",
        _ => "redis",
    }
}

fn markdown_table(rows: &[Row], targets: &[String]) -> String {
    let names: Vec<String> = targets.iter().map(|t| display_name(t)).collect();
    let peers: Vec<&String> = names.iter().filter(|n| *n != "chorus").collect();
    let mut out = String::from("| scenario | clients |");
    for n in &names {
        let _ = write!(out, " {n} ops/s | {n} p99 ms |");
    }
    for p in &peers {
        let _ = write!(out, " chorus/{p} |");
    }
    out.push_str("\n|---|---|");
    out.push_str(&"---|---|".repeat(names.len()));
    out.push_str(&"---|".repeat(peers.len()));
    out.push('\n');
    for row in rows {
        let _ = write!(out, "| {} | {} |", row.scenario, row.clients);
        for n in &names {
            match row.results.get(n) {
                Some((ops, _, p99, errors)) if *errors > 0 => {
                    let _ = write!(out, " {ops:.0} ({errors} errors) | {p99:.2} |");
                }
                Some((ops, _, p99, _)) => {
                    let _ = write!(out, " {ops:.0} | {p99:.2} |");
                }
                None => out.push_str(" – | – |"),
            }
        }
        let chorus = row.results.get("chorus").map(|r| r.0);
        for p in &peers {
            match (chorus, row.results.get(*p)) {
                (Some(c), Some((peer, ..))) if *peer > 0.0 => {
                    let _ = write!(out, " {:.2}x |", c / peer);
                }
                _ => out.push_str(" – |"),
            }
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
        let (running, specs, measured) = start_system(system, &dir, &args.net, &targets).await?;
        let outcome = run_system(&args, &scenarios, &specs, emulated, &measured, &mut runs).await;
        running.stop();
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
            (run.throughput_ops_per_sec, all.p50, all.p99, run.errors),
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
    let groups = |pick: fn(&(f64, f64, f64, u64)) -> f64| -> Vec<BarGroup> {
        rows.iter()
            .map(|row| BarGroup {
                label: format!("{}, {} cl", row.scenario, row.clients),
                values: target_names.iter().map(|t| row.results.get(t).map(pick)).collect(),
            })
            .collect()
    };
    let throughput_png = json.with_extension("png");
    plot::try_plot("the comparison", &throughput_png, |p| {
        plot::plot_bars(
            &format!("Throughput on {} (ops/s, log scale)", profile.name),
            "ops/s",
            &target_names,
            &groups(|r| r.0),
            p,
        )
    });
    let latency_png = json.with_file_name(format!(
        "{}-p99.png",
        json.file_stem().and_then(|s| s.to_str()).unwrap_or("compare")
    ));
    plot::try_plot("the latency comparison", &latency_png, |p| {
        plot::plot_bars(
            &format!("p99 latency on {} (ms, log scale)", profile.name),
            "ms",
            &target_names,
            &groups(|r| r.2),
            p,
        )
    });
    println!(
        "comparison: {} (.md, .png, -p99.png); each run's JSON is beside it",
        json.display()
    );
    Ok(())
}

async fn run_system(
    args: &CompareArgs,
    scenarios: &[Scenario],
    specs: &[TargetSpec],
    profile: Option<&Profile>,
    measured: &BTreeMap<String, f64>,
    runs: &mut Vec<RunResult>,
) -> anyhow::Result<()> {
    let mut loaded: Vec<(usize, usize)> = Vec::new();
    for scenario in scenarios {
        for &clients in &args.clients {
            for spec in specs {
                let mut config =
                    args.common
                        .config(&scenario.workload, clients, scenario.fields, scenario.field_bytes)?;
                config.key_prefix = scenario.key_prefix();
                let shape = (scenario.fields, scenario.field_bytes);
                let load = !loaded.contains(&shape);
                loaded.push(shape);
                println!("-- {} {} with {clients} clients", spec.name(), scenario.label());
                let target = spec.with_fields(scenario.fields);
                let (client_rtt_ms, mut result) = run_target(&target, &config, load).await?;
                result.network = profile.map(|p| NetworkReport {
                    profile: p.name.clone(),
                    bandwidth_mbit: p.bandwidth_mbit,
                    measured_paths_ms: measured.clone(),
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
