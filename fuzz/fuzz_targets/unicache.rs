//! UniCache's decoders: encoded commands for every preprocessor, encoded entries arriving in an
//! append (the follower's path), and a cache snapshot.
#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use chorus_fuzz::{append_after_resume, codec, resumed_codec, OneEntryLog, CACHE};
use chorus_kv::unicache::KvPreprocessor;
use chorus_log::{EntryCodec, UniCacheCodec};
use chorus_unicache::{decode_command, varint, CsvPreprocessor, ItemCache, Preprocessor, SqlParams, SqlPreprocessor};
use libfuzzer_sys::fuzz_target;

/// A fresh codec, made once (making one registers metrics, which is slow) and cloned per input.
fn template() -> &'static UniCacheCodec {
    static TEMPLATE: OnceLock<UniCacheCodec> = OnceLock::new();
    TEMPLATE.get_or_init(codec)
}

/// A follower whose cache runs from index 1.
fn resumed() -> &'static UniCacheCodec {
    static RESUMED: OnceLock<UniCacheCodec> = OnceLock::new();
    RESUMED.get_or_init(resumed_codec)
}

fuzz_target!(|data: &[u8]| {
    let mut cache = ItemCache::new(CACHE);
    for (i, word) in [&b"SET"[..], b"user\0", b"alpha", b"'R1'"].into_iter().enumerate() {
        cache.access(&Bytes::copy_from_slice(word), i as u64);
    }
    let preprocessors: [&dyn Preprocessor; 3] = [
        &KvPreprocessor::default(),
        &CsvPreprocessor::new(b',', &[1, 2], &[(3, b' ')]),
        &SqlPreprocessor {
            rules: Vec::new(),
            default: SqlParams::Strings,
        },
    ];
    for p in preprocessors {
        let mut out = Vec::new();
        let _ = decode_command(&cache, p, &mut varint::Reader::new(data), &mut out);
    }
    let _ = ItemCache::deserialize(CACHE, &mut varint::Reader::new(data));

    let _ = template().clone().restore(data, 0);
    let mut follower = resumed().clone();
    let mut msg = append_after_resume(Bytes::copy_from_slice(data));
    let _ = follower.decode(&mut msg, &OneEntryLog);
});
