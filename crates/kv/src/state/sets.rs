//! Sets: each set is one group of the store with a record per member (`S`, the key's length as
//! 4 big-endian bytes, the key, then the member; the value is empty), as a hash has one per
//! field, so adding one member to a large set writes one record and SCARD counts without
//! reading. SPOP's pick is fixed by the log: it is drawn from the leader's time for the entry,
//! the key and the set's size, which every replica has alike.

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};
use chorus_resp::Value;

use super::{group_prefix, scan_position, xorshift, KeyType, KvState, SET_TAG};
use crate::command::{SetOp, SetRead, SetWrite};
use crate::glob::glob_match;
use crate::keyspace_events;

pub(super) fn set_prefix(key: &[u8]) -> BytesMut {
    group_prefix(SET_TAG, key)
}

pub(super) fn member_key(key: &[u8], member: &[u8]) -> Bytes {
    let mut k = set_prefix(key);
    k.put_slice(member);
    k.freeze()
}

impl KvState {
    pub(super) fn is_set(&self, key: &[u8]) -> bool {
        self.holds_group(SET_TAG, key)
    }

    fn set_len(&mut self, key: &[u8]) -> usize {
        self.group_size(SET_TAG, key)
    }

    fn is_member(&self, key: &[u8], member: &[u8]) -> bool {
        !self.expired(key) && self.store.contains(&member_key(key, member))
    }

    /// A set's members in member order: none for a key that holds nothing, `WRONGTYPE` for one
    /// that holds something else.
    pub(super) fn set_members(&mut self, key: &[u8]) -> Result<Vec<Bytes>, Value> {
        if !self.type_check(key, KeyType::Set)? {
            return Ok(Vec::new());
        }
        let prefix = set_prefix(key);
        Ok(self
            .store
            .group_keys(&prefix)
            .into_iter()
            .map(|k| k.slice(prefix.len()..))
            .collect())
    }

    /// SINTER / SUNION / SDIFF of `keys`, as Redis checks them: every key's type first.
    fn set_operation(&mut self, op: SetOp, keys: &[Bytes]) -> Result<BTreeSet<Bytes>, Value> {
        let mut sets = Vec::with_capacity(keys.len());
        for key in keys {
            sets.push(self.set_members(key)?);
        }
        let mut sets = sets
            .into_iter()
            .map(|members| members.into_iter().collect::<BTreeSet<_>>());
        let first = sets.next().unwrap_or_default();
        Ok(match op {
            SetOp::Union => sets.fold(first, |acc, s| &acc | &s),
            SetOp::Diff => sets.fold(first, |acc, s| &acc - &s),
            SetOp::Inter => sets.fold(first, |acc, s| &acc & &s),
        })
    }

    /// The members SPOP takes from `key`'s `members`: `count` of them (one if `None`), drawn
    /// from the entry's time, the key and the set's size.
    fn spop_picks(&self, key: &[u8], members: &[Bytes], count: usize) -> Vec<Bytes> {
        if count >= members.len() {
            return members.to_vec();
        }
        let mut state = (self.now_ms ^ scan_position(key) ^ (members.len() as u64).rotate_left(32)) | 1;
        let mut order: Vec<usize> = (0..members.len()).collect();
        for i in 0..count {
            let j = i + (xorshift(&mut state) % (members.len() - i) as u64) as usize;
            order.swap(i, j);
        }
        order[..count].iter().map(|i| members[*i].clone()).collect()
    }

    fn remove_members(&mut self, index: u64, key: &[u8], members: &[Bytes]) {
        for member in members {
            self.store.write(index, member_key(key, member), None);
        }
        if self.set_len(key) == 0 {
            self.set_deadline(index, key, None);
        }
    }

    /// Replaces what `destination` holds with `members` (deleting it if there are none).
    fn store_set(&mut self, index: u64, destination: &[u8], members: impl IntoIterator<Item = Bytes>) {
        self.delete(index, destination);
        for member in members {
            self.store
                .write(index, member_key(destination, &member), Some(Bytes::new()));
        }
    }

    /// Applies a set write from the entry at `index`.
    pub(super) fn execute_set_write(&mut self, index: u64, write: SetWrite) -> Value {
        match write {
            SetWrite::Add { key, members } => self.sadd(index, &key, members),
            SetWrite::Remove { key, members } => self.srem(index, &key, members),
            SetWrite::Pop { key, count } => self.spop(index, &key, count),
            SetWrite::Move { from, to, member } => self.smove(index, &from, &to, &member),
            SetWrite::Store { op, destination, keys } => self.set_store(index, op, &destination, &keys),
        }
    }

    fn sadd(&mut self, index: u64, key: &[u8], members: Vec<Bytes>) -> Value {
        if let Err(e) = self.type_check(key, KeyType::Set) {
            return e;
        }
        let mut added = 0;
        for member in members {
            added += i64::from(!self.store.write(index, member_key(key, &member), Some(Bytes::new())));
        }
        if added > 0 {
            self.notify(keyspace_events::SET, "sadd", key);
        }
        Value::Integer(added)
    }

    fn srem(&mut self, index: u64, key: &[u8], members: Vec<Bytes>) -> Value {
        match self.type_check(key, KeyType::Set) {
            Err(e) => return e,
            Ok(false) => return Value::Integer(0),
            Ok(true) => {}
        }
        let present: BTreeSet<Bytes> = members.into_iter().filter(|m| self.is_member(key, m)).collect();
        let present: Vec<Bytes> = present.into_iter().collect();
        self.remove_members(index, key, &present);
        if !present.is_empty() {
            self.notify(keyspace_events::SET, "srem", key);
            self.notify_if_emptied(key);
        }
        Value::Integer(present.len() as i64)
    }

    fn spop(&mut self, index: u64, key: &[u8], count: Option<usize>) -> Value {
        let members = match self.set_members(key) {
            Err(e) => return e,
            Ok(members) => members,
        };
        let picks = self.spop_picks(key, &members, count.unwrap_or(1));
        self.remove_members(index, key, &picks);
        if !picks.is_empty() {
            self.notify(keyspace_events::SET, "spop", key);
            self.notify_if_emptied(key);
        }
        spop_reply(picks, count)
    }

    fn smove(&mut self, index: u64, from: &[u8], to: &[u8], member: &Bytes) -> Value {
        match self.smove_outcome(from, to, member) {
            Err(e) => e,
            Ok(false) => Value::Integer(0),
            Ok(true) => {
                if from != to {
                    self.remove_members(index, from, std::slice::from_ref(member));
                    self.notify(keyspace_events::SET, "srem", from);
                    self.notify_if_emptied(from);
                    if !self.store.write(index, member_key(to, member), Some(Bytes::new())) {
                        self.notify(keyspace_events::SET, "sadd", to);
                    }
                }
                Value::Integer(1)
            }
        }
    }

    /// Whether SMOVE moves `member`, checked as Redis checks: a missing source is 0 whatever
    /// the destination holds.
    fn smove_outcome(&mut self, from: &[u8], to: &[u8], member: &[u8]) -> Result<bool, Value> {
        if !self.exists(from) {
            return Ok(false);
        }
        self.type_check(from, KeyType::Set)?;
        self.type_check(to, KeyType::Set)?;
        Ok(self.is_member(from, member))
    }

    fn set_store(&mut self, index: u64, op: SetOp, destination: &[u8], keys: &[Bytes]) -> Value {
        match self.set_operation(op, keys) {
            Err(e) => e,
            Ok(result) => {
                let len = result.len();
                let existed = self.collecting_events && self.exists(destination);
                self.store_set(index, destination, result);
                if len > 0 {
                    let event = match op {
                        SetOp::Inter => "sinterstore",
                        SetOp::Union => "sunionstore",
                        SetOp::Diff => "sdiffstore",
                    };
                    self.notify(keyspace_events::SET, event, destination);
                } else if existed {
                    self.notify(keyspace_events::GENERIC, "del", destination);
                }
                Value::Integer(len as i64)
            }
        }
    }

    /// What applying a set write would answer, without applying it (see `preview_write`).
    pub(super) fn preview_set_write(&mut self, write: &SetWrite) -> Value {
        match write {
            SetWrite::Add { key, members } => match self.type_check(key, KeyType::Set) {
                Err(e) => e,
                Ok(_) => {
                    let distinct: BTreeSet<&Bytes> = members.iter().collect();
                    Value::Integer(distinct.into_iter().filter(|m| !self.is_member(key, m)).count() as i64)
                }
            },
            SetWrite::Remove { key, members } => match self.type_check(key, KeyType::Set) {
                Err(e) => e,
                Ok(_) => {
                    let distinct: BTreeSet<&Bytes> = members.iter().collect();
                    Value::Integer(distinct.into_iter().filter(|m| self.is_member(key, m)).count() as i64)
                }
            },
            SetWrite::Pop { key, count } => match self.set_members(key) {
                Err(e) => e,
                Ok(members) => spop_reply(self.spop_picks(key, &members, count.unwrap_or(1)), *count),
            },
            SetWrite::Move { from, to, member } => match self.smove_outcome(from, to, member) {
                Err(e) => e,
                Ok(moved) => Value::Integer(i64::from(moved)),
            },
            SetWrite::Store { op, keys, .. } => match self.set_operation(*op, keys) {
                Err(e) => e,
                Ok(result) => Value::Integer(result.len() as i64),
            },
        }
    }

    pub(super) fn read_set(&mut self, read: &SetRead) -> Result<Value, Value> {
        Ok(match read {
            SetRead::Members(key) => Value::Set(self.set_members(key)?.into_iter().map(Value::bulk).collect()),
            SetRead::IsMember { key, member } => {
                self.type_check(key, KeyType::Set)?;
                Value::Integer(i64::from(self.is_member(key, member)))
            }
            SetRead::MIsMember { key, members } => {
                self.type_check(key, KeyType::Set)?;
                Value::array(
                    members
                        .iter()
                        .map(|m| Value::Integer(i64::from(self.is_member(key, m))))
                        .collect(),
                )
            }
            SetRead::Card(key) => {
                self.type_check(key, KeyType::Set)?;
                Value::Integer(self.set_len(key) as i64)
            }
            SetRead::RandMember { key, count } => {
                let members = self.set_members(key)?;
                match count {
                    None if members.is_empty() => Value::null(),
                    None => Value::bulk(members[self.random_below(members.len())].clone()),
                    Some(count) => Value::array(
                        self.random_picks(members.len(), *count)
                            .into_iter()
                            .map(|i| Value::bulk(members[i].clone()))
                            .collect(),
                    ),
                }
            }
            SetRead::Operation { op, keys } => {
                Value::Set(self.set_operation(*op, keys)?.into_iter().map(Value::bulk).collect())
            }
            SetRead::InterCard { keys, limit } => {
                let len = self.set_operation(SetOp::Inter, keys)?.len();
                Value::Integer(if *limit == 0 { len } else { len.min(*limit) } as i64)
            }
            SetRead::Scan { key, args } => {
                let members = self.set_members(key)?;
                let matching = members
                    .into_iter()
                    .filter(|m| args.pattern.as_ref().is_none_or(|p| glob_match(p, m, false)))
                    .map(Value::bulk)
                    .collect();
                // The whole set at once, as Redis answers for small sets: cursor 0.
                Value::array(vec![Value::bulk("0"), Value::array(matching)])
            }
        })
    }
}

/// SPOP's reply: one member (or nil) without a count, a set with one.
fn spop_reply(picks: Vec<Bytes>, count: Option<usize>) -> Value {
    match count {
        None => Value::Bulk(picks.into_iter().next()),
        Some(_) => Value::Set(picks.into_iter().map(Value::bulk).collect()),
    }
}
