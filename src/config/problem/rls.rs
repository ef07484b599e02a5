//! Why a rate-limit service rules file is refused, beyond YAML and unknown
//! keys (one of the problems a `ProblemKind` carries).

/// Why a rules file is refused (beyond YAML and unknown keys).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RlsProblem {
    /// An empty `domain`.
    #[error("`domain` must not be empty")]
    EmptyDomain,
    /// A domain in two files.
    #[error("domain `{domain}` is also defined in {other}")]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// The file that defined it first.
        other: String,
    },
    /// An empty `key`.
    #[error("a descriptor needs a non-empty `key`")]
    EmptyKey,
    /// Two entries with one key and value under one parent.
    #[error("duplicate descriptor `{0}` at this level")]
    DuplicateEntry(String),
    /// `unit` with `unlimited: true`.
    #[error("an `unlimited` rate limit takes no `unit` or `requests_per_unit`")]
    UnlimitedWithUnit,
    /// A unit that is none of the protocol's.
    #[error("invalid rate limit unit `{0}` (second, minute, hour, day, week, month or year)")]
    BadUnit(String),
    /// A limited `rate_limit` without its number.
    #[error("`rate_limit` needs `unit` and `requests_per_unit` (0 refuses every request), or `unlimited: true`")]
    Incomplete,
    /// A `replaces` entry without a name, or with the limit's own.
    #[error("`replaces` needs the `name` of another rate limit")]
    BadReplaces,
    /// `share_threshold` on an entry whose value is no wildcard.
    #[error("`share_threshold` applies to a wildcard `value` (ending in `*`) only")]
    ShareWithoutWildcard,
    /// sluice's own keys on an entry with no limit to count.
    #[error("`{0}` needs a `rate_limit` with a unit on this descriptor")]
    NothingToCount(&'static str),
    /// An algorithm the RLS cannot serve.
    #[error("`concurrency` needs to know when a request ends, which the rate-limit service is never told; use sliding_log, sliding_window, fixed_window or token_bucket")]
    Concurrency,
    /// A sliding log too large to keep.
    #[error("{limit} per {unit} is too many to log one by one (at most {max}); write `algorithm: sliding_window` on this descriptor (or as `server.rls.algorithm`)")]
    LogTooLong {
        /// The number.
        limit: u32,
        /// The unit.
        unit: &'static str,
        /// The most a log may hold.
        max: u64,
    },
    /// A wrong parameter for the algorithm.
    #[error("`{key}` applies to `algorithm: {algorithm}` only")]
    WrongParameter {
        /// The key.
        key: &'static str,
        /// The algorithm it belongs to.
        algorithm: &'static str,
    },
}
