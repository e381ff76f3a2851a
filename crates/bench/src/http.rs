//! A minimal HTTP/1.1 client over one keep-alive connection: enough to read a node's metrics page
//! (replies framed by Content-Length or chunked encoding).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

pub struct HttpConnection {
    addr: SocketAddr,
    stream: TcpStream,
    buf: Vec<u8>,
    timeout: Duration,
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("malformed HTTP response: {what}"),
    )
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl HttpConnection {
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<HttpConnection> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
        stream.set_nodelay(true)?;
        Ok(HttpConnection {
            addr,
            stream,
            buf: Vec::with_capacity(16 * 1024),
            timeout,
        })
    }

    pub async fn get(&mut self, path: &str) -> std::io::Result<Response> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.exchange(path))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer within {timeout:?}")))?
    }

    async fn exchange(&mut self, path: &str) -> std::io::Result<Response> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.addr);
        self.stream.write_all(request.as_bytes()).await?;

        let head_end = self.buffer_until(b"\r\n\r\n", "header too long").await?;
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end + 4);
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid("status line"))?;
        let mut content_length = None;
        let mut chunked = false;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = Some(value.parse::<usize>().map_err(|_| invalid("content-length"))?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
        let body = if chunked {
            self.read_chunked().await?
        } else {
            let len = content_length.ok_or_else(|| invalid("neither content-length nor chunked"))?;
            self.take(len).await?
        };
        Ok(Response { status, body })
    }

    /// Reads until `pattern` is buffered; returns where it starts.
    async fn buffer_until(&mut self, pattern: &[u8], too_long: &str) -> std::io::Result<usize> {
        loop {
            if let Some(at) = find(&self.buf, pattern) {
                return Ok(at);
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(invalid(too_long));
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
        Ok(())
    }

    async fn take(&mut self, len: usize) -> std::io::Result<Vec<u8>> {
        if len > MAX_BODY_BYTES {
            return Err(invalid("body too large"));
        }
        while self.buf.len() < len {
            self.fill().await?;
        }
        Ok(self.buf.drain(..len).collect())
    }

    async fn read_chunked(&mut self) -> std::io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = self.buffer_until(b"\r\n", "chunk size line too long").await?;
            let size_text = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size_hex = size_text.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16).map_err(|_| invalid("chunk size"))?;
            self.buf.drain(..line_end + 2);
            if size == 0 {
                // Trailers are not used by etcd; skip to the blank line.
                let end = self.buffer_until(b"\r\n", "trailer too long").await?;
                self.buf.drain(..end + 2);
                return Ok(body);
            }
            if body.len() + size > MAX_BODY_BYTES {
                return Err(invalid("body too large"));
            }
            let chunk = self.take(size + 2).await?;
            body.extend_from_slice(&chunk[..size]);
        }
    }
}
