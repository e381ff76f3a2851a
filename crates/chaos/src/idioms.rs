//! The Redis idioms applications build on a strongly consistent store, under faults: locks
//! taken with `SET NX PX` and released with a compare-and-delete script, and queues fed with
//! RPUSH and drained with BLPOP. What is checked, from the clients' own records:
//!
//! - No lock is held twice: when a grant was answered before another client's SET began, that
//!   second grant must not be answered before the first could have ended — its time to live
//!   counted from when it was asked for, or its release if one was sent earlier.
//! - No queue item is delivered twice (by two pops, or by a pop and the queue at the end).
//! - No acknowledged item is lost: those neither delivered nor left in the queue at the end are
//!   at most as many as the pops whose outcome is unknown (each may have taken one unseen).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use chorus_client::{Client, ClientError, Value};
use serde::{Deserialize, Serialize};

use crate::workload::{Recorder, Rng};

/// Long enough that a leader change often falls inside a hold.
pub const LOCK_TTL_MS: u64 = 800;
const LOCKS: u64 = 2;
const QUEUES: u64 = 2;
const BLPOP_TIMEOUT_SECS: &str = "1";
/// Deadlines are whole milliseconds of the leader's clock (the same machine's clock here):
/// a hold can end up to a millisecond before its time to live counted from the request.
const CLOCK_SLACK_US: u64 = 2_000;
const PRODUCER_PAUSE: Duration = Duration::from_millis(5);
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(6);
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// The compare-and-delete that releases a lock only while it still holds the releaser's token.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// What the idiom clients did, one record per operation that matters to the checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Acquired {
        client: u64,
        lock: String,
        token: String,
        invoke_us: u64,
        complete_us: u64,
    },
    /// A release sent; `deleted` is its reply (1: released, 0: the lock no longer held the
    /// token), `None` when its outcome is unknown.
    Released {
        client: u64,
        lock: String,
        token: String,
        invoke_us: u64,
        deleted: Option<i64>,
        complete_us: Option<u64>,
    },
    /// An RPUSH; `acknowledged` false when its outcome is unknown.
    Pushed {
        client: u64,
        queue: String,
        item: i64,
        acknowledged: bool,
    },
    Popped {
        client: u64,
        queue: String,
        item: i64,
    },
    /// A BLPOP whose outcome is unknown: it may have taken an item no one saw.
    PopUnknown {
        client: u64,
    },
    /// An item left in a queue at the end.
    Remaining {
        queue: String,
        item: i64,
    },
}

impl Event {
    /// Whether the operation it records has a known outcome.
    pub fn outcome_known(&self) -> bool {
        match self {
            Event::Released { deleted, .. } => deleted.is_some(),
            Event::Pushed { acknowledged, .. } => *acknowledged,
            Event::PopUnknown { .. } => false,
            _ => true,
        }
    }
}

#[derive(Default)]
pub struct Log {
    pub events: Mutex<Vec<Event>>,
}

impl Log {
    fn record(&self, recorder: &Recorder, event: Event, known: bool) {
        let counter = if known { &recorder.completed } else { &recorder.unknown };
        counter.fetch_add(1, Ordering::Relaxed);
        self.events.lock().expect("idioms log").push(event);
    }
}

async fn connect(nodes: &[SocketAddr], rng: &mut Rng) -> Option<Client> {
    let addr = nodes[rng.below(nodes.len() as u64) as usize];
    match Client::connect(addr).await {
        Ok(mut client) => {
            client.set_timeout(REQUEST_TIMEOUT);
            Some(client)
        }
        Err(_) => {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            None
        }
    }
}

/// A reply that says the command did not execute (only TRYAGAIN promises that).
fn refused(reply: &Result<Value, ClientError>) -> bool {
    matches!(reply, Ok(Value::Error(e)) if e.starts_with("TRYAGAIN"))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    Locker,
    Producer,
    Consumer,
}

impl Role {
    /// Clients take the three roles in turn.
    pub fn of(client: u64) -> Role {
        match client % 3 {
            0 => Role::Locker,
            1 => Role::Producer,
            _ => Role::Consumer,
        }
    }
}

/// One client in its role until the run stops; it reconnects to a random node whenever its
/// connection breaks.
pub async fn client_loop(recorder: Arc<Recorder>, log: Arc<Log>, id: u64, nodes: Vec<SocketAddr>, seed: u64) {
    let mut rng = Rng::new(seed ^ id.rotate_left(29));
    let mut connection: Option<Client> = None;
    let mut sequence = 0i64;
    while !recorder.stop.load(Ordering::Relaxed) {
        let Some(client) = connection.as_mut() else {
            connection = connect(&nodes, &mut rng).await;
            continue;
        };
        sequence += 1;
        let broken = match Role::of(id) {
            Role::Locker => lock_once(&recorder, &log, client, id, sequence, &mut rng).await,
            Role::Producer => push_once(&recorder, &log, client, id, sequence, &mut rng).await,
            Role::Consumer => pop_once(&recorder, &log, client, id).await,
        };
        if broken {
            connection = None;
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
    }
}

/// Tries a lock; when granted, holds it a while and releases it. Whether the connection broke.
async fn lock_once(recorder: &Recorder, log: &Log, client: &mut Client, id: u64, sequence: i64, rng: &mut Rng) -> bool {
    let lock = format!("lock{}", rng.below(LOCKS));
    let token = format!("{id}-{sequence}");
    let ttl = LOCK_TTL_MS.to_string();
    let invoke_us = recorder.now_us();
    let reply = client.command(&["SET", &lock, &token, "NX", "PX", &ttl]).await;
    match reply {
        Ok(Value::Simple(ok)) if ok == "OK" => {
            let complete_us = recorder.now_us();
            let acquired = Event::Acquired {
                client: id,
                lock: lock.clone(),
                token: token.clone(),
                invoke_us,
                complete_us,
            };
            log.record(recorder, acquired, true);
        }
        Ok(Value::Bulk(None)) => {
            tokio::time::sleep(LOCK_RETRY_PAUSE).await;
            return false;
        }
        other => {
            // Maybe granted: then no one else gets it until it expires, which the checks allow.
            tokio::time::sleep(LOCK_RETRY_PAUSE).await;
            return other.is_err();
        }
    }
    tokio::time::sleep(Duration::from_millis(rng.below(LOCK_TTL_MS / 2))).await;
    let invoke_us = recorder.now_us();
    let reply = client.command(&["EVAL", RELEASE, "1", &lock, &token]).await;
    let (deleted, complete_us) = match &reply {
        Ok(Value::Integer(n)) => (Some(*n), Some(recorder.now_us())),
        _ => (None, None),
    };
    let released = Event::Released {
        client: id,
        lock,
        token,
        invoke_us,
        deleted,
        complete_us,
    };
    log.record(recorder, released, deleted.is_some());
    reply.is_err()
}

async fn push_once(recorder: &Recorder, log: &Log, client: &mut Client, id: u64, sequence: i64, rng: &mut Rng) -> bool {
    let queue = format!("queue{}", rng.below(QUEUES));
    let item = id as i64 * 1_000_000_000 + sequence;
    let reply = client.command(&["RPUSH", &queue, &item.to_string()]).await;
    let broken = reply.is_err();
    if !refused(&reply) {
        let acknowledged = matches!(reply, Ok(Value::Integer(_)));
        let pushed = Event::Pushed {
            client: id,
            queue,
            item,
            acknowledged,
        };
        log.record(recorder, pushed, acknowledged);
    }
    tokio::time::sleep(PRODUCER_PAUSE).await;
    broken
}

async fn pop_once(recorder: &Recorder, log: &Log, client: &mut Client, id: u64) -> bool {
    let queues: Vec<String> = (0..QUEUES).map(|q| format!("queue{q}")).collect();
    let mut args: Vec<&str> = vec!["BLPOP"];
    args.extend(queues.iter().map(String::as_str));
    args.push(BLPOP_TIMEOUT_SECS);
    let reply = client.command(&args).await;
    let popped = match &reply {
        Ok(Value::Array(Some(pair))) if pair.len() == 2 => match (&pair[0], &pair[1]) {
            (Value::Bulk(Some(queue)), Value::Bulk(Some(item))) => std::str::from_utf8(item)
                .ok()
                .and_then(|i| i.parse::<i64>().ok())
                .map(|item| (String::from_utf8_lossy(queue).into_owned(), item)),
            _ => None,
        },
        _ => None,
    };
    match (popped, &reply) {
        (Some((queue, item)), _) => log.record(
            recorder,
            Event::Popped {
                client: id,
                queue,
                item,
            },
            true,
        ),
        (None, Ok(Value::Array(None))) => {}
        (None, _) if refused(&reply) => {}
        (None, _) => log.record(recorder, Event::PopUnknown { client: id }, false),
    }
    reply.is_err()
}

/// After the run: what each queue still holds, read through any node that answers.
pub async fn drain(log: &Log, nodes: &[SocketAddr]) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for q in 0..QUEUES {
        let queue = format!("queue{q}");
        let items = loop {
            let mut reply = None;
            for addr in nodes {
                if let Ok(mut client) = Client::connect(*addr).await {
                    if let Ok(Value::Array(Some(items))) = client.command(&["LRANGE", &queue, "0", "-1"]).await {
                        reply = Some(items);
                        break;
                    }
                }
            }
            match reply {
                Some(items) => break items,
                None if tokio::time::Instant::now() > deadline => {
                    anyhow::bail!("no node answered LRANGE {queue} after the run")
                }
                None => tokio::time::sleep(RECONNECT_PAUSE).await,
            }
        };
        let mut events = log.events.lock().expect("idioms log");
        for item in items {
            let Value::Bulk(Some(item)) = item else {
                anyhow::bail!("{queue} holds a non-string item");
            };
            let item = std::str::from_utf8(&item)
                .ok()
                .and_then(|i| i.parse().ok())
                .with_context(|| format!("{queue} holds an item that is no number"))?;
            events.push(Event::Remaining {
                queue: queue.clone(),
                item,
            });
        }
    }
    Ok(())
}

/// What the checks found wrong (nothing: the idioms held).
pub fn check(events: &[Event]) -> Vec<String> {
    let mut violations = check_queues(events);
    violations.extend(check_locks(events));
    violations
}

fn check_queues(events: &[Event]) -> Vec<String> {
    let mut violations = Vec::new();
    let (mut pushed, mut acknowledged) = (HashSet::new(), HashSet::new());
    let mut delivered: BTreeMap<i64, usize> = BTreeMap::new();
    let mut unknown_pops = 0;
    for event in events {
        match event {
            Event::Pushed {
                item,
                acknowledged: ack,
                ..
            } => {
                pushed.insert(*item);
                if *ack {
                    acknowledged.insert(*item);
                }
            }
            Event::Popped { item, .. } | Event::Remaining { item, .. } => *delivered.entry(*item).or_default() += 1,
            Event::PopUnknown { .. } => unknown_pops += 1,
            _ => {}
        }
    }
    for (item, times) in &delivered {
        if *times > 1 {
            violations.push(format!("queue item {item} delivered {times} times"));
        }
        if !pushed.contains(item) {
            violations.push(format!("queue item {item} delivered but never pushed"));
        }
    }
    let mut lost: Vec<i64> = acknowledged
        .iter()
        .filter(|i| !delivered.contains_key(i))
        .copied()
        .collect();
    if lost.len() > unknown_pops {
        lost.sort_unstable();
        lost.truncate(10);
        violations.push(format!(
            "{} acknowledged queue items neither delivered nor left in a queue, but only {unknown_pops} pops had \
             unknown outcomes; first: {lost:?}",
            acknowledged.iter().filter(|i| !delivered.contains_key(i)).count()
        ));
    }
    violations
}

struct Hold<'a> {
    client: u64,
    token: &'a str,
    invoke_us: u64,
    complete_us: u64,
    /// The earliest it can have ended: its time to live from its request, or its release.
    earliest_end_us: u64,
}

fn check_locks(events: &[Event]) -> Vec<String> {
    let ttl_us = LOCK_TTL_MS * 1_000;
    let mut violations = Vec::new();
    let mut releases: HashMap<&str, (u64, Option<i64>, Option<u64>)> = HashMap::new();
    for event in events {
        if let Event::Released {
            token,
            invoke_us,
            deleted,
            complete_us,
            ..
        } = event
        {
            releases.insert(token.as_str(), (*invoke_us, *deleted, *complete_us));
        }
    }
    let mut holds: BTreeMap<&str, Vec<Hold>> = BTreeMap::new();
    for event in events {
        let Event::Acquired {
            client,
            lock,
            token,
            invoke_us,
            complete_us,
        } = event
        else {
            continue;
        };
        let expires_us = (invoke_us + ttl_us).saturating_sub(CLOCK_SLACK_US);
        let release = releases.get(token.as_str());
        if let Some((_, Some(0), Some(answered_us))) = release {
            if *answered_us < expires_us {
                violations.push(format!(
                    "lock {lock}: client {client}'s grant (token {token}) was gone before its time to live ran out"
                ));
            }
        }
        let earliest_end_us = release.map_or(expires_us, |(released_us, _, _)| expires_us.min(*released_us));
        holds.entry(lock).or_default().push(Hold {
            client: *client,
            token,
            invoke_us: *invoke_us,
            complete_us: *complete_us,
            earliest_end_us,
        });
    }
    for (lock, mut holds) in holds {
        holds.sort_by_key(|h| h.invoke_us);
        for (i, first) in holds.iter().enumerate() {
            for second in &holds[i + 1..] {
                if second.invoke_us >= first.earliest_end_us {
                    break;
                }
                if first.complete_us <= second.invoke_us && second.complete_us < first.earliest_end_us {
                    violations.push(format!(
                        "lock {lock}: client {} (token {}) was granted it at most {} µs into the run, while client {} \
                         (token {}) held it from at most {} µs until at least {} µs",
                        second.client,
                        second.token,
                        second.complete_us,
                        first.client,
                        first.token,
                        first.complete_us,
                        first.earliest_end_us
                    ));
                }
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquired(client: u64, token: &str, invoke_us: u64, complete_us: u64) -> Event {
        Event::Acquired {
            client,
            lock: "lock0".into(),
            token: token.into(),
            invoke_us,
            complete_us,
        }
    }

    fn released(token: &str, invoke_us: u64, deleted: Option<i64>) -> Event {
        Event::Released {
            client: 0,
            lock: "lock0".into(),
            token: token.into(),
            invoke_us,
            deleted,
            complete_us: deleted.map(|_| invoke_us + 1_000),
        }
    }

    #[test]
    fn a_lock_granted_while_another_holds_it_is_caught_and_one_granted_after_is_not() {
        let ttl_us = LOCK_TTL_MS * 1_000;
        // Granted 100 ms into the first hold, which nobody released.
        let twice = [acquired(1, "a", 0, 1_000), acquired(2, "b", 100_000, 101_000)];
        assert_eq!(check(&twice).len(), 1, "{:?}", check(&twice));
        // After its time to live, or after its release: fine.
        let after_ttl = [acquired(1, "a", 0, 1_000), acquired(2, "b", ttl_us, ttl_us + 1_000)];
        assert!(check(&after_ttl).is_empty());
        let after_release = [
            acquired(1, "a", 0, 1_000),
            released("a", 50_000, Some(1)),
            acquired(2, "b", 60_000, 61_000),
        ];
        assert!(check(&after_release).is_empty());
        // A release whose outcome is unknown may have taken effect when it was sent.
        let unknown_release = [
            acquired(1, "a", 0, 1_000),
            released("a", 50_000, None),
            acquired(2, "b", 60_000, 61_000),
        ];
        assert!(check(&unknown_release).is_empty());
        // A grant that overlaps in time with the other's request cannot be ordered: not judged.
        let concurrent = [acquired(1, "a", 0, 50_000), acquired(2, "b", 10_000, 20_000)];
        assert!(check(&concurrent).is_empty());
        // The lock gone (released 0) well before its time to live.
        let vanished = [acquired(1, "a", 0, 1_000), released("a", 100_000, Some(0))];
        assert_eq!(check(&vanished).len(), 1);
    }

    #[test]
    fn a_duplicate_or_lost_queue_item_is_caught_unless_an_unknown_pop_explains_the_loss() {
        let pushed = |item, acknowledged| Event::Pushed {
            client: 1,
            queue: "queue0".into(),
            item,
            acknowledged,
        };
        let popped = |item| Event::Popped {
            client: 2,
            queue: "queue0".into(),
            item,
        };
        let remaining = |item| Event::Remaining {
            queue: "queue0".into(),
            item,
        };
        let fine = [
            pushed(1, true),
            pushed(2, true),
            pushed(3, false),
            popped(1),
            remaining(2),
        ];
        assert!(check(&fine).is_empty());
        let twice = [pushed(1, true), popped(1), remaining(1)];
        assert_eq!(check(&twice).len(), 1);
        let lost = [pushed(1, true), pushed(2, true), popped(1)];
        assert_eq!(check(&lost).len(), 1);
        let explained = [
            pushed(1, true),
            pushed(2, true),
            popped(1),
            Event::PopUnknown { client: 2 },
        ];
        assert!(check(&explained).is_empty());
        let phantom = [popped(7)];
        assert_eq!(check(&phantom).len(), 1);
    }
}
