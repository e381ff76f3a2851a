//! What a peer connection reads: frame headers, checksums, hello/ping/pong payloads, the cluster
//! secret handshake's challenge and proof, the raft
//! messages inside frames, a snapshot shipment's offer, resume and chunk payloads, and peer
//! service requests and responses with the bodies of the services peers answer: a follower's
//! WAIT question to the leader and its answer, an LDC FETCH and the values it brings back.
#![no_main]

use chorus_kv::ldc::{decode_fetch, decode_fetched, encode_fetch, encode_fetched, SERVICE_FETCH};
use chorus_log::frame::{
    decode_header, decode_hello, decode_probe, decode_request, decode_response, encode_request, encode_response,
    verify_payload, FrameKind, FRAME_HEADER_BYTES,
};
use chorus_log::peer_auth::{decode_challenge, decode_proof, encode_challenge, encode_hello};
use chorus_log::replica_wait::{self, Question};
use chorus_log::shipment::{decode_chunk, decode_offer, decode_resume, encode_offer};
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
            FrameKind::Hello => {
                if let Ok((id, nonce)) = decode_hello(payload) {
                    assert_eq!(encode_hello(id, nonce.as_ref()), payload, "a hello encodes back");
                }
            }
            FrameKind::Challenge => {
                if let Ok((nonce, code)) = decode_challenge(payload) {
                    assert_eq!(encode_challenge(&nonce, &code), payload, "a challenge encodes back");
                }
            }
            FrameKind::Proof => {
                if let Ok(code) = decode_proof(payload) {
                    assert_eq!(code.as_slice(), payload, "a proof is its code");
                }
            }
            FrameKind::Ping | FrameKind::Pong => drop(decode_probe(payload)),
            FrameKind::Raft => drop(Message::parse_from_bytes(payload)),
            FrameKind::ShipOffer => {
                if let Ok(offer) = decode_offer(payload) {
                    assert_eq!(
                        encode_offer(&offer),
                        payload,
                        "a decoded offer encodes back to the same bytes"
                    );
                }
            }
            FrameKind::ShipResume => drop(decode_resume(payload)),
            FrameKind::ShipChunk => drop(decode_chunk(payload)),
            FrameKind::ShipDone => {}
            FrameKind::Request => {
                if let Ok((id, service, body)) = decode_request(payload) {
                    assert_eq!(encode_request(id, service, body), payload, "a request encodes back");
                    if service == replica_wait::SERVICE {
                        if let Ok(question) = Question::decode(body) {
                            assert_eq!(question.encode(), body, "a WAIT question encodes back");
                        }
                    }
                    if service == SERVICE_FETCH {
                        if let Some(keys) = decode_fetch(body) {
                            let again = encode_fetch(keys.iter().map(|(key, version)| (key.as_ref(), *version)));
                            assert_eq!(again, body, "a FETCH encodes back");
                        }
                    }
                }
            }
            FrameKind::Response => {
                if let Ok((id, body)) = decode_response(payload) {
                    assert_eq!(encode_response(id, body), payload, "a response encodes back");
                    // A response does not name its service: every service's decoder sees it.
                    if let Ok(answer) = replica_wait::decode_response(body) {
                        assert_eq!(
                            replica_wait::encode_response(answer),
                            body,
                            "a WAIT answer encodes back"
                        );
                    }
                    if let Some(values) = decode_fetched(body) {
                        assert_eq!(encode_fetched(&values), body, "fetched values encode back");
                    }
                }
            }
        }
        rest = &body[header.payload_len..];
    }
});
