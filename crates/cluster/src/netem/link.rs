//! Emulated links and the check that the emulation is really in effect.
//!
//! A link is one toxiproxy proxy: connections to `listen` are forwarded to `upstream`, with data
//! toward the upstream (the dialer's direction) delayed by `upstream_delay_ms` and data back
//! delayed by `downstream_delay_ms`. How a system's traffic maps onto links differs (Chorus dials
//! one connection per direction, Redis replicas dial the primary, etcd members stream from the
//! sender), so each layout also states which links make up each round trip of the profile; the
//! check measures every link by echoing through it and adds the measurements up along each path.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Link {
    pub name: String,
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    pub upstream_delay_ms: u64,
    pub downstream_delay_ms: u64,
    pub bandwidth_kbytes_per_sec: Option<u64>,
}

/// A round trip the profile promises, and the links whose echo times add up to it.
#[derive(Debug, Clone)]
pub struct PathCheck {
    pub label: String,
    pub expected_rtt_ms: u64,
    pub links: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct PathMeasurement {
    pub label: String,
    pub expected_rtt_ms: u64,
    pub measured_rtt_ms: f64,
}

impl PathMeasurement {
    /// Within 10% of the profile, with 5 ms of slack for loopback and scheduling noise on a busy
    /// machine.
    pub fn within_tolerance(&self) -> bool {
        let tolerance = (self.expected_rtt_ms as f64 * 0.10).max(5.0);
        (self.measured_rtt_ms - self.expected_rtt_ms as f64).abs() <= tolerance
    }
}

#[derive(Debug, Clone)]
pub struct Verification {
    pub paths: Vec<PathMeasurement>,
    /// Measured throughput of one capped link, with the cap, in Mbit/s.
    pub bandwidth_mbit: Option<(f64, f64)>,
}

impl Verification {
    pub fn print(&self) {
        for p in &self.paths {
            println!(
                "  {:<28} rtt {:>4} ms  measured {:>7.1} ms  {}",
                p.label,
                p.expected_rtt_ms,
                p.measured_rtt_ms,
                if p.within_tolerance() { "ok" } else { "OFF" }
            );
        }
        if let Some((measured, cap)) = self.bandwidth_mbit {
            println!("  bandwidth cap {cap} Mbit/s, measured {measured:.1} Mbit/s on one link");
        }
    }
}

const PINGS: usize = 5;
/// Measurements of the paths before `verify` calls the emulation off.
const VERIFY_ATTEMPTS: usize = 3;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Echoes every byte of the first connection accepted, closing the listener right after the
/// accept so the address is free again for the process the link is meant for.
fn spawn_echo_once(listener: TcpListener) {
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        drop(listener);
        let mut buf = [0u8; 64 * 1024];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 || stream.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    });
}

/// Median time for one byte to go through `link` and echo back, in ms. Needs the link's upstream
/// address to be free (the check runs before the processes behind the links start).
fn measure_echo_ms(link: &Link) -> anyhow::Result<f64> {
    let listener = TcpListener::bind(link.upstream)
        .with_context(|| format!("cannot check link {}: {} is in use", link.name, link.upstream))?;
    spawn_echo_once(listener);
    let mut stream = TcpStream::connect_timeout(&link.listen, IO_TIMEOUT)
        .with_context(|| format!("cannot connect through link {}", link.name))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    let mut samples = Vec::with_capacity(PINGS);
    let mut byte = [0u8; 1];
    for _ in 0..=PINGS {
        let started = Instant::now();
        stream.write_all(b"p")?;
        stream
            .read_exact(&mut byte)
            .with_context(|| format!("no echo through link {}", link.name))?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    // The first round trip includes toxiproxy dialing the upstream.
    samples.remove(0);
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Throughput through `link` with a cap, in Mbit/s: ~0.5 s worth of bytes echoed back.
fn measure_bandwidth_mbit(link: &Link, rate_kbytes_per_sec: u64, echo_ms: f64) -> anyhow::Result<f64> {
    let total = (rate_kbytes_per_sec * 1000 / 2).max(1) as usize;
    let listener = TcpListener::bind(link.upstream)?;
    spawn_echo_once(listener);
    let stream = TcpStream::connect_timeout(&link.listen, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT * 3))?;
    let mut writer = stream.try_clone()?;
    let started = Instant::now();
    let sender = std::thread::spawn(move || writer.write_all(&vec![7u8; total]));
    let mut reader = stream;
    let mut received = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while received < total {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            bail!("link {} closed during the bandwidth check", link.name);
        }
        received += n;
    }
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0 - echo_ms;
    sender.join().expect("sender thread")?;
    Ok(total as f64 * 8.0 / 1000.0 / elapsed_ms.max(1.0))
}

/// Every path's round trip, from each link's measured once; and each link's, by name.
fn measure_paths<'a>(
    links: &'a [Link],
    paths: &[PathCheck],
) -> anyhow::Result<(Vec<PathMeasurement>, HashMap<&'a str, f64>)> {
    // Links into the same upstream take turns (each check binds it); the others run in parallel.
    let mut by_upstream: BTreeMap<SocketAddr, Vec<&Link>> = BTreeMap::new();
    for link in links {
        by_upstream.entry(link.upstream).or_default().push(link);
    }
    let measured: Vec<anyhow::Result<Vec<(&str, f64)>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = by_upstream
            .values()
            .map(|group| {
                scope.spawn(|| {
                    group
                        .iter()
                        .map(|l| measure_echo_ms(l).map(|ms| (l.name.as_str(), ms)))
                        .collect::<anyhow::Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("measuring thread"))
            .collect()
    });
    let mut by_name = HashMap::new();
    for group in measured {
        by_name.extend(group?);
    }
    let mut measured_paths = Vec::new();
    for path in paths {
        let mut rtt = 0.0;
        for name in &path.links {
            rtt += by_name
                .get(name.as_str())
                .with_context(|| format!("path {} names unknown link {name}", path.label))?;
        }
        measured_paths.push(PathMeasurement {
            label: path.label.clone(),
            expected_rtt_ms: path.expected_rtt_ms,
            measured_rtt_ms: rtt,
        });
    }
    Ok((measured_paths, by_name))
}

/// Measures every link (in parallel) and every path; fails if any path is off by more than 10%
/// in each of `VERIFY_ATTEMPTS` measurements (a busy machine delays one now and then).
pub fn verify(links: &[Link], paths: &[PathCheck]) -> anyhow::Result<Verification> {
    let mut attempt = 1;
    let (measured_paths, by_name) = loop {
        let (measured_paths, by_name) = measure_paths(links, paths)?;
        let Some(off) = measured_paths.iter().find(|p| !p.within_tolerance()) else {
            break (measured_paths, by_name);
        };
        if attempt == VERIFY_ATTEMPTS {
            let reason = format!(
                "network emulation is not in effect: {} measured {:.1} ms, the profile says {} ms \
                 ({VERIFY_ATTEMPTS} measurements)",
                off.label, off.measured_rtt_ms, off.expected_rtt_ms
            );
            Verification {
                paths: measured_paths,
                bandwidth_mbit: None,
            }
            .print();
            bail!(reason);
        }
        println!(
            "  {} measured {:.1} ms, the profile says {} ms: measuring again",
            off.label, off.measured_rtt_ms, off.expected_rtt_ms
        );
        attempt += 1;
    };
    let bandwidth_mbit = match links.iter().find_map(|l| l.bandwidth_kbytes_per_sec.map(|r| (l, r))) {
        Some((link, rate)) => {
            let measured = measure_bandwidth_mbit(link, rate, by_name[link.name.as_str()])?;
            Some((measured, rate as f64 * 8.0 / 1000.0))
        }
        None => None,
    };
    let verification = Verification {
        paths: measured_paths,
        bandwidth_mbit,
    };
    if let Some((measured, cap)) = verification.bandwidth_mbit {
        if (measured - cap).abs() > cap * 0.25 {
            verification.print();
            bail!("bandwidth cap is not in effect: measured {measured:.1} Mbit/s for a cap of {cap} Mbit/s");
        }
    }
    Ok(verification)
}
