//! Routes the raft crate's slog output into `tracing`, so there is one log stream per process.

use std::fmt::{self, Write};

pub struct TracingDrain;

struct Fields(String);

impl slog::Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, val: &fmt::Arguments) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        let mut fields = Fields(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut fields);
        let _ = slog::KV::serialize(values, record, &mut fields);
        let message = record.msg();
        let fields = fields.0;
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{message}{fields}"),
            slog::Level::Warning => tracing::warn!(target: "raft", "{message}{fields}"),
            slog::Level::Info => tracing::info!(target: "raft", "{message}{fields}"),
            slog::Level::Debug => tracing::debug!(target: "raft", "{message}{fields}"),
            slog::Level::Trace => tracing::trace!(target: "raft", "{message}{fields}"),
        }
        Ok(())
    }
}
