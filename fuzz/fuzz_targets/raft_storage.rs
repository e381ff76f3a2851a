//! What recovery reads from disk: write-ahead-log segments and snapshot files, and the snapshot
//! data inside (state machine and entry codec parts).
#![no_main]

use chorus_log::storage::{decode_segment, decode_snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_segment(data);
    let _ = decode_snapshot(data);
});
