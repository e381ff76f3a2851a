//! A committed entry's payload: a batch of client commands.
#![no_main]

use bytes::Bytes;
use chorus_log::batch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Ok(decoded) = batch::decode(&payload) {
        let again = batch::encode(decoded.origin, decoded.leader_time_ms, &decoded.commands);
        assert_eq!(
            batch::decode(&again).unwrap(),
            decoded,
            "a batch decodes as it was encoded"
        );
        // Older versions are read, not written.
        if again[0] == payload[0] {
            assert_eq!(again, payload, "a decoded batch encodes back to the same bytes");
        }
    }
});
