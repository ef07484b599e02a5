//! The rate-limit service (`server.rls`): Envoy's gRPC
//! `envoy.service.ratelimit.v3.RateLimitService`, answered from
//! envoyproxy/ratelimit's own configuration files with sluice's limiter —
//! exact sliding windows on Redis, one all-or-nothing decision per request.
//!
//! - `proto`: the protocol, compiled from the vendored protos;
//! - `matching`: which limit a descriptor falls under, and its counter;
//! - `decide`: one request's decision and answer;
//! - `server`: the listener (h2c or TLS) and the gRPC service.

pub mod decide;
pub mod matching;
pub mod proto;
pub mod server;
