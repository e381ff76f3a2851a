//! CPU time spent by the processes under test during a run, read from `/proc/<pid>/stat`. On a
//! small machine that the servers and the benchmark client share, CPU per operation is what
//! throughput is made of, so every result carries it beside ops/s.

use anyhow::{bail, Context};
use serde::Serialize;

/// User and system CPU of one process (its threads, and children it has reaped), in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuTimes {
    pub user_secs: f64,
    pub system_secs: f64,
}

impl CpuTimes {
    pub fn total_secs(&self) -> f64 {
        self.user_secs + self.system_secs
    }

    fn minus(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            user_secs: self.user_secs - earlier.user_secs,
            system_secs: self.system_secs - earlier.system_secs,
        }
    }
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// Parses the text of `/proc/<pid>/stat`: utime, stime, cutime and cstime are fields 14–17,
/// counted after the command name, which sits in parentheses and may itself hold spaces.
pub fn parse_stat(text: &str) -> anyhow::Result<CpuTimes> {
    let fields = chorus_cluster::process::stat_fields(text).context("no command name in the stat line")?;
    if fields.len() < 15 {
        bail!("the stat line has {} fields after the name", fields.len());
    }
    // fields[0] is field 3 (the state).
    let tick = |n: usize| -> anyhow::Result<f64> {
        let value: u64 = fields[n - 3]
            .parse()
            .with_context(|| format!("field {n} is not a number"))?;
        Ok(value as f64)
    };
    let hz = clock_ticks_per_sec();
    Ok(CpuTimes {
        user_secs: (tick(14)? + tick(16)?) / hz,
        system_secs: (tick(15)? + tick(17)?) / hz,
    })
}

pub fn process_times(pid: u32) -> anyhow::Result<CpuTimes> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_stat(&text).with_context(|| format!("unreadable {path}"))
}

/// A process's CPU with that of its live descendants (reaped ones are in its own counters):
/// a server that forks a process per connection (PostgreSQL) is measured whole.
pub fn tree_times(pid: u32) -> anyhow::Result<CpuTimes> {
    let mut total = process_times(pid)?;
    let parents = chorus_cluster::process::parents();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(child, _) in parents.iter().filter(|(_, p)| *p == parent) {
            if let Ok(times) = process_times(child) {
                total.user_secs += times.user_secs;
                total.system_secs += times.system_secs;
                frontier.push(child);
            }
        }
    }
    Ok(total)
}

/// The CPU of one server process over a run.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessCpu {
    pub pid: u32,
    #[serde(flatten)]
    pub times: CpuTimes,
}

/// What the servers (every process of the system under test, with its children) spent over a
/// run.
#[derive(Debug, Clone, Serialize)]
pub struct ServerCpu {
    #[serde(flatten)]
    pub times: CpuTimes,
    /// User + system CPU per completed operation, all processes together, in µs.
    pub us_per_op: f64,
    /// Cores kept busy on average: CPU seconds per second of the run.
    pub cores_busy: f64,
    pub processes: Vec<ProcessCpu>,
}

/// CPU counters of the servers and of this process, taken at the start of a run.
pub struct CpuMeter {
    servers: Vec<(u32, CpuTimes)>,
    client: CpuTimes,
}

impl CpuMeter {
    /// Starts measuring `server_pids`; a process that cannot be read is left out, with a warning.
    pub fn start(server_pids: &[u32]) -> CpuMeter {
        let servers = server_pids
            .iter()
            .filter_map(|&pid| match tree_times(pid) {
                Ok(times) => Some((pid, times)),
                Err(e) => {
                    eprintln!("warning: the CPU of process {pid} is not counted: {e:#}");
                    None
                }
            })
            .collect();
        CpuMeter {
            servers,
            client: process_times(std::process::id()).unwrap_or_default(),
        }
    }

    /// The servers' CPU since `start` (`None` without servers to measure, or if one has exited:
    /// its CPU is lost with it), and this process's CPU per operation in µs.
    pub fn finish(&self, operations: u64, elapsed_secs: f64) -> (Option<ServerCpu>, f64) {
        let per_op_us = |secs: f64| secs * 1e6 / operations.max(1) as f64;
        let client = process_times(std::process::id()).unwrap_or_default().minus(self.client);
        let processes: Option<Vec<ProcessCpu>> = self
            .servers
            .iter()
            .map(|(pid, start)| {
                tree_times(*pid).ok().map(|end| ProcessCpu {
                    pid: *pid,
                    times: end.minus(*start),
                })
            })
            .collect();
        let server = processes.filter(|p| !p.is_empty()).map(|processes| {
            let times = CpuTimes {
                user_secs: processes.iter().map(|p| p.times.user_secs).sum(),
                system_secs: processes.iter().map(|p| p.times.system_secs).sum(),
            };
            ServerCpu {
                times,
                us_per_op: per_op_us(times.total_secs()),
                cores_busy: times.total_secs() / elapsed_secs.max(1e-9),
                processes,
            }
        });
        (server, per_op_us(client.total_secs()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_user_and_system_time_including_reaped_children() {
        let hz = clock_ticks_per_sec();
        let line = "4242 (redis server) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 150 30 20 20 0 5 0 \
                    100 1000 200 18446744073709551615";
        let times = parse_stat(line).unwrap();
        assert_eq!(times.user_secs, 280.0 / hz);
        assert_eq!(times.system_secs, 170.0 / hz);
        assert!(parse_stat("4242 (x) S 1 2").is_err());
        assert!(parse_stat("4242 S 1").is_err());
    }

    #[test]
    fn this_process_burns_measurable_cpu() {
        let meter = CpuMeter::start(&[std::process::id()]);
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed().as_millis() < 200 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let (server, client_us) = meter.finish(1000, 0.2);
        let server = server.unwrap();
        assert!(server.times.total_secs() > 0.1, "{server:?}");
        assert!(server.us_per_op > 100.0, "{server:?}");
        assert!(client_us > 100.0);
        assert!(CpuMeter::start(&[u32::MAX]).finish(1, 1.0).0.is_none());
    }
}
