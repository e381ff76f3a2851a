//! What the raft loop of a CURP leader holds back (the protocol is `chorus_curp`'s; the argument
//! is in `docs/reliability.md`, "CURP").
//!
//! A CURP leader answers a write before it commits (a *speculative* reply) when nothing it has
//! proposed and not applied touches the write's keys; the client is done once a superquorum of
//! witnesses also holds the write. Should this leader fail, the next one finds the write in the
//! witnesses and proposes it again. Three things keep that from being seen out of order:
//!
//! - **Recovery first.** A new leader proposes nothing of its clients' (its own queued writes,
//!   followers' forwarded ones) until it has proposed what it recovered from the witnesses: a
//!   write proposed before a recovered one could change the reply the old leader gave.
//! - **No speculation, no reads until recovered.** Until the last recovery entry has applied, it
//!   speculates on nothing (which also means an entry of its own term has committed, so no
//!   uncommitted entry of an older term it lacks can ever commit) and serves no read.
//! - **Reads see speculated writes.** A read that arrives after a speculative reply went out
//!   waits until that write commits: this leader's own reads, its lease reads, and followers'
//!   ReadIndex requests are held until the commit index reaches the last speculated index.

use raft::eraftpb::Message;

/// Followers' forwarded writes held while a new leader recovers, at most: past this they are
/// dropped and the followers' clients see their writes time out.
const MAX_HELD_PROPOSALS: usize = 16 * 1024;

#[derive(Default)]
pub(crate) struct CurpLeader {
    /// The term this node leads with CURP on (`None`: it does not).
    leading_term: Option<u64>,
    /// Term and index of the last entry this leader proposed for its recovery.
    recovered: Option<(u64, u64)>,
    /// The term whose writes this node, as leader, has told the state machine of (0: none),
    /// through which index, and the last index it answered speculatively.
    pub noted_in_term: u64,
    pub noted_through: u64,
    pub speculated_through: u64,
    /// Followers' forwarded writes that arrived before the recovery was proposed.
    held_proposals: Vec<Message>,
    /// Followers' ReadIndex requests, each with the commit index it waits for.
    held_read_indexes: Vec<(u64, Message)>,
}

impl CurpLeader {
    pub fn leading_term(&self) -> Option<u64> {
        self.leading_term
    }

    pub fn set_leading_term(&mut self, term: Option<u64>) {
        self.leading_term = term;
    }

    /// Whether the leader of `term` has proposed its recovery (so may propose clients' writes).
    pub fn recovery_proposed(&self, term: u64) -> bool {
        self.recovered.is_some_and(|(t, _)| t == term)
    }

    /// Whether the leader of `term`, having applied through `applied`, has finished recovering
    /// (so may speculate and serve reads).
    pub fn recovered(&self, term: u64, applied: u64) -> bool {
        self.recovered.is_some_and(|(t, index)| t == term && applied >= index)
    }

    /// The leader of `term` proposed its recovery, the last entry of it at `index`.
    pub fn note_recovery(&mut self, term: u64, index: u64) {
        assert!(
            !self.recovery_proposed(term),
            "one recovery per term: term {term} recovered again"
        );
        self.recovered = Some((term, index));
    }

    pub fn hold_proposal(&mut self, msg: Message) -> bool {
        if self.held_proposals.len() >= MAX_HELD_PROPOSALS {
            return false;
        }
        self.held_proposals.push(msg);
        true
    }

    pub fn take_held_proposals(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.held_proposals)
    }

    /// Holds a follower's ReadIndex until the commit index reaches what was speculated when it
    /// arrived (and the leader has recovered).
    pub fn hold_read_index(&mut self, msg: Message) {
        self.held_read_indexes.push((self.speculated_through, msg));
    }

    /// The held ReadIndex requests the commit index `committed` lets go.
    pub fn release_read_indexes(&mut self, committed: u64) -> Vec<Message> {
        if self.held_read_indexes.is_empty() {
            return Vec::new();
        }
        let (ready, waiting) = std::mem::take(&mut self.held_read_indexes)
            .into_iter()
            .partition::<Vec<_>, _>(|(wait_for, _)| *wait_for <= committed);
        self.held_read_indexes = waiting;
        ready.into_iter().map(|(_, msg)| msg).collect()
    }

    pub fn holds_read_indexes(&self) -> bool {
        !self.held_read_indexes.is_empty()
    }

    /// This node no longer leads: what it held is dropped (followers time out and ask the next
    /// leader) and its notes are forgotten.
    pub fn step_down(&mut self) {
        self.held_proposals.clear();
        self.held_read_indexes.clear();
        self.noted_in_term = 0;
        self.noted_through = 0;
        self.speculated_through = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_recovers_once_per_term_and_is_done_when_the_recovery_applies() {
        let mut curp = CurpLeader::default();
        assert!(!curp.recovery_proposed(3));
        curp.note_recovery(3, 10);
        assert!(curp.recovery_proposed(3));
        assert!(!curp.recovered(3, 9));
        assert!(curp.recovered(3, 10));
        assert!(!curp.recovered(4, 10), "a later term recovers anew");
    }

    #[test]
    fn held_read_indexes_wait_for_what_was_speculated_when_they_arrived() {
        let mut curp = CurpLeader {
            speculated_through: 7,
            ..CurpLeader::default()
        };
        curp.hold_read_index(Message::default());
        curp.speculated_through = 9;
        curp.hold_read_index(Message::default());
        assert_eq!(curp.release_read_indexes(6).len(), 0);
        assert_eq!(curp.release_read_indexes(8).len(), 1);
        assert!(curp.holds_read_indexes());
        assert_eq!(curp.release_read_indexes(9).len(), 1);
        assert!(!curp.holds_read_indexes());
    }
}
