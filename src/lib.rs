//! sluice: a reverse-proxy API gateway on Pingora with exact, distributed rate
//! limits kept in Redis. `docs/architecture.md` describes the design, `README.md` the use.
//!
//! Dependencies point one way: [`state`] builds what requests need from a
//! [`config::Config`] ([`route`], [`keys`], [`identity`], [`limiter`],
//! [`upstream`]); [`policy`] decides what to do with a request (over
//! [`request`], which reads the head, and [`headers`]); [`proxy`] glues that
//! to Pingora, [`context`] and [`metrics`]; [`front_door`] bounds what each
//! client connection may hold; [`reload`] swaps the state on `SIGHUP`.
//! [`limiter`] knows nothing of HTTP, Pingora or metrics (it reports through
//! its own observer trait); [`config`] knows nothing of Redis or Pingora
//! sessions; [`target`] and [`sync`] depend on nothing of sluice's.
//! `tests/layering.rs` fails when one of these rules is broken.

// Every public item says what it guarantees, and nothing outside the
// tests unwraps: a request, a config file or Redis never panics sluice.
#![warn(missing_docs, clippy::unwrap_used, clippy::expect_used)]

pub mod admin;
pub mod config;
pub mod edge;
pub mod limiter;
pub mod observe;
pub mod policy;
pub mod request;
pub mod rls;
pub mod sync;
pub mod target;
pub mod upstream;
