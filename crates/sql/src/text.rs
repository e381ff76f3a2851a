//! SQL text, read without parsing: statements split at top-level semicolons, each classified by
//! its leading words, and what makes a statement non-deterministic found and fixed (or refused)
//! before anything runs. The engine parses for real; this only has to be right about where
//! strings, quoted names and comments begin and end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::SqlError;

/// The SQL the engine reads, where rewritten text must differ: SQLite binds `?n` by number and
/// reads dates as text; PostgreSQL keeps `$n` and wants typed time literals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    Word,
    QuotedName,
    String,
    Number,
    /// `$1`, `?1`, `?`, `:name`, `@name`.
    Parameter,
    Punct,
    /// Whitespace and comments: kept so a rewrite copies them through.
    Gap,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Token<'a> {
    pub(crate) kind: TokenKind,
    pub(crate) text: &'a str,
}

/// Cuts `sql` into tokens. Fails on an unterminated string, quoted name or comment.
pub(crate) fn tokenize(sql: &str) -> Result<Vec<Token<'_>>, SqlError> {
    let bytes = sql.as_bytes();
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let start = at;
        let b = bytes[at];
        let kind = match b {
            b' ' | b'\t' | b'\r' | b'\n' | 0x0c => {
                while at < bytes.len() && bytes[at].is_ascii_whitespace() {
                    at += 1;
                }
                TokenKind::Gap
            }
            b'-' if bytes.get(at + 1) == Some(&b'-') => {
                while at < bytes.len() && bytes[at] != b'\n' {
                    at += 1;
                }
                TokenKind::Gap
            }
            b'/' if bytes.get(at + 1) == Some(&b'*') => {
                let end = sql[at + 2..]
                    .find("*/")
                    .ok_or_else(|| SqlError::syntax("unterminated /* comment"))?;
                at += 2 + end + 2;
                TokenKind::Gap
            }
            b'\'' => {
                at = quoted_end(bytes, at, b'\'').ok_or_else(|| SqlError::syntax("unterminated quoted string"))?;
                TokenKind::String
            }
            b'"' | b'`' => {
                at = quoted_end(bytes, at, b).ok_or_else(|| SqlError::syntax("unterminated quoted identifier"))?;
                TokenKind::QuotedName
            }
            b'[' => {
                let end = sql[at..]
                    .find(']')
                    .ok_or_else(|| SqlError::syntax("unterminated [identifier]"))?;
                at += end + 1;
                TokenKind::QuotedName
            }
            b'$' if bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {
                at += 1;
                while at < bytes.len() && bytes[at].is_ascii_digit() {
                    at += 1;
                }
                TokenKind::Parameter
            }
            b'$' => {
                // A dollar-quoted string: $tag$ ... $tag$.
                let tag_end = sql[at + 1..]
                    .find('$')
                    .map(|i| at + 1 + i)
                    .filter(|&i| bytes[at + 1..i].iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_'))
                    .ok_or_else(|| {
                        SqlError::syntax("a '$' that starts neither a parameter nor a dollar-quoted string")
                    })?;
                let tag = &sql[at..=tag_end];
                let close = sql[tag_end + 1..]
                    .find(tag)
                    .ok_or_else(|| SqlError::syntax("unterminated dollar-quoted string"))?;
                at = tag_end + 1 + close + tag.len();
                TokenKind::String
            }
            b'?' | b':' | b'@'
                if b == b'?'
                    || bytes
                        .get(at + 1)
                        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') =>
            {
                at += 1;
                // `?NNN` takes digits only (as `$NNN` does); `:name` and `@name` take a name.
                let named = b != b'?';
                while at < bytes.len()
                    && (bytes[at].is_ascii_digit() || (named && (bytes[at].is_ascii_alphabetic() || bytes[at] == b'_')))
                {
                    at += 1;
                }
                TokenKind::Parameter
            }
            c if c.is_ascii_digit() || (c == b'.' && bytes.get(at + 1).is_some_and(u8::is_ascii_digit)) => {
                while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'.') {
                    at += 1;
                }
                TokenKind::Number
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                while at < bytes.len()
                    && (bytes[at].is_ascii_alphanumeric()
                        || bytes[at] == b'_'
                        || bytes[at] == b'$'
                        || bytes[at] >= 0x80)
                {
                    at += 1;
                }
                TokenKind::Word
            }
            _ => {
                at += 1;
                TokenKind::Punct
            }
        };
        tokens.push(Token {
            kind,
            text: &sql[start..at],
        });
    }
    Ok(tokens)
}

/// The index just past the quote closing the one at `open` (a doubled quote is an escaped one).
fn quoted_end(bytes: &[u8], open: usize, quote: u8) -> Option<usize> {
    let mut at = open + 1;
    while at < bytes.len() {
        if bytes[at] == quote {
            if bytes.get(at + 1) == Some(&quote) {
                at += 2;
                continue;
            }
            return Some(at + 1);
        }
        at += 1;
    }
    None
}

/// The statements of `sql`, split at top-level semicolons, trimmed, empty ones dropped.
pub fn split_statements(sql: &str) -> Result<Vec<String>, SqlError> {
    let mut statements = Vec::new();
    let mut current = String::new();
    // A trigger's body holds semicolons inside BEGIN ... END.
    let mut trigger_depth = 0usize;
    let mut creating_trigger = false;
    let mut words_seen = 0usize;
    for token in tokenize(sql)? {
        if token.kind == TokenKind::Word {
            if words_seen < 4 && token.text.eq_ignore_ascii_case("trigger") {
                creating_trigger = true;
            }
            words_seen += 1;
            if creating_trigger && token.text.eq_ignore_ascii_case("begin") {
                trigger_depth += 1;
            } else if creating_trigger && token.text.eq_ignore_ascii_case("end") && trigger_depth > 0 {
                trigger_depth -= 1;
            }
        }
        if token.kind == TokenKind::Punct && token.text == ";" && trigger_depth == 0 {
            push_statement(&mut statements, &current);
            current.clear();
            creating_trigger = false;
            words_seen = 0;
        } else {
            current.push_str(token.text);
        }
    }
    push_statement(&mut statements, &current);
    Ok(statements)
}

fn push_statement(statements: &mut Vec<String>, text: &str) {
    let tokens = tokenize(text).unwrap_or_default();
    if tokens.iter().any(|t| t.kind != TokenKind::Gap) {
        statements.push(text.trim().to_owned());
    }
}

/// What a statement does, as far as replication is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementKind {
    Begin {
        read_only: bool,
    },
    Commit,
    Rollback,
    /// SAVEPOINT, RELEASE, ROLLBACK TO: inside a transaction, replicated with it.
    Savepoint,
    /// Changes nothing: served by any node.
    Read,
    /// May change the database: executed by the leader and replicated.
    Write,
    /// A session setting (SET, RESET): acknowledged, changes nothing replicated.
    Setting,
}

/// The significant words of a statement, upper-cased.
fn words(tokens: &[Token]) -> Vec<String> {
    tokens
        .iter()
        .filter(|t| t.kind == TokenKind::Word)
        .map(|t| t.text.to_ascii_uppercase())
        .collect()
}

/// Classifies one statement (as `split_statements` returns them) and refuses what must never
/// run: statements touching files outside the database, the extension loader, and Chorus's own
/// bookkeeping tables.
pub fn classify(statement: &str) -> Result<StatementKind, SqlError> {
    analyse(statement).map(|analysis| analysis.kind)
}

/// What the text layer concludes about one statement text: all a session and the writer ask
/// of it. Clients send the same statements over and over (prepared or not), and each would
/// otherwise be tokenised several times per execution, on the node's thread: the conclusions
/// are kept, by text.
#[derive(Debug)]
pub struct Analysis {
    /// `classify`'s answer.
    pub kind: StatementKind,
    /// `command_verb`'s answer.
    pub verb: Box<str>,
    /// `number_parameters`'s output (SQLite's; PostgreSQL's is the statement itself).
    numbered: Arc<str>,
    statement: Arc<str>,
    /// `fix_writes`'s output per dialect when it does not depend on the clock (and nothing is
    /// refused).
    clockless_fix: [Option<Arc<str>>; 2],
}

impl Analysis {
    fn of(statement: &str) -> Result<Analysis, SqlError> {
        let kind = classify_tokens(statement)?;
        let clockless_fix = [Dialect::Sqlite, Dialect::Postgres].map(|dialect| {
            match rewrite(statement, FixedClock { unix_ms: 0 }, dialect) {
                Ok((fixed, false)) => Some(fixed.into()),
                _ => None,
            }
        });
        Ok(Analysis {
            kind,
            verb: command_verb(statement).into(),
            numbered: number_parameters_of(statement)?.into(),
            statement: statement.into(),
            clockless_fix,
        })
    }

    /// The statement as the engine reads it when it is not replicated (a read): SQLite's
    /// parameters numbered `?n`.
    pub fn numbered(&self, dialect: Dialect) -> String {
        match dialect {
            Dialect::Sqlite => self.numbered.to_string(),
            Dialect::Postgres => self.statement.to_string(),
        }
    }

    /// `fix_writes(statement, clock, dialect)`, for the statement analysed.
    pub fn fix_writes(&self, statement: &str, clock: FixedClock, dialect: Dialect) -> Result<String, SqlError> {
        match &self.clockless_fix[dialect as usize] {
            Some(fixed) => Ok(fixed.to_string()),
            None => rewrite(statement, clock, dialect).map(|(fixed, _)| fixed),
        }
    }

    /// Whether the statement changes the schema rather than rows (a write that is not an
    /// INSERT, UPDATE, DELETE or REPLACE).
    pub fn changes_schema(&self) -> bool {
        self.kind == StatementKind::Write && !matches!(&*self.verb, "INSERT" | "UPDATE" | "DELETE" | "REPLACE")
    }
}

/// `classify` without keeping the analysis: for texts that come once (a statement with its
/// transaction's time written in), which would only push out the ones clients repeat.
pub fn classify_unkept(statement: &str) -> Result<StatementKind, SqlError> {
    match memo_get(statement) {
        Some(analysis) => Ok(analysis.kind),
        None => classify_tokens(statement),
    }
}

/// The statement's `Analysis`, kept for the next time it comes (unless it is long).
pub fn analyse(statement: &str) -> Result<Arc<Analysis>, SqlError> {
    if let Some(analysis) = memo_get(statement) {
        return Ok(analysis);
    }
    let analysis = Arc::new(Analysis::of(statement)?);
    memo_put(statement, &analysis);
    Ok(analysis)
}

/// Longer statements are usually one-off (bulk loads): analysed each time, not kept.
const MEMO_MAX_STATEMENT_BYTES: usize = 4096;
/// Distinct statement texts kept; the memo starts over when it is full.
const MEMO_CAPACITY: usize = 4096;

type Memo = Mutex<HashMap<Box<str>, Arc<Analysis>>>;

fn memo() -> &'static Memo {
    static MEMO: OnceLock<Memo> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

fn memo_get(statement: &str) -> Option<Arc<Analysis>> {
    if statement.len() > MEMO_MAX_STATEMENT_BYTES {
        return None;
    }
    memo()
        .lock()
        .expect("the memo lock is never poisoned")
        .get(statement)
        .cloned()
}

fn memo_put(statement: &str, analysis: &Arc<Analysis>) {
    if statement.len() > MEMO_MAX_STATEMENT_BYTES {
        return;
    }
    let mut memo = memo().lock().expect("the memo lock is never poisoned");
    if memo.len() >= MEMO_CAPACITY {
        memo.clear();
    }
    memo.insert(statement.into(), analysis.clone());
}

fn classify_tokens(statement: &str) -> Result<StatementKind, SqlError> {
    let tokens = tokenize(statement)?;
    let words = words(&tokens);
    if tokens
        .iter()
        .filter(|t| matches!(t.kind, TokenKind::Word | TokenKind::QuotedName))
        .any(|t| {
            t.text
                .trim_matches(['"', '`', '[', ']'])
                .to_ascii_lowercase()
                .starts_with(RESERVED_PREFIX)
        })
    {
        return Err(SqlError::reserved_name());
    }
    let first = words.first().map(String::as_str).unwrap_or("");
    let second = words.get(1).map(String::as_str).unwrap_or("");
    let has = |w: &str| words.iter().any(|x| x == w);
    let read_only_words = words.windows(2).any(|p| p[0] == "READ" && p[1] == "ONLY");
    Ok(match first {
        "BEGIN" | "START" => StatementKind::Begin {
            read_only: read_only_words,
        },
        "COMMIT" | "END" => StatementKind::Commit,
        "ROLLBACK" | "ABORT" if has("TO") => StatementKind::Savepoint,
        "ROLLBACK" | "ABORT" => StatementKind::Rollback,
        "SAVEPOINT" | "RELEASE" => StatementKind::Savepoint,
        // Session state that lives in the connection (prepared statements are the protocol's).
        "SET" | "RESET" | "DEALLOCATE" | "DISCARD" => StatementKind::Setting,
        "ATTACH" | "DETACH" | "VACUUM" => {
            return Err(SqlError::unsupported(format!(
                "{first} is not replicated: it reaches files outside the replicated database"
            )))
        }
        "PRAGMA" if tokens.iter().any(|t| t.kind == TokenKind::Punct && t.text == "=") => {
            return Err(SqlError::unsupported(
                "PRAGMA settings are not replicated; Chorus sets the engine's pragmas itself".into(),
            ))
        }
        "SELECT" | "VALUES" | "EXPLAIN" | "PRAGMA" | "SHOW" => StatementKind::Read,
        "WITH" if !(has("INSERT") || has("UPDATE") || has("DELETE") || has("REPLACE")) => StatementKind::Read,
        _ if second.is_empty() && first.is_empty() => StatementKind::Read,
        _ => StatementKind::Write,
    })
}

/// The command a statement runs, upper-cased (`INSERT` for `WITH ... INSERT`): its tag.
pub fn command_verb(statement: &str) -> String {
    let Ok(tokens) = tokenize(statement) else {
        return String::new();
    };
    let mut depth = 0i32;
    let mut first = None;
    for token in tokens {
        match (token.kind, token.text) {
            (TokenKind::Punct, "(") => depth += 1,
            (TokenKind::Punct, ")") => depth -= 1,
            (TokenKind::Word, word) if depth == 0 => {
                let word = word.to_ascii_uppercase();
                if first.is_none() {
                    first = Some(word.clone());
                }
                if first.as_deref() != Some("WITH") {
                    return word;
                }
                if matches!(
                    word.as_str(),
                    "INSERT" | "UPDATE" | "DELETE" | "REPLACE" | "SELECT" | "VALUES"
                ) {
                    return word;
                }
            }
            _ => {}
        }
    }
    first.unwrap_or_default()
}

/// For each column of a SELECT whose value is a call of a known function, its name (lower-case):
/// what a column without a declared type is typed by. `None` where the item is something else;
/// empty when the select list has a `*` (its columns cannot be matched to the items).
pub fn select_item_functions(statement: &str) -> Vec<Option<String>> {
    let Ok(tokens) = tokenize(statement) else {
        return Vec::new();
    };
    let significant: Vec<Token> = tokens.into_iter().filter(|t| t.kind != TokenKind::Gap).collect();
    let Some(start) = significant
        .iter()
        .position(|t| t.kind == TokenKind::Word && t.text.eq_ignore_ascii_case("select"))
    else {
        return Vec::new();
    };
    let mut items: Vec<Vec<Token>> = vec![Vec::new()];
    let mut depth = 0i32;
    for token in &significant[start + 1..] {
        match (token.kind, token.text) {
            (TokenKind::Punct, "(") => depth += 1,
            (TokenKind::Punct, ")") => depth -= 1,
            (TokenKind::Punct, ",") if depth == 0 => {
                items.push(Vec::new());
                continue;
            }
            (TokenKind::Word, word)
                if depth == 0
                    && ["from", "where", "group", "order", "limit", "union"]
                        .iter()
                        .any(|k| word.eq_ignore_ascii_case(k)) =>
            {
                break
            }
            _ => {}
        }
        items.last_mut().expect("one item at least").push(*token);
    }
    if items.iter().any(|item| item.last().is_some_and(|t| t.text == "*")) {
        return Vec::new();
    }
    items
        .iter()
        .map(|item| match item.as_slice() {
            [name, open, ..] if name.kind == TokenKind::Word && open.text == "(" => {
                // The call must be the whole item, but for an alias.
                let mut depth = 0;
                let close = item.iter().position(|t| {
                    match t.text {
                        "(" => depth += 1,
                        ")" => depth -= 1,
                        _ => {}
                    }
                    t.text == ")" && depth == 0
                })?;
                let rest = &item[close + 1..];
                let aliased = match rest {
                    [] => true,
                    [alias] => alias.kind == TokenKind::Word,
                    [as_word, alias] => as_word.text.eq_ignore_ascii_case("as") && alias.kind != TokenKind::Punct,
                    _ => false,
                };
                aliased.then(|| name.text.to_ascii_lowercase())
            }
            _ => None,
        })
        .collect()
}

/// Chorus's own tables in the engine start with this; clients may not name them.
pub const RESERVED_PREFIX: &str = "_chorus_";

/// The time a transaction's statements see, fixed once by the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedClock {
    pub unix_ms: i64,
}

impl FixedClock {
    /// `YYYY-MM-DD HH:MM:SS.SSS`, UTC: the text SQLite's date functions read and write.
    fn timestamp_ms(&self) -> String {
        let (date, time) = self.civil();
        format!("{date} {time}.{:03}", self.unix_ms.rem_euclid(1000))
    }

    fn timestamp(&self) -> String {
        let (date, time) = self.civil();
        format!("{date} {time}")
    }

    /// `CURRENT_TIMESTAMP`: SQLite's has whole seconds, PostgreSQL's microseconds.
    fn timestamp_of(&self, dialect: Dialect) -> String {
        match dialect {
            Dialect::Sqlite => self.timestamp(),
            Dialect::Postgres => self.timestamp_ms(),
        }
    }

    /// (`YYYY-MM-DD`, `HH:MM:SS`) in UTC.
    fn civil(&self) -> (String, String) {
        civil(self.unix_ms.div_euclid(1000))
    }
}

/// A Unix time in seconds as (`YYYY-MM-DD`, `HH:MM:SS`) in UTC.
pub(crate) fn civil(unix_secs: i64) -> (String, String) {
    let of_day = unix_secs.rem_euclid(86_400);
    (
        civil_date(unix_secs.div_euclid(86_400)),
        format!("{:02}:{:02}:{:02}", of_day / 3600, of_day / 60 % 60, of_day % 60),
    )
}

/// Days since 1970-01-01 as `YYYY-MM-DD` (proleptic Gregorian; Howard Hinnant's algorithm).
pub(crate) fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Makes a statement that may write deterministic: every read of the clock becomes the
/// transaction's fixed time, and for SQLite `$n` parameters become `?n` (which it binds by
/// number, where it would bind `$n` by order of appearance). What cannot be made deterministic
/// is refused, naming the function. `random()` stays: the engine draws it from the
/// transaction's seed (SQLite's `randomblob()` and `gen_random_uuid()` too; PostgreSQL cannot
/// seed its UUIDs, so there they are refused).
pub fn fix_writes(statement: &str, clock: FixedClock, dialect: Dialect) -> Result<String, SqlError> {
    match memo_get(statement) {
        Some(analysis) => analysis.fix_writes(statement, clock, dialect),
        None => rewrite(statement, clock, dialect).map(|(fixed, _)| fixed),
    }
}

/// A time literal as `dialect` reads it: SQLite's dates are text; PostgreSQL's untyped literal
/// would not do in arithmetic (`now() - interval '1 day'`). The typed one is a CAST, so that
/// its type name cannot run into what follows (`now()$x` must not become `timestamptz$x`) and
/// a word before it does not become a function called with it (`f CURRENT_TIME` must not
/// become `f ('…'::time)`).
fn time_literal(text: &str, postgres_type: &str, dialect: Dialect) -> String {
    match dialect {
        Dialect::Sqlite => format!("'{text}'"),
        // With its zone: a session's TimeZone must not move the transaction's instant.
        Dialect::Postgres if postgres_type == "timestamptz" => format!("CAST('{text}+00' AS timestamptz)"),
        Dialect::Postgres => format!("CAST('{text}' AS {postgres_type})"),
    }
}

/// `fix_writes`, and whether the output holds the clock (depends on `clock`).
fn rewrite(statement: &str, clock: FixedClock, dialect: Dialect) -> Result<(String, bool), SqlError> {
    let tokens = tokenize(statement)?;
    let mut reads_clock = false;
    let defines_schema = matches!(
        words(&tokens).first().map(String::as_str),
        Some("CREATE") | Some("ALTER")
    );
    let mut out = String::with_capacity(statement.len() + 16);
    let mut i = 0;
    while i < tokens.len() {
        let token = tokens[i];
        let call = next_significant(&tokens, i + 1).filter(|&j| tokens[j].text == "(");
        let empty_call = call
            .and_then(|open| next_significant(&tokens, open + 1))
            .filter(|&close| tokens[close].text == ")");
        let upper = token.text.to_ascii_uppercase();
        let clock_literal = match (token.kind, upper.as_str()) {
            (TokenKind::Word, "CURRENT_TIMESTAMP") if call.is_none() => Some((
                time_literal(&clock.timestamp_of(dialect), "timestamptz", dialect),
                i + 1,
            )),
            (TokenKind::Word, "LOCALTIMESTAMP") if call.is_none() => {
                Some((time_literal(&clock.timestamp_of(dialect), "timestamp", dialect), i + 1))
            }
            (TokenKind::Word, "CURRENT_DATE") if call.is_none() => {
                Some((time_literal(&clock.civil().0, "date", dialect), i + 1))
            }
            (TokenKind::Word, "CURRENT_TIME" | "LOCALTIME") if call.is_none() => {
                Some((time_literal(&clock.civil().1, "time", dialect), i + 1))
            }
            (TokenKind::Word, "NOW" | "STATEMENT_TIMESTAMP" | "TRANSACTION_TIMESTAMP") if empty_call.is_some() => {
                Some((
                    time_literal(&clock.timestamp_ms(), "timestamptz", dialect),
                    empty_call.unwrap_or(i) + 1,
                ))
            }
            (TokenKind::Word, "UNIXEPOCH") if empty_call.is_some() => {
                Some((clock.unix_ms.div_euclid(1000).to_string(), empty_call.unwrap_or(i) + 1))
            }
            (TokenKind::String, "'NOW'") => Some((format!("'{}'", clock.timestamp_ms()), i + 1)),
            _ => None,
        };
        if let Some((literal, next)) = clock_literal {
            reads_clock = true;
            if defines_schema {
                return Err(SqlError::nondeterministic(format!(
                    "{} in a schema definition reads each node's clock when rows are written; \
                     give the value in the INSERT instead",
                    token.text
                )));
            }
            out.push_str(&literal);
            i = next;
            continue;
        }
        match (token.kind, upper.as_str()) {
            (TokenKind::String, "'LOCALTIME'") => {
                return Err(SqlError::nondeterministic(
                    "the 'localtime' modifier depends on each node's time zone; convert on the client".into(),
                ))
            }
            (TokenKind::Word, "CLOCK_TIMESTAMP" | "TIMEOFDAY" | "TOTAL_CHANGES" | "LOAD_EXTENSION")
                if call.is_some() =>
            {
                return Err(SqlError::nondeterministic(format!(
                    "{}() gives each node a different value and cannot be replicated",
                    token.text
                )))
            }
            (
                TokenKind::Word,
                "GEN_RANDOM_UUID" | "UUID_GENERATE_V4" | "PG_BACKEND_PID" | "TXID_CURRENT" | "INET_SERVER_PORT",
            ) if call.is_some() && dialect == Dialect::Postgres => {
                return Err(SqlError::nondeterministic(format!(
                    "{}() gives each PostgreSQL node a different value and cannot be replicated \
                     by statement; compute it on the client",
                    token.text
                )))
            }
            (TokenKind::Parameter, _) if token.text.starts_with('$') && dialect == Dialect::Sqlite => {
                out.push('?');
                out.push_str(&token.text[1..]);
            }
            _ => out.push_str(token.text),
        }
        i += 1;
    }
    Ok((out, reads_clock))
}

/// `$n` parameters as `?n`, for statements that are not replicated (reads).
pub fn number_parameters(statement: &str) -> Result<String, SqlError> {
    if let Some(analysis) = memo_get(statement) {
        return Ok(analysis.numbered.to_string());
    }
    number_parameters_of(statement)
}

fn number_parameters_of(statement: &str) -> Result<String, SqlError> {
    let mut out = String::with_capacity(statement.len());
    for token in tokenize(statement)? {
        if token.kind == TokenKind::Parameter && token.text.starts_with('$') {
            out.push('?');
            out.push_str(&token.text[1..]);
        } else {
            out.push_str(token.text);
        }
    }
    Ok(out)
}

/// How many parameters a statement takes: the highest `$n`/`?n`, or the count of bare `?`.
pub fn parameter_count(statement: &str) -> Result<usize, SqlError> {
    let mut highest = 0usize;
    let mut bare = 0usize;
    for token in tokenize(statement)? {
        if token.kind != TokenKind::Parameter {
            continue;
        }
        match token.text[1..].parse::<usize>() {
            Ok(n) => highest = highest.max(n),
            Err(_) if token.text == "?" => bare += 1,
            Err(_) => {}
        }
    }
    Ok(highest.max(bare))
}

/// The prefix of Chorus's own session settings (`SET chorus.read_consistency = 'stale'`).
pub const SETTING_PREFIX: &str = "chorus.";

/// A session setting statement about one of Chorus's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChorusSetting {
    /// `SET name = value` (or `TO value`); `DEFAULT` and `RESET name` give None.
    Set { name: String, value: Option<String> },
    /// `SHOW name`.
    Show { name: String },
}

/// Reads `SET`, `RESET` or `SHOW` of a `chorus.*` setting; None for anything else (settings of
/// PostgreSQL's own are acknowledged and ignored).
pub fn chorus_setting(statement: &str) -> Option<ChorusSetting> {
    let tokens = tokenize(statement).ok()?;
    let significant: Vec<&str> = tokens
        .iter()
        .filter(|t| t.kind != TokenKind::Gap)
        .map(|t| t.text)
        .filter(|text| *text != ";")
        .collect();
    let (verb, rest) = significant.split_first()?;
    let rest = match rest.first().map(|w| w.to_ascii_uppercase()) {
        Some(w) if w == "SESSION" || w == "LOCAL" => &rest[1..],
        _ => rest,
    };
    let end = rest
        .iter()
        .position(|t| *t == "=" || t.eq_ignore_ascii_case("TO"))
        .unwrap_or(rest.len());
    let name = rest[..end].concat().to_ascii_lowercase();
    if !name.starts_with(SETTING_PREFIX) {
        return None;
    }
    let value = || {
        let [value] = rest.get(end + 1..)? else { return None };
        let value = value.trim_matches('\'').to_ascii_lowercase();
        (value != "default").then_some(value)
    };
    match verb.to_ascii_uppercase().as_str() {
        "SET" => Some(ChorusSetting::Set { name, value: value() }),
        "RESET" if end == rest.len() => Some(ChorusSetting::Set { name, value: None }),
        "SHOW" if end == rest.len() => Some(ChorusSetting::Show { name }),
        _ => None,
    }
}

fn next_significant(tokens: &[Token], from: usize) -> Option<usize> {
    (from..tokens.len()).find(|&j| tokens[j].kind != TokenKind::Gap)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLOCK: FixedClock = FixedClock {
        unix_ms: 1_795_747_860_123,
    };

    #[test]
    fn memoised_analyses_answer_as_a_fresh_one_would_and_clock_readers_stay_per_clock() {
        let later = FixedClock {
            unix_ms: CLOCK.unix_ms + 86_400_000,
        };
        for statement in [
            "UPDATE t SET n = n + $1 WHERE id = $2",
            "INSERT INTO t VALUES ($1, CURRENT_TIMESTAMP)",
            "SELECT * FROM t WHERE id = $1",
            "BEGIN READ ONLY",
        ] {
            let fresh = (
                classify_tokens(statement).unwrap(),
                rewrite(statement, CLOCK, Dialect::Sqlite).unwrap().0,
                number_parameters_of(statement).unwrap(),
            );
            for _ in 0..2 {
                let analysis = analyse(statement).unwrap();
                assert_eq!(analysis.kind, fresh.0, "{statement}");
                assert_eq!(
                    analysis.fix_writes(statement, CLOCK, Dialect::Sqlite).unwrap(),
                    fresh.1,
                    "{statement}"
                );
                assert_eq!(analysis.numbered(Dialect::Sqlite), fresh.2, "{statement}");
                assert_eq!(&*analysis.verb, command_verb(statement), "{statement}");
                assert_eq!(classify(statement).unwrap(), fresh.0, "{statement}");
                assert_eq!(
                    fix_writes(statement, CLOCK, Dialect::Sqlite).unwrap(),
                    fresh.1,
                    "{statement}"
                );
                assert_eq!(number_parameters(statement).unwrap(), fresh.2, "{statement}");
            }
        }
        let reads_clock = "INSERT INTO t VALUES ($1, CURRENT_TIMESTAMP)";
        assert_ne!(
            fix_writes(reads_clock, CLOCK, Dialect::Sqlite).unwrap(),
            fix_writes(reads_clock, later, Dialect::Sqlite).unwrap(),
            "a statement reading the clock is rewritten for each transaction's time"
        );
        let refused = "INSERT INTO t VALUES (clock_timestamp())";
        classify(refused).unwrap();
        assert!(
            fix_writes(refused, CLOCK, Dialect::Sqlite).is_err(),
            "a refusal is not memoised away"
        );
    }

    #[test]
    fn statements_split_at_semicolons_outside_strings_comments_and_triggers() {
        let sql = "INSERT INTO t VALUES ('a;b'); -- c;d\nSELECT \"x;y\" FROM t /* ; */;;\
                   CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE u SET n = n + 1; END; SELECT 1";
        let statements = split_statements(sql).unwrap();
        assert_eq!(statements.len(), 4, "{statements:?}");
        assert_eq!(statements[0], "INSERT INTO t VALUES ('a;b')");
        assert!(statements[2].ends_with("END"), "{}", statements[2]);
        assert_eq!(statements[3], "SELECT 1");
    }

    #[test]
    fn unterminated_strings_and_comments_are_errors() {
        for bad in ["SELECT 'abc", "SELECT \"abc", "SELECT 1 /* x", "SELECT $q$ x"] {
            assert!(split_statements(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn statements_are_classified_by_their_leading_words() {
        let cases = [
            ("begin", StatementKind::Begin { read_only: false }),
            ("START TRANSACTION READ ONLY", StatementKind::Begin { read_only: true }),
            ("commit", StatementKind::Commit),
            ("END", StatementKind::Commit),
            ("ROLLBACK", StatementKind::Rollback),
            ("ROLLBACK TO SAVEPOINT a", StatementKind::Savepoint),
            ("select * from t", StatementKind::Read),
            ("WITH x AS (SELECT 1) SELECT * FROM x", StatementKind::Read),
            ("WITH x AS (SELECT 1) DELETE FROM t", StatementKind::Write),
            ("  /* c */ insert into t values (1)", StatementKind::Write),
            ("CREATE TABLE t (a)", StatementKind::Write),
            ("PRAGMA table_info(t)", StatementKind::Read),
            ("SET application_name = 'x'", StatementKind::Setting),
        ];
        for (sql, kind) in cases {
            assert_eq!(classify(sql).unwrap(), kind, "{sql}");
        }
        for refused in [
            "ATTACH 'x.db' AS x",
            "PRAGMA synchronous = OFF",
            "DROP TABLE _chorus_applied",
            "SELECT * FROM \"_CHORUS_ahead\"",
        ] {
            assert!(classify(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn clock_reads_become_the_fixed_time() {
        let fixed = fix_writes(
            "INSERT INTO t VALUES (CURRENT_TIMESTAMP, now(), datetime('now'), unixepoch(), 'now is', $2, $1)",
            CLOCK,
            Dialect::Sqlite,
        )
        .unwrap();
        assert_eq!(
            fixed,
            "INSERT INTO t VALUES ('2026-11-27 02:51:00', '2026-11-27 02:51:00.123', \
             datetime('2026-11-27 02:51:00.123'), 1795747860, 'now is', ?2, ?1)"
        );
        assert_eq!(
            fix_writes("SELECT random(), randomblob(4)", CLOCK, Dialect::Sqlite).unwrap(),
            "SELECT random(), randomblob(4)"
        );
    }

    #[test]
    fn an_unkept_classification_answers_as_a_kept_one_and_keeps_nothing() {
        let once = "INSERT INTO t VALUES (('2026-11-27 02:51:00.123+00'::timestamptz), 41)";
        assert_eq!(classify_unkept(once).unwrap(), StatementKind::Write);
        assert!(memo_get(once).is_none(), "a one-off text is not kept");
        assert_eq!(classify_unkept("SELECT 1").unwrap(), classify("SELECT 1").unwrap());
    }

    #[test]
    fn postgres_keeps_its_parameters_and_reads_typed_times() {
        let pg = |sql: &str| fix_writes(sql, CLOCK, Dialect::Postgres);
        assert_eq!(
            pg("INSERT INTO t VALUES (CURRENT_TIMESTAMP, now() - interval '1 day', CURRENT_DATE, $2, $1)").unwrap(),
            "INSERT INTO t VALUES (CAST('2026-11-27 02:51:00.123+00' AS timestamptz), \
             CAST('2026-11-27 02:51:00.123+00' AS timestamptz) - interval '1 day', CAST('2026-11-27' AS date), $2, $1)"
        );
        // A word before a clock keyword stays a word, not a function called with the literal
        // (found by the `sql` fuzz target: the second pass refused a `TXID_CURRENT(…)`).
        let fixed = pg("UPDATE s SET a = TXID_CURRENT CURRENT_TIME").unwrap();
        assert_eq!(fixed, "UPDATE s SET a = TXID_CURRENT CAST('02:51:00' AS time)");
        assert_eq!(pg(&fixed).unwrap(), fixed);
        let fixed = pg("SELECT now()$x$ a $x$").unwrap();
        assert_eq!(
            pg(&fixed).unwrap(),
            fixed,
            "a literal does not run into a dollar quote after it"
        );
        assert_eq!(
            analyse("SELECT * FROM t WHERE id = $1")
                .unwrap()
                .numbered(Dialect::Postgres),
            "SELECT * FROM t WHERE id = $1"
        );
        let error = pg("INSERT INTO t VALUES (gen_random_uuid())").unwrap_err();
        assert!(error.message.contains("gen_random_uuid"), "{}", error.message);
        assert!(
            fix_writes("INSERT INTO t VALUES (gen_random_uuid())", CLOCK, Dialect::Sqlite).is_ok(),
            "SQLite draws UUIDs from the seed"
        );
    }

    #[test]
    fn what_cannot_be_made_deterministic_is_refused_by_name() {
        for (sql, named) in [
            ("UPDATE t SET a = datetime('now', 'localtime')", "localtime"),
            ("INSERT INTO t VALUES (clock_timestamp())", "clock_timestamp"),
            ("SELECT total_changes()", "total_changes"),
            ("CREATE TABLE t (a DEFAULT CURRENT_TIMESTAMP)", "CURRENT_TIMESTAMP"),
        ] {
            let error = fix_writes(sql, CLOCK, Dialect::Sqlite).unwrap_err();
            assert!(error.to_string().contains(named), "{sql}: {error}");
        }
    }

    #[test]
    fn dates_before_and_after_leap_days_are_civil() {
        let at = |unix_ms| FixedClock { unix_ms }.timestamp();
        assert_eq!(at(0), "1970-01-01 00:00:00");
        assert_eq!(at(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(at(4_107_542_399_000), "2100-02-28 23:59:59");
        assert_eq!(at(-1000), "1969-12-31 23:59:59");
    }

    #[test]
    fn the_command_of_a_common_table_expression_is_its_last_part() {
        assert_eq!(
            command_verb("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x"),
            "INSERT"
        );
        assert_eq!(
            command_verb("with recursive n(i) as (select 1 union all select i + 1 from n) select * from n"),
            "SELECT"
        );
        assert_eq!(command_verb("  update t set a = 1"), "UPDATE");
    }

    #[test]
    fn select_items_that_are_function_calls_are_named() {
        assert_eq!(
            select_item_functions("SELECT count(*), sum(a) AS total, a, max(b) + 1, avg(c) n FROM t GROUP BY a"),
            vec![Some("count".into()), Some("sum".into()), None, None, Some("avg".into())]
        );
        assert!(select_item_functions("SELECT *, count(*) FROM t").is_empty());
        assert!(select_item_functions("SELECT t.*, count(*) FROM t").is_empty());
    }

    #[test]
    fn chorus_settings_are_read_and_others_left_alone() {
        let set = |name: &str, value: Option<&str>| ChorusSetting::Set {
            name: name.into(),
            value: value.map(Into::into),
        };
        for (sql, expected) in [
            (
                "SET chorus.read_consistency = 'stale'",
                Some(set("chorus.read_consistency", Some("stale"))),
            ),
            (
                "set session Chorus.Read_Consistency to linearizable;",
                Some(set("chorus.read_consistency", Some("linearizable"))),
            ),
            (
                "SET chorus.read_consistency = DEFAULT",
                Some(set("chorus.read_consistency", None)),
            ),
            (
                "RESET chorus.read_consistency",
                Some(set("chorus.read_consistency", None)),
            ),
            (
                "SHOW chorus.read_consistency",
                Some(ChorusSetting::Show {
                    name: "chorus.read_consistency".into(),
                }),
            ),
            ("SET application_name = 'x'", None),
            ("SHOW server_version", None),
        ] {
            assert_eq!(chorus_setting(sql), expected, "{sql}");
        }
    }

    #[test]
    fn parameters_are_counted_and_numbered() {
        assert_eq!(parameter_count("SELECT $1, $3, '$2'").unwrap(), 3);
        assert_eq!(parameter_count("SELECT ?, ?").unwrap(), 2);
        assert_eq!(number_parameters("SELECT $2::int, $1").unwrap(), "SELECT ?2::int, ?1");
        // A rewritten parameter never swallows the word after it.
        let fixed = fix_writes("SELECT ($1BEGIN$x)", CLOCK, Dialect::Sqlite).unwrap();
        assert_eq!(fix_writes(&fixed, CLOCK, Dialect::Sqlite).unwrap(), fixed);
    }
}
