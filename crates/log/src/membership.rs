//! Who is in the cluster: raft's configuration (voters, learners, a joint configuration while
//! one changes) and where each member listens for peers.
//!
//! Addresses travel with the change that brings a node in (in the raft entry's context), so every
//! member learns them in log order; they are kept durably beside the configuration (a WAL record
//! with the index of the entry that made it) and in snapshots, so a node that restarts, or
//! catches up from a snapshot, knows where its peers are without being told again.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use protobuf::Message as _;
use raft::eraftpb::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState};

use crate::error::DecodeError;
use crate::wire::{put_blob, put_u32, put_u64, Reader};

/// Where each member listens for peers, by node id.
pub type Addresses = BTreeMap<u64, SocketAddr>;

/// Most members a configuration or an address book may list; more is malformed input.
const MAX_MEMBERS: usize = 1024;

/// The configuration in force and the addresses of its members.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Members {
    /// Index of the entry whose configuration change made this configuration (0: the one the
    /// cluster started with, or one of a build that did not record it).
    pub conf_index: u64,
    pub conf_state: ConfState,
    pub addresses: Addresses,
}

impl Members {
    /// Every node the configuration names: voters (incoming and outgoing) and learners.
    pub fn ids(&self) -> Vec<u64> {
        member_ids(&self.conf_state)
    }

    /// Whether a configuration change is half done (raft's joint consensus).
    pub fn joint(&self) -> bool {
        !self.conf_state.voters_outgoing.is_empty()
    }
}

/// Every node `cs` names, sorted, each once.
pub fn member_ids(cs: &ConfState) -> Vec<u64> {
    let mut ids: Vec<u64> = cs
        .voters
        .iter()
        .chain(&cs.voters_outgoing)
        .chain(&cs.learners)
        .chain(&cs.learners_next)
        .copied()
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A change an operator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberChange {
    /// A new node joins as a learner: it receives the log but neither votes nor counts for
    /// commit until promoted.
    AddLearner { id: u64, addr: SocketAddr },
    /// Learners become voters; more than one at once goes through a joint configuration.
    Promote(Vec<u64>),
    /// Members leave; more than one at once goes through a joint configuration.
    Remove(Vec<u64>),
    /// Voters become learners: they keep receiving and applying the log but neither vote nor
    /// count for commit — a leaving node's last step before its removal, so what it has under
    /// way still learns its outcome from the log.
    Demote(Vec<u64>),
}

impl MemberChange {
    /// The raft change, and the addresses it carries (in the entry's context).
    pub fn to_raft(&self) -> (ConfChangeV2, Addresses) {
        let single = |change_type: ConfChangeType, node_id: u64| {
            let mut change = ConfChangeSingle::default();
            change.set_change_type(change_type);
            change.node_id = node_id;
            change
        };
        let (changes, addresses): (Vec<ConfChangeSingle>, Addresses) = match self {
            MemberChange::AddLearner { id, addr } => (
                vec![single(ConfChangeType::AddLearnerNode, *id)],
                BTreeMap::from([(*id, *addr)]),
            ),
            MemberChange::Promote(ids) => (
                ids.iter().map(|id| single(ConfChangeType::AddNode, *id)).collect(),
                BTreeMap::new(),
            ),
            MemberChange::Remove(ids) => (
                ids.iter().map(|id| single(ConfChangeType::RemoveNode, *id)).collect(),
                BTreeMap::new(),
            ),
            // Raft makes a voter it is asked to add as a learner one.
            MemberChange::Demote(ids) => (
                ids.iter()
                    .map(|id| single(ConfChangeType::AddLearnerNode, *id))
                    .collect(),
                BTreeMap::new(),
            ),
        };
        let mut cc = ConfChangeV2::default();
        // One change is safe on its own; several go through joint consensus, which raft leaves
        // by itself once the joint configuration is committed.
        cc.set_transition(ConfChangeTransition::Auto);
        cc.set_changes(changes.into());
        (cc, addresses)
    }
}

pub fn encode_addresses(addresses: &Addresses, out: &mut Vec<u8>) {
    put_u32(out, addresses.len() as u32);
    for (id, addr) in addresses {
        put_u64(out, *id);
        put_blob(out, addr.to_string().as_bytes());
    }
}

pub fn decode_addresses(r: &mut Reader<'_>) -> Result<Addresses, DecodeError> {
    let count = r.u32()? as usize;
    if count > MAX_MEMBERS {
        return Err(DecodeError::TooLarge {
            size: count,
            limit: MAX_MEMBERS,
        });
    }
    let mut addresses = BTreeMap::new();
    for _ in 0..count {
        let id = r.u64()?;
        let addr = std::str::from_utf8(r.blob()?)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or(DecodeError::Invalid("member address"))?;
        if id == 0 || addresses.insert(id, addr).is_some() {
            return Err(DecodeError::Invalid("member id"));
        }
    }
    Ok(addresses)
}

/// A configuration change entry's context: the addresses it brings in.
pub fn decode_context(context: &[u8]) -> Result<Addresses, DecodeError> {
    if context.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut r = Reader::new(context);
    let addresses = decode_addresses(&mut r)?;
    r.finish()?;
    Ok(addresses)
}

pub fn encode_context(addresses: &Addresses) -> Vec<u8> {
    if addresses.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    encode_addresses(addresses, &mut out);
    out
}

/// The WAL record of the configuration: its index, raft's ConfState, the addresses.
pub fn encode_members(members: &Members) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + members.addresses.len() * 32);
    put_u64(&mut out, members.conf_index);
    put_blob(
        &mut out,
        &members
            .conf_state
            .write_to_bytes()
            .expect("encoding a ConfState cannot fail"),
    );
    encode_addresses(&members.addresses, &mut out);
    out
}

pub fn decode_members(payload: &[u8]) -> Result<Members, DecodeError> {
    let mut r = Reader::new(payload);
    let conf_index = r.u64()?;
    let conf_state = ConfState::parse_from_bytes(r.blob()?).map_err(|_| DecodeError::Invalid("conf state"))?;
    if member_ids(&conf_state).len() > MAX_MEMBERS {
        return Err(DecodeError::Invalid("conf state"));
    }
    let addresses = decode_addresses(&mut r)?;
    r.finish()?;
    Ok(Members {
        conf_index,
        conf_state,
        addresses,
    })
}

/// The peer service through which a node that does not lead hands a membership change to the
/// leader. The log's own, beside `replica_wait::SERVICE`: the last number, so applications'
/// services keep theirs.
pub const SERVICE: u8 = u8::MAX;

const CHANGE_ADD_LEARNER: u8 = 1;
const CHANGE_PROMOTE: u8 = 2;
const CHANGE_REMOVE: u8 = 3;
const CHANGE_DEMOTE: u8 = 4;

/// A change as a follower sends it to the leader.
pub fn encode_change(change: &MemberChange) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    let put_ids = |out: &mut Vec<u8>, ids: &[u64]| {
        put_u32(out, ids.len() as u32);
        for id in ids {
            put_u64(out, *id);
        }
    };
    match change {
        MemberChange::AddLearner { id, addr } => {
            out.push(CHANGE_ADD_LEARNER);
            put_u64(&mut out, *id);
            put_blob(&mut out, addr.to_string().as_bytes());
        }
        MemberChange::Promote(ids) => {
            out.push(CHANGE_PROMOTE);
            put_ids(&mut out, ids);
        }
        MemberChange::Remove(ids) => {
            out.push(CHANGE_REMOVE);
            put_ids(&mut out, ids);
        }
        MemberChange::Demote(ids) => {
            out.push(CHANGE_DEMOTE);
            put_ids(&mut out, ids);
        }
    }
    out
}

pub fn decode_change(body: &[u8]) -> Result<MemberChange, DecodeError> {
    let mut r = Reader::new(body);
    let ids = |r: &mut Reader<'_>| -> Result<Vec<u64>, DecodeError> {
        let count = r.u32()? as usize;
        if count > MAX_MEMBERS {
            return Err(DecodeError::TooLarge {
                size: count,
                limit: MAX_MEMBERS,
            });
        }
        (0..count).map(|_| r.u64()).collect()
    };
    let change = match r.u8()? {
        CHANGE_ADD_LEARNER => MemberChange::AddLearner {
            id: r.u64()?,
            addr: std::str::from_utf8(r.blob()?)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or(DecodeError::Invalid("member address"))?,
        },
        CHANGE_PROMOTE => MemberChange::Promote(ids(&mut r)?),
        CHANGE_REMOVE => MemberChange::Remove(ids(&mut r)?),
        CHANGE_DEMOTE => MemberChange::Demote(ids(&mut r)?),
        _ => return Err(DecodeError::Invalid("membership change kind")),
    };
    r.finish()?;
    Ok(change)
}

const ANSWER_DONE: u8 = 0;
const ANSWER_REFUSED: u8 = 1;
const ANSWER_FAILED: u8 = 2;

/// What the leader made of a forwarded change: the configuration once applied, a refusal (the
/// change cannot be made as asked), or another failure (a timeout, a leader change).
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeAnswer {
    Done(Members),
    Refused(String),
    Failed(String),
}

pub fn encode_answer(answer: &ChangeAnswer) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    match answer {
        ChangeAnswer::Done(members) => {
            out.push(ANSWER_DONE);
            out.extend_from_slice(&encode_members(members));
        }
        ChangeAnswer::Refused(reason) => {
            out.push(ANSWER_REFUSED);
            put_blob(&mut out, reason.as_bytes());
        }
        ChangeAnswer::Failed(reason) => {
            out.push(ANSWER_FAILED);
            put_blob(&mut out, reason.as_bytes());
        }
    }
    out
}

pub fn decode_answer(body: &[u8]) -> Result<ChangeAnswer, DecodeError> {
    let (&kind, rest) = body.split_first().ok_or(DecodeError::Invalid("empty answer"))?;
    let text = |rest: &[u8]| -> Result<String, DecodeError> {
        let mut r = Reader::new(rest);
        let text = String::from_utf8_lossy(r.blob()?).into_owned();
        r.finish()?;
        Ok(text)
    };
    Ok(match kind {
        ANSWER_DONE => ChangeAnswer::Done(decode_members(rest)?),
        ANSWER_REFUSED => ChangeAnswer::Refused(text(rest)?),
        ANSWER_FAILED => ChangeAnswer::Failed(text(rest)?),
        _ => return Err(DecodeError::Invalid("membership answer kind")),
    })
}

/// The addresses of the configuration `cs` makes, after a change that brought `added`: known
/// ones kept, new ones added, those of nodes that left dropped.
pub fn addresses_after(known: &Addresses, added: &Addresses, cs: &ConfState) -> Addresses {
    let ids = member_ids(cs);
    known
        .iter()
        .chain(added)
        .filter(|(id, _)| ids.binary_search(id).is_ok())
        .map(|(id, addr)| (*id, *addr))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_changes_and_answers_round_trip_and_cut_ones_are_errors() {
        let changes = [
            MemberChange::AddLearner {
                id: 4,
                addr: "127.0.0.4:7004".parse().unwrap(),
            },
            MemberChange::Promote(vec![4, 5]),
            MemberChange::Remove(vec![1]),
            MemberChange::Demote(vec![2, 3]),
        ];
        for change in changes {
            let bytes = encode_change(&change);
            assert_eq!(decode_change(&bytes).unwrap(), change);
            for cut in 0..bytes.len() {
                assert!(decode_change(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let answers = [
            ChangeAnswer::Done(Members {
                conf_index: 9,
                conf_state: ConfState {
                    voters: vec![1, 2, 3],
                    ..ConfState::default()
                },
                addresses: [(1, "127.0.0.1:7001".parse().unwrap())].into(),
            }),
            ChangeAnswer::Refused("another membership change is under way".into()),
            ChangeAnswer::Failed("timed out".into()),
        ];
        for answer in answers {
            let bytes = encode_answer(&answer);
            assert_eq!(decode_answer(&bytes).unwrap(), answer);
            assert!(decode_answer(&bytes[..bytes.len() - 1]).is_err());
        }
        assert!(decode_change(&[9]).is_err());
        assert!(decode_answer(&[]).is_err());
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn members_round_trip_and_malformed_records_are_refused() {
        let members = Members {
            conf_index: 42,
            conf_state: ConfState {
                voters: vec![1, 2, 3],
                learners: vec![4],
                ..Default::default()
            },
            addresses: BTreeMap::from([(1, addr(1)), (2, addr(2)), (3, addr(3)), (4, addr(4))]),
        };
        let bytes = encode_members(&members);
        assert_eq!(decode_members(&bytes).unwrap(), members);
        for cut in 0..bytes.len() {
            assert!(decode_members(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(decode_members(&trailing).is_err());
        let mut bad_addr = Vec::new();
        put_u32(&mut bad_addr, 1);
        put_u64(&mut bad_addr, 5);
        put_blob(&mut bad_addr, b"not an address");
        assert_eq!(
            decode_context(&bad_addr).unwrap_err(),
            DecodeError::Invalid("member address")
        );
        let mut huge = Vec::new();
        put_u32(&mut huge, u32::MAX);
        assert!(matches!(decode_context(&huge), Err(DecodeError::TooLarge { .. })));
    }

    #[test]
    fn a_change_carries_the_new_nodes_address_and_departures_drop_theirs() {
        let (cc, added) = MemberChange::AddLearner { id: 4, addr: addr(4) }.to_raft();
        assert_eq!(cc.changes.len(), 1);
        assert_eq!(cc.changes[0].get_change_type(), ConfChangeType::AddLearnerNode);
        assert_eq!(decode_context(&encode_context(&added)).unwrap(), added);
        let known = BTreeMap::from([(1, addr(1)), (2, addr(2)), (3, addr(3))]);
        let grown = ConfState {
            voters: vec![1, 2, 3],
            learners: vec![4],
            ..Default::default()
        };
        assert_eq!(addresses_after(&known, &added, &grown).len(), 4);
        let shrunk = ConfState {
            voters: vec![1, 2, 4],
            ..Default::default()
        };
        let after = addresses_after(&addresses_after(&known, &added, &grown), &BTreeMap::new(), &shrunk);
        assert_eq!(after.keys().copied().collect::<Vec<_>>(), vec![1, 2, 4]);
        let (promote, none) = MemberChange::Promote(vec![4, 5]).to_raft();
        assert_eq!(promote.changes.len(), 2);
        assert!(none.is_empty() && encode_context(&none).is_empty());
        let (demote, none) = MemberChange::Demote(vec![2]).to_raft();
        assert_eq!(demote.changes[0].get_change_type(), ConfChangeType::AddLearnerNode);
        assert!(none.is_empty());
    }
}
