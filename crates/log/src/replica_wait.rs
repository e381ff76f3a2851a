//! How many nodes besides the leader hold a log prefix durably (Redis's WAIT).
//!
//! Only the leader knows its followers' progress (`matched` is raised by their append responses,
//! which they send once the entries are fsynced), so a follower asks the leader over the peer
//! transport, as the log's own service [`SERVICE`]. The leader measures against a *target*: its
//! last index when the question arrives. Every write acknowledged before the question was asked is
//! at or below it — committed writes are in every leader's log, and a write CURP acknowledged
//! speculatively is in the leader's log from its proposal on, or among what a new leader recovers
//! and proposes before it answers (targets wait for that recovery). A target is reused only with
//! the leader, and in the term, that set it; a new leader sets its own.

use std::time::Instant;

use tokio::sync::oneshot;

use crate::error::{DecodeError, NodeError};
use crate::wire::{put_u32, put_u64, Reader};

/// The peer service number the log answers itself; applications' services use others.
pub const SERVICE: u8 = 0;

/// A leader's answer: in `term`, `replicas` nodes besides it had the log through `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub term: u64,
    pub target: u64,
    pub replicas: usize,
}

/// A follower's question to the leader: wait until `replicas` nodes hold `target` (0: the
/// leader's last index), for at most `timeout_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Question {
    pub target: u64,
    pub replicas: u32,
    pub timeout_ms: u64,
}

impl Question {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20);
        put_u64(&mut out, self.target);
        put_u32(&mut out, self.replicas);
        put_u64(&mut out, self.timeout_ms);
        out
    }

    pub fn decode(body: &[u8]) -> Result<Question, DecodeError> {
        let mut r = Reader::new(body);
        let question = Question {
            target: r.u64()?,
            replicas: r.u32()?,
            timeout_ms: r.u64()?,
        };
        r.finish()?;
        Ok(question)
    }
}

const ANSWERED: u8 = 0;
const NOT_LEADER: u8 = 1;

/// The response body: an answer, or that the node asked does not lead (any more).
pub fn encode_response(answer: Option<Answer>) -> Vec<u8> {
    let Some(answer) = answer else {
        return vec![NOT_LEADER];
    };
    let mut out = Vec::with_capacity(21);
    out.push(ANSWERED);
    put_u64(&mut out, answer.term);
    put_u64(&mut out, answer.target);
    put_u32(&mut out, u32::try_from(answer.replicas).unwrap_or(u32::MAX));
    out
}

pub fn decode_response(body: &[u8]) -> Result<Option<Answer>, DecodeError> {
    let mut r = Reader::new(body);
    let answer = match r.u8()? {
        NOT_LEADER => None,
        ANSWERED => Some(Answer {
            term: r.u64()?,
            target: r.u64()?,
            replicas: r.u32()? as usize,
        }),
        _ => return Err(DecodeError::Invalid("replica wait response kind")),
    };
    r.finish()?;
    Ok(answer)
}

/// A question waiting at the leader for its followers to catch up.
pub struct Waiting {
    /// 0 until the leader may set it (see the module's note on recovery).
    pub target: u64,
    pub replicas: usize,
    pub deadline: Option<Instant>,
    pub reply: oneshot::Sender<Result<Answer, NodeError>>,
}

/// The leader's waiting questions.
#[derive(Default)]
pub struct Waits {
    waiting: Vec<Waiting>,
}

impl Waits {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn push(&mut self, waiting: Waiting) {
        self.waiting.push(waiting);
    }

    /// The earliest deadline among the waiting.
    pub fn deadline(&self) -> Option<Instant> {
        self.waiting.iter().filter_map(|w| w.deadline).min()
    }

    /// Answers every question that is satisfied or out of time. `target_now` is the target a
    /// question without one gets (`None` while the leader may not set one yet); `holding(target)`
    /// counts the nodes besides the leader that hold it.
    pub fn answer(&mut self, term: u64, target_now: Option<u64>, now: Instant, holding: impl Fn(u64) -> usize) {
        self.waiting.retain_mut(|waiting| {
            if waiting.target == 0 {
                if let Some(target) = target_now {
                    waiting.target = target;
                }
            }
            let replicas = if waiting.target == 0 {
                0
            } else {
                holding(waiting.target)
            };
            let timed_out = waiting.deadline.is_some_and(|d| now >= d);
            if waiting.target == 0 && !timed_out {
                return true;
            }
            if replicas < waiting.replicas && !timed_out && !waiting.reply.is_closed() {
                return true;
            }
            let (reply, _) = oneshot::channel();
            let reply = std::mem::replace(&mut waiting.reply, reply);
            let _ = reply.send(Ok(Answer {
                term,
                target: waiting.target,
                replicas,
            }));
            false
        });
    }

    /// Leadership moved: every question fails, for its asker to put to the new leader.
    pub fn fail_all(&mut self) {
        for waiting in self.waiting.drain(..) {
            let _ = waiting.reply.send(Err(NodeError::LeaderChanged));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn questions_and_responses_round_trip_and_nonsense_is_refused() {
        let question = Question {
            target: 42,
            replicas: 2,
            timeout_ms: 1500,
        };
        assert_eq!(Question::decode(&question.encode()).unwrap(), question);
        assert!(Question::decode(&question.encode()[..19]).is_err());
        let answer = Answer {
            term: 7,
            target: 42,
            replicas: 1,
        };
        assert_eq!(decode_response(&encode_response(Some(answer))).unwrap(), Some(answer));
        assert_eq!(decode_response(&encode_response(None)).unwrap(), None);
        assert!(decode_response(&[]).is_err());
        assert!(decode_response(&[9]).is_err());
        assert!(decode_response(&[NOT_LEADER, 0]).is_err());
    }

    #[test]
    fn a_question_waits_for_its_target_and_its_replicas_or_its_deadline() {
        let mut waits = Waits::default();
        let now = Instant::now();
        let (reply, mut satisfied) = oneshot::channel();
        waits.push(Waiting {
            target: 0,
            replicas: 2,
            deadline: None,
            reply,
        });
        let (reply, mut timed) = oneshot::channel();
        waits.push(Waiting {
            target: 0,
            replicas: 2,
            deadline: Some(now + Duration::from_millis(10)),
            reply,
        });
        // Recovering: no target yet, nothing answered before the deadline.
        waits.answer(3, None, now, |_| 2);
        assert!(satisfied.try_recv().is_err() && timed.try_recv().is_err());
        waits.answer(3, Some(10), now, |target| if target <= 5 { 2 } else { 1 });
        assert!(satisfied.try_recv().is_err() && timed.try_recv().is_err());
        // The target stays the one first set, however far the log has gone since.
        waits.answer(3, Some(20), now + Duration::from_millis(10), |_| 1);
        let expected = Answer {
            term: 3,
            target: 10,
            replicas: 1,
        };
        assert_eq!(timed.try_recv().unwrap().unwrap(), expected);
        assert!(satisfied.try_recv().is_err());
        waits.answer(3, Some(20), now, |_| 2);
        assert_eq!(
            satisfied.try_recv().unwrap().unwrap(),
            Answer {
                replicas: 2,
                ..expected
            }
        );
        assert!(waits.is_empty());
        let (reply, mut failed) = oneshot::channel();
        waits.push(Waiting {
            target: 0,
            replicas: 1,
            deadline: None,
            reply,
        });
        waits.fail_all();
        assert!(matches!(failed.try_recv().unwrap(), Err(NodeError::LeaderChanged)));
    }
}
