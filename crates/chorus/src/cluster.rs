//! `chorus cluster start|status|stop`: a local multi-process cluster under one directory.
//!
//! `DIR/cluster.toml` lists the nodes and their addresses; `DIR/nodeN/` holds each node's
//! config, data, log and pid file. `start` on an existing directory restarts whichever nodes
//! are not running, with their data, so it doubles as "restart the node I killed".

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chorus_client::{Client, Value};
use serde::{Deserialize, Serialize};

use crate::config::ServerOptions;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeEntry {
    pub id: u64,
    pub resp_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Extra `chorus server` flags given at creation, reused on every restart.
    #[serde(default)]
    pub server_args: Vec<String>,
    pub nodes: Vec<NodeEntry>,
}

#[derive(Debug, Clone)]
pub struct NodeState {
    pub entry: NodeEntry,
    pub pid: Option<u32>,
    pub role: String,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
}

impl NodeState {
    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }
}

fn node_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node{id}"))
}

fn cluster_file(dir: &Path) -> PathBuf {
    dir.join("cluster.toml")
}

pub fn load(dir: &Path) -> anyhow::Result<ClusterFile> {
    let path = cluster_file(dir);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no cluster in {} (missing {})", dir.display(), path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid {}", path.display()))
}

/// Picks `count` distinct free loopback ports below the kernel's ephemeral range (which starts at
/// 32768 by default), so outgoing connections cannot take a port between our pick and the
/// node's bind. Candidates are probed in a pseudo-random order so concurrent clusters rarely meet.
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    const LOW: u32 = 10_000;
    const HIGH: u32 = 32_000;
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ (u64::from(std::process::id()) << 32);
    let mut held = Vec::with_capacity(count);
    for _ in 0..20_000 {
        if held.len() == count {
            break;
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let port = (LOW + (state % u64::from(HIGH - LOW)) as u32) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    if held.len() < count {
        bail!("cannot find {count} free loopback ports between {LOW} and {HIGH}");
    }
    Ok(held.iter().map(|l| l.local_addr().expect("bound").port()).collect())
}

fn create(dir: &Path, nodes: usize, server_args: Vec<String>) -> anyhow::Result<ClusterFile> {
    if nodes == 0 {
        bail!("a cluster needs at least one node");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ports = free_ports(nodes * 3)?;
    let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let entries: Vec<NodeEntry> = (0..nodes)
        .map(|i| NodeEntry {
            id: i as u64 + 1,
            resp_addr: addr(ports[i * 3]),
            peer_addr: addr(ports[i * 3 + 1]),
            metrics_addr: addr(ports[i * 3 + 2]),
        })
        .collect();
    let peers = entries
        .iter()
        .map(|n| format!("{}={}", n.id, n.peer_addr))
        .collect::<Vec<_>>()
        .join(",");
    for n in &entries {
        let ndir = node_dir(dir, n.id);
        std::fs::create_dir_all(&ndir)?;
        let options = ServerOptions {
            id: Some(n.id),
            data_dir: Some(ndir.join("data")),
            resp_addr: Some(n.resp_addr),
            metrics_addr: Some(n.metrics_addr),
            peers: Some(peers.clone()),
            ..Default::default()
        };
        std::fs::write(ndir.join("chorus.toml"), options.to_toml())?;
    }
    let file = ClusterFile {
        server_args,
        nodes: entries,
    };
    std::fs::write(cluster_file(dir), toml::to_string(&file)?)?;
    Ok(file)
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

pub fn read_pid(dir: &Path, id: u64) -> Option<u32> {
    std::fs::read_to_string(node_dir(dir, id).join("pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|pid| alive(*pid))
}

fn spawn_node(dir: &Path, file: &ClusterFile, id: u64) -> anyhow::Result<u32> {
    let ndir = node_dir(dir, id);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ndir.join("server.log"))?;
    let exe = std::env::current_exe().context("cannot find the chorus executable")?;
    let child = Command::new(exe)
        .arg("server")
        .arg("--config")
        .arg(ndir.join("chorus.toml"))
        .args(&file.server_args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Own process group: a Ctrl-C aimed at `cluster start` or the demo must not reach nodes.
        .process_group(0)
        .spawn()
        .context("cannot start chorus server")?;
    let pid = child.id();
    std::fs::write(ndir.join("pid"), pid.to_string())?;
    Ok(pid)
}

/// Creates the cluster if `dir` has none, then starts every node that is not running and waits
/// until all answer and a leader is elected.
pub async fn start(dir: &Path, nodes: usize, server_args: Vec<String>) -> anyhow::Result<ClusterFile> {
    let file = if cluster_file(dir).exists() {
        let file = load(dir)?;
        if !server_args.is_empty() && server_args != file.server_args {
            bail!(
                "{} already has a cluster started with server args {:?}; stop it and use a new directory to change them",
                dir.display(),
                file.server_args
            );
        }
        file
    } else {
        create(dir, nodes, server_args)?
    };
    for node in &file.nodes {
        if read_pid(dir, node.id).is_none() {
            spawn_node(dir, &file, node.id)?;
        }
    }
    wait_ready(dir, &file, Duration::from_secs(30)).await?;
    Ok(file)
}

/// Waits until every node answers and one of them is the leader.
pub async fn wait_ready(dir: &Path, file: &ClusterFile, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let states = status(dir, file).await;
        let up = states.iter().filter(|s| s.role != "down").count();
        if up == file.nodes.len() && states.iter().any(NodeState::is_leader) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "cluster in {} not ready after {timeout:?}: {up}/{} nodes answer, leader: {}; see nodeN/server.log",
                dir.display(),
                file.nodes.len(),
                states.iter().any(NodeState::is_leader)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn info_field(info: &str, key: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(|v| v.trim().to_string()))
}

async fn query_node(entry: &NodeEntry) -> Option<String> {
    let work = async {
        let mut client = Client::connect(entry.resp_addr).await.ok()?;
        match client.command(&["INFO", "raft"]).await.ok()? {
            Value::Bulk(Some(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
            _ => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(1), work).await.ok().flatten()
}

pub async fn status(dir: &Path, file: &ClusterFile) -> Vec<NodeState> {
    let mut out = Vec::new();
    for entry in &file.nodes {
        let pid = read_pid(dir, entry.id);
        let info = if pid.is_some() { query_node(entry).await } else { None };
        let field = |k: &str| info.as_deref().and_then(|i| info_field(i, k));
        let number = |k: &str| field(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        out.push(NodeState {
            entry: entry.clone(),
            pid,
            role: match (&pid, &info) {
                (None, _) => "down".into(),
                (Some(_), None) => "starting".into(),
                (Some(_), Some(_)) => field("raft_role").unwrap_or_else(|| "unknown".into()),
            },
            term: number("raft_term"),
            commit_index: number("raft_commit_index"),
            applied_index: number("raft_applied_index"),
        });
    }
    out
}

pub fn print_status(states: &[NodeState]) {
    for s in states {
        let pid = s.pid.map_or("-".to_string(), |p| p.to_string());
        println!(
            "node {}  {:<9}  pid {:<7}  resp {}  metrics http://{}/metrics  term {}  commit {}  applied {}",
            s.entry.id, s.role, pid, s.entry.resp_addr, s.entry.metrics_addr, s.term, s.commit_index, s.applied_index
        );
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
    // Reap it if it is our child, so it does not linger as a zombie.
    // SAFETY: waitpid with WNOHANG on a pid that may not be our child only returns an error.
    unsafe {
        libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG);
    }
}

/// SIGKILLs one node (used by the demo and tests to simulate a crash).
pub fn kill_node(dir: &Path, id: u64) -> anyhow::Result<()> {
    let pid = read_pid(dir, id).with_context(|| format!("node {id} is not running"))?;
    signal(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        signal(pid, 0);
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Stops every node: SIGTERM, then SIGKILL after 5 s.
pub fn stop(dir: &Path) -> anyhow::Result<()> {
    let file = load(dir)?;
    let pids: Vec<(u64, u32)> = file
        .nodes
        .iter()
        .filter_map(|n| read_pid(dir, n.id).map(|p| (n.id, p)))
        .collect();
    for (_, pid) in &pids {
        signal(*pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (id, pid) in &pids {
        while alive(*pid) {
            if Instant::now() > deadline {
                signal(*pid, libc::SIGKILL);
            } else {
                signal(*pid, 0);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(node_dir(dir, *id).join("pid"));
    }
    println!("stopped {} node(s) in {}", pids.len(), dir.display());
    Ok(())
}
