//! Payload of a normal raft entry: a batch of client commands proposed together by one node.
//!
//! `[version u8][leader time ms u64][origin node u64][origin incarnation u64][count u32]` then per
//! command `[request id u64][len u32][bytes]`. The origin (node id plus a per-process incarnation)
//! lets the proposing node route each result back to its waiting client once it applies the entry,
//! and the incarnation keeps a restarted node from mistaking its old requests for new ones.
//!
//! The leader's time is the wall-clock time, in milliseconds since the Unix epoch, that the leader
//! fixed for the batch as it took it into its log (a follower's forwarded batch is stamped again
//! by the leader). Commands whose effect depends on time (key expiry) read it, never a replica's
//! own clock, so every replica applies them alike. Batches of version 1 carry no time (0).

use bytes::Bytes;

use crate::error::DecodeError;
use crate::wire::{put_blob, put_u32, put_u64, Reader};

pub(crate) const BATCH_VERSION: u8 = 2;
/// Batches logged before entries carried the leader's time.
const UNTIMED_BATCH_VERSION: u8 = 1;
pub const BATCH_HEADER_BYTES: usize = 1 + 8 + 8 + 8 + 4;
pub const COMMAND_OVERHEAD_BYTES: usize = 8 + 4;
/// Where the leader's time sits in an encoded batch.
const LEADER_TIME_AT: std::ops::Range<usize> = 1..9;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin {
    pub node_id: u64,
    pub incarnation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub origin: Origin,
    /// Milliseconds since the Unix epoch, as the leader fixed them (0 in version-1 batches).
    pub leader_time_ms: u64,
    pub commands: Vec<(u64, Bytes)>,
}

pub fn encode(origin: Origin, leader_time_ms: u64, commands: &[(u64, Bytes)]) -> Bytes {
    Bytes::from(encode_commands(
        origin,
        leader_time_ms,
        commands.iter().map(|(id, command)| (*id, command.as_ref())),
    ))
}

/// Encodes the batch of `commands` (request id, command bytes) in one allocation.
pub fn encode_commands<'a>(
    origin: Origin,
    leader_time_ms: u64,
    commands: impl Iterator<Item = (u64, &'a [u8])> + Clone,
) -> Vec<u8> {
    let (count, command_bytes) = commands
        .clone()
        .fold((0usize, 0usize), |(n, bytes), (_, c)| (n + 1, bytes + c.len()));
    let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + command_bytes + count * COMMAND_OVERHEAD_BYTES);
    out.push(BATCH_VERSION);
    put_u64(&mut out, leader_time_ms);
    put_u64(&mut out, origin.node_id);
    put_u64(&mut out, origin.incarnation);
    put_u32(&mut out, count as u32);
    for (request_id, command) in commands {
        put_u64(&mut out, request_id);
        put_blob(&mut out, command);
    }
    out
}

/// The encoded batch `data` with its leader time replaced: what a leader does to the batches
/// followers forward. `None` when `data` is not a batch of the current version.
pub fn restamp(data: &[u8], leader_time_ms: u64) -> Option<Vec<u8>> {
    if data.first() != Some(&BATCH_VERSION) || data.len() < BATCH_HEADER_BYTES {
        return None;
    }
    let mut stamped = data.to_vec();
    stamped[LEADER_TIME_AT].copy_from_slice(&leader_time_ms.to_le_bytes());
    Some(stamped)
}

/// Decodes a batch; command bytes are zero-copy slices of `payload`.
pub fn decode(payload: &Bytes) -> Result<Batch, DecodeError> {
    let mut r = Reader::new(payload);
    let leader_time_ms = match r.u8()? {
        BATCH_VERSION => r.u64()?,
        UNTIMED_BATCH_VERSION => 0,
        found => {
            return Err(DecodeError::UnsupportedVersion {
                what: "log entry batch",
                found: found.into(),
                supported: BATCH_VERSION.into(),
            })
        }
    };
    let origin = Origin {
        node_id: r.u64()?,
        incarnation: r.u64()?,
    };
    let count = r.u32()? as usize;
    let mut commands = Vec::with_capacity(count.min(r.remaining() / COMMAND_OVERHEAD_BYTES));
    for _ in 0..count {
        let request_id = r.u64()?;
        let len = r.u32()? as usize;
        let start = payload.len() - r.remaining();
        r.bytes(len)?;
        commands.push((request_id, payload.slice(start..start + len)));
    }
    r.finish()?;
    Ok(Batch {
        origin,
        leader_time_ms,
        commands,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_every_truncation() {
        let origin = Origin {
            node_id: 2,
            incarnation: 99,
        };
        let commands = vec![(7, Bytes::from("SET a 1")), (8, Bytes::new()), (9, Bytes::from("x"))];
        let encoded = encode(origin, 1_700_000_000_123, &commands);
        let decoded = decode(&encoded).unwrap();
        let expected = Batch {
            origin,
            leader_time_ms: 1_700_000_000_123,
            commands,
        };
        assert_eq!(decoded, expected);
        for cut in 0..encoded.len() {
            assert!(decode(&encoded.slice(..cut)).is_err(), "cut {cut}");
        }
        let mut extended = encoded.to_vec();
        extended.push(0);
        assert!(decode(&Bytes::from(extended)).is_err());

        let restamped = Bytes::from(restamp(&encoded, 42).unwrap());
        let decoded = decode(&restamped).unwrap();
        assert_eq!(decoded.leader_time_ms, 42);
        assert_eq!(decoded.commands, expected.commands);
        assert_eq!(restamp(b"\x07not a batch", 42), None);
    }

    #[test]
    fn a_batch_from_before_leader_times_decodes_with_time_zero() {
        let mut old = vec![UNTIMED_BATCH_VERSION];
        old.extend_from_slice(&2u64.to_le_bytes());
        old.extend_from_slice(&5u64.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&7u64.to_le_bytes());
        old.extend_from_slice(&3u32.to_le_bytes());
        old.extend_from_slice(b"GET");
        let decoded = decode(&Bytes::from(old)).unwrap();
        assert_eq!(decoded.leader_time_ms, 0);
        assert_eq!(
            decoded.origin,
            Origin {
                node_id: 2,
                incarnation: 5
            }
        );
        assert_eq!(decoded.commands, vec![(7, Bytes::from("GET"))]);
    }

    #[test]
    fn huge_count_does_not_allocate_or_panic() {
        let mut buf = vec![BATCH_VERSION];
        buf.extend_from_slice(&[0u8; 24]);
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&Bytes::from(buf)).is_err());
    }
}
