//! How often CURP's paths ran during a run, from the nodes' metrics: a campaign that means to
//! test the fast path and recovery shows that it did.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use chorus_cluster::metrics::{metric_sum, scrape};
use serde::Serialize;

#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize)]
pub struct CurpTally {
    pub fast_path_writes: u64,
    pub slow_path_writes: u64,
    pub recoveries: u64,
    pub recovered_writes: u64,
}

impl CurpTally {
    fn from_metrics(text: &str) -> CurpTally {
        let count = |name| metric_sum(text, name) as u64;
        CurpTally {
            fast_path_writes: count("chorus_curp_fast_path_writes_total"),
            slow_path_writes: count("chorus_curp_slow_path_writes_total"),
            recoveries: count("chorus_curp_recoveries_total"),
            recovered_writes: count("chorus_curp_recovered_writes_total"),
        }
    }

    fn fields(&self) -> [u64; 4] {
        [
            self.fast_path_writes,
            self.slow_path_writes,
            self.recoveries,
            self.recovered_writes,
        ]
    }

    fn from_fields(f: [u64; 4]) -> CurpTally {
        CurpTally {
            fast_path_writes: f[0],
            slow_path_writes: f[1],
            recoveries: f[2],
            recovered_writes: f[3],
        }
    }

    pub fn any(&self) -> bool {
        self.fields().iter().any(|n| *n > 0)
    }
}

/// Totals over node restarts: each sample adds what grew since the last one of that node, or,
/// when a counter went back (the node restarted), all it has counted since.
#[derive(Default)]
pub struct CurpWatch {
    state: Mutex<(HashMap<u64, CurpTally>, CurpTally)>,
}

impl CurpWatch {
    pub async fn sample(&self, nodes: &[(u64, SocketAddr)]) {
        for (id, addr) in nodes {
            // A node that is down or paused is sampled next time.
            let Ok(Ok(text)) = tokio::time::timeout(std::time::Duration::from_secs(1), scrape(*addr)).await else {
                continue;
            };
            self.add(*id, CurpTally::from_metrics(&text));
        }
    }

    fn add(&self, node: u64, now: CurpTally) {
        let mut state = self.state.lock().expect("not poisoned");
        let (last, total) = &mut *state;
        let before = last.insert(node, now).unwrap_or_default();
        let restarted = now.fields().iter().zip(before.fields()).any(|(n, b)| *n < b);
        let base = if restarted { CurpTally::default() } else { before };
        let mut sum = total.fields();
        for (i, (n, b)) in now.fields().iter().zip(base.fields()).enumerate() {
            sum[i] += n - b;
        }
        *total = CurpTally::from_fields(sum);
    }

    pub fn total(&self) -> CurpTally {
        self.state.lock().expect("not poisoned").1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_survive_a_node_restart() {
        let watch = CurpWatch::default();
        let tally = |fast| CurpTally {
            fast_path_writes: fast,
            ..CurpTally::default()
        };
        watch.add(1, tally(10));
        watch.add(2, tally(5));
        watch.add(1, tally(25));
        watch.add(1, tally(3));
        assert_eq!(watch.total().fast_path_writes, 25 + 5 + 3);
    }
}
