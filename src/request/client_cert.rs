//! Client certificates verified at a TLS handshake (`server.tls[].client_auth`),
//! and what a request may know of them: the certificate's SHA-256
//! fingerprint, its subject and its subject alternative names.
//!
//! rustls verifies a client's chain during the handshake, before any request.
//! Once the handshake is complete, the listener checks the chain against its
//! own CA once more and, if it holds, attaches the certificate to that
//! connection ([`VerifiedClientCert`], in Pingora's TLS digest): a request
//! knows only its own connection's verified certificate. There is no record
//! shared between connections, so a certificate verified on one listener is
//! no identity on another, and no handshake, failed or not, changes what
//! another connection knows.

use sha2::{Digest, Sha256};
use std::sync::Arc;

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

/// A client certificate the listener's CA verified, kept with the
/// connection it was presented on.
#[derive(Debug, Clone)]
pub struct VerifiedClientCert(pub Arc<ClientCert>);
