//! `chorus bench ldc`: siloed caches against LDC (issue 14) in one command. For each cluster size
//! and cache mode, a fresh cluster with values read past the page cache (`--value-direct-io`) and
//! each node's cache a share of the data set's objects; the records loaded once, then each
//! scenario (a YCSB workload and a key distribution) warmed up and measured with clients spread
//! over every node. Per run: throughput, p50/p99, the nodes' CPU per operation, and where the
//! reads' values came from (local cache, an owner's cache, the device), with the cost-benefit
//! admission's choice. Extra siloed runs with larger caches find where siloed catches up.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use chorus_cluster::metrics::{metric_sum, scrape};
use serde::Serialize;

use crate::cli::{resp_target, run_target, save_run, CommonArgs};
use crate::plot::{self, BarGroup};
use crate::report;

/// 24-byte keys, as the paper's: this prefix and the workload's 12 digits.
const KEY_PREFIX: &str = "user12345678";

#[derive(clap::Args)]
pub struct LdcBenchArgs {
    /// Cluster sizes, each run with siloed caches and with LDC.
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    pub nodes: Vec<usize>,
    /// WORKLOAD:DISTRIBUTION pairs (YCSB workloads; uniform, zipfian or hotspot).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "C:zipfian,C:uniform,C:hotspot,B:zipfian,B:uniform,B:hotspot,A:zipfian"
    )]
    pub scenarios: Vec<String>,
    /// Each node's cache, as a share of the data set's objects.
    #[arg(long, default_value_t = 0.1)]
    pub cache_fraction: f64,
    /// Siloed runs of the first scenario with caches this many times larger (on the first
    /// cluster size): where siloed catches up with LDC. The flag alone: none.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "2,4")]
    pub siloed_cache_multipliers: Vec<f64>,
    /// Concurrent clients, spread over the nodes.
    #[arg(long, default_value_t = 48)]
    pub clients: usize,
    /// Seconds each scenario runs unmeasured first (caches and the admission settle).
    #[arg(long, default_value_t = 10.0)]
    pub warmup_secs: f64,
    /// µs the servers add to each device read of a value (their --emulated-device-read-us): a
    /// slower device than this machine's, such as a network-attached volume.
    #[arg(long, default_value_t = 0)]
    pub emulated_device_read_us: u64,
    /// Directory for the clusters (default: under the system's temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    nodes: usize,
    mode: String,
    cache_bytes_per_node: u64,
    scenario: String,
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    server_cpu_us_per_op: Option<f64>,
    /// Reads of values served from the reading node's cache, an owner's cache, the device.
    local_hits: f64,
    remote_hits: f64,
    device_reads: f64,
    /// Fetches an owner answered without the value at the asked version.
    remote_misses: f64,
    fetched_bytes: f64,
    /// The cost-benefit admission's choice at the end, per node.
    replicated_objects: Vec<f64>,
    /// What the nodes measured a local hit, a remote hit and a device read to take, µs (mean
    /// over nodes).
    read_us: BTreeMap<String, f64>,
}

#[derive(Serialize)]
struct Report<'a> {
    git_revision: String,
    machine: report::Machine,
    records: u64,
    value_bytes: usize,
    cache_fraction: f64,
    emulated_device_read_us: u64,
    clients: usize,
    duration_secs: f64,
    rows: &'a [Row],
}

/// The counters a row is made of, summed over the nodes.
fn counters(metrics: &[String]) -> [f64; 5] {
    let sum = |name| metrics.iter().map(|m| metric_sum(m, name)).sum::<f64>();
    [
        sum("chorus_storage_cache_hits_total"),
        sum("chorus_storage_cache_misses_total"),
        sum("chorus_ldc_remote_hits_total"),
        sum("chorus_ldc_remote_misses_total"),
        sum("chorus_ldc_fetched_bytes_total"),
    ]
}

/// The mean over nodes of a labelled read-time gauge, in µs (nodes that measured none left out).
fn mean_read_us(metrics: &[String], kind: &str) -> Option<f64> {
    let line = format!("chorus_ldc_read_ns{{kind=\"{kind}\"}} ");
    let values: Vec<f64> = metrics
        .iter()
        .filter_map(|m| m.lines().find_map(|l| l.strip_prefix(&line)?.parse::<f64>().ok()))
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64 / 1e3)
}

/// One cluster: loads the records, then warms up and measures each scenario.
async fn run_cluster(
    args: &LdcBenchArgs,
    nodes: usize,
    mode: &str,
    cache_bytes: u64,
    scenarios: &[String],
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("chorus-ldc-bench-{}-{nodes}-{mode}", std::process::id()));
    let server_args: Vec<String> = [
        "--cache-mode",
        mode,
        "--cache-bytes",
        &cache_bytes.to_string(),
        "--value-direct-io",
        "true",
        "--emulated-device-read-us",
        &args.emulated_device_read_us.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let file = chorus_cluster::start(&dir, nodes, server_args, &Default::default()).await?;
    let outcome = async {
        let states = chorus_cluster::status(&dir, &file).await;
        let pids: Vec<u32> = states.iter().filter_map(|s| s.pid).collect();
        let metrics_addrs: Vec<_> = file.nodes.iter().map(|n| n.metrics_addr).collect();
        let target = resp_target(
            &format!("chorus-{mode}-{nodes}n"),
            file.nodes.iter().map(|n| n.client_addr).collect(),
            1,
            None,
        );
        let mut loaded = false;
        for scenario in scenarios {
            let (workload, distribution) = scenario
                .split_once(':')
                .with_context(|| format!("scenario '{scenario}' is not WORKLOAD:DISTRIBUTION"))?;
            let mut common = args.common.clone();
            common.distribution = Some(distribution.to_string());
            let mut config = common.config(workload, args.clients, 1, args.common.field_bytes)?;
            config.key_prefix = KEY_PREFIX.into();
            let mut warmup = config.clone();
            warmup.duration_secs = args.warmup_secs;
            warmup.operations = None;
            println!("-- {nodes} nodes, {mode}, cache {cache_bytes} B per node: {scenario}");
            run_target(&target, &warmup, !loaded, &[]).await?;
            loaded = true;
            let mut before = Vec::new();
            for addr in &metrics_addrs {
                before.push(scrape(*addr).await?);
            }
            let (_, mut result) = run_target(&target, &config, false, &pids).await?;
            let mut after = Vec::new();
            for addr in &metrics_addrs {
                after.push(scrape(*addr).await?);
            }
            result.name = format!("ldc-{nodes}n-{mode}-{cache_bytes}B-{workload}-{distribution}");
            let [hits, misses, remote_hits, remote_misses, fetched_bytes] = {
                let (a, b) = (counters(&after), counters(&before));
                std::array::from_fn(|i| a[i] - b[i])
            };
            let all = &result.latency_ms["all"];
            let row = Row {
                nodes,
                mode: mode.to_string(),
                cache_bytes_per_node: cache_bytes,
                scenario: scenario.clone(),
                ops_per_sec: result.throughput_ops_per_sec,
                p50_ms: all.p50,
                p99_ms: all.p99,
                server_cpu_us_per_op: result.server_cpu.as_ref().map(|c| c.us_per_op),
                local_hits: hits,
                remote_hits,
                device_reads: misses - remote_hits,
                remote_misses,
                fetched_bytes,
                replicated_objects: after
                    .iter()
                    .map(|m| metric_sum(m, "chorus_ldc_replicated_objects"))
                    .collect(),
                read_us: ["local_hit", "remote_hit", "device"]
                    .into_iter()
                    .filter_map(|kind| Some((kind.to_string(), mean_read_us(&after, kind)?)))
                    .collect(),
            };
            println!(
                "   {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms, CPU {} µs/op; reads: {:.0} local, {:.0} remote, {:.0} device; replicated {:?}; read µs {:?}",
                row.ops_per_sec,
                row.p50_ms,
                row.p99_ms,
                row.server_cpu_us_per_op.map_or("?".into(), |c| format!("{c:.1}")),
                row.local_hits,
                row.remote_hits,
                row.device_reads,
                row.replicated_objects,
                row.read_us,
            );
            save_run(&result, &args.common.out)?;
            rows.push(row);
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    chorus_cluster::stop(&dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// Rows as a table; "vs siloed" is against siloed caches of `base_cache_bytes` on as many nodes.
fn markdown_table(rows: &[Row], base_cache_bytes: u64) -> String {
    let mut table = String::from(
        "| nodes | scenario | mode | cache/node | ops/s | vs siloed | p50 ms | p99 ms | CPU µs/op | local hits | remote hits | device reads | replicated objects |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let siloed = rows
            .iter()
            .find(|r| {
                r.nodes == row.nodes
                    && r.scenario == row.scenario
                    && r.mode == "siloed"
                    && r.cache_bytes_per_node == base_cache_bytes
            })
            .map(|r| r.ops_per_sec);
        let reads = (row.local_hits + row.remote_hits + row.device_reads).max(1.0);
        let share = |n: f64| format!("{:.0}%", 100.0 * n / reads);
        table.push_str(&format!(
            "| {} | {} | {} | {:.1} MiB | {:.0} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} |\n",
            row.nodes,
            row.scenario,
            row.mode,
            row.cache_bytes_per_node as f64 / (1 << 20) as f64,
            row.ops_per_sec,
            siloed.map_or("–".into(), |s| format!("{:.2}x", row.ops_per_sec / s.max(1e-9))),
            row.p50_ms,
            row.p99_ms,
            row.server_cpu_us_per_op.map_or("?".into(), |c| format!("{c:.1}")),
            share(row.local_hits),
            share(row.remote_hits),
            share(row.device_reads),
            if row.mode == "ldc" {
                row.replicated_objects
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            } else {
                "–".into()
            },
        ));
    }
    table
}

pub async fn run(args: LdcBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.cache_fraction > 0.0 && args.cache_fraction <= 1.0,
        "--cache-fraction is a share of the data set, above 0 and at most 1"
    );
    anyhow::ensure!(!args.scenarios.is_empty(), "give at least one --scenarios entry");
    // What the store's cache charges an object, so that the cache holds `--cache-fraction` of them.
    let object_bytes =
        (KEY_PREFIX.len() + 12 + 1 + args.common.field_bytes) as f64 + chorus_storage::OBJECT_OVERHEAD_BYTES as f64;
    let cache_bytes = (args.common.records as f64 * args.cache_fraction * object_bytes) as u64;
    println!(
        "LDC against siloed caches: {} records of {} B, each node's cache {:.0}% of the objects ({} B), {} clients over every node, device reads {}",
        args.common.records,
        args.common.field_bytes,
        100.0 * args.cache_fraction,
        cache_bytes,
        args.clients,
        if args.emulated_device_read_us > 0 {
            format!("slowed by {} µs", args.emulated_device_read_us)
        } else {
            "as they are".into()
        }
    );
    let mut rows = Vec::new();
    for (i, &nodes) in args.nodes.iter().enumerate() {
        for mode in ["siloed", "ldc"] {
            run_cluster(&args, nodes, mode, cache_bytes, &args.scenarios, &mut rows).await?;
        }
        if i == 0 {
            for multiplier in &args.siloed_cache_multipliers {
                let bigger = (cache_bytes as f64 * multiplier) as u64;
                run_cluster(&args, nodes, "siloed", bigger, &args.scenarios[..1], &mut rows).await?;
            }
        }
    }
    let table = markdown_table(&rows, cache_bytes);
    println!("\n{table}");
    let json = report::output_path(&args.common.out, "ldc", "json")?;
    report::write_json(
        &json,
        &Report {
            git_revision: report::git_revision(),
            machine: report::Machine::current(),
            records: args.common.records,
            value_bytes: args.common.field_bytes,
            cache_fraction: args.cache_fraction,
            emulated_device_read_us: args.emulated_device_read_us,
            clients: args.clients,
            duration_secs: args.common.duration_secs.unwrap_or(30.0),
            rows: &rows,
        },
    )?;
    std::fs::write(json.with_extension("md"), &table)?;
    let groups: Vec<BarGroup> = args
        .nodes
        .iter()
        .map(|nodes| BarGroup {
            label: format!("{nodes} nodes"),
            values: args
                .scenarios
                .iter()
                .map(|scenario| {
                    let find = |mode: &str| {
                        rows.iter()
                            .find(|r| {
                                r.nodes == *nodes
                                    && &r.scenario == scenario
                                    && r.mode == mode
                                    && r.cache_bytes_per_node == cache_bytes
                            })
                            .map(|r| r.ops_per_sec)
                    };
                    Some(find("ldc")? / find("siloed")?.max(1e-9))
                })
                .collect(),
        })
        .collect();
    plot::try_plot("the LDC ratios", &json.with_extension("png"), |p| {
        plot::plot_bars("LDC / siloed throughput", "ldc / siloed", &args.scenarios, &groups, p)
    });
    println!("results: {} (.md, .png)", json.display());
    Ok(())
}
