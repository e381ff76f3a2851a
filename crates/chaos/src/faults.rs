//! Faults: a schedule drawn from a seed (so a failing run can be replayed), and how each fault is
//! done to a local cluster and undone.
//!
//! Targets are chosen when a fault starts ("the leader", "a random node"), since which node
//! leads is only known then; what was actually done is recorded next to the schedule.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use chorus_cluster::{process, ClusterFile, NetOptions};
use serde::{Deserialize, Serialize};

use crate::workload::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL the leader, restart it when the fault ends.
    KillLeader,
    /// SIGKILL a random node, restart it when the fault ends.
    KillRandom,
    /// SIGSTOP the leader for longer than an election timeout, then SIGCONT.
    PauseLeader,
    /// SIGSTOP a random node, then SIGCONT.
    PauseRandom,
    /// Cut a random minority off from the majority.
    PartitionMajority,
    /// Cut the leader off from every other node.
    PartitionLeader,
    /// Two sides that cannot talk, joined only through one bridge node.
    PartitionBridge,
    /// SIGKILL every node, then start them all again.
    RestartAll,
}

impl FaultKind {
    pub const ALL: [FaultKind; 8] = [
        FaultKind::KillLeader,
        FaultKind::KillRandom,
        FaultKind::PauseLeader,
        FaultKind::PauseRandom,
        FaultKind::PartitionMajority,
        FaultKind::PartitionLeader,
        FaultKind::PartitionBridge,
        FaultKind::RestartAll,
    ];
}

/// One fault of the schedule: start after `quiet_ms` of healthy cluster, last `duration_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Planned {
    pub quiet_ms: u64,
    pub kind: FaultKind,
    pub duration_ms: u64,
    /// Picks "a random node" and partition sides, drawn with the schedule.
    pub choice: u64,
}

/// Draws faults until `total` is filled: 2–5 s of quiet, then 2–6 s of fault.
pub fn schedule(seed: u64, kinds: &[FaultKind], total: Duration) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let mut planned = Vec::new();
    let mut used = 0u64;
    let total_ms = total.as_millis() as u64;
    loop {
        let quiet_ms = 2_000 + rng.below(3_000);
        let duration_ms = 2_000 + rng.below(4_000);
        if used + quiet_ms + duration_ms > total_ms || kinds.is_empty() {
            return planned;
        }
        used += quiet_ms + duration_ms;
        planned.push(Planned {
            quiet_ms,
            kind: kinds[rng.below(kinds.len() as u64) as usize],
            duration_ms,
            choice: rng.below(u64::MAX),
        });
    }
}

/// What a fault did, for the record and to undo it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Applied {
    pub at_ms: u64,
    pub kind: FaultKind,
    pub nodes: Vec<u64>,
    /// Directed links cut, as (from, to).
    pub cut: Vec<(u64, u64)>,
    pub healed_at_ms: Option<u64>,
}

/// The cluster faults are done to.
pub struct Target<'a> {
    pub dir: &'a Path,
    pub file: &'a ClusterFile,
    pub net: &'a NetOptions,
}

impl Target<'_> {
    fn ids(&self) -> Vec<u64> {
        self.file.nodes.iter().map(|n| n.id).collect()
    }

    fn pid(&self, id: u64) -> anyhow::Result<u32> {
        chorus_cluster::read_pid(self.dir, id).with_context(|| format!("node {id} is not running"))
    }

    pub async fn leader(&self) -> Option<u64> {
        let states = chorus_cluster::status(self.dir, self.file).await;
        states.iter().find(|s| s.is_leader()).map(|s| s.entry.id)
    }

    fn cut(&self, sides: &[BTreeSet<u64>], bridge: Option<u64>) -> anyhow::Result<Vec<(u64, u64)>> {
        let proxy = chorus_cluster::network(self.dir)?;
        let side_of = |id: u64| sides.iter().position(|s| s.contains(&id));
        let mut cut = Vec::new();
        for from in self.ids() {
            for to in self.ids() {
                if from == to || Some(from) == bridge || Some(to) == bridge {
                    continue;
                }
                if side_of(from) != side_of(to) {
                    proxy.set_enabled(&chorus_cluster::peer_link_name(from, to), false)?;
                    cut.push((from, to));
                }
            }
        }
        Ok(cut)
    }

    /// Starts a fault; returns what it did.
    pub async fn apply(&self, planned: &Planned, at_ms: u64) -> anyhow::Result<Applied> {
        let ids = self.ids();
        let mut rng = Rng::new(planned.choice);
        let random = ids[rng.below(ids.len() as u64) as usize];
        let leader = match self.leader().await {
            Some(l) => l,
            None => random,
        };
        let mut applied = Applied {
            at_ms,
            kind: planned.kind,
            nodes: Vec::new(),
            cut: Vec::new(),
            healed_at_ms: None,
        };
        match planned.kind {
            FaultKind::KillLeader | FaultKind::KillRandom => {
                let id = if planned.kind == FaultKind::KillLeader {
                    leader
                } else {
                    random
                };
                chorus_cluster::kill_node(self.dir, id)?;
                applied.nodes.push(id);
            }
            FaultKind::PauseLeader | FaultKind::PauseRandom => {
                let id = if planned.kind == FaultKind::PauseLeader {
                    leader
                } else {
                    random
                };
                process::signal(self.pid(id)?, libc::SIGSTOP);
                applied.nodes.push(id);
            }
            FaultKind::PartitionMajority => {
                let mut shuffled = ids.clone();
                for i in (1..shuffled.len()).rev() {
                    shuffled.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let minority: BTreeSet<u64> = shuffled[..ids.len() / 2].iter().copied().collect();
                let majority: BTreeSet<u64> = shuffled[ids.len() / 2..].iter().copied().collect();
                applied.nodes = minority.iter().copied().collect();
                applied.cut = self.cut(&[minority, majority], None)?;
            }
            FaultKind::PartitionLeader => {
                let alone = BTreeSet::from([leader]);
                let rest: BTreeSet<u64> = ids.iter().copied().filter(|id| *id != leader).collect();
                applied.nodes.push(leader);
                applied.cut = self.cut(&[alone, rest], None)?;
            }
            FaultKind::PartitionBridge => {
                if ids.len() < 3 {
                    bail!("a bridge partition needs at least 3 nodes");
                }
                let bridge = random;
                let others: Vec<u64> = ids.iter().copied().filter(|id| *id != bridge).collect();
                let half = others.len() / 2;
                let left: BTreeSet<u64> = others[..half].iter().copied().collect();
                let right: BTreeSet<u64> = others[half..].iter().copied().collect();
                applied.nodes.push(bridge);
                applied.cut = self.cut(&[left, right], Some(bridge))?;
            }
            FaultKind::RestartAll => {
                for id in &ids {
                    if chorus_cluster::read_pid(self.dir, *id).is_some() {
                        chorus_cluster::kill_node(self.dir, *id)?;
                    }
                }
                applied.nodes = ids;
            }
        }
        Ok(applied)
    }

    /// Undoes a fault: restarts killed nodes, resumes paused ones, restores cut links.
    pub async fn heal(&self, applied: &Applied) -> anyhow::Result<()> {
        match applied.kind {
            FaultKind::KillLeader | FaultKind::KillRandom | FaultKind::RestartAll => self.restart_stopped().await?,
            FaultKind::PauseLeader | FaultKind::PauseRandom => {
                for id in &applied.nodes {
                    process::signal(self.pid(*id)?, libc::SIGCONT);
                }
            }
            FaultKind::PartitionMajority | FaultKind::PartitionLeader | FaultKind::PartitionBridge => {
                let proxy = chorus_cluster::network(self.dir)?;
                for (from, to) in &applied.cut {
                    proxy.set_enabled(&chorus_cluster::peer_link_name(*from, *to), true)?;
                }
            }
        }
        Ok(())
    }

    /// Starts every node that is not running and waits for a leader.
    pub async fn restart_stopped(&self) -> anyhow::Result<()> {
        chorus_cluster::start(self.dir, self.file.nodes.len(), Vec::new(), self.net).await?;
        Ok(())
    }

    /// Kills every node and starts them all again (what "no acknowledged write is lost after a
    /// full restart" is checked against).
    pub async fn full_restart(&self) -> anyhow::Result<()> {
        for id in self.ids() {
            if chorus_cluster::read_pid(self.dir, id).is_some() {
                chorus_cluster::kill_node(self.dir, id)?;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.restart_stopped().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let a = schedule(7, &FaultKind::ALL, Duration::from_secs(60));
        let b = schedule(7, &FaultKind::ALL, Duration::from_secs(60));
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        assert!(a.len() >= 5, "60 s holds several faults: {}", a.len());
        let total: u64 = a.iter().map(|p| p.quiet_ms + p.duration_ms).sum();
        assert!(total <= 60_000);
        let c = schedule(8, &FaultKind::ALL, Duration::from_secs(60));
        assert_ne!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&c).unwrap());
    }
}
