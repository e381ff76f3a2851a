//! What a node's connections wait for from the log as it applies: pub/sub messages, and
//! writes to the keys a blocked command (BLPOP & co.) waits on.
//!
//! PUBLISH is a write, so the log puts each channel's messages in one order; every node, as it
//! applies one, hands it to its own subscribers through this hub. A subscriber therefore gets
//! the messages of a channel in log order, whichever node it and the publishers are connected
//! to, at most once (a node that restarts does not replay old messages to new subscribers; it
//! has none while it replays). Keyspace notifications (`keyspace_events`) reach subscribers the
//! same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chorus_resp::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;

use crate::glob::glob_match;

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
}

impl Delivery {
    /// The frame Redis sends for it (a push in RESP3, an array in RESP2).
    pub fn frame(self) -> Value {
        match self {
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
        }
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
}

#[derive(Default)]
struct Subscriptions {
    channels: HashMap<Bytes, Subscribers>,
    patterns: HashMap<Bytes, Subscribers>,
}

impl Hub {
    /// Subscribes connection `id` to a channel (`pattern`: a glob of channels); whether it was
    /// not subscribed already.
    pub fn subscribe(&self, id: u64, name: Bytes, pattern: bool, to: UnboundedSender<Delivery>) -> bool {
        let mut inner = self.inner.lock().expect("pubsub lock");
        let map = if pattern {
            &mut inner.patterns
        } else {
            &mut inner.channels
        };
        let subscribers = map.entry(name).or_default();
        if subscribers.is_empty() {
            self.subscription_count.fetch_add(1, Ordering::Relaxed);
        }
        subscribers.insert(id, to).is_none()
    }

    pub fn unsubscribe(&self, id: u64, name: &[u8], pattern: bool) {
        let mut inner = self.inner.lock().expect("pubsub lock");
        let map = if pattern {
            &mut inner.patterns
        } else {
            &mut inner.channels
        };
        if let Some(subscribers) = map.get_mut(name) {
            subscribers.remove(&id);
            if subscribers.is_empty() {
                map.remove(name);
                self.subscription_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Hands a published message to this node's subscribers; how many receive it (a connection
    /// subscribed to the channel and to a matching pattern counts, and receives it, twice).
    pub fn publish(&self, channel: &Bytes, payload: &Bytes) -> usize {
        let inner = self.inner.lock().expect("pubsub lock");
        let mut receivers = 0;
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

    /// PUBSUB CHANNELS: the channels with a subscriber here, those matching `pattern` if given.
    pub fn channels(&self, pattern: Option<&[u8]>) -> Vec<Bytes> {
        let inner = self.inner.lock().expect("pubsub lock");
        let mut channels: Vec<Bytes> = inner
            .channels
            .keys()
            .filter(|c| pattern.is_none_or(|p| glob_match(p, c, false)))
            .cloned()
            .collect();
        channels.sort();
        channels
    }

    /// PUBSUB NUMSUB: subscribers here of `channel`.
    pub fn subscribers(&self, channel: &[u8]) -> usize {
        let inner = self.inner.lock().expect("pubsub lock");
        inner.channels.get(channel).map_or(0, HashMap::len)
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
        assert!(hub.subscribe(1, Bytes::from("news"), false, to_a.clone()));
        assert!(!hub.subscribe(1, Bytes::from("news"), false, to_a));
        assert!(hub.subscribe(2, Bytes::from("n*"), true, to_b.clone()));
        assert!(hub.subscribe(2, Bytes::from("sport"), false, to_b));
        assert_eq!(hub.publish(&Bytes::from("news"), &Bytes::from("hi")), 2);
        assert_eq!(
            a.try_recv().unwrap(),
            Delivery::Message {
                channel: Bytes::from("news"),
                payload: Bytes::from("hi")
            }
        );
        assert!(matches!(b.try_recv().unwrap(), Delivery::PatternMessage { .. }));
        assert!(b.try_recv().is_err(), "not subscribed to news itself");
        hub.unsubscribe(1, b"news", false);
        assert_eq!(hub.publish(&Bytes::from("news"), &Bytes::from("again")), 1);
        assert_eq!(hub.channels(None), vec![Bytes::from("sport")]);
        assert_eq!((hub.subscribers(b"sport"), hub.patterns()), (1, 1));
        assert!(hub.any_subscribed());
        hub.unsubscribe(2, b"sport", false);
        hub.unsubscribe(2, b"n*", true);
        assert!(!hub.any_subscribed());
    }
}
