//! Client certificates verified at a TLS handshake (`server.tls[].client_auth`),
//! and what a request may know of them: the certificate's SHA-256
//! fingerprint, its subject and its subject alternative names.
//!
//! rustls verifies a client's chain during the handshake, before any request,
//! and Pingora hands a request only the SHA-256 of the peer's certificate. So
//! the verifier records each certificate it accepts here, by that digest,
//! and a request looks its connection's certificate up: a certificate that is
//! not here was not verified (an `optional` listener serves such a client as
//! one without a certificate). A certificate that fails verification is
//! removed, so that one verified under a CA since removed stops counting for
//! new connections. The record is bounded: when it is full it is emptied,
//! and the connections whose certificates it forgot are served as without
//! one until they reconnect — never as someone else.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// What a verified client certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// SHA-256 of the certificate's DER, lower-case hex.
    pub fingerprint: String,
    /// The subject, as RFC 4514 text (`CN=orders,O=Acme`).
    pub subject: String,
    /// The subject's common name, if it has one.
    pub subject_cn: Option<String>,
    /// `DNS` subject alternative names.
    pub san_dns: Vec<String>,
    /// `URI` subject alternative names (SPIFFE IDs, for one).
    pub san_uri: Vec<String>,
}

impl ClientCert {
    /// The name `client_san` stands for: the first URI SAN (a SPIFFE ID, for
    /// one), else the first DNS SAN.
    pub fn san(&self) -> Option<&str> {
        self.san_uri
            .first()
            .or_else(|| self.san_dns.first())
            .map(String::as_str)
    }

    /// Reads a certificate's DER; `None` if it does not parse.
    pub fn parse(der: &[u8]) -> Option<Self> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject_cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string);
        let (mut san_dns, mut san_uri) = (Vec::new(), Vec::new());
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => san_dns.push(dns.to_string()),
                    GeneralName::URI(uri) => san_uri.push(uri.to_string()),
                    _ => {}
                }
            }
        }
        Some(Self {
            fingerprint: hex(&Sha256::digest(der)),
            subject: cert.subject().to_string(),
            subject_cn,
            san_dns,
            san_uri,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// How many verified certificates are remembered at most.
const MAX_REMEMBERED: usize = 65_536;

fn verified_certs() -> &'static Mutex<HashMap<Vec<u8>, Arc<ClientCert>>> {
    static VERIFIED: OnceLock<Mutex<HashMap<Vec<u8>, Arc<ClientCert>>>> = OnceLock::new();
    VERIFIED.get_or_init(Mutex::default)
}

/// Records a certificate the handshake verified.
pub(crate) fn record_verified(der: &[u8]) {
    let Some(cert) = ClientCert::parse(der) else {
        return;
    };
    let digest = Sha256::digest(der).to_vec();
    if let Ok(mut certs) = verified_certs().lock() {
        if certs.len() >= MAX_REMEMBERED && !certs.contains_key(&digest) {
            certs.clear();
        }
        certs.insert(digest, Arc::new(cert));
    }
}

/// Forgets a certificate that failed verification.
pub(crate) fn forget(der: &[u8]) {
    let digest = Sha256::digest(der).to_vec();
    if let Ok(mut certs) = verified_certs().lock() {
        certs.remove(&digest);
    }
}

/// The verified certificate whose SHA-256 is `digest`, if any.
pub fn verified(digest: &[u8]) -> Option<Arc<ClientCert>> {
    if digest.is_empty() {
        return None;
    }
    verified_certs().lock().ok()?.get(digest).cloned()
}
