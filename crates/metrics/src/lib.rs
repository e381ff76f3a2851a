//! Process-wide metrics rendered in the Prometheus text exposition format.
//!
//! Deliberately tiny: counters, gauges and fixed-bucket histograms, optionally with one label.
//! Components register what they need once (registration is idempotent by name) and keep the
//! returned `Arc` for the hot path, which is a single relaxed atomic operation.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A monotonically increasing count.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Latency histogram; observations are in seconds, buckets are upper bounds in seconds.
pub struct Histogram {
    bounds_seconds: &'static [f64],
    buckets: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// Buckets suited to request and fsync latencies: 50 µs to 10 s.
pub const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Histogram {
    fn new(bounds_seconds: &'static [f64]) -> Self {
        Histogram {
            bounds_seconds,
            buckets: bounds_seconds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, elapsed: std::time::Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(i) = self.bounds_seconds.iter().position(|b| seconds <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

enum Metric {
    Counter(Arc<Counter>),
    Gauge(Arc<Gauge>),
    Histogram(Arc<Histogram>),
}

struct Family {
    help: &'static str,
    label_name: Option<&'static str>,
    /// Label value ("" when unlabelled) to metric.
    series: BTreeMap<String, Metric>,
}

#[derive(Default)]
struct Registry {
    families: BTreeMap<&'static str, Family>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Registry::default()))
}

fn series(
    name: &'static str,
    help: &'static str,
    label: Option<(&'static str, &str)>,
    make: impl FnOnce() -> Metric,
    pick: impl FnOnce(&Metric) -> Option<Metric>,
) -> Metric {
    let mut registry = registry().lock().expect("metrics registry poisoned");
    let family = registry.families.entry(name).or_insert_with(|| Family {
        help,
        label_name: label.map(|(n, _)| n),
        series: BTreeMap::new(),
    });
    assert_eq!(
        family.label_name,
        label.map(|(n, _)| n),
        "metric {name} registered with two label names"
    );
    let key = label.map(|(_, v)| v.to_string()).unwrap_or_default();
    let metric = family.series.entry(key).or_insert_with(make);
    pick(metric).unwrap_or_else(|| panic!("metric {name} registered with two types"))
}

pub fn counter(name: &'static str, help: &'static str) -> Arc<Counter> {
    labeled_counter(name, help, None)
}

pub fn gauge(name: &'static str, help: &'static str) -> Arc<Gauge> {
    labeled_gauge(name, help, None)
}

pub fn histogram(name: &'static str, help: &'static str) -> Arc<Histogram> {
    labeled_histogram(name, help, None)
}

pub fn labeled_counter(name: &'static str, help: &'static str, label: Option<(&'static str, &str)>) -> Arc<Counter> {
    let m = series(
        name,
        help,
        label,
        || Metric::Counter(Arc::default()),
        |m| match m {
            Metric::Counter(c) => Some(Metric::Counter(c.clone())),
            _ => None,
        },
    );
    match m {
        Metric::Counter(c) => c,
        _ => unreachable!("pick returned the requested type"),
    }
}

pub fn labeled_gauge(name: &'static str, help: &'static str, label: Option<(&'static str, &str)>) -> Arc<Gauge> {
    let m = series(
        name,
        help,
        label,
        || Metric::Gauge(Arc::default()),
        |m| match m {
            Metric::Gauge(g) => Some(Metric::Gauge(g.clone())),
            _ => None,
        },
    );
    match m {
        Metric::Gauge(g) => g,
        _ => unreachable!("pick returned the requested type"),
    }
}

pub fn labeled_histogram(
    name: &'static str,
    help: &'static str,
    label: Option<(&'static str, &str)>,
) -> Arc<Histogram> {
    let m = series(
        name,
        help,
        label,
        || Metric::Histogram(Arc::new(Histogram::new(LATENCY_BUCKETS_SECONDS))),
        |m| match m {
            Metric::Histogram(h) => Some(Metric::Histogram(h.clone())),
            _ => None,
        },
    );
    match m {
        Metric::Histogram(h) => h,
        _ => unreachable!("pick returned the requested type"),
    }
}

/// Renders every registered metric in the Prometheus text format (version 0.0.4).
pub fn render() -> String {
    let registry = registry().lock().expect("metrics registry poisoned");
    let mut out = String::new();
    for (name, family) in &registry.families {
        let kind = match family.series.values().next() {
            Some(Metric::Counter(_)) => "counter",
            Some(Metric::Gauge(_)) => "gauge",
            Some(Metric::Histogram(_)) => "histogram",
            None => continue,
        };
        let _ = writeln!(out, "# HELP {name} {}", family.help);
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (label_value, metric) in &family.series {
            let labels = |extra: &str| -> String {
                let mut parts = Vec::new();
                if let Some(label_name) = family.label_name {
                    parts.push(format!("{label_name}=\"{}\"", escape(label_value)));
                }
                if !extra.is_empty() {
                    parts.push(extra.to_string());
                }
                if parts.is_empty() {
                    String::new()
                } else {
                    format!("{{{}}}", parts.join(","))
                }
            };
            match metric {
                Metric::Counter(c) => {
                    let _ = writeln!(out, "{name}{} {}", labels(""), c.get());
                }
                Metric::Gauge(g) => {
                    let _ = writeln!(out, "{name}{} {}", labels(""), g.get());
                }
                Metric::Histogram(h) => {
                    let mut cumulative = 0;
                    for (bound, bucket) in h.bounds_seconds.iter().zip(&h.buckets) {
                        cumulative += bucket.load(Ordering::Relaxed);
                        let le = format!("le=\"{bound}\"");
                        let _ = writeln!(out, "{name}_bucket{} {cumulative}", labels(&le));
                    }
                    let count = h.count.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}_bucket{} {count}", labels("le=\"+Inf\""));
                    let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
                    let _ = writeln!(out, "{name}_sum{} {sum}", labels(""));
                    let _ = writeln!(out, "{name}_count{} {count}", labels(""));
                }
            }
        }
    }
    out
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renders_counters_gauges_and_cumulative_histograms() {
        labeled_counter("test_sent_total", "sent", Some(("peer", "2"))).add(3);
        gauge("test_term", "term").set(7);
        let h = histogram("test_latency_seconds", "latency");
        h.observe(Duration::from_micros(80));
        h.observe(Duration::from_millis(3));
        let text = render();
        assert!(text.contains("test_sent_total{peer=\"2\"} 3"), "{text}");
        assert!(text.contains("test_term 7"), "{text}");
        assert!(text.contains("test_latency_seconds_bucket{le=\"0.0001\"} 1"), "{text}");
        assert!(text.contains("test_latency_seconds_bucket{le=\"0.005\"} 2"), "{text}");
        assert!(text.contains("test_latency_seconds_count 2"), "{text}");
    }

    #[test]
    fn registration_is_idempotent() {
        let a = counter("test_idempotent_total", "x");
        let b = counter("test_idempotent_total", "x");
        a.inc();
        assert_eq!(b.get(), 1);
    }
}
