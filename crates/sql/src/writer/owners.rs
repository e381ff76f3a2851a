//! Hybrid replication's class owners (issue 16): each conflict class is owned by one node, and a
//! transaction reaching a class another node owns borrows it through the log instead of racing
//! the owner's transactions to certification. The transaction is rolled back while it waits
//! (the write lock is free for others), the owner lends the class once its own transactions on
//! it are in the log and starts none on it until the borrower releases it, and the borrower is
//! re-executed on the state the log reached — failing with 40001 if what it had read changed.
//! Two transactions waiting on each other: the younger gives way. A global transaction (its
//! classes cannot be told) borrows every class from every node at once. The hand-over changes
//! no row: certification (`certify`) still decides, so a lost or late message costs time, not
//! safety.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

use super::{statement_seed, Active, Writer};
use crate::certify::Position;
use crate::classes::{owner_among, Label};
use crate::error::SqlError;
use crate::txn::{ClassMessage, Command, NodeRef, Ticket};

/// Hybrid replication's class owners: each class is owned by one voter (`owner_index` over the
/// voters in id order; a membership change, applied in log order, places the classes over the
/// new voters). A transaction reaching a class another node owns borrows it through the log
/// first, so it runs after the owner's transactions on it and before its next ones instead of
/// racing them to certification. An owner that lets a borrower wait in vain is taken for down
/// through the log (`ClassMessage::OwnerDown`): its classes move to the voters up
/// (`owner_among`) until it says it is back, which it does as soon as it reads that.
#[derive(Debug, Clone)]
pub struct Ownership {
    /// This node's id.
    pub me: u64,
    /// How long a transaction waits for a class it asked for: then it fails (40001) if the
    /// owner is alive, or goes on without it (certification decides) if the owner lent
    /// nothing to anyone meanwhile — that owner is then not asked again for `silent_for`.
    pub borrow_wait: Duration,
    pub silent_for: Duration,
    /// How long an owner lends a class before it takes it back unreleased (its borrower may be
    /// gone).
    pub lend_for: Duration,
    /// Which nodes answer the peer transport's pings: one that does is alive however slowly the
    /// log moves (a stalled log lends nothing for anyone), and is not taken for down.
    pub answering: Answering,
}

/// Whether a node answered the peer transport's pings lately (`PeerCalls::heard_within`).
#[derive(Clone)]
pub struct Answering(Arc<dyn Fn(u64) -> bool + Send + Sync>);

impl Answering {
    pub fn new(answers: impl Fn(u64) -> bool + Send + Sync + 'static) -> Answering {
        Answering(Arc::new(answers))
    }

    fn answers(&self, node: u64) -> bool {
        (self.0)(node)
    }
}

impl std::fmt::Debug for Answering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Answering")
    }
}

/// How a transaction's wait for classes ended.
#[derive(Debug, Clone, Copy)]
pub(super) enum Borrowed {
    Resumed,
    TimedOut,
    GaveWay,
    Failed,
}

impl Suspended {
    /// Whether it may run again.
    pub(super) fn ready(&self) -> bool {
        self.awaiting.is_empty() && self.held_locally.is_empty() && self.awaiting_all.is_empty()
    }
}

/// Whether `active` touched or borrowed `class`.
pub(super) fn holds(active: &Active, class: &str) -> bool {
    active.label.classes.contains(class) || active.borrowed.contains(class)
}

impl Borrowed {
    pub(super) const ALL: [Borrowed; 4] = [
        Borrowed::Resumed,
        Borrowed::TimedOut,
        Borrowed::GaveWay,
        Borrowed::Failed,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Borrowed::Resumed => "resumed",
            Borrowed::TimedOut => "timed_out",
            Borrowed::GaveWay => "gave_way",
            Borrowed::Failed => "failed",
        }
    }
}

/// A request for classes, as the log ordered it.
pub(super) struct Asked {
    pub(super) at: Position,
    /// What the asking transaction holds.
    pub(super) holding: BTreeSet<String>,
}

/// How long a request for a class waits on a younger waiting holder that does not wait for
/// what the asker holds before that one gives way (it may be part of a longer cycle).
const GIVE_WAY_AFTER: Duration = Duration::from_millis(30);

/// How often the hand-over's timed decisions are taken when nothing else happens.
pub(super) const HAND_OVER_TICK: Duration = GIVE_WAY_AFTER;

/// A client transaction waiting for classes, rolled back meanwhile.
pub(super) struct Suspended {
    pub(super) active: Active,
    /// Classes it waits for: lent to it by their owners, or given back to this node.
    pub(super) awaiting: BTreeSet<String>,
    /// Classes another suspended transaction of this node's holds: it waits until that one is
    /// done, then asks for them as for any other.
    pub(super) held_locally: BTreeSet<String>,
    /// A global transaction: the nodes (ids) whose classes it waits for, all
    /// of them (`ClassMessage::LendAll`) — its own node's too.
    pub(super) awaiting_all: BTreeSet<u64>,
    /// Told once it holds the write lock again with its statements re-executed, or why it
    /// cannot go on.
    pub(super) resumed: Option<oneshot::Sender<Result<(), SqlError>>>,
}

/// The wall clock in ms since the Unix epoch.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Writer {
    /// Hybrid with owners: a class lent out or asked for is not started on here until it is
    /// back (or lent), nor one a suspended transaction holds; a global transaction waits until
    /// none is suspended (it may touch their classes).
    pub(super) fn blocked_by_owners(&self, label: &Label) -> bool {
        if self.ownership.is_none() {
            return false;
        }
        if self.lent_all.is_some() || !self.to_lend_all.is_empty() {
            // A global transaction has (or asked for) every class of this node's.
            return true;
        }
        if label.global {
            return !self.suspended.is_empty();
        }
        label.classes.iter().any(|class| {
            self.lent.contains_key(class)
                || self.to_lend.iter().any(|(_, asked, _, _)| asked == class)
                || self.held_by_suspended(class)
        })
    }

    /// Whether a suspended transaction of this node's touched or borrowed `class`.
    pub(super) fn held_by_suspended(&self, class: &str) -> bool {
        self.suspended.values().any(|s| holds(&s.active, class))
    }

    /// See `WriterHandle::reach`: None if `session`'s transaction may run a statement touching
    /// `label` now; else it is suspended, and the receiver hears when it runs again.
    pub(super) fn reach(
        &mut self,
        session: u64,
        label: Label,
    ) -> Result<Option<oneshot::Receiver<Result<(), SqlError>>>, SqlError> {
        let Some(ownership) = self.ownership.clone() else {
            return Ok(None);
        };
        let Some(active) = self
            .active
            .as_ref()
            .filter(|a| a.session == session && !a.failed && !a.went_on_without && !a.label.global)
        else {
            return Ok(None);
        };
        if label.global {
            // It may touch any class: it borrows them all, from every node up (its own too,
            // through the log like the others, so its node's other transactions come first —
            // even while the log takes this node for down: it lends all the same).
            let awaiting_all: BTreeSet<u64> = self
                .voters
                .iter()
                .copied()
                .chain([ownership.me])
                .filter(|node| *node == ownership.me || !self.owners_down.contains(node))
                .collect();
            let mut active = self.active.take().expect("checked above");
            self.metrics.lock_held.observe(active.granted_at.elapsed());
            self.engine.rollback();
            // Global from here on: it resumes once none of its node's transactions is in the
            // log, as a global one starts.
            active.label.global = true;
            let ticket = self.ticket_for(&mut active);
            self.propose_class(ClassMessage::BorrowAll {
                ticket,
                holding: active.label.classes.union(&active.borrowed).cloned().collect(),
                sent_at_ms: unix_ms(),
            });
            return Ok(Some(self.suspend(
                session,
                active,
                BTreeSet::new(),
                BTreeSet::new(),
                awaiting_all,
            )));
        }
        let mine: BTreeSet<String> = active.label.classes.union(&active.borrowed).cloned().collect();
        let mut held_locally = BTreeSet::new();
        let mut reached = BTreeSet::new();
        for class in &label.classes {
            if mine.contains(class) {
                continue;
            }
            if self.held_by_suspended(class) {
                held_locally.insert(class.clone());
            } else {
                reached.insert(class.clone());
            }
        }
        if held_locally
            .iter()
            .any(|class| self.waits_for_any(class, &mine, &mut Vec::new()))
        {
            // The one holding it waits (through others, maybe) for a class this one holds.
            if let Some(active) = &mut self.active {
                active.failed = true;
            }
            self.metrics.borrowed[Borrowed::GaveWay as usize].inc();
            return Err(SqlError::serialization(
                "another transaction of this node's holds a class this one reaches, and waits for one this one holds; retry",
            ));
        }
        let (ask, awaiting) = self.to_ask(&ownership, reached);
        if awaiting.is_empty() && held_locally.is_empty() {
            return Ok(None);
        }
        let mut active = self.active.take().expect("checked above");
        self.metrics.lock_held.observe(active.granted_at.elapsed());
        // Rolled back, not ended: its statements run again when it resumes.
        self.engine.rollback();
        self.ask(&mut active, ask);
        Ok(Some(self.suspend(
            session,
            active,
            awaiting,
            held_locally,
            BTreeSet::new(),
        )))
    }

    /// Suspends `session`'s transaction, rolled back, until what it waits for comes.
    fn suspend(
        &mut self,
        session: u64,
        active: Active,
        awaiting: BTreeSet<String>,
        held_locally: BTreeSet<String>,
        awaiting_all: BTreeSet<u64>,
    ) -> oneshot::Receiver<Result<(), SqlError>> {
        let (told, resumed) = oneshot::channel();
        let suspended = Suspended {
            active,
            awaiting,
            held_locally,
            awaiting_all,
            resumed: Some(told),
        };
        // What it waits for is pushed to `resuming` when it comes: one waiting for nothing
        // goes there now, or it would wait in vain.
        if suspended.ready() {
            self.resuming.push_back(session);
        }
        self.suspended.insert(session, suspended);
        self.after_release();
        resumed
    }

    /// Of classes no transaction of this node's holds, those a transaction must wait for: those
    /// other nodes own (to ask them for; not an owner that let one wait in vain lately), and
    /// this node's lent out.
    pub(super) fn to_ask(&self, ownership: &Ownership, classes: BTreeSet<String>) -> (Vec<String>, BTreeSet<String>) {
        let now = Instant::now();
        let mut ask = Vec::new();
        let mut awaiting = BTreeSet::new();
        for class in classes {
            let owner = self.owner_of(&class);
            if owner == ownership.me {
                if self.lent.contains_key(&class) || self.lent_all.is_some() {
                    awaiting.insert(class);
                }
            } else if self.silent_until.get(&owner).is_none_or(|until| *until <= now) {
                ask.push(class.clone());
                awaiting.insert(class);
            }
        }
        (ask, awaiting)
    }

    /// Asks the owners for `classes` for `active` (under its ticket, issued now if it has none).
    pub(super) fn ask(&mut self, active: &mut Active, classes: Vec<String>) {
        if classes.is_empty() {
            return;
        }
        let ticket = self.ticket_for(active);
        self.propose_class(ClassMessage::Borrow {
            ticket,
            classes,
            holding: active.label.classes.union(&active.borrowed).cloned().collect(),
            sent_at_ms: unix_ms(),
        });
    }

    /// `active`'s ticket, issued now if it has none.
    fn ticket_for(&mut self, active: &mut Active) -> Ticket {
        *active.ticket.get_or_insert_with(|| {
            self.tickets += 1;
            Ticket {
                incarnation: self.incarnation,
                number: self.tickets,
            }
        })
    }

    /// Whether the suspended transactions holding `class` wait, themselves or through others of
    /// this node's, for one of `classes`.
    pub(super) fn waits_for_any(&self, class: &str, classes: &BTreeSet<String>, seen: &mut Vec<u64>) -> bool {
        let holders: Vec<u64> = self
            .suspended
            .iter()
            .filter(|(session, s)| !seen.contains(session) && holds(&s.active, class))
            .map(|(&session, _)| session)
            .collect();
        seen.extend(&holders);
        holders.into_iter().any(|holder| {
            let waiting = &self.suspended[&holder].held_locally;
            waiting.iter().any(|c| classes.contains(c)) || waiting.iter().any(|c| self.waits_for_any(c, classes, seen))
        })
    }

    /// Suspended transactions waiting for classes others of this node's held: those now free
    /// are asked for (or, this node's, taken if not lent out).
    pub(super) fn recheck_local_waits(&mut self) {
        let Some(ownership) = self.ownership.clone() else {
            return;
        };
        let waiting: Vec<u64> = self
            .suspended
            .iter()
            .filter(|(_, s)| !s.held_locally.is_empty())
            .map(|(&session, _)| session)
            .collect();
        for session in waiting {
            let held = self.suspended[&session].held_locally.clone();
            let freed: BTreeSet<String> = held
                .into_iter()
                .filter(|class| {
                    !self.active.as_ref().is_some_and(|a| holds(a, class))
                        && !self
                            .suspended
                            .iter()
                            .any(|(&other, s)| other != session && holds(&s.active, class))
                })
                .collect();
            if freed.is_empty() {
                continue;
            }
            let (ask, awaiting) = self.to_ask(&ownership, freed.clone());
            let mut suspended = self.suspended.remove(&session).expect("listed above");
            suspended.held_locally.retain(|class| !freed.contains(class));
            suspended.awaiting.extend(awaiting);
            self.ask(&mut suspended.active, ask);
            if suspended.ready() {
                self.resuming.push_back(session);
            }
            self.suspended.insert(session, suspended);
        }
    }

    /// `session`'s suspended transaction waited `borrow_wait` in vain. If the owners it waits
    /// for seem down (they lent nothing to anyone meanwhile, and answer no ping: a log that
    /// stalls for everyone must not have every node take the others for down) it goes on
    /// without their classes (what was lent to it goes back; certification decides) and they
    /// are not asked for `silent_for`. Otherwise it fails: going on beside a live owner would void the owner's
    /// transactions on the class (and those chained on them), not just risk itself; and one
    /// waiting for a class another of its own node's holds cannot run beside that one.
    pub(super) fn go_on_without(&mut self, session: u64) {
        let Some(ownership) = self.ownership.clone() else {
            return;
        };
        let Some(suspended) = self.suspended.get(&session) else {
            return;
        };
        if suspended.ready() {
            // Its classes came meanwhile.
            return;
        }
        let now = Instant::now();
        let alive = |owner: u64| {
            owner == ownership.me
                || ownership.answering.answers(owner)
                || self
                    .last_lent
                    .get(&owner)
                    .is_some_and(|at| now.duration_since(*at) < ownership.borrow_wait)
        };
        let awaited_owners: BTreeSet<u64> = suspended
            .awaiting
            .iter()
            .map(|class| self.owner_of(class))
            .chain(suspended.awaiting_all.iter().copied())
            .collect();
        if !suspended.held_locally.is_empty() || awaited_owners.iter().any(|&owner| alive(owner)) {
            self.fail_suspended(
                session,
                Borrowed::TimedOut,
                "the class's owner did not lend it in time (it is busy with it); retry",
            );
            self.after_release();
            return;
        }
        let suspended = self.suspended.get_mut(&session).expect("looked up above");
        suspended.awaiting.clear();
        suspended.awaiting_all.clear();
        suspended.active.went_on_without = true;
        suspended.active.borrowed.clear();
        let ticket = suspended.active.ticket.take();
        self.metrics.borrowed[Borrowed::TimedOut as usize].inc();
        for owner in awaited_owners {
            self.silent_until.insert(owner, now + ownership.silent_for);
            if owner != ownership.me && !self.owners_down.contains(&owner) {
                // Once the log has it, its classes have owners up: the next transactions on
                // them borrow from those instead of waiting in vain.
                self.propose_class(ClassMessage::OwnerDown {
                    node: NodeRef::Id(owner),
                });
            }
        }
        self.release(ticket);
        self.resuming.push_back(session);
        self.after_release();
    }

    /// `session`'s suspended transaction ends with serialization failure `why`.
    pub(super) fn fail_suspended(&mut self, session: u64, outcome: Borrowed, why: &str) {
        let Some(mut suspended) = self.suspended.remove(&session) else {
            return;
        };
        self.resuming.retain(|&s| s != session);
        self.metrics.borrowed[outcome as usize].inc();
        self.release(suspended.active.ticket);
        if let Some(told) = suspended.resumed.take() {
            let _ = told.send(Err(SqlError::serialization(why)));
        }
    }

    /// Records who asked to borrow (ordered at `at`, holding `holding`), unless the request was
    /// read again long after it was sent (a restart replaying the log: its asker is gone);
    /// whether it was recorded.
    fn note_asker(
        &mut self,
        ownership: &Ownership,
        ticket: Ticket,
        at: Position,
        holding: Vec<String>,
        sent_at_ms: u64,
    ) -> bool {
        let age = Duration::from_millis(unix_ms().saturating_sub(sent_at_ms));
        if age > ownership.borrow_wait + ownership.lend_for {
            return false;
        }
        let holding = holding.into_iter().collect();
        self.asked.insert(ticket, Asked { at, holding });
        true
    }

    /// A class hand-over the log ordered at `at` (see `Ownership`).
    pub(super) fn hand_over(&mut self, at: Position, message: ClassMessage) {
        let Some(ownership) = self.ownership.clone() else {
            return;
        };
        match message {
            ClassMessage::Borrow {
                ticket,
                classes,
                holding,
                sent_at_ms,
            } => {
                if !self.note_asker(&ownership, ticket, at, holding, sent_at_ms) {
                    return;
                }
                let now = Instant::now();
                for class in classes {
                    if self.owner_of(&class) == ownership.me {
                        self.to_lend.push_back((ticket, class, at, now));
                    }
                }
            }
            ClassMessage::Lend { ticket, class } => {
                let owner = self.owner_of(&class);
                self.last_lent.insert(owner, Instant::now());
                let waiter = self.suspended.iter_mut().find(|(_, s)| s.active.ticket == Some(ticket));
                if let Some((&session, suspended)) = waiter {
                    if suspended.awaiting.remove(&class) {
                        suspended.active.borrowed.insert(class);
                        if suspended.ready() {
                            self.resuming.push_back(session);
                        }
                    }
                }
            }
            ClassMessage::BorrowAll {
                ticket,
                holding,
                sent_at_ms,
            } => {
                if !self.note_asker(&ownership, ticket, at, holding, sent_at_ms) {
                    return;
                }
                // Every node lends, even one the asker took for down: a loan it did not wait
                // for costs nothing.
                self.to_lend_all.push_back((ticket, at, Instant::now()));
            }
            ClassMessage::LendAll { ticket, node } => {
                let Some(node) = self.resolve(node) else {
                    return self.try_lend();
                };
                self.last_lent.insert(node, Instant::now());
                let waiter = self.suspended.iter_mut().find(|(_, s)| s.active.ticket == Some(ticket));
                if let Some((&session, suspended)) = waiter {
                    if suspended.awaiting_all.remove(&node) && suspended.ready() {
                        self.resuming.push_back(session);
                    }
                }
            }
            ClassMessage::Release { ticket } => {
                self.asked.remove(&ticket);
                self.to_lend.retain(|(asker, _, _, _)| *asker != ticket);
                self.to_lend_all.retain(|(asker, _, _)| *asker != ticket);
                if self.lent_all.is_some_and(|(borrower, _)| borrower == ticket) {
                    self.take_back_all(&ownership);
                }
                let returned: Vec<String> = self
                    .lent
                    .iter()
                    .filter(|(_, (borrower, _))| *borrower == ticket)
                    .map(|(class, _)| class.clone())
                    .collect();
                self.take_back(&returned);
            }
            ClassMessage::OwnerDown { node } => {
                if let Some(node) = self.resolve(node).filter(|node| self.voters.contains(node)) {
                    let mut down = self.owners_down.clone();
                    if down.insert(node) {
                        tracing::info!(
                            node,
                            "a class owner is taken for down: its classes move to the nodes up"
                        );
                    }
                    self.owners_moved(&ownership, self.voters.clone(), down);
                }
            }
            ClassMessage::OwnerBack { node } => {
                if let Some(node) = self.resolve(node) {
                    if node == ownership.me {
                        self.back_proposed = None;
                    }
                    let mut down = self.owners_down.clone();
                    if down.remove(&node) {
                        tracing::info!(node, "a class owner taken for down is back: it owns its classes again");
                    }
                    self.owners_moved(&ownership, self.voters.clone(), down);
                }
            }
        }
        self.try_lend();
    }

    /// Taken for down while it runs (a borrower gave up on it, or it was down): it says it is
    /// back, and owns its classes again once the log has that — again if that word was lost.
    pub(super) fn claim_back(&mut self) {
        let Some(ownership) = &self.ownership else {
            return;
        };
        if self.owners_down.contains(&ownership.me)
            && self
                .back_proposed
                .is_none_or(|at| at.elapsed() >= ownership.borrow_wait)
        {
            self.back_proposed = Some(Instant::now());
            self.propose_class(ClassMessage::OwnerBack {
                node: NodeRef::Id(ownership.me),
            });
        }
    }

    /// Which node owns `class` now.
    pub(super) fn owner_of(&self, class: &str) -> u64 {
        owner_among(class, &self.voters, &self.owners_down)
    }

    /// The id of the node a class message names (None: a place no voter stands at).
    fn resolve(&self, node: NodeRef) -> Option<u64> {
        match node {
            NodeRef::Id(id) => Some(id),
            NodeRef::Place(place) => usize::try_from(place).ok().and_then(|p| self.voters.get(p).copied()),
        }
    }

    /// A membership change applied: the classes are placed over `voters` (sorted ids) from
    /// here on; a node that left is no longer taken for down.
    pub(super) fn voters_changed(&mut self, voters: Vec<u64>) {
        let Some(ownership) = self.ownership.clone() else {
            return;
        };
        if voters == self.voters {
            return;
        }
        tracing::info!(?voters, before = ?self.voters, "conflict classes placed over new voters");
        let down = self
            .owners_down
            .iter()
            .copied()
            .filter(|node| voters.contains(node))
            .collect();
        self.owners_moved(&ownership, voters, down);
        self.try_lend();
    }

    /// The voters are now `voters` and those taken for down `down`: a class that changed owner
    /// is no longer lent or to be lent by its old owner, a transaction waiting for it asks its
    /// new owner (or has it, if that is this node and it is not lent), and a global one waits
    /// for no node down or gone.
    fn owners_moved(&mut self, ownership: &Ownership, voters: Vec<u64>, down: BTreeSet<u64>) {
        if down == self.owners_down && voters == self.voters {
            return;
        }
        let before_voters = std::mem::replace(&mut self.voters, voters);
        let before = std::mem::replace(&mut self.owners_down, down);
        self.metrics.owners_down.set(self.owners_down.len() as i64);
        self.metrics.owner_voters.set(self.voters.len() as i64);
        let after_voters = self.voters.clone();
        let moved = |class: &str, now: &BTreeSet<u64>| {
            owner_among(class, &before_voters, &before) != owner_among(class, &after_voters, now)
        };
        let now = self.owners_down.clone();
        let gone: Vec<String> = self.lent.keys().filter(|class| moved(class, &now)).cloned().collect();
        for class in &gone {
            self.lent.remove(class);
        }
        self.to_lend.retain(|(_, class, _, _)| !moved(class, &now));
        let sessions: Vec<u64> = self.suspended.keys().copied().collect();
        for session in sessions {
            let suspended = self.suspended.get_mut(&session).expect("listed above");
            // A global transaction waits for no node taken for down (but its own, which lends
            // all the same: see `reach`).
            let waited_for_all = !suspended.awaiting_all.is_empty();
            suspended
                .awaiting_all
                .retain(|node| *node == ownership.me || (after_voters.contains(node) && !now.contains(node)));
            if waited_for_all && suspended.ready() {
                self.resuming.push_back(session);
                continue;
            }
            let moved_classes: BTreeSet<String> = suspended
                .awaiting
                .iter()
                .filter(|class| moved(class, &now))
                .cloned()
                .collect();
            if moved_classes.is_empty() {
                continue;
            }
            suspended.awaiting.retain(|class| !moved_classes.contains(class));
            let (ask, awaiting) = self.to_ask(ownership, moved_classes);
            let mut suspended = self.suspended.remove(&session).expect("listed above");
            suspended.awaiting.extend(awaiting);
            self.ask(&mut suspended.active, ask);
            if suspended.ready() {
                self.resuming.push_back(session);
            }
            self.suspended.insert(session, suspended);
        }
    }

    /// This node's `classes` lent out are back: its transactions waiting for them may go on.
    pub(super) fn take_back(&mut self, classes: &[String]) {
        for class in classes {
            self.lent.remove(class);
            for (&session, suspended) in &mut self.suspended {
                if suspended.awaiting.remove(class) && suspended.ready() {
                    self.resuming.push_back(session);
                }
            }
        }
    }

    /// This node's classes lent all at once are back: its transactions waiting for one go on.
    fn take_back_all(&mut self, ownership: &Ownership) {
        self.lent_all = None;
        let mine: BTreeSet<String> = self
            .suspended
            .values()
            .flat_map(|s| s.awaiting.iter())
            .filter(|class| self.owner_of(class) == ownership.me && !self.lent.contains_key(*class))
            .cloned()
            .collect();
        self.take_back(&mine.into_iter().collect::<Vec<_>>());
    }

    /// Lends what was asked for, in log order per class, once this node's transactions are
    /// done with it (their write-sets go to the log before the loan); takes back what was lent
    /// too long.
    pub(super) fn try_lend(&mut self) {
        let Some(ownership) = self.ownership.clone() else {
            return;
        };
        let now = Instant::now();
        let overdue: Vec<String> = self
            .lent
            .iter()
            .filter(|(_, (_, since))| now.duration_since(*since) >= ownership.lend_for)
            .map(|(class, _)| class.clone())
            .collect();
        self.metrics.lent_overdue.add(overdue.len() as u64);
        self.take_back(&overdue);
        if self
            .lent_all
            .is_some_and(|(_, since)| now.duration_since(since) >= ownership.lend_for)
        {
            self.metrics.lent_overdue.inc();
            self.take_back_all(&ownership);
        }
        if self.lent_all.is_some() {
            return;
        }
        // Requests ordered after one for all classes wait until that one is done.
        let first_all = self.to_lend_all.front().map(|&(_, at, _)| at);
        let mut still_asked = BTreeSet::new();
        let mut next = 0;
        while next < self.to_lend.len() {
            let (ticket, class, at, since) = self.to_lend[next].clone();
            if first_all.is_some_and(|first| at > first)
                || still_asked.contains(&class)
                || self.lent.contains_key(&class)
                || self.in_use(&class, ticket, at, since)
            {
                still_asked.insert(class);
                next += 1;
                continue;
            }
            self.to_lend.remove(next);
            self.lent.insert(class.clone(), (ticket, now));
            self.metrics.lent.inc();
            self.propose_class(ClassMessage::Lend { ticket, class });
        }
        let Some(&(ticket, at, since)) = self.to_lend_all.front() else {
            return;
        };
        // Lent all at once when nothing of this node's is lent, nothing asked earlier waits,
        // and no transaction of its holds a class.
        if self.lent.is_empty()
            && self.to_lend.iter().all(|&(_, _, asked_at, _)| asked_at > at)
            && !self.in_use_any(ticket, at, since)
        {
            self.to_lend_all.pop_front();
            self.lent_all = Some((ticket, now));
            self.metrics.lent.inc();
            self.propose_class(ClassMessage::LendAll {
                ticket,
                node: NodeRef::Id(ownership.me),
            });
        }
    }

    /// Whether this node's transactions hold classes, so `asker`'s request for all of them
    /// waits on (as `in_use` for one class): the one holding the write lock does, and a
    /// suspended one that holds any and does not give way.
    fn in_use_any(&mut self, asker: Ticket, at: Position, since: Instant) -> bool {
        self.active.is_some()
            || self.held_in_the_way(asker, at, since, |s| {
                s.active.ticket != Some(asker) && !(s.active.label.classes.is_empty() && s.active.borrowed.is_empty())
            })
    }

    /// Whether this node's transactions use `class`, so `asker`'s request for it, standing at
    /// `at` in the log and waiting since `since`, waits on. A suspended one that waits in turn
    /// gives way if it is the younger (its own request stands later in the log, or not yet)
    /// and it waits for what the asker holds, or the asker waited `GIVE_WAY_AFTER` (a longer
    /// cycle of waits, through other nodes: in a cycle some member is younger than the one it
    /// holds up, so every cycle breaks).
    pub(super) fn in_use(&mut self, class: &str, asker: Ticket, at: Position, since: Instant) -> bool {
        self.active.as_ref().is_some_and(|a| holds(a, class))
            || self.held_in_the_way(asker, at, since, |s| holds(&s.active, class))
    }

    /// Whether suspended transactions that `hold` what `asker`'s request (at `at`, waiting
    /// since `since`) wants keep it waiting; those younger and waiting give way (see `in_use`).
    fn held_in_the_way(
        &mut self,
        asker: Ticket,
        at: Position,
        since: Instant,
        hold: impl Fn(&Suspended) -> bool,
    ) -> bool {
        let long = since.elapsed() >= GIVE_WAY_AFTER;
        let asker_holds = self.asked.get(&asker).map(|asked| &asked.holding);
        let holders: Vec<(u64, bool)> = self
            .suspended
            .iter()
            .filter(|(_, s)| hold(s))
            .map(|(&session, s)| {
                let asked = s.active.ticket.and_then(|t| self.asked.get(&t)).map(|asked| asked.at);
                let waits_for_asker = asker_holds.is_some_and(|held| s.awaiting.iter().any(|c| held.contains(c)));
                let younger = asked.is_none_or(|asked| asked > at);
                (session, !s.ready() && younger && (waits_for_asker || long))
            })
            .collect();
        let mut in_use = false;
        for (session, younger_and_waiting) in holders {
            if younger_and_waiting {
                self.give_way(session);
            } else {
                in_use = true;
            }
        }
        in_use
    }

    /// `session`'s suspended transaction fails: an older one needs a class it holds.
    pub(super) fn give_way(&mut self, session: u64) {
        self.fail_suspended(
            session,
            Borrowed::GaveWay,
            "an older transaction needed a class this one held while it waited for another; retry",
        );
    }

    /// Tells the owners `ticket`'s transaction is done with what it asked for.
    pub(super) fn release(&mut self, ticket: Option<Ticket>) {
        if let Some(ticket) = ticket {
            self.propose_class(ClassMessage::Release { ticket });
        }
    }

    /// Sends a class hand-over to the log, after everything this node proposed before.
    pub(super) fn propose_class(&mut self, message: ClassMessage) {
        let (proposed, _) = oneshot::channel();
        // Advisory: if the runtime is going away, nothing waits for it.
        let _ = self.proposals.send((Command::Class(message), proposed));
    }

    /// Gives the write lock back to a suspended transaction that may go on, re-executed on the
    /// state the log reached; whether one has it.
    pub(super) fn resume_next(&mut self) -> bool {
        let mut next = 0;
        while next < self.resuming.len() {
            let session = self.resuming[next];
            let Some((label, ticket)) = self
                .suspended
                .get(&session)
                .map(|s| (s.active.label.clone(), s.active.ticket))
            else {
                self.resuming.remove(next);
                continue;
            };
            // While a global transaction has every class of this node's, only it goes on.
            let lent_to_another = self.lent_all.is_some_and(|(borrower, _)| Some(borrower) != ticket);
            if lent_to_another || self.blocked_by_own_in_flight(&label) {
                next += 1;
                continue;
            }
            self.resuming.remove(next);
            let mut suspended = self.suspended.remove(&session).expect("looked up above");
            let told = suspended
                .resumed
                .take()
                .expect("a suspended transaction is resumed once");
            let ticket = suspended.active.ticket;
            let went_on_without = suspended.active.went_on_without;
            match self.re_execute(&mut suspended.active) {
                Ok(()) => {
                    self.active = Some(suspended.active);
                    if told.send(Ok(())).is_err() {
                        // Its session left.
                        self.engine.rollback();
                        self.active = None;
                        self.release(ticket);
                        continue;
                    }
                    if !went_on_without {
                        self.metrics.borrowed[Borrowed::Resumed as usize].inc();
                    }
                    return true;
                }
                Err(e) => {
                    self.metrics.borrowed[Borrowed::Failed as usize].inc();
                    self.release(ticket);
                    let _ = told.send(Err(e));
                }
            }
        }
        false
    }

    /// Runs a suspended transaction's statements again on the state the log reached, which
    /// must show its classes as it saw them: no other node's transaction committed on them
    /// since its snapshot, and the chain it ran on committed. Its snapshot moves to here.
    pub(super) fn re_execute(&mut self, active: &mut Active) -> Result<(), SqlError> {
        let stale = || SqlError::serialization("what the transaction read changed while it waited for a class; retry");
        if !self
            .certifier
            .untouched_since(&active.label.classes, active.snapshot, self.incarnation)
        {
            return Err(stale());
        }
        let incarnation = self.incarnation;
        if active.chain_applied.iter().any(|&seq| {
            !self.own_in_flight.iter().any(|own| own.id.seq == seq) && !self.certifier.committed(incarnation, seq)
        }) {
            return Err(stale());
        }
        self.engine.begin()?;
        let chained = self.own_in_flight.is_empty() || self.engine.applies_in_transaction();
        let mut applied = Vec::new();
        let mut ran = Ok(());
        if chained {
            ran = self.apply_chain(&active.label, &mut applied);
            self.chain_broken |= ran.is_err();
        }
        if ran.is_ok() {
            ran = self.engine.record_writes();
        }
        for (ordinal, statement) in active.statements.iter().enumerate() {
            if ran.is_err() {
                break;
            }
            self.engine.seed(statement_seed(active.seed, ordinal));
            ran = self.engine.execute(&statement.sql, &statement.params).map(drop);
        }
        if let Err(e) = ran {
            self.engine.rollback();
            return Err(SqlError::serialization(&format!(
                "the transaction does not run again after its wait for a class ({e}); retry"
            )));
        }
        active.snapshot = (self.applied.log_index, self.applied.command);
        active.chained = chained;
        active.chain_applied = applied;
        active.granted_at = Instant::now();
        Ok(())
    }
}
