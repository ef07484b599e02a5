//! The import graph of the code has no circles: read from the sources'
//! own `crate::` and `super::` paths (grouped `use` lists expanded), each
//! file a module, no module imports one that imports it back, directly or
//! through others. A module's use of its ancestors (the vocabulary a
//! `mod.rs` holds for its children) is not an edge. Run on `src/` and on
//! the `versus` benchmark's modules; a circle fails naming, for each of its
//! imports, the `file:line` that makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, by module path (`limiter::local`), with
/// its text; `root` is the crate root's file name (`lib.rs`, `main.rs`).
fn modules(dir: &Path, root: &str) -> BTreeMap<String, (PathBuf, String)> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder)
            .expect("read a source folder")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
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
fn imports(module: &str, text: &str, known: &BTreeSet<String>) -> Vec<(String, usize)> {
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

/// The circles of the import graph of `dir` (crate root `root`), each as
/// its imports `from → to (file:line)`.
fn circles(dir: &Path, root: &str) -> Vec<Vec<String>> {
    let modules = modules(dir, root);
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let mut edges: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (module, (path, text)) in &modules {
        for (target, line) in imports(module, text, &known) {
            let at = format!("{}:{line}", path.display());
            edges
                .entry(module.clone())
                .or_default()
                .insert((target, at));
        }
    }
    // Tarjan's strongly connected components.
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<(String, String)>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        components: Vec<Vec<String>>,
    }
    fn visit(w: &mut Walk<'_>, v: &str) {
        let i = w.index.len();
        w.index.insert(v.to_string(), i);
        w.low.insert(v.to_string(), i);
        w.stack.push(v.to_string());
        let targets: Vec<String> = w
            .edges
            .get(v)
            .map(|e| e.iter().map(|(t, _)| t.clone()).collect())
            .unwrap_or_default();
        for t in targets {
            if !w.index.contains_key(&t) {
                visit(w, &t);
                let low = w.low[v].min(w.low[&t]);
                w.low.insert(v.to_string(), low);
            } else if w.stack.contains(&t) {
                let low = w.low[v].min(w.index[&t]);
                w.low.insert(v.to_string(), low);
            }
        }
        if w.low[v] == w.index[v] {
            let mut component = Vec::new();
            while let Some(top) = w.stack.pop() {
                let done = top == v;
                component.push(top);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                w.components.push(component);
            }
        }
    }
    let mut walk = Walk {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for module in &known {
        if !walk.index.contains_key(module) {
            visit(&mut walk, module);
        }
    }
    walk.components
        .iter()
        .map(|component| {
            let inside: BTreeSet<&String> = component.iter().collect();
            component
                .iter()
                .flat_map(|from| {
                    edges
                        .get(from)
                        .into_iter()
                        .flatten()
                        .filter(|(to, _)| inside.contains(to))
                        .map(move |(to, at)| format!("{from} → {to} ({at})"))
                })
                .collect()
        })
        .collect()
}

fn dir(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn the_gateway_has_no_import_circles() {
    let found = circles(&dir("src"), "lib.rs");
    assert!(found.is_empty(), "import circles:\n{found:#?}");
}

#[test]
fn the_benchmark_has_no_import_circles() {
    let found = circles(&dir("benches/versus"), "main.rs");
    assert!(found.is_empty(), "import circles:\n{found:#?}");
}

#[test]
fn a_circle_is_found_and_named_by_its_lines() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| std::fs::write(scratch.path().join(name), text).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\n");
    write("a.rs", "use crate::b::thing;\n");
    write("b.rs", "use crate::{c::{other, more}, x};\n");
    write("c.rs", "// use crate::a;\nfn f() { crate::a::call(); }\n");
    let found = circles(scratch.path(), "lib.rs");
    assert_eq!(found.len(), 1, "{found:#?}");
    let mut circle = found[0].clone();
    circle.sort();
    assert_eq!(circle.len(), 3, "{circle:#?}");
    assert!(
        circle[0].starts_with("a → b (") && circle[0].ends_with("a.rs:1)"),
        "{circle:#?}"
    );
    assert!(
        circle[2].starts_with("c → a (") && circle[2].ends_with("c.rs:2)"),
        "{circle:#?}"
    );
}
