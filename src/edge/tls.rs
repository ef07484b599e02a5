//! TLS termination for the `server.tls` listeners (rustls: TLS 1.2 and 1.3,
//! ALPN `h2` then `http/1.1`). Each handshake takes its certificate, chosen
//! by SNI, and its client-certificate rules from the configuration current
//! at that moment: a reload (SIGHUP) that re-reads the certificates or the
//! client CA applies to new handshakes at once, while open connections keep
//! theirs.

use crate::config::tls::ClientAuth;
use crate::policy::state::SharedState;
use crate::request::client_cert::{ClientCert, VerifiedClientCert};
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::sync::Arc;

/// Picks the certificate of one TLS listener for each handshake.
pub(crate) struct SniResolver {
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
pub(crate) struct RlsResolver {
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
pub(crate) fn rls_server_config(
    state: SharedState,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(RlsResolver { state }));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Asks for and verifies client certificates on one TLS listener, by the
/// `client_auth` of the configuration current at each handshake (so a
/// reload that changes the CA file applies to the next handshake).
/// `required`: no certificate, or one that does not chain to the CA, fails
/// the handshake. `optional`: such a client is served, as one without a
/// certificate.
///
/// What a connection's requests may believe of its certificate is decided
/// once the handshake is complete (the key proof included), by
/// [`VerifiedCertRecorder`], and kept with that connection alone: nothing
/// is shared between connections or listeners, so a certificate verified
/// on one listener is never an identity on another, and a failed handshake
/// anywhere takes nothing from anyone.
pub(crate) struct ClientCertAuth {
    state: SharedState,
    listen: String,
    /// For the signatures of the handshake itself.
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for ClientCertAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertAuth")
            .field("listen", &self.listen)
            .finish()
    }
}

impl ClientCertAuth {
    /// The listener's `client_auth` now, if any.
    fn current(&self) -> Option<ClientAuth> {
        let state = self.state.load();
        let listeners = &state.config.server.tls;
        let listener = listeners
            .iter()
            .find(|l| l.listen == self.listen)
            .or_else(|| listeners.first())?;
        listener.client_auth.clone()
    }
}

impl ClientCertVerifier for ClientCertAuth {
    fn offer_client_auth(&self) -> bool {
        self.current().is_some()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.current().is_some_and(|auth| auth.required)
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let Some(auth) = self.current() else {
            return Err(rustls::Error::General(
                "client certificates are not asked for".into(),
            ));
        };
        match auth
            .verifier
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(verified) => Ok(verified),
            Err(e) if auth.required => {
                log::debug!("client certificate refused on {}: {e}", self.listen);
                Err(e)
            }
            Err(e) => {
                log::debug!(
                    "client certificate ignored on {} (optional): {e}",
                    self.listen
                );
                Ok(ClientCertVerified::assertion())
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Once a handshake is complete, records with the connection the client
/// certificate this listener's CA verifies (checked again here: in
/// `optional` mode the handshake also completes for a certificate that
/// does not chain to it). The record is the connection's own (Pingora's
/// TLS digest extension): its requests read it, nobody else can.
struct VerifiedCertRecorder(Arc<ClientCertAuth>);

#[async_trait::async_trait]
impl TlsAccept for VerifiedCertRecorder {
    async fn handshake_complete_callback(
        &self,
        tls: &TlsRef,
    ) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        let (end_entity, intermediates) = tls.peer_cert_chain_der()?.split_first()?;
        let auth = self.0.current()?;
        auth.verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .ok()?;
        let cert = ClientCert::parse(end_entity)?;
        Some(Arc::new(VerifiedClientCert(Arc::new(cert))))
    }
}

/// Pingora's TLS settings for the listener at `listen`: certificates by SNI
/// from `state`, client certificates by its `client_auth`, TLS 1.2 and 1.3,
/// HTTP/2 offered by ALPN.
pub fn listener_settings(state: SharedState, listen: &str) -> pingora::Result<TlsSettings> {
    let auth = Arc::new(ClientCertAuth {
        state: state.clone(),
        listen: listen.to_string(),
        provider: Arc::new(rustls::crypto::ring::default_provider()),
    });
    let mut settings =
        TlsSettings::with_callbacks(Box::new(VerifiedCertRecorder(Arc::clone(&auth))))?;
    settings.set_cert_resolver(Arc::new(SniResolver {
        state,
        listen: listen.to_string(),
    }));
    settings.set_client_cert_verifier(auth);
    settings.enable_h2();
    Ok(settings)
}
