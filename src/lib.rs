//! sluice: a reverse-proxy API gateway on Pingora with exact, distributed rate
//! limits kept in Redis. See `DESIGN.md` for the contract and `README.md` for use.
//!
//! Dependencies point one way: [`proxy`] glues [`route`], [`keys`], [`limiter`]
//! and [`metrics`] together; [`limiter`] knows nothing of HTTP; [`config`]
//! knows nothing of Redis or Pingora sessions.

pub mod admin;
pub mod config;
pub mod identity;
pub mod keys;
pub mod limiter;
pub mod metrics;
pub mod proxy;
pub mod route;
pub mod upstream;
