//! Chorus and Redis over RESP. Records of one field are plain strings (SET/GET/MGET, like
//! redis-benchmark); records of several fields are hashes (HSET/HGETALL, like YCSB's Redis
//! binding). With `wait_replicas`, every write is followed by `WAIT n 0` in the same round trip,
//! so it is acknowledged only once n replicas have it: Redis's replicated-write mode.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_client::{Client, ClientError, Value};

use crate::target::{field_name, OpError, Record, Session, Target};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Commands per pipelined round trip while loading.
const LOAD_PIPELINE: usize = 128;

#[derive(Debug, Clone)]
pub struct RespTarget {
    pub name: String,
    /// Client i connects to `addrs[i % len]`.
    pub addrs: Vec<SocketAddr>,
    pub fields: usize,
    pub wait_replicas: Option<u32>,
    /// Connect over TLS, trusting this CA certificate.
    pub tls_ca: Option<std::path::PathBuf>,
}

impl Target for RespTarget {
    type Session = RespSession;

    fn name(&self) -> String {
        self.name.clone()
    }

    async fn connect(&self, client: usize) -> anyhow::Result<RespSession> {
        let addr = self.addrs[client % self.addrs.len()];
        let mut connection = match &self.tls_ca {
            Some(ca) => Client::connect_tls(addr, ca).await?,
            None => Client::connect(addr).await?,
        };
        connection.set_timeout(REQUEST_TIMEOUT);
        Ok(RespSession {
            client: connection,
            hashes: self.fields > 1,
            wait_replicas: self.wait_replicas,
        })
    }
}

pub struct RespSession {
    client: Client,
    hashes: bool,
    wait_replicas: Option<u32>,
}

fn connection_error(e: ClientError) -> OpError {
    OpError::Connection(e.to_string())
}

fn rejected(value: &Value) -> Option<OpError> {
    match value {
        Value::Error(e) => Some(OpError::Rejected(e.clone())),
        _ => None,
    }
}

pub(crate) fn insert_command(hashes: bool, key: &str, fields: &[Bytes]) -> Vec<Bytes> {
    if hashes {
        let mut args = Vec::with_capacity(2 + fields.len() * 2);
        args.push(Bytes::from_static(b"HSET"));
        args.push(Bytes::from(key.to_string()));
        for (i, value) in fields.iter().enumerate() {
            args.push(Bytes::from(field_name(i)));
            args.push(value.clone());
        }
        args
    } else {
        vec![
            Bytes::from_static(b"SET"),
            Bytes::from(key.to_string()),
            fields[0].clone(),
        ]
    }
}

pub(crate) fn update_command(hashes: bool, key: &str, field: usize, value: &Bytes) -> Vec<Bytes> {
    let key = Bytes::from(key.to_string());
    if hashes {
        vec![
            Bytes::from_static(b"HSET"),
            key,
            Bytes::from(field_name(field)),
            value.clone(),
        ]
    } else {
        vec![Bytes::from_static(b"SET"), key, value.clone()]
    }
}

impl RespSession {
    /// Sends write commands (plus WAIT when configured) in one round trip; checks every reply.
    async fn write(&mut self, mut commands: Vec<Vec<Bytes>>) -> Result<(), OpError> {
        if let Some(n) = self.wait_replicas {
            commands.push(vec![
                Bytes::from_static(b"WAIT"),
                Bytes::from(n.to_string()),
                Bytes::from_static(b"0"),
            ]);
        }
        let replies = self.client.pipeline(&commands).await.map_err(connection_error)?;
        if let Some(e) = replies.iter().find_map(rejected) {
            return Err(e);
        }
        if let (Some(n), Some(Value::Integer(acked))) = (self.wait_replicas, replies.last()) {
            if *acked < i64::from(n) {
                return Err(OpError::Rejected(format!("WAIT: {acked} of {n} replicas acknowledged")));
            }
        }
        Ok(())
    }
}

impl Session for RespSession {
    async fn insert(&mut self, key: &str, fields: &[Bytes]) -> Result<(), OpError> {
        self.write(vec![insert_command(self.hashes, key, fields)]).await
    }

    async fn load(&mut self, records: &[Record]) -> Result<(), OpError> {
        for chunk in records.chunks(LOAD_PIPELINE) {
            let commands = chunk
                .iter()
                .map(|(key, fields)| insert_command(self.hashes, key, fields))
                .collect();
            self.write(commands).await?;
        }
        Ok(())
    }

    async fn read(&mut self, key: &str) -> Result<bool, OpError> {
        let command: [&[u8]; 2] = [if self.hashes { b"HGETALL" } else { b"GET" }, key.as_bytes()];
        let reply = self.client.command(&command).await.map_err(connection_error)?;
        if let Some(e) = rejected(&reply) {
            return Err(e);
        }
        Ok(match reply {
            Value::Bulk(found) => found.is_some(),
            Value::Array(Some(fields)) => !fields.is_empty(),
            _ => false,
        })
    }

    async fn update(&mut self, key: &str, field: usize, value: &Bytes) -> Result<(), OpError> {
        self.write(vec![update_command(self.hashes, key, field, value)]).await
    }

    async fn scan(&mut self, keys: &[String]) -> Result<usize, OpError> {
        if !self.hashes {
            let mut command = vec![b"MGET".to_vec()];
            command.extend(keys.iter().map(|k| k.as_bytes().to_vec()));
            let reply = self.client.command(&command).await.map_err(connection_error)?;
            if let Some(e) = rejected(&reply) {
                return Err(e);
            }
            let Value::Array(Some(values)) = reply else {
                return Err(OpError::Rejected("MGET did not answer an array".into()));
            };
            return Ok(values.iter().filter(|v| matches!(v, Value::Bulk(Some(_)))).count());
        }
        let commands: Vec<[&[u8]; 2]> = keys.iter().map(|k| [b"HGETALL".as_slice(), k.as_bytes()]).collect();
        let replies = self.client.pipeline(&commands).await.map_err(connection_error)?;
        if let Some(e) = replies.iter().find_map(rejected) {
            return Err(e);
        }
        Ok(replies
            .iter()
            .filter(|r| matches!(r, Value::Array(Some(f)) if !f.is_empty()))
            .count())
    }

    async fn ping(&mut self) -> Result<f64, OpError> {
        let started = Instant::now();
        let reply = self.client.command(&["PING"]).await.map_err(connection_error)?;
        if let Some(e) = rejected(&reply) {
            return Err(e);
        }
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }
}
