//! Results: what a run measured, as JSON under `bench-results/`, and the summary printed at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::cpu::ServerCpu;
use crate::driver::RunConfig;

#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl LatencySummary {
    /// From a histogram of microseconds, in milliseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> LatencySummary {
        let ms = |us: u64| us as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TimelinePoint {
    pub second: u64,
    pub ops: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
}

impl Machine {
    pub fn current() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
                .unwrap_or_default(),
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
        }
    }
}

/// The checked-out revision (with "-dirty" when there are local changes), or "unknown".
pub fn git_revision() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) if run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty()) => {
            format!("{rev}-dirty")
        }
        Some(rev) => rev,
        None => "unknown".into(),
    }
}

/// The emulated network a run used, with what was measured on it.
#[derive(Debug, Clone, Serialize)]
pub struct NetworkReport {
    pub profile: String,
    pub bandwidth_mbit: Option<f64>,
    /// Round trips measured on the links before the system started (path label → ms).
    pub measured_paths_ms: BTreeMap<String, f64>,
    /// The client's round trip to the target just before the run, in ms.
    pub client_rtt_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub name: String,
    pub target: String,
    pub started_unix_secs: u64,
    pub git_revision: String,
    pub machine: Machine,
    pub network: Option<NetworkReport>,
    pub config: RunConfig,
    pub duration_secs: f64,
    pub operations: u64,
    pub errors: u64,
    pub errors_by_class: BTreeMap<String, u64>,
    pub error_samples: Vec<String>,
    pub reads_not_found: u64,
    pub throughput_ops_per_sec: f64,
    /// By operation kind, and "all".
    pub latency_ms: BTreeMap<String, LatencySummary>,
    pub timeline: Vec<TimelinePoint>,
    /// CPU the servers spent during the run (absent when their processes were not known).
    pub server_cpu: Option<ServerCpu>,
    /// CPU this benchmark client spent per operation, in µs.
    pub client_cpu_us_per_op: f64,
}

impl RunResult {
    pub fn print_summary(&self) {
        println!(
            "{}: {} ops in {:.1} s = {:.0} ops/s, {} errors{}",
            self.name,
            self.operations,
            self.duration_secs,
            self.throughput_ops_per_sec,
            self.errors,
            if self.reads_not_found > 0 {
                format!(", {} reads found nothing", self.reads_not_found)
            } else {
                String::new()
            }
        );
        for (kind, l) in &self.latency_ms {
            println!(
                "  {kind:<18} n {:>9}  mean {:>8.2}  p50 {:>8.2}  p90 {:>8.2}  p99 {:>8.2}  p99.9 {:>8.2}  max {:>8.2} ms",
                l.count, l.mean, l.p50, l.p90, l.p99, l.p999, l.max
            );
        }
        match &self.server_cpu {
            Some(cpu) => println!(
                "  CPU per operation: servers {:.1} µs (user {:.1}, system {:.1}; {} processes, {:.2} cores busy), client {:.1} µs",
                cpu.us_per_op,
                cpu.times.user_secs * 1e6 / self.operations.max(1) as f64,
                cpu.times.system_secs * 1e6 / self.operations.max(1) as f64,
                cpu.processes.len(),
                cpu.cores_busy,
                self.client_cpu_us_per_op
            ),
            None => println!(
                "  CPU per operation: servers not measured (their processes are unknown), client {:.1} µs",
                self.client_cpu_us_per_op
            ),
        }
        for sample in &self.error_samples {
            println!("  error: {sample}");
        }
    }
}

/// `DIR/NAME-<UTC time>.EXT`, creating DIR.
pub fn output_path(dir: &Path, name: &str, extension: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(dir.join(format!("{name}-{}.{extension}", utc_stamp(secs))))
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time (civil-from-days, proleptic Gregorian calendar).
pub fn utc_stamp(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    )
}

pub fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).expect("results serialise");
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps_match_known_dates() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_795_379_696), "20261122T203456Z");
    }
}
