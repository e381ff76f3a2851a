//! Runs a workload against a target: the load phase, then concurrent clients in a closed loop (as
//! fast as replies come) or an open loop at a target rate. In the open loop every operation has
//! an intended send time on a fixed schedule and its latency is measured from that time, so a
//! slow server is charged for the operations it delayed (no coordinated omission).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::cpu::CpuMeter;
use crate::report::{self, LatencySummary, RunResult, TimelinePoint};
use crate::rng::Rng;
use crate::target::{OpError, Record, Session, Target};
use crate::workload::{KeySpace, Op, OpKind, OpStream, Workload};

#[derive(Debug, Clone, serde::Serialize)]
pub struct RunConfig {
    pub workload: Workload,
    pub records: u64,
    pub fields: usize,
    pub field_bytes: usize,
    /// Keys are `{key_prefix}{record number:012}`.
    pub key_prefix: String,
    /// Stop after this many operations; otherwise after `duration_secs`.
    pub operations: Option<u64>,
    pub duration_secs: f64,
    pub clients: usize,
    /// Open loop at this many operations per second in total; closed loop when `None`.
    pub rate_ops_per_sec: Option<f64>,
    /// This share of written values comes from `value_repeat_pool` recurring values.
    pub value_repeat_fraction: Option<f64>,
    pub value_repeat_pool: usize,
    pub seed: u64,
}

impl RunConfig {
    pub fn key(&self, n: u64) -> String {
        format!("{}{n:012}", self.key_prefix)
    }
}

const LATENCY_MAX_US: u64 = 120_000_000;
const VALUE_POOL_BYTES: usize = 1 << 20;
const LOAD_BATCH_RECORDS: usize = 512;
/// Error messages kept verbatim in the result, so a failed run says why.
const ERROR_SAMPLES: usize = 5;

/// Where written values come from: slices of a pool of random printable bytes at random offsets
/// (practically never repeating, zero-copy), or with `repeat`, a small set of recurring values
/// for that share of writes (what a cache on the replication stream can exploit).
#[derive(Clone)]
struct Values {
    pool: Bytes,
    field_bytes: usize,
    repeat: Option<(f64, Vec<Bytes>)>,
}

impl Values {
    fn new(config: &RunConfig) -> Values {
        let mut rng = Rng::new(config.seed ^ 0x5EED);
        let len = VALUE_POOL_BYTES.max(config.field_bytes * 2);
        let pool = Bytes::from((0..len).map(|_| b'!' + rng.below(94) as u8).collect::<Vec<u8>>());
        let repeat = config.value_repeat_fraction.map(|fraction| {
            let recurring = (0..config.value_repeat_pool.max(1))
                .map(|i| {
                    let mut v = format!("recurring-{i}-").into_bytes();
                    v.resize(config.field_bytes, b'0' + (i % 10) as u8);
                    v.truncate(config.field_bytes);
                    Bytes::from(v)
                })
                .collect();
            (fraction, recurring)
        });
        Values {
            pool,
            field_bytes: config.field_bytes,
            repeat,
        }
    }

    fn next(&self, rng: &mut Rng) -> Bytes {
        if let Some((fraction, recurring)) = &self.repeat {
            if rng.next_f64() < *fraction {
                return recurring[rng.below(recurring.len() as u64) as usize].clone();
            }
        }
        let offset = rng.below((self.pool.len() - self.field_bytes + 1) as u64) as usize;
        self.pool.slice(offset..offset + self.field_bytes)
    }
}

fn record(config: &RunConfig, values: &Values, rng: &mut Rng, n: u64) -> Record {
    let fields = (0..config.fields).map(|_| values.next(rng)).collect();
    (config.key(n), fields)
}

/// Inserts records 0..records, spread over `clients` sessions, with progress.
pub async fn load<T: Target>(target: &T, config: &RunConfig) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let values = Values::new(config);
    let next = Arc::new(AtomicU64::new(0));
    let clients = config.clients.clamp(1, 16);
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let mut session = target
            .connect(client)
            .await
            .with_context(|| format!("{}: cannot connect for loading", target.name()))?;
        let (next, values, config) = (next.clone(), values.clone(), config.clone());
        tasks.spawn(async move {
            let mut rng = Rng::new(config.seed.wrapping_add(client as u64));
            loop {
                let first = next.fetch_add(LOAD_BATCH_RECORDS as u64, Ordering::Relaxed);
                if first >= config.records {
                    return Ok::<(), OpError>(());
                }
                let last = (first + LOAD_BATCH_RECORDS as u64).min(config.records);
                let records: Vec<Record> = (first..last).map(|n| record(&config, &values, &mut rng, n)).collect();
                session.load(&records).await?;
            }
        });
    }
    let progress = Progress::new();
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(result) => result.context("load task panicked")?.map_err(|e| anyhow::anyhow!("loading failed: {e}"))?,
                None => break,
            },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                let done = next.load(Ordering::Relaxed).min(config.records);
                progress.line(&format!(
                    "  loading {}: {done}/{} records, {:.0}s",
                    target.name(),
                    config.records,
                    started.elapsed().as_secs_f64()
                ));
            }
        }
    }
    progress.finish();
    Ok(started.elapsed())
}

struct Second {
    ops: u64,
    errors: u64,
    latency_us: Histogram<u64>,
}

/// Everything measured during a run; shared by the clients behind a mutex (held for
/// microseconds per operation).
struct Recorder {
    started: Instant,
    by_kind: BTreeMap<OpKind, Histogram<u64>>,
    errors: BTreeMap<&'static str, u64>,
    error_samples: Vec<String>,
    not_found: u64,
    seconds: Vec<Second>,
}

/// A latency histogram in microseconds.
pub(crate) fn histogram(significant_digits: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, significant_digits).expect("valid histogram bounds")
}

impl Recorder {
    fn new(started: Instant) -> Recorder {
        Recorder {
            started,
            by_kind: BTreeMap::new(),
            errors: BTreeMap::new(),
            error_samples: Vec::new(),
            not_found: 0,
            seconds: Vec::new(),
        }
    }

    fn second(&mut self, at: Instant) -> &mut Second {
        let index = at.saturating_duration_since(self.started).as_secs() as usize;
        while self.seconds.len() <= index {
            self.seconds.push(Second {
                ops: 0,
                errors: 0,
                latency_us: histogram(2),
            });
        }
        &mut self.seconds[index]
    }

    fn record(&mut self, kind: OpKind, latency: Duration, outcome: &Result<bool, OpError>, now: Instant) {
        let us = (latency.as_micros() as u64).clamp(1, LATENCY_MAX_US);
        match outcome {
            Ok(found) => {
                if !found {
                    self.not_found += 1;
                }
                self.by_kind
                    .entry(kind)
                    .or_insert_with(|| histogram(3))
                    .saturating_record(us);
                let second = self.second(now);
                second.ops += 1;
                second.latency_us.saturating_record(us);
            }
            Err(e) => {
                let class = match e {
                    OpError::Rejected(_) => "rejected",
                    OpError::Connection(_) => "connection",
                };
                *self.errors.entry(class).or_default() += 1;
                if self.error_samples.len() < ERROR_SAMPLES {
                    self.error_samples.push(format!("{}: {e}", kind.name()));
                }
                self.second(now).errors += 1;
            }
        }
    }
}

/// Executes one operation; `Ok(false)` means a read found nothing.
async fn execute<S: Session>(
    session: &mut S,
    config: &RunConfig,
    op: &Op,
    values: &Values,
    rng: &mut Rng,
    keys: &KeySpace,
) -> Result<bool, OpError> {
    match *op {
        Op::Read { key } => session.read(&config.key(key)).await,
        Op::Update { key, field } => {
            let value = values.next(rng);
            session.update(&config.key(key), field, &value).await.map(|_| true)
        }
        Op::Insert { key } => {
            let (key_name, fields) = record(config, values, rng, key);
            session.insert(&key_name, &fields).await?;
            keys.acknowledge();
            Ok(true)
        }
        Op::Scan { first_key, records } => {
            let names: Vec<String> = (first_key..first_key + records).map(|k| config.key(k)).collect();
            session.scan(&names).await.map(|found| found > 0)
        }
        Op::ReadModifyWrite { key, field } => {
            let name = config.key(key);
            let found = session.read(&name).await?;
            let value = values.next(rng);
            session.update(&name, field, &value).await?;
            Ok(found)
        }
    }
}

struct Shared<T: Target> {
    target: T,
    config: RunConfig,
    recorder: Mutex<Recorder>,
    keys: Arc<KeySpace>,
    values: Values,
    issued: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    started: Instant,
    deadline: Instant,
}

impl<T: Target> Shared<T> {
    /// Claims the next operation, or `None` when the run is over.
    fn claim(&self) -> Option<()> {
        if Instant::now() >= self.deadline {
            return None;
        }
        match self.config.operations {
            Some(limit) => (self.issued.fetch_add(1, Ordering::Relaxed) < limit).then_some(()),
            None => Some(()),
        }
    }
}

async fn client_loop<T: Target>(shared: Arc<Shared<T>>, client: usize, mut session: T::Session) {
    let config = &shared.config;
    let mut stream = OpStream::new(
        &config.workload,
        config.records,
        config.fields,
        shared.keys.clone(),
        config.seed.wrapping_mul(1_000_003).wrapping_add(client as u64),
    );
    let mut value_rng = Rng::new(config.seed ^ (client as u64) << 20);
    // Open loop: client i sends at start + (i / clients + k) × interval, k = 0, 1, 2, ...
    let interval = config
        .rate_ops_per_sec
        .map(|rate| Duration::from_secs_f64(config.clients as f64 / rate));
    let mut next_send = interval.map(|iv| shared.started + iv.mul_f64(client as f64 / config.clients as f64));
    while shared.claim().is_some() {
        let op = stream.next_op();
        let intended = match (&mut next_send, interval) {
            (Some(at), Some(iv)) => {
                let intended = *at;
                *at += iv;
                tokio::time::sleep_until(intended).await;
                intended
            }
            _ => Instant::now(),
        };
        if intended >= shared.deadline {
            break;
        }
        let outcome = execute(&mut session, config, &op, &shared.values, &mut value_rng, &shared.keys).await;
        let now = Instant::now();
        shared
            .recorder
            .lock()
            .expect("recorder lock")
            .record(op.kind(), now - intended, &outcome, now);
        match &outcome {
            Ok(_) => shared.completed.fetch_add(1, Ordering::Relaxed),
            Err(_) => shared.failed.fetch_add(1, Ordering::Relaxed),
        };
        if let Err(OpError::Connection(_)) = outcome {
            session = match reconnect(&shared, client).await {
                Some(session) => session,
                None => return,
            };
        }
    }
}

async fn reconnect<T: Target>(shared: &Shared<T>, client: usize) -> Option<T::Session> {
    let mut backoff = Duration::from_millis(50);
    while Instant::now() < shared.deadline {
        if let Ok(session) = shared.target.connect(client).await {
            return Some(session);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
    None
}

/// A progress line: rewritten in place on a terminal, one line per update otherwise.
struct Progress {
    tty: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn line(&self, text: &str) {
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r{text:<100}");
        } else {
            let _ = writeln!(err, "{text}");
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// Measures the client's round trip to the target (median of 5 pings), in ms.
pub async fn measure_client_rtt<T: Target>(target: &T) -> anyhow::Result<f64> {
    let mut session = target.connect(0).await?;
    let mut samples = Vec::new();
    for _ in 0..6 {
        samples.push(session.ping().await.map_err(|e| anyhow::anyhow!("ping failed: {e}"))?);
    }
    samples.remove(0);
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Runs the workload (no load phase) and returns the measurements, with the CPU that the
/// processes `server_pids` spent meanwhile.
pub async fn run<T: Target>(target: T, config: &RunConfig, server_pids: &[u32]) -> anyhow::Result<RunResult> {
    if config.clients == 0 {
        bail!("at least one client is needed");
    }
    let name = target.name();
    let mut sessions = Vec::with_capacity(config.clients);
    for client in 0..config.clients {
        sessions.push(
            target
                .connect(client)
                .await
                .with_context(|| format!("{name}: client {client} cannot connect"))?,
        );
    }
    let cpu = CpuMeter::start(server_pids);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(config.duration_secs);
    let shared = Arc::new(Shared {
        target,
        config: config.clone(),
        recorder: Mutex::new(Recorder::new(started)),
        keys: KeySpace::new(config.records),
        values: Values::new(config),
        issued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        started,
        deadline,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (client, session) in sessions.into_iter().enumerate() {
        tasks.spawn(client_loop(shared.clone(), client, session));
    }
    let progress = Progress::new();
    let mut last_completed = 0;
    let mut ticker = tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(result) => result.context("client task panicked")?,
                None => break,
            },
            _ = ticker.tick() => {
                let completed = shared.completed.load(Ordering::Relaxed);
                let elapsed = started.elapsed();
                let p99_ms = {
                    let recorder = shared.recorder.lock().expect("recorder lock");
                    let last = (elapsed.as_secs() as usize).saturating_sub(1);
                    recorder.seconds.get(last).map_or(0.0, |s| s.latency_us.value_at_quantile(0.99) as f64 / 1000.0)
                };
                progress.line(&format!(
                    "  {name} {:>5.1}s  ops {completed:>9}  {:>8} ops/s  p99 {p99_ms:>7.2} ms  errors {}",
                    elapsed.as_secs_f64(),
                    completed - last_completed,
                    shared.failed.load(Ordering::Relaxed)
                ));
                last_completed = completed;
            }
        }
    }
    progress.finish();
    let elapsed = started.elapsed();
    let recorder = shared.recorder.lock().expect("recorder lock");
    let mut result = summarize(&name, config, &recorder, elapsed.as_secs_f64());
    (result.server_cpu, result.client_cpu_us_per_op) = cpu.finish(result.operations, result.duration_secs);
    Ok(result)
}

fn summarize(target: &str, config: &RunConfig, recorder: &Recorder, elapsed_secs: f64) -> RunResult {
    let mut all = histogram(3);
    let mut latency = BTreeMap::new();
    for (kind, h) in &recorder.by_kind {
        all.add(h).expect("same bounds");
        latency.insert(kind.name().to_string(), LatencySummary::from_histogram(h));
    }
    latency.insert("all".to_string(), LatencySummary::from_histogram(&all));
    let operations = all.len();
    let errors: u64 = recorder.errors.values().sum();
    // Only whole seconds: the last, partial one holds just the replies that straggled in.
    let timeline = recorder
        .seconds
        .iter()
        .take(elapsed_secs.floor() as usize)
        .enumerate()
        .map(|(i, s)| TimelinePoint {
            second: i as u64 + 1,
            ops: s.ops,
            errors: s.errors,
            p50_ms: s.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms: s.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
        })
        .collect();
    RunResult {
        name: format!(
            "{target}-{}-c{}",
            config.workload.name.to_ascii_lowercase(),
            config.clients
        ),
        target: target.to_string(),
        started_unix_secs: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .saturating_sub(elapsed_secs as u64),
        git_revision: report::git_revision(),
        machine: report::Machine::current(),
        network: None,
        config: config.clone(),
        duration_secs: elapsed_secs,
        operations,
        errors,
        errors_by_class: recorder.errors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        error_samples: recorder.error_samples.clone(),
        reads_not_found: recorder.not_found,
        throughput_ops_per_sec: operations as f64 / elapsed_secs.max(1e-9),
        latency_ms: latency,
        timeline,
        server_cpu: None,
        client_cpu_us_per_op: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Record;

    /// A target whose every operation takes `service_ms`, one at a time per session.
    #[derive(Clone)]
    struct SlowTarget {
        service_ms: u64,
    }

    struct SlowSession {
        service_ms: u64,
    }

    impl Target for SlowTarget {
        type Session = SlowSession;

        fn name(&self) -> String {
            "slow".into()
        }

        async fn connect(&self, _client: usize) -> anyhow::Result<SlowSession> {
            Ok(SlowSession {
                service_ms: self.service_ms,
            })
        }
    }

    impl SlowSession {
        async fn serve(&self) {
            tokio::time::sleep(Duration::from_millis(self.service_ms)).await;
        }
    }

    impl Session for SlowSession {
        async fn insert(&mut self, _key: &str, _fields: &[Bytes]) -> Result<(), OpError> {
            self.serve().await;
            Ok(())
        }

        async fn load(&mut self, _records: &[Record]) -> Result<(), OpError> {
            Ok(())
        }

        async fn read(&mut self, _key: &str) -> Result<bool, OpError> {
            self.serve().await;
            Ok(true)
        }

        async fn update(&mut self, _key: &str, _field: usize, _value: &Bytes) -> Result<(), OpError> {
            self.serve().await;
            Ok(())
        }

        async fn scan(&mut self, keys: &[String]) -> Result<usize, OpError> {
            self.serve().await;
            Ok(keys.len())
        }

        async fn ping(&mut self) -> Result<f64, OpError> {
            Ok(0.0)
        }
    }

    fn config(rate: Option<f64>) -> RunConfig {
        RunConfig {
            workload: Workload::named("A").unwrap(),
            records: 100,
            fields: 1,
            field_bytes: 8,
            key_prefix: "user".into(),
            operations: None,
            duration_secs: 1.0,
            clients: 1,
            rate_ops_per_sec: rate,
            value_repeat_fraction: None,
            value_repeat_pool: 1,
            seed: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn closed_loop_measures_service_time() {
        let result = run(SlowTarget { service_ms: 10 }, &config(None), &[]).await.unwrap();
        let all = &result.latency_ms["all"];
        assert!((9.5..11.0).contains(&all.p99), "p99 {}", all.p99);
        assert!((95..=101).contains(&result.operations), "{} ops", result.operations);
    }

    #[tokio::test(start_paused = true)]
    async fn open_loop_charges_queueing_behind_a_slow_server() {
        // 200 ops/s offered to a server that completes 100/s: each operation waits for the ones
        // before it, and that wait is part of its latency (no coordinated omission).
        let result = run(SlowTarget { service_ms: 10 }, &config(Some(200.0)), &[])
            .await
            .unwrap();
        let all = &result.latency_ms["all"];
        assert!(all.p99 > 400.0, "p99 {} ms hides the queueing", all.p99);
        assert!(all.p50 > 200.0, "p50 {} ms", all.p50);
    }

    #[tokio::test(start_paused = true)]
    async fn open_loop_below_capacity_sends_on_schedule() {
        let result = run(SlowTarget { service_ms: 10 }, &config(Some(50.0)), &[])
            .await
            .unwrap();
        assert!(
            (48..=51).contains(&result.operations),
            "{} ops at 50/s",
            result.operations
        );
        assert!(result.latency_ms["all"].p99 < 11.0);
    }
}
