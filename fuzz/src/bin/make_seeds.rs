//! Writes a seed corpus for every fuzz target: bytes as the real code paths produce them (RESP
//! traffic, peer frames around real raft messages, a write-ahead-log segment and a snapshot
//! written by the storage, a snapshot shipment's frames, batches, state-machine snapshots, UniCache
//! encodings, reduced segments and manifests).
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --bin make-seeds -- fuzz/corpus

use std::path::{Path, PathBuf};

/// The leader time in seeded batches: a plausible wall-clock time in milliseconds.
const SEED_TIME_MS: u64 = 1_764_000_000_000;

use bytes::Bytes;
use chorus_curp::rifl::{ClientId, Envelope};
use chorus_curp::witness::{file as witness_file, Event, Record};
use chorus_fuzz::{append_after_resume, entry, resumed_codec, OneEntryLog, CACHE};
use chorus_kv::command::{encode_args, encode_curp_recovered, encode_enveloped, encode_register, encode_renew};
use chorus_kv::ldc::{encode_fetch, encode_fetched, SERVICE_FETCH};
use chorus_kv::unicache::KvPreprocessor;
use chorus_kv::KvState;
use chorus_kv::{dump, hyperloglog};
use chorus_log::backup::{encode_header, BackupHeader};
use chorus_log::batch::{self, Origin};
use chorus_log::frame::{encode_frame, encode_hello, encode_request, encode_response, FrameKind};
use chorus_log::membership::{
    encode_answer, encode_change, encode_context, encode_members, Addresses, ChangeAnswer, MemberChange, Members,
};
use chorus_log::peer_auth::{encode_challenge, CODE_BYTES, NONCE_BYTES};
use chorus_log::replica_wait::{self, Answer, Question};
use chorus_log::shipment::{encode_chunk, encode_offer, encode_resume, Offer};
use chorus_log::storage::{write_snapshot_file, DiskStorage, StorageOptions};
use chorus_log::{EntryCodec, StateMachine};
use chorus_sql::engine::{Column, Engine, Outcome, Recorded, Sqlite};
use chorus_sql::pg_write_set::{self, Change, Field, Table};
use chorus_sql::txn::{
    Body as SqlBody, Certify, ClassMessage, Command, NodeRef, Statement as SqlStatement, Ticket, Txn, TxnId,
    Value as SqlValue,
};
use chorus_sql::{ForwardReply, ForwardRequest, ForwardStart};
use chorus_storage::{encode_segment, segment_file_name, Reducer, StoreOptions};
use chorus_unicache::{
    absorb_command, encode_command, CsvPreprocessor, ItemCache, Preprocessor, SqlParams, SqlPreprocessor,
};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Message, MessageType, Snapshot};

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).expect("create corpus directory");
    std::fs::write(dir.join(name), bytes).expect("write seed");
}

fn args(words: &[&str]) -> Bytes {
    encode_args(
        &words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect::<Vec<_>>(),
    )
}

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into()));
    let commands = [
        args(&["SET", "user000000001234", "hello world"]),
        args(&["HSET", "user:42:profile", "field0", "v0", "field1", "v1"]),
        args(&["INCRBY", "counter:7", "5"]),
        args(&["MSET", "a", "1", "b", "2"]),
        args(&["DEL", "a", "b"]),
        args(&["APPEND", "email:12", "1,bob@x.org,inbox,re: lunch,2001"]),
    ];

    // RESP: what redis-cli and redis-benchmark send, and the replies they read.
    let resp: &[(&str, &[u8])] = &[
        ("set", b"*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000001\r\n$3\r\nxxx\r\n"),
        (
            "pipeline",
            b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*1\r\n$4\r\nPING\r\n*3\r\n$4\r\nHGET\r\n$1\r\nh\r\n$1\r\nf\r\n",
        ),
        ("inline", b"PING\r\nSET a b\r\nGET a\r\n"),
        (
            "replies",
            b"+OK\r\n-ERR unknown\r\n:42\r\n$5\r\nhello\r\n$-1\r\n*2\r\n$1\r\na\r\n*-1\r\n",
        ),
    ];
    for (name, bytes) in resp {
        write(&out, "resp", name, bytes);
    }

    // Peer frames around raft messages of each kind the loop sends.
    let mut frames = encode_hello(2, None);
    let mut append = Message::default();
    append.set_msg_type(MessageType::MsgAppend);
    append.from = 1;
    append.to = 2;
    append.term = 3;
    append.index = 10;
    append.log_term = 3;
    append.commit = 9;
    append.entries = vec![entry(
        11,
        batch::encode(
            Origin {
                node_id: 1,
                incarnation: 9,
            },
            SEED_TIME_MS,
            &[(1, commands[0].clone())],
        ),
    )]
    .into();
    let mut heartbeat = Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = 1;
    heartbeat.to = 2;
    heartbeat.term = 3;
    let mut response = Message::default();
    response.set_msg_type(MessageType::MsgAppendResponse);
    response.from = 2;
    response.to = 1;
    response.index = 11;
    for msg in [&append, &heartbeat, &response] {
        encode_frame(FrameKind::Raft, &msg.write_to_bytes().expect("encode"), &mut frames);
    }
    encode_frame(FrameKind::Ping, &7u64.to_le_bytes(), &mut frames);
    encode_frame(FrameKind::Pong, &7u64.to_le_bytes(), &mut frames);
    encode_frame(
        FrameKind::Request,
        &encode_request(9, 1, b"a witness record"),
        &mut frames,
    );
    encode_frame(FrameKind::Response, &encode_response(9, &[]), &mut frames);
    write(&out, "peer_frame", "connection", &frames);
    // A handshake with a cluster secret: hello with a nonce, challenge, proof.
    let mut handshake = encode_hello(2, Some(&[5; NONCE_BYTES]));
    encode_frame(
        FrameKind::Challenge,
        &encode_challenge(&[6; NONCE_BYTES], &[7; CODE_BYTES]),
        &mut handshake,
    );
    encode_frame(FrameKind::Proof, &[8; CODE_BYTES], &mut handshake);
    write(&out, "peer_frame", "handshake", &handshake);
    // The bodies of the services peers answer: a WAIT question and its answer, a FETCH and the
    // values it brings back (one found, one not).
    let mut services = Vec::new();
    let question = Question {
        target: 40,
        replicas: 1,
        timeout_ms: 500,
    };
    encode_frame(
        FrameKind::Request,
        &encode_request(10, replica_wait::SERVICE, &question.encode()),
        &mut services,
    );
    let answer = Answer {
        term: 3,
        target: 40,
        replicas: 2,
    };
    encode_frame(
        FrameKind::Response,
        &encode_response(10, &replica_wait::encode_response(Some(answer))),
        &mut services,
    );
    let fetch = encode_fetch([(&b"\x01key:1"[..], 38), (&b"\x01key:2"[..], 39)].into_iter());
    encode_frame(
        FrameKind::Request,
        &encode_request(11, SERVICE_FETCH, &fetch),
        &mut services,
    );
    let fetched = encode_fetched(&[Some(Bytes::from_static(b"value")), None]);
    encode_frame(FrameKind::Response, &encode_response(11, &fetched), &mut services);
    write(&out, "peer_frame", "services", &services);
    let mut shipment = Vec::new();
    let offer = Offer {
        term: 3,
        index: 40,
        files: vec![(segment_file_name(1, 20), 4_096), (segment_file_name(21, 40), 512)],
    };
    encode_frame(FrameKind::ShipOffer, &encode_offer(&offer), &mut shipment);
    encode_frame(FrameKind::ShipResume, &encode_resume(&[1_024, 0]), &mut shipment);
    encode_frame(FrameKind::ShipChunk, &encode_chunk(0, 1_024, &[7; 64]), &mut shipment);
    encode_frame(FrameKind::ShipDone, &[], &mut shipment);
    write(&out, "peer_frame", "shipment", &shipment);

    // A segment and a snapshot written by the storage itself.
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut storage, _) = DiskStorage::open(
        dir.path(),
        &[1, 2, 3],
        StorageOptions {
            preallocate: false,
            ..StorageOptions::default()
        },
    )
    .expect("open storage");
    let entries: Vec<Entry> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            entry(
                i as u64 + 1,
                batch::encode(
                    Origin {
                        node_id: 1,
                        incarnation: 1,
                    },
                    SEED_TIME_MS,
                    &[(i as u64, c.clone())],
                ),
            )
        })
        .collect();
    storage.append(&entries).expect("append");
    storage.set_hard_state(&HardState {
        term: 1,
        vote: 1,
        commit: 3,
        ..Default::default()
    });
    storage.persist(true).expect("persist");
    let state_dir = tempfile::tempdir().expect("temporary directory");
    let mut kv = KvState::open(StoreOptions::new(state_dir.path()), None).expect("open state");
    for (i, c) in commands.iter().enumerate() {
        kv.apply(i as u64 + 1, c);
        kv.entry_applied(i as u64 + 1);
    }
    let manifest = kv.snapshot_later()();
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().index = 3;
    snapshot.mut_metadata().term = 1;
    snapshot.data = Bytes::from(manifest.clone());
    let snapshot_path = write_snapshot_file(dir.path(), &snapshot).expect("write snapshot");
    for file in std::fs::read_dir(dir.path()).expect("list") {
        let path = file.expect("entry").path();
        let name = path.file_name().expect("name").to_string_lossy().into_owned();
        write(&out, "raft_storage", &name, &std::fs::read(&path).expect("read"));
    }
    drop(snapshot_path);

    // Batches and key-value inputs.
    write(
        &out,
        "batch",
        "batch",
        &batch::encode(
            Origin {
                node_id: 2,
                incarnation: 5,
            },
            SEED_TIME_MS,
            &commands
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, c)| (i as u64, c))
                .collect::<Vec<_>>(),
        ),
    );
    for (i, c) in commands.iter().enumerate() {
        write(&out, "kv", &format!("command-{i}"), c);
    }
    // RIFL: a registration, an enveloped write of the incarnation it creates, a renewal.
    let client = ClientId {
        incarnation: 1 << 16,
        connection: 1,
    };
    let envelope = Envelope {
        client,
        seq: 1,
        first_unacked: 1,
    };
    let incr = [Bytes::from_static(b"INCR"), Bytes::from_static(b"n")];
    write(&out, "kv", "rifl-register", &encode_register());
    write(&out, "kv", "rifl-write", &encode_enveloped(&envelope, &incr));
    write(&out, "kv", "rifl-renew", &encode_renew(1 << 16, 2));
    write(&out, "kv", "curp-recovered", &encode_curp_recovered(7));
    for (name, command) in [
        ("zadd", &["ZADD", "z", "GT", "CH", "1.5", "a", "-inf", "b"][..]),
        (
            "zrangestore",
            &["ZRANGESTORE", "y", "z", "(1", "+inf", "BYSCORE", "LIMIT", "0", "5"],
        ),
        ("zmpop", &["ZMPOP", "2", "z", "y", "MAX", "COUNT", "2"]),
        (
            "eval",
            &["EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", "k", "v"],
        ),
        (
            "exec",
            &[
                "EXEC",
                "1",
                "k",
                "0123456789abcdef",
                "3",
                "SET",
                "k",
                "v",
                "2",
                "INCR",
                "n",
            ],
        ),
    ] {
        write(&out, "kv", name, &args(command));
    }

    // A witness file: acceptances, a drop, a collection and a reset.
    let mut witness_file = Vec::new();
    let record = Record::new(
        client,
        1,
        3,
        vec![Bytes::from_static(b"n")],
        encode_enveloped(&envelope, &incr),
    );
    for event in [
        Event::Accepted(record),
        Event::Dropped { client, seq: 1 },
        Event::Collected { term: 4 },
        Event::Reset { below_term: 4 },
    ] {
        witness_file::encode(&event, &mut witness_file);
    }
    write(&out, "witness", "events", &witness_file);
    write(
        &out,
        "witness",
        "propose",
        &chorus_kv::curp::encode_propose(3, &[1, 2, 3], &encode_enveloped(&envelope, &incr)),
    );
    write(&out, "segment", "manifest", &manifest);

    // UniCache: encoded commands for each preprocessor, an encoded append entry, cache state.
    let preprocessors: [(&str, &dyn Preprocessor, Bytes); 3] = [
        ("kv", &KvPreprocessor::default(), commands[1].clone()),
        (
            "csv",
            &CsvPreprocessor::new(b',', &[1, 2], &[(3, b' ')]),
            Bytes::from_static(b"1,bob@x.org,inbox,re: lunch friday,2001"),
        ),
        (
            "sql",
            &SqlPreprocessor {
                rules: Vec::new(),
                default: SqlParams::Strings,
            },
            Bytes::from_static(b"INSERT INTO t (a, b) VALUES ('R1', 42)"),
        ),
    ];
    for (name, p, command) in preprocessors {
        let mut cache = ItemCache::new(CACHE);
        let mut parts = Vec::new();
        p.preprocess(&command, &mut parts);
        absorb_command(&mut cache, &parts, 1);
        let mut encoded = Vec::new();
        encode_command(&cache, &parts, &mut encoded);
        write(&out, "unicache", &format!("command-{name}"), &encoded);
        let mut state = Vec::new();
        cache.serialize(&mut state);
        write(&out, "unicache", &format!("cache-{name}"), &state);
    }
    let mut leader = resumed_codec();
    let mut msg = append_after_resume(batch::encode(
        Origin {
            node_id: 1,
            incarnation: 3,
        },
        SEED_TIME_MS,
        &[(5, commands[0].clone())],
    ));
    leader.encode(&mut msg, &OneEntryLog, 1);
    write(&out, "unicache", "encoded-entry", &msg.entries[0].data);
    write(&out, "unicache", "codec-snapshot", &leader.snapshot());

    // Storage segments: a reduced batch with puts and a tombstone, and one of reads only.
    let mut reducer = Reducer::new();
    reducer.write(100, "user:1".into(), Some("alice".into()));
    reducer.write(101, "user:2".into(), Some(Bytes::from(vec![7u8; 300])));
    reducer.write(102, "user:1".into(), Some("alice2".into()));
    reducer.write(103, "gone".into(), None);
    write(
        &out,
        "segment",
        "puts-and-tombstone",
        &encode_segment(&reducer.take().expect("a batch")),
    );
    reducer.note_index(104);
    write(
        &out,
        "segment",
        "reads-only",
        &encode_segment(&reducer.take().expect("a batch")),
    );
    // SQL: a transaction as the writer logs it, and statement text as clients send it.
    let txn = Txn {
        id: TxnId { incarnation: 9, seq: 2 },
        after: TxnId { incarnation: 9, seq: 1 },
        seed: 77,
        body: SqlBody::Statements(vec![SqlStatement {
            sql: "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2".into(),
            params: vec![SqlValue::Integer(-5), SqlValue::Text("3".into())],
        }]),
        certify: None,
    };
    write(&out, "sql", "txn", &txn.encode());
    // A write-set over the `sql_write_set` target's table t, which holds (1, 'one'), (2, 'two').
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut engine = Sqlite::open(dir.path()).expect("a database opens");
    for statement in [
        "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)",
        "INSERT INTO t VALUES (1, 'one'), (2, 'two')",
    ] {
        engine.execute(statement, &[]).expect("the table");
    }
    engine.begin().expect("begin");
    engine.record_writes().expect("recording");
    for statement in [
        "UPDATE t SET v = 'uno' WHERE k = 1",
        "DELETE FROM t WHERE k = 2",
        "INSERT INTO t VALUES (3, 'three')",
    ] {
        engine.execute(statement, &[]).expect("a change");
    }
    let Recorded::WriteSet(write_set) = engine.commit_recorded(TxnId::default()).expect("a write-set") else {
        panic!("the transaction changed rows");
    };
    write(&out, "sql_write_set", "update-delete-insert", &write_set);
    pg_write_set_seeds(&out);
    let txn = Txn {
        body: SqlBody::WriteSet(write_set),
        ..txn
    };
    write(&out, "sql", "write-set-txn", &txn.encode());
    // A hybrid transaction: the write-set after its certification header.
    let txn = Txn {
        certify: Some(Certify {
            snapshot: (40, 1),
            classes: vec!["1".into(), "2".into()],
            global: false,
            chain: Some(1),
        }),
        ..txn
    };
    write(&out, "sql", "certified-write-set-txn", &txn.encode());
    // A statement forwarded to its classes' owner, and a reply with rows.
    let forwarded = ForwardRequest::Statement {
        txn: 4,
        seq: 1,
        start: ForwardStart::Continue,
        sql: "SELECT balance FROM accounts WHERE branch = $1".into(),
        params: vec![SqlValue::Integer(2), SqlValue::Null],
    };
    write(&out, "sql", "forwarded-statement", &forwarded.encode());
    let reply = ForwardReply::Rows(
        Outcome {
            columns: vec![Column {
                name: "balance".into(),
                declared: Some("INT".into()),
                function: None,
            }],
            rows: vec![vec![SqlValue::Integer(100)], vec![SqlValue::Real(0.5)]],
            changes: 0,
            read_only: true,
        },
        "SELECT",
    );
    write(&out, "sql", "forwarded-reply", &reply.encode());
    let borrow = Command::Class(ClassMessage::Borrow {
        ticket: Ticket {
            incarnation: 9,
            number: 3,
        },
        classes: vec!["1".into(), "2".into()],
        holding: vec!["3".into()],
        sent_at_ms: 1_764_000_000_000,
    });
    write(&out, "sql", "class-borrow", &borrow.encode());
    let owner_down = Command::Class(ClassMessage::OwnerDown { node: NodeRef::Id(2) });
    write(&out, "sql", "class-owner-down", &owner_down.encode());
    // As builds before hybrid membership changes named a node: by its place among the voters.
    let lend_all_by_place = Command::Class(ClassMessage::LendAll {
        ticket: Ticket {
            incarnation: 9,
            number: 4,
        },
        node: NodeRef::Place(1),
    });
    write(&out, "sql", "class-lend-all-by-place", &lend_all_by_place.encode());
    let borrow_all = Command::Class(ClassMessage::BorrowAll {
        ticket: Ticket {
            incarnation: 9,
            number: 4,
        },
        holding: vec!["3".into()],
        sent_at_ms: 1_764_000_000_000,
    });
    write(&out, "sql", "class-borrow-all", &borrow_all.encode());
    write(
        &out,
        "sql",
        "statements",
        b"BEGIN; INSERT INTO t VALUES ($1, 'a;b', now(), datetime('now')); /* c */ COMMIT;",
    );
    // Statements the target's conflict-class rules (stock.s_w_id, district.d_w_id) label.
    write(
        &out,
        "sql",
        "classes",
        b"UPDATE stock SET s_w_id = 2 WHERE s_w_id = $1::bigint AND s_i_id = ?; \
          INSERT INTO district (d_id, d_w_id) SELECT d_id, d_w_id FROM district d WHERE 3 = d.d_w_id",
    );
    // PostgreSQL result values: the target's type index, then the value's binary form.
    let numeric_12_34: &[u8] = &[7, 0, 2, 0, 0, 0, 0, 0, 2, 0, 12, 0x0d, 0x48];
    write(&out, "pg_values", "numeric", numeric_12_34);
    let mut timestamptz = vec![15u8];
    timestamptz.extend_from_slice(&851_765_460_123_000i64.to_be_bytes());
    write(&out, "pg_values", "timestamptz", &timestamptz);
    write(&out, "pg_values", "int4", &[2, 0, 0, 1, 0]);
    membership_seeds(&out);
    hyperloglog_seeds(&out);
    dump_seeds(&out);
    println!("seeds written under {}", out.display());
}

/// `hyperloglog` seeds: an empty HyperLogLog, a sparse one, and one turned dense (the first
/// byte picks the target's operation).
fn hyperloglog_seeds(out: &Path) {
    let mut sparse = hyperloglog::empty();
    let mut dense = hyperloglog::empty();
    for n in 0..3000 {
        if n < 50 {
            hyperloglog::add(&mut sparse, format!("element:{n}").as_bytes()).expect("a valid HyperLogLog");
        }
        hyperloglog::add(&mut dense, format!("element:{n}").as_bytes()).expect("a valid HyperLogLog");
    }
    for (name, value) in [("empty", hyperloglog::empty()), ("sparse", sparse), ("dense", dense)] {
        write(out, "hyperloglog", name, &[&[0][..], &value].concat());
    }
}

/// `dump` seeds: the object encodings (without footers) of a value of each type.
fn dump_seeds(out: &Path) {
    let strings = |items: &[&str]| items.iter().map(|s| Bytes::from(s.to_string())).collect::<Vec<_>>();
    let values = [
        ("string", dump::DumpValue::String(Bytes::from("hello"))),
        ("list", dump::DumpValue::List(strings(&["a", "b", "300"]))),
        ("set", dump::DumpValue::Set(strings(&["x", "y"]))),
        ("zset", dump::DumpValue::Zset(vec![(Bytes::from("m"), 1.5)])),
        (
            "hash",
            dump::DumpValue::Hash(vec![(Bytes::from("f"), Bytes::from("v"))]),
        ),
    ];
    for (name, value) in values {
        let payload = dump::encode(&value);
        write(out, "dump", name, &payload[..payload.len() - 10]);
    }
}

/// `membership` seeds: a change's context, a members record, a backup header.
fn membership_seeds(out: &Path) {
    let addresses: Addresses = [
        (4, "127.0.0.4:7400".parse().expect("address")),
        (5, "[::1]:7500".parse().expect("address")),
    ]
    .into();
    write(out, "membership", "context", &encode_context(&addresses));
    let conf_state = ConfState {
        voters: vec![1, 2, 3],
        learners: vec![4, 5],
        ..ConfState::default()
    };
    let members = Members {
        conf_index: 42,
        conf_state: conf_state.clone(),
        addresses,
    };
    write(out, "membership", "members", &encode_members(&members));
    write(
        out,
        "membership",
        "forwarded-change",
        &encode_change(&MemberChange::Promote(vec![4, 5])),
    );
    write(
        out,
        "membership",
        "answer",
        &encode_answer(&ChangeAnswer::Done(members.clone())),
    );
    let header = BackupHeader {
        index: 302,
        term: 2,
        conf_state,
        data: vec![9; 16],
        files: vec![("seg-000001.log".into(), 4_096), ("manifest".into(), 120)],
    };
    write(out, "membership", "backup-header", &encode_header(&header));
}

/// `pg_write_set` seeds: a write-set in the log's form (first byte 0), and lines of
/// `test_decoding`'s output (first byte 1).
fn pg_write_set_seeds(out: &Path) {
    let table = Table {
        schema: "public".into(),
        name: "t".into(),
    };
    let field = |column: &str, value: Option<&str>| Field {
        column: column.into(),
        value: value.map(String::from),
    };
    let changes = [
        Change::Insert {
            table: table.clone(),
            row: vec![field("k", Some("1")), field("v", None)],
        },
        Change::Update {
            table: table.clone(),
            key: vec![field("k", Some("1"))],
            row: vec![field("v", Some("it's"))],
        },
        Change::Delete {
            table: table.clone(),
            key: vec![field("k", Some("1"))],
        },
        Change::Truncate {
            tables: vec![table],
            restart_identity: true,
            cascade: false,
        },
    ];
    let groups = pg_write_set::group(changes.to_vec());
    write(
        out,
        "pg_write_set",
        "changes",
        &[&[0][..], &pg_write_set::encode(&groups)].concat(),
    );
    for (name, line) in [
        (
            "insert",
            "table public.t: INSERT: k[integer]:1 v[text]:'it''s' a[integer[]]:'{1,2}' b[bit]:B'10'",
        ),
        (
            "update",
            "table public.\"T x\": UPDATE: old-key: k[integer]:1 new-tuple: k[integer]:2 v[text]:unchanged-toast-datum",
        ),
        ("delete", "table public.t: DELETE: k[integer]:1"),
        ("truncate", "table public.a, public.b: TRUNCATE: restart_seqs cascade"),
    ] {
        write(out, "pg_write_set", name, &[&[1][..], line.as_bytes()].concat());
    }
}
