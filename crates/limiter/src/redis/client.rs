//! How both Redis backends talk to Redis, apart from what they say: the
//! client for a URL (TLS included), the connection's TCP settings, a
//! query within its deadline, the one table that classifies Redis's
//! errors, and each call's outcome reported to the observer and the
//! circuit breaker.

use crate::redis::circuit::{CircuitBreaker, Transition};
use crate::settings::RedisTlsConfig;
use crate::{LimiterError, RedisObserver};
use std::time::{Duration, Instant};

/// The least a connection waits for a reply before giving up on it (every
/// decision is separately bounded by its own, shorter, budget).
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// A circuit breaker for a Redis node reached within `budget` per decision
/// and `connect` per connect: its probe may take a connect, or two budgets.
pub(super) fn circuit_for(budget: Duration, connect: Duration) -> CircuitBreaker {
    CircuitBreaker::new(connect.max(budget * 2))
}

/// The TLS material of `limiter.redis.tls` as the redis crate takes it;
/// `None` when neither a CA nor a client certificate is set (a `rediss://`
/// URL then trusts the system's roots).
pub(super) fn tls_certificates(tls: &RedisTlsConfig) -> Option<redis::TlsCertificates> {
    if tls.ca_pem.is_none() && tls.client_pem.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: tls
            .client_pem
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    })
}

/// A client for `info`, over TLS with `tls`'s material when it has any.
pub(super) fn client_for(
    info: redis::ConnectionInfo,
    tls: &RedisTlsConfig,
) -> redis::RedisResult<redis::Client> {
    ensure_tls_provider();
    match tls_certificates(tls) {
        Some(certificates) => redis::Client::build_with_tls(info, certificates),
        None => redis::Client::open(info),
    }
}

/// Logs a failed connection attempt. One a person must fix (a wrong
/// password or user, a certificate that does not verify, TLS that does not
/// agree) is a warning, at most every 30 s; an unreachable Redis is only
/// debug (the circuit and `sluice_redis_up` say it). Never names the URL,
/// which may hold a password.
pub(super) fn connect_failed(place: &str, error: &redis::RedisError) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_WARNED_S: AtomicU64 = AtomicU64::new(0);
    let text = error.to_string();
    let lower = text.to_ascii_lowercase();
    let fixable = error.kind() == redis::ErrorKind::AuthenticationFailed
        || [
            "wrongpass",
            "noauth",
            "noperm",
            "certificate",
            "tls",
            "handshake",
        ]
        .iter()
        .any(|word| lower.contains(word));
    if !fixable || error.is_connection_refusal() {
        log::debug!("cannot connect to Redis {place}: {text}");
        return;
    }
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_WARNED_S.load(Ordering::Relaxed);
    if now_s >= last + 30
        && LAST_WARNED_S
            .compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        log::warn!("cannot connect to Redis {place}: {text}");
    } else {
        log::debug!("cannot connect to Redis {place}: {text}");
    }
}

/// rustls needs one process-wide crypto provider: ring, installed once
/// (a provider already installed is kept).
pub(super) fn ensure_tls_provider() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// TCP settings for every Redis connection: `TCP_NODELAY`, as every Redis
/// client sets it. redis-rs leaves Nagle's algorithm on by default; with it, a
/// write that follows one not yet acknowledged waits for the peer's delayed
/// ACK (up to 40 ms on Linux): a stall in the decision's budget.
pub(super) fn no_delay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// Server error codes that mean Redis itself cannot serve (not one key's problem).
pub(super) const UNHEALTHY_CODES: &[&str] = &[
    "LOADING",
    "BUSY",
    "OOM",
    "READONLY",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "TRYAGAIN",
    "NOREPLICAS",
];

/// What a Redis error means for sluice, for both backends alike: refused
/// (nothing listening), I/O (the connection broke), a timeout (reported as
/// the `budget` it ran out of), Redis unable to serve (`UNHEALTHY_CODES`, or
/// a cluster redirection the client could not follow), or an error confined
/// to this one call.
/// Runs `cmd` on `conn` within `timeout`, its errors made a
/// [`LimiterError`] by `classify`: one command on one key, for both backends.
pub(super) async fn query_within<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    cmd: &redis::Cmd,
    timeout: Duration,
    classify: impl Fn(redis::RedisError) -> LimiterError,
) -> Result<redis::Value, LimiterError> {
    match tokio::time::timeout(timeout, cmd.query_async(conn)).await {
        Ok(result) => result.map_err(classify),
        Err(_) => Err(LimiterError::Timeout(timeout)),
    }
}

pub(super) fn classify(error: &redis::RedisError, budget: Duration) -> LimiterError {
    // A timeout is an I/O error to redis-rs too: ask about it first.
    if error.is_timeout() {
        LimiterError::Timeout(budget)
    } else if error.is_connection_refusal() {
        LimiterError::Refused(error.to_string())
    } else if error.is_io_error() || error.is_connection_dropped() {
        LimiterError::Io(error.to_string())
    } else if error.is_cluster_error() {
        // MOVED/ASK reaching us means the client could not follow them: the
        // owner of the slot is unreachable or the topology is in flux.
        LimiterError::Unavailable(error.to_string())
    } else {
        server_error(error.code().unwrap_or(""), error.to_string())
    }
}

/// A Redis error reply with `code` (its first word) and `message`.
pub(super) fn server_error(code: &str, message: String) -> LimiterError {
    if UNHEALTHY_CODES.contains(&code) {
        LimiterError::Unavailable(message)
    } else {
        LimiterError::Server(message)
    }
}

/// Reports a call that answered after `elapsed`: the observer hears of it,
/// and the circuit closes if it was probing (logged, naming `node`).
pub(super) fn record_success(
    observer: &dyn RedisObserver,
    circuit: &CircuitBreaker,
    elapsed: Duration,
    node: &str,
) {
    observer.call_succeeded(elapsed);
    observer.set_up(true);
    circuit_success(circuit, node);
}

/// Closes `circuit` if it was probing, and says so.
pub(super) fn circuit_success(circuit: &CircuitBreaker, node: &str) {
    if circuit.on_success() == Transition::Closed {
        log::info!("Redis {node} answers again: circuit closed, decisions come from Redis");
    }
}

/// Reports a call started at `started` that failed with `error`. Returns
/// whether this failure opened the circuit (the caller then drops its
/// connection or refreshes its map). An error confined to one call never
/// counts against the circuit.
pub(super) fn record_failure(
    observer: &dyn RedisObserver,
    circuit: &CircuitBreaker,
    error: &LimiterError,
    started: Instant,
    node: &str,
) -> bool {
    observer.call_failed(error);
    let Some(failure) = error.circuit_failure() else {
        log::warn!("rate-limit decision failed for one key: {error}");
        return false;
    };
    match circuit.on_failure(Instant::now(), started, failure) {
        Transition::Opened(wait) => {
            log::warn!(
                "Redis {node} unhealthy ({error}): circuit open for {wait:?}, on_error applies"
            );
            observer.set_up(false);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::circuit::Failure;

    /// I/O errors as redis-rs reports them, what each must classify as,
    /// and what it must tell the circuit breaker.
    fn io_errors() -> Vec<(redis::RedisError, &'static str, Option<Failure>)> {
        use redis::RedisError;
        use std::io;
        let io_error = |kind: io::ErrorKind| RedisError::from(io::Error::new(kind, "x"));
        vec![
            (
                io_error(io::ErrorKind::ConnectionRefused),
                "refused",
                Some(Failure::Refused),
            ),
            (
                io_error(io::ErrorKind::ConnectionReset),
                "io",
                Some(Failure::Down),
            ),
            (
                io_error(io::ErrorKind::BrokenPipe),
                "io",
                Some(Failure::Down),
            ),
            (
                io_error(io::ErrorKind::TimedOut),
                "timeout",
                Some(Failure::Slow),
            ),
        ]
    }

    /// Error replies as Redis sends them on the wire, what each must
    /// classify as, and what it must tell the circuit breaker.
    fn reply_errors() -> Vec<(redis::RedisError, &'static str, Option<Failure>)> {
        let reply = |text: &str| {
            let wire = format!("-{text}\r\n");
            redis::parse_redis_value(wire.as_bytes())
                .and_then(redis::Value::extract_error)
                .expect_err("an error reply")
        };
        vec![
            (
                reply("LOADING Redis is loading the dataset in memory"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("BUSY Redis is busy running a script"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("OOM command not allowed when used memory > 'maxmemory'"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("READONLY You can't write against a read only replica"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("MASTERDOWN Link with MASTER is down"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("CLUSTERDOWN The cluster is down"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("TRYAGAIN Multiple keys request during rehashing"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("MOVED 3999 127.0.0.1:6381"),
                "unavailable",
                Some(Failure::Down),
            ),
            (
                reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
                "server",
                None,
            ),
            (reply("ERR user_script:1: bad"), "server", None),
            (reply("NOSCRIPT No matching script"), "server", None),
        ]
    }

    /// One table of Redis errors and what they mean, for both backends.
    #[test]
    fn redis_errors_are_classified_once_for_both_backends() {
        let budget = Duration::from_millis(20);
        for (error, expected, failure) in io_errors().into_iter().chain(reply_errors()) {
            let classified = classify(&error, budget);
            let kind = match &classified {
                LimiterError::Refused(_) => "refused",
                LimiterError::Io(_) => "io",
                LimiterError::Timeout(b) => {
                    assert_eq!(*b, budget, "a timeout reports the budget");
                    "timeout"
                }
                LimiterError::Unavailable(_) => "unavailable",
                LimiterError::Server(_) => "server",
                LimiterError::CircuitOpen => "circuit_open",
            };
            assert_eq!(kind, expected, "{error:?}");
            assert_eq!(classified.circuit_failure(), failure, "{error:?}");
        }
    }
}
