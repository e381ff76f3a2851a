//! `chorus cluster add-node|remove-node`: changing a running local cluster's membership through
//! the leader's membership requests (GET/POST /members on its metrics port), the cluster serving
//! throughout.
//!
//! A node is added as a learner, started with no configuration (`--join true`), caught up from
//! a snapshot and the log, and only then promoted to voter — several at once through one joint
//! configuration. A node that is to be removed hands its leadership to another voter first if
//! it leads, is made a learner, and is stopped — letting its clients finish what they began,
//! which as a learner still learns its outcome from the log — before it is removed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::{
    cluster_file, http_request, load, loopback, node_dir, place_leader, ports, read_pid, spawn_node, status,
    stop_nodes, write_node_config, ClusterFile, NodeEntry, NodeState,
};

/// Adds `count` nodes to the cluster in `dir`, each step given `within`; returns their ids.
pub async fn add_nodes(dir: &Path, count: usize, within: Duration) -> anyhow::Result<Vec<u64>> {
    let mut file = load(dir)?;
    refuse_unsupported(dir, &file)?;
    if count == 0 {
        bail!("--count must be 1 or more");
    }
    crate::wait_ready(dir, &file, within).await?;
    // Ids are never reused: a removed node's directory may still hold its data.
    let first_id = (1..)
        .find(|id| file.nodes.iter().all(|n| n.id < *id) && !node_dir(dir, *id).exists())
        .expect("an unused id");
    let ids: Vec<u64> = (first_id..first_id + count as u64).collect();
    // A cluster on the PostgreSQL engine gives each new node a server of its own, as at start.
    let with_postgres = file.nodes.iter().any(|n| n.postgres_addr.is_some());
    let ports = ports::free_loopback_ports(count * 4)?;
    for (i, id) in ids.iter().enumerate() {
        let entry = NodeEntry {
            id: *id,
            resp_addr: loopback(ports[i * 4]),
            peer_addr: loopback(ports[i * 4 + 1]),
            metrics_addr: loopback(ports[i * 4 + 2]),
            client_addr: loopback(ports[i * 4]),
            postgres_addr: with_postgres.then(|| loopback(ports[i * 4 + 3])),
        };
        file.nodes.push(entry);
        // The members it reaches, and itself; once added it learns the membership from the log.
        write_node_config(dir, &file, *id, true)?;
        std::fs::write(cluster_file(dir), toml::to_string(&file)?)?;
        spawn_node(dir, &file, *id)?;
        let entry = file.node(*id).expect("just added").clone();
        let answer = ask_leader(
            dir,
            &file,
            &format!("/members/learner?id={id}&addr={}", entry.peer_addr),
            within,
        )
        .await
        .with_context(|| format!("adding node {id} as a learner"))?;
        println!("node {id}: added as a learner ({})", first_line(&answer));
    }
    for id in &ids {
        let caught_up_at = crate::wait_caught_up(dir, &file, *id, within).await?;
        println!("node {id}: caught up to index {caught_up_at}");
    }
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let answer = ask_leader(dir, &file, &format!("/members/promote?ids={list}"), within)
        .await
        .with_context(|| format!("promoting node(s) {list} to voters"))?;
    println!(
        "node(s) {list}: voters{} ({})",
        if ids.len() > 1 {
            ", through a joint configuration"
        } else {
            ""
        },
        first_line(&answer)
    );
    // Every node up applies the new configuration before this returns, so each one's own view
    // (GET /members, `cluster status`) already names the new voters.
    for state in status(dir, &file).await {
        if state.role != "down" {
            crate::wait_caught_up(dir, &file, state.entry.id, within).await?;
        }
    }
    Ok(ids)
}

/// Removes node `id` from the cluster in `dir` and stops it: a leader hands its leadership over
/// first; a voter is made a learner (it owns nothing any more: SQL classes and LDC's cache
/// follow the voters), then stopped, draining its clients, then removed.
pub async fn remove_node(dir: &Path, id: u64, within: Duration) -> anyhow::Result<()> {
    let mut file = load(dir)?;
    refuse_unsupported(dir, &file)?;
    if file.node(id).is_none() {
        bail!(
            "no node {id} in the cluster in {}; `chorus cluster status --dir {}` lists them",
            dir.display(),
            dir.display()
        );
    }
    if file.nodes.len() == 1 {
        bail!("node {id} is the cluster's only node; stop the cluster instead");
    }
    crate::wait_ready(dir, &file, within).await?;
    let states = status(dir, &file).await;
    if states.iter().any(|s| s.entry.id == id && s.is_leader()) {
        let to = states
            .iter()
            .find(|s| s.entry.id != id && s.role == "follower")
            .map(|s| s.entry.id)
            .context("no other node is up to take the leadership")?;
        place_leader(dir, &file, to, within).await?;
        println!("node {id}: handed the leadership to node {to}");
    }
    match ask_leader(dir, &file, &format!("/members/demote?ids={id}"), within).await {
        Ok(answer) => println!("node {id}: a learner now ({})", first_line(&answer)),
        Err(e) if e.to_string().contains(NOT_A_VOTER) => {}
        Err(e) => return Err(e.context(format!("making node {id} a learner before its removal"))),
    }
    // Every node up places SQL classes over the voters without it before it stops, so none
    // sends it a transaction it would have to refuse.
    for other in status(dir, &file).await {
        if other.entry.id != id && other.role != "down" {
            crate::wait_caught_up(dir, &file, other.entry.id, within).await?;
        }
    }
    if let Some(pid) = read_pid(dir, id) {
        stop_nodes(dir, &[(id, pid)]);
        println!("node {id}: stopped (it let its clients finish what they began)");
    }
    let answer = ask_leader(dir, &file, &format!("/members/remove?ids={id}"), within)
        .await
        .with_context(|| format!("removing node {id}"))?;
    println!("node {id}: removed ({})", first_line(&answer));
    if file.node(id).is_some_and(|n| n.postgres_addr.is_some()) {
        crate::postgres::stop(&node_dir(dir, id));
    }
    file.nodes.retain(|n| n.id != id);
    std::fs::write(cluster_file(dir), toml::to_string(&file)?)?;
    println!(
        "node {id}: its directory {} stays for its log",
        node_dir(dir, id).display()
    );
    Ok(())
}

fn refuse_unsupported(dir: &Path, file: &ClusterFile) -> anyhow::Result<()> {
    if file.net.is_some() {
        bail!(
            "the cluster in {} runs on an emulated network, whose proxies are made per pair of nodes at creation; \
             membership changes need a cluster started without --net",
            dir.display()
        );
    }
    Ok(())
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// Sends a membership request to the leader, retrying while there is none, the leadership
/// moves, or another change is under way; the leader's answer.
async fn ask_leader(dir: &Path, file: &ClusterFile, path: &str, within: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    let mut last = String::from("no leader answered");
    loop {
        let states = status(dir, file).await;
        if let Some(leader) = states.iter().find(|s: &&NodeState| s.is_leader()) {
            match http_request(leader.entry.metrics_addr, "POST", path).await {
                Ok((200, body)) => return Ok(body),
                // Refused for now (not the leader any more, a change under way) or unanswered.
                Ok((409 | 503, body)) => last = body.trim().to_string(),
                Ok((code, body)) => bail!("node {} answered {code}: {}", leader.entry.id, body.trim()),
                Err(e) => last = e.to_string(),
            }
            if is_final_refusal(&last) {
                bail!("{last}");
            }
        }
        if Instant::now() > deadline {
            bail!("not done within {within:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The leader's refusal to demote a node that is a learner already.
const NOT_A_VOTER: &str = "is not a voter";

/// Refusals that waiting does not change.
fn is_final_refusal(reason: &str) -> bool {
    [
        "already a member",
        "not a learner",
        "not a member",
        "no voter",
        NOT_A_VOTER,
    ]
    .iter()
    .any(|words| reason.contains(words))
}
