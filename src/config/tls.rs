//! Certificates of the TLS listeners (`server.tls`): read and checked when
//! the configuration loads (and so again on every reload), so a missing
//! file, an unreadable key or a key that is not the certificate's is a
//! `--check` error at its line, never a failed handshake.

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use std::sync::Arc;

/// One TLS listener: its address and its certificates, the first the
/// default for clients that send no name or one no certificate covers.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsListenerConfig {
    /// `IP:PORT`.
    pub listen: String,
    /// At least one.
    pub certs: Vec<LoadedCert>,
    /// Client certificates asked for, and what they must chain to.
    pub client_auth: Option<ClientAuth>,
}

/// `client_auth` of a TLS listener: its CA certificates, read when the
/// configuration loads (and so again on every reload), and the verifier
/// made from them.
#[derive(Clone)]
pub struct ClientAuth {
    /// The CA file, as written.
    pub ca_path: String,
    /// Whether a client without a valid certificate is refused at the
    /// handshake (else it is served as one without a certificate).
    pub required: bool,
    /// Verifies a client's chain against the CA certificates.
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// The CA certificates, to tell whether a reload changed them.
    roots: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("ca", &self.ca_path)
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ClientAuth {
    fn eq(&self, other: &Self) -> bool {
        self.ca_path == other.ca_path
            && self.required == other.required
            && self.roots == other.roots
    }
}

impl ClientAuth {
    /// Reads the PEM CA certificates at `ca_path` and makes their verifier.
    /// The error says which file and why.
    pub fn load(ca_path: &str, required: bool) -> Result<Self, String> {
        let pem = std::fs::read(ca_path).map_err(|e| format!("cannot read `{ca_path}`: {e}"))?;
        let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("`{ca_path}` is not a PEM certificate file: {e}"))?;
        if roots.is_empty() {
            return Err(format!("`{ca_path}` holds no PEM certificate"));
        }
        let mut store = RootCertStore::empty();
        for root in &roots {
            store
                .add(root.clone())
                .map_err(|e| format!("`{ca_path}`: a certificate is not a usable CA: {e}"))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .map_err(|e| format!("`{ca_path}`: {e}"))?;
        Ok(Self {
            ca_path: ca_path.to_string(),
            required,
            verifier,
            roots,
        })
    }
}

/// A certificate chain and its private key, ready to serve.
#[derive(Clone)]
pub struct LoadedCert {
    /// The certificate file, as written.
    pub cert_path: String,
    /// The key file, as written.
    pub key_path: String,
    /// The chain and the signing key.
    pub key: Arc<CertifiedKey>,
}

impl std::fmt::Debug for LoadedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedCert")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish()
    }
}

impl PartialEq for LoadedCert {
    /// The same files holding the same chain (a key that changes changes its
    /// certificate too).
    fn eq(&self, other: &Self) -> bool {
        self.cert_path == other.cert_path
            && self.key_path == other.key_path
            && self.key.cert == other.key.cert
    }
}

impl LoadedCert {
    /// Reads `cert_path` (a PEM chain, leaf first) and `key_path` (a PEM
    /// private key: PKCS#8, PKCS#1 or SEC1) and checks that the key is the
    /// leaf certificate's. The error says which file and why.
    pub fn load(cert_path: &str, key_path: &str) -> Result<Self, String> {
        let cert_pem =
            std::fs::read(cert_path).map_err(|e| format!("cannot read `{cert_path}`: {e}"))?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("`{cert_path}` is not a PEM certificate chain: {e}"))?;
        if chain.is_empty() {
            return Err(format!("`{cert_path}` holds no PEM certificate"));
        }
        let key_pem =
            std::fs::read(key_path).map_err(|e| format!("cannot read `{key_path}`: {e}"))?;
        let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| format!("`{key_path}` is not a PEM private key: {e}"))?;
        let signing = any_supported_type(&key_der)
            .map_err(|e| format!("`{key_path}` is not a usable private key: {e}"))?;
        let key = CertifiedKey::new(chain, signing);
        key.keys_match()
            .map_err(|e| format!("`{key_path}` is not the key of `{cert_path}`: {e}"))?;
        Ok(Self {
            cert_path: cert_path.to_string(),
            key_path: key_path.to_string(),
            key: Arc::new(key),
        })
    }

    /// Whether the leaf certificate is valid for `name` (its subject
    /// alternative names, wildcards included, as a client checks them).
    pub fn covers(&self, name: &ServerName<'_>) -> bool {
        let Some(leaf) = self.key.cert.first() else {
            return false;
        };
        webpki::EndEntityCert::try_from(leaf)
            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(name).is_ok())
    }
}

impl TlsListenerConfig {
    /// The certificate for a client that asked for `sni`: the first that
    /// covers the name, or the first of all.
    pub fn certificate_for(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let name = sni.and_then(|s| ServerName::try_from(s.to_string()).ok());
        let chosen = name
            .and_then(|name| self.certs.iter().find(|c| c.covers(&name)))
            .or_else(|| self.certs.first());
        chosen.map(|c| Arc::clone(&c.key))
    }
}
