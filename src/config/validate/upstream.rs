//! `upstreams:`. Server names are checked for shape here and resolved later
//! (`config/resolve.rs`), so validation does no I/O.

use super::super::checker::Checker;
use super::super::defaults::upstream as defaults;
use super::super::file::{BalanceFile, UpstreamFile};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::UpstreamConfig;
use std::time::Duration;

pub(super) fn upstream(c: &mut Checker, name: &str, f: &UpstreamFile) -> UpstreamConfig {
    let path = KeyPath::root("upstreams").key(name);
    c.name(&path, name, "upstream");
    c.not_supported(&path.key("tls"), &f.tls, "TLS to upstreams (`tls`)");
    if matches!(f.balance, Some(BalanceFile::Random | BalanceFile::HashIp)) {
        let what = "`balance` other than round_robin";
        c.problem(&path.key("balance"), ProblemKind::NotSupported(what));
    }
    if f.servers.is_empty() {
        let kind = ProblemKind::NeedsOne {
            key: "servers",
            item: "host:port",
        };
        c.problem(&path.key("servers"), kind);
    }
    for (i, server) in f.servers.iter().enumerate() {
        if server.contains("://") {
            let kind = ProblemKind::ServerWithScheme(server.clone());
            c.problem(&path.key("servers").index(i), kind);
        }
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
        addresses: f.servers.clone(),
        servers: Vec::new(),
        health_check,
        connect_timeout,
        read_timeout,
    }
}
