//! A peer connection's bytes: plain TCP, or — with `--peer-tls-*` — TLS on which both ends
//! present a certificate and take only one that chains to the cluster's CA, so an outsider can
//! neither join nor read or alter the replication stream on the path. The transport speaks it
//! asynchronously ([`PeerStream`]); snapshot shipments, on threads of their own, blocking
//! ([`BlockingPeerStream`]).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use chorus_tls::rustls::{ClientConnection, ServerConnection, StreamOwned};
use chorus_tls::rustls_pki_types::ServerName;
use chorus_tls::tokio_rustls::{TlsConnector, TlsStream};
use chorus_tls::PeerTls;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The name a peer's certificate must carry: the address it is dialed at.
fn server_name(addr: SocketAddr) -> ServerName<'static> {
    ServerName::IpAddress(addr.ip().into())
}

pub enum PeerStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl PeerStream {
    /// The accepting end of a connection: with TLS, the handshake that checks the dialer's
    /// certificate.
    pub async fn accept(tcp: TcpStream, tls: Option<&PeerTls>) -> Result<PeerStream, String> {
        let Some(tls) = tls else {
            return Ok(PeerStream::Plain(tcp));
        };
        let stream = tls.configs().acceptor.accept(tcp).await.map_err(|e| {
            format!("TLS handshake failed: {e} (does the peer present a certificate of this cluster's CA?)")
        })?;
        Ok(PeerStream::Tls(Box::new(TlsStream::Server(stream))))
    }

    /// The dialing end of a connection to the node at `addr`.
    pub async fn dial(tcp: TcpStream, addr: SocketAddr, tls: Option<&PeerTls>) -> Result<PeerStream, String> {
        let Some(tls) = tls else {
            return Ok(PeerStream::Plain(tcp));
        };
        let stream = TlsConnector::from(tls.configs().dialer)
            .connect(server_name(addr), tcp)
            .await
            .map_err(|e| {
                format!("TLS handshake failed: {e} (does the peer at {addr} have a certificate of this cluster's CA?)")
            })?;
        Ok(PeerStream::Tls(Box::new(TlsStream::Client(stream))))
    }

    /// The same connection, accepted, for blocking use (a snapshot shipment's receiver).
    pub fn into_blocking(self) -> Result<BlockingPeerStream, String> {
        let blocking = |tcp: TcpStream| {
            let tcp = tcp.into_std().map_err(|e| e.to_string())?;
            tcp.set_nonblocking(false).map_err(|e| e.to_string())?;
            Ok::<_, String>(tcp)
        };
        match self {
            PeerStream::Plain(tcp) => Ok(BlockingPeerStream::Plain(blocking(tcp)?)),
            PeerStream::Tls(stream) => match *stream {
                TlsStream::Server(stream) => {
                    // The session goes along, with whatever it already read and decrypted.
                    let (tcp, session) = stream.into_inner();
                    Ok(BlockingPeerStream::Server(Box::new(StreamOwned::new(
                        session,
                        blocking(tcp)?,
                    ))))
                }
                TlsStream::Client(_) => Err("a dialed connection cannot receive a shipment".into()),
            },
        }
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            PeerStream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            PeerStream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            PeerStream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            PeerStream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

pub enum BlockingPeerStream {
    Plain(std::net::TcpStream),
    Server(Box<StreamOwned<ServerConnection, std::net::TcpStream>>),
    Client(Box<StreamOwned<ClientConnection, std::net::TcpStream>>),
}

impl BlockingPeerStream {
    /// The dialing end of a connection to the node at `addr`; with TLS, the handshake happens
    /// on the first write.
    pub fn dial(tcp: std::net::TcpStream, addr: SocketAddr, tls: Option<&PeerTls>) -> Result<Self, String> {
        let Some(tls) = tls else {
            return Ok(BlockingPeerStream::Plain(tcp));
        };
        let session = ClientConnection::new(tls.configs().dialer, server_name(addr))
            .map_err(|e| format!("TLS to {addr}: {e}"))?;
        Ok(BlockingPeerStream::Client(Box::new(StreamOwned::new(session, tcp))))
    }

    /// The socket underneath, for its timeouts.
    pub fn socket(&self) -> &std::net::TcpStream {
        match self {
            BlockingPeerStream::Plain(tcp) => tcp,
            BlockingPeerStream::Server(tls) => tls.get_ref(),
            BlockingPeerStream::Client(tls) => tls.get_ref(),
        }
    }
}

impl Read for BlockingPeerStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            BlockingPeerStream::Plain(tcp) => tcp.read(buf),
            BlockingPeerStream::Server(tls) => tls.read(buf),
            BlockingPeerStream::Client(tls) => tls.read(buf),
        }
    }
}

impl Write for BlockingPeerStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            BlockingPeerStream::Plain(tcp) => tcp.write(buf),
            BlockingPeerStream::Server(tls) => tls.write(buf),
            BlockingPeerStream::Client(tls) => tls.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            BlockingPeerStream::Plain(tcp) => tcp.flush(),
            BlockingPeerStream::Server(tls) => tls.flush(),
            BlockingPeerStream::Client(tls) => tls.flush(),
        }
    }
}
