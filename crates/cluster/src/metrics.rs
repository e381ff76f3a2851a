//! A node's Prometheus metrics, read over HTTP: what benchmarks and the chaos harness learn
//! from a running node beyond its replies.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The text of `GET /metrics` on `addr`.
pub async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    let fetch = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: chorus\r\nConnection: close\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .with_context(|| format!("http://{addr}/metrics did not answer in 5 s"))?
        .with_context(|| format!("cannot read http://{addr}/metrics"))?;
    let text = String::from_utf8_lossy(&response);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("http://{addr}/metrics sent no complete response");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!("http://{addr}/metrics answered {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

/// Sum of every sample of metric `name` (all label sets) in `text`.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_label_set_of_one_metric_and_no_other() {
        let text = "# HELP a_total x\na_total{reason=\"x\"} 2\na_total{reason=\"y\"} 3\na_total_more 7\nb 1\n";
        assert_eq!(metric_sum(text, "a_total"), 5.0);
        assert_eq!(metric_sum(text, "b"), 1.0);
        assert_eq!(metric_sum(text, "c"), 0.0);
    }
}
