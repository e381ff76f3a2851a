//! `chorus backup` and `chorus restore`: a running cluster's state at a linearizable point, as
//! one checksummed file (GET /backup on a node's metrics port; the format is
//! `chorus_log::backup`), and a new local cluster built from one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use chorus_cluster as cluster;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[derive(clap::Args)]
pub struct BackupArgs {
    /// A local cluster (`chorus cluster start --dir`): its leader is asked, or --node.
    #[arg(long, conflicts_with = "metrics_addr")]
    cluster: Option<PathBuf>,
    /// With --cluster: the node to ask (any node gives a linearizable backup).
    #[arg(long, requires = "cluster")]
    node: Option<u64>,
    /// Or the metrics address (host:port) of any node of a cluster.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Where the backup goes (written aside, checked, then renamed into place).
    #[arg(long)]
    to: PathBuf,
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// A backup `chorus backup` wrote.
    #[arg(long)]
    from: PathBuf,
    /// A new directory for the restored local cluster.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
}

pub async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let addr = match (&args.cluster, args.metrics_addr) {
        (Some(dir), _) => {
            let file = cluster::load(dir)?;
            let states = cluster::status(dir, &file).await;
            let chosen = match args.node {
                Some(id) => states.iter().find(|s| s.entry.id == id),
                None => states.iter().find(|s| s.is_leader()),
            };
            chosen.map(|s| s.entry.metrics_addr).with_context(|| {
                format!(
                    "no such node answering in {}; see `chorus cluster status --dir {}`",
                    dir.display(),
                    dir.display()
                )
            })?
        }
        (None, Some(addr)) => addr,
        (None, None) => bail!("say where to take the backup from: --cluster DIR or --metrics-addr HOST:PORT"),
    };
    let started = Instant::now();
    let partial = args.to.with_extension("partial");
    let (index, bytes) = download(addr, &partial).await?;
    let checked = partial.clone();
    let header = tokio::task::spawn_blocking(move || chorus_log::backup::verify(&checked)).await??;
    assert_eq!(header.index, index, "the backup is of the index its node announced");
    std::fs::rename(&partial, &args.to).with_context(|| format!("cannot move the backup to {}", args.to.display()))?;
    sync_parent(&args.to)?;
    println!(
        "backup of index {index} (term {}, {} files, {bytes} bytes) written to {} in {:.1} s; its SHA-256 checked",
        header.term,
        header.files.len(),
        args.to.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// GET /backup from `addr` into `to`, fsynced; the index the node announced and the bytes.
async fn download(addr: std::net::SocketAddr, to: &Path) -> anyhow::Result<(u64, u64)> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot reach the node's metrics port {addr}"))?;
    stream
        .write_all(chorus_cluster::metrics_port_request("GET", "/backup").as_bytes())
        .await?;
    let mut reader = BufReader::with_capacity(1 << 20, stream);
    let mut status = String::new();
    reader.read_line(&mut status).await?;
    let (mut length, mut index) = (None, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((&line, ""));
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse::<u64>().ok(),
            "x-chorus-backup-index" => index = value.trim().parse::<u64>().ok(),
            _ => {}
        }
    }
    if !status.contains(" 200 ") {
        let mut body = String::new();
        let _ = reader.read_to_string(&mut body).await;
        bail!("{addr} took no backup: {} {}", status.trim(), body.trim());
    }
    let (Some(length), Some(index)) = (length, index) else {
        bail!("{addr} answered GET /backup without its length or index");
    };
    // The command does nothing else meanwhile: blocking writes to the file are fine here.
    let mut file =
        std::io::BufWriter::new(std::fs::File::create(to).with_context(|| format!("cannot create {}", to.display()))?);
    let mut body = reader.take(length);
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = body.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(&mut file, &buf[..n])?;
        copied += n as u64;
    }
    if copied != length {
        bail!("the backup from {addr} broke off after {copied} of {length} bytes");
    }
    file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok((index, length))
}

fn sync_parent(path: &Path) -> anyhow::Result<()> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(parent).and_then(|d| d.sync_all())?;
    Ok(())
}

pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    if args.dir.join("cluster.toml").exists() {
        bail!(
            "{} already holds a cluster; restore into a new directory",
            args.dir.display()
        );
    }
    let from = args.from.clone();
    let header = tokio::task::spawn_blocking(move || chorus_log::backup::verify(&from)).await??;
    let net = cluster::NetOptions::default();
    let file = cluster::create_stopped(&args.dir, args.nodes, Vec::new(), &net)?;
    for node in &file.nodes {
        let into = cluster::node_dir(&args.dir, node.id)
            .join("data")
            .join(chorus_log::backup::RESTORE_DIR);
        let from = args.from.clone();
        tokio::task::spawn_blocking(move || chorus_log::backup::unpack(&from, &into)).await??;
    }
    cluster::start(&args.dir, args.nodes, Vec::new(), &net).await?;
    println!(
        "restored index {} of {} into a new {}-node cluster in {}",
        header.index,
        args.from.display(),
        args.nodes,
        args.dir.display()
    );
    cluster::print_status(&file, &cluster::status(&args.dir, &file).await);
    Ok(())
}
