//! Peer wire frames: `[magic "CH" u16][version u8][kind u8][payload len u32][crc32 u32][payload]`.
//!
//! The first frame on a connection is a hello naming the sending node (with a cluster secret,
//! followed by a challenge and a proof: `peer_auth`); every later frame carries
//! one protobuf-encoded raft message, or a ping (an opaque u64 the peer echoes in a pong, to time
//! the link's round trip), or a request to a peer service other than raft (`[id u64][service u8]
//! [body]`) or the response to one (`[id u64][body]`). A connection whose second frame is a
//! shipment offer carries a snapshot's files instead (see `shipment`). Oversized lengths are
//! rejected before any allocation.

use crate::error::DecodeError;
use crate::peer_auth::{self, Nonce, NONCE_BYTES};
use crate::wire::Reader;

pub const FRAME_HEADER_BYTES: usize = 12;
const MAGIC: [u8; 2] = *b"CH";
pub const PROTOCOL_VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Hello = 1,
    Raft = 2,
    Ping = 3,
    Pong = 4,
    ShipOffer = 5,
    ShipResume = 6,
    ShipChunk = 7,
    ShipDone = 8,
    Request = 9,
    Response = 10,
    Challenge = 11,
    Proof = 12,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub payload_len: usize,
    pub crc32: u32,
}

pub fn decode_header(buf: &[u8; FRAME_HEADER_BYTES], max_payload_bytes: usize) -> Result<FrameHeader, DecodeError> {
    let mut r = Reader::new(buf);
    if r.bytes(2)? != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = r.u8()?;
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            what: "peer protocol",
            found: version.into(),
            supported: PROTOCOL_VERSION.into(),
        });
    }
    let kind = match r.u8()? {
        1 => FrameKind::Hello,
        2 => FrameKind::Raft,
        3 => FrameKind::Ping,
        4 => FrameKind::Pong,
        5 => FrameKind::ShipOffer,
        6 => FrameKind::ShipResume,
        7 => FrameKind::ShipChunk,
        8 => FrameKind::ShipDone,
        9 => FrameKind::Request,
        10 => FrameKind::Response,
        11 => FrameKind::Challenge,
        12 => FrameKind::Proof,
        _ => return Err(DecodeError::Invalid("frame kind")),
    };
    let payload_len = r.u32()? as usize;
    if payload_len > max_payload_bytes {
        return Err(DecodeError::TooLarge {
            size: payload_len,
            limit: max_payload_bytes,
        });
    }
    Ok(FrameHeader {
        kind,
        payload_len,
        crc32: r.u32()?,
    })
}

pub fn verify_payload(header: &FrameHeader, payload: &[u8]) -> Result<(), DecodeError> {
    let computed = crc32fast::hash(payload);
    if computed != header.crc32 {
        return Err(DecodeError::Checksum {
            stored: header.crc32,
            computed,
        });
    }
    Ok(())
}

pub fn encode_frame(kind: FrameKind, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(kind as u8);
    let len = u32::try_from(payload.len()).expect("frame larger than 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The hello frame: the dialer's id, and its nonce when it holds a cluster secret.
pub fn encode_hello(node_id: u64, nonce: Option<&Nonce>) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + 8 + NONCE_BYTES);
    encode_frame(FrameKind::Hello, &peer_auth::encode_hello(node_id, nonce), &mut out);
    out
}

/// The payload of a ping or pong: one u64.
pub fn decode_probe(payload: &[u8]) -> Result<u64, DecodeError> {
    let mut r = Reader::new(payload);
    let stamp = r.u64()?;
    r.finish()?;
    Ok(stamp)
}

/// A request frame's payload: its id, the service it is for, and its body.
pub fn encode_request(id: u64, service: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + body.len());
    out.extend_from_slice(&id.to_le_bytes());
    out.push(service);
    out.extend_from_slice(body);
    out
}

pub fn decode_request(payload: &[u8]) -> Result<(u64, u8, &[u8]), DecodeError> {
    let mut r = Reader::new(payload);
    let id = r.u64()?;
    let service = r.u8()?;
    Ok((id, service, &payload[9..]))
}

/// A response frame's payload: the id of the request it answers, and its body.
pub fn encode_response(id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(body);
    out
}

pub fn decode_response(payload: &[u8]) -> Result<(u64, &[u8]), DecodeError> {
    let mut r = Reader::new(payload);
    let id = r.u64()?;
    Ok((id, &payload[8..]))
}

pub fn decode_hello(payload: &[u8]) -> Result<(u64, Option<Nonce>), DecodeError> {
    peer_auth::decode_hello(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_rejections() {
        let mut out = Vec::new();
        encode_frame(FrameKind::Raft, b"payload", &mut out);
        let header: [u8; FRAME_HEADER_BYTES] = out[..FRAME_HEADER_BYTES].try_into().unwrap();
        let h = decode_header(&header, 1024).unwrap();
        assert_eq!(h.kind, FrameKind::Raft);
        assert_eq!(h.payload_len, 7);
        verify_payload(&h, &out[FRAME_HEADER_BYTES..]).unwrap();
        assert!(verify_payload(&h, b"paylOad").is_err());
        assert!(matches!(decode_header(&header, 6), Err(DecodeError::TooLarge { .. })));
        let mut bad = header;
        bad[0] = b'X';
        assert_eq!(decode_header(&bad, 1024), Err(DecodeError::BadMagic));
        let mut newer = header;
        newer[2] = PROTOCOL_VERSION + 1;
        let refused = decode_header(&newer, 1024).unwrap_err();
        assert!(
            refused
                .to_string()
                .starts_with("peer protocol version 2; this build reads version 1 only"),
            "{refused}"
        );
        let mut bad_kind = header;
        bad_kind[3] = 99;
        assert!(decode_probe(&7u64.to_le_bytes()).is_ok_and(|v| v == 7));
        assert!(decode_probe(b"short").is_err());
        assert!(decode_header(&bad_kind, 1024).is_err());
    }

    #[test]
    fn requests_and_responses_round_trip() {
        let request = encode_request(7, 2, b"body");
        assert_eq!(decode_request(&request).unwrap(), (7, 2, b"body".as_ref()));
        let response = encode_response(7, b"");
        assert_eq!(decode_response(&response).unwrap(), (7, b"".as_ref()));
        for cut in 0..9 {
            assert!(decode_request(&request[..cut]).is_err());
            assert!(cut >= 8 || decode_response(&response[..cut]).is_err());
        }
    }

    #[test]
    fn hello_round_trip() {
        let frame = encode_hello(3, None);
        assert_eq!(decode_hello(&frame[FRAME_HEADER_BYTES..]).unwrap(), (3, None));
        assert!(decode_hello(b"short").is_err());
    }
}
