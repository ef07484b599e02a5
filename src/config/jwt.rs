//! Validation of `identity.jwt` (docs/configuration.md): algorithms, key material, claim.
//!
//! Key material is read here, when the config loads, so a missing secret or an
//! unreadable key file is a config error rather than a request-time surprise.

use super::checker::Checker;
use super::file::JwtFile;
use super::{IdentityConfig, JwtConfig, JwtKey};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::str::FromStr;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    Hmac,
    Rsa,
    Ec,
}

fn family(algorithm: Algorithm) -> Option<Family> {
    use Algorithm::*;
    match algorithm {
        HS256 | HS384 | HS512 => Some(Family::Hmac),
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => Some(Family::Rsa),
        ES256 | ES384 => Some(Family::Ec),
        _ => None,
    }
}

/// Checks `identity.jwt` and loads its key.
pub(super) fn validate(c: &mut Checker, f: &JwtFile) -> IdentityConfig {
    let header = f
        .header
        .clone()
        .unwrap_or_else(|| "authorization".into())
        .to_ascii_lowercase();
    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        c.problem(
            "identity.jwt.header",
            format!("`{header}` is not a valid header name"),
        );
    }
    let names = f.algorithms.clone().unwrap_or_else(|| vec!["HS256".into()]);
    if names.is_empty() {
        c.problem(
            "identity.jwt.algorithms",
            "`algorithms` needs at least one algorithm",
        );
    }
    let mut algorithms = Vec::new();
    let mut families = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let path = format!("identity.jwt.algorithms[{i}]");
        match Algorithm::from_str(name).ok().and_then(|a| Some((a, family(a)?))) {
            Some((algorithm, fam)) => {
                algorithms.push(algorithm);
                if !families.contains(&fam) {
                    families.push(fam);
                }
            }
            None => c.problem(
                &path,
                format!("unknown or unsupported JWT algorithm `{name}` (use HS256/384/512, RS256/384/512, PS256/384/512, ES256/384; `none` is never accepted)"),
            ),
        }
    }
    if families.len() > 1 {
        c.problem(
            "identity.jwt.algorithms",
            "`algorithms` must all use one kind of key: HS* (secret_env), RS*/PS* (an RSA public_key_file) or ES* (an EC public_key_file)",
        );
    }
    let key = match families.first() {
        Some(Family::Hmac) => hmac_key(c, f),
        Some(fam) => public_key(c, f, *fam),
        None => JwtKey::Secret(Vec::new()),
    };
    let leeway = c.duration("identity.jwt.leeway", f.leeway.as_deref(), Duration::ZERO);
    let claim = f.claim.clone().unwrap_or_else(|| "sub".into());
    if claim.is_empty() {
        c.problem(
            "identity.jwt.claim",
            "`claim` must name a claim, such as sub",
        );
    }
    IdentityConfig::Jwt(JwtConfig {
        header,
        algorithms,
        key,
        claim,
        required: f.required,
        leeway,
    })
}

fn hmac_key(c: &mut Checker, f: &JwtFile) -> JwtKey {
    if f.public_key_file.is_some() {
        c.problem(
            "identity.jwt.public_key_file",
            "HS* algorithms verify with `secret_env`, not a public key",
        );
    }
    let var = f
        .secret_env
        .clone()
        .unwrap_or_else(|| "SLUICE_JWT_SECRET".into());
    let path = if f.secret_env.is_some() {
        "identity.jwt.secret_env"
    } else {
        "identity.jwt"
    };
    match c.env(&var) {
        Some(secret) if !secret.is_empty() => {
            if secret.len() < 32 {
                c.warning(
                    path,
                    format!(
                        "the secret in `{var}` is {} bytes; HS256 wants at least 32",
                        secret.len()
                    ),
                );
            }
            JwtKey::Secret(secret.into_bytes())
        }
        _ => {
            c.problem(
                path,
                format!("environment variable `{var}` (the JWT secret) is not set or empty"),
            );
            JwtKey::Secret(Vec::new())
        }
    }
}

fn public_key(c: &mut Checker, f: &JwtFile, fam: Family) -> JwtKey {
    if f.secret_env.is_some() {
        c.problem(
            "identity.jwt.secret_env",
            "RS*/PS*/ES* algorithms verify with `public_key_file`, not a secret",
        );
    }
    let Some(file) = &f.public_key_file else {
        c.problem(
            "identity.jwt",
            "RS*/PS*/ES* algorithms need `public_key_file` (a PEM public key)",
        );
        return JwtKey::Secret(Vec::new());
    };
    let path = "identity.jwt.public_key_file";
    let pem = match std::fs::read(file) {
        Ok(pem) => pem,
        Err(e) => {
            c.problem(path, format!("cannot read `{file}`: {e}"));
            return JwtKey::Secret(Vec::new());
        }
    };
    let parsed = match fam {
        Family::Rsa => DecodingKey::from_rsa_pem(&pem).map(|_| JwtKey::RsaPem(pem)),
        _ => DecodingKey::from_ec_pem(&pem).map(|_| JwtKey::EcPem(pem)),
    };
    parsed.unwrap_or_else(|e| {
        c.problem(
            path,
            format!(
                "`{file}` is not a PEM {} public key: {e}",
                if fam == Family::Rsa { "RSA" } else { "EC" }
            ),
        );
        JwtKey::Secret(Vec::new())
    })
}
