//! `chorus bench reduction`: the log-reduction paper's experiment (§5) on this machine, in
//! process as the paper's prototype ran it (no network, no raft: the cost measured is applying
//! commands and persisting them). For every workload and batch size one operation stream runs
//! against a fresh store in `reduced` mode and then in `full` mode (every write kept: the
//! standard log in the same code), and the table compares commands and bytes persisted,
//! throughput and CPU per operation, disk used once the cleaner is idle, the time to reopen the
//! store from cold files (recovery) and the time to copy the state's segments as a shipment
//! lands them (each written and fsynced) and install them in an empty store (catch-up of a wiped
//! follower, without the network).
//!
//! Reads never enter Chorus's log (they are served by the leader after a ReadIndex), so `full`
//! persists only writes. The paper's standard log also logs each read; its size is given as
//! `full`'s bytes plus one key-only record per read, so the reduction is shown against both.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use chorus_storage::{segment_bytes_per_record, Manifest, StorageMode, Store, StoreOptions};
use serde::Serialize;

use crate::cpu::process_times;
use crate::generator::Distribution;
use crate::plot::{self, BarGroup};
use crate::report;
use crate::workload::{record_key, KeySpace, Op, OpStream, Workload};

#[derive(clap::Args)]
pub struct ReductionArgs {
    /// Workloads as the paper defines them: A (50% reads), B (95% reads) and C (100% reads)
    /// uniform; D (95% reads, 5% inserts) latest; AW (100% writes) uniform; AWL (100% writes)
    /// latest.
    #[arg(long, value_delimiter = ',', default_value = "A,B,C,D,AW,AWL")]
    pub workloads: Vec<String>,
    /// Commands per batch (reads included, as in the paper).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub batches: Vec<u64>,
    /// Distinct keys the workload draws from.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Commands per run.
    #[arg(long, default_value_t = 1_000_000)]
    pub operations: u64,
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Seed of the operation stream: a run's read share, and so its reduction, is one draw
    /// around the workload's (A's 50% reads vary by about ±0.05% at 10^6 commands).
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// Writes between manifests (the state's part of a raft snapshot), as a node snapshots.
    #[arg(long, default_value_t = 20_000)]
    pub snapshot_every_writes: u64,
    /// Runs of each mode per workload and batch size, alternating; the table shows the run of
    /// median throughput.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Where the stores live (default: a temporary directory, removed afterwards). Put it on
    /// the device under test.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Further directories the stores spread their segments over, one writer thread each (the
    /// paper's parallel logging: put each on its own device).
    #[arg(long, value_delimiter = ',')]
    pub more_dirs: Vec<PathBuf>,
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

/// One workload, batch size and mode.
#[derive(Debug, Clone, Serialize)]
struct ModeRun {
    mode: &'static str,
    reads: u64,
    writes: u64,
    /// Records and bytes the segment writer persisted (before any cleaning).
    records_persisted: u64,
    bytes_persisted: u64,
    segments_written: u64,
    run_secs: f64,
    /// After the run, until the writers and the cleaner were idle.
    settle_secs: f64,
    ops_per_sec: f64,
    /// CPU of the whole process (applying, the writer, the cleaner) per command, until settled.
    cpu_us_per_op: f64,
    merges: u64,
    /// Segment bytes once the cleaner is idle.
    disk_bytes_after_cleaner: u64,
    /// Until the reopened store serves; a reduced store builds its index meanwhile, done at
    /// `recovery_indexed_secs`.
    recovery_secs: f64,
    recovery_indexed_secs: f64,
    /// Until the wiped follower serves, and until its index is built.
    catch_up_secs: f64,
    catch_up_indexed_secs: f64,
    catch_up_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    workload: String,
    batch_commands: u64,
    /// The paper's standard log: every command, a read as a key-only record.
    standard_log_commands: u64,
    standard_log_bytes: u64,
    reduced: ModeRun,
    full: ModeRun,
    /// Every run's throughput, so the spread the ratio sits in shows.
    reduced_runs_ops_per_sec: Vec<f64>,
    full_runs_ops_per_sec: Vec<f64>,
}

impl Row {
    fn fewer(reduced: u64, baseline: u64) -> f64 {
        if baseline == 0 {
            0.0
        } else {
            100.0 * (1.0 - reduced as f64 / baseline as f64)
        }
    }

    fn fewer_commands(&self) -> f64 {
        Row::fewer(self.reduced.records_persisted, self.standard_log_commands)
    }

    fn fewer_bytes(&self) -> f64 {
        Row::fewer(self.reduced.bytes_persisted, self.standard_log_bytes)
    }
}

#[derive(Serialize)]
struct Report<'a> {
    git_revision: String,
    machine: report::Machine,
    records: u64,
    operations: u64,
    value_bytes: usize,
    seed: u64,
    snapshot_every_writes: u64,
    rows: &'a [Row],
}

/// The paper's workloads: its A, B and C are uniform (YCSB's default is zipfian).
fn paper_workload(name: &str) -> anyhow::Result<Workload> {
    let workload = Workload::named(name)?;
    Ok(match workload.name.as_str() {
        "A" | "B" | "C" => workload.with_distribution(Distribution::Uniform),
        "D" | "AW" | "AWL" => workload,
        other => bail!("workload {other} is not one of the paper's (A, B, C, D, AW, AWL)"),
    })
}

/// Copies `files` into `to` as a follower receives a shipment — each file written and fsynced,
/// then the directory — and returns the bytes copied.
fn receive_shipment(files: &[(String, PathBuf)], to: &Path) -> anyhow::Result<u64> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    let mut bytes = 0;
    let mut progress_at = Instant::now() + Duration::from_secs(10);
    for (shipped, (name, from)) in files.iter().enumerate() {
        if Instant::now() >= progress_at {
            progress_at += Duration::from_secs(10);
            println!("     … catch-up: {shipped} of {} files shipped", files.len());
        }
        let path = to.join(name);
        bytes += std::fs::copy(from, &path).with_context(|| format!("cannot copy {}", from.display()))?;
        File::open(&path)
            .and_then(|file| file.sync_data())
            .with_context(|| format!("cannot sync {}", path.display()))?;
    }
    File::open(to)
        .and_then(|dir| dir.sync_all())
        .with_context(|| format!("cannot sync {}", to.display()))?;
    Ok(bytes)
}

/// Drops the files' pages from the page cache, so a reopen reads the device. The files were
/// synced, so their pages are clean and the kernel can drop them.
fn evict_from_page_cache(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let file = std::fs::File::open(entry?.path())?;
        // SAFETY: a valid descriptor; advice changes no memory of ours.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    Ok(())
}

fn cpu_secs() -> anyhow::Result<f64> {
    Ok(process_times(std::process::id())?.total_secs())
}

/// Runs `args.operations` commands of `workload` against a fresh store in `dir`.
fn run_mode(
    args: &ReductionArgs,
    workload: &Workload,
    batch_commands: u64,
    mode: StorageMode,
    dir: &Path,
) -> anyhow::Result<ModeRun> {
    let options = StoreOptions {
        mode,
        // The benchmark cuts batches itself, every `batch_commands` commands.
        batch_writes: u64::MAX,
        batch_bytes: u64::MAX,
        more_dirs: args.more_dirs.iter().map(|more| more.join("state")).collect(),
        ..StoreOptions::new(dir.join("state"))
    };
    let _ = std::fs::remove_dir_all(dir);
    for more in &options.more_dirs {
        let _ = std::fs::remove_dir_all(more);
    }
    let mut store = Store::open(options.clone(), None)?;
    let keys = KeySpace::new(args.records);
    let mut stream = OpStream::new(workload, args.records, 1, keys.clone(), args.seed);
    let mut value = vec![b'v'; args.value_bytes];
    let (mut reads, mut writes, mut index) = (0u64, 0u64, 0u64);
    let mut snapshot: Option<std::thread::JoinHandle<Manifest>> = None;
    let mut writes_at_snapshot = 0;
    let cpu_before = cpu_secs()?;
    let started = Instant::now();
    let mut progress_at = started + Duration::from_secs(10);
    for done in 1..=args.operations {
        let key = match stream.next_op() {
            Op::Read { key } => {
                reads += 1;
                store.get(record_key(key).as_bytes())?;
                None
            }
            Op::Update { key, .. } | Op::ReadModifyWrite { key, .. } => Some(key),
            Op::Insert { key } => {
                keys.acknowledge();
                Some(key)
            }
            Op::Scan { .. } => bail!("workload {} scans; the paper's workloads do not", workload.name),
        };
        if let Some(key) = key {
            writes += 1;
            index += 1;
            // Distinct values, as a real workload writes.
            let stamp = 8.min(value.len());
            value[..stamp].copy_from_slice(&index.to_le_bytes()[..stamp]);
            store.write(
                index,
                Bytes::from(record_key(key)),
                Some(Bytes::copy_from_slice(&value)),
            );
            store.entry_applied(index);
        }
        let batch_ends = done % batch_commands == 0;
        if batch_ends {
            store.cut();
        }
        if snapshot.as_ref().is_some_and(|s| s.is_finished()) {
            let manifest = snapshot.take().expect("present").join().expect("snapshot thread");
            store.manifest_persisted(&manifest)?;
        }
        // A manifest cuts the building batch; begun only where a batch ends, it does not split the
        // paper's batches (which made the reduction vary with the snapshot thread's timing).
        if batch_ends && snapshot.is_none() && writes - writes_at_snapshot >= args.snapshot_every_writes {
            writes_at_snapshot = writes;
            snapshot = Some(std::thread::spawn(store.manifest_later()));
        }
        if Instant::now() >= progress_at {
            progress_at += Duration::from_secs(10);
            println!(
                "     … {done} of {} commands, {:.0} /s",
                args.operations,
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    if let Some(in_flight) = snapshot.take() {
        let manifest = in_flight.join().expect("snapshot thread");
        store.manifest_persisted(&manifest)?;
    }
    let manifest = store.manifest_later()();
    store.manifest_persisted(&manifest)?;
    let run_secs = started.elapsed().as_secs_f64();

    // The cleaner works behind the foreground (rate-limited, at low priority); its backlog at the
    // end is still part of what the run cost, so CPU is counted until it is done.
    let settle_started = Instant::now();
    store.settle_reporting(Duration::from_secs(10), |store| {
        let stats = store.stats();
        println!(
            "     … cleaner: {} segments, {} merges, {:.0}% of segment bytes dead",
            stats.segments,
            stats.merges,
            100.0 * store.dirty_ratio()
        );
    });
    let manifest = store.manifest_later()();
    store.manifest_persisted(&manifest)?;
    store.wait_for_retirements();
    let settle_secs = settle_started.elapsed().as_secs_f64();
    let cpu_secs_used = cpu_secs()? - cpu_before;
    let stats = store.stats();

    let catch_up_started = Instant::now();
    let follower_dir = dir.join("follower");
    let mut follower = Store::open(StoreOptions::new(&follower_dir), None)?;
    let staged = dir.join("incoming");
    let catch_up_bytes = receive_shipment(&store.pin_segments(&manifest)?.files, &staged)?;
    follower.install(&manifest, &staged)?;
    let catch_up_secs = catch_up_started.elapsed().as_secs_f64();
    follower.stats();
    let catch_up_indexed_secs = catch_up_started.elapsed().as_secs_f64();
    drop(follower);
    drop(store);

    for state_dir in options.all_dirs() {
        evict_from_page_cache(state_dir)?;
    }
    if manifest.segments.len() >= 10_000 {
        println!("     … recovery: reopening {} segments", manifest.segments.len());
    }
    let recovery_started = Instant::now();
    let mut recovered = Store::open(options.clone(), Some(&manifest))?;
    let recovery_secs = recovery_started.elapsed().as_secs_f64();
    let recovered_keys = recovered.stats().live_keys;
    let recovery_indexed_secs = recovery_started.elapsed().as_secs_f64();
    if recovered_keys != stats.live_keys {
        bail!("recovered {recovered_keys} keys, the store had {}", stats.live_keys);
    }
    drop(recovered);
    for state_dir in std::iter::once(dir).chain(options.more_dirs.iter().map(PathBuf::as_path)) {
        std::fs::remove_dir_all(state_dir).with_context(|| format!("cannot remove {}", state_dir.display()))?;
    }

    Ok(ModeRun {
        mode: match mode {
            StorageMode::Reduced => "reduced",
            StorageMode::Full => "full",
        },
        reads,
        writes,
        records_persisted: stats.records_out,
        bytes_persisted: stats.bytes_out,
        segments_written: stats.segments_out,
        run_secs,
        settle_secs,
        ops_per_sec: args.operations as f64 / run_secs,
        cpu_us_per_op: cpu_secs_used * 1e6 / args.operations as f64,
        merges: stats.merges,
        disk_bytes_after_cleaner: stats.segment_bytes,
        recovery_secs,
        recovery_indexed_secs,
        catch_up_secs,
        catch_up_indexed_secs,
        catch_up_bytes,
    })
}

fn median_run(mut runs: Vec<ModeRun>) -> ModeRun {
    runs.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    runs.swap_remove(runs.len() / 2)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

const TABLE_HEADER: &str = "| workload | batch | fewer commands vs standard log | fewer bytes vs standard log | \
    fewer bytes vs full | reduced/full ops/s | cleaner after the run s | CPU µs/op reduced / full | \
    disk after cleaner MiB reduced / full | recovery s reduced / full (serving; indexed) | \
    catch-up s reduced / full (serving; indexed) |\n\
    |---|---|---|---|---|---|---|---|---|---|---|\n";

fn table_row(row: &Row) -> String {
    let (r, f) = (&row.reduced, &row.full);
    format!(
        "| {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.2}× | {:.2} | {:.1} / {:.1} | {:.1} / {:.1} | {:.3} / {:.3} ({:.1}×; {:.3} / {:.3}) | {:.3} / {:.3} ({:.1}×; {:.3} / {:.3}) |\n",
        row.workload,
        row.batch_commands,
        row.fewer_commands(),
        row.fewer_bytes(),
        Row::fewer(r.bytes_persisted, f.bytes_persisted),
        r.ops_per_sec / f.ops_per_sec,
        r.settle_secs,
        r.cpu_us_per_op,
        f.cpu_us_per_op,
        mib(r.disk_bytes_after_cleaner),
        mib(f.disk_bytes_after_cleaner),
        r.recovery_secs,
        f.recovery_secs,
        f.recovery_secs / r.recovery_secs.max(1e-9),
        r.recovery_indexed_secs,
        f.recovery_indexed_secs,
        r.catch_up_secs,
        f.catch_up_secs,
        f.catch_up_secs / r.catch_up_secs.max(1e-9),
        r.catch_up_indexed_secs,
        f.catch_up_indexed_secs,
    )
}

pub fn run(args: ReductionArgs) -> anyhow::Result<()> {
    if args.batches.contains(&0) {
        bail!("a batch holds at least one command");
    }
    let workloads: Vec<Workload> = args
        .workloads
        .iter()
        .map(|w| paper_workload(w))
        .collect::<anyhow::Result<_>>()?;
    let work = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("chorus-reduction-bench-{}", std::process::id())));
    println!(
        "log reduction: {} commands over {} keys, {} B values, in {}",
        args.operations,
        args.records,
        args.value_bytes,
        work.display()
    );
    let key_bytes = record_key(0).len();
    let read_record_bytes = segment_bytes_per_record(key_bytes, 0) as u64;
    let mut rows = Vec::new();
    print!("{TABLE_HEADER}");
    for workload in &workloads {
        for &batch_commands in &args.batches {
            let (mut reduced, mut full) = (Vec::new(), Vec::new());
            for round in 0..args.repeat.max(1) {
                // Which mode runs first alternates: the first run of a pair pays for warming the
                // allocator and the page cache.
                for mode in if round % 2 == 0 {
                    [StorageMode::Reduced, StorageMode::Full]
                } else {
                    [StorageMode::Full, StorageMode::Reduced]
                } {
                    let run = run_mode(&args, workload, batch_commands, mode, &work)?;
                    match mode {
                        StorageMode::Reduced => reduced.push(run),
                        StorageMode::Full => full.push(run),
                    }
                }
            }
            let reduced_runs_ops_per_sec = reduced.iter().map(|r| r.ops_per_sec).collect();
            let full_runs_ops_per_sec = full.iter().map(|r| r.ops_per_sec).collect();
            let (reduced, full) = (median_run(reduced), median_run(full));
            let row = Row {
                workload: workload.name.clone(),
                batch_commands,
                standard_log_commands: args.operations,
                standard_log_bytes: full.bytes_persisted + full.reads * read_record_bytes,
                reduced,
                full,
                reduced_runs_ops_per_sec,
                full_runs_ops_per_sec,
            };
            print!("{}", table_row(&row));
            rows.push(row);
        }
    }
    let _ = std::fs::remove_dir_all(&work);

    println!("\n{TABLE_HEADER}{}", rows.iter().map(table_row).collect::<String>());
    let json = report::output_path(&args.out, "reduction", "json")?;
    report::write_json(
        &json,
        &Report {
            git_revision: report::git_revision(),
            machine: report::Machine::current(),
            records: args.records,
            operations: args.operations,
            value_bytes: args.value_bytes,
            seed: args.seed,
            snapshot_every_writes: args.snapshot_every_writes,
            rows: &rows,
        },
    )?;
    let stem = json.with_extension("");
    let bars = |value: &dyn Fn(&Row) -> Vec<f64>| -> Vec<BarGroup> {
        rows.iter()
            .map(|row| BarGroup {
                label: format!("{} b{}", row.workload, row.batch_commands),
                values: value(row).into_iter().map(Some).collect(),
            })
            .collect()
    };
    plot::try_plot(
        "the reduction",
        Path::new(&format!("{}-fewer.png", stem.display())),
        |path| {
            plot::plot_bars(
                "Reduced log vs the standard log (every command)",
                "% fewer than the standard log",
                &["fewer commands %".into(), "fewer bytes %".into()],
                &bars(&|row| vec![row.fewer_commands(), row.fewer_bytes()]),
                path,
            )
        },
    );
    plot::try_plot(
        "the ratios",
        Path::new(&format!("{}-ratios.png", stem.display())),
        |path| {
            plot::plot_bars(
                "Reduced vs full (above 1: reduced is better)",
                "ratio",
                &[
                    "throughput reduced/full".into(),
                    "recovery speed-up".into(),
                    "catch-up speed-up".into(),
                ],
                &bars(&|row| {
                    let (r, f) = (&row.reduced, &row.full);
                    vec![
                        r.ops_per_sec / f.ops_per_sec,
                        f.recovery_secs / r.recovery_secs.max(1e-9),
                        f.catch_up_secs / r.catch_up_secs.max(1e-9),
                    ]
                }),
                path,
            )
        },
    );
    println!("results: {} (and -fewer.png, -ratios.png)", json.display());
    Ok(())
}
