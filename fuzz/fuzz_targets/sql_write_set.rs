//! A write-set as a replica applies it (passive replication): whatever its bytes, applying it
//! commits with its log position or is refused leaving the database as it was; never a crash.
#![no_main]

use std::sync::Mutex;

use chorus_sql::engine::{AppliedMark, Engine, Sqlite};
use libfuzzer_sys::fuzz_target;

struct Database {
    engine: Sqlite,
    _dir: tempfile::TempDir,
}

static DATABASE: Mutex<Option<Database>> = Mutex::new(None);

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT);
     CREATE TABLE IF NOT EXISTS u (a TEXT, b BLOB, c REAL, PRIMARY KEY (a, b));
     CREATE TABLE IF NOT EXISTS r (x, y);";

fn rows(engine: &mut Sqlite) -> Vec<Vec<chorus_sql::txn::Value>> {
    engine
        .execute(
            "SELECT 't', * FROM t UNION ALL SELECT 'u', a, b FROM u UNION ALL SELECT 'r', x, y FROM r",
            &[],
        )
        .expect("the fuzzed tables are readable")
        .rows
}

fuzz_target!(|data: &[u8]| {
    let mut database = DATABASE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let database = database.get_or_insert_with(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut engine = Sqlite::open(dir.path()).expect("a database opens");
        engine.execute("BEGIN", &[]).expect("begin");
        for statement in SCHEMA.split(';').filter(|s| !s.trim().is_empty()) {
            engine.execute(statement, &[]).expect("the schema");
        }
        engine
            .execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')", &[])
            .expect("rows");
        engine.execute("COMMIT", &[]).expect("commit");
        Database { engine, _dir: dir }
    });
    let engine = &mut database.engine;
    let before = rows(engine);
    let before_mark = engine.applied().expect("the applied mark");
    let mark = AppliedMark {
        log_index: before_mark.log_index + 1,
        ..before_mark
    };
    match engine.apply_write_set(data) {
        Ok(()) => {
            engine
                .end_write_sets(Some(mark))
                .expect("a write-set that applied commits");
            assert_eq!(engine.applied().expect("the applied mark"), mark);
        }
        Err(_) => {
            engine.end_write_sets(None).expect("a rollback");
            assert_eq!(rows(engine), before, "a refused write-set leaves nothing behind");
            assert_eq!(engine.applied().expect("the applied mark"), before_mark);
        }
    }
});
