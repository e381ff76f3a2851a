//! Sorted sets: each is one group of the store holding two records per member, so adding to or
//! removing from a large set writes two records and never rewrites the set:
//!
//! - `m` then the member, whose value is the score (an f64's 8 bytes, big-endian): ZSCORE, and
//!   the members in member order (the BYLEX ranges);
//! - `o`, the score in an order-keeping 8 bytes, then the member, with no value: the members in
//!   score order, ties by member, as Redis orders them (ZRANGE, ZPOPMIN, ranks).
//!
//! Every write is first planned — its reply and the scores it changes, read without writing —
//! then applied, so what CURP previews and what the log applies are one computation.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use bytes::{BufMut, Bytes, BytesMut};
use chorus_resp::{format_double, Double, Value};

use super::{group_prefix, unreadable_value, KeyType, KvState, WRONGTYPE, ZSET_TAG};
use crate::command::{
    Aggregate, CombineOptions, CommandError, Direction, LexBound, RangeQuery, ScoreBound, SearchCommand, SetCondition,
    ZRange, ZsetOp, ZsetRead, ZsetWrite,
};
use crate::glob::glob_match;
use crate::keyspace_events;

/// Members and their scores.
type Members = Vec<(Bytes, f64)>;

const SCORE_RECORD: u8 = b'm';
const ORDER_RECORD: u8 = b'o';
/// The byte after `ORDER_RECORD`: every order record sorts below it.
const AFTER_ORDER_RECORDS: u8 = ORDER_RECORD + 1;
const AFTER_SCORE_RECORDS: u8 = SCORE_RECORD + 1;

pub(super) fn zset_prefix(key: &[u8]) -> BytesMut {
    group_prefix(ZSET_TAG, key)
}

fn score_key(key: &[u8], member: &[u8]) -> Bytes {
    let mut k = zset_prefix(key);
    k.put_u8(SCORE_RECORD);
    k.put_slice(member);
    k.freeze()
}

fn order_key(key: &[u8], score: f64, member: &[u8]) -> Bytes {
    let mut k = zset_prefix(key);
    k.put_u8(ORDER_RECORD);
    k.put_slice(&order_bytes(score));
    k.put_slice(member);
    k.freeze()
}

/// A score as 8 bytes that sort as the scores do (-0 as 0, which Redis also orders alike).
fn order_bytes(score: f64) -> [u8; 8] {
    order_number(score).to_be_bytes()
}

fn order_number(score: f64) -> u64 {
    let bits = (score + 0.0).to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

fn score_of_order_number(n: u64) -> f64 {
    f64::from_bits(if n >> 63 == 1 { n & !(1 << 63) } else { !n })
}

/// An order record's score and member (`rest` is the key after the set's prefix).
fn split_order_record(rest: &Bytes) -> (f64, Bytes) {
    let Some(order) = rest.get(1..9) else {
        unreadable_value()
    };
    let n = u64::from_be_bytes(order.try_into().expect("8 bytes"));
    (score_of_order_number(n), rest.slice(9..))
}

/// A key bound for order records: `[o][score]`, or just past every record of `score`.
fn order_bound(score: f64, past: bool) -> Vec<u8> {
    let n = order_number(score) + u64::from(past);
    let mut bound = vec![ORDER_RECORD];
    bound.extend_from_slice(&n.to_be_bytes());
    bound
}

/// What a planned write does: its reply, and per member of `key` the score it had and the one
/// it gets (`None`: not a member), after first emptying `key` if `replace`.
struct Plan {
    reply: Value,
    key: Bytes,
    replace: bool,
    changes: BTreeMap<Bytes, (Option<f64>, Option<f64>)>,
}

impl Plan {
    fn reply(key: &Bytes, reply: Value) -> Plan {
        Plan {
            reply,
            key: key.clone(),
            replace: false,
            changes: BTreeMap::new(),
        }
    }
}

/// Key bounds (after the set's prefix) of the records a range selects: order records for
/// ranks and scores, score records (`by_member`) for lex ranges.
pub(super) struct KeyBounds {
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    by_member: bool,
}

impl KeyBounds {
    fn borrowed(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (
            self.from.as_ref().map(Vec::as_slice),
            self.to.as_ref().map(Vec::as_slice),
        )
    }
}

pub(super) fn score_bounds(min: &ScoreBound, max: &ScoreBound) -> KeyBounds {
    KeyBounds {
        from: Bound::Included(order_bound(min.score.0, min.exclusive)),
        to: Bound::Excluded(order_bound(max.score.0, !max.exclusive)),
        by_member: false,
    }
}

fn lex_bounds(min: &LexBound, max: &LexBound) -> KeyBounds {
    let member = |m: &Bytes| [&[SCORE_RECORD][..], m].concat();
    let lower = match min {
        LexBound::Lowest => Bound::Included(vec![SCORE_RECORD]),
        LexBound::Highest => Bound::Included(vec![AFTER_SCORE_RECORDS]),
        LexBound::Inclusive(m) => Bound::Included(member(m)),
        LexBound::Exclusive(m) => Bound::Excluded(member(m)),
    };
    let upper = match max {
        LexBound::Lowest => Bound::Excluded(vec![SCORE_RECORD]),
        LexBound::Highest => Bound::Excluded(vec![AFTER_SCORE_RECORDS]),
        LexBound::Inclusive(m) => Bound::Included(member(m)),
        LexBound::Exclusive(m) => Bound::Excluded(member(m)),
    };
    KeyBounds {
        from: lower,
        to: upper,
        by_member: true,
    }
}

fn all_order_records() -> KeyBounds {
    KeyBounds {
        from: Bound::Included(vec![ORDER_RECORD]),
        to: Bound::Excluded(vec![AFTER_ORDER_RECORDS]),
        by_member: false,
    }
}

/// `[member, score]` pairs as ZRANGE answers them (scores only WITHSCORES).
fn range_reply(members: Members, with_scores: bool) -> Value {
    if with_scores {
        Value::Pairs(
            members
                .into_iter()
                .map(|(m, s)| (Value::bulk(m), Value::Double(Double(s))))
                .collect(),
        )
    } else {
        Value::array(members.into_iter().map(|(m, _)| Value::bulk(m)).collect())
    }
}

/// ZPOPMIN's reply: `member, score` pairs with a count (nested in RESP3), a flat pair without.
fn popped_reply(popped: &[(Bytes, f64)], count: Option<usize>) -> Value {
    let pairs = popped
        .iter()
        .map(|(m, s)| (Value::bulk(m.clone()), Value::Double(Double(*s))));
    match count {
        Some(_) => Value::Pairs(pairs.collect()),
        None => Value::array(pairs.flat_map(|(m, s)| [m, s]).collect()),
    }
}

impl KvState {
    pub(super) fn is_zset(&self, key: &[u8]) -> bool {
        self.holds_group(ZSET_TAG, key)
    }

    fn zset_len(&mut self, key: &[u8]) -> usize {
        self.group_size(ZSET_TAG, key) / 2
    }

    /// `member`'s score in `key`, which is a live sorted set (or nothing).
    pub(super) fn zscore(&mut self, key: &[u8], member: &[u8]) -> Option<f64> {
        if self.expired(key) {
            return None;
        }
        let value = self
            .store
            .get(&score_key(key, member))
            .unwrap_or_else(|e| super::unreadable(e))?;
        match <[u8; 8]>::try_from(value.as_ref()) {
            Ok(bits) => Some(f64::from_be_bytes(bits)),
            Err(_) => unreadable_value(),
        }
    }

    /// The members (and scores) of `key` in the records `bounds` select, in their order or
    /// backwards, skipping `skip`, at most `take`; none once `key` has expired (its records stay
    /// until its deletion applies).
    pub(super) fn zset_records(
        &mut self,
        key: &[u8],
        bounds: &KeyBounds,
        skip: usize,
        take: usize,
        backwards: bool,
    ) -> Members {
        if self.expired(key) {
            return Vec::new();
        }
        let prefix = zset_prefix(key);
        let keys = self
            .store
            .group_keys_between(&prefix, bounds.borrowed(), skip, take, backwards);
        keys.into_iter()
            .map(|k| {
                let rest = k.slice(prefix.len()..);
                if bounds.by_member {
                    let member = rest.slice(1..);
                    let score = self.zscore(key, &member).unwrap_or_else(|| unreadable_value());
                    (member, score)
                } else {
                    let (score, member) = split_order_record(&rest);
                    (member, score)
                }
            })
            .collect()
    }

    /// The members a range selects, in order (`reverse`: from the highest), after LIMIT.
    fn zset_range(&mut self, key: &[u8], query: &RangeQuery) -> Members {
        let (bounds, skip, take) = match &query.range {
            ZRange::Rank { start, stop } => {
                let len = self.zset_len(key) as i64;
                let (mut start, mut stop) = (*start, *stop);
                if start < 0 {
                    start += len;
                }
                if stop < 0 {
                    stop += len;
                }
                start = start.max(0);
                if start > stop || start >= len {
                    return Vec::new();
                }
                stop = stop.min(len - 1);
                (all_order_records(), start as usize, (stop - start + 1) as usize)
            }
            ZRange::Score { .. } | ZRange::Lex { .. } if query.offset < 0 || query.count == 0 => return Vec::new(),
            ZRange::Score { min, max } => (score_bounds(min, max), query.offset as usize, limit_take(query.count)),
            ZRange::Lex { min, max } => (lex_bounds(min, max), query.offset as usize, limit_take(query.count)),
        };
        self.zset_records(key, &bounds, skip, take, query.reverse)
    }

    /// Whether `key` is a sorted set: `Ok(false)` if it holds nothing, `WRONGTYPE` otherwise.
    fn zset_check(&self, key: &[u8]) -> Result<bool, Value> {
        self.type_check(key, KeyType::Zset)
    }

    /// The reply and the changes of a sorted-set write, without applying them.
    fn zset_plan(&mut self, write: &ZsetWrite) -> Result<Plan, Value> {
        match write {
            ZsetWrite::Add { key, options, pairs } => {
                self.zset_check(key)?;
                let mut plan = Plan::reply(key, Value::Integer(0));
                let (mut added, mut changed) = (0, 0);
                let mut last_score = None;
                for (Double(score), member) in pairs {
                    let current = match plan.changes.get(member) {
                        Some((_, now)) => *now,
                        None => self.zscore(key, member),
                    };
                    let new_score = match current {
                        Some(current) => {
                            if options.condition == SetCondition::IfAbsent {
                                last_score = None;
                                continue;
                            }
                            let new_score = if options.increment { current + score } else { *score };
                            if new_score.is_nan() {
                                return Err(Value::error("ERR resulting score is not a number (NaN)"));
                            }
                            let refused = match options.only {
                                Some(Direction::Up) => new_score <= current,
                                Some(Direction::Down) => new_score >= current,
                                None => false,
                            };
                            if refused {
                                last_score = None;
                                continue;
                            }
                            last_score = Some(new_score);
                            if new_score == current {
                                continue;
                            }
                            changed += 1;
                            new_score
                        }
                        None => {
                            if options.condition == SetCondition::IfPresent {
                                last_score = None;
                                continue;
                            }
                            added += 1;
                            last_score = Some(*score);
                            *score
                        }
                    };
                    let before = plan.changes.get(member).map_or(current, |(before, _)| *before);
                    plan.changes.insert(member.clone(), (before, Some(new_score)));
                }
                plan.reply = if options.increment {
                    last_score.map_or_else(Value::null, |s| Value::Double(Double(s)))
                } else {
                    Value::Integer(added + if options.count_changed { changed } else { 0 })
                };
                Ok(plan)
            }
            ZsetWrite::Remove { key, members } => {
                self.zset_check(key)?;
                let mut plan = Plan::reply(key, Value::Integer(0));
                for member in members {
                    if !plan.changes.contains_key(member) {
                        if let Some(score) = self.zscore(key, member) {
                            plan.changes.insert(member.clone(), (Some(score), None));
                        }
                    }
                }
                plan.reply = Value::Integer(plan.changes.len() as i64);
                Ok(plan)
            }
            ZsetWrite::Pop { key, highest, count } => {
                self.zset_check(key)?;
                let popped = self.zset_records(key, &all_order_records(), 0, count.unwrap_or(1), *highest);
                let mut plan = Plan::reply(key, popped_reply(&popped, *count));
                for (member, score) in popped {
                    plan.changes.insert(member, (Some(score), None));
                }
                Ok(plan)
            }
            ZsetWrite::MultiPop { keys, highest, count } => {
                for key in keys {
                    if !self.zset_check(key)? {
                        continue;
                    }
                    let popped = self.zset_records(key, &all_order_records(), 0, *count, *highest);
                    let pairs = popped
                        .iter()
                        .map(|(m, s)| Value::array(vec![Value::bulk(m.clone()), Value::Double(Double(*s))]))
                        .collect();
                    let mut plan = Plan::reply(key, Value::array(vec![Value::bulk(key.clone()), Value::array(pairs)]));
                    for (member, score) in popped {
                        plan.changes.insert(member, (Some(score), None));
                    }
                    return Ok(plan);
                }
                Ok(Plan::reply(&Bytes::new(), Value::Array(None)))
            }
            ZsetWrite::RemoveRange { key, range } => {
                self.zset_check(key)?;
                let query = RangeQuery {
                    range: range.clone(),
                    reverse: false,
                    offset: 0,
                    count: -1,
                    with_scores: false,
                };
                let removed = self.zset_range(key, &query);
                let mut plan = Plan::reply(key, Value::Integer(removed.len() as i64));
                for (member, score) in removed {
                    plan.changes.insert(member, (Some(score), None));
                }
                Ok(plan)
            }
            ZsetWrite::RangeStore {
                destination,
                source,
                query,
            } => {
                self.zset_check(source)?;
                let members = self.zset_range(source, query);
                Ok(replacing_plan(destination, members))
            }
            ZsetWrite::CombineStore {
                op,
                destination,
                keys,
                options,
            } => {
                let members = self.combine(*op, keys, options)?;
                Ok(replacing_plan(destination, members))
            }
            ZsetWrite::GeoStore(search) => {
                let members = self
                    .geo_search(search)?
                    .map_or_else(Vec::new, |searched| searched.stored());
                let destination = search.destination().expect("a storing search has a destination");
                Ok(replacing_plan(destination, members))
            }
        }
    }

    /// The members and scores of each of `keys` (a set's members score 1), in key order; then,
    /// as Redis checks them, what `options` say (WRONGTYPE comes first).
    fn combine_sources(
        &mut self,
        keys: &[Bytes],
        options: &Result<CombineOptions, CommandError>,
    ) -> Result<(Vec<Members>, CombineOptions), Value> {
        for key in keys {
            if !matches!(self.key_type(key), None | Some(KeyType::Zset | KeyType::Set)) {
                return Err(Value::error(WRONGTYPE));
            }
        }
        let options = options.clone().map_err(Value::error)?;
        let mut sources = Vec::with_capacity(keys.len());
        for key in keys {
            sources.push(match self.key_type(key) {
                Some(KeyType::Set) => self.set_members(key)?.into_iter().map(|m| (m, 1.0)).collect(),
                _ => self.zset_members(key),
            });
        }
        Ok((sources, options))
    }

    /// ZUNION, ZINTER or ZDIFF of `keys`, in score order. Scores are computed as Redis 7.0
    /// computes them, in its order, so sums of floats round alike: union and intersection go
    /// through the keys from the smallest (stably), a weighted score that is NaN (inf × 0) counts
    /// as 0 and so does a sum that is (inf − inf); ZDIFF keeps the first key's scores.
    fn combine(
        &mut self,
        op: ZsetOp,
        keys: &[Bytes],
        options: &Result<CombineOptions, CommandError>,
    ) -> Result<Members, Value> {
        let (sources, options) = self.combine_sources(keys, options)?;
        let mut weighted: Vec<(Members, f64)> = sources.into_iter().zip(options.weights.iter().map(|w| w.0)).collect();
        let nan_as_zero = |score: f64| if score.is_nan() { 0.0 } else { score };
        let mut combined: Members = match op {
            ZsetOp::Union => {
                weighted.sort_by_key(|(members, _)| members.len());
                let mut scores: HashMap<Bytes, f64> = HashMap::new();
                for (members, weight) in weighted {
                    for (member, score) in members {
                        let score = nan_as_zero(weight * score);
                        scores
                            .entry(member)
                            .and_modify(|total| *total = aggregate(options.aggregate, *total, score))
                            .or_insert(score);
                    }
                }
                scores.into_iter().collect()
            }
            ZsetOp::Inter => {
                weighted.sort_by_key(|(members, _)| members.len());
                intersection(weighted, options.aggregate, usize::MAX)
            }
            ZsetOp::Diff => {
                let mut sources = weighted.into_iter().map(|(members, _)| members);
                let first = sources.next().unwrap_or_default();
                let others: Vec<HashMap<Bytes, f64>> = sources.map(|members| members.into_iter().collect()).collect();
                first
                    .into_iter()
                    .filter(|(member, _)| others.iter().all(|other| !other.contains_key(member)))
                    .collect()
            }
        };
        combined.sort_by(|(m1, s1), (m2, s2)| s1.partial_cmp(s2).expect("no NaN scores").then_with(|| m1.cmp(m2)));
        Ok(combined)
    }

    /// What applying a sorted-set write would answer, without applying it.
    pub(super) fn preview_zset_write(&mut self, write: &ZsetWrite) -> Value {
        self.zset_plan(write).map_or_else(|e| e, |plan| plan.reply)
    }

    /// Applies a sorted-set write from the entry at `index`.
    pub(super) fn execute_zset_write(&mut self, index: u64, write: ZsetWrite) -> Value {
        let plan = match self.zset_plan(&write) {
            Ok(plan) => plan,
            Err(e) => return e,
        };
        let event = zset_event(&write);
        let key = plan.key;
        let existed = plan.replace && self.collecting_events && self.exists(&key);
        if plan.replace {
            self.delete(index, &key);
        } else if plan.changes.is_empty() {
            return plan.reply;
        } else {
            self.delete_if_expired(index, &key);
        }
        for (member, (before, after)) in plan.changes {
            if let Some(before) = before {
                self.store.write(index, order_key(&key, before, &member), None);
            }
            match after {
                Some(after) => {
                    let score = Bytes::copy_from_slice(&after.to_be_bytes());
                    self.store.write(index, score_key(&key, &member), Some(score));
                    self.store
                        .write(index, order_key(&key, after, &member), Some(Bytes::new()));
                }
                None => {
                    self.store.write(index, score_key(&key, &member), None);
                }
            }
        }
        if self.zset_len(&key) == 0 {
            self.set_deadline(index, &key, None);
        }
        if !plan.replace || self.exists(&key) {
            self.notify(keyspace_events::ZSET, event, &key);
            self.notify_if_emptied(&key);
        } else if existed {
            self.notify(keyspace_events::GENERIC, "del", &key);
        }
        plan.reply
    }

    /// A sorted set's members and scores in score order (RENAME, COPY).
    pub(super) fn zset_members(&mut self, key: &[u8]) -> Members {
        self.zset_records(key, &all_order_records(), 0, usize::MAX, false)
    }

    /// Writes `members` into `key`, which holds nothing.
    pub(super) fn put_zset(&mut self, index: u64, key: &[u8], members: Members) {
        for (member, score) in members {
            self.store.write(
                index,
                score_key(key, &member),
                Some(Bytes::copy_from_slice(&score.to_be_bytes())),
            );
            self.store
                .write(index, order_key(key, score, &member), Some(Bytes::new()));
        }
    }

    pub(super) fn read_zset(&mut self, read: &ZsetRead) -> Result<Value, Value> {
        Ok(match read {
            ZsetRead::Score { key, member } => {
                self.zset_check(key)?;
                self.zscore(key, member)
                    .map_or_else(Value::null, |s| Value::Double(Double(s)))
            }
            ZsetRead::MScore { key, members } => {
                self.zset_check(key)?;
                Value::array(
                    members
                        .iter()
                        .map(|m| {
                            self.zscore(key, m)
                                .map_or_else(Value::null, |s| Value::Double(Double(s)))
                        })
                        .collect(),
                )
            }
            ZsetRead::Card(key) => {
                self.zset_check(key)?;
                Value::Integer(self.zset_len(key) as i64)
            }
            ZsetRead::Count { key, range } => {
                if !self.zset_check(key)? {
                    return Ok(Value::Integer(0));
                }
                let bounds = match range {
                    ZRange::Score { min, max } => score_bounds(min, max),
                    ZRange::Lex { min, max } => lex_bounds(min, max),
                    ZRange::Rank { .. } => unreachable!("ZCOUNT and ZLEXCOUNT take score and lex ranges"),
                };
                Value::Integer(self.store.group_count_between(&zset_prefix(key), bounds.borrowed()) as i64)
            }
            ZsetRead::Range { key, query } => {
                self.zset_check(key)?;
                range_reply(self.zset_range(key, query), query.with_scores)
            }
            ZsetRead::Rank {
                key,
                member,
                from_highest,
            } => {
                self.zset_check(key)?;
                let Some(score) = self.zscore(key, member) else {
                    return Ok(Value::null());
                };
                let own = order_key(key, score, member);
                let prefix = zset_prefix(key);
                let below = (
                    Bound::Included(&[ORDER_RECORD][..]),
                    Bound::Excluded(&own[prefix.len()..]),
                );
                let rank = self.store.group_count_between(&prefix, below);
                Value::Integer(if *from_highest {
                    self.zset_len(key) - 1 - rank
                } else {
                    rank
                } as i64)
            }
            ZsetRead::RandMember {
                key,
                count,
                with_scores,
            } => {
                self.zset_check(key)?;
                let members = self.zset_members(key);
                match count {
                    None if members.is_empty() => Value::null(),
                    None => Value::bulk(members[self.random_below(members.len())].0.clone()),
                    Some(count) => {
                        let picks = self.random_picks(members.len(), *count);
                        let picked = picks.into_iter().map(|i| members[i].clone()).collect();
                        range_reply(picked, *with_scores)
                    }
                }
            }
            ZsetRead::Combine { op, keys, options } => {
                let with_scores = options.as_ref().is_ok_and(|o| o.with_scores);
                range_reply(self.combine(*op, keys, options)?, with_scores)
            }
            ZsetRead::InterCard { keys, options } => {
                let (sources, options) = self.combine_sources(keys, options)?;
                let mut sources: Vec<(Members, f64)> = sources.into_iter().map(|s| (s, 1.0)).collect();
                sources.sort_by_key(|(members, _)| members.len());
                let limit = if options.limit == 0 { usize::MAX } else { options.limit };
                Value::Integer(intersection(sources, Aggregate::Sum, limit).len() as i64)
            }
            ZsetRead::Scan { key, args } => {
                self.zset_check(key)?;
                let mut out = Vec::new();
                for (member, score) in self.zset_members(key) {
                    if args.pattern.as_ref().is_none_or(|p| glob_match(p, &member, false)) {
                        out.push(Value::bulk(member));
                        out.push(Value::bulk(format_double(score)));
                    }
                }
                // The whole set at once, as Redis answers for small sets: cursor 0.
                Value::array(vec![Value::bulk("0"), Value::array(out)])
            }
        })
    }
}

/// The event a sorted-set write that changed something is notified as.
fn zset_event(write: &ZsetWrite) -> &'static str {
    match write {
        ZsetWrite::Add { options, .. } if options.increment => "zincr",
        ZsetWrite::Add { .. } => "zadd",
        ZsetWrite::Remove { .. } => "zrem",
        ZsetWrite::Pop { highest: false, .. } | ZsetWrite::MultiPop { highest: false, .. } => "zpopmin",
        ZsetWrite::Pop { highest: true, .. } | ZsetWrite::MultiPop { highest: true, .. } => "zpopmax",
        ZsetWrite::RemoveRange { range, .. } => match range {
            ZRange::Rank { .. } => "zremrangebyrank",
            ZRange::Score { .. } => "zremrangebyscore",
            ZRange::Lex { .. } => "zremrangebylex",
        },
        ZsetWrite::RangeStore { .. } => "zrangestore",
        ZsetWrite::GeoStore(search) => match search.command {
            SearchCommand::SearchStore => "geosearchstore",
            _ => "georadiusstore",
        },
        ZsetWrite::CombineStore { op, .. } => match op {
            ZsetOp::Union => "zunionstore",
            ZsetOp::Inter => "zinterstore",
            ZsetOp::Diff => "zdiffstore",
        },
    }
}

/// A write that replaces `destination` with `members` (deleting it when there are none),
/// answering how many it stored.
fn replacing_plan(destination: &Bytes, members: Members) -> Plan {
    let mut plan = Plan::reply(destination, Value::Integer(members.len() as i64));
    plan.replace = true;
    for (member, score) in members {
        plan.changes.insert(member, (None, Some(score)));
    }
    plan
}

/// `total` and a further weighted score, combined as AGGREGATE says (Redis's
/// `zunionInterAggregate`: a NaN score never wins MIN or MAX, a NaN sum is 0).
fn aggregate(how: Aggregate, total: f64, score: f64) -> f64 {
    match how {
        Aggregate::Sum => {
            let sum = total + score;
            if sum.is_nan() {
                0.0
            } else {
                sum
            }
        }
        Aggregate::Min if score < total => score,
        Aggregate::Max if score > total => score,
        Aggregate::Min | Aggregate::Max => total,
    }
}

/// The members of the first of `sources` (each with its weight, the smallest first) that every
/// other holds, their scores aggregated as Redis's ZINTER does (the first's weighted score with
/// NaN as 0, the others' as they are); at most `limit` of them.
fn intersection(sources: Vec<(Members, f64)>, how: Aggregate, limit: usize) -> Members {
    let mut sources = sources.into_iter();
    let Some((first, first_weight)) = sources.next() else {
        return Vec::new();
    };
    let others: Vec<(HashMap<Bytes, f64>, f64)> = sources
        .map(|(members, weight)| (members.into_iter().collect(), weight))
        .collect();
    let mut common = Vec::new();
    'members: for (member, score) in first {
        if common.len() >= limit {
            break;
        }
        let weighted = first_weight * score;
        let mut total = if weighted.is_nan() { 0.0 } else { weighted };
        for (other, weight) in &others {
            let Some(score) = other.get(&member) else {
                continue 'members;
            };
            total = aggregate(how, total, score * weight);
        }
        common.push((member, total));
    }
    common
}

/// LIMIT's count as a number of members to take (a negative count is no limit).
fn limit_take(count: i64) -> usize {
    usize::try_from(count).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_bytes_sort_as_scores_do_and_give_the_score_back() {
        let scores = [
            f64::NEG_INFINITY,
            -1e300,
            -2.5,
            -1.0,
            -f64::MIN_POSITIVE,
            0.0,
            f64::MIN_POSITIVE,
            1.0,
            1.5,
            1e300,
            f64::INFINITY,
        ];
        for pair in scores.windows(2) {
            assert!(order_bytes(pair[0]) < order_bytes(pair[1]), "{pair:?}");
        }
        for score in scores {
            assert_eq!(score_of_order_number(order_number(score)), score);
        }
        assert_eq!(order_bytes(-0.0), order_bytes(0.0));
    }
}
