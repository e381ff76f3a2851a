//! A reduced-batch segment file as start-up and reads find it on disk. The format is canonical:
//! whatever decodes must encode back to the same bytes.
#![no_main]

use chorus_storage::{decode_segment, encode_segment, ReducedBatch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((header, records)) = decode_segment(data) {
        let batch = ReducedBatch {
            first_index: header.first_index,
            last_index: header.last_index,
            records,
            writes_in: 0,
            bytes_in: 0,
        };
        assert_eq!(
            encode_segment(&batch),
            data,
            "a decoded segment encodes back to the same bytes"
        );
    }
});
