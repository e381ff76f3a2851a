//! A small async client for Chorus over RESP, with pipelining. It speaks the public protocol
//! only, so it works against any node (and against Redis) — except [`RiflSession`], Chorus's
//! exactly-once writes under an id the application owns, and [`CurpSession`], which also takes
//! CURP's fast path itself.

mod curp;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BytesMut};
pub use chorus_resp::Value;
use chorus_resp::{parse_value, write_command, Limits};
pub use curp::{CurpReply, CurpSession};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection to {addr} failed: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("server closed the connection")]
    Closed,
    #[error("malformed reply: {0}")]
    Protocol(#[from] chorus_resp::Error),
    #[error("server error: {0}")]
    Server(String),
    #[error("TLS: {0}")]
    Tls(String),
}

/// A connection's byte stream: plain TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub struct Client {
    addr: SocketAddr,
    stream: Box<dyn Io>,
    input: BytesMut,
    output: Vec<u8>,
    timeout: Duration,
    limits: Limits,
}

impl Client {
    /// Connects with a default per-request timeout of 10 s.
    pub async fn connect(addr: SocketAddr) -> Result<Client, ClientError> {
        let stream = Self::connect_tcp(addr).await?;
        Ok(Self::over(addr, Box::new(stream)))
    }

    /// Connects over TLS, verifying the node's certificate against the CA certificate(s) in
    /// `ca_cert` (PEM) for the address's IP.
    pub async fn connect_tls(addr: SocketAddr, ca_cert: &std::path::Path) -> Result<Client, ClientError> {
        let connector = chorus_tls::client_connector(ca_cert).map_err(ClientError::Tls)?;
        let stream = Self::connect_tcp(addr).await?;
        let timeout = Duration::from_secs(10);
        let stream = tokio::time::timeout(timeout, connector.connect(addr.ip().into(), stream))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map_err(|source| ClientError::Connect { addr, source })?;
        Ok(Self::over(addr, Box::new(stream)))
    }

    async fn connect_tcp(addr: SocketAddr) -> Result<TcpStream, ClientError> {
        let timeout = Duration::from_secs(10);
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map_err(|source| ClientError::Connect { addr, source })?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    fn over(addr: SocketAddr, stream: Box<dyn Io>) -> Client {
        let timeout = Duration::from_secs(10);
        Client {
            addr,
            stream,
            input: BytesMut::with_capacity(16 * 1024),
            output: Vec::with_capacity(1024),
            timeout,
            limits: Limits::default(),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sends one command and waits for its reply. Server errors come back as `Value::Error`.
    pub async fn command<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Value, ClientError> {
        let mut replies = self.pipeline(std::slice::from_ref(&args)).await?;
        Ok(replies.pop().expect("one reply per command"))
    }

    /// Sends several commands in one write and returns their replies in order.
    pub async fn pipeline<C: AsRef<[A]>, A: AsRef<[u8]>>(&mut self, commands: &[C]) -> Result<Vec<Value>, ClientError> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.pipeline_inner(commands))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// The next value the server sends unasked (a pub/sub message once subscribed).
    pub async fn receive(&mut self) -> Result<Value, ClientError> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.next_value())
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    async fn next_value(&mut self) -> Result<Value, ClientError> {
        loop {
            if let Some((value, used)) = parse_value(&self.input, &self.limits)? {
                self.input.advance(used);
                return Ok(value);
            }
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(ClientError::Closed);
            }
        }
    }

    async fn pipeline_inner<C: AsRef<[A]>, A: AsRef<[u8]>>(
        &mut self,
        commands: &[C],
    ) -> Result<Vec<Value>, ClientError> {
        self.output.clear();
        for c in commands {
            write_command(c.as_ref(), &mut self.output);
        }
        self.stream.write_all(&self.output).await?;
        let mut replies = Vec::with_capacity(commands.len());
        while replies.len() < commands.len() {
            replies.push(self.next_value().await?);
        }
        Ok(replies)
    }
}

/// A RIFL client id the application owns: its writes carry (id, sequence number), so one whose
/// connection was lost — its node died mid-write — is sent again, to any node, and executes at
/// most once. Writes go one at a time: wrap one, send it until an answer arrives (anything but a
/// lost connection or a timeout), then mark it answered before wrapping the next.
#[derive(Debug, Clone)]
pub struct RiflSession {
    incarnation: u64,
    next_seq: u64,
    first_unacked: u64,
}

/// One write of a session, ready to send (and send again) as it is.
#[derive(Debug, Clone)]
pub struct RiflWrite {
    pub seq: u64,
    pub command: Vec<Vec<u8>>,
}

impl RiflSession {
    /// Registers a new id through `client`'s node (one log write).
    pub async fn register(client: &mut Client) -> Result<RiflSession, ClientError> {
        match client.command(&["RIFL", "REGISTER"]).await? {
            Value::Integer(id) if id > 0 => Ok(RiflSession {
                incarnation: id as u64,
                next_seq: 1,
                first_unacked: 1,
            }),
            Value::Error(e) => Err(ClientError::Server(e)),
            other => Err(ClientError::Server(format!("unexpected RIFL REGISTER reply {other:?}"))),
        }
    }

    /// The next write, as `RIFL WRITE incarnation seq first_unacked command...`.
    pub fn wrap<A: AsRef<[u8]>>(&mut self, args: &[A]) -> RiflWrite {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut command: Vec<Vec<u8>> = vec![
            b"RIFL".to_vec(),
            b"WRITE".to_vec(),
            self.incarnation.to_string().into_bytes(),
            seq.to_string().into_bytes(),
            self.first_unacked.to_string().into_bytes(),
        ];
        command.extend(args.iter().map(|a| a.as_ref().to_vec()));
        RiflWrite { seq, command }
    }

    /// `write` was answered: its record at the servers may go with the next write.
    pub fn answered(&mut self, write: &RiflWrite) {
        self.first_unacked = self.first_unacked.max(write.seq + 1);
    }
}
