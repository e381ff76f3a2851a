//! The status page a node serves on its metrics port (`GET /`): who it is in the raft group,
//! how far behind each peer is, what it is doing per second, and each technique's health — all
//! from the node's status and its own metrics, rendered as plain HTML that refreshes itself.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chorus_log::node::NodeStatus;

/// How often the page reloads itself.
const REFRESH_SECS: u32 = 2;
/// Rates are over this window.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Samples of the applied index and of the commands received, for the page's rates.
#[derive(Default)]
pub struct Rates {
    samples: Mutex<VecDeque<(Instant, u64, f64)>>,
}

impl Rates {
    /// Adds a sample; a page asks for one each time it is drawn, and a background task once a
    /// second.
    pub fn sample(&self, applied_index: u64, metrics: &str) {
        let mut samples = self.samples.lock().expect("not poisoned");
        let now = Instant::now();
        samples.push_back((now, applied_index, sum(metrics, "chorus_commands_total")));
        while samples
            .front()
            .is_some_and(|(at, _, _)| now.duration_since(*at) > RATE_WINDOW)
        {
            samples.pop_front();
        }
    }

    /// Entries applied and commands received per second over the window, once it holds two
    /// samples.
    fn per_second(&self) -> Option<(f64, f64)> {
        let samples = self.samples.lock().expect("not poisoned");
        let (first, last) = (samples.front()?, samples.back()?);
        let seconds = last.0.duration_since(first.0).as_secs_f64();
        (seconds > 0.5).then(|| {
            (
                last.1.saturating_sub(first.1) as f64 / seconds,
                (last.2 - first.2).max(0.0) / seconds,
            )
        })
    }
}

/// One sample line of the Prometheus text: name, labels (as written), value.
fn samples<'a>(metrics: &'a str) -> impl Iterator<Item = (&'a str, &'a str, f64)> + 'a {
    metrics.lines().filter(|l| !l.starts_with('#')).filter_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let value = value.parse().ok()?;
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        Some((name, labels, value))
    })
}

/// The sum of every series of `name`, 0 if it has none.
fn sum(metrics: &str, name: &str) -> f64 {
    samples(metrics).filter(|(n, _, _)| *n == name).map(|(_, _, v)| v).sum()
}

/// The value of `name` for `label="value"`, if there is such a series.
fn labeled(metrics: &str, name: &str, label: &str) -> Option<f64> {
    samples(metrics)
        .find(|(n, labels, _)| *n == name && labels.split(',').any(|l| l == label))
        .map(|(_, _, v)| v)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The techniques' sections: a title and the metric name prefix whose series it lists.
const SECTIONS: &[(&str, &str)] = &[
    ("UniCache (entries sent as encodings)", "chorus_unicache_"),
    ("CURP (one-round-trip writes)", "chorus_curp_"),
    ("LDC (one logical cache)", "chorus_ldc_"),
    ("Storage (log reduction)", "chorus_storage_"),
    ("SQL", "chorus_sql_"),
    ("Clients", "chorus_resp_"),
    ("TLS", "chorus_tls_"),
];

/// The page for a node whose status is `status` and whose metrics are `metrics`.
pub fn render(status: &NodeStatus, metrics: &str, rates: &Rates) -> String {
    let mut page = String::new();
    let role = format!("{:?}", status.role).to_lowercase();
    let _ = write!(
        page,
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <title>Chorus node {id}: {role}</title><style>\
         body{{font-family:sans-serif;margin:1.5em;color:#222}} h1{{font-size:1.4em}} h2{{font-size:1.1em;margin-top:1.4em}}\
         table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:right}}\
         th{{background:#f2f2f2;text-align:left}} td.name{{text-align:left;font-family:monospace}} .role{{font-weight:bold}}\
         .leader{{color:#0a7a2f}} .follower{{color:#1d4f91}} .candidate,.precandidate{{color:#b35c00}}\
         .warn{{color:#b00020;font-weight:bold}}</style></head><body>\
         <h1>Chorus node {id}: <span class=\"role {role}\" id=\"role\">{role}</span></h1>",
        id = status.id,
    );
    let leader = match status.leader_id {
        0 => "none known".to_string(),
        id => format!("node {id}"),
    };
    let _ = write!(
        page,
        "<table id=\"raft\"><tr><th>term</th><th>leader</th><th>commit index</th><th>applied index</th>\
         <th>log</th><th>snapshot index</th></tr><tr><td id=\"term\">{}</td><td id=\"leader\">{leader}</td>\
         <td>{}</td><td>{}</td><td>{} – {}</td><td>{}</td></tr></table>",
        status.term,
        status.commit_index,
        status.applied_index,
        status.first_index,
        status.last_index,
        status.snapshot_index
    );
    page.push_str("<h2>Throughput</h2>");
    match rates.per_second() {
        Some((entries, commands)) => {
            let _ = write!(
                page,
                "<p id=\"throughput\">{entries:.0} entries applied/s, {commands:.0} client commands/s \
                 (last {} s)</p>",
                RATE_WINDOW.as_secs()
            );
        }
        None => page.push_str("<p id=\"throughput\">measuring…</p>"),
    }
    page.push_str(
        "<h2>Peers</h2><table id=\"peers\"><tr><th>peer</th><th>lag (entries)</th><th>round trip (µs)</th>\
         <th>bytes sent</th><th>bytes received</th></tr>",
    );
    let mut peers: Vec<String> = samples(metrics)
        .filter(|(name, _, _)| *name == "chorus_peer_rtt_microseconds")
        .filter_map(|(_, labels, _)| labels.strip_prefix("peer=\"")?.strip_suffix('"').map(str::to_string))
        .collect();
    peers.sort();
    for peer in &peers {
        let label = format!("peer=\"{peer}\"");
        let value = |name: &str| labeled(metrics, name, &label).map_or("–".to_string(), |v| format!("{v:.0}"));
        let lag = if status.role == chorus_log::Role::Leader {
            value("chorus_raft_peer_lag_entries")
        } else {
            "(leader knows)".to_string()
        };
        let _ = write!(
            page,
            "<tr><td class=\"name\">node {}</td><td>{lag}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(peer),
            value("chorus_peer_rtt_microseconds"),
            value("chorus_peer_bytes_sent_total"),
            value("chorus_peer_bytes_received_total"),
        );
    }
    page.push_str("</table>");
    let refused = sum(metrics, "chorus_peer_auth_failures_total");
    if refused > 0.0 {
        let _ = write!(
            page,
            "<p class=\"warn\">{refused:.0} peer connection(s) refused for want of the cluster secret or a certificate of its CA</p>"
        );
    }
    for (title, prefix) in SECTIONS {
        let rows: Vec<(&str, &str, f64)> = samples(metrics)
            .filter(|(name, _, _)| name.starts_with(prefix) && !name.ends_with("_bucket"))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = write!(
            page,
            "<h2>{}</h2><table><tr><th>metric</th><th>value</th></tr>",
            escape(title)
        );
        for (name, labels, value) in rows {
            let series = if labels.is_empty() {
                name.to_string()
            } else {
                format!("{name}{{{labels}}}")
            };
            let _ = write!(
                page,
                "<tr><td class=\"name\">{}</td><td>{value}</td></tr>",
                escape(&series)
            );
        }
        page.push_str("</table>");
    }
    page.push_str("<p>Every series: <a href=\"/metrics\">/metrics</a> (Prometheus text).</p></body></html>");
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every series the shipped Grafana dashboard queries is one some crate registers (a
    /// renamed metric would otherwise leave a panel silently empty).
    #[test]
    fn the_grafana_dashboard_queries_only_metrics_chorus_exports() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root.join("deploy/grafana/chorus.json")).unwrap()).unwrap();
        let mut sources = String::new();
        let mut dirs = vec![root.join("crates")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    sources += &std::fs::read_to_string(&path).unwrap();
                }
            }
        }
        let panels = dashboard["panels"].as_array().unwrap();
        let mut checked = 0;
        for target in panels.iter().filter_map(|p| p["targets"].as_array()).flatten() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("chorus_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                let name = name.trim_end_matches("_bucket");
                assert!(
                    sources.contains(&format!("\"{name}\"")),
                    "the dashboard queries {name}, which nothing exports"
                );
                checked += 1;
            }
        }
        assert!(checked > 30, "{checked} series checked");
        for title in ["Raft", "UniCache", "CURP", "LDC", "Storage (log reduction)"] {
            assert!(panels.iter().any(|p| p["title"] == title), "a {title} row");
        }
    }

    #[test]
    fn the_page_shows_the_role_the_peers_lag_and_each_techniques_series() {
        let status = NodeStatus {
            id: 2,
            role: chorus_log::Role::Leader,
            term: 7,
            leader_id: 2,
            commit_index: 120,
            applied_index: 118,
            first_index: 1,
            last_index: 121,
            snapshot_index: 0,
        };
        let metrics =
            "# HELP x\nchorus_peer_rtt_microseconds{peer=\"1\"} 250\nchorus_peer_rtt_microseconds{peer=\"3\"} 300\n\
                       chorus_raft_peer_lag_entries{peer=\"1\"} 0\nchorus_raft_peer_lag_entries{peer=\"3\"} 42\n\
                       chorus_unicache_version 118\nchorus_commands_total{command=\"set\"} 10\n\
                       chorus_peer_auth_failures_total 2\nchorus_sql_x{a=\"<b>\"} 1\n";
        let rates = Rates::default();
        rates.sample(100, metrics);
        let page = render(&status, metrics, &rates);
        assert!(
            page.contains("<span class=\"role leader\" id=\"role\">leader</span>"),
            "{page}"
        );
        assert!(page.contains("<td id=\"term\">7</td>"));
        assert!(
            page.contains("<td class=\"name\">node 3</td><td>42</td><td>300</td>"),
            "{page}"
        );
        assert!(page.contains("chorus_unicache_version</td><td>118"), "{page}");
        assert!(page.contains("2 peer connection(s) refused"));
        assert!(
            page.contains("chorus_sql_x{a=&quot;&lt;b&gt;&quot;}"),
            "label text is escaped: {page}"
        );
        assert!(!page.contains("CURP"), "a technique without series is left out");
        assert!(page.contains("measuring"), "one sample gives no rate yet");
    }
}
