//! Faults: a schedule drawn from a seed (so a failing run can be replayed), and how each fault is
//! done to a local cluster and undone.
//!
//! Targets are chosen when a fault starts ("the leader", "a random node"), since which node
//! leads is only known then; what was actually done is recorded next to the schedule.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use anyhow::{bail, Context};
use chorus_cluster::{process, ClusterFile, NetOptions};
use serde::{Deserialize, Serialize};

use crate::disks::PowerCutDisks;
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
    /// SIGKILL a random node and cut its disk's power (its unsynced writes vanish); restart it
    /// when the fault ends.
    PowerCutRandom,
    /// SIGKILL every node and cut every disk's power, then start them all again.
    PowerCutAll,
    /// On the PostgreSQL engine: crash a random node's server (a SIGKILLed server process
    /// makes it reset and recover from its WAL); the node fails on its broken connections and
    /// is restarted when the fault ends.
    CrashPostgresRandom,
    /// Change the membership: a new node joins (a learner, caught up, then a voter) and a random
    /// other one is removed (a leader hands its leadership over first) and stopped. Needs a
    /// network without per-pair proxies (every member dials a node at the one address the log
    /// records) and the registers or bank workload, whose clients follow the membership.
    ReplaceRandom,
}

impl FaultKind {
    pub const ALL: [FaultKind; 10] = [
        FaultKind::KillLeader,
        FaultKind::KillRandom,
        FaultKind::PauseLeader,
        FaultKind::PauseRandom,
        FaultKind::PartitionMajority,
        FaultKind::PartitionLeader,
        FaultKind::PartitionBridge,
        FaultKind::RestartAll,
        FaultKind::PowerCutRandom,
        FaultKind::PowerCutAll,
    ];

    /// Needs each node's data on a power-cut disk.
    pub fn cuts_power(self) -> bool {
        matches!(self, FaultKind::PowerCutRandom | FaultKind::PowerCutAll)
    }

    /// Cuts links between nodes, which needs a proxy on every link.
    pub fn cuts_links(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionMajority | FaultKind::PartitionLeader | FaultKind::PartitionBridge
        )
    }

    /// Needs each node to replicate into a PostgreSQL server of its own.
    pub fn needs_postgres(self) -> bool {
        self == FaultKind::CrashPostgresRandom
    }

    /// The faults a run draws from when none are named: every one that applies to its nodes.
    pub fn defaults(on_postgres: bool) -> Vec<FaultKind> {
        let mut kinds = FaultKind::ALL.to_vec();
        if on_postgres {
            kinds.push(FaultKind::CrashPostgresRandom);
        }
        kinds
    }
}

/// For this long before the power goes, syncs stop completing, as on a device that has stopped
/// flushing.
const SYNC_STALL_BEFORE_CUT: Duration = Duration::from_millis(100);

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
    /// Files and directory entries a power cut took back to their last synced state.
    #[serde(default)]
    pub rolled_back_by_cut: usize,
}

/// The nodes clients may reach, (id, client address) each, as the membership changes.
pub type NodeList = Arc<RwLock<Vec<(u64, SocketAddr)>>>;

/// The cluster faults are done to.
pub struct Target<'a> {
    pub dir: &'a Path,
    pub net: &'a NetOptions,
    /// The nodes' power-cut disks, when the run's faults cut power.
    pub disks: Option<&'a Mutex<PowerCutDisks>>,
    /// Where the clients connect; a membership change updates it.
    pub nodes: NodeList,
}

/// How long one step of a membership change (adding, catching up, promoting, removing) may take.
const MEMBERSHIP_STEP_TIMEOUT: Duration = Duration::from_secs(30);

impl Target<'_> {
    /// The cluster as its file lists it now (membership changes rewrite it).
    pub fn file(&self) -> anyhow::Result<ClusterFile> {
        chorus_cluster::load(self.dir)
    }

    fn ids(&self) -> Vec<u64> {
        self.file()
            .map_or_else(|_| Vec::new(), |file| file.nodes.iter().map(|n| n.id).collect())
    }

    fn pid(&self, id: u64) -> anyhow::Result<u32> {
        chorus_cluster::read_pid(self.dir, id).with_context(|| format!("node {id} is not running"))
    }

    pub async fn leader(&self) -> Option<u64> {
        let states = chorus_cluster::status(self.dir, &self.file().ok()?).await;
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
            rolled_back_by_cut: 0,
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
                self.kill_and_wait(&self.ids());
                applied.nodes = ids;
            }
            FaultKind::PowerCutRandom => {
                applied.rolled_back_by_cut = self.power_cut(&[random]).await?;
                applied.nodes.push(random);
            }
            FaultKind::PowerCutAll => {
                applied.rolled_back_by_cut = self.power_cut(&ids).await?;
                applied.nodes = ids;
            }
            FaultKind::CrashPostgresRandom => {
                crash_postgres(&chorus_cluster::node_dir(self.dir, random))?;
                applied.nodes.push(random);
            }
            FaultKind::ReplaceRandom => applied.nodes = self.replace(random).await?,
        }
        Ok(applied)
    }

    /// SIGKILLs each of `ids` still running and waits until it is gone. One lookup of its pid:
    /// a node already signalled may die between two (kill_node's own lookup then fails, and
    /// a power cut stopped there left every node down).
    fn kill_and_wait(&self, ids: &[u64]) {
        for &id in ids {
            if let Some(pid) = chorus_cluster::read_pid(self.dir, id) {
                process::kill(pid);
            }
        }
    }

    fn disks(&self) -> anyhow::Result<std::sync::MutexGuard<'_, PowerCutDisks>> {
        let disks = self
            .disks
            .context("a power-cut fault needs the nodes' data on power-cut disks")?;
        Ok(disks.lock().expect("disks lock"))
    }

    /// Cuts the power of running nodes under load. For a moment before, their syncs stop
    /// completing: the cut then finds writes that were written but never made durable, and
    /// exposes any reply that ran ahead of durability — a window too short to hit by chance
    /// while syncs are fast. Returns what the cuts rolled back.
    async fn power_cut(&self, ids: &[u64]) -> anyhow::Result<usize> {
        let pids: Vec<u32> = ids
            .iter()
            .filter_map(|id| chorus_cluster::read_pid(self.dir, *id))
            .collect();
        {
            let disks = self.disks()?;
            for &id in ids {
                disks.stall_syncs(id)?;
            }
        }
        tokio::time::sleep(SYNC_STALL_BEFORE_CUT).await;
        for pid in pids {
            process::signal(pid, libc::SIGKILL);
        }
        {
            let disks = self.disks()?;
            for &id in ids {
                disks.fail_stalled_syncs(id)?;
            }
        }
        self.kill_and_wait(ids);
        self.cut_power(ids)
    }

    /// Cuts the power of the (already killed) nodes' disks; returns what the cuts rolled back.
    fn cut_power(&self, ids: &[u64]) -> anyhow::Result<usize> {
        let mut disks = self.disks()?;
        let mut rolled_back = 0;
        for &id in ids {
            let report = disks.cut(id)?;
            rolled_back += report.files_rolled_back + report.entries_rolled_back;
        }
        Ok(rolled_back)
    }

    /// Undoes a fault: restarts killed nodes, resumes paused ones, restores cut links.
    pub async fn heal(&self, applied: &Applied) -> anyhow::Result<()> {
        match applied.kind {
            FaultKind::KillLeader
            | FaultKind::KillRandom
            | FaultKind::RestartAll
            | FaultKind::PowerCutRandom
            | FaultKind::PowerCutAll
            | FaultKind::CrashPostgresRandom => self.restart_stopped().await?,
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
            // A change of members is not undone; the next fault finds the new ones.
            FaultKind::ReplaceRandom => {}
        }
        Ok(())
    }

    /// A new node joins, then `leaving` is removed; the clients follow. Returns [leaving, new].
    async fn replace(&self, leaving: u64) -> anyhow::Result<Vec<u64>> {
        let added = chorus_cluster::members::add_nodes(self.dir, 1, MEMBERSHIP_STEP_TIMEOUT).await?;
        chorus_cluster::members::remove_node(self.dir, leaving, MEMBERSHIP_STEP_TIMEOUT).await?;
        let file = self.file()?;
        *self.nodes.write().expect("node list") = file.nodes.iter().map(|n| (n.id, n.resp_addr)).collect();
        Ok([vec![leaving], added].concat())
    }

    /// Starts every node that is not running and waits for a leader.
    pub async fn restart_stopped(&self) -> anyhow::Result<()> {
        let file = self.file()?;
        let nodes = file.nodes.len();
        if file.sql {
            chorus_cluster::start_sql(self.dir, nodes, Vec::new(), self.net).await?;
        } else {
            chorus_cluster::start(self.dir, nodes, Vec::new(), self.net).await?;
        }
        Ok(())
    }

    /// Kills every node (and cuts every disk's power, when the nodes are on power-cut disks) and
    /// starts them all again: what "no acknowledged write is lost" is checked against.
    pub async fn full_restart(&self) -> anyhow::Result<usize> {
        self.kill_and_wait(&self.ids());
        let rolled_back = if self.disks.is_some() {
            self.cut_power(&self.ids())?
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.restart_stopped().await?;
        Ok(rolled_back)
    }
}

/// Crashes the PostgreSQL server of the node in `node_dir`: SIGKILL of its WAL writer, which the
/// server takes as a crash of any of its processes — every connection ends, shared memory is
/// reset, and the server recovers from its WAL (unflushed commits are lost).
fn crash_postgres(node_dir: &Path) -> anyhow::Result<()> {
    let server = chorus_cluster::postgres::pid(node_dir)
        .with_context(|| format!("no PostgreSQL server runs for {}", node_dir.display()))?;
    let wal_writer = process::children(server)
        .into_iter()
        .find(|&pid| process::command_line(pid).contains("walwriter"))
        .with_context(|| format!("PostgreSQL server {server} has no WAL writer (still recovering?)"))?;
    process::signal(wal_writer, libc::SIGKILL);
    Ok(())
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
