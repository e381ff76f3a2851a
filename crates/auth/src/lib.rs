//! Who may use a node's client ports (RESP and PostgreSQL): users with passwords and rights, as
//! Redis's `requirepass` and ACL file state them (a subset: whole-command rights, read-only or
//! read-write), and the throttle on failed logins.
//!
//! Passwords are kept as SHA-256 digests (an ACL file may give the digest instead of the
//! password, as Redis's `#<hex>`), compared in constant time; a user's first password given in
//! the clear is also kept as SCRAM-SHA-256's salted password, which PostgreSQL clients log in
//! with.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_metrics::{labeled_counter, Counter};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// What a user may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rights {
    /// Only AUTH, HELLO, QUIT and PING (Redis's `-@all`, a new user's default).
    None,
    /// Everything that does not write (`+@read`, or `+@all -@write`).
    Read,
    /// Everything (`+@all`).
    ReadWrite,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub enabled: bool,
    /// Any password logs in (Redis's `nopass`).
    pub nopass: bool,
    password_digests: Vec<[u8; 32]>,
    /// What a SCRAM-SHA-256 login is checked against: from the first password given in the
    /// clear (none if every password was given as a digest).
    pub scram: Option<ScramSecret>,
    pub rights: Rights,
}

/// SCRAM-SHA-256's secret for one password (RFC 5802, 7677): a random salt and
/// PBKDF2-HMAC-SHA256 of the password over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramSecret {
    pub salt: [u8; 16],
    pub salted_password: [u8; 32],
}

/// PBKDF2 iterations for SCRAM, as PostgreSQL's default.
pub const SCRAM_ITERATIONS: u32 = 4096;

impl ScramSecret {
    fn new(password: &[u8]) -> ScramSecret {
        let mut salt = [0u8; 16];
        getrandom::getrandom(&mut salt).expect("the operating system gives random bytes");
        ScramSecret {
            salt,
            salted_password: pbkdf2_sha256(password, &salt, SCRAM_ITERATIONS),
        }
    }
}

/// PBKDF2-HMAC-SHA256 (RFC 8018) with a 32-byte result: one block.
pub fn pbkdf2_sha256(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let prf = Hmac::<Sha256>::new_from_slice(password).expect("HMAC takes a key of any length");
    let mut mac = prf.clone();
    mac.update(salt);
    mac.update(&1u32.to_be_bytes());
    let mut block: [u8; 32] = mac.finalize().into_bytes().into();
    let mut result = block;
    for _ in 1..iterations {
        let mut mac = prf.clone();
        mac.update(&block);
        block = mac.finalize().into_bytes().into();
        for (r, b) in result.iter_mut().zip(block) {
            *r ^= b;
        }
    }
    result
}

impl User {
    fn new(name: &str) -> User {
        User {
            name: name.to_string(),
            enabled: false,
            nopass: false,
            password_digests: Vec::new(),
            scram: None,
            rights: Rights::None,
        }
    }

    fn accepts(&self, password: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        let digest = sha256(password);
        // Every digest is compared, each in constant time: the reply takes as long whichever
        // matched, or none.
        let matched = self
            .password_digests
            .iter()
            .fold(false, |matched, known| matched | constant_time_eq(known, &digest));
        self.nopass || matched
    }
}

/// The users of a node. Without `requirepass` or an ACL file there is one, `default`, enabled,
/// needing no password, with every right: Redis's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Users {
    by_name: HashMap<String, User>,
    /// Keys the SCRAM secrets of names that cannot log in (`scram_secret`).
    decoy_key: [u8; 32],
}

impl Default for Users {
    fn default() -> Self {
        Users::from_config("", "").expect("the empty configuration is valid")
    }
}

impl Users {
    /// Users from `requirepass` (the default user's password; empty: none) and an ACL file's
    /// text (empty: none). Errors name the line and the rule.
    pub fn from_config(requirepass: &str, acl_text: &str) -> Result<Users, String> {
        let mut by_name = HashMap::new();
        for (number, line) in acl_text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let user = parse_user(line).map_err(|e| format!("ACL line {}: {e}", number + 1))?;
            if by_name.contains_key(&user.name) {
                return Err(format!("ACL line {}: user {} is defined twice", number + 1, user.name));
            }
            by_name.insert(user.name.clone(), user);
        }
        if !requirepass.is_empty() && by_name.contains_key("default") {
            return Err("both requirepass and the ACL file set the default user: set it in one place".into());
        }
        by_name.entry("default".to_string()).or_insert_with(|| User {
            name: "default".into(),
            enabled: true,
            nopass: requirepass.is_empty(),
            password_digests: if requirepass.is_empty() {
                Vec::new()
            } else {
                vec![sha256(requirepass.as_bytes())]
            },
            scram: (!requirepass.is_empty()).then(|| ScramSecret::new(requirepass.as_bytes())),
            rights: Rights::ReadWrite,
        });
        let mut decoy_key = [0u8; 32];
        getrandom::getrandom(&mut decoy_key).expect("the operating system gives random bytes");
        Ok(Users { by_name, decoy_key })
    }

    /// What a SCRAM login as `name` is checked against: the user's secret if they are enabled
    /// and have a password in the clear, else a decoy no password matches, with a salt that
    /// stays the same for the name — so a client cannot tell a wrong password from a user who
    /// does not exist, or cannot log in this way.
    pub fn scram_secret(&self, name: &str) -> (ScramSecret, bool) {
        let real = self
            .by_name
            .get(name)
            .filter(|user| user.enabled)
            .and_then(|user| user.scram.clone());
        if let Some(secret) = real {
            return (secret, true);
        }
        let keyed = |what: &[u8]| -> [u8; 32] {
            let mut mac = Hmac::<Sha256>::new_from_slice(&self.decoy_key).expect("HMAC takes a key of any length");
            mac.update(what);
            mac.update(name.as_bytes());
            mac.finalize().into_bytes().into()
        };
        let salt = keyed(b"salt")[..16].try_into().expect("16 of 32 bytes");
        (
            ScramSecret {
                salt,
                salted_password: keyed(b"unmatchable"),
            },
            false,
        )
    }

    /// The user a new connection is, before any AUTH: `default` if it needs no password.
    pub fn initial(&self) -> Option<&User> {
        self.by_name
            .get("default")
            .filter(|default| default.enabled && default.nopass)
    }

    /// Whether anyone may connect without a password and write: worth a warning when an ACL
    /// file or `requirepass` was meant to protect the node.
    pub fn open_to_anyone(&self) -> bool {
        self.initial()
            .is_some_and(|default| default.rights == Rights::ReadWrite)
    }

    /// The user `name` if `password` is one of theirs and they are enabled.
    pub fn authenticate(&self, name: &[u8], password: &[u8]) -> Option<&User> {
        let user = std::str::from_utf8(name).ok().and_then(|name| self.by_name.get(name));
        match user {
            Some(user) if user.accepts(password) => Some(user),
            Some(_) => None,
            None => {
                // As long as a known user's check: the reply does not tell which names exist.
                let _ = constant_time_eq(&sha256(password), &[0; 32]);
                None
            }
        }
    }

    /// The user named `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<&User> {
        self.by_name.get(name)
    }

    /// User names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.by_name.keys().cloned().collect();
        names.sort();
        names
    }
}

/// One `user <name> <rule>...` line, in Redis's ACL syntax: `on`, `off`, `>password`,
/// `#<sha256 hex>`, `nopass`, `resetpass`, `+@all` / `allcommands`, `+@read`, `-@write`,
/// `-@all` / `nocommands`, and `~*` / `allkeys` (every key; narrower key patterns are refused).
fn parse_user(line: &str) -> Result<User, String> {
    let mut words = line.split_whitespace();
    if words.next() != Some("user") {
        return Err("a line starts with `user <name>`".into());
    }
    let name = words.next().ok_or("`user` needs a name")?;
    let mut user = User::new(name);
    for rule in words {
        match rule {
            "on" => user.enabled = true,
            "off" => user.enabled = false,
            "nopass" => {
                user.nopass = true;
                user.password_digests.clear();
                user.scram = None;
            }
            "resetpass" => {
                user.nopass = false;
                user.password_digests.clear();
                user.scram = None;
            }
            "+@all" | "allcommands" => user.rights = Rights::ReadWrite,
            "-@all" | "nocommands" => user.rights = Rights::None,
            "+@read" => user.rights = user.rights.max(Rights::Read),
            "-@write" => user.rights = user.rights.min(Rights::Read),
            "~*" | "allkeys" | "&*" | "allchannels" => {}
            _ if rule.starts_with('>') => {
                let password = &rule.as_bytes()[1..];
                user.password_digests.push(sha256(password));
                if user.scram.is_none() {
                    user.scram = Some(ScramSecret::new(password));
                }
                user.nopass = false;
            }
            _ if rule.starts_with('#') => {
                user.password_digests.push(parse_digest(&rule[1..])?);
                user.nopass = false;
            }
            _ if rule.starts_with('~') || rule.starts_with("%") => {
                return Err(format!(
                    "key pattern {rule} is not supported: a user's rights cover every key (~*)"
                ))
            }
            _ => {
                return Err(format!(
                    "rule {rule} is not supported (on, off, >password, #sha256, nopass, resetpass, \
                     +@all, +@read, -@write, -@all, ~*)"
                ))
            }
        }
    }
    Ok(user)
}

fn parse_digest(hex: &str) -> Result<[u8; 32], String> {
    let bad = || format!("#{hex} is not a SHA-256 digest (64 hex digits)");
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(hex.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(digest)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the comparison from being turned into an early exit.
    std::hint::black_box(difference) == 0
}

/// Failed logins from one address before it must wait.
const FREE_FAILURES: u32 = 3;
/// The first wait; each further failure doubles it, up to `LONGEST_WAIT`.
const FIRST_WAIT: Duration = Duration::from_millis(500);
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// Addresses remembered at most; beyond, those whose wait is over are forgotten first.
const MAX_ADDRESSES: usize = 10_000;

/// Failed logins per client address: after `FREE_FAILURES`, an address must wait before its
/// next attempt is even checked, twice as long after each further failure. A success clears it.
#[derive(Default)]
pub struct LoginThrottle {
    by_address: HashMap<IpAddr, Failures>,
}

#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    wait_until: Instant,
}

impl LoginThrottle {
    /// How long `address` must still wait before a login attempt is checked (None: now).
    pub fn must_wait(&self, address: IpAddr, now: Instant) -> Option<Duration> {
        let failures = self.by_address.get(&address)?;
        (failures.wait_until > now).then(|| failures.wait_until - now)
    }

    pub fn failed(&mut self, address: IpAddr, now: Instant) {
        if self.by_address.len() >= MAX_ADDRESSES && !self.by_address.contains_key(&address) {
            self.by_address.retain(|_, failures| failures.wait_until > now);
            if self.by_address.len() >= MAX_ADDRESSES {
                // Every remembered address is waiting: this one waits as long as the worst.
                return;
            }
        }
        let failures = self.by_address.entry(address).or_insert(Failures {
            count: 0,
            wait_until: now,
        });
        failures.count += 1;
        if failures.count > FREE_FAILURES {
            let doublings = (failures.count - FREE_FAILURES - 1).min(16);
            failures.wait_until = now + (FIRST_WAIT * (1 << doublings)).min(LONGEST_WAIT);
        }
    }

    pub fn succeeded(&mut self, address: IpAddr) {
        self.by_address.remove(&address);
    }
}

/// One port's logins (RESP, PostgreSQL, the metrics port's actions): the node's users, the
/// throttle of failed attempts per client address, and the refusals counted in
/// `<failures_metric>{reason="wrong_password"|"throttled"}`.
pub struct Logins {
    users: Arc<Users>,
    throttle: Mutex<LoginThrottle>,
    wrong_password: Arc<Counter>,
    throttled: Arc<Counter>,
}

/// Why a login was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginRefused {
    /// The address failed too often lately: the password was not even checked.
    Throttled { wait: Duration },
    /// A wrong password, or a user who does not exist or is disabled.
    WrongPassword,
}

impl Logins {
    pub fn new(users: Arc<Users>, failures_metric: &'static str, help: &'static str) -> Logins {
        let failures = |reason| labeled_counter(failures_metric, help, Some(("reason", reason)));
        Logins {
            users,
            throttle: Mutex::new(LoginThrottle::default()),
            wrong_password: failures("wrong_password"),
            throttled: failures("throttled"),
        }
    }

    pub fn users(&self) -> &Users {
        &self.users
    }

    fn throttle(&self) -> std::sync::MutexGuard<'_, LoginThrottle> {
        self.throttle.lock().expect("login throttle poisoned")
    }

    /// How long `remote` must wait before its next attempt is checked (counted as a throttled
    /// login); None if it may try now.
    pub fn must_wait(&self, remote: IpAddr) -> Option<Duration> {
        let wait = self.throttle().must_wait(remote, Instant::now());
        if wait.is_some() {
            self.throttled.inc();
        }
        wait
    }

    /// Records a wrong password from `remote` (for logins checked elsewhere, as SCRAM's are).
    pub fn failed(&self, remote: IpAddr) {
        self.throttle().failed(remote, Instant::now());
        self.wrong_password.inc();
    }

    pub fn succeeded(&self, remote: IpAddr) {
        self.throttle().succeeded(remote);
    }

    /// Logs `remote` in as `name` if `password` is theirs, unless it must wait.
    pub fn log_in(&self, name: &[u8], password: &[u8], remote: IpAddr) -> Result<&User, LoginRefused> {
        if let Some(wait) = self.must_wait(remote) {
            return Err(LoginRefused::Throttled { wait });
        }
        match self.users.authenticate(name, password) {
            Some(user) => {
                self.succeeded(remote);
                Ok(user)
            }
            None => {
                self.failed(remote);
                Err(LoginRefused::WrongPassword)
            }
        }
    }
}

/// The user and password of an HTTP `Authorization: Basic …` header's value (RFC 7617);
/// None for another scheme or malformed base64.
pub fn basic_credentials(header_value: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let (scheme, encoded) = header_value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = decode_base64(encoded.trim())?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some((decoded[..colon].to_vec(), decoded[colon + 1..].to_vec()))
}

/// The `Authorization` header's value that logs `user` in with `password` (HTTP Basic).
pub fn basic_authorization(user: &str, password: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let plain = format!("{user}:{password}");
    let mut encoded = String::from("Basic ");
    for chunk in plain.as_bytes().chunks(3) {
        let mut three = [0u8; 3];
        three[..chunk.len()].copy_from_slice(chunk);
        let bits = u32::from_be_bytes([0, three[0], three[1], three[2]]);
        for i in 0..4 {
            if i <= chunk.len() {
                encoded.push(ALPHABET[(bits >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                encoded.push('=');
            }
        }
    }
    encoded
}

/// Standard base64 with padding (RFC 4648 §4); None on any other input.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let padding = text.iter().rev().take_while(|&&b| b == b'=').count();
    if padding > 2 {
        return None;
    }
    let sextet = |b: u8| match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for (i, quad) in text.chunks(4).enumerate() {
        let last = (i + 1) * 4 == text.len();
        let pads = if last { padding } else { 0 };
        let mut bits = 0u32;
        for &b in &quad[..4 - pads] {
            bits = bits << 6 | u32::from(sextet(b)?);
        }
        bits <<= 6 * pads as u32;
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pads]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_decode_and_malformed_ones_are_none() {
        // "aladdin:open sesame" and "admin:" (an empty password), as browsers and curl send them.
        assert_eq!(
            basic_credentials("Basic YWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            Some((b"aladdin".to_vec(), b"open sesame".to_vec()))
        );
        assert_eq!(
            basic_credentials("basic YWRtaW46"),
            Some((b"admin".to_vec(), Vec::new()))
        );
        assert_eq!(
            basic_credentials("Basic dTpwOnE="),
            Some((b"u".to_vec(), b"p:q".to_vec()))
        );
        assert_eq!(
            basic_authorization("aladdin", "open sesame"),
            "Basic YWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        for password in ["", "p", "pw", "pw3", "a longer one: with colons"] {
            assert_eq!(
                basic_credentials(&basic_authorization("u", password)),
                Some((b"u".to_vec(), password.as_bytes().to_vec()))
            );
        }
        for bad in [
            "Bearer YWRtaW46",
            "Basic YWRtaW46=",
            "Basic YWRt!W46",
            "Basic ====",
            "Basic YWRtaW4=",
            "Basic",
            "",
            "Basic YQ==YQ==",
        ] {
            assert_eq!(basic_credentials(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn without_configuration_the_default_user_needs_no_password_and_may_write() {
        let users = Users::default();
        let initial = users.initial().expect("connections start as default");
        assert_eq!((initial.name.as_str(), initial.rights), ("default", Rights::ReadWrite));
        assert!(users.open_to_anyone());
        assert!(users.authenticate(b"default", b"anything").is_some());
        assert!(users.authenticate(b"bob", b"anything").is_none());
    }

    #[test]
    fn requirepass_makes_the_default_user_need_it() {
        let users = Users::from_config("s3cret", "").unwrap();
        assert!(users.initial().is_none());
        assert!(!users.open_to_anyone());
        assert!(users.authenticate(b"default", b"s3cret").is_some());
        assert!(users.authenticate(b"default", b"s3cre").is_none());
        assert!(users.authenticate(b"default", b"").is_none());
    }

    #[test]
    fn an_acl_file_gives_users_passwords_digests_and_rights() {
        let digest = "f1d1c2cfbd8b9b6a3b4c0f0e1bbcd9f46e9a4e2b5f2c2a8e86a2d2f4c8b6a1e0";
        let text = format!(
            "# operators\nuser default off\nuser alice on >wonder +@all ~*\n\
             user reader on >books +@read\nuser auditor on #{digest} +@all -@write\n\
             user gone off >x +@all\n"
        );
        let users = Users::from_config("", &text).unwrap();
        assert!(users.initial().is_none(), "default is off");
        assert_eq!(
            users.authenticate(b"alice", b"wonder").unwrap().rights,
            Rights::ReadWrite
        );
        assert_eq!(users.authenticate(b"reader", b"books").unwrap().rights, Rights::Read);
        assert!(users.authenticate(b"reader", b"wonder").is_none());
        assert!(
            users.authenticate(b"gone", b"x").is_none(),
            "a disabled user cannot log in"
        );
        assert!(users.authenticate(b"default", b"").is_none());
        assert_eq!(users.names(), ["alice", "auditor", "default", "gone", "reader"]);
        // The digest form: SHA-256 of the password, as `echo -n pw | sha256sum` prints it.
        let text = format!("user auditor on #{} +@all -@write", hex(&sha256(b"pw")));
        let users = Users::from_config("", &text).unwrap();
        assert_eq!(users.authenticate(b"auditor", b"pw").unwrap().rights, Rights::Read);
        assert!(users.open_to_anyone(), "default was not turned off");
    }

    #[test]
    fn pbkdf2_matches_the_published_vectors_and_scram_keeps_the_first_clear_password() {
        // RFC 7914 section 11 (its first 32 bytes), and a 4096-round vector from RFC 7677's
        // SCRAM-SHA-256 example (salt W22ZaJ0SNY7soEsUEjb6gQ==, password "pencil").
        assert_eq!(
            hex(&pbkdf2_sha256(b"passwd", b"salt", 1)),
            "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
        );
        let salt = [
            0x5b, 0x6d, 0x99, 0x68, 0x9d, 0x12, 0x35, 0x8e, 0xec, 0xa0, 0x4b, 0x14, 0x12, 0x36, 0xfa, 0x81,
        ];
        assert_eq!(
            hex(&pbkdf2_sha256(b"pencil", &salt, 4096)),
            "c4a49510323ab4f952cac1fa99441939e78ea74d6be81ddf7096e87513dc615d"
        );
        let users = Users::from_config(
            "",
            "user a on #00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff >first >second +@all",
        )
        .unwrap();
        let scram = users.get("a").unwrap().scram.clone().unwrap();
        assert_eq!(
            scram.salted_password,
            pbkdf2_sha256(b"first", &scram.salt, SCRAM_ITERATIONS)
        );
        let users = Users::from_config(
            "",
            "user d on #00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        )
        .unwrap();
        assert_eq!(
            users.get("d").unwrap().scram,
            None,
            "a digest cannot be turned into SCRAM's secret"
        );
        let users = Users::from_config("pw", "").unwrap();
        assert!(
            users.get("default").unwrap().scram.is_some(),
            "requirepass logs in over SQL too"
        );
        let (secret, real) = users.scram_secret("default");
        assert!(real);
        assert_eq!(
            secret.salted_password,
            pbkdf2_sha256(b"pw", &secret.salt, SCRAM_ITERATIONS)
        );
        let (decoy, real) = users.scram_secret("nobody");
        assert!(!real);
        assert_eq!(
            users.scram_secret("nobody").0,
            decoy,
            "the same salt each time, as a real user's"
        );
        assert_ne!(users.scram_secret("someone").0.salt, decoy.salt);
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_bad_acl_file_is_refused_naming_the_line_and_rule() {
        for (text, said) in [
            (
                "user a on >x +@all\nuser b on ~app:* +@all",
                "line 2: key pattern ~app:*",
            ),
            ("user a on +@everything", "line 1: rule +@everything"),
            ("usr a on", "line 1: a line starts with"),
            ("user a on #abc", "line 1: #abc is not a SHA-256"),
            ("user a on\nuser a off", "line 2: user a is defined twice"),
        ] {
            let error = Users::from_config("", text).unwrap_err();
            assert!(error.contains(said), "{text:?}: {error}");
        }
        let error = Users::from_config("pw", "user default on >x +@all").unwrap_err();
        assert!(error.contains("in one place"), "{error}");
    }

    #[test]
    fn failed_logins_from_an_address_make_it_wait_longer_each_time_until_one_succeeds() {
        let mut throttle = LoginThrottle::default();
        let address: IpAddr = "127.0.0.7".parse().unwrap();
        let other: IpAddr = "127.0.0.8".parse().unwrap();
        let now = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.must_wait(address, now), None);
            throttle.failed(address, now);
        }
        assert_eq!(throttle.must_wait(address, now), None, "the free failures cost nothing");
        throttle.failed(address, now);
        assert_eq!(throttle.must_wait(address, now), Some(FIRST_WAIT));
        throttle.failed(address, now);
        assert_eq!(throttle.must_wait(address, now), Some(FIRST_WAIT * 2));
        assert_eq!(throttle.must_wait(address, now + FIRST_WAIT * 2), None);
        assert_eq!(throttle.must_wait(other, now), None, "per address");
        for _ in 0..40 {
            throttle.failed(address, now);
        }
        assert_eq!(throttle.must_wait(address, now), Some(LONGEST_WAIT));
        throttle.succeeded(address);
        assert_eq!(throttle.must_wait(address, now), None);
    }
}
