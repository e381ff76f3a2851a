//! Helpers shared by the integration test files.
#![allow(dead_code, reason = "each test file compiles its own copy and uses some of it")]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const CHORUS: &str = env!("CARGO_BIN_EXE_chorus");

/// Runs `chorus ARGS`, asserts success, returns stdout and stderr together.
pub fn run_chorus(args: &[&str]) -> String {
    run_chorus_in(Path::new("."), args)
}

/// Runs `chorus ARGS` in the working directory `cwd`, asserts success, returns stdout and
/// stderr together.
pub fn run_chorus_in(cwd: &Path, args: &[&str]) -> String {
    let out = Command::new(CHORUS)
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("run chorus");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chorus {args:?} failed:\n{text}");
    text
}

/// Prints the last `count` lines of each (name, log file): a failing test's nodes' logs go
/// with its temporary directory, so their ends are shown with the failure.
pub fn print_log_tails(logs: impl IntoIterator<Item = (String, PathBuf)>, count: usize) {
    for (name, path) in logs {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("---- {name}: last {count} lines of {}", path.display());
        for line in &lines[lines.len().saturating_sub(count)..] {
            eprintln!("{line}");
        }
    }
}
