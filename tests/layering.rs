//! The layers of docs/architecture.md, checked from the code's own imports:
//! every file of `src/` belongs to the folder it sits in (`edge`, `policy`,
//! …, or a leaf file at the top), and a folder imports only the folders
//! below it in [`ORDER`]. An import that runs back up fails, naming its
//! `file:line`. Imports are read as the import-circle test reads them
//! (`crate::` and `super::` paths, grouped `use` lists expanded, comments
//! and `#[cfg(test)]` modules left out).
//!
//! Besides the order, a few outside crates are kept out of layers that must
//! not know them: the config knows nothing of Redis or Pingora's
//! connections, and nothing below the edge sees a Pingora session.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod imports;

use imports::{edges, sources};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers of `src/`, top first: each may import itself and those after
/// it, never one before it. The crate roots (`lib.rs`, `main.rs`) stand
/// above all of them; the limiter crate (`crates/limiter`, re-exported as
/// `limiter` with its `sync`) stands below all of them, which the compiler
/// keeps: it cannot name the gateway.
const ORDER: &[&str] = &[
    "admin", "rls", "edge", "policy", "observe", "upstream", "request", "config", "target",
];

/// The layer of `module` (its first path segment), or `None` for a crate
/// root (`lib.rs`, and `main.rs` beside it).
fn layer_of(module: &str) -> Option<&str> {
    module
        .split("::")
        .next()
        .filter(|first| !first.is_empty() && *first != "main")
}

/// Every import of the crate at `dir` that runs from a layer to one above
/// it, and every module in no layer of `order`, as `file:line: why` lines.
fn violations(dir: &Path, root: &str, order: &[&str]) -> Vec<String> {
    let rank = |layer: &str| order.iter().position(|l| *l == layer);
    let mut found = Vec::new();
    for (module, imports) in edges(dir, root) {
        let Some(from) = layer_of(&module) else {
            continue;
        };
        let Some(from_rank) = rank(from) else {
            found.push(format!(
                "{module}: in no layer (place it in a folder of the layer order)"
            ));
            continue;
        };
        for (target, at) in imports {
            let Some(to) = layer_of(&target) else {
                continue;
            };
            if rank(to).is_some_and(|to_rank| to_rank < from_rank) {
                found.push(format!(
                    "{at}: {from} imports {to} ({module} → {target}), a layer above it"
                ));
            }
        }
    }
    found
}

/// The lines of the files under `dir` that name any of `crates` as code
/// (not in a comment), as `file:line: text`.
fn naming(dir: &Path, crates: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for path in sources(dir) {
        let text = std::fs::read_to_string(&path).expect("read a source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let names = |name: &&str| {
                code.match_indices(*name)
                    .any(|(at, _)| !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
            };
            if crates.iter().any(names) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

fn src(part: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(part)
}

#[test]
fn no_layer_imports_one_above_it() {
    let found = violations(&src(""), "lib.rs", ORDER);
    assert!(
        found.is_empty(),
        "imports against the layer order {ORDER:?}:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_layer_of_the_order_is_a_folder_or_a_file_of_src() {
    for layer in ORDER {
        assert!(
            src(layer).is_dir() || src(&format!("{layer}.rs")).is_file(),
            "{layer} is in the layer order but not in src/"
        );
    }
}

#[test]
fn an_import_that_runs_up_is_found_and_named_by_its_line() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = scratch.path().join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write("lib.rs", "pub mod top;\npub mod low;\npub mod stray;\n");
    write("top/mod.rs", "use crate::low::thing;\n");
    write("low/mod.rs", "pub mod inner;\n// use crate::top::x;\n");
    write("low/inner.rs", "fn f() {\n    crate::top::call();\n}\n");
    write("stray.rs", "");
    let order = ["top", "low"];
    let found: BTreeMap<String, String> = violations(scratch.path(), "lib.rs", &order)
        .into_iter()
        .map(|line| (line.split(':').next().unwrap_or_default().to_string(), line))
        .collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    let up = found
        .values()
        .find(|l| l.contains("low imports top"))
        .expect("the climb");
    assert!(up.contains("inner.rs:2:"), "{up}");
    assert!(found.contains_key("stray"), "{found:#?}");
}

#[test]
fn the_config_knows_nothing_of_redis_or_pingora() {
    let found = naming(&src("config"), &["redis::", "pingora"]);
    assert!(
        found.is_empty(),
        "the config reaches for:\n{}",
        found.join("\n")
    );
}

#[test]
fn nothing_below_the_edge_sees_a_session() {
    let mut found = Vec::new();
    for layer in ["policy", "observe", "upstream", "request", "config"] {
        found.extend(naming(
            &src(layer),
            &["pingora::proxy", "ServerSession", "mut Session"],
        ));
    }
    assert!(found.is_empty(), "below the edge:\n{}", found.join("\n"));
}
