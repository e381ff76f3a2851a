//! The fault-injection harness in CI: a short run with faults (a power cut of every node among
//! them) must be linearizable, a bank on a SQL cluster must keep its books, a deliberately broken build (reads served from local state, no ReadIndex) must
//! be caught, and a run that cannot finish must fail with its records kept. Long campaigns are
//! manual (docs/reliability.md).

mod common;

use std::process::Command;

use common::{run_chorus, CHORUS};

/// Whether power-cut disks can be mounted here (else the power-cut faults are left out, loudly,
/// unless `CHORUS_REQUIRE_FUSE` makes that a failure).
fn power_cuts_available() -> bool {
    let mountpoint = tempfile::tempdir().unwrap();
    chorus_powercut::mount_for_test(&chorus_powercut::Disk::new(), mountpoint.path()).is_ok()
}

#[test]
fn a_short_run_under_every_kind_of_fault_is_linearizable() {
    let out = tempfile::tempdir().unwrap();
    // Seed 43's 24 s draw a power cut of every node, then two pauses.
    let mut args = vec![
        "chaos",
        "run",
        "--duration-secs",
        "24",
        "--seed",
        "43",
        "--out",
        out.path().to_str().unwrap(),
    ];
    let power_cuts = power_cuts_available();
    if !power_cuts {
        args.extend([
            "--faults",
            "kill-leader,kill-random,pause-leader,pause-random,restart-all",
        ]);
    }
    let text = run_chorus(&args);
    assert!(text.contains(": linearizable"), "{text}");
    assert!(text.contains("fault "), "faults were injected:\n{text}");
    if power_cuts {
        assert!(
            text.contains("fault PowerCutAll"),
            "the power of every node was cut:\n{text}"
        );
    }
}

#[test]
fn a_short_bank_run_on_a_sql_cluster_keeps_its_books() {
    let out = tempfile::tempdir().unwrap();
    // The run ends with a full restart: with the nodes on power-cut disks, a power cut of every
    // node, whose SQLite files (never synced by SQLite) the nodes must rebuild from their
    // checkpoints and logs.
    let power_cuts = power_cuts_available();
    let faults = if power_cuts {
        "kill-leader,kill-random,pause-leader,partition-leader,restart-all,power-cut-random"
    } else {
        "kill-leader,kill-random,pause-leader,partition-leader,restart-all"
    };
    let text = run_chorus(&[
        "chaos",
        "run",
        "--workload",
        "bank",
        "--duration-secs",
        "20",
        "--seed",
        "1",
        "--faults",
        faults,
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(text.contains("acknowledged transfers agree on every node"), "{text}");
    if power_cuts {
        assert!(
            text.contains("cutting its power"),
            "the power of every node was cut:\n{text}"
        );
    }
    assert!(text.contains("fault "), "faults were injected:\n{text}");
    let committed: u64 = text
        .split("checked ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(committed > 100, "transfers committed under faults: {committed}\n{text}");
}

/// Runs `chorus chaos run ARGS`, which must fail and keep `kept` in the run's directory; returns
/// its output.
fn failing_run(args: &[&str], kept: &[&str]) -> String {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(CHORUS)
        .args(["chaos", "run", "--out", out.path().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "the run passed:\n{text}");
    let kept_dir = std::fs::read_dir(out.path()).unwrap().next().unwrap().unwrap().path();
    for file in kept {
        assert!(kept_dir.join(file).exists(), "a failed run keeps {file}:\n{text}");
    }
    text
}

#[test]
fn reads_served_without_read_index_are_caught() {
    let text = failing_run(
        &[
            "--duration-secs",
            "24",
            "--seed",
            "5",
            "--faults",
            "partition-majority,partition-leader",
            "--server-flags",
            "--read-consistency stale",
        ],
        &["history.jsonl", "schedule.json", "result.json", "violation.jsonl"],
    );
    assert!(text.contains("NOT linearizable"), "{text}");
}

#[test]
fn a_run_that_cannot_finish_fails_and_keeps_what_it_recorded() {
    let text = failing_run(
        &["--duration-secs", "5", "--server-flags", "--no-such-flag"],
        &[
            "history.jsonl",
            "schedule.json",
            "result.json",
            "cluster/node1/server.log",
        ],
    );
    assert!(text.contains("run failed: the cluster did not start"), "{text}");
}
