//! UniCache's hot paths per command, with a warm cache: preprocess + encode (the leader, for
//! each entry it sends) and decode (a follower), for the key-value, SQL and CSV preprocessors.

use bytes::Bytes;
use chorus_kv::command::encode_args;
use chorus_kv::unicache::KvPreprocessor;
use chorus_unicache::{
    absorb_command, decode_command, encode_command, varint, CacheConfig, CsvPreprocessor, ItemCache, Policy,
    Preprocessor, SqlParams, SqlPreprocessor, SqlRule,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

fn warm_cache(p: &dyn Preprocessor, commands: &[Bytes]) -> ItemCache {
    let mut cache = ItemCache::new(CacheConfig {
        policy: Policy::LeCaR,
        max_items: 4096,
        max_bytes: 1 << 20,
    });
    let mut parts = Vec::new();
    for (i, c) in commands.iter().enumerate() {
        parts.clear();
        p.preprocess(c, &mut parts);
        absorb_command(&mut cache, &parts, i as u64);
    }
    cache
}

fn bench_preprocessor(c: &mut Criterion, name: &str, p: &dyn Preprocessor, commands: Vec<Bytes>) {
    let cache = warm_cache(p, &commands);
    let mut parts = Vec::new();
    let mut out = Vec::with_capacity(1024);
    let mut i = 0;
    c.bench_function(&format!("{name}: preprocess + encode"), |b| {
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
    c.bench_function(&format!("{name}: decode"), |b| {
        b.iter_batched_ref(
            || Vec::with_capacity(1024),
            |out| {
                i = (i + 1) % encoded.len();
                decode_command(&cache, p, &mut varint::Reader::new(&encoded[i]), out).unwrap();
            },
            BatchSize::SmallInput,
        )
    });
}

fn sql(c: &mut Criterion) {
    let p = SqlPreprocessor {
        rules: vec![SqlRule {
            template_prefix: "INSERT INTO positions".into(),
            cacheable: vec![0, 1],
        }],
        default: SqlParams::Strings,
    };
    let commands: Vec<Bytes> = (0..1000u64)
        .map(|i| {
            Bytes::from(format!(
                "INSERT INTO positions (route, stop, vehicle, lat, lon, at) VALUES ('R{}', 'S{}', {}, {}.{}, {}.{}, '2026-11-22 10:{:02}:{:02}')",
                i % 12,
                i % 40,
                1000 + i,
                59,
                i * 7 % 1000,
                18,
                i * 13 % 1000,
                i % 60,
                i * 7 % 60
            ))
        })
        .collect();
    bench_preprocessor(c, "sql", &p, commands);
}

fn csv(c: &mut Criterion) {
    let p = CsvPreprocessor::new(b',', &[1, 2, 3], &[(4, b' ')]);
    let commands: Vec<Bytes> = (0..1000u64)
        .map(|i| {
            Bytes::from(format!(
                "<{i}.JavaMail@x>,user{}@enron.com,folder{},user{}@enron.com,re: meeting about the {} report,2001-05-{:02}",
                i % 30,
                i % 8,
                i % 17,
                ["quarterly", "gas", "power", "legal"][(i % 4) as usize],
                i % 28 + 1
            ))
        })
        .collect();
    bench_preprocessor(c, "csv", &p, commands);
}

fn kv(c: &mut Criterion) {
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
    bench_preprocessor(c, "kv", &KvPreprocessor::default(), commands);
}

criterion_group!(benches, kv, sql, csv);
criterion_main!(benches);
