//! `server.rls`: the gRPC rate-limit service for Envoy, and its rules —
//! envoyproxy/ratelimit's configuration files, read as they are.
//!
//! A rules file holds one `domain` and a tree of `descriptors`: each entry
//! has a `key`, an optional `value` (absent: any value, each counted apart;
//! ending in `*`: any value with that prefix), an optional `rate_limit`
//! (`unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`), nested
//! `descriptors`, and the flags `shadow_mode`, `detailed_metric`,
//! `value_to_metric` and `share_threshold`. sluice adds `algorithm`,
//! `burst` and `buckets` on an entry with a rate limit. Every problem is
//! reported against its own file, `file:line:column`.

use super::checker::Checker;
use super::defaults::limit as defaults;
use super::file::AlgorithmFile;
use super::position::PositionIndex;
use super::problem::{KeyPath, ProblemKind, RlsProblem};
use super::tls::TlsListenerConfig;
use super::{format_duration, Algorithm, ConfigError, Problem};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `server.rls`.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsConfig {
    /// `IP:PORT` of the gRPC listener.
    pub listen: String,
    /// The rules: a directory of files, or one file, as written.
    pub config_path: String,
    /// The algorithm of every rate limit that names none.
    pub algorithm: Algorithm,
    /// Which headers answers ask Envoy to add to its response.
    pub response_headers: RlsHeaders,
    /// TLS on the listener (its certificates); `None`: h2c.
    pub tls: Option<TlsListenerConfig>,
    /// The rules, read when the configuration loads (and on every reload).
    pub rules: Arc<RlsRules>,
}

/// `server.rls.response_headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlsHeaders {
    /// None.
    None,
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of
    /// the descriptor closest to its limit.
    Draft,
}

/// A rate limit's unit: its window, and its number in Envoy's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days (envoyproxy/ratelimit's month).
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Its name in a rules file (any case is accepted there).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The window it counts over.
    pub fn window(self) -> Duration {
        let day = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => day,
            Unit::Week => 7 * day,
            Unit::Month => 30 * day,
            Unit::Year => 365 * day,
        })
    }

    /// Its value in `RateLimitResponse.RateLimit.Unit`.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of a protocol value; `None` for `UNKNOWN` and values not
    /// in the protocol.
    pub fn from_proto(value: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.proto() == value)
    }

    fn parse(text: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(text))
    }
}

/// Every domain's descriptor tree, and the rate limits its entries hold.
#[derive(Debug, Default, PartialEq)]
pub struct RlsRules {
    /// The root entries of each domain.
    pub domains: HashMap<String, Node>,
    /// Every entry's rate limit; [`Node::limit`] indexes it.
    pub limits: Vec<RlsLimit>,
    /// The files read, in the order read.
    pub files: Vec<PathBuf>,
}

/// One level of a descriptor tree: the entries under one parent.
#[derive(Debug, Default, PartialEq)]
pub struct Node {
    /// The rate limit of this entry (an index into [`RlsRules::limits`]).
    pub limit: Option<usize>,
    /// `share_threshold`: every value this wildcard entry matches is counted
    /// under one counter.
    pub share_threshold: bool,
    /// The entries below, in file order.
    pub children: Vec<Node>,
    /// Children with a `key` and an exact `value`.
    pub by_value: HashMap<(String, String), usize>,
    /// Children with a `key` and no `value` (any value).
    pub by_key: HashMap<String, usize>,
    /// Children whose `value` ends in `*`: key, value prefix, child.
    pub wildcards: Vec<(String, String, usize)>,
}

/// One entry's `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsLimit {
    /// The `limit` label of its decisions: its `name`, or its entries'
    /// path (`key_value.key`).
    pub label: String,
    /// Its domain.
    pub domain: String,
    /// `name`, which another entry's `replaces` may name.
    pub name: Option<String>,
    /// The names of the limits this one replaces in a request.
    pub replaces: Vec<String>,
    /// `None`: `unlimited`.
    pub rate: Option<Rate>,
    /// `shadow_mode`: counted and reported, never over the limit.
    pub shadow: bool,
}

/// A limited entry's number, unit and algorithm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Requests per unit; 0 refuses every request.
    pub requests_per_unit: u32,
    /// The unit (the window).
    pub unit: Unit,
    /// How it counts.
    pub algorithm: Algorithm,
}

impl RlsLimit {
    /// The limit in one phrase: "10 per minute (sliding_log)".
    pub fn describe(&self) -> String {
        let mut text = match &self.rate {
            None => "unlimited".to_string(),
            Some(rate) => format!(
                "{} per {} ({})",
                rate.requests_per_unit,
                rate.unit.name(),
                rate.algorithm.name()
            ),
        };
        if self.shadow {
            text.push_str(", shadow");
        }
        if !self.replaces.is_empty() {
            text.push_str(&format!(", replaces {}", self.replaces.join(" ")));
        }
        text
    }
}

/// A rules file, as envoyproxy/ratelimit writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorFile>,
}

/// One descriptor entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorFile {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimitFile>,
    #[serde(default)]
    descriptors: Vec<DescriptorFile>,
    #[serde(default)]
    shadow_mode: bool,
    /// Accepted; metrics never carry request values.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
    /// Accepted; metrics never carry request values.
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    algorithm: Option<AlgorithmFile>,
    burst: Option<u64>,
    buckets: Option<u32>,
}

/// `rate_limit:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitFile {
    unit: Option<String>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplacesFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesFile {
    name: String,
}

/// The rules files at `path`: the file itself, or the regular files
/// directly in the directory (following symlinks, names starting with `.`
/// left out, as in a mounted ConfigMap), sorted by name.
pub fn rule_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !std::fs::metadata(path)?.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        let file = entry.path();
        if !hidden && std::fs::metadata(&file).is_ok_and(|m| m.is_file()) {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads the rules at `path`, with `default` as the algorithm of limits
/// that name none; the warnings, one line each.
pub fn read_rules(path: &str, default: Algorithm) -> Result<(RlsRules, Vec<String>), ConfigError> {
    let whole = |message: String| ConfigError {
        path: PathBuf::from(path),
        problems: vec![Problem {
            position: None,
            message,
        }],
    };
    let files = rule_files(Path::new(path))
        .map_err(|e| whole(format!("cannot read the rate-limit service's rules: {e}")))?;
    let mut rules = RlsRules::default();
    let mut origin: HashMap<String, PathBuf> = HashMap::new();
    let mut warnings = Vec::new();
    for file in files {
        warnings.extend(load_file(&file, default, &mut rules, &mut origin)?);
        rules.files.push(file);
    }
    Ok((rules, warnings))
}

/// Adds the domain of `file` to `rules`.
fn load_file(
    file: &Path,
    default: Algorithm,
    rules: &mut RlsRules,
    origin: &mut HashMap<String, PathBuf>,
) -> Result<Vec<String>, ConfigError> {
    let fail = |problems: Vec<Problem>| ConfigError {
        path: file.to_path_buf(),
        problems,
    };
    let text = std::fs::read_to_string(file).map_err(|e| {
        fail(vec![Problem {
            position: None,
            message: format!("cannot read: {e}"),
        }])
    })?;
    let parsed: DomainFile =
        serde_yaml::from_str(&text).map_err(|e| fail(vec![super::serde_problem(&e)]))?;
    let index = PositionIndex::build(&text);
    let no_env = |_: &str| None;
    let mut c = Checker::new(&index, &no_env);
    let at = KeyPath::root("domain");
    if parsed.domain.is_empty() {
        c.problem(&at, RlsProblem::EmptyDomain.into());
    } else if let Some(other) = origin.get(&parsed.domain) {
        let other = other.display().to_string();
        let domain = parsed.domain.clone();
        c.problem(&at, RlsProblem::DuplicateDomain { domain, other }.into());
    }
    let mut root = Node::default();
    let mut level = Level {
        c: &mut c,
        domain: &parsed.domain,
        default,
        limits: &mut rules.limits,
    };
    level.entries(
        &KeyPath::root("descriptors"),
        &parsed.descriptors,
        "",
        &mut root,
    );
    if !c.problems.is_empty() {
        return Err(fail(c.problems));
    }
    origin.insert(parsed.domain.clone(), file.to_path_buf());
    rules.domains.insert(parsed.domain, root);
    Ok(fail(c.warnings)
        .to_string()
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect())
}

/// The state of reading one file's descriptor tree.
struct Level<'c, 'a> {
    c: &'c mut Checker<'a>,
    domain: &'c str,
    default: Algorithm,
    limits: &'c mut Vec<RlsLimit>,
}

impl Level<'_, '_> {
    /// Reads `entries` (at `at`, below the entries path `parent`) into `node`.
    fn entries(&mut self, at: &KeyPath, entries: &[DescriptorFile], parent: &str, node: &mut Node) {
        for (i, d) in entries.iter().enumerate() {
            let at = at.index(i);
            if d.key.is_empty() {
                self.c.problem(&at.key("key"), RlsProblem::EmptyKey.into());
            }
            let composite = match &d.value {
                Some(value) if !value.is_empty() => format!("{}_{value}", d.key),
                _ => d.key.clone(),
            };
            let path = if parent.is_empty() {
                composite.clone()
            } else {
                format!("{parent}.{composite}")
            };
            let index = node.children.len();
            let wildcard = d.value.as_deref().and_then(|v| v.strip_suffix('*'));
            let fresh = match (&d.value, wildcard) {
                (_, Some(prefix)) => {
                    let taken = node
                        .wildcards
                        .iter()
                        .any(|(k, p, _)| *k == d.key && p == prefix);
                    node.wildcards
                        .push((d.key.clone(), prefix.to_string(), index));
                    !taken
                }
                (Some(value), None) if !value.is_empty() => node
                    .by_value
                    .insert((d.key.clone(), value.clone()), index)
                    .is_none(),
                _ => node.by_key.insert(d.key.clone(), index).is_none(),
            };
            if !fresh {
                self.c.problem(
                    &at.key("key"),
                    RlsProblem::DuplicateEntry(path.clone()).into(),
                );
            }
            if d.share_threshold && wildcard.is_none() {
                let kind = RlsProblem::ShareWithoutWildcard.into();
                self.c.problem(&at.key("share_threshold"), kind);
            }
            let mut child = Node {
                share_threshold: d.share_threshold,
                ..Node::default()
            };
            child.limit = self.limit(&at, d, &path);
            self.entries(&at.key("descriptors"), &d.descriptors, &path, &mut child);
            node.children.push(child);
        }
    }

    /// The rate limit of entry `d` (at `at`, entries path `path`), added
    /// to the limits; its index.
    fn limit(&mut self, at: &KeyPath, d: &DescriptorFile, path: &str) -> Option<usize> {
        let Some(r) = &d.rate_limit else {
            for (key, set) in [
                ("algorithm", d.algorithm.is_some()),
                ("burst", d.burst.is_some()),
                ("buckets", d.buckets.is_some()),
            ] {
                if set {
                    self.c
                        .problem(&at.key(key), RlsProblem::NothingToCount(key).into());
                }
            }
            return None;
        };
        let at_limit = at.key("rate_limit");
        let rate = if r.unlimited {
            if r.unit.is_some() || r.requests_per_unit.is_some() {
                let kind = RlsProblem::UnlimitedWithUnit.into();
                self.c.problem(&at_limit.key("unit"), kind);
            }
            for (key, set) in [
                ("algorithm", d.algorithm.is_some()),
                ("burst", d.burst.is_some()),
            ] {
                if set {
                    self.c
                        .problem(&at.key(key), RlsProblem::NothingToCount(key).into());
                }
            }
            None
        } else {
            self.rate(at, d, r)
        };
        let name = r.name.clone().filter(|n| !n.is_empty());
        let mut replaces = Vec::new();
        for (j, rep) in r.replaces.iter().enumerate() {
            if rep.name.is_empty() || Some(&rep.name) == name.as_ref() {
                let kind = RlsProblem::BadReplaces.into();
                self.c.problem(&at_limit.key("replaces").index(j), kind);
            }
            replaces.push(rep.name.clone());
        }
        self.limits.push(RlsLimit {
            label: name.clone().unwrap_or_else(|| path.to_string()),
            domain: self.domain.to_string(),
            name,
            replaces,
            rate,
            shadow: d.shadow_mode,
        });
        Some(self.limits.len() - 1)
    }

    /// The number, unit and algorithm of a limited `rate_limit`.
    fn rate(&mut self, at: &KeyPath, d: &DescriptorFile, r: &RateLimitFile) -> Option<Rate> {
        let at_limit = at.key("rate_limit");
        let (Some(unit_text), Some(requests_per_unit)) = (&r.unit, r.requests_per_unit) else {
            self.c.problem(&at_limit, RlsProblem::Incomplete.into());
            return None;
        };
        let Some(unit) = Unit::parse(unit_text) else {
            let kind = RlsProblem::BadUnit(unit_text.clone()).into();
            self.c.problem(&at_limit.key("unit"), kind);
            return None;
        };
        let algorithm = self.algorithm(at, d, requests_per_unit, unit)?;
        Some(Rate {
            requests_per_unit,
            unit,
            algorithm,
        })
    }

    /// The algorithm of entry `d`: its own `algorithm`, or the default,
    /// with its parameters checked.
    fn algorithm(
        &mut self,
        at: &KeyPath,
        d: &DescriptorFile,
        requests_per_unit: u32,
        unit: Unit,
    ) -> Option<Algorithm> {
        let wrong = |key, algorithm| RlsProblem::WrongParameter { key, algorithm }.into();
        let kind = match d.algorithm {
            Some(AlgorithmFile::Concurrency) => {
                self.c
                    .problem(&at.key("algorithm"), RlsProblem::Concurrency.into());
                return None;
            }
            Some(AlgorithmFile::SlidingLog) => Algorithm::SlidingLog,
            Some(AlgorithmFile::FixedWindow) => Algorithm::FixedWindow,
            Some(AlgorithmFile::SlidingWindow) => Algorithm::SlidingWindow {
                buckets: defaults::BUCKETS,
            },
            Some(AlgorithmFile::TokenBucket) => Algorithm::TokenBucket { burst: 0 },
            None => self.default,
        };
        // A token bucket fills to `burst`, by default the entry's own number.
        let algorithm = match kind {
            Algorithm::SlidingWindow { buckets } => Algorithm::SlidingWindow {
                buckets: d.buckets.unwrap_or(buckets),
            },
            Algorithm::TokenBucket { .. } => Algorithm::TokenBucket {
                burst: d.burst.unwrap_or(u64::from(requests_per_unit)),
            },
            other => other,
        };
        if d.burst.is_some() && !matches!(algorithm, Algorithm::TokenBucket { .. }) {
            self.c
                .problem(&at.key("burst"), wrong("burst", "token_bucket"));
        }
        if d.buckets.is_some() && !matches!(algorithm, Algorithm::SlidingWindow { .. }) {
            self.c
                .problem(&at.key("buckets"), wrong("buckets", "sliding_window"));
        }
        self.parameters(at, algorithm, requests_per_unit, unit);
        Some(algorithm)
    }

    /// The checks an algorithm's parameters need against the entry's
    /// number and window.
    fn parameters(&mut self, at: &KeyPath, algorithm: Algorithm, limit: u32, unit: Unit) {
        match algorithm {
            Algorithm::SlidingLog if u64::from(limit) > super::defaults::limit::MAX_LOG => {
                let max = super::defaults::limit::MAX_LOG;
                let kind = RlsProblem::LogTooLong {
                    limit,
                    unit: unit.name(),
                    max,
                };
                self.c
                    .problem(&at.key("rate_limit").key("requests_per_unit"), kind.into());
            }
            Algorithm::SlidingWindow { buckets } => {
                let window = unit.window();
                if !(1..=1000).contains(&buckets) {
                    let kind = ProblemKind::Between {
                        key: "buckets".into(),
                        min: 1,
                        max: 1000,
                    };
                    self.c.problem(&at.key("buckets"), kind);
                } else if !window.as_micros().is_multiple_of(u128::from(buckets)) {
                    let window = format_duration(window);
                    let kind = ProblemKind::BucketsDoNotDivide { window, buckets };
                    self.c.problem(&at.key("buckets"), kind);
                }
            }
            Algorithm::TokenBucket { burst: 0 } if limit > 0 => {
                let kind = ProblemKind::AtLeast {
                    key: "burst",
                    min: "1",
                };
                self.c.problem(&at.key("burst"), kind);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first problem of `yaml` as a rules file, as printed.
    fn problem(yaml: &str) -> String {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("r.yaml");
        std::fs::write(&file, yaml).expect("write");
        let path = file.to_string_lossy().to_string();
        match read_rules(&path, Algorithm::SlidingLog) {
            Ok(_) => String::new(),
            Err(e) => e.to_string().replace(&path, "r.yaml"),
        }
    }

    #[test]
    fn each_refusal_names_its_line_and_column() {
        let cases = [
            ("domain: ''\n", "r.yaml:1:9: `domain` must not be empty"),
            ("domain: d\ndescriptors:\n  - key: ''\n", "r.yaml:3:10: a descriptor needs a non-empty `key`"),
            (
                "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
                "r.yaml:4:10: duplicate descriptor `a` at this level",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
                "r.yaml:4:41: an `unlimited` rate limit takes no `unit`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
                "r.yaml:4:17: `rate_limit` needs `unit` and `requests_per_unit`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
                "r.yaml:5:22: `share_threshold` applies to a wildcard",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    algorithm: concurrency\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
                "r.yaml:4:16: `concurrency` needs to know when a request ends",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 2000000}\n",
                "r.yaml:4:48: 2000000 per day is too many to log one by one",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    burst: 3\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
                "r.yaml:4:12: `burst` applies to `algorithm: token_bucket` only",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    algorithm: sliding_window\n    buckets: 7\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
                "r.yaml:5:14: ",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    algorithm: fixed_window\n",
                "r.yaml:4:16: `algorithm` needs a `rate_limit` with a unit",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n",
                "r.yaml:4:",
            ),
        ];
        for (yaml, expected) in cases {
            let got = problem(yaml);
            assert!(
                got.starts_with(expected),
                "{yaml}\n→ {got}\nwanted {expected}"
            );
        }
    }

    #[test]
    fn units_any_case_and_sluice_algorithms_on_an_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("r.yaml");
        let yaml = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: MINUTE, requests_per_unit: 10}
  - key: b
    algorithm: token_bucket
    burst: 4
    rate_limit: {unit: Second, requests_per_unit: 2}
  - key: c
    algorithm: sliding_window
    buckets: 20
    rate_limit: {unit: hour, requests_per_unit: 5000000}
";
        std::fs::write(&file, yaml).expect("write");
        let (rules, _) =
            read_rules(&file.to_string_lossy(), Algorithm::FixedWindow).expect("rules");
        let rates: Vec<Rate> = rules.limits.iter().filter_map(|l| l.rate).collect();
        assert_eq!(rates[0].unit, Unit::Minute);
        assert_eq!(rates[0].algorithm, Algorithm::FixedWindow);
        assert_eq!(rates[1].algorithm, Algorithm::TokenBucket { burst: 4 });
        assert_eq!(rates[2].algorithm, Algorithm::SlidingWindow { buckets: 20 });
        for unit in Unit::ALL {
            assert_eq!(Unit::from_proto(unit.proto()), Some(unit));
        }
        assert_eq!(Unit::from_proto(0), None);
    }
}
