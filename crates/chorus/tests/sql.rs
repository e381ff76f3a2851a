//! Integration tests of the SQL middleware: real `chorus sql` node processes on 127.0.0.1,
//! real PostgreSQL clients (psql and tokio-postgres).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

mod common;
use common::{run_chorus_in, CHORUS};

struct Node {
    pg: SocketAddr,
    metrics: SocketAddr,
    dir: PathBuf,
    child: Option<Child>,
    /// On the PostgreSQL engine: the node's own server (stopped on drop).
    engine: Option<NodeServer>,
}

/// A node's own PostgreSQL server.
struct NodeServer {
    dir: PathBuf,
    addr: SocketAddr,
    /// The `chorus sql` flags naming it.
    flags: Vec<String>,
}

/// The database under the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Sqlite,
    /// A PostgreSQL server per node, started as `chorus cluster start` does.
    Postgres,
}

/// A local cluster of `chorus sql` nodes, stopped when dropped.
struct SqlCluster {
    dir: tempfile::TempDir,
    peers: String,
    nodes: Vec<Node>,
    /// Extra `chorus sql` flags for every node.
    args: Vec<String>,
}

impl SqlCluster {
    fn start(count: u64) -> SqlCluster {
        Self::start_with(count, &[])
    }

    fn start_with(count: u64, args: &[&str]) -> SqlCluster {
        Self::start_on(Engine::Sqlite, count, args)
    }

    fn start_on(engine: Engine, count: u64, args: &[&str]) -> SqlCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports = chorus_cluster::ports::free_loopback_ports(4 * count as usize).expect("free ports");
        let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let peers = (0..count)
            .map(|i| format!("{}={}", i + 1, addr(ports[3 * i as usize])))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = (0..count)
            .map(|i| Node {
                pg: addr(ports[3 * i as usize + 1]),
                metrics: addr(ports[3 * i as usize + 2]),
                dir: dir.path().join(format!("node{}", i + 1)),
                child: None,
                engine: (engine == Engine::Postgres).then(|| {
                    let server = addr(ports[3 * count as usize + i as usize]);
                    let server_dir = dir.path().join(format!("postgres{}", i + 1));
                    std::fs::create_dir_all(&server_dir).unwrap();
                    chorus_cluster::postgres::ensure_running(dir.path(), &server_dir, server)
                        .expect("PostgreSQL starts (scripts/install-bench-tools installs it)");
                    let flags = vec![
                        "--sql-engine".to_string(),
                        "postgres".to_string(),
                        "--sql-postgres".to_string(),
                        chorus_cluster::postgres::conninfo(server),
                    ];
                    NodeServer {
                        dir: server_dir,
                        addr: server,
                        flags,
                    }
                }),
            })
            .collect();
        let mut cluster = SqlCluster {
            dir,
            peers,
            nodes,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        for id in 1..=count {
            cluster.launch(id);
        }
        cluster
    }

    fn node(&self, id: u64) -> &Node {
        &self.nodes[id as usize - 1]
    }

    fn launch(&mut self, id: u64) {
        let peers = self.peers.clone();
        let mut args = self.args.clone();
        let node = &mut self.nodes[id as usize - 1];
        if let Some(server) = &node.engine {
            args.extend(server.flags.iter().cloned());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.dir.with_extension("log"))
            .expect("node log");
        let child = Command::new(CHORUS)
            .args(["sql", "--id", &id.to_string(), "--peers", &peers])
            .args(["--data-dir", node.dir.to_str().expect("utf-8 path")])
            .args([
                "--pg-addr",
                &node.pg.to_string(),
                "--metrics-addr",
                &node.metrics.to_string(),
            ])
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start chorus sql");
        node.child = Some(child);
    }

    fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.nodes[id as usize - 1].child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
        }
    }

    /// Sends node `id` SIGTERM: it shuts down as an operator's `kill` or a supervisor does.
    fn terminate(&self, id: u64) {
        let child = self.nodes[id as usize - 1].child.as_ref().expect("node running");
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }

    /// Waits up to `within` for node `id`'s process to exit; whether it did.
    fn exited_within(&mut self, id: u64, within: Duration) -> bool {
        let node = &mut self.nodes[id as usize - 1];
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if node
                .child
                .as_mut()
                .expect("node started")
                .try_wait()
                .expect("wait")
                .is_some()
            {
                node.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn gauge(&self, id: u64, name: &str) -> Option<u64> {
        metric_at(self.node(id).metrics, name)
    }

    /// The last lines of node `id`'s log, without raft's chatter and backtrace frames (a node
    /// that exits with RUST_BACKTRACE set would fill the tail with frames, hiding its error).
    fn log_tail(&self, id: u64) -> String {
        let log = std::fs::read_to_string(self.node(id).dir.with_extension("log")).unwrap_or_default();
        let frame = |line: &str| {
            let line = line.trim_start();
            line.starts_with("at ")
                || line
                    .split_once(": ")
                    .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        };
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains(" raft: ") && !frame(l)).collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The ends of the logs of nodes `ids`, each under its node's name.
    fn log_tails(&self, ids: &[u64]) -> String {
        ids.iter()
            .map(|id| format!("node {id}:\n{}", self.log_tail(*id)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until node `id` has compacted its log past `index` (snapshots are written off its
    /// main thread).
    async fn wait_for_compaction(&self, id: u64, index: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.gauge(id, "chorus_raft_first_index").unwrap_or(0) <= index {
            assert!(
                Instant::now() < deadline,
                "node {id} did not compact its log past {index}; its log ends:\n{}",
                self.log_tail(id)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn role(&self, id: u64) -> Option<u64> {
        self.gauge(id, "chorus_raft_role")
    }

    /// Waits until node `id` answers `query` with `expected`.
    async fn wait_for_rows(&self, id: u64, query: &str, expected: &[Vec<Option<String>>]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let config = format!(
                "host=127.0.0.1 port={} user=chorus connect_timeout=2",
                self.node(id).pg.port()
            );
            if let Ok((client, connection)) = tokio_postgres::connect(&config, NoTls).await {
                tokio::spawn(connection);
                if let Ok(messages) = client.simple_query(query).await {
                    if rows_of(messages) == expected {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "node {id} does not answer {query} with {expected:?}; its log ends:\n{}",
                self.log_tail(id)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until node `id` answers `query` with `expected`, asked over TLS by psql.
    async fn wait_for_rows_over_tls(
        &self,
        id: u64,
        ca: &std::path::Path,
        query: &str,
        expected: &[Vec<Option<String>>],
    ) {
        let want: Vec<String> = expected
            .iter()
            .map(|row| {
                row.iter()
                    .map(|v| v.clone().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("psql")
                .arg(format!(
                    "host=127.0.0.1 port={} user=chorus dbname=chorus sslmode=verify-full sslrootcert={}",
                    self.node(id).pg.port(),
                    ca.display()
                ))
                .args(["-X", "-A", "-t", "-c", query])
                .output()
                .unwrap();
            let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect();
            if out.status.success() && got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} does not answer {query} with {want:?} over TLS: {got:?} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until one of `ids` leads and returns it.
    async fn leader_among(&self, ids: &[u64]) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(&leader) = ids.iter().find(|&&id| self.role(id) == Some(3)) {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no leader among {ids:?}; their logs end:\n{}",
                self.log_tails(ids)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `sql` as one transaction on the leader and returns the leader: refused by a node
    /// that stopped leading (an election on a loaded machine), it changed nothing and is run
    /// again on the new leader.
    async fn setup(&self, sql: &str) -> u64 {
        let all: Vec<u64> = (1..=self.nodes.len() as u64).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let leader = self.leader_among(&all).await;
            let outcome = self
                .client(leader)
                .await
                .batch_execute(&format!("BEGIN; {sql}; COMMIT;"))
                .await;
            match outcome {
                Ok(()) => return leader,
                Err(e) if e.code().map(|c| c.code()) == Some("25006") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("setup on node {leader} failed: {e}"),
            }
        }
    }

    /// Runs `sql` on the leader among `ids`, again while a node refuses it for not leading
    /// (25006: nothing ran); the node that ran it and the rows it returned.
    async fn write_on_leader(&self, ids: &[u64], sql: &str) -> (u64, Vec<Vec<Option<String>>>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let leader = self.leader_among(ids).await;
            match self.client(leader).await.simple_query(sql).await {
                Ok(messages) => return (leader, rows_of(messages)),
                Err(e) if e.code().map(|c| c.code()) == Some("25006") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("{sql} on node {leader}: {e}"),
            }
        }
    }

    /// Crashes node `id`'s PostgreSQL server (a SIGKILLed backend makes the server reset and
    /// recover from its WAL) and returns a connection to it once it takes them again.
    /// Node `id`'s PostgreSQL server's connection string.
    fn server_conninfo(&self, id: u64) -> String {
        format!(
            "{} connect_timeout=2",
            chorus_cluster::postgres::conninfo(self.node_server(id).addr)
        )
    }

    /// Node `id`'s own PostgreSQL server.
    fn node_server(&self, id: u64) -> &NodeServer {
        self.node(id).engine.as_ref().expect("a PostgreSQL engine")
    }

    /// A client of node `id`'s PostgreSQL server itself, behind the node's back.
    async fn server(&self, id: u64) -> Client {
        let (server, connection) = tokio_postgres::connect(&self.server_conninfo(id), NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        server
    }

    /// Node `id`'s PostgreSQL server, stopped (a fast shutdown).
    fn stop_postgres(&self, id: u64) {
        chorus_cluster::postgres::stop(&self.node_server(id).dir);
    }

    /// Node `id`'s PostgreSQL server, started again; returns once it takes connections.
    fn start_postgres(&self, id: u64) {
        let server = self.node_server(id);
        chorus_cluster::postgres::ensure_running(self.dir.path(), &server.dir, server.addr).expect("PostgreSQL starts");
    }

    async fn crash_postgres(&self, id: u64) -> Client {
        let conninfo = self.server_conninfo(id);
        let server = self.server(id).await;
        // The node commits without waiting for the WAL's flush (a lost tail replays from the
        // log); a commit that writes WAL and waits for it flushes everything before it, so the
        // crash keeps what the node applied.
        server
            .batch_execute("BEGIN; SET LOCAL synchronous_commit = on; CREATE TEMP TABLE flushed (); COMMIT")
            .await
            .unwrap();
        let pid: i32 = server.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
        // Crash recovery ends with a checkpoint of its own: until it is there, a connection may
        // be one the postmaster took before it saw the crash, and is about to cut.
        const CHECKPOINT: &str = "SELECT checkpoint_lsn::text FROM pg_control_checkpoint()";
        let before: String = server.query_one(CHECKPOINT, &[]).await.unwrap().get(0);
        let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
        assert!(killed.success(), "kill -KILL {pid}");
        assert!(server.simple_query("SELECT 1").await.is_err(), "the backend was killed");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((server, connection)) = tokio_postgres::connect(&conninfo, NoTls).await {
                tokio::spawn(connection);
                if let Ok(row) = server.query_one(CHECKPOINT, &[]).await {
                    if row.get::<_, String>(0) != before {
                        return server;
                    }
                }
            }
            assert!(Instant::now() < deadline, "node {id}'s server did not recover");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn client(&self, id: u64) -> Client {
        self.try_client(id).await.expect("connect")
    }

    /// A client of node `id`, if it takes connections.
    async fn try_client(&self, id: u64) -> Option<Client> {
        try_pg_client(self.node(id).pg).await
    }

    fn psql(&self, id: u64, script: &str) -> String {
        let node = self.node(id);
        let mut child = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &node.pg.port().to_string(),
                "-U",
                "chorus",
                "-d",
                "chorus",
            ])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("psql is installed (scripts/install-bench-tools installs postgresql-client)");
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "psql on node {id} failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }
}

impl Drop for SqlCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = self
                .nodes
                .iter()
                .map(|node| (node.dir.display().to_string(), node.dir.with_extension("log")));
            common::print_log_tails(logs, 40);
        }
        for id in 1..=self.nodes.len() as u64 {
            self.kill(id);
        }
        for server in self.nodes.iter().filter_map(|n| n.engine.as_ref()) {
            chorus_cluster::postgres::stop(&server.dir);
        }
    }
}

/// The unlabelled metric `name` on the metrics port `addr`, if it answers.
fn metric_at(addr: SocketAddr, name: &str) -> Option<u64> {
    let metrics = http_get(addr, "/metrics")?;
    let prefix = format!("{name} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

/// Every row of `query`, as text, from a simple query.
async fn rows(client: &Client, query: &str) -> Vec<Vec<Option<String>>> {
    rows_of(client.simple_query(query).await.expect(query))
}

fn rows_of(messages: Vec<SimpleQueryMessage>) -> Vec<Vec<Option<String>>> {
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some((0..row.len()).map(|i| row.get(i).map(str::to_owned)).collect()),
            _ => None,
        })
        .collect()
}

fn others(leader: u64) -> Vec<u64> {
    (1..=3).filter(|&id| id != leader).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_and_tokio_postgres_on_different_nodes_see_each_others_committed_writes() {
    sessions_on_different_nodes_see_each_others_committed_writes(Engine::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_sessions_on_different_nodes_see_each_others_committed_writes() {
    sessions_on_different_nodes_see_each_others_committed_writes(Engine::Postgres).await;
}

async fn sessions_on_different_nodes_see_each_others_committed_writes(engine: Engine) {
    let cluster = SqlCluster::start_on(engine, 3, &[]);
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let followers = others(leader);

    cluster.psql(
        leader,
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL, score REAL);
         BEGIN;
         INSERT INTO notes VALUES (1, 'from psql', 1.5);
         INSERT INTO notes VALUES (2, 'also psql', NULL);
         COMMIT;",
    );
    // A prepared statement with parameters, over the extended protocol, on the leader.
    let writer = cluster.client(leader).await;
    let inserted = writer
        .execute(
            "INSERT INTO notes (id, body, score) VALUES ($1, $2, $3)",
            &[&"3", &"from tokio-postgres", &"2.25"],
        )
        .await
        .expect("prepared insert");
    assert_eq!(inserted, 1);
    let typed = writer
        .query_typed(
            "SELECT id, body FROM notes WHERE id >= $1 ORDER BY id",
            &[(&2i64, tokio_postgres::types::Type::INT8)],
        )
        .await
        .expect("typed query");
    assert_eq!(typed.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), vec![2, 3]);

    // Linearizable reads on a follower see every write acknowledged before they began.
    let reader = cluster.client(followers[0]).await;
    let seen = reader
        .query("SELECT id, body, score FROM notes ORDER BY id", &[])
        .await
        .expect("follower read");
    let seen: Vec<(i64, String, Option<f64>)> = seen.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(
        seen,
        vec![
            (1, "from psql".into(), Some(1.5)),
            (2, "also psql".into(), None),
            (3, "from tokio-postgres".into(), Some(2.25)),
        ]
    );
    assert_eq!(
        cluster
            .psql(followers[1], "SELECT count(*), sum(id) FROM notes;")
            .trim(),
        "3|6"
    );

    // A replica refuses writes with the SQLSTATE a PostgreSQL standby gives, and changes nothing.
    let refused = reader
        .simple_query("INSERT INTO notes VALUES (9, 'nope', NULL)")
        .await
        .expect_err("a replica refuses writes");
    assert_eq!(refused.code().map(|c| c.code()), Some("25006"), "{refused}");

    // A failed statement aborts its transaction as in PostgreSQL, and nothing of it replicates.
    writer.simple_query("BEGIN").await.unwrap();
    writer
        .simple_query("INSERT INTO notes VALUES (4, 'rolled back', NULL)")
        .await
        .unwrap();
    let duplicate = writer
        .simple_query("INSERT INTO notes VALUES (1, 'duplicate', NULL)")
        .await
        .expect_err("duplicate key");
    assert_eq!(duplicate.code().map(|c| c.code()), Some("23505"), "{duplicate}");
    let ignored = writer.simple_query("SELECT 1").await.expect_err("aborted transaction");
    assert_eq!(ignored.code().map(|c| c.code()), Some("25P02"));
    writer.simple_query("COMMIT").await.unwrap();
    assert_eq!(
        rows(&reader, "SELECT count(*) FROM notes WHERE id = 4").await,
        vec![vec![Some("0".to_string())]]
    );
}

/// psycopg 3, installed by `scripts/install-client-libs`, runs `tests/clients/psycopg_check.py`:
/// parameters, executemany, transaction blocks, a unique violation rolling a block back, reads
/// on a replica, and a replica refusing a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg_passes_its_check_against_a_cluster() {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = manifest_dir.join("../../target/client-libs/python/bin/python");
    assert!(
        python.exists(),
        "the client libraries are not installed; run scripts/install-client-libs (scripts/test does)"
    );
    let cluster = SqlCluster::start(3);
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let port = |id: u64| cluster.node(id).pg.port().to_string();
    let out = Command::new(python)
        .arg(manifest_dir.join("tests/clients/psycopg_check.py"))
        .args([port(leader), port(others(leader)[0])])
        .output()
        .expect("run the psycopg check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.trim() == "ok", "psycopg: {text}");
}

/// PostgreSQL's own functions: random() is seeded alike on every node, clock reads become the
/// transaction's fixed time as typed literals (arithmetic on them works), and what PostgreSQL
/// cannot seed is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_non_deterministic_statements_are_fixed_once_or_refused_by_name() {
    let cluster = SqlCluster::start_on(Engine::Postgres, 3, &[]);
    let leader = cluster
        .setup(
            "CREATE TABLE draws (n DOUBLE PRECISION, at TIMESTAMPTZ, yesterday TIMESTAMPTZ, day DATE);
             INSERT INTO draws VALUES (random(), CURRENT_TIMESTAMP, now() - interval '1 day', CURRENT_DATE);
             INSERT INTO draws SELECT random(), now(), at - interval '1 hour', CURRENT_DATE FROM draws",
        )
        .await;
    let client = cluster.client(leader).await;
    let query = "SELECT n, at, yesterday, day FROM draws ORDER BY n";
    let on_leader = rows(&client, query).await;
    assert_eq!(on_leader.len(), 2);
    assert_ne!(on_leader[0][0], on_leader[1][0], "each row drew its own value");
    for follower in others(leader) {
        assert_eq!(
            rows(&cluster.client(follower).await, query).await,
            on_leader,
            "node {follower}"
        );
    }
    for (statement, named) in [
        (
            "INSERT INTO draws (n) VALUES (length(gen_random_uuid()::text))",
            "gen_random_uuid",
        ),
        ("INSERT INTO draws (at) VALUES (clock_timestamp())", "clock_timestamp"),
        (
            "CREATE TABLE stamped (at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP)",
            "CURRENT_TIMESTAMP",
        ),
    ] {
        let error = client.simple_query(statement).await.expect_err(statement);
        let db_error = error.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "0A000", "{statement}: {db_error}");
        assert!(db_error.message().contains(named), "{statement}: {db_error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_deterministic_statements_are_fixed_once_or_refused_by_name() {
    let cluster = SqlCluster::start(3);
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let client = cluster.client(leader).await;
    client
        .batch_execute(
            "CREATE TABLE draws (n INTEGER, blob BLOB, id TEXT, at TEXT, day TEXT);
             INSERT INTO draws VALUES (random(), randomblob(8), gen_random_uuid(), CURRENT_TIMESTAMP, date('now'));
             INSERT INTO draws SELECT random(), randomblob(8), gen_random_uuid(), now(), CURRENT_DATE FROM draws;",
        )
        .await
        .expect("non-deterministic functions are fixed");
    let query = "SELECT n, hex(blob), id, at, day FROM draws ORDER BY n";
    let on_leader = rows(&client, query).await;
    assert_eq!(on_leader.len(), 2);
    assert_ne!(on_leader[0], on_leader[1], "each row drew its own values");
    for follower in others(leader) {
        assert_eq!(
            rows(&cluster.client(follower).await, query).await,
            on_leader,
            "node {follower}"
        );
    }
    for (statement, named) in [
        (
            "INSERT INTO draws (at) VALUES (datetime('now', 'localtime'))",
            "localtime",
        ),
        (
            "CREATE TABLE stamped (at TEXT DEFAULT CURRENT_TIMESTAMP)",
            "CURRENT_TIMESTAMP",
        ),
        ("ATTACH DATABASE '/tmp/elsewhere.db' AS elsewhere", "ATTACH"),
    ] {
        let error = client.simple_query(statement).await.expect_err(statement);
        let db_error = error.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "0A000", "{statement}: {db_error}");
        assert!(db_error.message().contains(named), "{statement}: {db_error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_from_stdin_loads_rows_everywhere_and_a_bad_row_loads_none() {
    use futures::SinkExt;
    let cluster = SqlCluster::start(3);
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let out = cluster.psql(
        leader,
        "CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, note TEXT);\n\
         \\copy people FROM STDIN\n\
         1\tada\t\\N\n\
         2\tgrace\ttab\\there\n\
         \\.\n\
         \\copy people (id, name) FROM STDIN WITH (FORMAT csv, HEADER true)\n\
         id,name\n\
         3,\"hopper, grace\"\n\
         \\.\n\
         SELECT count(*) FROM people;\n",
    );
    assert_eq!(out.lines().last(), Some("3"), "psql said:\n{out}");

    let client = cluster.client(leader).await;
    let sink = client.copy_in("COPY people FROM STDIN (FORMAT csv)").await.unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(b"4,linus,\n5,ken,")).await.unwrap();
    assert_eq!(sink.finish().await.unwrap(), 2);
    let sink = client.copy_in("COPY people FROM STDIN (FORMAT csv)").await.unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(b"6,new,\n1,again,\n"))
        .await
        .unwrap();
    let error = sink.finish().await.expect_err("a duplicate key fails the COPY");
    assert_eq!(error.as_db_error().expect("a server error").code().code(), "23505");

    let query = "SELECT id, name, note FROM people ORDER BY id";
    let expected = vec![
        vec![Some("1".into()), Some("ada".into()), None],
        vec![Some("2".into()), Some("grace".into()), Some("tab\there".into())],
        vec![Some("3".into()), Some("hopper, grace".into()), None],
        vec![Some("4".into()), Some("linus".into()), None],
        vec![Some("5".into()), Some("ken".into()), None],
    ];
    assert_eq!(rows(&client, query).await, expected);
    for follower in others(leader) {
        cluster.wait_for_rows(follower, query, &expected).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_answers_on_a_replica_cut_off_from_the_leader_and_a_linearizable_one_does_not() {
    let mut cluster = SqlCluster::start(3);
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    cluster
        .client(leader)
        .await
        .batch_execute("CREATE TABLE kept (v TEXT); INSERT INTO kept VALUES ('committed')")
        .await
        .unwrap();
    let [replica, other] = others(leader)[..] else {
        unreachable!()
    };
    let committed = vec![vec![Some("committed".to_owned())]];
    cluster.wait_for_rows(replica, "SELECT v FROM kept", &committed).await;
    let session = cluster.client(replica).await;
    assert_eq!(
        rows(&session, "SHOW chorus.read_consistency").await,
        vec![vec![Some("linearizable".to_owned())]]
    );
    cluster.kill(leader);
    cluster.kill(other);
    let error = session
        .simple_query("SELECT v FROM kept")
        .await
        .expect_err("no majority, no linearizable read");
    assert_eq!(error.as_db_error().expect("a server error").code().code(), "57P03");

    session
        .batch_execute("SET chorus.read_consistency = 'stale'")
        .await
        .unwrap();
    assert_eq!(rows(&session, "SELECT v FROM kept").await, committed);
    assert_eq!(
        rows(&session, "SHOW chorus.read_consistency").await,
        vec![vec![Some("stale".to_owned())]]
    );
    let error = session
        .batch_execute("SET chorus.read_consistency = 'sometimes'")
        .await
        .expect_err("an unknown consistency");
    assert_eq!(error.as_db_error().expect("a server error").code().code(), "22023");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_mode_replicates_what_cannot_be_made_deterministic_by_its_write_set() {
    let cluster = SqlCluster::start_with(3, &["--sql-mode", "auto"]);
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let client = cluster.client(leader).await;
    client
        .batch_execute(
            "CREATE TABLE stamps (n INTEGER PRIMARY KEY, at TEXT);
             INSERT INTO stamps VALUES (1, datetime('now', 'localtime')), (2, CURRENT_TIMESTAMP);
             BEGIN;
             INSERT INTO stamps SELECT n + 2, datetime(at, '+1 day', 'localtime') FROM stamps;
             UPDATE stamps SET at = at || ' ' || random() WHERE n > 2;
             COMMIT;",
        )
        .await
        .expect("auto mode runs what active mode refuses");
    let query = "SELECT n, at FROM stamps ORDER BY n";
    let on_leader = rows(&client, query).await;
    assert_eq!(on_leader.len(), 4);
    // The CREATE went as statements; the INSERT and the transaction (both read 'localtime'),
    // as their write-sets.
    let proposed = |body| {
        cluster.gauge(
            leader,
            &format!("chorus_sql_transactions_proposed_total{{body=\"{body}\"}}"),
        )
    };
    assert_eq!((proposed("statements"), proposed("write_set")), (Some(1), Some(2)));
    for follower in others(leader) {
        assert_eq!(
            rows(&cluster.client(follower).await, query).await,
            on_leader,
            "node {follower}"
        );
    }
    let error = client
        .batch_execute(
            "BEGIN; INSERT INTO stamps VALUES (9, datetime('now', 'localtime')); CREATE TABLE later (a); COMMIT;",
        )
        .await
        .expect_err("a schema change beside what only a write-set replicates");
    let db_error = error.as_db_error().expect("a server error");
    assert_eq!(db_error.code().code(), "0A000", "{db_error}");
    assert!(db_error.message().contains("schema"), "{db_error}");
}

/// Passive mode on PostgreSQL: what the leader's logical decoding reports is what replicas
/// apply — arrays, quotes, NULLs, a large value an update left alone, generated and identity
/// columns; a table without a key travels as statements; a new leader's sequences continue
/// past the rows its predecessor inserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_passive_mode_applies_the_leaders_decoded_rows() {
    let mut cluster = SqlCluster::start_on(Engine::Postgres, 3, &["--sql-mode", "passive"]);
    let leader = cluster
        .setup(
            "CREATE TABLE acct (id serial PRIMARY KEY, owner text, balance numeric(12,2), tags int[], \
             big text, twice int GENERATED ALWAYS AS (id * 2) STORED, \
             n int GENERATED ALWAYS AS IDENTITY UNIQUE);
             CREATE TABLE keyless (a int, b text)",
        )
        .await;
    let client = cluster.client(leader).await;
    client
        .batch_execute(
            "INSERT INTO acct (owner, balance, tags, big) VALUES ('o''neil', 10.5, '{1,2}', repeat('x', 100000)), \
             ('new-tuple: x', NULL, '{}', 'y');
             UPDATE acct SET balance = 99 WHERE id = 1;
             UPDATE acct SET id = 10 WHERE id = 2;
             BEGIN; INSERT INTO acct (owner) VALUES ('third'); DELETE FROM acct WHERE id = 10; COMMIT;
             INSERT INTO keyless VALUES (1, 'x'), (1, 'x');
             UPDATE keyless SET b = 'y' WHERE a = 1;",
        )
        .await
        .unwrap();
    let proposed = |id: u64, body: &str| {
        cluster.gauge(
            id,
            &format!("chorus_sql_transactions_proposed_total{{body=\"{body}\"}}"),
        )
    };
    // The schema changes, and the update of the keyless table (an insert needs no key), as
    // statements.
    assert_eq!(
        (proposed(leader, "statements"), proposed(leader, "write_set")),
        (Some(2), Some(5))
    );
    // A column of a type the front end does not return is an error, and the session goes on.
    let error = client
        .simple_query("SELECT tags FROM acct")
        .await
        .expect_err("int[] is not returned");
    assert_eq!(error.as_db_error().expect("a server error").code().code(), "0A000");
    let query = "SELECT id, owner, balance, tags::text, length(big), twice, n FROM acct \
                 UNION ALL SELECT a, b, NULL, NULL, NULL, NULL, NULL FROM keyless ORDER BY 1, 2";
    let expected = rows(&client, query).await;
    assert_eq!(expected.len(), 4, "{expected:?}");
    assert_eq!(
        expected[0],
        ["1", "o'neil", "99.0", "{1,2}", "100000", "2", "1"]
            .map(|v| Some(v.to_string()))
            .to_vec()
    );
    for follower in others(leader) {
        cluster.wait_for_rows(follower, query, &expected).await;
    }
    // A new leader's sequences continue where the rows are, not where its own had stopped.
    cluster.kill(leader);
    let (_, inserted) = cluster
        .write_on_leader(
            &others(leader),
            "INSERT INTO acct (owner) VALUES ('after') RETURNING id, n",
        )
        .await;
    assert_eq!(inserted, vec![vec![Some("4".to_string()), Some("4".to_string())]]);
}

/// Sequences advance outside transactions: neither the leader's rolled-back draws nor a new
/// leader make a replica re-executing `nextval` draw another value than its leader did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_replicas_draw_what_the_leader_drew_after_rollbacks_and_a_new_leader() {
    let mut cluster = SqlCluster::start_on(Engine::Postgres, 3, &[]);
    let leader = cluster
        .setup("CREATE TABLE items (id serial PRIMARY KEY, name text UNIQUE)")
        .await;
    let client = cluster.client(leader).await;
    client
        .batch_execute("INSERT INTO items (name) VALUES ('a')")
        .await
        .unwrap();
    client
        .batch_execute("BEGIN; INSERT INTO items (name) VALUES ('rolled back'); ROLLBACK;")
        .await
        .unwrap();
    client
        .batch_execute("INSERT INTO items (name) VALUES ('a')")
        .await
        .expect_err("a duplicate name draws a value and fails");
    client
        .batch_execute("INSERT INTO items (name) VALUES ('b')")
        .await
        .unwrap();
    let query = "SELECT id, name FROM items ORDER BY id";
    let row = |id: &str, name: &str| vec![Some(id.to_string()), Some(name.to_string())];
    let expected = rows(&client, query).await;
    assert_eq!(expected, vec![row("1", "a"), row("4", "b")]);
    for follower in others(leader) {
        cluster.wait_for_rows(follower, query, &expected).await;
    }
    cluster.kill(leader);
    let (successor, _) = cluster
        .write_on_leader(&others(leader), "INSERT INTO items (name) VALUES ('c')")
        .await;
    let expected = rows(&cluster.client(successor).await, query).await;
    assert_eq!(expected, vec![row("1", "a"), row("4", "b"), row("5", "c")]);
    for node in others(leader) {
        cluster.wait_for_rows(node, query, &expected).await;
    }
}

/// PostgreSQL logs sequence values in advance: recovering from a crash moves a sequence up to
/// 32 values ahead. A replica whose server alone crashed must still draw what the leader drew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_a_replica_whose_server_crashed_draws_what_the_leader_drew() {
    let mut cluster = SqlCluster::start_on(Engine::Postgres, 3, &[]);
    let leader = cluster
        .setup("CREATE TABLE items (id serial PRIMARY KEY, name text)")
        .await;
    let client = cluster.client(leader).await;
    for name in ["a", "b", "c"] {
        client
            .execute("INSERT INTO items (name) VALUES ($1)", &[&name])
            .await
            .unwrap();
    }
    let query = "SELECT id, name FROM items ORDER BY id";
    let expected = rows(&client, query).await;
    let crashed = others(leader)[0];
    cluster.wait_for_rows(crashed, query, &expected).await;
    cluster.kill(crashed);
    // A draw of a transaction the crash cut short stays drawn; with it PostgreSQL logs 32 values
    // ahead, and its crash recovery starts the sequence there. (Without it, whether recovery
    // moves the sequence depends on whether the last thing logged for it was a draw.)
    cluster
        .server(crashed)
        .await
        .batch_execute("SELECT nextval('items_id_seq')")
        .await
        .unwrap();
    let server = cluster.crash_postgres(crashed).await;
    let recovered = rows(&server, "SELECT last_value FROM items_id_seq").await;
    let recovered: u64 = recovered[0][0].as_deref().unwrap().parse().unwrap();
    assert!(
        recovered > 3,
        "crash recovery left the sequence at {recovered}: nothing to show here"
    );
    cluster.launch(crashed);
    for name in ["d", "e"] {
        client
            .execute("INSERT INTO items (name) VALUES ($1)", &[&name])
            .await
            .unwrap();
    }
    let expected = rows(&client, query).await;
    assert_eq!(expected.len(), 5);
    assert_eq!(expected[4][0].as_deref(), Some("5"), "{expected:?}");
    for node in others(leader) {
        cluster.wait_for_rows(node, query, &expected).await;
    }
}

/// A node started while its PostgreSQL server is down (a reboot that starts Chorus first, a
/// server still replaying its WAL) waits for the server instead of exiting, then serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_a_node_started_before_its_server_waits_for_it() {
    let mut cluster = SqlCluster::start_on(Engine::Postgres, 1, &[]);
    let node = cluster
        .setup("CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items VALUES (1)")
        .await;
    cluster.kill(node);
    cluster.stop_postgres(node);
    cluster.launch(node);
    assert!(
        !cluster.exited_within(node, Duration::from_millis(1500)),
        "node {node} exited while its server was down; its log ends:\n{}",
        cluster.log_tail(node)
    );
    cluster.start_postgres(node);
    cluster
        .wait_for_rows(node, "SELECT id FROM items", &[vec![Some("1".to_string())]])
        .await;
}

/// A checkpoint's dump reads sequences later than its snapshot, while the leader goes on
/// drawing: a replica rebuilt from it must still draw what the leader drew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_a_replica_rebuilt_from_a_checkpoint_under_load_draws_what_the_leader_drew() {
    let mut cluster = SqlCluster::start_on(
        Engine::Postgres,
        3,
        &["--snapshot-interval-entries", "30", "--log-keep-entries", "5"],
    );
    let leader = cluster
        .setup("CREATE TABLE events (id serial PRIMARY KEY, at_ms bigint)")
        .await;
    let lagging = others(leader)[0];
    cluster.kill(lagging);
    let client = cluster.client(leader).await;
    let writing = Arc::new(AtomicBool::new(true));
    let inserted = Arc::new(AtomicU64::new(0));
    let load = {
        let (writing, inserted) = (writing.clone(), inserted.clone());
        tokio::spawn(async move {
            while writing.load(Ordering::Relaxed) {
                let n = inserted.load(Ordering::Relaxed);
                client
                    .execute(
                        "INSERT INTO events (at_ms) VALUES ($1::text::bigint)",
                        &[&n.to_string()],
                    )
                    .await
                    .unwrap();
                inserted.fetch_add(1, Ordering::Relaxed);
            }
            client
        })
    };
    cluster.wait_for_compaction(leader, 60).await;
    let before_catch_up = inserted.load(Ordering::Relaxed);
    cluster.launch(lagging);
    // It catches up from a checkpoint while the inserts go on: for 4 s, and at least 100 of
    // them (a loaded machine may do fewer in that time).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while inserted.load(Ordering::Relaxed) < before_catch_up + 100 {
        assert!(
            Instant::now() < deadline,
            "only {} inserts in a minute of catch-up",
            inserted.load(Ordering::Relaxed) - before_catch_up
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writing.store(false, Ordering::Relaxed);
    let client = load.await.unwrap();
    let query = "SELECT count(*), sum(id), max(id) FROM events";
    let expected = rows(&client, query).await;
    for node in 1..=3 {
        cluster.wait_for_rows(node, query, &expected).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_mid_load_loses_no_committed_transaction() {
    sigkill_of_the_leader_mid_load_loses_nothing(Engine::Sqlite).await;
}

/// The killed node's PostgreSQL server keeps running and holds the transactions the node
/// executed ahead of the log: at restart it is emptied and rebuilt from a dump and the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_sigkill_of_the_leader_mid_load_loses_no_committed_transaction() {
    sigkill_of_the_leader_mid_load_loses_nothing(Engine::Postgres).await;
}

async fn sigkill_of_the_leader_mid_load_loses_nothing(engine: Engine) {
    // Checkpoints at least 100 entries apart (and a database's size of commands): the killed
    // leader rebuilds from one and the log after it.
    let mut cluster = SqlCluster::start_on(
        engine,
        3,
        &["--snapshot-interval-entries", "100", "--log-keep-entries", "20"],
    );
    let leader = cluster
        .setup(
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE ledger (id INTEGER PRIMARY KEY, account INTEGER NOT NULL, amount INTEGER NOT NULL);
             INSERT INTO accounts VALUES (1, 1000), (2, 1000), (3, 1000), (4, 1000)",
        )
        .await;

    // Transfers on the leader until it dies; each acknowledged one is remembered.
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for worker in 0..4u64 {
        let client = cluster.client(leader).await;
        let acknowledged = acknowledged.clone();
        workers.push(tokio::spawn(async move {
            for n in 0.. {
                let id = worker * 1_000_000 + n;
                let (from, to) = (1 + (id % 4), 1 + ((id + 1) % 4));
                let transfer = format!(
                    "BEGIN;
                     UPDATE accounts SET balance = balance - 1 WHERE id = {from};
                     UPDATE accounts SET balance = balance + 1 WHERE id = {to};
                     INSERT INTO ledger VALUES ({id}, {from}, -1);
                     COMMIT;"
                );
                match client.batch_execute(&transfer).await {
                    Ok(()) => acknowledged.lock().unwrap().push(id),
                    Err(_) => return,
                }
            }
        }));
    }
    // The leader dies once it holds a checkpoint and work after it, however slow the machine.
    cluster.wait_for_compaction(leader, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(leader);
    for worker in workers {
        worker.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 50,
        "only {} transfers before the crash",
        acknowledged.len()
    );

    let survivors = others(leader);
    let new_leader = cluster.leader_among(&survivors).await;
    cluster.launch(leader);
    // The restarted node catches up from the log; then every node holds the same rows.
    // The new leader takes writes (once it has applied what the old one committed).
    let successor = cluster.client(new_leader).await;
    execute_until_taken(
        &successor,
        "INSERT INTO ledger VALUES (999999999, 1, 0)",
        Duration::from_secs(10),
        "the new leader takes no writes",
    )
    .await;
    let dump = "SELECT 'a', id, balance FROM accounts UNION ALL SELECT 'l', id, amount FROM ledger ORDER BY 1, 2";
    let reference = rows(&successor, dump).await;
    let ledger: std::collections::HashSet<String> = reference
        .iter()
        .filter(|r| r[0].as_deref() == Some("l"))
        .map(|r| r[1].clone().unwrap())
        .collect();
    for id in &acknowledged {
        assert!(ledger.contains(&id.to_string()), "acknowledged transfer {id} was lost");
    }
    let total: i64 = reference
        .iter()
        .filter(|r| r[0].as_deref() == Some("a"))
        .map(|r| r[2].as_deref().unwrap().parse::<i64>().unwrap())
        .sum();
    assert_eq!(total, 4000, "transfers keep the total");
    for id in 1..=3 {
        cluster.wait_for_rows(id, dump, &reference).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_the_compacted_log_catches_up_from_a_checkpoint() {
    replica_catches_up_from_a_checkpoint(Engine::Sqlite).await;
}

/// On PostgreSQL the checkpoint is a `pg_dump` of an exported snapshot, restored by
/// `pg_restore` into the lagging node's emptied database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_a_replica_behind_the_compacted_log_catches_up_from_a_checkpoint() {
    replica_catches_up_from_a_checkpoint(Engine::Postgres).await;
}

async fn replica_catches_up_from_a_checkpoint(engine: Engine) {
    let mut cluster = SqlCluster::start_on(
        engine,
        3,
        &["--snapshot-interval-entries", "30", "--log-keep-entries", "5"],
    );
    let leader = cluster
        .setup("CREATE TABLE t (n INTEGER PRIMARY KEY, square INTEGER)")
        .await;
    let lagging = others(leader)[0];
    let client = cluster.client(leader).await;
    cluster.kill(lagging);
    for n in 0..200 {
        client
            .execute(
                "INSERT INTO t VALUES ($1, CAST($1 AS INTEGER) * CAST($1 AS INTEGER))",
                &[&n.to_string()],
            )
            .await
            .unwrap();
    }
    cluster.wait_for_compaction(leader, 20).await;
    cluster.launch(lagging);
    let query = "SELECT count(*), sum(square) FROM t";
    let expected = rows(&client, query).await;
    assert_eq!(
        expected,
        vec![vec![Some("200".to_string()), Some("2646700".to_string())]]
    );
    cluster.wait_for_rows(lagging, query, &expected).await;
    // It goes on applying the log after the checkpoint it received.
    client.execute("INSERT INTO t VALUES (1000, 0)", &[]).await.unwrap();
    cluster
        .wait_for_rows(lagging, "SELECT count(*) FROM t", &[vec![Some("201".to_string())]])
        .await;
}

/// Every row of `table` on node `id`, ordered by its key, hashed (the TPC-C tables hold
/// hundreds of thousands of rows: the nodes are compared row by row through the hash).
/// Starts a lone `chorus sql` node with `flags`, which must refuse to start; what it said.
fn refused_start(flags: &[&str]) -> String {
    let mut refused = Command::new(CHORUS)
        .args(["sql", "--id", "1", "--peers", "1=127.0.0.1:1"])
        .args(flags)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    refused.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(!refused.wait().unwrap().success(), "it started: {stderr}");
    stderr
}

async fn table_digest(client: &Client, table: &str, order_by: &str) -> (usize, u64) {
    use std::hash::{Hash, Hasher};
    let rows = rows(client, &format!("SELECT * FROM {table} ORDER BY {order_by}")).await;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    rows.hash(&mut hasher);
    (rows.len(), hasher.finish())
}

const TPCC_TABLES: [(&str, &str); 9] = [
    ("warehouse", "w_id"),
    ("district", "d_w_id, d_id"),
    ("customer", "c_w_id, c_d_id, c_id"),
    ("history", "h_c_w_id, h_c_d_id, h_c_id, h_date, h_amount, h_data"),
    ("new_order", "no_w_id, no_d_id, no_o_id"),
    ("orders", "o_w_id, o_d_id, o_id"),
    ("order_line", "ol_w_id, ol_d_id, ol_o_id, ol_number"),
    ("item", "i_id"),
    ("stock", "s_w_id, s_i_id"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_mid_tpcc_loses_no_new_order_and_the_replicas_end_equal() {
    sigkill_mid_passive_tpcc(Engine::Sqlite).await;
}

/// Write-sets from the leader's logical decoding; the killed leader's server is rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_sigkill_of_the_leader_mid_passive_tpcc_loses_no_new_order_and_the_replicas_end_equal() {
    sigkill_mid_passive_tpcc(Engine::Postgres).await;
}

async fn sigkill_mid_passive_tpcc(engine: Engine) {
    use chorus_bench::tpcc::{self, TpccArgs};
    // Passive replication: the replicas apply the write-sets TPC-C's transactions made (the
    // other tests here mostly replicate statements). A 3 s election timeout: the load's long
    // statements on a machine shared with the other tests must not move leadership before the
    // kill (the load retries serialization failures only).
    let mut cluster = SqlCluster::start_on(
        engine,
        3,
        &[
            "--snapshot-interval-entries",
            "3000",
            "--log-keep-entries",
            "200",
            "--sql-mode",
            "passive",
            "--election-ticks",
            "30",
        ],
    );
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let addr = cluster.node(leader).pg;
    let loaders = vec![
        vec![tpcc::connect(addr).await.unwrap()],
        vec![tpcc::connect(addr).await.unwrap()],
    ];
    tpcc::load(&loaders, 1, 7).await.unwrap();
    let args = TpccArgs {
        cluster: None,
        systems: Vec::new(),
        dir: PathBuf::new(),
        warehouses: vec![1],
        terminals: Some(8),
        duration_secs: 10.0,
        loaders: 2,
        no_load: true,
        keep_data: false,
        seed: 7,
        route: tpcc::Route::Owner,
        out: PathBuf::new(),
        net: Default::default(),
    };
    let run = tokio::spawn(async move { tpcc::run_once("chorus-passive", &[addr], &[], &args, 1, false).await });
    // The leader dies 3 s into the run, once 70 new orders have committed (a loaded machine
    // may take longer), and before the run's 10 s end.
    let watcher = loaders.into_iter().flatten().next().unwrap();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    loop {
        let orders = rows(&watcher, "SELECT count(*) FROM orders").await;
        let orders: u64 = orders[0][0].as_deref().unwrap().parse().unwrap();
        if orders >= 30_070 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "only {} new orders committed in 9 s",
            orders - 30_000
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.kill(leader);
    let result = run.await.unwrap().unwrap();
    let acknowledged = result.kinds[0].committed;
    assert!(acknowledged > 50, "only {acknowledged} new orders before the crash");

    let new_leader = cluster.leader_among(&others(leader)).await;
    cluster.launch(leader);
    let successor = cluster.client(new_leader).await;
    // A new leader holds linearizable reads until it has committed an entry of its term; on a
    // loaded machine that can outlast a request's wait for a leader (3 s), and the read is
    // refused as retryable (57P03): retried.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = tpcc::check_consistency(&successor).await {
        let unavailable = e
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::code)
            == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW);
        assert!(
            unavailable && Instant::now() < deadline,
            "the new leader {new_leader} fails the consistency check: {e:#}; the logs end:\n{}",
            cluster.log_tails(&[1, 2, 3])
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // 3,000 orders per district were loaded; each acknowledged new order added one.
    let orders = rows(&successor, "SELECT count(*) FROM orders").await;
    let orders: u64 = orders[0][0].as_deref().unwrap().parse().unwrap();
    assert!(
        orders >= 30_000 + acknowledged,
        "{orders} orders, but 30000 were loaded and {acknowledged} new orders acknowledged"
    );
    let mut reference = Vec::new();
    for (table, key) in TPCC_TABLES {
        reference.push(table_digest(&successor, table, key).await);
    }
    for id in 1..=3 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let client = cluster.client(id).await;
            let mut digests = Vec::new();
            for (table, key) in TPCC_TABLES {
                digests.push(table_digest(&client, table, key).await);
            }
            if digests == reference {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} does not hold the new leader's rows; its log ends:\n{}",
                cluster.log_tail(id)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// With conflict-class rules, each transaction reaching COMMIT is counted by the classes its
/// statements touch; a rule that does not parse stops the node at start, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_are_labelled_with_the_conflict_classes_they_touch() {
    let cluster = SqlCluster::start_with(1, &["--sql-conflict-classes", "accounts.branch"]);
    let leader = cluster
        .setup("CREATE TABLE accounts (branch int, id int, balance int, PRIMARY KEY (branch, id))")
        .await;
    let client = cluster.client(leader).await;
    client
        .batch_execute(
            "CREATE TABLE rates (currency text PRIMARY KEY, rate int); \
             INSERT INTO accounts VALUES (1, 1, 100), (1, 2, 100), (2, 1, 100);",
        )
        .await
        .unwrap();
    let transfer = "UPDATE accounts SET balance = balance + $3 WHERE branch = $1 AND id = $2";
    // One class, twice.
    for _ in 0..2 {
        client
            .batch_execute("BEGIN; SELECT balance FROM accounts WHERE branch = 1 AND id = 1")
            .await
            .unwrap();
        client.execute(transfer, &[&"1", &"2", &"-5"]).await.unwrap();
        client.batch_execute("COMMIT").await.unwrap();
    }
    // Two classes.
    client.batch_execute("BEGIN").await.unwrap();
    client.execute(transfer, &[&"1", &"1", &"-5"]).await.unwrap();
    client.execute(transfer, &[&"2", &"1", &"5"]).await.unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    let count = |classes: &str| {
        cluster
            .gauge(
                leader,
                &format!("chorus_sql_transactions_labelled_total{{classes=\"{classes}\"}}"),
            )
            .unwrap_or(0)
    };
    assert_eq!(count("one"), 2);
    // The two-class transfer, and the INSERT without a column list: placed by the table's
    // columns, it touches branches 1 and 2.
    assert_eq!(count("several"), 2);
    // Every branch: global, like the schema changes.
    let global = count("global");
    assert!(global >= 2, "{global}");
    client
        .batch_execute("BEGIN; UPDATE accounts SET balance = balance + 1; COMMIT")
        .await
        .unwrap();
    assert_eq!(count("global"), global + 1);
    assert_eq!(count("none"), 0);

    let stderr = refused_start(&["--sql-conflict-classes", "accounts"]);
    assert!(
        stderr.contains("--sql-conflict-classes: 'accounts' is not table.column"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_hybrid_mode_every_node_takes_writes_and_one_reaching_another_nodes_class_borrows_it_first() {
    // Not forwarded to the owner: every transaction runs where its client is.
    let cluster = SqlCluster::start_with(
        3,
        &[
            "--sql-mode",
            "hybrid",
            "--sql-conflict-classes",
            "accounts.branch",
            "--sql-forward",
            "false",
        ],
    );
    // The accounts written on node 3, which may not lead: it is taken there.
    let clients = three_branches(&cluster, 3).await;

    // Node 2 owns branch 1 (classes spread by value over the nodes in id order): node 1's
    // transaction borrows it through the log, and node 2's own transaction on it waits until
    // node 1's is done, then runs on its result — neither races the other to certification.
    let transfer = "UPDATE accounts SET balance = balance + $3 WHERE branch = $1 AND id = $2";
    clients[0].batch_execute("BEGIN").await.unwrap();
    clients[0].execute(transfer, &[&"1", &"1", &"-5"]).await.unwrap();
    let [first, second, third] = clients;
    let owners = tokio::spawn(async move {
        second
            .batch_execute("BEGIN; UPDATE accounts SET balance = balance + 5 WHERE branch = 1 AND id = 2")
            .await
            .unwrap();
        let sum = rows(&second, "SELECT sum(balance) FROM accounts WHERE branch = 1").await;
        second.batch_execute("COMMIT").await.unwrap();
        (second, sum)
    });
    // Node 3 meanwhile works on another class, untouched by both.
    third
        .batch_execute("BEGIN; UPDATE accounts SET balance = balance + 1 WHERE branch = 3 AND id = 1; COMMIT")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !owners.is_finished(),
        "the owner's transaction waits for the borrower's"
    );
    first.batch_execute("COMMIT").await.unwrap();
    let (second, branch_sum) = owners.await.unwrap();
    assert_eq!(
        branch_sum,
        vec![vec![Some("200".into())]],
        "it ran after node 1's transfer"
    );
    let clients = [first, second, third];

    // Concurrent transfers within and across classes from every node; retried when void.
    let mut tasks = Vec::new();
    for (n, client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let (mut committed, mut void) = (0, 0);
            for i in 0..40i32 {
                let (from, to) = if i % 5 == 0 {
                    (n as i32 + 1, (n as i32 + 1) % 3 + 1)
                } else {
                    (n as i32 + 1, n as i32 + 1)
                };
                loop {
                    let outcome = client
                        .batch_execute(&format!(
                            "BEGIN; UPDATE accounts SET balance = balance - 1 WHERE branch = {from} AND id = 1; \
                             UPDATE accounts SET balance = balance + 1 WHERE branch = {to} AND id = 2; COMMIT"
                        ))
                        .await;
                    match outcome {
                        Ok(()) => break committed += 1,
                        Err(e) if e.code().map(|c| c.code()) == Some("40001") => {
                            // A statement before COMMIT may fail too (a wait for a class in
                            // vain): the transaction stays open, failed, until rolled back.
                            client.batch_execute("ROLLBACK").await.unwrap();
                            void += 1
                        }
                        Err(e) => panic!("node {}: {:?}", n + 1, e.as_db_error()),
                    }
                }
            }
            (client, committed, void)
        }));
    }
    // And, beside them, transactions touching every branch (global: no branch named), which
    // borrow every class from every node instead of starving in certification.
    let global_client = cluster.client(2).await;
    let globals = tokio::spawn(async move {
        for _ in 0..5 {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match global_client
                    .batch_execute("BEGIN; UPDATE accounts SET balance = balance + 1 WHERE id = 1; COMMIT")
                    .await
                {
                    Ok(()) => break,
                    Err(e) if e.code().map(|c| c.code()) == Some("40001") => {
                        global_client.batch_execute("ROLLBACK").await.unwrap();
                        assert!(Instant::now() < deadline, "a global transaction starves: {e:?}");
                    }
                    Err(e) => panic!("global: {:?}", e.as_db_error()),
                }
            }
        }
    });
    let mut clients = Vec::new();
    for task in tasks {
        let (client, committed, _void) = task.await.unwrap();
        assert_eq!(committed, 40);
        clients.push(client);
    }
    globals.await.unwrap();
    let mut digests = Vec::new();
    for client in &clients {
        let total = rows(client, "SELECT sum(balance), count(*) FROM accounts").await;
        // 600, plus node 3's 1 and the global transactions' 5 × 3: the transfers keep the sum.
        assert_eq!(total, vec![vec![Some("616".into()), Some("6".into())]]);
        digests.push(table_digest(client, "accounts", "branch, id").await);
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    // Every node certified every transaction alike.
    let certified = |id: u64, outcome: &str| {
        cluster.gauge(
            id,
            &format!("chorus_sql_transactions_certified_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert!(certified(1, "committed").unwrap_or(0) >= 124);
    let lent: u64 = [1, 2, 3]
        .into_iter()
        .map(|id| cluster.gauge(id, "chorus_sql_classes_lent_total").unwrap_or(0))
        .sum();
    assert!(
        lent >= 25,
        "every transfer to another node's branch borrowed it: {lent}"
    );
    let outcomes =
        |id: u64| ["committed", "void_chain", "void_conflict", "void_misfit"].map(|outcome| certified(id, outcome));
    for id in [2, 3] {
        assert_eq!(outcomes(id), outcomes(1));
    }
    let branch_1 = rows(&clients[1], "SELECT balance FROM accounts WHERE branch = 1 ORDER BY id").await;
    assert_eq!(
        branch_1[0],
        vec![Some("60".into())],
        "node 1's first transfer and its 40 later ones took 45 from account 1, the global ones added 5"
    );

    let stderr = refused_start(&["--sql-mode", "hybrid"]);
    assert!(stderr.contains("give --sql-conflict-classes"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_hybrid_mode_a_transaction_runs_on_its_classes_owner_whichever_node_its_client_reached() {
    let cluster = SqlCluster::start_with(
        3,
        &["--sql-mode", "hybrid", "--sql-conflict-classes", "accounts.branch"],
    );
    let clients = three_branches(&cluster, 1).await;

    // Node 2 owns branch 1: node 1's client's interactive transaction (a read, parameters,
    // COMMIT) runs there, statement by statement, and answers as if it ran here.
    let transfer = "UPDATE accounts SET balance = balance + $3 WHERE branch = $1 AND id = $2";
    let first = &clients[0];
    first.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        branch_balances(first, 1).await,
        vec![vec![Some("100".into())], vec![Some("100".into())]]
    );
    assert_eq!(first.execute(transfer, &[&"1", &"1", &"-7"]).await.unwrap(), 1);
    assert_eq!(first.execute(transfer, &[&"1", &"2", &"7"]).await.unwrap(), 1);
    first.batch_execute("COMMIT").await.unwrap();
    assert_eq!(cluster.gauge(1, "chorus_sql_transactions_forwarded_total"), Some(1));
    assert_eq!(
        branch_balances(&clients[1], 1).await,
        vec![vec![Some("93".into())], vec![Some("107".into())]]
    );

    // A statement failing there fails the transaction here; ROLLBACK undoes it there.
    first.batch_execute("BEGIN").await.unwrap();
    first.execute(transfer, &[&"2", &"1", &"-50"]).await.unwrap();
    let duplicate = first
        .batch_execute("INSERT INTO accounts (branch, id, balance) VALUES (2, 1, 0)")
        .await
        .unwrap_err();
    assert_eq!(duplicate.code().map(|c| c.code()), Some("23505"), "{duplicate:?}");
    let failed = first.execute(transfer, &[&"2", &"2", &"50"]).await.unwrap_err();
    assert_eq!(failed.code().map(|c| c.code()), Some("25P02"), "{failed:?}");
    first.batch_execute("ROLLBACK").await.unwrap();
    // Autocommit statements are forwarded too.
    first.execute(transfer, &[&"2", &"2", &"1"]).await.unwrap();
    assert_eq!(
        branch_balances(first, 2).await,
        vec![vec![Some("100".into())], vec![Some("101".into())]]
    );

    // A client that leaves inside a forwarded transaction leaves no write lock held on the
    // owner: node 2's own client writes on at once (its lock wait, 5 s, is shorter than the
    // time after which the owner rolls back forwarded transactions left idle).
    let leaving = cluster.client(3).await;
    leaving
        .batch_execute("BEGIN; UPDATE accounts SET balance = 0 WHERE branch = 1")
        .await
        .unwrap();
    drop(leaving);
    tokio::time::sleep(Duration::from_millis(200)).await;
    clients[1]
        .batch_execute("UPDATE accounts SET balance = balance + 1 WHERE branch = 1 AND id = 1")
        .await
        .unwrap();
    assert_eq!(
        branch_balances(&clients[1], 1).await,
        vec![vec![Some("94".into())], vec![Some("107".into())]]
    );

    // Every node's client works on a branch another node owns, concurrently: each transfer
    // runs on its branch's owner, borrowing nothing.
    let lent = || -> u64 {
        [1, 2, 3]
            .into_iter()
            .map(|id| cluster.gauge(id, "chorus_sql_classes_lent_total").unwrap_or(0))
            .sum()
    };
    let lent_before = lent();
    let mut tasks = Vec::new();
    for (n, client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let branch = (n + 1) % 3 + 1;
            let mut committed = 0;
            while committed < 30 {
                let outcome = client
                    .batch_execute(&format!(
                        "BEGIN; UPDATE accounts SET balance = balance - 1 WHERE branch = {branch} AND id = 1; \
                         UPDATE accounts SET balance = balance + 1 WHERE branch = {branch} AND id = 2; COMMIT"
                    ))
                    .await;
                match outcome {
                    Ok(()) => committed += 1,
                    Err(e) if e.code().map(|c| c.code()) == Some("40001") => {
                        client.batch_execute("ROLLBACK").await.unwrap();
                    }
                    Err(e) => panic!("node {}: {:?}", n + 1, e.as_db_error()),
                }
            }
            client
        }));
    }
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await.unwrap());
    }
    let mut digests = Vec::new();
    for client in &clients {
        assert_eq!(
            rows(client, "SELECT sum(balance) FROM accounts").await,
            vec![vec![Some("602".into())]]
        );
        digests.push(table_digest(client, "accounts", "branch, id").await);
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    for id in [1, 2, 3] {
        assert!(
            cluster
                .gauge(id, "chorus_sql_transactions_forwarded_total")
                .unwrap_or(0)
                >= 30,
            "node {id} forwarded its clients' transactions"
        );
    }
    assert_eq!(lent(), lent_before, "no transfer borrowed a class");
}

/// Accounts 1 and 2 of branches 1 to 3, 100 each, written through node `writer`; a client on
/// each node, in id order.
async fn three_branches(cluster: &SqlCluster, writer: u64) -> [Client; 3] {
    cluster
        .setup("CREATE TABLE accounts (branch int, id int, balance int, PRIMARY KEY (branch, id))")
        .await;
    let clients = [
        cluster.client(1).await,
        cluster.client(2).await,
        cluster.client(3).await,
    ];
    clients[writer as usize - 1]
        .batch_execute(
            "INSERT INTO accounts (branch, id, balance) VALUES (1, 1, 100), (1, 2, 100), (2, 1, 100), \
             (2, 2, 100), (3, 1, 100), (3, 2, 100)",
        )
        .await
        .unwrap();
    clients
}

async fn branch_balances(client: &Client, branch: i32) -> Vec<Vec<Option<String>>> {
    rows(
        client,
        &format!("SELECT balance FROM accounts WHERE branch = {branch} ORDER BY id"),
    )
    .await
}

/// Moves 1 from `from`'s account to `to`'s through `node`, retrying whatever fails (an owner
/// or leader that is down) until it commits.
async fn transfer_until_done(cluster: &SqlCluster, node: u64, from: i32, to: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let outcome = match tokio::time::timeout(Duration::from_secs(5), cluster.try_client(node)).await {
            Ok(Some(client)) => client
                .batch_execute(&format!(
                    "BEGIN; UPDATE accounts SET balance = balance - 1 WHERE branch = {from}; \
                     UPDATE accounts SET balance = balance + 1 WHERE branch = {to}; COMMIT"
                ))
                .await
                .map_err(|e| e.to_string()),
            _ => Err("no connection".to_string()),
        };
        match outcome {
            Ok(()) => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "a transfer through node {node} did not commit: {e}; its log ends:\n{}",
                cluster.log_tail(node)
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_hybrid_mode_a_down_owners_classes_move_to_the_nodes_up_and_come_back_when_it_restarts() {
    let mut cluster = SqlCluster::start_with(
        3,
        &["--sql-mode", "hybrid", "--sql-conflict-classes", "accounts.branch"],
    );
    cluster
        .setup("CREATE TABLE accounts (branch int PRIMARY KEY, balance int)")
        .await;
    cluster
        .client(1)
        .await
        .batch_execute("INSERT INTO accounts VALUES (1, 100), (3, 100), (4, 100)")
        .await
        .unwrap();
    let down = |cluster: &SqlCluster, id: u64| cluster.gauge(id, "chorus_sql_class_owners_down");

    // Node 2 owns branches 1 and 4 (value mod 3 over the nodes in id order). It goes down: a
    // transfer through node 1 reaching them waits in vain once, and the log takes node 2 for
    // down on every node up.
    cluster.kill(2);
    transfer_until_done(&cluster, 1, 3, 1).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while down(&cluster, 1) != Some(1) || down(&cluster, 3) != Some(1) {
        assert!(
            Instant::now() < deadline,
            "node 2 is not taken for down: {:?}",
            (down(&cluster, 1), down(&cluster, 3))
        );
        transfer_until_done(&cluster, 1, 3, 1).await;
    }
    // Its branches spread over the nodes up: branch 4 now belongs to node 3, which lends it
    // to node 1's transfers.
    let lent_by_3 = || cluster.gauge(3, "chorus_sql_classes_lent_total").unwrap_or(0);
    let lent_before = lent_by_3();
    transfer_until_done(&cluster, 1, 3, 4).await;
    assert!(lent_by_3() > lent_before, "node 3 lent branch 4");

    // Node 2 restarts, reads that it was taken for down, and says it is back.
    cluster.launch(2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while [1, 2, 3].into_iter().any(|id| down(&cluster, id) != Some(0)) {
        assert!(
            Instant::now() < deadline,
            "node 2 is still taken for down: {:?}; its log ends:\n{}",
            [1, 2, 3].map(|id| down(&cluster, id)),
            cluster.log_tail(2)
        );
        transfer_until_done(&cluster, 2, 1, 4).await;
    }
    let client = cluster.client(3).await;
    assert_eq!(
        rows(&client, "SELECT sum(balance) FROM accounts").await,
        vec![vec![Some("300".into())]],
        "the transfers kept the sum"
    );
}

/// A client of node `id` logged in as `user` with `password`, or the error it got.
async fn log_in(cluster: &SqlCluster, id: u64, user: &str, password: &str) -> Result<Client, tokio_postgres::Error> {
    let config = format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=chorus connect_timeout=5",
        cluster.node(id).pg.port()
    );
    let (client, connection) = tokio_postgres::connect(&config, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

fn code(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(|code| code.code())
}

/// With users (the RESP port's ACL file), a SQL client logs in with SCRAM-SHA-256 — psql and
/// tokio-postgres unchanged — as a user with a password in the clear; a wrong password, an
/// unknown user, or a user known only by a digest gets 28P01; a read-only user reads on any
/// node and its writes get 42501, alone or in a transaction; an address that keeps failing is
/// made to wait, and it is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_clients_log_in_with_scram_and_a_read_only_user_cannot_write() {
    let acl_dir = tempfile::tempdir().unwrap();
    let acl = acl_dir.path().join("users.acl");
    std::fs::write(
        &acl,
        "user default off\nuser app on >app-pw +@all\nuser reader on >read-pw +@read\n\
         user auditor on #5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8 +@all\n",
    )
    .unwrap();
    let cluster = SqlCluster::start_with(3, &["--acl-file", acl.to_str().unwrap()]);
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let follower = others(leader)[0];

    let mut psql = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", &cluster.node(leader).pg.port().to_string()])
        .args(["-U", "app", "-d", "chorus", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .env("PGPASSWORD", "app-pw")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    psql.stdin
        .take()
        .unwrap()
        .write_all(b"CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);\nINSERT INTO notes VALUES (1, 'hello');\nSELECT body FROM notes;\n")
        .unwrap();
    let out = psql.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "psql as app: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(),
        ["CREATE TABLE", "INSERT 0 1", "hello"]
    );

    let reader = log_in(&cluster, follower, "reader", "read-pw").await.unwrap();
    assert_eq!(
        rows(&reader, "SELECT body FROM notes").await,
        vec![vec![Some("hello".to_string())]],
        "a read-only user reads on a follower, linearizably"
    );
    let refused = reader
        .simple_query("INSERT INTO notes VALUES (2, 'no')")
        .await
        .unwrap_err();
    assert_eq!(code(&refused), Some("42501"), "{refused}");
    reader.simple_query("BEGIN").await.unwrap();
    assert_eq!(
        rows(&reader, "SELECT count(*) FROM notes").await,
        vec![vec![Some("1".to_string())]]
    );
    let refused = reader.simple_query("DELETE FROM notes").await.unwrap_err();
    assert_eq!(code(&refused), Some("42501"), "{refused}");
    reader.simple_query("ROLLBACK").await.unwrap();
    let app = log_in(&cluster, leader, "app", "app-pw").await.unwrap();
    assert_eq!(
        rows(&app, "SELECT count(*) FROM notes").await,
        vec![vec![Some("1".to_string())]]
    );

    for (user, password) in [
        ("app", "wrong"),
        ("nobody", "app-pw"),
        ("auditor", "password"),
        ("default", ""),
    ] {
        let refused = log_in(&cluster, follower, user, password).await.err().unwrap();
        assert_eq!(code(&refused), Some("28P01"), "{user}: {refused}");
    }

    // Node 3 alone gets the guesses (every client here is 127.0.0.1).
    let guessed = if leader == 3 || follower == 3 {
        others(leader).into_iter().find(|id| *id != follower).unwrap()
    } else {
        3
    };
    for _ in 0..4 {
        let refused = log_in(&cluster, guessed, "app", "guess").await.err().unwrap();
        assert_eq!(code(&refused), Some("28P01"), "{refused}");
    }
    let refused = log_in(&cluster, guessed, "app", "app-pw").await.err().unwrap();
    assert_eq!(
        code(&refused),
        Some("28000"),
        "the right password is not checked while the address waits: {refused}"
    );
    let metrics = http_get(cluster.node(guessed).metrics, "/metrics").unwrap();
    assert!(
        metrics.contains("chorus_sql_login_failures_total{reason=\"wrong_password\"} 4"),
        "{metrics}"
    );
    assert!(
        metrics.contains("chorus_sql_login_failures_total{reason=\"throttled\"} 1"),
        "{metrics}"
    );
}

/// With a certificate the PostgreSQL port takes TLS connections only: psql verifying the node
/// against the CA (sslmode=verify-full) works, a client that does not ask for TLS is told it must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_node_with_a_certificate_takes_tls_clients_only() {
    let tls_dir = tempfile::tempdir().unwrap();
    let ca = chorus_tls::write_local_ca(tls_dir.path()).unwrap();
    let cluster = SqlCluster::start_with(
        3,
        &[
            "--tls-cert-file",
            ca.node_cert.to_str().unwrap(),
            "--tls-key-file",
            ca.node_key.to_str().unwrap(),
        ],
    );
    let leader = cluster.leader_among(&[1, 2, 3]).await;
    let conninfo = |id: u64, mode: &str| {
        format!(
            "host=127.0.0.1 port={} user=chorus dbname=chorus sslmode={mode} sslrootcert={}",
            cluster.node(id).pg.port(),
            ca.ca_cert.display()
        )
    };
    let psql = |id: u64, mode: &str, script: &str| {
        let out = Command::new("psql")
            .arg(conninfo(id, mode))
            .args(["-X", "-A", "-t", "-c", script])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, said) = psql(leader, "verify-full", "CREATE TABLE t (v TEXT)");
    assert!(ok, "{said}");
    let (ok, said) = psql(leader, "verify-full", "INSERT INTO t VALUES ('over tls')");
    assert!(ok, "{said}");
    let follower = others(leader)[0];
    cluster
        .wait_for_rows_over_tls(
            follower,
            &ca.ca_cert,
            "SELECT v FROM t",
            &[vec![Some("over tls".into())]],
        )
        .await;
    let (ok, said) = psql(follower, "disable", "SELECT 1");
    assert!(!ok && said.contains("TLS connections only"), "{said}");
}

/// A local cluster made by `chorus cluster start`, stopped when dropped.
struct ClusterDir(tempfile::TempDir);

impl ClusterDir {
    /// `chorus cluster start --sql` in a new directory, `server_args` given to every node.
    fn start_sql(server_args: &[&str]) -> ClusterDir {
        let cluster = ClusterDir(tempfile::tempdir().unwrap());
        let mut args = vec!["cluster", "start", "--sql", "--dir", cluster.path(), "--"];
        args.extend_from_slice(server_args);
        cluster.chorus(&args);
        cluster
    }

    fn path(&self) -> &str {
        self.0.path().to_str().expect("utf-8 path")
    }

    fn chorus(&self, args: &[&str]) -> String {
        common::run_chorus(args)
    }

    fn nodes(&self) -> Vec<chorus_cluster::NodeEntry> {
        chorus_cluster::load(self.0.path()).expect("cluster.toml").nodes
    }

    /// A client of the node that leads now.
    async fn leader(&self) -> (u64, Client) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for node in self.nodes() {
                if metric_at(node.metrics_addr, "chorus_raft_role") == Some(3) {
                    return (node.id, pg_client(node.client_addr).await);
                }
            }
            assert!(Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `sql` on the leader, again while a node refuses it for not leading (25006).
    async fn write(&self, sql: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (leader, client) = self.leader().await;
            match client.batch_execute(sql).await {
                Ok(()) => return,
                Err(e) if Instant::now() < deadline && e.code().map(|c| c.code()) == Some("25006") => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("{sql} on node {leader}: {e}"),
            }
        }
    }
}

impl Drop for ClusterDir {
    fn drop(&mut self) {
        let _ = Command::new(CHORUS)
            .args(["cluster", "stop", "--dir", self.path()])
            .output();
        if std::thread::panicking() {
            let logs = std::fs::read_dir(self.0.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("node"))
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        e.path().join("server.log"),
                    )
                });
            common::print_log_tails(logs, 40);
        }
    }
}

async fn pg_client(addr: SocketAddr) -> Client {
    try_pg_client(addr).await.expect("connect")
}

/// A client of the node whose PostgreSQL port is `addr`, if it takes connections.
async fn try_pg_client(addr: SocketAddr) -> Option<Client> {
    let config = format!(
        "host=127.0.0.1 port={} user=chorus dbname=chorus connect_timeout=5",
        addr.port()
    );
    let (client, connection) = tokio_postgres::connect(&config, NoTls).await.ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// A client of the node whose PostgreSQL port is `addr`, with what its connection ended with.
async fn pg_client_watched(addr: SocketAddr) -> (Client, tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>) {
    let config = format!(
        "host=127.0.0.1 port={} user=chorus dbname=chorus connect_timeout=5",
        addr.port()
    );
    let (client, connection) = tokio_postgres::connect(&config, NoTls).await.expect("connect");
    (client, tokio::spawn(connection))
}

/// A node sent SIGTERM shuts down as PostgreSQL's smart shutdown does: it takes no new client,
/// an idle session is ended at once with 57P01, and a session in a transaction may finish it —
/// its COMMIT is acknowledged, and the rows are on the other nodes — before it is ended too and
/// the process exits, long before the drain's 5 s are up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_shutting_down_lets_an_open_transaction_commit_and_ends_idle_sessions() {
    let mut cluster = SqlCluster::start(3);
    let leader = cluster.setup("CREATE TABLE items (id int PRIMARY KEY)").await;
    let (idle, idle_ended) = pg_client_watched(cluster.node(leader).pg).await;
    let (busy, busy_ended) = pg_client_watched(cluster.node(leader).pg).await;
    busy.batch_execute("BEGIN; INSERT INTO items VALUES (1)").await.unwrap();
    cluster.terminate(leader);

    let ended = tokio::time::timeout(Duration::from_secs(3), idle_ended)
        .await
        .expect("the idle session is ended at once")
        .unwrap();
    let error = ended.expect_err("the node says why it ends the session");
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN),
        "{error}"
    );
    assert!(idle.is_closed());
    assert!(
        try_pg_client(cluster.node(leader).pg).await.is_none(),
        "a node shutting down takes no new client"
    );

    busy.batch_execute("INSERT INTO items VALUES (2)").await.unwrap();
    busy.batch_execute("COMMIT")
        .await
        .expect("a transaction open when the shutdown began commits");
    let ended = tokio::time::timeout(Duration::from_secs(3), busy_ended)
        .await
        .expect("the session ends once its transaction did")
        .unwrap();
    assert_eq!(
        ended.expect_err("ended by the node").code(),
        Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN)
    );
    assert!(
        cluster.exited_within(leader, Duration::from_secs(3)),
        "the node exits once its last session ended"
    );
    assert!(
        cluster.node(leader).dir.join("sql/db.closed").exists(),
        "a node that stopped cleanly marks its database closed (SQLite syncs nothing before)"
    );
    let others = others(leader);
    cluster.leader_among(&others).await;
    for &id in &others {
        cluster
            .wait_for_rows(id, "SELECT count(*) FROM items", &[vec![Some("2".to_string())]])
            .await;
    }

    // The closed database is trusted as it is; one whose node was killed is rebuilt from the
    // last checkpoint and the log. Either way every row is there.
    let rebuilt = "rebuilding it from the checkpoint and the log";
    let killed = others[0];
    cluster.kill(killed);
    cluster.launch(leader);
    cluster.launch(killed);
    for id in [leader, killed] {
        cluster
            .wait_for_rows(id, "SELECT count(*) FROM items", &[vec![Some("2".to_string())]])
            .await;
    }
    let log = |id: u64| std::fs::read_to_string(cluster.node(id).dir.with_extension("log")).unwrap();
    assert!(!log(leader).contains(rebuilt), "{}", cluster.log_tail(leader));
    assert!(log(killed).contains(rebuilt), "{}", cluster.log_tail(killed));
}

/// `chorus cluster start --dir` brings a stopped SQL cluster back as it was made, rows and all,
/// without being told `--sql` again — also on the PostgreSQL engine in a directory named
/// relative to where the command runs, whose servers start from there; `--sql` on a directory
/// holding a key-value cluster is refused, saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sql_cluster_starts_again_as_it_was_made() {
    let cluster = ClusterDir(tempfile::tempdir().unwrap());
    let parent = cluster.0.path().parent().expect("a temporary directory has a parent");
    let name = cluster
        .path()
        .rsplit('/')
        .next()
        .expect("a temporary directory has a name");
    let relative = |args: &[&str]| run_chorus_in(parent, args);
    relative(&[
        "cluster",
        "start",
        "--sql",
        "--dir",
        name,
        "--",
        "--sql-engine",
        "postgres",
    ]);
    cluster.write("CREATE TABLE items (id int PRIMARY KEY)").await;
    cluster.write("INSERT INTO items VALUES (1), (2)").await;
    relative(&["cluster", "stop", "--dir", name]);
    relative(&["cluster", "start", "--dir", name]);
    let (_, client) = cluster.leader().await;
    execute_until_taken(
        &client,
        "SELECT 1 FROM items",
        Duration::from_secs(20),
        "the leader after the restart serves no reads",
    )
    .await;
    let count = client.query_one("SELECT count(*) FROM items", &[]).await.unwrap();
    assert_eq!(count.get::<_, i64>(0), 2);

    let key_value = ClusterDir(tempfile::tempdir().unwrap());
    key_value.chorus(&["cluster", "start", "--dir", key_value.path()]);
    let refused = Command::new(CHORUS)
        .args(["cluster", "start", "--sql", "--dir", key_value.path()])
        .output()
        .expect("run chorus");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("holds a key-value cluster; start it without --sql"),
        "{said}"
    );
}

/// A SQL cluster in active replication changes its membership online, as a key-value one does:
/// two nodes join (from the leader's checkpoint and the log) and are promoted, then the leader
/// (after handing over) and another original node leave; every remaining node ends with every
/// row written before, between and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_cluster_grows_and_shrinks_online_and_every_node_has_every_row() {
    let cluster = ClusterDir::start_sql(&[]);
    cluster
        .write("CREATE TABLE items (id int PRIMARY KEY, name text)")
        .await;
    let insert = |from: usize, to: usize| {
        let values: Vec<String> = (from..to).map(|i| format!("({i}, 'item {i}')")).collect();
        format!("INSERT INTO items VALUES {}", values.join(", "))
    };
    cluster.write(&insert(0, 100)).await;
    let said = cluster.chorus(&["cluster", "add-node", "--dir", cluster.path(), "--count", "2"]);
    assert!(said.contains("node(s) 4,5: voters"), "{said}");
    cluster.write(&insert(100, 200)).await;
    let (leader, _) = cluster.leader().await;
    let other = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    for id in [leader, other] {
        let said = cluster.chorus(&[
            "cluster",
            "remove-node",
            "--dir",
            cluster.path(),
            "--node",
            &id.to_string(),
        ]);
        assert!(said.contains(&format!("node {id}: removed")), "{said}");
    }
    cluster.write(&insert(200, 300)).await;
    let remaining = cluster.nodes();
    assert_eq!(remaining.len(), 3);
    for node in remaining {
        let client = pg_client(node.client_addr).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let count = rows(&client, "SELECT count(*), sum(id) FROM items").await;
            if count == vec![vec![Some("300".to_string()), Some("44850".to_string())]] {
                break;
            }
            assert!(Instant::now() < deadline, "node {}: {count:?}", node.id);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A hybrid SQL cluster changes membership online, its conflict classes placed over the voters
/// in force: branch 3 is node 1's over voters 1, 2, 3 (3 mod 3) and node 4's once node 4 joins
/// (3 mod 4), so node 1 forwards a transaction on it to node 4 then, and runs it itself again
/// once node 4 has left. Deposits forwarded to node 4 while it leaves all get an answer — node
/// 4 is made a learner and drains before it stops — at worst a retryable 40001, never an
/// unknown outcome. Every node ends with every deposit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_sql_cluster_places_its_classes_over_the_voters_as_nodes_join_and_leave() {
    let cluster = ClusterDir::start_sql(&["--sql-mode", "hybrid", "--sql-conflict-classes", "accounts.branch"]);
    cluster
        .write("CREATE TABLE accounts (branch int PRIMARY KEY, balance int)")
        .await;
    cluster.write("INSERT INTO accounts VALUES (3, 100), (5, 100)").await;
    let node = |id: u64| cluster.nodes().into_iter().find(|n| n.id == id).expect("listed");
    let metrics_1 = node(1).metrics_addr;
    let client_1 = pg_client(node(1).client_addr).await;
    let wait_for_voters = |count: u64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while metric_at(metrics_1, "chorus_sql_class_owner_voters") != Some(count) {
            assert!(
                Instant::now() < deadline,
                "node 1 never placed the classes over {count} voters"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for_voters(3);
    let mut deposits = 5;
    assert_eq!(
        deposit_into_3(&client_1, metrics_1, 5).await,
        0,
        "node 1 owns branch 3 over voters 1, 2, 3"
    );

    let said = cluster.chorus(&["cluster", "add-node", "--dir", cluster.path()]);
    assert!(said.contains("node(s) 4: voters"), "{said}");
    wait_for_voters(4);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        deposits += 5;
        if deposit_into_3(&client_1, metrics_1, 5).await == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "node 1 does not forward branch 3 to node 4");
    }

    // Node 4 leaves (handing leadership over first if it leads) while deposits keep coming.
    let leaving = Arc::new(AtomicBool::new(true));
    let depositing = {
        let (client, leaving) = (pg_client(node(1).client_addr).await, leaving.clone());
        tokio::spawn(async move {
            let (mut done, mut failures) = (0, Vec::new());
            while leaving.load(Ordering::Relaxed) {
                match client
                    .batch_execute("UPDATE accounts SET balance = balance + 1 WHERE branch = 3")
                    .await
                {
                    Ok(()) => done += 1,
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE) => {}
                    Err(e) => failures.push(match e.as_db_error() {
                        Some(db) => format!("{}: {}", db.code().code(), db.message()),
                        None => e.to_string(),
                    }),
                }
            }
            (done, failures)
        })
    };
    cluster.chorus(&["cluster", "remove-node", "--dir", cluster.path(), "--node", "4"]);
    leaving.store(false, Ordering::Relaxed);
    let (done, failures) = depositing.await.unwrap();
    assert!(failures.is_empty(), "deposits during the removal failed: {failures:?}");
    assert!(done > 0, "no deposit went through during the removal");
    deposits += done;
    wait_for_voters(3);
    deposits += 5;
    assert_eq!(
        deposit_into_3(&client_1, metrics_1, 5).await,
        0,
        "branch 3 is node 1's again"
    );

    let expected = vec![vec![Some((100 + deposits).to_string())]];
    for node in cluster.nodes() {
        let client = pg_client(node.client_addr).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let balance = rows(&client, "SELECT balance FROM accounts WHERE branch = 3").await;
            if balance == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: {balance:?}, not {expected:?}",
                node.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Deposits 1 into branch 3 `times` through `client`, each retried while a class moves (40001,
/// or a forward to a node not heard from yet); returns how many of them the node (metrics port
/// `metrics`) forwarded to another.
async fn deposit_into_3(client: &Client, metrics: SocketAddr, times: usize) -> u64 {
    let forwarded = || metric_at(metrics, "chorus_sql_transactions_forwarded_total").unwrap_or(0);
    let before = forwarded();
    for _ in 0..times {
        execute_until_taken(
            client,
            "UPDATE accounts SET balance = balance + 1 WHERE branch = 3",
            Duration::from_secs(20),
            "a deposit into branch 3",
        )
        .await;
    }
    forwarded() - before
}

/// Runs `sql` through `client` again every 100 ms until it succeeds; fails the test, saying
/// `failing` and the last error, if it has not within `within`.
async fn execute_until_taken(client: &Client, sql: &str, within: Duration, failing: &str) {
    let deadline = Instant::now() + within;
    while let Err(e) = client.batch_execute(sql).await {
        assert!(Instant::now() < deadline, "{failing}: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// On the PostgreSQL engine a joining node gets a server of its own, draws what the leader drew
/// once caught up, and a removed node's server is stopped with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_postgres_engine_a_joining_node_gets_its_own_server_and_a_removed_one_stops_its() {
    let cluster = ClusterDir::start_sql(&["--sql-engine", "postgres"]);
    cluster
        .write("CREATE TABLE items (id serial PRIMARY KEY, name text)")
        .await;
    cluster.write("INSERT INTO items (name) VALUES ('a'), ('b')").await;
    cluster.chorus(&["cluster", "add-node", "--dir", cluster.path()]);
    let (leader, _) = cluster.leader().await;
    cluster.chorus(&[
        "cluster",
        "remove-node",
        "--dir",
        cluster.path(),
        "--node",
        &leader.to_string(),
    ]);
    let removed_server = cluster.0.path().join(format!("node{leader}/postgres/data"));
    let still_running = Command::new("pgrep")
        .args(["-f", &removed_server.display().to_string()])
        .output()
        .unwrap();
    assert!(
        !still_running.status.success(),
        "node {leader}'s PostgreSQL server outlived its removal"
    );
    cluster.write("INSERT INTO items (name) VALUES ('c')").await;
    let joined = cluster.nodes().into_iter().find(|n| n.id == 4).expect("node 4 listed");
    let client = pg_client(joined.client_addr).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let drawn = rows(&client, "SELECT count(*), max(id) FROM items").await;
        if drawn == vec![vec![Some("3".to_string()), Some("3".to_string())]] {
            break;
        }
        assert!(Instant::now() < deadline, "node 4: {drawn:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
