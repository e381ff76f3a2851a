//! What a node's connections wait for from the log as it applies: pub/sub messages, writes to
//! the keys a blocked command (BLPOP & co.) waits on, and invalidations of what a client caches
//! (`tracking`).
//!
//! PUBLISH is a write, so the log puts each channel's messages in one order; every node, as it
//! applies one, hands it to its own subscribers through this hub. A subscriber therefore gets
//! the messages of a channel in log order, whichever node it and the publishers are connected
//! to, at most once (a node that restarts does not replay old messages to new subscribers; it
//! has none while it replays). Keyspace notifications (`keyspace_events`) reach subscribers the
//! same way. Shard channels (SSUBSCRIBE, SPUBLISH; Redis 7) are a namespace of their own, as
//! on a Redis that is not a cluster: their messages reach only their own subscribers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chorus_resp::{Protocol, Value};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;

use crate::glob::glob_match;
use crate::tracking::{self, Invalidations, Target, TrackingOptions, INVALIDATE_CHANNEL};

/// What a subscribed connection is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Message {
        channel: Bytes,
        payload: Bytes,
    },
    PatternMessage {
        pattern: Bytes,
        channel: Bytes,
        payload: Bytes,
    },
    ShardMessage {
        channel: Bytes,
        payload: Bytes,
    },
    /// Forget these cached keys (`None`: every key); see `tracking`.
    Invalidate(Option<Vec<Bytes>>),
}

/// What a connection subscribes to: a channel, a pattern of channels, or a shard channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscription {
    Channel,
    Pattern,
    ShardChannel,
}

impl Delivery {
    /// The frame Redis sends for it (a push in RESP3, an array in RESP2), if any: an
    /// invalidation reaches a RESP2 connection only as a message of `INVALIDATE_CHANNEL`, so
    /// only if it subscribed to that (`invalidations_subscribed`).
    pub fn frame(self, protocol: Protocol, invalidations_subscribed: bool) -> Option<Value> {
        Some(match self {
            Delivery::Message { channel, payload } => {
                Value::Push(vec![Value::bulk("message"), Value::bulk(channel), Value::bulk(payload)])
            }
            Delivery::PatternMessage {
                pattern,
                channel,
                payload,
            } => Value::Push(vec![
                Value::bulk("pmessage"),
                Value::bulk(pattern),
                Value::bulk(channel),
                Value::bulk(payload),
            ]),
            Delivery::ShardMessage { channel, payload } => Value::Push(vec![
                Value::bulk("smessage"),
                Value::bulk(channel),
                Value::bulk(payload),
            ]),
            Delivery::Invalidate(keys) => {
                let keys = Value::Array(keys.map(|keys| keys.into_iter().map(|k| Value::Bulk(Some(k))).collect()));
                match protocol {
                    Protocol::Resp3 => Value::Push(vec![Value::bulk("invalidate"), keys]),
                    Protocol::Resp2 if invalidations_subscribed => Value::Push(vec![
                        Value::bulk("message"),
                        Value::bulk(Bytes::from_static(INVALIDATE_CHANNEL)),
                        keys,
                    ]),
                    Protocol::Resp2 => return None,
                }
            }
        })
    }
}

type Subscribers = HashMap<u64, UnboundedSender<Delivery>>;

/// This node's subscriptions: channel (or pattern) → connection id → where to send; and its
/// blocked connections: key → connection id → what wakes it.
#[derive(Default)]
pub struct Hub {
    inner: Mutex<Subscriptions>,
    blocked: Mutex<HashMap<Bytes, HashMap<u64, Arc<Notify>>>>,
    /// Blocked connections, so that applying a write costs one load when none are.
    blocked_count: AtomicUsize,
    /// Channels and patterns with a subscriber here, so that a write with keyspace
    /// notifications on costs one load when no one listens.
    subscription_count: AtomicUsize,
    /// The `notify-keyspace-events` flags as this node last applied them, for CONFIG GET.
    keyspace_flags: AtomicU16,
    tracking: Mutex<tracking::Table>,
    /// Whether any connection tracks, so that applying a write costs one load when none does.
    any_tracking: AtomicBool,
}

#[derive(Default)]
struct Subscriptions {
    channels: HashMap<Bytes, Subscribers>,
    patterns: HashMap<Bytes, Subscribers>,
    shard_channels: HashMap<Bytes, Subscribers>,
}

impl Subscriptions {
    fn of(&mut self, kind: Subscription) -> &mut HashMap<Bytes, Subscribers> {
        match kind {
            Subscription::Channel => &mut self.channels,
            Subscription::Pattern => &mut self.patterns,
            Subscription::ShardChannel => &mut self.shard_channels,
        }
    }
}

impl Hub {
    /// Subscribes connection `id` to a channel, a glob of channels or a shard channel; whether
    /// it was not subscribed already.
    pub fn subscribe(&self, id: u64, name: Bytes, kind: Subscription, to: UnboundedSender<Delivery>) -> bool {
        let mut inner = self.inner.lock().expect("pubsub lock");
        let subscribers = inner.of(kind).entry(name).or_default();
        if subscribers.is_empty() {
            self.subscription_count.fetch_add(1, Ordering::Relaxed);
        }
        subscribers.insert(id, to).is_none()
    }

    pub fn unsubscribe(&self, id: u64, name: &[u8], kind: Subscription) {
        let mut inner = self.inner.lock().expect("pubsub lock");
        let map = inner.of(kind);
        if let Some(subscribers) = map.get_mut(name) {
            subscribers.remove(&id);
            if subscribers.is_empty() {
                map.remove(name);
                self.subscription_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Hands a published message to this node's subscribers; how many receive it (a connection
    /// subscribed to the channel and to a matching pattern counts, and receives it, twice). A
    /// message to a shard channel (`sharded`) reaches that shard channel's subscribers alone.
    pub fn publish(&self, channel: &Bytes, payload: &Bytes, sharded: bool) -> usize {
        let inner = self.inner.lock().expect("pubsub lock");
        let mut receivers = 0;
        if sharded {
            for to in inner.shard_channels.get(channel).into_iter().flat_map(HashMap::values) {
                let message = Delivery::ShardMessage {
                    channel: channel.clone(),
                    payload: payload.clone(),
                };
                receivers += usize::from(to.send(message).is_ok());
            }
            return receivers;
        }
        if let Some(subscribers) = inner.channels.get(channel) {
            for to in subscribers.values() {
                let message = Delivery::Message {
                    channel: channel.clone(),
                    payload: payload.clone(),
                };
                receivers += usize::from(to.send(message).is_ok());
            }
        }
        for (pattern, subscribers) in &inner.patterns {
            if !glob_match(pattern, channel, false) {
                continue;
            }
            for to in subscribers.values() {
                let message = Delivery::PatternMessage {
                    pattern: pattern.clone(),
                    channel: channel.clone(),
                    payload: payload.clone(),
                };
                receivers += usize::from(to.send(message).is_ok());
            }
        }
        receivers
    }

    /// Connection `id` waits for writes to `keys`; `wake` is notified when one applies here.
    pub fn block(&self, id: u64, keys: &[Bytes], wake: Arc<Notify>) {
        let mut blocked = self.blocked.lock().expect("blocked lock");
        for key in keys {
            blocked.entry(key.clone()).or_default().insert(id, wake.clone());
        }
        self.blocked_count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn unblock(&self, id: u64, keys: &[Bytes]) {
        let mut blocked = self.blocked.lock().expect("blocked lock");
        for key in keys {
            if let Some(waiting) = blocked.get_mut(key) {
                waiting.remove(&id);
                if waiting.is_empty() {
                    blocked.remove(key);
                }
            }
        }
        self.blocked_count.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn any_subscribed(&self) -> bool {
        self.subscription_count.load(Ordering::Relaxed) > 0
    }

    pub fn keyspace_flags(&self) -> u16 {
        self.keyspace_flags.load(Ordering::Relaxed)
    }

    pub fn set_keyspace_flags(&self, flags: u16) {
        self.keyspace_flags.store(flags, Ordering::Relaxed);
    }

    pub fn any_blocked(&self) -> bool {
        self.blocked_clients() > 0
    }

    /// Connections waiting in a blocking command (BLPOP, BZMPOP, …).
    pub fn blocked_clients(&self) -> usize {
        self.blocked_count.load(Ordering::Relaxed)
    }

    /// A write to `key` applied here: every connection blocked on it looks again (each its own
    /// permit, so a wake-up that comes while one is not yet waiting is kept for it).
    pub fn key_written(&self, key: &[u8]) {
        if let Some(waiting) = self.blocked.lock().expect("blocked lock").get(key) {
            for wake in waiting.values() {
                wake.notify_one();
            }
        }
    }

    /// PUBSUB CHANNELS (or SHARDCHANNELS, `kind`): the channels with a subscriber here, those
    /// matching `pattern` if given.
    pub fn channels(&self, kind: Subscription, pattern: Option<&[u8]>) -> Vec<Bytes> {
        let mut inner = self.inner.lock().expect("pubsub lock");
        let mut channels: Vec<Bytes> = inner
            .of(kind)
            .keys()
            .filter(|c| pattern.is_none_or(|p| glob_match(p, c, false)))
            .cloned()
            .collect();
        channels.sort();
        channels
    }

    /// PUBSUB NUMSUB (or SHARDNUMSUB, `kind`): subscribers here of `channel`.
    pub fn subscribers(&self, kind: Subscription, channel: &[u8]) -> usize {
        let mut inner = self.inner.lock().expect("pubsub lock");
        inner.of(kind).get(channel).map_or(0, HashMap::len)
    }

    /// Connection `id` is told of writes to what it reads from now on, through `to` (see
    /// `tracking`).
    pub fn track(&self, id: u64, to: UnboundedSender<Delivery>, options: &TrackingOptions) {
        let mut table = self.tracking.lock().expect("tracking lock");
        table.turn_on(id, to, options);
        self.any_tracking.store(true, Ordering::Relaxed);
    }

    pub fn untrack(&self, id: u64) {
        let mut table = self.tracking.lock().expect("tracking lock");
        table.turn_off(id);
        self.any_tracking.store(!table.is_empty(), Ordering::Relaxed);
    }

    pub fn any_tracking(&self) -> bool {
        self.any_tracking.load(Ordering::Relaxed)
    }

    /// Connection `id` read `keys` (on the raft loop, as the read executed).
    pub fn tracked_read(&self, id: u64, keys: &[Bytes]) {
        let evicted = self.tracking.lock().expect("tracking lock").read(id, keys);
        self.invalidate(evicted);
    }

    /// A write to `keys` applied here.
    pub fn keys_written(&self, keys: &[Bytes]) {
        let told = self.tracking.lock().expect("tracking lock").written(keys);
        self.invalidate(told);
    }

    /// Every key may have changed (FLUSHALL, a script, a snapshot installed).
    pub fn everything_written(&self) {
        let told = self.tracking.lock().expect("tracking lock").everything_written();
        self.invalidate(told);
    }

    fn invalidate(&self, invalidations: Invalidations) {
        if invalidations.is_empty() {
            return;
        }
        let inner = self.inner.lock().expect("pubsub lock");
        let redirected = inner.channels.get(INVALIDATE_CHANNEL);
        for (target, keys) in invalidations {
            let to = match &target {
                Target::Own(to) => Some(to),
                Target::Redirect(id) => redirected.and_then(|subscribers| subscribers.get(id)),
            };
            if let Some(to) = to {
                let _ = to.send(Delivery::Invalidate(keys));
            }
        }
    }

    /// PUBSUB NUMPAT: patterns subscribed here.
    pub fn patterns(&self) -> usize {
        self.inner.lock().expect("pubsub lock").patterns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reaches_channel_and_matching_pattern_subscribers_and_no_one_else() {
        let hub = Hub::default();
        let (to_a, mut a) = tokio::sync::mpsc::unbounded_channel();
        let (to_b, mut b) = tokio::sync::mpsc::unbounded_channel();
        use Subscription::{Channel, Pattern, ShardChannel};
        assert!(hub.subscribe(1, Bytes::from("news"), Channel, to_a.clone()));
        assert!(!hub.subscribe(1, Bytes::from("news"), Channel, to_a.clone()));
        assert!(hub.subscribe(2, Bytes::from("n*"), Pattern, to_b.clone()));
        assert!(hub.subscribe(2, Bytes::from("sport"), Channel, to_b));
        assert!(hub.subscribe(1, Bytes::from("news"), ShardChannel, to_a));
        assert_eq!(hub.publish(&Bytes::from("news"), &Bytes::from("hi"), false), 2);
        assert_eq!(
            a.try_recv().unwrap(),
            Delivery::Message {
                channel: Bytes::from("news"),
                payload: Bytes::from("hi")
            }
        );
        assert!(matches!(b.try_recv().unwrap(), Delivery::PatternMessage { .. }));
        assert!(b.try_recv().is_err(), "not subscribed to news itself");
        assert!(
            a.try_recv().is_err(),
            "a channel's message does not reach its shard channel"
        );
        assert_eq!(hub.publish(&Bytes::from("news"), &Bytes::from("sharded"), true), 1);
        assert!(matches!(a.try_recv().unwrap(), Delivery::ShardMessage { .. }));
        assert!(b.try_recv().is_err(), "a shard channel's message matches no pattern");
        hub.unsubscribe(1, b"news", Channel);
        assert_eq!(hub.publish(&Bytes::from("news"), &Bytes::from("again"), false), 1);
        assert_eq!(hub.channels(Channel, None), vec![Bytes::from("sport")]);
        assert_eq!(hub.channels(ShardChannel, None), vec![Bytes::from("news")]);
        assert_eq!((hub.subscribers(Channel, b"sport"), hub.patterns()), (1, 1));
        assert!(hub.any_subscribed());
        hub.unsubscribe(2, b"sport", Channel);
        hub.unsubscribe(2, b"n*", Pattern);
        hub.unsubscribe(1, b"news", ShardChannel);
        assert!(!hub.any_subscribed());
    }
}
