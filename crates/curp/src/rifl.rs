//! RIFL (Lee et al., "Implementing Linearizability at Large Scale and Low Latency", SOSP'15):
//! every write carries its client's id and a sequence number, and every replica keeps, as part of
//! the replicated state, the reply to each write its client has not yet acknowledged. A write that
//! arrives again — a retry after a leader change, or a late copy of a forwarded proposal — is
//! answered from its record and never executed twice.
//!
//! Chorus adds one rule: a client's writes execute in sequence order, without gaps. A write whose
//! predecessor has not executed executes nothing and is answered [`Verdict::OutOfOrder`], so a
//! client that retries a lost write retries the ones after it too, and a pipeline's writes take
//! effect in the order they were sent even across a leader change.
//!
//! Client ids are leased through the log. A node registers an *incarnation* (a log command whose
//! id comes from the entry's index, so every replica assigns the same one) and numbers its
//! connections within it; a connection is a RIFL client. The node renews the incarnation through
//! the log; one not renewed within [`LEASE_ENTRIES`] entries expires with every record it held,
//! and its writes are refused from then on ([`Verdict::Expired`]): their records may be gone, so
//! executing them could execute something twice. A renewal also names the node's oldest open
//! connection; the records of every connection below it are dropped.
//!
//! Time here is log time (entry indices), so every replica agrees on what has expired without
//! reading a clock.
//!
//! Everything here is a function of the log: the same commands at the same indices give every
//! replica the same records. The owner persists them through the `persist` callbacks (a key
//! suffix and a value, `None` to delete) and rebuilds them with [`Completions::restore`]. Lease
//! changes are persisted as they happen; a client's record only when the owner asks
//! ([`Completions::flush`]), which it does before it describes its durable state (a snapshot), so
//! a busy client costs one record write per snapshot rather than one per write.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use bytes::Bytes;
use foldhash::HashMap;

/// An incarnation not renewed for this many log entries has expired. At the highest entry rate
/// measured here (about 5,000 entries/s, one write per entry) that is over three minutes; a node
/// renews every few seconds.
pub const LEASE_ENTRIES: u64 = 1 << 20;

/// Registrations one log entry can hold: an incarnation's id is `index << REGISTRATION_BITS | n`.
const REGISTRATION_BITS: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId {
    pub incarnation: u64,
    /// Numbered from 1 within the incarnation, never reused.
    pub connection: u64,
}

/// What a write carries besides its command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub client: ClientId,
    /// From 1, one per write of the client.
    pub seq: u64,
    /// Every write below this one has been answered to the client: its record may go.
    pub first_unacked: u64,
}

pub const ENVELOPE_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    Malformed(&'static str),
    /// More registrations in one log entry than ids can tell apart.
    TooManyRegistrations,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Malformed(what) => write!(f, "malformed RIFL record: {what}"),
            Error::TooManyRegistrations => write!(f, "too many client registrations in one log entry"),
        }
    }
}

impl std::error::Error for Error {}

fn u64_at(buf: &[u8], at: usize) -> Result<u64, Error> {
    let bytes = buf.get(at..at + 8).ok_or(Error::Malformed("truncated"))?;
    Ok(u64::from_le_bytes(bytes.try_into().expect("eight bytes")))
}

impl Envelope {
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.client.incarnation,
            self.client.connection,
            self.seq,
            self.first_unacked,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Decodes the first [`ENVELOPE_BYTES`] of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Envelope, Error> {
        let envelope = Envelope {
            client: ClientId {
                incarnation: u64_at(buf, 0)?,
                connection: u64_at(buf, 8)?,
            },
            seq: u64_at(buf, 16)?,
            first_unacked: u64_at(buf, 24)?,
        };
        if envelope.client.connection == 0 || envelope.seq == 0 {
            return Err(Error::Malformed("connections and sequence numbers start at 1"));
        }
        if envelope.first_unacked > envelope.seq {
            return Err(Error::Malformed("a write acknowledges itself"));
        }
        Ok(envelope)
    }
}

/// What to do with an enveloped write; `R` is the owner's reply type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<R> {
    /// New and next in its client's order: execute it, then [`Completions::complete`] it.
    Execute,
    /// Executed before; this is the reply it produced.
    Duplicate(R),
    /// Its client acknowledged it already, so its reply is gone: a late copy nobody waits for.
    Stale,
    /// An earlier write of the same client has not executed; this one executed nothing.
    OutOfOrder,
    /// The client's incarnation expired or never existed; nothing executed.
    Expired,
}

#[derive(Debug, Clone)]
struct ClientRecord<R> {
    /// Every write below has executed, none at or above.
    next_seq: u64,
    /// The client acknowledged every write below.
    acked_below: u64,
    /// The replies of writes `acked_below..next_seq`, in order.
    replies: VecDeque<R>,
    /// Changed since the last flush (and listed in `Completions::dirty`).
    dirty: bool,
}

/// Equal when they hold the same records; whether they await a flush does not matter.
impl<R: PartialEq> PartialEq for ClientRecord<R> {
    fn eq(&self, other: &Self) -> bool {
        (self.next_seq, self.acked_below) == (other.next_seq, other.acked_below) && self.replies == other.replies
    }
}

/// A client that has executed nothing.
impl<R> Default for ClientRecord<R> {
    fn default() -> ClientRecord<R> {
        ClientRecord {
            next_seq: 1,
            acked_below: 1,
            replies: VecDeque::new(),
            dirty: false,
        }
    }
}

impl<R: std::fmt::Debug> ClientRecord<R> {
    /// Drops replies the client has acknowledged; whether any went. A client cannot acknowledge
    /// a write that has not executed, so a claim past `next_seq` is held to it.
    fn acknowledge(&mut self, first_unacked: u64) -> bool {
        let acked_below = first_unacked.min(self.next_seq);
        if acked_below <= self.acked_below {
            return false;
        }
        self.replies.drain(..(acked_below - self.acked_below) as usize);
        self.acked_below = acked_below;
        true
    }

    fn check(&self) {
        assert!(
            self.acked_below <= self.next_seq && self.replies.len() as u64 == self.next_seq - self.acked_below,
            "RIFL record out of shape: {self:?}"
        );
    }

    fn encode(&self, encode_reply: &dyn Fn(&R) -> Bytes) -> Bytes {
        let replies: Vec<Bytes> = self.replies.iter().map(encode_reply).collect();
        let mut out = Vec::with_capacity(16 + replies.iter().map(|r| 4 + r.len()).sum::<usize>());
        out.extend_from_slice(&self.next_seq.to_le_bytes());
        out.extend_from_slice(&self.acked_below.to_le_bytes());
        for reply in &replies {
            out.extend_from_slice(&(reply.len() as u32).to_le_bytes());
            out.extend_from_slice(reply);
        }
        Bytes::from(out)
    }

    fn decode(buf: &[u8], decode_reply: &dyn Fn(&[u8]) -> Option<R>) -> Result<ClientRecord<R>, Error> {
        let mut record = ClientRecord {
            next_seq: u64_at(buf, 0)?,
            acked_below: u64_at(buf, 8)?,
            replies: VecDeque::new(),
            dirty: false,
        };
        let mut rest = &buf[16..];
        while !rest.is_empty() {
            let len = rest
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("four bytes")) as usize)
                .ok_or(Error::Malformed("truncated reply length"))?;
            let reply = rest.get(4..4 + len).ok_or(Error::Malformed("truncated reply"))?;
            record
                .replies
                .push_back(decode_reply(reply).ok_or(Error::Malformed("reply"))?);
            rest = &rest[4 + len..];
        }
        if record.acked_below == 0
            || record.acked_below > record.next_seq
            || record.replies.len() as u64 != record.next_seq - record.acked_below
        {
            return Err(Error::Malformed("reply count does not match the sequence numbers"));
        }
        Ok(record)
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Incarnation<R> {
    renewed_at_index: u64,
    /// Every connection below has closed; its record is gone and its writes are stale.
    forgotten_below: u64,
    clients: HashMap<u64, ClientRecord<R>>,
}

impl<R> Incarnation<R> {
    fn expired(&self, index: u64) -> bool {
        index > self.renewed_at_index.saturating_add(LEASE_ENTRIES)
    }

    fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(16);
        out.extend_from_slice(&self.renewed_at_index.to_le_bytes());
        out.extend_from_slice(&self.forgotten_below.to_le_bytes());
        Bytes::from(out)
    }
}

/// The key suffix of an incarnation's own record: its id.
pub fn incarnation_key(incarnation: u64) -> [u8; 8] {
    incarnation.to_be_bytes()
}

/// The key suffix of a client's record: its incarnation's key, then the connection.
pub fn client_key(client: ClientId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&client.incarnation.to_be_bytes());
    key[8..].copy_from_slice(&client.connection.to_be_bytes());
    key
}

/// Where a record changes: its key suffix and new value, `None` to delete it.
pub type Persist<'a> = &'a mut dyn FnMut(&[u8], Option<Bytes>);

/// The completion records of every client, and the leases of their incarnations. `R` is the
/// owner's reply type.
#[derive(Debug, Clone)]
pub struct Completions<R> {
    incarnations: BTreeMap<u64, Incarnation<R>>,
    /// The entry of the last registration and how many it held.
    last_registration: (u64, u64),
    /// Clients whose record changed since the last [`Completions::flush`].
    dirty: Vec<ClientId>,
}

impl<R> Default for Completions<R> {
    fn default() -> Self {
        Completions {
            incarnations: BTreeMap::new(),
            last_registration: (0, 0),
            dirty: Vec::new(),
        }
    }
}

impl<R: Clone + std::fmt::Debug> Completions<R> {
    pub fn new() -> Completions<R> {
        Completions::default()
    }

    /// Rebuilds the records from what `persist` wrote: (key suffix, value) pairs in any order,
    /// replies decoded by `decode_reply`.
    pub fn restore<'a>(
        records: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        decode_reply: &dyn Fn(&[u8]) -> Option<R>,
    ) -> Result<Completions<R>, Error> {
        let mut incarnations = BTreeMap::new();
        let mut clients = Vec::new();
        for (key, value) in records {
            match key.len() {
                8 => {
                    if value.len() != 16 {
                        return Err(Error::Malformed("incarnation record length"));
                    }
                    let incarnation = Incarnation {
                        renewed_at_index: u64_at(value, 0)?,
                        forgotten_below: u64_at(value, 8)?,
                        clients: HashMap::default(),
                    };
                    let id = u64::from_be_bytes(key.try_into().expect("eight bytes"));
                    incarnations.insert(id, incarnation);
                }
                16 => {
                    let id = ClientId {
                        incarnation: u64::from_be_bytes(key[..8].try_into().expect("eight bytes")),
                        connection: u64::from_be_bytes(key[8..].try_into().expect("eight bytes")),
                    };
                    clients.push((id, ClientRecord::decode(value, decode_reply)?));
                }
                _ => return Err(Error::Malformed("key length")),
            }
        }
        for (id, record) in clients {
            incarnations
                .get_mut(&id.incarnation)
                .ok_or(Error::Malformed("a client record without its incarnation"))?
                .clients
                .insert(id.connection, record);
        }
        Ok(Completions {
            incarnations,
            ..Completions::default()
        })
    }

    /// How many clients have records.
    pub fn clients(&self) -> usize {
        self.incarnations.values().map(|i| i.clients.len()).sum()
    }

    pub fn incarnations(&self) -> usize {
        self.incarnations.len()
    }

    /// Decides what the write at `index` in `envelope` does, and drops the replies it
    /// acknowledges.
    pub fn admit(&mut self, index: u64, envelope: &Envelope) -> Verdict<R> {
        let Some(incarnation) = self.incarnations.get_mut(&envelope.client.incarnation) else {
            return Verdict::Expired;
        };
        if incarnation.expired(index) {
            return Verdict::Expired;
        }
        if envelope.client.connection < incarnation.forgotten_below {
            return Verdict::Stale;
        }
        let Some(record) = incarnation.clients.get_mut(&envelope.client.connection) else {
            // A client's first write creates its record when it executes.
            return if envelope.seq == 1 {
                Verdict::Execute
            } else {
                Verdict::OutOfOrder
            };
        };
        if record.acknowledge(envelope.first_unacked) && !record.dirty {
            record.dirty = true;
            self.dirty.push(envelope.client);
        }
        if envelope.seq < record.acked_below {
            Verdict::Stale
        } else if envelope.seq < record.next_seq {
            let reply = record.replies[(envelope.seq - record.acked_below) as usize].clone();
            Verdict::Duplicate(reply)
        } else if envelope.seq == record.next_seq {
            Verdict::Execute
        } else {
            Verdict::OutOfOrder
        }
    }

    /// The sequence number `client`'s next write must carry to execute if it applied at `index`,
    /// or `None` if it would not execute whatever it carried (expired, or forgotten), or might
    /// not by then: an incarnation within `margin_entries` of its lease's end.
    pub fn next_seq(&self, index: u64, client: ClientId, margin_entries: u64) -> Option<u64> {
        let incarnation = self.incarnations.get(&client.incarnation)?;
        if incarnation.expired(index.saturating_add(margin_entries)) || client.connection < incarnation.forgotten_below
        {
            return None;
        }
        Some(incarnation.clients.get(&client.connection).map_or(1, |r| r.next_seq))
    }

    /// Whether write `seq` of `client` can no longer execute for the first time: it has
    /// executed, or its connection has been forgotten. An unknown incarnation says nothing: it
    /// may have expired, or been registered after the state this replica holds.
    pub fn settled(&self, client: ClientId, seq: u64) -> bool {
        let Some(incarnation) = self.incarnations.get(&client.incarnation) else {
            return false;
        };
        client.connection < incarnation.forgotten_below
            || incarnation
                .clients
                .get(&client.connection)
                .is_some_and(|r| seq < r.next_seq)
    }

    /// Records the reply of a write [`Completions::admit`] let execute.
    pub fn complete(&mut self, envelope: &Envelope, reply: R) {
        let incarnation = self
            .incarnations
            .get_mut(&envelope.client.incarnation)
            .expect("an admitted write's incarnation is live");
        let record = incarnation.clients.entry(envelope.client.connection).or_default();
        assert_eq!(
            record.next_seq, envelope.seq,
            "only the next write of a client executes"
        );
        record.replies.push_back(reply);
        record.next_seq += 1;
        record.check();
        if !record.dirty {
            record.dirty = true;
            self.dirty.push(envelope.client);
        }
    }

    /// Writes the client records that changed since the last flush, replies encoded by
    /// `encode_reply`.
    pub fn flush(&mut self, encode_reply: &dyn Fn(&R) -> Bytes, persist: Persist<'_>) {
        for client in std::mem::take(&mut self.dirty) {
            // A record deleted since it changed was deleted through `persist` already.
            if let Some(record) = self
                .incarnations
                .get_mut(&client.incarnation)
                .and_then(|i| i.clients.get_mut(&client.connection))
            {
                record.dirty = false;
                persist(&client_key(client), Some(record.encode(encode_reply)));
            }
        }
    }

    /// Registers a new incarnation at `index`; its id.
    pub fn register(&mut self, index: u64, persist: Persist<'_>) -> Result<u64, Error> {
        self.expire(index, persist);
        let (last_index, count) = self.last_registration;
        let n = if last_index == index { count } else { 0 };
        if n >= 1 << REGISTRATION_BITS {
            return Err(Error::TooManyRegistrations);
        }
        self.last_registration = (index, n + 1);
        let id = (index << REGISTRATION_BITS) | n;
        let incarnation = Incarnation {
            renewed_at_index: index,
            forgotten_below: 1,
            clients: HashMap::default(),
        };
        persist(&incarnation_key(id), Some(incarnation.encode()));
        let previous = self.incarnations.insert(id, incarnation);
        assert!(previous.is_none(), "incarnation ids are never reused");
        Ok(id)
    }

    /// Renews `incarnation`'s lease at `index` and forgets its connections below
    /// `forgotten_below`; `false` if it has expired.
    pub fn renew(&mut self, index: u64, incarnation: u64, forgotten_below: u64, persist: Persist<'_>) -> bool {
        self.expire(index, persist);
        let Some(live) = self.incarnations.get_mut(&incarnation) else {
            return false;
        };
        live.renewed_at_index = index;
        if forgotten_below > live.forgotten_below {
            live.forgotten_below = forgotten_below;
            let closed: Vec<u64> = live.clients.keys().copied().filter(|c| *c < forgotten_below).collect();
            for connection in closed {
                live.clients.remove(&connection);
                persist(
                    &client_key(ClientId {
                        incarnation,
                        connection,
                    }),
                    None,
                );
            }
        }
        persist(&incarnation_key(incarnation), Some(live.encode()));
        true
    }

    /// Drops every incarnation whose lease has run out by `index`, with its records.
    fn expire(&mut self, index: u64, persist: Persist<'_>) {
        let expired: Vec<u64> = self
            .incarnations
            .iter()
            .filter(|(_, i)| i.expired(index))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let incarnation = self.incarnations.remove(&id).expect("listed");
            for connection in incarnation.clients.into_keys() {
                persist(
                    &client_key(ClientId {
                        incarnation: id,
                        connection,
                    }),
                    None,
                );
            }
            persist(&incarnation_key(id), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// What the owner's storage would hold: every record `persist` wrote.
    #[derive(Default)]
    struct Disk(BTreeMap<Vec<u8>, Bytes>);

    impl Disk {
        fn persist(&mut self) -> impl FnMut(&[u8], Option<Bytes>) + '_ {
            |key, value| match value {
                Some(v) => {
                    self.0.insert(key.to_vec(), v);
                }
                None => {
                    self.0.remove(key);
                }
            }
        }

        fn restore(&self) -> Completions<Bytes> {
            Completions::restore(self.0.iter().map(|(k, v)| (k.as_slice(), v.as_ref())), &decode).unwrap()
        }

        fn flush(&mut self, c: &mut Completions<Bytes>) {
            c.flush(&|r: &Bytes| r.clone(), &mut self.persist());
        }
    }

    fn decode(reply: &[u8]) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(reply))
    }

    fn same_records(a: &Completions<Bytes>, b: &Completions<Bytes>) -> bool {
        a.incarnations == b.incarnations
    }

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn envelope(incarnation: u64, connection: u64, seq: u64, first_unacked: u64) -> Envelope {
        Envelope {
            client: ClientId {
                incarnation,
                connection,
            },
            seq,
            first_unacked,
        }
    }

    #[test]
    fn envelopes_round_trip_and_reject_nonsense() {
        let e = envelope(7 << 16, 3, 9, 4);
        let mut buf = Vec::new();
        e.encode(&mut buf);
        assert_eq!(buf.len(), ENVELOPE_BYTES);
        assert_eq!(Envelope::decode(&buf).unwrap(), e);
        for cut in 0..ENVELOPE_BYTES {
            assert!(Envelope::decode(&buf[..cut]).is_err());
        }
        for bad in [envelope(1, 0, 1, 1), envelope(1, 1, 0, 0), envelope(1, 1, 2, 3)] {
            let mut buf = Vec::new();
            bad.encode(&mut buf);
            assert!(Envelope::decode(&buf).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_write_executes_once_in_order_and_its_reply_outlives_retries_until_acknowledged() {
        let mut disk = Disk::default();
        let mut c: Completions<Bytes> = Completions::new();
        let inc = c.register(5, &mut disk.persist()).unwrap();
        assert_eq!(
            c.register(5, &mut disk.persist()).unwrap(),
            inc + 1,
            "two in one entry differ"
        );
        let w = |seq, acked| envelope(inc, 1, seq, acked);
        assert_eq!(c.admit(6, &w(2, 1)), Verdict::OutOfOrder, "write 1 has not executed");
        assert_eq!(c.admit(6, &w(1, 1)), Verdict::Execute);
        c.complete(&w(1, 1), Bytes::from_static(b":1"));
        assert_eq!(c.admit(6, &w(1, 1)), Verdict::Duplicate(Bytes::from_static(b":1")));
        assert_eq!(c.admit(7, &w(2, 1)), Verdict::Execute);
        c.complete(&w(2, 1), Bytes::from_static(b":2"));
        assert_eq!(
            c.admit(7, &w(3, 1)),
            Verdict::Execute,
            "a pipeline acknowledges nothing yet"
        );
        c.complete(&w(3, 1), Bytes::from_static(b":3"));
        let id = w(1, 1).client;
        assert!(c.settled(id, 3) && !c.settled(id, 4), "executed through 3");
        let unknown = ClientId {
            incarnation: inc + 7,
            connection: 1,
        };
        assert!(
            !c.settled(unknown, 1),
            "an unknown incarnation may be one registered later"
        );
        assert_eq!(c.admit(8, &w(1, 1)), Verdict::Duplicate(Bytes::from_static(b":1")));
        assert_eq!(c.admit(8, &w(4, 3)), Verdict::Execute, "acknowledges 1 and 2");
        assert_eq!(c.admit(8, &w(1, 1)), Verdict::Stale, "an acknowledged reply is gone");
        assert_eq!(c.admit(8, &w(3, 3)), Verdict::Duplicate(Bytes::from_static(b":3")));
        disk.flush(&mut c);
        assert!(same_records(&disk.restore(), &c), "what was persisted is what is held");
        assert_eq!(
            c.admit(9, &envelope(inc + 7, 1, 1, 1)),
            Verdict::Expired,
            "never registered"
        );
        let client = w(1, 1).client;
        assert_eq!(c.next_seq(9, client, 0), Some(4), "what the next write must carry");
        assert_eq!(
            c.next_seq(
                9,
                ClientId {
                    connection: 2,
                    ..client
                },
                0
            ),
            Some(1)
        );
        assert_eq!(c.next_seq(9, envelope(inc + 7, 1, 1, 1).client, 0), None);
        assert_eq!(
            c.next_seq(9, client, LEASE_ENTRIES),
            None,
            "too close to the lease's end"
        );
    }

    #[test]
    fn leases_expire_in_log_time_and_renewals_forget_closed_connections() {
        let mut disk = Disk::default();
        let mut c: Completions<Bytes> = Completions::new();
        let old = c.register(1, &mut disk.persist()).unwrap();
        let kept = c.register(2, &mut disk.persist()).unwrap();
        for connection in 1..=3 {
            let e = envelope(kept, connection, 1, 1);
            assert_eq!(c.admit(3, &e), Verdict::Execute);
            c.complete(&e, Bytes::from_static(b"+OK"));
        }
        disk.flush(&mut c);
        assert_eq!(c.clients(), 3);
        assert!(c.renew(4, kept, 3, &mut disk.persist()));
        assert_eq!(c.clients(), 1, "connections 1 and 2 closed");
        assert_eq!(c.admit(5, &envelope(kept, 2, 1, 1)), Verdict::Stale);
        assert_eq!(
            c.admit(5, &envelope(kept, 3, 1, 1)),
            Verdict::Duplicate(Bytes::from_static(b"+OK"))
        );
        assert_eq!(c.admit(1 + LEASE_ENTRIES, &envelope(old, 1, 1, 1)), Verdict::Execute);
        assert_eq!(c.admit(2 + LEASE_ENTRIES, &envelope(old, 1, 1, 1)), Verdict::Expired);
        assert!(c.renew(2 + LEASE_ENTRIES, kept, 3, &mut disk.persist()));
        assert!(
            !c.renew(3 + LEASE_ENTRIES, old, 1, &mut disk.persist()),
            "expired and swept"
        );
        assert_eq!(c.incarnations(), 1);
        assert!(same_records(&disk.restore(), &c));
        assert!(!disk.0.keys().any(|k| k.starts_with(&incarnation_key(old))));
    }

    #[test]
    fn restore_rejects_malformed_records() {
        let mut disk = Disk::default();
        let mut c: Completions<Bytes> = Completions::new();
        let inc = c.register(1, &mut disk.persist()).unwrap();
        let e = envelope(inc, 1, 1, 1);
        c.admit(2, &e);
        c.complete(&e, Bytes::from_static(b"+OK"));
        disk.flush(&mut c);
        for (key, value) in &disk.0 {
            for cut in 0..value.len() {
                let mut broken = disk.0.clone();
                broken.insert(key.clone(), value.slice(..cut));
                assert!(
                    Completions::restore(broken.iter().map(|(k, v)| (k.as_slice(), v.as_ref())), &decode).is_err(),
                    "{key:?} cut at {cut}"
                );
            }
        }
        let orphan = [(
            &client_key(ClientId {
                incarnation: 9,
                connection: 1,
            })[..],
            &disk.0[&client_key(e.client).to_vec()][..],
        )];
        assert!(Completions::restore(orphan, &decode).is_err());
    }

    /// Clients that resend every unanswered write, over a log that loses, duplicates and
    /// reorders their attempts, with restarts from what was persisted: every write executes
    /// exactly once, each client's in order, and every answer is the reply its execution gave.
    #[test]
    fn randomized_retries_duplicates_and_restarts_execute_each_write_once_in_order() {
        for seed in 1..=40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut disk = Disk::default();
            let mut c: Completions<Bytes> = Completions::new();
            let inc = c.register(1, &mut disk.persist()).unwrap();
            const CLIENTS: u64 = 4;
            const WRITES: u64 = 30;
            // Per client: how many writes it has answered, the replies it got, and (the state)
            // the sequence numbers executed, in execution order.
            let mut answered = vec![0u64; CLIENTS as usize];
            let mut replies: Vec<BTreeMap<u64, Bytes>> = vec![BTreeMap::new(); CLIENTS as usize];
            let mut executed: Vec<Vec<u64>> = vec![Vec::new(); CLIENTS as usize];
            let mut in_flight: Vec<Envelope> = Vec::new();
            let mut index = 1;
            while answered.iter().any(|a| *a < WRITES) {
                // Each client (re)sends a window of its unanswered writes.
                for client in 0..CLIENTS {
                    let first = answered[client as usize] + 1;
                    let last = (first + rng.below(3)).min(WRITES);
                    for seq in first..=last {
                        if rng.below(3) > 0 {
                            in_flight.push(envelope(inc, client + 1, seq, first));
                        }
                    }
                }
                // One entry: some of what is in flight, in a random order, some of it twice.
                index += 1;
                let take = rng.below(in_flight.len() as u64 + 1) as usize;
                for _ in 0..take {
                    let pick = rng.below(in_flight.len() as u64) as usize;
                    let e = if rng.below(4) == 0 {
                        in_flight[pick]
                    } else {
                        in_flight.swap_remove(pick)
                    };
                    let client = (e.client.connection - 1) as usize;
                    let reply = match c.admit(index, &e) {
                        Verdict::Execute => {
                            executed[client].push(e.seq);
                            let reply = Bytes::from(format!(":{}", executed[client].len()));
                            c.complete(&e, reply.clone());
                            Some(reply)
                        }
                        Verdict::Duplicate(reply) => Some(reply),
                        Verdict::Stale | Verdict::OutOfOrder => None,
                        Verdict::Expired => panic!("the lease is renewed"),
                    };
                    if let Some(reply) = reply {
                        let previous = replies[client].insert(e.seq, reply.clone());
                        assert!(previous.is_none_or(|p| p == reply), "seed {seed}: two replies");
                        while replies[client].contains_key(&(answered[client] + 1)) {
                            answered[client] += 1;
                        }
                    }
                }
                disk.flush(&mut c);
                if rng.below(10) == 0 {
                    let restored = disk.restore();
                    assert!(same_records(&restored, &c), "seed {seed}: restart at {index}");
                    c = restored;
                }
                if index % 50 == 0 {
                    assert!(c.renew(index, inc, 1, &mut disk.persist()));
                }
            }
            for client in 0..CLIENTS as usize {
                assert_eq!(executed[client], (1..=WRITES).collect::<Vec<_>>(), "seed {seed}");
                for (seq, reply) in &replies[client] {
                    assert_eq!(reply, &Bytes::from(format!(":{seq}")), "seed {seed}");
                }
            }
        }
    }
}
