//! Smoke tests of the measuring instruments: seconds-long runs that prove the driver, the network
//! emulation and the side-by-side peers work end to end. Real measurements are manual
//! (docs/benchmarks.md).

mod common;

use std::path::{Path, PathBuf};

use common::run_chorus;
use serde_json::Value as Json;

/// Stops the cluster in `dir` when the test ends, passed or failed.
struct ClusterGuard(PathBuf);

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new(common::CHORUS)
            .args(["cluster", "stop", "--dir"])
            .arg(&self.0)
            .output();
    }
}

fn start_cluster(dir: &Path, extra: &[&str]) -> (ClusterGuard, String) {
    let path = dir.to_str().expect("utf-8 path");
    let mut args = vec!["cluster", "start", "--dir", path];
    args.extend_from_slice(extra);
    let guard = ClusterGuard(dir.to_path_buf());
    let output = run_chorus(&args);
    (guard, output)
}

/// The single JSON file in `dir` whose name starts with `prefix`.
fn result_file(dir: &Path, prefix: &str) -> Json {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json") && p.file_name().unwrap().to_string_lossy().starts_with(prefix)
        })
        .collect();
    assert_eq!(
        files.len(),
        1,
        "expected one {prefix}*.json in {}: {files:?}",
        dir.display()
    );
    serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap()
}

#[test]
fn bench_run_drives_a_cluster_and_writes_json_and_a_plot() {
    let work = tempfile::tempdir().unwrap();
    let cluster_dir = work.path().join("cluster");
    let out = work.path().join("results");
    let (_guard, _) = start_cluster(&cluster_dir, &[]);
    let output = run_chorus(&[
        "bench",
        "run",
        "--cluster",
        cluster_dir.to_str().unwrap(),
        "--workload",
        "A",
        "--duration-secs",
        "2",
        "--clients",
        "4",
        "--records",
        "500",
        "--out",
        out.to_str().unwrap(),
    ]);
    let result = result_file(&out, "chorus-a-c4");
    let operations = result["operations"].as_u64().unwrap();
    assert!(operations > 100, "{output}");
    assert_eq!(result["errors"].as_u64(), Some(0), "{output}");
    assert_eq!(
        result["reads_not_found"].as_u64(),
        Some(0),
        "every read hits a loaded record"
    );
    let latency = &result["latency_ms"];
    assert!(latency["read"]["count"].as_u64().unwrap() > 0);
    assert!(latency["update"]["count"].as_u64().unwrap() > 0);
    assert!(latency["all"]["p99"].as_f64().unwrap() >= latency["all"]["p50"].as_f64().unwrap());
    assert!(!result["timeline"].as_array().unwrap().is_empty());
    let png_count = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "png"))
        .count();
    assert_eq!(png_count, 1, "the run's plot is written");
}

#[test]
fn wan3_emulation_is_verified_and_really_delays_requests() {
    let work = tempfile::tempdir().unwrap();
    let cluster_dir = work.path().join("cluster");
    let out = work.path().join("results");
    let (_guard, started) = start_cluster(&cluster_dir, &["--net", "wan3"]);
    for path in ["node 1 <-> node 2", "node 1 <-> node 3", "node 2 <-> node 3"] {
        let line = started
            .lines()
            .find(|l| l.contains(path))
            .unwrap_or_else(|| panic!("no check of {path}:\n{started}"));
        assert!(line.trim_end().ends_with("ok"), "{line}");
    }
    let status = run_chorus(&["cluster", "status", "--dir", cluster_dir.to_str().unwrap()]);
    assert!(
        status.lines().any(|l| l.starts_with("node 1 ") && l.contains("leader")),
        "node 1 holds the leader's place in wan3:\n{status}"
    );
    run_chorus(&[
        "bench",
        "run",
        "--cluster",
        cluster_dir.to_str().unwrap(),
        "--workload",
        "AW",
        "--fields",
        "1",
        "--field-bytes",
        "64",
        "--duration-secs",
        "2",
        "--clients",
        "2",
        "--records",
        "100",
        "--out",
        out.to_str().unwrap(),
    ]);
    let result = result_file(&out, "chorus-aw-c2");
    // A write commits once the nearer follower (RTT 102 ms) has it: one emulated round trip.
    let p50 = result["latency_ms"]["update"]["p50"].as_f64().unwrap();
    assert!((100.0..160.0).contains(&p50), "write p50 {p50} ms under wan3");
    assert_eq!(result["network"]["profile"].as_str(), Some("wan3"));
}

#[test]
fn compare_runs_every_target_side_by_side_and_writes_one_table() {
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("results");
    let output = run_chorus(&[
        "bench",
        "compare",
        "--net",
        "lan",
        "--scenarios",
        "AW:1x64",
        "--clients",
        "2",
        "--duration-secs",
        "1",
        "--records",
        "200",
        "--dir",
        work.path().join("systems").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let comparison = result_file(&out, "compare-lan");
    let rows = comparison["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{output}");
    for target in ["chorus", "etcd", "redis", "redis+wait", "redis-alone"] {
        let cell = &rows[0]["results"][target];
        let ops = cell["ops_per_sec"].as_f64().unwrap_or(0.0);
        assert!(ops > 0.0, "{target} made no progress:\n{output}");
        assert_eq!(cell["errors"].as_u64(), Some(0), "{target} errors:\n{output}");
        // Every system's server processes are measured, and they did work.
        let cpu = cell["server_cpu_us_per_op"].as_f64().unwrap_or(0.0);
        assert!(cpu > 0.0, "{target} has no CPU per operation:\n{output}");
    }
    assert!(output.contains("chorus/etcd"), "the table has ratios:\n{output}");
    assert!(
        output.contains("CPU µs/op"),
        "the table has CPU per operation:\n{output}"
    );
    for figure in ["-p99.png", "-cpu.png"] {
        assert!(
            out.read_dir()
                .unwrap()
                .any(|e| e.unwrap().path().to_string_lossy().ends_with(figure)),
            "no {figure}"
        );
    }
}
