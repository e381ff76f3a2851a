//! The systems we compare against, started from Debian's packages on loopback under the same
//! network profile as Chorus: a 3-member etcd cluster, Redis as a primary with 2 replicas, and
//! a lone Redis (durable on one machine, replicated nowhere: the yardstick of a single node);
//! for SQL, PostgreSQL alone and as a primary with 2 streaming standbys (or as many as
//! `--nodes` asks), synchronous (a commit waits until enough standbys have flushed it to be on
//! disk on a majority, 2 of 3, as Chorus's) or asynchronous.
//!
//! How each one's traffic is laid onto emulated links:
//! - Redis: each replica dials the primary, so one link per replica carries that pair's round
//!   trip (half the RTT each way).
//! - etcd: member X receives member Y's messages on a stream X opened to Y's peer URL, so Y's
//!   outgoing messages all cross Y's proxy downstream. One delay per member (the sender's)
//!   reproduces any 3-member RTT triangle exactly: d_i = (rtt(i,j) + rtt(i,k) − rtt(j,k)) / 2.
//!
//! Member 1 (the primary, for Redis) sits where the profile puts the leader; etcd's leadership
//! is moved there after start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chorus_client::{Client, Value};
use chorus_cluster::netem::{self, Link, PathCheck, Profile, Toxiproxy};
use chorus_cluster::{ports, process};
use serde::{Deserialize, Serialize};

use crate::etcd_target;

const MEMBERS: u64 = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum System {
    Etcd,
    Redis,
    RedisAlone,
    /// Primary + 2 standbys, `synchronous_standby_names = 'ANY 1 (...)'`.
    Postgres,
    /// Primary + 2 standbys, asynchronous streaming.
    PostgresAsync,
    PostgresAlone,
}

impl System {
    fn binary(&self) -> &'static str {
        match self {
            System::Etcd => "etcd",
            System::Redis | System::RedisAlone => "redis-server",
            System::Postgres | System::PostgresAsync | System::PostgresAlone => "postgres",
        }
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, System::Postgres | System::PostgresAsync | System::PostgresAlone)
    }

    fn package(&self) -> &'static str {
        match self {
            System::Etcd => "etcd-server",
            System::Redis | System::RedisAlone => "redis-server",
            System::Postgres | System::PostgresAsync | System::PostgresAlone => "postgresql",
        }
    }
}

/// A running peer cluster, recorded in `DIR/peers.toml` so `peers stop` can find it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerCluster {
    pub system: System,
    pub pids: Vec<u32>,
    /// Where the benchmark client connects: the leader or primary, through its client link
    /// under a network profile.
    pub client_addr: SocketAddr,
    pub profile: Option<String>,
    pub bandwidth_mbit: Option<f64>,
    /// Round trips measured on the emulated links before the members started.
    pub measured_paths_ms: BTreeMap<String, f64>,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("peers.toml")
}

/// A PostgreSQL server program: Debian keeps them out of PATH, in one directory per major
/// version; the newest wins.
fn require_binary(system: System) -> anyhow::Result<()> {
    let found = if system.is_postgres() {
        chorus_cluster::postgres::program(system.binary()).is_some()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(system.binary()).is_file()))
    };
    if !found {
        bail!(
            "{} is not installed; run scripts/install-bench-tools (or apt-get install {})",
            system.binary(),
            system.package()
        );
    }
    Ok(())
}

/// Starts the proxy server, creates `links`, and measures `paths` (label → ms).
fn start_network(dir: &Path, links: &[Link], paths: &[PathCheck]) -> anyhow::Result<BTreeMap<String, f64>> {
    let proxy = Toxiproxy::start(dir)?;
    for link in links {
        proxy.create(link)?;
    }
    let verification = netem::verify(links, paths).inspect_err(|_| proxy.stop())?;
    verification.print();
    Ok(verification
        .paths
        .iter()
        .map(|p| (p.label.clone(), p.measured_rtt_ms))
        .collect())
}

fn client_link(name: &str, listen: u16, upstream: SocketAddr, rtt_ms: u64) -> (Link, PathCheck) {
    let link = Link {
        name: name.to_string(),
        listen: loopback(listen),
        upstream,
        upstream_delay_ms: netem::split_rtt(rtt_ms, true),
        downstream_delay_ms: netem::split_rtt(rtt_ms, false),
        // The cap models links between regions; the client link stays uncapped.
        bandwidth_kbytes_per_sec: None,
    };
    let path = PathCheck {
        label: name.replace("-to-", " <-> "),
        expected_rtt_ms: rtt_ms,
        links: vec![name.to_string()],
    };
    (link, path)
}

impl PeerCluster {
    pub fn load(dir: &Path) -> anyhow::Result<PeerCluster> {
        let text = std::fs::read_to_string(state_file(dir))
            .with_context(|| {
                format!(
                    "no peer cluster in {}; start one with `chorus bench peers start --system etcd|redis|redis-alone|postgres|postgres-async|postgres-alone --dir {}`",
                    dir.display(),
                    dir.display()
                )
            })?;
        toml::from_str(&text).with_context(|| format!("invalid {}", state_file(dir).display()))
    }

    fn save(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::write(state_file(dir), toml::to_string(self)?)?;
        Ok(())
    }

    /// Starts `system` in `dir` (which must not hold a running one).
    pub async fn start(system: System, dir: &Path, profile: Option<&Profile>) -> anyhow::Result<PeerCluster> {
        Self::start_members(system, dir, profile, MEMBERS as usize).await
    }

    /// As `start`, with `members` members: PostgreSQL with standbys takes any number from 2
    /// (to compare with a Chorus cluster of that size); the others run 3.
    pub async fn start_members(
        system: System,
        dir: &Path,
        profile: Option<&Profile>,
        members: usize,
    ) -> anyhow::Result<PeerCluster> {
        let replicated_postgres = matches!(system, System::Postgres | System::PostgresAsync);
        if members != MEMBERS as usize && !(replicated_postgres && members >= 2) {
            bail!(
                "{system:?} runs {MEMBERS} members; only PostgreSQL with standbys (postgres, postgres-async) \
                 takes another count, from 2"
            );
        }
        require_binary(system)?;
        if let Ok(existing) = PeerCluster::load(dir) {
            if existing.pids.iter().any(|pid| process::alive(*pid)) {
                bail!(
                    "{} already runs a peer cluster; stop it first with `chorus bench peers stop --dir {}`",
                    dir.display(),
                    dir.display()
                );
            }
        }
        if let Some(profile) = profile {
            // A lone Redis sits where the profile puts the leader and uses only its client link.
            if system != System::RedisAlone {
                profile.check_nodes(members)?;
            }
            println!("network: {}", profile.summary());
        }
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut cluster = match system {
            System::Redis => start_redis(dir, profile, MEMBERS).await,
            System::RedisAlone => start_redis(dir, profile, 1).await,
            System::Etcd => start_etcd(dir, profile).await,
            System::Postgres => start_postgres(dir, profile, members - 1, true).await,
            System::PostgresAsync => start_postgres(dir, profile, members - 1, false).await,
            System::PostgresAlone => start_postgres(dir, profile, 0, false).await,
        }?;
        cluster.profile = profile.map(|p| p.name.clone());
        cluster.bandwidth_mbit = profile.and_then(|p| p.bandwidth_mbit);
        cluster.save(dir)?;
        Ok(cluster)
    }

    pub fn stop(&self, dir: &Path) {
        for pid in &self.pids {
            process::terminate(*pid, Duration::from_secs(10));
        }
        if let Some(pid) = process::read_pid(&dir.join("toxiproxy.pid")) {
            process::terminate(pid, Duration::from_secs(3));
        }
    }
}

/// Where a primary's replicas and its client reach it.
struct PrimaryNetwork {
    /// The primary's address as replica 2, 3, … dials it.
    primary_for: Vec<SocketAddr>,
    client_addr: SocketAddr,
    measured: BTreeMap<String, f64>,
}

/// Under a profile, a link per replica (that pair's round trip) and one for the client, on
/// `proxy_ports` (`members` of them), measured; without one, everyone dials the primary.
fn primary_network(
    dir: &Path,
    profile: Option<&Profile>,
    primary: SocketAddr,
    members: usize,
    proxy_ports: &[u16],
) -> anyhow::Result<PrimaryNetwork> {
    let Some(profile) = profile else {
        return Ok(PrimaryNetwork {
            primary_for: vec![primary; members - 1],
            client_addr: primary,
            measured: BTreeMap::new(),
        });
    };
    let mut links = Vec::new();
    let mut paths = Vec::new();
    for replica in 2..=members as u64 {
        let name = format!("replica-{replica}-to-primary");
        let rtt = profile.rtt_ms(1, replica);
        links.push(Link {
            name: name.clone(),
            listen: loopback(proxy_ports[replica as usize - 2]),
            upstream: primary,
            upstream_delay_ms: netem::split_rtt(rtt, true),
            downstream_delay_ms: netem::split_rtt(rtt, false),
            bandwidth_kbytes_per_sec: profile.bandwidth_kbytes_per_sec(),
        });
        paths.push(PathCheck {
            label: format!("primary <-> replica {replica}"),
            expected_rtt_ms: rtt,
            links: vec![name],
        });
    }
    let primary_for = links.iter().map(|l| l.listen).collect();
    let (link, path) = client_link(
        "client-to-primary",
        proxy_ports[members - 1],
        primary,
        profile.client_rtt(1),
    );
    let client_addr = link.listen;
    links.push(link);
    paths.push(path);
    Ok(PrimaryNetwork {
        primary_for,
        client_addr,
        measured: start_network(dir, &links, &paths)?,
    })
}

/// A primary (member 1) and `members - 1` replicas.
async fn start_redis(dir: &Path, profile: Option<&Profile>, members: u64) -> anyhow::Result<PeerCluster> {
    // Member ports, then (under a profile) a proxy per replica link and one for the client.
    let proxies = if profile.is_some() { members as usize } else { 0 };
    let ports = ports::free_loopback_ports(members as usize + proxies)?;
    let primary = loopback(ports[0]);
    let network = primary_network(dir, profile, primary, members as usize, &ports[members as usize..])?;
    let mut pids = Vec::new();
    for member in 1..=members {
        let mdir = dir.join(format!("redis{member}"));
        let mut command = Command::new("redis-server");
        command.args(["--port", &ports[member as usize - 1].to_string(), "--bind", "127.0.0.1"]);
        command.arg("--dir").arg(&mdir);
        // Durable like Chorus: every write is fsynced before the primary answers.
        command.args([
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
        ]);
        if member > 1 {
            let upstream = network.primary_for[member as usize - 2];
            command.args(["--replicaof", &upstream.ip().to_string(), &upstream.port().to_string()]);
        }
        process::drop_root(&mut command, dir, &[&mdir])?;
        pids.push(process::spawn(
            command,
            &dir.join(format!("redis{member}.log")),
            &dir.join(format!("redis{member}.pid")),
        )?);
    }
    let cluster = PeerCluster {
        system: if members == 1 {
            System::RedisAlone
        } else {
            System::Redis
        },
        pids,
        client_addr: network.client_addr,
        profile: None,
        bandwidth_mbit: None,
        measured_paths_ms: network.measured,
    };
    wait_for_replicas(primary, members as usize - 1)
        .await
        .inspect_err(|_| cluster.stop(dir))?;
    Ok(cluster)
}

async fn wait_for_replicas(primary: SocketAddr, replicas: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(mut client) = Client::connect(primary).await {
            if let Ok(Value::Bulk(Some(info))) = client.command(&["INFO", "replication"]).await {
                let info = String::from_utf8_lossy(&info);
                let online = info
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count();
                if online >= replicas {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("Redis replicas did not come online within {READY_TIMEOUT:?}; see redisN.log beside them");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Settings every PostgreSQL member shares: durable commits (fsync, `synchronous_commit = on`),
/// memory and checkpoints sized so that a benchmark measures transactions rather than
/// checkpoints, and streaming replication enabled.
const POSTGRES_SETTINGS: &str = "
listen_addresses = '127.0.0.1'
max_connections = 300
shared_buffers = 1GB
fsync = on
synchronous_commit = on
wal_level = replica
max_wal_senders = 10
hot_standby = on
max_wal_size = 16GB
checkpoint_timeout = 1h
log_min_messages = warning
";

/// A PostgreSQL primary (member 1) and `standbys` streaming standbys made by pg_basebackup;
/// with `synchronous`, a commit waits for the flush of as many standbys as make a majority
/// with the primary (one of two, two of four): on disk on a majority, as Chorus's commits. Under a profile, each standby
/// streams over its link to the primary, as Redis replicas do.
async fn start_postgres(
    dir: &Path,
    profile: Option<&Profile>,
    standbys: usize,
    synchronous: bool,
) -> anyhow::Result<PeerCluster> {
    let program =
        |name: &str| chorus_cluster::postgres::program(name).with_context(|| format!("no PostgreSQL {name} installed"));
    let members = standbys + 1;
    let proxies = if profile.is_some() { members } else { 0 };
    let ports = ports::free_loopback_ports(members + proxies)?;
    let primary = loopback(ports[0]);
    let network = primary_network(dir, profile, primary, members, &ports[members..])?;
    let pdir = dir.join("pg1");
    let mut initdb = Command::new(program("initdb")?);
    initdb
        .arg("-D")
        .arg(pdir.join("data"))
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"]);
    process::drop_root(&mut initdb, dir, &[&pdir])?;
    chorus_cluster::postgres::run_to_end(initdb, "initdb", &dir.join("initdb.log"))?;
    let names: Vec<String> = (2..=members).map(|m| format!("pg{m}")).collect();
    let synchronous_names = if synchronous {
        format!("ANY {} ({})", members / 2, names.join(", "))
    } else {
        String::new()
    };
    let conf = pdir.join("data/postgresql.conf");
    let mut text = std::fs::read_to_string(&conf)?;
    text.push_str(POSTGRES_SETTINGS);
    text.push_str(&format!("synchronous_standby_names = '{synchronous_names}'\n"));
    std::fs::write(&conf, text)?;
    let start = |member: usize, mdir: &Path, extra: &[String]| -> anyhow::Result<u32> {
        let mut command = Command::new(program("postgres")?);
        command
            .arg("-D")
            .arg(mdir.join("data"))
            .args(["-p", &ports[member - 1].to_string()])
            .arg("-k")
            .arg(mdir)
            .args(extra);
        process::drop_root(&mut command, dir, &[mdir])?;
        process::spawn(
            command,
            &dir.join(format!("pg{member}.log")),
            &dir.join(format!("pg{member}.pid")),
        )
    };
    let mut cluster = PeerCluster {
        system: match (standbys, synchronous) {
            (0, _) => System::PostgresAlone,
            (_, true) => System::Postgres,
            (_, false) => System::PostgresAsync,
        },
        pids: vec![start(1, &pdir, &[])?],
        client_addr: network.client_addr,
        profile: None,
        bandwidth_mbit: None,
        measured_paths_ms: network.measured.clone(),
    };
    let started = async {
        postgres_ready(primary).await?;
        for (i, name) in names.iter().enumerate() {
            let member = i + 2;
            let mdir = dir.join(name);
            let mut backup = Command::new(program("pg_basebackup")?);
            backup
                .args(["-h", "127.0.0.1", "-p", &ports[0].to_string(), "-U", "postgres", "-D"])
                .arg(mdir.join("data"))
                .args(["-R", "--wal-method=stream", "--checkpoint=fast"]);
            process::drop_root(&mut backup, dir, &[&mdir])?;
            chorus_cluster::postgres::run_to_end(backup, "pg_basebackup", &dir.join(format!("{name}-basebackup.log")))?;
            let conninfo = format!(
                "primary_conninfo={} application_name={name}",
                chorus_cluster::postgres::conninfo(network.primary_for[i])
            );
            cluster.pids.push(start(member, &mdir, &["-c".into(), conninfo])?);
        }
        wait_for_standbys(primary, standbys, synchronous).await
    };
    if let Err(e) = started.await {
        cluster.stop(dir);
        return Err(e);
    }
    Ok(cluster)
}

async fn postgres_connect(addr: SocketAddr) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) =
        tokio_postgres::connect(&chorus_cluster::postgres::conninfo(addr), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn postgres_ready(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match postgres_connect(addr).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                bail!("PostgreSQL at {addr} did not accept connections within {READY_TIMEOUT:?} ({e}); see pg1.log")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until `standbys` standbys stream from the primary (and, when synchronous, take part
/// in the commit quorum).
async fn wait_for_standbys(primary: SocketAddr, standbys: usize, synchronous: bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let client = postgres_connect(primary).await?;
    let wanted = if synchronous { "'quorum', 'sync'" } else { "'async'" };
    let sql =
        format!("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ({wanted})");
    loop {
        let row = client.query_one(&sql, &[]).await?;
        if row.get::<_, i64>(0) as usize >= standbys {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the PostgreSQL standbys did not stream within {READY_TIMEOUT:?}; see pgN.log");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Per-member send delays that reproduce the profile's RTT triangle (see the module comment).
fn etcd_send_delays(profile: &Profile) -> anyhow::Result<Vec<u64>> {
    let rtt = |a: u64, b: u64| profile.rtt_ms(a, b) as i64;
    (1..=MEMBERS)
        .map(|i| {
            let (j, k) = match i {
                1 => (2, 3),
                2 => (1, 3),
                _ => (1, 2),
            };
            let twice = rtt(i, j) + rtt(i, k) - rtt(j, k);
            if twice < 0 {
                bail!(
                    "profile {} has an RTT triangle no per-sender delay can reproduce",
                    profile.name
                );
            }
            Ok(twice as u64 / 2)
        })
        .collect()
}

async fn start_etcd(dir: &Path, profile: Option<&Profile>) -> anyhow::Result<PeerCluster> {
    let n = MEMBERS as usize;
    // Client and peer port per member, then (under a profile) a peer proxy per member and a
    // client proxy for member 1.
    let proxies = if profile.is_some() { n + 1 } else { 0 };
    let ports = ports::free_loopback_ports(2 * n + proxies)?;
    let client_port = |m: usize| ports[2 * (m - 1)];
    let peer_port = |m: usize| ports[2 * (m - 1) + 1];
    let mut advertised: Vec<SocketAddr> = (1..=n).map(|m| loopback(peer_port(m))).collect();
    let mut client_addr = loopback(client_port(1));
    let mut measured = BTreeMap::new();
    if let Some(profile) = profile {
        let delays = etcd_send_delays(profile)?;
        let mut links = Vec::new();
        for m in 1..=n {
            links.push(Link {
                name: format!("member-{m}-peer"),
                listen: loopback(ports[2 * n + m - 1]),
                upstream: loopback(peer_port(m)),
                upstream_delay_ms: 0,
                downstream_delay_ms: delays[m - 1],
                bandwidth_kbytes_per_sec: profile.bandwidth_kbytes_per_sec(),
            });
            advertised[m - 1] = links[m - 1].listen;
        }
        let mut paths = Vec::new();
        for a in 1..=MEMBERS {
            for b in a + 1..=MEMBERS {
                paths.push(PathCheck {
                    label: format!("member {a} <-> member {b}"),
                    expected_rtt_ms: profile.rtt_ms(a, b),
                    links: vec![format!("member-{a}-peer"), format!("member-{b}-peer")],
                });
            }
        }
        let (link, path) = client_link(
            "client-to-member-1",
            ports[3 * n],
            loopback(client_port(1)),
            profile.client_rtt(1),
        );
        client_addr = link.listen;
        links.push(link);
        paths.push(path);
        measured = start_network(dir, &links, &paths)?;
    }
    let initial_cluster = (1..=n)
        .map(|m| format!("m{m}=http://{}", advertised[m - 1]))
        .collect::<Vec<_>>()
        .join(",");
    let token = format!("chorus-bench-{}", std::process::id());
    let mut pids = Vec::new();
    for m in 1..=n {
        let mdir = dir.join(format!("etcd{m}"));
        let client_url = format!("http://{}", loopback(client_port(m)));
        let mut command = Command::new("etcd");
        command
            .args(["--name", &format!("m{m}")])
            .arg("--data-dir")
            .arg(mdir.join("data"))
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args(["--listen-peer-urls", &format!("http://{}", loopback(peer_port(m)))])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{}", advertised[m - 1]),
            ])
            .args(["--initial-cluster", &initial_cluster, "--initial-cluster-token", &token])
            .args([
                "--initial-cluster-state",
                "new",
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ]);
        process::drop_root(&mut command, dir, &[&mdir])?;
        pids.push(process::spawn(
            command,
            &dir.join(format!("etcd{m}.log")),
            &dir.join(format!("etcd{m}.pid")),
        )?);
    }
    let cluster = PeerCluster {
        system: System::Etcd,
        pids,
        client_addr,
        profile: None,
        bandwidth_mbit: None,
        measured_paths_ms: measured,
    };
    let members: Vec<SocketAddr> = (1..=n).map(|m| loopback(client_port(m))).collect();
    etcd_lead_from_member_1(&members)
        .await
        .inspect_err(|_| cluster.stop(dir))?;
    Ok(cluster)
}

/// Waits for a leader, then moves leadership to member 1 (the leader's place in the profile).
async fn etcd_lead_from_member_1(members: &[SocketAddr]) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let mut statuses = Vec::new();
        for addr in members {
            statuses.push(etcd_target::member_status(*addr).await.ok());
        }
        if let Some(first) = statuses[0] {
            if first.leader_id != 0 && statuses.iter().all(Option::is_some) {
                if first.leader_id == first.member_id {
                    return Ok(());
                }
                let leader_addr = statuses
                    .iter()
                    .zip(members)
                    .find(|(s, _)| s.is_some_and(|s| s.member_id == first.leader_id))
                    .map(|(_, addr)| *addr);
                if let Some(addr) = leader_addr {
                    let _ = etcd_target::move_leader(addr, first.member_id).await;
                }
            }
        }
        if Instant::now() > deadline {
            bail!("etcd did not elect member 1 as leader within {READY_TIMEOUT:?}; see etcdN.log");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_send_delays_reproduce_the_wan3_triangle() {
        let profile = Profile::load("wan3", None).unwrap();
        let d = etcd_send_delays(&profile).unwrap();
        assert_eq!(d, vec![91, 11, 133]);
        assert_eq!(d[0] + d[1], 102);
        assert_eq!(d[0] + d[2], 224);
        assert_eq!(d[1] + d[2], 144);
        let geo3 = Profile::load("geo3", None).unwrap();
        assert_eq!(etcd_send_delays(&geo3).unwrap(), vec![50, 50, 50]);
    }

    #[tokio::test]
    async fn only_postgres_with_standbys_takes_another_member_count() {
        let dir = std::env::temp_dir().join(format!("chorus-peers-refused-{}", std::process::id()));
        for (system, members) in [
            (System::Etcd, 5),
            (System::Redis, 5),
            (System::PostgresAlone, 5),
            (System::Postgres, 1),
        ] {
            let refused = PeerCluster::start_members(system, &dir, None, members)
                .await
                .err()
                .unwrap_or_else(|| panic!("{system:?} with {members} members started"));
            assert!(
                refused.to_string().contains("only PostgreSQL with standbys"),
                "{refused}"
            );
        }
        assert!(!dir.exists(), "nothing was started");
    }
}
