//! Linearizability checking, key by key (a history of independent keys is linearizable exactly
//! when each key's is), with the algorithm of Wing & Gong as improved by Lowe: walk the history
//! in time order, tentatively linearize each invoked operation whose result the model allows,
//! backtrack when a completion arrives before its operation could be linearized, and remember
//! (set of linearized operations, state) pairs already explored. Porcupine checks the same way.
//!
//! The model is a register with increment: a write sets a value, a read returns it (or nothing),
//! an increment adds one (to 0 when missing) and returns the result. Operations with an unknown
//! outcome may take effect at any point after they were invoked, or never; failed operations
//! never took effect and are left out, as are reads that did not complete.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use crate::history::{Op, OpKind, Outcome};

type State = Option<i64>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order of the key's operations explains the results; the operations are listed.
    Violation {
        key: String,
        ops: Vec<Op>,
    },
    /// The search ran out of time for this key.
    GaveUp {
        key: String,
    },
}

/// The model: whether `op` can take effect in `state` with the result it returned, and the
/// state after it.
fn step(state: State, op: &Op) -> Option<State> {
    let known = op.outcome == Outcome::Ok;
    match op.kind {
        OpKind::Read => (op.result == state).then_some(state),
        OpKind::Write => Some(op.value),
        OpKind::Incr => {
            let next = Some(state.unwrap_or(0).wrapping_add(1));
            (!known || op.result == next).then_some(next)
        }
    }
}

/// One event of the time-ordered list: an invocation or a completion of operation `op`.
#[derive(Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    /// The matching event (call ↔ return).
    partner: usize,
    prev: usize,
    next: usize,
}

const HEAD: usize = usize::MAX;

struct EventList {
    events: Vec<Event>,
    head: usize,
}

impl EventList {
    fn new(ops: &[Op]) -> EventList {
        // (time, is_return, op): at equal times calls go first, so operations that touch at an
        // instant count as concurrent (the clock's grain must not invent an order).
        let mut times: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            times.push((op.invoke_us, false, i));
            times.push((op.complete_us.unwrap_or(u64::MAX), true, i));
        }
        times.sort_by_key(|&(t, is_return, i)| (t, is_return, i));
        let mut events: Vec<Event> = times
            .iter()
            .enumerate()
            .map(|(at, &(_, is_return, op))| Event {
                op,
                is_call: !is_return,
                partner: 0,
                prev: if at == 0 { HEAD } else { at - 1 },
                next: if at + 1 == times.len() { HEAD } else { at + 1 },
            })
            .collect();
        let mut call_of = vec![0usize; ops.len()];
        for (at, e) in events.iter().enumerate() {
            if e.is_call {
                call_of[e.op] = at;
            }
        }
        for at in 0..events.len() {
            if !events[at].is_call {
                let call = call_of[events[at].op];
                events[at].partner = call;
                events[call].partner = at;
            }
        }
        let head = if events.is_empty() { HEAD } else { 0 };
        EventList { events, head }
    }

    fn unlink(&mut self, at: usize) {
        let Event { prev, next, .. } = self.events[at];
        if prev == HEAD {
            self.head = next;
        } else {
            self.events[prev].next = next;
        }
        if next != HEAD {
            self.events[next].prev = prev;
        }
    }

    fn relink(&mut self, at: usize) {
        let Event { prev, next, .. } = self.events[at];
        if prev == HEAD {
            self.head = at;
        } else {
            self.events[prev].next = at;
        }
        if next != HEAD {
            self.events[next].prev = at;
        }
    }

    /// Takes an operation (its call and its return) out of the list.
    fn lift(&mut self, call: usize) {
        let ret = self.events[call].partner;
        self.unlink(call);
        self.unlink(ret);
    }

    /// Puts it back; undoes `lift` when done in reverse order.
    fn unlift(&mut self, call: usize) {
        let ret = self.events[call].partner;
        self.relink(ret);
        self.relink(call);
    }
}

/// The search over one key's events.
struct Search<'a> {
    ops: &'a [Op],
    list: EventList,
    state: State,
    /// Operations linearized, or (unknown outcome) dropped as never having happened.
    handled: Vec<u64>,
    /// (call event, state before it), one per handled operation, in order.
    stack: Vec<(usize, State)>,
    /// (handled, state) pairs already explored: the rest of the history cannot follow them.
    seen: HashSet<(Vec<u64>, State)>,
}

impl Search<'_> {
    /// Handles the operation of `call` leading to `next_state`, unless that was explored before.
    fn choose(&mut self, call: usize, next_state: State) -> bool {
        let op = self.list.events[call].op;
        let mut handled = self.handled.clone();
        handled[op / 64] |= 1 << (op % 64);
        if !self.seen.insert((handled.clone(), next_state)) {
            return false;
        }
        self.stack.push((call, self.state));
        self.state = next_state;
        self.handled = handled;
        self.list.lift(call);
        true
    }

    /// Undoes the last choice; returns where to look next, or `None` when nothing is left to undo.
    fn undo(&mut self) -> Option<usize> {
        let (call, previous) = self.stack.pop()?;
        self.list.unlift(call);
        self.state = previous;
        let op = self.list.events[call].op;
        self.handled[op / 64] &= !(1 << (op % 64));
        Some(self.list.events[call].next)
    }
}

/// Checks one key's operations.
fn check_key(key: &str, ops: &[Op], deadline: Instant) -> Verdict {
    let mut search = Search {
        ops,
        list: EventList::new(ops),
        state: None,
        handled: vec![0u64; ops.len().div_ceil(64).max(1)],
        stack: Vec::new(),
        seen: HashSet::new(),
    };
    let violation = || {
        let mut involved: Vec<Op> = ops.to_vec();
        involved.sort_by_key(|o| o.invoke_us);
        Verdict::Violation {
            key: key.to_string(),
            ops: involved,
        }
    };
    let mut at = search.list.head;
    let mut steps = 0u64;
    while search.list.head != HEAD {
        steps += 1;
        if steps.is_multiple_of(4096) && Instant::now() > deadline {
            return Verdict::GaveUp { key: key.to_string() };
        }
        if at == HEAD {
            at = search.list.head;
        }
        let event = search.list.events[at];
        let op = &search.ops[event.op];
        if event.is_call {
            // Linearize it here if the model allows; otherwise try the next event.
            let chosen = step(search.state, op).is_some_and(|next| search.choose(at, next));
            at = if chosen { search.list.head } else { event.next };
            continue;
        }
        // A completion reached before its operation was linearized. An operation with an
        // unknown outcome may never have happened: drop it. Otherwise undo the last choice.
        if op.outcome == Outcome::Unknown && search.choose(event.partner, search.state) {
            at = search.list.head;
            continue;
        }
        match search.undo() {
            Some(next) => at = next,
            None => return violation(),
        }
    }
    Verdict::Linearizable
}

/// Leaves out writes of unknown outcome whose value nothing ever observed: a read of it, or an
/// increment result within (number of increments) above it. "Never happened" is always one of
/// the checker's choices for them, and with nothing depending on their value no explanation
/// needs them, so dropping them changes no verdict; it keeps the search small when crashes leave
/// many writes unanswered.
fn drop_unobserved_unknown_writes(ops: Vec<Op>) -> Vec<Op> {
    let increments = ops.iter().filter(|o| o.kind == OpKind::Incr).count() as i64;
    let mut observed: Vec<i64> = ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok && o.kind != OpKind::Write)
        .filter_map(|o| o.result)
        .collect();
    observed.sort_unstable();
    ops.into_iter()
        .filter(|o| {
            if o.kind != OpKind::Write || o.outcome != Outcome::Unknown {
                return true;
            }
            let v = o.value.unwrap_or(0);
            let first_at_or_above = observed.partition_point(|r| *r < v);
            observed
                .get(first_at_or_above)
                .is_some_and(|r| r.saturating_sub(v) <= increments)
        })
        .collect()
}

/// Checks a whole history, key by key; the first key that fails decides.
pub fn check(history: &[Op], time_limit: Duration) -> Verdict {
    let mut by_key: BTreeMap<String, Vec<Op>> = BTreeMap::new();
    for op in history {
        let relevant = !matches!(
            (op.outcome, op.kind),
            (Outcome::Fail, _) | (Outcome::Unknown, OpKind::Read)
        );
        if relevant {
            let mut op = op.clone();
            if op.outcome == Outcome::Unknown {
                op.complete_us = None;
            }
            by_key.entry(op.key.clone()).or_default().push(op);
        }
    }
    let deadline = Instant::now() + time_limit;
    for (key, ops) in by_key {
        let ops = drop_unobserved_unknown_writes(ops);
        match check_key(&key, &ops, deadline) {
            Verdict::Linearizable => {}
            other => return other,
        }
    }
    Verdict::Linearizable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u64, kind: OpKind, value: Option<i64>, result: Option<i64>, at: (u64, u64)) -> Op {
        Op {
            client,
            kind,
            key: "k".into(),
            value,
            invoke_us: at.0,
            complete_us: Some(at.1),
            outcome: Outcome::Ok,
            result,
            node: 1,
        }
    }

    fn write(client: u64, v: i64, at: (u64, u64)) -> Op {
        op(client, OpKind::Write, Some(v), None, at)
    }

    fn read(client: u64, r: Option<i64>, at: (u64, u64)) -> Op {
        op(client, OpKind::Read, None, r, at)
    }

    fn incr(client: u64, r: i64, at: (u64, u64)) -> Op {
        op(client, OpKind::Incr, None, Some(r), at)
    }

    fn unknown(mut o: Op) -> Op {
        o.outcome = Outcome::Unknown;
        o.complete_us = None;
        o
    }

    fn verdict(history: &[Op]) -> bool {
        match check(history, Duration::from_secs(10)) {
            Verdict::Linearizable => true,
            Verdict::Violation { .. } => false,
            Verdict::GaveUp { .. } => panic!("gave up"),
        }
    }

    #[test]
    fn sequential_and_concurrent_histories_that_are_linearizable() {
        assert!(verdict(&[]));
        assert!(verdict(&[
            write(1, 1, (0, 10)),
            read(2, Some(1), (20, 30)),
            incr(1, 2, (40, 50))
        ]));
        // Concurrent write and read: the read may see either value.
        assert!(verdict(&[
            write(1, 1, (0, 10)),
            write(1, 2, (20, 40)),
            read(2, Some(1), (25, 35))
        ]));
        assert!(verdict(&[
            write(1, 1, (0, 10)),
            write(1, 2, (20, 40)),
            read(2, Some(2), (25, 35))
        ]));
        // A read of a missing key before any write.
        assert!(verdict(&[read(2, None, (0, 5)), write(1, 3, (10, 20))]));
    }

    #[test]
    fn a_stale_read_is_caught() {
        // The write of 2 completed before the read began, yet the read saw 1.
        assert!(!verdict(&[
            write(1, 1, (0, 10)),
            write(1, 2, (20, 30)),
            read(2, Some(1), (40, 50))
        ]));
    }

    #[test]
    fn a_lost_write_is_caught() {
        // Acknowledged write of 5, then a later read sees nothing.
        assert!(!verdict(&[write(1, 5, (0, 10)), read(2, None, (20, 30))]));
    }

    #[test]
    fn a_double_applied_increment_is_caught() {
        assert!(!verdict(&[incr(1, 1, (0, 10)), incr(2, 3, (20, 30))]));
        assert!(verdict(&[incr(1, 1, (0, 10)), incr(2, 2, (20, 30))]));
    }

    #[test]
    fn unknown_outcomes_may_or_may_not_have_happened() {
        // The write's outcome is unknown: a later read may see it...
        assert!(verdict(&[unknown(write(1, 7, (0, 10))), read(2, Some(7), (20, 30))]));
        // ...or not.
        assert!(verdict(&[unknown(write(1, 7, (0, 10))), read(2, None, (20, 30))]));
        // But it cannot come back after being overwritten by a later completed write.
        assert!(!verdict(&[
            unknown(write(1, 7, (0, 10))),
            write(2, 8, (20, 30)),
            read(2, Some(8), (40, 50)),
            read(3, Some(7), (60, 70)),
            read(2, Some(8), (80, 90)),
        ]));
        // An unknown increment took effect (one later read shows it) or did not.
        assert!(verdict(&[
            write(1, 1, (0, 5)),
            unknown(incr(1, 0, (10, 20))),
            read(2, Some(2), (30, 40))
        ]));
    }

    /// Brute force: some subset of the unknown operations, in some order that respects real
    /// time, explains every result.
    fn brute_force(ops: &[Op]) -> bool {
        let known: Vec<usize> = (0..ops.len()).filter(|i| ops[*i].outcome == Outcome::Ok).collect();
        let unknown: Vec<usize> = (0..ops.len()).filter(|i| ops[*i].outcome == Outcome::Unknown).collect();
        for mask in 0..(1u32 << unknown.len()) {
            let mut chosen = known.clone();
            chosen.extend(
                unknown
                    .iter()
                    .enumerate()
                    .filter(|(b, _)| mask & (1 << b) != 0)
                    .map(|(_, i)| *i),
            );
            if permutations_explain(ops, &mut chosen, 0, None) {
                return true;
            }
        }
        false
    }

    fn permutations_explain(ops: &[Op], order: &mut Vec<usize>, from: usize, state: State) -> bool {
        if from == order.len() {
            return true;
        }
        for i in from..order.len() {
            order.swap(from, i);
            let op = &ops[order[from]];
            // Nothing still to come may have completed before this one was invoked.
            let respects_time = order[from + 1..]
                .iter()
                .all(|later| ops[*later].complete_us.is_none_or(|done| done >= op.invoke_us));
            if respects_time {
                if let Some(next) = step(state, op) {
                    if permutations_explain(ops, order, from + 1, next) {
                        order.swap(from, i);
                        return true;
                    }
                }
            }
            order.swap(from, i);
        }
        false
    }

    #[test]
    fn agrees_with_brute_force_on_random_small_histories() {
        let mut seed = 0x1234_5678u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut linearizable, mut not) = (0, 0);
        for _ in 0..3_000 {
            let count = 1 + next(6);
            let ops: Vec<Op> = (0..count)
                .map(|i| {
                    let start = next(60);
                    let at = (start, start + 1 + next(30));
                    let mut o = match next(3) {
                        0 => read(i, if next(4) == 0 { None } else { Some(next(3) as i64) }, at),
                        1 => write(i, next(3) as i64, at),
                        _ => incr(i, next(4) as i64, at),
                    };
                    if next(4) == 0 && o.kind != OpKind::Read {
                        o = unknown(o);
                    }
                    o
                })
                .collect();
            let expected = brute_force(&ops);
            let compact: Vec<String> = ops
                .iter()
                .map(|o| {
                    format!(
                        "{:?} v={:?} r={:?} [{}, {:?}] {:?}",
                        o.kind, o.value, o.result, o.invoke_us, o.complete_us, o.outcome
                    )
                })
                .collect();
            assert_eq!(verdict(&ops), expected, "{compact:#?}");
            if expected {
                linearizable += 1;
            } else {
                not += 1;
            }
        }
        assert!(
            linearizable > 300 && not > 300,
            "{linearizable} linearizable, {not} not"
        );
    }

    #[test]
    fn many_concurrent_clients_check_quickly() {
        // Five clients, each writing its own values and reading, overlapping heavily.
        let mut history = Vec::new();
        let mut last = None;
        for i in 0..300u64 {
            let client = i % 5;
            let t = i * 10;
            if i % 3 == 0 {
                history.push(read(client, last, (t, t + 35)));
            } else {
                let v = i as i64;
                history.push(write(client, v, (t, t + 5)));
                last = Some(v);
            }
        }
        let started = Instant::now();
        assert!(verdict(&history));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
