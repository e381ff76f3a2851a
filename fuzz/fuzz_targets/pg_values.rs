//! Result values as the PostgreSQL engine's server sends them (binary form): whatever the
//! bytes, decoding gives a value or an error, never a crash.
#![no_main]

use chorus_sql::postgres::{decode, Type};
use libfuzzer_sys::fuzz_target;

const TYPES: [Type; 16] = [
    Type::BOOL,
    Type::INT2,
    Type::INT4,
    Type::INT8,
    Type::OID,
    Type::FLOAT4,
    Type::FLOAT8,
    Type::NUMERIC,
    Type::TEXT,
    Type::VARCHAR,
    Type::JSONB,
    Type::BYTEA,
    Type::UUID,
    Type::DATE,
    Type::TIMESTAMP,
    Type::TIMESTAMPTZ,
];

fuzz_target!(|data: &[u8]| {
    let Some((&which, raw)) = data.split_first() else {
        return;
    };
    let _ = decode(&TYPES[usize::from(which) % TYPES.len()], raw);
});
