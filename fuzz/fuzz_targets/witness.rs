//! A witness file as start-up reads it: events, each length-prefixed and checksummed. What
//! decodes re-encodes to the same bytes and replays into a witness without a panic.
#![no_main]

use chorus_curp::witness::{file, Witness};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
