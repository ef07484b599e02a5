//! The import graph of sluice's own code, read from its sources: each file
//! a module, an edge for each `crate::` or `super::` path its code names
//! (grouped `use` lists expanded, comments and `#[cfg(test)]` modules left
//! out, a module's use of its ancestors not counted). Shared by the
//! import-circle and the layering tests.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, sorted.
pub fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder)
            .expect("read a source folder")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Every `.rs` file under `dir`, by module path (`limiter::local`), with
/// its text; `root` is the crate root's file name (`lib.rs`, `main.rs`).
pub fn modules(dir: &Path, root: &str) -> BTreeMap<String, (PathBuf, String)> {
    let mut found = BTreeMap::new();
    for path in sources(dir) {
        let relative = path.strip_prefix(dir).expect("under dir");
        let mut parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        if parts.len() == 1 && format!("{}.rs", parts[0]) == root {
            parts.clear();
        }
        let text = std::fs::read_to_string(&path).expect("read a source");
        found.insert(parts.join("::"), (path, text));
    }
    found
}

/// The code of `text` without comments and without its `#[cfg(test)]`
/// module (tests may reach anywhere), as lines.
fn code_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_tests = false;
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            in_tests = true;
        }
        let code = if in_tests {
            ""
        } else {
            line.split("//").next().unwrap_or_default()
        };
        lines.push(code.to_string());
    }
    lines
}

/// The paths a `use` tree or an inline path names, braces expanded:
/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(prefix: &str, tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![format!("{prefix}{path}")];
    };
    let head = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|i| !i.trim().is_empty())
        .flat_map(|item| expand(&format!("{prefix}{head}"), item))
        .collect()
}

/// The modules `module`'s code imports, each with the line that does.
pub fn imports(module: &str, text: &str, known: &BTreeSet<String>) -> Vec<(String, usize)> {
    let lines = code_lines(text);
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let resolve = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").map(str::trim).collect();
        (1..=parts.len())
            .rev()
            .map(|n| parts[..n].join("::"))
            .find(|candidate| known.contains(candidate))
    };
    let mut found = Vec::new();
    let mut statement = String::new();
    let mut statement_line = 0;
    for (n, line) in lines.iter().enumerate() {
        // `use` statements, which may span lines.
        let trimmed = line.trim_start();
        if statement.is_empty()
            && (trimmed.starts_with("use ")
                || trimmed.starts_with("pub use ")
                || trimmed.starts_with("pub(crate) use ")
                || trimmed.starts_with("pub(super) use "))
        {
            statement_line = n + 1;
        }
        if statement_line > 0 {
            statement.push_str(line);
            if line.contains(';') {
                let body = statement.split("use ").nth(1).unwrap_or_default();
                let body = body.trim_end_matches(|c: char| c == ';' || c.is_whitespace());
                for path in expand("", body) {
                    let absolute = if let Some(rest) = path.strip_prefix("crate::") {
                        rest.to_string()
                    } else if let Some(rest) = path.strip_prefix("super::") {
                        if parent.is_empty() {
                            rest.to_string()
                        } else {
                            format!("{parent}::{rest}")
                        }
                    } else {
                        continue;
                    };
                    if let Some(target) = resolve(&absolute) {
                        found.push((target, statement_line));
                    }
                }
                statement.clear();
                statement_line = 0;
            }
            continue;
        }
        // Inline paths: `crate::a::b::f(…)`.
        let mut rest = line.as_str();
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if let Some(target) = resolve(tail[..end].trim_end_matches(':')) {
                found.push((target, n + 1));
            }
            rest = &tail[end..];
        }
    }
    // A module's use of itself or of its ancestors is no edge.
    found.retain(|(target, _)| {
        target != module && !module.starts_with(&format!("{target}::")) && !target.is_empty()
    });
    found
}

/// Every import of the crate rooted at `dir/root`: for each module, the
/// modules it imports, each with the `file:line` that does.
pub fn edges(dir: &Path, root: &str) -> BTreeMap<String, BTreeSet<(String, String)>> {
    let modules = modules(dir, root);
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (module, (path, text)) in &modules {
        let entry = edges.entry(module.clone()).or_default();
        for (target, line) in imports(module, text, &known) {
            entry.insert((target, format!("{}:{line}", path.display())));
        }
    }
    edges
}
