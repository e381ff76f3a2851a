//! Errors a SQL client sees, each with the SQLSTATE a PostgreSQL client expects.

const NOT_REPLICABLE: &str = "not replicable: ";

/// An error for the client: a SQLSTATE code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (SQLSTATE {code})")]
pub struct SqlError {
    pub code: &'static str,
    pub message: String,
}

impl SqlError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        SqlError {
            code,
            message: message.into(),
        }
    }

    pub fn syntax(message: &str) -> Self {
        Self::new("42601", message)
    }

    pub fn reserved_name() -> Self {
        Self::new(
            "42939",
            format!("names starting with {} belong to Chorus", crate::text::RESERVED_PREFIX),
        )
    }

    pub fn unsupported(message: String) -> Self {
        Self::new("0A000", message)
    }

    /// A statement whose result would differ between replicas.
    pub fn nondeterministic(message: String) -> Self {
        Self::new("0A000", format!("{NOT_REPLICABLE}{message}"))
    }

    /// Whether this is `nondeterministic`'s error: the statement runs, but only its
    /// write-set can be replicated.
    pub fn is_nondeterministic(&self) -> bool {
        self.code == "0A000" && self.message.starts_with(NOT_REPLICABLE)
    }

    /// A write reached a replica; `leader` is the leader's node id (0: none known).
    pub fn read_only(leader: u64) -> Self {
        let hint = match leader {
            0 => "no leader is known yet, retry shortly".to_owned(),
            id => format!("send writes to the leader, node {id}"),
        };
        Self::new("25006", format!("this node is a replica and serves reads only; {hint}"))
    }

    /// The connection to the database failed (SQLSTATE class 08): nothing the statement did.
    pub fn is_connection_failure(&self) -> bool {
        self.code.starts_with("08")
    }

    /// A write reached a node elected leader a moment ago, still applying what earlier
    /// leaders committed.
    pub fn not_leading_yet() -> Self {
        Self::new(
            "25006",
            "this node is still applying what earlier leaders committed and takes no writes yet; retry shortly",
        )
    }

    pub fn in_failed_transaction() -> Self {
        Self::new(
            "25P02",
            "current transaction is aborted, commands ignored until end of transaction block",
        )
    }

    /// The transaction did not commit and may be retried.
    pub fn serialization(message: &str) -> Self {
        Self::new("40001", message)
    }

    /// Whether the transaction committed is not known (the leader changed or the log stalled
    /// after it was proposed).
    pub fn outcome_unknown(message: &str) -> Self {
        Self::new("08007", message)
    }

    pub fn lock_timeout(waited_ms: u64) -> Self {
        Self::new(
            "55P03",
            format!("another session held the write lock for more than {waited_ms} ms; retry"),
        )
    }

    /// SQLSTATE admin_shutdown: the node is shutting down.
    pub const ADMIN_SHUTDOWN: &'static str = "57P01";

    pub fn shutting_down(message: &str) -> Self {
        Self::new(Self::ADMIN_SHUTDOWN, message)
    }

    pub fn unavailable(message: &str) -> Self {
        Self::new("57P03", message)
    }

    /// A write that does not fit the rows it meets: an integrity constraint, or a write-set's
    /// row not as it expects. Hybrid replication voids a certified write-set that fails so.
    pub fn is_conflict(&self) -> bool {
        self.code.starts_with("23") || self.code == crate::write_set::ROW_MISMATCH
    }

    /// An error the engine gave while executing a statement.
    pub fn from_sqlite(error: &rusqlite::Error) -> Self {
        use rusqlite::ffi::ErrorCode;
        let code = match error {
            rusqlite::Error::SqliteFailure(e, message) => {
                let message = message.as_deref().unwrap_or("");
                match e.code {
                    ErrorCode::ConstraintViolation => match e.extended_code {
                        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                            "23505"
                        }
                        rusqlite::ffi::SQLITE_CONSTRAINT_NOTNULL => "23502",
                        rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => "23503",
                        rusqlite::ffi::SQLITE_CONSTRAINT_CHECK => "23514",
                        _ => "23000",
                    },
                    ErrorCode::ReadOnly => "25006",
                    ErrorCode::TooBig => "54000",
                    ErrorCode::TypeMismatch => "42804",
                    _ if message.starts_with("no such table") => "42P01",
                    _ if message.starts_with("no such column") => "42703",
                    _ if message.starts_with("no such function") => "42883",
                    _ if message.contains("syntax error") || message.contains("incomplete input") => "42601",
                    _ if message.contains("already exists") => "42P07",
                    _ => "XX000",
                }
            }
            rusqlite::Error::MultipleStatement => "42601",
            rusqlite::Error::InvalidParameterCount(..) | rusqlite::Error::InvalidParameterName(_) => "08P01",
            _ => "XX000",
        };
        Self::new(code, error.to_string())
    }
}
