//! Free loopback ports for local clusters, proxies and peers.

use std::net::TcpListener;

use anyhow::bail;

/// Picks `count` distinct free loopback ports below the kernel's ephemeral range (which starts at
/// 32768 by default), so outgoing connections cannot take a port between our pick and the
/// owner's bind. Candidates are probed in a pseudo-random order so concurrent clusters rarely meet.
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
            held.push(listener);
        }
    }
    if held.len() < count {
        bail!("cannot find {count} free loopback ports between {LOW} and {HIGH}");
    }
    Ok(held.iter().map(|l| l.local_addr().expect("bound").port()).collect())
}
