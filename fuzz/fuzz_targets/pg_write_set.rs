//! The PostgreSQL engine's write-sets: the log's form (first byte 0), which replicas decode,
//! and `test_decoding`'s lines (else), which the leader parses. Whatever the bytes: an error
//! or a value, never a panic; what decodes encodes back to the same bytes, and every group of
//! changes has its statements.
#![no_main]

use chorus_sql::pg_write_set::{self, Line, TableInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, data)) = data.split_first() else {
        return;
    };
    if kind == 0 {
        if let Ok(groups) = pg_write_set::decode(data) {
            assert_eq!(pg_write_set::encode(&groups), data, "a write-set re-encodes as it came");
            for group in groups {
                let _ = pg_write_set::statements(group);
            }
        }
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(line) = pg_write_set::parse_line(text) {
        if !matches!(line, Line::Begin | Line::Commit | Line::Message) {
            let info = TableInfo {
                key: vec!["k".into()],
                generated: vec!["g".into()],
                identity_always: vec!["n".into()],
            };
            if let Ok(change) = pg_write_set::resolve(line, &info) {
                for group in pg_write_set::group(vec![change]) {
                    let _ = pg_write_set::statements(group);
                }
            }
        }
    }
});
