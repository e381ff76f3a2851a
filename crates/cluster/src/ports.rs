//! Free loopback ports for local clusters, proxies and peers.

use std::net::TcpListener;

use anyhow::bail;

/// How long a picked port stays reserved for its owner against other processes picking ports;
/// a cluster that restarts a node renews its ports' reservations (`renew`), since a stopped
/// node's port is free to bind for anyone picking.
const RESERVATION_SECS: u64 = 600;

fn reservations_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("chorus-port-reservations")
}

/// Renews the reservations of ports an existing cluster owns, before it starts nodes on them
/// again.
pub fn renew(ports: &[u16]) {
    let dir = reservations_dir();
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    for port in ports {
        let _ = std::fs::write(dir.join(port.to_string()), b"");
    }
}

/// Reserves `port` for this pick across processes: a port is free to bind between our pick and
/// its owner's bind (a node or proxy starting up), and clusters started at the same moment (tests
/// run in parallel) would otherwise be handed the same one. Reservations are files named after
/// the port; one older than RESERVATION_SECS is stale and taken over.
fn reserve(port: u16) -> bool {
    let dir = reservations_dir();
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let path = dir.join(port.to_string());
    let stale = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .is_ok_and(|at| at.elapsed().is_ok_and(|age| age.as_secs() >= RESERVATION_SECS));
    if stale {
        let _ = std::fs::remove_file(&path);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .is_ok()
}

/// Picks `count` distinct free loopback ports below the kernel's ephemeral range (which starts at
/// 32768 by default), so outgoing connections cannot take a port between our pick and the
/// owner's bind. Candidates are probed in a pseudo-random order and reserved (see `reserve`) so
/// concurrent clusters do not meet.
pub fn free_loopback_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    const LOW: u32 = 10_000;
    const HIGH: u32 = 32_000;
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ (u64::from(std::process::id()) << 32);
    let mut held = Vec::with_capacity(count);
    for _ in 0..20_000 {
        if held.len() == count {
            break;
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let port = (LOW + (state % u64::from(HIGH - LOW)) as u32) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            if reserve(port) {
                held.push(listener);
            }
        }
    }
    if held.len() < count {
        bail!("cannot find {count} free loopback ports between {LOW} and {HIGH}");
    }
    Ok(held.iter().map(|l| l.local_addr().expect("bound").port()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_ports_are_distinct_and_not_handed_out_again_while_reserved() {
        let picked = free_loopback_ports(50).unwrap();
        let mut unique = picked.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 50);
        for port in picked {
            assert!(!reserve(port), "port {port} could be picked again at once");
        }
    }
}
