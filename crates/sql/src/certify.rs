//! Certification of hybrid transactions (issue 16; Postgres-R's first committer wins, at the
//! granularity of conflict classes). Every node executes its own clients' transactions on its
//! state at some log position (the snapshot), and the log orders them all. Each node then
//! certifies every transaction in log order, alike: it commits only if no transaction the log
//! committed after its snapshot touched a class it touched (a global one touches every class,
//! and conflicts with anything committed after its snapshot). Whatever a transaction read or
//! wrote lies in its classes (the labeller labels a statement global when it cannot tell), so
//! a committed transaction saw exactly the state the log's order gives it: the history is
//! serial in log order.
//!
//! A node need not wait for its own transactions to come back from the log before it runs the
//! next on the same classes: it runs the next on its snapshot with the write-sets of all its
//! own transactions still in the log applied first, and the next depends on those of them that
//! touched its classes (its chain). It commits only if every transaction of its chain was
//! ordered before it and committed; touches by its own node's transactions after its snapshot
//! are then its chain's (or of classes it did not touch), and do not count against it. A
//! node's transactions are numbered in the order it proposes them (`TxnId::seq`), and the log
//! must keep that order: one ordered after a later one is void. A chain reaches back at most
//! `CHAIN_SPAN` transactions.
//!
//! What the certifier remembers — per class, the last commits that touched it; per executing
//! node (incarnation), the last of its transactions ordered and which of the ones before
//! committed — is the
//! database's (`_chorus_certified`), written in the same engine transaction as the rows, so a
//! restart or a checkpoint certifies on exactly as before.

use std::collections::HashMap;

use crate::txn::{Certify, TxnId};

/// A log command's place: (log index, position within its entry).
pub type Position = (u64, u32);

/// The last commit that touched something, by which executing node (incarnation), and the last
/// one by any other node before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Touch {
    pub last: Position,
    pub by: u64,
    pub before: Position,
}

impl Touch {
    fn record(&mut self, at: Position, by: u64) {
        if by != self.by {
            self.before = self.last;
        }
        self.last = at;
        self.by = by;
    }

    /// The last touch by a node other than `incarnation`.
    fn latest_not_by(&self, incarnation: u64) -> Position {
        if self.by == incarnation {
            self.before
        } else {
            self.last
        }
    }
}

/// How far back (in its node's transactions) a transaction's chain may reach.
pub const CHAIN_SPAN: u64 = 64;

/// Of one executing node's transactions: the last the log ordered, and which of the last
/// `CHAIN_SPAN` committed (bit i: the one numbered `last_seq - i`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chain {
    pub last_seq: u64,
    pub committed: u64,
}

impl Chain {
    fn committed(&self, seq: u64) -> bool {
        seq <= self.last_seq && self.last_seq - seq < CHAIN_SPAN && self.committed & (1 << (self.last_seq - seq)) != 0
    }
}

/// Why certification voids a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Void {
    /// A transaction of its chain was not ordered before it or did not commit, or a later
    /// transaction of its node's was ordered before it.
    Chain,
    /// Another node's transaction (or a global one) committed on what it touched after its
    /// snapshot: first committer wins.
    Conflict,
}

/// One thing the certifier remembers, as the database keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remembered {
    Class(String, Touch),
    /// The last global commit.
    Global(Position),
    /// The last commit of any kind.
    Any(Touch),
    /// An executing node's (incarnation's) transactions.
    Chain(u64, Chain),
}

#[derive(Debug, Default)]
pub struct Certifier {
    classes: HashMap<String, Touch>,
    global: Position,
    any: Touch,
    chains: HashMap<u64, Chain>,
}

impl Certifier {
    /// The certifier that remembers `rows` (as `commit` and `void` gave them).
    pub fn from_rows(rows: impl IntoIterator<Item = Remembered>) -> Certifier {
        let mut certifier = Certifier::default();
        for row in rows {
            match row {
                Remembered::Class(class, touch) => {
                    certifier.classes.insert(class, touch);
                }
                Remembered::Global(at) => certifier.global = at,
                Remembered::Any(touch) => certifier.any = touch,
                Remembered::Chain(incarnation, chain) => {
                    certifier.chains.insert(incarnation, chain);
                }
            }
        }
        certifier
    }

    /// Whether transaction `id`, which `certify` describes, ordered at `at`, commits: its
    /// chain was ordered before it and committed, and no other transaction committed after its
    /// snapshot touched what it touched.
    pub fn admits(&self, id: TxnId, certify: &Certify, at: Position) -> Result<(), Void> {
        assert!(
            certify.snapshot < at,
            "a transaction is ordered after the state it ran on: snapshot {:?}, position {at:?}",
            certify.snapshot
        );
        let chain = self.chains.get(&id.incarnation).copied().unwrap_or_default();
        if id.seq <= chain.last_seq {
            return Err(Void::Chain);
        }
        let depends_on = certify.chain.unwrap_or(0);
        let chain_committed = (0..CHAIN_SPAN)
            .filter(|i| depends_on & (1 << i) != 0)
            .all(|i| id.seq > i + 1 && chain.committed(id.seq - 1 - i));
        if !chain_committed {
            return Err(Void::Chain);
        }
        // On a chain, its own node's touches after the snapshot are its chain's.
        let others = |touch: &Touch| {
            if certify.chain.is_some() {
                touch.latest_not_by(id.incarnation)
            } else {
                touch.last
            }
        };
        let later = |position: Position| position > certify.snapshot;
        let untouched = if certify.global {
            !later(others(&self.any))
        } else {
            !later(self.global)
                && certify
                    .classes
                    .iter()
                    .all(|class| self.classes.get(class).is_none_or(|touch| !later(others(touch))))
        };
        if untouched {
            Ok(())
        } else {
            Err(Void::Conflict)
        }
    }

    /// Whether no transaction of a node other than `incarnation` committed on `classes` (nor a
    /// global one) after `snapshot`: a transaction of `incarnation`'s that saw them there still
    /// sees them as they are.
    pub fn untouched_since<'a>(
        &self,
        classes: impl IntoIterator<Item = &'a String>,
        snapshot: Position,
        incarnation: u64,
    ) -> bool {
        self.global <= snapshot
            && classes.into_iter().all(|class| {
                self.classes
                    .get(class)
                    .is_none_or(|touch| touch.latest_not_by(incarnation) <= snapshot)
            })
    }

    /// Whether transaction `seq` of `incarnation`, ordered already, committed (one further back
    /// than `CHAIN_SPAN` counts as not).
    pub fn committed(&self, incarnation: u64, seq: u64) -> bool {
        self.chains.get(&incarnation).is_some_and(|chain| chain.committed(seq))
    }

    /// Remembers transaction `id`, committed at `at`; returns what changed, for the database.
    pub fn commit(&mut self, id: TxnId, certify: &Certify, at: Position) -> Vec<Remembered> {
        assert!(
            at > self.any.last,
            "certification goes forward in the log: {at:?} after {:?}",
            self.any.last
        );
        self.any.record(at, id.incarnation);
        let mut changed = vec![Remembered::Any(self.any)];
        if certify.global {
            self.global = at;
            changed.push(Remembered::Global(at));
        } else {
            for class in &certify.classes {
                let touch = self.classes.entry(class.clone()).or_default();
                touch.record(at, id.incarnation);
                changed.push(Remembered::Class(class.clone(), *touch));
            }
        }
        changed.push(self.ordered(id, false));
        changed
    }

    /// Remembers that transaction `id` was void; returns what changed, for the database.
    pub fn void(&mut self, id: TxnId) -> Vec<Remembered> {
        vec![self.ordered(id, true)]
    }

    fn ordered(&mut self, id: TxnId, void: bool) -> Remembered {
        let chain = self.chains.entry(id.incarnation).or_default();
        // One ordered after a later one is void, and changes nothing.
        if id.seq > chain.last_seq {
            let shift = id.seq - chain.last_seq;
            chain.committed = if shift >= CHAIN_SPAN {
                0
            } else {
                chain.committed << shift
            };
            chain.committed |= u64::from(!void);
            chain.last_seq = id.seq;
        }
        Remembered::Chain(id.incarnation, *chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Certifier {
        /// Whether certification passes it (tests ask why separately).
        fn passes(&self, id: TxnId, certify: &Certify, at: Position) -> bool {
            self.admits(id, certify, at).is_ok()
        }
    }

    fn txn(snapshot: Position, classes: &[&str], global: bool) -> Certify {
        Certify {
            snapshot,
            classes: classes.iter().map(|c| c.to_string()).collect(),
            global,
            chain: None,
        }
    }

    fn id(incarnation: u64, seq: u64) -> TxnId {
        TxnId { incarnation, seq }
    }

    #[test]
    fn the_first_committer_of_a_class_wins() {
        let mut certifier = Certifier::default();
        let a = txn((1, 0), &["a"], false);
        let b = txn((1, 0), &["b"], false);
        let a_again = txn((1, 0), &["a", "c"], false);
        assert!(certifier.passes(id(1, 1), &a, (2, 0)));
        certifier.commit(id(1, 1), &a, (2, 0));
        assert!(
            certifier.passes(id(2, 1), &b, (2, 1)),
            "another class commits alongside"
        );
        certifier.commit(id(2, 1), &b, (2, 1));
        assert_eq!(
            certifier.admits(id(3, 1), &a_again, (3, 0)),
            Err(Void::Conflict),
            "a class written after its snapshot"
        );
        assert!(
            !certifier.passes(id(1, 2), &a_again, (3, 0)),
            "its own node's earlier transaction counts too, outside a chain"
        );
        assert!(
            certifier.passes(id(3, 1), &txn((2, 0), &["a", "c"], false), (3, 0)),
            "a snapshot that saw the write"
        );
    }

    #[test]
    fn a_global_transaction_conflicts_with_everything_after_its_snapshot_and_everything_with_it() {
        let mut certifier = Certifier::default();
        certifier.commit(id(1, 1), &txn((1, 0), &[], false), (2, 0));
        assert!(
            !certifier.passes(id(2, 1), &txn((1, 0), &[], true), (3, 0)),
            "a transaction of no class came after its snapshot"
        );
        let global = txn((2, 0), &[], true);
        assert!(certifier.passes(id(2, 1), &global, (3, 0)));
        certifier.commit(id(2, 1), &global, (3, 0));
        assert!(!certifier.passes(id(1, 2), &txn((2, 5), &["z"], false), (4, 0)));
        assert!(!certifier.passes(id(1, 2), &txn((2, 5), &[], false), (4, 0)));
        assert!(certifier.passes(id(1, 2), &txn((3, 0), &["z"], false), (4, 0)));
    }

    #[test]
    fn a_chained_transaction_commits_after_its_chain_and_only_if_all_of_it_committed() {
        let mut certifier = Certifier::default();
        let first = txn((1, 0), &["a"], false);
        // Node 1 runs seq 2 on seq 1's write-set, both on snapshot (1, 0).
        let second = Certify {
            chain: Some(0b1),
            ..txn((1, 0), &["a"], false)
        };
        assert!(certifier.passes(id(1, 1), &first, (2, 0)));
        certifier.commit(id(1, 1), &first, (2, 0));
        assert!(
            certifier.passes(id(1, 2), &second, (2, 1)),
            "its own chain's touch does not count"
        );
        // Had another node touched the class in between, it would not.
        let mut other = Certifier::default();
        other.commit(id(1, 1), &first, (2, 0));
        other.commit(id(9, 1), &txn((1, 0), &["a"], false), (2, 1));
        assert_eq!(other.admits(id(1, 2), &second, (3, 0)), Err(Void::Conflict));
        // A chain member voided, or missing, voids it; one it does not depend on does not.
        let mut voided = Certifier::default();
        voided.void(id(1, 1));
        assert_eq!(voided.admits(id(1, 2), &second, (2, 1)), Err(Void::Chain));
        let independent = Certify {
            chain: Some(0),
            ..txn((1, 0), &["b"], false)
        };
        assert!(voided.passes(id(1, 2), &independent, (2, 1)));
        let missing = Certifier::default();
        assert!(!missing.passes(id(1, 2), &second, (2, 1)));
        let mut skipped = Certifier::default();
        skipped.commit(id(1, 2), &independent, (2, 0));
        let third = Certify {
            chain: Some(0b11),
            ..txn((1, 0), &["a"], false)
        };
        assert!(!skipped.passes(id(1, 3), &third, (3, 0)), "seq 1 was never ordered");
        // A transaction ordered after a later one of its node's is void.
        certifier.commit(id(1, 2), &second, (2, 1));
        assert_eq!(certifier.admits(id(1, 1), &first, (3, 0)), Err(Void::Chain));
    }

    #[test]
    fn what_commit_and_void_return_rebuild_the_same_certifier() {
        let mut certifier = Certifier::default();
        let mut rows = Vec::new();
        for (who, at, t) in [
            (id(1, 1), (2, 0), txn((1, 0), &["a", "b"], false)),
            (id(2, 1), (2, 1), txn((1, 0), &["c"], false)),
            (id(2, 2), (5, 0), txn((2, 1), &[], true)),
            (id(1, 2), (6, 0), txn((5, 0), &["a"], false)),
        ] {
            assert!(certifier.passes(who, &t, at));
            rows.extend(certifier.commit(who, &t, at));
        }
        rows.extend(certifier.void(id(3, 4)));
        let rebuilt = Certifier::from_rows(rows);
        let chained = Certify {
            chain: Some(0b10),
            ..txn((5, 0), &["a"], false)
        };
        for (who, probe) in [
            (id(1, 3), txn((2, 0), &["b"], false)),
            (id(3, 5), txn((5, 0), &["a"], false)),
            (id(1, 3), txn((5, 0), &["a"], false)),
            (id(1, 3), chained.clone()),
            (id(3, 5), chained),
            (id(3, 3), txn((6, 0), &["c"], false)),
            (id(2, 3), txn((5, 0), &["c"], false)),
            (id(1, 3), txn((5, 0), &[], true)),
            (id(1, 3), txn((6, 0), &[], true)),
        ] {
            assert_eq!(
                rebuilt.passes(who, &probe, (7, 0)),
                certifier.passes(who, &probe, (7, 0)),
                "{who:?} {probe:?}"
            );
        }
    }
}
