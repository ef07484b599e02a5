//! sluice: a reverse-proxy API gateway on Pingora with exact, distributed rate
//! limits kept in Redis. `docs/architecture.md` describes the design, `README.md` the use.
//!
//! Each folder is a layer, and a layer imports only the layers below it:
//! [`admin`] (the admin listener, its APIs, reloads) and [`rls`] (the
//! rate-limit service) over [`edge`] (everything that touches a Pingora
//! session) over [`policy`] (the running state and what is decided about a
//! request, touching no response) over [`observe`] (metrics, logs, traces),
//! [`upstream`] (pools and health), [`request`] (what is read off a request)
//! and [`config`] (YAML into a validated `Config`), with [`target`] (the
//! canonical request target) at the bottom. The decision itself is the
//! [`limiter`] crate, which knows nothing of HTTP. `tests/layering.rs` fails,
//! naming the line, when an import runs up this order.
//!
//! Lints (`Cargo.toml`'s `[lints]`): every public item is documented, and
//! nothing outside the tests unwraps, so a request, a config file or Redis
//! never panics sluice.

/// The rate-limit decision (the `sluice-limiter` crate): algorithms, Redis,
/// the in-process twin and the failure policy, knowing nothing of HTTP.
pub use sluice_limiter as limiter;
/// Locks that ignore poisoning (from the limiter crate, which needs them too).
pub use sluice_limiter::sync;

pub mod admin;
pub mod config;
pub mod edge;
pub mod observe;
pub mod policy;
pub mod request;
pub mod rls;
pub mod target;
pub mod upstream;
