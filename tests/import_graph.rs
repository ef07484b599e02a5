//! The import graph of the code has no circles: read from the sources'
//! own `crate::` and `super::` paths (grouped `use` lists expanded), each
//! file a module, no module imports one that imports it back, directly or
//! through others. A module's use of its ancestors (the vocabulary a
//! `mod.rs` holds for its children) is not an edge. Run on `src/`, on the
//! limiter crate and on the `versus` benchmark's modules; a circle fails naming, for each of its
//! imports, the `file:line` that makes it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod imports;

use imports::edges;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The circles of the import graph of `dir` (crate root `root`), each as
/// its imports `from → to (file:line)`.
fn circles(dir: &Path, root: &str) -> Vec<Vec<String>> {
    let edges = edges(dir, root);
    let known: BTreeSet<String> = edges.keys().cloned().collect();
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
fn the_limiter_crate_has_no_import_circles() {
    let found = circles(&dir("crates/limiter/src"), "lib.rs");
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
