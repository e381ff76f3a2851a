//! One client connection: pgwire decodes the messages and runs our handlers, and this loop
//! decides when replies leave. pgwire's own loop writes to the socket at every reply message
//! (three writes per statement of the extended protocol: BindComplete, CommandComplete,
//! ReadyForQuery); like PostgreSQL, this one holds replies until no further message is already
//! waiting, so a pipelined transaction's replies leave in one write and the client wakes once.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::{FutureExt, SinkExt, StreamExt};
use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::PgWireFrontendMessage;
use pgwire::tokio::server::{negotiate_tls, process_error, process_message};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::codec::{Framed, FramedParts};

/// A client that has not finished its startup in this long is dropped (as pgwire does).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Replies held beyond this many bytes are written at once (a large result set streams).
const HELD_REPLY_BYTES: usize = 64 * 1024;

/// A stream whose writes are held until `release`; `flush` only moves bytes into the hold.
struct Corked<T> {
    inner: T,
    held: Vec<u8>,
    /// How much of `held` the socket has taken.
    written: usize,
}

impl<T: AsyncWrite + Unpin> Corked<T> {
    fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.held.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.held.clear();
        self.written = 0;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    async fn release(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_release(cx)).await
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Corked<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Corked<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.held.len() >= HELD_REPLY_BYTES {
            ready!(self.poll_release(cx))?;
        }
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_release(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How a connection learns that its node shuts down, and whether its session may be closed.
pub struct Closing {
    /// Becomes true when the node drains.
    pub signal: watch::Receiver<bool>,
    /// No transaction open: the session may end between two statements.
    pub idle: Box<dyn Fn() -> bool + Send + Sync>,
}

/// Serves one client until it leaves, breaks the protocol, or its node shuts down while it has
/// no transaction open (`closing`). With `tls`, a client that does not ask for TLS
/// (sslmode=disable) is told it must and let go.
pub async fn converse<H: PgWireServerHandlers>(
    socket: TcpStream,
    handlers: H,
    tls: Option<&chorus_tls::ServerTls>,
    mut closing: Closing,
) -> io::Result<()> {
    let acceptor = tls.map(chorus_tls::ServerTls::acceptor);
    let Ok(negotiated) = tokio::time::timeout(STARTUP_TIMEOUT, negotiate_tls(socket, acceptor)).await else {
        return Ok(());
    };
    let Some(mut plain) = negotiated? else {
        return Ok(());
    };
    if tls.is_some() && !plain.is_secure() {
        let refusal = PgWireError::UserError(Box::new(ErrorInfo::new(
            "FATAL".into(),
            "28000".into(),
            "this server accepts TLS connections only: connect with sslmode=require, or verify-full \
             with the cluster's CA certificate"
                .into(),
        )));
        process_error(&mut plain, refusal, false).await?;
        plain.flush().await?;
        return Ok(());
    }
    let old = plain.into_parts();
    let mut parts = FramedParts::new(
        Corked {
            inner: old.io,
            held: Vec::new(),
            written: 0,
        },
        old.codec,
    );
    parts.read_buf = old.read_buf;
    parts.write_buf = old.write_buf;
    let mut socket = Framed::from_parts(parts);
    let startup = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    loop {
        let message = match socket.next().now_or_never() {
            Some(message) => message,
            None => {
                socket.flush().await?;
                socket.get_mut().release().await?;
                let starting = matches!(
                    socket.state(),
                    PgWireConnectionState::AwaitingStartup | PgWireConnectionState::AuthenticationInProgress
                );
                let next = async {
                    if starting {
                        tokio::time::timeout(STARTUP_TIMEOUT, socket.next())
                            .await
                            .unwrap_or_default()
                    } else {
                        socket.next().await
                    }
                };
                let next = tokio::select! {
                    biased;
                    () = chorus_log::drain::until_idle(&mut closing.signal, &closing.idle) => None,
                    message = next => Some(message),
                };
                match next {
                    Some(message) => message,
                    None => {
                        // PostgreSQL's words and SQLSTATE for a session its server shuts down.
                        let shutdown = PgWireError::UserError(Box::new(ErrorInfo::new(
                            "FATAL".into(),
                            crate::error::SqlError::ADMIN_SHUTDOWN.into(),
                            "terminating connection due to administrator command: this node is shutting \
                             down; connect to another node of the cluster"
                                .into(),
                        )));
                        process_error(&mut socket, shutdown, false).await?;
                        break;
                    }
                }
            }
        };
        let Some(Ok(message)) = message else {
            break;
        };
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        let extended_protocol = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let cancelling = matches!(message, PgWireFrontendMessage::CancelRequest(_));
        let outcome = process_message(
            message,
            &mut socket,
            startup.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        )
        .await;
        if let Err(mut e) = outcome {
            errors.on_error(&socket, &mut e);
            let fatal = e.is_fatal();
            process_error(&mut socket, e, extended_protocol).await?;
            if fatal {
                break;
            }
        }
        if cancelling {
            break;
        }
    }
    socket.flush().await?;
    let corked = socket.get_mut();
    corked.release().await?;
    // The client may already be gone; there is nothing left to tell it.
    let _ = corked.inner.shutdown().await;
    Ok(())
}
