//! The keys a request was denied under, kept for `/v1/top` and the
//! console with their parts as the request carried them — so an operator
//! sees the flooding header value, not only its hash — except credentials,
//! which are shown only as a hash prefix: the parts the limit marks as
//! reading one (the `Authorization` and `Proxy-Authorization` headers, the
//! JWT's header, the API key's header or query parameter, every cookie and
//! every header the auth service is sent), the same parts its counter key
//! hashes.

use super::checks::{counter_name, with_request_parts, Keyed};
use super::RequestView;
use crate::config::{KeyPart, LimitConfig};
use crate::observe::top_keys::{parts_of, Shown, ShownPart};
use crate::policy::state::{CompiledRoute, GatewayState};
use crate::request::parts::{part_value, PartValue, RequestParts};
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use std::time::Instant;

/// A value longer than this (in bytes) is shown by its beginning.
const MAX_SHOWN: usize = 256;

/// Hex digits of a credential's SHA-256 shown in its place.
const HASH_PREFIX: usize = 12;

/// Records, in each limit's top keys, the keys `denied` (indices into
/// `keys`) of a request seen through `view`.
pub(super) fn record_denied(
    state: &GatewayState,
    route: &CompiledRoute,
    view: &RequestView<'_>,
    (client, user): (IpAddr, Option<&[u8]>),
    keys: &[Keyed],
    denied: &[usize],
) {
    let now = Instant::now();
    for keyed in denied.iter().filter_map(|&i| keys.get(i)) {
        let Some(limit) = route.limits.get(keyed.index) else {
            continue;
        };
        let parts = parts_of(&keyed.key, counter_name(route, &limit.config));
        limit.denied.record_with(parts, now, || {
            with_request_parts(state, route, view, client, user, |request| {
                shown_parts(&limit.config, request)
            })
        });
    }
}

/// How each part of `limit`'s key in `request` is shown.
fn shown_parts(limit: &LimitConfig, request: &RequestParts<'_>) -> Shown {
    let credential = |i: usize| limit.credential_parts.get(i) == Some(&true);
    limit
        .key
        .iter()
        .enumerate()
        .map(|(i, part)| match part_value(part, request) {
            PartValue::One(value) if credential(i) => hidden(&value),
            // An IPv6 client is keyed by its prefix, which the usage API
            // does not take as an address.
            PartValue::One(value) if *part == KeyPart::Ip => ShownPart {
                exact: std::str::from_utf8(&value).is_ok_and(|t| t.parse::<IpAddr>().is_ok()),
                ..shown(&value)
            },
            PartValue::One(value) => shown(&value),
            // Counted under the client's address (`on_missing: ip`).
            PartValue::Missing | PartValue::Ambiguous => ShownPart {
                text: format!("(missing: ip {})", request.ip),
                exact: false,
            },
        })
        .collect()
}

/// A value shown as it is when it is text and short enough.
fn shown(value: &[u8]) -> ShownPart {
    match std::str::from_utf8(value) {
        Ok(text) if text.len() <= MAX_SHOWN => ShownPart {
            text: text.to_string(),
            exact: true,
        },
        _ => {
            let lossy = String::from_utf8_lossy(value);
            let cut = (0..=MAX_SHOWN.min(lossy.len()))
                .rev()
                .find(|&i| lossy.is_char_boundary(i))
                .unwrap_or(0);
            ShownPart {
                text: format!("{}…", &lossy[..cut]),
                exact: false,
            }
        }
    }
}

/// A credential shown as `sha256:` and the first hex digits of its hash.
fn hidden(value: &[u8]) -> ShownPart {
    let digest = Sha256::digest(value);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    ShownPart {
        text: format!("sha256:{}", &hex[..HASH_PREFIX]),
        exact: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_shown_whole_when_short_text_and_cut_otherwise() {
        let payload = "<img src=x onerror=alert(1)>";
        assert_eq!(
            shown(payload.as_bytes()),
            ShownPart {
                text: payload.into(),
                exact: true
            }
        );
        let long = "é".repeat(200);
        let part = shown(long.as_bytes());
        assert!(!part.exact);
        assert!(part.text.ends_with('…') && part.text.len() <= MAX_SHOWN + 3);
        assert_eq!(shown(b"\xff\xfe").text, "\u{fffd}\u{fffd}…");
    }

    #[test]
    fn a_credential_is_shown_as_a_hash_prefix() {
        let part = hidden(b"sk_live_secret");
        assert!(part.text.starts_with("sha256:") && part.text.len() == 7 + HASH_PREFIX);
        assert!(!part.text.contains("secret") && !part.exact);
    }
}
