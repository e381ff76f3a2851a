//! Client-side caching, as Redis 6 introduced it (`CLIENT TRACKING`): a connection that turns
//! tracking on is sent an `invalidate` message for a key it read once a write to that key
//! applies on its node — or, in broadcast mode (`BCAST`), for every key written under its
//! prefixes, read or not.
//!
//! Nothing is missed between a read and a write: the raft loop records a tracked read's keys as
//! it executes the read, and sends invalidations as it applies writes, so a write applied after
//! the read finds the record and one applied before is in what the read returned. A connection
//! writes the invalidations that arrive while it works on a batch after that batch's replies,
//! so a client never sees a reply after the invalidation that makes it stale. The log is
//! applied on every node, so a client is told of writes sent to any node.

use std::collections::HashMap;

use bytes::Bytes;
use tokio::sync::mpsc::UnboundedSender;

use crate::listeners::Delivery;

/// The channel a connection that another one redirects its invalidations to subscribes to
/// (RESP2 clients, which have no push messages on the connection they read on).
pub const INVALIDATE_CHANNEL: &[u8] = b"__redis__:invalidate";

/// Keys recorded at most (Redis's `tracking-table-max-keys` default); past it, recording a key
/// invalidates another, so its readers forget it.
const MAX_TRACKED_KEYS: usize = 1_000_000;

/// What `CLIENT TRACKING ON` asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrackingOptions {
    /// The connection the invalidations go to instead (its `CLIENT ID`).
    pub redirect: Option<u64>,
    /// Every key written under `prefixes`, read or not.
    pub bcast: bool,
    /// Under BCAST, the prefixes (none: every key).
    pub prefixes: Vec<Bytes>,
    /// Only reads right after `CLIENT CACHING YES` are tracked.
    pub optin: bool,
    /// Reads right after `CLIENT CACHING NO` are not tracked.
    pub optout: bool,
}

/// `CLIENT TRACKING ON|OFF [REDIRECT id] [BCAST] [PREFIX p]... [OPTIN] [OPTOUT]`, the arguments
/// after TRACKING, given the connection's current options and whether a connection id exists:
/// `Some` options to track with from now on, `None` to stop. Refused as Redis 7.0 refuses it,
/// in the order it checks.
pub fn parse(
    args: &[Bytes],
    current: Option<&TrackingOptions>,
    connection_exists: impl Fn(u64) -> bool,
) -> Result<Option<TrackingOptions>, String> {
    let Some((switch, rest)) = args.split_first() else {
        return Err("ERR wrong number of arguments for 'client|tracking' command".into());
    };
    let on = match switch.to_ascii_lowercase().as_slice() {
        b"on" => true,
        b"off" => false,
        _ => return Err("ERR syntax error".into()),
    };
    let mut options = TrackingOptions::default();
    let mut words = rest.iter();
    while let Some(word) = words.next() {
        match word.to_ascii_lowercase().as_slice() {
            b"redirect" => {
                let id = words.next().ok_or("ERR syntax error")?;
                let id = std::str::from_utf8(id)
                    .ok()
                    .and_then(|id| id.parse().ok())
                    .ok_or("ERR value is not an integer or out of range")?;
                if !connection_exists(id) {
                    return Err("ERR The client ID you want redirect to does not exist".into());
                }
                options.redirect = Some(id);
            }
            b"bcast" => options.bcast = true,
            b"prefix" => options
                .prefixes
                .push(Bytes::copy_from_slice(words.next().ok_or("ERR syntax error")?)),
            b"optin" | b"optout" if options.optin || options.optout => {
                return Err("ERR You can't specify both OPTIN mode and OPTOUT mode".into())
            }
            b"optin" => options.optin = true,
            b"optout" => options.optout = true,
            b"noloop" => {
                return Err(
                    "ERR NOLOOP is not supported here: a node applies a write without knowing which \
                            connection sent it, so the writer is told of its own writes too"
                        .into(),
                )
            }
            _ => return Err("ERR syntax error".into()),
        }
    }
    if !on {
        return Ok(None);
    }
    if !options.bcast && !options.prefixes.is_empty() {
        return Err("ERR PREFIX option requires BCAST mode to be enabled".into());
    }
    if let Some(current) = current {
        if current.bcast != options.bcast {
            return Err(
                "ERR You can't switch BCAST mode on/off before disabling tracking for this client, \
                        and then re-enabling it with a different mode."
                    .into(),
            );
        }
    }
    if options.bcast && (options.optin || options.optout) {
        return Err("ERR OPTIN and OPTOUT are not compatible with BCAST".into());
    }
    if let Some(current) = current {
        if (options.optin && current.optout) || (options.optout && current.optin) {
            return Err(
                "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, \
                        and then re-enabling it with a different mode."
                    .into(),
            );
        }
    }
    let existing = current.map_or(&[][..], |current| &current.prefixes[..]);
    for (i, prefix) in options.prefixes.iter().enumerate() {
        let overlapping = |other: &Bytes| prefix.starts_with(other) || other.starts_with(prefix);
        let (kind, other) = match existing.iter().find(|other| overlapping(other)) {
            Some(other) => ("an existing", other),
            None => match options.prefixes[i + 1..].iter().find(|other| overlapping(other)) {
                Some(other) => ("another provided", other),
                None => continue,
            },
        };
        return Err(format!(
            "ERR Prefix '{}' overlaps with {kind} prefix '{}'. Prefixes for a single client must not overlap.",
            String::from_utf8_lossy(prefix),
            String::from_utf8_lossy(other)
        ));
    }
    // Turned on again, a BCAST connection keeps its prefixes and adds these.
    options.prefixes.extend(existing.iter().cloned());
    options.prefixes.sort();
    Ok(Some(options))
}

/// A node's tracked connections and what each is to be told of.
#[derive(Default)]
pub struct Table {
    clients: HashMap<u64, Tracker>,
    /// Key → the connections that read it since it was last written (not BCAST).
    keys: HashMap<Bytes, Vec<u64>>,
    /// (prefix, connection) of the BCAST connections; an empty prefix covers every key.
    prefixes: Vec<(Bytes, u64)>,
}

struct Tracker {
    /// The connection's own deliveries.
    to: UnboundedSender<Delivery>,
    redirect: Option<u64>,
}

/// Invalidations to send: to whom (the tracking connection, or the one it redirects to), and
/// the keys (`None`: every key).
pub type Invalidations = Vec<(Target, Option<Vec<Bytes>>)>;

/// Where a tracking connection's invalidations go.
#[derive(Clone, Debug)]
pub enum Target {
    Own(UnboundedSender<Delivery>),
    /// The connection with this id, if it is subscribed to `INVALIDATE_CHANNEL`.
    Redirect(u64),
}

impl Table {
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Connection `id` is tracked from now on (again, with these options, if it was).
    pub fn turn_on(&mut self, id: u64, to: UnboundedSender<Delivery>, options: &TrackingOptions) {
        self.turn_off(id);
        self.clients.insert(
            id,
            Tracker {
                to,
                redirect: options.redirect,
            },
        );
        if options.bcast {
            if options.prefixes.is_empty() {
                self.prefixes.push((Bytes::new(), id));
            }
            for prefix in &options.prefixes {
                self.prefixes.push((prefix.clone(), id));
            }
            // Redis tells a connection of its prefixes' keys in the prefixes' order.
            self.prefixes.sort();
        }
    }

    /// Connection `id` is no longer tracked; the keys it read are forgotten lazily (a write to
    /// one finds no one to tell).
    pub fn turn_off(&mut self, id: u64) {
        if self.clients.remove(&id).is_some() {
            self.prefixes.retain(|(_, client)| *client != id);
        }
    }

    /// Connection `id` read `keys`: it is told of the next write to each. What recording them
    /// made the table forget, to send.
    pub fn read(&mut self, id: u64, keys: &[Bytes]) -> Invalidations {
        if !self.clients.contains_key(&id) {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        for key in keys {
            if let Some(readers) = self.keys.get_mut(key) {
                if !readers.contains(&id) {
                    readers.push(id);
                }
                continue;
            }
            if self.keys.len() >= MAX_TRACKED_KEYS {
                let victim = self.keys.keys().next().expect("the table is full").clone();
                for reader in self.keys.remove(&victim).into_iter().flatten() {
                    if let Some(target) = self.target(reader) {
                        evicted.push((target, Some(vec![victim.clone()])));
                    }
                }
            }
            self.keys.insert(key.clone(), vec![id]);
        }
        evicted
    }

    /// A write to `keys` applied: whom to tell of what, as Redis tells it — a reader one
    /// message per key, a BCAST connection one per prefix with the keys under it.
    pub fn written(&mut self, keys: &[Bytes]) -> Invalidations {
        let mut told = Vec::new();
        for key in keys {
            for reader in self.keys.remove(key).into_iter().flatten() {
                told.extend(self.target(reader).map(|target| (target, Some(vec![key.clone()]))));
            }
        }
        for (prefix, client) in &self.prefixes {
            let mut under: Vec<Bytes> = Vec::new();
            for key in keys.iter().filter(|key| key.starts_with(prefix)) {
                if !under.contains(key) {
                    under.push(key.clone());
                }
            }
            if !under.is_empty() {
                told.extend(self.target(*client).map(|target| (target, Some(under))));
            }
        }
        told
    }

    /// Every key changed at once (FLUSHALL, a script, a snapshot installed): every tracked
    /// connection forgets all it cached.
    pub fn everything_written(&mut self) -> Invalidations {
        self.keys.clear();
        let ids: Vec<u64> = self.clients.keys().copied().collect();
        ids.into_iter()
            .filter_map(|id| Some((self.target(id)?, None)))
            .collect()
    }

    fn target(&self, id: u64) -> Option<Target> {
        let tracker = self.clients.get(&id)?;
        Some(match tracker.redirect {
            Some(to) => Target::Redirect(to),
            None => Target::Own(tracker.to.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args_of as words;

    #[test]
    fn tracking_options_are_parsed_and_refused_as_redis_refuses_them() {
        let parse = |args: &str, current: Option<&TrackingOptions>| parse(&words(args), current, |id| id == 7);
        assert_eq!(parse("on", None), Ok(Some(TrackingOptions::default())));
        assert_eq!(parse("OFF", None), Ok(None));
        let bcast = parse("on bcast prefix user: prefix job: redirect 7", None)
            .unwrap()
            .unwrap();
        assert_eq!(bcast.prefixes, words("job: user:"), "in order, as Redis lists them");
        assert_eq!((bcast.bcast, bcast.redirect), (true, Some(7)));
        let more = parse("on bcast prefix task:", Some(&bcast)).unwrap().unwrap();
        assert_eq!(more.prefixes, words("job: task: user:"));
        for (args, current, error) in [
            ("maybe", None, "ERR syntax error"),
            (
                "on prefix a",
                None,
                "ERR PREFIX option requires BCAST mode to be enabled",
            ),
            (
                "on optin optout",
                None,
                "ERR You can't specify both OPTIN mode and OPTOUT mode",
            ),
            (
                "on bcast optin",
                None,
                "ERR OPTIN and OPTOUT are not compatible with BCAST",
            ),
            ("on redirect x", None, "ERR value is not an integer or out of range"),
            (
                "on redirect 8",
                None,
                "ERR The client ID you want redirect to does not exist",
            ),
            ("on redirect", None, "ERR syntax error"),
            (
                "on bcast prefix ab prefix a",
                None,
                "ERR Prefix 'ab' overlaps with another provided prefix 'a'",
            ),
            (
                "on bcast prefix user:1",
                Some(&bcast),
                "ERR Prefix 'user:1' overlaps with an existing prefix 'user:'",
            ),
            (
                "on bcast optin",
                Some(&TrackingOptions::default()),
                "ERR You can't switch BCAST mode",
            ),
            ("on noloop", None, "ERR NOLOOP is not supported here"),
        ] {
            let refused = parse(args, current).unwrap_err();
            assert!(refused.starts_with(error), "{args}: {refused}");
        }
    }

    fn told(invalidations: Invalidations) -> Vec<Option<Vec<Bytes>>> {
        invalidations.into_iter().map(|(_, keys)| keys).collect()
    }

    #[test]
    fn a_reader_is_told_once_of_the_next_write_to_what_it_read_and_a_broadcast_client_of_every_write_under_its_prefix()
    {
        let mut table = Table::default();
        let (to, _deliveries) = tokio::sync::mpsc::unbounded_channel();
        table.turn_on(1, to.clone(), &TrackingOptions::default());
        assert!(told(table.read(1, &words("a b"))).is_empty());
        assert!(told(table.read(2, &words("c"))).is_empty(), "2 does not track");
        table.read(1, &words("c"));
        assert_eq!(
            told(table.written(&words("a c"))),
            vec![Some(words("a")), Some(words("c"))]
        );
        assert!(table.written(&words("a")).is_empty(), "told once, until it reads again");
        let bcast = TrackingOptions {
            bcast: true,
            prefixes: words("user:"),
            ..TrackingOptions::default()
        };
        table.turn_on(3, to, &bcast);
        assert_eq!(told(table.written(&words("user:1 job:1"))), vec![Some(words("user:1"))]);
        let mut everyone = told(table.everything_written());
        everyone.sort();
        assert_eq!(everyone, vec![None, None]);
        assert!(table.written(&words("b")).is_empty(), "a flush forgets what was read");
        table.turn_off(3);
        assert!(table.written(&words("user:2")).is_empty());
        assert!(!table.is_empty());
        table.turn_off(1);
        assert!(table.is_empty());
    }
}
