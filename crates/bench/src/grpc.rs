//! Unary gRPC calls over HTTP/2, with protobuf messages encoded and decoded by hand: enough to
//! drive etcd through its native API (as its own clients do) without a protobuf toolchain.
//!
//! A `Channel` is one HTTP/2 connection; calls from many sessions multiplex over it, as they do
//! over a gRPC client connection.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Per-stream and per-connection receive windows: large enough that 50 concurrent calls with
/// multi-kilobyte replies never wait for a window update.
const STREAM_WINDOW_BYTES: u32 = 1 << 20;
const CONNECTION_WINDOW_BYTES: u32 = 16 << 20;
/// gRPC's message prefix: a compression flag and a 32-bit big-endian length.
const MESSAGE_PREFIX_BYTES: usize = 5;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The connection failed, timed out or broke the protocol; open a new channel.
    Transport(String),
    /// The server answered with a non-zero grpc-status.
    Status { code: u32, message: String },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transport(e) => write!(f, "{e}"),
            CallError::Status { code, message } => write!(f, "grpc-status {code}: {message}"),
        }
    }
}

impl std::error::Error for CallError {}

fn transport(context: &str) -> impl Fn(h2::Error) -> CallError + '_ {
    move |e| CallError::Transport(format!("{context}: {e}"))
}

#[derive(Clone)]
pub struct Channel {
    send: h2::client::SendRequest<Bytes>,
    authority: String,
    timeout: Duration,
    /// Drives the connection; finished once it has closed.
    driver: std::sync::Arc<JoinHandle<()>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Channel({})", self.authority)
    }
}

impl Channel {
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> anyhow::Result<Channel> {
        let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow::anyhow!("connecting to {addr} timed out"))??;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .handshake(tcp)
            .await?;
        // The connection ends when it closes or breaks; the next call reports why.
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Channel {
            send,
            authority: addr.to_string(),
            timeout,
            driver: std::sync::Arc::new(driver),
        })
    }

    /// Whether the connection has closed (a new channel is needed).
    pub fn is_closed(&self) -> bool {
        self.driver.is_finished()
    }

    /// Calls `path` (`/package.Service/Method`) with an encoded request; returns the encoded reply.
    pub async fn unary(&self, path: &str, message: &[u8]) -> Result<Bytes, CallError> {
        tokio::time::timeout(self.timeout, self.call(path, message))
            .await
            .unwrap_or_else(|_| {
                Err(CallError::Transport(format!(
                    "{path} timed out after {:?}",
                    self.timeout
                )))
            })
    }

    async fn call(&self, path: &str, message: &[u8]) -> Result<Bytes, CallError> {
        let mut send = self.send.clone().ready().await.map_err(transport("connection"))?;
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(|e| CallError::Transport(format!("bad request for {path}: {e}")))?;
        let (response, mut stream) = send.send_request(request, false).map_err(transport("send"))?;
        let mut framed = BytesMut::with_capacity(MESSAGE_PREFIX_BYTES + message.len());
        framed.put_u8(0);
        framed.put_u32(message.len() as u32);
        framed.put_slice(message);
        stream.send_data(framed.freeze(), true).map_err(transport("send"))?;

        let (parts, mut body) = response.await.map_err(transport("response"))?.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(CallError::Transport(format!("{path}: HTTP status {}", parts.status)));
        }
        // A failed call may answer with headers only, the status among them.
        check_status(&parts.headers)?;
        let mut reply = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(transport("reply"))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            reply.extend_from_slice(&chunk);
        }
        match body.trailers().await.map_err(transport("trailers"))? {
            Some(trailers) => check_status(&trailers)?,
            None if parts.headers.contains_key("grpc-status") => {}
            None => return Err(CallError::Transport(format!("{path}: reply without grpc-status"))),
        }
        unframe(reply.freeze()).map_err(|e| CallError::Transport(format!("{path}: {e}")))
    }
}

fn check_status(headers: &http::HeaderMap) -> Result<(), CallError> {
    let Some(code) = headers.get("grpc-status") else {
        return Ok(());
    };
    let code: u32 = code
        .to_str()
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| CallError::Transport(format!("unreadable grpc-status {code:?}")))?;
    if code == 0 {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
        .unwrap_or_default();
    Err(CallError::Status { code, message })
}

/// The one message of a unary reply, without its prefix.
fn unframe(mut reply: Bytes) -> Result<Bytes, String> {
    if reply.len() < MESSAGE_PREFIX_BYTES {
        return Err(format!("reply of {} bytes has no message prefix", reply.len()));
    }
    let compressed = reply.get_u8();
    let len = reply.get_u32() as usize;
    if compressed != 0 {
        return Err("compressed reply, though none was asked for".into());
    }
    if len != reply.len() {
        return Err(format!("message prefix says {len} bytes, {} arrived", reply.len()));
    }
    Ok(reply)
}

/// Protobuf's wire format, as far as the messages we exchange need it, on the project's LEB128
/// varints (`chorus_unicache::varint`).
pub mod proto {
    use chorus_unicache::varint::{self, Reader};

    /// A field's value as it appears on the wire.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Value<'a> {
        Varint(u64),
        Bytes(&'a [u8]),
        Fixed64(&'a [u8]),
        Fixed32(&'a [u8]),
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct DecodeError(pub String);

    impl std::error::Error for DecodeError {}

    impl std::fmt::Display for DecodeError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "malformed protobuf: {}", self.0)
        }
    }

    impl From<chorus_unicache::Error> for DecodeError {
        fn from(e: chorus_unicache::Error) -> DecodeError {
            DecodeError(e.to_string())
        }
    }

    pub fn put_uint(out: &mut Vec<u8>, field: u32, value: u64) {
        varint::put(out, u64::from(field) << 3);
        varint::put(out, value);
    }

    pub fn put_bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
        varint::put(out, u64::from(field) << 3 | 2);
        varint::put_bytes(out, value);
    }

    /// An embedded message, written by `write`.
    pub fn put_message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
        let mut inner = Vec::new();
        write(&mut inner);
        put_bytes(out, field, &inner);
    }

    /// The fields of a message, in wire order; the first malformed one ends the iteration.
    pub struct Fields<'a> {
        reader: Reader<'a>,
        failed: bool,
    }

    pub fn fields(message: &[u8]) -> Fields<'_> {
        Fields {
            reader: Reader::new(message),
            failed: false,
        }
    }

    impl<'a> Fields<'a> {
        fn next_field(&mut self) -> Result<(u32, Value<'a>), DecodeError> {
            let key = self.reader.varint()?;
            let field = u32::try_from(key >> 3).map_err(|_| DecodeError("field number too large".into()))?;
            let value = match key & 7 {
                0 => Value::Varint(self.reader.varint()?),
                1 => Value::Fixed64(self.reader.take(8)?),
                2 => Value::Bytes(self.reader.bytes()?),
                5 => Value::Fixed32(self.reader.take(4)?),
                _ => return Err(DecodeError("unsupported wire type".into())),
            };
            Ok((field, value))
        }
    }

    impl<'a> Iterator for Fields<'a> {
        type Item = Result<(u32, Value<'a>), DecodeError>;

        fn next(&mut self) -> Option<Self::Item> {
            if self.failed || self.reader.is_empty() {
                return None;
            }
            let next = self.next_field();
            self.failed = next.is_err();
            Some(next)
        }
    }

    /// The unsigned value of field `field` (the last occurrence wins, as protobuf says), or 0.
    pub fn uint(message: &[u8], field: u32) -> Result<u64, DecodeError> {
        let mut found = 0;
        for f in fields(message) {
            if let (number, Value::Varint(v)) = f? {
                if number == field {
                    found = v;
                }
            }
        }
        Ok(found)
    }

    /// Every length-delimited occurrence of field `field` (repeated fields, embedded messages).
    pub fn all_bytes(message: &[u8], field: u32) -> Result<Vec<&[u8]>, DecodeError> {
        let mut found = Vec::new();
        for f in fields(message) {
            if let (number, Value::Bytes(b)) = f? {
                if number == field {
                    found.push(b);
                }
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::proto::{self, Value};
    use super::*;

    #[test]
    fn messages_round_trip_through_the_wire_format() {
        let mut message = Vec::new();
        proto::put_bytes(&mut message, 1, b"key");
        proto::put_uint(&mut message, 3, 300);
        proto::put_message(&mut message, 2, |inner| proto::put_uint(inner, 4, u64::MAX));
        let decoded: Vec<_> = proto::fields(&message).collect::<Result<_, _>>().unwrap();
        assert_eq!(decoded[0], (1, Value::Bytes(b"key")));
        assert_eq!(decoded[1], (3, Value::Varint(300)));
        let (2, Value::Bytes(inner)) = decoded[2] else {
            panic!("{:?}", decoded[2])
        };
        assert_eq!(proto::uint(inner, 4).unwrap(), u64::MAX);
        assert_eq!(proto::uint(&message, 3).unwrap(), 300);
        assert_eq!(proto::all_bytes(&message, 1).unwrap(), vec![b"key".as_slice()]);
        // Known bytes: field 1, varint 150 (the protobuf documentation's example).
        assert_eq!(proto::uint(&[0x08, 0x96, 0x01], 1).unwrap(), 150);
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let mut message = Vec::new();
        proto::put_bytes(&mut message, 1, &[7; 200]);
        proto::put_uint(&mut message, 2, u64::MAX);
        for cut in 0..message.len() {
            let outcome: Result<Vec<_>, _> = proto::fields(&message[..cut]).collect();
            assert!(
                cut == 0 || cut == 203 || outcome.is_err(),
                "prefix of {cut} bytes decoded"
            );
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let junk: Vec<u8> = (0..(seed % 24) as usize)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = proto::fields(&junk).count();
            let _ = proto::uint(&junk, 1);
        }
        assert!(proto::uint(&[0xff; 11], 1).is_err(), "an endless varint");
        assert!(proto::uint(&[0x0b], 1).is_err(), "wire type 3 (groups)");
    }

    #[test]
    fn a_reply_is_one_prefixed_uncompressed_message() {
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0, 0, 2, 8, 1])).unwrap(),
            &[8, 1][..]
        );
        assert!(unframe(Bytes::from_static(&[0, 0, 0, 0, 3, 8, 1])).is_err());
        assert!(unframe(Bytes::from_static(&[1, 0, 0, 0, 2, 8, 1])).is_err());
        assert!(unframe(Bytes::from_static(&[0, 0])).is_err());
    }
}
