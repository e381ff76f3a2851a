//! What the key-value store reads from disk and from a leader: a reduced-batch segment file (also
//! what a lagging follower receives) and a manifest (the state machine's part of a raft
//! snapshot). Both are canonical: whatever decodes must encode back to the same bytes. The
//! cleaner reads a segment file a record at a time, without its index: what it streams from a
//! segment that decodes whole is what decoding gives.
#![no_main]

use chorus_storage::{
    decode_segment, encode_segment, verify_segment, Manifest, Record, RecordStream, ReducedBatch, SegmentError,
};
use libfuzzer_sys::fuzz_target;

fn stream(data: &[u8]) -> Result<Vec<Record>, SegmentError> {
    // A file in memory where there is such a file system: a file per input costs little there.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("chorus-fuzz-segment-{}", std::process::id()));
    std::fs::write(&path, data).expect("the input is written to a file");
    let mut stream = RecordStream::open(&path, 64)?;
    let mut records = Vec::new();
    while let Some((_, record)) = stream.next_record()? {
        records.push(record);
    }
    Ok(records)
}

fuzz_target!(|data: &[u8]| {
    let streamed = stream(data);
    if let Ok((header, records)) = decode_segment(data) {
        assert_eq!(
            streamed.as_ref().ok(),
            Some(&records),
            "a segment that decodes streams its records"
        );
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
