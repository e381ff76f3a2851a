//! What the fuzz targets and the seed generator share: the UniCache setup whose encodings the
//! seeds hold and whose decoder the `unicache` target attacks, defined once so the two agree.

use std::sync::Arc;

use bytes::Bytes;
use chorus_kv::unicache::KvPreprocessor;
use chorus_log::{EntryCodec, LogView, UniCacheCodec, UniCacheSettings};
use chorus_unicache::{CacheConfig, Policy};
use raft::eraftpb::{Entry, EntryType, Message, MessageType};

pub const CACHE: CacheConfig = CacheConfig {
    policy: Policy::LeCaR,
    max_items: 64,
    max_bytes: 4096,
};

/// A log holding just the resume entry at index 1 (term 1).
pub struct OneEntryLog;

impl LogView for OneEntryLog {
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

/// A normal entry of term 1.
pub fn entry(index: u64, data: Bytes) -> Entry {
    let mut e = Entry {
        index,
        term: 1,
        ..Default::default()
    };
    e.set_entry_type(EntryType::EntryNormal);
    e.data = data;
    e
}

/// A key-value UniCache codec without auto-tune, paused as every replica starts.
pub fn codec() -> UniCacheCodec {
    UniCacheCodec::new(
        UniCacheSettings {
            cache: CACHE,
            autotune: false,
        },
        Arc::new(KvPreprocessor::default()),
    )
}

/// A codec whose cache runs from index 1, as after the leader's first resume entry.
pub fn resumed_codec() -> UniCacheCodec {
    let mut codec = codec();
    let resume = codec.take_proposal().expect("a paused cache without auto-tune resumes");
    codec.applied(&entry(1, resume));
    codec
}

/// The leader's append of entry 2 (carrying `data`) to node 2, right after the resume entry.
pub fn append_after_resume(data: Bytes) -> Message {
    let mut msg = Message::default();
    msg.set_msg_type(MessageType::MsgAppend);
    msg.from = 1;
    msg.to = 2;
    msg.index = 1;
    msg.log_term = 1;
    msg.entries = vec![entry(2, data)].into();
    msg
}
