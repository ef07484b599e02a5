//! What changed between two configurations, for the reload log (docs/operations.md).
//!
//! The diff is by name — routes by route name, limits by (route, limit name),
//! upstreams by upstream name — because names are what Redis counter keys are
//! made of: a limit that keeps its route and name keeps its counters.

use super::{Config, RouteConfig};

/// The differences between an old and a new configuration.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ConfigDiff {
    /// One line per change that a reload applies, such as
    /// "limit `sms/per-user` modified: 100 per 1m → 10 per 1m".
    pub applied: Vec<String>,
    /// One line per changed setting that only a restart or upgrade applies
    /// (listeners, threads, …); a reload keeps the running value.
    pub needs_restart: Vec<String>,
}

impl ConfigDiff {
    /// Whether the two configurations are the same in everything a reload applies.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty()
    }
}

/// Compares `old` with `new`.
pub(crate) fn diff(old: &Config, new: &Config) -> ConfigDiff {
    let mut d = ConfigDiff::default();
    server(old, new, &mut d);
    if old.client_ip != new.client_ip {
        d.applied.push("client_ip modified".into());
    }
    if old.identity != new.identity {
        d.applied.push("identity modified".into());
    }
    if old.limiter != new.limiter {
        d.applied
            .push("limiter modified: new backend connections, in-process counters restart".into());
    }
    if old.response != new.response {
        d.applied.push("response modified".into());
    }
    if old.exempt != new.exempt {
        d.applied
            .push(format!("exempt modified: {}", new.exempt.describe()));
    }
    if old.server.access_log != new.server.access_log {
        d.applied.push(format!(
            "server.access_log {}",
            if new.server.access_log { "on" } else { "off" }
        ));
    }
    if old.server.watch_config != new.server.watch_config {
        d.applied.push(format!(
            "server.watch_config {}",
            if new.server.watch_config { "on" } else { "off" }
        ));
    }
    if old.server.front_door != new.server.front_door {
        d.applied
            .push("server connection limits modified (new connections use them)".into());
    }
    upstreams(old, new, &mut d);
    routes(old, new, &mut d);
    d
}

fn server(old: &Config, new: &Config, d: &mut ConfigDiff) {
    let (o, n) = (&old.server, &new.server);
    let mut restart = |name: &str, changed: bool| {
        if changed {
            d.needs_restart.push(format!("server.{name}"));
        }
    };
    restart("listen", o.listen != n.listen);
    restart("admin", o.admin != n.admin);
    restart("threads", o.threads != n.threads);
    restart("work_stealing", o.work_stealing != n.work_stealing);
    restart("grace_period", o.grace_period != n.grace_period);
    restart("shutdown_delay", o.shutdown_delay != n.shutdown_delay);
    restart("pid_file", o.pid_file != n.pid_file);
    restart("upgrade_sock", o.upgrade_sock != n.upgrade_sock);
    let addresses = |s: &super::ServerConfig| -> Vec<String> {
        s.tls.iter().map(|l| l.listen.clone()).collect()
    };
    restart("tls (listen addresses)", addresses(o) != addresses(n));
    restart("h2c", o.h2c != n.h2c);
    let speaks_h2 = n.h2c || !n.tls.is_empty();
    restart(
        "keepalive_timeout (of HTTP/2 connections)",
        speaks_h2 && o.front_door.keepalive_timeout != n.front_door.keepalive_timeout,
    );
    if o.tls != n.tls && addresses(o) == addresses(n) {
        d.applied.push(
            "server.tls certificates and client CAs re-read (new handshakes use them)".into(),
        );
    }
    rls(o, n, d);
}

/// The rate-limit service: its rules and defaults reload; its address,
/// and whether it runs or speaks TLS, need a restart.
fn rls(o: &super::ServerConfig, n: &super::ServerConfig, d: &mut ConfigDiff) {
    let (old, new) = match (&o.rls, &n.rls) {
        (Some(old), Some(new)) => (old, new),
        (None, None) => return,
        _ => {
            d.needs_restart.push("server.rls (on or off)".into());
            return;
        }
    };
    if old.listen != new.listen {
        d.needs_restart.push("server.rls.listen".into());
    }
    if old.tls.is_some() != new.tls.is_some() {
        d.needs_restart
            .push("server.rls.certs (TLS on or off)".into());
    }
    if old.rules != new.rules {
        d.applied.push(format!(
            "server.rls rules modified: {} domains, {} limits",
            new.rules.domains.len(),
            new.rules.limits.len()
        ));
    }
    if old.algorithm != new.algorithm || old.response_headers != new.response_headers {
        d.applied.push("server.rls defaults modified".into());
    }
    if old.tls.is_some() && new.tls.is_some() && old.tls != new.tls {
        d.applied
            .push("server.rls certificates re-read (new handshakes use them)".into());
    }
}

fn upstreams(old: &Config, new: &Config, d: &mut ConfigDiff) {
    for o in &old.upstreams {
        match new.upstreams.iter().find(|n| n.name == o.name) {
            None => d.applied.push(format!("upstream `{}` removed", o.name)),
            Some(n) if n != o => d.applied.push(format!("upstream `{}` modified", o.name)),
            Some(_) => {}
        }
    }
    for n in &new.upstreams {
        if !old.upstreams.iter().any(|o| o.name == n.name) {
            d.applied.push(format!("upstream `{}` added", n.name));
        }
    }
}

fn routes(old: &Config, new: &Config, d: &mut ConfigDiff) {
    for (i, o) in old.routes.iter().enumerate() {
        let Some((j, n)) = new
            .routes
            .iter()
            .enumerate()
            .find(|(_, n)| n.name == o.name)
        else {
            d.applied.push(format!("route `{}` removed", o.name));
            continue;
        };
        let mut what = Vec::new();
        if (&o.path, &o.methods, &o.host) != (&n.path, &n.methods, &n.host) {
            what.push("match");
        }
        if action_target(old, o) != action_target(new, n) {
            what.push("target");
        }
        if o.exempt != n.exempt {
            what.push("exempt");
        }
        if i != j {
            what.push("position");
        }
        if !what.is_empty() {
            d.applied
                .push(format!("route `{}` modified: {}", o.name, what.join(", ")));
        }
        limits(o, n, d);
    }
    for n in &new.routes {
        if !old.routes.iter().any(|o| o.name == n.name) {
            d.applied.push(format!("route `{}` added", n.name));
        }
    }
}

/// The route's target by upstream name (indices shift when upstreams change).
fn action_target(config: &Config, route: &RouteConfig) -> String {
    match &route.action {
        super::RouteAction::Upstream(i) => config
            .upstreams
            .get(*i)
            .map(|u| format!("upstream {}", u.name))
            .unwrap_or_default(),
        super::RouteAction::Respond { status, body } => format!("respond {status} {body}"),
    }
}

fn limits(old: &RouteConfig, new: &RouteConfig, d: &mut ConfigDiff) {
    let route = &old.name;
    for o in &old.limits {
        match new.limits.iter().find(|n| n.name == o.name) {
            None => d
                .applied
                .push(format!("limit `{route}/{}` removed", o.name)),
            Some(n) if n != o => {
                let mut line = format!(
                    "limit `{route}/{}` modified: {} → {}",
                    o.name,
                    o.describe(),
                    n.describe()
                );
                if o.algorithm.name() != n.algorithm.name() || o.share != n.share {
                    line.push_str(" (its counters restart)");
                }
                d.applied.push(line);
            }
            Some(_) => {}
        }
    }
    for n in &new.limits {
        if !old.limits.iter().any(|o| o.name == n.name) {
            d.applied.push(format!(
                "limit `{route}/{}` added: {}",
                n.name,
                n.describe()
            ));
        }
    }
}
