//! What every listener's settings share: an address to bind, and TLS
//! certificates read and checked when the configuration loads (used by the
//! server's listeners and the rate-limit service's).

use super::super::checker::Checker;
use super::super::file::TlsCertFile;
use super::super::problem::{KeyPath, ProblemKind};
use super::super::tls::LoadedCert;
use std::net::SocketAddr;

/// An `IP:PORT` to listen on.
pub(super) fn check_listen_addr(c: &mut Checker, path: &KeyPath, addr: &str) {
    if addr.parse::<SocketAddr>().is_err() {
        c.problem(path, ProblemKind::BadListenAddress(addr.to_string()));
    }
}

/// The certificates of a TLS listener, read and checked now (a missing
/// file, an unreadable key, a key that is not its certificate's are errors
/// at the entry's line).
pub(super) fn load_certs(c: &mut Checker, at: &KeyPath, pairs: &[TlsCertFile]) -> Vec<LoadedCert> {
    let mut certs = Vec::new();
    for (j, pair) in pairs.iter().enumerate() {
        match LoadedCert::load(&pair.cert, &pair.key) {
            Ok(cert) => certs.push(cert),
            Err(why) => c.problem(&at.index(j), ProblemKind::BadCertificate(why)),
        }
    }
    certs
}
