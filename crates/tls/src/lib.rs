//! TLS on a node's client ports (its certificate and key) and mutual TLS on its peer links (its
//! peer certificate and key, and the cluster's CA), loaded from PEM files and reloaded when any
//! of them changes (connections made after that get the new ones; open ones keep theirs); and
//! for local clusters, throwaway CAs (`chorus cluster start --tls`) and random cluster secrets
//! (`--secret`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use chorus_metrics::Counter;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
pub use tokio_rustls::server::TlsStream;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};
// The peer transport's blocking snapshot shipments speak rustls directly.
pub use {rustls, rustls_pki_types, tokio_rustls};

/// How often a node looks whether its certificate, key or CA files changed.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Something built from files (a certificate, its key, a CA), built again when any of them
/// changes: connections made after that get the new one; open ones keep theirs.
pub struct Reloaded<T> {
    paths: Vec<PathBuf>,
    build: fn(&[PathBuf]) -> Result<T, String>,
    current: RwLock<(T, Vec<Option<SystemTime>>)>,
    reloads: Arc<Counter>,
}

impl<T> std::fmt::Debug for Reloaded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloaded")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl<T: Clone> Reloaded<T> {
    fn from_files(paths: Vec<PathBuf>, build: fn(&[PathBuf]) -> Result<T, String>) -> Result<Arc<Self>, String> {
        // Stamped before reading: a change while reading is seen next time.
        let stamps = stamps(&paths);
        let built = build(&paths)?;
        Ok(Arc::new(Reloaded {
            paths,
            build,
            current: RwLock::new((built, stamps)),
            reloads: chorus_metrics::counter(
                "chorus_tls_certificate_reloads_total",
                "Times TLS certificates and keys were read again after their files changed",
            ),
        }))
    }

    fn current(&self) -> T {
        self.current.read().expect("not poisoned").0.clone()
    }

    /// Builds again if any file changed since; files that do not build (half written, say)
    /// leave what is in use as it is, and are tried again next time.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let stamps = stamps(&self.paths);
        if stamps == self.current.read().expect("not poisoned").1 {
            return Ok(false);
        }
        let built = (self.build)(&self.paths)?;
        *self.current.write().expect("not poisoned") = (built, stamps);
        self.reloads.inc();
        Ok(true)
    }

    /// Looks at the files every `every`, for as long as the process runs.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut failing = false;
        loop {
            tokio::time::sleep(every).await;
            match self.reload_if_changed() {
                Ok(true) => {
                    failing = false;
                    tracing::info!(files = ?self.paths, "TLS certificate reloaded");
                }
                Ok(false) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "TLS certificate files changed but do not load; keeping the old ones");
                }
                Err(_) => {}
            }
        }
    }
}

fn stamps(paths: &[PathBuf]) -> Vec<Option<SystemTime>> {
    paths
        .iter()
        .map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
        .collect()
}

/// A node's client-port certificate and key.
pub type ServerTls = Reloaded<TlsAcceptor>;

impl ServerTls {
    /// The certificate chain in `cert_path` and the private key in `key_path` (PEM); errors say
    /// which file and what was wrong.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerTls>, String> {
        Reloaded::from_files(vec![cert_path.to_path_buf(), key_path.to_path_buf()], |paths| {
            let (certs, key) = certificate_and_key(&paths[0], &paths[1])?;
            let config = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(|e| not_a_pair(&paths[0], &paths[1], e))?;
            Ok(TlsAcceptor::from(Arc::new(config)))
        })
    }

    /// What accepts client connections now.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current()
    }
}

/// Both ends of mutual TLS on peer links: every node presents its certificate whether it accepts
/// or dials, and takes only peers whose certificate chains to the cluster's CA.
#[derive(Clone)]
pub struct PeerConfigs {
    pub acceptor: TlsAcceptor,
    pub dialer: Arc<rustls::ClientConfig>,
}

/// A node's peer certificate, its key and the cluster's CA.
pub type PeerTls = Reloaded<PeerConfigs>;

impl PeerTls {
    /// The certificate chain in `cert_path`, its key in `key_path` and the CA certificate(s)
    /// peers' certificates must chain to in `ca_path` (PEM); errors say which file.
    pub fn load(cert_path: &Path, key_path: &Path, ca_path: &Path) -> Result<Arc<PeerTls>, String> {
        let paths = vec![cert_path.to_path_buf(), key_path.to_path_buf(), ca_path.to_path_buf()];
        Reloaded::from_files(paths, |paths| {
            let (certs, key) = certificate_and_key(&paths[0], &paths[1])?;
            let roots = Arc::new(ca_roots(&paths[2])?);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| format!("{}: {e}", paths[2].display()))?;
            let mut server = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs.clone(), key.clone_key())
                .map_err(|e| not_a_pair(&paths[0], &paths[1], e))?;
            // Peers never resume sessions: tickets would be bytes for nothing.
            server.send_tls13_tickets = 0;
            let dialer = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_client_auth_cert(certs, key)
                .map_err(|e| not_a_pair(&paths[0], &paths[1], e))?;
            Ok(PeerConfigs {
                acceptor: TlsAcceptor::from(Arc::new(server)),
                dialer: Arc::new(dialer),
            })
        })
    }

    /// What accepts peers' connections and what dials them, now.
    pub fn configs(&self) -> PeerConfigs {
        self.current()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn not_a_pair(cert_path: &Path, key_path: &Path, e: rustls::Error) -> String {
    format!(
        "{} and {} are not a certificate and its key: {e}",
        cert_path.display(),
        key_path.display()
    )
}

fn certificate_and_key(
    cert_path: &Path,
    key_path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let certs = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the TLS certificate {}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", cert_path.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("cannot read the TLS private key {}: {e}", key_path.display()))?;
    Ok((certs, key))
}

/// The CA certificate(s) in `ca_cert` (PEM), and nothing else, as trust roots.
fn ca_roots(ca_cert: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the CA certificate {}: {e}", ca_cert.display()))?;
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("{} is not a CA certificate: {e}", ca_cert.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("no certificate in {}", ca_cert.display()));
    }
    Ok(roots)
}

/// A client's TLS: trusts the CA certificate(s) in `ca_cert` (PEM), nothing else.
pub fn client_connector(ca_cert: &Path) -> Result<TlsConnector, String> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(ca_roots(ca_cert)?)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// A random cluster secret (32 bytes from the system's generator, as hex) written to `path`,
/// readable by its owner only, for a local cluster's peers (`chorus cluster start --secret`);
/// an existing file is kept.
pub fn write_secret(path: &Path) -> Result<PathBuf, String> {
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let mut secret = [0u8; 32];
    getrandom::getrandom(&mut secret).map_err(|e| format!("cannot draw a secret: {e}"))?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    write_file(path, &(hex + "\n"), 0o600)?;
    Ok(path.to_path_buf())
}

/// Writes `text` to `path` (created with `mode` if new, replaced otherwise).
fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .and_then(|mut file| std::io::Write::write_all(&mut file, text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
#[derive(Debug, Clone)]
pub struct LocalCa {
    /// The CA's certificate: what clients verify the nodes with, and peers each other.
    pub ca_cert: PathBuf,
    /// The nodes' client-port certificate (for 127.0.0.1 and localhost) and its key.
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    /// The nodes' peer certificate (the same names, for both ends of a peer link) and its key.
    pub peer_cert: PathBuf,
    pub peer_key: PathBuf,
}

/// A throwaway CA and two certificates for 127.0.0.1 and localhost signed by it, one for the
/// client ports and one for peer links, written to `dir` as `ca.pem`, `node.pem`,
/// `node-key.pem`, `peer.pem` and `peer-key.pem` (keys readable by their owner only); files
/// already there are kept, so a cluster restarted keeps its CA.
pub fn write_local_ca(dir: &Path) -> Result<LocalCa, String> {
    let files = LocalCa {
        ca_cert: dir.join("ca.pem"),
        node_cert: dir.join("node.pem"),
        node_key: dir.join("node-key.pem"),
        peer_cert: dir.join("peer.pem"),
        peer_key: dir.join("peer-key.pem"),
    };
    let all = [
        &files.ca_cert,
        &files.node_cert,
        &files.node_key,
        &files.peer_cert,
        &files.peer_key,
    ];
    if all.iter().all(|file| file.exists()) {
        return Ok(files);
    }
    let failed = |e: rcgen::Error| format!("cannot make a local CA: {e}");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Chorus local cluster CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca_key = rcgen::KeyPair::generate().map_err(failed)?;
    let ca = ca_params.self_signed(&ca_key).map_err(failed)?;
    let leaf = |common_name: &str, usages: Vec<rcgen::ExtendedKeyUsagePurpose>| {
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).map_err(failed)?;
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = usages;
        let key = rcgen::KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &ca, &ca_key).map_err(failed)?;
        Ok::<_, String>((cert.pem(), key.serialize_pem()))
    };
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let (node_cert, node_key) = leaf("Chorus local node", vec![ServerAuth])?;
    let (peer_cert, peer_key) = leaf("Chorus local peer", vec![ServerAuth, ClientAuth])?;
    write_file(&files.node_key, &node_key, 0o600)?;
    write_file(&files.node_cert, &node_cert, 0o644)?;
    write_file(&files.peer_key, &peer_key, 0o600)?;
    write_file(&files.peer_cert, &peer_cert, 0o644)?;
    write_file(&files.ca_cert, &ca.pem(), 0o644)?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_drawn_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_secret(&path).unwrap();
        let first = std::fs::read_to_string(&path).unwrap();
        assert_eq!(first.trim().len(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        write_secret(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            first,
            "an existing secret is kept"
        );
        let other = dir.path().join("other");
        write_secret(&other).unwrap();
        assert_ne!(std::fs::read_to_string(&other).unwrap(), first);
    }

    #[test]
    fn a_local_ca_signs_a_certificate_the_server_loads_and_a_changed_file_is_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let ca = write_local_ca(dir.path()).unwrap();
        let tls = ServerTls::load(&ca.node_cert, &ca.node_key).unwrap();
        let first_key = std::fs::read(&ca.node_key).unwrap();
        assert!(!tls.reload_if_changed().unwrap(), "nothing changed");
        let again = write_local_ca(dir.path()).unwrap();
        assert_eq!(
            std::fs::read(&again.ca_cert).unwrap(),
            std::fs::read(&ca.ca_cert).unwrap(),
            "an existing CA is kept"
        );
        // A new certificate and key (another CA's) in place of the old ones.
        let other = tempfile::tempdir().unwrap();
        let replacement = write_local_ca(other.path()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::copy(&replacement.node_cert, &ca.node_cert).unwrap();
        std::fs::copy(&replacement.node_key, &ca.node_key).unwrap();
        assert!(tls.reload_if_changed().unwrap());
        // A key that does not match the certificate is refused, and the pair in use stays.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&ca.node_key, first_key).unwrap();
        let refused = tls.reload_if_changed();
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("not a certificate and its key")),
            "{refused:?}"
        );
        assert!(ServerTls::load(&ca.node_cert, &dir.path().join("missing.pem"))
            .err()
            .unwrap()
            .contains("missing.pem"));
    }
}

#[cfg(test)]
mod peer_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Dials `acceptor`'s side over an in-memory pipe with `dialer`: what the acceptor read, or
    /// why either side failed.
    async fn exchange(dialer: &PeerTls, acceptor: &PeerTls) -> Result<Vec<u8>, String> {
        let (near, far) = tokio::io::duplex(64 * 1024);
        let accepting = acceptor.configs().acceptor;
        let accepted = tokio::spawn(async move {
            let mut stream = accepting.accept(far).await.map_err(|e| format!("accept: {e}"))?;
            let mut got = vec![0u8; 5];
            stream.read_exact(&mut got).await.map_err(|e| format!("read: {e}"))?;
            Ok::<_, String>(got)
        });
        let name = rustls_pki_types::ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
        let dialed = TlsConnector::from(dialer.configs().dialer).connect(name, near).await;
        if let Ok(mut stream) = dialed {
            let _ = stream.write_all(b"hello").await;
            let _ = stream.flush().await;
        }
        accepted.await.unwrap()
    }

    #[tokio::test]
    async fn peers_of_one_ca_talk_and_a_peer_of_another_ca_is_refused_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let ours = write_local_ca(dir.path()).unwrap();
        let node = PeerTls::load(&ours.peer_cert, &ours.peer_key, &ours.ca_cert).unwrap();
        let other_dir = tempfile::tempdir().unwrap();
        let theirs = write_local_ca(other_dir.path()).unwrap();
        let outsider = PeerTls::load(&theirs.peer_cert, &theirs.peer_key, &theirs.ca_cert).unwrap();
        assert_eq!(exchange(&node, &node).await.unwrap(), b"hello");
        assert!(exchange(&outsider, &node).await.is_err(), "an outsider cannot dial in");
        assert!(exchange(&node, &outsider).await.is_err(), "nor be dialed");
        // An outsider that trusts our CA but has its own certificate is still refused.
        let half = PeerTls::load(&theirs.peer_cert, &theirs.peer_key, &ours.ca_cert).unwrap();
        assert!(exchange(&half, &node).await.is_err());
        // The client-port certificate is not a peer's: it may not authenticate a dialer.
        let server_only = PeerTls::load(&ours.node_cert, &ours.node_key, &ours.ca_cert).unwrap();
        assert!(exchange(&server_only, &node).await.is_err());
        assert!(PeerTls::load(&ours.peer_cert, &ours.peer_key, &ours.peer_key)
            .err()
            .unwrap()
            .contains("peer-key.pem"));
    }
}
