//! One TPC-C terminal: a connection, its prepared statements, and the five transactions.
//!
//! Each transaction is sent as a pipeline: its statements (BEGIN … COMMIT, prepared, with
//! parameters) go out back to back and the replies are read afterwards, so a transaction costs
//! one client round trip rather than one per statement. That is possible because every value a
//! later statement needs from an earlier one is computed inside SQL (the new order's id is read
//! from the district row the same transaction just advanced). Delivery needs two answers
//! (the oldest undelivered order, and whether this terminal was the one to delete it), so it
//! takes three round trips. The same terminal drives every system compared.

use bytes::BytesMut;
use futures::future::join_all;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

use super::random::{self, Text};
use super::schema::{CUSTOMERS_PER_DISTRICT, DISTRICTS_PER_WAREHOUSE, ITEMS};
use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NewOrder,
    Payment,
    OrderStatus,
    Delivery,
    StockLevel,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::NewOrder,
        Kind::Payment,
        Kind::OrderStatus,
        Kind::Delivery,
        Kind::StockLevel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::NewOrder => "new-order",
            Kind::Payment => "payment",
            Kind::OrderStatus => "order-status",
            Kind::Delivery => "delivery",
            Kind::StockLevel => "stock-level",
        }
    }

    /// The standard mix (clause 5.2.3's minimums, the rest new-order): 45/43/4/4/4.
    pub fn draw(rng: &mut Rng) -> Kind {
        match rng.below(100) {
            0..=44 => Kind::NewOrder,
            45..=87 => Kind::Payment,
            88..=91 => Kind::OrderStatus,
            92..=95 => Kind::Delivery,
            _ => Kind::StockLevel,
        }
    }
}

/// How a transaction ended.
#[derive(Debug)]
pub enum Outcome {
    Committed,
    /// New-order's 1% with an unused item number, rolled back as the spec requires.
    RolledBackByDesign,
    /// A serialization failure, deadlock or lock timeout: the same input is tried again.
    Retry(String),
    Failed(String),
}

/// A statement parameter: TPC-C only binds integers and text.
#[derive(Debug, Clone)]
enum Param {
    Int(i64),
    Text(String),
}

impl ToSql for Param {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Param::Int(v) => v.to_sql(ty, out),
            Param::Text(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <String as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

fn int(v: u64) -> Param {
    Param::Int(v as i64)
}

const I: Type = Type::INT8;
const T: Type = Type::TEXT;

struct Prepared {
    begin: Statement,
    begin_read_only: Statement,
    commit: Statement,
    rollback: Statement,
    customer_by_name: Statement,
    no_customer: Statement,
    no_district: Statement,
    no_order: Statement,
    no_new_order: Statement,
    no_stock: Statement,
    /// One per district: the line copies the stock row's S_DIST_xx for the order's district.
    no_line: Vec<Statement>,
    pay_warehouse: Statement,
    pay_district: Statement,
    pay_customer: Statement,
    pay_history: Statement,
    os_customer: Statement,
    os_order: Statement,
    os_lines: Statement,
    dl_oldest: Statement,
    dl_delete: Statement,
    dl_carrier: Statement,
    dl_lines: Statement,
    dl_customer: Statement,
    stock_level: Statement,
}

impl Prepared {
    async fn new(client: &Client) -> Result<Prepared, tokio_postgres::Error> {
        let p = |sql: &'static str, types: &'static [Type]| client.prepare_typed(sql, types);
        let mut no_line = Vec::new();
        for d in 1..=DISTRICTS_PER_WAREHOUSE {
            let sql = format!(
                "INSERT INTO order_line (ol_o_id, ol_d_id, ol_w_id, ol_number, ol_i_id, ol_supply_w_id, \
                 ol_quantity, ol_amount, ol_dist_info) VALUES \
                 ((SELECT d_next_o_id - 1 FROM district WHERE d_w_id = $1 AND d_id = $2), $2, $1, $3, $4, $5, $6, \
                 (SELECT i_price FROM item WHERE i_id = $4) * $6, \
                 (SELECT s_dist_{d:02} FROM stock WHERE s_w_id = $5 AND s_i_id = $4))"
            );
            no_line.push(client.prepare_typed(&sql, &[I, I, I, I, I, I]).await?);
        }
        Ok(Prepared {
            begin: p("BEGIN", &[]).await?,
            begin_read_only: p("BEGIN READ ONLY", &[]).await?,
            commit: p("COMMIT", &[]).await?,
            rollback: p("ROLLBACK", &[]).await?,
            customer_by_name: p(
                "SELECT c_id FROM customer WHERE c_w_id = $1 AND c_d_id = $2 AND c_last = $3 ORDER BY c_first",
                &[I, I, T],
            )
            .await?,
            no_customer: p(
                "SELECT c_discount, c_last, c_credit, w_tax FROM customer, warehouse \
                 WHERE w_id = $1 AND c_w_id = w_id AND c_d_id = $2 AND c_id = $3",
                &[I, I, I],
            )
            .await?,
            no_district: p(
                "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = $1 AND d_id = $2",
                &[I, I],
            )
            .await?,
            no_order: p(
                "INSERT INTO orders (o_id, o_d_id, o_w_id, o_c_id, o_entry_d, o_ol_cnt, o_all_local) \
                 SELECT d_next_o_id - 1, d_id, d_w_id, $3, $4, $5, $6 FROM district WHERE d_w_id = $1 AND d_id = $2",
                &[I, I, I, I, I, I],
            )
            .await?,
            no_new_order: p(
                "INSERT INTO new_order (no_o_id, no_d_id, no_w_id) \
                 SELECT d_next_o_id - 1, d_id, d_w_id FROM district WHERE d_w_id = $1 AND d_id = $2",
                &[I, I],
            )
            .await?,
            no_stock: p(
                "UPDATE stock SET s_quantity = CASE WHEN s_quantity >= $3 + 10 THEN s_quantity - $3 \
                 ELSE s_quantity - $3 + 91 END, s_ytd = s_ytd + $3, s_order_cnt = s_order_cnt + 1, \
                 s_remote_cnt = s_remote_cnt + $4 WHERE s_w_id = $1 AND s_i_id = $2",
                &[I, I, I, I],
            )
            .await?,
            no_line,
            pay_warehouse: p("UPDATE warehouse SET w_ytd = w_ytd + $2 WHERE w_id = $1", &[I, I]).await?,
            pay_district: p(
                "UPDATE district SET d_ytd = d_ytd + $3 WHERE d_w_id = $1 AND d_id = $2",
                &[I, I, I],
            )
            .await?,
            pay_customer: p(
                "UPDATE customer SET c_balance = c_balance - $4, c_ytd_payment = c_ytd_payment + $4, \
                 c_payment_cnt = c_payment_cnt + 1, c_data = CASE WHEN c_credit = 'BC' \
                 THEN substr($5 || c_data, 1, 500) ELSE c_data END \
                 WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = $3",
                &[I, I, I, I, T],
            )
            .await?,
            pay_history: p(
                "INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, h_data) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, \
                 (SELECT w_name FROM warehouse WHERE w_id = $5) || '    ' || \
                 (SELECT d_name FROM district WHERE d_w_id = $5 AND d_id = $4))",
                &[I, I, I, I, I, I, I],
            )
            .await?,
            os_customer: p(
                "SELECT c_balance, c_first, c_middle, c_last FROM customer \
                 WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = $3",
                &[I, I, I],
            )
            .await?,
            os_order: p(
                "SELECT o_id, o_carrier_id, o_entry_d FROM orders WHERE o_w_id = $1 AND o_d_id = $2 \
                 AND o_c_id = $3 ORDER BY o_id DESC LIMIT 1",
                &[I, I, I],
            )
            .await?,
            os_lines: p(
                "SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d FROM order_line \
                 WHERE ol_w_id = $1 AND ol_d_id = $2 AND ol_o_id = \
                 (SELECT max(o_id) FROM orders WHERE o_w_id = $1 AND o_d_id = $2 AND o_c_id = $3)",
                &[I, I, I],
            )
            .await?,
            dl_oldest: p(
                "SELECT no_o_id FROM new_order WHERE no_w_id = $1 AND no_d_id = $2 ORDER BY no_o_id LIMIT 1",
                &[I, I],
            )
            .await?,
            dl_delete: p(
                "DELETE FROM new_order WHERE no_w_id = $1 AND no_d_id = $2 AND no_o_id = $3",
                &[I, I, I],
            )
            .await?,
            dl_carrier: p(
                "UPDATE orders SET o_carrier_id = $4 WHERE o_w_id = $1 AND o_d_id = $2 AND o_id = $3",
                &[I, I, I, I],
            )
            .await?,
            dl_lines: p(
                "UPDATE order_line SET ol_delivery_d = $4 WHERE ol_w_id = $1 AND ol_d_id = $2 AND ol_o_id = $3",
                &[I, I, I, I],
            )
            .await?,
            dl_customer: p(
                "UPDATE customer SET c_balance = c_balance + (SELECT sum(ol_amount) FROM order_line \
                 WHERE ol_w_id = $1 AND ol_d_id = $2 AND ol_o_id = $3), c_delivery_cnt = c_delivery_cnt + 1 \
                 WHERE c_w_id = $1 AND c_d_id = $2 AND c_id = \
                 (SELECT o_c_id FROM orders WHERE o_w_id = $1 AND o_d_id = $2 AND o_id = $3)",
                &[I, I, I],
            )
            .await?,
            // The last 20 orders' bounds as scalar subqueries: joined with the district row
            // instead, PostgreSQL's generic plan for the prepared statement can scan the whole
            // order_line table (minutes at 16 warehouses).
            stock_level: p(
                "SELECT count(DISTINCT s_i_id) FROM order_line, stock \
                 WHERE ol_w_id = $1 AND ol_d_id = $2 \
                 AND ol_o_id < (SELECT d_next_o_id FROM district WHERE d_w_id = $1 AND d_id = $2) \
                 AND ol_o_id >= (SELECT d_next_o_id - 20 FROM district WHERE d_w_id = $1 AND d_id = $2) \
                 AND s_w_id = $1 AND s_i_id = ol_i_id AND s_quantity < $3",
                &[I, I, I],
            )
            .await?,
        })
    }
}

type Step<'a> = (&'a Statement, Vec<Param>);

fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// Sends every step before reading any reply; each reply is the rows a statement affected.
async fn pipeline(client: &Client, steps: &[Step<'_>]) -> Vec<Result<u64, tokio_postgres::Error>> {
    join_all(
        steps
            .iter()
            .map(|(statement, params)| async move { client.execute(*statement, &refs(params)).await }),
    )
    .await
}

/// As `pipeline`, keeping the rows.
async fn pipeline_rows(client: &Client, steps: &[Step<'_>]) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
    join_all(
        steps
            .iter()
            .map(|(statement, params)| async move { client.query(*statement, &refs(params)).await }),
    )
    .await
}

pub(super) fn is_retryable(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::LOCK_NOT_AVAILABLE
    })
}

pub(super) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}

/// The outcome of a transaction from its statements' replies: the first error decides.
fn outcome<V>(replies: &[Result<V, tokio_postgres::Error>], rollback_by_design: bool) -> Outcome {
    match replies.iter().find_map(|r| r.as_ref().err()) {
        None => Outcome::Committed,
        Some(e) if rollback_by_design && e.code() == Some(&SqlState::NOT_NULL_VIOLATION) => Outcome::RolledBackByDesign,
        Some(e) if is_retryable(e) => Outcome::Retry(describe(e)),
        Some(e) => Outcome::Failed(describe(e)),
    }
}

/// A terminal: its connection, statements, home warehouse and random inputs.
pub struct Terminal {
    client: Client,
    prepared: Prepared,
    warehouses: u64,
    home: u64,
    rng: Rng,
}

struct NewOrderLine {
    item: u64,
    supply_warehouse: u64,
    quantity: u64,
}

impl Terminal {
    pub async fn new(client: Client, warehouses: u64, home: u64, seed: u64) -> Result<Terminal, tokio_postgres::Error> {
        let prepared = Prepared::new(&client).await?;
        Ok(Terminal {
            client,
            prepared,
            warehouses,
            home,
            rng: Rng::new(seed),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    fn district(&mut self) -> u64 {
        self.rng.between(1, DISTRICTS_PER_WAREHOUSE)
    }

    fn customer_id(&mut self) -> u64 {
        self.rng.nurand(1023, 1, CUSTOMERS_PER_DISTRICT, random::C_ID)
    }

    /// A warehouse other than the home one (the home one when there is no other).
    fn remote_warehouse(&mut self) -> u64 {
        if self.warehouses == 1 {
            return self.home;
        }
        let other = self.rng.between(1, self.warehouses - 1);
        if other >= self.home {
            other + 1
        } else {
            other
        }
    }

    /// Runs one transaction of `kind`, retrying the same input after a retryable failure;
    /// returns its outcome, how many tries it took, and whether it reached a warehouse other
    /// than its home one.
    pub async fn run(&mut self, kind: Kind) -> (Outcome, u32, bool) {
        let input = self.input(kind);
        let crosses = input.crosses_warehouses(self.home);
        let mut tries = 0;
        loop {
            tries += 1;
            let outcome = self.execute(&input).await;
            match outcome {
                Outcome::Retry(_) if tries < 10 => continue,
                other => return (other, tries, crosses),
            }
        }
    }

    fn input(&mut self, kind: Kind) -> Input {
        let w = self.home;
        let d = self.district();
        match kind {
            Kind::NewOrder => {
                let customer = self.customer_id();
                let line_count = self.rng.between(5, 15);
                let rolls_back = self.rng.between(1, 100) == 1;
                let mut lines: Vec<NewOrderLine> = (0..line_count)
                    .map(|n| {
                        let item = if rolls_back && n == line_count - 1 {
                            ITEMS + 1
                        } else {
                            self.rng.nurand(8191, 1, ITEMS, random::C_ITEM)
                        };
                        let supply_warehouse = if self.rng.between(1, 100) == 1 {
                            self.remote_warehouse()
                        } else {
                            w
                        };
                        NewOrderLine {
                            item,
                            supply_warehouse,
                            quantity: self.rng.between(1, 10),
                        }
                    })
                    .collect();
                // Stock rows are locked in one global order, so two new orders never deadlock.
                lines.sort_by_key(|l| (l.supply_warehouse, l.item));
                Input::NewOrder { d, customer, lines }
            }
            Kind::Payment => {
                let (customer_warehouse, customer_district) = if self.rng.between(1, 100) <= 85 {
                    (w, d)
                } else {
                    (self.remote_warehouse(), self.district())
                };
                Input::Payment {
                    d,
                    customer_warehouse,
                    customer_district,
                    customer: self.customer_choice(),
                    amount_cents: self.rng.between(100, 500_000),
                }
            }
            Kind::OrderStatus => Input::OrderStatus {
                d,
                customer: self.customer_choice(),
            },
            Kind::Delivery => Input::Delivery {
                carrier: self.rng.between(1, 10),
            },
            Kind::StockLevel => Input::StockLevel {
                d,
                threshold: self.rng.between(10, 20),
            },
        }
    }

    /// 60% of customers are named by last name, the others by id (clause 2.5.1.2).
    fn customer_choice(&mut self) -> Customer {
        if self.rng.between(1, 100) <= 60 {
            Customer::ByName(random::last_name(self.rng.nurand(255, 0, 999, random::C_LAST_RUN)))
        } else {
            Customer::ById(self.customer_id())
        }
    }

    /// The customer's id: by last name, the middle one of the matching customers ordered by
    /// first name. Names never change, so the lookup may precede the transaction.
    async fn resolve(&self, warehouse: u64, district: u64, customer: &Customer) -> Result<u64, Outcome> {
        let name = match customer {
            Customer::ById(id) => return Ok(*id),
            Customer::ByName(name) => name,
        };
        let params = [int(warehouse), int(district), Param::Text(name.clone())];
        let rows = self
            .client
            .query(&self.prepared.customer_by_name, &refs(&params))
            .await
            .map_err(|e| outcome::<()>(&[Err(e)], false))?;
        if rows.is_empty() {
            return Err(Outcome::Failed(format!("no customer named {name}")));
        }
        let middle = &rows[(rows.len() - 1) / 2];
        middle
            .try_get::<_, i64>(0)
            .map(|id| id as u64)
            .map_err(|e| Outcome::Failed(format!("customer id: {e}")))
    }

    async fn execute(&self, input: &Input) -> Outcome {
        let p = &self.prepared;
        let w = self.home;
        let now = Param::Int(random::now_ms());
        match input {
            Input::NewOrder { d, customer, lines } => {
                let all_local = lines.iter().all(|l| l.supply_warehouse == w);
                let mut steps: Vec<Step> = vec![
                    (&p.begin, vec![]),
                    (&p.no_customer, vec![int(w), int(*d), int(*customer)]),
                    (&p.no_district, vec![int(w), int(*d)]),
                    (
                        &p.no_order,
                        vec![
                            int(w),
                            int(*d),
                            int(*customer),
                            now,
                            int(lines.len() as u64),
                            int(u64::from(all_local)),
                        ],
                    ),
                    (&p.no_new_order, vec![int(w), int(*d)]),
                ];
                for (n, line) in lines.iter().enumerate() {
                    let remote = u64::from(line.supply_warehouse != w);
                    steps.push((
                        &p.no_stock,
                        vec![
                            int(line.supply_warehouse),
                            int(line.item),
                            int(line.quantity),
                            int(remote),
                        ],
                    ));
                    steps.push((
                        &p.no_line[*d as usize - 1],
                        vec![
                            int(w),
                            int(*d),
                            int(n as u64 + 1),
                            int(line.item),
                            int(line.supply_warehouse),
                            int(line.quantity),
                        ],
                    ));
                }
                steps.push((&p.commit, vec![]));
                outcome(&pipeline(&self.client, &steps).await, true)
            }
            Input::Payment {
                d,
                customer_warehouse,
                customer_district,
                customer,
                amount_cents,
            } => {
                let c = match self.resolve(*customer_warehouse, *customer_district, customer).await {
                    Ok(c) => c,
                    Err(outcome) => return outcome,
                };
                let history = format!("{c} {customer_district} {customer_warehouse} {d} {w} {amount_cents} | ");
                let steps: Vec<Step> = vec![
                    (&p.begin, vec![]),
                    (&p.pay_warehouse, vec![int(w), int(*amount_cents)]),
                    (&p.pay_district, vec![int(w), int(*d), int(*amount_cents)]),
                    (
                        &p.pay_customer,
                        vec![
                            int(*customer_warehouse),
                            int(*customer_district),
                            int(c),
                            int(*amount_cents),
                            Param::Text(history),
                        ],
                    ),
                    (
                        &p.pay_history,
                        vec![
                            int(c),
                            int(*customer_district),
                            int(*customer_warehouse),
                            int(*d),
                            int(w),
                            now,
                            int(*amount_cents),
                        ],
                    ),
                    (&p.commit, vec![]),
                ];
                outcome(&pipeline(&self.client, &steps).await, false)
            }
            Input::OrderStatus { d, customer } => {
                let c = match self.resolve(w, *d, customer).await {
                    Ok(c) => c,
                    Err(outcome) => return outcome,
                };
                let key = vec![int(w), int(*d), int(c)];
                let steps: Vec<Step> = vec![
                    (&p.begin_read_only, vec![]),
                    (&p.os_customer, key.clone()),
                    (&p.os_order, key.clone()),
                    (&p.os_lines, key),
                    (&p.commit, vec![]),
                ];
                outcome(&pipeline_rows(&self.client, &steps).await, false)
            }
            Input::Delivery { carrier } => self.deliver(*carrier, now).await,
            Input::StockLevel { d, threshold } => {
                let steps: Vec<Step> = vec![(&p.stock_level, vec![int(w), int(*d), int(*threshold)])];
                outcome(&pipeline_rows(&self.client, &steps).await, false)
            }
        }
    }

    /// Delivery (clause 2.7.4): for each district, the oldest undelivered order is delivered.
    /// Three round trips: the oldest orders, then their deletion (another terminal of the same
    /// warehouse may have taken one first: it is then skipped), then the updates.
    async fn deliver(&self, carrier: u64, now: Param) -> Outcome {
        let p = &self.prepared;
        let w = self.home;
        let mut steps: Vec<Step> = vec![(&p.begin, vec![])];
        for d in 1..=DISTRICTS_PER_WAREHOUSE {
            steps.push((&p.dl_oldest, vec![int(w), int(d)]));
        }
        let replies = pipeline_rows(&self.client, &steps).await;
        if replies.iter().any(Result::is_err) {
            return self.abandon(outcome(&replies, false)).await;
        }
        let mut oldest = Vec::new();
        for (d, rows) in (1..=DISTRICTS_PER_WAREHOUSE).zip(replies[1..].iter().flatten()) {
            match rows.first().map(|r| r.try_get::<_, i64>(0)) {
                Some(Ok(o_id)) => oldest.push((d, o_id as u64)),
                Some(Err(e)) => return self.abandon(Outcome::Failed(format!("oldest order: {e}"))).await,
                None => {}
            }
        }
        let deletes: Vec<Step> = oldest
            .iter()
            .map(|&(d, o)| (&p.dl_delete, vec![int(w), int(d), int(o)]))
            .collect();
        let deleted = pipeline(&self.client, &deletes).await;
        let mut updates: Vec<Step> = Vec::new();
        for (&(d, o), reply) in oldest.iter().zip(&deleted) {
            match reply {
                Ok(1) => {
                    updates.push((&p.dl_carrier, vec![int(w), int(d), int(o), int(carrier)]));
                    updates.push((&p.dl_lines, vec![int(w), int(d), int(o), now.clone()]));
                    updates.push((&p.dl_customer, vec![int(w), int(d), int(o)]));
                }
                Ok(_) => {}
                Err(_) => return self.abandon(outcome(&deleted, false)).await,
            }
        }
        updates.push((&p.commit, vec![]));
        outcome(&pipeline(&self.client, &updates).await, false)
    }

    /// Ends a transaction that failed between round trips.
    async fn abandon(&self, outcome: Outcome) -> Outcome {
        let _ = self.client.execute(&self.prepared.rollback, &[]).await;
        outcome
    }
}

enum Customer {
    ById(u64),
    ByName(String),
}

enum Input {
    NewOrder {
        d: u64,
        customer: u64,
        lines: Vec<NewOrderLine>,
    },
    Payment {
        d: u64,
        customer_warehouse: u64,
        customer_district: u64,
        customer: Customer,
        amount_cents: u64,
    },
    OrderStatus {
        d: u64,
        customer: Customer,
    },
    Delivery {
        carrier: u64,
    },
    StockLevel {
        d: u64,
        threshold: u64,
    },
}

impl Input {
    /// Whether it reaches a warehouse other than `home` (a remote supplier or customer).
    fn crosses_warehouses(&self, home: u64) -> bool {
        match self {
            Input::NewOrder { lines, .. } => lines.iter().any(|line| line.supply_warehouse != home),
            Input::Payment { customer_warehouse, .. } => *customer_warehouse != home,
            Input::OrderStatus { .. } | Input::Delivery { .. } | Input::StockLevel { .. } => false,
        }
    }
}
