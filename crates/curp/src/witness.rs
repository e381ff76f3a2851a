//! A CURP witness (Park and Ousterhout, "Exploiting Commutativity For Practical Fast
//! Replication", NSDI'19): an unordered set of writes, each of which commutes with every other it
//! holds. A client that has its write accepted by a superquorum of witnesses and a speculative
//! reply from the leader is done in one round trip; if the leader then fails, the next one
//! replays what enough witnesses hold.
//!
//! The rules that keep an acknowledged fast-path write from being lost:
//!
//! - **Commutativity.** A record is accepted only if its keys are disjoint from every held
//!   record's keys, so recovery may replay the records it finds in any order. The check and the
//!   insert are one step (`&mut self`).
//! - **Terms.** A record names the term of the leader it was sent to. Once a new leader has
//!   collected this witness's pool for its term ([`Witness::collect`]), records for older terms
//!   are refused: an old leader that does not know it was deposed cannot complete a write behind
//!   the recovery's back.
//! - **Quorums.** With `f` tolerated failures a fast path needs
//!   [`superquorum`]`(f) = f + ⌈f/2⌉ + 1` acceptances; recovery collects `f + 1` pools and replays
//!   every record found in at least [`recovery_quorum`]`(f) = ⌈f/2⌉ + 1` of them. Any `f + 1` pools
//!   include at least `⌈f/2⌉ + 1` of a superquorum, so every completed write is found; and two
//!   records that each appear in `⌈f/2⌉ + 1` of `f + 1` pools share a pool, so they commute.
//! - **Order within a client.** Recovery replays a client's records in sequence order (RIFL
//!   refuses a write whose predecessor has not executed).
//!
//! A record leaves the witness when its node applies the write (it is committed, so the log keeps
//! it), or when a recovery that superseded its term has finished ([`Witness::reset`]). A record
//! that arrives after its write applied here (its request overtaken by the replication) is
//! accepted without being held: the log already keeps the write.
//! Persistence is the owner's: every change is an [`Event`] it appends to a file and syncs before
//! answering, and replays with [`Witness::replay`] on start-up.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use bytes::Bytes;

use crate::rifl::ClientId;

/// One write as a witness holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub client: ClientId,
    pub seq: u64,
    /// The term of the leader the write was sent to.
    pub term: u64,
    /// The keys the write touches, sorted and distinct: records commute when theirs are disjoint.
    keys: Vec<Bytes>,
    /// The write as the log holds it, which recovery proposes again.
    pub command: Bytes,
}

impl Record {
    /// A record of `command`, which touches `keys` (in any order, repeats allowed: `MSET a 1 a 2`).
    pub fn new(client: ClientId, seq: u64, term: u64, mut keys: Vec<Bytes>, command: Bytes) -> Record {
        keys.sort_unstable();
        keys.dedup();
        Record {
            client,
            seq,
            term,
            keys,
            command,
        }
    }

    pub fn keys(&self) -> &[Bytes] {
        &self.keys
    }

    pub fn id(&self) -> (ClientId, u64) {
        (self.client, self.seq)
    }

    fn size_bytes(&self) -> usize {
        self.command.len() + self.keys.iter().map(Bytes::len).sum::<usize>()
    }
}

/// Acceptances a fast-path write needs with `f` failures tolerated: all 3 of 3, 4 of 5.
pub fn superquorum(f: usize) -> usize {
    f + f.div_ceil(2) + 1
}

/// In how many of `f + 1` collected pools a record must appear to be replayed.
pub fn recovery_quorum(f: usize) -> usize {
    f.div_ceil(2) + 1
}

/// Why a witness did not accept a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// A held record touches one of its keys.
    Conflict,
    /// A leader of a later term has collected this pool.
    StaleTerm { collected_for: u64 },
    /// The pool is at its size bound.
    Full,
}

/// A change to a witness, as its owner persists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Accepted(Record),
    Dropped { client: ClientId, seq: u64 },
    Collected { term: u64 },
    Reset { below_term: u64 },
}

/// A witness file whose events, each intact, could not have been made in that order: a bug or a
/// file that is not ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event {event} does not follow from the ones before it: {what}")]
pub struct ReplayError {
    pub event: usize,
    pub what: &'static str,
}

#[derive(Debug)]
pub struct Witness {
    records: BTreeMap<(ClientId, u64), Record>,
    /// Which held record touches each key.
    by_key: HashMap<Bytes, (ClientId, u64)>,
    /// The latest term a leader collected this pool for; older records are refused.
    collected_for: u64,
    held_bytes: usize,
    max_bytes: usize,
    /// The last `RECENTLY_APPLIED` writes applied here that the witness did not hold (yet).
    recently_applied: HashSet<(ClientId, u64)>,
    applied_order: VecDeque<(ClientId, u64)>,
}

/// How many writes applied without a record the witness remembers, so a record that arrives
/// after its write applied is not held for ever.
const RECENTLY_APPLIED: usize = 1 << 16;

impl Witness {
    pub fn new(max_bytes: usize) -> Witness {
        Witness {
            records: BTreeMap::new(),
            by_key: HashMap::new(),
            collected_for: 0,
            held_bytes: 0,
            max_bytes,
            recently_applied: HashSet::new(),
            applied_order: VecDeque::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// The ids of the records held.
    pub fn ids(&self) -> Vec<(ClientId, u64)> {
        self.records.keys().copied().collect()
    }

    /// Accepts `record` if it commutes with everything held and its term is current; the event
    /// to persist before answering, if any. The same record again is accepted again (a client's
    /// retry); one whose write has already applied here is accepted and not held.
    pub fn accept(&mut self, record: Record) -> Result<Option<Event>, Rejection> {
        if record.term < self.collected_for {
            return Err(Rejection::StaleTerm {
                collected_for: self.collected_for,
            });
        }
        if self.recently_applied.contains(&record.id()) {
            return Ok(None);
        }
        if let Some(held) = self.records.get(&record.id()) {
            return if *held == record {
                Ok(Some(Event::Accepted(record)))
            } else {
                Err(Rejection::Conflict)
            };
        }
        if record.keys.iter().any(|k| self.by_key.contains_key(k)) {
            return Err(Rejection::Conflict);
        }
        if self.held_bytes + record.size_bytes() > self.max_bytes {
            return Err(Rejection::Full);
        }
        self.insert(record.clone());
        Ok(Some(Event::Accepted(record)))
    }

    fn insert(&mut self, record: Record) {
        for key in &record.keys {
            let previous = self.by_key.insert(key.clone(), record.id());
            assert!(previous.is_none(), "a witness holds two records on one key");
        }
        self.held_bytes += record.size_bytes();
        self.records.insert(record.id(), record);
    }

    /// The write `(client, seq)` has been applied: the log keeps it now.
    pub fn applied(&mut self, client: ClientId, seq: u64) -> Option<Event> {
        let Some(record) = self.records.remove(&(client, seq)) else {
            if self.recently_applied.insert((client, seq)) {
                self.applied_order.push_back((client, seq));
                if self.applied_order.len() > RECENTLY_APPLIED {
                    let oldest = self.applied_order.pop_front().expect("not empty");
                    self.recently_applied.remove(&oldest);
                }
            }
            return None;
        };
        for key in &record.keys {
            self.by_key.remove(key);
        }
        self.held_bytes -= record.size_bytes();
        Some(Event::Dropped { client, seq })
    }

    /// A leader of `term` recovers: from now on records for older terms are refused. Returns
    /// the pool as it stands.
    pub fn collect(&mut self, term: u64) -> (Vec<Record>, Option<Event>) {
        let event = (term > self.collected_for).then(|| {
            self.collected_for = term;
            Event::Collected { term }
        });
        (self.records.values().cloned().collect(), event)
    }

    /// The recovery for `term` has replayed what it found: records of older terms were either
    /// replayed (and are dropped as they apply) or never completed.
    pub fn reset(&mut self, term: u64) -> Event {
        let old: Vec<(ClientId, u64)> = self
            .records
            .values()
            .filter(|r| r.term < term)
            .map(Record::id)
            .collect();
        for (client, seq) in old {
            self.applied(client, seq);
        }
        Event::Reset { below_term: term }
    }

    /// Rebuilds a witness from its persisted events, in the order they were made. Events that
    /// no live witness could have made (a record accepted over a conflicting one) are an error.
    pub fn replay(max_bytes: usize, events: impl IntoIterator<Item = Event>) -> Result<Witness, ReplayError> {
        let mut witness = Witness::new(max_bytes);
        for (at, event) in events.into_iter().enumerate() {
            let fail = |what| Err(ReplayError { event: at, what });
            match event {
                Event::Accepted(record) => match witness.records.get(&record.id()) {
                    Some(held) if *held == record => {}
                    Some(_) => return fail("a second record under one client and sequence number"),
                    None if record.keys.iter().any(|k| witness.by_key.contains_key(k)) => {
                        return fail("a record accepted over a conflicting one");
                    }
                    None => witness.insert(record),
                },
                Event::Dropped { client, seq } => {
                    witness.applied(client, seq);
                }
                Event::Collected { term } => {
                    witness.collected_for = witness.collected_for.max(term);
                }
                Event::Reset { below_term } => {
                    witness.reset(below_term);
                }
            }
        }
        Ok(witness)
    }

    /// The events that rebuild this witness as it is now: what a compacted file holds.
    pub fn snapshot_events(&self) -> Vec<Event> {
        let mut events = vec![Event::Collected {
            term: self.collected_for,
        }];
        events.extend(self.records.values().cloned().map(Event::Accepted));
        events
    }
}

/// The records recovery replays from `pools` (at least `f + 1`, each from a different node):
/// those found in [`recovery_quorum`]`(f)` of them, each client's in sequence order. Pools that
/// no correct witnesses could have given (two different records under one id, or two records
/// that both reach the quorum and conflict) are an error: recovery must not guess.
pub fn recoverable(pools: &[Vec<Record>], f: usize) -> Result<Vec<Record>, String> {
    assert!(
        pools.len() > f,
        "recovery needs f + 1 pools, got {} for f = {f}",
        pools.len()
    );
    let mut seen: BTreeMap<(ClientId, u64), (usize, &Record)> = BTreeMap::new();
    for pool in pools {
        for record in pool {
            let (count, first) = seen.entry(record.id()).or_insert((0, record));
            if *first != record {
                return Err(format!("two different records under id {:?}", record.id()));
            }
            *count += 1;
        }
    }
    let chosen: Vec<Record> = seen
        .into_values()
        .filter(|(count, _)| *count >= recovery_quorum(f))
        .map(|(_, record)| record.clone())
        .collect();
    let mut keys = HashMap::new();
    for record in &chosen {
        for key in &record.keys {
            if let Some(other) = keys.insert(key, record.id()) {
                return Err(format!(
                    "records {other:?} and {:?} both reached the recovery quorum but conflict on {key:?}",
                    record.id()
                ));
            }
        }
    }
    Ok(chosen)
}

/// Events as a witness file holds them: `[len u32][crc32 u32][payload]`, the payload
/// `[kind u8]` then the event's fields, little-endian.
pub mod file {
    use super::*;

    const ACCEPTED: u8 = 1;
    const DROPPED: u8 = 2;
    const COLLECTED: u8 = 3;
    const RESET: u8 = 4;
    pub const HEADER_BYTES: usize = 8;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum DecodeError {
        /// The file ends inside an event: a write the crash cut short.
        TornTail { valid_bytes: usize },
        /// A complete event whose checksum or fields are wrong.
        Corrupt { at: usize, what: &'static str },
    }

    fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }

    pub fn encode(event: &Event, out: &mut Vec<u8>) {
        let mut payload = Vec::new();
        match event {
            Event::Accepted(r) => {
                payload.push(ACCEPTED);
                for v in [r.client.incarnation, r.client.connection, r.seq, r.term] {
                    payload.extend_from_slice(&v.to_le_bytes());
                }
                payload.extend_from_slice(&(r.keys.len() as u32).to_le_bytes());
                for key in &r.keys {
                    put_bytes(&mut payload, key);
                }
                put_bytes(&mut payload, &r.command);
            }
            Event::Dropped { client, seq } => {
                payload.push(DROPPED);
                for v in [client.incarnation, client.connection, *seq] {
                    payload.extend_from_slice(&v.to_le_bytes());
                }
            }
            Event::Collected { term } => {
                payload.push(COLLECTED);
                payload.extend_from_slice(&term.to_le_bytes());
            }
            Event::Reset { below_term } => {
                payload.push(RESET);
                payload.extend_from_slice(&below_term.to_le_bytes());
            }
        }
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
    }

    struct Fields<'a>(&'a [u8]);

    impl<'a> Fields<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
            if self.0.len() < n {
                return Err("truncated field");
            }
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Ok(head)
        }
        fn u64(&mut self) -> Result<u64, &'static str> {
            Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("eight bytes")))
        }
        fn u32(&mut self) -> Result<usize, &'static str> {
            Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("four bytes")) as usize)
        }
        fn bytes(&mut self) -> Result<Bytes, &'static str> {
            let len = self.u32()?;
            Ok(Bytes::copy_from_slice(self.take(len)?))
        }
    }

    fn decode_payload(payload: &[u8]) -> Result<Event, &'static str> {
        let mut f = Fields(payload);
        let kind = f.take(1)?[0];
        let event = match kind {
            ACCEPTED => {
                let client = ClientId {
                    incarnation: f.u64()?,
                    connection: f.u64()?,
                };
                let seq = f.u64()?;
                let term = f.u64()?;
                let count = f.u32()?;
                let mut keys: Vec<Bytes> = Vec::with_capacity(count.min(f.0.len() / 4));
                for _ in 0..count {
                    let key = f.bytes()?;
                    if keys.last().is_some_and(|last| *last >= key) {
                        return Err("record keys not sorted and distinct");
                    }
                    keys.push(key);
                }
                let command = f.bytes()?;
                Event::Accepted(Record {
                    client,
                    seq,
                    term,
                    keys,
                    command,
                })
            }
            DROPPED => Event::Dropped {
                client: ClientId {
                    incarnation: f.u64()?,
                    connection: f.u64()?,
                },
                seq: f.u64()?,
            },
            COLLECTED => Event::Collected { term: f.u64()? },
            RESET => Event::Reset { below_term: f.u64()? },
            _ => return Err("unknown event kind"),
        };
        if !f.0.is_empty() {
            return Err("trailing bytes in event");
        }
        Ok(event)
    }

    /// Decodes a whole file. A tail too short to hold the event its header announces is a
    /// torn write (`TornTail`, with the events before it); anything else wrong is corruption.
    pub fn decode_all(buf: &[u8]) -> Result<Vec<Event>, (Vec<Event>, DecodeError)> {
        let mut events = Vec::new();
        let mut at = 0;
        while at < buf.len() {
            let Some(header) = buf.get(at..at + HEADER_BYTES) else {
                return Err((events, DecodeError::TornTail { valid_bytes: at }));
            };
            let len = u32::from_le_bytes(header[..4].try_into().expect("four bytes")) as usize;
            let crc = u32::from_le_bytes(header[4..].try_into().expect("four bytes"));
            let Some(payload) = buf.get(at + HEADER_BYTES..at + HEADER_BYTES + len) else {
                return Err((events, DecodeError::TornTail { valid_bytes: at }));
            };
            if crc32fast::hash(payload) != crc {
                return Err((
                    events,
                    DecodeError::Corrupt {
                        at,
                        what: "checksum mismatch",
                    },
                ));
            }
            match decode_payload(payload) {
                Ok(event) => events.push(event),
                Err(what) => return Err((events, DecodeError::Corrupt { at, what })),
            }
            at += HEADER_BYTES + len;
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(connection: u64) -> ClientId {
        ClientId {
            incarnation: 1 << 16,
            connection,
        }
    }

    fn record(connection: u64, seq: u64, term: u64, keys: &[&str]) -> Record {
        Record::new(
            client(connection),
            seq,
            term,
            keys.iter().map(|k| Bytes::copy_from_slice(k.as_bytes())).collect(),
            Bytes::from(format!("write {connection}/{seq} {keys:?}")),
        )
    }

    #[test]
    fn quorums_for_one_and_two_failures() {
        assert_eq!((superquorum(1), recovery_quorum(1)), (3, 2));
        assert_eq!((superquorum(2), recovery_quorum(2)), (4, 2));
        for f in 1..=4 {
            let nodes = 2 * f + 1;
            // Any f + 1 pools hold at least recovery_quorum of a superquorum's acceptances...
            assert!(superquorum(f) + (f + 1) - nodes >= recovery_quorum(f), "f = {f}");
            // ...and two records that each reach it among f + 1 pools share one.
            assert!(2 * recovery_quorum(f) > f + 1, "f = {f}");
        }
    }

    #[test]
    fn a_witness_holds_only_commuting_records_and_lets_them_go_when_applied() {
        let mut w = Witness::new(1 << 20);
        assert!(w.accept(record(1, 1, 5, &["a", "b"])).is_ok());
        assert_eq!(w.accept(record(2, 1, 5, &["b"])), Err(Rejection::Conflict));
        assert!(w.accept(record(2, 1, 5, &["c"])).is_ok());
        assert!(
            w.accept(record(1, 1, 5, &["a", "b"])).is_ok(),
            "a retry is accepted again"
        );
        assert_eq!(
            w.accept(record(1, 1, 5, &["z"])),
            Err(Rejection::Conflict),
            "same id, other write"
        );
        assert_eq!(w.len(), 2);
        assert!(w.applied(client(1), 1).is_some());
        assert!(w.applied(client(1), 1).is_none());
        assert!(w.accept(record(2, 2, 5, &["b"])).is_ok(), "b is free again");
        assert!(w.applied(client(3), 1).is_none());
        assert_eq!(
            w.accept(record(3, 1, 5, &["b"])),
            Ok(None),
            "a record overtaken by its write's apply is accepted, not held"
        );
        assert_eq!(w.len(), 2);
        let mut tiny = Witness::new(10);
        assert_eq!(tiny.accept(record(1, 1, 1, &["k"])), Err(Rejection::Full));
    }

    #[test]
    fn a_write_naming_one_key_twice_is_held_once_and_released_whole() {
        let mut w = Witness::new(1 << 20);
        let mset = record(1, 1, 5, &["b", "a", "b"]);
        assert_eq!(mset.keys(), &[Bytes::from("a"), Bytes::from("b")]);
        assert!(w.accept(mset).is_ok());
        assert!(w.applied(client(1), 1).is_some());
        assert!(w.is_empty());
        assert!(w.accept(record(2, 1, 5, &["b"])).is_ok());
    }

    #[test]
    fn events_no_witness_could_have_made_do_not_replay() {
        let conflicting = vec![
            Event::Accepted(record(1, 1, 5, &["a"])),
            Event::Accepted(record(2, 1, 5, &["a"])),
        ];
        assert_eq!(Witness::replay(1 << 20, conflicting).unwrap_err().event, 1);
        let same_id = vec![
            Event::Accepted(record(1, 1, 5, &["a"])),
            Event::Accepted(record(1, 1, 5, &["b"])),
        ];
        assert!(Witness::replay(1 << 20, same_id).is_err());
        let mut file = Vec::new();
        let mut unsorted = record(1, 1, 5, &["a", "b"]);
        unsorted.keys.reverse();
        file::encode(&Event::Accepted(unsorted), &mut file);
        assert!(matches!(
            file::decode_all(&file),
            Err((
                _,
                file::DecodeError::Corrupt {
                    what: "record keys not sorted and distinct",
                    ..
                }
            ))
        ));
    }

    #[test]
    fn after_a_collection_records_for_older_terms_are_refused_and_reset_clears_them() {
        let mut w = Witness::new(1 << 20);
        w.accept(record(1, 1, 5, &["a"])).unwrap();
        let (pool, event) = w.collect(6);
        assert_eq!(pool, vec![record(1, 1, 5, &["a"])]);
        assert_eq!(event, Some(Event::Collected { term: 6 }));
        assert_eq!(
            w.accept(record(2, 1, 5, &["b"])),
            Err(Rejection::StaleTerm { collected_for: 6 }),
            "the deposed leader's fast path cannot complete"
        );
        w.accept(record(2, 1, 6, &["b"])).unwrap();
        w.reset(6);
        assert_eq!(w.collect(6).0, vec![record(2, 1, 6, &["b"])]);
    }

    #[test]
    fn recovery_replays_what_a_quorum_of_pools_holds_in_client_order() {
        // f = 1: three nodes; a fast-path write reached all three, another only one.
        let done = record(1, 2, 5, &["a"]);
        let earlier = record(1, 1, 5, &["c"]);
        let partial = record(2, 1, 5, &["b"]);
        let pools = vec![
            vec![done.clone(), partial.clone(), earlier.clone()],
            vec![earlier.clone(), done.clone()],
        ];
        assert_eq!(recoverable(&pools, 1).unwrap(), vec![earlier, done]);
        // f = 2: five nodes; collected pools from three of them.
        let everywhere = record(3, 1, 7, &["x"]);
        let two = record(4, 1, 7, &["y"]);
        let one = record(5, 1, 7, &["z"]);
        let pools = vec![
            vec![everywhere.clone(), two.clone()],
            vec![everywhere.clone(), two.clone(), one],
            vec![everywhere.clone()],
        ];
        assert_eq!(recoverable(&pools, 2).unwrap(), vec![everywhere, two.clone()]);
        let mut forged = two.clone();
        forged.command = Bytes::from_static(b"something else");
        assert!(
            recoverable(&[vec![two], vec![forged]], 1).is_err(),
            "one id, two records"
        );
        let (a, b) = (record(6, 1, 7, &["k"]), record(7, 1, 7, &["k"]));
        assert!(
            recoverable(&[vec![a.clone(), b.clone()], vec![a, b]], 1).is_err(),
            "conflicting records cannot both have completed"
        );
    }

    /// Random acceptances at five witnesses with random losses: every record a superquorum
    /// accepted is recovered from any three pools, and what is recovered commutes.
    #[test]
    fn randomized_any_majority_of_pools_recovers_every_superquorum_write() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut below = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..200 {
            let f = 2;
            let mut witnesses: Vec<Witness> = (0..5).map(|_| Witness::new(1 << 20)).collect();
            let mut completed = Vec::new();
            for n in 0..30 {
                let key = format!("k{}", below(12));
                let r = record(n + 1, 1, 3, &[&key]);
                let accepted = witnesses
                    .iter_mut()
                    .filter(|_| below(4) > 0)
                    .filter_map(|w| w.accept(r.clone()).ok())
                    .count();
                if accepted >= superquorum(f) {
                    completed.push(r);
                }
            }
            let mut chosen: Vec<usize> = (0..5).collect();
            while chosen.len() > f + 1 {
                chosen.remove(below(chosen.len() as u64) as usize);
            }
            let pools: Vec<Vec<Record>> = chosen.iter().map(|i| witnesses[*i].collect(4).0).collect();
            let recovered = recoverable(&pools, f).unwrap();
            for r in &completed {
                assert!(recovered.contains(r), "{r:?} completed but was not recovered");
            }
        }
    }

    #[test]
    fn the_file_replays_to_the_same_witness_and_a_torn_tail_is_told_from_corruption() {
        let mut w = Witness::new(1 << 20);
        let mut file = Vec::new();
        let log = |e: Event, file: &mut Vec<u8>| file::encode(&e, file);
        log(w.accept(record(1, 1, 5, &["a", "b"])).unwrap().unwrap(), &mut file);
        log(w.accept(record(2, 1, 5, &["c"])).unwrap().unwrap(), &mut file);
        log(w.applied(client(1), 1).unwrap(), &mut file);
        log(w.collect(6).1.unwrap(), &mut file);
        log(w.accept(record(3, 1, 6, &["a"])).unwrap().unwrap(), &mut file);
        log(w.reset(6), &mut file);
        let events = file::decode_all(&file).unwrap();
        let replayed = Witness::replay(1 << 20, events).unwrap();
        assert_eq!(replayed.records, w.records);
        assert_eq!(replayed.collected_for, 6);
        let compacted = Witness::replay(1 << 20, w.snapshot_events()).unwrap();
        assert_eq!((compacted.records, compacted.collected_for), (w.records.clone(), 6));
        for cut in 0..file.len() {
            match file::decode_all(&file[..cut]) {
                Ok(events) => assert!(events.len() < 6, "a cut at {cut} kept every event"),
                Err((_, file::DecodeError::TornTail { valid_bytes })) => assert!(valid_bytes <= cut),
                Err((_, e)) => panic!("a cut at {cut} is a torn tail, not {e:?}"),
            }
        }
        let mut flipped = file.clone();
        flipped[file::HEADER_BYTES + 3] ^= 1;
        assert!(matches!(
            file::decode_all(&flipped),
            Err((_, file::DecodeError::Corrupt { at: 0, .. }))
        ));
    }
}
