//! A blocking PostgreSQL connection for the writer, which runs on the node's thread: each
//! statement is written to the socket and its reply read right there, with no hand-off to
//! another thread and back (that cost as much as the statement). Extended protocol, parameters
//! in text form, results in binary (decoded by `postgres::decode`); trust or cleartext-free
//! local authentication only, as a node's own server is set up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio_postgres::types::{IsNull, ToSql, Type};

use crate::error::SqlError;
use crate::txn::Value;

/// A statement prepared on the connection: its name there, and the types of its parameters
/// and result columns.
#[derive(Debug, Clone)]
pub struct Prepared {
    name: String,
    pub params: Vec<Type>,
    pub columns: Vec<(String, Type)>,
}

/// A statement to execute: prepared, or text parsed for this one execution (as the unnamed
/// statement, in the same round trip: a statement seen once is not worth a Parse of its own).
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Prepared(&'a Prepared),
    Once(&'a str),
}

/// What one execution gave.
pub struct Executed {
    /// The result columns, when the execution described them (a `Target::Once`).
    pub columns: Option<Vec<(String, Type)>>,
    pub rows: Vec<Vec<Value>>,
    /// From the command tag (INSERT 0 n, UPDATE n, …); 0 for other commands.
    pub changes: u64,
}

pub struct Connection {
    socket: TcpStream,
    out: BytesMut,
    incoming: BytesMut,
    next_name: u64,
    /// An I/O error happened: the conversation's place is lost, the connection is not reused.
    broken: bool,
}

/// Reads what has arrived into `chunk`, again when a signal interrupted the wait: a process
/// stopped and continued (SIGSTOP, SIGCONT) sees a read with a timeout fail with EINTR.
pub(crate) fn read_some(socket: &mut TcpStream, chunk: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match socket.read(chunk) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            read => return read,
        }
    }
}

fn io_error(e: std::io::Error) -> SqlError {
    SqlError::new("08006", format!("the node's PostgreSQL connection failed: {e}"))
}

fn protocol_error(what: &str) -> SqlError {
    SqlError::new(
        "08P01",
        format!("unexpected message from the node's PostgreSQL: {what}"),
    )
}

impl Connection {
    /// Connects to `host:port` as `user` to `dbname`, with `options` (`-c name=value …`).
    pub fn connect(config: &tokio_postgres::Config, options: &str) -> Result<Connection, SqlError> {
        Self::connect_with(config, options, &[])
    }

    /// `connect`, with startup parameters of its own (`replication`), and reads bounded by
    /// `read_timeout`: the socket and what was read past the startup, for a conversation
    /// that is not the extended protocol's (a replication stream).
    pub fn connect_raw(
        config: &tokio_postgres::Config,
        options: &str,
        extra: &[(&str, &str)],
        read_timeout: Duration,
    ) -> Result<(TcpStream, BytesMut), SqlError> {
        let connection = Self::connect_with(config, options, extra)?;
        connection
            .socket
            .set_read_timeout(Some(read_timeout))
            .map_err(io_error)?;
        Ok((connection.socket, connection.incoming))
    }

    fn connect_with(
        config: &tokio_postgres::Config,
        options: &str,
        extra: &[(&str, &str)],
    ) -> Result<Connection, SqlError> {
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => {
                return Err(SqlError::new(
                    "08001",
                    "the node's PostgreSQL must be given as host=ADDRESS (TCP)",
                ))
            }
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let socket = TcpStream::connect((host.as_str(), port)).map_err(io_error)?;
        socket.set_nodelay(true).map_err(io_error)?;
        socket
            .set_read_timeout(Some(Duration::from_secs(600)))
            .map_err(io_error)?;
        let mut connection = Connection {
            socket,
            out: BytesMut::with_capacity(8192),
            incoming: BytesMut::with_capacity(64 * 1024),
            next_name: 0,
            broken: false,
        };
        let user = config.get_user().unwrap_or("postgres");
        let dbname = config.get_dbname().unwrap_or(user);
        let parameters = [
            ("user", user),
            ("database", dbname),
            ("options", options),
            ("client_encoding", "UTF8"),
        ];
        frontend::startup_message(parameters.into_iter().chain(extra.iter().copied()), &mut connection.out)
            .map_err(io_error)?;
        connection.flush()?;
        loop {
            match connection.read()? {
                Message::AuthenticationOk | Message::ParameterStatus(_) | Message::BackendKeyData(_) => {}
                Message::ReadyForQuery(_) => return Ok(connection),
                Message::ErrorResponse(body) => return Err(server_error(&body)),
                Message::NoticeResponse(_) => {}
                _ => {
                    return Err(SqlError::new(
                        "28000",
                        "the node's PostgreSQL asks for a password; Chorus reaches its own server by \
                         trust on loopback (as `chorus cluster start` sets it up)",
                    ))
                }
            }
        }
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    fn flush(&mut self) -> Result<(), SqlError> {
        let written = self.socket.write_all(&self.out);
        self.out.clear();
        written.map_err(|e| self.broke(e))
    }

    /// A reply out of place: the conversation's place is lost.
    fn lost(&mut self, what: &str) -> SqlError {
        self.broken = true;
        protocol_error(what)
    }

    fn broke(&mut self, e: std::io::Error) -> SqlError {
        self.broken = true;
        io_error(e)
    }

    fn read(&mut self) -> Result<Message, SqlError> {
        loop {
            match Message::parse(&mut self.incoming) {
                Ok(Some(message)) => return Ok(message),
                Ok(None) => {}
                Err(e) => return Err(self.broke(e)),
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = match read_some(&mut self.socket, &mut chunk) {
                Ok(0) => return Err(self.broke(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => n,
                Err(e) => return Err(self.broke(e)),
            };
            self.incoming.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads until ReadyForQuery, returning the first error the server sent, if any.
    fn until_ready(&mut self, mut first_error: Option<SqlError>) -> Result<(), SqlError> {
        loop {
            match self.read()? {
                Message::ReadyForQuery(_) => return first_error.map_or(Ok(()), Err),
                Message::ErrorResponse(body) => {
                    first_error.get_or_insert_with(|| server_error(&body));
                }
                _ => {}
            }
        }
    }

    /// Reads to the end of a failed request and returns its error.
    fn fail<T>(&mut self, error: SqlError) -> Result<T, SqlError> {
        self.until_ready(Some(error))?;
        unreachable!("until_ready returns the error it is given")
    }

    /// Runs `sql` (one or more statements without parameters) through the simple protocol.
    pub fn batch(&mut self, sql: &str) -> Result<(), SqlError> {
        frontend::query(sql, &mut self.out).map_err(io_error)?;
        self.flush()?;
        self.until_ready(None)
    }

    pub fn prepare(&mut self, sql: &str) -> Result<Prepared, SqlError> {
        self.next_name += 1;
        let name = format!("w{}", self.next_name);
        frontend::parse(&name, sql, std::iter::empty(), &mut self.out).map_err(io_error)?;
        frontend::describe(b'S', &name, &mut self.out).map_err(io_error)?;
        frontend::sync(&mut self.out);
        self.flush()?;
        let mut params = Vec::new();
        let mut columns = Vec::new();
        loop {
            match self.read()? {
                Message::ParseComplete | Message::NoData => {}
                Message::ParameterDescription(body) => {
                    params = body
                        .parameters()
                        .map(|oid| Ok(type_of(oid)))
                        .collect()
                        .map_err(io_error)?;
                }
                Message::RowDescription(body) => columns = described_columns(&body)?,
                Message::ErrorResponse(body) => return self.fail(server_error(&body)),
                Message::ReadyForQuery(_) => return Ok(Prepared { name, params, columns }),
                _ => return Err(self.lost("in reply to a Parse")),
            }
        }
    }

    /// Appends one execution of `target` to what is sent next (with a Describe of a
    /// `Target::Once` when `describe`).
    fn queue_execute(&mut self, target: Target, params: &[Value], describe: bool) -> Result<(), SqlError> {
        let name = match target {
            Target::Prepared(statement) => statement.name.as_str(),
            Target::Once(sql) => {
                frontend::parse("", sql, std::iter::empty(), &mut self.out).map_err(io_error)?;
                if describe {
                    frontend::describe(b'S', "", &mut self.out).map_err(io_error)?;
                }
                ""
            }
        };
        // Parameters travel as text, which the server reads as the type it expects; only a
        // blob needs to know it is going to a bytea.
        let types = params.iter().enumerate().map(|(i, value)| match target {
            Target::Prepared(statement) => statement.params.get(i).cloned().unwrap_or(Type::UNKNOWN),
            Target::Once(_) if matches!(value, Value::Blob(_)) => Type::BYTEA,
            Target::Once(_) => Type::UNKNOWN,
        });
        let bound = frontend::bind(
            "",
            name,
            std::iter::once(0i16),
            params.iter().zip(types),
            |(value, ty), out| encode_text(value, &ty, out),
            std::iter::once(1i16),
            &mut self.out,
        );
        if let Err(e) = bound {
            self.out.clear();
            let why = match e {
                frontend::BindError::Conversion(e) => e.to_string(),
                frontend::BindError::Serialization(e) => e.to_string(),
            };
            return Err(SqlError::new("22P02", format!("a parameter cannot be sent: {why}")));
        }
        frontend::execute("", 0, &mut self.out).map_err(io_error)
    }

    /// Executes `target` and collects its rows and the rows it changed, after the statements of
    /// `prefix` (whose results are dropped) in the same round trip. An error of any stops the
    /// rest and is returned.
    pub fn execute(
        &mut self,
        prefix: &[(Target, &[Value])],
        target: Target,
        params: &[Value],
    ) -> Result<Executed, SqlError> {
        for (before, before_params) in prefix {
            self.queue_execute(*before, before_params, false)?;
        }
        self.queue_execute(target, params, true)?;
        frontend::sync(&mut self.out);
        self.flush()?;
        let mut executed = Executed {
            columns: None,
            rows: Vec::new(),
            changes: 0,
        };
        let mut described = Vec::new();
        let mut undecodable = None;
        // The prefix's statements end first; what comes after them is the target's.
        let mut prefix_left = prefix.len();
        loop {
            match self.read()? {
                Message::ParseComplete
                | Message::ParameterDescription(_)
                | Message::NoData
                | Message::BindComplete
                | Message::NoticeResponse(_) => {}
                Message::DataRow(_) if prefix_left > 0 => {}
                Message::CommandComplete(_) | Message::EmptyQueryResponse if prefix_left > 0 => prefix_left -= 1,
                Message::EmptyQueryResponse => {}
                Message::RowDescription(body) => {
                    described = described_columns(&body)?;
                    executed.columns = Some(described.clone());
                }
                // After a row that cannot be read, the rest are passed over to the end of the
                // reply: the connection stays in step for the next request.
                Message::DataRow(_) if undecodable.is_some() => {}
                Message::DataRow(body) => {
                    let columns = match target {
                        Target::Prepared(statement) => &statement.columns,
                        Target::Once(_) => &described,
                    };
                    match decode_row(&body, columns) {
                        Ok(row) => executed.rows.push(row),
                        Err(e) => undecodable = Some(e),
                    }
                }
                Message::CommandComplete(body) => {
                    let tag = body.tag().map_err(io_error)?;
                    executed.changes = changes_of(tag);
                }
                Message::ErrorResponse(body) => return self.fail(server_error(&body)),
                Message::ReadyForQuery(_) => return undecodable.map_or(Ok(executed), Err),
                _ => return Err(self.lost("in reply to an Execute")),
            }
        }
    }

    /// Executes every statement with one Sync at the end: one round trip for them all, giving
    /// the rows each changed. The first error stops the rest (the server skips to the Sync) and
    /// is returned.
    pub fn execute_pipelined(&mut self, runs: &[(Target, &[Value])]) -> Result<Vec<u64>, SqlError> {
        for (target, params) in runs {
            self.queue_execute(*target, params, false)?;
        }
        frontend::sync(&mut self.out);
        self.flush()?;
        let mut changes = Vec::with_capacity(runs.len());
        let mut first_error = None;
        loop {
            match self.read()? {
                Message::CommandComplete(body) => changes.push(changes_of(body.tag().map_err(io_error)?)),
                Message::EmptyQueryResponse => changes.push(0),
                Message::ErrorResponse(body) => {
                    first_error.get_or_insert_with(|| server_error(&body));
                }
                Message::ReadyForQuery(_) => return first_error.map_or(Ok(changes), Err),
                _ => {}
            }
        }
    }
}

/// A row's values, read as `columns` describe them.
fn decode_row(
    body: &postgres_protocol::message::backend::DataRowBody,
    columns: &[(String, Type)],
) -> Result<Vec<Value>, SqlError> {
    let mut row = Vec::with_capacity(columns.len());
    let mut ranges = body.ranges();
    while let Some(range) = ranges.next().map_err(io_error)? {
        let (name, ty) = columns
            .get(row.len())
            .ok_or_else(|| protocol_error("a row longer than its description"))?;
        row.push(match range {
            None => Value::Null,
            Some(range) => crate::postgres::decode(ty, &body.buffer()[range]).map_err(|e| {
                SqlError::new(
                    "0A000",
                    format!(
                        "column {name} of type {} cannot be returned through Chorus yet; cast it to text ({e})",
                        ty.name()
                    ),
                )
            })?,
        });
    }
    Ok(row)
}

/// The result columns a RowDescription names, with their types.
fn described_columns(
    body: &postgres_protocol::message::backend::RowDescriptionBody,
) -> Result<Vec<(String, Type)>, SqlError> {
    body.fields()
        .map(|field| Ok((field.name().to_owned(), type_of(field.type_oid()))))
        .collect()
        .map_err(io_error)
}

fn type_of(oid: u32) -> Type {
    Type::from_oid(oid).unwrap_or(Type::UNKNOWN)
}

/// The rows a command changed, from its tag: the last number of INSERT/UPDATE/DELETE/MERGE/COPY.
fn changes_of(tag: &str) -> u64 {
    let mut words = tag.split_whitespace();
    match words.next() {
        Some("INSERT" | "UPDATE" | "DELETE" | "MERGE" | "COPY") => {
            words.next_back().and_then(|n| n.parse().ok()).unwrap_or(0)
        }
        _ => 0,
    }
}

fn server_error(body: &postgres_protocol::message::backend::ErrorResponseBody) -> SqlError {
    let mut fields = body.fields();
    error_of_fields(std::iter::from_fn(|| {
        fields
            .next()
            .ok()
            .flatten()
            .map(|field| (field.type_(), String::from_utf8_lossy(field.value_bytes()).into_owned()))
    }))
}

/// The error an ErrorResponse's fields (type, value) describe: its SQLSTATE and message.
pub(crate) fn error_of_fields(fields: impl Iterator<Item = (u8, String)>) -> SqlError {
    let mut code = String::from("XX000");
    let mut message = String::new();
    for (kind, value) in fields {
        match kind {
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
    }
    SqlError::new(crate::postgres::intern_code(&code), message)
}

fn encode_text(
    value: &Value,
    ty: &Type,
    out: &mut BytesMut,
) -> Result<postgres_protocol::IsNull, Box<dyn std::error::Error + Sync + Send>> {
    Ok(match crate::postgres::Param(value).to_sql(ty, out)? {
        IsNull::Yes => postgres_protocol::IsNull::Yes,
        IsNull::No => postgres_protocol::IsNull::No,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_come_from_the_command_tag() {
        assert_eq!(changes_of("INSERT 0 3"), 3);
        assert_eq!(changes_of("UPDATE 12"), 12);
        assert_eq!(changes_of("DELETE 0"), 0);
        assert_eq!(changes_of("SELECT 5"), 0);
        assert_eq!(changes_of("CREATE TABLE"), 0);
    }
}
