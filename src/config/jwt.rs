//! Validation of `identity.jwt` (docs/configuration.md): algorithms, key
//! material, claim, issuer and audiences.
//!
//! Key material is read here, when the config loads, so a missing secret or an
//! unreadable key file is a config error rather than a request-time surprise.

use super::checker::Checker;
use super::defaults::jwt as defaults;
use super::file::JwtFile;
use super::problem::{KeyPath, ProblemKind};
use super::{IdentityConfig, JwksSource, JwtConfig, JwtKey};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::str::FromStr;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    Hmac,
    Rsa,
    Ec,
    Ed,
}

fn family(algorithm: Algorithm) -> Option<Family> {
    use Algorithm::*;
    match algorithm {
        HS256 | HS384 | HS512 => Some(Family::Hmac),
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => Some(Family::Rsa),
        ES256 | ES384 => Some(Family::Ec),
        EdDSA => Some(Family::Ed),
    }
}

/// `<base>.<key>` (`base`: where this `jwt` method is, `identity.jwt` or
/// `identity[i].jwt`).
fn at(base: &KeyPath, key: &str) -> KeyPath {
    base.key(key)
}

/// The most clock skew `leeway` may forgive: more is no leeway but an
/// expiry switched off (and past `i64` seconds it would wrap).
const MAX_LEEWAY: std::time::Duration = std::time::Duration::from_secs(3600);

/// The least time between JWKS fetches: less would poll the provider in
/// a tight loop.
const MIN_JWKS_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// Checks `identity.jwt` and loads its key.
pub(super) fn validate(c: &mut Checker, base: &KeyPath, f: &JwtFile) -> IdentityConfig {
    let header = f
        .header
        .as_deref()
        .unwrap_or(defaults::HEADER)
        .to_ascii_lowercase();
    c.header_name(&at(base, "header"), &header);
    let jwks = f.jwks_url.is_some() || f.jwks_file.is_some();
    let (algorithms, families) = algorithms(c, base, f, jwks);
    let key = match families.first() {
        _ if jwks => jwks_source(c, base, f, &algorithms, &families),
        Some(Family::Hmac) => hmac_key(c, base, f),
        Some(fam) => public_key(c, base, f, *fam),
        None => JwtKey::Secret(Vec::new()),
    };
    let leeway = c.duration(&at(base, "leeway"), f.leeway.as_deref(), defaults::LEEWAY);
    if leeway > MAX_LEEWAY {
        let kind = ProblemKind::AtMost {
            key: "leeway",
            max: "1h",
        };
        c.problem(&at(base, "leeway"), kind);
    }
    let claim = f.claim.as_deref().unwrap_or(defaults::CLAIM).to_string();
    if claim.is_empty() {
        c.problem(&at(base, "claim"), ProblemKind::EmptyClaim);
    }
    let (issuer, audiences) = issuer_and_audiences(c, base, f);
    if jwks && audiences.is_empty() {
        c.warning(&base.clone(), ProblemKind::NoAudiences);
    }
    IdentityConfig::Jwt(JwtConfig {
        header,
        algorithms,
        key,
        claim,
        issuer,
        audiences,
        required: f.required,
        leeway,
    })
}

/// `issuer` and `audiences`: present means not empty.
fn issuer_and_audiences(
    c: &mut Checker,
    base: &KeyPath,
    f: &JwtFile,
) -> (Option<String>, Vec<String>) {
    if f.issuer.as_deref() == Some("") {
        c.problem(&at(base, "issuer"), ProblemKind::Empty("issuer".into()));
    }
    let audiences = f.audiences.clone().unwrap_or_default();
    if f.audiences.as_ref().is_some_and(Vec::is_empty) {
        let (key, item) = ("audiences", "audience");
        c.problem(&at(base, "audiences"), ProblemKind::NeedsOne { key, item });
    }
    for (i, audience) in audiences.iter().enumerate() {
        if audience.is_empty() {
            let path = at(base, "audiences").index(i);
            c.problem(&path, ProblemKind::Empty("audiences".into()));
        }
    }
    (f.issuer.clone(), audiences)
}

/// The algorithms, and the kinds of key they need (one, when valid; a JWKS
/// may hold several kinds, never HMAC).
fn algorithms(
    c: &mut Checker,
    base: &KeyPath,
    f: &JwtFile,
    jwks: bool,
) -> (Vec<Algorithm>, Vec<Family>) {
    let default = if jwks {
        defaults::JWKS_ALGORITHM
    } else {
        defaults::ALGORITHM
    };
    let names = f.algorithms.clone().unwrap_or_else(|| vec![default.into()]);
    if names.is_empty() {
        let (key, item) = ("algorithms", "algorithm");
        c.problem(&at(base, "algorithms"), ProblemKind::NeedsOne { key, item });
    }
    let mut algorithms = Vec::new();
    let mut families = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match Algorithm::from_str(name)
            .ok()
            .and_then(|a| Some((a, family(a)?)))
        {
            Some((algorithm, fam)) => {
                algorithms.push(algorithm);
                if !families.contains(&fam) {
                    families.push(fam);
                }
            }
            None => {
                let kind = ProblemKind::UnknownJwtAlgorithm(name.clone());
                c.problem(&at(base, "algorithms").index(i), kind);
            }
        }
    }
    if jwks && families.contains(&Family::Hmac) {
        c.problem(&at(base, "algorithms"), ProblemKind::HmacWithJwks);
    } else if families.len() > 1 && !jwks {
        c.problem(&at(base, "algorithms"), ProblemKind::MixedJwtKeys);
    }
    (algorithms, families)
}

/// `jwks_url` and/or `jwks_file`, with their refresh periods; the file is
/// read and parsed now.
fn jwks_source(
    c: &mut Checker,
    base: &KeyPath,
    f: &JwtFile,
    algorithms: &[Algorithm],
    families: &[Family],
) -> JwtKey {
    for (given, key) in [
        (f.secret_env.is_some(), "secret_env"),
        (f.public_key_file.is_some(), "public_key_file"),
    ] {
        if given {
            c.problem(&at(base, key), ProblemKind::JwksWithOtherKey(key));
        }
    }
    if let Some(url) = &f.jwks_url {
        if !jwks_url_is_safe(url) {
            c.problem(&at(base, "jwks_url"), ProblemKind::JwksUrl(url.clone()));
        }
    }
    let file = f.jwks_file.as_ref().and_then(|file| {
        let path = at(base, "jwks_file");
        let document = c.read_file(&path, file)?;
        if families.contains(&Family::Hmac) {
            return Some(document);
        }
        let parsed = super::jwks::KeySet::parse(&document, algorithms).and_then(|set| {
            match set.ambiguous().first() {
                Some(kid) => Err(super::jwks::JwksError::SharedKid(kid.clone())),
                None => Ok(set),
            }
        });
        match parsed {
            Ok(_) => Some(document),
            Err(e) => {
                let kind = ProblemKind::BadJwks {
                    file: file.clone(),
                    error: e.to_string(),
                };
                c.problem(&path, kind);
                None
            }
        }
    });
    let refresh = c.duration(
        &at(base, "jwks_refresh"),
        f.jwks_refresh.as_deref(),
        defaults::JWKS_REFRESH,
    );
    let min_refresh = c.duration(
        &at(base, "jwks_min_refresh"),
        f.jwks_min_refresh.as_deref(),
        defaults::JWKS_MIN_REFRESH,
    );
    for (key, value) in [("jwks_refresh", refresh), ("jwks_min_refresh", min_refresh)] {
        if value < MIN_JWKS_REFRESH {
            c.problem(&at(base, key), ProblemKind::AtLeast { key, min: "1s" });
        }
    }
    JwtKey::Jwks(JwksSource {
        url: f.jwks_url.clone(),
        file,
        refresh,
        min_refresh,
    })
}

/// An https URL, or http to a loopback address (a provider's keys fetched in
/// the clear could be replaced on the way).
fn jwks_url_is_safe(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    match (uri.scheme_str(), uri.host()) {
        (Some("https"), Some(_)) => true,
        (Some("http"), Some(host)) => {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}

fn hmac_key(c: &mut Checker, base: &KeyPath, f: &JwtFile) -> JwtKey {
    if f.public_key_file.is_some() {
        c.problem(&at(base, "public_key_file"), ProblemKind::HmacWithPublicKey);
    }
    let var = f
        .secret_env
        .clone()
        .unwrap_or_else(|| defaults::SECRET_ENV.into());
    let path = if f.secret_env.is_some() {
        at(base, "secret_env")
    } else {
        base.clone()
    };
    match c.env(&var) {
        Some(secret) if !secret.is_empty() => {
            if secret.len() < 32 {
                let bytes = secret.len();
                c.warning(&path, ProblemKind::ShortSecret { var, bytes });
            }
            JwtKey::Secret(secret.into_bytes())
        }
        _ => {
            c.secret_unset(&path, ProblemKind::SecretUnset(var));
            JwtKey::Secret(Vec::new())
        }
    }
}

fn public_key(c: &mut Checker, base: &KeyPath, f: &JwtFile, fam: Family) -> JwtKey {
    if f.secret_env.is_some() {
        c.problem(&at(base, "secret_env"), ProblemKind::PublicKeyWithSecret);
    }
    let Some(file) = &f.public_key_file else {
        c.problem(&base.clone(), ProblemKind::NeedsPublicKey);
        return JwtKey::Secret(Vec::new());
    };
    let path = at(base, "public_key_file");
    let Some(pem) = c.read_file(&path, file) else {
        return JwtKey::Secret(Vec::new());
    };
    let parsed = match fam {
        Family::Rsa => DecodingKey::from_rsa_pem(&pem).map(|_| JwtKey::RsaPem(pem)),
        Family::Ed => DecodingKey::from_ed_pem(&pem).map(|_| JwtKey::EdPem(pem)),
        _ => DecodingKey::from_ec_pem(&pem).map(|_| JwtKey::EcPem(pem)),
    };
    parsed.unwrap_or_else(|e| {
        let kind = ProblemKind::NotPublicKey {
            file: file.clone(),
            family: match fam {
                Family::Rsa => "RSA",
                Family::Ed => "Ed25519",
                _ => "EC",
            },
            error: e.to_string(),
        };
        c.problem(&path, kind);
        JwtKey::Secret(Vec::new())
    })
}
