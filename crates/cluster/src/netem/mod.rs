//! Network emulation for local clusters: named profiles (latency between nodes and to the client,
//! optional bandwidth cap), applied by a toxiproxy server on every link, and verified by
//! measurement before anything runs over them. `tc netem` is not available on our machines, so
//! latency is added in user space.

pub mod link;
pub mod profile;
pub mod toxiproxy;

pub use link::{verify, Link, PathCheck, PathMeasurement, Verification};
pub use profile::Profile;
pub use toxiproxy::Toxiproxy;

/// Splits a round trip over the two directions of a pair; the halves add up to `rtt_ms` exactly.
pub fn split_rtt(rtt_ms: u64, first_half: bool) -> u64 {
    if first_half {
        rtt_ms.div_ceil(2)
    } else {
        rtt_ms / 2
    }
}
