//! Sentinel: the client that asks the sentinels which server is the
//! primary, and connects to it with the URL's user, password, database and
//! scheme.

use crate::redis::client;
use crate::settings::{RedisTlsConfig, SentinelConfig};
use crate::LimiterError;

/// A sentinel client for `sentinel`'s master, connecting to the primary it
/// names with `info`'s user, password, database and scheme, and over
/// `rediss://` with `tls`'s CA and client certificate; the sentinels over
/// TLS too with `sentinel.tls`. The sentinels' own password is passed as it
/// is written (no URL to escape it for).
pub(super) fn sentinel_client(
    sentinel: &SentinelConfig,
    info: &redis::ConnectionInfo,
    tls: &RedisTlsConfig,
) -> Result<redis::sentinel::SentinelClient, LimiterError> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    client::ensure_tls_provider();
    let invalid = |e: &dyn std::fmt::Display| {
        LimiterError::Server(format!("invalid Redis Sentinel settings: {e}"))
    };
    let nodes = sentinel
        .nodes
        .iter()
        .map(|node| {
            let (host, port) = node
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
                .ok_or_else(|| invalid(&format!("{node} is not host:port")))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            Ok(if sentinel.tls {
                redis::ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                redis::ConnectionAddr::Tcp(host, port)
            })
        })
        .collect::<Result<Vec<_>, LimiterError>>()?;
    let primary = info.redis_settings();
    let certificates = client::tls_certificates(tls);
    let mut builder =
        SentinelClientBuilder::new(nodes, sentinel.master.as_str(), SentinelServerType::Master)
            .map_err(|e| invalid(&e))?
            .set_client_to_sentinel_tcp_settings(client::no_delay())
            .set_client_to_redis_tcp_settings(client::no_delay())
            .set_client_to_redis_db(primary.db())
            .set_client_to_redis_protocol(primary.protocol());
    if let Some(password) = &sentinel.password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if sentinel.tls {
        builder = builder.set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        if let Some(certificates) = certificates.clone() {
            builder = builder.set_client_to_sentinel_certificates(certificates);
        }
    }
    if let Some(username) = primary.username() {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = primary.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if let redis::ConnectionAddr::TcpTls { insecure, .. } = info.addr() {
        builder = builder.set_client_to_redis_tls_mode(if *insecure {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        });
        if let Some(certificates) = certificates {
            builder = builder.set_client_to_redis_certificates(certificates);
        }
    }
    builder.build().map_err(|e| invalid(&e))
}
