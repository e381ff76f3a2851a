//! etcd through its native gRPC API (`etcdserverpb.KV`), the way its own clients reach it. A
//! record of one field is one key; a record of several fields is one key per field
//! (`KEY/fieldN`), so an update writes one field, as on the RESP targets, and a read is one
//! linearizable range request over the record.
//!
//! Sessions share one HTTP/2 connection per member address, as calls from the goroutines of a
//! Go program share its etcd client's connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::grpc::{proto, CallError, Channel};
use crate::target::{field_name, OpError, Record, Session, Target};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// etcd's default limit on operations in one transaction (--max-txn-ops).
const MAX_TXN_OPS: usize = 128;

const PUT: &str = "/etcdserverpb.KV/Put";
const RANGE: &str = "/etcdserverpb.KV/Range";
const TXN: &str = "/etcdserverpb.KV/Txn";
const STATUS: &str = "/etcdserverpb.Maintenance/Status";
const MOVE_LEADER: &str = "/etcdserverpb.Maintenance/MoveLeader";

#[derive(Debug, Clone)]
pub struct EtcdTarget {
    pub addrs: Vec<SocketAddr>,
    pub fields: usize,
    channels: Arc<Mutex<HashMap<SocketAddr, Channel>>>,
}

impl EtcdTarget {
    pub fn new(addrs: Vec<SocketAddr>, fields: usize) -> EtcdTarget {
        EtcdTarget {
            addrs,
            fields,
            channels: Arc::default(),
        }
    }

    /// The same members (and connections) for records of another shape.
    pub fn with_fields(&self, fields: usize) -> EtcdTarget {
        EtcdTarget { fields, ..self.clone() }
    }

    /// The open channel to `addr`, or a new one if there is none or it has closed.
    async fn channel(&self, addr: SocketAddr) -> anyhow::Result<Channel> {
        if let Some(channel) = self.channels.lock().expect("channels lock").get(&addr) {
            if !channel.is_closed() {
                return Ok(channel.clone());
            }
        }
        let channel = Channel::connect(addr, REQUEST_TIMEOUT).await?;
        self.channels
            .lock()
            .expect("channels lock")
            .insert(addr, channel.clone());
        Ok(channel)
    }
}

impl Target for EtcdTarget {
    type Session = EtcdSession;

    fn name(&self) -> String {
        "etcd".into()
    }

    async fn connect(&self, client: usize) -> anyhow::Result<EtcdSession> {
        let addr = self.addrs[client % self.addrs.len()];
        Ok(EtcdSession {
            channel: self.channel(addr).await?,
            fields: self.fields,
        })
    }
}

pub struct EtcdSession {
    channel: Channel,
    fields: usize,
}

fn op_error(e: CallError) -> OpError {
    match e {
        CallError::Transport(e) => OpError::Connection(e),
        status => OpError::Rejected(status.to_string()),
    }
}

fn malformed(e: proto::DecodeError) -> OpError {
    OpError::Rejected(format!("etcd reply: {e}"))
}

/// A PutRequest: key = 1, value = 2.
fn put_request(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    proto::put_bytes(out, 1, key);
    proto::put_bytes(out, 2, value);
}

/// A RangeRequest over [key, range_end): key = 1, range_end = 2; linearizable (the default).
fn range_request(key: &[u8], range_end: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + range_end.len() + 4);
    proto::put_bytes(&mut out, 1, key);
    proto::put_bytes(&mut out, 2, range_end);
    out
}

/// A TxnRequest with no compares whose success branch (field 2) puts every pair; each
/// RequestOp carries its PutRequest as field 2.
fn txn_request<'a>(puts: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in puts {
        proto::put_message(&mut out, 2, |op| {
            proto::put_message(op, 2, |put| put_request(put, key, value));
        });
    }
    out
}

impl EtcdSession {
    fn field_key(&self, key: &str, field: usize) -> String {
        if self.fields == 1 {
            key.to_string()
        } else {
            format!("{key}/{}", field_name(field))
        }
    }

    /// Number of keys in [key, range_end): the kvs (field 2) of the RangeResponse.
    async fn range(&mut self, key: &str, range_end: &str) -> Result<usize, OpError> {
        let request = range_request(key.as_bytes(), range_end.as_bytes());
        let reply = self.channel.unary(RANGE, &request).await.map_err(op_error)?;
        Ok(proto::all_bytes(&reply, 2).map_err(malformed)?.len())
    }

    async fn txn(&mut self, puts: &[(String, Bytes)]) -> Result<(), OpError> {
        for chunk in puts.chunks(MAX_TXN_OPS) {
            let request = txn_request(chunk.iter().map(|(k, v)| (k.as_bytes(), v.as_ref())));
            let reply = self.channel.unary(TXN, &request).await.map_err(op_error)?;
            // TxnResponse.succeeded = 2: with no compares, the success branch always runs.
            if proto::uint(&reply, 2).map_err(malformed)? != 1 {
                return Err(OpError::Rejected("transaction did not succeed".into()));
            }
        }
        Ok(())
    }

    fn record_puts(&self, key: &str, fields: &[Bytes]) -> Vec<(String, Bytes)> {
        fields
            .iter()
            .enumerate()
            .map(|(i, value)| (self.field_key(key, i), value.clone()))
            .collect()
    }
}

impl Session for EtcdSession {
    async fn insert(&mut self, key: &str, fields: &[Bytes]) -> Result<(), OpError> {
        if self.fields == 1 {
            return self.update(key, 0, &fields[0]).await;
        }
        let puts = self.record_puts(key, fields);
        self.txn(&puts).await
    }

    async fn load(&mut self, records: &[Record]) -> Result<(), OpError> {
        let puts: Vec<_> = records
            .iter()
            .flat_map(|(key, fields)| self.record_puts(key, fields))
            .collect();
        self.txn(&puts).await
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
        let mut request = Vec::with_capacity(key.len() + value.len() + 8);
        put_request(&mut request, key.as_bytes(), value);
        self.channel.unary(PUT, &request).await.map_err(op_error)?;
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
        self.channel.unary(STATUS, &[]).await.map_err(op_error)?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }
}

/// A member's view of the cluster: its own id and its leader's (0 when it knows none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    pub leader_id: u64,
}

/// Maintenance.Status of the member at `addr`: StatusResponse.header (1) holds member_id (2);
/// the leader is field 4.
pub async fn member_status(addr: SocketAddr) -> anyhow::Result<MemberStatus> {
    let channel = Channel::connect(addr, REQUEST_TIMEOUT).await?;
    let reply = channel.unary(STATUS, &[]).await?;
    let header = proto::all_bytes(&reply, 1)?;
    let header = header.last().copied().unwrap_or_default();
    Ok(MemberStatus {
        member_id: proto::uint(header, 2)?,
        leader_id: proto::uint(&reply, 4)?,
    })
}

/// Asks the leader at `leader` to hand leadership to member `target_id` (MoveLeaderRequest.targetID = 1).
pub async fn move_leader(leader: SocketAddr, target_id: u64) -> anyhow::Result<()> {
    let channel = Channel::connect(leader, REQUEST_TIMEOUT).await?;
    let mut request = Vec::new();
    proto::put_uint(&mut request, 1, target_id);
    channel.unary(MOVE_LEADER, &request).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_nests_each_put_in_a_request_op_of_the_success_branch() {
        let request = txn_request([(b"k".as_slice(), b"v".as_slice())].into_iter());
        // success(2) { request_put(2) { key(1) "k", value(2) "v" } }
        assert_eq!(request, vec![0x12, 8, 0x12, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
        assert_eq!(range_request(b"a", b"b"), vec![0x0a, 1, b'a', 0x12, 1, b'b']);
    }
}
