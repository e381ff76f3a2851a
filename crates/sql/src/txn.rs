//! A transaction as it travels through the log: what it changed — the statements the leader
//! ran (already made deterministic) with their parameters and the seed of its random values
//! (active replication), or its write-set (passive) — and the transaction it was executed after,
//! or (hybrid replication) what its certification needs: the log position its snapshot
//! reflects and the conflict classes it touches.

/// A value bound to a statement's parameter or read from a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// Names a transaction: the leader's incarnation (a process start) and its count within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TxnId {
    pub incarnation: u64,
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub sql: String,
    pub params: Vec<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Txn {
    pub id: TxnId,
    /// The transaction whose state this one was executed on. Every replica applies it only if
    /// that is the last transaction it applied, so a transaction never runs on a state other
    /// than the one its client saw (see `machine`).
    pub after: TxnId,
    /// Seeds `random()`, `randomblob()` and `gen_random_uuid()`.
    pub seed: u64,
    pub body: Body,
    /// Hybrid replication: certified against what the log ordered after its snapshot, instead
    /// of by `after`.
    pub certify: Option<Certify>,
}

/// What a hybrid transaction's certification needs (see `certify`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certify {
    /// The last log command (index, position in its entry) applied to the state it ran on.
    pub snapshot: (u64, u32),
    /// The conflict classes it touched (read or wrote).
    pub classes: Vec<String>,
    /// Its classes could not be told: it may have touched any.
    pub global: bool,
    /// None: it ran on its snapshot alone. Some: it ran on its snapshot with the write-sets of
    /// every transaction of its node's still in the log applied first, and depends on those
    /// of them that touched its classes: bit i stands for the one numbered `seq - 1 - i` (see
    /// `certify`).
    pub chain: Option<u64>,
}

/// A command of the SQL log: a transaction, or (hybrid replication) a message that hands a
/// conflict class between nodes.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Txn(Txn),
    Class(ClassMessage),
}

impl From<Txn> for Command {
    fn from(txn: Txn) -> Command {
        Command::Txn(txn)
    }
}

/// Names one transaction's request for classes it does not own: the requesting node's
/// incarnation and a count within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ticket {
    pub incarnation: u64,
    pub number: u64,
}

/// Hybrid replication's class hand-over (see `writer`): ordered through the log so that a
/// transaction reaching a class another node owns runs after the owner's transactions on it
/// and before its next ones. Advisory: no row depends on it, certification still decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassMessage {
    /// A transaction asks for `classes` (their owners lend them) and holds `holding` (an owner
    /// whose own waiting transaction the asker waits for, in turn, knows they wait on each
    /// other); sent at `sent_at_ms` (Unix time), so that one read again long after (a restart
    /// replaying the log) is ignored.
    Borrow {
        ticket: Ticket,
        classes: Vec<String>,
        holding: Vec<String>,
        sent_at_ms: u64,
    },
    /// The owner lends `class`: its own transactions on it are ordered before this.
    Lend { ticket: Ticket, class: String },
    /// The transaction is done with what it asked for (its write-set is ordered before this).
    Release { ticket: Ticket },
    /// `node` seems down (it lent nothing while a transaction waited for its class): its
    /// classes move to the nodes up until it says it is back.
    OwnerDown { node: NodeRef },
    /// `node` is back and owns its classes again.
    OwnerBack { node: NodeRef },
    /// A transaction that may touch any class (global) asks every node up for all of theirs,
    /// as `Borrow` does for some.
    BorrowAll {
        ticket: Ticket,
        holding: Vec<String>,
        sent_at_ms: u64,
    },
    /// `node` lends all its classes: its own transactions are ordered before this, and it
    /// starts none until the `Release`.
    LendAll { ticket: Ticket, node: NodeRef },
}

/// A node a class message names: by its id, or — in entries of builds from before hybrid
/// clusters changed membership — by its place among the voters in id order, which in such a
/// cluster never changed (the writer resolves it over the voters it has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRef {
    Id(u64),
    Place(u64),
}

impl NodeRef {
    /// The message's tag: the kind by place (as older builds wrote it) or its kind by id.
    fn tag(self, by_place: u8, by_id: u8) -> u8 {
        match self {
            NodeRef::Place(_) => by_place,
            NodeRef::Id(_) => by_id,
        }
    }

    fn number(self) -> u64 {
        match self {
            NodeRef::Id(n) | NodeRef::Place(n) => n,
        }
    }
}

/// What replicas do with a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Execute these statements (active replication).
    Statements(Vec<Statement>),
    /// Apply this write-set: the engine's record of the rows the transaction changed, as
    /// `Engine::commit_recorded` gives it (passive replication).
    WriteSet(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not a SQL transaction (bad magic)")]
    Magic,
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("unknown value tag {0}")]
    Tag(u8),
    #[error("text that is not UTF-8")]
    Utf8,
    #[error("{0} bytes left over")]
    Trailing(usize),
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

const MAGIC_STATEMENTS: &[u8; 4] = b"SQT1";
const MAGIC_WRITE_SET: &[u8; 4] = b"SQW1";
/// The same bodies after a certification header.
const MAGIC_CERTIFIED_STATEMENTS: &[u8; 4] = b"SQT2";
const MAGIC_CERTIFIED_WRITE_SET: &[u8; 4] = b"SQW2";
const MAGIC_CLASS: &[u8; 4] = b"SQC1";

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        let message = match self {
            Command::Txn(txn) => return txn.encode(),
            Command::Class(message) => message,
        };
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(MAGIC_CLASS);
        let ticket = match message {
            ClassMessage::Borrow { ticket, .. } => {
                out.push(0);
                Some(ticket)
            }
            ClassMessage::Lend { ticket, .. } => {
                out.push(1);
                Some(ticket)
            }
            ClassMessage::Release { ticket } => {
                out.push(2);
                Some(ticket)
            }
            ClassMessage::OwnerDown { node } => {
                out.push(node.tag(3, 7));
                out.extend_from_slice(&node.number().to_le_bytes());
                None
            }
            ClassMessage::OwnerBack { node } => {
                out.push(node.tag(4, 8));
                out.extend_from_slice(&node.number().to_le_bytes());
                None
            }
            ClassMessage::BorrowAll { ticket, .. } => {
                out.push(5);
                Some(ticket)
            }
            ClassMessage::LendAll { ticket, node } => {
                out.push(node.tag(6, 9));
                Some(ticket)
            }
        };
        if let Some(ticket) = ticket {
            out.extend_from_slice(&ticket.incarnation.to_le_bytes());
            out.extend_from_slice(&ticket.number.to_le_bytes());
        }
        match message {
            ClassMessage::Borrow {
                classes,
                holding,
                sent_at_ms,
                ..
            } => {
                out.extend_from_slice(&sent_at_ms.to_le_bytes());
                for list in [classes, holding] {
                    put_len(&mut out, list.len());
                    for class in list {
                        put_bytes(&mut out, class.as_bytes());
                    }
                }
            }
            ClassMessage::Lend { class, .. } => put_bytes(&mut out, class.as_bytes()),
            ClassMessage::BorrowAll {
                holding, sent_at_ms, ..
            } => {
                out.extend_from_slice(&sent_at_ms.to_le_bytes());
                put_len(&mut out, holding.len());
                for class in holding {
                    put_bytes(&mut out, class.as_bytes());
                }
            }
            ClassMessage::LendAll { node, .. } => out.extend_from_slice(&node.number().to_le_bytes()),
            ClassMessage::Release { .. } | ClassMessage::OwnerDown { .. } | ClassMessage::OwnerBack { .. } => {}
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Command, DecodeError> {
        if bytes.get(..4) != Some(MAGIC_CLASS.as_slice()) {
            return Txn::decode(bytes).map(Command::Txn);
        }
        let mut r = Reader::new(&bytes[4..]);
        let kind = r.take(1)?[0];
        let message = match kind {
            3 => ClassMessage::OwnerDown {
                node: NodeRef::Place(r.u64()?),
            },
            4 => ClassMessage::OwnerBack {
                node: NodeRef::Place(r.u64()?),
            },
            7 => ClassMessage::OwnerDown {
                node: NodeRef::Id(r.u64()?),
            },
            8 => ClassMessage::OwnerBack {
                node: NodeRef::Id(r.u64()?),
            },
            _ => Self::decode_ticketed(kind, &mut r)?,
        };
        r.finished()?;
        Ok(Command::Class(message))
    }

    /// A class message naming a ticket, after its kind.
    fn decode_ticketed(kind: u8, r: &mut Reader<'_>) -> Result<ClassMessage, DecodeError> {
        let ticket = Ticket {
            incarnation: r.u64()?,
            number: r.u64()?,
        };
        Ok(match kind {
            0 => {
                let sent_at_ms = r.u64()?;
                // Each class takes at least its 4-byte length.
                let classes = r.list(4, Reader::text)?;
                let holding = r.list(4, Reader::text)?;
                ClassMessage::Borrow {
                    ticket,
                    classes,
                    holding,
                    sent_at_ms,
                }
            }
            1 => ClassMessage::Lend {
                ticket,
                class: r.text()?,
            },
            2 => ClassMessage::Release { ticket },
            5 => {
                let sent_at_ms = r.u64()?;
                let holding = r.list(4, Reader::text)?;
                ClassMessage::BorrowAll {
                    ticket,
                    holding,
                    sent_at_ms,
                }
            }
            6 => ClassMessage::LendAll {
                ticket,
                node: NodeRef::Place(r.u64()?),
            },
            9 => ClassMessage::LendAll {
                ticket,
                node: NodeRef::Id(r.u64()?),
            },
            tag => return Err(DecodeError::Tag(tag)),
        })
    }
}

impl Txn {
    pub fn encode(&self) -> Vec<u8> {
        let body_len = match &self.body {
            Body::Statements(statements) => statements.iter().map(|s| s.sql.len() + 16).sum::<usize>(),
            Body::WriteSet(write_set) => write_set.len(),
        };
        let mut out = Vec::with_capacity(64 + body_len);
        out.extend_from_slice(match (&self.body, &self.certify) {
            (Body::Statements(_), None) => MAGIC_STATEMENTS,
            (Body::WriteSet(_), None) => MAGIC_WRITE_SET,
            (Body::Statements(_), Some(_)) => MAGIC_CERTIFIED_STATEMENTS,
            (Body::WriteSet(_), Some(_)) => MAGIC_CERTIFIED_WRITE_SET,
        });
        for n in [
            self.id.incarnation,
            self.id.seq,
            self.after.incarnation,
            self.after.seq,
            self.seed,
        ] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        if let Some(certify) = &self.certify {
            out.extend_from_slice(&certify.snapshot.0.to_le_bytes());
            out.extend_from_slice(&certify.snapshot.1.to_le_bytes());
            out.push(u8::from(certify.global));
            out.push(u8::from(certify.chain.is_some()));
            out.extend_from_slice(&certify.chain.unwrap_or(0).to_le_bytes());
            put_len(&mut out, certify.classes.len());
            for class in &certify.classes {
                put_bytes(&mut out, class.as_bytes());
            }
        }
        let statements = match &self.body {
            Body::Statements(statements) => statements,
            Body::WriteSet(write_set) => {
                put_bytes(&mut out, write_set);
                return out;
            }
        };
        put_len(&mut out, statements.len());
        for statement in statements {
            put_bytes(&mut out, statement.sql.as_bytes());
            put_len(&mut out, statement.params.len());
            for value in &statement.params {
                put_value(&mut out, value);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Txn, DecodeError> {
        let mut r = Reader { bytes, at: 0 };
        let magic = r.take(4)?;
        let (write_set, certified) = match magic.try_into().expect("4 bytes") {
            MAGIC_STATEMENTS => (false, false),
            MAGIC_WRITE_SET => (true, false),
            MAGIC_CERTIFIED_STATEMENTS => (false, true),
            MAGIC_CERTIFIED_WRITE_SET => (true, true),
            _ => return Err(DecodeError::Magic),
        };
        let id = TxnId {
            incarnation: r.u64()?,
            seq: r.u64()?,
        };
        let after = TxnId {
            incarnation: r.u64()?,
            seq: r.u64()?,
        };
        let seed = r.u64()?;
        let certify = certified.then(|| r.certify()).transpose()?;
        if write_set {
            let write_set = r.bytes()?.to_vec();
            r.finished()?;
            return Ok(Txn {
                id,
                after,
                seed,
                body: Body::WriteSet(write_set),
                certify,
            });
        }
        // A statement takes at least 8 bytes (its text's length and its parameters' count), a
        // value at least one.
        let statements = r.list(8, |r| {
            Ok(Statement {
                sql: r.text()?,
                params: r.list(1, Reader::value)?,
            })
        })?;
        r.finished()?;
        Ok(Txn {
            id,
            after,
            seed,
            body: Body::Statements(statements),
            certify,
        })
    }
}

pub(crate) fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(
        &u32::try_from(len)
            .expect("a transaction part under 4 GiB")
            .to_le_bytes(),
    );
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// A value as `Reader::value` reads it: a type tag, then the value.
pub(crate) fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.push(0),
        Value::Integer(i) => {
            out.push(1);
            out.extend_from_slice(&i.to_le_bytes());
        }
        Value::Real(f) => {
            out.push(2);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::Text(t) => {
            out.push(3);
            put_bytes(out, t.as_bytes());
        }
        Value::Blob(b) => {
            out.push(4);
            put_bytes(out, b);
        }
    }
}

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecodeError::Truncated(self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub(crate) fn finished(&self) -> Result<(), DecodeError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            left => Err(DecodeError::Trailing(left)),
        }
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub(crate) fn len(&mut self) -> Result<usize, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize)
    }

    /// A count, then that many items read by `item`, each taking at least `min_item_bytes` of
    /// the input: a count never reserves more than what is left of the input could hold.
    pub(crate) fn list<T>(
        &mut self,
        min_item_bytes: usize,
        mut item: impl FnMut(&mut Self) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, DecodeError> {
        let count = self.len()?;
        let left = self.bytes.len() - self.at;
        let mut items = Vec::with_capacity(count.min(left / min_item_bytes.max(1)));
        for _ in 0..count {
            items.push(item(self)?);
        }
        Ok(items)
    }

    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.len()?;
        self.take(len)
    }

    pub(crate) fn text(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError::Utf8)
    }

    pub(crate) fn value(&mut self) -> Result<Value, DecodeError> {
        Ok(match self.take(1)?[0] {
            0 => Value::Null,
            1 => Value::Integer(self.u64()? as i64),
            2 => Value::Real(f64::from_bits(self.u64()?)),
            3 => Value::Text(self.text()?),
            4 => Value::Blob(self.bytes()?.to_vec()),
            tag => return Err(DecodeError::Tag(tag)),
        })
    }

    /// A byte that must be 0 or 1.
    pub(crate) fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Malformed(what)),
        }
    }

    fn certify(&mut self) -> Result<Certify, DecodeError> {
        let snapshot = (
            self.u64()?,
            u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")),
        );
        let global = self.flag("a global flag that is neither 0 nor 1")?;
        let chained = self.flag("a chain flag that is neither 0 nor 1")?;
        let chain = self.u64()?;
        if !chained && chain != 0 {
            return Err(DecodeError::Malformed("a chain without its flag"));
        }
        let chain = chained.then_some(chain);
        // Each class takes at least its 4-byte length.
        let classes = self.list(4, Reader::text)?;
        Ok(Certify {
            snapshot,
            classes,
            global,
            chain,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Txn {
        Txn {
            id: TxnId { incarnation: 7, seq: 3 },
            after: TxnId { incarnation: 7, seq: 2 },
            seed: 0xfeed,
            body: Body::Statements(vec![
                Statement {
                    sql: "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)".into(),
                    params: vec![
                        Value::Null,
                        Value::Integer(-5),
                        Value::Real(2.5),
                        Value::Text("é".into()),
                        Value::Blob(vec![0, 1]),
                    ],
                },
                Statement {
                    sql: "DELETE FROM t".into(),
                    params: vec![],
                },
            ]),
            certify: None,
        }
    }

    fn certified(txn: Txn) -> Txn {
        Txn {
            certify: Some(Certify {
                snapshot: (41, 2),
                classes: vec!["1".into(), "é".into()],
                global: false,
                chain: Some(0b101),
            }),
            ..txn
        }
    }

    fn write_set_sample() -> Txn {
        Txn {
            body: Body::WriteSet(vec![b'T', 3, 1, 0, 1, b't', 0]),
            ..sample()
        }
    }

    #[test]
    fn a_decoded_transaction_equals_the_encoded_one() {
        for txn in [
            sample(),
            write_set_sample(),
            certified(sample()),
            certified(write_set_sample()),
        ] {
            assert_eq!(Txn::decode(&txn.encode()).unwrap(), txn);
        }
    }

    fn class_messages() -> Vec<Command> {
        let ticket = Ticket {
            incarnation: 11,
            number: 4,
        };
        vec![
            Command::Class(ClassMessage::Borrow {
                ticket,
                classes: vec!["3".into(), "é".into()],
                holding: vec!["1".into()],
                sent_at_ms: 1_764_000_000_000,
            }),
            Command::Class(ClassMessage::Lend {
                ticket,
                class: "3".into(),
            }),
            Command::Class(ClassMessage::Release { ticket }),
            Command::Class(ClassMessage::BorrowAll {
                ticket,
                holding: vec!["2".into()],
                sent_at_ms: 1_764_000_000_000,
            }),
        ]
        .into_iter()
        .chain([NodeRef::Id(7), NodeRef::Place(2)].into_iter().flat_map(|node| {
            [
                Command::Class(ClassMessage::OwnerDown { node }),
                Command::Class(ClassMessage::OwnerBack { node }),
                Command::Class(ClassMessage::LendAll { ticket, node }),
            ]
        }))
        .collect()
    }

    #[test]
    fn a_decoded_command_equals_the_encoded_one_and_every_truncation_is_an_error() {
        let mut commands = class_messages();
        commands.push(Command::Txn(certified(sample())));
        for command in commands {
            let bytes = command.encode();
            assert_eq!(Command::decode(&bytes).unwrap(), command);
            for cut in 0..bytes.len() {
                assert!(Command::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(Command::decode(&longer), Err(DecodeError::Trailing(1)));
        }
    }

    #[test]
    fn every_truncation_and_a_trailing_byte_are_errors() {
        for txn in [
            sample(),
            write_set_sample(),
            certified(sample()),
            certified(write_set_sample()),
        ] {
            let bytes = txn.encode();
            for cut in 0..bytes.len() {
                assert!(Txn::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(Txn::decode(&longer), Err(DecodeError::Trailing(1)));
        }
    }
}
