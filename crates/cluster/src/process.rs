//! Processes of a local cluster: spawned in their own process group, tracked by pid files,
//! stopped by pid.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The fields of a `/proc/<pid>/stat` line after the parenthesised command name, which may
/// itself hold spaces: `[0]` is field 3 (the state), `[n - 3]` is field n.
pub fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect())
}

/// `(pid, parent pid)` of every live process, from `/proc`.
pub fn parents() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let text = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let parent = stat_fields(&text)?.get(1)?.parse().ok()?;
            Some((pid, parent))
        })
        .collect()
}

/// The live children of `parent`.
pub fn children(parent: u32) -> Vec<u32> {
    parents()
        .into_iter()
        .filter(|&(_, p)| p == parent)
        .map(|(pid, _)| pid)
        .collect()
}

/// `pid`'s command line (what a server may rewrite to name its process), or empty.
pub fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .unwrap_or_default()
}

/// Whether `pid` is a live process: one of its threads is not a zombie. The main thread of a
/// killed process can be a zombie while another is still finishing a system call (a write to a
/// FUSE file system, say), and until that one exits the process keeps its files and the ports
/// it listens on.
pub fn alive(pid: u32) -> bool {
    let live = |stat_path: &Path| {
        std::fs::read_to_string(stat_path).is_ok_and(|stat| {
            stat_fields(&stat)
                .and_then(|fields| fields.first().copied())
                .is_some_and(|state| state != "Z" && state != "X")
        })
    };
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(threads) => threads.flatten().any(|thread| live(&thread.path().join("stat"))),
        Err(_) => false,
    }
}

/// Sends `sig` to `pid` and reaps it if it is our child, so it does not linger as a zombie.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
    reap(pid);
}

/// Collects `pid`'s exit status if it is our child and has exited.
fn reap(pid: u32) {
    // SAFETY: waitpid with WNOHANG on a pid that may not be our child only returns an error.
    unsafe {
        libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG);
    }
}

/// The pid recorded in `pid_file`, if that process is alive.
pub fn read_pid(pid_file: &Path) -> Option<u32> {
    std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|pid| alive(*pid))
}

/// SIGKILLs `pid` and waits (up to 5 s) until it is gone, as a crash would leave it.
pub fn kill(pid: u32) {
    signal(pid, libc::SIGKILL);
    wait_gone(pid, Duration::from_secs(5));
}

/// SIGTERM, then SIGKILL once `grace` has passed; returns when the process is gone.
pub fn terminate(pid: u32, grace: Duration) {
    signal(pid, libc::SIGTERM);
    wait_gone_or_kill(pid, grace);
}

/// Waits for a process already signalled to stop, SIGKILLing it once `grace` has passed. A
/// second SIGTERM instead would tell a node to skip letting its clients finish.
pub fn wait_gone_or_kill(pid: u32, grace: Duration) {
    if !wait_gone(pid, grace) {
        kill(pid);
    }
}

fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        reap(pid);
        if !alive(pid) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `command` in its own process group (a Ctrl-C aimed at the tool that started it must
/// not reach it), with stdout and stderr appended to `log`, and records its pid in `pid_file`.
pub fn spawn(mut command: Command, log: &Path, pid_file: &Path) -> anyhow::Result<u32> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let child = command
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {:?}", command.get_program()))?;
    let pid = child.id();
    std::fs::write(pid_file, pid.to_string()).with_context(|| format!("cannot write {}", pid_file.display()))?;
    Ok(pid)
}

const NOBODY: u32 = 65_534;

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// When we are root, lets the user `nobody` pass through `dir` (search only: it cannot list it),
/// so that services running as nobody reach directories inside it; says so if it changed the
/// mode. Every directory above `dir` must already let others pass: those are not ours to
/// change, so that fails at once, saying what to do.
pub fn let_nobody_pass(dir: &Path, program: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if !running_as_root() {
        return Ok(());
    }
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", dir.display()))?;
    let mode_of = |d: &Path| -> anyhow::Result<u32> {
        Ok(std::fs::metadata(d)
            .with_context(|| format!("cannot inspect {}", d.display()))?
            .permissions()
            .mode()
            & 0o7777)
    };
    for ancestor in dir.ancestors().skip(1) {
        let mode = mode_of(ancestor)?;
        if mode & 0o001 == 0 {
            bail!(
                "{program} runs as the user nobody (chorus runs as root), and nobody cannot pass \
                 through {} (mode {mode:o}); use a directory outside it (e.g. under /tmp), or \
                 allow it with `chmod o+x {}`",
                ancestor.display(),
                ancestor.display()
            );
        }
    }
    let mode = mode_of(&dir)?;
    if mode & 0o001 == 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o001))
            .with_context(|| format!("cannot let nobody pass through {}", dir.display()))?;
        eprintln!(
            "note: {} is now mode {:o}: {program} runs as nobody and must reach its directory inside",
            dir.display(),
            mode | 0o001
        );
    }
    Ok(())
}

/// Services we start for comparison run as the unprivileged user `nobody` when we are root.
/// `dirs` (created if missing, inside `base`, the directory the user gave) are handed over to
/// that user, and `base` is opened for it to pass through (see `let_nobody_pass`), so any
/// directory works, `mktemp -d` (0700) included.
pub fn drop_root(command: &mut Command, base: &Path, dirs: &[&Path]) -> anyhow::Result<()> {
    if !running_as_root() {
        return Ok(());
    }
    let_nobody_pass(base, &command.get_program().to_string_lossy())?;
    for dir in dirs {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY))
            .with_context(|| format!("cannot hand {} to nobody", dir.display()))?;
    }
    // std also drops root's supplementary groups when it switches the user of a root process.
    command.uid(NOBODY).gid(NOBODY);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_alive_until_killed_and_reaped() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(alive(pid));
        signal(pid, libc::SIGKILL);
        // `signal` may have reaped it already.
        let _ = child.wait();
        assert!(!alive(pid), "a killed child is gone once reaped");
        assert!(!alive(u32::MAX), "no such process");
    }
}
