//! Peers prove to each other that they hold the cluster secret before any raft message, service
//! request or snapshot file crosses a connection.
//!
//! A connection is dialed by the node that sends on it. With a secret the handshake is:
//!
//! 1. dialer → acceptor: hello `[dialer id u64][dialer nonce 16]`
//! 2. acceptor → dialer: challenge `[acceptor nonce 16][HMAC(acceptor tag, ids, nonces) 32]` —
//!    the dialer sends nothing more to a node that cannot show the secret;
//! 3. dialer → acceptor: proof `[HMAC(dialer tag, ids, nonces) 32]`.
//!
//! Both codes are HMAC-SHA256 over a role tag, both node ids and both fresh nonces, so neither
//! can be replayed on another connection or reflected back to the node that made it. Without a
//! secret the hello is the dialer's id alone, as before; a node with a secret refuses such a
//! hello, and one without refuses a hello carrying a nonce, each saying why.
//!
//! This authenticates peers; it does not hide or protect the traffic that follows (TLS does that).

use std::sync::Arc;

use chorus_tls::PeerTls;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::error::DecodeError;
use crate::wire::Reader;

pub const NONCE_BYTES: usize = 16;
pub const CODE_BYTES: usize = 32;
/// A secret shorter than this is refused: it could be guessed.
pub const MIN_SECRET_BYTES: usize = 16;

const ACCEPTOR_TAG: &[u8] = b"chorus peer acceptor v1";
const DIALER_TAG: &[u8] = b"chorus peer dialer v1";

pub type Nonce = [u8; NONCE_BYTES];
pub type Code = [u8; CODE_BYTES];

/// What a node shows its peers and asks of them: the cluster secret, mutual TLS
/// (`peer_stream`), both or neither.
#[derive(Clone, Debug, Default)]
pub struct PeerCredentials {
    pub secret: Option<ClusterSecret>,
    pub tls: Option<Arc<PeerTls>>,
}

/// The secret every node of a cluster shares.
#[derive(Clone)]
pub struct ClusterSecret(Vec<u8>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The secret in `text` (surrounding whitespace is not part of it).
    pub fn new(text: &str) -> Result<ClusterSecret, String> {
        let secret = text.trim();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the cluster secret is {} bytes; it must be at least {MIN_SECRET_BYTES} \
                 (e.g. `head -c 32 /dev/urandom | base64`)",
                secret.len()
            ));
        }
        Ok(ClusterSecret(secret.as_bytes().to_vec()))
    }

    fn mac(&self, side: Side, exchange: &Exchange) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(match side {
            Side::Acceptor => ACCEPTOR_TAG,
            Side::Dialer => DIALER_TAG,
        });
        mac.update(&exchange.dialer.to_le_bytes());
        mac.update(&exchange.acceptor.to_le_bytes());
        mac.update(&exchange.dialer_nonce);
        mac.update(&exchange.acceptor_nonce);
        mac
    }

    /// `side`'s code for `exchange`: it holds the secret, on this connection.
    pub fn code(&self, side: Side, exchange: &Exchange) -> Code {
        self.mac(side, exchange).finalize().into_bytes().into()
    }

    /// Whether `code` is `side`'s for `exchange` (compared in constant time).
    pub fn checks(&self, side: Side, exchange: &Exchange, code: &Code) -> bool {
        self.mac(side, exchange).verify_slice(code).is_ok()
    }
}

/// Which end of a connection a code is from: each signs under its own tag, so one end's code
/// reflected back is not the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Acceptor,
    Dialer,
}

/// What both codes of one connection's handshake cover: both node ids and both nonces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    pub dialer: u64,
    pub acceptor: u64,
    pub dialer_nonce: Nonce,
    pub acceptor_nonce: Nonce,
}

/// The dialer's side of a handshake with node `peer`; the caller does the I/O.
pub struct Dial<'a> {
    secret: &'a ClusterSecret,
    node_id: u64,
    peer: u64,
    ours: Nonce,
}

impl<'a> Dial<'a> {
    /// The dialer and its hello's payload.
    pub fn start(secret: &'a ClusterSecret, node_id: u64, peer: u64) -> (Dial<'a>, Vec<u8>) {
        let ours = new_nonce();
        let hello = encode_hello(node_id, Some(&ours));
        (
            Dial {
                secret,
                node_id,
                peer,
                ours,
            },
            hello,
        )
    }

    /// The proof answering the peer's challenge, if the challenge shows the peer holds the secret.
    pub fn answer(&self, challenge: &[u8]) -> Result<Code, String> {
        let (theirs, code) = decode_challenge(challenge).map_err(|e| format!("bad challenge: {e}"))?;
        let exchange = Exchange {
            dialer: self.node_id,
            acceptor: self.peer,
            dialer_nonce: self.ours,
            acceptor_nonce: theirs,
        };
        if !self.secret.checks(Side::Acceptor, &exchange, &code) {
            return Err(format!(
                "the node answering at node {}'s address does not hold the cluster secret; nothing sent",
                self.peer
            ));
        }
        Ok(self.secret.code(Side::Dialer, &exchange))
    }
}

/// The acceptor's side of a handshake with the dialer of a hello; the caller does the I/O.
pub struct Accept<'a> {
    secret: &'a ClusterSecret,
    exchange: Exchange,
}

impl<'a> Accept<'a> {
    /// After the hello of node `from` (with `nonce` if it has a secret): the acceptor and its
    /// challenge's payload, or None if neither end has a secret (the connection is open), or why
    /// the connection must close.
    pub fn start(
        secret: Option<&'a ClusterSecret>,
        node_id: u64,
        from: u64,
        nonce: Option<Nonce>,
    ) -> Result<Option<(Accept<'a>, Vec<u8>)>, String> {
        let (secret, theirs) = match (secret, nonce) {
            (None, None) => return Ok(None),
            (None, Some(_)) => {
                return Err(format!(
                    "node {from} proves a cluster secret and this node has none: give every node the \
                     same cluster_secret_file"
                ))
            }
            (Some(_), None) => {
                return Err(format!(
                    "node {from} sent no proof of the cluster secret: give every node the same \
                     cluster_secret_file"
                ))
            }
            (Some(secret), Some(theirs)) => (secret, theirs),
        };
        let exchange = Exchange {
            dialer: from,
            acceptor: node_id,
            dialer_nonce: theirs,
            acceptor_nonce: new_nonce(),
        };
        let challenge = encode_challenge(&exchange.acceptor_nonce, &secret.code(Side::Acceptor, &exchange));
        Ok(Some((Accept { secret, exchange }, challenge)))
    }

    /// Whether the dialer's proof shows it holds the secret.
    pub fn check(&self, proof: &[u8]) -> Result<(), String> {
        let proof = decode_proof(proof).map_err(|e| format!("bad proof: {e}"))?;
        if !self.secret.checks(Side::Dialer, &self.exchange, &proof) {
            return Err(format!(
                "a connection calling itself node {} does not hold the cluster secret",
                self.exchange.dialer
            ));
        }
        Ok(())
    }
}

/// A fresh nonce from the operating system's generator.
pub fn new_nonce() -> Nonce {
    let mut nonce = [0u8; NONCE_BYTES];
    getrandom::getrandom(&mut nonce).expect("the operating system gives random bytes");
    nonce
}

/// A hello's payload: the dialer's id, and its nonce when it has a secret.
pub fn encode_hello(node_id: u64, nonce: Option<&Nonce>) -> Vec<u8> {
    let mut out = node_id.to_le_bytes().to_vec();
    if let Some(nonce) = nonce {
        out.extend_from_slice(nonce);
    }
    out
}

pub fn decode_hello(payload: &[u8]) -> Result<(u64, Option<Nonce>), DecodeError> {
    let mut r = Reader::new(payload);
    let id = r.u64()?;
    let nonce = if r.remaining() == 0 {
        None
    } else {
        Some(r.bytes(NONCE_BYTES)?.try_into().expect("NONCE_BYTES read"))
    };
    r.finish()?;
    Ok((id, nonce))
}

pub fn encode_challenge(nonce: &Nonce, code: &Code) -> Vec<u8> {
    [&nonce[..], &code[..]].concat()
}

pub fn decode_challenge(payload: &[u8]) -> Result<(Nonce, Code), DecodeError> {
    let mut r = Reader::new(payload);
    let nonce = r.bytes(NONCE_BYTES)?.try_into().expect("NONCE_BYTES read");
    let code = r.bytes(CODE_BYTES)?.try_into().expect("CODE_BYTES read");
    r.finish()?;
    Ok((nonce, code))
}

pub fn decode_proof(payload: &[u8]) -> Result<Code, DecodeError> {
    let mut r = Reader::new(payload);
    let code = r.bytes(CODE_BYTES)?.try_into().expect("CODE_BYTES read");
    r.finish()?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> ClusterSecret {
        ClusterSecret::new(text).unwrap()
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert!(ClusterSecret::new("  short \n").unwrap_err().contains("at least 16"));
        assert!(ClusterSecret::new("sixteen-bytes-ok\n").is_ok());
    }

    #[test]
    fn only_a_holder_of_the_same_secret_makes_codes_that_check() {
        let (ours, theirs) = (secret("correct horse battery"), secret("correct horse battery staple"));
        let (dn, an) = (new_nonce(), new_nonce());
        assert_ne!(dn, an, "nonces are fresh");
        let exchange = |dialer, acceptor, dialer_nonce| Exchange {
            dialer,
            acceptor,
            dialer_nonce,
            acceptor_nonce: an,
        };
        let code = ours.code(Side::Acceptor, &exchange(1, 2, dn));
        assert!(ours.checks(Side::Acceptor, &exchange(1, 2, dn), &code));
        assert!(
            !theirs.checks(Side::Acceptor, &exchange(1, 2, dn), &code),
            "another secret"
        );
        assert!(
            !ours.checks(Side::Acceptor, &exchange(3, 2, dn), &code),
            "another dialer"
        );
        assert!(
            !ours.checks(Side::Acceptor, &exchange(1, 2, new_nonce()), &code),
            "another connection"
        );
        assert!(
            !ours.checks(Side::Dialer, &exchange(1, 2, dn), &code),
            "an acceptor's code reflected back is not a dialer's"
        );
        let proof = ours.code(Side::Dialer, &exchange(1, 2, dn));
        assert!(ours.checks(Side::Dialer, &exchange(1, 2, dn), &proof));
        assert!(!ours.checks(Side::Dialer, &exchange(2, 1, dn), &proof), "ids swapped");
    }

    /// The whole exchange, as the transport runs it, minus the sockets.
    fn handshake(dialer_secret: Option<&ClusterSecret>, acceptor_secret: Option<&ClusterSecret>) -> Result<(), String> {
        let (dial, hello) = match dialer_secret {
            Some(secret) => {
                let (dial, hello) = Dial::start(secret, 1, 2);
                (Some(dial), hello)
            }
            None => (None, encode_hello(1, None)),
        };
        let (from, nonce) = decode_hello(&hello).map_err(|e| e.to_string())?;
        let Some((accept, challenge)) = Accept::start(acceptor_secret, 2, from, nonce)? else {
            return Ok(());
        };
        let proof = dial
            .expect("a challenge goes to a dialer with a secret")
            .answer(&challenge)?;
        accept.check(&proof)
    }

    #[test]
    fn a_handshake_opens_only_between_nodes_holding_the_same_secret_or_none() {
        let ours = secret("correct horse battery");
        let theirs = secret("correct horse battery staple");
        assert_eq!(handshake(Some(&ours), Some(&ours)), Ok(()));
        assert_eq!(handshake(None, None), Ok(()));
        let refused = handshake(Some(&theirs), Some(&ours)).unwrap_err();
        assert!(refused.contains("does not hold the cluster secret"), "{refused}");
        let refused = handshake(None, Some(&ours)).unwrap_err();
        assert!(refused.contains("sent no proof"), "{refused}");
        let refused = handshake(Some(&ours), None).unwrap_err();
        assert!(refused.contains("this node has none"), "{refused}");
        // A proof replayed on another connection (the acceptor's nonce differs) is refused.
        let (dial, hello) = Dial::start(&ours, 1, 2);
        let (from, nonce) = decode_hello(&hello).unwrap();
        let (first, challenge) = Accept::start(Some(&ours), 2, from, nonce).unwrap().unwrap();
        let proof = dial.answer(&challenge).unwrap();
        assert_eq!(first.check(&proof), Ok(()));
        let (second, _) = Accept::start(Some(&ours), 2, from, nonce).unwrap().unwrap();
        assert!(second.check(&proof).is_err(), "replayed");
    }

    #[test]
    fn handshake_payloads_decode_to_what_was_encoded_and_malformed_ones_are_errors() {
        let nonce = new_nonce();
        assert_eq!(decode_hello(&encode_hello(7, None)).unwrap(), (7, None));
        assert_eq!(decode_hello(&encode_hello(7, Some(&nonce))).unwrap(), (7, Some(nonce)));
        let code = [9u8; CODE_BYTES];
        assert_eq!(
            decode_challenge(&encode_challenge(&nonce, &code)).unwrap(),
            (nonce, code)
        );
        assert_eq!(decode_proof(&code).unwrap(), code);
        let hello = encode_hello(7, Some(&nonce));
        for cut in 0..hello.len() {
            if cut != 8 {
                assert!(decode_hello(&hello[..cut]).is_err(), "hello cut at {cut}");
            }
        }
        assert!(decode_hello(&[hello.as_slice(), &[0]].concat()).is_err());
        assert!(decode_challenge(&code).is_err());
        assert!(decode_proof(&code[..31]).is_err());
        assert!(decode_proof(&[code.as_slice(), &[0]].concat()).is_err());
    }
}
