//! The SQL middleware's untrusted inputs: a command's bytes from the log (a transaction or a
//! class hand-over), statements forwarded by a peer and its replies, statement text from clients (splitting, classifying, the determinism
//! rewrite, conflict-class labels, COPY statements) and COPY data.
#![no_main]

use chorus_sql::classes::{Labeller, Schema};
use chorus_sql::copy::{parse_copy, CopyFormat, RowReader};
use chorus_sql::text::{
    classify, command_verb, fix_writes, parameter_count, split_statements, Dialect, FixedClock, StatementKind,
};
use chorus_sql::txn::{Command, Value};
use chorus_sql::{ForwardReply, ForwardRequest};
use libfuzzer_sys::fuzz_target;

/// Two ruled tables' columns, so that an INSERT without a column list is placed.
struct FixedSchema;

impl Schema for FixedSchema {
    fn version(&mut self) -> Option<u64> {
        Some(1)
    }

    fn insert_columns(&mut self, table: &str) -> Option<Vec<String>> {
        let columns: &[&str] = match table {
            "stock" => &["s_i_id", "s_w_id", "s_quantity"],
            "t" => &["v", "k"],
            _ => return None,
        };
        Some(columns.iter().map(|c| c.to_string()).collect())
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(command) = Command::decode(data) {
        assert_eq!(
            Command::decode(&command.encode()).unwrap(),
            command,
            "a command decodes as it was encoded"
        );
    }
    // Compared as bytes: a NaN parameter is not equal to itself.
    if let Ok(request) = ForwardRequest::decode(data) {
        let encoded = request.encode();
        assert_eq!(
            ForwardRequest::decode(&encoded).unwrap().encode(),
            encoded,
            "a forwarded statement decodes as it was encoded"
        );
    }
    if let Ok(reply) = ForwardReply::decode(data) {
        let encoded = reply.encode();
        assert_eq!(
            ForwardReply::decode(&encoded).unwrap().encode(),
            encoded,
            "a forwarded reply decodes as it was encoded"
        );
    }
    // COPY data from a client, in both formats, in two pieces: rows come out or an error does.
    for format in [
        CopyFormat::Text {
            delimiter: b'\t',
            null: "\\N".into(),
        },
        CopyFormat::Csv {
            delimiter: b',',
            null: String::new(),
            header: true,
        },
    ] {
        let mut reader = RowReader::new(format);
        let (first, second) = data.split_at(data.len() / 2);
        let _ = reader
            .feed(first)
            .and_then(|_| reader.feed(second))
            .and_then(|_| reader.finish());
    }
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_copy(sql);
    let mut labeller = Labeller::new("stock.s_w_id, district.d_w_id, t.k".parse().expect("rules"));
    let params: Vec<Value> = (0..4).map(Value::Integer).collect();
    if let Ok(statements) = split_statements(sql) {
        for statement in statements {
            for kind in [StatementKind::Read, StatementKind::Write] {
                let _ = labeller.label(&statement, kind, &params, &mut FixedSchema);
            }
            let _ = classify(&statement);
            let _ = command_verb(&statement);
            let _ = parameter_count(&statement);
            for dialect in [Dialect::Sqlite, Dialect::Postgres] {
                let clock = FixedClock {
                    unix_ms: 1_764_000_000_000,
                };
                if let Ok(fixed) = fix_writes(&statement, clock, dialect) {
                    // The rewrite is done once: a fixed statement reads no clock.
                    assert_eq!(
                        fix_writes(&fixed, FixedClock { unix_ms: 0 }, dialect).unwrap(),
                        fixed,
                        "fixing a fixed statement changes nothing"
                    );
                }
            }
        }
    }
});
