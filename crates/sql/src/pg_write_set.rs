//! Write-sets of the PostgreSQL engine (passive replication): the rows a transaction changed,
//! as PostgreSQL's logical decoding reports them on the leader (the `test_decoding` plugin,
//! which ships with the server), carried through the log in a binary form of ours, and applied
//! on each replica as one statement per row, the row found by its table's key.
//!
//! Values travel in PostgreSQL's text form and are bound as text parameters: each replica's
//! server reads them as the column's type, exactly as the leader's server printed them.

use crate::error::SqlError;
use crate::txn::{put_bytes, put_len, DecodeError, Reader, Value};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Table {
    pub schema: String,
    pub name: String,
}

impl Table {
    fn quoted(&self) -> String {
        format!("{}.{}", quoted(&self.schema), quoted(&self.name))
    }
}

/// A column's value in text form; None is NULL.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub column: String,
    pub value: Option<String>,
}

/// One row changed (or tables emptied), as replicas apply it.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Insert {
        table: Table,
        row: Vec<Field>,
    },
    /// `key` finds the row as it was; `row` holds its new values (columns not named keep theirs).
    Update {
        table: Table,
        key: Vec<Field>,
        row: Vec<Field>,
    },
    Delete {
        table: Table,
        key: Vec<Field>,
    },
    Truncate {
        tables: Vec<Table>,
        restart_identity: bool,
        cascade: bool,
    },
}

/// A value as logical decoding prints it.
#[derive(Debug, Clone, PartialEq)]
pub enum Datum {
    Null,
    Text(String),
    /// A large value an UPDATE left as it was (not in the WAL record).
    UnchangedToast,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DecodedField {
    pub column: String,
    pub datum: Datum,
}

/// One line of `test_decoding`'s output.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Begin,
    Commit,
    Insert {
        table: Table,
        new: Vec<DecodedField>,
    },
    /// `old_key` is printed only when the key changed (or the table's replica identity is FULL).
    Update {
        table: Table,
        old_key: Option<Vec<DecodedField>>,
        new: Vec<DecodedField>,
    },
    /// The old row's replica identity columns (none if the table has no identity).
    Delete {
        table: Table,
        old: Vec<DecodedField>,
    },
    Truncate {
        tables: Vec<Table>,
        restart_identity: bool,
        cascade: bool,
    },
    /// A logical message (`pg_logical_emit_message`): not a change of rows.
    Message,
}

/// Walks a line; every step fails (never panics) on text it does not expect.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn eat(&mut self, prefix: &str) -> bool {
        match self.rest.strip_prefix(prefix) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn expect(&mut self, prefix: &str) -> Result<(), String> {
        if self.eat(prefix) {
            Ok(())
        } else {
            Err(format!("expected '{prefix}' at '{}'", preview(self.rest)))
        }
    }

    /// Text between `quote`s, a quote inside doubled (None if the rest does not open with one).
    fn quoted(&mut self, quote: char) -> Option<Result<String, String>> {
        let inside = self.rest.strip_prefix(quote)?;
        let mut text = String::new();
        let mut chars = inside.char_indices();
        while let Some((at, c)) = chars.next() {
            if c != quote {
                text.push(c);
            } else if inside[at + 1..].starts_with(quote) {
                text.push(quote);
                chars.next();
            } else {
                self.rest = &inside[at + 1..];
                return Some(Ok(text));
            }
        }
        Some(Err(format!("a {quote}-quoted text does not close")))
    }

    /// An identifier as `quote_identifier` prints it: plain, or in double quotes (doubled inside).
    fn identifier(&mut self, ends: &[char]) -> Result<String, String> {
        if let Some(name) = self.quoted('"') {
            return name;
        }
        let end = self.rest.find(ends).unwrap_or(self.rest.len());
        if end == 0 {
            return Err(format!("expected a name at '{}'", preview(self.rest)));
        }
        let name = self.rest[..end].to_owned();
        self.rest = &self.rest[end..];
        Ok(name)
    }

    fn table(&mut self) -> Result<Table, String> {
        let schema = self.identifier(&['.', ':', ',', ' '])?;
        self.expect(".")?;
        let name = self.identifier(&[':', ',', ' '])?;
        Ok(Table { schema, name })
    }

    /// ` name[type]:value`, repeated, up to the end or ` new-tuple:`.
    fn fields(&mut self) -> Result<Vec<DecodedField>, String> {
        if self.eat(" (no-tuple-data)") {
            return Ok(Vec::new());
        }
        let mut fields = Vec::new();
        while !self.rest.is_empty() && !self.rest.starts_with(" new-tuple:") {
            self.expect(" ")?;
            let column = self.identifier(&['['])?;
            self.expect("[")?;
            // A type name may hold brackets (`integer[]`): it ends at the first `]:`.
            let type_end = self.rest.find("]:").ok_or("a column's type does not close")?;
            self.rest = &self.rest[type_end + 2..];
            let datum = self.datum()?;
            fields.push(DecodedField { column, datum });
        }
        Ok(fields)
    }

    fn datum(&mut self) -> Result<Datum, String> {
        if let Some(text) = self.quoted('\'') {
            return text.map(Datum::Text);
        }
        if let Some(bits) = self.rest.strip_prefix("B'") {
            let end = bits.find('\'').ok_or("a bit string does not close")?;
            self.rest = &bits[end + 1..];
            return Ok(Datum::Text(bits[..end].to_owned()));
        }
        let end = self.rest.find(' ').unwrap_or(self.rest.len());
        let bare = &self.rest[..end];
        self.rest = &self.rest[end..];
        Ok(match bare {
            "" => return Err("a column without a value".into()),
            "null" => Datum::Null,
            "unchanged-toast-datum" => Datum::UnchangedToast,
            number_or_boolean => Datum::Text(number_or_boolean.to_owned()),
        })
    }
}

fn preview(text: &str) -> &str {
    let end = text.char_indices().nth(40).map_or(text.len(), |(at, _)| at);
    &text[..end]
}

/// Parses one line of `test_decoding`'s output (options `include-xids` and `skip-empty-xacts`
/// either way).
pub fn parse_line(line: &str) -> Result<Line, String> {
    if line == "BEGIN" || line.starts_with("BEGIN ") {
        return Ok(Line::Begin);
    }
    if line == "COMMIT" || line.starts_with("COMMIT ") {
        return Ok(Line::Commit);
    }
    if line.starts_with("message:") {
        return Ok(Line::Message);
    }
    let mut cursor = Cursor { rest: line };
    cursor.expect("table ")?;
    let mut tables = vec![cursor.table()?];
    while cursor.eat(", ") {
        tables.push(cursor.table()?);
    }
    cursor.expect(":")?;
    let single = |mut tables: Vec<Table>| match tables.len() {
        1 => Ok(tables.remove(0)),
        n => Err(format!("{n} tables for one row")),
    };
    let parsed = if cursor.eat(" INSERT:") {
        Line::Insert {
            table: single(tables)?,
            new: cursor.fields()?,
        }
    } else if cursor.eat(" UPDATE:") {
        let old_key = if cursor.eat(" old-key:") {
            let old = cursor.fields()?;
            cursor.expect(" new-tuple:")?;
            Some(old)
        } else {
            None
        };
        Line::Update {
            table: single(tables)?,
            old_key,
            new: cursor.fields()?,
        }
    } else if cursor.eat(" DELETE:") {
        Line::Delete {
            table: single(tables)?,
            old: cursor.fields()?,
        }
    } else if cursor.eat(" TRUNCATE:") {
        let (mut restart_identity, mut cascade) = (false, false);
        if !cursor.eat(" (no-flags)") {
            restart_identity = cursor.eat(" restart_seqs");
            cascade = cursor.eat(" cascade");
        }
        Line::Truncate {
            tables,
            restart_identity,
            cascade,
        }
    } else {
        return Err(format!("an unknown change at '{}'", preview(cursor.rest)));
    };
    if !cursor.rest.is_empty() {
        return Err(format!("left over: '{}'", preview(cursor.rest)));
    }
    Ok(parsed)
}

/// What the leader knows of a table to turn decoded rows into changes.
#[derive(Debug, Clone, Default)]
pub struct TableInfo {
    /// The columns that find a row (the primary key, or the replica identity index); empty if none.
    pub key: Vec<String>,
    /// Generated columns: computed by each replica, never written.
    pub generated: Vec<String>,
    /// Identity columns GENERATED ALWAYS: an UPDATE may not set them (but to DEFAULT, which
    /// draws from the leader's sequence), so an update checks them instead: a replica whose
    /// row differs fails loudly rather than diverging.
    pub identity_always: Vec<String>,
}

/// Turns a decoded row change into a change replicas can apply; an error says why it cannot
/// be (a table without a key, a large value missing from the WAL).
pub fn resolve(line: Line, info: &TableInfo) -> Result<Change, String> {
    let written = |fields: Vec<DecodedField>| -> Vec<Field> {
        fields
            .into_iter()
            .filter(|field| !info.generated.contains(&field.column))
            .filter_map(|field| match field.datum {
                Datum::Null => Some(Field {
                    column: field.column,
                    value: None,
                }),
                Datum::Text(text) => Some(Field {
                    column: field.column,
                    value: Some(text),
                }),
                Datum::UnchangedToast => None,
            })
            .collect()
    };
    let key_of = |table: &Table, fields: &[DecodedField]| -> Result<Vec<Field>, String> {
        if info.key.is_empty() {
            return Err(format!(
                "table {} has no primary key, so its rows cannot be found on the replicas",
                table.quoted()
            ));
        }
        info.key
            .iter()
            .map(|column| match fields.iter().find(|field| &field.column == column) {
                Some(DecodedField {
                    datum: Datum::Text(text),
                    ..
                }) => Ok(Field {
                    column: column.clone(),
                    value: Some(text.clone()),
                }),
                _ => Err(format!(
                    "a change of {} without its key column {column}",
                    table.quoted()
                )),
            })
            .collect()
    };
    Ok(match line {
        Line::Insert { table, new } => {
            if new.iter().any(|field| field.datum == Datum::UnchangedToast) {
                return Err(format!("an insert into {} without one of its values", table.quoted()));
            }
            Change::Insert {
                row: written(new),
                table,
            }
        }
        Line::Update { table, old_key, new } => {
            let mut key = key_of(&table, old_key.as_deref().unwrap_or(&new))?;
            let (checked, row): (Vec<Field>, Vec<Field>) = written(new)
                .into_iter()
                .partition(|field| info.identity_always.contains(&field.column));
            key.extend(checked.into_iter().filter(|field| !info.key.contains(&field.column)));
            Change::Update { key, row, table }
        }
        Line::Delete { table, old } => Change::Delete {
            key: key_of(&table, &old)?,
            table,
        },
        Line::Truncate {
            tables,
            restart_identity,
            cascade,
        } => Change::Truncate {
            tables,
            restart_identity,
            cascade,
        },
        Line::Begin | Line::Commit | Line::Message => return Err("not a change of rows".into()),
    })
}

/// Consecutive row changes of one kind, table and set of columns: the form the log carries
/// (each column named once) and replicas apply (inserts and deletes of a group in one statement).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub kind: Kind,
    /// One table; a TRUNCATE's, any number.
    pub tables: Vec<Table>,
    /// The columns that find each row (updates and deletes).
    pub key: Vec<String>,
    /// The columns each row writes (inserts and updates).
    pub columns: Vec<String>,
    /// Per row, the key's values then the columns'.
    pub rows: Vec<Vec<Option<String>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Insert,
    Update,
    Delete,
    Truncate { restart_identity: bool, cascade: bool },
}

fn names(fields: &[Field]) -> impl Iterator<Item = &str> {
    fields.iter().map(|field| field.column.as_str())
}

fn values(fields: Vec<Field>) -> impl Iterator<Item = Option<String>> {
    fields.into_iter().map(|field| field.value)
}

/// Groups consecutive changes of one shape, in order.
pub fn group(changes: Vec<Change>) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for change in changes {
        let (kind, table, key, row) = match change {
            Change::Insert { table, row } => (Kind::Insert, table, Vec::new(), row),
            Change::Update { table, key, row } => (Kind::Update, table, key, row),
            Change::Delete { table, key } => (Kind::Delete, table, key, Vec::new()),
            Change::Truncate {
                tables,
                restart_identity,
                cascade,
            } => {
                groups.push(Group {
                    kind: Kind::Truncate {
                        restart_identity,
                        cascade,
                    },
                    tables,
                    key: Vec::new(),
                    columns: Vec::new(),
                    rows: Vec::new(),
                });
                continue;
            }
        };
        let same_shape = groups.last().is_some_and(|last| {
            last.kind == kind
                && last.tables[0] == table
                && last.key.iter().map(String::as_str).eq(names(&key))
                && last.columns.iter().map(String::as_str).eq(names(&row))
        });
        if !same_shape {
            groups.push(Group {
                kind,
                tables: vec![table],
                key: names(&key).map(String::from).collect(),
                columns: names(&row).map(String::from).collect(),
                rows: Vec::new(),
            });
        }
        let last = groups.last_mut().expect("pushed above");
        last.rows.push(values(key).chain(values(row)).collect());
    }
    groups
}

const MAGIC: &[u8; 4] = b"PGW2";

/// Opens each row: a row of no columns still takes a byte, so a count read from the input can
/// never make more rows than the input holds.
const ROW: u8 = b'r';

fn put_names(out: &mut Vec<u8>, names: &[String]) {
    put_len(out, names.len());
    for name in names {
        put_bytes(out, name.as_bytes());
    }
}

pub fn encode(groups: &[Group]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 * groups.len() + 8);
    out.extend_from_slice(MAGIC);
    put_len(&mut out, groups.len());
    for group in groups {
        let (kind, flags) = match group.kind {
            Kind::Insert => (1, 0),
            Kind::Update => (2, 0),
            Kind::Delete => (3, 0),
            Kind::Truncate {
                restart_identity,
                cascade,
            } => (4, u8::from(restart_identity) | u8::from(cascade) << 1),
        };
        out.extend_from_slice(&[kind, flags]);
        put_len(&mut out, group.tables.len());
        for table in &group.tables {
            put_bytes(&mut out, table.schema.as_bytes());
            put_bytes(&mut out, table.name.as_bytes());
        }
        put_names(&mut out, &group.key);
        put_names(&mut out, &group.columns);
        put_len(&mut out, group.rows.len());
        for row in &group.rows {
            out.push(ROW);
            for value in row {
                match value {
                    None => out.push(0),
                    Some(text) => {
                        out.push(1);
                        put_bytes(&mut out, text.as_bytes());
                    }
                }
            }
        }
    }
    out
}

/// A count read from the input, capped for reserving room: never more than the input holds.
fn room(count: usize, input_len: usize) -> usize {
    count.min(input_len / 4)
}

fn read_names(r: &mut Reader, input_len: usize) -> Result<Vec<String>, DecodeError> {
    let count = r.len()?;
    let mut names = Vec::with_capacity(room(count, input_len));
    for _ in 0..count {
        names.push(r.text()?);
    }
    Ok(names)
}

/// Reads what `encode` wrote; an error (never a panic) for anything else, including groups
/// whose shape their kind does not allow.
pub fn decode(bytes: &[u8]) -> Result<Vec<Group>, DecodeError> {
    let mut r = Reader::new(bytes);
    if r.take(4)? != MAGIC {
        return Err(DecodeError::Magic);
    }
    let count = r.len()?;
    let mut groups = Vec::with_capacity(room(count, bytes.len()));
    for _ in 0..count {
        let header = r.take(2)?;
        let kind = match (header[0], header[1]) {
            (1, 0) => Kind::Insert,
            (2, 0) => Kind::Update,
            (3, 0) => Kind::Delete,
            (4, flags @ 0..=3) => Kind::Truncate {
                restart_identity: flags & 1 != 0,
                cascade: flags & 2 != 0,
            },
            (kind, _) => return Err(DecodeError::Tag(kind)),
        };
        let table_count = r.len()?;
        let mut tables = Vec::with_capacity(room(table_count, bytes.len()));
        for _ in 0..table_count {
            tables.push(Table {
                schema: r.text()?,
                name: r.text()?,
            });
        }
        let key = read_names(&mut r, bytes.len())?;
        let columns = read_names(&mut r, bytes.len())?;
        let row_count = r.len()?;
        let width = key.len() + columns.len();
        let mut rows = Vec::with_capacity(room(row_count, bytes.len()));
        for _ in 0..row_count {
            match r.take(1)?[0] {
                ROW => {}
                tag => return Err(DecodeError::Tag(tag)),
            }
            let mut row = Vec::with_capacity(room(width, bytes.len()));
            for _ in 0..width {
                row.push(match r.take(1)?[0] {
                    0 => None,
                    1 => Some(r.text()?),
                    tag => return Err(DecodeError::Tag(tag)),
                });
            }
            rows.push(row);
        }
        let shaped = match kind {
            Kind::Insert => tables.len() == 1 && key.is_empty(),
            Kind::Update => tables.len() == 1 && !key.is_empty(),
            Kind::Delete => tables.len() == 1 && !key.is_empty() && columns.is_empty(),
            Kind::Truncate { .. } => !tables.is_empty() && width == 0 && rows.is_empty(),
        };
        if !shaped {
            return Err(DecodeError::Malformed(
                "a group's tables, key or columns do not fit its kind",
            ));
        }
        groups.push(Group {
            kind,
            tables,
            key,
            columns,
            rows,
        });
    }
    r.finished()?;
    Ok(groups)
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A statement that applies changes, its parameters, and how many rows it must change (None:
/// any number).
pub struct Apply {
    pub sql: String,
    pub params: Vec<Value>,
    pub rows: Option<u64>,
}

/// Rows one INSERT or DELETE applies at most: a statement's text stays short enough to keep
/// prepared for the common sizes, and far from PostgreSQL's 65,535 parameters.
const ROWS_PER_STATEMENT: usize = 64;

fn param(value: Option<String>) -> Value {
    value.map_or(Value::Null, Value::Text)
}

/// `"a", "b"` for the columns.
fn column_list(columns: &[String]) -> String {
    columns.iter().map(|c| quoted(c)).collect::<Vec<_>>().join(", ")
}

/// `($1, $2), ($3, $4)` for `rows` rows of `width` parameters.
fn placeholder_rows(rows: usize, width: usize) -> String {
    (0..rows)
        .map(|row| {
            let row: Vec<String> = (1..=width).map(|n| format!("${}", row * width + n)).collect();
            format!("({})", row.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `"k" = $n AND …` for one row's key (a NULL compared with IS NULL), parameters from `first`.
fn key_condition(key: &[String], values: &[Option<String>], first: usize) -> String {
    let mut next = first;
    key.iter()
        .zip(values)
        .map(|(column, value)| match value {
            None => format!("{} IS NULL", quoted(column)),
            Some(_) => {
                next += 1;
                format!("{} = ${}", quoted(column), next - 1)
            }
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The statements that apply `group` on a replica, in order.
pub fn statements(group: Group) -> Vec<Apply> {
    let Group {
        kind,
        tables,
        key,
        columns,
        rows,
    } = group;
    let table = tables.first().map(Table::quoted).unwrap_or_default();
    let width = key.len() + columns.len();
    let mut applies = Vec::new();
    match kind {
        Kind::Truncate {
            restart_identity,
            cascade,
        } => {
            let names: Vec<String> = tables.iter().map(Table::quoted).collect();
            applies.push(Apply {
                sql: format!(
                    "TRUNCATE {}{}{}",
                    names.join(", "),
                    if restart_identity { " RESTART IDENTITY" } else { "" },
                    if cascade { " CASCADE" } else { "" }
                ),
                params: Vec::new(),
                rows: None,
            });
        }
        Kind::Insert if columns.is_empty() => {
            for _ in &rows {
                applies.push(Apply {
                    sql: format!("INSERT INTO {table} DEFAULT VALUES"),
                    params: Vec::new(),
                    rows: Some(1),
                });
            }
        }
        Kind::Insert => {
            let listed = column_list(&columns);
            let mut rows = rows.into_iter().peekable();
            while rows.peek().is_some() {
                let chunk: Vec<Vec<Option<String>>> = rows.by_ref().take(ROWS_PER_STATEMENT).collect();
                applies.push(Apply {
                    // OVERRIDING SYSTEM VALUE: an identity column takes the leader's value.
                    sql: format!(
                        "INSERT INTO {table} ({listed}) OVERRIDING SYSTEM VALUE VALUES {}",
                        placeholder_rows(chunk.len(), width)
                    ),
                    rows: Some(chunk.len() as u64),
                    params: chunk.into_iter().flatten().map(param).collect(),
                });
            }
        }
        Kind::Update => {
            let set: Vec<String> = columns
                .iter()
                .enumerate()
                .map(|(i, column)| format!("{} = ${}", quoted(column), i + 1))
                .collect();
            let set = set.join(", ");
            for mut row in rows {
                // Parameters: the new values, then the key's (those not NULL).
                let new_values = row.split_off(key.len());
                let condition = key_condition(&key, &row, columns.len() + 1);
                applies.push(Apply {
                    sql: format!("UPDATE {table} SET {set} WHERE {condition}"),
                    params: new_values
                        .into_iter()
                        .chain(row.into_iter().flatten().map(Some))
                        .map(param)
                        .collect(),
                    rows: Some(1),
                });
            }
        }
        Kind::Delete if rows.iter().flatten().any(|value| value.is_none()) => {
            for row in rows {
                applies.push(Apply {
                    sql: format!("DELETE FROM {table} WHERE {}", key_condition(&key, &row, 1)),
                    params: row.into_iter().flatten().map(Some).map(param).collect(),
                    rows: Some(1),
                });
            }
        }
        Kind::Delete => {
            let target = match key.as_slice() {
                [one] => quoted(one),
                _ => format!("({})", column_list(&key)),
            };
            let mut rows = rows.into_iter().peekable();
            while rows.peek().is_some() {
                let chunk: Vec<Vec<Option<String>>> = rows.by_ref().take(ROWS_PER_STATEMENT).collect();
                let list = match key.len() {
                    1 => (1..=chunk.len())
                        .map(|n| format!("${n}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    _ => placeholder_rows(chunk.len(), width),
                };
                applies.push(Apply {
                    sql: format!("DELETE FROM {table} WHERE {target} IN ({list})"),
                    rows: Some(chunk.len() as u64),
                    params: chunk.into_iter().flatten().map(param).collect(),
                });
            }
        }
    }
    applies
}

/// The error a replica reports when a change does not find its row as the leader left it.
pub fn diverged(sql: &str, expected: u64, changed: u64) -> SqlError {
    SqlError::new(
        "XX001",
        format!("a write-set's `{sql}` changed {changed} rows where the leader changed {expected}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str) -> Table {
        Table {
            schema: "public".into(),
            name: name.into(),
        }
    }

    fn text(column: &str, value: &str) -> DecodedField {
        DecodedField {
            column: column.into(),
            datum: Datum::Text(value.into()),
        }
    }

    #[test]
    fn test_decoding_lines_parse_with_quotes_arrays_and_nulls() {
        assert_eq!(parse_line("BEGIN 745").unwrap(), Line::Begin);
        assert_eq!(parse_line("COMMIT").unwrap(), Line::Commit);
        let line = "table public.\"Odd \"\"T\"\"\": INSERT: id[integer]:1 \"Name\"[text]:'it''s ok' \
                    tags[text[]]:'{a,b}' flag[boolean]:true b[bit]:B'101' n[numeric]:null";
        assert_eq!(
            parse_line(line).unwrap(),
            Line::Insert {
                table: table("Odd \"T\""),
                new: vec![
                    text("id", "1"),
                    text("Name", "it's ok"),
                    text("tags", "{a,b}"),
                    text("flag", "true"),
                    text("b", "101"),
                    DecodedField {
                        column: "n".into(),
                        datum: Datum::Null
                    },
                ],
            }
        );
        let update = "table public.t: UPDATE: old-key: id[integer]:1 new-tuple: id[integer]:2 \
                      v[character varying]:' new-tuple: x' big[text]:unchanged-toast-datum";
        let Line::Update { old_key, new, .. } = parse_line(update).unwrap() else {
            panic!("an update");
        };
        assert_eq!(old_key, Some(vec![text("id", "1")]));
        assert_eq!(new[1], text("v", " new-tuple: x"));
        assert_eq!(new[2].datum, Datum::UnchangedToast);
        assert_eq!(
            parse_line("table public.a, public.b: TRUNCATE: restart_seqs cascade").unwrap(),
            Line::Truncate {
                tables: vec![table("a"), table("b")],
                restart_identity: true,
                cascade: true
            }
        );
        assert_eq!(
            parse_line("table public.t: DELETE: (no-tuple-data)").unwrap(),
            Line::Delete {
                table: table("t"),
                old: Vec::new()
            }
        );
        for bad in [
            "table public.t: INSERT: id[integer]:'1",
            "table public.t: INSERT: id[integer",
            "table public.t: UPSERT: id[integer]:1",
            "table t: INSERT:",
            "table public.\"t: INSERT:",
            "table public.t: INSERT: id[integer]:",
            "something else",
        ] {
            assert!(parse_line(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn updates_find_their_row_by_key_and_skip_generated_and_untouched_columns() {
        let info = TableInfo {
            key: vec!["id".into()],
            generated: vec!["total".into()],
            identity_always: vec!["n".into()],
        };
        let line = parse_line(
            "table public.t: UPDATE: id[integer]:7 v[text]:'x' total[integer]:9 big[text]:unchanged-toast-datum \
             n[integer]:3",
        )
        .unwrap();
        let change = resolve(line, &info).unwrap();
        let applies = statements(group(vec![change]).remove(0));
        let apply = &applies[0];
        assert_eq!(
            apply.sql,
            "UPDATE \"public\".\"t\" SET \"id\" = $1, \"v\" = $2 WHERE \"id\" = $3 AND \"n\" = $4"
        );
        assert_eq!(
            apply.params,
            ["7", "x", "7", "3"].map(|v| Value::Text(v.into())).to_vec()
        );
        let keyless = parse_line("table public.t: DELETE: (no-tuple-data)").unwrap();
        assert!(resolve(keyless, &TableInfo::default()).is_err());
    }

    fn field(column: &str, value: Option<&str>) -> Field {
        Field {
            column: column.into(),
            value: value.map(String::from),
        }
    }

    #[test]
    fn consecutive_changes_of_one_shape_apply_in_one_statement() {
        let insert = |k: &str| Change::Insert {
            table: table("t"),
            row: vec![field("k", Some(k)), field("v", None)],
        };
        let delete = |k: &str| Change::Delete {
            table: table("t"),
            key: vec![field("k", Some(k))],
        };
        let groups = group(vec![insert("1"), insert("2"), delete("1"), delete("2"), insert("3")]);
        assert_eq!(groups.len(), 3);
        let sqls: Vec<(String, Vec<Value>, Option<u64>)> = groups
            .into_iter()
            .flat_map(statements)
            .map(|apply| (apply.sql, apply.params, apply.rows))
            .collect();
        let text = |v: &str| Value::Text(v.into());
        assert_eq!(
            sqls,
            vec![
                (
                    "INSERT INTO \"public\".\"t\" (\"k\", \"v\") OVERRIDING SYSTEM VALUE VALUES ($1, $2), ($3, $4)"
                        .into(),
                    vec![text("1"), Value::Null, text("2"), Value::Null],
                    Some(2)
                ),
                (
                    "DELETE FROM \"public\".\"t\" WHERE \"k\" IN ($1, $2)".into(),
                    vec![text("1"), text("2")],
                    Some(2)
                ),
                (
                    "INSERT INTO \"public\".\"t\" (\"k\", \"v\") OVERRIDING SYSTEM VALUE VALUES ($1, $2)".into(),
                    vec![text("3"), Value::Null],
                    Some(1)
                ),
            ]
        );
    }

    #[test]
    fn write_sets_round_trip_and_reject_damage() {
        let changes = vec![
            Change::Insert {
                table: table("t"),
                row: vec![field("a", Some("1")), field("b", None)],
            },
            Change::Update {
                table: table("t"),
                key: vec![field("a", Some("1"))],
                row: vec![field("b", Some("x"))],
            },
            Change::Delete {
                table: table("t"),
                key: vec![field("a", Some("2"))],
            },
            Change::Truncate {
                tables: vec![table("u")],
                restart_identity: false,
                cascade: true,
            },
        ];
        let groups = group(changes);
        let bytes = encode(&groups);
        assert_eq!(decode(&bytes).unwrap(), groups);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_kind = bytes.clone();
        bad_kind[8] = 9;
        assert_eq!(decode(&bad_kind), Err(DecodeError::Tag(9)));
        let keyless_delete = Group {
            kind: Kind::Delete,
            tables: vec![table("t")],
            key: Vec::new(),
            columns: Vec::new(),
            rows: Vec::new(),
        };
        assert!(matches!(
            decode(&encode(&[keyless_delete])),
            Err(DecodeError::Malformed(_))
        ));
        // Rows of no columns claimed by the billion (the fuzzer's out-of-memory input): each row
        // takes a byte, so the count runs out of input at once.
        let mut endless = encode(&[Group {
            kind: Kind::Insert,
            tables: vec![table("t")],
            key: Vec::new(),
            columns: Vec::new(),
            rows: Vec::new(),
        }]);
        let count_at = endless.len() - 4;
        endless[count_at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&endless), Err(DecodeError::Truncated(_))));
    }
}
