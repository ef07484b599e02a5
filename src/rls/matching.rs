//! Which rate limit a request descriptor falls under, as envoyproxy/ratelimit
//! finds it, and the counter it is counted in.
//!
//! The entries are walked down the domain's tree, one level per entry: at
//! each level the entry's key and value are looked up first, then the
//! wildcard values (`foo*`, in file order), then the key alone. The limit is
//! the one on the entry the last request entry lands on; a request
//! descriptor longer or shorter than the tree's path has none.

use super::proto::rate_limit_descriptor::Entry;
use crate::config::rls::{Node, RlsRules};
use crate::policy::keys::push_part;

/// The limit a descriptor falls under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'r> {
    /// The index of its limit in [`RlsRules::limits`].
    pub limit: usize,
    /// Entries matched by a `share_threshold` wildcard: (entry index,
    /// value prefix). Every value they match shares one counter.
    pub shared: Vec<(usize, &'r str)>,
}

/// The limit of `entries` in `domain`, if any.
pub fn find<'r>(rules: &'r RlsRules, domain: &str, entries: &[Entry]) -> Option<Found<'r>> {
    let mut node = rules.domains.get(domain)?;
    let mut shared = Vec::new();
    let mut found = None;
    for (i, entry) in entries.iter().enumerate() {
        let (next, wildcard) = step(node, entry)?;
        if let Some(prefix) = wildcard.filter(|_| next.share_threshold) {
            shared.push((i, prefix));
        }
        if i + 1 == entries.len() {
            found = next.limit;
        }
        if next.children.is_empty() {
            break;
        }
        node = next;
    }
    Some(Found {
        limit: found?,
        shared,
    })
}

/// The child of `node` that `entry` lands on, with the wildcard prefix
/// that matched it, if one did.
fn step<'r>(node: &'r Node, entry: &Entry) -> Option<(&'r Node, Option<&'r str>)> {
    if !entry.value.is_empty() {
        let exact = (entry.key.clone(), entry.value.clone());
        if let Some(&i) = node.by_value.get(&exact) {
            return Some((&node.children[i], None));
        }
    }
    for (key, prefix, i) in &node.wildcards {
        if *key == entry.key && entry.value.starts_with(prefix.as_str()) {
            return Some((&node.children[*i], Some(prefix.as_str())));
        }
    }
    let &i = node.by_key.get(&entry.key)?;
    Some((&node.children[i], None))
}

/// The counter key of a descriptor: the domain and every entry's key and
/// value (a shared wildcard's prefix in place of its value), each written
/// as key parts are (raw when short and safe, else hashed), in one hash tag.
/// `!` keeps it apart from every route's counters.
pub fn counter_key(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    shared: &[(usize, &str)],
) -> String {
    let mut key = String::with_capacity(prefix.len() + 16 + entries.len() * 48);
    key.push_str(prefix);
    key.push_str("{!rls|");
    push_part(&mut key, domain.as_bytes());
    for (i, entry) in entries.iter().enumerate() {
        key.push('|');
        push_part(&mut key, entry.key.as_bytes());
        key.push('|');
        match shared.iter().find(|(at, _)| *at == i) {
            // `*` is never kept raw: a pattern never equals a value.
            Some((_, pattern)) => push_part(&mut key, format!("{pattern}*").as_bytes()),
            None => push_part(&mut key, entry.value.as_bytes()),
        }
    }
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rls::RlsRules;

    fn rules(yaml: &str) -> RlsRules {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, yaml).expect("write");
        let path = file.to_string_lossy().to_string();
        crate::config::rls::read_rules(&path, crate::config::Algorithm::SlidingLog)
            .expect("rules load")
            .0
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect()
    }

    fn label(rules: &RlsRules, domain: &str, pairs: &[(&str, &str)]) -> Option<String> {
        let found = find(rules, domain, &entries(pairs))?;
        Some(rules.limits[found.limit].label.clone())
    }

    const RULES: &str = "
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0}
      - key: baz
        value: pre*
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: api}
";

    #[test]
    fn key_and_value_come_before_a_wildcard_and_a_wildcard_before_the_key() {
        let r = rules(RULES);
        assert_eq!(label(&r, "rl", &[("foo", "x")]).as_deref(), Some("foo"));
        assert_eq!(
            label(&r, "rl", &[("foo", "x"), ("bar", "y")]).as_deref(),
            Some("foo.bar")
        );
        assert_eq!(
            label(&r, "rl", &[("foo", "x"), ("bar", "banned")]).as_deref(),
            Some("foo.bar_banned")
        );
        assert_eq!(
            label(&r, "rl", &[("foo", "x"), ("baz", "prefix")]).as_deref(),
            Some("foo.baz_pre*")
        );
        assert_eq!(label(&r, "rl", &[("foo", "x"), ("baz", "other")]), None);
        assert_eq!(
            label(
                &r,
                "rl",
                &[("source_cluster", "proxy"), ("destination_cluster", "mock")]
            )
            .as_deref(),
            Some("source_cluster_proxy.destination_cluster_mock")
        );
    }

    #[test]
    fn a_descriptor_of_another_depth_or_domain_has_no_limit() {
        let r = rules(RULES);
        // Shorter than the path to the limit.
        assert_eq!(label(&r, "rl", &[("source_cluster", "proxy")]), None);
        // Longer than the tree.
        assert_eq!(
            label(&r, "rl", &[("foo", "x"), ("bar", "y"), ("z", "1")]),
            None
        );
        assert_eq!(label(&r, "other", &[("foo", "x")]), None);
        assert_eq!(label(&r, "rl", &[]), None);
        // A key made of another's key and value is not that pair.
        assert_eq!(label(&r, "rl", &[("source_cluster_proxy", "")]), None);
    }

    #[test]
    fn values_are_counted_apart_unless_a_wildcard_shares_its_counter() {
        let r = rules(RULES);
        let key = |pairs: &[(&str, &str)]| {
            let e = entries(pairs);
            let found = find(&r, "rl", &e).expect("a limit");
            counter_key("p:", "rl", &e, &found.shared)
        };
        assert_ne!(key(&[("foo", "a")]), key(&[("foo", "b")]));
        assert_eq!(key(&[("path", "/api/x")]), key(&[("path", "/api/y")]));
        assert!(key(&[("foo", "a")]).starts_with("p:{!rls|rl|foo|a"));
        // Hostile values stay inside the hash tag and cannot forge a separator.
        let forged = key(&[("foo", "a|b}{c")]);
        assert_eq!(forged.matches('{').count(), 1, "{forged}");
        assert_eq!(forged.matches('}').count(), 1, "{forged}");
        assert_ne!(forged, key(&[("foo", "a|b")]));
    }
}
