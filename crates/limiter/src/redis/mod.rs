//! The Redis backends: a standalone Redis or one named by Sentinel
//! ([`standalone`]) and a Redis Cluster ([`cluster`]), both deciding through
//! the same script and codec ([`wire`]) and reaching Redis the same way
//! (the client, its error table and deadlines: `client.rs`);
//! the circuit breaker each Redis (or each cluster primary) has
//! ([`circuit`]); a batch's deadline on Redis's clock ([`deadline`]);
//! what a decision Redis ran or skipped after its budget leaves
//! ([`reconcile`]); the connection made once in the background; and the
//! size of the batch a decision went in, for its trace ([`batch_size`]).

pub mod batch_size;
pub mod circuit;
mod client;
pub mod cluster;
pub mod deadline;
mod lazy;
pub mod reconcile;
pub mod slots;
pub mod standalone;
pub mod wire;

pub use standalone::RedisLimiter;
