//! Chorus through `chorus_client::CurpSession`: the client itself sends each write to the leader
//! and every witness (CURP's fast path from afar, as Xline's clients do). Reads, the load phase
//! and network checks go over plain RESP to the first address, where `compare` puts the leader.

use std::time::Duration;

use bytes::Bytes;
use chorus_client::{CurpReply, CurpSession, Value};

use crate::resp_target::{insert_command, update_command, RespSession, RespTarget};
use crate::target::{OpError, Record, Session, Target};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct CurpTarget {
    /// Every node, the one reads go to first.
    pub resp: RespTarget,
}

impl Target for CurpTarget {
    type Session = CurpClientSession;

    fn name(&self) -> String {
        self.resp.name.clone()
    }

    async fn connect(&self, _client: usize) -> anyhow::Result<CurpClientSession> {
        let plain = RespTarget {
            addrs: vec![self.resp.addrs[0]],
            ..self.resp.clone()
        };
        Ok(CurpClientSession {
            plain: plain.connect(0).await?,
            curp: CurpSession::connect(&self.resp.addrs, REQUEST_TIMEOUT).await?,
            hashes: self.resp.fields > 1,
        })
    }
}

pub struct CurpClientSession {
    plain: RespSession,
    curp: CurpSession,
    hashes: bool,
}

impl CurpClientSession {
    async fn write(&mut self, command: Vec<Bytes>) -> Result<(), OpError> {
        match self.curp.write(&command).await {
            Ok(CurpReply::Fast(Value::Error(e)) | CurpReply::Slow(Value::Error(e))) => Err(OpError::Rejected(e)),
            Ok(_) => Ok(()),
            Err(e) => Err(OpError::Connection(e.to_string())),
        }
    }
}

impl Session for CurpClientSession {
    async fn insert(&mut self, key: &str, fields: &[Bytes]) -> Result<(), OpError> {
        self.write(insert_command(self.hashes, key, fields)).await
    }

    async fn load(&mut self, records: &[Record]) -> Result<(), OpError> {
        self.plain.load(records).await
    }

    async fn read(&mut self, key: &str) -> Result<bool, OpError> {
        self.plain.read(key).await
    }

    async fn update(&mut self, key: &str, field: usize, value: &Bytes) -> Result<(), OpError> {
        self.write(update_command(self.hashes, key, field, value)).await
    }

    async fn scan(&mut self, keys: &[String]) -> Result<usize, OpError> {
        self.plain.scan(keys).await
    }

    async fn ping(&mut self) -> Result<f64, OpError> {
        self.plain.ping().await
    }
}
