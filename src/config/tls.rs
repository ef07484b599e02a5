//! Certificates of the TLS listeners (`server.tls`): read and checked when
//! the configuration loads (and so again on every reload), so a missing
//! file, an unreadable key or a key that is not the certificate's is a
//! `--check` error at its line, never a failed handshake.

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use std::sync::Arc;

/// One TLS listener: its address and its certificates, the first the
/// default for clients that send no name or one no certificate covers.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsListenerConfig {
    /// `IP:PORT`.
    pub listen: String,
    /// At least one.
    pub certs: Vec<LoadedCert>,
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
