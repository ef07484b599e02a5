//! Passive health (nginx's `max_fails` / `fail_timeout`): a server that
//! fails `max_fails` times within `fail_timeout` — refused, reset, timed out
//! — is taken out of selection for `fail_timeout`, then tried again.

use crate::sync::Locked;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One server's recent failures.
#[derive(Debug, Clone, Copy)]
struct Failures {
    /// Failures counted since `since`.
    count: u32,
    /// When the counting window began.
    since: Instant,
    /// Out of selection until then.
    out_until: Option<Instant>,
    /// What the last failure was (an error kind: "ConnectRefused", …).
    last: &'static str,
}

/// A server taken out by its failures, as the console and `/v1/upstreams`
/// show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// How long it stays out from now.
    pub remaining: Duration,
    /// The kind of the failure that took it out.
    pub last_failure: &'static str,
}

/// The failures of one upstream's servers.
#[derive(Debug)]
pub struct PassiveHealth {
    max_fails: u32,
    fail_timeout: Duration,
    servers: Mutex<HashMap<SocketAddr, Failures>>,
}

impl PassiveHealth {
    /// Takes a server out after `max_fails` failures within `fail_timeout`,
    /// for `fail_timeout`; `max_fails` 0 never takes one out.
    pub fn new(max_fails: u32, fail_timeout: Duration) -> Self {
        PassiveHealth {
            max_fails,
            fail_timeout,
            servers: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a failure of `server` at `now`, of kind `what`; true when it
    /// takes the server out.
    pub fn failed(&self, server: SocketAddr, now: Instant, what: &'static str) -> bool {
        if self.max_fails == 0 {
            return false;
        }
        let mut servers = self.servers.locked();
        let entry = servers.entry(server).or_insert(Failures {
            count: 0,
            since: now,
            out_until: None,
            last: what,
        });
        entry.last = what;
        if now.duration_since(entry.since) > self.fail_timeout {
            entry.count = 0;
            entry.since = now;
        }
        entry.count += 1;
        if entry.count < self.max_fails {
            return false;
        }
        entry.count = 0;
        entry.since = now;
        entry.out_until = Some(now + self.fail_timeout);
        true
    }

    /// Whether `server` is out at `now`, for how long still, and why.
    pub fn ejection(&self, server: SocketAddr, now: Instant) -> Option<Ejection> {
        let servers = self.servers.locked();
        let failures = servers.get(&server)?;
        let until = failures.out_until.filter(|until| *until > now)?;
        Some(Ejection {
            remaining: until - now,
            last_failure: failures.last,
        })
    }

    /// Whether `server` is out of selection at `now`.
    pub fn is_out(&self, server: SocketAddr, now: Instant) -> bool {
        if self.max_fails == 0 {
            return false;
        }
        let servers = self.servers.locked();
        servers
            .get(&server)
            .and_then(|f| f.out_until)
            .is_some_and(|until| until > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_out_after_max_fails_within_the_window_and_back_after_it() {
        let health = PassiveHealth::new(2, Duration::from_secs(10));
        let server: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let t0 = Instant::now();
        assert!(!health.failed(server, t0, "ConnectRefused"));
        assert!(!health.is_out(server, t0));
        // The second failure comes after the window: counted afresh.
        assert!(!health.failed(server, t0 + Duration::from_secs(11), "ConnectRefused"));
        assert!(health.failed(server, t0 + Duration::from_secs(12), "ConnectTimedout"));
        assert!(health.is_out(server, t0 + Duration::from_secs(13)));
        let ejection = health.ejection(server, t0 + Duration::from_secs(13));
        assert_eq!(
            ejection,
            Some(Ejection {
                remaining: Duration::from_secs(9),
                last_failure: "ConnectTimedout"
            })
        );
        assert_eq!(health.ejection(server, t0 + Duration::from_secs(23)), None);
        assert!(!health.is_out(server, t0 + Duration::from_secs(23)));
    }

    #[test]
    fn max_fails_zero_never_takes_a_server_out() {
        let health = PassiveHealth::new(0, Duration::from_secs(10));
        let server: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let now = Instant::now();
        assert!(!health.failed(server, now, "ConnectRefused"));
        assert!(!health.is_out(server, now));
    }
}
