//! The shape the code keeps, checked on its sources (the gateway's `src/`
//! and the limiter crate's): no source file over 700 lines (a module's tests
//! kept in a file of their own, `tests.rs` or `*_tests.rs`, are not
//! counted), no function over 80 lines, and at most five files at the top
//! of `src/` (the crate roots and small leaves; everything else lives in
//! the folder of its layer).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod imports;

use imports::sources;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FUNCTION_LINES: usize = 80;

fn roots() -> Vec<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![manifest.join("src"), manifest.join("crates/limiter/src")]
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The functions of `text` longer than `max` lines, as `(line, name, length)`:
/// a function runs from its `fn` line to the first later line that closes
/// it at the same indentation.
fn long_functions(text: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let Some(at) = code.find("fn ") else {
            continue;
        };
        let before = &code[..at];
        let is_definition = before.split_whitespace().all(|word| {
            word.starts_with("pub")
                || matches!(word, "async" | "const" | "unsafe" | "extern" | "\"C\"")
        });
        if !is_definition || code.starts_with("//") {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The signature ends at the first `{` or `;` closing a line; a
        // declaration without a body (a trait's) has no length.
        let signature_end = lines[n..]
            .iter()
            .position(|l| l.trim_end().ends_with('{') || l.trim_end().ends_with(';'));
        if signature_end.is_none_or(|e| lines[n + e].trim_end().ends_with(';')) {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let Some(end) = lines[n..]
            .iter()
            .position(|l| *l == close || l.starts_with(&close) && l.trim() == "}")
        else {
            continue;
        };
        if end + 1 > max {
            found.push((n + 1, name, end + 1));
        }
    }
    found
}

#[test]
fn no_source_file_is_over_700_lines() {
    let mut over = Vec::new();
    for root in roots() {
        for file in sources(&root) {
            let lines = std::fs::read_to_string(&file)
                .expect("read")
                .lines()
                .count();
            if lines > MAX_FILE_LINES && !is_test_file(&file) {
                over.push(format!("{}: {lines} lines", file.display()));
            }
        }
    }
    assert!(
        over.is_empty(),
        "files over {MAX_FILE_LINES} lines:\n{}",
        over.join("\n")
    );
}

#[test]
fn no_function_is_over_80_lines() {
    let mut over = Vec::new();
    for root in roots() {
        for file in sources(&root) {
            let text = std::fs::read_to_string(&file).expect("read");
            for (line, name, length) in long_functions(&text, MAX_FUNCTION_LINES) {
                over.push(format!(
                    "{}:{line}: fn {name}, {length} lines",
                    file.display()
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines:\n{}",
        over.join("\n")
    );
}

#[test]
fn a_long_function_is_found() {
    let body = "    let x = 1;\n".repeat(90);
    let text = format!("fn short() {{\n}}\n\npub(crate) async fn long() {{\n{body}}}\n");
    let found = long_functions(&text, MAX_FUNCTION_LINES);
    assert_eq!(found, vec![(4, "long".to_string(), 92)]);
}

#[test]
fn the_top_of_src_holds_at_most_five_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: Vec<String> = std::fs::read_dir(&src)
        .expect("read src/")
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.len() <= 5, "src/ holds {files:?}");
}
