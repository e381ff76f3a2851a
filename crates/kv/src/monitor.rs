//! MONITOR: connections that asked for it get a line for every command this node's clients
//! send it, in Redis's form (`+1700000000.123456 [0 127.0.0.1:50000] "SET" "k" "v"`). A node
//! shows what its own clients send: the commands another node's clients send, and those a
//! script runs, are not shown (Redis shows a script's commands as `[0 lua]`). When nobody
//! monitors, a command costs one atomic load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::broadcast;

/// Lines a monitor may fall behind by before it misses some (Redis would close it instead).
const BACKLOG_LINES: usize = 16 * 1024;

pub struct Monitors {
    watching: AtomicUsize,
    lines: broadcast::Sender<Bytes>,
}

/// A monitoring connection's feed; while it lives the node formats lines.
pub struct Feed {
    monitors: Arc<Monitors>,
    pub lines: broadcast::Receiver<Bytes>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.monitors.watching.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Default for Monitors {
    fn default() -> Self {
        Monitors {
            watching: AtomicUsize::new(0),
            lines: broadcast::channel(BACKLOG_LINES).0,
        }
    }
}

impl Monitors {
    pub fn watching(&self) -> bool {
        self.watching.load(Ordering::Relaxed) > 0
    }

    pub fn watch(self: &Arc<Self>) -> Feed {
        self.watching.fetch_add(1, Ordering::Relaxed);
        Feed {
            monitors: self.clone(),
            lines: self.lines.subscribe(),
        }
    }

    /// Sends every monitor the line for `args`, sent by the client at `peer`, unless Redis
    /// keeps the command from monitors (administrative ones); passwords are redacted.
    pub fn feed(&self, peer: &str, args: &[Bytes]) {
        if let Some(line) = line(SystemTime::now(), peer, args) {
            // Nobody may be listening any more: then the line is for nobody.
            let _ = self.lines.send(line);
        }
    }
}

/// Whether Redis 7.0 keeps a command from monitors: administrative commands are not shown.
fn hidden(args: &[Bytes]) -> bool {
    let is = |arg: Option<&Bytes>, names: &[&str]| {
        arg.is_some_and(|a| names.iter().any(|n| a.eq_ignore_ascii_case(n.as_bytes())))
    };
    is(
        args.first(),
        &[
            "config",
            "cluster",
            "monitor",
            "debug",
            "slowlog",
            "latency",
            "module",
            "save",
            "bgsave",
            "bgrewriteaof",
            "shutdown",
        ],
    ) || (is(args.first(), &["client"]) && is(args.get(1), &["kill", "list"]))
        || (is(args.first(), &["acl"]) && is(args.get(1), &["users"]))
}

/// The arguments a monitor (or the slow log) shows: AUTH's, and HELLO's after AUTH, replaced by
/// `(redacted)`.
pub(crate) fn redacted(args: &[Bytes]) -> Vec<Bytes> {
    let redacted = Bytes::from_static(b"(redacted)");
    let mut shown = args.to_vec();
    if args[0].eq_ignore_ascii_case(b"auth") {
        shown[1..].fill(redacted);
    } else if args[0].eq_ignore_ascii_case(b"hello") {
        if let Some(at) = args.iter().position(|a| a.eq_ignore_ascii_case(b"auth")) {
            for arg in shown.iter_mut().skip(at + 1).take(2) {
                *arg = redacted.clone();
            }
        }
    }
    shown
}

fn line(now: SystemTime, peer: &str, args: &[Bytes]) -> Option<Bytes> {
    if args.is_empty() || hidden(args) {
        return None;
    }
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut line = format!(
        "+{}.{:06} [0 {peer}]",
        since_epoch.as_secs(),
        since_epoch.subsec_micros()
    )
    .into_bytes();
    for arg in redacted(args) {
        line.push(b' ');
        quote(&mut line, &arg);
    }
    line.extend_from_slice(b"\r\n");
    Some(Bytes::from(line))
}

/// `bytes` quoted as Redis's `sdscatrepr` quotes them: printable ASCII as it is, `\\` and `"`
/// escaped, `\n`, `\r`, `\t`, `\a`, `\b` by name, other bytes as `\xHH`.
fn quote(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    for &b in bytes {
        match b {
            b'\\' | b'"' => out.extend_from_slice(&[b'\\', b]),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x07 => out.extend_from_slice(b"\\a"),
            0x08 => out.extend_from_slice(b"\\b"),
            b' '..=b'~' => out.push(b),
            _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn shown(args: &[&[u8]]) -> Option<String> {
        let args: Vec<Bytes> = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
        let at = UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_042);
        line(at, "127.0.0.1:5000", &args).map(|l| String::from_utf8(l.to_vec()).unwrap())
    }

    #[test]
    fn a_line_is_the_command_as_redis_quotes_it() {
        assert_eq!(
            shown(&[b"SET", b"k", b"a \"b\"\\\n\x01\xff"]).unwrap(),
            "+1700000000.000042 [0 127.0.0.1:5000] \"SET\" \"k\" \"a \\\"b\\\"\\\\\\n\\x01\\xff\"\r\n"
        );
    }

    #[test]
    fn passwords_and_administrative_commands_are_not_shown() {
        assert_eq!(
            shown(&[b"auth", b"user", b"secret"]).unwrap(),
            "+1700000000.000042 [0 127.0.0.1:5000] \"auth\" \"(redacted)\" \"(redacted)\"\r\n"
        );
        assert_eq!(
            shown(&[b"HELLO", b"3", b"AUTH", b"u", b"p", b"SETNAME", b"n"]).unwrap(),
            "+1700000000.000042 [0 127.0.0.1:5000] \"HELLO\" \"3\" \"AUTH\" \"(redacted)\" \"(redacted)\" \"SETNAME\" \"n\"\r\n"
        );
        assert_eq!(shown(&[b"CONFIG", b"GET", b"*"]), None);
        assert_eq!(shown(&[b"client", b"LIST"]), None);
        assert!(shown(&[b"client", b"setname", b"x"]).is_some());
    }
}
