//! Helpers shared by the integration test files.

use std::process::Command;

pub const CHORUS: &str = env!("CARGO_BIN_EXE_chorus");

/// Runs `chorus ARGS`, asserts success, returns stdout and stderr together.
pub fn run_chorus(args: &[&str]) -> String {
    let out = Command::new(CHORUS).args(args).output().expect("run chorus");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chorus {args:?} failed:\n{text}");
    text
}
