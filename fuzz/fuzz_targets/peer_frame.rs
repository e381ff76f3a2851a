//! What a peer connection reads: frame headers, checksums, hello/ping/pong payloads and the raft
//! messages inside frames.
#![no_main]

use chorus_log::frame::{decode_header, decode_hello, decode_probe, verify_payload, FrameKind, FRAME_HEADER_BYTES};
use libfuzzer_sys::fuzz_target;
use protobuf::Message as _;
use raft::eraftpb::Message;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while rest.len() >= FRAME_HEADER_BYTES {
        let header: [u8; FRAME_HEADER_BYTES] = rest[..FRAME_HEADER_BYTES].try_into().unwrap();
        let Ok(header) = decode_header(&header, 1 << 20) else {
            return;
        };
        let body = &rest[FRAME_HEADER_BYTES..];
        let Some(payload) = body.get(..header.payload_len) else {
            return;
        };
        // Past the checksum too, so the decoders behind it see arbitrary payloads.
        let _ = verify_payload(&header, payload);
        match header.kind {
            FrameKind::Hello => drop(decode_hello(payload)),
            FrameKind::Ping | FrameKind::Pong => drop(decode_probe(payload)),
            FrameKind::Raft => drop(Message::parse_from_bytes(payload)),
        }
        rest = &body[header.payload_len..];
    }
});
