//! Who may act through the metrics port. Looking (the status page, `/metrics`, `GET /members`)
//! is open, as Prometheus expects; acting — failover, membership changes, a backup of every
//! key — needs a user with every right (HTTP Basic, the RESP and SQL users' passwords) when the
//! node has users. Failed logins are throttled per address and counted, as on the client ports.

use std::net::IpAddr;
use std::sync::Arc;

use chorus_auth::{basic_credentials, LoginRefused, Logins, Rights, Users};

pub struct AdminGate {
    logins: Logins,
}

/// Why a request was not let through: the HTTP status line and body to answer with.
pub struct Refusal {
    pub status: &'static str,
    pub body: String,
}

impl AdminGate {
    /// None when anyone may connect to the client ports and write: nothing to guard.
    pub fn new(users: Arc<Users>) -> Option<AdminGate> {
        if users.open_to_anyone() {
            return None;
        }
        Some(AdminGate {
            logins: Logins::new(
                users,
                "chorus_admin_login_failures_total",
                "Metrics-port actions refused for their credentials, by why",
            ),
        })
    }

    /// Lets `request` (its head) from `remote` through if it only looks, or carries the
    /// credentials of an enabled user with every right.
    pub fn check(&self, request: &[u8], remote: IpAddr) -> Result<(), Refusal> {
        if only_looks(request) {
            return Ok(());
        }
        let Some((user, password)) = authorization(request).and_then(basic_credentials) else {
            return Err(unauthorized(
                "this node has users: act as one with every right (HTTP Basic)",
            ));
        };
        match self.logins.log_in(&user, &password, remote) {
            Ok(user) if user.rights == Rights::ReadWrite => Ok(()),
            Ok(user) => Err(Refusal {
                status: "403 Forbidden",
                body: format!("user {} may not act on the cluster: it needs every right\n", user.name),
            }),
            Err(LoginRefused::Throttled { wait }) => Err(Refusal {
                status: "429 Too Many Requests",
                body: format!(
                    "too many failed logins from {remote}: try again in {} ms\n",
                    wait.as_millis().max(1)
                ),
            }),
            Err(LoginRefused::WrongPassword) => {
                tracing::info!(%remote, user = %String::from_utf8_lossy(&user), "metrics-port login refused");
                Err(unauthorized("invalid username-password pair or user is disabled"))
            }
        }
    }
}

fn unauthorized(why: &str) -> Refusal {
    Refusal {
        status: "401 Unauthorized",
        body: format!("{why}\n"),
    }
}

/// Requests that change nothing and reveal no key or value.
fn only_looks(request: &[u8]) -> bool {
    ["GET / ", "GET /metrics ", "GET /members "]
        .iter()
        .any(|open| request.starts_with(open.as_bytes()))
}

/// The value of the request head's `Authorization` header.
fn authorization(request: &[u8]) -> Option<&str> {
    let head = std::str::from_utf8(request).ok()?;
    head.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then_some(value.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "Authorization: Basic ZGVmYXVsdDpzM2NyZXQ="; // default:s3cret
    const READER: &str = "authorization: basic cmVhZGVyOnI="; // reader:r

    fn gate() -> AdminGate {
        let users = Users::from_config("s3cret", "user reader on >r +@read ~*").unwrap();
        AdminGate::new(Arc::new(users)).expect("a node with passwords is guarded")
    }

    fn request(line: &str, header: &str) -> Vec<u8> {
        format!("{line} HTTP/1.1\r\nHost: chorus\r\n{header}\r\n\r\n").into_bytes()
    }

    #[test]
    fn looking_is_open_acting_needs_a_user_with_every_right() {
        let gate = gate();
        let here: IpAddr = [127, 0, 0, 1].into();
        for open in ["GET /", "GET /metrics", "GET /members"] {
            assert!(gate.check(&request(open, ""), here).is_ok(), "{open}");
        }
        for act in ["GET /backup", "POST /failover", "POST /members/remove?ids=2"] {
            let refused = gate.check(&request(act, ""), here).expect_err(act);
            assert!(refused.status.starts_with("401"), "{act}: {}", refused.status);
            assert!(gate.check(&request(act, ADMIN), here).is_ok(), "{act}");
            let refused = gate.check(&request(act, READER), here).expect_err(act);
            assert!(refused.status.starts_with("403"), "{act}: {}", refused.status);
        }
        let no_users = Users::from_config("", "").unwrap();
        assert!(AdminGate::new(Arc::new(no_users)).is_none());
    }

    #[test]
    fn wrong_passwords_are_throttled_per_address() {
        let gate = gate();
        let guesser: IpAddr = [127, 0, 0, 9].into();
        let wrong = "Authorization: Basic ZGVmYXVsdDpndWVzcw=="; // default:guess
        let statuses: Vec<&str> = (0..12)
            .map(|_| {
                gate.check(&request("GET /backup", wrong), guesser)
                    .expect_err("a wrong password")
                    .status
            })
            .collect();
        assert!(statuses[0].starts_with("401"));
        assert!(statuses.iter().any(|s| s.starts_with("429")), "{statuses:?}");
        let elsewhere: IpAddr = [127, 0, 0, 1].into();
        assert!(gate.check(&request("GET /backup", ADMIN), elsewhere).is_ok());
    }
}
