//! Named network profiles, read from the checked-in `profiles.toml`.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use serde::Deserialize;

const PROFILES_TOML: &str = include_str!("../../net-profiles.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileSpec {
    description: String,
    #[serde(default)]
    node_rtt_ms: Vec<Vec<u64>>,
    #[serde(default)]
    client_rtt_ms: Vec<u64>,
    uniform_rtt_ms: Option<u64>,
    bandwidth_mbit: Option<f64>,
    #[serde(default)]
    proxied: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// Round-trip times between nodes (index 0 is node 1); empty when nothing is added.
    pub node_rtt_ms: Vec<Vec<u64>>,
    /// Round-trip time from the benchmark client to each node.
    pub client_rtt_ms: Vec<u64>,
    /// Without `node_rtt_ms`: the round-trip time between any two nodes, for any cluster size.
    pub uniform_rtt_ms: Option<u64>,
    /// Cap on every emulated link, each direction.
    pub bandwidth_mbit: Option<f64>,
    /// Proxies on every link even though nothing is added, so links can be cut.
    pub proxied: bool,
}

fn specs() -> BTreeMap<String, ProfileSpec> {
    toml::from_str(PROFILES_TOML).expect("the built-in profiles.toml is valid")
}

/// Names of the built-in profiles, for help texts and errors.
pub fn names() -> Vec<String> {
    specs().into_keys().collect()
}

impl Profile {
    /// Loads a built-in profile; `bandwidth_mbit` (from a flag) overrides the profile's cap.
    pub fn load(name: &str, bandwidth_mbit: Option<f64>) -> anyhow::Result<Profile> {
        let spec = specs()
            .remove(name)
            .with_context(|| format!("unknown network profile '{name}'; known: {}", names().join(", ")))?;
        let profile = Profile {
            name: name.to_string(),
            description: spec.description,
            node_rtt_ms: spec.node_rtt_ms,
            client_rtt_ms: spec.client_rtt_ms,
            uniform_rtt_ms: spec.uniform_rtt_ms,
            bandwidth_mbit: bandwidth_mbit.or(spec.bandwidth_mbit),
            proxied: spec.proxied,
        };
        profile.validate()?;
        Ok(profile)
    }

    fn validate(&self) -> anyhow::Result<()> {
        let n = self.node_rtt_ms.len();
        if self.client_rtt_ms.len() != n {
            bail!(
                "profile '{}': client_rtt_ms has {} entries for {n} nodes",
                self.name,
                self.client_rtt_ms.len()
            );
        }
        for (i, row) in self.node_rtt_ms.iter().enumerate() {
            if row.len() != n || row[i] != 0 {
                bail!(
                    "profile '{}': node_rtt_ms must be square with a zero diagonal",
                    self.name
                );
            }
            for (j, rtt) in row.iter().enumerate() {
                if *rtt != self.node_rtt_ms[j][i] {
                    bail!("profile '{}': node_rtt_ms is not symmetric at ({i}, {j})", self.name);
                }
            }
        }
        if self.uniform_rtt_ms.is_some() && n > 0 {
            bail!(
                "profile '{}': uniform_rtt_ms and node_rtt_ms exclude each other",
                self.name
            );
        }
        if self.bandwidth_mbit.is_some_and(|b| b.is_nan() || b <= 0.0) {
            bail!("bandwidth must be a positive number of Mbit/s");
        }
        Ok(())
    }

    /// True when the profile adds neither latency nor a bandwidth cap: no proxies are needed.
    pub fn is_passthrough(&self) -> bool {
        self.node_rtt_ms.is_empty() && self.uniform_rtt_ms.is_none() && self.bandwidth_mbit.is_none() && !self.proxied
    }

    /// Fails unless the profile fits a cluster of `nodes`.
    pub fn check_nodes(&self, nodes: usize) -> anyhow::Result<()> {
        if !self.node_rtt_ms.is_empty() && self.node_rtt_ms.len() != nodes {
            bail!(
                "network profile '{}' describes {} nodes, the cluster has {nodes}",
                self.name,
                self.node_rtt_ms.len()
            );
        }
        Ok(())
    }

    /// RTT between nodes `a` and `b` (1-based ids); 0 when the profile adds no latency.
    pub fn rtt_ms(&self, a: u64, b: u64) -> u64 {
        if let (Some(rtt), true) = (self.uniform_rtt_ms, a != b) {
            return rtt;
        }
        self.node_rtt_ms
            .get(a as usize - 1)
            .and_then(|row| row.get(b as usize - 1))
            .copied()
            .unwrap_or(0)
    }

    /// RTT between the benchmark client and node `id`.
    pub fn client_rtt(&self, id: u64) -> u64 {
        self.client_rtt_ms.get(id as usize - 1).copied().unwrap_or(0)
    }

    /// The bandwidth cap in toxiproxy's unit (1000 bytes per second).
    pub fn bandwidth_kbytes_per_sec(&self) -> Option<u64> {
        self.bandwidth_mbit
            .map(|mbit| ((mbit * 1000.0 / 8.0).round() as u64).max(1))
    }

    /// A one-line description with the cap, for progress output and reports.
    pub fn summary(&self) -> String {
        match self.bandwidth_mbit {
            Some(mbit) => format!("{} ({}; links capped at {mbit} Mbit/s)", self.name, self.description),
            None => format!("{} ({})", self.name, self.description),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_profiles_load_and_describe_the_papers_settings() {
        let wan3 = Profile::load("wan3", None).unwrap();
        assert_eq!(wan3.rtt_ms(1, 2), 102);
        assert_eq!(wan3.rtt_ms(3, 1), 224);
        assert_eq!(wan3.rtt_ms(2, 3), 144);
        assert_eq!(wan3.client_rtt(1), 0);
        assert!(!wan3.is_passthrough());
        assert!(wan3.check_nodes(5).is_err());
        let geo3 = Profile::load("geo3", Some(100.0)).unwrap();
        assert_eq!(geo3.rtt_ms(1, 3), 100);
        assert_eq!(geo3.client_rtt(2), 150);
        assert_eq!(geo3.bandwidth_kbytes_per_sec(), Some(12_500));
        let proxied = Profile::load("lan-proxied", None).unwrap();
        assert!(!proxied.is_passthrough());
        proxied.check_nodes(5).unwrap();
        assert_eq!(proxied.rtt_ms(1, 4), 0);
        let slow = Profile::load("lan-slow-proxied", None).unwrap();
        slow.check_nodes(5).unwrap();
        assert_eq!((slow.rtt_ms(1, 4), slow.rtt_ms(5, 2), slow.rtt_ms(3, 3)), (20, 20, 0));
        let lan = Profile::load("lan", None).unwrap();
        assert!(lan.is_passthrough());
        lan.check_nodes(7).unwrap();
        assert!(!Profile::load("lan", Some(10.0)).unwrap().is_passthrough());
        assert!(Profile::load("moon", None).is_err());
        assert!(Profile::load("lan", Some(0.0)).is_err());
    }
}
