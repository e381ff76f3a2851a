//! The leader's logical decoding stream: a replication connection to the node's own PostgreSQL
//! that receives `test_decoding`'s lines for each committed transaction, from the slot the
//! node keeps while it leads (passive replication on the PostgreSQL engine).
//!
//! A stream rather than `pg_logical_slot_get_changes`: that function starts decoding again at
//! the slot's restart point on every call — up to the last running-transactions record, which
//! PostgreSQL writes every 15 s — so each transaction would re-read seconds of WAL. A stream
//! decodes each record once.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, BytesMut};
use postgres_protocol::message::frontend;

use crate::error::SqlError;

/// The node's slot, on its own server: one per server, as one node writes to it.
pub const SLOT: &str = "chorus_writes";

/// How long the writer waits for a committed transaction's changes.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A frame larger than this is not PostgreSQL talking.
const FRAME_MAX_BYTES: usize = 1 << 30;

/// Reports the position received back to the server (so it can recycle WAL) this often.
const REPORT_EVERY_TRANSACTIONS: u32 = 64;

/// Microseconds from the Unix epoch to PostgreSQL's, 2000-01-01.
const POSTGRES_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

pub struct Stream {
    socket: TcpStream,
    incoming: BytesMut,
    /// The end of the last transaction received, reported as processed.
    received_lsn: u64,
    unreported: u32,
}

fn io_error(e: std::io::Error) -> SqlError {
    SqlError::new("08006", format!("the node's PostgreSQL decoding stream failed: {e}"))
}

fn protocol_error(what: &str) -> SqlError {
    SqlError::new(
        "08P01",
        format!("unexpected message on the node's PostgreSQL decoding stream: {what}"),
    )
}

/// The SQLSTATE and message of an ErrorResponse's body.
fn server_error(body: &[u8]) -> SqlError {
    crate::pg_blocking::error_of_fields(
        body.split(|b| *b == 0)
            .filter_map(|field| field.split_first())
            .map(|(&kind, value)| (kind, String::from_utf8_lossy(value).into_owned())),
    )
}

impl Stream {
    /// Connects for replication to `config`'s server and starts streaming the slot.
    pub fn start(config: &tokio_postgres::Config) -> Result<Stream, SqlError> {
        // wal_sender_timeout = 0: the writer reads only when it commits, and may be idle long.
        let (socket, incoming) = crate::pg_blocking::Connection::connect_raw(
            config,
            "-c wal_sender_timeout=0",
            &[("replication", "database")],
            READ_TIMEOUT,
        )?;
        let mut stream = Stream {
            socket,
            incoming,
            received_lsn: 0,
            unreported: 0,
        };
        let mut out = BytesMut::new();
        let start =
            format!("START_REPLICATION SLOT {SLOT} LOGICAL 0/0 (\"skip-empty-xacts\" '1', \"include-xids\" '0')");
        frontend::query(&start, &mut out).map_err(io_error)?;
        stream.send(&out)?;
        loop {
            match stream.frame()? {
                (b'W', _) => return Ok(stream),
                (b'E', body) => return Err(server_error(&body)),
                (b'N' | b'S', _) => {}
                (tag, _) => return Err(protocol_error(&format!("message '{}' at the start", tag as char))),
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), SqlError> {
        self.socket.write_all(bytes).map_err(io_error)
    }

    /// The next message: its tag and body.
    fn frame(&mut self) -> Result<(u8, BytesMut), SqlError> {
        loop {
            if self.incoming.len() >= 5 {
                let len = u32::from_be_bytes(self.incoming[1..5].try_into().expect("4 bytes")) as usize;
                if !(4..=FRAME_MAX_BYTES).contains(&len) {
                    return Err(protocol_error(&format!("a frame of {len} bytes")));
                }
                if self.incoming.len() > len {
                    let mut frame = self.incoming.split_to(len + 1);
                    let tag = frame[0];
                    frame.advance(5);
                    return Ok((tag, frame));
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = crate::pg_blocking::read_some(&mut self.socket, &mut chunk).map_err(io_error)?;
            if n == 0 {
                return Err(io_error(std::io::ErrorKind::UnexpectedEof.into()));
            }
            self.incoming.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next line of output, answering the server's keepalives on the way.
    fn line(&mut self) -> Result<(String, u64), SqlError> {
        loop {
            let (tag, mut body) = self.frame()?;
            match tag {
                b'd' => {}
                b'E' => return Err(server_error(&body)),
                b'N' => continue,
                other => return Err(protocol_error(&format!("message '{}' in the stream", other as char))),
            }
            match body.first() {
                Some(b'w') if body.len() >= 25 => {
                    body.advance(1);
                    let start_lsn = body.get_u64();
                    body.advance(16);
                    let line =
                        String::from_utf8(body.to_vec()).map_err(|_| protocol_error("a line that is not UTF-8"))?;
                    return Ok((line, start_lsn));
                }
                Some(b'k') if body.len() >= 18 => {
                    if body[17] == 1 {
                        self.report()?;
                    }
                }
                _ => return Err(protocol_error("a replication message of an unknown kind")),
            }
        }
    }

    /// The lines of the next committed transaction, BEGIN and COMMIT left out.
    pub fn next_transaction(&mut self) -> Result<Vec<String>, SqlError> {
        let mut lines = Vec::new();
        let mut begun = false;
        loop {
            let (line, lsn) = self.line()?;
            // Changes start "table " or "message:": the first word tells the transaction's bounds.
            if line.starts_with("BEGIN") {
                begun = true;
                continue;
            }
            match line.starts_with("COMMIT") {
                true if begun => {
                    self.received_lsn = self.received_lsn.max(lsn);
                    self.unreported += 1;
                    if self.unreported >= REPORT_EVERY_TRANSACTIONS {
                        self.report()?;
                    }
                    return Ok(lines);
                }
                false if begun => lines.push(line),
                _ => return Err(protocol_error("a change outside a transaction")),
            }
        }
    }

    /// Tells the server everything received is processed: the slot may let its WAL go.
    fn report(&mut self) -> Result<(), SqlError> {
        let now_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
            - POSTGRES_EPOCH_UNIX_MICROS;
        let mut update = BytesMut::with_capacity(34);
        update.put_u8(b'r');
        for _ in 0..3 {
            update.put_u64(self.received_lsn);
        }
        update.put_i64(now_micros);
        update.put_u8(0);
        let mut out = BytesMut::new();
        frontend::CopyData::new(update.freeze())
            .map_err(io_error)?
            .write(&mut out);
        self.unreported = 0;
        self.send(&out)
    }
}
