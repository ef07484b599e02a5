//! `upstreams:`. Server names are checked for shape here and resolved later
//! (`config/resolve.rs`), so validation does no I/O.

use super::super::checker::Checker;
use super::super::defaults::upstream as defaults;
use super::super::file::{BalanceFile, UpstreamFile, UpstreamServerFile, UpstreamTlsFile};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::{Balance, KeyPart, ServerSpec, UpstreamConfig, UpstreamProtocol, UpstreamTls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::time::Duration;

pub(super) fn upstream(c: &mut Checker, name: &str, f: &UpstreamFile) -> UpstreamConfig {
    let path = KeyPath::root("upstreams").key(name);
    c.name(&path, name, "upstream");
    let balance = balance(c, &path, f);
    let fail_timeout = fail_timeout(c, &path, f);
    let dns_refresh = dns_refresh(c, &path, f);
    if f.servers.is_empty() {
        let kind = ProblemKind::NeedsOne {
            key: "servers",
            item: "host:port",
        };
        c.problem(&path.key("servers"), kind);
    }
    let mut addresses = Vec::with_capacity(f.servers.len());
    for (i, server) in f.servers.iter().enumerate() {
        let at = path.key("servers").index(i);
        if server.addr.contains("://") {
            let kind = ProblemKind::ServerWithScheme(server.addr.clone());
            c.problem(&at, kind);
        }
        let weight = server.weight.unwrap_or(1);
        if weight == 0 || weight > 1000 {
            let key = "weight".to_string();
            let kind = ProblemKind::Between {
                key,
                min: 1,
                max: 1000,
            };
            c.problem(&at.key("weight"), kind);
        }
        addresses.push(ServerSpec {
            addr: server.addr.clone(),
            weight: weight.clamp(1, 1000) as usize,
        });
    }
    let health_check = f.health_check.as_ref().map(|h| {
        let at = path.key("health_check").key("interval");
        let interval = c.duration(&at, h.interval.as_deref(), defaults::HEALTH_INTERVAL);
        if interval < Duration::from_millis(100) {
            let kind = ProblemKind::AtLeast {
                key: "interval",
                min: "100ms",
            };
            c.problem(&at, kind);
        }
        interval
    });
    let mut timeout = |field: &str, text: &Option<String>, default: Duration| {
        let value = c.duration(&path.key(field), text.as_deref(), default);
        if value.is_zero() {
            c.problem(&path.key(field), ProblemKind::Zero(field.to_string()));
        }
        value
    };
    let connect_timeout = timeout(
        "connect_timeout",
        &f.connect_timeout,
        defaults::CONNECT_TIMEOUT,
    );
    let read_timeout = timeout("read_timeout", &f.read_timeout, defaults::READ_TIMEOUT);
    UpstreamConfig {
        name: name.to_string(),
        addresses,
        servers: Vec::new(),
        health_check,
        connect_timeout,
        read_timeout,
        tls: f
            .tls
            .as_ref()
            .map(|t| tls(c, &path.key("tls"), t, &f.servers)),
        protocol: protocol(c, &path, f),
        balance,
        max_fails: f.max_fails.unwrap_or(defaults::MAX_FAILS),
        fail_timeout,
        dns_refresh,
    }
}

/// `dns_refresh:` (at least 1s), when given.
fn dns_refresh(c: &mut Checker, path: &KeyPath, f: &UpstreamFile) -> Option<Duration> {
    let text = f.dns_refresh.as_deref()?;
    let at = path.key("dns_refresh");
    let value = c.duration(&at, Some(text), Duration::from_secs(30));
    if value < Duration::from_secs(1) {
        let kind = ProblemKind::AtLeast {
            key: "dns_refresh",
            min: "1s",
        };
        c.problem(&at, kind);
    }
    Some(value)
}

/// `fail_timeout:` (more than zero).
fn fail_timeout(c: &mut Checker, path: &KeyPath, f: &UpstreamFile) -> Duration {
    let at = path.key("fail_timeout");
    let value = c.duration(&at, f.fail_timeout.as_deref(), defaults::FAIL_TIMEOUT);
    if value.is_zero() {
        c.problem(&at, ProblemKind::Zero("fail_timeout".to_string()));
    }
    value
}

/// `balance:` and `hash_key:` (consistent_hash only; `[ip]` by default).
fn balance(c: &mut Checker, path: &KeyPath, f: &UpstreamFile) -> Balance {
    let hash_key = f
        .hash_key
        .as_ref()
        .map(|parts| super::limit::key_parts(c, &path.key("hash_key"), parts, None));
    match (f.balance.unwrap_or(BalanceFile::RoundRobin), hash_key) {
        (BalanceFile::ConsistentHash, Some(parts)) => Balance::ConsistentHash(parts),
        (BalanceFile::ConsistentHash | BalanceFile::HashIp, None) => {
            Balance::ConsistentHash(vec![KeyPart::Ip])
        }
        (_, Some(_)) => {
            c.problem(&path.key("hash_key"), ProblemKind::HashKeyWithoutHashing);
            Balance::RoundRobin
        }
        (BalanceFile::RoundRobin, None) => Balance::RoundRobin,
        (BalanceFile::Random, None) => Balance::Random,
    }
}

/// `protocol:` h2 is HTTP/2 over TLS, h2c over plain TCP.
fn protocol(c: &mut Checker, path: &KeyPath, f: &UpstreamFile) -> UpstreamProtocol {
    let protocol = f.protocol.unwrap_or_default();
    let why = match (protocol, f.tls.is_some()) {
        (UpstreamProtocol::H2, false) => {
            Some("`protocol: h2` is HTTP/2 over TLS: add `tls`, or use h2c")
        }
        (UpstreamProtocol::H2c, true) => {
            Some("`protocol: h2c` is HTTP/2 without TLS: use h2 with `tls`")
        }
        _ => None,
    };
    if let Some(why) = why {
        c.problem(&path.key("protocol"), ProblemKind::ProtocolAndTls(why));
    }
    protocol
}

/// `tls:`: the name defaults to the first server's host; `ca_file` is read
/// now, and every certificate in it must parse.
fn tls(
    c: &mut Checker,
    at: &KeyPath,
    t: &UpstreamTlsFile,
    servers: &[UpstreamServerFile],
) -> UpstreamTls {
    let host = servers
        .first()
        .and_then(|s| s.addr.rsplit_once(':'))
        .map(|(host, _)| {
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string()
        })
        .unwrap_or_default();
    let sni = t.sni.clone().unwrap_or(host);
    let ca_der = t.ca_file.as_ref().and_then(|file| {
        let at = at.key("ca_file");
        let pem = c.read_file(&at, file)?;
        let certs: Result<Vec<CertificateDer<'static>>, _> =
            CertificateDer::pem_slice_iter(&pem).collect();
        let parsed = certs.ok().filter(|certs| {
            !certs.is_empty()
                && certs
                    .iter()
                    .all(|cert| webpki::anchor_from_trusted_cert(cert).is_ok())
        });
        match parsed {
            Some(certs) => Some(certs.iter().map(|cert| cert.as_ref().to_vec()).collect()),
            None => {
                c.problem(&at, ProblemKind::NotPem(file.clone()));
                None
            }
        }
    });
    UpstreamTls {
        sni,
        verify: t.verify.unwrap_or(true),
        ca_der,
    }
}
