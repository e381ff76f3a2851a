//! Each node's data directory on its own power-cut disk (`chorus-powercut`), so that a fault can
//! take away what a node wrote but never synced. A SIGKILL cannot: the kernel keeps the dead
//! process's written pages, which is why only a power cut catches a missing fsync.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use chorus_powercut::{CutReport, Disk, Mount};

struct NodeDisk {
    id: u64,
    disk: Disk,
    data_dir: PathBuf,
    mount: Option<Mount>,
}

/// The nodes' disks; dropping this unmounts them (their contents are lost with the process).
pub struct PowerCutDisks {
    nodes: Vec<NodeDisk>,
}

impl PowerCutDisks {
    /// Mounts an empty disk at `node<id>/data` under `cluster_dir` for each id, before the
    /// cluster first starts, so that nothing a node ever writes bypasses the disk.
    pub fn mount(cluster_dir: &Path, ids: &[u64]) -> anyhow::Result<PowerCutDisks> {
        if !Path::new("/dev/fuse").exists() {
            bail!("power-cut faults need FUSE, and /dev/fuse does not exist; leave them out with --faults");
        }
        let mut nodes = Vec::new();
        for &id in ids {
            let data_dir = chorus_cluster::node_dir(cluster_dir, id).join("data");
            std::fs::create_dir_all(&data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
            let disk = Disk::new();
            let mount = disk.mount(&data_dir).with_context(|| {
                format!(
                    "power-cut faults need a FUSE mount (root, or fusermount3 from fuse3) at {}; leave them out with --faults",
                    data_dir.display()
                )
            })?;
            nodes.push(NodeDisk {
                id,
                disk,
                data_dir,
                mount: Some(mount),
            });
        }
        Ok(PowerCutDisks { nodes })
    }

    /// Stops completing syncs on node `id`'s disk (see `Disk::stall_syncs`).
    pub fn stall_syncs(&self, id: u64) -> anyhow::Result<()> {
        self.node(id)?.disk.stall_syncs();
        Ok(())
    }

    /// Answers node `id`'s stalled syncs with `EIO`, so that its killed process can die.
    pub fn fail_stalled_syncs(&self, id: u64) -> anyhow::Result<()> {
        self.node(id)?.disk.fail_stalled_syncs();
        Ok(())
    }

    fn node(&self, id: u64) -> anyhow::Result<&NodeDisk> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("node {id} has no power-cut disk"))
    }

    /// Cuts the power of node `id`'s disk, which must have no process using it (kill the node
    /// first): it is unmounted, loses every unsynced write, and is mounted again.
    pub fn cut(&mut self, id: u64) -> anyhow::Result<CutReport> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.id == id)
            .with_context(|| format!("node {id} has no power-cut disk"))?;
        drop(node.mount.take());
        let report = node.disk.cut_power();
        node.mount = Some(
            node.disk
                .mount(&node.data_dir)
                .with_context(|| format!("remounting {} after a power cut", node.data_dir.display()))?,
        );
        Ok(report)
    }

    /// Copies every node's data to `data-at-end` beside its mount, for a run whose data must
    /// outlive this process (a failed run).
    pub fn save(&self) -> anyhow::Result<()> {
        for node in &self.nodes {
            let to = node.data_dir.with_file_name("data-at-end");
            copy_tree(&node.data_dir, &to).with_context(|| format!("saving {}", node.data_dir.display()))?;
        }
        Ok(())
    }
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
