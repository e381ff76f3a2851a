//! `chorus sql`: a SQL node — the raft log, the SQL middleware over an embedded SQLite (or the
//! node's own PostgreSQL server), the PostgreSQL front end and metrics.

use std::os::unix::process::CommandExt;
use std::time::Duration;

use anyhow::{bail, Context};
use chorus_log::IdentityCodec;
use chorus_sql::postgres::PgServer;
use chorus_sql::{Database, ReplicationMode, SqlOptions};
use tokio::net::TcpListener;

use crate::admin_gate::AdminGate;
use crate::config::{parse_peers, ServerConfig};
use crate::server::{node_config, serve_metrics};

pub async fn run(config: ServerConfig) -> anyhow::Result<()> {
    let peers = parse_peers(&config.peers)?;
    if !peers.iter().any(|(id, _)| *id == config.id) {
        bail!("node id {} is not in peers '{}'", config.id, config.peers);
    }
    let listener = TcpListener::bind(config.pg_addr)
        .await
        .with_context(|| format!("cannot listen for PostgreSQL clients on {}", config.pg_addr))?;
    let metrics_listener = TcpListener::bind(config.metrics_addr)
        .await
        .with_context(|| format!("cannot serve metrics on {}", config.metrics_addr))?;
    let mode: ReplicationMode = config
        .sql_mode
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--sql-mode: {e}"))?;
    let users = std::sync::Arc::new(crate::server::users(&config)?);
    let options = SqlOptions {
        mode,
        read_consistency: config.read_consistency()?,
        conflict_classes: config
            .sql_conflict_classes
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--sql-conflict-classes: {e} (give table.column,table.column,…)"))?,
        commit_timeout: Duration::from_millis(config.request_timeout_ms),
        lock_wait: Duration::from_millis(config.request_timeout_ms),
        forward: config.sql_forward,
        on_diverged: Box::new(restart_in_place),
        users: users.clone(),
        tls: crate::server::client_tls(&config)?,
    };
    let sql_dir = config.data_dir.join("sql");
    let database = match config.sql_engine.as_str() {
        "sqlite" => Database::Sqlite { dir: sql_dir.clone() },
        "postgres" => {
            if config.sql_postgres.is_empty() {
                bail!(
                    "--sql-engine postgres needs --sql-postgres 'host=… port=… user=… dbname=…' naming \
                     this node's own PostgreSQL server (`chorus cluster start --sql -- --sql-engine postgres` \
                     starts one per node)"
                );
            }
            let bin = if config.sql_postgres_bin.is_empty() {
                chorus_cluster::postgres::program("pg_dump")
                    .and_then(|program| program.parent().map(std::path::Path::to_path_buf))
                    .context(
                        "no PostgreSQL client programs under /usr/lib/postgresql; install PostgreSQL \
                         or give --sql-postgres-bin DIR (where pg_dump and pg_restore are)",
                    )?
            } else {
                config.sql_postgres_bin.clone().into()
            };
            Database::Postgres(PgServer::new(&config.sql_postgres, bin).map_err(|e| anyhow::anyhow!("{e}"))?)
        }
        other => bail!("--sql-engine: unknown engine '{other}'; use sqlite or postgres"),
    };
    let node = chorus_sql::start(
        node_config(&config, peers)?,
        database,
        &sql_dir,
        listener,
        Box::new(IdentityCodec),
        options,
    )
    .await
    .context("cannot start the SQL node")?;
    tokio::spawn(serve_metrics(
        metrics_listener,
        node.node.clone(),
        AdminGate::new(users),
    ));
    tracing::info!(
        id = config.id, pg = %config.pg_addr, metrics = %config.metrics_addr,
        data_dir = %config.data_dir.display(), "chorus SQL node serving"
    );
    // PostgreSQL's clients have no command that stops the server.
    let drain_ms = config.shutdown_drain_ms;
    let node = &node;
    crate::server::until_shut_down(std::future::pending(), move || async move {
        match node.drain(Duration::from_millis(drain_ms)).await {
            Ok(()) => tracing::info!("every client's transaction ended"),
            Err(open) => tracing::warn!(
                connections = open.connections,
                forwarded = open.forwarded,
                "transactions still open when the drain's time ran out; their clients lose the connection"
            ),
        }
        crate::server::step_down(&node.node).await;
    })
    .await?;
    // Every acknowledged COMMIT is in the fsynced raft log; the database follows from it. The
    // node's thread runs nothing after this, so no write follows the database's close.
    if let Err(e) = node.close_database() {
        tracing::warn!(error = %e, "the database was not closed; the next start rebuilds it from the last checkpoint and the log");
    }
    Ok(())
}

/// The database holds transactions the log will not have: the process replaces itself with a
/// fresh start of the same command (same pid, so supervisors and pid files still match), which
/// rebuilds the database from the log. Every descriptor is close-on-exec; the raft log is safe
/// to cut at any point, as after a crash.
fn restart_in_place() {
    let error = match std::env::current_exe() {
        Ok(exe) => std::process::Command::new(exe).args(std::env::args_os().skip(1)).exec(),
        Err(e) => e,
    };
    tracing::error!(error = %error, "cannot restart in place; exiting so a supervisor restarts the node");
    std::process::exit(75);
}
