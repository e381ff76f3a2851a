//! The TPC-C tables, their initial population (clause 4.3.3) and the consistency conditions
//! checked after a run (clause 3.3.2), in SQL that SQLite (behind Chorus) and PostgreSQL both
//! run unchanged. Money is in cents (BIGINT) so that sums compare exactly; times are Unix
//! milliseconds chosen by the driver, so no statement reads a server's clock.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_postgres::Client;

use super::random::{self, Text};
use crate::rng::Rng;

pub const DISTRICTS_PER_WAREHOUSE: u64 = 10;
pub const CUSTOMERS_PER_DISTRICT: u64 = 3000;
pub const ITEMS: u64 = 100_000;
/// Orders loaded per district; the last `NEW_ORDERS_PER_DISTRICT` are still to deliver.
const ORDERS_PER_DISTRICT: u64 = 3000;
const NEW_ORDERS_PER_DISTRICT: u64 = 900;
/// Rows per INSERT statement while loading: large enough that statement overhead vanishes,
/// small enough that one log entry stays far below a megabyte.
const ROWS_PER_INSERT: usize = 400;
/// Tries of one insert refused with a retryable error, and the pauses between them (doubling).
const RETRY_TRIES: u32 = 30;
const RETRY_BACKOFF_FIRST: Duration = Duration::from_millis(20);
const RETRY_BACKOFF_LAST: Duration = Duration::from_secs(2);

const TABLES: [&str; 9] = [
    "order_line",
    "new_order",
    "orders",
    "history",
    "customer",
    "district",
    "stock",
    "item",
    "warehouse",
];

const CREATE: [&str; 11] = [
    "CREATE TABLE warehouse (w_id BIGINT PRIMARY KEY, w_name VARCHAR(10) NOT NULL, \
     w_street_1 VARCHAR(20), w_street_2 VARCHAR(20), w_city VARCHAR(20), w_state CHAR(2), \
     w_zip CHAR(9), w_tax DOUBLE PRECISION NOT NULL, w_ytd BIGINT NOT NULL)",
    "CREATE TABLE district (d_id BIGINT NOT NULL, d_w_id BIGINT NOT NULL, d_name VARCHAR(10) NOT NULL, \
     d_street_1 VARCHAR(20), d_street_2 VARCHAR(20), d_city VARCHAR(20), d_state CHAR(2), \
     d_zip CHAR(9), d_tax DOUBLE PRECISION NOT NULL, d_ytd BIGINT NOT NULL, \
     d_next_o_id BIGINT NOT NULL, PRIMARY KEY (d_w_id, d_id))",
    "CREATE TABLE customer (c_id BIGINT NOT NULL, c_d_id BIGINT NOT NULL, c_w_id BIGINT NOT NULL, \
     c_first VARCHAR(16) NOT NULL, c_middle CHAR(2), c_last VARCHAR(16) NOT NULL, \
     c_street_1 VARCHAR(20), c_street_2 VARCHAR(20), c_city VARCHAR(20), c_state CHAR(2), \
     c_zip CHAR(9), c_phone CHAR(16), c_since BIGINT NOT NULL, c_credit CHAR(2) NOT NULL, \
     c_credit_lim BIGINT NOT NULL, c_discount DOUBLE PRECISION NOT NULL, \
     c_balance BIGINT NOT NULL, c_ytd_payment BIGINT NOT NULL, c_payment_cnt BIGINT NOT NULL, \
     c_delivery_cnt BIGINT NOT NULL, c_data VARCHAR(500) NOT NULL, \
     PRIMARY KEY (c_w_id, c_d_id, c_id))",
    "CREATE INDEX customer_by_name ON customer (c_w_id, c_d_id, c_last, c_first)",
    "CREATE TABLE history (h_c_id BIGINT NOT NULL, h_c_d_id BIGINT NOT NULL, h_c_w_id BIGINT NOT NULL, \
     h_d_id BIGINT NOT NULL, h_w_id BIGINT NOT NULL, h_date BIGINT NOT NULL, \
     h_amount BIGINT NOT NULL, h_data VARCHAR(24) NOT NULL)",
    "CREATE TABLE new_order (no_o_id BIGINT NOT NULL, no_d_id BIGINT NOT NULL, no_w_id BIGINT NOT NULL, \
     PRIMARY KEY (no_w_id, no_d_id, no_o_id))",
    "CREATE TABLE orders (o_id BIGINT NOT NULL, o_d_id BIGINT NOT NULL, o_w_id BIGINT NOT NULL, \
     o_c_id BIGINT NOT NULL, o_entry_d BIGINT NOT NULL, o_carrier_id BIGINT, \
     o_ol_cnt BIGINT NOT NULL, o_all_local BIGINT NOT NULL, PRIMARY KEY (o_w_id, o_d_id, o_id))",
    "CREATE INDEX orders_by_customer ON orders (o_w_id, o_d_id, o_c_id, o_id)",
    "CREATE TABLE order_line (ol_o_id BIGINT NOT NULL, ol_d_id BIGINT NOT NULL, ol_w_id BIGINT NOT NULL, \
     ol_number BIGINT NOT NULL, ol_i_id BIGINT NOT NULL, ol_supply_w_id BIGINT NOT NULL, \
     ol_delivery_d BIGINT, ol_quantity BIGINT NOT NULL, ol_amount BIGINT NOT NULL, \
     ol_dist_info CHAR(24) NOT NULL, PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number))",
    "CREATE TABLE item (i_id BIGINT PRIMARY KEY, i_im_id BIGINT NOT NULL, i_name VARCHAR(24) NOT NULL, \
     i_price BIGINT NOT NULL, i_data VARCHAR(50) NOT NULL)",
    "CREATE TABLE stock (s_i_id BIGINT NOT NULL, s_w_id BIGINT NOT NULL, s_quantity BIGINT NOT NULL, \
     s_dist_01 CHAR(24) NOT NULL, s_dist_02 CHAR(24) NOT NULL, s_dist_03 CHAR(24) NOT NULL, \
     s_dist_04 CHAR(24) NOT NULL, s_dist_05 CHAR(24) NOT NULL, s_dist_06 CHAR(24) NOT NULL, \
     s_dist_07 CHAR(24) NOT NULL, s_dist_08 CHAR(24) NOT NULL, s_dist_09 CHAR(24) NOT NULL, \
     s_dist_10 CHAR(24) NOT NULL, s_ytd BIGINT NOT NULL, s_order_cnt BIGINT NOT NULL, \
     s_remote_cnt BIGINT NOT NULL, s_data VARCHAR(50) NOT NULL, PRIMARY KEY (s_w_id, s_i_id))",
];

/// Drops any earlier TPC-C tables and creates them empty.
pub async fn create(client: &Client) -> anyhow::Result<()> {
    for table in TABLES {
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
            .await
            .with_context(|| format!("cannot drop {table}"))?;
    }
    for statement in CREATE {
        client
            .batch_execute(statement)
            .await
            .with_context(|| format!("cannot run: {statement}"))?;
    }
    Ok(())
}

/// Rows of one table, rendered as SQL literals, sent as multi-row INSERTs.
struct Inserter<'a> {
    client: &'a Client,
    table: &'static str,
    rows: Vec<String>,
    loaded: u64,
    /// Whether a retry was already reported (once per table and warehouse is enough).
    said_retrying: bool,
    /// The table's columns, named in each INSERT: hybrid replication labels an INSERT with
    /// the class column's values only when it can tell where that column is, and without a
    /// column list only the SQLite engine can say (on PostgreSQL every insert would be a
    /// global transaction borrowing every class).
    columns: Option<String>,
}

impl<'a> Inserter<'a> {
    fn new(client: &'a Client, table: &'static str) -> Inserter<'a> {
        Inserter {
            client,
            table,
            rows: Vec::with_capacity(ROWS_PER_INSERT),
            loaded: 0,
            said_retrying: false,
            columns: None,
        }
    }

    /// Inserts the one `row` into `table`; the rows written.
    async fn one(client: &'a Client, table: &'static str, row: String) -> anyhow::Result<u64> {
        let mut inserter = Inserter::new(client, table);
        inserter.push(row).await?;
        inserter.flush().await?;
        Ok(inserter.loaded)
    }

    async fn push(&mut self, row: String) -> anyhow::Result<()> {
        self.rows.push(row);
        if self.rows.len() >= ROWS_PER_INSERT {
            self.flush().await?;
        }
        Ok(())
    }

    /// The table's column names in order, as the server describes them.
    async fn column_list(&self) -> anyhow::Result<String> {
        let described = self
            .client
            .prepare(&format!("SELECT * FROM {} LIMIT 0", self.table))
            .await
            .with_context(|| format!("cannot describe {}", self.table))?;
        Ok(described
            .columns()
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(","))
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        if self.columns.is_none() {
            self.columns = Some(self.column_list().await?);
        }
        let columns = self.columns.as_deref().expect("set above");
        let sql = format!("INSERT INTO {} ({columns}) VALUES {}", self.table, self.rows.join(","));
        // A hybrid cluster may refuse an insert it could not get its class for in time
        // (serialization failure): nothing was written, so the same insert is tried again.
        let mut backoff = RETRY_BACKOFF_FIRST;
        let mut tries = 1;
        loop {
            match self.client.batch_execute(&sql).await {
                Ok(()) => break,
                Err(e) if super::terminal::is_retryable(&e) && tries < RETRY_TRIES => {
                    if !self.said_retrying {
                        println!(
                            "  retrying an insert into {}: {}",
                            self.table,
                            super::terminal::describe(&e)
                        );
                        self.said_retrying = true;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RETRY_BACKOFF_LAST);
                    tries += 1;
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot load {} (try {tries} of at most {RETRY_TRIES})", self.table))
                }
            }
        }
        self.loaded += self.rows.len() as u64;
        self.rows.clear();
        Ok(())
    }
}

/// A quoted SQL string literal; the generator only makes letters, digits and spaces.
fn quoted(text: &str) -> String {
    debug_assert!(!text.contains('\''));
    format!("'{text}'")
}

fn address(rng: &mut Rng) -> String {
    format!(
        "{},{},{},{},{}",
        quoted(&rng.alnum(10, 20)),
        quoted(&rng.alnum(10, 20)),
        quoted(&rng.alnum(10, 20)),
        quoted(&rng.letters(2, 2)),
        quoted(&format!("{}11111", rng.digits(4, 4)))
    )
}

/// Loads the item table (shared by every warehouse).
pub async fn load_items(client: &Client, seed: u64) -> anyhow::Result<u64> {
    let mut rng = Rng::new(seed);
    let mut items = Inserter::new(client, "item");
    for i_id in 1..=ITEMS {
        let row = format!(
            "({i_id},{},{},{},{})",
            rng.between(1, 10_000),
            quoted(&rng.alnum(14, 24)),
            rng.between(100, 10_000),
            quoted(&rng.data(26, 50))
        );
        items.push(row).await?;
    }
    items.flush().await?;
    Ok(items.loaded)
}

/// Loads warehouse `w_id` with its stock, districts, customers, history and orders; returns
/// the rows written.
pub async fn load_warehouse(client: &Client, w_id: u64, seed: u64, loaded_at_ms: i64) -> anyhow::Result<u64> {
    let mut rng = Rng::new(seed ^ w_id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut rows = 0;
    let tax = |rng: &mut Rng| rng.between(0, 2000) as f64 / 10_000.0;
    let warehouse = format!(
        "({w_id},{},{},{},{})",
        quoted(&rng.alnum(6, 10)),
        address(&mut rng),
        tax(&mut rng),
        30_000_000
    );
    rows += Inserter::one(client, "warehouse", warehouse).await?;

    let mut stock = Inserter::new(client, "stock");
    for i_id in 1..=ITEMS {
        let dists: Vec<String> = (0..DISTRICTS_PER_WAREHOUSE)
            .map(|_| quoted(&rng.alnum(24, 24)))
            .collect();
        let row = format!(
            "({i_id},{w_id},{},{},0,0,0,{})",
            rng.between(10, 100),
            dists.join(","),
            quoted(&rng.data(26, 50))
        );
        stock.push(row).await?;
    }
    stock.flush().await?;
    rows += stock.loaded;

    for d_id in 1..=DISTRICTS_PER_WAREHOUSE {
        let district = format!(
            "({d_id},{w_id},{},{},{},{},{})",
            quoted(&rng.alnum(6, 10)),
            address(&mut rng),
            tax(&mut rng),
            3_000_000,
            ORDERS_PER_DISTRICT + 1
        );
        rows += Inserter::one(client, "district", district).await?;

        let mut customers = Inserter::new(client, "customer");
        let mut history = Inserter::new(client, "history");
        for c_id in 1..=CUSTOMERS_PER_DISTRICT {
            let last = if c_id <= 1000 {
                random::last_name(c_id - 1)
            } else {
                random::last_name(rng.nurand(255, 0, 999, random::C_LAST_LOAD))
            };
            let credit = if rng.below(10) == 0 { "BC" } else { "GC" };
            let row = format!(
                "({c_id},{d_id},{w_id},{},'OE',{},{},{},{loaded_at_ms},'{credit}',5000000,{},-1000,1000,1,0,{})",
                quoted(&rng.alnum(8, 16)),
                quoted(&last),
                address(&mut rng),
                quoted(&rng.digits(16, 16)),
                rng.between(0, 5000) as f64 / 10_000.0,
                quoted(&rng.alnum(300, 500))
            );
            customers.push(row).await?;
            let row = format!(
                "({c_id},{d_id},{w_id},{d_id},{w_id},{loaded_at_ms},1000,{})",
                quoted(&rng.alnum(12, 24))
            );
            history.push(row).await?;
        }
        customers.flush().await?;
        history.flush().await?;
        rows += customers.loaded + history.loaded;

        let mut orders = Inserter::new(client, "orders");
        let mut new_orders = Inserter::new(client, "new_order");
        let mut lines = Inserter::new(client, "order_line");
        let customers_in_order = rng.permutation(CUSTOMERS_PER_DISTRICT);
        for o_id in 1..=ORDERS_PER_DISTRICT {
            let delivered = o_id <= ORDERS_PER_DISTRICT - NEW_ORDERS_PER_DISTRICT;
            let line_count = rng.between(5, 15);
            let carrier = if delivered {
                rng.between(1, 10).to_string()
            } else {
                "NULL".into()
            };
            let row = format!(
                "({o_id},{d_id},{w_id},{},{loaded_at_ms},{carrier},{line_count},1)",
                customers_in_order[o_id as usize - 1]
            );
            orders.push(row).await?;
            if !delivered {
                new_orders.push(format!("({o_id},{d_id},{w_id})")).await?;
            }
            for number in 1..=line_count {
                let (delivery, amount) = if delivered {
                    (loaded_at_ms.to_string(), 0)
                } else {
                    ("NULL".into(), rng.between(1, 999_999))
                };
                let row = format!(
                    "({o_id},{d_id},{w_id},{number},{},{w_id},{delivery},5,{amount},{})",
                    rng.between(1, ITEMS),
                    quoted(&rng.alnum(24, 24))
                );
                lines.push(row).await?;
            }
        }
        orders.flush().await?;
        new_orders.flush().await?;
        lines.flush().await?;
        rows += orders.loaded + new_orders.loaded + lines.loaded;
    }
    Ok(rows)
}

/// TPC-C's conflict classes: every table but `item` by its warehouse column, for hybrid
/// replication (`--sql-conflict-classes`).
pub const CONFLICT_CLASSES: &str = "warehouse.w_id,district.d_w_id,customer.c_w_id,history.h_w_id,\
                                    new_order.no_w_id,orders.o_w_id,order_line.ol_w_id,stock.s_w_id";

/// Creates the tables and loads `warehouses` warehouses over `loaders` (one warehouse at a
/// time per loader), each loader holding a connection to every node in the order
/// `owner_index` counts them: a warehouse is loaded through the node that owns its class, so
/// under hybrid replication no insert borrows its class from another node. Prints progress.
pub async fn load(loaders: &[Vec<Client>], warehouses: u64, seed: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let first = loaders
        .first()
        .and_then(|nodes| nodes.first())
        .context("no connection to load with")?;
    create(first).await?;
    let loaded_at_ms = random::now_ms();
    let next = std::sync::atomic::AtomicU64::new(1);
    // Items first, alone: with hybrid replication a write to `item` (no class) is certified
    // against everything written meanwhile.
    let items = load_items(first, seed).await?;
    let workers = loaders.iter().map(|nodes| {
        let next = &next;
        async move {
            let mut rows = 0;
            loop {
                let w_id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if w_id > warehouses {
                    return anyhow::Ok(rows);
                }
                let owner = &nodes[chorus_sql::classes::owner_index(&w_id.to_string(), nodes.len())];
                rows += load_warehouse(owner, w_id, seed, loaded_at_ms).await?;
                println!(
                    "  loaded warehouse {w_id}/{warehouses} ({:.0} s)",
                    started.elapsed().as_secs_f64()
                );
            }
        }
    });
    let rows = items + futures::future::try_join_all(workers).await?.iter().sum::<u64>();
    println!("loaded {rows} rows in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// TPC-C's consistency conditions 1–4 (clause 3.3.2.1–4), each as the number of warehouses or
/// districts that break it.
const CONDITIONS: [(&str, &str); 4] = [
    (
        "W_YTD = sum(D_YTD)",
        "SELECT count(*) FROM warehouse WHERE w_ytd <> (SELECT sum(d_ytd) FROM district WHERE d_w_id = w_id)",
    ),
    (
        "D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)",
        "SELECT count(*) FROM district WHERE d_next_o_id - 1 <> \
         (SELECT max(o_id) FROM orders WHERE o_w_id = d_w_id AND o_d_id = d_id) \
         OR d_next_o_id - 1 <> (SELECT max(no_o_id) FROM new_order WHERE no_w_id = d_w_id AND no_d_id = d_id)",
    ),
    (
        "count(NO_O_ID) = max(NO_O_ID) - min(NO_O_ID) + 1",
        "SELECT count(*) FROM (SELECT count(*) AS n, max(no_o_id) - min(no_o_id) + 1 AS span \
         FROM new_order GROUP BY no_w_id, no_d_id) AS per_district WHERE n <> span",
    ),
    (
        "sum(O_OL_CNT) = count(order lines)",
        "SELECT count(*) FROM (SELECT o_w_id, o_d_id, sum(o_ol_cnt) AS lines FROM orders \
         GROUP BY o_w_id, o_d_id) AS o JOIN (SELECT ol_w_id, ol_d_id, count(*) AS lines \
         FROM order_line GROUP BY ol_w_id, ol_d_id) AS l \
         ON o.o_w_id = l.ol_w_id AND o.o_d_id = l.ol_d_id WHERE o.lines <> l.lines",
    ),
];

/// Runs the consistency conditions; an error names every one broken.
pub async fn check_consistency(client: &Client) -> anyhow::Result<()> {
    let mut broken = Vec::new();
    for (name, sql) in CONDITIONS {
        let rows = client
            .simple_query(sql)
            .await
            .with_context(|| format!("cannot check {name}"))?;
        let violations = rows
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .context("a consistency check returned no row")?;
        if violations != "0" {
            broken.push(format!("{name}: broken in {violations}"));
        }
    }
    if !broken.is_empty() {
        bail!("TPC-C consistency conditions broken: {}", broken.join("; "));
    }
    Ok(())
}
