//! Preprocess + encode per key-value command with a warm cache (the leader's hot path), and
//! decode (a follower's).

use bytes::Bytes;
use chorus_kv::command::encode_args;
use chorus_kv::unicache::KvPreprocessor;
use chorus_unicache::{
    absorb_command, decode_command, encode_command, varint, CacheConfig, ItemCache, Policy, Preprocessor,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

fn kv(c: &mut Criterion) {
    let p = KvPreprocessor::default();
    let values: Vec<Bytes> = (0..50u8).map(|v| Bytes::from(vec![b'a' + v % 26; 256])).collect();
    let commands: Vec<Bytes> = (0..1000usize)
        .map(|i| {
            let key = Bytes::from(format!("user{:012}", i * 7919 % 100_000));
            if i % 3 == 0 {
                encode_args(&[
                    Bytes::from_static(b"HSET"),
                    key,
                    Bytes::from("field3"),
                    values[i % 50].clone(),
                ])
            } else {
                encode_args(&[Bytes::from_static(b"SET"), key, values[i % 50].clone()])
            }
        })
        .collect();
    let mut cache = ItemCache::new(CacheConfig {
        policy: Policy::LeCaR,
        max_items: 4096,
        max_bytes: 1 << 20,
    });
    let mut parts = Vec::new();
    for (i, cmd) in commands.iter().enumerate() {
        parts.clear();
        p.preprocess(cmd, &mut parts);
        absorb_command(&mut cache, &parts, i as u64);
    }
    let mut out = Vec::with_capacity(1024);
    let mut i = 0;
    c.bench_function("kv: preprocess + encode", |b| {
        b.iter(|| {
            i = (i + 1) % commands.len();
            parts.clear();
            out.clear();
            p.preprocess(&commands[i], &mut parts);
            encode_command(&cache, &parts, &mut out)
        })
    });
    let encoded: Vec<Vec<u8>> = commands
        .iter()
        .map(|cmd| {
            let mut parts = Vec::new();
            p.preprocess(cmd, &mut parts);
            let mut out = Vec::new();
            encode_command(&cache, &parts, &mut out);
            out
        })
        .collect();
    c.bench_function("kv: decode", |b| {
        b.iter_batched_ref(
            || Vec::with_capacity(1024),
            |out| {
                i = (i + 1) % encoded.len();
                decode_command(&cache, &p, &mut varint::Reader::new(&encoded[i]), out).unwrap();
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, kv);
criterion_main!(benches);
