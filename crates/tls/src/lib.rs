//! TLS on a node's client ports: its certificate and key, loaded from PEM files and reloaded
//! when either file changes (connections accepted after that get the new ones; open ones keep
//! theirs); and for local clusters, throwaway CAs (`chorus cluster start --tls`) and random
//! cluster secrets (`--secret`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use chorus_metrics::Counter;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
pub use tokio_rustls::server::TlsStream;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A node's server certificate, reloaded when its files change.
pub struct ServerTls {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Loaded>,
    reloads: Arc<Counter>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

struct Loaded {
    acceptor: TlsAcceptor,
    /// The files' modification times when loaded.
    stamps: (Option<SystemTime>, Option<SystemTime>),
}

impl ServerTls {
    /// The certificate chain in `cert_path` and the private key in `key_path` (PEM); errors say
    /// which file and what was wrong.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerTls>, String> {
        let loaded = load(cert_path, key_path)?;
        Ok(Arc::new(ServerTls {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new(loaded),
            reloads: chorus_metrics::counter(
                "chorus_tls_certificate_reloads_total",
                "Times the TLS certificate and key were read again after their files changed",
            ),
        }))
    }

    /// What accepts connections now.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current.read().expect("not poisoned").acceptor.clone()
    }

    /// Loads the files again if either changed since; a file that does not load (half written,
    /// say) leaves the certificate in use as it is, and is tried again next time.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let stamps = (modified(&self.cert_path), modified(&self.key_path));
        if stamps == self.current.read().expect("not poisoned").stamps {
            return Ok(false);
        }
        let loaded = load(&self.cert_path, &self.key_path)?;
        *self.current.write().expect("not poisoned") = loaded;
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
                    tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded");
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

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn load(cert_path: &Path, key_path: &Path) -> Result<Loaded, String> {
    // Stamped before reading: a change while reading is seen next time.
    let stamps = (modified(cert_path), modified(key_path));
    let certs = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the TLS certificate {}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", cert_path.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("cannot read the TLS private key {}: {e}", key_path.display()))?;
    let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "{} and {} are not a certificate and its key: {e}",
                cert_path.display(),
                key_path.display()
            )
        })?;
    Ok(Loaded {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        stamps,
    })
}

/// A client's TLS: trusts the CA certificate(s) in `ca_cert` (PEM), nothing else.
pub fn client_connector(ca_cert: &Path) -> Result<TlsConnector, String> {
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
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
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
    /// The CA's certificate: what clients verify the nodes with.
    pub ca_cert: PathBuf,
    /// The nodes' certificate (for 127.0.0.1 and localhost) and its key.
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
}

/// A throwaway CA and one certificate for 127.0.0.1 and localhost signed by it, written to
/// `dir` as `ca.pem`, `node.pem` and `node-key.pem` (the key readable by its owner only);
/// files already there are kept, so a cluster restarted keeps its CA.
pub fn write_local_ca(dir: &Path) -> Result<LocalCa, String> {
    let files = LocalCa {
        ca_cert: dir.join("ca.pem"),
        node_cert: dir.join("node.pem"),
        node_key: dir.join("node-key.pem"),
    };
    if files.ca_cert.exists() && files.node_cert.exists() && files.node_key.exists() {
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
    let mut node_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).map_err(failed)?;
    node_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Chorus local node");
    let node_key = rcgen::KeyPair::generate().map_err(failed)?;
    let node = node_params.signed_by(&node_key, &ca, &ca_key).map_err(failed)?;
    write_file(&files.node_key, &node_key.serialize_pem(), 0o600)?;
    write_file(&files.node_cert, &node.pem(), 0o644)?;
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
