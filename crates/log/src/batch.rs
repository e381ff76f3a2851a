//! Payload of a normal raft entry: a batch of client commands proposed together by one node.
//!
//! `[version u8][origin node u64][origin incarnation u64][count u32]` then per command
//! `[request id u64][len u32][bytes]`. The origin (node id plus a per-process incarnation) lets the
//! proposing node route each result back to its waiting client once it applies the entry, and the
//! incarnation keeps a restarted node from mistaking its old requests for new ones.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::wire::{put_blob, put_u32, put_u64, Reader};

pub(crate) const BATCH_VERSION: u8 = 1;
pub const BATCH_HEADER_BYTES: usize = 1 + 8 + 8 + 4;
pub const COMMAND_OVERHEAD_BYTES: usize = 8 + 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin {
    pub node_id: u64,
    pub incarnation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub origin: Origin,
    pub commands: Vec<(u64, Bytes)>,
}

pub fn encode(origin: Origin, commands: &[(u64, Bytes)]) -> Bytes {
    Bytes::from(encode_commands(
        origin,
        commands.iter().map(|(id, command)| (*id, command.as_ref())),
    ))
}

/// Encodes the batch of `commands` (request id, command bytes) in one allocation.
pub fn encode_commands<'a>(origin: Origin, commands: impl Iterator<Item = (u64, &'a [u8])> + Clone) -> Vec<u8> {
    let (count, command_bytes) = commands
        .clone()
        .fold((0usize, 0usize), |(n, bytes), (_, c)| (n + 1, bytes + c.len()));
    let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + command_bytes + count * COMMAND_OVERHEAD_BYTES);
    out.push(BATCH_VERSION);
    put_u64(&mut out, origin.node_id);
    put_u64(&mut out, origin.incarnation);
    put_u32(&mut out, count as u32);
    for (request_id, command) in commands {
        put_u64(&mut out, request_id);
        put_blob(&mut out, command);
    }
    out
}

/// Decodes a batch; command bytes are zero-copy slices of `payload`.
pub fn decode(payload: &Bytes) -> Result<Batch, DecodeError> {
    let mut r = Reader::new(payload);
    if r.u8()? != BATCH_VERSION {
        return Err(DecodeError::BadMagic);
    }
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
    Ok(Batch { origin, commands })
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
        let encoded = encode(origin, &commands);
        let decoded = decode(&encoded).unwrap();
        assert_eq!(decoded, Batch { origin, commands });
        for cut in 0..encoded.len() {
            assert!(decode(&encoded.slice(..cut)).is_err(), "cut {cut}");
        }
        let mut extended = encoded.to_vec();
        extended.push(0);
        assert!(decode(&Bytes::from(extended)).is_err());
    }

    #[test]
    fn huge_count_does_not_allocate_or_panic() {
        let mut buf = vec![BATCH_VERSION];
        buf.extend_from_slice(&[0u8; 16]);
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&Bytes::from(buf)).is_err());
    }
}
