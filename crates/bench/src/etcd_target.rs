//! etcd through its v3 JSON gateway (HTTP), so no gRPC toolchain is needed. A record of one field
//! is one key; a record of several fields is one key per field (`KEY/fieldN`), so an update
//! writes one field, as on the RESP targets, and a read is one range request over the record.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value as Json};

use crate::http::HttpConnection;
use crate::target::{field_name, OpError, Record, Session, Target};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// etcd's default limit on operations in one transaction (--max-txn-ops).
const MAX_TXN_OPS: usize = 128;

#[derive(Debug, Clone)]
pub struct EtcdTarget {
    pub addrs: Vec<SocketAddr>,
    pub fields: usize,
}

impl Target for EtcdTarget {
    type Session = EtcdSession;

    fn name(&self) -> String {
        "etcd".into()
    }

    async fn connect(&self, client: usize) -> anyhow::Result<EtcdSession> {
        let addr = self.addrs[client % self.addrs.len()];
        Ok(EtcdSession {
            http: HttpConnection::connect(addr, REQUEST_TIMEOUT).await?,
            fields: self.fields,
        })
    }
}

pub struct EtcdSession {
    http: HttpConnection,
    fields: usize,
}

/// Standard base64 with padding, as protobuf's JSON mapping encodes `bytes`.
pub fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn put_op(key: &str, value: &[u8]) -> Json {
    json!({"request_put": {"key": base64(key.as_bytes()), "value": base64(value)}})
}

impl EtcdSession {
    fn field_key(&self, key: &str, field: usize) -> String {
        if self.fields == 1 {
            key.to_string()
        } else {
            format!("{key}/{}", field_name(field))
        }
    }

    async fn call(&mut self, path: &str, body: &Json) -> Result<Json, OpError> {
        let body = serde_json::to_vec(body).expect("JSON encodes");
        let response = self
            .http
            .post(path, &body)
            .await
            .map_err(|e| OpError::Connection(e.to_string()))?;
        if response.status != 200 {
            return Err(OpError::Rejected(format!(
                "HTTP {}: {}",
                response.status,
                String::from_utf8_lossy(&response.body).trim()
            )));
        }
        serde_json::from_slice(&response.body).map_err(|e| OpError::Rejected(format!("bad JSON from etcd: {e}")))
    }

    /// Number of keys in [key, range_end).
    async fn range(&mut self, key: &str, range_end: &str) -> Result<usize, OpError> {
        let reply = self
            .call(
                "/v3/kv/range",
                &json!({"key": base64(key.as_bytes()), "range_end": base64(range_end.as_bytes())}),
            )
            .await?;
        Ok(reply.get("kvs").and_then(Json::as_array).map_or(0, Vec::len))
    }

    async fn txn(&mut self, puts: Vec<Json>) -> Result<(), OpError> {
        for ops in puts.chunks(MAX_TXN_OPS) {
            let reply = self.call("/v3/kv/txn", &json!({"success": ops})).await?;
            if reply.get("succeeded").and_then(Json::as_bool) != Some(true) {
                return Err(OpError::Rejected(format!("transaction did not succeed: {reply}")));
            }
        }
        Ok(())
    }

    fn record_puts(&self, key: &str, fields: &[Bytes]) -> Vec<Json> {
        fields
            .iter()
            .enumerate()
            .map(|(i, value)| put_op(&self.field_key(key, i), value))
            .collect()
    }
}

impl Session for EtcdSession {
    async fn insert(&mut self, key: &str, fields: &[Bytes]) -> Result<(), OpError> {
        if self.fields == 1 {
            return self.update(key, 0, &fields[0]).await;
        }
        let puts = self.record_puts(key, fields);
        self.txn(puts).await
    }

    async fn load(&mut self, records: &[Record]) -> Result<(), OpError> {
        let puts: Vec<Json> = records
            .iter()
            .flat_map(|(key, fields)| self.record_puts(key, fields))
            .collect();
        self.txn(puts).await
    }

    async fn read(&mut self, key: &str) -> Result<bool, OpError> {
        let found = if self.fields == 1 {
            self.range(key, &format!("{key}\0")).await?
        } else {
            // Every key of the record: "KEY/" up to (not including) "KEY0", since '0' follows '/'.
            self.range(&format!("{key}/"), &format!("{key}0")).await?
        };
        Ok(found > 0)
    }

    async fn update(&mut self, key: &str, field: usize, value: &Bytes) -> Result<(), OpError> {
        let key = self.field_key(key, field);
        self.call(
            "/v3/kv/put",
            &json!({"key": base64(key.as_bytes()), "value": base64(value)}),
        )
        .await?;
        Ok(())
    }

    async fn scan(&mut self, keys: &[String]) -> Result<usize, OpError> {
        let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
            return Ok(0);
        };
        let found = if self.fields == 1 {
            self.range(first, &format!("{last}\0")).await?
        } else {
            self.range(&format!("{first}/"), &format!("{last}0")).await? / self.fields
        };
        Ok(found)
    }

    async fn ping(&mut self) -> Result<f64, OpError> {
        let started = Instant::now();
        let response = self
            .http
            .get("/version")
            .await
            .map_err(|e| OpError::Connection(e.to_string()))?;
        if response.status != 200 {
            return Err(OpError::Rejected(format!("GET /version answered {}", response.status)));
        }
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }
}
