//! The `chorus` command: run a node, manage a local cluster, or watch the demo.

mod admin_gate;
mod backup;
mod config;
mod demo;
mod members_admin;
mod server;
mod sql_server;
mod status_page;

use std::path::PathBuf;

use anyhow::Context;
use chorus_cluster as cluster;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "chorus",
    version,
    about = "A replicated data store speaking the Redis protocol"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run one node. Settings come from --config FILE (TOML) and flags; flags win.
    Server {
        /// TOML file with any of the settings below.
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        options: Box<config::ServerOptions>,
    },
    /// Run one SQL node: PostgreSQL clients, an embedded SQLite replicated over the log. Takes
    /// the settings of `chorus server` (its own port is --pg-addr; the key-value ones are unused).
    Sql {
        /// TOML file with any of the settings of `chorus server`.
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        options: Box<config::ServerOptions>,
    },
    /// Manage a local multi-process cluster on 127.0.0.1.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Back up a running cluster's state, at a linearizable point, into one checksummed file.
    Backup(backup::BackupArgs),
    /// Build a new local cluster from a backup.
    Restore(backup::RestoreArgs),
    /// Start a local 3-node cluster, drive a workload, crash and restart the leader, verify.
    Demo(demo::DemoArgs),
    /// Proof under faults: record a history under crashes, pauses and partitions, check it.
    Chaos {
        #[command(subcommand)]
        command: chorus_chaos::run::ChaosCommand,
    },
    /// Benchmarks: YCSB workloads against Chorus, Redis or etcd, and side-by-side comparisons.
    Bench {
        #[command(subcommand)]
        command: Box<chorus_bench::cli::BenchCommand>,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Create (or restart the stopped nodes of) a cluster in DIR and wait for a leader.
    Start {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        net: chorus_bench::cli::NetArgs,
        /// Nodes run `chorus sql`: PostgreSQL clients (psql -h 127.0.0.1 -p PORT) on each node's
        /// client port, an embedded SQLite replicated over the log. Taken when the cluster is
        /// created; a restart keeps what it was created with.
        #[arg(long)]
        sql: bool,
        /// The client ports speak TLS only, with a certificate from a throwaway CA made in
        /// DIR/tls (clients verify with DIR/tls/ca.pem). Taken when the cluster is created; a
        /// restart keeps what it was created with.
        #[arg(long)]
        tls: bool,
        /// Peers prove they hold a cluster secret, made at random in DIR/secret (readable by
        /// its owner only). Taken when the cluster is created, as --tls.
        #[arg(long)]
        secret: bool,
        /// Extra `chorus server` flags for every node, after `--`.
        #[arg(last = true)]
        server_args: Vec<String>,
    },
    /// Restart every node of the cluster in DIR.
    Restart {
        #[arg(long)]
        dir: PathBuf,
        /// One node at a time, the cluster serving throughout: the leader hands leadership
        /// away before it stops, and each node catches up with the log before the next stops.
        #[arg(long)]
        rolling: bool,
    },
    /// Add nodes to the running cluster in DIR: each joins as a learner, catches up, and then
    /// all become voters together (through a joint configuration when more than one).
    AddNode {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        count: usize,
    },
    /// Remove node NODE from the running cluster in DIR and stop it (a leader hands its
    /// leadership over first).
    RemoveNode {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        node: u64,
    },
    /// One line per node: id, role, pid, RESP address.
    Status {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Stop every node of the cluster in DIR (data is kept).
    Stop {
        #[arg(long)]
        dir: PathBuf,
    },
    /// SIGKILL one node, as a crash would.
    Kill {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        node: u64,
    },
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// A node's settings: flags over the file over defaults; starts logging at the level they say.
fn load_config(file: Option<PathBuf>, flags: config::ServerOptions) -> anyhow::Result<config::ServerConfig> {
    let from_file = match file {
        Some(path) => config::ServerOptions::from_file(&path)?,
        None => config::ServerOptions::default(),
    };
    let config = flags.over(from_file).resolve();
    init_logging(&config.log);
    Ok(config)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if matches!(cli.command, Commands::Server { .. } | Commands::Sql { .. }) {
        // A node that panics anywhere (in a task too, which the runtime would otherwise outlive)
        // stops: serving on past a broken invariant or a poisoned lock helps no one, while a
        // restart recovers from what is durable.
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            std::process::abort();
        }));
    }
    // Process-wide, before any thread touches SQLite (SQLite takes a page cache only then).
    chorus_sql::page_cache::install();
    // A node runs on one thread (see `chorus_log::node`), and so does `chorus bench`: on two
    // shared cores a second worker only adds cross-CPU wake-ups, which the systems under test
    // pay for (client CPU per op on 100% writes at 50 clients: Chorus 9.7 -> 8.1-8.5 µs, etcd
    // over gRPC 22 -> 15-17 µs). The other tools use every core.
    let runtime = match cli.command {
        Commands::Server { .. } | Commands::Sql { .. } | Commands::Bench { .. } => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build()
    .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        match cli.command {
            Commands::Server { config, options } => server::run(load_config(config, *options)?).await,
            Commands::Sql { config, options } => sql_server::run(load_config(config, *options)?).await,
            Commands::Cluster { command } => match command {
                ClusterCommand::Start {
                    nodes,
                    dir,
                    net,
                    sql,
                    tls,
                    secret,
                    mut server_args,
                } => {
                    if secret && !dir.join("cluster.toml").exists() {
                        let path = chorus_tls::write_secret(&dir.join("secret")).map_err(anyhow::Error::msg)?;
                        server_args.extend(["--cluster-secret-file".to_string(), path.display().to_string()]);
                    }
                    if tls && !dir.join("cluster.toml").exists() {
                        let ca = chorus_tls::write_local_ca(&dir.join("tls")).map_err(anyhow::Error::msg)?;
                        server_args.extend([
                            "--tls-cert-file".to_string(),
                            ca.node_cert.display().to_string(),
                            "--tls-key-file".to_string(),
                            ca.node_key.display().to_string(),
                            "--peer-tls-cert-file".to_string(),
                            ca.peer_cert.display().to_string(),
                            "--peer-tls-key-file".to_string(),
                            ca.peer_key.display().to_string(),
                            "--peer-tls-ca-file".to_string(),
                            ca.ca_cert.display().to_string(),
                        ]);
                        println!(
                            "TLS: clients verify the nodes with {} (redis-cli --tls --cacert FILE; psql \"sslmode=verify-full sslrootcert=FILE\"); \
                             peer links are mutual TLS with {}",
                            ca.ca_cert.display(),
                            ca.peer_cert.display()
                        );
                    }
                    let net = cluster::NetOptions {
                        profile: net.net,
                        bandwidth_mbit: net.net_bandwidth_mbit,
                    };
                    let file = if sql {
                        cluster::start_sql(&dir, nodes, server_args, &net).await?
                    } else {
                        cluster::start(&dir, nodes, server_args, &net).await?
                    };
                    cluster::print_status(&file, &cluster::status(&dir, &file).await);
                    Ok(())
                }
                ClusterCommand::Restart { dir, rolling } => {
                    if rolling {
                        cluster::restart_rolling(&dir, std::time::Duration::from_secs(60)).await?;
                    } else {
                        cluster::stop(&dir)?;
                        let file = cluster::load(&dir)?;
                        let net = cluster::NetOptions::default();
                        if file.sql {
                            cluster::start_sql(&dir, file.nodes.len(), Vec::new(), &net).await?;
                        } else {
                            cluster::start(&dir, file.nodes.len(), Vec::new(), &net).await?;
                        }
                    }
                    let file = cluster::load(&dir)?;
                    cluster::print_status(&file, &cluster::status(&dir, &file).await);
                    Ok(())
                }
                ClusterCommand::Status { dir } => {
                    let file = cluster::load(&dir)?;
                    cluster::print_status(&file, &cluster::status(&dir, &file).await);
                    Ok(())
                }
                ClusterCommand::Stop { dir } => cluster::stop(&dir),
                ClusterCommand::Kill { dir, node } => cluster::kill_node(&dir, node),
                ClusterCommand::AddNode { dir, count } => {
                    cluster::members::add_nodes(&dir, count, std::time::Duration::from_secs(60)).await?;
                    let file = cluster::load(&dir)?;
                    cluster::print_status(&file, &cluster::status(&dir, &file).await);
                    Ok(())
                }
                ClusterCommand::RemoveNode { dir, node } => {
                    cluster::members::remove_node(&dir, node, std::time::Duration::from_secs(60)).await?;
                    let file = cluster::load(&dir)?;
                    cluster::print_status(&file, &cluster::status(&dir, &file).await);
                    Ok(())
                }
            },
            Commands::Demo(args) => demo::run(args).await,
            Commands::Backup(args) => backup::backup(args).await,
            Commands::Restore(args) => backup::restore(args).await,
            Commands::Bench { command } => chorus_bench::cli::run(*command).await,
            Commands::Chaos { command } => chorus_chaos::run::main(command).await,
        }
    })
}
