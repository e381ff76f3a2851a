//! A history: every operation clients issued, with when it was invoked and when (and how) it
//! completed, written one JSON object per line.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// GET: the value, or none.
    Read,
    /// SET to `value`.
    Write,
    /// INCR: the value after incrementing (a missing key counts as 0).
    Incr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Took effect; `result` is what the server answered.
    Ok,
    /// Definitely did not take effect (the server said so, or it was never sent).
    Fail,
    /// May or may not have taken effect (timeout, lost connection, outcome-unknown error).
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub client: u64,
    pub kind: OpKind,
    pub key: String,
    /// The value written, for writes.
    pub value: Option<i64>,
    pub invoke_us: u64,
    /// None while outstanding, and for unknown outcomes.
    pub complete_us: Option<u64>,
    pub outcome: Outcome,
    /// A read's value (None: the key was missing) or an increment's new value.
    pub result: Option<i64>,
    /// The node the client sent it to.
    pub node: u64,
}

/// Writes `records` one JSON object per line: a history, or the idioms workload's events.
pub fn write_history<T: Serialize>(path: &Path, records: &[T]) -> anyhow::Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for record in records {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

pub fn read_history(path: &Path) -> anyhow::Result<Vec<Op>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    std::io::BufReader::new(file)
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let line = line?;
            serde_json::from_str(&line).with_context(|| format!("{}:{}: not an operation", path.display(), i + 1))
        })
        .collect()
}
