//! A CURP-aware client, for applications far from every node: it sends each write to the leader
//! (`CURP PROPOSE`) and to every node's witness (`CURP RECORD`) itself, and is done in one round
//! trip when the leader answers before committing and a superquorum of witnesses holds the write
//! (all 3 of 3, 4 of 5). Otherwise it sends the write again as a `RIFL WRITE` under the same id,
//! which executes it once. Writes go one at a time, so every earlier write is answered before the
//! next is sent (the order a fast-path reply relies on).
//!
//! The witnesses are the voters of the cluster's configuration, as the leader reports them: a
//! write is recorded by those among the addresses given, and the leader speculates only if they
//! are still its voters (a membership change since sends the write the slow way, once).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::{Client, ClientError, RiflSession, Value};

/// Acceptances a fast-path write needs among `nodes` witnesses: f + ⌈f/2⌉ + 1 with f tolerated
/// failures (the servers' rule, `chorus_curp::witness::superquorum`).
fn superquorum(nodes: usize) -> usize {
    let f = (nodes - 1) / 2;
    f + f.div_ceil(2) + 1
}

/// What a connection was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    Propose,
    Record,
}

/// How a fast-path attempt ended.
enum Attempt {
    Fast(Value),
    /// The leader could not speculate and answered once the write applied.
    Applied(Value),
    /// Neither: the write is sent again as a `RIFL WRITE`.
    Failed,
}

/// A connection back from its request, with the reply.
type Returned = (usize, Half, Client, Result<Value, ClientError>);

struct Node {
    addr: SocketAddr,
    id: u64,
    /// One connection for the leader's half, one for the witness's: a `PROPOSE` may wait for
    /// its write to apply, and a `RECORD` must not wait behind it.
    propose: Option<Client>,
    record: Option<Client>,
}

pub struct CurpSession {
    rifl: RiflSession,
    nodes: Vec<Node>,
    /// The leader (an index into `nodes`), its term and its voters, as last learned.
    leader: Option<(usize, u64, Vec<u64>)>,
    /// Requests still out when the last write was decided; their connections come back here.
    in_flight: JoinSet<Returned>,
    timeout: Duration,
}

/// How a write was answered.
#[derive(Debug, Clone, PartialEq)]
pub enum CurpReply {
    /// In one round trip: the leader's speculative reply, with a superquorum of witnesses.
    Fast(Value),
    /// Once applied (a conflict, a witness refused or was down, or the leader moved).
    Slow(Value),
}

impl CurpReply {
    pub fn value(&self) -> &Value {
        match self {
            CurpReply::Fast(v) | CurpReply::Slow(v) => v,
        }
    }
}

async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Client, ClientError> {
    let mut client = Client::connect(addr).await?;
    client.set_timeout(timeout);
    Ok(client)
}

impl CurpSession {
    /// Connects to every node (all of the cluster's, with `--curp on`) and registers an id.
    pub async fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<CurpSession, ClientError> {
        let mut nodes = Vec::with_capacity(addrs.len());
        for &addr in addrs {
            let mut record = connect(addr, timeout).await?;
            let id = match record.command(&["CURP", "STATUS"]).await? {
                Value::Array(Some(items)) => match items.first() {
                    Some(Value::Integer(id)) => *id as u64,
                    _ => return Err(ClientError::Server("malformed CURP STATUS reply".into())),
                },
                Value::Error(e) => return Err(ClientError::Server(e)),
                other => return Err(ClientError::Server(format!("unexpected CURP STATUS reply {other:?}"))),
            };
            let propose = connect(addr, timeout).await?;
            nodes.push(Node {
                addr,
                id,
                propose: Some(propose),
                record: Some(record),
            });
        }
        let first = nodes
            .first_mut()
            .expect("at least one node")
            .propose
            .as_mut()
            .expect("connected");
        let rifl = RiflSession::register(first).await?;
        let mut session = CurpSession {
            rifl,
            nodes,
            leader: None,
            in_flight: JoinSet::new(),
            timeout,
        };
        // Found now, so the first write does not pay for asking every node; without a leader
        // yet, the first write asks again.
        let _ = session.find_leader().await;
        Ok(session)
    }

    /// Asks every node whom it follows; the leader of the highest term any reports, and its
    /// voters as the leader itself reports them.
    async fn find_leader(&mut self) -> Result<(usize, u64, Vec<u64>), ClientError> {
        let mut best: Option<(u64, u64)> = None;
        let mut voters_by_node = Vec::new();
        for node in &mut self.nodes {
            let Some(client) = node.record.as_mut() else {
                continue;
            };
            if let Ok(Value::Array(Some(items))) = client.command(&["CURP", "STATUS"]).await {
                if let [_, Value::Integer(leader), Value::Integer(term), Value::Array(Some(voters))] = items.as_slice()
                {
                    if *leader > 0 && best.is_none_or(|(t, _)| (*term as u64) > t) {
                        best = Some((*term as u64, *leader as u64));
                    }
                    let voters: Vec<u64> = voters
                        .iter()
                        .filter_map(|v| match v {
                            Value::Integer(id) => Some(*id as u64),
                            _ => None,
                        })
                        .collect();
                    voters_by_node.push((node.id, voters));
                }
            }
        }
        let (term, leader_id) = best.ok_or_else(|| ClientError::Server("TRYAGAIN no node knows a leader".into()))?;
        let index =
            self.nodes.iter().position(|n| n.id == leader_id).ok_or_else(|| {
                ClientError::Server(format!("the leader, node {leader_id}, is not among the addresses"))
            })?;
        // None while a change is half done: those writes take the slow way.
        let voters = voters_by_node
            .into_iter()
            .find_map(|(id, voters)| (id == leader_id).then_some(voters))
            .unwrap_or_default();
        self.leader = Some((index, term, voters.clone()));
        Ok((index, term, voters))
    }

    /// Takes back the connections of requests still out, reconnecting those that failed.
    async fn settle_in_flight(&mut self) {
        while let Some(joined) = self.in_flight.join_next().await {
            if let Ok(returned) = joined {
                // The write these answered was decided already.
                let _ = self.put_back(returned);
            }
        }
    }

    fn put_back(&mut self, (index, half, client, result): Returned) -> Result<Value, ClientError> {
        let usable = !matches!(
            result,
            Err(ClientError::Io(_) | ClientError::Closed | ClientError::Timeout(_) | ClientError::Protocol(_))
        );
        let slot = match half {
            Half::Propose => &mut self.nodes[index].propose,
            Half::Record => &mut self.nodes[index].record,
        };
        if usable {
            *slot = Some(client);
        }
        result
    }

    async fn connection(&mut self, index: usize, half: Half) -> Result<Client, ClientError> {
        let node = &mut self.nodes[index];
        let slot = match half {
            Half::Propose => &mut node.propose,
            Half::Record => &mut node.record,
        };
        match slot.take() {
            Some(client) => Ok(client),
            None => connect(node.addr, self.timeout).await,
        }
    }

    fn send(&mut self, index: usize, half: Half, mut client: Client, command: Vec<Vec<u8>>) {
        self.in_flight.spawn(async move {
            let result = client.command(&command).await;
            (index, half, client, result)
        });
    }

    /// Executes one write, exactly once.
    pub async fn write<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<CurpReply, ClientError> {
        self.settle_in_flight().await;
        let write = self.rifl.wrap(args);
        let reply = match self.try_fast(&write.command[2..]).await {
            Attempt::Fast(value) => CurpReply::Fast(value),
            Attempt::Applied(value) => CurpReply::Slow(value),
            Attempt::Failed => CurpReply::Slow(self.resend(&write.command).await?),
        };
        self.rifl.answered(&write);
        Ok(reply)
    }

    /// One fast-path attempt of the write whose `RIFL WRITE` arguments are `envelope_and_command`
    /// (incarnation, seq, first_unacked, command...).
    async fn try_fast(&mut self, envelope_and_command: &[Vec<u8>]) -> Attempt {
        let known = match self.leader.clone() {
            Some(known) => Some(known),
            None => self.find_leader().await.ok(),
        };
        let Some((leader, term, voters)) = known else {
            return Attempt::Failed;
        };
        if voters.is_empty() {
            // A membership change is half done; ask again next time.
            self.leader = None;
            return Attempt::Failed;
        }
        let witnesses = voters.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let with_half = |half: &str| {
            let mut command = vec![
                b"CURP".to_vec(),
                half.as_bytes().to_vec(),
                term.to_string().into_bytes(),
            ];
            if half == "PROPOSE" {
                command.push(witnesses.clone().into_bytes());
            }
            command.extend_from_slice(envelope_and_command);
            command
        };
        let Ok(client) = self.connection(leader, Half::Propose).await else {
            return Attempt::Failed;
        };
        self.send(leader, Half::Propose, client, with_half("PROPOSE"));
        for index in 0..self.nodes.len() {
            if !voters.contains(&self.nodes[index].id) {
                continue;
            }
            if let Ok(client) = self.connection(index, Half::Record).await {
                self.send(index, Half::Record, client, with_half("RECORD"));
            }
        }
        let needed = superquorum(voters.len());
        let (mut accepted, mut refused) = (0, 0);
        let mut speculated = None;
        while let Some(Ok(returned)) = self.in_flight.join_next().await {
            let half = returned.1;
            let result = self.put_back(returned);
            match (half, result) {
                (Half::Record, Ok(Value::Simple(ok))) if ok == "OK" => accepted += 1,
                (Half::Record, _) => refused += 1,
                (Half::Propose, Ok(Value::Array(Some(items)))) if items.len() == 2 => match (&items[0], &items[1]) {
                    (Value::Bulk(Some(kind)), reply) if kind.as_ref() == b"SPECULATED" => {
                        speculated = Some(reply.clone())
                    }
                    (Value::Bulk(Some(kind)), reply) if kind.as_ref() == b"APPLIED" => {
                        return Attempt::Applied(reply.clone())
                    }
                    _ => return Attempt::Failed,
                },
                (Half::Propose, _) => {
                    self.leader = None;
                    return Attempt::Failed;
                }
            }
            if let Some(reply) = &speculated {
                if accepted >= needed {
                    return Attempt::Fast(reply.clone());
                }
                if voters.len() - refused < needed {
                    return Attempt::Failed;
                }
            }
        }
        Attempt::Failed
    }

    /// Sends the write as `RIFL WRITE` until a node answers: the leader first, then the others.
    async fn resend(&mut self, command: &[Vec<u8>]) -> Result<Value, ClientError> {
        let first = self.leader.as_ref().map_or(0, |(index, ..)| *index);
        let mut last_error = None;
        for attempt in 0..self.nodes.len() * 3 {
            let index = (first + attempt) % self.nodes.len();
            let mut client = match self.connection(index, Half::Propose).await {
                Ok(client) => client,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            let result = client.command(command).await;
            match self.put_back((index, Half::Propose, client, result)) {
                Ok(Value::Error(e))
                    if e.starts_with("TRYAGAIN") || e.starts_with("UNCERTAIN") || e.starts_with("TIMEOUT") =>
                {
                    last_error = Some(ClientError::Server(e));
                    self.leader = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(value) => return Ok(value),
                Err(e) => {
                    self.leader = None;
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or(ClientError::Closed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superquorums_of_three_and_five() {
        assert_eq!((superquorum(1), superquorum(3), superquorum(5)), (1, 3, 4));
    }
}
