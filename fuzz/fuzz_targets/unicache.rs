//! UniCache's decoders: encoded commands for every preprocessor, encoded entries arriving in an
//! append (the follower's path), and a cache snapshot.
#![no_main]

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use chorus_kv::unicache::KvPreprocessor;
use chorus_log::{EntryCodec, LogView, UniCacheCodec, UniCacheSettings};
use chorus_unicache::{
    decode_command, varint, CacheConfig, CsvPreprocessor, ItemCache, Policy, Preprocessor, SqlParams, SqlPreprocessor,
};
use libfuzzer_sys::fuzz_target;
use raft::eraftpb::{Entry, EntryType, Message, MessageType};

/// A log holding just the resume entry at index 1.
struct EmptyLog;

impl LogView for EmptyLog {
    fn term(&self, index: u64) -> Option<u64> {
        (index <= 1).then_some(index)
    }

    fn last_index(&self) -> u64 {
        1
    }

    fn entries(&self, low: u64, high: u64) -> Option<Vec<Entry>> {
        (low >= high).then(Vec::new)
    }
}

fn codec() -> UniCacheCodec {
    UniCacheCodec::new(
        UniCacheSettings {
            cache: config(),
            autotune: false,
        },
        Arc::new(KvPreprocessor::default()),
    )
}

/// A fresh codec, made once (making one registers metrics, which is slow) and cloned per input.
fn template() -> &'static UniCacheCodec {
    static TEMPLATE: OnceLock<UniCacheCodec> = OnceLock::new();
    TEMPLATE.get_or_init(codec)
}

/// A follower whose cache runs from index 1, as after the leader's first resume entry.
fn resumed() -> &'static UniCacheCodec {
    static RESUMED: OnceLock<UniCacheCodec> = OnceLock::new();
    RESUMED.get_or_init(|| {
        let mut follower = codec();
        let mut resume = Entry {
            index: 1,
            term: 1,
            ..Default::default()
        };
        resume.set_entry_type(EntryType::EntryNormal);
        resume.data = codec()
            .take_proposal()
            .expect("a paused cache without auto-tune resumes");
        follower.applied(&resume);
        follower
    })
}

fn config() -> CacheConfig {
    CacheConfig {
        policy: Policy::LeCaR,
        max_items: 64,
        max_bytes: 4096,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut cache = ItemCache::new(config());
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
    let _ = ItemCache::deserialize(config(), &mut varint::Reader::new(data));

    let _ = template().clone().restore(data, 0);
    let mut follower = resumed().clone();
    let mut entry = Entry {
        index: 2,
        term: 1,
        ..Default::default()
    };
    entry.set_entry_type(EntryType::EntryNormal);
    entry.data = Bytes::copy_from_slice(data);
    let mut msg = Message::default();
    msg.set_msg_type(MessageType::MsgAppend);
    msg.from = 1;
    msg.to = 2;
    msg.index = 1;
    msg.log_term = 1;
    msg.entries = vec![entry].into();
    let _ = follower.decode(&mut msg, &EmptyLog);
});
