//! What the key-value store reads from disk and from a leader: a reduced-batch segment file (also
//! what a lagging follower receives) and a manifest (the state machine's part of a raft
//! snapshot). Both are canonical: whatever decodes must encode back to the same bytes.
#![no_main]

use chorus_storage::{decode_segment, encode_segment, verify_segment, Manifest, ReducedBatch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((header, records)) = decode_segment(data) {
        let batch = ReducedBatch {
            first_index: header.first_index,
            last_index: header.last_index,
            records,
            log_order: header.log_order,
            writes_in: 0,
            bytes_in: 0,
        };
        assert_eq!(
            encode_segment(&batch),
            data,
            "a decoded segment encodes back to the same bytes"
        );
    }
    if let Ok(manifest) = Manifest::decode(data) {
        assert_eq!(
            manifest.encode(),
            data,
            "a decoded manifest encodes back to the same bytes"
        );
    }
    let _ = verify_segment(data);
});
