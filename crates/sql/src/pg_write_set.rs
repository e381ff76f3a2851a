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

    /// An identifier as `quote_identifier` prints it: plain, or in double quotes (doubled inside).
    fn identifier(&mut self, ends: &[char]) -> Result<String, String> {
        if let Some(quoted) = self.rest.strip_prefix('"') {
            let mut name = String::new();
            let mut chars = quoted.char_indices();
            while let Some((at, c)) = chars.next() {
                if c != '"' {
                    name.push(c);
                    continue;
                }
                if quoted[at + 1..].starts_with('"') {
                    name.push('"');
                    chars.next();
                    continue;
                }
                self.rest = &quoted[at + 1..];
                return Ok(name);
            }
            return Err("an identifier's quotes do not close".into());
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
        if let Some(quoted) = self.rest.strip_prefix('\'') {
            let mut text = String::new();
            let mut chars = quoted.char_indices();
            while let Some((at, c)) = chars.next() {
                if c != '\'' {
                    text.push(c);
                    continue;
                }
                if quoted[at + 1..].starts_with('\'') {
                    text.push('\'');
                    chars.next();
                    continue;
                }
                self.rest = &quoted[at + 1..];
                return Ok(Datum::Text(text));
            }
            return Err("a quoted value does not close".into());
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

const MAGIC: &[u8; 4] = b"PGW1";

fn put_table(out: &mut Vec<u8>, table: &Table) {
    put_bytes(out, table.schema.as_bytes());
    put_bytes(out, table.name.as_bytes());
}

fn put_fields(out: &mut Vec<u8>, fields: &[Field]) {
    put_len(out, fields.len());
    for field in fields {
        put_bytes(out, field.column.as_bytes());
        match &field.value {
            None => out.push(0),
            Some(text) => {
                out.push(1);
                put_bytes(out, text.as_bytes());
            }
        }
    }
}

pub fn encode(changes: &[Change]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * changes.len() + 8);
    out.extend_from_slice(MAGIC);
    put_len(&mut out, changes.len());
    for change in changes {
        match change {
            Change::Insert { table, row } => {
                out.push(1);
                put_table(&mut out, table);
                put_fields(&mut out, row);
            }
            Change::Update { table, key, row } => {
                out.push(2);
                put_table(&mut out, table);
                put_fields(&mut out, key);
                put_fields(&mut out, row);
            }
            Change::Delete { table, key } => {
                out.push(3);
                put_table(&mut out, table);
                put_fields(&mut out, key);
            }
            Change::Truncate {
                tables,
                restart_identity,
                cascade,
            } => {
                out.push(4);
                put_len(&mut out, tables.len());
                for table in tables {
                    put_table(&mut out, table);
                }
                out.push(u8::from(*restart_identity) | u8::from(*cascade) << 1);
            }
        }
    }
    out
}

fn read_table(r: &mut Reader) -> Result<Table, DecodeError> {
    Ok(Table {
        schema: r.text()?,
        name: r.text()?,
    })
}

fn read_fields(r: &mut Reader, input_len: usize) -> Result<Vec<Field>, DecodeError> {
    let count = r.len()?;
    // A field takes at least 5 bytes: a count never reserves more than the input holds.
    let mut fields = Vec::with_capacity(count.min(input_len / 5));
    for _ in 0..count {
        let column = r.text()?;
        let value = match r.take(1)?[0] {
            0 => None,
            1 => Some(r.text()?),
            tag => return Err(DecodeError::Tag(tag)),
        };
        fields.push(Field { column, value });
    }
    Ok(fields)
}

/// Reads what `encode` wrote; an error (never a panic) for anything else.
pub fn decode(bytes: &[u8]) -> Result<Vec<Change>, DecodeError> {
    let mut r = Reader::new(bytes);
    if r.take(4)? != MAGIC {
        return Err(DecodeError::Magic);
    }
    let count = r.len()?;
    let mut changes = Vec::with_capacity(count.min(bytes.len()));
    for _ in 0..count {
        changes.push(match r.take(1)?[0] {
            1 => Change::Insert {
                table: read_table(&mut r)?,
                row: read_fields(&mut r, bytes.len())?,
            },
            2 => Change::Update {
                table: read_table(&mut r)?,
                key: read_fields(&mut r, bytes.len())?,
                row: read_fields(&mut r, bytes.len())?,
            },
            3 => Change::Delete {
                table: read_table(&mut r)?,
                key: read_fields(&mut r, bytes.len())?,
            },
            4 => {
                let count = r.len()?;
                let mut tables = Vec::with_capacity(count.min(bytes.len() / 8));
                for _ in 0..count {
                    tables.push(read_table(&mut r)?);
                }
                let flags = r.take(1)?[0];
                if flags > 3 {
                    return Err(DecodeError::Tag(flags));
                }
                Change::Truncate {
                    tables,
                    restart_identity: flags & 1 != 0,
                    cascade: flags & 2 != 0,
                }
            }
            tag => return Err(DecodeError::Tag(tag)),
        });
    }
    r.finished()?;
    Ok(changes)
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A statement that applies a change, its parameters, and how many rows it must change (None:
/// any number).
pub struct Apply {
    pub sql: String,
    pub params: Vec<Value>,
    pub rows: Option<u64>,
}

fn param(value: &Option<String>) -> Value {
    value.clone().map_or(Value::Null, Value::Text)
}

/// `"k1" = $n AND …` for a key, its parameters numbered from `first`.
fn key_condition(key: &[Field], first: usize, params: &mut Vec<Value>) -> String {
    let mut next = first;
    key.iter()
        .map(|field| match &field.value {
            None => format!("{} IS NULL", quoted(&field.column)),
            Some(_) => {
                params.push(param(&field.value));
                next += 1;
                format!("{} = ${}", quoted(&field.column), next - 1)
            }
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The statement that applies `change` on a replica; None if it changes nothing (an update
/// whose only new values were left out of the WAL).
pub fn statement(change: &Change) -> Option<Apply> {
    Some(match change {
        Change::Insert { table, row } => {
            let columns: Vec<String> = row.iter().map(|field| quoted(&field.column)).collect();
            let placeholders: Vec<String> = (1..=row.len()).map(|n| format!("${n}")).collect();
            Apply {
                // OVERRIDING SYSTEM VALUE: an identity column takes the leader's value.
                sql: format!(
                    "INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE VALUES ({})",
                    table.quoted(),
                    columns.join(", "),
                    placeholders.join(", ")
                ),
                params: row.iter().map(|field| param(&field.value)).collect(),
                rows: Some(1),
            }
        }
        Change::Update { table, key, row } => {
            if row.is_empty() {
                return None;
            }
            let mut params: Vec<Value> = row.iter().map(|field| param(&field.value)).collect();
            let set: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, field)| format!("{} = ${}", quoted(&field.column), i + 1))
                .collect();
            let condition = key_condition(key, row.len() + 1, &mut params);
            Apply {
                sql: format!("UPDATE {} SET {} WHERE {condition}", table.quoted(), set.join(", ")),
                params,
                rows: Some(1),
            }
        }
        Change::Delete { table, key } => {
            let mut params = Vec::with_capacity(key.len());
            let condition = key_condition(key, 1, &mut params);
            Apply {
                sql: format!("DELETE FROM {} WHERE {condition}", table.quoted()),
                params,
                rows: Some(1),
            }
        }
        Change::Truncate {
            tables,
            restart_identity,
            cascade,
        } => {
            let names: Vec<String> = tables.iter().map(Table::quoted).collect();
            Apply {
                sql: format!(
                    "TRUNCATE {}{}{}",
                    names.join(", "),
                    if *restart_identity { " RESTART IDENTITY" } else { "" },
                    if *cascade { " CASCADE" } else { "" }
                ),
                params: Vec::new(),
                rows: None,
            }
        }
    })
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
        let apply = statement(&change).unwrap();
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

    #[test]
    fn write_sets_round_trip_and_reject_damage() {
        let changes = vec![
            Change::Insert {
                table: table("t"),
                row: vec![
                    Field {
                        column: "a".into(),
                        value: Some("1".into()),
                    },
                    Field {
                        column: "b".into(),
                        value: None,
                    },
                ],
            },
            Change::Delete {
                table: table("t"),
                key: vec![Field {
                    column: "a".into(),
                    value: Some("2".into()),
                }],
            },
            Change::Truncate {
                tables: vec![table("u")],
                restart_identity: false,
                cascade: true,
            },
        ];
        let bytes = encode(&changes);
        assert_eq!(decode(&bytes).unwrap(), changes);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_tag = bytes.clone();
        bad_tag[8] = 9;
        assert_eq!(decode(&bad_tag), Err(DecodeError::Tag(9)));
    }
}
