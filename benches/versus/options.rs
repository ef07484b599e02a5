//! Command-line options (after `cargo bench --bench versus --`).

use clap::Parser;
use std::path::PathBuf;

/// The side-by-side load benchmark; see benches/versus/main.rs.
#[derive(Parser, Debug)]
#[command(name = "versus")]
pub struct Options {
    /// Interleaved rounds of every case.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds each case runs per round.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Keep-alive connections of the load client.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Scenarios to run, comma-separated (all by default).
    #[arg(long, value_delimiter = ',', default_values_t = SCENARIOS.map(String::from), value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS))]
    pub scenarios: Vec<String>,
    /// Parts to run, comma-separated: `limits` (the limiters side by side
    /// on plain HTTP/1.1), `edge` (TLS and HTTP/2 against nginx), `rls`
    /// (the rate-limit service against the gateway's own decision), `redis`
    /// (decisions per Redis core, against other limiters' commands) and
    /// `tracing` (what tracing costs a request, in instructions, under
    /// Callgrind; not run unless named), `overhead` (sluice's own cost in
    /// instructions; not run unless named) and `console` (an open operator
    /// console's polling against none; not run unless named).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_PARTS.map(String::from), value_parser = clap::builder::PossibleValuesParser::new(PARTS))]
    pub parts: Vec<String>,
    /// Only the Redis-capacity cases (`--parts redis`) whose name contains
    /// this text, the seed's script and the `INCR` floor (for the ratios):
    /// to profile one case.
    #[arg(long, value_name = "TEXT")]
    pub only: Option<String>,
    /// Pinned topology: each server under test on core 0, and Redis, the
    /// upstream and the load client on core 1 (`taskset`), so that a
    /// server's CPU per request is its own work, not contention for a core.
    #[arg(long)]
    pub pin: bool,
    /// Where the tables are written.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/results.md"))]
    pub out: PathBuf,
    /// Also replace the tables in docs/benchmarks.md (between its markers).
    #[arg(long)]
    pub update_readme: bool,
    /// An earlier sluice binary to run side by side with this build (no
    /// limit and sliding_log), for a before/after table in the same run.
    #[arg(long, value_name = "BINARY")]
    pub before: Option<PathBuf>,
    /// Serve as the benchmark's upstream on ADDR (the run starts this binary
    /// again in this mode).
    #[arg(long, value_name = "ADDR", hide = true)]
    pub upstream: Option<String>,
    /// Serve as the bare Pingora proxy: `LISTEN,UPSTREAM,THREADS,WORK_STEALING`,
    /// and `,429` to answer every request with 429 instead (the run starts
    /// this binary again in this mode).
    #[arg(long, value_name = "SPEC", hide = true)]
    pub bare: Option<String>,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    pub bench: bool,
}

/// The traffic scenarios (`benches/versus/wrk.lua`): every case runs each.
pub const SCENARIOS: [&str; 3] = ["allowed", "flood", "mix"];

/// The parts of the benchmark `--parts` chooses from.
pub const PARTS: [&str; 8] = [
    "limits", "edge", "rls", "redis", "tracing", "overhead", "console", "llm",
];

/// The parts run when `--parts` is not given (all but `tracing` and
/// `overhead`, which need valgrind and run the gateway fifty times slower,
/// and `console` and `llm`, questions asked once).
const DEFAULT_PARTS: [&str; 4] = ["limits", "edge", "rls", "redis"];

impl Options {
    /// Whether `--parts` names `part`.
    pub fn runs(&self, part: &str) -> bool {
        self.parts.iter().any(|p| p == part)
    }

    /// The document `--update-readme` rewrites.
    pub fn benchmark_document() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks.md")
    }
}
