//! The file schema of a limit's usage keys: `reserve` (units taken before
//! the request is proxied) and `cost_from` (what the response says it
//! cost), with their JSON pointers.
//!
//! Its fields are the YAML keys themselves, documented where operators read
//! them (docs/configuration.md).
#![allow(missing_docs)]

use serde::Deserialize;

/// One JSON pointer, or a list of them (`/max_tokens` or
/// `[/max_completion_tokens, /max_tokens]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointersFile(pub Vec<String>);

impl<'de> Deserialize<'de> for PointersFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::value::SeqAccessDeserializer;
        struct Pointers;
        impl<'de> serde::de::Visitor<'de> for Pointers {
            type Value = PointersFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON pointer (such as /usage/total_tokens), or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PointersFile, E> {
                Ok(PointersFile(vec![v.to_string()]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<PointersFile, A::Error> {
                Vec::<String>::deserialize(SeqAccessDeserializer::new(seq)).map(PointersFile)
            }
        }
        d.deserialize_any(Pointers)
    }
}

/// `limits[].reserve`: a constant, or read from the request's JSON body.
#[derive(Debug)]
pub enum ReserveFile {
    /// `reserve: 500`.
    Units(u64),
    /// `reserve: {request_json: …, default: …, max: …, plus: …, required: …}`.
    Read(ReserveReadFile),
}

/// `limits[].reserve` as a map.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveReadFile {
    pub request_json: Option<PointersFile>,
    pub default: Option<u64>,
    pub max: Option<u64>,
    pub plus: Option<u64>,
    #[serde(default)]
    pub required: bool,
}

impl<'de> Deserialize<'de> for ReserveFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::value::MapAccessDeserializer;
        struct Reserve;
        impl<'de> serde::de::Visitor<'de> for Reserve {
            type Value = ReserveFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a number of units, or {request_json: POINTER, default: N, max: N, plus: N, required: BOOL}",
                )
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ReserveFile, E> {
                Ok(ReserveFile::Units(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ReserveFile, A::Error> {
                ReserveReadFile::deserialize(MapAccessDeserializer::new(map)).map(ReserveFile::Read)
            }
        }
        d.deserialize_any(Reserve)
    }
}

/// `limits[].cost_from`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostFromFile {
    pub response_header: Option<String>,
    pub response_json: Option<PointersFile>,
}
