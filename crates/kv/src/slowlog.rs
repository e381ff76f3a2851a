//! SLOWLOG: the commands this node took longer than a threshold to answer, newest first, in
//! Redis's form. A command's time runs from when the node read it to when its reply was ready
//! to send, so a write's includes its commit on a majority; pipelined commands' replies go out
//! together, so each counts until the last of its batch is ready. Each node keeps its own log
//! and settings (as each Redis server does); neither is replicated nor kept across restarts.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use chorus_resp::Value;

/// Redis's defaults: 10 ms, and the latest 128 entries.
pub const DEFAULT_SLOWER_THAN_US: i64 = 10_000;
pub const DEFAULT_MAX_LEN: u64 = 128;

/// Most arguments an entry keeps (the last one kept says how many more there were), and most
/// bytes of each, as Redis keeps.
const MAX_ARGS: usize = 32;
const MAX_ARG_BYTES: usize = 128;

pub struct SlowLog {
    /// `slowlog-log-slower-than`: negative logs nothing, 0 every command.
    slower_than_us: AtomicI64,
    /// `slowlog-max-len`.
    max_len: AtomicU64,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    next_id: u64,
    newest_first: VecDeque<Entry>,
}

struct Entry {
    id: u64,
    unix_secs: u64,
    took_us: u64,
    args: Vec<Bytes>,
    client_addr: SocketAddr,
    client_name: Bytes,
}

/// Who sent a command, as an entry shows it.
pub struct Sender<'a> {
    pub addr: SocketAddr,
    pub name: Option<&'a Bytes>,
}

impl SlowLog {
    pub fn new(slower_than_us: i64, max_len: u64) -> SlowLog {
        SlowLog {
            slower_than_us: AtomicI64::new(slower_than_us),
            max_len: AtomicU64::new(max_len),
            entries: Mutex::new(Entries::default()),
        }
    }

    /// Whether any command is logged at all (checked before a command's arguments are kept).
    pub fn enabled(&self) -> bool {
        self.slower_than_us.load(Ordering::Relaxed) >= 0
    }

    /// Logs the command `args` if it took at least the threshold.
    pub fn note(&self, args: &[Bytes], took: Duration, sender: &Sender) {
        let threshold_us = self.slower_than_us.load(Ordering::Relaxed);
        let took_us = took.as_micros() as u64;
        if threshold_us < 0 || took_us < threshold_us as u64 {
            return;
        }
        let max_len = self.max_len.load(Ordering::Relaxed) as usize;
        let entry_args = kept_args(args);
        let unix_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let mut entries = self.entries.lock().expect("not poisoned");
        let id = entries.next_id;
        entries.next_id += 1;
        entries.newest_first.push_front(Entry {
            id,
            unix_secs,
            took_us,
            args: entry_args,
            client_addr: sender.addr,
            client_name: sender.name.map(|name| Bytes::copy_from_slice(name)).unwrap_or_default(),
        });
        entries.newest_first.truncate(max_len);
    }

    /// SLOWLOG GET: the newest `count` entries (all of them for None).
    pub fn newest(&self, count: Option<usize>) -> Value {
        let entries = self.entries.lock().expect("not poisoned");
        let count = count.unwrap_or(usize::MAX);
        Value::array(
            entries
                .newest_first
                .iter()
                .take(count)
                .map(|entry| {
                    Value::array(vec![
                        Value::Integer(entry.id as i64),
                        Value::Integer(entry.unix_secs as i64),
                        Value::Integer(entry.took_us as i64),
                        Value::array(entry.args.iter().map(|arg| Value::Bulk(Some(arg.clone()))).collect()),
                        Value::bulk(entry.client_addr.to_string()),
                        Value::Bulk(Some(entry.client_name.clone())),
                    ])
                })
                .collect(),
        )
    }

    pub fn len(&self) -> usize {
        self.entries.lock().expect("not poisoned").newest_first.len()
    }

    pub fn reset(&self) {
        self.entries.lock().expect("not poisoned").newest_first.clear();
    }

    pub fn slower_than_us(&self) -> i64 {
        self.slower_than_us.load(Ordering::Relaxed)
    }

    pub fn max_len(&self) -> u64 {
        self.max_len.load(Ordering::Relaxed)
    }

    pub fn set_slower_than_us(&self, us: i64) {
        self.slower_than_us.store(us, Ordering::Relaxed);
    }

    /// A shorter log drops its oldest entries now, as Redis's does.
    pub fn set_max_len(&self, max_len: u64) {
        self.max_len.store(max_len, Ordering::Relaxed);
        let mut entries = self.entries.lock().expect("not poisoned");
        entries.newest_first.truncate(max_len as usize);
    }
}

/// What an entry keeps of a command: copies (a slice would keep the connection's whole input
/// buffer alive), cut as Redis cuts them, passwords redacted, and a transaction as its EXEC.
fn kept_args(args: &[Bytes]) -> Vec<Bytes> {
    if args[0].as_ref() == b"EXEC" && args.len() > 1 {
        // The front end's own form of a transaction (`exec_args`), not what the client sent.
        return vec![Bytes::from_static(b"exec")];
    }
    let redacted = crate::monitor::redacted(args);
    let shown = if args.len() > MAX_ARGS {
        MAX_ARGS - 1
    } else {
        args.len()
    };
    let mut kept: Vec<Bytes> = redacted[..shown]
        .iter()
        .map(|arg| {
            if arg.len() > MAX_ARG_BYTES {
                let mut cut = arg[..MAX_ARG_BYTES].to_vec();
                cut.extend_from_slice(format!("... ({} more bytes)", arg.len() - MAX_ARG_BYTES).as_bytes());
                Bytes::from(cut)
            } else {
                Bytes::copy_from_slice(arg)
            }
        })
        .collect();
    if shown < args.len() {
        kept.push(Bytes::from(format!("... ({} more arguments)", args.len() - shown)));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args_of as args;

    #[test]
    fn long_commands_and_secrets_are_kept_as_redis_keeps_them() {
        let many = kept_args(&args(&format!("DEL {}", vec!["k"; 40].join(" "))));
        assert_eq!(many.len(), 32);
        assert_eq!(many[31], Bytes::from("... (10 more arguments)"));
        let long = kept_args(&[Bytes::from("SET"), Bytes::from("k".repeat(200)), Bytes::from("v")]);
        assert_eq!(long[1], Bytes::from(format!("{}... (72 more bytes)", "k".repeat(128))));
        assert_eq!(kept_args(&args("auth u p")), args("auth (redacted) (redacted)"));
        assert_eq!(
            kept_args(&args("HELLO 3 AUTH u p")),
            args("HELLO 3 AUTH (redacted) (redacted)")
        );
        assert_eq!(kept_args(&args("EXEC 0 2 SET k v")), args("exec"));
    }

    #[test]
    fn only_commands_at_the_threshold_or_slower_are_kept_newest_first_up_to_the_length() {
        let log = SlowLog::new(1_000, 2);
        let sender = Sender {
            addr: "127.0.0.1:5".parse().unwrap(),
            name: None,
        };
        log.note(&args("GET fast"), Duration::from_micros(999), &sender);
        assert_eq!(log.len(), 0);
        for key in ["a", "b", "c"] {
            log.note(&args(&format!("GET {key}")), Duration::from_millis(1), &sender);
        }
        assert_eq!(log.len(), 2);
        let Value::Array(Some(entries)) = log.newest(Some(1)) else {
            panic!()
        };
        let Value::Array(Some(newest)) = &entries[0] else {
            panic!()
        };
        assert_eq!(newest[0], Value::Integer(2));
        assert_eq!(newest[3], Value::array(vec![Value::bulk("GET"), Value::bulk("c")]));
        log.set_max_len(1);
        assert_eq!(log.len(), 1);
        log.set_slower_than_us(-1);
        log.note(&args("GET d"), Duration::from_secs(1), &sender);
        assert_eq!(log.len(), 1);
        log.reset();
        assert_eq!(log.len(), 0);
    }
}
