//! Whether a limit counts a request at all (`exempt:` at the top level, on a
//! route, on a limit). An exempt request consumes nothing on the limits it
//! is exempt from and is counted as `decision="exempt"`.
//!
//! Only what the gateway can believe exempts: the client IP as `client_ip`
//! resolves it, a header only from a trusted proxy (a client could send any
//! header, and one sent twice is never believed), a claim only from a token
//! whose signature verified.

use crate::config::ExemptConfig;
use crate::policy::identity::Claims;
use crate::request::HeaderValues;
use serde_json::Value;
use std::net::IpAddr;

/// What an exemption is matched against.
pub struct Subject<'a> {
    /// The client IP (after `client_ip.trusted_proxies`).
    pub client: IpAddr,
    /// Whether the socket peer is a trusted proxy (headers are believed).
    pub trusted_peer: bool,
    /// A request header's values, by lower-case name.
    pub header: &'a dyn Fn(&str) -> HeaderValues<'a>,
    /// The verified token's claims, if a token verified.
    pub claims: Option<&'a Claims>,
}

/// Whether `exempt` matches `subject`: any one of its criteria does.
pub fn exempts(exempt: &ExemptConfig, subject: &Subject<'_>) -> bool {
    if exempt.is_empty() {
        return false;
    }
    let by_network = exempt.cidrs.iter().any(|net| net.contains(&subject.client));
    let by_header = subject.trusted_peer
        && exempt.headers.iter().any(|(name, values)| {
            matches!((subject.header)(name),
                HeaderValues::One(got) if values.iter().any(|v| v.as_bytes() == got))
        });
    let by_claim = subject.claims.is_some_and(|claims| {
        exempt.claims.iter().any(|(name, values)| {
            claims
                .get(name)
                .is_some_and(|claim| claim_matches(claim, values))
        })
    });
    by_network || by_header || by_claim
}

/// A claim equals one of `values` as text (numbers and booleans as JSON
/// writes them), or, for an array, one of its elements does.
fn claim_matches(claim: &Value, values: &[String]) -> bool {
    match claim {
        Value::String(s) => values.iter().any(|v| v == s),
        Value::Number(n) => {
            let text = n.to_string();
            values.contains(&text)
        }
        Value::Bool(b) => values
            .iter()
            .any(|v| v == if *b { "true" } else { "false" }),
        Value::Array(items) => items
            .iter()
            .any(|item| !item.is_array() && claim_matches(item, values)),
        Value::Null | Value::Object(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ExemptConfig {
        ExemptConfig {
            cidrs: vec![
                "10.0.0.0/8".parse().unwrap(),
                "2001:db8::/32".parse().unwrap(),
            ],
            headers: vec![("x-internal".into(), vec!["yes".into()])],
            claims: vec![
                ("role".into(), vec!["admin".into()]),
                ("tier".into(), vec!["3".into()]),
            ],
        }
    }

    fn check(client: &str, trusted: bool, header: Option<&'static [u8]>, claims: Value) -> bool {
        let lookup = move |name: &str| match (name, header) {
            ("x-internal", Some(v)) => HeaderValues::One(v),
            _ => HeaderValues::Absent,
        };
        let claims = claims.as_object().cloned();
        let subject = Subject {
            client: client.parse().unwrap(),
            trusted_peer: trusted,
            header: &lookup,
            claims: claims.as_ref(),
        };
        exempts(&config(), &subject)
    }

    #[test]
    fn networks_headers_and_claims_each_exempt() {
        let none = Value::Null;
        assert!(check("10.1.2.3", false, None, none.clone()));
        assert!(check("2001:db8::7", false, None, none.clone()));
        assert!(!check("11.0.0.1", false, None, none.clone()));
        // A header only from a trusted proxy, and only its exact value.
        assert!(check("1.2.3.4", true, Some(b"yes"), none.clone()));
        assert!(!check("1.2.3.4", false, Some(b"yes"), none.clone()));
        assert!(!check("1.2.3.4", true, Some(b"YES"), none.clone()));
        // Claims: strings, numbers, arrays.
        let claims = |v: Value| check("1.2.3.4", false, None, v);
        assert!(claims(serde_json::json!({"role": "admin"})));
        assert!(claims(serde_json::json!({"role": ["user", "admin"]})));
        assert!(claims(serde_json::json!({"tier": 3})));
        assert!(!claims(serde_json::json!({"role": "administrator"})));
        assert!(!claims(serde_json::json!({"role": [["admin"]]})));
        assert!(!claims(serde_json::json!({"role": {"admin": true}})));
        assert!(!claims(serde_json::json!({})));
    }

    #[test]
    fn an_empty_exemption_exempts_nothing() {
        let lookup = |_: &str| HeaderValues::Absent;
        let subject = Subject {
            client: "10.0.0.1".parse().unwrap(),
            trusted_peer: true,
            header: &lookup,
            claims: None,
        };
        assert!(!exempts(&ExemptConfig::default(), &subject));
    }
}
