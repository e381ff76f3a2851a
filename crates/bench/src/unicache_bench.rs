//! `chorus bench unicache`: the synthetic macro benchmark of UniCache. For every value size and
//! share of recurring values, a fresh 3-node cluster runs 100% writes with UniCache off, then
//! another with it on, on the same emulated network; the table gives the throughput ratio and
//! the bytes the leader sent to followers before and after encoding.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::cli::{resp_target, run_target, save_run, CommonArgs, NetArgs};
use crate::plot::{self, BarGroup};
use crate::report::{self, RunResult};
use chorus_cluster::metrics::{metric_sum, scrape};

#[derive(clap::Args)]
pub struct UniCacheArgs {
    #[command(flatten)]
    pub net: NetArgs,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024,4096")]
    pub sizes: Vec<usize>,
    /// Percentages of writes whose value is one of 64 recurring values (the rest are random).
    #[arg(long, value_delimiter = ',', default_value = "0,25,50,75,100")]
    pub hits: Vec<u32>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 200)]
    pub clients: usize,
    /// Runs of each point, off and on alternating; the table gives the medians.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Server flags for the UniCache-on cluster, e.g. "--unicache-autotune false".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub unicache_flags: String,
    /// Where the clusters keep their data (default: a temporary directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    value_bytes: usize,
    recurring_percent: u32,
    off_ops_per_sec: f64,
    on_ops_per_sec: f64,
    ratio: f64,
    /// Every run's throughput, so the off runs' own spread shows the noise the ratio sits in.
    off_runs_ops_per_sec: Vec<f64>,
    on_runs_ops_per_sec: Vec<f64>,
    off_p99_ms: f64,
    on_p99_ms: f64,
    /// Payload bytes the leader sent its followers with UniCache on, before and after encoding.
    bytes_before: f64,
    bytes_after: f64,
    encoding_peers: f64,
    /// Whether the cache was running at the end (auto-tune pauses it where it does not pay).
    cache_active: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    profile: String,
    bandwidth_mbit: Option<f64>,
    git_revision: String,
    machine: report::Machine,
    clients: usize,
    duration_secs: f64,
    rows: &'a [Row],
    runs: &'a [RunResult],
}

/// One cluster, one run: returns the result and the leader's metrics afterwards.
async fn run_once(
    args: &UniCacheArgs,
    dir: &std::path::Path,
    unicache: bool,
    size: usize,
    recurring: u32,
) -> anyhow::Result<(RunResult, String)> {
    let mut server_args = vec!["--unicache".to_string(), unicache.to_string()];
    if unicache {
        server_args.extend(args.unicache_flags.split_whitespace().map(str::to_string));
    }
    let file = chorus_cluster::start(dir, 3, server_args, &args.net.options()).await?;
    let outcome = async {
        let states = chorus_cluster::status(dir, &file).await;
        let leader = states.iter().find(|s| s.is_leader()).context("no leader")?;
        let target = resp_target(
            if unicache { "chorus+unicache" } else { "chorus" },
            vec![leader.entry.client_addr],
            1,
            None,
        );
        let mut config = args.common.config("AW", args.clients, 1, size)?;
        config.value_repeat_fraction = Some(f64::from(recurring) / 100.0);
        config.value_repeat_pool = 64;
        let pids: Vec<u32> = states.iter().filter_map(|s| s.pid).collect();
        let (_, result) = run_target(&target, &config, false, &pids).await?;
        let metrics = scrape(leader.entry.metrics_addr).await?;
        Ok::<_, anyhow::Error>((result, metrics))
    }
    .await;
    chorus_cluster::stop(dir)?;
    let _ = std::fs::remove_dir_all(dir);
    outcome
}

pub async fn run(args: UniCacheArgs) -> anyhow::Result<()> {
    let profile = args.net.profile()?;
    println!("UniCache off vs on, 100% writes, on {}", profile.summary());
    let work = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("chorus-unicache-bench-{}", std::process::id())));
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for &size in &args.sizes {
        for &recurring in &args.hits {
            println!("-- {size} B values, {recurring}% recurring");
            let mut offs = Vec::new();
            let mut ons = Vec::new();
            for _ in 0..args.repeat.max(1) {
                offs.push(run_once(&args, &work.join("off"), false, size, recurring).await?.0);
                ons.push(run_once(&args, &work.join("on"), true, size, recurring).await?);
            }
            let median_index = |results: &[&RunResult]| {
                let mut order: Vec<usize> = (0..results.len()).collect();
                order.sort_by(|a, b| {
                    results[*a]
                        .throughput_ops_per_sec
                        .total_cmp(&results[*b].throughput_ops_per_sec)
                });
                order[order.len() / 2]
            };
            let off_runs_ops_per_sec: Vec<f64> = offs.iter().map(|r| r.throughput_ops_per_sec).collect();
            let on_runs_ops_per_sec: Vec<f64> = ons.iter().map(|(r, _)| r.throughput_ops_per_sec).collect();
            let off = offs.swap_remove(median_index(&offs.iter().collect::<Vec<_>>()));
            let (on, metrics) = ons.swap_remove(median_index(&ons.iter().map(|(r, _)| r).collect::<Vec<_>>()));
            let row = Row {
                value_bytes: size,
                recurring_percent: recurring,
                off_ops_per_sec: off.throughput_ops_per_sec,
                on_ops_per_sec: on.throughput_ops_per_sec,
                ratio: on.throughput_ops_per_sec / off.throughput_ops_per_sec.max(1e-9),
                off_runs_ops_per_sec,
                on_runs_ops_per_sec,
                off_p99_ms: off.latency_ms["all"].p99,
                on_p99_ms: on.latency_ms["all"].p99,
                bytes_before: metric_sum(&metrics, "chorus_unicache_bytes_before_total"),
                bytes_after: metric_sum(&metrics, "chorus_unicache_bytes_after_total"),
                encoding_peers: metric_sum(&metrics, "chorus_unicache_encoding"),
                cache_active: metric_sum(&metrics, "chorus_unicache_active") > 0.0,
            };
            println!(
                "   off {:.0} ops/s, on {:.0} ops/s: {:.2}x; sent {:.0}% of the bytes; encoding to {} of 2 followers; cache {}",
                row.off_ops_per_sec,
                row.on_ops_per_sec,
                row.ratio,
                100.0 * row.bytes_after / row.bytes_before.max(1.0),
                row.encoding_peers,
                if row.cache_active { "running" } else { "paused" }
            );
            for result in [&off, &on] {
                save_run(result, &args.common.out)?;
            }
            runs.push(off);
            runs.push(on);
            rows.push(row);
        }
    }
    let _ = std::fs::remove_dir_all(&work);

    let mut table = String::from(
        "| value B | recurring % | off ops/s | on ops/s | on/off | off runs / off median | off p99 ms | on p99 ms | bytes sent (on) | followers encoding | cache |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let (low, high) = r
            .off_runs_ops_per_sec
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        table.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.2}x | {:.2}–{:.2}x | {:.1} | {:.1} | {:.0}% | {} | {} |\n",
            r.value_bytes,
            r.recurring_percent,
            r.off_ops_per_sec,
            r.on_ops_per_sec,
            r.ratio,
            low / r.off_ops_per_sec.max(1e-9),
            high / r.off_ops_per_sec.max(1e-9),
            r.off_p99_ms,
            r.on_p99_ms,
            100.0 * r.bytes_after / r.bytes_before.max(1.0),
            r.encoding_peers,
            if r.cache_active { "running" } else { "paused" }
        ));
    }
    println!("\n{table}");
    let json = report::output_path(&args.common.out, &format!("unicache-{}", profile.name), "json")?;
    report::write_json(
        &json,
        &Report {
            profile: profile.name.clone(),
            bandwidth_mbit: profile.bandwidth_mbit,
            git_revision: report::git_revision(),
            machine: report::Machine::current(),
            clients: args.clients,
            duration_secs: args.common.duration_secs.unwrap_or(30.0),
            rows: &rows,
            runs: &runs,
        },
    )?;
    std::fs::write(json.with_extension("md"), &table)?;
    let sizes: Vec<String> = args.sizes.iter().map(|s| format!("{s} B")).collect();
    let groups: Vec<BarGroup> = args
        .hits
        .iter()
        .map(|h| BarGroup {
            label: format!("{h}% recurring"),
            values: args
                .sizes
                .iter()
                .map(|s| {
                    rows.iter()
                        .find(|r| r.value_bytes == *s && r.recurring_percent == *h)
                        .map(|r| r.ratio)
                })
                .collect(),
        })
        .collect();
    plot::try_plot("the UniCache ratios", &json.with_extension("png"), |p| {
        plot::plot_bars(
            &format!("UniCache on/off throughput on {}", profile.name),
            "on / off",
            &sizes,
            &groups,
            p,
        )
    });
    println!("results: {} (.md, .png)", json.display());
    Ok(())
}

#[derive(clap::Args)]
pub struct StreamArgs {
    /// Records per stream.
    #[arg(long, default_value_t = 100_000)]
    pub records: usize,
    /// Cache budget in bytes of items.
    #[arg(long, default_value_t = 1 << 20)]
    pub cache_bytes: usize,
    /// Cache budget in items.
    #[arg(long, default_value_t = 32_768)]
    pub cache_items: u32,
    /// Eviction policies to compare.
    #[arg(long, value_delimiter = ',', default_value = "lru,lfu,lecar")]
    pub policies: Vec<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for the JSON result.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
struct StreamRow {
    stream: &'static str,
    policy: String,
    records: usize,
    raw_bytes: u64,
    encoded_bytes: u64,
    compression_percent: f64,
    cache_items: usize,
    cache_bytes: usize,
    encode_ns_per_record: f64,
}

/// Compression of realistic streams: each record is encoded with the cache as it stands (what
/// the leader sends) and then absorbed (what every replica does once it commits).
pub fn run_streams(args: StreamArgs) -> anyhow::Result<()> {
    let dict = crate::streams::Dictionary::load()?;
    let streams = [
        crate::streams::email(&dict, args.records, args.seed),
        crate::streams::news(&dict, args.records, args.seed),
        crate::streams::bus_sql(args.records, args.seed),
    ];
    let mut rows = Vec::new();
    for stream in &streams {
        for policy in &args.policies {
            let config = chorus_unicache::CacheConfig {
                policy: policy.parse().map_err(anyhow::Error::msg)?,
                max_items: args.cache_items,
                max_bytes: args.cache_bytes,
            };
            let mut cache = chorus_unicache::ItemCache::new(config);
            let (mut raw, mut encoded) = (0u64, 0u64);
            let mut parts = Vec::new();
            let mut out = Vec::new();
            let mut encode_time = Duration::ZERO;
            for (i, record) in stream.records.iter().enumerate() {
                let started = std::time::Instant::now();
                parts.clear();
                out.clear();
                stream.preprocessor.preprocess(record, &mut parts);
                chorus_unicache::encode_command(&cache, &parts, &mut out);
                encode_time += started.elapsed();
                raw += record.len() as u64;
                encoded += out.len() as u64;
                chorus_unicache::absorb_command(&mut cache, &parts, i as u64);
            }
            let row = StreamRow {
                stream: stream.name,
                policy: config.policy.name().to_string(),
                records: stream.records.len(),
                raw_bytes: raw,
                encoded_bytes: encoded,
                compression_percent: 100.0 * (1.0 - encoded as f64 / raw.max(1) as f64),
                cache_items: cache.len(),
                cache_bytes: cache.bytes(),
                encode_ns_per_record: encode_time.as_nanos() as f64 / stream.records.len().max(1) as f64,
            };
            println!(
                "{:<22} {:<6} {:>5.1}% smaller ({:.0} -> {:.0} B per record), cache {} items / {} KiB, {:.0} ns per record",
                row.stream,
                row.policy,
                row.compression_percent,
                raw as f64 / row.records as f64,
                encoded as f64 / row.records as f64,
                row.cache_items,
                row.cache_bytes / 1024,
                row.encode_ns_per_record
            );
            rows.push(row);
        }
    }
    let json = report::output_path(&args.out, "unicache-streams", "json")?;
    report::write_json(&json, &rows)?;
    println!("results: {}", json.display());
    Ok(())
}
