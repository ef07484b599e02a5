//! TLS termination for the `server.tls` listeners (rustls: TLS 1.2 and 1.3,
//! ALPN `h2` then `http/1.1`). Each handshake takes its certificate, chosen
//! by SNI, from the configuration current at that moment: a reload (SIGHUP)
//! that re-reads the certificates serves them to new handshakes at once,
//! while open connections keep theirs.

use crate::state::SharedState;
use pingora::listeners::tls::TlsSettings;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::sync::Arc;

/// Picks the certificate of one TLS listener for each handshake.
pub struct SniResolver {
    state: SharedState,
    listen: String,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniResolver")
            .field("listen", &self.listen)
            .finish()
    }
}

impl ResolvesServerCert for SniResolver {
    /// The first certificate of the listener that covers the client's SNI
    /// name, or its first (the default) for no name or an unknown one.
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let state = self.state.load();
        let listeners = &state.config.server.tls;
        // A reload that drops or moves a listener applies on a restart:
        // until then its address keeps the first listener's certificates.
        let listener = listeners
            .iter()
            .find(|l| l.listen == self.listen)
            .or_else(|| listeners.first())?;
        listener.certificate_for(hello.server_name())
    }
}

/// Picks the certificate of the rate-limit service's listener
/// (`server.rls.certs`) for each handshake, from the configuration current
/// at that moment.
pub struct RlsResolver {
    state: SharedState,
}

impl std::fmt::Debug for RlsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RlsResolver")
    }
}

impl ResolvesServerCert for RlsResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let state = self.state.load();
        let tls = state.config.server.rls.as_ref()?.tls.as_ref()?;
        tls.certificate_for(hello.server_name())
    }
}

/// The rustls settings of the rate-limit service's TLS listener: its
/// certificates by SNI from `state`, TLS 1.2 and 1.3, ALPN `h2` only (gRPC).
pub fn rls_server_config(state: SharedState) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(RlsResolver { state }));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Pingora's TLS settings for the listener at `listen`: certificates by SNI
/// from `state`, TLS 1.2 and 1.3, HTTP/2 offered by ALPN.
pub fn listener_settings(state: SharedState, listen: &str) -> pingora::Result<TlsSettings> {
    let mut settings = TlsSettings::intermediate("", "")?;
    settings.set_cert_resolver(Arc::new(SniResolver {
        state,
        listen: listen.to_string(),
    }));
    settings.enable_h2();
    Ok(settings)
}
