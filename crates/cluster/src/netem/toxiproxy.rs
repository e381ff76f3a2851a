//! A toxiproxy server owned by one local cluster: found (or installed with `go install`),
//! started on a free loopback port, configured over its HTTP API, stopped by pid.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::link::Link;
use crate::ports::free_loopback_ports;
use crate::process;

const MODULE: &str = "github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0";
const BINARY: &str = "toxiproxy-server";
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// Where we install tools: `$CHORUS_TOOLS_DIR`, else `tools/` beside the build directory of the
/// running executable (`target/tools` for `target/release/chorus`).
fn tools_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CHORUS_TOOLS_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("cannot locate the running executable")?;
    let build_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the executable has no parent directory")?;
    Ok(build_dir.join("tools"))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// Finds toxiproxy (`$CHORUS_TOXIPROXY`, PATH, the tools directory), installing it into the
/// tools directory with `go install` when it is missing and Go is available.
pub fn find_or_install() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("CHORUS_TOXIPROXY") {
        return Ok(PathBuf::from(path));
    }
    if let Some(path) = on_path(BINARY) {
        return Ok(path);
    }
    let dir = tools_dir()?;
    let installed = dir.join(BINARY);
    if installed.is_file() {
        return Ok(installed);
    }
    if on_path("go").is_none() {
        bail!(
            "network emulation needs toxiproxy and it is not installed. Install Go and rerun, or run \
             `go install {MODULE}` and put the binary on PATH as {BINARY}"
        );
    }
    eprintln!("installing toxiproxy into {} (go install {MODULE}) ...", dir.display());
    // A staging directory of our own, so concurrent first uses cannot trip over each other.
    let staging = dir.join(format!("go-install-{}", std::process::id()));
    std::fs::create_dir_all(&staging).with_context(|| format!("cannot create {}", staging.display()))?;
    let status = Command::new("go")
        .args(["install", MODULE])
        .env("GOBIN", &staging)
        .status()
        .context("cannot run go")?;
    if !status.success() {
        bail!("go install {MODULE} failed ({status}); see its output above");
    }
    std::fs::rename(staging.join("server"), &installed)
        .with_context(|| format!("cannot move toxiproxy into {}", installed.display()))?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(installed)
}

/// A running toxiproxy server.
#[derive(Debug, Clone)]
pub struct Toxiproxy {
    pub api: SocketAddr,
    pub pid: u32,
}

impl Toxiproxy {
    /// Starts a server whose pid file and log live in `dir`.
    pub fn start(dir: &Path) -> anyhow::Result<Toxiproxy> {
        let binary = find_or_install()?;
        let port = free_loopback_ports(1)?[0];
        let api = SocketAddr::from(([127, 0, 0, 1], port));
        let log_path = dir.join("toxiproxy.log");
        let mut command = Command::new(&binary);
        command.args(["-host", "127.0.0.1", "-port", &port.to_string()]);
        let pid = process::spawn(command, &log_path, &dir.join("toxiproxy.pid"))?;
        std::fs::write(dir.join("toxiproxy.api"), api.to_string())?;
        let server = Toxiproxy { api, pid };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.request("GET", "/version", "").is_err() {
            if Instant::now() > deadline || !process::alive(server.pid) {
                bail!("toxiproxy did not start; see {}", log_path.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// The server started in `dir`, if it is running.
    pub fn attach(dir: &Path) -> Option<Toxiproxy> {
        let pid = process::read_pid(&dir.join("toxiproxy.pid"))?;
        let api = std::fs::read_to_string(dir.join("toxiproxy.api"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(Toxiproxy { api, pid })
    }

    /// Creates the proxy for `link` with its toxics.
    pub fn create(&self, link: &Link) -> anyhow::Result<()> {
        self.request(
            "POST",
            "/proxies",
            &format!(
                r#"{{"name":"{}","listen":"{}","upstream":"{}","enabled":true}}"#,
                link.name, link.listen, link.upstream
            ),
        )
        .with_context(|| format!("cannot create proxy {}", link.name))?;
        for (stream, delay_ms) in [
            ("upstream", link.upstream_delay_ms),
            ("downstream", link.downstream_delay_ms),
        ] {
            if delay_ms > 0 {
                self.add_toxic(
                    &link.name,
                    &format!(
                        r#"{{"name":"latency_{stream}","type":"latency","stream":"{stream}","toxicity":1.0,"attributes":{{"latency":{delay_ms},"jitter":0}}}}"#
                    ),
                )?;
            }
            if let Some(rate) = link.bandwidth_kbytes_per_sec {
                self.add_toxic(
                    &link.name,
                    &format!(
                        r#"{{"name":"bandwidth_{stream}","type":"bandwidth","stream":"{stream}","toxicity":1.0,"attributes":{{"rate":{rate}}}}}"#
                    ),
                )?;
            }
        }
        Ok(())
    }

    /// Cuts (`false`) or restores (`true`) a link: a disabled proxy closes its connections and
    /// refuses new ones.
    pub fn set_enabled(&self, proxy: &str, enabled: bool) -> anyhow::Result<()> {
        self.request(
            "POST",
            &format!("/proxies/{proxy}"),
            &format!(r#"{{"enabled":{enabled}}}"#),
        )
        .with_context(|| format!("cannot switch proxy {proxy}"))?;
        Ok(())
    }

    fn add_toxic(&self, proxy: &str, body: &str) -> anyhow::Result<()> {
        self.request("POST", &format!("/proxies/{proxy}/toxics"), body)
            .with_context(|| format!("cannot add a toxic to proxy {proxy}"))?;
        Ok(())
    }

    /// Stops the server (SIGTERM, then SIGKILL).
    pub fn stop(&self) {
        process::terminate(self.pid, Duration::from_secs(3));
    }

    /// One HTTP/1.1 request with `Connection: close`; returns the body of a 2xx answer.
    fn request(&self, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
        let mut stream = TcpStream::connect_timeout(&self.api, API_TIMEOUT)?;
        stream.set_read_timeout(Some(API_TIMEOUT))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.api,
            body.len()
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let status: u16 = response
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .context("toxiproxy sent no HTTP status line")?;
        let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
        if !(200..300).contains(&status) {
            bail!("toxiproxy answered {status} to {method} {path}: {}", body.trim());
        }
        Ok(body)
    }
}
