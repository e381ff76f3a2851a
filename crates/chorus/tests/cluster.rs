//! Integration tests: real `chorus` node processes on 127.0.0.1, real clients.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_client::{Client, CurpReply, CurpSession, RiflSession, Value};
use serde::Deserialize;

mod common;

use common::{run_chorus, CHORUS};

#[derive(Deserialize, Clone)]
struct NodeEntry {
    id: u64,
    resp_addr: SocketAddr,
    peer_addr: SocketAddr,
    metrics_addr: SocketAddr,
}

#[derive(Deserialize)]
struct ClusterFile {
    nodes: Vec<NodeEntry>,
}

struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<NodeEntry>,
}

impl Cluster {
    fn start(nodes: usize, server_args: &[&str]) -> Cluster {
        Cluster::start_with(nodes, &[], server_args)
    }

    /// `chorus cluster start` with `cluster_flags` (`--tls`) and `server_args` for every node.
    fn start_with(nodes: usize, cluster_flags: &[&str], server_args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().to_str().expect("utf-8 path").to_string();
        let n = nodes.to_string();
        let mut args = vec!["cluster", "start", "--nodes", &n, "--dir", &path];
        args.extend_from_slice(cluster_flags);
        if !server_args.is_empty() {
            args.push("--");
            args.extend_from_slice(server_args);
        }
        let status = run_chorus(&args);
        assert_eq!(
            status.lines().filter(|l| l.starts_with("node ")).count(),
            nodes,
            "{status}"
        );
        let file: ClusterFile =
            toml::from_str(&std::fs::read_to_string(dir.path().join("cluster.toml")).unwrap()).unwrap();
        Cluster { dir, nodes: file.nodes }
    }

    fn dir(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }

    fn node(&self, id: u64) -> &NodeEntry {
        self.nodes.iter().find(|n| n.id == id).expect("node id")
    }

    fn kill(&self, id: u64) {
        run_chorus(&["cluster", "kill", "--dir", self.dir(), "--node", &id.to_string()]);
    }

    /// Restarts every stopped node and waits for all to answer with a leader elected.
    fn restart_stopped(&self) {
        run_chorus(&["cluster", "start", "--dir", self.dir()]);
    }

    async fn client(&self, id: u64) -> Client {
        Client::connect(self.node(id).resp_addr).await.expect("connect")
    }

    async fn info(&self, id: u64, field: &str) -> Option<String> {
        let mut c = tokio::time::timeout(Duration::from_secs(1), Client::connect(self.node(id).resp_addr))
            .await
            .ok()?
            .ok()?;
        c.set_timeout(Duration::from_secs(1));
        let Ok(Value::Bulk(Some(info))) = c.command(&["INFO", "raft"]).await else {
            return None;
        };
        String::from_utf8_lossy(&info)
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(str::to_string))
    }

    async fn info_u64(&self, id: u64, field: &str) -> u64 {
        self.info(id, field).await.and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// The leader as seen by the given nodes, if they agree on one that is up.
    async fn leader_among(&self, ids: &[u64]) -> Option<u64> {
        for id in ids {
            if self.info(*id, "raft_role").await.as_deref() == Some("leader") {
                return Some(*id);
            }
        }
        None
    }

    async fn wait_for_leader(&self, ids: &[u64], within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.leader_among(ids).await {
                return l;
            }
            assert!(Instant::now() < deadline, "no leader among {ids:?} within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The leader of all three nodes, and the other two.
    async fn leader_and_followers(&self) -> (u64, Vec<u64>) {
        let leader = self.wait_for_leader(&[1, 2, 3], Duration::from_secs(5)).await;
        (leader, (1..=3).filter(|id| *id != leader).collect())
    }

    fn metrics(&self, id: u64) -> String {
        http_get(self.node(id).metrics_addr, "/metrics")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(CHORUS)
            .args(["cluster", "stop", "--dir", self.dir()])
            .output();
        if std::thread::panicking() {
            let logs = self.nodes.iter().map(|n| {
                let log = self.dir.path().join(format!("node{}/server.log", n.id));
                (format!("node {}", n.id), log)
            });
            common::print_log_tails(logs, 30);
        }
    }
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    http_request(addr, "GET", path)
}

/// A request with no body; the whole answer, head and body.
fn http_request(addr: SocketAddr, method: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("metrics connect");
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

fn metric_value(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

fn bulk(s: &str) -> Value {
    Value::Bulk(Some(s.as_bytes().to_vec().into()))
}

fn ok() -> Value {
    Value::Simple("OK".into())
}

/// CLIENT LIST shows a node's connections as they are (a subscriber flagged `P`, a blocked
/// client's command, a name set), and CLIENT KILL closes the ones it picks: a blocked client is
/// answered as if its timeout ran out, then closed; an idle one is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_shows_a_nodes_connections_and_client_kill_closes_them() {
    let cluster = Cluster::start(3, &[]);
    let mut admin = cluster.client(2).await;
    let mut subscriber = cluster.client(2).await;
    subscriber.command(&["SUBSCRIBE", "news"]).await.unwrap();
    let mut blocked = cluster.client(2).await;
    let blpop = tokio::spawn(async move { blocked.command(&["BLPOP", "nothing-comes", "0"]).await });
    assert_eq!(admin.command(&["CLIENT", "SETNAME", "admin"]).await.unwrap(), ok());
    let list = |value: Value| match value {
        Value::Bulk(Some(text)) => String::from_utf8(text.to_vec()).unwrap(),
        other => panic!("CLIENT LIST answered {other:?}"),
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let text = list(admin.command(&["CLIENT", "LIST"]).await.unwrap());
        if text.contains("cmd=blpop") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.lines().count(), 3, "{lines}");
    let line_with = |needle: &str| {
        lines
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle}: {lines}"))
    };
    assert!(line_with("name=admin").contains("flags=N") && line_with("name=admin").contains("cmd=client"));
    assert!(line_with("sub=1").contains("flags=P"), "{lines}");
    let field = |line: &str, key: &str| {
        let start = line.find(&format!(" {key}=")).map_or(0, |at| at + 1) + key.len() + 1;
        line[start..].split(' ').next().unwrap().to_string()
    };
    let blocked_id = field(line_with("cmd=blpop"), "id");
    let pubsub = list(admin.command(&["CLIENT", "LIST", "TYPE", "pubsub"]).await.unwrap());
    assert_eq!(pubsub.lines().count(), 1, "{pubsub}");
    assert_eq!(
        admin.command(&["CLIENT", "KILL"]).await.unwrap(),
        Value::Error("ERR wrong number of arguments for 'client|kill' command".into())
    );
    assert_eq!(
        admin.command(&["CLIENT", "KILL", "ID", "0"]).await.unwrap(),
        Value::Error("ERR client-id should be greater than 0".into())
    );
    assert_eq!(
        admin.command(&["CLIENT", "KILL", "ID", &blocked_id]).await.unwrap(),
        Value::Integer(1)
    );
    let unblocked = tokio::time::timeout(Duration::from_secs(3), blpop)
        .await
        .expect("the killed client is answered")
        .unwrap();
    assert_eq!(unblocked.unwrap(), Value::Array(None));
    let subscriber_addr = field(line_with("sub=1"), "addr");
    assert_eq!(
        admin.command(&["CLIENT", "KILL", &subscriber_addr]).await.unwrap(),
        ok()
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(3), subscriber.command(&["PING"]))
            .await
            .expect("a killed connection is closed, not left hanging")
            .is_err()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = list(admin.command(&["CLIENT", "LIST"]).await.unwrap());
        if left.lines().count() == 1 {
            assert!(left.contains("name=admin"), "{left}");
            break;
        }
        assert!(Instant::now() < deadline, "killed connections are still listed: {left}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        admin.command(&["CLIENT", "KILL", "127.0.0.1:1"]).await.unwrap(),
        Value::Error("ERR No such client".into())
    );
}

/// A node sent SIGTERM answers the writes its clients wait for before it exits: a write the
/// leader cannot commit yet (both followers stopped) is acknowledged once they come back, and
/// only then is the connection closed and the process gone; meanwhile no new client is taken,
/// and a client blocked in BLPOP with no timeout is answered at once as if its timeout ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_shutting_down_answers_the_writes_under_way_before_it_exits() {
    use chorus_cluster::process;
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let pid = |id: u64| chorus_cluster::read_pid(cluster.dir.path(), id).expect("the node runs");
    let mut writer = cluster.client(leader).await;
    let mut blocked = cluster.client(leader).await;
    let blpop = tokio::spawn(async move { blocked.command(&["BLPOP", "nothing-comes", "0"]).await });
    for id in &followers {
        process::signal(pid(*id), libc::SIGSTOP);
    }
    let write = tokio::spawn(async move {
        let reply = writer.command(&["SET", "drained", "yes"]).await;
        (writer, reply)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader_pid = pid(leader);
    process::signal(leader_pid, libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        TcpStream::connect(cluster.node(leader).resp_addr).is_err(),
        "a node shutting down takes no new client"
    );
    assert!(process::alive(leader_pid), "the node waits for the write under way");
    let unblocked = tokio::time::timeout(Duration::from_secs(3), blpop)
        .await
        .expect("the blocked client is answered while the node drains")
        .unwrap();
    assert_eq!(unblocked.expect("a reply, not a closed connection"), Value::Array(None));
    for id in &followers {
        process::signal(pid(*id), libc::SIGCONT);
    }
    let (mut writer, reply) = write.await.unwrap();
    assert_eq!(reply.expect("the write under way is answered"), ok());
    assert!(
        writer.command(&["GET", "drained"]).await.is_err(),
        "then the connection is closed"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while process::alive(leader_pid) {
        assert!(
            Instant::now() < deadline,
            "the node did not exit once its clients were answered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let new_leader = cluster.wait_for_leader(&followers, Duration::from_secs(10)).await;
    let mut reader = cluster.client(new_leader).await;
    assert_eq!(reader.command(&["GET", "drained"]).await.unwrap(), bulk("yes"));
}

/// `chorus cluster stop` lets every node's clients finish: a client blocked in BLPOP on each
/// node is answered as if its timeout ran out, not dropped, and no node is sent a second
/// SIGTERM (which ends a node at once, dropping the writes its clients wait for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_stop_lets_every_node_answer_its_clients() {
    let cluster = Cluster::start(3, &[]);
    let mut blocked = Vec::new();
    for id in 1..=3 {
        let mut client = cluster.client(id).await;
        blocked.push(tokio::spawn(async move {
            client.command(&["BLPOP", "nothing-comes", "0"]).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dir = cluster.dir().to_string();
    tokio::task::spawn_blocking(move || run_chorus(&["cluster", "stop", "--dir", &dir]))
        .await
        .unwrap();
    for (id, reply) in (1..=3).zip(blocked) {
        let reply = reply.await.unwrap();
        assert_eq!(
            reply.unwrap_or_else(|e| panic!("node {id} dropped its blocked client: {e}")),
            Value::Array(None)
        );
        let log = std::fs::read_to_string(cluster.dir.path().join(format!("node{id}/server.log"))).unwrap();
        assert!(!log.contains("second SIGTERM"), "node {id} was told twice to stop");
    }
}

/// A leader sent SIGTERM hands its leadership to a follower before it exits: with an election
/// timeout of 5 s (`--election-ticks 50`) the followers would wait that long for a leader that
/// crashed, but one of them leads, and takes a write, well within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_shutting_down_hands_its_leadership_over_first() {
    let cluster = Cluster::start(3, &["--election-ticks", "50"]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let pid = chorus_cluster::read_pid(cluster.dir.path(), leader).expect("the leader runs");
    chorus_cluster::process::signal(pid, libc::SIGTERM);
    let new_leader = cluster.wait_for_leader(&followers, Duration::from_secs(3)).await;
    let mut client = cluster.client(new_leader).await;
    assert_eq!(client.command(&["SET", "after", "the-hand-over"]).await.unwrap(), ok());
}

async fn info_section(client: &mut Client, section: &str) -> String {
    let Value::Bulk(Some(text)) = client.command(&["INFO", section]).await.unwrap() else {
        panic!("INFO {section} is not a bulk string")
    };
    String::from_utf8(text.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_any_node_are_linearizably_readable_on_every_node() {
    let cluster = Cluster::start(3, &[]);
    let mut clients = Vec::new();
    for id in 1..=3 {
        clients.push(cluster.client(id).await);
    }
    for i in 0..60usize {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        assert_eq!(clients[i % 3].command(&["SET", &key, &value]).await.unwrap(), ok());
        // Read right away on a different node: linearizable reads must see the acknowledged write.
        assert_eq!(
            clients[(i + 1) % 3].command(&["GET", &key]).await.unwrap(),
            bulk(&value)
        );
    }
    for i in 1..=30i64 {
        assert_eq!(
            clients[i as usize % 3].command(&["INCR", "counter"]).await.unwrap(),
            Value::Integer(i)
        );
    }
    for c in &mut clients {
        assert_eq!(c.command(&["GET", "counter"]).await.unwrap(), bulk("30"));
    }
    assert_eq!(
        clients[0].command(&["HSET", "h", "f1", "a", "f2", "b"]).await.unwrap(),
        Value::Integer(2)
    );
    assert_eq!(
        clients[2].command(&["HMGET", "h", "f2", "f1", "nope"]).await.unwrap(),
        Value::Array(Some(vec![bulk("b"), bulk("a"), Value::Bulk(None)]))
    );
    // MEMORY USAGE counts records, not a node's cache, so every node answers alike; TOUCH
    // counts the keys that exist; TIME is the node's clock.
    let mut usages = Vec::new();
    for c in &mut clients {
        usages.push(c.command(&["MEMORY", "USAGE", "h", "SAMPLES", "0"]).await.unwrap());
    }
    assert!(matches!(usages[0], Value::Integer(n) if n >= 8), "{usages:?}");
    assert!(usages.iter().all(|u| *u == usages[0]), "{usages:?}");
    assert_eq!(
        clients[1].command(&["MEMORY", "USAGE", "nope"]).await.unwrap(),
        Value::Bulk(None)
    );
    assert_eq!(
        clients[2].command(&["TOUCH", "h", "nope", "counter"]).await.unwrap(),
        Value::Integer(2)
    );
    let Value::Array(Some(time)) = clients[0].command(&["TIME"]).await.unwrap() else {
        panic!("TIME is not an array")
    };
    let number = |v: &Value| match v {
        Value::Bulk(Some(b)) => std::str::from_utf8(b).unwrap().parse::<u64>().unwrap(),
        other => panic!("{other:?} is not a number"),
    };
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(number(&time[0]).abs_diff(now_secs) < 60 && number(&time[1]) < 1_000_000);
    // Pipelined write-then-read on one connection reads its own write.
    let replies = clients[1]
        .pipeline(&[
            vec!["SET", "p", "1"],
            vec!["GET", "p"],
            vec!["INCR", "p"],
            vec!["GET", "p"],
        ])
        .await
        .unwrap();
    assert_eq!(replies, vec![ok(), bulk("1"), Value::Integer(2), bulk("2")]);
    // Unknown and malformed commands are errors that change nothing.
    let before = clients[0].command(&["DBSIZE"]).await.unwrap();
    assert!(
        matches!(clients[0].command(&["NOSUCHCOMMAND"]).await.unwrap(), Value::Error(e) if e.starts_with("ERR unknown command"))
    );
    assert!(
        matches!(clients[0].command(&["SET", "onlykey"]).await.unwrap(), Value::Error(e) if e.contains("wrong number of arguments"))
    );
    assert!(
        matches!(clients[0].command(&["HGET", "k1", "f"]).await.unwrap(), Value::Error(e) if e.starts_with("WRONGTYPE"))
    );
    assert_eq!(clients[0].command(&["DBSIZE"]).await.unwrap(), before);
    // INFO commandstats counts what this connection's node was sent, by command.
    let Value::Bulk(Some(stats)) = clients[0].command(&["INFO", "commandstats"]).await.unwrap() else {
        panic!("INFO commandstats is not a bulk string")
    };
    let stats = String::from_utf8(stats.to_vec()).unwrap();
    assert!(stats.starts_with("# Commandstats\r\n"), "{stats}");
    assert!(stats.contains("cmdstat_dbsize:calls=2,usec="), "{stats}");
    // A refusal before running and a failure while running are told apart, as Redis does, and
    // each error reply is counted by its code.
    let stat = |name: &str| {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(stat("set").ends_with(",rejected_calls=1,failed_calls=0"), "{stats}");
    assert!(stat("hget").ends_with(",rejected_calls=0,failed_calls=1"), "{stats}");
    assert!(!stats.contains("nosuchcommand"), "{stats}");
    let errors = info_section(&mut clients[0], "errorstats").await;
    assert!(errors.contains("errorstat_WRONGTYPE:count=1\r\n"), "{errors}");
    assert!(errors.contains("errorstat_ERR:count=2\r\n"), "{errors}");
    let latencies = info_section(&mut clients[0], "latencystats").await;
    assert!(latencies.contains("latency_percentiles_usec_get:p50="), "{latencies}");
    // LATENCY HISTOGRAM: the GETs' calls, and calls under each power of two µs growing to them.
    let Value::Array(Some(histogram)) = clients[0]
        .command(&["LATENCY", "HISTOGRAM", "get", "nosuch"])
        .await
        .unwrap()
    else {
        panic!("LATENCY HISTOGRAM is not an array")
    };
    let [name, Value::Array(Some(fields))] = &histogram[..] else {
        panic!("one command's histogram: {histogram:?}")
    };
    assert_eq!(name, &bulk("get"));
    let [calls_name, Value::Integer(calls), buckets_name, Value::Array(Some(buckets))] = &fields[..] else {
        panic!("{fields:?}")
    };
    assert_eq!((calls_name, buckets_name), (&bulk("calls"), &bulk("histogram_usec")));
    let cumulative: Vec<i64> = buckets
        .chunks(2)
        .map(|pair| match pair {
            [Value::Integer(_), Value::Integer(count)] => *count,
            _ => panic!("{buckets:?}"),
        })
        .collect();
    assert!(cumulative.windows(2).all(|w| w[0] < w[1]), "{cumulative:?}");
    assert_eq!(cumulative.last(), Some(calls));
    assert_eq!(
        clients[0].command(&["MODULE", "LIST"]).await.unwrap(),
        Value::Array(Some(vec![]))
    );
    assert_eq!(clients[0].command(&["CONFIG", "RESETSTAT"]).await.unwrap(), ok());
    let stats = info_section(&mut clients[0], "commandstats").await;
    let lines: Vec<&str> = stats.lines().collect();
    assert!(
        lines.len() == 2 && lines[1].starts_with("cmdstat_config:calls=1,"),
        "only the RESETSTAT itself is counted since: {stats}"
    );
    // The fields monitoring tools (and `redis-cli --stat`) read are there, and mean something.
    let Value::Bulk(Some(info)) = clients[0].command(&["INFO"]).await.unwrap() else {
        panic!("INFO is not a bulk string")
    };
    let info = String::from_utf8(info.to_vec()).unwrap();
    let field = |name: &str| -> f64 {
        let line = info.lines().find(|l| l.starts_with(&format!("{name}:")));
        line.unwrap_or_else(|| panic!("no {name} in {info}"))[name.len() + 1..]
            .parse()
            .unwrap()
    };
    assert!(field("connected_clients") >= 1.0 && field("blocked_clients") == 0.0);
    assert!(field("used_memory") > 1e6 && field("used_memory_peak") > 1e6, "{info}");
    assert!(field("total_commands_processed") >= 10.0 && field("total_connections_received") >= 1.0);
    assert!(field("used_cpu_user") + field("used_cpu_sys") > 0.0);
    assert_eq!(
        clients[0]
            .command(&["SET", "short-lived", "v", "EX", "100"])
            .await
            .unwrap(),
        ok()
    );
    // INFO reads this node's state as it is (stale): the write shows once applied here.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let Value::Bulk(Some(keyspace)) = clients[0].command(&["INFO", "keyspace"]).await.unwrap() else {
            panic!("INFO keyspace is not a bulk string")
        };
        let keyspace = String::from_utf8(keyspace.to_vec()).unwrap();
        if keyspace.contains(",expires=1,") {
            break;
        }
        assert!(Instant::now() < deadline, "{keyspace}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let metrics = cluster.metrics(1);
    for name in [
        "chorus_raft_term",
        "chorus_raft_commit_index",
        "chorus_raft_applied_index",
        "chorus_raft_commands_proposed_total",
        "chorus_raft_fsync_seconds_count",
    ] {
        metric_value(&metrics, name);
    }
    assert!(
        metrics.contains("chorus_peer_bytes_sent_total{peer=\"2\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("chorus_peer_entries_received_total{peer="),
        "{metrics}"
    );
    assert!(metrics.contains("chorus_commands_total{command=\"set\"}"), "{metrics}");
    assert!(
        metrics.contains("chorus_command_duration_seconds_bucket{kind=\"write\",le="),
        "{metrics}"
    );
}

/// With `--read-lease true` the leader serves linearizable reads from its own state: a write
/// acknowledged by a follower is read back on the leader at once, and the reads cost no
/// ReadIndex rounds beyond the lease's renewals. After a leadership transfer the new leader
/// takes a lease of its own and the old one (now a follower) still reads the latest write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_lease_serves_leader_reads_locally_and_linearizably() {
    let cluster = Cluster::start(3, &["--read-lease", "true"]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(10)).await;
    let follower = leader % 3 + 1;
    let mut on_leader = cluster.client(leader).await;
    let mut on_follower = cluster.client(follower).await;
    assert_eq!(on_leader.command(&["SET", "warm", "up"]).await.unwrap(), ok());
    assert_eq!(on_leader.command(&["GET", "warm"]).await.unwrap(), bulk("up"));
    let counters = |id: u64| {
        let metrics = cluster.metrics(id);
        (
            metric_value(&metrics, "chorus_raft_lease_reads_total"),
            metric_value(&metrics, "chorus_raft_read_index_requests_total"),
        )
    };
    let (lease_reads_before, read_indexes_before) = counters(leader);
    const READS: usize = 200;
    for i in 0..READS {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        assert_eq!(on_follower.command(&["SET", &key, &value]).await.unwrap(), ok());
        assert_eq!(on_leader.command(&["GET", &key]).await.unwrap(), bulk(&value));
    }
    let (lease_reads, read_indexes) = counters(leader);
    assert!(
        lease_reads - lease_reads_before >= (READS - 10) as f64,
        "{} of {READS} reads served under the lease",
        lease_reads - lease_reads_before
    );
    assert!(
        read_indexes - read_indexes_before < 40.0,
        "{} ReadIndex rounds for {READS} reads",
        read_indexes - read_indexes_before
    );

    assert_eq!(on_follower.command(&["CLUSTER", "FAILOVER"]).await.unwrap(), ok());
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.leader_among(&[follower]).await != Some(follower) {
        assert!(Instant::now() < deadline, "node {follower} did not take over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (new_leader_lease_reads, _) = counters(follower);
    for i in 0..50 {
        let value = format!("after{i}");
        assert_eq!(on_follower.command(&["SET", "x", &value]).await.unwrap(), ok());
        assert_eq!(on_leader.command(&["GET", "x"]).await.unwrap(), bulk(&value));
        assert_eq!(on_follower.command(&["GET", "x"]).await.unwrap(), bulk(&value));
    }
    assert!(
        counters(follower).0 > new_leader_lease_reads,
        "the new leader serves reads under a lease of its own"
    );
}

/// Clients writing one command at a time share raft entries: while an entry is uncommitted new
/// writes wait for the next one, and once it commits the leader lingers for the clients it just
/// answered, so every client's next write joins the same entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_share_raft_entries() {
    const CLIENTS: usize = 16;
    const WRITES_EACH: usize = 40;
    // Waits far longer than any client needs to send its next write, so the batch size does not
    // depend on how loaded the machine is.
    let cluster = Cluster::start(
        3,
        &["--group-commit-linger-us", "50000", "--group-commit-wait-us", "50000"],
    );
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(5)).await;
    // The node's first write registers its RIFL incarnation, a command of its own.
    let mut first = cluster.client(leader).await;
    assert_eq!(first.command(&["SET", "first", "v"]).await.unwrap(), ok());
    let before = cluster.metrics(leader);
    let mut writers = Vec::new();
    for c in 0..CLIENTS {
        let mut client = cluster.client(leader).await;
        writers.push(tokio::spawn(async move {
            for i in 0..WRITES_EACH {
                let key = format!("batch{c}-{i}");
                assert_eq!(client.command(&["SET", &key, "v"]).await.unwrap(), ok(), "SET {key}");
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let after = cluster.metrics(leader);
    let delta = |name| metric_value(&after, name) - metric_value(&before, name);
    let commands = delta("chorus_raft_commands_proposed_total");
    let entries = delta("chorus_raft_entries_proposed_total");
    assert_eq!(commands, (CLIENTS * WRITES_EACH) as f64);
    assert!(
        commands / entries >= CLIENTS as f64 * 0.75,
        "{commands} writes went out in {entries} entries: fewer than {} per entry",
        CLIENTS as f64 * 0.75
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crash_loses_no_acknowledged_write_and_the_node_catches_up() {
    let cluster = Cluster::start(3, &[]);
    let mut c = cluster.client(1).await;
    let mut expected = Vec::new();
    for i in 0..300 {
        let (key, value) = (format!("before{i}"), format!("x{i}"));
        assert_eq!(c.command(&["SET", &key, &value]).await.unwrap(), ok());
        expected.push((key, value));
    }
    let (leader, survivors) = cluster.leader_and_followers().await;
    cluster.kill(leader);
    let killed_at = Instant::now();
    let new_leader = cluster.wait_for_leader(&survivors, Duration::from_secs(5)).await;
    eprintln!(
        "new leader {new_leader} elected {:?} after SIGKILL of {leader}",
        killed_at.elapsed()
    );
    assert_ne!(new_leader, leader);

    for id in &survivors {
        let mut c = cluster.client(*id).await;
        for (key, value) in &expected {
            assert_eq!(
                c.command(&["GET", key]).await.unwrap(),
                bulk(value),
                "node {id} key {key}"
            );
        }
    }
    let mut c = cluster.client(survivors[0]).await;
    for i in 0..100 {
        let (key, value) = (format!("after{i}"), format!("y{i}"));
        assert_eq!(c.command(&["SET", &key, &value]).await.unwrap(), ok());
        expected.push((key, value));
    }
    cluster.restart_stopped();
    let mut back = cluster.client(leader).await;
    for (key, value) in &expected {
        assert_eq!(
            back.command(&["GET", key]).await.unwrap(),
            bulk(value),
            "restarted node, key {key}"
        );
    }
}

/// CURP on, with the fast path taken whatever the distance to the leader (as the chaos harness
/// runs it).
const CURP_ON: &[&str] = &["--curp", "on", "--curp-fast-path-min-rtt-us", "0"];

fn metric_sum_over(cluster: &Cluster, ids: &[u64], name: &str) -> f64 {
    ids.iter().map(|id| metric_value(&cluster.metrics(*id), name)).sum()
}

/// Pipelined INCRs on each client's own counter, on the followers, through a SIGKILL of the
/// leader: writes a leader change left in doubt are retried under their RIFL sequence numbers, so
/// every reply is the next integer (an INCR executed twice would skip one, a lost one repeat one)
/// and no client is told UNCERTAIN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increments_in_doubt_after_a_leader_crash_execute_exactly_once_and_in_order() {
    increments_through_a_leader_crash(&[], 0).await;
}

/// The same with CURP: the increments take the fast path (one round trip, answered before they
/// commit), and the new leader recovers what the witnesses hold before it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curp_fast_path_increments_through_a_leader_crash_execute_exactly_once_and_in_order() {
    let (cluster, followers) = increments_through_a_leader_crash(CURP_ON, 100).await;
    let new_leader = cluster.wait_for_leader(&followers, Duration::from_secs(5)).await;
    let recoveries = metric_value(&cluster.metrics(new_leader), "chorus_curp_recoveries_total");
    assert!(recoveries >= 1.0, "the new leader served without recovering");
}

/// The leader is stopped once the followers have taken the fast path `min_fast_path_writes`
/// times, so that writes on it are in flight at the crash however slowly a loaded machine gets
/// there.
async fn increments_through_a_leader_crash(server_args: &[&str], min_fast_path_writes: u64) -> (Cluster, Vec<u64>) {
    let cluster = Cluster::start(3, server_args);
    let (leader, followers) = cluster.leader_and_followers().await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for (n, id) in followers.iter().cycle().take(6).enumerate() {
        let mut c = cluster.client(*id).await;
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let key = format!("counter{n}");
            let mut replies = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let batch = vec![vec!["INCR".to_string(), key.clone()]; 4];
                replies.extend(c.pipeline(&batch).await.expect("the follower stays up"));
            }
            let last = c.command(&["GET", &key]).await.unwrap();
            (key, replies, last)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fast_path_writes = || metric_sum_over(&cluster, &followers, "chorus_curp_fast_path_writes_total");
    let give_up_at = Instant::now() + Duration::from_secs(30);
    while min_fast_path_writes > 0 && fast_path_writes() < min_fast_path_writes as f64 {
        assert!(
            Instant::now() < give_up_at,
            "only {} writes took the fast path in 30 s",
            fast_path_writes()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopped first, so the writes forwarded to it are surely in flight when it dies.
    let pid = chorus_cluster::read_pid(cluster.dir.path(), leader).expect("the leader runs");
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    // Writes sent after the stop reach a leader that never takes them: certainly in doubt when
    // it dies (the clients above may all be waiting on writes it had already replicated).
    let mut late = cluster.client(followers[0]).await;
    let late_writes = tokio::spawn(async move {
        let batch = vec![vec!["INCR".to_string(), "after-the-stop".to_string()]; 4];
        late.pipeline(&batch).await.expect("the follower stays up")
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(leader);
    let late_replies = late_writes.await.unwrap();
    // Long enough for an election and writes under the new leader.
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    assert_eq!(late_replies, (1..=4).map(Value::Integer).collect::<Vec<_>>());
    for client in clients {
        let (key, replies, last) = client.await.unwrap();
        for (i, reply) in replies.iter().enumerate() {
            assert_eq!(reply, &Value::Integer(i as i64 + 1), "{key}, reply {i}");
        }
        assert_eq!(last, bulk(&replies.len().to_string()), "{key}");
    }
    let retried = metric_sum_over(&cluster, &followers, "chorus_rifl_write_retries_total");
    assert!(
        retried > 0.0,
        "the crash left no write in doubt; the test proved nothing"
    );
    (cluster, followers)
}

/// A client that owns its RIFL id sends a write again to another node after its node died: the
/// write executes once, and a late copy of one the client has moved past executes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_owned_id_settles_a_write_on_another_node_after_its_node_dies() {
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let mut first = cluster.client(followers[0]).await;
    let mut session = RiflSession::register(&mut first).await.unwrap();
    for i in 1..=5 {
        let write = session.wrap(&["INCR", "n"]);
        assert_eq!(first.command(&write.command).await.unwrap(), Value::Integer(i));
        session.answered(&write);
    }
    // Its reply is lost with the node: the client only knows it sent it.
    let sixth = session.wrap(&["INCR", "n"]);
    assert_eq!(first.command(&sixth.command).await.unwrap(), Value::Integer(6));
    cluster.kill(followers[0]);
    let mut second = cluster.client(followers[1]).await;
    assert_eq!(
        second.command(&sixth.command).await.unwrap(),
        Value::Integer(6),
        "sent again, answered from its record"
    );
    session.answered(&sixth);
    let seventh = session.wrap(&["INCR", "n"]);
    assert_eq!(second.command(&seventh.command).await.unwrap(), Value::Integer(7));
    let stale = second.command(&sixth.command).await.unwrap();
    assert!(matches!(&stale, Value::Error(e) if e.starts_with("STALE")), "{stale:?}");
    assert_eq!(second.command(&["GET", "n"]).await.unwrap(), bulk("7"));
    let read = second
        .command(&["RIFL", "WRITE", "1", "2", "1", "GET", "n"])
        .await
        .unwrap();
    assert!(
        matches!(&read, Value::Error(e) if e.contains("write command")),
        "{read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_behind_the_compacted_log_catches_up_by_snapshot() {
    let cluster = Cluster::start(3, &["--snapshot-interval-entries", "50", "--log-keep-entries", "10"]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(5)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let mut c = cluster.client(leader).await;
    assert_eq!(c.command(&["SET", "seed", "1"]).await.unwrap(), ok());
    let follower_last = cluster.info_u64(follower, "raft_last_index").await;
    cluster.kill(follower);
    // 4 KiB values: the state (about 1.6 MB) ships as several chunks.
    let value = |i: usize| format!("{i:04096}");
    for i in 0..400 {
        assert_eq!(c.command(&["SET", &format!("s{i}"), &value(i)]).await.unwrap(), ok());
    }
    let first = cluster.info_u64(leader, "raft_first_index").await;
    assert!(
        first > follower_last + 1,
        "leader compacted only to {first}; follower had {follower_last}"
    );

    cluster.restart_stopped();
    let target = cluster.info_u64(leader, "raft_commit_index").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.info_u64(follower, "raft_applied_index").await < target {
        assert!(Instant::now() < deadline, "follower did not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let installed = metric_value(&cluster.metrics(follower), "chorus_raft_snapshots_installed_total");
    assert!(installed >= 1.0, "follower caught up without a snapshot");
    let received = metric_value(&cluster.metrics(follower), "chorus_snapshot_bytes_received_total");
    let sent = metric_value(&cluster.metrics(leader), "chorus_snapshot_bytes_sent_total");
    // The snapshot holds the writes up to its index: at most the snapshot interval plus the
    // kept entries (60 writes, one per entry) behind the last, so more than one 1 MiB chunk.
    let shipped_at_least = ((400 - 60) * 4096) as f64;
    assert!(
        received >= shipped_at_least && sent >= received,
        "the segments were shipped: {received} bytes received, {sent} sent"
    );
    // Local (stale) reads on the follower now show everything: its own state holds the data.
    let local_reads_show_the_writes = |step: usize| {
        let cluster = &cluster;
        async move {
            let mut f = cluster.client(follower).await;
            assert_eq!(f.command(&["READONLY"]).await.unwrap(), ok());
            for i in (0..400).step_by(step) {
                assert_eq!(f.command(&["GET", &format!("s{i}")]).await.unwrap(), bulk(&value(i)));
            }
        }
    };
    local_reads_show_the_writes(7).await;
    // The installed segments are the follower's own now: they survive its restart.
    cluster.kill(follower);
    cluster.restart_stopped();
    local_reads_show_the_writes(11).await;
}

/// Reads waiting through an election are served once the new leader has committed its first
/// entry, on the leader and on the other survivor alike. Raft drops a ReadIndex that reaches a
/// leader before that commit, and ignores one whose context another pending request has (a
/// follower's and the leader's used to share contexts); re-issued only an election timeout later
/// (3 s here, twice the 1.5 s a request waits for a leader), such reads failed with TRYAGAIN
/// after the leader was up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_waiting_through_an_election_are_served_once_the_new_leader_commits() {
    let cluster = Cluster::start(3, &["--election-ticks", "30", "--leader-wait-ms", "1500"]);
    let (leader, survivors) = cluster.leader_and_followers().await;
    let mut c = cluster.client(leader).await;
    assert_eq!(c.command(&["SET", "k", "v"]).await.unwrap(), ok());
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for id in survivors.clone() {
        let mut c = cluster.client(id).await;
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let answer = c.command(&["GET", "k"]).await.expect("the survivor stays up");
                answers.push((Instant::now(), answer));
            }
            (id, answers)
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.kill(leader);
    cluster.wait_for_leader(&survivors, Duration::from_secs(30)).await;
    let leader_seen_at = Instant::now();
    // Past the moment a dropped ReadIndex would be issued again.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let (id, answers) = reader.await.unwrap();
        let after_the_election: Vec<_> = answers
            .iter()
            .filter(|(at, _)| *at > leader_seen_at + Duration::from_secs(1))
            .map(|(_, answer)| answer)
            .collect();
        assert!(
            !after_the_election.is_empty(),
            "node {id} answered no read after the election"
        );
        for answer in after_the_election {
            assert_eq!(answer, &bulk("v"), "node {id}, a read once the new leader was up");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_requests_fail_with_clear_errors_in_bounded_time() {
    let cluster = Cluster::start(3, &["--leader-wait-ms", "1000", "--request-timeout-ms", "2000"]);
    let (leader, followers) = cluster.leader_and_followers().await;
    // Written through a follower, so the leader has never registered its RIFL incarnation.
    let mut f = cluster.client(followers[0]).await;
    assert_eq!(f.command(&["SET", "a", "1"]).await.unwrap(), ok());
    for id in &followers {
        cluster.kill(*id);
    }
    // Many first writes at once: one registration fails for all of them, not one after another.
    let started = Instant::now();
    let mut first_writes = Vec::new();
    for n in 0..6 {
        let mut c = cluster.client(leader).await;
        first_writes.push(tokio::spawn(async move {
            c.command(&["SET", &format!("new{n}"), "v"]).await
        }));
    }
    for write in first_writes {
        let answer = write.await.unwrap().unwrap();
        assert!(
            matches!(&answer, Value::Error(e) if e.starts_with("TIMEOUT") || e.starts_with("TRYAGAIN")),
            "first write without quorum answered {answer:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "six first writes took {:?}",
        started.elapsed()
    );
    let mut c = cluster.client(leader).await;
    let started = Instant::now();
    let write = c.command(&["SET", "a", "2"]).await.unwrap();
    assert!(
        matches!(&write, Value::Error(e) if e.starts_with("TIMEOUT") || e.starts_with("TRYAGAIN")),
        "write without quorum answered {write:?}"
    );
    let read = c.command(&["GET", "a"]).await.unwrap();
    assert!(
        matches!(&read, Value::Error(e) if e.starts_with("TRYAGAIN")),
        "read without quorum answered {read:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    // Stale reads are still served locally, by explicit opt-in.
    assert_eq!(c.command(&["READONLY"]).await.unwrap(), ok());
    assert!(matches!(c.command(&["GET", "a"]).await.unwrap(), Value::Bulk(Some(_))));
    cluster.restart_stopped();
    // Back to a quorum (on a loaded machine the election may take longer than the 1 s a request
    // waits for a leader): the value is whichever write took.
    cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let mut c = cluster.client(leader).await;
    let v = c.command(&["GET", "a"]).await.unwrap();
    assert!(v == bulk("1") || v == bulk("2"), "{v:?}");
}

fn send_and_read(addr: SocketAddr, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return (out, false)
            }
            Err(_) => return (out, true),
        }
    }
}

fn peer_frame(kind: u8, payload: &[u8], claimed_len: Option<u32>) -> Vec<u8> {
    let mut f = b"CH".to_vec();
    f.push(1);
    f.push(kind);
    f.extend_from_slice(&claimed_len.unwrap_or(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// CRC-32 (IEEE), as the peer frame uses; written out here so the test does not trust our code.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in data {
        crc ^= *b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_input_is_rejected_and_the_cluster_is_unaffected() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(5)).await;
    let term_before = cluster.info_u64(leader, "raft_term").await;
    let target = (1..=3).find(|id| *id != leader).unwrap();
    let node = cluster.node(target).clone();

    // RESP port: an oversized bulk string and a malformed header each get an error, then a close.
    for input in [&b"*1\r\n$99999999999\r\n"[..], b"*1\r\n$abc\r\n", b"*2\r\n:1\r\n"] {
        let (reply, closed) = send_and_read(node.resp_addr, input);
        assert!(
            reply.starts_with(b"-ERR Protocol error"),
            "{:?}",
            String::from_utf8_lossy(&reply)
        );
        assert!(closed, "connection left open after a protocol error");
    }
    // Binary junk as an inline command is an unknown command, not a crash.
    let (reply, _) = send_and_read(node.resp_addr, b"\x00\x01\xfe\xff junk\r\n");
    assert!(
        reply.starts_with(b"-ERR unknown command"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );

    // Peer port: junk, an oversized frame, an unknown node, and a corrupt raft message.
    let junk: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
    let hello_from_2 = peer_frame(1, &((target % 3) + 1).to_le_bytes(), None);
    let cases = [
        junk.clone(),
        peer_frame(2, b"", Some(2_000_000_000)),
        peer_frame(1, &99u64.to_le_bytes(), None),
        [hello_from_2.clone(), peer_frame(2, &junk, None)].concat(),
        [
            hello_from_2,
            peer_frame(2, b"abc", Some(3)).into_iter().map(|b| b ^ 1).collect(),
        ]
        .concat(),
    ];
    for (i, case) in cases.iter().enumerate() {
        let (_, closed) = send_and_read(node.peer_addr, case);
        assert!(closed, "peer case {i} left the connection open");
    }
    let rejected = metric_value(&cluster.metrics(target), "chorus_peer_connections_rejected_total");
    assert!(rejected >= 5.0, "only {rejected} peer connections rejected");

    for id in 1..=3 {
        let mut c = cluster.client(id).await;
        let key = format!("after-garbage-{id}");
        assert_eq!(c.command(&["SET", &key, "ok"]).await.unwrap(), ok());
        assert_eq!(c.command(&["GET", &key]).await.unwrap(), bulk("ok"));
    }
    assert_eq!(
        cluster.info_u64(leader, "raft_term").await,
        term_before,
        "garbage caused an election"
    );
}

fn require_tool(name: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .unwrap()
        .status
        .success();
    assert!(
        found,
        "{name} is not installed; install Debian's redis-tools (.ci/run does)"
    );
}

fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{tool} {args:?} failed: {text}");
    text
}

/// A connection that speaks raw RESP, for replies our client's decoder does not read (RESP3).
struct RawConnection(std::net::TcpStream);

impl RawConnection {
    fn connect(addr: SocketAddr) -> RawConnection {
        let stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        RawConnection(stream)
    }

    fn send(&mut self, args: &[&str]) {
        let mut request = Vec::new();
        chorus_resp::write_command(args, &mut request);
        std::io::Write::write_all(&mut self.0, &request).unwrap();
    }

    /// Sends `args` and asserts the reply is exactly `expected`.
    fn expect(&mut self, args: &[&str], expected: &[u8]) {
        self.send(args);
        let mut reply = vec![0; expected.len()];
        std::io::Read::read_exact(&mut self.0, &mut reply).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&reply),
            String::from_utf8_lossy(expected),
            "{args:?}"
        );
    }

    /// Sends a HELLO and returns its reply (whose last field is the empty module list).
    fn hello(&mut self, args: &[&str]) -> String {
        self.send(args);
        self.until(b"$7\r\nmodules\r\n*0\r\n")
    }

    /// Every byte received from now until (and with) `end`.
    fn until(&mut self, end: &[u8]) -> String {
        let mut received = Vec::new();
        let mut byte = [0u8];
        while !received.ends_with(end) {
            std::io::Read::read_exact(&mut self.0, &mut byte).unwrap();
            received.push(byte[0]);
        }
        String::from_utf8(received).unwrap()
    }
}

/// A client that opens with `HELLO 3` (go-redis v9 and redis-py with protocol=3 do) gets RESP3:
/// maps for HELLO, HGETALL and CONFIG GET, `_` for nulls — the bytes Redis 7 sends — and
/// `HELLO 2` (or RESET) takes it back to RESP2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_clients_negotiate_with_hello_and_get_maps_and_nulls() {
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut c = cluster.client(leader).await;
    assert_eq!(
        c.command(&["HSET", "h3", "f1", "v1", "f2", "v2"]).await.unwrap(),
        Value::Integer(2)
    );
    let mut raw = RawConnection::connect(cluster.node(followers[0]).resp_addr);
    let hello = raw.hello(&["HELLO", "3", "AUTH", "default", "any", "SETNAME", "app"]);
    assert!(hello.starts_with("%7\r\n$6\r\nserver\r\n$6\r\nchorus\r\n"), "{hello}");
    assert!(hello.contains("$5\r\nproto\r\n:3\r\n"), "{hello}");
    assert!(hello.contains("$4\r\nrole\r\n$7\r\nreplica\r\n"), "{hello}");
    let leader_hello = RawConnection::connect(cluster.node(leader).resp_addr).hello(&["HELLO", "3"]);
    assert!(
        leader_hello.contains("$4\r\nrole\r\n$6\r\nmaster\r\n"),
        "{leader_hello}"
    );
    raw.expect(
        &["HGETALL", "h3"],
        b"%2\r\n$2\r\nf1\r\n$2\r\nv1\r\n$2\r\nf2\r\n$2\r\nv2\r\n",
    );
    raw.expect(&["GET", "no-such-key"], b"_\r\n");
    raw.expect(&["HGETALL", "no-such-key"], b"%0\r\n");
    raw.expect(&["CONFIG", "GET", "save"], b"%1\r\n$4\r\nsave\r\n$0\r\n\r\n");
    raw.expect(&["HMGET", "h3", "f1", "no-such-field"], b"*2\r\n$2\r\nv1\r\n_\r\n");
    raw.expect(&["CLIENT", "GETNAME"], b"$3\r\napp\r\n");
    raw.expect(&["HELLO", "4"], b"-NOPROTO unsupported protocol version\r\n");
    raw.expect(
        &["HELLO", "3", "AUTH", "bob", "secret"],
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    let hello = raw.hello(&["HELLO", "2"]);
    assert!(hello.starts_with("*14\r\n"), "{hello}");
    raw.expect(
        &["HGETALL", "h3"],
        b"*4\r\n$2\r\nf1\r\n$2\r\nv1\r\n$2\r\nf2\r\n$2\r\nv2\r\n",
    );
    raw.expect(&["GET", "no-such-key"], b"$-1\r\n");

    // RESET takes a connection back to how it connected: RESP2, no name, no transaction.
    raw.hello(&["HELLO", "3", "SETNAME", "app"]);
    raw.expect(&["MULTI"], b"+OK\r\n");
    raw.expect(&["RESET"], b"+RESET\r\n");
    raw.expect(&["GET", "no-such-key"], b"$-1\r\n");
    raw.expect(&["CLIENT", "GETNAME"], b"$-1\r\n");
    raw.expect(&["EXEC"], b"-ERR EXEC without MULTI\r\n");
}

/// The cases of `replies_match_redis`'s generator: every one, and the streams' and their
/// consumer groups'.
const ALL_CASES: std::ops::Range<usize> = 0..171;
const STREAM_CASES: std::ops::Range<usize> = 138..154;

/// A redis-server of our own on a free port, stopped when dropped.
struct RedisServer {
    child: std::process::Child,
    addr: SocketAddr,
    /// Its working directory: where a BGREWRITEAOF writes.
    _dir: tempfile::TempDir,
}

impl RedisServer {
    fn start() -> RedisServer {
        require_tool("redis-server");
        // A port below the ephemeral range and reserved like a cluster's: one the kernel hands
        // out for binding to port 0 can be taken by another test's outgoing connection before
        // redis-server binds it.
        let port = chorus_cluster::ports::free_loopback_ports(1).unwrap()[0];
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .current_dir(dir.path())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisServer { child, addr, _dir: dir }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `count` random commands of every type — strings, hashes, sets, lists, sorted sets, expiry,
/// scripts, and transactions opened and closed a few commands on — on six keys named
/// `prefix`0..5 (values that are and are not integers, keys of every type, wrong arities),
/// each sent to Redis and to Chorus; the replies must be equal, errors word for word. HGETALL's
/// pairs are compared as a set: Redis keeps a small hash in insertion order, Chorus in field
/// order (likewise HKEYS, HVALS and the set commands), also inside EXEC's array. `cases` picks
/// the generator's cases: all of them, or the streams' alone (`STREAM_CASES`).
async fn replies_match_redis(
    redis: &mut Client,
    chorus: &mut Client,
    seed: u64,
    count: usize,
    prefix: &str,
    cases: std::ops::Range<usize>,
) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut below = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    const VALUES: [&str; 9] = ["1", "-3", "abc", "10", "", "9223372036854775807", "x y", "01", "+1"];
    // The names of the commands queued since MULTI, while a transaction is open.
    let mut queued: Option<Vec<String>> = None;
    for i in 0..count {
        let key = format!("{prefix}{}", below(6));
        let other = format!("{prefix}{}", below(6));
        let field = format!("f{}", below(4));
        let value = VALUES[below(VALUES.len())].to_string();
        let seconds = ["1000", "2000", "-1", "0"][below(4)].to_string();
        // Floats on keys of their own, with increments a long double holds exactly: Redis adds in
        // long doubles and prints their rounding noise, Chorus in exact decimals (decimal.rs).
        let float_key = format!("{prefix}f{}", below(2));
        let float = ["0.5", "-2.25", "3", "abc", "1e2", "inf", ""][below(7)].to_string();
        let offset = ["0", "3", "-1"][below(3)].to_string();
        let index = ["0", "1", "-1", "-2", "5"][below(5)].to_string();
        let score = ["1", "2.5", "-1", "0", "inf", "-inf", "abc", "1e2", "3"][below(9)].to_string();
        let score_bound = || ["-inf", "+inf", "(1", "1", "2.5", "(2.5", "abc", "0"];
        let (min, max) = (score_bound()[below(8)].to_string(), score_bound()[below(8)].to_string());
        // Lex ranges are defined where every member has one score: keys of their own, ZADDed 0.
        let lex_key = format!("{prefix}z{}", below(2));
        let lex_bound = || ["-", "+", "[f1", "(f1", "[f0", "f1", "(f3"];
        let (lex_min, lex_max) = (lex_bound()[below(7)].to_string(), lex_bound()[below(7)].to_string());
        let zadd_options = || ["NX", "XX", "GT", "LT", "CH", "INCR"];
        let script = "return redis.call(ARGV[1], KEYS[1], ARGV[2])".to_string();
        let bit_bound = || ["0", "1", "-1", "-2", "7", "abc", "20"];
        let (bit_start, bit_end) = (bit_bound()[below(7)].to_string(), bit_bound()[below(7)].to_string());
        let bit_unit = ["BYTE", "BIT", "bit", "nope"][below(4)].to_string();
        // Stream ids with small numbers, so that commands meet each other's entries; never `*`,
        // whose id is the time (the log's on Chorus, the wall clock's on Redis).
        let stream_ids = || ["1-1", "2", "2-*", "3-0", "0-0", "0-*", "1-x", "5-2", "3-*", "4-1"];
        // Consumer groups and consumers; idle times (XPENDING's entries, XINFO CONSUMERS) are
        // left out, being the clock's.
        let group = format!("g{}", below(2));
        // Stream commands mostly on keys of their own, so that groups, entries and pending
        // entries meet; now and then on a key of any type.
        let stream_key = if below(4) == 0 {
            key.clone()
        } else {
            format!("{prefix}s{}", below(2))
        };
        let consumer = format!("c{}", below(2));
        // HyperLogLogs mostly on keys of their own, read only through their registers: a
        // PFCOUNT of one key writes its count into the string on Redis, not on Chorus.
        let hll_key = format!("{prefix}h{}", below(2));
        let hll_or_any_key = if below(4) == 0 { key.clone() } else { hll_key.clone() };
        // Geospatial indexes: positions around Sicily (a few out of bounds or not numbers),
        // members m0..m5, searches of every shape and option.
        let geo_key = if below(5) == 0 {
            key.clone()
        } else {
            format!("{prefix}g{}", below(2))
        };
        let geo_members = [0; 3].map(|_| format!("m{}", below(6)));
        let geo_units = [0; 2].map(|_| ["m", "km", "mi", "ft", "KM", "yd"][below(6)].to_string());
        let geo_radii = [0; 2].map(|_| ["10", "100", "250", "0", "-1", "x"][below(6)].to_string());
        let geo_position = |pick: usize| -> [String; 2] {
            [
                ["13.361389", "38.115556"],
                ["15.087269", "37.502669"],
                ["14.2", "37.1"],
                ["12.5", "37.8"],
                ["15.6", "38.2"],
                ["13.9", "36.7"],
                ["200", "10"],
                ["14", "x"],
            ][pick]
                .map(String::from)
        };
        let command: Vec<String> = match cases.start + below(cases.len()) {
            // Stream ids run out at 5-2: start the stream keys afresh now and then.
            152 if below(4) == 0 => vec!["DEL".into(), stream_key],
            146 | 152 | 153 => match below(7) {
                0..=2 => {
                    let mut c = vec!["XGROUP".into(), "CREATE".into(), stream_key, group];
                    c.push(["0", "0", "$", "1-1", "x", "-"][below(6)].into());
                    if below(4) != 0 {
                        c.push("MKSTREAM".into());
                    }
                    if below(4) == 0 {
                        c.extend(["ENTRIESREAD".into(), ["1", "-1", "-2"][below(3)].into()]);
                    }
                    c
                }
                3 => vec![
                    "XGROUP".into(),
                    "SETID".into(),
                    stream_key,
                    group,
                    ["0", "$", "2-0", "+", "y"][below(5)].into(),
                ],
                4 => vec!["XGROUP".into(), "DESTROY".into(), stream_key, group],
                5 => vec!["XGROUP".into(), "CREATECONSUMER".into(), stream_key, group, consumer],
                _ => vec!["XGROUP".into(), "DELCONSUMER".into(), stream_key, group, consumer],
            },
            147 | 148 => {
                let mut c = vec!["XREADGROUP".into(), "GROUP".into(), group, consumer];
                if below(3) == 0 {
                    c.extend(["COUNT".into(), ["0", "1", "2"][below(3)].into()]);
                }
                if below(5) == 0 {
                    c.push("NOACK".into());
                }
                c.extend(["STREAMS".into(), stream_key]);
                let two = below(3) == 0;
                if two {
                    c.push(other);
                }
                let read_id = || [">", ">", "0", "1-1", "$", "x"];
                c.push(read_id()[below(6)].into());
                if two {
                    c.push(read_id()[below(6)].into());
                }
                c
            }
            149 => {
                let mut c = vec!["XACK".into(), stream_key, group];
                for _ in 0..1 + below(2) {
                    c.push(stream_ids()[below(10)].into());
                }
                c
            }
            150 => match below(2) {
                0 => vec!["XPENDING".into(), stream_key, group],
                _ => vec!["XINFO".into(), "GROUPS".into(), stream_key],
            },
            151 => match below(2) {
                0 => {
                    let mut c = vec!["XCLAIM".into(), stream_key, group, consumer];
                    c.push(["0", "3600000", "x"][below(3)].into());
                    for _ in 0..1 + below(2) {
                        c.push(stream_ids()[below(10)].into());
                    }
                    for option in ["JUSTID", "FORCE", "RETRYCOUNT 5", "LASTID 3-0"] {
                        if below(4) == 0 {
                            c.extend(option.split(' ').map(String::from));
                        }
                    }
                    c
                }
                _ => {
                    let mut c = vec!["XAUTOCLAIM".into(), stream_key, group, consumer];
                    c.push(["0", "3600000"][below(2)].into());
                    c.push(["0", "-", "(1-1", "2-0"][below(4)].into());
                    if below(2) == 0 {
                        c.extend(["COUNT".into(), ["1", "2", "0"][below(3)].into()]);
                    }
                    if below(3) == 0 {
                        c.push("JUSTID".into());
                    }
                    c
                }
            },
            138..=140 => {
                let mut c = vec!["XADD".to_string(), stream_key];
                if below(6) == 0 {
                    c.push("NOMKSTREAM".into());
                }
                match below(5) {
                    0 => c.extend([
                        "MAXLEN".into(),
                        ["=", "0", "2", "1"][below(4)].into(),
                        ["0", "2", "-1", "x"][below(4)].into(),
                    ]),
                    1 => c.extend(["MINID".into(), ["2-0", "3", "x", "(1"][below(4)].into()]),
                    2 if below(4) == 0 => c.extend(["MAXLEN".into(), "2".into(), "LIMIT".into(), "1".into()]),
                    _ => {}
                }
                c.push(stream_ids()[below(10)].into());
                for _ in 0..1 + below(2) {
                    c.extend([field.clone(), value.clone()]);
                }
                if below(12) == 0 {
                    c.pop();
                }
                c
            }
            141 => {
                let mut c = vec!["XDEL".to_string(), stream_key];
                for _ in 0..1 + below(2) {
                    c.push(stream_ids()[below(10)].into());
                }
                c
            }
            142 => match below(3) {
                0 => vec![
                    "XTRIM".into(),
                    stream_key,
                    "MAXLEN".into(),
                    ["0", "1", "3", "-1"][below(4)].into(),
                ],
                1 => vec![
                    "XTRIM".into(),
                    stream_key,
                    "MINID".into(),
                    "=".into(),
                    ["2-0", "3", "x"][below(3)].into(),
                ],
                _ => vec!["XLEN".into(), stream_key],
            },
            143 => {
                let bound = || ["-", "+", "1", "2-0", "(1-1", "(2", "3-5", "x", "(+", "(0-0"];
                let name = ["XRANGE", "XREVRANGE"][below(2)];
                let mut c = vec![
                    name.to_string(),
                    stream_key,
                    bound()[below(10)].into(),
                    bound()[below(10)].into(),
                ];
                if below(3) == 0 {
                    c.extend(["COUNT".into(), ["0", "1", "2", "-1", "x"][below(5)].into()]);
                }
                c
            }
            144 | 145 => {
                let mut c = vec!["XREAD".to_string()];
                if below(3) == 0 {
                    c.extend(["COUNT".into(), ["0", "1", "2"][below(3)].into()]);
                }
                c.extend(["STREAMS".into(), stream_key]);
                let two = below(2) == 0;
                if two {
                    c.push(other);
                }
                let read_id = || ["0", "1-1", "$", "2", "x"];
                c.push(read_id()[below(5)].into());
                if two {
                    c.push(read_id()[below(5)].into());
                }
                c
            }
            133..=135 => {
                let name = [
                    "ZUNIONSTORE",
                    "ZINTERSTORE",
                    "ZDIFFSTORE",
                    "ZUNION",
                    "zinter",
                    "ZDIFF",
                    "ZINTERCARD",
                ][below(7)];
                let sources = 1 + below(3);
                let mut c = vec![name.to_string()];
                if name.ends_with("STORE") {
                    c.push(other);
                }
                c.push(match below(12) {
                    0 => ["0", "-1", "x", "9"][below(4)].into(),
                    _ => sources.to_string(),
                });
                c.push(key);
                c.extend((1..sources).map(|_| format!("{prefix}{}", below(6))));
                for _ in 0..below(3) {
                    match below(4) {
                        0 => {
                            c.push("WEIGHTS".into());
                            let weights = if below(8) == 0 { sources + 1 } else { sources };
                            c.extend((0..weights).map(|_| ["2", "0", "-1", "0.5", "inf", "x"][below(6)].to_string()));
                        }
                        1 => c.extend(["AGGREGATE".into(), ["SUM", "min", "MAX", "avg"][below(4)].into()]),
                        2 => c.push("WITHSCORES".into()),
                        _ => c.extend(["LIMIT".into(), ["0", "1", "2", "-1", "x"][below(5)].into()]),
                    }
                }
                c
            }
            136 | 137 => vec!["ZADD".into(), key, score, field],
            // SORT on keys of any type. Left out: BY without `*` unless storing, and ALPHA with a
            // BY pattern — both leave a set's members in Redis's hash order, which only that
            // process knows.
            case @ (164 | 165) => {
                let store = case == 165;
                let mut c = vec![["SORT", "SORT_RO"][usize::from(!store && below(4) == 0)].into(), key];
                let by_star = below(3) == 0;
                for _ in 0..below(4) {
                    match below(7) {
                        0 => c.push(["ASC", "DESC"][below(2)].into()),
                        1 if !by_star => c.push("ALPHA".into()),
                        2 => c.extend(["LIMIT".into(), index.clone(), ["1", "2", "-1", "0"][below(4)].into()]),
                        3 => c.extend([
                            "GET".into(),
                            ["#".into(), format!("{prefix}*"), format!("{prefix}*->f0")][below(3)].clone(),
                        ]),
                        4 if store => c.extend(["BY".into(), "nosort".into()]),
                        _ => c.push("DESC".into()),
                    }
                }
                if by_star {
                    c.extend([
                        "BY".into(),
                        [format!("{prefix}*"), format!("{prefix}*->f1")][below(2)].clone(),
                    ]);
                }
                if store {
                    c.extend(["STORE".into(), other]);
                }
                c
            }
            // A library loaded again and again (the same code: the same reply), and its
            // functions called — one that may write, one that may not.
            168 => vec![
                "FUNCTION".into(),
                "LOAD".into(),
                "REPLACE".into(),
                "#!lua name=generated\n\
                 redis.register_function('generated_call', function(keys, args)\n\
                   return redis.call(args[1], keys[1], args[2]) end)\n\
                 redis.register_function{function_name='generated_read', flags={'no-writes'},\n\
                   callback=function(keys, args) return redis.call(args[1], keys[1], args[2]) end}"
                    .into(),
            ],
            169 | 170 => vec![
                ["FCALL", "FCALL_RO"][below(2)].into(),
                ["generated_call", "generated_read"][below(2)].into(),
                "1".into(),
                key,
                ["SET", "GET", "INCRBY", "APPEND", "SADD", "LPUSH", "HGET", "ZADD"][below(8)].into(),
                value,
            ],
            167 => {
                let mut c = vec!["XSETID".into(), stream_key, stream_ids()[below(10)].into()];
                match below(4) {
                    0 => c.extend(["ENTRIESADDED".into(), ["0", "3", "100", "-1"][below(4)].into()]),
                    1 => c.extend(["MAXDELETEDID".into(), stream_ids()[below(10)].into()]),
                    _ => {}
                }
                c
            }
            166 => {
                let mut c = vec!["LCS".into(), key, other];
                match below(5) {
                    0 => c.push("LEN".into()),
                    1 => c.push("IDX".into()),
                    2 => c.extend(["IDX".into(), "MINMATCHLEN".into(), ["1", "2", "x"][below(3)].into()]),
                    3 => c.extend(["IDX".into(), "WITHMATCHLEN".into(), ["LEN", "IDX"][below(2)].into()]),
                    _ => {}
                }
                c
            }
            162 | 163 => {
                let mut c = vec![["BITFIELD", "BITFIELD_RO"][below(4) / 3].into(), key];
                for _ in 0..1 + below(3) {
                    let kind = ["i1", "u1", "i5", "u8", "i8", "u16", "i64", "u63", "u64", "x"][below(10)].to_string();
                    let at = ["0", "3", "#1", "13", "-1", "#x"][below(6)].to_string();
                    let number =
                        ["0", "1", "-1", "127", "-129", "300", "9223372036854775807", "y"][below(8)].to_string();
                    match below(5) {
                        0 => c.extend(["OVERFLOW".into(), ["WRAP", "SAT", "fail", "nope"][below(4)].into()]),
                        1 | 2 => c.extend(["GET".into(), kind, at]),
                        3 => c.extend(["SET".into(), kind, at, number]),
                        _ => c.extend(["INCRBY".into(), kind, at, number]),
                    }
                }
                c
            }
            158 => {
                let mut c = vec!["GEOADD".into(), geo_key];
                if below(4) == 0 {
                    c.push(["NX", "XX", "CH"][below(3)].into());
                }
                for member in &geo_members[..1 + below(3)] {
                    c.extend(geo_position(if below(10) == 0 { 6 + below(2) } else { below(6) }));
                    c.push(member.clone());
                }
                c
            }
            159 => {
                let [a, b, _] = geo_members;
                match below(3) {
                    0 => vec!["GEOPOS".into(), geo_key, a, b],
                    1 => vec!["GEOHASH".into(), geo_key, a, b],
                    _ => {
                        let mut c = vec!["GEODIST".into(), geo_key, a, b];
                        if below(2) == 0 {
                            c.push(geo_units[0].clone());
                        }
                        c
                    }
                }
            }
            case @ (160 | 161) => {
                let [member, from_member, _] = geo_members;
                let [unit, other_unit] = geo_units;
                let [radius, height] = geo_radii;
                let mut c = match (case == 161, below(3)) {
                    (false, _) => vec!["GEOSEARCH".into(), geo_key],
                    (true, 0) => vec!["GEOSEARCHSTORE".into(), format!("{prefix}gd"), geo_key],
                    (true, 1) => {
                        let mut c = vec!["GEORADIUS".into(), geo_key];
                        c.extend(geo_position(below(8)));
                        c.extend([radius.clone(), unit.clone()]);
                        c
                    }
                    (true, _) => vec![
                        "GEORADIUSBYMEMBER".into(),
                        geo_key,
                        member,
                        radius.clone(),
                        unit.clone(),
                    ],
                };
                if matches!(c[0].as_str(), "GEOSEARCH" | "GEOSEARCHSTORE") {
                    if below(2) == 0 {
                        c.extend(["FROMMEMBER".into(), from_member]);
                    } else {
                        c.push("FROMLONLAT".into());
                        c.extend(geo_position(below(8)));
                    }
                    if below(2) == 0 {
                        c.extend(["BYRADIUS".into(), radius, other_unit]);
                    } else {
                        c.extend(["BYBOX".into(), radius, height, other_unit]);
                    }
                }
                for _ in 0..below(4) {
                    match below(9) {
                        0 => c.push("ASC".into()),
                        1 => c.push("DESC".into()),
                        2 => c.extend(["COUNT".into(), ["1", "3", "0"][below(3)].into()]),
                        3 => c.push("ANY".into()),
                        4 => c.push("WITHDIST".into()),
                        5 => c.push("WITHCOORD".into()),
                        6 => c.push("WITHHASH".into()),
                        7 if c[0] == "GEOSEARCHSTORE" => c.push("STOREDIST".into()),
                        7 | 8 if c[0].starts_with("GEORADIUS") => {
                            c.extend([["STORE", "STOREDIST"][below(2)].into(), format!("{prefix}gd")])
                        }
                        _ => c.push("ASC".into()),
                    }
                }
                c
            }
            154 => {
                let mut c = vec!["PFADD".into(), hll_or_any_key];
                c.extend((0..below(4)).map(|_| ["a", "b", "c", "d", "e", "f", "g", "h"][below(8)].to_string()));
                c
            }
            // Hundreds of elements at once, so that the sparse form fills and turns dense.
            155 => {
                let mut c = vec!["PFADD".into(), hll_key];
                c.extend((0..300).map(|_| format!("e{}", below(4000))));
                c
            }
            156 => match below(5) {
                0 => vec!["PFCOUNT".into(), hll_key],
                1 => vec![
                    "PFCOUNT".into(),
                    hll_key,
                    hll_or_any_key,
                    format!("{prefix}h{}", below(3)),
                ],
                2 => vec!["GETRANGE".into(), hll_key, "16".into(), "-1".into()],
                3 => vec!["GETRANGE".into(), hll_key, "0".into(), "4".into()],
                _ => vec!["STRLEN".into(), hll_key],
            },
            157 => {
                let mut c = vec!["PFMERGE".into(), hll_or_any_key, hll_key];
                if below(2) == 0 {
                    c.push(format!("{prefix}h{}", below(3)));
                }
                c
            }
            131 | 132 => {
                let op = ["AND", "or", "XOR", "NOT", "nope"][below(5)];
                let mut c = vec!["BITOP".into(), op.into(), other, key];
                if below(3) > 0 {
                    c.push(format!("{prefix}{}", below(6)));
                }
                c
            }
            124 => vec![
                "SETBIT".into(),
                key,
                ["0", "7", "13", "-1", "4294967296", "x"][below(6)].into(),
                ["0", "1", "1", "2"][below(4)].into(),
            ],
            125 => vec!["GETBIT".into(), key, ["0", "1", "9", "-1", "100"][below(5)].into()],
            126 => vec!["BITCOUNT".into(), key],
            127 => {
                let mut c = vec!["BITCOUNT".into(), key, bit_start];
                if below(6) > 0 {
                    c.push(bit_end);
                }
                if below(2) == 0 {
                    c.push(bit_unit);
                }
                c
            }
            128 => vec!["BITPOS".into(), key, ["0", "1", "2", "x"][below(4)].into()],
            129 => {
                let mut c = vec!["BITPOS".into(), key, ["0", "1"][below(2)].into(), bit_start];
                if below(3) > 0 {
                    c.push(bit_end);
                    if below(2) == 0 {
                        c.push(bit_unit);
                    }
                }
                c
            }
            130 => vec!["SETBIT".into(), key, ["0", "15", "22"][below(3)].into(), "1".into()],
            120 => vec![
                "EVAL".into(),
                script,
                "1".into(),
                key,
                ["SET", "GET", "INCRBY", "APPEND", "SADD", "LPUSH", "HGET", "ZADD"][below(8)].into(),
                value,
            ],
            121 => vec![
                "EVAL".into(),
                "return redis.pcall('INCR', KEYS[1])".into(),
                "1".into(),
                key,
            ],
            // A transaction is opened here and closed a few commands on (EXEC or DISCARD).
            122 if queued.is_none() => vec!["MULTI".into()],
            122 | 123 if queued.as_ref().is_some_and(|q: &Vec<String>| q.len() >= 2) => {
                vec![["EXEC", "EXEC", "DISCARD"][below(3)].into()]
            }
            93 => {
                let mut c = vec!["ZADD".to_string(), key];
                for _ in 0..below(3) {
                    c.push(zadd_options()[below(6)].into());
                }
                c.extend([score, field]);
                if below(3) == 0 {
                    c.extend(["3".into(), "f0".into()]);
                }
                c
            }
            94 => vec!["ZADD".into(), key, score, field, "-1".into(), "f1".into()],
            95 => vec!["ZINCRBY".into(), key, score, field],
            96 => vec!["ZREM".into(), key, field, "f0".into()],
            97 => vec!["ZSCORE".into(), key, field],
            98 => vec!["ZMSCORE".into(), key, field, "f1".into()],
            99 => vec!["ZCARD".into(), key],
            100 => vec!["ZCOUNT".into(), key, min, max],
            101 => {
                let mut c = vec!["ZRANGE".into(), key, index, ["-1", "2", "0"][below(3)].into()];
                if below(2) == 0 {
                    c.push("WITHSCORES".into());
                }
                c
            }
            102 => {
                let mut c = vec!["ZRANGE".into(), key, min, max, "BYSCORE".into()];
                for option in ["REV", "WITHSCORES"] {
                    if below(2) == 0 {
                        c.push(option.into());
                    }
                }
                if below(2) == 0 {
                    c.extend([
                        "LIMIT".into(),
                        ["0", "1", "-1"][below(3)].into(),
                        ["1", "-1", "0", "2"][below(4)].into(),
                    ]);
                }
                c
            }
            103 => vec!["ZREVRANGE".into(), key, index, "-1".into(), "WITHSCORES".into()],
            104 => vec![
                "ZRANGEBYSCORE".into(),
                key,
                min,
                max,
                "WITHSCORES".into(),
                "LIMIT".into(),
                ["0", "1"][below(2)].into(),
                ["2", "-1"][below(2)].into(),
            ],
            105 => vec!["ZREVRANGEBYSCORE".into(), key, max, min],
            106 => vec![["ZRANK", "ZREVRANK"][below(2)].into(), key, field],
            107 => {
                let mut c = vec![["ZPOPMIN", "ZPOPMAX"][below(2)].to_string(), key];
                if below(2) == 0 {
                    c.push(["0", "2", "-1", "5"][below(4)].into());
                }
                c
            }
            108 => vec!["ZREMRANGEBYRANK".into(), key, index, ["-1", "0", "1"][below(3)].into()],
            109 => vec!["ZREMRANGEBYSCORE".into(), key, min, max],
            110 => vec!["ZRANGESTORE".into(), other, key, index, "-1".into()],
            111 => vec![
                "ZMPOP".into(),
                "2".into(),
                key,
                other,
                ["MIN", "MAX", "UP"][below(3)].into(),
                "COUNT".into(),
                ["1", "3", "0"][below(3)].into(),
            ],
            112 | 113 => vec!["ZADD".into(), lex_key, "0".into(), field],
            114 => {
                let mut c = vec!["ZRANGEBYLEX".into(), lex_key, lex_min, lex_max];
                if below(2) == 0 {
                    c.extend([
                        "LIMIT".into(),
                        ["0", "1"][below(2)].into(),
                        ["1", "-1"][below(2)].into(),
                    ]);
                }
                c
            }
            115 => vec!["ZLEXCOUNT".into(), lex_key, lex_min, lex_max],
            116 => vec!["ZREMRANGEBYLEX".into(), lex_key, lex_min, lex_max],
            117 => vec!["ZRANGE".into(), lex_key, lex_max, lex_min, "BYLEX".into(), "REV".into()],
            118 => vec!["ZSCAN".into(), key, "0".into()],
            119 => vec![
                "ZRANGE".into(),
                key,
                "0".into(),
                "-1".into(),
                ["LIMIT", "BYLEX", "REV", "WITHSCORES"][below(4)].into(),
                "0".into(),
                "1".into(),
            ],
            76 => vec![
                ["LPUSH", "RPUSH", "LPUSHX", "RPUSHX"][below(4)].into(),
                key,
                value,
                field,
            ],
            77 => vec![["LPOP", "RPOP"][below(2)].into(), key],
            78 => vec![
                ["LPOP", "RPOP"][below(2)].into(),
                key,
                ["0", "1", "3", "-1"][below(4)].into(),
            ],
            79 => vec!["LRANGE".into(), key, index, ["-1", "2", "0"][below(3)].into()],
            80 => vec!["LLEN".into(), key],
            81 => vec!["LINDEX".into(), key, index],
            82 => vec!["LSET".into(), key, index, value],
            83 => vec!["LREM".into(), key, ["0", "1", "-1"][below(3)].into(), value],
            84 => vec!["LTRIM".into(), key, index, ["-1", "2", "0"][below(3)].into()],
            85 => vec![
                "LMOVE".into(),
                key,
                other,
                ["LEFT", "RIGHT"][below(2)].into(),
                ["LEFT", "RIGHT", "UP"][below(3)].into(),
            ],
            86 => vec!["RPOPLPUSH".into(), key, other],
            87 => vec!["RPUSH".into(), key, "f0".into(), "f1".into(), "f0".into()],
            88 => vec!["LRANGE".into(), key, "0".into(), "-1".into()],
            89 => vec![
                "LINSERT".into(),
                key,
                ["BEFORE", "AFTER", "NEAR"][below(3)].into(),
                field,
                value,
            ],
            91 => vec![
                "LMPOP".into(),
                "2".into(),
                key,
                other,
                ["LEFT", "RIGHT"][below(2)].into(),
                "COUNT".into(),
                ["1", "3", "0"][below(3)].into(),
            ],
            90 => vec![
                "LPOS".into(),
                key,
                field,
                "RANK".into(),
                ["1", "-1", "2", "0"][below(4)].into(),
                "COUNT".into(),
                ["0", "1", "2"][below(3)].into(),
            ],
            62 => vec!["SADD".into(), key, field, value],
            63 => vec!["SREM".into(), key, field, "f0".into()],
            64 => vec!["SMEMBERS".into(), key],
            65 => vec!["SISMEMBER".into(), key, field],
            66 => vec!["SMISMEMBER".into(), key, field, "f1".into()],
            67 => vec!["SCARD".into(), key],
            68 => vec![["SINTER", "SUNION", "SDIFF"][below(3)].into(), key, other],
            69 => vec![
                ["SINTERSTORE", "SUNIONSTORE", "SDIFFSTORE"][below(3)].into(),
                key,
                other,
                field,
            ],
            70 => vec!["SMOVE".into(), key, other, field],
            71 => vec!["SINTERCARD".into(), "2".into(), key, other],
            // Counts past any set's size: every member, so Redis's pick and Chorus's agree.
            72 => vec!["SPOP".into(), key, "20".into()],
            73 => vec!["SRANDMEMBER".into(), key, "20".into()],
            74 => vec!["SADD".into(), key, "f0".into(), "f1".into(), "f2".into()],
            45 => vec!["SETRANGE".into(), key, offset, value],
            46 => vec!["GETRANGE".into(), key, offset, ["-1", "2", "-3"][below(3)].into()],
            47 => vec!["MSETNX".into(), key, value.clone(), other, value],
            48 => vec!["HINCRBY".into(), key, field, value],
            49 => vec!["HINCRBYFLOAT".into(), float_key, field, float],
            50 => vec!["HSETNX".into(), key, field, value],
            51 => vec!["RENAME".into(), key, other],
            52 => vec!["RENAMENX".into(), key, other],
            53 => vec!["COPY".into(), key, other],
            54 => vec!["COPY".into(), key, other, "REPLACE".into()],
            55 => vec!["KEYS".into(), format!("{prefix}*")],
            56 => vec!["INCRBYFLOAT".into(), float_key, float],
            57 => vec!["GET".into(), float_key],
            58 => vec!["HGETALL".into(), float_key],
            59 if below(10) == 0 => vec!["FLUSHALL".into()],
            60 => vec!["SETRANGE".into(), key, "1".into(), "".into()],
            29 => vec!["SET".into(), key, value, "EX".into(), seconds],
            30 => vec!["SET".into(), key, value, ["KEEPTTL", "GET", "NX"][below(3)].into()],
            31 => vec!["SETEX".into(), key, seconds, value],
            32 => vec!["GETSET".into(), key, value],
            33 => vec!["GETDEL".into(), key],
            34 => vec!["GETEX".into(), key, "EX".into(), seconds],
            35 => vec!["GETEX".into(), key, "PERSIST".into()],
            36 => vec!["EXPIRE".into(), key, seconds],
            // Absolute times: GT and LT compare deadlines, which relative times would make
            // depend on the millisecond each system ran the command in.
            37 => vec![
                "EXPIREAT".into(),
                key,
                ["4102444800", "4102448400", "1"][below(3)].into(),
                ["NX", "XX", "GT", "LT"][below(4)].into(),
            ],
            38 => vec!["EXPIRE".into(), key, seconds, "NX".into(), "GT".into()],
            39 => vec!["PERSIST".into(), key],
            40 => vec!["TTL".into(), key],
            41 => vec!["PTTL".into(), key],
            42 => vec!["EXPIRETIME".into(), key],
            43 => vec!["SET".into(), key, value, "PX".into(), seconds, "KEEPTTL".into()],
            0 => vec!["SET".into(), key, value],
            1 => vec!["SET".into(), key, value, ["NX", "XX"][below(2)].into()],
            2 => vec!["GET".into(), key],
            3 => vec!["DEL".into(), key, other],
            4 => vec!["EXISTS".into(), key, other],
            5 => vec!["MGET".into(), key, other],
            6 => vec!["MSET".into(), key, value.clone(), other, value],
            7 => vec!["INCR".into(), key],
            8 => vec!["INCRBY".into(), key, value],
            9 => vec!["DECR".into(), key],
            10 => vec!["DECRBY".into(), key, value],
            11 => vec!["APPEND".into(), key, value],
            12 => vec!["STRLEN".into(), key],
            13 => vec!["TYPE".into(), key],
            14 => vec!["SETNX".into(), key, value],
            15 => vec!["HSET".into(), key, field, value],
            16 => vec!["HGET".into(), key, field],
            17 => vec!["HMGET".into(), key, field, "f0".into()],
            18 => vec!["HGETALL".into(), key],
            19 => vec!["HDEL".into(), key, field],
            20 => vec!["HLEN".into(), key],
            21 => vec!["HEXISTS".into(), key, field],
            22 => vec!["UNLINK".into(), key],
            23 => vec!["HMSET".into(), key, field, value],
            24 => vec!["SET".into(), key],
            25 => vec!["HKEYS".into(), key],
            26 => vec!["HVALS".into(), key],
            27 => vec!["HSTRLEN".into(), key, field],
            _ => vec!["HSET".into(), key, field],
        };
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        // Inside a transaction, replies that drift with time would be compared inside EXEC's
        // array, without the tolerance below: leave them out there.
        if queued.is_some() && ["TTL", "PTTL", "EXPIRETIME"].contains(&args[0]) {
            continue;
        }
        let expected = redis
            .command(&args)
            .await
            .unwrap_or_else(|e| panic!("redis-server, {args:?}: {e}"));
        let got = chorus
            .command(&args)
            .await
            .unwrap_or_else(|e| panic!("Chorus, {args:?}: {e}"));
        let ended = match args[0] {
            "MULTI" => {
                queued = Some(Vec::new());
                None
            }
            "EXEC" | "DISCARD" => queued.take(),
            name => {
                if let Some(queued) = &mut queued {
                    queued.push(name.to_string());
                }
                None
            }
        };
        let as_set = |name: &str, v: Value| match v {
            // ZSCAN's pairs: Redis walks a sorted set that has ever been large (its encoding
            // stays converted) in its hash table's order.
            Value::Array(Some(mut page)) if name == "ZSCAN" && page.len() == 2 => {
                if let Value::Array(Some(items)) = &mut page[1] {
                    let mut pairs: Vec<Vec<Value>> = items.chunks(2).map(<[Value]>::to_vec).collect();
                    pairs.sort_by_key(|pair| format!("{:?}", pair[0]));
                    *items = pairs.concat();
                }
                Value::Array(Some(page))
            }
            Value::Array(Some(items)) if name == "HGETALL" => {
                let mut pairs: Vec<(Value, Value)> = items.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect();
                pairs.sort_by_key(|(field, _)| format!("{field:?}"));
                Value::Array(Some(pairs.into_iter().flat_map(|(f, v)| [f, v]).collect()))
            }
            Value::Array(Some(mut items))
                if [
                    "HKEYS",
                    "HVALS",
                    "KEYS",
                    "SMEMBERS",
                    "SINTER",
                    "SUNION",
                    "SDIFF",
                    "SPOP",
                    "SRANDMEMBER",
                ]
                .contains(&name) =>
            {
                items.sort_by_key(|item| format!("{item:?}"));
                Value::Array(Some(items))
            }
            other => other,
        };
        // EXEC's array: each reply as its own command's.
        let normalized = |v: Value| match (v, &ended) {
            (Value::Array(Some(replies)), Some(names)) if args[0] == "EXEC" && replies.len() == names.len() => {
                Value::Array(Some(
                    replies.into_iter().zip(names).map(|(r, n)| as_set(n, r)).collect(),
                ))
            }
            (v, _) => as_set(args[0], v),
        };
        // Times to live are read a moment apart from keys given them a moment apart: close, not
        // equal. What matters exactly is the sign (-2 no key, -1 no deadline).
        let tolerance = match args[0] {
            "TTL" | "EXPIRETIME" => 1,
            "PTTL" => 1000,
            _ => 0,
        };
        match (&got, &expected) {
            (Value::Integer(a), Value::Integer(b)) if tolerance > 0 && *a >= 0 && *b >= 0 => {
                assert!(
                    (a - b).abs() <= tolerance,
                    "command {i} (seed {seed}): {args:?}: {a} against {b}"
                );
            }
            _ => assert_eq!(
                normalized(got),
                normalized(expected),
                "command {i} (seed {seed}): {args:?}"
            ),
        }
    }
    // The next call may use another connection to Chorus but keeps this one to Redis.
    if queued.is_some() {
        assert_eq!(
            chorus.command(&["DISCARD"]).await.unwrap(),
            redis.command(&["DISCARD"]).await.unwrap()
        );
    }
}

/// The replies a connection blocked in BLPOP, then in XREAD BLOCK, gets when another unblocks
/// it (as timed out, then with an error), and what the other is answered along the way.
async fn unblocked(addr: SocketAddr) -> Vec<Value> {
    let mut blocked = Client::connect(addr).await.unwrap();
    let mut other = Client::connect(addr).await.unwrap();
    let Value::Integer(id) = blocked.command(&["CLIENT", "ID"]).await.unwrap() else {
        panic!("CLIENT ID is a number")
    };
    let id = id.to_string();
    let mut replies = Vec::new();
    for (command, reason) in [
        (vec!["BLPOP", "nothing", "0"], None),
        (vec!["XREAD", "BLOCK", "0", "STREAMS", "nothing-s", "$"], Some("ERROR")),
    ] {
        let waiting = tokio::spawn(async move {
            let reply = blocked.command(&command).await.unwrap();
            (blocked, reply)
        });
        // Until it waits, CLIENT UNBLOCK finds nothing to end.
        loop {
            let mut unblock = vec!["CLIENT", "UNBLOCK", id.as_str()];
            unblock.extend(reason);
            if other.command(&unblock).await.unwrap() == Value::Integer(1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (back, reply) = waiting.await.unwrap();
        blocked = back;
        replies.push(reply);
    }
    for args in [
        vec!["CLIENT", "UNBLOCK", id.as_str()],
        vec!["CLIENT", "UNBLOCK", "987654321"],
        vec!["CLIENT", "UNBLOCK", "abc"],
        vec!["CLIENT", "UNBLOCK", id.as_str(), "LATER"],
        vec!["CLIENT", "NO-EVICT", "on"],
        vec!["CLIENT", "NO-EVICT", "maybe"],
    ] {
        replies.push(other.command(&args).await.unwrap());
    }
    replies
}

/// CLIENT UNBLOCK ends another connection's blocking command as redis-server does: as if its
/// timeout ran out, or with an UNBLOCKED error; 0 for a connection that does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_unblock_ends_a_blocking_command_as_redis_server_does() {
    let redis_server = RedisServer::start();
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let expected = unblocked(redis_server.addr).await;
    assert_eq!(expected[0], Value::Array(None), "{expected:?}");
    assert_eq!(unblocked(cluster.node(followers[0]).resp_addr).await, expected);
}

/// What a subscriber connection at `addr` is sent while it subscribes to shard channels,
/// channels and a pattern and another connection publishes, then unsubscribes, up to its `PING`'s
/// answer; and the publisher's replies.
async fn shard_channel_traffic(addr: SocketAddr) -> (String, Vec<Value>) {
    let mut subscriber = RawConnection::connect(addr);
    subscriber.send(&["SSUBSCRIBE", "a", "b"]);
    subscriber.send(&["SUBSCRIBE", "c"]);
    subscriber.send(&["PSUBSCRIBE", "*"]);
    subscriber.send(&["SSUBSCRIBE", "a"]);
    subscriber.send(&["GET", "k"]);
    // Every confirmation is out before anything is published.
    subscriber.send(&["PING", "subscribed"]);
    let mut received = subscriber.until(b"$10\r\nsubscribed\r\n");
    let mut publisher = Client::connect(addr).await.unwrap();
    let mut replies = Vec::new();
    for args in [
        vec!["SPUBLISH", "a", "to a, sharded"],
        vec!["PUBLISH", "a", "to a"],
        vec!["SPUBLISH", "c", "to c, sharded"],
        vec!["SPUBLISH", "b", "to b, sharded"],
        vec!["PUBSUB", "SHARDCHANNELS"],
        vec!["PUBSUB", "SHARDCHANNELS", "b*"],
        vec!["PUBSUB", "SHARDNUMSUB", "a", "c"],
        vec!["PUBSUB", "NUMSUB", "a", "c"],
        vec!["SPUBLISH", "a"],
    ] {
        let mut reply = publisher.command(&args).await.unwrap();
        // Redis lists channels in its hash table's order.
        if let (["PUBSUB", "SHARDCHANNELS", ..], Value::Array(Some(channels))) = (args.as_slice(), &mut reply) {
            channels.sort_by_key(|c| format!("{c:?}"));
        }
        replies.push(reply);
    }
    // The node hands messages over as it applies them: let them reach the subscriber first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    subscriber.send(&["SUNSUBSCRIBE", "a"]);
    subscriber.send(&["SUNSUBSCRIBE"]);
    subscriber.send(&["SUNSUBSCRIBE"]);
    subscriber.send(&["PING", "done"]);
    received += &subscriber.until(b"$4\r\ndone\r\n");
    replies.push(publisher.command(&["PUBSUB", "SHARDCHANNELS"]).await.unwrap());
    (received, replies)
}

/// Shard channels (SSUBSCRIBE, SUNSUBSCRIBE, SPUBLISH, PUBSUB SHARDCHANNELS and SHARDNUMSUB)
/// behave byte for byte as on redis-server: their own namespace, which PUBLISH and patterns do
/// not reach, `smessage` frames, confirmations counting the shard channels alone; and a message
/// published through one node reaches a shard channel's subscriber on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_channels_behave_as_on_redis_server() {
    let redis_server = RedisServer::start();
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let expected = shard_channel_traffic(redis_server.addr).await;
    assert!(expected.0.contains("smessage"), "{}", expected.0);
    assert_eq!(
        shard_channel_traffic(cluster.node(followers[0]).resp_addr).await,
        expected
    );

    let mut subscriber = RawConnection::connect(cluster.node(followers[1]).resp_addr);
    subscriber.expect(
        &["SSUBSCRIBE", "far"],
        b"*3\r\n$10\r\nssubscribe\r\n$3\r\nfar\r\n:1\r\n",
    );
    let mut publisher = cluster.client(leader).await;
    publisher.command(&["SPUBLISH", "far", "hello"]).await.unwrap();
    let frame = b"*3\r\n$8\r\nsmessage\r\n$3\r\nfar\r\n$5\r\nhello\r\n";
    let mut message = vec![0; frame.len()];
    std::io::Read::read_exact(&mut subscriber.0, &mut message).unwrap();
    assert_eq!(String::from_utf8_lossy(&message), String::from_utf8_lossy(frame));
}

impl RawConnection {
    /// Sends `PING marker` and returns every byte received up to its answer.
    fn until_ping(&mut self, marker: &str) -> String {
        self.send(&["PING", marker]);
        self.until(format!("${}\r\n{marker}\r\n", marker.len()).as_bytes())
    }
}

/// What client-side caching connections at `reader` are sent while another client writes at
/// `writer`: RESP3 default mode (the keys read, a connection's own write, FLUSHALL), BCAST with
/// prefixes, OPTIN with CLIENT CACHING, a RESP2 connection redirecting to a subscriber of
/// `__redis__:invalidate`, CLIENT TRACKINGINFO and GETREDIR, the refusals; and a RESP3 set.
async fn tracking_traffic(reader: SocketAddr, writer: SocketAddr) -> Vec<String> {
    let mut writer = Client::connect(writer).await.unwrap();
    let mut write = async |args: &[&str]| {
        writer.command(args).await.unwrap();
    };
    // The node hands invalidations over as it applies the writes: let them reach the reader.
    let settle = || tokio::time::sleep(Duration::from_millis(300));
    let mut seen = Vec::new();
    let mut r = RawConnection::connect(reader);
    r.hello(&["HELLO", "3"]);
    for args in [
        &["CLIENT", "TRACKING", "ON"][..],
        &["GET", "k"],
        &["MGET", "a", "b"],
        &["CLIENT", "TRACKINGINFO"],
        &["CLIENT", "GETREDIR"],
        &["CLIENT", "CACHING", "YES"],
    ] {
        r.send(args);
    }
    seen.push(r.until_ping("tracking"));
    write(&["SET", "k", "1"]).await;
    write(&["MSET", "a", "1", "b", "2", "c", "3"]).await;
    settle().await;
    seen.push(r.until_ping("others-wrote"));
    r.send(&["GET", "k"]);
    r.send(&["SET", "k", "2"]);
    settle().await;
    seen.push(r.until_ping("own-write"));
    r.send(&["GET", "k"]);
    r.send(&["GET", "a"]);
    seen.push(r.until_ping("read-again"));
    write(&["FLUSHALL"]).await;
    settle().await;
    seen.push(r.until_ping("flushed"));
    for args in [
        &["CLIENT", "TRACKING", "ON", "BCAST"][..],
        &["CLIENT", "TRACKING", "OFF"],
        &["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "user:", "PREFIX", "job:"],
        &["CLIENT", "TRACKINGINFO"],
    ] {
        r.send(args);
    }
    seen.push(r.until_ping("bcast"));
    write(&["MSET", "user:1", "x", "job:1", "y", "user:2", "z", "other", "o"]).await;
    settle().await;
    seen.push(r.until_ping("bcast-written"));
    for args in [
        &["CLIENT", "TRACKING", "OFF"][..],
        &["CLIENT", "TRACKING", "ON", "OPTIN"],
        &["GET", "x"],
        &["CLIENT", "CACHING", "YES"],
        &["GET", "y"],
        &["CLIENT", "CACHING", "NO"],
    ] {
        r.send(args);
    }
    seen.push(r.until_ping("optin"));
    write(&["SET", "x", "1"]).await;
    write(&["SET", "y", "1"]).await;
    settle().await;
    seen.push(r.until_ping("optin-written"));
    write(&["SADD", "members", "m"]).await;
    r.send(&["SMEMBERS", "members"]);
    r.send(&["SPOP", "nothing", "2"]);
    seen.push(r.until_ping("set"));

    let mut subscriber = RawConnection::connect(reader);
    subscriber.send(&["CLIENT", "ID"]);
    let id = subscriber.until_ping("id");
    let id = id[1..].split("\r\n").next().unwrap().to_string();
    subscriber.send(&["SUBSCRIBE", "__redis__:invalidate"]);
    seen.push(subscriber.until_ping("subscribed"));
    let mut redirecting = RawConnection::connect(reader);
    for args in [
        &["CLIENT", "TRACKING", "ON", "REDIRECT", &id][..],
        &["GET", "z"],
        &["CLIENT", "TRACKING", "ON", "REDIRECT", "999999"],
        &["CLIENT", "TRACKING", "ON", "PREFIX", "a"],
        &["CLIENT", "TRACKING", "ON", "OPTIN", "OPTOUT"],
        &["CLIENT", "TRACKING", "ON", "BCAST", "OPTIN"],
        &["CLIENT", "TRACKING", "MAYBE"],
    ] {
        redirecting.send(args);
    }
    seen.push(redirecting.until_ping("redirecting"));
    write(&["SET", "z", "1"]).await;
    settle().await;
    seen.push(subscriber.until_ping("redirected"));
    seen
}

/// Client-side caching (CLIENT TRACKING, CACHING, GETREDIR, TRACKINGINFO) behaves byte for byte
/// as on redis-server, with the reader on a follower and the writer on the leader: every
/// invalidation, in Redis's order and grouping, and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_caching_invalidates_as_redis_server_does() {
    let redis_server = RedisServer::start();
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let expected = tracking_traffic(redis_server.addr, redis_server.addr).await;
    assert!(expected[1].contains("invalidate"), "{expected:?}");
    let seen = tracking_traffic(cluster.node(followers[0]).resp_addr, cluster.node(leader).resp_addr).await;
    for (step, (seen, expected)) in seen.iter().zip(&expected).enumerate() {
        assert_eq!(seen, expected, "step {step}");
    }
    assert_eq!(seen.len(), expected.len());
}

/// A RESP3 frame as a tracking reader needs it: an invalidation push, or a reply.
#[derive(Debug, PartialEq)]
enum Resp3Frame {
    Invalidate(Option<Vec<String>>),
    Reply(Option<String>),
}

impl RawConnection {
    fn line(&mut self) -> String {
        let mut line = self.until(b"\r\n");
        line.truncate(line.len() - 2);
        line
    }

    /// A bulk string, a null, a simple string or an invalidation push (what GET, SET and PING
    /// answer a tracking RESP3 client).
    fn frame(&mut self) -> Resp3Frame {
        let line = self.line();
        match line.as_bytes()[0] {
            b'$' => {
                let body = self.line();
                assert_eq!(body.len().to_string(), line[1..], "a bulk string of its length");
                Resp3Frame::Reply(Some(body))
            }
            b'_' => Resp3Frame::Reply(None),
            b'+' => Resp3Frame::Reply(Some(line[1..].to_string())),
            b'>' => {
                assert_eq!(
                    (line.as_str(), self.line().as_str(), self.line().as_str()),
                    (">2", "$10", "invalidate")
                );
                let keys = self.line();
                if keys == "_" {
                    return Resp3Frame::Invalidate(None);
                }
                let count: usize = keys[1..].parse().unwrap();
                Resp3Frame::Invalidate(Some(
                    (0..count)
                        .map(|_| {
                            self.line();
                            self.line()
                        })
                        .collect(),
                ))
            }
            _ => panic!("unexpected frame {line}"),
        }
    }
}

/// A client caching what it reads on a follower, told of writes through invalidations, never
/// keeps a stale value: while writes to the same keys race its reads, each value it caches is
/// invalidated if a later write applies — however close the write comes to the read — so once
/// the writes stop and their invalidations arrive, every value it still holds is the latest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caching_client_never_keeps_a_value_a_racing_write_replaced() {
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    const KEYS: usize = 4;
    let mut writer = cluster.client(leader).await;
    for key in 0..KEYS {
        writer.command(&["SET", &format!("k{key}"), "0"]).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writing = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut last = [0u64; KEYS];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = (n as usize * 7) % KEYS;
                writer
                    .command(&["SET", &format!("k{key}"), &n.to_string()])
                    .await
                    .unwrap();
                last[key] = n;
            }
            last
        })
    };
    let addr = cluster.node(followers[0]).resp_addr;
    let reading = tokio::task::spawn_blocking(move || {
        let mut r = RawConnection::connect(addr);
        r.hello(&["HELLO", "3"]);
        r.send(&["CLIENT", "TRACKING", "ON"]);
        assert_eq!(r.frame(), Resp3Frame::Reply(Some("OK".into())));
        let mut cache: HashMap<String, Option<String>> = HashMap::new();
        let (mut hits, mut invalidations) = (0, 0);
        let began = Instant::now();
        let mut i = 0;
        // Three seconds, and on a loaded machine (slower writes) until enough writes raced the reads.
        while began.elapsed() < Duration::from_secs(3)
            || (invalidations <= 100 && began.elapsed() < Duration::from_secs(30))
        {
            i += 1;
            let key = format!("k{}", i % KEYS);
            if cache.contains_key(&key) {
                hits += 1;
                // Invalidations arrive on their own: a PING takes whatever came before it.
                r.send(&["PING", "p"]);
            } else {
                r.send(&["GET", &key]);
            }
            loop {
                match r.frame() {
                    Resp3Frame::Invalidate(Some(keys)) => {
                        invalidations += 1;
                        keys.iter().for_each(|k| drop(cache.remove(k)));
                    }
                    Resp3Frame::Invalidate(None) => {
                        invalidations += 1;
                        cache.clear();
                    }
                    Resp3Frame::Reply(reply) if reply.as_deref() == Some("p") => break,
                    Resp3Frame::Reply(value) => {
                        cache.insert(key.clone(), value);
                        break;
                    }
                }
            }
        }
        (r, cache, hits, invalidations)
    });
    let (mut r, mut cache, hits, invalidations) = reading.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let last = writing.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.send(&["PING", "done"]);
    loop {
        match r.frame() {
            Resp3Frame::Invalidate(Some(keys)) => keys.iter().for_each(|k| drop(cache.remove(k))),
            Resp3Frame::Invalidate(None) => cache.clear(),
            Resp3Frame::Reply(_) => break,
        }
    }
    assert!(
        hits > 100 && invalidations > 100,
        "hits {hits}, invalidations {invalidations}"
    );
    for (key, value) in &cache {
        let index: usize = key[1..].parse().unwrap();
        assert_eq!(
            value.as_deref(),
            Some(last[index].to_string().as_str()),
            "{key} is stale in the cache"
        );
    }
}

/// COMMAND GETKEYS of every kind of command, and its errors.
const GETKEYS_CASES: &[&str] = &[
    "GET k",
    "SET k v EX 10",
    "MSET a 1 b 2",
    "OBJECT ENCODING k",
    "OBJECT HELP",
    "OBJECT ENCODING",
    "MEMORY USAGE k",
    "SORT k LIMIT 0 1 BY w GET x STORE dst",
    "SORT_RO k BY x",
    "GEORADIUS k 0 0 1 km STORE d1 STOREDIST d2",
    "GEORADIUSBYMEMBER k store 1 km STORE d1",
    "SINTERCARD 2 a b LIMIT 1",
    "SINTERCARD 5 a",
    "BLMPOP 0 2 a b LEFT",
    "ZUNIONSTORE d 2 a b WEIGHTS 1 2",
    "ZINTERSTORE d 0 a",
    "ZDIFF 1 a",
    "XREAD COUNT 1 STREAMS s1 s2 0 0",
    "XREADGROUP GROUP g c COUNT 1 STREAMS s1 0",
    "XGROUP CREATE s g 0",
    "XINFO HELP",
    "EVAL x 2 a b",
    "EVAL x 3 a b",
    "FCALL_RO f 0",
    "PUBLISH ch m",
    "SPUBLISH ch m",
    "WATCH a b",
    "BLPOP a b 0",
    "BITOP AND d a b",
    "GEOSEARCHSTORE d s FROMMEMBER m BYRADIUS 1 km",
    "KEYS *",
    "GET a b",
    "NOSUCH a",
    "PING",
];

/// What a client sees of COMMAND GETKEYS, LATENCY, MODULE, SLOWLOG and the slow log's settings
/// (the entries' arguments and client names, not their times).
async fn introspection(addr: SocketAddr) -> Vec<Value> {
    let mut client = Client::connect(addr).await.unwrap();
    let mut seen = Vec::new();
    for case in GETKEYS_CASES {
        let mut args = vec!["COMMAND", "GETKEYS"];
        args.extend(case.split(' '));
        seen.push(client.command(&args).await.unwrap());
    }
    let long_key = "k".repeat(200);
    let many: Vec<String> = (0..40).map(|i| format!("key{i}")).collect();
    let mut del = vec!["DEL"];
    del.extend(many.iter().map(String::as_str));
    let commands: Vec<Vec<&str>> = vec![
        // Redis's latency monitor, off; module commands with no module loaded.
        vec!["LATENCY", "LATEST"],
        vec!["LATENCY", "HISTORY", "command"],
        vec!["LATENCY", "RESET"],
        vec!["LATENCY", "GRAPH", "command"],
        vec!["LATENCY", "HISTOGRAM", "nosuchcommand"],
        vec!["LATENCY", "HISTORY"],
        vec!["LATENCY", "NOSUCH"],
        vec!["LATENCY"],
        vec!["MODULE", "LIST"],
        vec!["MODULE", "LIST", "x"],
        vec!["MODULE", "NOSUCH"],
        vec!["CONFIG", "SET", "slowlog-max-len", "x"],
        vec!["CONFIG", "SET", "slowlog-max-len", "-1"],
        vec!["CONFIG", "SET", "slowlog-max-len", "5", "slowlog-max-len", "6"],
        vec!["CONFIG", "SET", "slowlog-log-slower-than", "1.5"],
        vec!["CONFIG", "SET", "slowlog-max-len", "6", "slowlog-log-slower-than", "0"],
        // One at a time: redis-server's order of several is its hash table's.
        vec!["CONFIG", "GET", "slowlog-max-len"],
        vec!["CONFIG", "GET", "slowlog-log-slower-than"],
        vec!["SLOWLOG", "RESET"],
        vec!["CLIENT", "SETNAME", "tester"],
        vec!["SET", &long_key, "v"],
        vec!["GET", "k"],
        vec!["HSET", "h", "f", "v"],
        del,
        vec!["PING"],
        vec!["SLOWLOG", "LEN"],
        vec!["SLOWLOG", "GET", "-2"],
        vec!["SLOWLOG", "GET", "x"],
        vec!["SLOWLOG", "LEN", "1"],
        vec!["SLOWLOG", "NOSUCH"],
        vec!["SLOWLOG"],
    ];
    for command in &commands {
        seen.push(client.command(command).await.unwrap());
    }
    let Value::Array(Some(entries)) = client.command(&["SLOWLOG", "GET", "-1"]).await.unwrap() else {
        panic!("SLOWLOG GET is an array")
    };
    let mut ids = Vec::new();
    for entry in entries {
        let Value::Array(Some(fields)) = entry else {
            panic!("{entry:?}")
        };
        let [Value::Integer(id), Value::Integer(unix_secs), Value::Integer(took_us), args, Value::Bulk(Some(addr)), name] =
            &fields[..]
        else {
            panic!("{fields:?}")
        };
        assert!(*unix_secs > 1_700_000_000 && *took_us >= 0, "{fields:?}");
        assert!(String::from_utf8_lossy(addr).starts_with("127.0.0.1:"), "{fields:?}");
        ids.push(*id);
        seen.push(Value::array(vec![args.clone(), name.clone()]));
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1] + 1), "newest first: {ids:?}");
    let Value::Array(Some(two)) = client.command(&["SLOWLOG", "GET", "2"]).await.unwrap() else {
        panic!("SLOWLOG GET is an array")
    };
    seen.push(Value::Integer(two.len() as i64));
    seen
}

/// COMMAND GETKEYS finds the keys redis-server finds and fails as it does; the slow log of a
/// follower (writes forwarded to its leader) keeps what redis-server's keeps, cut and ordered
/// alike, with its settings and errors; LATENCY's monitor commands and MODULE answer as
/// redis-server's do with the monitor off and no module loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_getkeys_latency_modules_and_the_slow_log_answer_as_on_redis_server() {
    let redis_server = RedisServer::start();
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let expected = introspection(redis_server.addr).await;
    let seen = introspection(cluster.node(followers[0]).resp_addr).await;
    assert_eq!(seen.len(), expected.len(), "{seen:#?}\n{expected:#?}");
    for (at, (seen, expected)) in seen.iter().zip(&expected).enumerate() {
        assert_eq!(seen, expected, "reply {at}");
    }
}

/// LASTSAVE on any node is when the latest write was made (every write is on disk once it
/// applies); SAVE, BGSAVE and BGREWRITEAOF say there is nothing to do and where a copy comes
/// from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lastsave_is_when_the_latest_write_was_made() {
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let mut client = cluster.client(followers[0]).await;
    let unix_secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let before = unix_secs();
    client.command(&["SET", "k", "v"]).await.unwrap();
    let after = unix_secs();
    let Value::Integer(saved) = client.command(&["LASTSAVE"]).await.unwrap() else {
        panic!("LASTSAVE is a number")
    };
    assert!((before..=after).contains(&saved), "{before} <= {saved} <= {after}");
    for command in ["SAVE", "BGSAVE", "BGREWRITEAOF"] {
        let reply = client.command(&[command]).await.unwrap();
        assert!(
            matches!(&reply, Value::Error(e) if e.contains("chorus backup --to FILE")),
            "{command}: {reply:?}"
        );
    }
}

/// SHUTDOWN stops a node as SIGTERM does — what its client sent before is answered, SHUTDOWN
/// itself is not (the connection closes, as with Redis, whose clients take that for success)
/// — while the others go on; its options are checked as Redis checks them. (A read-only user
/// may not send it: `resp_users_log_in_and_a_read_only_user_cannot_write`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_node_it_is_sent_to() {
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut stopping = cluster.client(followers[0]).await;
    for (args, expected) in [
        (vec!["SHUTDOWN", "LATER"], "ERR syntax error"),
        (vec!["SHUTDOWN", "SAVE", "NOSAVE"], "ERR syntax error"),
        (vec!["SHUTDOWN", "ABORT", "NOW"], "ERR syntax error"),
        (vec!["SHUTDOWN", "ABORT"], "ERR No shutdown in progress."),
    ] {
        assert_eq!(
            stopping.command(&args).await.unwrap(),
            Value::error(expected),
            "{args:?}"
        );
    }
    let replies = stopping
        .pipeline(&[vec!["SET", "before", "1"], vec!["SHUTDOWN", "NOSAVE", "NOW"]])
        .await;
    assert!(replies.is_err(), "SHUTDOWN is not answered: {replies:?}");
    // Its process exits (`cluster status` shows no pid once it has).
    let deadline = Instant::now() + Duration::from_secs(10);
    let down = format!("node {}  down", followers[0]);
    while !run_chorus(&["cluster", "status", "--dir", cluster.dir()]).contains(&down) {
        assert!(Instant::now() < deadline, "node {} still runs", followers[0]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut leader_client = cluster.client(leader).await;
    assert_eq!(
        leader_client.command(&["GET", "before"]).await.unwrap(),
        Value::bulk("1")
    );
    cluster.restart_stopped();
    let mut restarted = cluster.client(followers[0]).await;
    assert_eq!(restarted.command(&["GET", "before"]).await.unwrap(), Value::bulk("1"));
}

/// The commands a MONITOR connection is shown while `client` sends `commands`, each line
/// without its time and client address (checked for Redis's form), up to the `PING` sent last.
async fn monitored(addr: SocketAddr, commands: &[Vec<&str>]) -> Vec<String> {
    let mut monitor = RawConnection::connect(addr);
    monitor.expect(&["MONITOR"], b"+OK\r\n");
    let mut client = Client::connect(addr).await.unwrap();
    for args in commands {
        client.command(args).await.unwrap();
    }
    client.command(&["PING"]).await.unwrap();
    let mut lines = std::io::BufReader::new(monitor.0.try_clone().unwrap());
    let mut shown = Vec::new();
    loop {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
        let line = line.strip_suffix("\r\n").expect("a whole line");
        let (time, rest) = line.strip_prefix('+').unwrap().split_once(' ').unwrap();
        let (secs, micros) = time.split_once('.').unwrap();
        assert!(
            secs.parse::<u64>().is_ok() && micros.len() == 6 && micros.parse::<u32>().is_ok(),
            "{line}"
        );
        // Redis shows a script's commands too; Chorus runs them where the log applies.
        if rest.starts_with("[0 lua] ") {
            continue;
        }
        let (client, command) = rest
            .strip_prefix("[0 127.0.0.1:")
            .and_then(|rest| rest.split_once("] "))
            .unwrap_or_else(|| panic!("{line}"));
        assert!(client.parse::<u16>().is_ok(), "{line}");
        if command == "\"PING\"" {
            return shown;
        }
        shown.push(command.to_string());
    }
}

/// MONITOR shows what a node's clients send as redis-server shows it: each command as sent,
/// quoted alike (binary bytes escaped), a transaction's commands when its EXEC comes,
/// passwords redacted, administrative and unknown commands left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_shows_commands_as_redis_server_does() {
    let redis_server = RedisServer::start();
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let commands: Vec<Vec<&str>> = vec![
        vec!["SET", "k", "a \"b\"\n\t\u{1}é"],
        vec!["get", "k"],
        vec!["MULTI"],
        vec!["INCR", "n"],
        vec!["LPUSH", "l", "x"],
        vec!["EXEC"],
        vec!["MULTI"],
        vec!["NOSUCHCOMMAND"],
        vec!["EXEC"],
        vec!["EVAL", "return redis.call('GET', KEYS[1])", "1", "k"],
        vec!["HELLO", "2", "AUTH", "default", "any"],
        vec!["CONFIG", "GET", "maxmemory"],
        vec!["CLIENT", "LIST"],
        vec!["CLIENT", "SETNAME", "watched"],
        vec!["NOSUCHCOMMAND", "x"],
        vec!["SLOWLOG", "LEN"],
        vec!["BGREWRITEAOF"],
        vec!["COMMAND", "GETKEYS", "GET", "k"],
        vec!["ECHO", ""],
    ];
    let expected = monitored(redis_server.addr, &commands).await;
    assert_eq!(expected.len(), 13, "{expected:#?}");
    assert_eq!(
        monitored(cluster.node(followers[0]).resp_addr, &commands).await,
        expected
    );
}

/// FUNCTION LIST's reply with each library's functions in name order: Redis lists them in its
/// hash table's order, which a seed drawn at start-up decides.
fn functions_in_name_order(listing: Value) -> Value {
    let Value::Array(Some(libraries)) = listing else {
        return listing;
    };
    let sorted = libraries.into_iter().map(|library| {
        let Value::Array(Some(mut fields)) = library else {
            return library;
        };
        if let Some(Value::Array(Some(functions))) = fields.get_mut(5) {
            functions.sort_by_key(|f| format!("{f:?}"));
        }
        Value::Array(Some(fields))
    });
    let mut sorted: Vec<Value> = sorted.collect();
    sorted.sort_by_key(|library| format!("{library:?}"));
    Value::Array(Some(sorted))
}

/// Redis 7's functions answer as redis-server's do — loading (and every way a library is
/// refused), FCALL and FCALL_RO, their flags, their errors, FUNCTION LIST, STATS and DELETE, a
/// transaction that loads and calls, and commands a script may not call — on a follower, whose
/// writes go through the log; another node calls them too; FUNCTION DUMP payloads move
/// libraries between redis-server and Chorus both ways; and the libraries survive a restart of
/// every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_answer_as_on_redis_server_on_every_node_and_survive_restarts() {
    let redis_server = RedisServer::start();
    let mut redis = Client::connect(redis_server.addr).await.unwrap();
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let mut chorus = cluster.client(followers[0]).await;
    let lib = |name: &str, body: &str| format!("#!lua name={name}\n{body}");
    let calls = lib(
        "calls",
        "local suffix = '!'\n\
         redis.register_function('set_and_get', function(keys, args)\n\
           redis.call('set', keys[1], args[1] .. suffix)\n\
           return redis.call('get', keys[1])\n\
         end)\n\
         redis.register_function{function_name='reader', callback=function(keys, args)\n\
           return {redis.call('get', keys[1]), #args, string.rep('a', 2)} end,\n\
           flags={'no-writes', 'allow-stale'}, description='reads a key'}\n\
         redis.register_function('fails', function(keys, args) return redis.call('incr', keys[1]) end)\n\
         redis.register_function('writes_a_global', function() x = 1 end)\n\
         redis.register_function('pcall_bad_arg', function() return redis.pcall('get', nil) end)\n\
         redis.register_function('call_bad_arg', function() return redis.call('get', nil) end)\n\
         redis.register_function('calls_fcall', function() return redis.call('fcall', 'reader', 0) end)\n\
         redis.register_function('calls_blpop', function() return redis.call('blpop', 'l', 0) end)\n\
         redis.register_function('calls_function', function() return redis.call('function', 'stats') end)",
    );
    let cases: Vec<Vec<String>> = [
        vec!["FUNCTION", "LOAD", &calls],
        vec!["FUNCTION", "LOAD", &calls],
        vec!["FCALL", "set_and_get", "1", "k", "v"],
        vec!["FCALL_RO", "set_and_get", "1", "k", "v"],
        vec!["FCALL_RO", "reader", "1", "k", "a", "b"],
        vec!["FCALL", "reader", "1", "k"],
        vec!["FCALL", "fails", "1", "k"],
        vec!["FCALL", "writes_a_global", "0"],
        vec!["FCALL", "pcall_bad_arg", "0"],
        vec!["FCALL", "call_bad_arg", "0"],
        vec!["FCALL", "calls_fcall", "0"],
        vec!["FCALL", "calls_blpop", "0"],
        vec!["FCALL", "calls_function", "0"],
        vec!["FCALL", "nosuch", "x"],
        vec!["FCALL", "reader", "x"],
        vec!["FCALL", "reader", "-1"],
        vec!["FCALL", "reader", "2", "k"],
        vec!["EVAL", "return redis.call('eval_ro', 'return 1', 0)", "0"],
        vec!["EVAL", "return redis.call('get', nil)", "0"],
        vec!["FUNCTION", "LOAD", "return 1"],
        vec!["FUNCTION", "LOAD", "#!lua name=a-b\n"],
        vec!["FUNCTION", "LOAD", "#!js name=js\n"],
        vec!["FUNCTION", "LOAD", "#!lua name=x name=y\n"],
        vec![
            "FUNCTION",
            "LOAD",
            "#!lua name=\"quoted\"\nredis.register_function('q', function() return 1 end)",
        ],
        vec!["FUNCTION", "LOAD", &lib("nothing", "return 1")],
        vec!["FUNCTION", "LOAD", &lib("syntax", "this is not lua")],
        vec!["FUNCTION", "LOAD", &lib("calls_at_load", "redis.call('set', 'a', 'b')")],
        vec!["FUNCTION", "LOAD", &lib("no_string", "local s = string.rep('a', 2)")],
        vec!["FUNCTION", "LOAD", &lib("global", "x = 1")],
        vec!["FUNCTION", "LOAD", &lib("arity", "redis.register_function()")],
        vec!["FUNCTION", "LOAD", &lib("one_arg", "redis.register_function('f')")],
        vec![
            "FUNCTION",
            "LOAD",
            &lib("bad_name", "redis.register_function('a-b', function() end)"),
        ],
        vec![
            "FUNCTION",
            "LOAD",
            &lib(
                "twice",
                "redis.register_function('t', function() end)\nredis.register_function('t', function() end)",
            ),
        ],
        vec![
            "FUNCTION",
            "LOAD",
            &lib(
                "bad_flag",
                "redis.register_function{function_name='b', callback=function() end, flags={'nope'}}",
            ),
        ],
        vec![
            "FUNCTION",
            "LOAD",
            &lib("no_callback", "redis.register_function{function_name='b'}"),
        ],
        vec![
            "FUNCTION",
            "LOAD",
            &lib("taken", "redis.register_function('reader', function() end)"),
        ],
        vec![
            "FUNCTION",
            "LOAD",
            "REPLACE",
            &lib("other", "redis.register_function('other', function() return 2 end)"),
        ],
        vec!["FUNCTION", "LOAD", "NOPE", "x"],
        vec!["FUNCTION", "LIST", "LIBRARYNAME"],
        vec!["FUNCTION", "LIST", "WITHCODE", "WITHCODE"],
        vec!["FUNCTION", "STATS"],
        vec!["MULTI"],
        vec![
            "FUNCTION",
            "LOAD",
            &lib(
                "in_multi",
                "redis.register_function('in_multi', function() return 'yes' end)",
            ),
        ],
        vec!["FCALL", "in_multi", "0"],
        vec!["EXEC"],
        vec!["FUNCTION", "DELETE", "nosuch"],
        vec!["FUNCTION", "DELETE", "in_multi"],
        vec!["FCALL", "in_multi", "0"],
        vec!["FUNCTION", "FLUSH", "LAZY"],
        vec!["FUNCTION", "RESTORE", "not a payload"],
        vec!["FUNCTION", "KILL"],
        vec!["FUNCTION", "NOPE"],
    ]
    .iter()
    .map(|case| case.iter().map(|a| a.to_string()).collect())
    .collect();
    for args in &cases {
        let expected = redis.command(args).await.unwrap();
        assert_eq!(chorus.command(args).await.unwrap(), expected, "{args:?}");
    }
    let listing = ["FUNCTION", "LIST", "WITHCODE"];
    let expected = functions_in_name_order(redis.command(&listing).await.unwrap());
    assert_eq!(
        functions_in_name_order(chorus.command(&listing).await.unwrap()),
        expected
    );

    // Another node calls the same functions and reads what they wrote.
    let mut other = cluster.client(followers[1]).await;
    let read = ["FCALL_RO", "reader", "1", "k"];
    assert_eq!(other.command(&read).await.unwrap(), redis.command(&read).await.unwrap());

    // Libraries move between redis-server and Chorus in FUNCTION DUMP's payloads, both ways.
    let Value::Bulk(Some(from_redis)) = redis.command(&["FUNCTION", "DUMP"]).await.unwrap() else {
        panic!("redis-server dumps its functions")
    };
    let restore = |payload: &[u8], policy: &str| {
        vec![
            b"FUNCTION".to_vec(),
            b"RESTORE".to_vec(),
            payload.to_vec(),
            policy.as_bytes().to_vec(),
        ]
    };
    // Every library in it is taken; which one the error names depends on the payload's order.
    let taken = chorus.command(&restore(&from_redis, "APPEND")).await.unwrap();
    assert!(
        matches!(&taken, Value::Error(e) if e.starts_with("ERR Library ") && e.ends_with(" already exists")),
        "{taken:?}"
    );
    assert_eq!(
        chorus.command(&restore(&from_redis, "FLUSH")).await.unwrap(),
        Value::ok()
    );
    assert_eq!(
        functions_in_name_order(chorus.command(&listing).await.unwrap()),
        expected
    );
    let Value::Bulk(Some(from_chorus)) = chorus.command(&["FUNCTION", "DUMP"]).await.unwrap() else {
        panic!("Chorus dumps its functions")
    };
    redis.command(&["FUNCTION", "FLUSH"]).await.unwrap();
    assert_eq!(
        redis.command(&restore(&from_chorus, "REPLACE")).await.unwrap(),
        Value::ok()
    );
    assert_eq!(
        functions_in_name_order(redis.command(&listing).await.unwrap()),
        expected
    );

    // Every node restarts and still holds the libraries.
    for id in 1..=3 {
        cluster.kill(id);
    }
    cluster.restart_stopped();
    let (leader, _) = cluster.leader_and_followers().await;
    let mut chorus = cluster.client(leader).await;
    assert_eq!(
        functions_in_name_order(chorus.command(&listing).await.unwrap()),
        expected
    );
    let call = ["FCALL", "set_and_get", "1", "k2", "w"];
    assert_eq!(
        chorus.command(&call).await.unwrap(),
        redis.command(&call).await.unwrap()
    );
}

/// DUMP payloads move values between redis-server and Chorus, both ways: Redis's compact
/// encodings (listpacks, quicklists, intsets, integer and LZF strings) restore into Chorus, and
/// Chorus's payloads restore into Redis, every value intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_payloads_move_values_between_redis_server_and_chorus() {
    let redis_server = RedisServer::start();
    let mut redis = Client::connect(redis_server.addr).await.unwrap();
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let mut chorus = cluster.client(followers[0]).await;
    let long = "x".repeat(5000);
    let many: Vec<String> = (0..300).map(|i| format!("e{i}")).collect();
    let numbers: Vec<String> = (0..600).map(|i| i.to_string()).collect();
    let mut setup: Vec<Vec<&str>> = vec![
        vec!["SET", "string", "hello"],
        vec!["SET", "integer", "-32768"],
        vec!["SET", "compressible", &long],
        vec!["RPUSH", "list", "a", "1", "70000", "9999999999"],
        vec!["SADD", "intset", "1", "-5", "5000000000"],
        vec!["SADD", "set", "a", "b"],
        vec!["ZADD", "zset", "1", "a", "2.5", "b", "-inf", "c"],
        vec!["HSET", "hash", "f", "v", "n", "1"],
    ];
    setup.push(
        [
            &["RPUSH", "long-list"][..],
            &many.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    );
    setup.push(
        [
            &["SADD", "big-intset"][..],
            &numbers.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    );
    for args in &setup {
        redis.command(args).await.unwrap();
        chorus.command(args).await.unwrap();
    }
    let read = |key: &str, kind: &str| -> Vec<String> {
        match kind {
            "string" => vec!["GET".into(), key.into()],
            "list" => vec!["LRANGE".into(), key.into(), "0".into(), "-1".into()],
            "set" => vec!["SORT".into(), key.into(), "ALPHA".into()],
            "zset" => vec![
                "ZRANGE".into(),
                key.into(),
                "0".into(),
                "-1".into(),
                "WITHSCORES".into(),
            ],
            _ => vec!["HMGET".into(), key.into(), "f".into(), "n".into()],
        }
    };
    for args in &setup {
        let key = args[1];
        let kind = match args[0] {
            "SET" => "string",
            "RPUSH" => "list",
            "SADD" => "set",
            "ZADD" => "zset",
            _ => "hash",
        };
        let Value::Bulk(Some(from_redis)) = redis.command(&["DUMP", key]).await.unwrap() else {
            panic!("redis-server dumps {key}")
        };
        let Value::Bulk(Some(from_chorus)) = chorus.command(&["DUMP", key]).await.unwrap() else {
            panic!("Chorus dumps {key}")
        };
        let copy = format!("{key}-copy");
        let restore = |payload: &[u8]| {
            vec![
                b"RESTORE".to_vec(),
                copy.clone().into_bytes(),
                b"0".to_vec(),
                payload.to_vec(),
            ]
        };
        assert_eq!(
            chorus.command(&restore(&from_redis)).await.unwrap(),
            Value::ok(),
            "{key} into Chorus"
        );
        assert_eq!(
            redis.command(&restore(&from_chorus)).await.unwrap(),
            Value::ok(),
            "{key} into Redis"
        );
        let original = redis.command(&read(key, kind)).await.unwrap();
        assert_eq!(
            chorus.command(&read(&copy, kind)).await.unwrap(),
            original,
            "{key} from Redis in Chorus"
        );
        assert_eq!(
            redis.command(&read(&copy, kind)).await.unwrap(),
            original,
            "{key} from Chorus in Redis"
        );
    }
    let Value::Bulk(Some(payload)) = redis.command(&["DUMP", "string"]).await.unwrap() else {
        panic!("redis-server dumps a string")
    };
    let mut damaged = payload.to_vec();
    damaged[1] ^= 1;
    let args = [&b"RESTORE"[..], b"damaged", b"0", &damaged];
    assert_eq!(
        chorus.command(&args).await.unwrap(),
        redis.command(&args).await.unwrap(),
        "a damaged payload is refused alike"
    );
}

/// Differential: Chorus answers random commands as redis-server does, errors included — through a follower, then through another node after the leader was killed (the
/// same keys, so the state must have survived the leader change intact).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_commands_get_the_replies_redis_server_gives_across_a_leader_change() {
    let redis_server = RedisServer::start();
    let mut redis = Client::connect(redis_server.addr).await.unwrap();
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut chorus = cluster.client(followers[0]).await;
    replies_match_redis(&mut redis, &mut chorus, 1, 6000, "diff:", ALL_CASES).await;
    replies_match_redis(&mut redis, &mut chorus, 3, 4000, "streams:", STREAM_CASES).await;
    cluster.kill(leader);
    cluster.wait_for_leader(&followers, Duration::from_secs(10)).await;
    let mut chorus = cluster.client(followers[1]).await;
    replies_match_redis(&mut redis, &mut chorus, 2, 6000, "diff:", ALL_CASES).await;
    replies_match_redis(&mut redis, &mut chorus, 4, 3000, "streams:", STREAM_CASES).await;
}

/// Differential: with `notify-keyspace-events KEA` set (through the log, on one node), a
/// subscriber on another node gets the keyspace events redis-server sends for the same random
/// commands, in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_events_are_the_ones_redis_server_sends() {
    let redis_server = RedisServer::start();
    let mut redis = Client::connect(redis_server.addr).await.unwrap();
    let cluster = Cluster::start(3, &[]);
    let (_, followers) = cluster.leader_and_followers().await;
    let mut chorus = cluster.client(followers[0]).await;
    for c in [&mut redis, &mut chorus] {
        let set = ["CONFIG", "SET", "notify-keyspace-events", "KEA"];
        assert_eq!(c.command(&set).await.unwrap(), ok());
    }
    let mut redis_events = Client::connect(redis_server.addr).await.unwrap();
    let mut chorus_events = cluster.client(followers[1]).await;
    let config = chorus_events
        .command(&["CONFIG", "GET", "notify-keyspace-events"])
        .await
        .unwrap();
    assert_eq!(config, Value::array(vec![bulk("notify-keyspace-events"), bulk("AKE")]));
    for c in [&mut redis_events, &mut chorus_events] {
        c.command(&["PSUBSCRIBE", "__key*__:*"]).await.unwrap();
    }
    replies_match_redis(&mut redis, &mut chorus, 5, 6000, "ev:", ALL_CASES).await;
    replies_match_redis(&mut redis, &mut chorus, 6, 3000, "evs:", STREAM_CASES).await;
    for c in [&mut redis, &mut chorus] {
        c.command(&["SET", "ev:done", "1"]).await.unwrap();
    }
    let redis_seen = events_until_done(&mut redis_events).await;
    let chorus_seen = events_until_done(&mut chorus_events).await;
    assert!(redis_seen.len() > 300, "only {} events", redis_seen.len());
    for (n, (want, got)) in redis_seen.iter().zip(&chorus_seen).enumerate() {
        assert_eq!(
            got,
            want,
            "event {n}; redis-server's before it: {:?}",
            &redis_seen[n.saturating_sub(6)..n]
        );
    }
    assert_eq!(chorus_seen.len(), redis_seen.len());
}

/// The (channel, message) pairs a PSUBSCRIBEd client gets, up to the `set` of `ev:done`.
async fn events_until_done(c: &mut Client) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    loop {
        let Value::Array(Some(frame)) = c.receive().await.unwrap() else {
            panic!("not a pmessage")
        };
        let text = |v: &Value| match v {
            Value::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("{other:?}"),
        };
        let event = (text(&frame[2]), text(&frame[3]));
        if event == ("__keyevent@0__:set".to_string(), "ev:done".to_string()) {
            return seen;
        }
        seen.push(event);
    }
}

/// MULTI/EXEC/WATCH answer as redis-server does, step for step: queued commands, errors that
/// discard the transaction and errors that are one command's reply, EXEC's array, and WATCH
/// aborting a transaction when another client changed a watched key (here through another
/// node) and not when the key was left alone or unwatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_answer_as_redis_server_does() {
    let redis_server = RedisServer::start();
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    // Each step: which connection (0 watches and transacts, 1 is the other client) and what.
    let steps: &[(usize, &[&str])] = &[
        (0, &["MULTI"]),
        (0, &["SET", "a", "1"]),
        (0, &["INCR", "a"]),
        (0, &["GET", "a"]),
        (0, &["EXEC"]),
        (0, &["MULTI"]),
        (0, &["SET", "a"]),
        (0, &["INCR", "a"]),
        (0, &["EXEC"]),
        (0, &["MULTI"]),
        (0, &["SET", "a", "1", "XX", "NX"]),
        (0, &["INCR", "a"]),
        (0, &["LPUSH", "a", "x"]),
        (0, &["EXEC"]),
        (0, &["EXEC"]),
        (0, &["DISCARD"]),
        (0, &["MULTI"]),
        (0, &["MULTI"]),
        (0, &["WATCH", "a"]),
        (0, &["NOSUCHCOMMAND", "x"]),
        (0, &["EXEC"]),
        (0, &["MULTI"]),
        (0, &["INCR", "a"]),
        (0, &["DISCARD"]),
        (0, &["GET", "a"]),
        (0, &["WATCH", "a", "b"]),
        (1, &["SET", "a", "5"]),
        (0, &["MULTI"]),
        (0, &["INCR", "a"]),
        (0, &["EXEC"]),
        (0, &["WATCH", "a"]),
        (0, &["MULTI"]),
        (0, &["INCR", "a"]),
        (0, &["EXEC"]),
        (0, &["WATCH", "a"]),
        (0, &["UNWATCH"]),
        (1, &["SET", "a", "9"]),
        (0, &["MULTI"]),
        (0, &["GET", "a"]),
        (0, &["EXEC"]),
        (0, &["WATCH", "b"]),
        (1, &["EXPIRE", "a", "100"]),
        (0, &["MULTI"]),
        (0, &["LPUSH", "l", "x"]),
        (0, &["BLPOP", "l", "0"]),
        (0, &["BLPOP", "l", "0"]),
        (0, &["ZADD", "z", "1.5", "m"]),
        (0, &["ZSCORE", "z", "m"]),
        (0, &["EXEC"]),
        (0, &["MULTI"]),
        (0, &["EXEC"]),
    ];
    let mut redis = [
        Client::connect(redis_server.addr).await.unwrap(),
        Client::connect(redis_server.addr).await.unwrap(),
    ];
    let mut chorus = [cluster.client(followers[0]).await, cluster.client(leader).await];
    for (i, (connection, args)) in steps.iter().enumerate() {
        let expected = redis[*connection].command(args).await.unwrap();
        let got = chorus[*connection].command(args).await.unwrap();
        assert_eq!(got, expected, "step {i}: {args:?}");
    }
    // What Chorus does not run inside a transaction, it refuses there, discarding it.
    let c = &mut chorus[0];
    assert_eq!(c.command(&["MULTI"]).await.unwrap(), ok());
    let refused = c.command(&["PING"]).await.unwrap();
    assert!(
        matches!(&refused, Value::Error(e) if e.contains("only data commands")),
        "{refused:?}"
    );
    assert_eq!(
        c.command(&["EXEC"]).await.unwrap(),
        Value::error("EXECABORT Transaction discarded because of previous errors.")
    );
}

/// Lua scripts answer as redis-server runs them — results converted by Redis's rules, errors
/// worded alike (from commands, from Lua, from compiling, from the sandbox) — and a script's
/// writes reach every node: EVALSHA finds a script loaded through another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_answer_as_redis_server_does_and_replicate() {
    let redis_server = RedisServer::start();
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut redis = Client::connect(redis_server.addr).await.unwrap();
    let mut chorus = cluster.client(followers[0]).await;
    let load = "return redis.call('INCRBY', KEYS[1], ARGV[1])";
    let steps: &[&[&str]] = &[
        &["SET", "s", "text"],
        &["EVAL", "return {1, 'two', {3.7, false}, nil, 5}", "0"],
        &["EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", "k", "v"],
        &["EVAL", "return redis.call('GET', KEYS[1])", "1", "k"],
        &["EVAL", "return redis.call('HGET', 's', 'f')", "0"],
        &["EVAL", "return redis.pcall('HGET', 's', 'f')", "0"],
        &["EVAL", "return redis.call('NOSUCH')", "0"],
        &["EVAL", "return 1 +", "0"],
        &["EVAL", "return 1 + nil", "0"],
        &["EVAL", "x = 1", "0"],
        &["EVAL", "return undefined_global", "0"],
        &["EVAL", "return redis.error_reply('MY error')", "0"],
        &["EVAL", "return redis.status_reply('FINE')", "0"],
        &[
            "EVAL",
            "return redis.call('ZADD', 'z', 1.5, 'm') + #redis.call('ZRANGE', 'z', 0, -1)",
            "0",
        ],
        &["EVAL", "return redis.sha1hex('')", "0"],
        &["EVAL", "return ARGV", "0", "a", "b"],
        &["EVAL", "return 1", "2", "only-one-key"],
        &["EVAL", "return 1", "-1"],
        &["EVALSHA", "0000000000000000000000000000000000000000", "0"],
        &["SCRIPT", "LOAD", load],
        &[
            "EVALSHA",
            "8cd00688c05c46bde4a2e60658ef20a2e5c0b248",
            "1",
            "counter",
            "5",
        ],
        &["SCRIPT", "EXISTS", "0000000000000000000000000000000000000000"],
        &["EVAL_RO", "return redis.call('SET', 'k', 'w')", "0"],
        &["EVAL_RO", "return redis.call('GET', 'k')", "0"],
        &["SCRIPT", "FLUSH"],
        &["SCRIPT", "KILL"],
    ];
    for (i, args) in steps.iter().enumerate() {
        let expected = redis.command(args).await.unwrap();
        let got = chorus.command(args).await.unwrap();
        assert_eq!(got, expected, "step {i}: {args:?}");
    }
    // Loaded through one node, run through another; the writes are everyone's.
    let sha = match chorus.command(&["SCRIPT", "LOAD", load]).await.unwrap() {
        Value::Bulk(Some(sha)) => String::from_utf8(sha.to_vec()).unwrap(),
        other => panic!("{other:?}"),
    };
    let mut other = cluster.client(leader).await;
    assert_eq!(
        other.command(&["EVALSHA", &sha, "1", "counter", "7"]).await.unwrap(),
        Value::Integer(12),
        "5 from the steps, then 7"
    );
    let mut last = cluster.client(followers[1]).await;
    assert_eq!(
        last.command(&["SCRIPT", "EXISTS", &sha]).await.unwrap(),
        Value::array(vec![Value::Integer(1)])
    );
    assert_eq!(last.command(&["GET", "counter"]).await.unwrap(), bulk("12"));
}

/// PUBLISH through any node reaches the subscribers on every node, and every subscriber of a
/// channel gets its messages in one order — the log's — though two publishers on two nodes
/// interleave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_messages_reach_subscribers_on_every_node_in_one_order() {
    const PER_PUBLISHER: usize = 100;
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut subscribers = Vec::new();
    for id in [leader, followers[0], followers[1]] {
        let mut c = cluster.client(id).await;
        assert_eq!(
            c.command(&["SUBSCRIBE", "events"]).await.unwrap(),
            Value::array(vec![bulk("subscribe"), bulk("events"), Value::Integer(1)])
        );
        subscribers.push(c);
    }
    let publish = |id: u64, tag: &'static str| {
        let cluster = &cluster;
        async move {
            let mut c = cluster.client(id).await;
            for i in 0..PER_PUBLISHER {
                let reply = c.command(&["PUBLISH", "events", &format!("{tag}{i}")]).await.unwrap();
                assert!(matches!(reply, Value::Integer(n) if (0..=3).contains(&n)), "{reply:?}");
            }
        }
    };
    tokio::join!(publish(followers[0], "a"), publish(followers[1], "b"));
    let mut orders = Vec::new();
    for mut subscriber in subscribers {
        let mut received = Vec::new();
        while received.len() < 2 * PER_PUBLISHER {
            match subscriber.receive().await.unwrap() {
                Value::Array(Some(frame)) if frame.len() == 3 && frame[0] == bulk("message") => {
                    let Value::Bulk(Some(payload)) = &frame[2] else {
                        panic!("{frame:?}")
                    };
                    received.push(String::from_utf8(payload.to_vec()).unwrap());
                }
                other => panic!("not a message: {other:?}"),
            }
        }
        orders.push(received);
    }
    assert_eq!(orders[0], orders[1], "two subscribers saw two orders");
    assert_eq!(orders[0], orders[2], "two subscribers saw two orders");
    for tag in ["a", "b"] {
        let own: Vec<&String> = orders[0].iter().filter(|m| m.starts_with(tag)).collect();
        let expected: Vec<String> = (0..PER_PUBLISHER).map(|i| format!("{tag}{i}")).collect();
        assert_eq!(
            own,
            expected.iter().collect::<Vec<_>>(),
            "a publisher's messages out of its order"
        );
    }
}

/// A queue's consumer blocks on one node (BLPOP, BLMOVE, BZPOPMIN, XREAD, XREADGROUP) until a producer
/// pushes on another;
/// each element goes to exactly one of two blocked consumers; a timeout answers nil.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_consumers_get_each_pushed_element_once_or_time_out() {
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut consumers = Vec::new();
    for id in [followers[0], followers[1]] {
        let mut c = cluster.client(id).await;
        consumers.push(tokio::spawn(async move {
            c.command(&["BLPOP", "jobs", "other", "10"]).await.unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut producer = cluster.client(leader).await;
    assert_eq!(
        producer.command(&["RPUSH", "jobs", "job1", "job2"]).await.unwrap(),
        Value::Integer(2)
    );
    let mut got = Vec::new();
    for consumer in consumers {
        match consumer.await.unwrap() {
            Value::Array(Some(pair)) => {
                assert_eq!(pair[0], bulk("jobs"));
                got.push(pair[1].clone());
            }
            other => panic!("{other:?}"),
        }
    }
    got.sort_by_key(|v| format!("{v:?}"));
    assert_eq!(got, vec![bulk("job1"), bulk("job2")], "each job to one consumer");
    assert_eq!(producer.command(&["LLEN", "jobs"]).await.unwrap(), Value::Integer(0));

    let mut c = cluster.client(followers[0]).await;
    let started = Instant::now();
    assert_eq!(c.command(&["BLPOP", "jobs", "0.2"]).await.unwrap(), Value::Array(None));
    assert!(started.elapsed() >= Duration::from_millis(200));
    let mover = tokio::spawn(async move {
        c.command(&["BLMOVE", "jobs", "done", "LEFT", "RIGHT", "10"])
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    producer.command(&["LPUSH", "jobs", "job3"]).await.unwrap();
    assert_eq!(mover.await.unwrap(), bulk("job3"));
    assert_eq!(
        producer.command(&["LRANGE", "done", "0", "-1"]).await.unwrap(),
        Value::array(vec![bulk("job3")])
    );
    assert_eq!(
        producer.command(&["BLPOP", "jobs", "-1"]).await.unwrap(),
        Value::error("ERR timeout is negative")
    );

    // Sorted sets block the same way: the lowest score first, with its key and score.
    let mut c = cluster.client(followers[0]).await;
    let popper = tokio::spawn(async move { c.command(&["BZPOPMIN", "none", "tasks", "10"]).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    producer
        .command(&["ZADD", "tasks", "2", "later", "1", "sooner"])
        .await
        .unwrap();
    assert_eq!(
        popper.await.unwrap(),
        Value::array(vec![bulk("tasks"), bulk("sooner"), bulk("1")])
    );
    assert_eq!(
        producer
            .command(&["BZMPOP", "1", "2", "none", "tasks", "MAX"])
            .await
            .unwrap(),
        Value::array(vec![
            bulk("tasks"),
            Value::array(vec![Value::array(vec![bulk("later"), bulk("2")])])
        ])
    );

    // Streams block on `$` (entries newer than the stream's last when the reader arrived) and
    // wake on an XADD made through another node.
    producer.command(&["XADD", "events", "1-1", "old", "x"]).await.unwrap();
    let mut c = cluster.client(followers[1]).await;
    let reader = tokio::spawn(async move {
        c.command(&["XREAD", "COUNT", "5", "BLOCK", "10000", "STREAMS", "events", "$"])
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        producer.command(&["XADD", "events", "2-1", "new", "y"]).await.unwrap(),
        bulk("2-1")
    );
    let entry = Value::array(vec![bulk("2-1"), Value::array(vec![bulk("new"), bulk("y")])]);
    assert_eq!(
        reader.await.unwrap(),
        Value::array(vec![Value::array(vec![bulk("events"), Value::array(vec![entry])])])
    );
    let mut c = cluster.client(followers[0]).await;
    let started = Instant::now();
    assert_eq!(
        c.command(&["XREAD", "BLOCK", "200", "STREAMS", "events", "2-1"])
            .await
            .unwrap(),
        Value::Array(None)
    );
    assert!(started.elapsed() >= Duration::from_millis(200));

    // A consumer group: two consumers blocked on two nodes each get one of two new entries,
    // which stay pending until acknowledged.
    let create = ["XGROUP", "CREATE", "events", "workers", "$"];
    assert_eq!(producer.command(&create).await.unwrap(), ok());
    let mut readers = Vec::new();
    for (id, name) in [(followers[0], "alice"), (followers[1], "bob")] {
        let mut c = cluster.client(id).await;
        readers.push(tokio::spawn(async move {
            let read = [
                "XREADGROUP",
                "GROUP",
                "workers",
                name,
                "COUNT",
                "1",
                "BLOCK",
                "10000",
                "STREAMS",
                "events",
                ">",
            ];
            c.command(&read).await.unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in ["3-1", "4-1"] {
        producer.command(&["XADD", "events", id, "job", id]).await.unwrap();
    }
    let mut delivered = Vec::new();
    for reader in readers {
        match reader.await.unwrap() {
            Value::Array(Some(streams)) => match &streams[..] {
                [Value::Array(Some(stream))] if stream[0] == bulk("events") => delivered.push(stream[1].clone()),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
    delivered.sort_by_key(|v| format!("{v:?}"));
    let entry = |id: &str| Value::array(vec![bulk(id), Value::array(vec![bulk("job"), bulk(id)])]);
    assert_eq!(
        delivered,
        vec![Value::array(vec![entry("3-1")]), Value::array(vec![entry("4-1")])],
        "each entry to one consumer"
    );
    let pending = producer.command(&["XPENDING", "events", "workers"]).await.unwrap();
    assert!(
        matches!(&pending, Value::Array(Some(summary)) if summary[0] == Value::Integer(2)),
        "{pending:?}"
    );
    assert_eq!(
        producer
            .command(&["XACK", "events", "workers", "3-1", "4-1"])
            .await
            .unwrap(),
        Value::Integer(2)
    );
    let mut c = cluster.client(followers[0]).await;
    let read = [
        "XREADGROUP",
        "GROUP",
        "workers",
        "alice",
        "BLOCK",
        "200",
        "STREAMS",
        "events",
        ">",
    ];
    assert_eq!(c.command(&read).await.unwrap(), Value::Array(None));
    let read = [
        "XREADGROUP",
        "GROUP",
        "nobody",
        "alice",
        "BLOCK",
        "0",
        "STREAMS",
        "events",
        ">",
    ];
    assert_eq!(
        c.command(&read).await.unwrap(),
        Value::error("NOGROUP No such key 'events' or consumer group 'nobody' in XREADGROUP with GROUP option")
    );
}

/// The distributed-lock idiom across a leader change: a lock taken with `SET NX PX` on one node
/// cannot be taken on another before its deadline, though the leader that timed it died, and can
/// be soon after; the leader's sweep then deletes expired keys on every node. All nodes share
/// this machine's clock, so the clock bound of `docs/reliability.md` is zero here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_with_nx_px_is_not_taken_twice_nor_held_long_past_its_ttl_across_a_leader_change() {
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut alice = cluster.client(followers[0]).await;
    let mut bob = cluster.client(followers[1]).await;
    for n in 0..20 {
        let key = format!("session{n}");
        assert_eq!(alice.command(&["SET", &key, "x", "PX", "300"]).await.unwrap(), ok());
    }
    let ttl_ms = 2_000u128;
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let sent_ms = now_ms();
    assert_eq!(
        alice
            .command(&["SET", "lock:x", "alice", "NX", "PX", "2000"])
            .await
            .unwrap(),
        ok()
    );
    let answered_ms = now_ms();
    cluster.kill(leader);
    // Bob's attempts go to the new leader: one sent into the election could have an unknown
    // outcome, and then when it took the lock would be unknown too.
    cluster.wait_for_leader(&followers, Duration::from_secs(10)).await;
    let taken_ms = loop {
        let reply = bob
            .command(&["SET", "lock:x", "bob", "NX", "PX", "2000"])
            .await
            .unwrap();
        if reply == ok() {
            break now_ms();
        }
        assert_eq!(reply, Value::null(), "while alice holds the lock");
        // Alice's, or gone if it expired since bob asked.
        let holder = bob.command(&["GET", "lock:x"]).await.unwrap();
        assert!(holder == bulk("alice") || holder == Value::null(), "{holder:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        taken_ms >= sent_ms + ttl_ms,
        "bob took the lock {} ms after alice asked for it, within its {ttl_ms} ms",
        taken_ms - sent_ms
    );
    // Generous: a poll, a commit and this machine's hiccups, not an election (done by then).
    assert!(
        taken_ms <= answered_ms + ttl_ms + 1_500,
        "the lock outlived its TTL by {} ms",
        taken_ms - answered_ms - ttl_ms
    );
    assert_eq!(alice.command(&["GET", "lock:x"]).await.unwrap(), bulk("bob"));
    // The expired sessions are deleted through the log, on every node.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for id in &followers {
        let mut c = cluster.client(*id).await;
        while c.command(&["DBSIZE"]).await.unwrap() != Value::Integer(1) {
            assert!(
                std::time::Instant::now() < deadline,
                "expired keys still counted on node {id}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// With values read past the page cache (`--value-direct-io`) and a cache far smaller than the
/// data, GETs read the device off the raft loop while writes to the same keys keep landing: every
/// GET, on the leader and on followers, returns at least the value acknowledged before it was
/// sent, and never a value older than one it or an earlier GET of the same client saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_reading_the_device_off_the_loop_stay_linearizable_under_racing_writes() {
    gets_stay_linearizable_under_racing_writes(SILOED).await;
}

/// The same with LDC: a miss of a key another node owns is fetched from the owner's cache while
/// writes race it; a fetched value is used only at the version the asker's index holds. (Owners
/// only: the cost-benefit admission could find fetching slower than this machine's device and
/// stop asking.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldc_remote_hits_stay_linearizable_under_racing_writes() {
    let cluster = gets_stay_linearizable_under_racing_writes(LDC_OWNERS_ONLY).await;
    let remote_hits = metric_sum_over(&cluster, &[1, 2, 3], "chorus_ldc_remote_hits_total");
    assert!(remote_hits > 1_000.0, "only {remote_hits} remote hits");
}

async fn gets_stay_linearizable_under_racing_writes(cache_flags: &[&str]) -> Cluster {
    use std::sync::{Arc, Mutex};
    const KEYS: u64 = 2_000;
    let cluster = device_read_cluster(cache_flags);
    let mut loader = cluster.client(1).await;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(200) {
        let mut args = vec!["MSET".to_string()];
        for k in chunk {
            args.extend([format!("dio:{k}"), format!("{:0>100}", 0)]);
        }
        assert_eq!(loader.command(&args).await.unwrap(), ok());
    }
    // The last value acknowledged for each key (values only grow).
    let acked: Arc<Mutex<HashMap<u64, u64>>> = Arc::new(Mutex::new(HashMap::new()));
    let writer = {
        let acked = acked.clone();
        let mut c = cluster.client(1).await;
        tokio::spawn(async move {
            for n in 1..=3_000u64 {
                let k = (n * 7_919) % KEYS;
                let reply = c.command(&["SET", &format!("dio:{k}"), &format!("{n:0>100}")]).await;
                assert_eq!(reply.unwrap(), ok());
                acked.lock().unwrap().insert(k, n);
            }
        })
    };
    let mut readers = Vec::new();
    for (r, id) in [1u64, 2, 3, 1, 2, 3].into_iter().enumerate() {
        let acked = acked.clone();
        let mut c = cluster.client(id).await;
        readers.push(tokio::spawn(async move {
            let mut seen: HashMap<u64, u64> = HashMap::new();
            let mut x = r as u64 + 1;
            let mut gets = 0;
            while gets < 3_000 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let k = (x >> 33) % KEYS;
                let floor = acked.lock().unwrap().get(&k).copied().unwrap_or(0);
                let Value::Bulk(Some(value)) = c.command(&["GET", &format!("dio:{k}")]).await.unwrap() else {
                    panic!("dio:{k} has no value");
                };
                let got: u64 = String::from_utf8_lossy(&value).parse().unwrap();
                assert!(
                    got >= floor,
                    "GET dio:{k} on node {id} gave {got}, after {floor} was acknowledged"
                );
                let before = seen.insert(k, got).unwrap_or(0);
                assert!(
                    got >= before,
                    "GET dio:{k} on node {id} went back from {before} to {got}"
                );
                gets += 1;
            }
        }));
    }
    writer.await.unwrap();
    for reader in readers {
        reader.await.unwrap();
    }
    // The reads did go to the device: the caches hold a sliver of the keys.
    let misses = metric_sum_over(&cluster, &[1, 2, 3], "chorus_storage_cache_misses_total");
    assert!(misses > 5_000.0, "only {misses} cache misses");
    cluster
}

const SILOED: &[&str] = &["--cache-mode", "siloed"];
const LDC_OWNERS_ONLY: &[&str] = &["--cache-mode", "ldc", "--ldc-admission", "owners"];

/// Three nodes whose caches (256 KiB) hold a sliver of the tests' data and whose misses read the
/// device past the page cache, their caches managed as `cache_flags` say.
fn device_read_cluster(cache_flags: &[&str]) -> Cluster {
    let mut flags = vec!["--cache-bytes", "262144", "--value-direct-io", "true"];
    flags.extend(cache_flags);
    Cluster::start(3, &flags)
}

/// LDC with a node killed while GETs of its keys run on the others: they fall back to the
/// device (after one timeout, then the peer is skipped), with no error and the right values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldc_a_dead_owner_costs_latency_not_errors() {
    const KEYS: u64 = 1_000;
    let cluster = device_read_cluster(LDC_OWNERS_ONLY);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut c = cluster.client(leader).await;
    for k in 0..KEYS {
        assert_eq!(
            c.command(&["SET", &format!("own:{k}"), &format!("{k:0>100}")])
                .await
                .unwrap(),
            ok()
        );
    }
    // Every node reads every key, so each owner caches its own.
    for id in [1, 2, 3] {
        let mut reader = cluster.client(id).await;
        for k in 0..KEYS {
            reader.command(&["GET", &format!("own:{k}")]).await.unwrap();
        }
    }
    cluster.kill(followers[1]);
    let mut reader = cluster.client(leader).await;
    for round in 0..2 {
        for k in 0..KEYS {
            let reply = reader.command(&["GET", &format!("own:{k}")]).await.unwrap();
            assert_eq!(reply, bulk(&format!("{k:0>100}")), "round {round}, key {k}");
        }
    }
    let failures = metric_sum_over(&cluster, &[leader], "chorus_ldc_remote_failures_total");
    assert!(failures > 0.0, "the dead owner was never asked");
}

/// LDC's cost-benefit admission with data that fits one node's cache: keeping every object on
/// every node makes every read local, whatever a remote hit costs here, so the admission decides
/// to replicate all of it (its gauge says how many) and reads then neither fetch nor read the
/// device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldc_replicates_a_data_set_that_fits_one_cache_on_every_node() {
    const KEYS: u64 = 300;
    // Small batches: the values leave the batch being built (held in memory on every node) for
    // segments, where caching them is the admission's call.
    let cluster = device_read_cluster(&["--cache-mode", "ldc", "--reduction-batch-writes", "50"]);
    let mut c = cluster.client(1).await;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
        let mut args = vec!["MSET".to_string()];
        for k in chunk {
            args.extend([format!("fit:{k}"), format!("{k:0>100}")]);
        }
        assert_eq!(c.command(&args).await.unwrap(), ok());
    }
    let mut readers = Vec::new();
    for id in [1, 2, 3] {
        readers.push(cluster.client(id).await);
    }
    let read_all = |readers: &mut Vec<Client>| {
        let readers = std::mem::take(readers);
        async move {
            let mut back = Vec::new();
            for mut reader in readers {
                for k in 0..KEYS {
                    let reply = reader.command(&["GET", &format!("fit:{k}")]).await.unwrap();
                    assert_eq!(reply, bulk(&format!("{k:0>100}")));
                }
                back.push(reader);
            }
            back
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        readers = read_all(&mut readers).await;
        let replicated: Vec<f64> = [1, 2, 3]
            .iter()
            .map(|id| metric_value(&cluster.metrics(*id), "chorus_ldc_replicated_objects"))
            .collect();
        // The store's keys: these and its own bookkeeping.
        if replicated.iter().all(|r| *r >= KEYS as f64) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the admission replicates {replicated:?} of {KEYS} objects"
        );
    }
    // Passes after the decision bring in what was fetched or read before it: a value enters the
    // cache's small FIFO and, read again, its main one (S3-FIFO), which can take a few passes
    // when a pass admits more than the small FIFO holds. Then a whole pass stays local.
    let away = |cluster: &Cluster| {
        metric_sum_over(cluster, &[1, 2, 3], "chorus_ldc_remote_hits_total")
            + metric_sum_over(cluster, &[1, 2, 3], "chorus_storage_cache_misses_total")
    };
    let mut left_in_last_pass = f64::NAN;
    for _ in 0..10 {
        let before = away(&cluster);
        readers = read_all(&mut readers).await;
        left_in_last_pass = away(&cluster) - before;
        if left_in_last_pass == 0.0 {
            break;
        }
    }
    assert_eq!(
        left_in_last_pass, 0.0,
        "reads still leave their node after the decision"
    );
}

/// WAIT counts the nodes besides the leader that hold the connection's writes, on the leader and
/// on a follower (which asks the leader), waits for a node that is down until it returns, and
/// asks a new leader after a leader change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_counts_the_replicas_holding_a_connections_writes() {
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    for id in [leader, followers[0]] {
        let mut c = cluster.client(id).await;
        assert_eq!(c.command(&["SET", "k", &id.to_string()]).await.unwrap(), ok());
        assert_eq!(wait(&mut c, "2", "10000").await, Value::Integer(2), "on node {id}");
        assert_eq!(wait(&mut c, "0", "0").await, Value::Integer(2));
        assert_eq!(
            c.command(&["WAIT", "1"]).await.unwrap(),
            Value::error("ERR wrong number of arguments for 'wait' command")
        );
        assert_eq!(wait(&mut c, "1", "-1").await, Value::error("ERR timeout is negative"));
    }
    cluster.kill(followers[1]);
    let mut c = cluster.client(followers[0]).await;
    assert_eq!(c.command(&["SET", "k", "while 2 of 3"]).await.unwrap(), ok());
    assert_eq!(wait(&mut c, "2", "300").await, Value::Integer(1), "one node is down");
    assert_eq!(wait(&mut c, "1", "0").await, Value::Integer(1));
    let mut waiting = cluster.client(followers[0]).await;
    let until_back = tokio::spawn(async move { wait(&mut waiting, "2", "0").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!until_back.is_finished(), "WAIT 2 0 returned while a node was down");
    cluster.restart_stopped();
    let answered = tokio::time::timeout(Duration::from_secs(20), until_back).await;
    assert_eq!(
        answered.expect("answered once the node is back").unwrap(),
        Value::Integer(2)
    );
    cluster.kill(leader);
    let survivors: Vec<u64> = followers.clone();
    let new_leader = cluster.wait_for_leader(&survivors, Duration::from_secs(10)).await;
    let other = *survivors.iter().find(|id| **id != new_leader).unwrap();
    let mut c = cluster.client(other).await;
    assert_eq!(c.command(&["SET", "k", "after"]).await.unwrap(), ok());
    assert_eq!(
        wait(&mut c, "2", "300").await,
        Value::Integer(1),
        "asked the new leader"
    );
}

async fn wait(c: &mut Client, replicas: &str, timeout_ms: &str) -> Value {
    c.command(&["WAIT", replicas, timeout_ms]).await.unwrap()
}

/// Applications' own client libraries, installed by `scripts/install-client-libs`: redis-py
/// (over RESP2 and RESP3), go-redis v9 (RESP3, its default, and RESP2), ioredis and Jedis (RESP2
/// and RESP3) run their checks in `tests/clients` against a 3-node cluster — locks (redis-py's
/// `Lock` among them), a rate limiter, pipelines, transactions, scripts, pub/sub, keyspace
/// notifications, WAIT, strings, hashes, sets, sorted sets, expiry, SCAN and errors — writing
/// through one node and reading on another.
#[test]
fn redis_py_go_redis_ioredis_and_jedis_pass_their_checks_against_a_cluster() {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let libs = manifest_dir.join("../../target/client-libs");
    let (python, go_check) = (libs.join("python/bin/python"), libs.join("go-redis-check"));
    let node_modules = libs.join("node/node_modules");
    let java_libs = libs.join("java");
    assert!(
        python.exists() && go_check.exists() && node_modules.join("ioredis").exists() && java_libs.exists(),
        "the client libraries are not installed; run scripts/install-client-libs (scripts/test does)"
    );
    let script = manifest_dir.join("tests/clients/redis_py_check.py");
    let cluster = Cluster::start(3, &[]);
    let leader = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(cluster.leader_and_followers())
        .0;
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let port = |id: u64| cluster.node(id).resp_addr.port().to_string();
    let addr = |id: u64| cluster.node(id).resp_addr.to_string();
    let out = run_tool(
        python.to_str().unwrap(),
        &[script.to_str().unwrap(), &port(others[0]), &port(others[1])],
        None,
    );
    assert_eq!(out.trim(), "ok", "redis-py: {out}");
    let out = run_tool(go_check.to_str().unwrap(), &[&addr(others[1]), &addr(leader)], None);
    assert_eq!(out.trim(), "ok", "go-redis: {out}");
    let node_path = format!("NODE_PATH={}", node_modules.display());
    let check = manifest_dir.join("tests/clients/ioredis/check.js");
    let out = run_tool(
        "env",
        &[
            &node_path,
            "node",
            check.to_str().unwrap(),
            &port(leader),
            &port(others[0]),
        ],
        None,
    );
    assert_eq!(out.trim(), "ok", "ioredis: {out}");
    let class_path = format!("{}/*", java_libs.display());
    let check = manifest_dir.join("tests/clients/jedis/Check.java");
    let out = run_tool(
        "java",
        &[
            "-cp",
            &class_path,
            check.to_str().unwrap(),
            &port(others[1]),
            &port(others[0]),
        ],
        None,
    );
    assert_eq!(out.trim(), "ok", "Jedis: {out}");
}

#[test]
fn redis_cli_and_redis_benchmark_work_against_any_node() {
    require_tool("redis-cli");
    require_tool("redis-benchmark");
    let cluster = Cluster::start(3, &[]);
    for node in &cluster.nodes {
        let port = node.resp_addr.port().to_string();
        let script = format!(
            "SET cli{} hello\nAPPEND cli{} -world\nGET cli{}\nPING\n",
            node.id, node.id, node.id
        );
        let out = run_tool("redis-cli", &["-p", &port], Some(&script));
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            vec!["OK", "11", "hello-world", "PONG"],
            "{out}"
        );
    }
    let port = cluster.node(2).resp_addr.port().to_string();
    for pipeline in ["1", "16"] {
        let out = run_tool(
            "redis-benchmark",
            &[
                "-p", &port, "-t", "set,get", "-d", "64", "-c", "10", "-n", "3000", "-P", pipeline, "-q",
            ],
            None,
        );
        let finals: Vec<&str> = out
            .split(['\r', '\n'])
            .filter(|l| l.contains("requests per second"))
            .collect();
        assert_eq!(finals.len(), 2, "expected SET and GET results: {out}");
    }
    let out = run_tool("redis-cli", &["-p", &port, "DBSIZE"], None);
    let keys: u64 = out.trim().parse().unwrap();
    assert!(keys >= 4, "benchmark keys missing: {out}");
}

/// redis-cli's output for `args` against `port` as `login` (user, password), whatever its
/// exit status (an error reply is output too).
fn redis_cli(port: u16, login: Option<(&str, &str)>, args: &[&str]) -> String {
    let port = port.to_string();
    let mut cli = Command::new("redis-cli");
    cli.args(["-p", &port, "--no-auth-warning"]);
    if let Some((user, password)) = login {
        cli.args(["--user", user, "--pass", password]);
    }
    let out = cli.args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string() + String::from_utf8_lossy(&out.stderr).trim()
}

/// With an ACL file, a connection runs nothing but AUTH, HELLO and QUIT until it logs in; a
/// read-only user reads and cannot write (not even queued in a MULTI), stop a node or monitor
/// it; a wrong password gets
/// WRONGPASS, and an address that keeps failing is made to wait, counted in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_users_log_in_and_a_read_only_user_cannot_write() {
    require_tool("redis-cli");
    let acl_dir = tempfile::tempdir().unwrap();
    let acl = acl_dir.path().join("users.acl");
    std::fs::write(
        &acl,
        "user default off\nuser admin on >admin-pw +@all ~*\nuser reader on >read-pw +@read\n\
         user prober on >probe-pw -@all\n",
    )
    .unwrap();
    let cluster = Cluster::start(3, &["--acl-file", acl.to_str().unwrap()]);
    let port = |id: u64| cluster.node(id).resp_addr.port();
    let admin = Some(("admin", "admin-pw"));
    let reader = Some(("reader", "read-pw"));

    assert_eq!(
        redis_cli(port(1), None, &["SET", "k", "v"]),
        "NOAUTH Authentication required."
    );
    assert_eq!(redis_cli(port(1), admin, &["SET", "k", "v"]), "OK");
    assert_eq!(
        redis_cli(port(2), reader, &["GET", "k"]),
        "v",
        "a follower serves the reader"
    );
    assert_eq!(redis_cli(port(2), reader, &["ACL", "WHOAMI"]), "reader");
    assert_eq!(
        redis_cli(port(2), reader, &["SET", "k", "w"]),
        "NOPERM User reader has no permissions to run the 'set' command"
    );
    let script = redis_cli(port(1), reader, &["EVAL", "return 1", "0"]);
    assert!(script.contains("NOPERM"), "a script may write: {script}");
    for admin_only in ["shutdown", "monitor"] {
        assert_eq!(
            redis_cli(port(2), reader, &[admin_only]),
            format!("NOPERM User reader has no permissions to run the '{admin_only}' command")
        );
    }
    assert_eq!(
        redis_cli(port(1), admin, &["GET", "k"]),
        "v",
        "nothing the reader sent wrote"
    );
    let prober = Some(("prober", "probe-pw"));
    assert_eq!(redis_cli(port(1), prober, &["PING"]), "PONG");
    assert_eq!(
        redis_cli(port(1), prober, &["GET", "k"]),
        "NOPERM User prober has no permissions to run the 'get' command"
    );

    // A MULTI whose write is refused as it is queued is discarded whole.
    let mut raw = RawConnection::connect(cluster.node(1).resp_addr);
    raw.expect(&["GET", "k"], b"-NOAUTH Authentication required.\r\n");
    raw.expect(&["AUTH", "reader", "read-pw"], b"+OK\r\n");
    raw.expect(&["MULTI"], b"+OK\r\n");
    raw.expect(&["GET", "k"], b"+QUEUED\r\n");
    raw.expect(
        &["DEL", "k"],
        b"-NOPERM User reader has no permissions to run the 'del' command\r\n",
    );
    raw.expect(
        &["EXEC"],
        b"-EXECABORT Transaction discarded because of previous errors.\r\n",
    );
    // Logging in again as another user changes the rights; HELLO logs in too.
    raw.expect(&["AUTH", "admin", "admin-pw"], b"+OK\r\n");
    raw.expect(&["DEL", "k"], b":1\r\n");
    let mut hello = RawConnection::connect(cluster.node(1).resp_addr);
    hello.expect(&["HELLO", "3"], b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n");
    let greeting = hello.hello(&["HELLO", "3", "AUTH", "reader", "read-pw"]);
    assert!(greeting.contains("$5\r\nproto\r\n:3\r\n"), "{greeting}");

    // Node 3 only: the throttle is per address, and every test client is 127.0.0.1.
    let mut guesser = RawConnection::connect(cluster.node(3).resp_addr);
    for _ in 0..4 {
        guesser.expect(
            &["AUTH", "admin", "guess"],
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
        );
    }
    guesser.send(&["AUTH", "admin", "admin-pw"]);
    let refused = guesser.until(b"\r\n");
    assert!(
        refused.starts_with("-ERR too many failed logins from 127.0.0.1: try again in "),
        "the right password is not even checked while the address waits: {refused}"
    );
    let metrics = cluster.metrics(3);
    assert!(
        metrics.contains("chorus_resp_login_failures_total{reason=\"wrong_password\"} 4"),
        "{metrics}"
    );
    assert!(
        metrics.contains("chorus_resp_login_failures_total{reason=\"throttled\"} 1"),
        "{metrics}"
    );
    // The cluster was never disturbed.
    assert_eq!(redis_cli(port(2), admin, &["SET", "after", "1"]), "OK");

    // The metrics port: looking is open; acting (here a backup of every key) needs a user with
    // every right, given as chorus's commands take it.
    assert!(http_get(cluster.node(2).metrics_addr, "/members").starts_with("HTTP/1.1 200"));
    let backup_file = acl_dir.path().join("backup.chorus");
    let backup_as = |login: Option<(&str, &str)>| {
        let mut command = Command::new(CHORUS);
        command.args([
            "backup",
            "--cluster",
            cluster.dir(),
            "--node",
            "2",
            "--to",
            backup_file.to_str().unwrap(),
        ]);
        command.env_remove("CHORUS_USER").env_remove("CHORUS_PASSWORD");
        if let Some((user, password)) = login {
            command.env("CHORUS_USER", user).env("CHORUS_PASSWORD", password);
        }
        let out = command.output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    let said = backup_as(None);
    assert!(said.contains("401 Unauthorized"), "{said}");
    let said = backup_as(reader);
    assert!(said.contains("403 Forbidden"), "{said}");
    assert!(!backup_file.exists(), "nothing was written for a refused backup");
    let said = backup_as(admin);
    assert!(said.contains("its SHA-256 checked"), "{said}");
}

/// The status page on a node's metrics port, drawn by a real headless browser (chromium): the
/// leader's page names its role and term, lists both peers with how far behind they are, and
/// shows the throughput under a few writes; a screenshot lands in the test's temp directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_leader_its_peers_and_throughput_in_a_headless_browser() {
    require_tool("chromium");
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let mut c = cluster.client(leader).await;
    for i in 0..200 {
        assert_eq!(c.command(&["SET", &format!("page{i}"), "x"]).await.unwrap(), ok());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let url = format!("http://{}/", cluster.node(leader).metrics_addr);
    let browse = |extra: &[String]| {
        let out = Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            .args(extra)
            .arg(&url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "chromium: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dom = browse(&["--dump-dom".to_string()]);
    assert!(dom.contains("id=\"role\">leader</span>"), "{dom}");
    let term = cluster.info_u64(leader, "raft_term").await;
    assert!(dom.contains(&format!("<td id=\"term\">{term}</td>")), "{dom}");
    for follower in followers {
        assert!(
            dom.contains(&format!("<td class=\"name\">node {follower}</td><td>")),
            "{dom}"
        );
    }
    assert!(dom.contains("client commands/s"), "{dom}");
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    browse(&[
        format!("--screenshot={}", screenshot.display()),
        "--window-size=1000,1200".to_string(),
    ]);
    let png = std::fs::read(&screenshot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a drawn page: {} bytes",
        png.len()
    );
}

/// Writes `prefix0, prefix1, …` as exactly-once RIFL writes until `stop`, each sent again to the
/// next node while it gets no answer (a lost connection, a node restarting: the retries a client
/// library makes); the number acknowledged, also kept in `acknowledged_so_far` as it grows.
/// Panics if one goes unacknowledged for 30 s.
async fn write_until(
    addrs: Vec<SocketAddr>,
    prefix: String,
    stop: Arc<AtomicBool>,
    acknowledged_so_far: Arc<AtomicU64>,
) -> u64 {
    let mut node = 0;
    let mut client = loop {
        if let Ok(client) = Client::connect(addrs[node % addrs.len()]).await {
            break client;
        }
        node += 1;
    };
    client.set_timeout(Duration::from_secs(2));
    let mut session = RiflSession::register(&mut client).await.unwrap();
    let mut acknowledged = 0;
    while !stop.load(Ordering::Relaxed) {
        let write = session.wrap(&["SET", &format!("{prefix}{acknowledged}"), "x"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match client.command(&write.command).await {
                Ok(Value::Simple(ok)) if ok == "OK" => break,
                answer => {
                    assert!(
                        Instant::now() < deadline,
                        "{prefix}{acknowledged} never acknowledged: {answer:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    node += 1;
                    if let Ok(next) = Client::connect(addrs[node % addrs.len()]).await {
                        client = next;
                        client.set_timeout(Duration::from_secs(2));
                    }
                }
            }
        }
        session.answered(&write);
        acknowledged += 1;
        acknowledged_so_far.store(acknowledged, Ordering::Relaxed);
    }
    acknowledged
}

/// `chorus cluster restart --rolling` under a write load: every node is restarted (a new
/// process each), the leader after handing its leadership away; no write goes unacknowledged,
/// and every acknowledged one is on every node afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_and_fails_no_write() {
    let cluster = Cluster::start(3, &[]);
    let addrs: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.resp_addr).collect();
    let pids_before: Vec<u32> = (1..=3).map(|id| node_pid(&cluster, id)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            tokio::spawn(write_until(
                addrs.clone(),
                format!("roll{w}-"),
                stop.clone(),
                Arc::default(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dir = cluster.dir().to_string();
    let said = tokio::task::spawn_blocking(move || run_chorus(&["cluster", "restart", "--rolling", "--dir", &dir]))
        .await
        .unwrap();
    assert_eq!(said.matches("restarted and caught up").count(), 3, "{said}");
    assert!(said.contains("handed the leadership to node"), "{said}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.push(writer.await.unwrap());
    }
    for id in 1..=3 {
        assert_ne!(
            node_pid(&cluster, id),
            pids_before[id as usize - 1],
            "node {id} restarted"
        );
        let mut c = cluster.client(id).await;
        for (w, count) in acknowledged.iter().enumerate() {
            assert!(*count > 0, "writer {w} wrote");
            for i in 0..*count {
                assert_eq!(
                    c.command(&["GET", &format!("roll{w}-{i}")]).await.unwrap(),
                    bulk("x"),
                    "node {id}"
                );
            }
        }
    }
}

fn node_pid(cluster: &Cluster, id: u64) -> u32 {
    std::fs::read_to_string(Path::new(cluster.dir()).join(format!("node{id}")).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// redis-cli over TLS, verifying the node with `ca`; its output and whether it succeeded.
fn redis_cli_tls(port: u16, ca: Option<&Path>, args: &[&str]) -> (bool, String) {
    let port = port.to_string();
    let mut cli = Command::new("redis-cli");
    cli.args(["-p", &port]);
    if let Some(ca) = ca {
        cli.args(["--tls", "--cacert"]).arg(ca);
    }
    let out = cli.args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string() + String::from_utf8_lossy(&out.stderr).trim();
    (
        out.status.success() && !text.starts_with("Error") && !text.contains("Could not"),
        text,
    )
}

/// `chorus cluster start --tls`: the RESP ports speak TLS only, with a certificate the cluster's
/// throwaway CA signed; a plaintext client fails cleanly (counted) and the node goes on; a
/// certificate replaced on disk is taken for new connections without a restart.
#[test]
fn a_tls_cluster_serves_tls_clients_only_and_reloads_a_replaced_certificate() {
    require_tool("redis-cli");
    let cluster = Cluster::start_with(3, &["--tls"], &[]);
    let tls_dir = Path::new(cluster.dir()).join("tls");
    let ca = tls_dir.join("ca.pem");
    let port = |id: u64| cluster.node(id).resp_addr.port();
    assert_eq!(
        redis_cli_tls(port(1), Some(&ca), &["SET", "k", "v"]),
        (true, "OK".to_string())
    );
    assert_eq!(
        redis_cli_tls(port(2), Some(&ca), &["GET", "k"]),
        (true, "v".to_string())
    );
    let (ok, said) = redis_cli_tls(port(2), None, &["GET", "k"]);
    assert!(!ok && !said.contains('v'), "a plaintext client gets nothing: {said}");
    assert!(
        metric_value(&cluster.metrics(2), "chorus_resp_tls_handshake_failures_total") >= 1.0,
        "counted"
    );
    assert_eq!(redis_cli_tls(port(2), Some(&ca), &["PING"]), (true, "PONG".to_string()));

    // Another CA's certificate and key in place of the node's: new connections get them once
    // the node has looked (every 10 s).
    let other = tempfile::tempdir().unwrap();
    let replacement = chorus_tls::write_local_ca(other.path()).unwrap();
    std::fs::copy(&replacement.node_cert, tls_dir.join("node.pem")).unwrap();
    std::fs::copy(&replacement.node_key, tls_dir.join("node-key.pem")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !redis_cli_tls(port(3), Some(&replacement.ca_cert), &["GET", "k"]).0 {
        assert!(Instant::now() < deadline, "node 3 never took the new certificate");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, said) = redis_cli_tls(port(3), Some(&ca), &["GET", "k"]);
    assert!(!ok, "the old CA no longer verifies the node: {said}");
}

/// A process started in node 3's place (its address and config, a data directory of its own)
/// with other credentials, after node 3 was killed.
struct Impostor {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    /// The leader among nodes 1 and 2 when it started, and its term.
    leader: u64,
    term: u64,
}

impl Impostor {
    async fn in_place_of_node3(cluster: &Cluster, credentials: &[String]) -> Impostor {
        cluster.kill(3);
        let leader = cluster.wait_for_leader(&[1, 2], Duration::from_secs(10)).await;
        let term = cluster.info_u64(leader, "raft_term").await;
        let dir = tempfile::tempdir().unwrap();
        let node3_config = Path::new(cluster.dir()).join("node3").join("chorus.toml");
        let child = Command::new(CHORUS)
            .args(["server", "--config", node3_config.to_str().unwrap()])
            .args(credentials)
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Impostor {
            child,
            _dir: dir,
            leader,
            term,
        }
    }

    /// Checks it holds no key, stops it, and checks its votes moved no term and nodes 1 and 2
    /// counted it (and the outsider before it) among the refused.
    async fn got_nothing(mut self, cluster: &Cluster) {
        let mut seen_by_impostor = RawConnection::connect(cluster.node(3).resp_addr);
        seen_by_impostor.expect(&["READONLY"], b"+OK\r\n");
        seen_by_impostor.expect(&["DBSIZE"], b":0\r\n");
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        assert_eq!(
            cluster.info_u64(self.leader, "raft_term").await,
            self.term,
            "the impostor's votes never reached a node"
        );
        let refused: f64 = [1, 2]
            .iter()
            .map(|id| metric_value(&cluster.metrics(*id), "chorus_peer_auth_failures_total"))
            .sum();
        assert!(refused >= 2.0, "the outsider and the impostor were counted: {refused}");
    }
}

/// With a cluster secret, a process without it can neither join nor read the replication
/// stream: a raw connection claiming to be node 2 is closed at its hello, and an impostor node 3
/// (node 3's address and config, another secret) gets no entry while the other two go on and
/// elect no one new; the real node 3, restarted, catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_without_the_cluster_secret_are_refused_and_change_nothing() {
    let secrets = tempfile::tempdir().unwrap();
    let wrong = secrets.path().join("wrong");
    std::fs::write(&wrong, "a-secret-for-some-other-cluster\n").unwrap();
    // `--secret` draws the cluster's own into DIR/secret.
    let cluster = Cluster::start_with(3, &["--secret"], &[]);
    assert!(Path::new(cluster.dir()).join("secret").exists());
    let mut c = cluster.client(1).await;
    assert_eq!(c.command(&["SET", "before", "1"]).await.unwrap(), ok());

    // An outsider's hello, without a proof, is answered by a closed connection.
    let mut outsider = TcpStream::connect(cluster.node(1).peer_addr).unwrap();
    outsider.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    outsider.write_all(&chorus_log::frame::encode_hello(2, None)).unwrap();
    let mut answer = Vec::new();
    let closed = outsider.read_to_end(&mut answer);
    assert!(closed.is_ok(), "closed at once, not left open: {closed:?}");
    assert!(answer.is_empty(), "nothing is sent before a proof: {answer:?}");

    let impostor = Impostor::in_place_of_node3(
        &cluster,
        &["--cluster-secret-file".to_string(), wrong.display().to_string()],
    )
    .await;
    for i in 0..20 {
        assert_eq!(c.command(&["SET", &format!("during{i}"), "x"]).await.unwrap(), ok());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut seen_by_impostor = RawConnection::connect(cluster.node(3).resp_addr);
    seen_by_impostor.expect(&["READONLY"], b"+OK\r\n");
    seen_by_impostor.expect(&["GET", "before"], b"$-1\r\n");
    impostor.got_nothing(&cluster).await;

    cluster.restart_stopped();
    let mut three = cluster.client(3).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while three.command(&["GET", "during19"]).await.unwrap() != bulk("x") {
        assert!(Instant::now() < deadline, "node 3 with the secret catches up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With peer TLS, raft traffic and snapshot shipments cross only between nodes whose
/// certificates chain to the cluster's CA: a plaintext hello on a peer port is closed (counted),
/// an impostor node 3 with another CA's certificate gets no entry and moves no term, and the real
/// node 3, behind the compacted log, catches up by a snapshot shipped over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_with_tls_take_only_certificates_of_the_clusters_ca_and_ship_snapshots_over_it() {
    let certs = tempfile::tempdir().unwrap();
    let ours = chorus_tls::write_local_ca(&certs.path().join("ours")).unwrap();
    let theirs = chorus_tls::write_local_ca(&certs.path().join("theirs")).unwrap();
    let peer_flags = |ca: &chorus_tls::LocalCa| {
        [
            ("--peer-tls-cert-file", &ca.peer_cert),
            ("--peer-tls-key-file", &ca.peer_key),
            ("--peer-tls-ca-file", &ca.ca_cert),
        ]
        .iter()
        .flat_map(|(flag, file)| [flag.to_string(), file.display().to_string()])
        .collect::<Vec<_>>()
    };
    let mut server_args = peer_flags(&ours);
    server_args.extend(["--snapshot-interval-entries", "50", "--log-keep-entries", "10"].map(String::from));
    let cluster = Cluster::start_with(3, &[], &server_args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut c = cluster.client(1).await;
    assert_eq!(c.command(&["SET", "before", "1"]).await.unwrap(), ok());

    // A plaintext hello never gets past the TLS handshake.
    let mut outsider = TcpStream::connect(cluster.node(1).peer_addr).unwrap();
    outsider.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    outsider.write_all(&chorus_log::frame::encode_hello(2, None)).unwrap();
    let closed = outsider.read_to_end(&mut Vec::new());
    assert!(closed.is_ok(), "closed at once, not left open: {closed:?}");

    let impostor = Impostor::in_place_of_node3(&cluster, &peer_flags(&theirs)).await;
    let leader = impostor.leader;
    let mut c = cluster.client(leader).await;
    // 4 KiB values: the leader compacts past node 3's log and ships it the state.
    let value = |i: usize| format!("{i:04096}");
    for i in 0..400 {
        assert_eq!(c.command(&["SET", &format!("s{i}"), &value(i)]).await.unwrap(), ok());
    }
    impostor.got_nothing(&cluster).await;

    cluster.restart_stopped();
    let target = cluster.info_u64(leader, "raft_commit_index").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.info_u64(3, "raft_applied_index").await < target {
        assert!(Instant::now() < deadline, "node 3 did not catch up over TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = metric_value(&cluster.metrics(3), "chorus_snapshot_bytes_received_total");
    assert!(received >= 1_000_000.0, "the state was shipped: {received} bytes");
    let mut three = cluster.client(3).await;
    assert_eq!(three.command(&["READONLY"]).await.unwrap(), ok());
    assert_eq!(three.command(&["GET", "s399"]).await.unwrap(), bulk(&value(399)));
}

#[test]
fn server_rejects_a_bad_config_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "id = 1\nelection_tick = 5\n").unwrap();
    let out = Command::new(CHORUS)
        .args(["server", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `election_tick`"), "{err}");
    let out = Command::new(CHORUS)
        .args(["server", "--id", "4", "--peers", "1=127.0.0.1:1", "--data-dir"])
        .arg(dir.path().join("d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in peers"));
    assert!(
        !Path::new(&dir.path().join("d")).exists(),
        "a rejected config must not create data"
    );
}

/// The demo SIGKILLs the leader in the middle of a write-heavy workload and then checks every
/// acknowledged write on every node; it exits non-zero if anything is missing.
#[test]
fn demo_survives_a_leader_crash_under_load_with_no_lost_writes() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(CHORUS)
        .args(["demo", "--duration-secs", "8", "--clients", "8", "--dir"])
        .arg(dir.path().join("demo"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("SIGKILL leader"), "{text}");
    assert!(text.contains("CHECK PASSED"), "{text}");
    // Every write's outcome is known: the clients own RIFL ids and send a write whose
    // connection died with the leader again to another node, where it executes once (the check
    // above holds each counter to exactly its acknowledged increments).
    assert!(text.contains("outcome unknown 0:"), "{text}");
}

/// Writes `count` keys `{prefix}{i}` through `client`, values drawn from a small pool so the
/// cache has something to hit; returns what was written.
async fn write_pooled(client: &mut Client, prefix: &str, count: usize, expected: &mut Vec<(String, String)>) {
    for i in 0..count {
        let key = format!("{prefix}{i}");
        let value = format!("{}-{}", ["alpha", "beta", "gamma", "delta"][i % 4], "x".repeat(200));
        let reply = client.command(&["SET", &key, &value]).await.unwrap();
        assert_eq!(reply, ok(), "SET {key}");
        expected.push((key, value));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicache_replicas_agree_across_two_leader_changes_and_a_follower_restart() {
    let cluster = Cluster::start(
        3,
        &[
            "--unicache",
            "true",
            "--unicache-autotune",
            "false",
            "--unicache-max-items",
            "64",
        ],
    );
    let all = [1, 2, 3];
    let mut expected = Vec::new();
    let first = cluster.wait_for_leader(&all, Duration::from_secs(5)).await;
    write_pooled(&mut cluster.client(first).await, "a", 300, &mut expected).await;

    // Leader change 1: the leader crashes.
    cluster.kill(first);
    let survivors: Vec<u64> = all.into_iter().filter(|id| *id != first).collect();
    let second = cluster.wait_for_leader(&survivors, Duration::from_secs(5)).await;
    write_pooled(&mut cluster.client(second).await, "b", 300, &mut expected).await;
    cluster.restart_stopped();

    // Leader change 2: leadership handed to another node.
    let third = all.into_iter().find(|id| *id != second).unwrap();
    let mut c = cluster.client(third).await;
    assert_eq!(c.command(&["CLUSTER", "FAILOVER"]).await.unwrap(), ok());
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.leader_among(&all).await != Some(third) {
        assert!(Instant::now() < deadline, "node {third} did not take over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    write_pooled(&mut c, "c", 300, &mut expected).await;

    // A follower restarts while writes continue.
    let follower = all.into_iter().find(|id| *id != third).unwrap();
    cluster.kill(follower);
    write_pooled(&mut c, "d", 200, &mut expected).await;
    cluster.restart_stopped();
    write_pooled(&mut c, "e", 200, &mut expected).await;

    // Every node applies the same log and holds the same data.
    let target = cluster.info_u64(third, "raft_commit_index").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    for id in all {
        while cluster.info_u64(id, "raft_applied_index").await < target {
            assert!(Instant::now() < deadline, "node {id} did not catch up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut c = cluster.client(id).await;
        assert_eq!(c.command(&["READONLY"]).await.unwrap(), ok());
        for (key, value) in &expected {
            assert_eq!(
                c.command(&["GET", key]).await.unwrap(),
                bulk(value),
                "node {id} key {key}"
            );
        }
    }
    let decoded: f64 = all
        .iter()
        .map(|id| metric_value(&cluster.metrics(*id), "chorus_unicache_decoded_entries_total"))
        .sum();
    assert!(decoded > 0.0, "no entry travelled encoded");
    for id in all {
        let m = cluster.metrics(id);
        assert_eq!(
            metric_value(&m, "chorus_unicache_decode_failures_total{reason=\"checksum\"}"),
            0.0,
            "node {id}"
        );
    }
}

/// The newest write-ahead-log segment of a node.
fn newest_segment(cluster: &Cluster, id: u64) -> std::path::PathBuf {
    let data = cluster.dir.path().join(format!("node{id}/data"));
    let mut segments: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    segments.pop().expect("a segment")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_is_zeroed_and_a_flipped_bit_inside_the_log_stops_the_node_loudly() {
    let cluster = Cluster::start(3, &[]);
    let mut c = cluster.client(1).await;
    for i in 0..200 {
        assert_eq!(c.command(&["SET", &format!("t{i}"), "v"]).await.unwrap(), ok());
    }
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(5)).await;
    let victim = (1..=3).find(|id| *id != leader).unwrap();

    // A torn tail (the last record half written when the process died: here its last bytes
    // never reached the disk) is zeroed on restart, and the node catches up from its peers.
    // Segments may be preallocated, so the records end at the last non-zero byte, not at the
    // end of the file.
    cluster.kill(victim);
    let segment = newest_segment(&cluster, victim);
    let mut bytes = std::fs::read(&segment).unwrap();
    let records_end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    bytes[records_end - 7..records_end].fill(0);
    std::fs::write(&segment, &bytes).unwrap();
    cluster.restart_stopped();
    let mut back = cluster.client(victim).await;
    assert_eq!(back.command(&["GET", "t199"]).await.unwrap(), bulk("v"));
    let log = std::fs::read_to_string(cluster.dir.path().join(format!("node{victim}/server.log"))).unwrap();
    assert!(log.contains("zeroing the torn tail"), "{log}");

    // A flipped bit before the tail is corruption, not a torn write: the node refuses to start
    // and says why, rather than applying or dropping what it cannot trust. The restart may have
    // begun a new segment; writes fill it, so that the bit flipped in its middle has whole records
    // after it (a bad last record is a torn tail).
    for i in 0..200 {
        assert_eq!(back.command(&["SET", &format!("u{i}"), "v"]).await.unwrap(), ok());
    }
    assert_eq!(back.command(&["GET", "u199"]).await.unwrap(), bulk("v"));
    cluster.kill(victim);
    let segment = newest_segment(&cluster, victim);
    let mut bytes = std::fs::read(&segment).unwrap();
    let records_end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
    bytes[records_end / 2] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();
    let started = Command::new(CHORUS)
        .args(["cluster", "start", "--dir", cluster.dir()])
        .output()
        .unwrap();
    let log = std::fs::read_to_string(cluster.dir.path().join(format!("node{victim}/server.log"))).unwrap();
    assert!(
        !started.status.success(),
        "a node started on a corrupt log:\n{}",
        &log[log.len().saturating_sub(3000)..]
    );
    let log = std::fs::read_to_string(cluster.dir.path().join(format!("node{victim}/server.log"))).unwrap();
    assert!(log.contains("corrupt") || log.contains("checksum"), "{log}");
}

/// What the writers of the crash tests were told: keys whose SET was acknowledged, and how many
/// increments were acknowledged and attempted.
#[derive(Default, Clone)]
struct Acknowledged {
    sets: Vec<(String, String)>,
    increments_acked: i64,
    increments_attempted: i64,
}

/// One writer of the crash tests: SETs unique keys, INCRs a shared counter, and overwrites a few
/// hot keys (dead records for the cleaner) until its connection fails.
async fn write_until_killed(
    addr: SocketAddr,
    writer: usize,
    round: usize,
    acked: std::sync::Arc<std::sync::Mutex<Acknowledged>>,
) {
    let Ok(mut c) = Client::connect(addr).await else { return };
    c.set_timeout(Duration::from_secs(2));
    for i in 0.. {
        let reply = match i % 4 {
            0 => {
                acked.lock().unwrap().increments_attempted += 1;
                match c.command(&["INCR", "crash-counter"]).await {
                    Ok(Value::Integer(_)) => {
                        acked.lock().unwrap().increments_acked += 1;
                        continue;
                    }
                    _ => return,
                }
            }
            1 => {
                c.command(&["SET", &format!("hot-{}", (i + writer) % 40), &"h".repeat(200)])
                    .await
            }
            _ => {
                let key = format!("crash-r{round}-w{writer}-{i}");
                let value = format!("{key}-{}", "v".repeat(50 + i % 150));
                let reply = c.command(&["SET", &key, &value]).await;
                if matches!(&reply, Ok(v) if *v == ok()) {
                    acked.lock().unwrap().sets.push((key, value));
                }
                reply
            }
        };
        if !matches!(reply, Ok(v) if v == ok()) {
            return;
        }
    }
}

/// Asserts that every acknowledged SET from `sets_from` on reads back (MGET in chunks) and that
/// the counter lies between the acknowledged and the attempted increments; `context` names the
/// crash in a failure.
async fn assert_acknowledged_writes_present(c: &mut Client, acked: &Acknowledged, sets_from: usize, context: &str) {
    for chunk in acked.sets[sets_from..].chunks(500) {
        let mut mget = vec!["MGET"];
        mget.extend(chunk.iter().map(|(key, _)| key.as_str()));
        let Value::Array(Some(values)) = c.command(&mget).await.unwrap() else {
            panic!("MGET answers an array");
        };
        for ((key, value), got) in chunk.iter().zip(values) {
            assert_eq!(got, bulk(value), "{context}: acknowledged {key} lost");
        }
    }
    let Value::Bulk(Some(counter)) = c.command(&["GET", "crash-counter"]).await.unwrap() else {
        panic!("{context}: the counter is gone");
    };
    let counter: i64 = String::from_utf8(counter.to_vec()).unwrap().parse().unwrap();
    let (acknowledged, attempted) = (acked.increments_acked, acked.increments_attempted);
    assert!(
        (acknowledged..=attempted).contains(&counter),
        "{context}: counter {counter}, acknowledged {acknowledged} attempted {attempted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_heavy_writes_never_loses_an_acknowledged_write() {
    // Small segments, frequent snapshots and a cleaner without a floor, so kills also land in
    // segment rolls, snapshot writes, merges and log compaction.
    let cluster = Cluster::start(
        1,
        &[
            "--segment-size-bytes",
            "65536",
            "--snapshot-interval-entries",
            "400",
            "--log-keep-entries",
            "100",
            "--min-cleanable-dead-bytes",
            "0",
        ],
    );
    let addr = cluster.node(1).resp_addr;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Acknowledged::default()));
    // Kill points spread over a write burst; fixed so a failure replays the same schedule.
    for (round, kill_after_ms) in [170u64, 430, 90, 610, 280, 750, 350].into_iter().enumerate() {
        let writers: Vec<_> = (0..8)
            .map(|w| tokio::spawn(write_until_killed(addr, w, round, acked.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        cluster.kill(1);
        for w in writers {
            w.await.unwrap();
        }
        cluster.restart_stopped();

        let acked_now = acked.lock().unwrap().clone();
        let mut c = cluster.client(1).await;
        assert_acknowledged_writes_present(&mut c, &acked_now, 0, &format!("round {round}")).await;
        eprintln!(
            "round {round}: killed after {kill_after_ms} ms; {} SETs and {} INCRs acknowledged so far, all present",
            acked_now.sets.len(),
            acked_now.increments_acked
        );
    }
    let snapshots = std::fs::read_dir(cluster.dir.path().join("node1/data"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains("snap"))
        .count();
    assert!(snapshots > 0, "the test meant to cross snapshots but none was written");
}

/// A client that takes CURP's fast path itself (`CurpSession`: to the leader and every witness at
/// once): its increments are answered in one round trip while all nodes are up, and exactly once
/// and in order through a SIGKILL of the leader, after which it falls back to the ordinary path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curp_client_writes_in_one_round_trip_and_exactly_once_through_a_leader_crash() {
    let cluster = Cluster::start(3, &["--curp", "on"]);
    let addrs: Vec<_> = (1..=3).map(|id| cluster.node(id).resp_addr).collect();
    let mut session = CurpSession::connect(&addrs, Duration::from_secs(10)).await.unwrap();
    let (leader, followers) = cluster.leader_and_followers().await;
    // The leader speculates only on a write whose witnesses, as the PROPOSE names them, are its
    // voters.
    let leader = recovered_leader(&cluster, Duration::from_secs(10))
        .await
        .unwrap_or(leader);
    let mut raw = cluster.client(leader).await;
    let mut rifl = RiflSession::register(&mut raw).await.unwrap();
    let term = cluster.info_u64(leader, "raft_term").await.to_string();
    for (witnesses, answered) in [("1,2", "APPLIED"), ("3,1,2", "SPECULATED"), ("1,2,3,4", "APPLIED")] {
        let write = rifl.wrap(&["SET", "named-witnesses", witnesses]);
        let mut propose = vec![
            b"CURP".to_vec(),
            b"PROPOSE".to_vec(),
            term.clone().into_bytes(),
            witnesses.as_bytes().to_vec(),
        ];
        propose.extend(write.command[2..].iter().cloned());
        let reply = raw.command(&propose).await.unwrap();
        assert!(
            matches!(&reply, Value::Array(Some(items)) if items[0] == bulk(answered)),
            "witnesses {witnesses}: {reply:?}"
        );
        rifl.answered(&write);
    }
    let mut counts = [0i64; 7];
    let (mut fast, mut written) = (0, 0);
    // At least 200 writes, and on until 100 took the fast path (fewer do per 200 on a loaded
    // machine); then the leader dies and 200 more follow.
    let mut killed_after = None;
    while killed_after.is_none_or(|killed: usize| written < killed + 200) {
        if killed_after.is_none() && written >= 200 && fast >= 100 {
            cluster.kill(leader);
            killed_after = Some(written);
        }
        assert!(
            killed_after.is_some() || written < 2000,
            "only {fast} of {written} writes were answered in one round trip"
        );
        let i = written;
        let key = format!("curp-counter{}", i % 7);
        let reply = session.write(&["INCR", &key]).await.unwrap();
        counts[i % 7] += 1;
        assert_eq!(reply.value(), &Value::Integer(counts[i % 7]), "write {i} on {key}");
        fast += usize::from(matches!(reply, CurpReply::Fast(_)));
        written += 1;
    }
    let mut c = cluster.client(followers[0]).await;
    for (n, count) in counts.iter().enumerate() {
        let value = c.command(&["GET", &format!("curp-counter{n}")]).await.unwrap();
        assert_eq!(value, bulk(&count.to_string()), "counter {n}");
    }
}

/// Eight writers on the followers of a CURP cluster for `kill_after_ms`, then SIGKILL of every
/// node; returns how many writes the followers answered by the fast path before the kill.
async fn curp_burst_then_kill_every_node(
    cluster: &Cluster,
    round: usize,
    kill_after_ms: u64,
    acked: &std::sync::Arc<std::sync::Mutex<Acknowledged>>,
) -> f64 {
    let (_, followers) = cluster.leader_and_followers().await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let addr = cluster.node(followers[w % 2]).resp_addr;
            tokio::spawn(write_until_killed(addr, w, round, acked.clone()))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
    let fast = metric_sum_over(cluster, &followers, "chorus_curp_fast_path_writes_total");
    for id in 1..=3 {
        cluster.kill(id);
    }
    for w in writers {
        w.await.unwrap();
    }
    fast
}

/// The leader once it has proposed its CURP recovery: the role shows before the recovery does,
/// since the new leader first gathers the witnesses' records.
async fn recovered_leader(cluster: &Cluster, within: Duration) -> Option<u64> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let leader = cluster.wait_for_leader(&[1, 2, 3], within).await;
        if metric_value(&cluster.metrics(leader), "chorus_curp_recoveries_total") >= 1.0 {
            return Some(leader);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// CURP answers a write before it commits, so a crash of every node right after must not lose
/// it: the witnesses hold it on disk, and the leader elected after the restart replays it.
/// Writers on both followers; every node is killed mid-burst, three times — and more, up to
/// twelve, until 100 writes took the fast path (a loaded machine writes less per burst).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curp_fast_path_writes_survive_killing_every_node() {
    let cluster = Cluster::start(3, CURP_ON);
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Acknowledged::default()));
    let mut fast = 0.0;
    let mut round = 0;
    while round < 3 || (fast <= 100.0 && round < 12) {
        let kill_after_ms = [180u64, 420, 260][round % 3];
        fast += curp_burst_then_kill_every_node(&cluster, round, kill_after_ms, &acked).await;
        cluster.restart_stopped();
        let leader = recovered_leader(&cluster, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("round {round}: no leader ran a CURP recovery"));
        let acked_now = acked.lock().unwrap().clone();
        let mut c = cluster.client(leader).await;
        assert_acknowledged_writes_present(&mut c, &acked_now, 0, &format!("round {round}")).await;
        round += 1;
    }
    assert!(fast > 100.0, "only {fast} writes took the fast path in {round} rounds");
}

/// CURP's fast path answers before the write is fsynced on a majority of logs: the witnesses'
/// fsynced records are what a power cut cannot take. Every node on a disk that loses its
/// unsynced writes; writers on the followers; every node killed and the power cut on all three,
/// twenty times — and more, up to forty, until 100 writes took the fast path and a cut lost an
/// unsynced write (a loaded machine writes less per burst). (A build whose witnesses do not
/// persist their records fails this.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curp_fast_path_writes_survive_power_cuts_of_every_node() {
    const CUTS: usize = 20;
    const MOST_CUTS: usize = 40;
    let cluster = Cluster::start(3, CURP_ON);
    let mut disks = Vec::new();
    for id in 1..=3 {
        let Some((disk, mount)) = move_onto_powercut_disk(&cluster, id) else {
            return;
        };
        disks.push((id, disk, Some(mount)));
    }
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Acknowledged::default()));
    let (mut fast, mut recovered) = (0.0, 0.0);
    let mut rolled_back = 0;
    let mut round = 0;
    while round < CUTS || ((fast <= 100.0 || rolled_back == 0) && round < MOST_CUTS) {
        let kill_after_ms = 100 + 37 * (round as u64 % 7);
        fast += curp_burst_then_kill_every_node(&cluster, round, kill_after_ms, &acked).await;
        for (id, disk, mount) in disks.iter_mut() {
            drop(mount.take());
            let report = disk.cut_power();
            rolled_back += report.files_rolled_back + report.entries_rolled_back;
            let data = cluster.dir.path().join(format!("node{id}/data"));
            *mount = Some(disk.mount(&data).expect("remount after a power cut"));
        }
        cluster.restart_stopped();
        let leader = recovered_leader(&cluster, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("cut {round}: no leader ran a CURP recovery"));
        recovered += metric_value(&cluster.metrics(leader), "chorus_curp_recovered_writes_total");
        let acked_now = acked.lock().unwrap().clone();
        let mut c = cluster.client(leader).await;
        assert_acknowledged_writes_present(&mut c, &acked_now, 0, &format!("cut {round}")).await;
        round += 1;
    }
    eprintln!("{round} power cuts of every node: {fast} fast-path writes, {recovered} recovered from the witnesses");
    assert!(fast > 100.0, "only {fast} writes took the fast path in {round} cuts");
    assert!(
        rolled_back > 0,
        "no cut lost an unsynced write: the test did not exercise what it is for"
    );
}

/// Copies a directory tree into `to` and syncs every file and directory there.
fn copy_tree_durably(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&target).unwrap();
            copy_tree_durably(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
            std::fs::File::open(&target).unwrap().sync_all().unwrap();
        }
    }
    std::fs::File::open(to).unwrap().sync_all().unwrap();
}

/// Power cuts, not just SIGKILLs: the node's data directory is on a file system that, at each
/// cut, drops every write no fsync covered (and every creation, rename and removal no directory
/// fsync covered). Heavy writes with small batches, frequent snapshots and a low cleaner
/// threshold put cuts into segment writes, merges, manifest switches and log compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_during_heavy_writes_never_lose_an_acknowledged_write() {
    const CUTS: usize = 100;
    let cluster = Cluster::start(
        1,
        &[
            "--segment-size-bytes",
            "65536",
            "--snapshot-interval-entries",
            "150",
            "--log-keep-entries",
            "50",
            "--reduction-batch-writes",
            "64",
            "--min-cleanable-dirty-ratio",
            "0.3",
            "--min-cleanable-dead-bytes",
            "0",
            // Short election timeouts: a restarted single node leads sooner.
            "--tick-ms",
            "20",
        ],
    );
    let Some((disk, mut mount)) = move_onto_powercut_disk(&cluster, 1) else {
        return;
    };
    let data = cluster.dir.path().join("node1/data");

    let addr = cluster.node(1).resp_addr;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Acknowledged::default()));
    let mut lost = chorus_powercut::CutReport::default();
    let (mut merges, mut snapshots) = (0, 0);
    let counter_of = |metrics: &str, name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut verified_sets = 0;
    for round in 0..CUTS {
        let writers: Vec<_> = (0..4)
            .map(|w| tokio::spawn(write_until_killed(addr, w, round, acked.clone())))
            .collect();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let cut_after_ms = 20 + rng % 300;
        tokio::time::sleep(Duration::from_millis(cut_after_ms)).await;
        let metrics = cluster.metrics(1);
        merges += counter_of(&metrics, "chorus_storage_merges_total ");
        snapshots += counter_of(&metrics, "chorus_raft_snapshots_created_total ");
        cluster.kill(1);
        for w in writers {
            w.await.unwrap();
        }
        drop(mount);
        let report = disk.cut_power();
        lost.files_rolled_back += report.files_rolled_back;
        lost.entries_rolled_back += report.entries_rolled_back;
        mount = disk.mount(&data).expect("remount after a power cut");
        cluster.restart_stopped();

        let acked_now = acked.lock().unwrap().clone();
        // Every acknowledged write since the last cut, and all of them every tenth cut.
        let check_from = if round % 10 == 9 { 0 } else { verified_sets };
        verified_sets = acked_now.sets.len();
        let mut c = cluster.client(1).await;
        let context = format!("cut {round} (after {cut_after_ms} ms)");
        assert_acknowledged_writes_present(&mut c, &acked_now, check_from, &context).await;
    }
    let acked = acked.lock().unwrap();
    eprintln!(
        "{CUTS} power cuts: {} SETs and {} INCRs acknowledged, all present; {snapshots} snapshots and \
         {merges} cleaner merges between cuts; the cuts rolled back {} files and {} directory entries",
        acked.sets.len(),
        acked.increments_acked,
        lost.files_rolled_back,
        lost.entries_rolled_back
    );
    assert!(
        lost.files_rolled_back + lost.entries_rolled_back > 0,
        "no cut lost an unsynced write: the test did not exercise what it is for"
    );
    assert!(
        snapshots > 0 && merges > 0,
        "cuts were meant to fall among snapshots and merges"
    );
}

/// A node whose disk fills up refuses writes with a clear error, keeps serving reads, loses no
/// acknowledged write, and takes writes again by itself once space returns. The disk is the
/// power-cut file system with a capacity. With the key-value segments on it too, their writer
/// tends to run out first; with them elsewhere, the raft log's next segment cannot be
/// preallocated and the log's own room check refuses the writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_clearly_and_they_resume_when_space_returns() {
    full_disk_refuses_writes_until_space_returns(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_raft_log_disk_refuses_writes_clearly_and_they_resume_when_space_returns() {
    full_disk_refuses_writes_until_space_returns(false).await;
}

async fn full_disk_refuses_writes_until_space_returns(state_on_full_disk: bool) {
    let outside = tempfile::tempdir().unwrap();
    let state_dir = outside.path().join("state");
    let state_dir = state_dir.to_str().unwrap();
    let mut flags = FULL_DISK_FLAGS.to_vec();
    if !state_on_full_disk {
        flags.extend(["--data-dirs", state_dir]);
    }
    let cluster = Cluster::start(1, &flags);
    let Some((disk, _mount)) = move_onto_powercut_disk(&cluster, 1) else {
        return;
    };

    let mut c = cluster.client(1).await;
    c.set_timeout(Duration::from_secs(10));
    let value = full_disk_value;
    let mut acked = Vec::new();
    let refusal = write_until_the_disk_fills(&mut c, &disk, &mut acked).await;
    assert!(
        refusal.starts_with("NOSPACE") && refusal.contains("disk on node 1 is full"),
        "{refusal}"
    );
    assert!(acked.len() > 100, "only {} writes before the disk filled", acked.len());
    // Still full: refused again, at once; reads still answered.
    let started = Instant::now();
    let again = c.command(&["SET", "refused", &value(0)]).await.unwrap();
    assert!(
        matches!(&again, Value::Error(m) if m.starts_with("NOSPACE")),
        "{again:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a refusal took {:?}",
        started.elapsed()
    );
    let last = *acked.last().unwrap();
    assert_eq!(
        c.command(&["GET", &format!("full-{last}")]).await.unwrap(),
        bulk(&value(last))
    );
    let log = std::fs::read_to_string(cluster.dir.path().join("node1/server.log")).unwrap();
    assert!(log.contains("refusing writes: the disk is full"), "{log}");
    if !state_on_full_disk {
        assert!(log.contains("preallocating a raft log segment failed"), "{log}");
    }
    let refusals = metric_value(&cluster.metrics(1), "chorus_raft_disk_full_refusals_total");
    assert!(refusals >= 2.0, "{refusals} refusals counted");

    disk.set_capacity_bytes(None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let i = acked.len();
        match c.command(&["SET", &format!("full-{i}"), &value(i)]).await.unwrap() {
            reply if reply == ok() => break,
            Value::Error(message) if message.starts_with("NOSPACE") => {
                assert!(
                    Instant::now() < deadline,
                    "writes did not resume within 30 s of space returning"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }
    for _ in 0..200 {
        let i = acked.len();
        assert_eq!(
            c.command(&["SET", &format!("full-{i}"), &value(i)]).await.unwrap(),
            ok()
        );
        acked.push(i);
    }
    let check = |mut c: Client, acked: Vec<usize>| async move {
        for i in acked {
            assert_eq!(
                c.command(&["GET", &format!("full-{i}")]).await.unwrap(),
                bulk(&value(i)),
                "acknowledged full-{i} lost"
            );
        }
    };
    check(c, acked.clone()).await;
    cluster.kill(1);
    cluster.restart_stopped();
    check(cluster.client(1).await, acked).await;
}

/// The leader's disk fills up: it refuses writes with NOSPACE and hands leadership to a
/// follower, the cluster takes writes again, the full node falls behind, and it catches up by
/// itself once space returns — no acknowledged write lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_a_full_disk_hands_over_and_catches_up_when_space_returns() {
    let cluster = Cluster::start(3, FULL_DISK_FLAGS);
    let full = 1;
    let Some((disk, _mount)) = move_onto_powercut_disk(&cluster, 1) else {
        return;
    };
    let mut c = cluster.client(full).await;
    c.set_timeout(Duration::from_secs(10));
    assert_eq!(c.command(&["CLUSTER", "FAILOVER"]).await.unwrap(), ok());
    assert_eq!(cluster.wait_for_leader(&[full], Duration::from_secs(10)).await, full);

    let value = full_disk_value;
    let mut acked = Vec::new();
    let refusal = write_until_the_disk_fills(&mut c, &disk, &mut acked).await;
    assert!(refusal.starts_with("NOSPACE"), "{refusal}");
    let leader = cluster.wait_for_leader(&[2, 3], Duration::from_secs(10)).await;
    let mut c = cluster.client(leader).await;
    c.set_timeout(Duration::from_secs(10));
    for _ in 0..300 {
        let i = acked.len();
        assert_eq!(
            c.command(&["SET", &format!("full-{i}"), &value(i)]).await.unwrap(),
            ok()
        );
        acked.push(i);
    }
    let target = cluster.info_u64(leader, "raft_commit_index").await;
    assert!(
        cluster.info_u64(full, "raft_applied_index").await < target,
        "the node with the full disk kept up"
    );
    assert!(metric_value(&cluster.metrics(full), "chorus_raft_disk_full_refusals_total") >= 1.0);

    disk.set_capacity_bytes(None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.info_u64(full, "raft_applied_index").await < target {
        assert!(
            Instant::now() < deadline,
            "the node did not catch up within 30 s of space returning"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in [full, leader] {
        let mut c = cluster.client(id).await;
        for &i in &acked {
            assert_eq!(
                c.command(&["GET", &format!("full-{i}")]).await.unwrap(),
                bulk(&value(i)),
                "acknowledged full-{i} lost on node {id}"
            );
        }
    }
}

/// Server flags for the full-disk tests: small raft log segments (the log's preallocation runs
/// out early), frequent snapshots and small reduction batches (segments written all the time).
const FULL_DISK_FLAGS: &[&str] = &[
    "--segment-size-bytes",
    "1048576",
    "--snapshot-interval-entries",
    "200",
    "--log-keep-entries",
    "50",
    "--reduction-batch-writes",
    "64",
    "--tick-ms",
    "20",
];

/// Moves node 1's data directory onto a fresh power-cut disk and restarts it there; `None` (the
/// test is skipped) where FUSE cannot be mounted.
fn move_onto_powercut_disk(cluster: &Cluster, id: u64) -> Option<(chorus_powercut::Disk, chorus_powercut::Mount)> {
    cluster.kill(id);
    let data = cluster.dir.path().join(format!("node{id}/data"));
    let first_start = cluster.dir.path().join(format!("node{id}/data-first-start"));
    std::fs::rename(&data, &first_start).unwrap();
    std::fs::create_dir(&data).unwrap();
    let disk = chorus_powercut::Disk::new();
    let mount = chorus_powercut::mount_for_test(&disk, &data).ok()?;
    copy_tree_durably(&first_start, &data);
    cluster.restart_stopped();
    Some((disk, mount))
}

fn full_disk_value(i: usize) -> String {
    format!("{i}-{}", "v".repeat(1000))
}

/// Writes 1 KiB values as `full-<i>` through `c`, recording each acknowledged `i` in `acked`:
/// 50 first (so the raft log leaves its first plain segment for a preallocated one), then with
/// 4 MiB left on `disk` until a write is refused; returns the refusal.
async fn write_until_the_disk_fills(c: &mut Client, disk: &chorus_powercut::Disk, acked: &mut Vec<usize>) -> String {
    for _ in 0..50 {
        let i = acked.len();
        let key = format!("full-{i}");
        assert_eq!(c.command(&["SET", &key, &full_disk_value(i)]).await.unwrap(), ok());
        acked.push(i);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    disk.set_capacity_bytes(Some(disk.used_bytes() + 4 * 1024 * 1024));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "60 s of writes never filled the disk");
        let i = acked.len();
        match c
            .command(&["SET", &format!("full-{i}"), &full_disk_value(i)])
            .await
            .unwrap()
        {
            reply if reply == ok() => acked.push(i),
            Value::Error(message) => return message,
            other => panic!("unexpected reply {other:?}"),
        }
    }
}

/// The cluster's nodes as `cluster.toml` lists them now.
fn listed_nodes(cluster: &Cluster) -> Vec<NodeEntry> {
    let file: ClusterFile =
        toml::from_str(&std::fs::read_to_string(Path::new(cluster.dir()).join("cluster.toml")).unwrap()).unwrap();
    file.nodes
}

/// `GET /members` on a node's metrics port: (id, role) per member.
fn members_of(node: &NodeEntry) -> Vec<(u64, String)> {
    let mut stream = TcpStream::connect(node.metrics_addr).unwrap();
    stream
        .write_all(b"GET /members HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    body.lines()
        .skip(1)
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            (words[0].parse().unwrap(), words[2].to_string())
        })
        .collect()
}

/// Membership changes under a write load: 3 → 5 voters (two learners caught up, then promoted
/// through one joint configuration), a new node restarted (it finds its peers in what it
/// recorded, not in its config), then 5 → 3 by removing the leader (after it hands over) and
/// another original node. No write fails for good, and every acknowledged one is on every
/// remaining node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_grows_to_five_and_shrinks_to_three_under_load_losing_no_write() {
    grow_to_five_and_shrink_to_three_under_load(&Cluster::start(3, &[]), |_| {}).await;
}

/// The same with CURP's fast path taken by every follower: the witnesses follow the voters —
/// writes complete in one round trip under the five voters' witnesses and again under the last
/// three's, across a leader that hands over and recovers — and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_curp_the_witnesses_follow_the_voters_through_growth_and_shrinkage() {
    let cluster = Cluster::start(3, CURP_ON);
    let fast_writes = |nodes: &[NodeEntry]| -> f64 {
        nodes
            .iter()
            .map(|n| {
                metric_value(
                    &http_get(n.metrics_addr, "/metrics"),
                    "chorus_curp_fast_path_writes_total",
                )
            })
            .sum()
    };
    let mut fast_when_shrunk = 0.0;
    grow_to_five_and_shrink_to_three_under_load(&cluster, |phase| match phase {
        Phase::Grown(nodes) => {
            // The writers' followers go on taking the fast path, now recorded by five witnesses:
            // the new nodes' too.
            let before = fast_writes(nodes);
            let deadline = Instant::now() + Duration::from_secs(10);
            tokio::task::block_in_place(|| {
                while fast_writes(nodes) <= before {
                    assert!(Instant::now() < deadline, "no fast-path write under five voters");
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            for node in nodes.iter().filter(|n| n.id > 3) {
                let accepted = metric_value(
                    &http_get(node.metrics_addr, "/metrics"),
                    "chorus_curp_witness_accepted_total",
                );
                assert!(accepted > 0.0, "node {}'s witness recorded no write", node.id);
            }
        }
        Phase::Shrunk(nodes) => fast_when_shrunk = fast_writes(nodes),
    })
    .await;
    // Writes go on in one round trip under the last three voters' witnesses.
    let remaining = listed_nodes(&cluster);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut written = 0;
    while fast_writes(&remaining) <= fast_when_shrunk {
        assert!(
            Instant::now() < deadline,
            "no fast-path write under the last three voters"
        );
        for node in &remaining {
            let mut c = Client::connect(node.resp_addr).await.unwrap();
            assert_eq!(
                c.command(&["SET", &format!("after{written}"), "y"]).await.unwrap(),
                ok()
            );
            written += 1;
        }
    }
    let mut c = Client::connect(remaining[0].resp_addr).await.unwrap();
    for i in 0..written {
        assert_eq!(c.command(&["GET", &format!("after{i}")]).await.unwrap(), bulk("y"));
    }
}

/// Where `grow_to_five_and_shrink_to_three_under_load` stands, with the members then.
enum Phase<'a> {
    Grown(&'a [NodeEntry]),
    Shrunk(&'a [NodeEntry]),
}

/// Grows `cluster` from 3 to 5 voters and shrinks it back to 3 (removing its leader and another
/// original node) under four exactly-once writers, telling `at` of each phase; checks every
/// acknowledged write is on every remaining node.
async fn grow_to_five_and_shrink_to_three_under_load(cluster: &Cluster, mut at: impl FnMut(Phase)) {
    let addrs: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.resp_addr).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            // Each starts on another node, so followers take writes too.
            let mut addrs = addrs.clone();
            let first = w % addrs.len();
            addrs.rotate_left(first);
            tokio::spawn(write_until(addrs, format!("grow{w}-"), stop.clone(), Arc::default()))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dir = cluster.dir().to_string();
    let chorus = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || run_chorus(&args.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    let said = chorus(vec![
        "cluster".into(),
        "add-node".into(),
        "--dir".into(),
        dir.clone(),
        "--count".into(),
        "2".into(),
    ])
    .await
    .unwrap();
    assert!(
        said.contains("node(s) 4,5: voters, through a joint configuration"),
        "{said}"
    );
    let nodes = listed_nodes(cluster);
    assert_eq!(nodes.len(), 5);
    for node in &nodes {
        let members = members_of(node);
        assert_eq!(members.len(), 5, "node {}: {members:?}", node.id);
        assert!(
            members.iter().all(|(_, role)| role == "voter"),
            "node {}: {members:?}",
            node.id
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    at(Phase::Grown(&nodes));
    // A new node restarted knows its peers from its own records (its config names only the
    // members it joined).
    run_chorus(&["cluster", "kill", "--dir", &dir, "--node", "5"]);
    cluster.restart_stopped();
    let leader_id = cluster.info_u64(3, "raft_leader_id").await;
    assert!(leader_id > 0);
    let other = [1, 2, 3].into_iter().find(|id| *id != leader_id).unwrap();
    for id in [leader_id, other] {
        let said = chorus(vec![
            "cluster".into(),
            "remove-node".into(),
            "--dir".into(),
            dir.clone(),
            "--node".into(),
            id.to_string(),
        ])
        .await
        .unwrap();
        assert!(said.contains(&format!("node {id}: removed")), "{said}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.push(writer.await.unwrap());
    }
    let remaining = listed_nodes(cluster);
    assert_eq!(remaining.len(), 3);
    assert!(remaining.iter().all(|n| n.id != leader_id && n.id != other));
    at(Phase::Shrunk(&remaining));
    for node in &remaining {
        let members: Vec<u64> = members_of(node).into_iter().map(|(id, _)| id).collect();
        assert_eq!(
            members,
            remaining.iter().map(|n| n.id).collect::<Vec<_>>(),
            "node {}",
            node.id
        );
        let mut c = Client::connect(node.resp_addr).await.unwrap();
        for (w, count) in acknowledged.iter().enumerate() {
            assert!(*count > 0, "writer {w} wrote");
            for i in 0..*count {
                assert_eq!(
                    c.command(&["GET", &format!("grow{w}-{i}")]).await.unwrap(),
                    bulk("x"),
                    "node {}",
                    node.id
                );
            }
        }
    }
}

/// A membership change asked of a follower (its metrics port, as an operator would with curl)
/// is handed to the leader and made: the follower answers with the new configuration, every
/// node applies it, and the cluster keeps taking writes on its two remaining nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_hands_a_membership_change_to_the_leader() {
    let cluster = Cluster::start(3, &[]);
    let (leader, followers) = cluster.leader_and_followers().await;
    let (asked, removed) = (followers[0], followers[1]);
    let answer = http_request(
        cluster.node(asked).metrics_addr,
        "POST",
        &format!("/members/remove?ids={removed}"),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let voters = |listing: &str| -> Vec<u64> {
        listing
            .lines()
            .filter(|line| line.contains("voter"))
            .filter_map(|line| line.split_whitespace().next()?.parse().ok())
            .collect()
    };
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let mut expected = vec![leader, asked];
    expected.sort();
    assert_eq!(voters(body), expected, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    for id in [leader, asked] {
        loop {
            let listing = http_get(cluster.node(id).metrics_addr, "/members");
            if voters(&listing) == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} never applied the change: {listing}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut c = cluster.client(asked).await;
    assert_eq!(c.command(&["SET", "after-removal", "1"]).await.unwrap(), ok());
    assert_eq!(
        cluster
            .client(leader)
            .await
            .command(&["GET", "after-removal"])
            .await
            .unwrap(),
        bulk("1")
    );
}

/// `chorus backup` of a cluster under writes, `chorus restore` into a new one: the restored
/// cluster holds the source's state at the backup's index — of each writer's sequence of
/// writes, every one acknowledged before the backup began and none sent after it ended, a
/// prefix with no gap — and takes writes of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_writes_restores_into_a_new_cluster_equal_at_its_index() {
    let cluster = Cluster::start(3, &[]);
    let addrs: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.resp_addr).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let progress: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::default()).collect();
    let writers: Vec<_> = (0..3)
        .map(|w| {
            tokio::spawn(write_until(
                addrs.clone(),
                format!("bk{w}-"),
                stop.clone(),
                progress[w].clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let backup_file = cluster.dir.path().join("backup.chorus");
    let acknowledged_before: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    let (dir, to) = (cluster.dir().to_string(), backup_file.to_str().unwrap().to_string());
    let said = tokio::task::spawn_blocking(move || run_chorus(&["backup", "--cluster", &dir, "--to", &to]))
        .await
        .unwrap();
    assert!(said.contains("its SHA-256 checked"), "{said}");
    // Each writer has at most one write in flight: none past this was sent before the end.
    let sent_by_end: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed) + 1).collect();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }

    let restored_dir = tempfile::tempdir().unwrap();
    let restored_path = restored_dir.path().to_path_buf();
    let said = run_chorus(&[
        "restore",
        "--from",
        backup_file.to_str().unwrap(),
        "--dir",
        restored_path.to_str().unwrap(),
    ]);
    assert!(said.contains("restored index"), "{said}");
    let file: ClusterFile =
        toml::from_str(&std::fs::read_to_string(restored_path.join("cluster.toml")).unwrap()).unwrap();
    let restored = Cluster {
        dir: restored_dir,
        nodes: file.nodes,
    };
    for id in 1..=3 {
        let mut c = restored.client(id).await;
        for w in 0..3 {
            let mut n = 0;
            while c.command(&["EXISTS", &format!("bk{w}-{n}")]).await.unwrap() == Value::Integer(1) {
                n += 1;
            }
            assert!(
                n >= acknowledged_before[w] && n <= sent_by_end[w],
                "node {id}, writer {w}: {n} writes, acknowledged before {}, sent by the end {}",
                acknowledged_before[w],
                sent_by_end[w]
            );
            for later in n..sent_by_end[w] + 2 {
                assert_eq!(
                    c.command(&["EXISTS", &format!("bk{w}-{later}")]).await.unwrap(),
                    Value::Integer(0),
                    "no gap: write {later} of writer {w} on node {id}"
                );
            }
        }
    }
    let mut c = restored.client(2).await;
    assert_eq!(
        c.command(&["SET", "after-restore", "1"]).await.unwrap(),
        Value::Simple("OK".into())
    );

    // A restore that recorded its snapshot and stopped before deleting the backup finishes on
    // the next start: the leftover goes, the state stays.
    let keys = c.command(&["DBSIZE"]).await.unwrap();
    restored.kill(1);
    let leftover = restored_path.join("node1/data").join(chorus_log::backup::RESTORE_DIR);
    chorus_log::backup::unpack(&backup_file, &leftover).unwrap();
    restored.restart_stopped();
    assert!(!leftover.exists(), "the finished restore's backup was deleted");
    let mut c = restored.client(1).await;
    assert_eq!(c.command(&["DBSIZE"]).await.unwrap(), keys);
}
