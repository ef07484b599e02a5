//! The file schema of `identity:`: the methods and each one's settings.
//!
//! Its fields are the YAML keys themselves, documented where operators read
//! them (docs/configuration.md).
#![allow(missing_docs)]

use serde::Deserialize;

/// `identity:`: one method, or a list of one-method maps tried in order.
#[derive(Debug)]
pub enum IdentityMethods {
    /// `identity: {jwt: …}` (or `header`, `api_key`).
    One(Box<IdentityFile>),
    /// `identity: [{jwt: …}, {api_key: …}]`.
    Several(Vec<IdentityFile>),
}

impl<'de> Deserialize<'de> for IdentityMethods {
    /// A map is one method, a sequence a list of them; each is read as an
    /// [`IdentityFile`], so its errors (an unknown key) keep their words and
    /// positions.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
        struct Methods;
        impl<'de> serde::de::Visitor<'de> for Methods {
            type Value = IdentityMethods;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "an identity method (header, jwt, api_key or client_cert), or a list of them",
                )
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                IdentityFile::deserialize(MapAccessDeserializer::new(map))
                    .map(|one| IdentityMethods::One(Box::new(one)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Vec::<IdentityFile>::deserialize(SeqAccessDeserializer::new(seq))
                    .map(IdentityMethods::Several)
            }
        }
        d.deserialize_any(Methods)
    }
}

/// One identity method (one of `jwt`, `header` or `api_key`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityFile {
    pub jwt: Option<JwtFile>,
    pub header: Option<String>,
    pub api_key: Option<ApiKeyFile>,
    pub client_cert: Option<ClientCertIdentityFile>,
    pub auth_request: Option<AuthRequestFile>,
}

/// `identity.auth_request:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthRequestFile {
    pub url: Option<String>,
    pub timeout: Option<String>,
    /// The request headers sent along (the credential).
    #[serde(default)]
    pub headers: Vec<String>,
    pub user_header: Option<String>,
    pub plan_header: Option<String>,
    pub cache_ttl: Option<String>,
    #[serde(default)]
    pub required: bool,
}

/// `identity.client_cert:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCertIdentityFile {
    /// What of the certificate becomes the user (default `fingerprint`).
    pub from: Option<CertField>,
    #[serde(default)]
    pub required: bool,
}

/// What of a verified client certificate becomes the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertField {
    /// The first URI subject alternative name.
    SanUri,
    /// The first DNS subject alternative name.
    SanDns,
    /// The subject's common name.
    SubjectCn,
    /// The SHA-256 of the certificate, hex.
    Fingerprint,
}

/// `identity.api_key:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyFile {
    pub header: Option<String>,
    pub query: Option<String>,
    pub store: Option<String>,
    pub file: Option<String>,
    pub cache_ttl: Option<String>,
    #[serde(default)]
    pub required: bool,
    pub failures: Option<FailuresFile>,
}

/// `identity.api_key.failures:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailuresFile {
    pub limit: Option<u64>,
    pub window: Option<String>,
}

/// The consumers file of `identity.api_key.file`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumersFile {
    #[serde(default)]
    pub consumers: Vec<ConsumerFile>,
}

/// One consumer of the consumers file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerFile {
    pub id: String,
    pub plan: Option<String>,
    #[serde(default)]
    pub keys: Vec<String>,
}

/// `identity.jwt:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    pub header: Option<String>,
    pub algorithms: Option<Vec<String>>,
    pub secret_env: Option<String>,
    pub public_key_file: Option<String>,
    /// The provider's JWKS URL.
    pub jwks_url: Option<String>,
    /// A JWKS document on disk.
    pub jwks_file: Option<String>,
    pub jwks_refresh: Option<String>,
    pub jwks_min_refresh: Option<String>,
    pub claim: Option<String>,
    /// The `iss` a token must carry.
    pub issuer: Option<String>,
    /// A token's `aud` must contain one of these.
    pub audiences: Option<Vec<String>>,
    #[serde(default)]
    pub required: bool,
    pub leeway: Option<String>,
}
