//! What a CURP leader has proposed but not yet applied, so that it answers a write before the
//! write commits only when the answer cannot change: no proposed-but-unapplied command touches
//! the write's keys, and the client's own earlier writes — proposed, not yet applied — will all
//! have executed by then (RIFL executes a client's writes in sequence order).
//!
//! The leader tells it about every command joining its log, in log order (`proposed`), and it
//! forgets each entry's commands as the entry applies (`applied_through`). A node that stops
//! being leader forgets everything (`clear`).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use chorus_curp::rifl::ClientId;

#[derive(Default)]
pub struct Proposed {
    /// Each key a proposed command touches, and the index of the last entry touching it.
    keys: HashMap<Bytes, u64>,
    /// Each client with proposed writes: the sequence number its next write must carry once
    /// they have applied, and the index of the last entry holding one of them.
    clients: HashMap<ClientId, (u64, u64)>,
    /// By entry: the keys and clients it noted, to forget when it applies.
    by_entry: BTreeMap<u64, (Vec<Bytes>, Vec<ClientId>)>,
    /// The last entry holding a command that touches every key (FLUSHALL), until it applies.
    every_key_until: Option<u64>,
}

impl Proposed {
    pub fn is_empty(&self) -> bool {
        self.by_entry.is_empty()
    }

    /// Whether a proposed, unapplied command touches any of `keys`.
    pub fn touches(&self, keys: &[Bytes]) -> bool {
        self.every_key_until.is_some() || keys.iter().any(|k| self.keys.contains_key(k))
    }

    /// A command at `index` touches every key.
    pub fn note_every_key(&mut self, index: u64) {
        self.every_key_until = Some(index);
        self.by_entry.entry(index).or_default();
    }

    /// The sequence number `client`'s next write carries to execute once the client's proposed
    /// writes have applied; `None` if it has none proposed.
    pub fn next_seq(&self, client: ClientId) -> Option<u64> {
        self.clients.get(&client).map(|(next, _)| *next)
    }

    /// A command at `index` touches `keys`; for a client's write, `next_seq` is what its next
    /// write must carry once this one has applied.
    pub fn note(&mut self, index: u64, keys: Vec<Bytes>, client: Option<(ClientId, u64)>) {
        if let Some((last, _)) = self.by_entry.last_key_value() {
            assert!(*last <= index, "commands join the log in index order");
        }
        for key in &keys {
            self.keys.insert(key.clone(), index);
        }
        let noted = self.by_entry.entry(index).or_default();
        noted.0.extend(keys);
        if let Some((client, next_seq)) = client {
            self.clients.insert(client, (next_seq, index));
            noted.1.push(client);
        }
    }

    /// Every entry up to `index` has applied.
    pub fn applied_through(&mut self, index: u64) {
        if self.every_key_until.is_some_and(|until| until <= index) {
            self.every_key_until = None;
        }
        while let Some(entry) = self.by_entry.first_entry() {
            if *entry.key() > index {
                break;
            }
            let (at, (keys, clients)) = entry.remove_entry();
            for key in keys {
                if self.keys.get(&key) == Some(&at) {
                    self.keys.remove(&key);
                }
            }
            for client in clients {
                if self.clients.get(&client).is_some_and(|(_, last)| *last == at) {
                    self.clients.remove(&client);
                }
            }
        }
    }

    pub fn clear(&mut self) {
        *self = Proposed::default();
    }
}
