//! Local multi-process clusters on 127.0.0.1, optionally on an emulated wide-area network:
//! `chorus cluster start|status|stop|kill`, and the same for the benchmark and the tests.
//!
//! `DIR/cluster.toml` lists the nodes, their addresses and the emulated links; `DIR/nodeN/` holds
//! each node's config, data, log and pid file. `start` on an existing directory restarts whichever
//! nodes are not running, with their data, so it doubles as "restart the node I killed".
//!
//! Under a network profile every node reaches each peer through its own proxy (one per direction,
//! since a Chorus node dials a connection for its outgoing messages), and clients reach node N
//! through a client proxy whose address `status` prints. Node 1 sits where the profile puts the
//! leader, so `start` hands leadership to node 1.

pub mod members;
pub mod metrics;
pub mod netem;
pub mod ports;
pub mod postgres;
pub mod process;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::netem::{Link, PathCheck, Profile, Toxiproxy};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeEntry {
    pub id: u64,
    /// The client port: RESP, or PostgreSQL in a SQL cluster (`pg` true).
    pub resp_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    /// Where clients should connect: the client proxy under a network profile, else `resp_addr`.
    pub client_addr: SocketAddr,
    /// The node's own PostgreSQL server, on a SQL cluster of the PostgreSQL engine.
    #[serde(default)]
    pub postgres_addr: Option<SocketAddr>,
}

/// The emulated network of a cluster, kept so a restart recreates the same proxies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetEntry {
    pub profile: String,
    pub bandwidth_mbit: Option<f64>,
    pub links: Vec<Link>,
    /// Round trips measured on the links when the cluster was created (path label → ms).
    #[serde(default)]
    pub measured_rtt_ms: BTreeMap<String, f64>,
    /// Whether the profile puts the leader in a particular place (node 1).
    #[serde(default)]
    pub place_leader: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterFile {
    /// The nodes run `chorus sql` (PostgreSQL clients) rather than `chorus server`.
    #[serde(default)]
    pub sql: bool,
    /// Extra `chorus server` flags given at creation, reused on every restart.
    #[serde(default)]
    pub server_args: Vec<String>,
    pub nodes: Vec<NodeEntry>,
    pub net: Option<NetEntry>,
}

impl ClusterFile {
    pub fn node(&self, id: u64) -> Option<&NodeEntry> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// Which network a new cluster runs on.
#[derive(Debug, Clone, Default)]
pub struct NetOptions {
    /// A profile name from `net-profiles.toml`; `None` or "lan" adds nothing.
    pub profile: Option<String>,
    pub bandwidth_mbit: Option<f64>,
}

impl NetOptions {
    /// The profile to emulate, or `None` when it adds nothing.
    pub fn resolve(&self) -> anyhow::Result<Option<Profile>> {
        let profile = Profile::load(self.profile.as_deref().unwrap_or("lan"), self.bandwidth_mbit)?;
        Ok((!profile.is_passthrough()).then_some(profile))
    }
}

#[derive(Debug, Clone)]
pub struct NodeState {
    pub entry: NodeEntry,
    pub pid: Option<u32>,
    pub role: String,
    pub term: u64,
    pub leader_id: u64,
    pub commit_index: u64,
    pub applied_index: u64,
}

impl NodeState {
    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }
}

pub fn node_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node{id}"))
}

fn cluster_file(dir: &Path) -> PathBuf {
    dir.join("cluster.toml")
}

pub fn load(dir: &Path) -> anyhow::Result<ClusterFile> {
    let path = cluster_file(dir);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no cluster in {} (missing {}); start one with `chorus cluster start --dir {}`",
            dir.display(),
            path.display(),
            dir.display()
        )
    })?;
    toml::from_str(&text).with_context(|| format!("invalid {}", path.display()))
}

/// The pid of node `id` if it is running.
pub fn read_pid(dir: &Path, id: u64) -> Option<u32> {
    process::read_pid(&node_dir(dir, id).join("pid"))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Proxies for every directed peer link and every client link, and the round trips they make.
fn chorus_links(profile: &Profile, nodes: &[NodeEntry], proxy_ports: &[u16]) -> (Vec<Link>, Vec<PathCheck>) {
    let bandwidth = profile.bandwidth_kbytes_per_sec();
    let mut ports = proxy_ports.iter().copied();
    let mut links = Vec::new();
    let mut paths = Vec::new();
    for from in nodes {
        for to in nodes.iter().filter(|n| n.id != from.id) {
            let rtt = profile.rtt_ms(from.id, to.id);
            links.push(Link {
                name: peer_link_name(from.id, to.id),
                listen: loopback(ports.next().expect("a port per link")),
                upstream: to.peer_addr,
                upstream_delay_ms: netem::split_rtt(rtt, from.id < to.id),
                downstream_delay_ms: 0,
                bandwidth_kbytes_per_sec: bandwidth,
            });
            if from.id < to.id {
                paths.push(PathCheck {
                    label: format!("node {} <-> node {}", from.id, to.id),
                    expected_rtt_ms: rtt,
                    links: vec![peer_link_name(from.id, to.id), peer_link_name(to.id, from.id)],
                });
            }
        }
    }
    for node in nodes {
        let rtt = profile.client_rtt(node.id);
        let name = format!("client-to-{}", node.id);
        links.push(Link {
            name: name.clone(),
            listen: loopback(ports.next().expect("a port per link")),
            upstream: node.resp_addr,
            upstream_delay_ms: netem::split_rtt(rtt, true),
            downstream_delay_ms: netem::split_rtt(rtt, false),
            // The cap models links between regions; the client link stays uncapped.
            bandwidth_kbytes_per_sec: None,
        });
        paths.push(PathCheck {
            label: format!("client <-> node {}", node.id),
            expected_rtt_ms: rtt,
            links: vec![name],
        });
    }
    (links, paths)
}

/// The part of a node's `chorus server` configuration file that the cluster decides.
#[derive(Serialize)]
struct NodeConfigFile {
    id: u64,
    data_dir: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    resp_addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pg_addr: Option<SocketAddr>,
    metrics_addr: SocketAddr,
    peers: String,
    /// Set on a node added to a running cluster (`members`).
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    join: bool,
}

/// The name of the link carrying node `from`'s messages to node `to`.
pub fn peer_link_name(from: u64, to: u64) -> String {
    format!("peer-{from}-to-{to}")
}

/// Creates a key-value cluster in `dir` without starting it (`start` starts it), for a caller
/// that puts something in the nodes' data directories first (`chorus restore`).
pub fn create_stopped(
    dir: &Path,
    nodes: usize,
    server_args: Vec<String>,
    net: &NetOptions,
) -> anyhow::Result<ClusterFile> {
    create(dir, nodes, server_args, net, false)
}

fn create(
    dir: &Path,
    nodes: usize,
    server_args: Vec<String>,
    net: &NetOptions,
    sql: bool,
) -> anyhow::Result<ClusterFile> {
    if nodes == 0 {
        bail!("a cluster needs at least one node: pass --nodes 1 or more");
    }
    let profile = net.resolve()?;
    if let Some(profile) = &profile {
        profile.check_nodes(nodes)?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let proxies = if profile.is_some() { nodes * nodes } else { 0 };
    let with_postgres = sql && postgres::engine_chosen(&server_args);
    let postgres_ports = if with_postgres { nodes } else { 0 };
    let ports = ports::free_loopback_ports(nodes * 3 + postgres_ports + proxies)?;
    let mut entries: Vec<NodeEntry> = (0..nodes)
        .map(|i| NodeEntry {
            id: i as u64 + 1,
            resp_addr: loopback(ports[i * 3]),
            peer_addr: loopback(ports[i * 3 + 1]),
            metrics_addr: loopback(ports[i * 3 + 2]),
            client_addr: loopback(ports[i * 3]),
            postgres_addr: with_postgres.then(|| loopback(ports[nodes * 3 + i])),
        })
        .collect();
    let net_entry = match &profile {
        Some(profile) => {
            let (links, paths) = chorus_links(profile, &entries, &ports[nodes * 3 + postgres_ports..]);
            println!("network: {}", profile.summary());
            let proxy = Toxiproxy::start(dir)?;
            for link in &links {
                proxy.create(link).inspect_err(|_| proxy.stop())?;
            }
            // The nodes are not running yet, so every link can be measured end to end.
            let verification = netem::verify(&links, &paths).inspect_err(|_| proxy.stop())?;
            verification.print();
            for node in &mut entries {
                node.client_addr = links
                    .iter()
                    .find(|l| l.name == format!("client-to-{}", node.id))
                    .expect("a client link per node")
                    .listen;
            }
            Some(NetEntry {
                profile: profile.name.clone(),
                bandwidth_mbit: profile.bandwidth_mbit,
                links,
                measured_rtt_ms: verification
                    .paths
                    .iter()
                    .map(|p| (p.label.clone(), p.measured_rtt_ms))
                    .collect(),
                place_leader: !profile.node_rtt_ms.is_empty(),
            })
        }
        None => None,
    };
    let file = ClusterFile {
        sql,
        server_args,
        nodes: entries,
        net: net_entry,
    };
    for n in &file.nodes {
        write_node_config(dir, &file, n.id, false)?;
    }
    std::fs::write(cluster_file(dir), toml::to_string(&file)?)?;
    Ok(file)
}

/// Writes node `id`'s `chorus.toml`: its addresses, and every node of `file` as its peers
/// (through the node's own proxies under a network profile).
fn write_node_config(dir: &Path, file: &ClusterFile, id: u64, join: bool) -> anyhow::Result<()> {
    let n = file.node(id).expect("a listed node");
    let peers = file
        .nodes
        .iter()
        .map(|p| {
            let addr = match &file.net {
                Some(net) if p.id != n.id => {
                    let name = peer_link_name(n.id, p.id);
                    net.links
                        .iter()
                        .find(|l| l.name == name)
                        .expect("a link per pair")
                        .listen
                }
                _ => p.peer_addr,
            };
            format!("{}={addr}", p.id)
        })
        .collect::<Vec<_>>()
        .join(",");
    let ndir = node_dir(dir, n.id);
    std::fs::create_dir_all(&ndir)?;
    let config = NodeConfigFile {
        id: n.id,
        data_dir: ndir.join("data"),
        resp_addr: (!file.sql).then_some(n.resp_addr),
        pg_addr: file.sql.then_some(n.resp_addr),
        metrics_addr: n.metrics_addr,
        peers,
        join,
    };
    std::fs::write(ndir.join("chorus.toml"), toml::to_string(&config)?)?;
    Ok(())
}

fn spawn_node(dir: &Path, file: &ClusterFile, id: u64) -> anyhow::Result<u32> {
    let ndir = node_dir(dir, id);
    let exe = std::env::current_exe().context("cannot find the chorus executable")?;
    let mut command = Command::new(exe);
    command
        .arg(if file.sql { "sql" } else { "server" })
        .arg("--config")
        .arg(ndir.join("chorus.toml"))
        .args(&file.server_args);
    if let Some(addr) = file.node(id).and_then(|n| n.postgres_addr) {
        postgres::ensure_running(dir, &ndir, addr)?;
        command.args(["--sql-postgres", &postgres::conninfo(addr)]);
    }
    process::spawn(command, &ndir.join("server.log"), &ndir.join("pid"))
}

/// The running proxy server of a cluster on an emulated network (to cut and heal links).
pub fn network(dir: &Path) -> anyhow::Result<Toxiproxy> {
    Toxiproxy::attach(dir).with_context(|| {
        format!(
            "the cluster in {} runs without proxies; start it with --net lan-proxied to cut links",
            dir.display()
        )
    })
}

/// Brings the emulated network of an existing cluster back if its proxy server is gone.
fn ensure_network(dir: &Path, file: &ClusterFile) -> anyhow::Result<()> {
    let Some(net) = &file.net else { return Ok(()) };
    if process::read_pid(&dir.join("toxiproxy.pid")).is_some() {
        return Ok(());
    }
    let proxy = Toxiproxy::start(dir)?;
    for link in &net.links {
        proxy.create(link)?;
    }
    Ok(())
}

/// Creates the cluster if `dir` has none, then starts every node that is not running and waits
/// until all answer and a leader is elected (node 1, under a profile that places the leader).
pub async fn start(
    dir: &Path,
    nodes: usize,
    server_args: Vec<String>,
    net: &NetOptions,
) -> anyhow::Result<ClusterFile> {
    start_nodes(dir, nodes, server_args, net, false).await
}

/// `start` for a cluster of `chorus sql` nodes, which PostgreSQL clients reach on each node's
/// client port.
pub async fn start_sql(
    dir: &Path,
    nodes: usize,
    server_args: Vec<String>,
    net: &NetOptions,
) -> anyhow::Result<ClusterFile> {
    start_nodes(dir, nodes, server_args, net, true).await
}

async fn start_nodes(
    dir: &Path,
    nodes: usize,
    server_args: Vec<String>,
    net: &NetOptions,
    sql: bool,
) -> anyhow::Result<ClusterFile> {
    let file = if cluster_file(dir).exists() {
        let file = load(dir)?;
        if !server_args.is_empty() && server_args != file.server_args {
            bail!(
                "{} already has a cluster started with server args {:?}; stop it and use a new directory to change them",
                dir.display(),
                file.server_args
            );
        }
        if net.profile.is_some() && net.profile.as_deref() != Some(file.net.as_ref().map_or("lan", |n| &n.profile)) {
            bail!(
                "{} already has a cluster on another network profile; stop it and use a new directory",
                dir.display()
            );
        }
        let node_ports: Vec<u16> = file
            .nodes
            .iter()
            .flat_map(|n| [n.resp_addr.port(), n.peer_addr.port(), n.metrics_addr.port()])
            .chain(file.nodes.iter().filter_map(|n| n.postgres_addr.map(|a| a.port())))
            .collect();
        ports::renew(&node_ports);
        ensure_network(dir, &file)?;
        file
    } else {
        create(dir, nodes, server_args, net, sql)?
    };
    // A restart brings back what the directory holds; only asking a key-value one for SQL is
    // a contradiction.
    if sql && !file.sql {
        bail!(
            "{} holds a key-value cluster; start it without --sql, or give --sql a new directory",
            dir.display()
        );
    }
    let mut spawned = Vec::new();
    for node in &file.nodes {
        if read_pid(dir, node.id).is_none() {
            spawned.push((node.id, spawn_node(dir, &file, node.id)?));
        }
    }
    let started: anyhow::Result<()> = async {
        tokio::select! {
            ready = wait_ready(dir, &file, Duration::from_secs(30)) => ready?,
            (id, log) = first_exit(dir, &spawned) => bail!(
                "node {id} exited while starting; the end of {}:\n{log}",
                node_dir(dir, id).join("server.log").display()
            ),
        }
        if file.net.as_ref().is_some_and(|n| n.place_leader) {
            place_leader(dir, &file, 1, Duration::from_secs(20)).await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = started {
        // A start that failed leaves nothing of its own running.
        if spawned.len() == file.nodes.len() {
            let _ = stop(dir);
        } else {
            stop_nodes(dir, &spawned);
        }
        return Err(e.context(format!("the {} node(s) this start spawned were stopped", spawned.len())));
    }
    Ok(file)
}

/// Resolves when one of the `spawned` (id, pid) processes has exited, with its log's last lines.
async fn first_exit(dir: &Path, spawned: &[(u64, u32)]) -> (u64, String) {
    loop {
        if let Some((id, _)) = spawned.iter().find(|(_, pid)| !process::alive(*pid)) {
            let log = std::fs::read_to_string(node_dir(dir, *id).join("server.log")).unwrap_or_default();
            return (*id, why_it_stopped(&log));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines of a node's log that say why it stopped: from its last panic or error on (a
/// backtrace after it would bury the message), or else its last lines.
fn why_it_stopped(log: &str) -> String {
    const LINES: usize = 8;
    let lines: Vec<&str> = log.lines().collect();
    let from = lines
        .iter()
        .rposition(|line| line.contains("panicked at") || line.starts_with("Error:"))
        .unwrap_or(lines.len().saturating_sub(LINES));
    lines[from..lines.len().min(from + LINES)].join("\n")
}

/// The last `count` warnings and errors in a node's log, or a word saying there were none:
/// what a failed wait shows of why.
fn last_warnings(log: &str, count: usize) -> String {
    let mut warned: Vec<&str> = log
        .lines()
        .rev()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .take(count)
        .collect();
    if warned.is_empty() {
        return "  (no warnings)".into();
    }
    warned.reverse();
    warned
        .iter()
        .map(|line| format!("  {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where the commands that act through a node's metrics port (failover, membership, backup)
/// find the credentials a node with users asks for: a user with every right.
pub const ADMIN_USER_ENV: &str = "CHORUS_USER";
pub const ADMIN_PASSWORD_ENV: &str = "CHORUS_PASSWORD";

/// A request with no body to a node's metrics port, as its head is sent: logged in as
/// `$CHORUS_USER` (default `default`) if `$CHORUS_PASSWORD` is set.
pub fn metrics_port_request(method: &str, path: &str) -> String {
    let login = match std::env::var(ADMIN_PASSWORD_ENV) {
        Ok(password) => {
            let user = std::env::var(ADMIN_USER_ENV).unwrap_or_else(|_| "default".into());
            format!(
                "Authorization: {}\r\n",
                chorus_auth::basic_authorization(&user, &password)
            )
        }
        Err(_) => String::new(),
    };
    format!("{method} {path} HTTP/1.1\r\nHost: chorus\r\n{login}Content-Length: 0\r\n\r\n")
}

/// A request with no body to a node's metrics port (SQL nodes have no RESP port, and a RESP
/// port may want a login): the status code and body of the answer.
async fn http_request(metrics_addr: SocketAddr, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(metrics_addr).await?;
        let request = metrics_port_request(method, path);
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.map(|_| answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), ask)
        .await
        .with_context(|| format!("{metrics_addr} did not answer {method} {path} within 10 s"))?
        .with_context(|| format!("{method} {path} to {metrics_addr}"))?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("{metrics_addr} answered {method} {path} with no HTTP status"))?;
    Ok((code, body.to_string()))
}

/// POST /failover on a node's metrics port; the answer does not matter, the caller watches the
/// roles.
async fn ask_failover_over_http(metrics_addr: SocketAddr) {
    let _ = http_request(metrics_addr, "POST", "/failover").await;
}

/// Hands leadership to node `to` (POST /failover on its metrics port) and waits until it leads.
pub async fn place_leader(dir: &Path, file: &ClusterFile, to: u64, within: Duration) -> anyhow::Result<()> {
    let entry = file.node(to).with_context(|| {
        format!(
            "no node {to} in the cluster in {}; `chorus cluster status --dir {}` lists them",
            dir.display(),
            dir.display()
        )
    })?;
    let deadline = Instant::now() + within;
    loop {
        let states = status(dir, file).await;
        if states.iter().any(|s| s.entry.id == to && s.is_leader()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "node {to} did not become the leader within {within:?}; see `chorus cluster status --dir {}` and {}",
                dir.display(),
                node_dir(dir, to).join("server.log").display()
            );
        }
        ask_failover_over_http(entry.metrics_addr).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until every node answers and one of them is the leader.
pub async fn wait_ready(dir: &Path, file: &ClusterFile, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let states = status(dir, file).await;
        // "starting" (running, not answering yet) is not up: a node that fails during start
        // would otherwise be counted as ready.
        let up = states
            .iter()
            .filter(|s| s.role != "down" && s.role != "starting")
            .count();
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

/// A node's raft state, from its metrics (which need no login, where its RESP port may), in
/// the words of `INFO raft`.
async fn query_node(entry: &NodeEntry) -> Option<String> {
    let text = tokio::time::timeout(Duration::from_secs(1), metrics::scrape(entry.metrics_addr))
        .await
        .ok()?
        .ok()?;
    let gauge = |name: &str| metrics::metric_sum(&text, name) as u64;
    let role = match gauge("chorus_raft_role") {
        3 => "leader",
        2 => "candidate",
        1 => "precandidate",
        _ => "follower",
    };
    Some(format!(
        "raft_role:{role}\nraft_term:{}\nraft_leader_id:{}\nraft_commit_index:{}\nraft_applied_index:{}\n",
        gauge("chorus_raft_term"),
        gauge("chorus_raft_leader_id"),
        gauge("chorus_raft_commit_index"),
        gauge("chorus_raft_applied_index")
    ))
}

pub async fn status(dir: &Path, file: &ClusterFile) -> Vec<NodeState> {
    let mut out = Vec::new();
    for entry in &file.nodes {
        let pid = read_pid(dir, entry.id);
        let info = match pid {
            None => None,
            Some(_) => query_node(entry).await,
        };
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
            leader_id: number("raft_leader_id"),
            commit_index: number("raft_commit_index"),
            applied_index: number("raft_applied_index"),
        });
    }
    out
}

pub fn print_status(file: &ClusterFile, states: &[NodeState]) {
    if let Some(net) = &file.net {
        println!(
            "network profile {}{}: clients connect to the client addresses",
            net.profile,
            net.bandwidth_mbit.map(|b| format!(", {b} Mbit/s")).unwrap_or_default()
        );
    }
    for s in states {
        let pid = s.pid.map_or("-".to_string(), |p| p.to_string());
        let client = if s.entry.client_addr != s.entry.resp_addr {
            format!("  client {}", s.entry.client_addr)
        } else {
            String::new()
        };
        println!(
            "node {}  {:<9}  pid {:<7}  {} {}{client}  metrics http://{}/metrics  term {}  commit {}  applied {}",
            s.entry.id,
            s.role,
            pid,
            if file.sql { "pg" } else { "resp" },
            s.entry.resp_addr,
            s.entry.metrics_addr,
            s.term,
            s.commit_index,
            s.applied_index
        );
    }
}

/// SIGKILLs one node (used by the demo and tests to simulate a crash).
pub fn kill_node(dir: &Path, id: u64) -> anyhow::Result<()> {
    let pid = read_pid(dir, id).with_context(|| {
        format!(
            "node {id} is not running; `chorus cluster start --dir {}` starts the nodes that are down",
            dir.display()
        )
    })?;
    process::kill(pid);
    Ok(())
}

/// How long a node is given to exit after SIGTERM before it is killed: it lets its clients
/// finish what they began for up to `--shutdown-drain-ms` (5 s by default) first.
const NODE_STOP_GRACE: Duration = Duration::from_secs(10);

/// Stops the (id, pid) nodes: SIGTERM to all, then each is waited for (killed after
/// `NODE_STOP_GRACE`).
fn stop_nodes(dir: &Path, pids: &[(u64, u32)]) {
    for (_, pid) in pids {
        process::signal(*pid, libc::SIGTERM);
    }
    for (id, pid) in pids {
        process::wait_gone_or_kill(*pid, NODE_STOP_GRACE);
        let _ = std::fs::remove_file(node_dir(dir, *id).join("pid"));
    }
}

/// Stops every node (SIGTERM: each lets its clients finish, then exits; SIGKILL after
/// `NODE_STOP_GRACE`) and the network emulation; data is kept.
pub fn stop(dir: &Path) -> anyhow::Result<()> {
    let file = load(dir)?;
    let pids: Vec<(u64, u32)> = file
        .nodes
        .iter()
        .filter_map(|n| read_pid(dir, n.id).map(|p| (n.id, p)))
        .collect();
    stop_nodes(dir, &pids);
    for node in file.nodes.iter().filter(|n| n.postgres_addr.is_some()) {
        postgres::stop(&node_dir(dir, node.id));
    }
    if let Some(pid) = process::read_pid(&dir.join("toxiproxy.pid")) {
        process::terminate(pid, Duration::from_secs(3));
        let _ = std::fs::remove_file(dir.join("toxiproxy.pid"));
    }
    println!("stopped {} node(s) in {}", pids.len(), dir.display());
    Ok(())
}

/// Restarts every node in turn while the cluster keeps serving: a leader hands leadership to
/// another node first; each node is stopped (SIGTERM), started again on the same data, and
/// caught up — its applied index at the leader's commit index of when it came back — before the
/// next is touched. Each step has `within` to finish.
pub async fn restart_rolling(dir: &Path, within: Duration) -> anyhow::Result<()> {
    let file = load(dir)?;
    wait_ready(dir, &file, within).await?;
    for entry in &file.nodes {
        let id = entry.id;
        let began = Instant::now();
        let states = status(dir, &file).await;
        if states.iter().any(|s| s.entry.id == id && s.is_leader()) && file.nodes.len() > 1 {
            let to = states
                .iter()
                .find(|s| s.entry.id != id && s.role != "down" && s.role != "starting")
                .map(|s| s.entry.id)
                .context("no other node is up to take the leadership")?;
            place_leader(dir, &file, to, within).await?;
            println!("node {id}: handed the leadership to node {to}");
        }
        if let Some(pid) = read_pid(dir, id) {
            stop_nodes(dir, &[(id, pid)]);
        }
        spawn_node(dir, &file, id)?;
        let caught_up_at = wait_caught_up(dir, &file, id, within).await?;
        println!(
            "node {id}: restarted and caught up to index {caught_up_at} in {:.1} s",
            began.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Waits until node `id` answers and has applied what the leader had committed when it did.
async fn wait_caught_up(dir: &Path, file: &ClusterFile, id: u64, within: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + within;
    let mut target = None;
    loop {
        let states = status(dir, file).await;
        let node = states.iter().find(|s| s.entry.id == id).expect("a listed node");
        if node.role == "down" {
            let log = std::fs::read_to_string(node_dir(dir, id).join("server.log")).unwrap_or_default();
            bail!("node {id} stopped after its restart: {}", why_it_stopped(&log));
        }
        let leader = states.iter().find(|s| s.is_leader());
        if let (Some(leader), true) = (leader, node.role != "starting") {
            let target = *target.get_or_insert(leader.commit_index);
            if node.applied_index >= target {
                return Ok(target);
            }
        }
        if Instant::now() > deadline {
            let warnings_of = |who: u64| {
                let log = std::fs::read_to_string(node_dir(dir, who).join("server.log")).unwrap_or_default();
                last_warnings(&log, 5)
            };
            let leader_warnings = match leader {
                Some(leader) if leader.entry.id != id => {
                    format!(
                        "\nnode {} (leading) last warned:\n{}",
                        leader.entry.id,
                        warnings_of(leader.entry.id)
                    )
                }
                _ => String::new(),
            };
            bail!(
                "node {id} did not catch up within {within:?} (applied {}, leader's commit {:?}); see {}\nnode {id} last warned:\n{}{leader_warnings}",
                node.applied_index,
                target,
                node_dir(dir, id).join("server.log").display(),
                warnings_of(id),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{last_warnings, why_it_stopped};

    #[test]
    fn a_failed_wait_shows_the_last_warnings_in_order() {
        let log = "T INFO a\nT  WARN chorus: one\nT INFO b\nT ERROR chorus: two\nT  WARN chorus: three\n";
        assert_eq!(last_warnings(log, 2), "  T ERROR chorus: two\n  T  WARN chorus: three");
        assert_eq!(last_warnings("T INFO a\n", 2), "  (no warnings)");
    }

    #[test]
    fn a_stopped_nodes_panic_message_is_shown_not_its_backtrace() {
        let mut log = String::from("INFO started\nthread 'main' panicked at src/store.rs:1:1:\nsegment 7 missing\n");
        for frame in 0..40 {
            log.push_str(&format!("  {frame}: some::frame\n"));
        }
        let shown = why_it_stopped(&log);
        assert!(shown.starts_with("thread 'main' panicked at"), "{shown}");
        assert!(shown.contains("segment 7 missing"), "{shown}");
        assert_eq!(why_it_stopped("a\nb\nc"), "a\nb\nc", "without a panic, the last lines");
    }
}
