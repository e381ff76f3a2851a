//! CURP's bytes from disk and from peers: a witness file as start-up reads it (events, each
//! length-prefixed and checksummed; a peer's `RECORD` body is one such event), and a peer's
//! `PROPOSE` body. What decodes re-encodes to the same bytes; a witness file replays into a
//! witness without a panic.
#![no_main]

use chorus_curp::witness::{file, Witness};
use chorus_kv::curp::{decode_propose, encode_propose};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((term, witnesses, command)) = decode_propose(data) {
        assert_eq!(
            encode_propose(term, &witnesses, command),
            data,
            "a PROPOSE body re-encodes"
        );
    }
    let events = match file::decode_all(data) {
        Ok(events) => events,
        Err((events, _)) => events,
    };
    let mut again = Vec::new();
    for event in &events {
        file::encode(event, &mut again);
    }
    assert_eq!(
        again,
        data[..again.len()],
        "decoded events encode back to the same bytes"
    );
    let _ = Witness::replay(1 << 20, events);
});
