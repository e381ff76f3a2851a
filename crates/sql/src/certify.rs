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
//! What the certifier remembers — per class, the position of the last committed transaction
//! that touched it — is the database's (`_chorus_certified`), written in the same engine
//! transaction as the rows, so a restart or a checkpoint certifies on exactly as before.

use std::collections::HashMap;

use crate::txn::Certify;

/// A log command's place: (log index, position within its entry).
pub type Position = (u64, u32);

/// What a remembered position is the last commit of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Touched {
    /// A transaction touching this class.
    Class(String),
    /// A global transaction.
    Global,
    /// Any transaction.
    Any,
}

#[derive(Debug, Default)]
pub struct Certifier {
    classes: HashMap<String, Position>,
    global: Position,
    any: Position,
}

impl Certifier {
    /// The certifier whose remembered positions are `rows` (as `commit` gave them).
    pub fn from_rows(rows: impl IntoIterator<Item = (Touched, Position)>) -> Certifier {
        let mut certifier = Certifier::default();
        for (touched, at) in rows {
            certifier.remember(touched, at);
        }
        certifier
    }

    fn remember(&mut self, touched: Touched, at: Position) {
        match touched {
            Touched::Class(class) => {
                self.classes.insert(class, at);
            }
            Touched::Global => self.global = at,
            Touched::Any => self.any = at,
        }
    }

    /// Whether the transaction `certify` describes, ordered at `at`, commits: nothing committed
    /// after its snapshot touched what it touched.
    pub fn admits(&self, certify: &Certify, at: Position) -> bool {
        assert!(
            certify.snapshot < at,
            "a transaction is ordered after the state it ran on: snapshot {:?}, position {at:?}",
            certify.snapshot
        );
        let later = |position: Position| position > certify.snapshot;
        if certify.global {
            return !later(self.any);
        }
        !later(self.global)
            && certify
                .classes
                .iter()
                .all(|class| self.classes.get(class).is_none_or(|&position| !later(position)))
    }

    /// Remembers a transaction committed at `at`; returns what changed, for the database.
    pub fn commit(&mut self, certify: &Certify, at: Position) -> Vec<(Touched, Position)> {
        assert!(
            at > self.any,
            "certification goes forward in the log: {at:?} after {:?}",
            self.any
        );
        let mut touched = vec![(Touched::Any, at)];
        if certify.global {
            touched.push((Touched::Global, at));
        } else {
            touched.extend(certify.classes.iter().map(|class| (Touched::Class(class.clone()), at)));
        }
        for (what, position) in &touched {
            self.remember(what.clone(), *position);
        }
        touched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(snapshot: Position, classes: &[&str], global: bool) -> Certify {
        Certify {
            snapshot,
            classes: classes.iter().map(|c| c.to_string()).collect(),
            global,
        }
    }

    #[test]
    fn the_first_committer_of_a_class_wins() {
        let mut certifier = Certifier::default();
        let a = txn((1, 0), &["a"], false);
        let b = txn((1, 0), &["b"], false);
        let a_again = txn((1, 0), &["a", "c"], false);
        assert!(certifier.admits(&a, (2, 0)));
        certifier.commit(&a, (2, 0));
        assert!(certifier.admits(&b, (2, 1)), "another class commits alongside");
        certifier.commit(&b, (2, 1));
        assert!(
            !certifier.admits(&a_again, (3, 0)),
            "a class written after its snapshot"
        );
        assert!(
            certifier.admits(&txn((2, 0), &["a", "c"], false), (3, 0)),
            "a snapshot that saw the write"
        );
    }

    #[test]
    fn a_global_transaction_conflicts_with_everything_after_its_snapshot_and_everything_with_it() {
        let mut certifier = Certifier::default();
        certifier.commit(&txn((1, 0), &[], false), (2, 0));
        assert!(
            !certifier.admits(&txn((1, 0), &[], true), (3, 0)),
            "a transaction of no class came after its snapshot"
        );
        let global = txn((2, 0), &[], true);
        assert!(certifier.admits(&global, (3, 0)));
        certifier.commit(&global, (3, 0));
        assert!(!certifier.admits(&txn((2, 5), &["z"], false), (4, 0)));
        assert!(!certifier.admits(&txn((2, 5), &[], false), (4, 0)));
        assert!(certifier.admits(&txn((3, 0), &["z"], false), (4, 0)));
    }

    #[test]
    fn what_commit_returns_rebuilds_the_same_certifier() {
        let mut certifier = Certifier::default();
        let mut rows = HashMap::new();
        for (at, t) in [
            ((2, 0), txn((1, 0), &["a", "b"], false)),
            ((2, 1), txn((1, 0), &["c"], false)),
            ((5, 0), txn((2, 1), &[], true)),
            ((6, 0), txn((5, 0), &["a"], false)),
        ] {
            assert!(certifier.admits(&t, at));
            rows.extend(certifier.commit(&t, at));
        }
        let rebuilt = Certifier::from_rows(rows);
        for probe in [
            txn((2, 0), &["b"], false),
            txn((5, 0), &["a"], false),
            txn((5, 0), &["c"], false),
            txn((5, 0), &[], true),
            txn((6, 0), &[], true),
        ] {
            assert_eq!(
                rebuilt.admits(&probe, (7, 0)),
                certifier.admits(&probe, (7, 0)),
                "{probe:?}"
            );
        }
    }
}
