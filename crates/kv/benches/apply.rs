//! Applying committed SETs, as every replica does for every write: decode the command, update the
//! index (the key's old value superseded), add it to the batch being reduced, and every 47 writes
//! (an entry at 50 clients) close the entry, which cuts batches for the segment writer and adopts
//! written segments. Over a key space that stays in the CPU's caches (10,000 keys) and one that
//! does not (1,000,000), each key written once before timing starts.

use bytes::Bytes;
use chorus_kv::command::encode_args;
use chorus_kv::state::KvState;
use chorus_log::StateMachine;
use chorus_storage::StoreOptions;
use criterion::{criterion_group, criterion_main, Criterion};

const VALUE_BYTES: usize = 256;
const WRITES_PER_ENTRY: u64 = 47;
/// Distinct commands cycled through (a pseudo-random key each).
const COMMANDS: usize = 100_000;

fn set_command(key_number: u64) -> Bytes {
    let key = Bytes::from(format!("user1x256-{key_number:012}"));
    encode_args(&[Bytes::from_static(b"SET"), key, Bytes::from(vec![b'v'; VALUE_BYTES])])
}

struct Applier {
    state: KvState,
    index: u64,
    writes: u64,
    /// Last, so it is removed after the state closes.
    _dir: tempfile::TempDir,
}

impl Applier {
    fn new(keys: u64) -> Applier {
        let dir = tempfile::tempdir().expect("temporary directory");
        let state = KvState::open(StoreOptions::new(dir.path()), None).expect("store opens");
        let mut applier = Applier {
            state,
            index: 1,
            writes: 0,
            _dir: dir,
        };
        for key in 0..keys {
            applier.apply(&set_command(key));
        }
        applier
    }

    fn apply(&mut self, command: &[u8]) {
        self.state.apply(self.index, command);
        self.writes += 1;
        if self.writes.is_multiple_of(WRITES_PER_ENTRY) {
            self.state.entry_applied(self.index);
            self.index += 1;
        }
    }
}

fn bench_apply(c: &mut Criterion) {
    for keys in [10_000u64, 1_000_000] {
        let mut random = 0x9E37_79B9_7F4A_7C15u64;
        let commands: Vec<Bytes> = (0..COMMANDS)
            .map(|_| {
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                set_command(random % keys)
            })
            .collect();
        let mut applier = Applier::new(keys);
        let mut next = 0;
        c.bench_function(&format!("apply SET of {VALUE_BYTES} B over {keys} keys"), |b| {
            b.iter(|| {
                applier.apply(&commands[next]);
                next = (next + 1) % commands.len();
            })
        });
    }
}

criterion_group!(benches, bench_apply);
criterion_main!(benches);
