//! PostgreSQL servers on this machine: the programs of the newest installed version, and one
//! server per node of a SQL cluster on the PostgreSQL engine (`chorus cluster start --sql --
//! --sql-engine postgres`), initialised at the node's first start in `nodeN/postgres`, run as
//! nobody when Chorus runs as root, and stopped with the cluster.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::process;

/// A PostgreSQL program (`initdb`, `postgres`, `pg_dump`, …) of the newest version installed
/// as Debian lays it out.
pub fn program(name: &str) -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let program = e.path().join("bin").join(name);
            program.is_file().then_some((version, program))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, program)| program)
}

fn require(name: &str) -> anyhow::Result<PathBuf> {
    program(name).with_context(|| {
        format!("no PostgreSQL {name} under /usr/lib/postgresql; install PostgreSQL (the Debian package `postgresql`)")
    })
}

/// The connection string of a server on `addr` (trust authentication on loopback, as initdb
/// sets it).
pub fn conninfo(addr: SocketAddr) -> String {
    format!("host={} port={} user=postgres dbname=postgres", addr.ip(), addr.port())
}

/// Whether a SQL cluster's server flags choose the PostgreSQL engine.
pub fn engine_chosen(server_args: &[String]) -> bool {
    server_args
        .iter()
        .zip(server_args.iter().skip(1))
        .any(|(flag, value)| flag == "--sql-engine" && value == "postgres")
        || server_args.iter().any(|a| a == "--sql-engine=postgres")
}

/// Settings of a node's server. Chorus's log is what is durable: the engine's commits do not
/// wait for its WAL flush (set per session by the node), but PostgreSQL keeps fsync and full
/// page writes, so a crash leaves a consistent database the log brings forward. Logical
/// decoding (a slot and a WAL sender) is how a leader captures write-sets in passive mode.
const NODE_SETTINGS: &str = "
listen_addresses = '127.0.0.1'
max_connections = 100
shared_buffers = 256MB
fsync = on
wal_level = logical
max_wal_senders = 4
max_replication_slots = 4
max_wal_size = 4GB
checkpoint_timeout = 15min
log_min_messages = warning
";

/// Runs `command` to its end, its output kept in `log`; fails saying where to look.
pub fn run_to_end(mut command: Command, what: &str, log: &Path) -> anyhow::Result<()> {
    let output = command.output().with_context(|| format!("cannot run {what}"))?;
    std::fs::write(log, [&output.stdout[..], &output.stderr[..]].concat())?;
    if !output.status.success() {
        bail!("{what} failed ({}); see {}", output.status, log.display());
    }
    Ok(())
}

/// The PostgreSQL server of the node in `node_dir` (inside the cluster's `base` directory),
/// started on `addr` unless it runs, and initialised first if it never was; returns once it
/// accepts connections.
pub fn ensure_running(base: &Path, node_dir: &Path, addr: SocketAddr) -> anyhow::Result<()> {
    let pid_file = pid_file(node_dir);
    if process::read_pid(&pid_file).is_some() {
        return Ok(());
    }
    // The server runs in its data directory: a relative socket directory (a cluster given
    // as `--dir c`) would name one that does not exist from there.
    let pg_dir = std::path::absolute(node_dir.join("postgres"))?;
    let data = pg_dir.join("data");
    if !data.join("PG_VERSION").exists() {
        let mut initdb = Command::new(require("initdb")?);
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"]);
        process::drop_root(&mut initdb, base, &[&pg_dir])?;
        run_to_end(initdb, "initdb", &node_dir.join("initdb.log"))?;
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf)?;
        text.push_str(NODE_SETTINGS);
        std::fs::write(&conf, text)?;
    }
    let mut server = Command::new(require("postgres")?);
    server
        .arg("-D")
        .arg(&data)
        .args(["-p", &addr.port().to_string()])
        .arg("-k")
        .arg(&pg_dir);
    process::drop_root(&mut server, base, &[&pg_dir])?;
    let pid = process::spawn(server, &node_dir.join("postgres.log"), &pid_file)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = Command::new(require("pg_isready")?)
            .args(["-q", "-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            return Ok(());
        }
        if !process::alive(pid) || Instant::now() > deadline {
            process::terminate(pid, Duration::from_secs(5));
            let _ = std::fs::remove_file(&pid_file);
            bail!(
                "PostgreSQL for {} did not start; see {}",
                node_dir.display(),
                node_dir.join("postgres.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pid_file(node_dir: &Path) -> PathBuf {
    node_dir.join("postgres.pid")
}

/// The pid of the node's PostgreSQL server, if it runs.
pub fn pid(node_dir: &Path) -> Option<u32> {
    process::read_pid(&pid_file(node_dir))
}

/// Stops the node's PostgreSQL server if it runs (a fast shutdown: SIGINT).
pub fn stop(node_dir: &Path) {
    let pid_file = pid_file(node_dir);
    if let Some(pid) = process::read_pid(&pid_file) {
        process::signal(pid, libc::SIGINT);
        process::wait_gone_or_kill(pid, Duration::from_secs(20));
        let _ = std::fs::remove_file(&pid_file);
    }
}
