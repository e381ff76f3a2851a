//! Membership changes over a node's metrics port, which `chorus cluster add-node|remove-node`
//! use (and an operator may, with curl):
//!
//! - `GET /members`: one line per member — id, peer address, role — after the index of the
//!   change that made the configuration;
//! - `POST /members/learner?id=4&addr=127.0.0.1:7004`: add a learner;
//! - `POST /members/promote?ids=4,5`: make learners voters (several at once through a joint
//!   configuration);
//! - `POST /members/demote?ids=4`: make voters learners (not the leader), which still apply the
//!   log — how `remove-node` lets a node finish what it has under way before it leaves;
//! - `POST /members/remove?ids=4`: remove members (not the leader: hand leadership over first).
//!
//! Any node takes them: one that does not lead hands them to the leader over the peer link.

use std::net::SocketAddr;

use chorus_log::membership::{MemberChange, Members};
use chorus_log::{NodeError, NodeHandle, StateMachine};

/// The status line and body for a membership request, or `None` for another request.
pub async fn answer<S: StateMachine>(request: &[u8], node: &NodeHandle<S>) -> Option<(&'static str, String)> {
    let line = request.split(|b| *b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split(' ');
    let (method, target) = (words.next()?, words.next()?);
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if !path.starts_with("/members") {
        return None;
    }
    if method == "GET" && path == "/members" {
        return Some(("200 OK", describe(&node.members())));
    }
    if method != "POST" {
        return Some(("405 Method Not Allowed", "membership changes are POSTs\n".into()));
    }
    let change = match parse_change(path, query) {
        Ok(change) => change,
        Err(reason) => return Some(("400 Bad Request", format!("{reason}\n"))),
    };
    Some(match node.change_members(change).await {
        Ok(members) => ("200 OK", describe(&members)),
        Err(NodeError::MembershipRefused(reason)) => ("409 Conflict", format!("{reason}\n")),
        Err(e) => ("503 Service Unavailable", format!("{e}\n")),
    })
}

fn parse_change(path: &str, query: &str) -> Result<MemberChange, String> {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| format!("{path} needs ?{name}=..."))
    };
    let ids = |text: &str| -> Result<Vec<u64>, String> {
        let ids: Vec<u64> = text
            .split(',')
            .map(|id| id.parse().ok().filter(|id| *id > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("'{text}' is not a list of node ids (positive integers, comma separated)"))?;
        Ok(ids)
    };
    match path {
        "/members/learner" => {
            let id = *ids(param("id")?)?.first().expect("split yields one part at least");
            let addr: SocketAddr = param("addr")?
                .parse()
                .map_err(|_| "addr must be the new node's peer address, host:port".to_string())?;
            Ok(MemberChange::AddLearner { id, addr })
        }
        "/members/promote" => Ok(MemberChange::Promote(ids(param("ids")?)?)),
        "/members/remove" => Ok(MemberChange::Remove(ids(param("ids")?)?)),
        "/members/demote" => Ok(MemberChange::Demote(ids(param("ids")?)?)),
        _ => Err(format!(
            "no {path}: POST /members/learner?id=N&addr=HOST:PORT, /members/promote?ids=N,..., \
             /members/demote?ids=N,... or /members/remove?ids=N,..."
        )),
    }
}

/// `conf_index N` then `id addr role` per member.
pub fn describe(members: &Members) -> String {
    let cs = &members.conf_state;
    let mut out = format!("conf_index {}\n", members.conf_index);
    for id in members.ids() {
        let role = if cs.voters.contains(&id) {
            "voter"
        } else if cs.voters_outgoing.contains(&id) {
            "leaving"
        } else {
            "learner"
        };
        let addr = members
            .addresses
            .get(&id)
            .map_or("unknown".to_string(), |a| a.to_string());
        out.push_str(&format!("{id} {addr} {role}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_parse_from_the_path_and_bad_ones_say_what_is_expected() {
        assert_eq!(
            parse_change("/members/learner", "id=4&addr=127.0.0.1:7004"),
            Ok(MemberChange::AddLearner {
                id: 4,
                addr: "127.0.0.1:7004".parse().unwrap()
            })
        );
        assert_eq!(
            parse_change("/members/promote", "ids=4,5"),
            Ok(MemberChange::Promote(vec![4, 5]))
        );
        assert_eq!(
            parse_change("/members/remove", "ids=2"),
            Ok(MemberChange::Remove(vec![2]))
        );
        assert_eq!(
            parse_change("/members/demote", "ids=3"),
            Ok(MemberChange::Demote(vec![3]))
        );
        assert!(parse_change("/members/remove", "ids=0")
            .unwrap_err()
            .contains("node ids"));
        assert!(parse_change("/members/learner", "id=4").unwrap_err().contains("?addr="));
        assert!(parse_change("/members/learner", "id=4&addr=nowhere")
            .unwrap_err()
            .contains("peer address"));
        assert!(parse_change("/members/grow", "")
            .unwrap_err()
            .contains("/members/promote"));
    }
}
