//! Keyspace notifications (Redis's `notify-keyspace-events`): as a node applies a write, it
//! publishes what the write did to each key, to this node's own subscribers, on
//! `__keyspace@0__:<key>` (the event as the message) and `__keyevent@0__:<event>` (the key).
//!
//! The setting is a write (`CONFIG SET notify-keyspace-events`), so every node notifies alike
//! from the same entry on, and it survives restarts and snapshots. Events come from the applied
//! log, in its order, like PUBLISH; key-miss events (`m`) would come from reads, which do not go
//! through the log, and are never sent.

use bytes::Bytes;

pub const GENERIC: u16 = 1 << 0;
pub const STRING: u16 = 1 << 1;
pub const LIST: u16 = 1 << 2;
pub const SET: u16 = 1 << 3;
pub const HASH: u16 = 1 << 4;
pub const ZSET: u16 = 1 << 5;
pub const EXPIRED: u16 = 1 << 6;
pub const EVICTED: u16 = 1 << 7;
pub const STREAM: u16 = 1 << 8;
pub const MODULE: u16 = 1 << 9;
pub const NEW: u16 = 1 << 10;
pub const KEYSPACE: u16 = 1 << 11;
pub const KEYEVENT: u16 = 1 << 12;
pub const KEY_MISS: u16 = 1 << 13;
/// What `A` stands for (not `n` or `m`).
const ALL: u16 = GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE;

/// Each class's character, in the order Redis writes them.
const CLASSES: [(u8, u16); 11] = [
    (b'g', GENERIC),
    (b'$', STRING),
    (b'l', LIST),
    (b's', SET),
    (b'h', HASH),
    (b'z', ZSET),
    (b'x', EXPIRED),
    (b'e', EVICTED),
    (b't', STREAM),
    (b'd', MODULE),
    (b'n', NEW),
];

/// The flags a `notify-keyspace-events` string sets, or Redis's error for a character it does
/// not know.
pub fn parse(text: &[u8]) -> Result<u16, String> {
    let mut flags = 0;
    for c in text {
        flags |= match c {
            b'A' => ALL,
            b'K' => KEYSPACE,
            b'E' => KEYEVENT,
            b'm' => KEY_MISS,
            c => match CLASSES.iter().find(|(name, _)| name == c) {
                Some((_, class)) => *class,
                None => {
                    return Err(
                        "ERR CONFIG SET failed (possibly related to argument 'notify-keyspace-events') - \
                         Invalid event class character. Use 'Ag$lshzxeKEtmdn'."
                            .to_string(),
                    )
                }
            },
        };
    }
    Ok(flags)
}

/// The flags as CONFIG GET shows them, as Redis writes them (`A` for all of its classes, and
/// then, like Redis, without `n`).
pub fn render(flags: u16) -> String {
    let mut text = String::new();
    if flags & ALL == ALL {
        text.push('A');
    } else {
        for (name, class) in CLASSES {
            if flags & class != 0 {
                text.push(name as char);
            }
        }
    }
    for (name, class) in [('K', KEYSPACE), ('E', KEYEVENT), ('m', KEY_MISS)] {
        if flags & class != 0 {
            text.push(name);
        }
    }
    text
}

/// Whether `flags` send events of `class` at all.
pub fn sends(flags: u16, class: u16) -> bool {
    flags & class != 0 && flags & (KEYSPACE | KEYEVENT) != 0
}

/// The (channel, message) pairs an event is published as.
pub fn messages(flags: u16, event: &str, key: &Bytes) -> Vec<(Bytes, Bytes)> {
    let mut out = Vec::with_capacity(2);
    if flags & KEYSPACE != 0 {
        let mut channel = b"__keyspace@0__:".to_vec();
        channel.extend_from_slice(key);
        out.push((Bytes::from(channel), Bytes::copy_from_slice(event.as_bytes())));
    }
    if flags & KEYEVENT != 0 {
        out.push((Bytes::from(format!("__keyevent@0__:{event}")), key.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_read_and_print_as_redis_does() {
        for (given, shown) in [
            ("KEA", "AKE"),
            ("KEAnm", "AKEm"),
            ("Kg$", "g$K"),
            ("", ""),
            ("Elzx", "lzxE"),
        ] {
            assert_eq!(render(parse(given.as_bytes()).unwrap()), shown, "{given}");
        }
        assert!(parse(b"KEX").unwrap_err().contains("Invalid event class character"));
        assert!(sends(parse(b"Kl").unwrap(), LIST));
        assert!(!sends(parse(b"A").unwrap(), LIST), "neither K nor E");
        assert!(!sends(parse(b"KEl").unwrap(), SET));
    }

    #[test]
    fn an_event_goes_to_its_key_and_its_event_channels() {
        let key = Bytes::from("k:1");
        assert_eq!(
            messages(parse(b"KEA").unwrap(), "set", &key),
            vec![
                (Bytes::from("__keyspace@0__:k:1"), Bytes::from("set")),
                (Bytes::from("__keyevent@0__:set"), key.clone()),
            ]
        );
        assert_eq!(messages(parse(b"E$").unwrap(), "set", &key).len(), 1);
    }
}
