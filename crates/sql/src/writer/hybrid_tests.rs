//! Hybrid replication on the writer: nodes executing concurrently, certification in log order,
//! and a randomized check against a serial reference.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use super::tests::{node_over, Node};
use super::*;
use crate::engine::Sqlite;
use crate::txn::{ClassMessage, NodeRef};

fn hybrid_node() -> Node {
    hybrid_node_in(tempfile::tempdir().unwrap())
}

/// The node over `dir`'s database, as a restart opens it.
fn hybrid_node_in(dir: tempfile::TempDir) -> Node {
    let labeller = Labeller::new("acct.class,hist.class".parse().unwrap());
    node_over(
        dir,
        ReplicationMode::Hybrid,
        Some(labeller),
        Duration::from_millis(200),
        None,
    )
}

/// Node `me` of three (ids 0, 1, 2) that own the classes (class % 3: see `owner_index`),
/// without a transport: no other node answers its pings.
fn owning_node(me: u64) -> Node {
    owning_node_hearing(me, Answering::new(|_| false))
}

/// Node `me` of three, hearing pings from the nodes `answering` says.
fn owning_node_hearing(me: u64, answering: Answering) -> Node {
    let labeller = Labeller::new("acct.class,hist.class".parse().unwrap());
    let ownership = Ownership {
        me,
        borrow_wait: Duration::from_millis(500),
        silent_for: Duration::from_secs(5),
        lend_for: Duration::from_secs(60),
        answering,
    };
    node_over(
        tempfile::tempdir().unwrap(),
        ReplicationMode::Hybrid,
        Some(labeller),
        Duration::from_millis(200),
        Some(ownership),
    )
}

type Reads = Vec<Vec<Vec<Value>>>;

/// Starts a transaction on `node` whose first statement is `first` (waiting for the lock).
async fn begin(node: &Node, session: u64, first: &(&str, Vec<Value>)) -> Result<(), SqlError> {
    let analysis = crate::text::analyse(first.0).unwrap();
    let label = node.writer.label(first.0, analysis.kind, &first.1);
    node.writer.begin(session, label).await
}

/// Runs `statements` in `session`'s open transaction; returns the rows each gave.
fn run(node: &Node, session: u64, statements: &[(&str, Vec<Value>)]) -> Reads {
    statements
        .iter()
        .map(|(sql, params)| {
            let analysis = crate::text::analyse(sql).unwrap();
            node.writer
                .execute(session, sql, &analysis, params.clone())
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .rows
        })
        .collect()
}

/// Runs `statements` in `session`'s open transaction, as `run`; a serialization failure
/// (a write-set of its node's in the log on a class it reached no longer fits) rolls it back.
fn try_run(node: &Node, session: u64, statements: &[(&str, Vec<Value>)]) -> Result<Reads, ()> {
    let mut reads = Vec::new();
    for (sql, params) in statements {
        let analysis = crate::text::analyse(sql).unwrap();
        match node.writer.execute(session, sql, &analysis, params.clone()) {
            Ok(outcome) => reads.push(outcome.rows),
            Err(e) => {
                assert_eq!(e.code, "40001", "{sql}: {e}");
                // A client may end a failed transaction with COMMIT as well as ROLLBACK.
                if session.is_multiple_of(2) {
                    node.writer.rollback(session);
                } else {
                    let ended = node.writer.commit(session).unwrap();
                    assert!(matches!(ended, Committed::Nothing { rolled_back: true }), "{ended:?}");
                }
                return Err(());
            }
        }
    }
    Ok(reads)
}

/// Commits `session`'s transaction; returns what it proposed and how to hear its outcome.
fn commit(node: &mut Node, session: u64) -> Option<(Txn, Certifying)> {
    match node.writer.commit(session).unwrap() {
        Committed::Certifying(certifying) => Some((super::tests::next_txn(&mut node.proposals), certifying)),
        Committed::Nothing { .. } => None,
        Committed::Ahead(_) => panic!("a hybrid node executes nothing ahead"),
    }
}

/// Runs a whole transaction on `node`.
async fn transact(node: &mut Node, session: u64, statements: &[(&str, Vec<Value>)]) -> (Reads, Txn, Certifying) {
    begin(node, session, &statements[0]).await.unwrap();
    let reads = run(node, session, statements);
    let (txn, certifying) = commit(node, session).expect("the transaction wrote");
    (reads, txn, certifying)
}

/// Every node applies the log's next entry (one transaction).
fn deliver(nodes: &[Node], index: u64, command: &(impl Clone + Into<Command>)) {
    for node in nodes {
        assert_eq!(node.writer.apply(index, command.clone()), Applied::Committed);
        node.writer.entries_applied();
    }
}

fn outcome(certifying: &mut Certifying) -> Option<Applied> {
    certifying.outcome.try_recv().ok()
}

/// The accounts, in id order.
fn accounts(node: &Node) -> Vec<Vec<Value>> {
    let mut writer = node.writer.writer();
    writer
        .engine
        .execute("SELECT id, class, bal FROM acct ORDER BY id", &[])
        .unwrap()
        .rows
}

const SCHEMA: &str = "CREATE TABLE acct (id INTEGER PRIMARY KEY, class INTEGER NOT NULL, bal INTEGER NOT NULL)";
const DEPOSIT: &str = "UPDATE acct SET bal = bal + ?1 WHERE class = ?2 AND id = ?3";
const SUM: &str = "SELECT coalesce(sum(bal), 0) FROM acct WHERE class = ?1";

fn int(n: i64) -> Value {
    Value::Integer(n)
}

/// Three nodes holding the schema and eight accounts (id 1–8, class id % 4, balance 100).
async fn cluster() -> (Vec<Node>, u64) {
    cluster_of(vec![hybrid_node(), hybrid_node(), hybrid_node()]).await
}

async fn cluster_of(mut nodes: Vec<Node>) -> (Vec<Node>, u64) {
    let (_, schema, mut created) = transact(&mut nodes[0], 1, &[(SCHEMA, vec![])]).await;
    assert!(
        matches!(schema.body, Body::Statements(_)),
        "a schema change travels as statements"
    );
    assert!(schema.certify.as_ref().unwrap().global);
    deliver(&nodes, 1, &schema);
    assert_eq!(outcome(&mut created), Some(Applied::Committed));
    let rows: Vec<String> = (1..=8).map(|id| format!("({id}, {}, 100)", id % 4)).collect();
    let insert = format!("INSERT INTO acct (id, class, bal) VALUES {}", rows.join(", "));
    let (_, filled, mut inserted) = transact(&mut nodes[0], 1, &[(&insert, vec![])]).await;
    deliver(&nodes, 2, &filled);
    assert_eq!(outcome(&mut inserted), Some(Applied::Committed));
    (nodes, 3)
}

#[tokio::test]
async fn nodes_execute_different_classes_at_once_and_the_first_committer_of_a_class_wins() {
    let (mut nodes, index) = cluster().await;
    let (_, on_one, mut one) = transact(&mut nodes[0], 1, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    let (_, on_two, mut two) = transact(&mut nodes[1], 1, &[(DEPOSIT, vec![int(7), int(2), int(2)])]).await;
    // Node 3 runs on class 1 before the log brought it node 1's deposit.
    let (_, late, mut stale) = transact(
        &mut nodes[2],
        1,
        &[(SUM, vec![int(1)]), (DEPOSIT, vec![int(1), int(1), int(5)])],
    )
    .await;
    assert_eq!(outcome(&mut one), None, "nothing is told before the log orders it");
    for (offset, txn) in [&on_one, &on_two, &late].into_iter().enumerate() {
        deliver(&nodes, index + offset as u64, txn);
    }
    assert_eq!(outcome(&mut one), Some(Applied::Committed));
    assert_eq!(
        outcome(&mut two),
        Some(Applied::Committed),
        "another class commits alongside"
    );
    assert_eq!(
        outcome(&mut stale),
        Some(Applied::Void),
        "its class was written after its snapshot"
    );
    let expected: Vec<Vec<Value>> = (1..=8)
        .map(|id| {
            vec![
                int(id),
                int(id % 4),
                int(100 + [5, 7, 0, 0, 0, 0, 0, 0][id as usize - 1]),
            ]
        })
        .collect();
    for node in &nodes {
        assert_eq!(accounts(node), expected);
        assert!(!node.diverged.load(Ordering::SeqCst));
    }
    // Ran again on a state that has node 1's deposit, it commits.
    let (_, again, mut retried) = transact(&mut nodes[2], 2, &[(DEPOSIT, vec![int(1), int(1), int(5)])]).await;
    deliver(&nodes, index + 3, &again);
    assert_eq!(outcome(&mut retried), Some(Applied::Committed));
}

#[tokio::test]
async fn a_node_runs_its_next_transaction_on_a_class_on_its_own_still_in_the_log() {
    let (mut nodes, index) = cluster().await;
    let (_, first, mut first_told) = transact(&mut nodes[0], 1, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    // The next, on the same class, sees the first's deposit before the log has it.
    let (reads, second, mut second_told) = transact(
        &mut nodes[0],
        2,
        &[(SUM, vec![int(1)]), (DEPOSIT, vec![int(1), int(1), int(5)])],
    )
    .await;
    assert_eq!(reads[0], vec![vec![int(205)]]);
    assert_eq!(
        second.certify.as_ref().unwrap().chain,
        Some(0b1),
        "it depends on the first"
    );
    // A read-only one on the chain is certified too: it saw what the log may void.
    let (reads, read_only, mut read_told) = transact(&mut nodes[0], 3, &[(SUM, vec![int(1)])]).await;
    assert_eq!(reads[0], vec![vec![int(206)]]);
    for (offset, txn) in [&first, &second, &read_only].into_iter().enumerate() {
        deliver(&nodes, index + offset as u64, txn);
    }
    for told in [&mut first_told, &mut second_told, &mut read_told] {
        assert_eq!(outcome(told), Some(Applied::Committed));
    }
    assert_eq!(accounts(&nodes[1])[0][2], int(105));
    assert_eq!(accounts(&nodes[2])[4][2], int(101));

    // Node 2 writes class 1 first: node 1's next is void, and the one chained on it too; one
    // on another class, run on the same state, depends on neither and commits.
    let (_, theirs, _) = transact(&mut nodes[1], 1, &[(DEPOSIT, vec![int(7), int(1), int(1)])]).await;
    let (_, mine, mut mine_told) = transact(&mut nodes[0], 4, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    let (_, other, mut other_told) = transact(&mut nodes[0], 5, &[(DEPOSIT, vec![int(5), int(2), int(2)])]).await;
    let (_, chained, mut chained_told) = transact(&mut nodes[0], 6, &[(DEPOSIT, vec![int(5), int(1), int(5)])]).await;
    assert_eq!(
        other.certify.as_ref().unwrap().chain,
        Some(0),
        "another class: it depends on nothing"
    );
    assert_eq!(
        chained.certify.as_ref().unwrap().chain,
        Some(0b10),
        "it depends on the one before the last"
    );
    for (offset, txn) in [&theirs, &mine, &other, &chained].into_iter().enumerate() {
        deliver(&nodes, index + 3 + offset as u64, txn);
    }
    assert_eq!(outcome(&mut mine_told), Some(Applied::Void));
    assert_eq!(outcome(&mut other_told), Some(Applied::Committed));
    assert_eq!(
        outcome(&mut chained_told),
        Some(Applied::Void),
        "it saw a write the log voided"
    );
    for node in &nodes {
        assert_eq!(accounts(node)[0][2], int(112));
        assert_eq!(accounts(node)[1][2], int(105));
        assert_eq!(accounts(node)[4][2], int(101));
    }
}

#[tokio::test]
async fn with_triggers_a_node_holds_a_class_back_while_its_own_transaction_on_it_is_in_the_log() {
    let (mut nodes, index) = cluster().await;
    let (_, audit, _) = transact(
        &mut nodes[0],
        1,
        &[
            ("CREATE TABLE audit (n INTEGER)", vec![]),
            (
                "CREATE TRIGGER audited AFTER UPDATE ON acct BEGIN INSERT INTO audit VALUES (new.bal); END",
                vec![],
            ),
        ],
    )
    .await;
    deliver(&nodes, index, &audit);
    let (_, first, mut told) = transact(&mut nodes[0], 1, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    // Another class starts at once; the same class waits for the log.
    let (_, other, _) = transact(&mut nodes[0], 2, &[(DEPOSIT, vec![int(5), int(2), int(2)])]).await;
    assert_eq!(other.certify.as_ref().unwrap().chain, None, "not chained");
    let same = (DEPOSIT, vec![int(5), int(1), int(5)]);
    let error = begin(&nodes[0], 3, &same).await.unwrap_err();
    assert_eq!(error.code, "55P03", "it waited out the lock wait");
    let waiting = {
        let writer = nodes[0].writer.clone();
        tokio::spawn(async move {
            let analysis = crate::text::analyse(DEPOSIT).unwrap();
            let label = writer.label(DEPOSIT, analysis.kind, &[int(5), int(1), int(5)]);
            writer.begin(4, label).await
        })
    };
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    deliver(&nodes, index + 1, &first);
    assert_eq!(outcome(&mut told), Some(Applied::Committed));
    waiting.await.unwrap().unwrap();
    run(&nodes[0], 4, std::slice::from_ref(&same));
    let (second, _) = commit(&mut nodes[0], 4).unwrap();
    assert_eq!(
        second.certify.unwrap().snapshot,
        (index + 1, 0),
        "it ran on a state holding the first"
    );
}

#[tokio::test]
async fn what_the_log_orders_while_a_client_holds_the_lock_waits_for_it_and_reads_wait_for_that() {
    let (mut nodes, index) = cluster().await;
    let (_, deposit, mut told) = transact(&mut nodes[0], 1, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    // Node 2's client holds the lock (on class 2) while the log orders node 1's deposit.
    let holding = (DEPOSIT, vec![int(1), int(2), int(2)]);
    begin(&nodes[1], 1, &holding).await.unwrap();
    deliver(&nodes, index, &deposit);
    assert_eq!(outcome(&mut told), Some(Applied::Committed), "node 1 applied it");
    let balance_of_1 = |node: &Node| accounts(node)[0][2].clone();
    assert_eq!(
        balance_of_1(&nodes[1]),
        int(100),
        "deferred behind the client's transaction"
    );
    let progress = nodes[1].writer.progress.clone();
    let read = tokio::spawn(async move { progress.certified().await });
    tokio::task::yield_now().await;
    assert!(
        !read.is_finished(),
        "a read waits until the database holds what the log ordered"
    );
    run(&nodes[1], 1, std::slice::from_ref(&holding));
    let (mine, mut mine_told) = commit(&mut nodes[1], 1).unwrap();
    read.await.unwrap();
    assert_eq!(balance_of_1(&nodes[1]), int(105));
    deliver(&nodes, index + 1, &mine);
    assert_eq!(
        outcome(&mut mine_told),
        Some(Applied::Committed),
        "another class: it commits though its snapshot is older"
    );
    assert_eq!(accounts(&nodes[0]), accounts(&nodes[1]));
    assert_eq!(accounts(&nodes[1]), accounts(&nodes[2]));
}

#[tokio::test]
async fn rows_without_a_key_take_rowids_in_log_order_and_a_write_set_that_does_not_fit_is_void() {
    let (mut nodes, index) = cluster().await;
    let (_, schema, _) = transact(
        &mut nodes[0],
        1,
        &[("CREATE TABLE hist (class INTEGER, n INTEGER UNIQUE)", vec![])],
    )
    .await;
    deliver(&nodes, index, &schema);
    // Two classes, so certification passes both, and each node drew rowid 1 for its row: the
    // log gives them 1 and 2.
    let insert = "INSERT INTO hist (class, n) VALUES (?1, ?2)";
    let (_, first, mut first_told) = transact(&mut nodes[0], 2, &[(insert, vec![int(1), int(10)])]).await;
    let (_, second, mut second_told) = transact(&mut nodes[1], 2, &[(insert, vec![int(2), int(20)])]).await;
    // A unique value across classes: it passes certification but does not fit the rows.
    let (_, clash, mut clash_told) = transact(&mut nodes[2], 2, &[(insert, vec![int(3), int(10)])]).await;
    for (offset, txn) in [&first, &second, &clash].into_iter().enumerate() {
        deliver(&nodes, index + 1 + offset as u64, txn);
    }
    assert_eq!(outcome(&mut first_told), Some(Applied::Committed));
    assert_eq!(outcome(&mut second_told), Some(Applied::Committed));
    assert_eq!(outcome(&mut clash_told), Some(Applied::Void));
    for node in &nodes {
        let mut writer = node.writer.writer();
        let rows = writer
            .engine
            .execute("SELECT rowid, class, n FROM hist ORDER BY rowid", &[])
            .unwrap()
            .rows;
        assert_eq!(rows, vec![vec![int(1), int(1), int(10)], vec![int(2), int(2), int(20)]]);
    }
    // The void one left nothing behind: the next one on its class commits.
    let (_, third, mut third_told) = transact(&mut nodes[2], 3, &[(insert, vec![int(3), int(30)])]).await;
    deliver(&nodes, index + 4, &third);
    assert_eq!(outcome(&mut third_told), Some(Applied::Committed));
}

#[tokio::test]
async fn a_restarted_node_certifies_as_the_others_do() {
    let (mut nodes, index) = cluster().await;
    let (_, deposit, _) = transact(&mut nodes[0], 1, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    let (_, stale, mut stale_told) = transact(&mut nodes[1], 1, &[(DEPOSIT, vec![int(5), int(1), int(5)])]).await;
    deliver(&nodes, index, &deposit);
    // Node 3 restarts between the two: what certification remembers is in its database.
    let restarted = nodes.pop().unwrap();
    let Node { writer, _dir: dir, .. } = restarted;
    drop(writer);
    nodes.push(hybrid_node_in(dir));
    deliver(&nodes, index + 1, &stale);
    assert_eq!(outcome(&mut stale_told), Some(Applied::Void));
    assert_eq!(accounts(&nodes[2]), accounts(&nodes[0]));
}

#[tokio::test]
async fn a_checkpoint_installed_over_deferred_transactions_leaves_no_read_waiting() {
    let (mut nodes, index) = cluster().await;
    let (_, deposit, _) = transact(&mut nodes[0], 1, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    begin(&nodes[1], 1, &(DEPOSIT, vec![int(1), int(2), int(2)]))
        .await
        .unwrap();
    deliver(&nodes, index, &deposit);
    // Node 2 holds the deposit back behind its client; then a checkpoint replaces its database.
    let checkpoint = tempfile::tempdir().unwrap();
    let copy = checkpoint.path().join("db");
    {
        let mut writer = nodes[0].writer.writer();
        writer
            .engine
            .execute("VACUUM INTO ?1", &[Value::Text(copy.display().to_string())])
            .unwrap();
    }
    nodes[1].writer.restore(Some(&copy), nodes[0].writer.applied()).unwrap();
    tokio::time::timeout(Duration::from_secs(1), nodes[1].writer.progress.certified())
        .await
        .expect("nothing left to wait for");
    assert_eq!(accounts(&nodes[1]), accounts(&nodes[0]));
}

/// The log of the randomized test: proposals not yet ordered, per node in order (a node's
/// proposals keep their order), and what it ordered.
struct Log {
    queues: Vec<VecDeque<Txn>>,
    next_index: u64,
    ordered: Vec<TxnId>,
}

impl Log {
    /// Every node applies node `from`'s next proposal, if it has one.
    fn order_next(&mut self, nodes: &[Node], from: usize) {
        if let Some(txn) = self.queues[from].pop_front() {
            deliver(nodes, self.next_index, &txn);
            self.ordered.push(txn.id);
            self.next_index += 1;
        }
    }
}

/// A statement as the randomized test keeps it.
type Owned = (String, Vec<Value>);

/// A small deterministic generator (the test must repeat).
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random transactions on overlapping accounts, executed on random nodes on states the log has
/// reached to random depths (some holding the lock while the log orders others), delivered in
/// a random order: the committed ones, replayed one after another in log order on a reference
/// database, read what they read when they ran, and every node ends with the reference's rows.
#[tokio::test]
async fn certified_histories_equal_a_serial_one_in_log_order() {
    for seed in 1..=6u64 {
        let (mut nodes, index) = cluster().await;
        let reference = tempfile::tempdir().unwrap();
        let mut serial = Sqlite::open(reference.path()).unwrap();
        serial.execute(SCHEMA, &[]).unwrap();
        for id in 1..=8 {
            serial
                .execute("INSERT INTO acct VALUES (?1, ?2, 100)", &[int(id), int(id % 4)])
                .unwrap();
        }
        let mut draw = Draw(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut log = Log {
            queues: vec![VecDeque::new(); 3],
            next_index: index,
            ordered: Vec::new(),
        };
        let mut ran: HashMap<TxnId, (Vec<Owned>, Reads, Certifying)> = HashMap::new();
        let mut session = 10;
        let (mut held_back, mut chained, mut abandoned) = (0, 0, 0);
        for _ in 0..120 {
            let action = draw.below(10);
            if action < 4 {
                // Order the next proposal of a random node.
                log.order_next(&nodes, draw.below(3) as usize);
                continue;
            }
            let on = draw.below(3) as usize;
            // Read two classes' totals, move money between them, write one total down.
            let (a, b) = (draw.below(4) as i64, draw.below(4) as i64);
            let (from_id, to_id) = (if a == 0 { 4 } else { a }, if b == 0 { 8 } else { b + 4 });
            let amount = draw.below(20) as i64 + 1;
            let statements: Vec<Owned> = vec![
                (SUM.into(), vec![int(a)]),
                (SUM.into(), vec![int(b)]),
                (DEPOSIT.into(), vec![int(-amount), int(a), int(from_id)]),
                (DEPOSIT.into(), vec![int(amount), int(b), int(to_id)]),
                (
                    "UPDATE acct SET bal = bal + (SELECT coalesce(sum(bal), 0) FROM acct WHERE class = ?1) % 7 \
                     WHERE class = ?1 AND id = ?2"
                        .into(),
                    vec![int(a), int(from_id)],
                ),
            ];
            let borrowed: Vec<(&str, Vec<Value>)> = statements.iter().map(|(s, p)| (s.as_str(), p.clone())).collect();
            session += 1;
            // A transaction of this node's in the log that no longer fits holds it back
            // until the log has them all.
            let granted = {
                let writer = nodes[on].writer.clone();
                let label = writer.label(SUM, StatementKind::Read, &[int(a)]);
                tokio::spawn(async move { writer.begin(session, label).await })
            };
            tokio::task::yield_now().await;
            if !granted.is_finished() {
                held_back += 1;
                while !log.queues[on].is_empty() {
                    log.order_next(&nodes, on);
                }
            }
            granted.await.unwrap().unwrap();
            let Ok(mut reads) = try_run(&nodes[on], session, &borrowed[..2]) else {
                abandoned += 1;
                continue;
            };
            if action == 9 {
                // The log orders others while this one holds the lock.
                for other in (0..3).filter(|&other| other != on) {
                    log.order_next(&nodes, other);
                }
            }
            let Ok(more) = try_run(&nodes[on], session, &borrowed[2..]) else {
                abandoned += 1;
                continue;
            };
            reads.extend(more);
            let (txn, certifying) = commit(&mut nodes[on], session).unwrap();
            chained += usize::from(txn.certify.as_ref().unwrap().chain.unwrap_or(0) != 0);
            ran.insert(txn.id, (statements, reads, certifying));
            log.queues[on].push_back(txn);
        }
        for from in 0..3 {
            while !log.queues[from].is_empty() {
                log.order_next(&nodes, from);
            }
        }
        let mut committed = 0;
        for id in &log.ordered {
            let (statements, reads, certifying) = ran.get_mut(id).unwrap();
            match outcome(certifying).expect("every outcome is told") {
                Applied::Void => continue,
                Applied::Committed => committed += 1,
            }
            serial.begin().unwrap();
            let replayed: Reads = statements
                .iter()
                .map(|(sql, params)| serial.execute(sql, params).unwrap().rows)
                .collect();
            serial.commit().unwrap();
            assert_eq!(
                &replayed[..2],
                &reads[..2],
                "seed {seed}: {id:?} read what the serial order gives"
            );
        }
        assert!(
            committed > 20 && committed < ran.len(),
            "seed {seed}: {committed} of {} committed",
            ran.len()
        );
        assert!(
            chained > 10 && held_back + abandoned > 0,
            "seed {seed}: {chained} ran on a chain, {held_back} waited for a chain that no longer fit, \
             {abandoned} met one midway"
        );
        let expected = serial
            .execute("SELECT id, class, bal FROM acct ORDER BY id", &[])
            .unwrap()
            .rows;
        for node in &nodes {
            assert_eq!(accounts(node), expected, "seed {seed}");
            assert!(!node.diverged.load(Ordering::SeqCst));
        }
    }
}

/// Every node applies what `from` proposed since, in order, one command per log index from
/// `index` on; returns the next index.
fn deliver_proposed(nodes: &mut [Node], from: usize, mut index: u64) -> u64 {
    for command in take_proposed(&mut nodes[from]) {
        deliver(nodes, index, &command);
        index += 1;
    }
    index
}

/// Starts `session`'s transaction on `node` with a deposit of `amount` into account `id` of
/// `class`, and leaves it open.
async fn open_deposit(node: &Node, session: u64, amount: i64, class: i64, id: i64) {
    let deposit = (DEPOSIT, vec![int(amount), int(class), int(id)]);
    begin(node, session, &deposit).await.unwrap();
    run(node, session, &[deposit]);
}

/// Suspends `session`'s transaction on `node` for a statement on `class`, as the front end
/// does before running it; the receiver hears when it runs again.
fn reach(node: &Node, session: u64, class: i64) -> oneshot::Receiver<Result<(), SqlError>> {
    let label = node.writer.label(SUM, StatementKind::Read, &[int(class)]);
    node.writer
        .writer()
        .reach(session, label)
        .unwrap()
        .expect("another node owns the class: it waits")
}

/// What `node` proposed since last asked, taken.
fn take_proposed(node: &mut Node) -> Vec<Command> {
    std::iter::from_fn(|| node.proposals.try_recv().ok().map(|(c, _)| c)).collect()
}

/// The nodes `proposed` takes for down.
fn taken_for_down(proposed: &[Command]) -> Vec<u64> {
    proposed
        .iter()
        .filter_map(|c| match class_message(c) {
            Some(ClassMessage::OwnerDown {
                node: NodeRef::Id(node),
            }) => Some(*node),
            _ => None,
        })
        .collect()
}

fn class_message(command: &Command) -> Option<&ClassMessage> {
    match command {
        Command::Class(message) => Some(message),
        Command::Txn(_) => None,
    }
}

#[tokio::test]
async fn a_transaction_borrows_another_nodes_class_and_runs_after_the_owners_transactions_on_it() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    // Node 1 owns class 1 and has a deposit on it in flight; node 0 runs on its class 0 and
    // then reaches class 1.
    let (_, on_one, mut owners) = transact(&mut nodes[1], 1, &[(DEPOSIT, vec![int(5), int(1), int(1)])]).await;
    open_deposit(&nodes[0], 7, 1, 0, 4).await;
    let mut resumed = reach(&nodes[0], 7, 1);
    assert!(resumed.try_recv().is_err(), "it waits for the owner");
    deliver(&nodes, index, &on_one);
    let index = deliver_proposed(&mut nodes, 0, index + 1);
    // The owner lent it (after its own deposit, which is in the log before).
    let lend = nodes[1].proposals.try_recv().unwrap().0;
    assert!(matches!(class_message(&lend), Some(ClassMessage::Lend { class, .. }) if class == "1"));
    deliver(&nodes, index, &lend);
    assert!(matches!(resumed.try_recv(), Ok(Ok(()))), "it runs again with the class");
    // It sees the owner's deposit (and its own, run again), and a new transaction of the
    // owner's on the class waits until it is done.
    assert_eq!(run(&nodes[0], 7, &[(SUM, vec![int(1)])]), vec![vec![vec![int(205)]]]);
    let owner = nodes[1].writer.clone();
    let label = owner.label(SUM, StatementKind::Read, &[int(1)]);
    let held_back = tokio::spawn(async move { owner.begin(8, label).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!held_back.is_finished(), "the owner lent the class");
    let (borrower_txn, mut borrowers) = commit(&mut nodes[0], 7).expect("it wrote");
    let release = nodes[0].proposals.try_recv().unwrap().0;
    assert!(matches!(class_message(&release), Some(ClassMessage::Release { .. })));
    deliver(&nodes, index + 1, &borrower_txn);
    deliver(&nodes, index + 2, &release);
    assert_eq!(outcome(&mut owners), Some(Applied::Committed));
    assert_eq!(
        outcome(&mut borrowers),
        Some(Applied::Committed),
        "it ran on the owner's deposit"
    );
    held_back.await.unwrap().expect("the class is back");
    nodes[1].writer.rollback(8);
    let balances: Vec<Value> = accounts(&nodes[2]).into_iter().map(|row| row[2].clone()).collect();
    assert_eq!(balances[..5], [int(105), int(100), int(100), int(101), int(100)]);
}

#[tokio::test]
async fn of_two_transactions_waiting_for_each_others_class_the_younger_gives_way() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    open_deposit(&nodes[0], 1, 1, 0, 4).await;
    let mut older = reach(&nodes[0], 1, 1);
    open_deposit(&nodes[1], 1, 1, 1, 1).await;
    let mut younger = reach(&nodes[1], 1, 0);
    // Node 0's request is ordered first: node 1's transaction holds class 1 and waits for a
    // later one, so it gives way and node 1 lends class 1; node 0 does not lend class 0.
    let index = deliver_proposed(&mut nodes, 0, index);
    let index = deliver_proposed(&mut nodes, 1, index);
    let err = younger.try_recv().unwrap().unwrap_err();
    assert_eq!(err.code, "40001");
    assert!(
        nodes[0].proposals.is_empty(),
        "node 0 lends nothing while its own waits"
    );
    deliver_proposed(&mut nodes, 1, index);
    assert!(matches!(older.try_recv(), Ok(Ok(()))), "the older one goes on");
    assert_eq!(run(&nodes[0], 1, &[(SUM, vec![int(1)])]), vec![vec![vec![int(200)]]]);
}

#[tokio::test]
async fn a_transaction_reaching_a_class_another_of_its_nodes_holds_while_waiting_waits_for_it() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    // Node 0 owns classes 0 and 3. Its first transaction holds class 0 while it waits for
    // class 1; its second, on class 3, reaches class 0.
    open_deposit(&nodes[0], 1, 1, 0, 4).await;
    let mut first = reach(&nodes[0], 1, 1);
    open_deposit(&nodes[0], 2, 2, 3, 3).await;
    let mut second = reach(&nodes[0], 2, 0);
    let index = deliver_proposed(&mut nodes, 0, index);
    let index = deliver_proposed(&mut nodes, 1, index);
    assert!(matches!(first.try_recv(), Ok(Ok(()))));
    assert!(second.try_recv().is_err(), "the first still holds class 0");
    run(&nodes[0], 1, &[(DEPOSIT, vec![int(10), int(1), int(1)])]);
    let (txn, mut first_outcome) = commit(&mut nodes[0], 1).unwrap();
    assert!(
        matches!(second.try_recv(), Ok(Ok(()))),
        "class 0 is free once the first is done"
    );
    // It reads class 0 with the first one's deposit (still in the log: its chain).
    assert_eq!(run(&nodes[0], 2, &[(SUM, vec![int(0)])]), vec![vec![vec![int(201)]]]);
    let (second_txn, mut second_outcome) = commit(&mut nodes[0], 2).unwrap();
    assert_eq!(second_txn.certify.as_ref().unwrap().chain, Some(0b1));
    deliver(&nodes, index, &txn);
    deliver(&nodes, index + 1, &second_txn);
    assert_eq!(outcome(&mut first_outcome), Some(Applied::Committed));
    assert_eq!(outcome(&mut second_outcome), Some(Applied::Committed));
}

#[tokio::test]
async fn an_owner_lends_a_class_only_once_its_transaction_on_it_is_done() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    // Node 1's client is in a transaction on its class 1 when node 0's asks for it.
    open_deposit(&nodes[1], 1, 1, 1, 1).await;
    open_deposit(&nodes[0], 1, 1, 0, 4).await;
    let mut borrower = reach(&nodes[0], 1, 1);
    let index = deliver_proposed(&mut nodes, 0, index);
    assert!(
        nodes[1].proposals.is_empty(),
        "nothing lent while its own transaction runs"
    );
    let (owners, mut owners_outcome) = commit(&mut nodes[1], 1).unwrap();
    let lend = nodes[1].proposals.try_recv().unwrap().0;
    assert!(matches!(class_message(&lend), Some(ClassMessage::Lend { class, .. }) if class == "1"));
    deliver(&nodes, index, &owners);
    deliver(&nodes, index + 1, &lend);
    assert_eq!(outcome(&mut owners_outcome), Some(Applied::Committed));
    assert!(matches!(borrower.try_recv(), Ok(Ok(()))));
    assert_eq!(
        run(&nodes[0], 1, &[(SUM, vec![int(1)])]),
        vec![vec![vec![int(201)]]],
        "the borrower sees the owner's deposit"
    );
}

#[tokio::test]
async fn a_borrower_whose_owner_does_not_answer_fails_if_the_owner_lends_to_others_and_goes_on_if_it_seems_down() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    // Node 2 lends class 2 to node 0's first transaction: node 2 is alive.
    begin(&nodes[0], 1, &(DEPOSIT, vec![int(1), int(0), int(4)]))
        .await
        .unwrap();
    let mut first = reach(&nodes[0], 1, 2);
    let index = deliver_proposed(&mut nodes, 0, index);
    let index = deliver_proposed(&mut nodes, 2, index);
    assert!(matches!(first.try_recv(), Ok(Ok(()))));
    nodes[0].writer.rollback(1);
    // Node 0's second transaction asks node 2 for class 2 again; the loan does not come in
    // time (it is not delivered here).
    begin(&nodes[0], 2, &(DEPOSIT, vec![int(1), int(3), int(3)]))
        .await
        .unwrap();
    let mut busy = reach(&nodes[0], 2, 2);
    deliver_proposed(&mut nodes, 0, index);
    nodes[0].writer.writer().go_on_without(2);
    let err = busy.try_recv().unwrap().unwrap_err();
    assert_eq!(err.code, "40001", "its owner is alive: going on would void the owner's");
    // Class 1's owner lent nothing to anyone: it seems down, and the transaction goes on.
    begin(&nodes[0], 3, &(DEPOSIT, vec![int(1), int(3), int(3)]))
        .await
        .unwrap();
    let mut alone = reach(&nodes[0], 3, 1);
    nodes[0].writer.writer().go_on_without(3);
    assert!(matches!(alone.try_recv(), Ok(Ok(()))));
    run(&nodes[0], 3, &[(SUM, vec![int(1)])]);
    nodes[0].writer.rollback(3);
    // And it is not asked again for a while.
    begin(&nodes[0], 4, &(DEPOSIT, vec![int(1), int(3), int(3)]))
        .await
        .unwrap();
    let label = nodes[0].writer.label(SUM, StatementKind::Read, &[int(1)]);
    assert!(nodes[0].writer.writer().reach(4, label).unwrap().is_none());
}

#[tokio::test]
async fn an_owner_taken_for_down_has_its_classes_move_to_the_nodes_up_until_it_says_it_is_back() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    let owners = |node: &Node| {
        let writer = node.writer.writer();
        ["1", "4", "7"].map(|class| writer.owner_of(class))
    };
    // Node 1 does not answer: node 2's transaction waits for its class 4, node 0's for its
    // class 1.
    open_deposit(&nodes[2], 1, 1, 2, 2).await;
    let mut on_four = reach(&nodes[2], 1, 4);
    begin(&nodes[0], 1, &(DEPOSIT, vec![int(1), int(0), int(4)]))
        .await
        .unwrap();
    let mut on_one = reach(&nodes[0], 1, 1);
    let index = deliver_proposed(&mut nodes, 2, index);
    let index = deliver_proposed(&mut nodes, 0, index);
    // What node 1 says never reaches the log.
    while nodes[1].proposals.try_recv().is_ok() {}
    nodes[0].writer.writer().go_on_without(1);
    assert!(
        matches!(on_one.try_recv(), Ok(Ok(()))),
        "its owner seems down: it goes on"
    );
    let proposed = take_proposed(&mut nodes[0]);
    assert_eq!(taken_for_down(&proposed), [1]);
    for (offset, command) in proposed.iter().enumerate() {
        deliver(&nodes, index + offset as u64, command);
    }
    let index = index + proposed.len() as u64;
    // Node 1's classes spread over nodes 0 and 2, the same on every node; node 2's
    // transaction waiting for class 4 now owns it and goes on.
    for node in &nodes {
        assert_eq!(owners(node), [0, 2, 0]);
    }
    assert!(
        matches!(on_four.try_recv(), Ok(Ok(()))),
        "class 4 moved to its own node"
    );
    // Node 1 reads that it was taken for down, and says it is back: its classes return.
    let back = take_proposed(&mut nodes[1]);
    assert_eq!(
        back.iter().filter_map(class_message).collect::<Vec<_>>(),
        [&ClassMessage::OwnerBack { node: NodeRef::Id(1) }]
    );
    deliver(&nodes, index, &back[0]);
    for node in &nodes {
        assert_eq!(owners(node), [1, 1, 1]);
    }
}

#[tokio::test]
async fn an_owner_that_answers_pings_is_not_taken_for_down_however_slowly_the_log_moves() {
    let answering = Arc::new(AtomicBool::new(true));
    let hears_one = {
        let answering = answering.clone();
        Answering::new(move |node| node == 1 && answering.load(Ordering::Relaxed))
    };
    let (mut nodes, index) = cluster_of(vec![owning_node_hearing(0, hears_one), owning_node(1), owning_node(2)]).await;
    // Node 1 owns class 1 and lends nothing (the log moves, but not its word): node 0's
    // transaction waits in vain, and fails with 40001, since node 1 answers pings.
    begin(&nodes[0], 1, &(DEPOSIT, vec![int(1), int(0), int(4)]))
        .await
        .unwrap();
    let mut on_one = reach(&nodes[0], 1, 1);
    let index = deliver_proposed(&mut nodes, 0, index);
    while nodes[1].proposals.try_recv().is_ok() {}
    nodes[0].writer.writer().go_on_without(1);
    let failed = on_one.try_recv();
    assert!(matches!(&failed, Ok(Err(e)) if e.code == "40001"), "{failed:?}");
    let proposed = take_proposed(&mut nodes[0]);
    assert!(taken_for_down(&proposed).is_empty(), "{proposed:?}");
    for (offset, command) in proposed.iter().enumerate() {
        deliver(&nodes, index + offset as u64, command);
    }
    let index = index + proposed.len() as u64;
    // Once it answers no ping either, the next wait takes it for down.
    answering.store(false, Ordering::Relaxed);
    begin(&nodes[0], 2, &(DEPOSIT, vec![int(1), int(0), int(4)]))
        .await
        .unwrap();
    let mut on_one = reach(&nodes[0], 2, 1);
    deliver_proposed(&mut nodes, 0, index);
    nodes[0].writer.writer().go_on_without(2);
    assert!(
        matches!(on_one.try_recv(), Ok(Ok(()))),
        "its owner seems down: it goes on"
    );
    let proposed = take_proposed(&mut nodes[0]);
    assert_eq!(taken_for_down(&proposed), [1]);
}

#[tokio::test]
async fn a_global_transaction_borrows_every_class_and_runs_when_every_node_is_done_with_them() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    const EVERY: &str = "UPDATE acct SET bal = bal + 1";
    let every = |node: &Node| node.writer.label(EVERY, StatementKind::Write, &[]);
    assert!(every(&nodes[0]).global);
    // Node 1's client is in a transaction on its class 1 when node 0's global one starts.
    open_deposit(&nodes[1], 1, 5, 1, 1).await;
    begin(&nodes[0], 1, &(EVERY, vec![])).await.unwrap();
    let label = every(&nodes[0]);
    let mut global = nodes[0]
        .writer
        .writer()
        .reach(1, label)
        .unwrap()
        .expect("it waits for every node's classes");
    let index = deliver_proposed(&mut nodes, 0, index);
    // Nodes 0 and 2 lend theirs at once; node 1 once its transaction is done.
    assert!(nodes[1].proposals.is_empty(), "node 1's transaction holds class 1");
    let index = deliver_proposed(&mut nodes, 0, index);
    let index = deliver_proposed(&mut nodes, 2, index);
    assert!(global.try_recv().is_err());
    // Meanwhile no transaction starts on a node that lent everything.
    let lender = nodes[2].writer.clone();
    let label = lender.label(DEPOSIT, StatementKind::Write, &[int(1), int(2), int(2)]);
    let held_back = tokio::spawn(async move { lender.begin(2, label).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!held_back.is_finished(), "node 2 lent all its classes");
    let (deposit, mut deposits) = commit(&mut nodes[1], 1).unwrap();
    let lend_all = nodes[1].proposals.try_recv().unwrap().0;
    assert!(matches!(
        class_message(&lend_all),
        Some(ClassMessage::LendAll {
            node: NodeRef::Id(1),
            ..
        })
    ));
    deliver(&nodes, index, &deposit);
    deliver(&nodes, index + 1, &lend_all);
    assert!(matches!(global.try_recv(), Ok(Ok(()))), "every node lent its classes");
    run(&nodes[0], 1, &[(EVERY, vec![])]);
    let (global_txn, mut global_outcome) = commit(&mut nodes[0], 1).unwrap();
    let release = nodes[0].proposals.try_recv().unwrap().0;
    assert!(matches!(class_message(&release), Some(ClassMessage::Release { .. })));
    deliver(&nodes, index + 2, &global_txn);
    deliver(&nodes, index + 3, &release);
    assert_eq!(outcome(&mut deposits), Some(Applied::Committed));
    assert_eq!(
        outcome(&mut global_outcome),
        Some(Applied::Committed),
        "it ran after node 1's deposit, and nothing ran beside it"
    );
    held_back.await.unwrap().expect("the classes are back");
    nodes[2].writer.rollback(2);
    for node in &nodes {
        let balances: Vec<Value> = accounts(node).into_iter().map(|row| row[2].clone()).collect();
        assert_eq!(balances, [106, 101, 101, 101, 101, 101, 101, 101].map(int));
    }
}

#[tokio::test]
async fn a_global_transaction_waits_for_its_own_nodes_loan_even_when_the_log_took_every_node_for_down() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    // Under load every borrower gave up on the owner it waited for: the log takes all three
    // for down, node 0 before its global transaction starts or after (each then says it is
    // back; those words are late here).
    let down = |node: u64| {
        Command::Class(ClassMessage::OwnerDown {
            node: NodeRef::Id(node),
        })
    };
    deliver(&nodes, index, &down(1));
    deliver(&nodes, index + 1, &down(2));
    let index = index + 2;
    for node in &mut nodes {
        while node.proposals.try_recv().is_ok() {}
    }
    const EVERY: &str = "UPDATE acct SET bal = bal + 1";
    begin(&nodes[0], 1, &(EVERY, vec![])).await.unwrap();
    let label = nodes[0].writer.label(EVERY, StatementKind::Write, &[]);
    let mut global = nodes[0]
        .writer
        .writer()
        .reach(1, label)
        .unwrap()
        .expect("it waits at least for its own node's classes");
    assert!(global.try_recv().is_err(), "its node's loan comes through the log");
    deliver(&nodes, index, &down(0));
    assert!(
        global.try_recv().is_err(),
        "its own node taken for down still lends: it waits for that"
    );
    let mut index = deliver_proposed(&mut nodes, 0, index + 1);
    // Every node lends all, down or not; node 0's loan is the one it waits for.
    for lender in 0..3 {
        index = deliver_proposed(&mut nodes, lender, index);
    }
    assert!(
        matches!(global.try_recv(), Ok(Ok(()))),
        "its own node lent: it runs (and does not wait until its client gives up)"
    );
}

#[tokio::test]
async fn a_membership_change_places_the_classes_over_the_new_voters_and_a_waiting_transaction_follows_its_class() {
    let (mut nodes, index) = cluster_of((0..3).map(owning_node).collect()).await;
    let owners = |node: &Node| {
        let writer = node.writer.writer();
        (0..8)
            .map(|class| writer.owner_of(&class.to_string()))
            .collect::<Vec<u64>>()
    };
    // Node 0's transaction on its class 0 reaches class 4, node 1's over voters 0, 1, 2.
    open_deposit(&nodes[0], 1, 1, 0, 4).await;
    let mut on_four = reach(&nodes[0], 1, 4);
    let index = deliver_proposed(&mut nodes, 0, index);
    assert!(on_four.try_recv().is_err(), "it waits for node 1's loan");
    // A fourth voter (id 3) joins: class 4 is node 0's now, on every node alike, and the
    // transaction waiting for it goes on without a loan.
    for node in &nodes {
        node.writer.voters_changed(&[0, 1, 2, 3]);
    }
    assert!(
        matches!(on_four.try_recv(), Ok(Ok(()))),
        "class 4 moved to its own node"
    );
    for node in &nodes {
        assert_eq!(owners(node), [0, 1, 2, 3, 0, 1, 2, 3]);
    }
    // Node 1 is taken for down, then leaves: its classes go to the voters left, and a node
    // that left is not counted down.
    deliver(
        &nodes,
        index,
        &Command::Class(ClassMessage::OwnerDown { node: NodeRef::Id(1) }),
    );
    assert_ne!(owners(&nodes[0])[1], 1, "node 1's class 1 goes to a voter up");
    for node in &nodes {
        node.writer.voters_changed(&[0, 2, 3]);
        assert!(node.writer.writer().owners_down.is_empty());
        assert_eq!(owners(node), [0, 2, 3, 0, 2, 3, 0, 2]);
    }
    // An older build's message names a node by its place among the voters.
    deliver(
        &nodes,
        index + 1,
        &Command::Class(ClassMessage::OwnerDown {
            node: NodeRef::Place(2),
        }),
    );
    assert_eq!(
        nodes[2].writer.writer().owners_down,
        BTreeSet::from([3]),
        "place 2 of 0, 2, 3 is node 3"
    );
}
