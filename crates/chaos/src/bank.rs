//! A bank on a SQL cluster (`chorus sql`), under faults: clients move money between accounts in
//! transactions, readers sum the balances on any node. What is checked:
//!
//! - Every read of the total, on any node, sees the total the bank started with.
//! - At the end, on every node, the balances are what the ledger of transfers says (none lost
//!   or applied twice), every acknowledged transfer is in the ledger, none that was refused is,
//!   and every node holds the same rows.
//!
//! Accounts belong to branches, and every statement names its rows' branch, so a cluster in
//! hybrid mode certifies transfers by branch (`--sql-conflict-classes` `BRANCH_CLASSES`); most
//! transfers cross branches.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use crate::faults::NodeList;
use crate::workload::{Recorder, Rng};

const ACCOUNTS: u64 = 8;
const BRANCHES: u64 = 4;
/// The conflict classes of the bank's tables, for a cluster in hybrid mode.
pub const BRANCH_CLASSES: &str = "accounts.branch,transfers.branch";
const INITIAL_BALANCE: i64 = 1_000;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// How a transfer ended, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Committed,
    /// An error that promises nothing was committed.
    Refused,
    Unknown,
}

#[derive(Debug, Default)]
pub struct Log {
    transfers: Mutex<BTreeMap<u64, Ended>>,
    /// Totals read that differ from the bank's, with the node that answered.
    bad_totals: Mutex<Vec<(u64, i64)>>,
    reads: std::sync::atomic::AtomicU64,
}

impl Log {
    /// (committed, refused, unknown) transfers, and reads of the total.
    pub fn counts(&self) -> (usize, usize, usize, u64) {
        let transfers = self.transfers.lock().expect("bank log");
        let count = |ended: Ended| transfers.values().filter(|e| **e == ended).count();
        (
            count(Ended::Committed),
            count(Ended::Refused),
            count(Ended::Unknown),
            self.reads.load(Ordering::Relaxed),
        )
    }
}

async fn connect(addr: SocketAddr) -> Option<Client> {
    let config = format!("host={} port={} user=chaos connect_timeout=2", addr.ip(), addr.port());
    let (client, connection) = tokio::time::timeout(REQUEST_TIMEOUT, tokio_postgres::connect(&config, NoTls))
        .await
        .ok()?
        .ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// Rows of a simple query, each value as text.
type Rows = Vec<Vec<String>>;

fn rows(messages: Vec<SimpleQueryMessage>) -> Rows {
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some((0..row.len()).map(|i| row.get(i).unwrap_or("").to_owned()).collect()),
            _ => None,
        })
        .collect()
}

/// Creates the accounts through whichever node leads.
pub async fn setup(nodes: &[(u64, SocketAddr)]) -> anyhow::Result<()> {
    let values: Vec<String> = (1..=ACCOUNTS)
        .map(|id| format!("({id}, {}, {INITIAL_BALANCE})", id % BRANCHES))
        .collect();
    let schema = format!(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, branch INTEGER NOT NULL, balance INTEGER NOT NULL);
         CREATE TABLE transfers (id INTEGER PRIMARY KEY, branch INTEGER NOT NULL, src INTEGER NOT NULL, \
             dst INTEGER NOT NULL, amount INTEGER NOT NULL);
         INSERT INTO accounts (id, branch, balance) VALUES {};",
        values.join(", ")
    );
    for _ in 0..100 {
        for (_, addr) in nodes {
            if let Some(client) = connect(*addr).await {
                if client.batch_execute(&schema).await.is_ok() {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
    anyhow::bail!("no node took the bank's schema")
}

/// Whether a failed transfer certainly changed nothing: the server refused it before COMMIT
/// could have been applied.
fn refused(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|e| {
        matches!(
            e.code().code(),
            "25006" | "40001" | "55P03" | "57P03" | "25P02" | "23505" | "23514"
        )
    })
}

/// Transfers (or, for a reader, sums) until the run stops, each client on one node at a time,
/// moving to the next of the members `nodes` lists (a membership change updates it) when one
/// fails it.
pub async fn client_loop(
    recorder: Arc<Recorder>,
    log: Arc<Log>,
    client_id: u64,
    reader: bool,
    nodes: NodeList,
    seed: u64,
) {
    let mut rng = Rng::new(seed ^ (client_id + 1).wrapping_mul(0x51_7cc1_b727_220a));
    let mut node = rng.below(1 << 16) as usize;
    let mut connected_to = 0;
    let mut client: Option<Client> = None;
    let mut next = 0u64;
    while !recorder.stop.load(Ordering::Relaxed) {
        let Some(connected) = &client else {
            let (id, addr) = {
                let members = nodes.read().expect("node list");
                members[node % members.len()]
            };
            connected_to = id;
            client = connect(addr).await;
            if client.is_none() {
                node += 1;
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
            continue;
        };
        if reader {
            let read = tokio::time::timeout(
                REQUEST_TIMEOUT,
                connected.simple_query("SELECT sum(balance), count(*) FROM accounts"),
            )
            .await;
            match read {
                Ok(Ok(messages)) => {
                    let total = rows(messages)
                        .first()
                        .and_then(|r| r[0].parse::<i64>().ok())
                        .unwrap_or(i64::MIN);
                    log.reads.fetch_add(1, Ordering::Relaxed);
                    recorder.completed.fetch_add(1, Ordering::Relaxed);
                    if total != ACCOUNTS as i64 * INITIAL_BALANCE {
                        log.bad_totals.lock().expect("bank log").push((connected_to, total));
                    }
                }
                _ => {
                    client = None;
                    node += 1;
                }
            }
            continue;
        }
        let id = (client_id << 32) | next;
        next += 1;
        let from = 1 + rng.below(ACCOUNTS);
        let to = 1 + (from + rng.below(ACCOUNTS - 1)) % ACCOUNTS;
        let amount = 1 + rng.below(50);
        let (from_branch, to_branch) = (from % BRANCHES, to % BRANCHES);
        let transfer = format!(
            "BEGIN;
             UPDATE accounts SET balance = balance - {amount} WHERE branch = {from_branch} AND id = {from};
             UPDATE accounts SET balance = balance + {amount} WHERE branch = {to_branch} AND id = {to};
             INSERT INTO transfers (id, branch, src, dst, amount) VALUES ({id}, {from_branch}, {from}, {to}, {amount});
             COMMIT;"
        );
        let mut conflicted = false;
        let ended = match tokio::time::timeout(REQUEST_TIMEOUT, connected.batch_execute(&transfer)).await {
            Ok(Ok(())) => Ended::Committed,
            Ok(Err(e)) if refused(&e) => {
                conflicted = e.as_db_error().is_some_and(|e| e.code().code() == "40001");
                Ended::Refused
            }
            _ => Ended::Unknown,
        };
        log.transfers.lock().expect("bank log").insert(id, ended);
        match ended {
            Ended::Committed => {
                recorder.completed.fetch_add(1, Ordering::Relaxed);
            }
            // A conflict with another transaction (hybrid mode: with one another node ran):
            // the node is fine, and the client stays, so that nodes keep writing at once.
            Ended::Refused if conflicted && connected.batch_execute("ROLLBACK").await.is_ok() => {}
            Ended::Refused | Ended::Unknown => {
                if ended == Ended::Unknown {
                    recorder.unknown.fetch_add(1, Ordering::Relaxed);
                }
                // A replica, or a node in trouble: try the next one on a new connection (a
                // refused transaction may have left this one inside a failed block).
                client = None;
                node += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// The checks, after the run healed and every node restarted: violations, if any.
pub async fn check(log: &Log, nodes: &[(u64, SocketAddr)]) -> anyhow::Result<Vec<String>> {
    let mut violations: Vec<String> = log
        .bad_totals
        .lock()
        .expect("bank log")
        .iter()
        .take(10)
        .map(|(node, total)| format!("node {node} read a total of {total}"))
        .collect();
    let transfers = log.transfers.lock().expect("bank log").clone();
    let mut reference: Option<(u64, Rows, Rows)> = None;
    for (id, addr) in nodes {
        let (accounts, ledger) = read_state(*addr)
            .await
            .with_context(|| format!("node {id} does not answer the final reads"))?;
        violations.extend(state_violations(*id, &accounts, &ledger, &transfers));
        match &reference {
            None => reference = Some((*id, accounts, ledger)),
            Some((first, a, l)) if *a != accounts || *l != ledger => {
                violations.push(format!("node {id} holds other rows than node {first}"));
            }
            Some(_) => {}
        }
    }
    Ok(violations)
}

/// What is wrong with one node's final state: balances that are not what its ledger says,
/// refused transfers in the ledger, acknowledged ones missing from it.
fn state_violations(
    node: u64,
    accounts: &[Vec<String>],
    ledger: &[Vec<String>],
    transfers: &BTreeMap<u64, Ended>,
) -> Vec<String> {
    let mut violations = Vec::new();
    let mut expected: BTreeMap<u64, i64> = (1..=ACCOUNTS).map(|a| (a, INITIAL_BALANCE)).collect();
    for row in ledger {
        let number = |i: usize| row[i].parse::<i64>().unwrap_or(i64::MIN);
        *expected.entry(number(1) as u64).or_default() -= number(3);
        *expected.entry(number(2) as u64).or_default() += number(3);
        let transfer = number(0) as u64;
        if transfers.get(&transfer) == Some(&Ended::Refused) {
            violations.push(format!("node {node} holds transfer {transfer}, which was refused"));
        }
    }
    for row in accounts {
        let (account, balance) = (
            row[0].parse::<u64>().unwrap_or(0),
            row[1].parse::<i64>().unwrap_or(i64::MIN),
        );
        if expected.get(&account) != Some(&balance) {
            violations.push(format!(
                "node {node}: account {account} holds {balance}, its ledger says {:?}",
                expected.get(&account)
            ));
        }
    }
    let in_ledger: std::collections::HashSet<&str> = ledger.iter().map(|r| r[0].as_str()).collect();
    for (transfer, ended) in transfers {
        if *ended == Ended::Committed && !in_ledger.contains(transfer.to_string().as_str()) {
            violations.push(format!("node {node} lost acknowledged transfer {transfer}"));
        }
    }
    violations
}

/// A node's accounts and ledger, read until it answers (it may still be catching up).
async fn read_state(addr: SocketAddr) -> anyhow::Result<(Rows, Rows)> {
    let mut last_error = String::from("no connection");
    for _ in 0..150 {
        if let Some(client) = connect(addr).await {
            let accounts = client
                .simple_query("SELECT id, balance FROM accounts ORDER BY id")
                .await;
            let ledger = client
                .simple_query("SELECT id, src, dst, amount FROM transfers ORDER BY id")
                .await;
            match (accounts, ledger) {
                (Ok(a), Ok(l)) => return Ok((rows(a), rows(l))),
                (Err(e), _) | (_, Err(e)) => last_error = e.to_string(),
            }
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
    anyhow::bail!("{last_error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: &[i64]) -> Vec<String> {
        values.iter().map(i64::to_string).collect()
    }

    fn accounts(balances: &[(i64, i64)]) -> Vec<Vec<String>> {
        (1..=ACCOUNTS as i64)
            .map(|a| {
                let balance = balances
                    .iter()
                    .find(|(id, _)| *id == a)
                    .map_or(INITIAL_BALANCE, |(_, b)| *b);
                row(&[a, balance])
            })
            .collect()
    }

    #[test]
    fn a_consistent_state_passes_and_each_kind_of_damage_is_named() {
        let transfers = BTreeMap::from([(7, Ended::Committed), (8, Ended::Refused), (9, Ended::Unknown)]);
        let ledger = vec![row(&[7, 1, 2, 30])];
        let moved = accounts(&[(1, 970), (2, 1030)]);
        assert!(state_violations(1, &moved, &ledger, &transfers).is_empty());
        // An unknown transfer may have committed.
        let with_unknown = vec![row(&[7, 1, 2, 30]), row(&[9, 3, 4, 5])];
        assert!(state_violations(
            1,
            &accounts(&[(1, 970), (2, 1030), (3, 995), (4, 1005)]),
            &with_unknown,
            &transfers
        )
        .is_empty());

        let doubled = accounts(&[(1, 940), (2, 1060)]);
        assert!(state_violations(1, &doubled, &ledger, &transfers)[0].contains("account 1 holds 940"));
        let lost = state_violations(1, &accounts(&[]), &[], &transfers);
        assert!(
            lost.iter().any(|v| v.contains("lost acknowledged transfer 7")),
            "{lost:?}"
        );
        let refused = vec![row(&[7, 1, 2, 30]), row(&[8, 1, 2, 1])];
        let found = state_violations(1, &accounts(&[(1, 969), (2, 1031)]), &refused, &transfers);
        assert!(
            found.iter().any(|v| v.contains("transfer 8, which was refused")),
            "{found:?}"
        );
    }
}
