//! Conflict classes, the ground hybrid replication (issue 16) stands on: an operator names, per
//! table, the column whose value is a row's class (TPC-C: the warehouse —
//! `warehouse.w_id,district.d_w_id,…`), and each transaction is labelled, from its statements'
//! text and parameters, with the classes it touches — or as global when a statement's classes
//! cannot be told from them.
//!
//! A label must never miss a class its transaction touches, so whatever is unclear is global: a
//! ruled table named more often than its class column is pinned to a value (`column = value`,
//! the value a parameter or a literal), two ruled tables of one statement sharing a class
//! column's name, `OR` or `NOT` anywhere in a statement, a write to a table without a rule,
//! an INSERT with a computed class (or without a column list where the database cannot say
//! which columns its rows fill), an UPDATE setting a class to a
//! computed value, any other write (schema changes, `COPY`, `MERGE`, `ON CONFLICT`). Ruled
//! tables reached only through a view or a function are not seen: rules name what statements
//! name.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;
use std::sync::Arc;

use crate::text::{tokenize, StatementKind, Token, TokenKind};
use crate::txn::Value;

/// Per table (lower-cased), the column (lower-cased) whose value is a row's class.
#[derive(Debug, Clone, Default)]
pub struct ClassRules {
    columns: HashMap<String, String>,
}

impl ClassRules {
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }
}

impl FromStr for ClassRules {
    type Err = String;

    /// `table.column,table.column,…`; empty: no rules.
    fn from_str(text: &str) -> Result<ClassRules, String> {
        let mut columns = HashMap::new();
        for rule in text.split(',').map(str::trim).filter(|rule| !rule.is_empty()) {
            let (table, column) = rule
                .split_once('.')
                .ok_or_else(|| format!("'{rule}' is not table.column"))?;
            for name in [table, column] {
                let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && name.bytes().next().is_some_and(|b| !b.is_ascii_digit());
                if !plain {
                    return Err(format!("'{name}' in '{rule}' is not a plain table or column name"));
                }
            }
            if columns
                .insert(table.to_ascii_lowercase(), column.to_ascii_lowercase())
                .is_some()
            {
                return Err(format!("table '{table}' has two rules"));
            }
        }
        Ok(ClassRules { columns })
    }
}

/// Which of `nodes` nodes (in id order) owns `class` and executes its transactions: an integer
/// class by its value modulo the count (consecutive warehouses spread evenly), any other by a
/// hash of its text (FNV-1a: the same on every node and in every build).
pub fn owner_index(class: &str, nodes: usize) -> usize {
    placement(class, nodes).0
}

/// Which of the `voters` (node ids, sorted) owns `class` while the nodes in `down` are taken for
/// down (the log said so, see `writer::Ownership`): the voter at its place by `owner_index` if
/// that one is up, else one of the voters up, spread evenly (an integer class by its value's
/// quotient by the voter count, any other by its hash), so a down node's classes do not all
/// land on one survivor. A membership change moves classes by changing `voters`.
pub fn owner_among(class: &str, voters: &[u64], down: &BTreeSet<u64>) -> u64 {
    let (place, spread) = placement(class, voters.len());
    let owner = voters[place];
    if !down.contains(&owner) {
        return owner;
    }
    let up: Vec<u64> = voters.iter().copied().filter(|node| !down.contains(node)).collect();
    if up.is_empty() {
        return owner;
    }
    up[(spread % up.len() as u64) as usize]
}

/// A class's owner among `nodes`, and what is left of its value or hash for spreading it.
fn placement(class: &str, nodes: usize) -> (usize, u64) {
    assert!(nodes > 0, "a cluster has a node");
    let n = nodes as u64;
    match class.parse::<i64>() {
        Ok(value) => (
            value.rem_euclid(nodes as i64) as usize,
            value.div_euclid(nodes as i64).unsigned_abs(),
        ),
        Err(_) => {
            let hash = class.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
            });
            ((hash % n) as usize, hash / n)
        }
    }
}

/// The classes a transaction touches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Label {
    pub classes: BTreeSet<String>,
    /// Some statement's classes could not be told: it may touch any.
    pub global: bool,
}

impl Label {
    pub fn global() -> Label {
        Label {
            classes: BTreeSet::new(),
            global: true,
        }
    }

    /// Adds what another statement of the transaction touches.
    pub fn join(&mut self, other: Label) {
        if self.global {
            return;
        }
        if other.global {
            *self = Label::global();
        } else {
            self.classes.extend(other.classes);
        }
    }

    /// What `kind` names, for metrics: no ruled table, one class, several, or global.
    pub const KINDS: [&'static str; 4] = ["none", "one", "several", "global"];

    /// Which of `KINDS` this label is.
    pub fn kind_index(&self) -> usize {
        match (self.global, self.classes.len()) {
            (true, _) => 3,
            (false, 0) => 0,
            (false, 1) => 1,
            (false, _) => 2,
        }
    }

    pub fn kind(&self) -> &'static str {
        Self::KINDS[self.kind_index()]
    }
}

/// Where a statement's class value comes from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// The n-th parameter (from 1).
    Param(usize),
    Literal(String),
}

/// A statement's labelling, from its text alone.
#[derive(Debug, PartialEq)]
enum Template {
    Global,
    /// Empty: it touches no ruled table.
    Classes(Vec<Source>),
}

/// What the labeller asks the database about an INSERT without a column list.
pub trait Schema {
    /// A number that changes whenever the schema does; None: the database cannot say.
    fn version(&mut self) -> Option<u64>;
    /// The columns (lower-cased) an INSERT without a column list fills into `table`, in order;
    /// None if there is no such table or the database cannot say.
    fn insert_columns(&mut self, table: &str) -> Option<Vec<String>>;
}

/// A schema that cannot say anything: an INSERT without a column list is global.
pub struct NoSchema;

impl Schema for NoSchema {
    fn version(&mut self) -> Option<u64> {
        None
    }

    fn insert_columns(&mut self, _table: &str) -> Option<Vec<String>> {
        None
    }
}

/// A text's template, and the schema version it was read against if it depends on the schema.
struct Memo {
    template: Arc<Template>,
    schema_version: Option<u64>,
}

/// Texts' templates kept at most; beyond, the memo starts over (texts with values written in
/// come once).
const TEMPLATES_KEPT: usize = 10_000;

/// Labels statements by `rules`, remembering each text's template (the writer owns it).
pub struct Labeller {
    rules: ClassRules,
    templates: HashMap<String, Memo>,
}

impl Labeller {
    pub fn new(rules: ClassRules) -> Labeller {
        Labeller {
            rules,
            templates: HashMap::new(),
        }
    }

    /// What statement `sql` (of kind `kind`) touches with `params`; `schema` places an INSERT's
    /// class column when the statement names no columns.
    pub fn label(&mut self, sql: &str, kind: StatementKind, params: &[Value], schema: &mut dyn Schema) -> Label {
        if !matches!(kind, StatementKind::Read | StatementKind::Write) {
            return Label::default();
        }
        let memo = self.templates.get(sql).filter(|memo| {
            // A template read against the schema holds while the schema does.
            memo.schema_version.is_none() || memo.schema_version == schema.version()
        });
        let template = match memo {
            Some(memo) => memo.template.clone(),
            None => {
                if self.templates.len() >= TEMPLATES_KEPT {
                    self.templates.clear();
                }
                let mut schema_version = None;
                let template = Arc::new(template(
                    &self.rules,
                    sql,
                    kind == StatementKind::Write,
                    schema,
                    &mut schema_version,
                ));
                let memo = Memo {
                    template: template.clone(),
                    schema_version,
                };
                self.templates.insert(sql.to_owned(), memo);
                template
            }
        };
        let Template::Classes(sources) = &*template else {
            return Label::global();
        };
        let mut label = Label::default();
        for source in sources {
            let class = match source {
                Source::Literal(text) => text.clone(),
                Source::Param(n) => match params.get(n - 1) {
                    Some(Value::Integer(i)) => i.to_string(),
                    Some(Value::Text(text)) => text.clone(),
                    Some(Value::Real(r)) => r.to_string(),
                    // No class (NULL), or one that is not text.
                    Some(Value::Null | Value::Blob(_)) | None => return Label::global(),
                },
            };
            label.classes.insert(class);
        }
        label
    }
}

/// A table or column name as rules spell them: unquoted names fold to lower case.
fn name_of(token: &Token) -> Option<String> {
    match token.kind {
        TokenKind::Word => Some(token.text.to_ascii_lowercase()),
        TokenKind::QuotedName => Some(token.text[1..token.text.len() - 1].to_owned()),
        _ => None,
    }
}

fn is(token: Option<&Token>, text: &str) -> bool {
    token.is_some_and(|t| t.text.eq_ignore_ascii_case(text))
}

/// The labelling of one statement's text; `schema_version` is set to the version of the
/// schema read for it, if one was.
fn template(
    rules: &ClassRules,
    sql: &str,
    writes: bool,
    schema: &mut dyn Schema,
    schema_version: &mut Option<u64>,
) -> Template {
    let Ok(tokens) = tokenize(sql) else {
        return Template::Global;
    };
    let tokens: Vec<Token> = tokens.into_iter().filter(|t| t.kind != TokenKind::Gap).collect();
    if tokens
        .iter()
        .any(|t| ["OR", "NOT"].iter().any(|w| t.text.eq_ignore_ascii_case(w)))
    {
        return Template::Global;
    }
    let params = number_parameters(&tokens);
    let verb = tokens.first().map(|t| t.text.to_ascii_uppercase()).unwrap_or_default();
    let target = if writes {
        match write_target(&tokens, &verb) {
            Some(table) if rules.columns.contains_key(&table) => Some(table),
            _ => return Template::Global,
        }
    } else {
        None
    };
    if writes && tokens.iter().any(|t| t.text.eq_ignore_ascii_case("CONFLICT")) {
        return Template::Global;
    }
    // Every ruled table the statement names, and how often.
    let mut named: Vec<(String, usize)> = Vec::new();
    for (at, token) in tokens.iter().enumerate() {
        let Some(name) = name_of(token) else { continue };
        // `table.` qualifies a column (the table is named where it is read).
        if !rules.columns.contains_key(&name) || is(tokens.get(at + 1), ".") {
            continue;
        }
        match named.iter_mut().find(|(table, _)| *table == name) {
            Some((_, count)) => *count += 1,
            None => named.push((name, 1)),
        }
    }
    let mut sources = Vec::new();
    for (at, (table, times)) in named.iter().enumerate() {
        let column = &rules.columns[table];
        if named[..at].iter().any(|(other, _)| &rules.columns[other] == column) {
            return Template::Global;
        }
        let Some(pins) = equalities(&tokens, &params, column) else {
            return Template::Global;
        };
        // An INSERT's target is named once more than it is read.
        let inserting = target.as_deref() == Some(table.as_str()) && verb == "INSERT";
        if pins.values.len() + pins.columns.len() < times - usize::from(inserting) {
            return Template::Global;
        }
        let Some(mut pinned) = resolve(&tokens, &params, rules, column, pins) else {
            return Template::Global;
        };
        if pinned.is_empty() && *times > usize::from(inserting) {
            return Template::Global;
        }
        if inserting {
            match inserted(&tokens, &params, column, rules, schema, schema_version) {
                Some(found) => pinned.extend(found),
                None => return Template::Global,
            }
        }
        sources.extend(pinned);
    }
    Template::Classes(sources)
}

/// For each parameter token, its number: `$n` and `?n` say it, a bare `?` is the next one,
/// named ones (`:name`, `@name`) have none.
fn number_parameters(tokens: &[Token]) -> Vec<Option<usize>> {
    let mut next = 0;
    tokens
        .iter()
        .map(|t| {
            if t.kind != TokenKind::Parameter {
                return None;
            }
            if t.text == "?" {
                next += 1;
                return Some(next);
            }
            let number = t.text.strip_prefix(['$', '?'])?.parse().ok().filter(|&n| n >= 1)?;
            next = next.max(number);
            Some(number)
        })
        .collect()
}

/// The table an INSERT, UPDATE or DELETE writes (`None` for any other write).
fn write_target(tokens: &[Token], verb: &str) -> Option<String> {
    let keyword = match verb {
        "INSERT" => "INTO",
        "UPDATE" => "UPDATE",
        "DELETE" => "FROM",
        _ => return None,
    };
    let mut at = tokens.iter().position(|t| t.text.eq_ignore_ascii_case(keyword))? + 1;
    if is(tokens.get(at), "ONLY") {
        at += 1;
    }
    if is(tokens.get(at + 1), ".") {
        at += 2;
    }
    name_of(tokens.get(at)?)
}

/// The value at `at` if it is a parameter or a literal (a cast after it changes no class):
/// where it comes from, and the index after it.
fn simple_value(tokens: &[Token], params: &[Option<usize>], at: usize) -> Option<(Source, usize)> {
    let token = tokens.get(at)?;
    let source = match token.kind {
        TokenKind::Parameter => Source::Param(params[at]?),
        TokenKind::Number => Source::Literal(token.text.to_owned()),
        // Not a dollar-quoted string: its quotes are tags.
        TokenKind::String if token.text.starts_with('\'') => {
            Source::Literal(token.text[1..token.text.len() - 1].replace("''", "'"))
        }
        _ => return None,
    };
    let mut after = at + 1;
    // `::type` tokenizes as ':' and a named parameter.
    while is(tokens.get(after), ":") && tokens.get(after + 1).is_some_and(|t| t.text.starts_with(':')) {
        after += 2;
    }
    Some((source, after))
}

/// Whether the token at `at` ends an operand: nothing binds tighter after it.
fn ends_operand(tokens: &[Token], at: usize) -> bool {
    match tokens.get(at) {
        None => true,
        Some(t) if t.kind == TokenKind::Punct => matches!(t.text, ")" | "," | ";"),
        Some(t) => t.kind == TokenKind::Word,
    }
}

/// What a class column is equated with in a statement.
#[derive(Debug, Default)]
struct Pins {
    values: Vec<Source>,
    /// Other columns (`c_w_id = w_id`): pinned to whatever those are.
    columns: Vec<String>,
}

/// Whether an operand starting at `start` stands alone as a condition's or an assignment's
/// side: after WHERE, AND, ON or SET (or a parenthesis opened right after one), or after a
/// comma of a SET list — not inside a CASE, a function's arguments or an arithmetic expression.
fn stands_alone(tokens: &[Token], start: usize) -> bool {
    let case_depth = tokens[..start].iter().fold(0i32, |depth, t| {
        if t.text.eq_ignore_ascii_case("CASE") {
            depth + 1
        } else if t.text.eq_ignore_ascii_case("END") {
            depth - 1
        } else {
            depth
        }
    });
    if case_depth > 0 || start == 0 {
        return false;
    }
    let keyword = |at: usize| {
        ["WHERE", "AND", "ON", "SET"]
            .iter()
            .any(|k| tokens[at].text.eq_ignore_ascii_case(k))
    };
    match tokens[start - 1].text {
        "(" => start >= 2 && keyword(start - 2),
        "," => true,
        _ => keyword(start - 1),
    }
}

/// The column name at `at` (qualified or not) and where its operand starts, if it is one.
fn column_at(tokens: &[Token], at: usize) -> Option<(String, usize)> {
    let name = name_of(tokens.get(at)?)?;
    if is(tokens.get(at + 1), ".") {
        return None;
    }
    let start = if at >= 2 && is(tokens.get(at - 1), ".") {
        at - 2
    } else {
        at
    };
    Some((name, start))
}

/// Every `column = value`, `value = column` and `column = other_column` in the statement, each
/// side an operand of its own; `None` if the statement assigns `column` a computed value (an
/// UPDATE moving rows to a class it cannot tell).
fn equalities(tokens: &[Token], params: &[Option<usize>], column: &str) -> Option<Pins> {
    let mut pins = Pins::default();
    for at in 0..tokens.len() {
        let Some((name, start)) = column_at(tokens, at) else {
            continue;
        };
        if name != column {
            continue;
        }
        if is(tokens.get(at + 1), "=") && stands_alone(tokens, start) {
            // `column = …`: a value or a column, ending the operand.
            let value = simple_value(tokens, params, at + 2).filter(|&(_, after)| ends_operand(tokens, after));
            let other = (at + 2..(at + 5).min(tokens.len()))
                .find_map(|end| {
                    column_at(tokens, end)
                        .filter(|&(_, start)| start == at + 2)
                        .map(|(n, _)| (n, end))
                })
                .filter(|&(_, end)| ends_operand(tokens, end + 1));
            match (value, other) {
                (Some((source, _)), _) => pins.values.push(source),
                (None, Some((other, _))) => pins.columns.push(other),
                _ if assigned(tokens, at) => return None,
                _ => {}
            }
        } else if start >= 2 && is(tokens.get(start - 1), "=") && ends_operand(tokens, at + 1) {
            // `… = column`: a value or a column standing alone before the `=`.
            let before = start - 2;
            match simple_value(tokens, params, before) {
                Some((source, after)) if after == start - 1 && stands_alone(tokens, before) => pins.values.push(source),
                Some(_) => {}
                None => {
                    if let Some((other, other_start)) = column_at(tokens, before) {
                        if stands_alone(tokens, other_start) {
                            pins.columns.push(other);
                        }
                    }
                }
            }
        }
    }
    Some(pins)
}

/// `column`'s values: its own pins and, through equated class columns, theirs.
fn resolve(
    tokens: &[Token],
    params: &[Option<usize>],
    rules: &ClassRules,
    column: &str,
    pins: Pins,
) -> Option<Vec<Source>> {
    let mut values = pins.values;
    let mut seen = vec![column.to_owned()];
    let mut next: Vec<String> = pins.columns;
    while let Some(other) = next.pop() {
        if seen.contains(&other) || !rules.columns.values().any(|ruled| *ruled == other) {
            continue;
        }
        let pins = equalities(tokens, params, &other)?;
        values.extend(pins.values);
        next.extend(pins.columns);
        seen.push(other);
    }
    Some(values)
}

/// Whether `column` at `at` is assigned in an UPDATE's SET list (between SET and WHERE, outside
/// parentheses).
fn assigned(tokens: &[Token], at: usize) -> bool {
    let Some(set) = tokens.iter().position(|t| t.text.eq_ignore_ascii_case("SET")) else {
        return false;
    };
    if at < set {
        return false;
    }
    let mut depth = 0i32;
    for token in &tokens[set..at] {
        match token.text {
            "(" => depth += 1,
            ")" => depth -= 1,
            _ if depth == 0 && token.text.eq_ignore_ascii_case("WHERE") => return false,
            _ => {}
        }
    }
    depth == 0
}

/// The items of a parenthesised, comma-separated list opening at `open`: each item's token
/// range, and the index after the closing parenthesis.
fn list_items(tokens: &[Token], open: usize) -> Option<(Vec<(usize, usize)>, usize)> {
    if !is(tokens.get(open), "(") {
        return None;
    }
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = open + 1;
    for (at, token) in tokens.iter().enumerate().skip(open) {
        match token.text {
            "(" => depth += 1,
            ")" => {
                depth -= 1;
                if depth == 0 {
                    items.push((start, at));
                    return Some((items, at + 1));
                }
            }
            "," if depth == 1 => {
                items.push((start, at));
                start = at + 1;
            }
            _ => {}
        }
    }
    None
}

/// The classes an INSERT gives its rows: each VALUES row's value at the class column's place,
/// or, for INSERT … SELECT, the selected class column's pinned values. `None` if any cannot be
/// told.
fn inserted(
    tokens: &[Token],
    params: &[Option<usize>],
    column: &str,
    rules: &ClassRules,
    schema: &mut dyn Schema,
    schema_version: &mut Option<u64>,
) -> Option<Vec<Source>> {
    let into = tokens.iter().position(|t| t.text.eq_ignore_ascii_case("INTO"))?;
    let mut open = into + 2;
    if is(tokens.get(into + 2), ".") {
        open += 2;
    }
    // The class column's place in the rows: in the column list, or without one in the table's
    // columns as the schema has them now.
    let (place, after) = match list_items(tokens, open) {
        Some((columns, after)) => {
            let place = columns
                .iter()
                .position(|&(start, end)| end == start + 1 && name_of(&tokens[start]).as_deref() == Some(column))?;
            (place, after)
        }
        None => {
            let table = name_of(tokens.get(open - 1)?)?;
            // Whatever the schema says now (even that there is no such table) may change.
            *schema_version = Some(schema.version()?);
            let place = schema.insert_columns(&table)?.iter().position(|name| name == column)?;
            (place, open)
        }
    };
    if is(tokens.get(after), "VALUES") {
        let mut sources = Vec::new();
        let mut open = after + 1;
        loop {
            let (values, next) = list_items(tokens, open)?;
            let (start, end) = *values.get(place)?;
            match simple_value(tokens, params, start) {
                Some((source, after)) if after == end => sources.push(source),
                _ => return None,
            }
            if !is(tokens.get(next), ",") {
                return Some(sources);
            }
            open = next + 1;
        }
    }
    if !is(tokens.get(after), "SELECT") {
        return None;
    }
    // INSERT … SELECT: the item at the class column's place must be a literal, a parameter or
    // a ruled class column (whose equalities the statement's scan has already pinned).
    let from = (after..tokens.len()).find(|&i| tokens[i].text.eq_ignore_ascii_case("FROM"))?;
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = after + 1;
    for (at, token) in tokens.iter().enumerate().take(from).skip(after + 1) {
        match token.text {
            "(" => depth += 1,
            ")" => depth -= 1,
            "," if depth == 0 => {
                items.push((start, at));
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push((start, from));
    let (start, end) = *items.get(place)?;
    if let Some((source, after)) = simple_value(tokens, params, start) {
        return (after == end).then(|| vec![source]);
    }
    // A ruled class column selected: the classes its equalities pin.
    let selected = name_of(&tokens[start]).filter(|_| end == start + 1)?;
    if !rules.columns.values().any(|ruled| *ruled == selected) {
        return None;
    }
    let pins = equalities(tokens, params, &selected)?;
    resolve(tokens, params, rules, &selected, pins).filter(|pinned| !pinned.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn owners_spread_integer_classes_evenly_and_hash_the_others_alike_everywhere() {
        let per_node = (1..=12).fold([0; 3], |mut counts, w| {
            counts[super::owner_index(&w.to_string(), 3)] += 1;
            counts
        });
        assert_eq!(per_node, [4, 4, 4]);
        assert_eq!(super::owner_index("-1", 3), 2);
        assert_eq!(super::owner_index("north", 3), super::owner_index("north", 3));
        assert!(super::owner_index("north", 5) < 5);
    }

    #[test]
    fn a_down_nodes_classes_spread_over_the_nodes_up_and_the_others_stay() {
        let voters = [1, 2, 3];
        let down = BTreeSet::from([2]);
        let mut per_node = BTreeMap::new();
        for w in 1..=12 {
            let class = w.to_string();
            let owner = owner_among(&class, &voters, &down);
            let by_place = voters[owner_index(&class, 3)];
            if by_place == 2 {
                assert_ne!(owner, 2, "warehouse {w}");
            } else {
                assert_eq!(owner, by_place, "warehouse {w}");
            }
            *per_node.entry(owner).or_insert(0) += 1;
        }
        assert_eq!(per_node, BTreeMap::from([(1, 6), (3, 6)]));
        for class in ["north", "south", "east", "west"] {
            assert!(!down.contains(&owner_among(class, &voters, &down)), "{class}");
        }
        assert_eq!(
            owner_among("4", &voters, &BTreeSet::from([1, 2, 3])),
            2,
            "none up: as if all were"
        );
    }

    #[test]
    fn a_joining_voter_takes_its_share_of_the_classes_and_a_leaving_one_hands_its_share_on() {
        let count = |voters: &[u64]| {
            (1..=12).fold(BTreeMap::new(), |mut counts, w| {
                *counts
                    .entry(owner_among(&w.to_string(), voters, &BTreeSet::new()))
                    .or_insert(0) += 1;
                counts
            })
        };
        assert_eq!(count(&[1, 2, 3]), BTreeMap::from([(1, 4), (2, 4), (3, 4)]));
        assert_eq!(count(&[1, 2, 3, 7]), BTreeMap::from([(1, 3), (2, 3), (3, 3), (7, 3)]));
        assert_eq!(count(&[2, 7]), BTreeMap::from([(2, 6), (7, 6)]));
    }

    use super::*;
    use std::collections::BTreeMap;

    const TPCC_RULES: &str = "warehouse.w_id, district.d_w_id, customer.c_w_id, history.h_w_id, \
                              new_order.no_w_id, orders.o_w_id, order_line.ol_w_id, stock.s_w_id";

    fn labeller() -> Labeller {
        Labeller::new(TPCC_RULES.parse().unwrap())
    }

    #[track_caller]
    fn classes(label: &Label) -> Vec<&str> {
        assert!(!label.global, "{label:?}");
        label.classes.iter().map(String::as_str).collect()
    }

    fn write(sql: &str, params: &[i64]) -> Label {
        let params: Vec<Value> = params.iter().map(|&p| Value::Integer(p)).collect();
        labeller().label(sql, StatementKind::Write, &params, &mut NoSchema)
    }

    fn read(sql: &str, params: &[i64]) -> Label {
        let params: Vec<Value> = params.iter().map(|&p| Value::Integer(p)).collect();
        labeller().label(sql, StatementKind::Read, &params, &mut NoSchema)
    }

    #[test]
    fn rules_parse_and_bad_ones_say_why() {
        let rules: ClassRules = TPCC_RULES.parse().unwrap();
        assert_eq!(rules.columns["stock"], "s_w_id");
        assert!("".parse::<ClassRules>().unwrap().is_empty());
        for bad in [
            "stock",
            "stock.",
            ".s_w_id",
            "stock.s w",
            "1stock.s_w_id",
            "stock.a,stock.b",
        ] {
            assert!(bad.parse::<ClassRules>().is_err(), "{bad}");
        }
    }

    #[test]
    fn tpcc_statements_are_labelled_with_the_warehouses_they_touch() {
        let update = "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = $1 AND d_id = $2";
        assert_eq!(classes(&write(update, &[3, 7])), ["3"]);
        // A remote stock row: the supply warehouse ($5) besides the home one ($1).
        let line = "INSERT INTO order_line (ol_o_id, ol_d_id, ol_w_id, ol_number, ol_i_id, ol_supply_w_id, \
                    ol_quantity, ol_amount, ol_dist_info) VALUES \
                    ((SELECT d_next_o_id - 1 FROM district WHERE d_w_id = $1 AND d_id = $2), $2, $1, $3, $4, $5, $6, \
                    (SELECT i_price FROM item WHERE i_id = $4) * $6, \
                    (SELECT s_dist_01 FROM stock WHERE s_w_id = $5 AND s_i_id = $4))";
        assert_eq!(classes(&write(line, &[1, 2, 3, 4, 9, 6])), ["1", "9"]);
        let order = "INSERT INTO orders (o_id, o_d_id, o_w_id, o_c_id, o_entry_d, o_ol_cnt, o_all_local) \
                     SELECT d_next_o_id - 1, d_id, d_w_id, $3, $4, $5, $6 FROM district WHERE d_w_id = $1 AND d_id = $2";
        assert_eq!(classes(&write(order, &[2, 1, 5, 0, 10, 1])), ["2"]);
        let level = "SELECT count(DISTINCT s_i_id) FROM order_line, stock WHERE ol_w_id = $1 AND ol_d_id = $2 \
                     AND ol_o_id < (SELECT d_next_o_id FROM district WHERE d_w_id = $1 AND d_id = $2) \
                     AND ol_o_id >= (SELECT d_next_o_id - 20 FROM district WHERE d_w_id = $1 AND d_id = $2) \
                     AND s_w_id = $1 AND s_i_id = ol_i_id AND s_quantity < $3";
        assert_eq!(classes(&read(level, &[4, 1, 15])), ["4"]);
        // Pinned through the warehouse it is joined to.
        let customer = "SELECT c_discount, c_last, c_credit, w_tax FROM customer, warehouse \
                        WHERE w_id = $1 AND c_w_id = w_id AND c_d_id = $2 AND c_id = $3";
        assert_eq!(classes(&read(customer, &[5, 1, 2])), ["5"]);
        let joined = "SELECT * FROM customer c JOIN warehouse w ON w.w_id = c.c_w_id WHERE c.c_w_id = $1";
        assert_eq!(classes(&read(joined, &[6])), ["6"]);
        let item = "SELECT i_price, i_name, i_data FROM item WHERE i_id = $1";
        assert_eq!(read(item, &[5]).kind(), "none");
    }

    #[test]
    fn what_cannot_be_told_is_global() {
        for (sql, writes) in [
            // No class pinned, or not for every time the table is named.
            ("SELECT * FROM stock WHERE s_i_id = $1", false),
            (
                "SELECT * FROM stock WHERE s_i_id IN (SELECT s_i_id FROM stock WHERE s_w_id = $1)",
                false,
            ),
            ("SELECT * FROM district WHERE d_w_id = w_id", false),
            ("SELECT * FROM stock WHERE s_w_id = $1 + 1", false),
            ("SELECT * FROM stock WHERE s_w_id = $1 OR s_i_id = $2", false),
            ("SELECT * FROM stock WHERE NOT s_w_id = $1", false),
            // Writes Chorus cannot place.
            ("UPDATE item SET i_price = 1 WHERE i_id = $1", true),
            ("CREATE TABLE t (a int)", true),
            ("INSERT INTO stock VALUES ($1, $2)", true),
            ("INSERT INTO stock (s_i_id, s_w_id) VALUES ($1, $2 + 1)", true),
            ("INSERT INTO stock (s_i_id, s_w_id) SELECT i_id, i_id FROM item", true),
            (
                "INSERT INTO stock (s_i_id, s_w_id) SELECT s_i_id, s_w_id FROM stock",
                true,
            ),
            ("INSERT INTO stock (s_i_id, s_w_id) SELECT s_i_id, 2 FROM stock", true),
            ("SELECT * FROM stock WHERE s_w_id + 0 = $1", false),
            ("SELECT * FROM stock WHERE s_w_id = $$8$$", false),
            ("SELECT * FROM stock WHERE s_w_id = $0", false),
            ("SELECT * FROM stock WHERE 2 * s_w_id = $1", false),
            ("SELECT * FROM stock WHERE $1 = s_w_id * 2", false),
            (
                "SELECT * FROM stock WHERE CASE WHEN s_w_id = 1 THEN true ELSE true END",
                false,
            ),
            ("SELECT * FROM stock WHERE f(s_w_id = 1)", false),
            (
                "SELECT * FROM customer, warehouse WHERE c_w_id = w_id AND c_id = $1",
                false,
            ),
            (
                "INSERT INTO stock (s_i_id, s_w_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                true,
            ),
            ("UPDATE stock SET s_w_id = s_w_id + 1 WHERE s_w_id = $1", true),
        ] {
            let label = if writes {
                write(sql, &[1, 2])
            } else {
                read(sql, &[1, 2])
            };
            assert!(label.global, "{sql}: {label:?}");
        }
        let rules = "a.k, b.k".parse().unwrap();
        let shared = Labeller::new(rules).label(
            "SELECT * FROM a JOIN b ON a.x = b.x WHERE a.k = 1",
            StatementKind::Read,
            &[],
            &mut NoSchema,
        );
        assert!(shared.global, "two tables sharing a class column's name: {shared:?}");
    }

    #[test]
    fn literals_casts_quoted_names_and_bare_parameters_are_read() {
        let label = write(
            "INSERT INTO \"stock\" (s_i_id, \"s_w_id\") VALUES (?, ?), (7, '8')",
            &[1, 2],
        );
        assert_eq!(classes(&label), ["2", "8"]);
        let label = write(
            "UPDATE public.stock SET s_w_id = 5 WHERE s_w_id = $1::bigint AND s_i_id = $2",
            &[3, 9],
        );
        assert_eq!(classes(&label), ["3", "5"]);
        assert_eq!(classes(&read("SELECT * FROM stock s WHERE 6 = s.s_w_id", &[])), ["6"]);
        let null = labeller().label(
            "SELECT * FROM stock WHERE s_w_id = $1",
            StatementKind::Read,
            &[Value::Null],
            &mut NoSchema,
        );
        assert!(null.global);
    }

    /// A schema whose tables and version a test sets, counting how often it is asked.
    #[derive(Default)]
    struct FakeSchema {
        version: u64,
        tables: HashMap<String, Vec<String>>,
        asked: usize,
    }

    impl Schema for FakeSchema {
        fn version(&mut self) -> Option<u64> {
            Some(self.version)
        }

        fn insert_columns(&mut self, table: &str) -> Option<Vec<String>> {
            self.asked += 1;
            self.tables.get(table).cloned()
        }
    }

    #[test]
    fn an_insert_without_a_column_list_is_placed_by_the_schema_it_is_labelled_against() {
        let mut labeller = labeller();
        let mut schema = FakeSchema::default();
        let insert = "INSERT INTO stock VALUES ($1, $2), (7, 8)";
        let select = "INSERT INTO main.stock SELECT 3, w_id FROM warehouse WHERE w_id = $1";
        let label = |labeller: &mut Labeller, schema: &mut FakeSchema, sql: &str| {
            labeller.label(
                sql,
                StatementKind::Write,
                &[Value::Integer(1), Value::Integer(2)],
                schema,
            )
        };
        assert!(label(&mut labeller, &mut schema, insert).global, "no such table yet");
        schema.version = 1;
        schema
            .tables
            .insert("stock".into(), vec!["s_i_id".into(), "s_w_id".into()]);
        assert_eq!(classes(&label(&mut labeller, &mut schema, insert)), ["2", "8"]);
        assert_eq!(classes(&label(&mut labeller, &mut schema, select)), ["1"]);
        let asked = schema.asked;
        assert_eq!(classes(&label(&mut labeller, &mut schema, insert)), ["2", "8"]);
        assert_eq!(schema.asked, asked, "a template is kept while the schema version holds");
        // The class column moved (a table rebuilt with its columns in another order).
        schema.version = 2;
        schema
            .tables
            .insert("stock".into(), vec!["s_w_id".into(), "s_i_id".into()]);
        assert_eq!(classes(&label(&mut labeller, &mut schema, insert)), ["1", "7"]);
        schema.version = 3;
        schema
            .tables
            .insert("stock".into(), vec!["s_i_id".into(), "s_quantity".into()]);
        assert!(label(&mut labeller, &mut schema, insert).global, "no class column");
        // More values than the schema has columns is the database's error, not a class.
        schema.version = 4;
        schema.tables.insert("stock".into(), vec!["s_w_id".into()]);
        assert_eq!(classes(&label(&mut labeller, &mut schema, insert)), ["1", "7"]);
        let computed = "INSERT INTO stock VALUES ($1 + 1, $2)";
        assert!(label(&mut labeller, &mut schema, computed).global);
        assert!(
            label(&mut labeller, &mut schema, "INSERT INTO stock DEFAULT VALUES").global,
            "no value to read the class from"
        );
    }

    #[test]
    fn a_transaction_joins_its_statements_labels() {
        let mut label = Label::default();
        label.join(read("SELECT * FROM stock WHERE s_w_id = 1", &[]));
        label.join(read("SELECT * FROM item WHERE i_id = 1", &[]));
        assert_eq!(label.kind(), "one");
        label.join(read("SELECT * FROM stock WHERE s_w_id = 2", &[]));
        assert_eq!(label.kind(), "several");
        label.join(read("SELECT * FROM stock", &[]));
        assert_eq!(label.kind(), "global");
        label.join(read("SELECT * FROM stock WHERE s_w_id = 3", &[]));
        assert_eq!(label.kind(), "global");
    }
}
